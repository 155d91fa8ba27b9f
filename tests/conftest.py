"""Shared fixtures: one torch thread for the whole suite, and the character tokenizer."""

import pytest
import torch

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
