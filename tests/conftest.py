"""Shared fixtures: one torch thread for the whole suite, the character tokenizer, no run cache."""

import os

import pytest
import torch

# Unit tests never read or write the run cache under _build/ (tests of the cache point it at tmp_path).
os.environ["GRPO_LAB_RUN_CACHE"] = "off"

from grpo_lab.models import build_char_tokenizer


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    # Tiny models gain nothing from intra-op threads, and on a shared 2-core machine OpenMP
    # spin-waiting made the suite several times slower; restore the setting afterwards.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tok():
    return build_char_tokenizer()


@pytest.fixture
def capture_grads():
    """``capture_grads(trainer, store, key)``: at every optimiser step of ``trainer``, store a copy of
    the policy's gradients (before the step) in ``store[key]``."""

    def install(trainer, store, key):
        step = trainer.optimizer.step

        def wrapped(*a, **k):
            store[key] = [p.grad.clone() for p in trainer.policy.parameters()]
            return step(*a, **k)

        trainer.optimizer.step = wrapped

    return install
