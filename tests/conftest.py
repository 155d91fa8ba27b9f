"""Shared fixtures: one torch thread for the whole suite, the character tokenizer, no run cache."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Unit tests never read or write the run cache under _build/ (tests of the cache point it at tmp_path).
os.environ["GRPO_LAB_RUN_CACHE"] = "off"

from grpo_lab.policy.models import build_char_tokenizer


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    # Tiny models gain nothing from intra-op threads, and on a shared 2-core machine OpenMP
    # spin-waiting made the suite several times slower; restore the setting afterwards.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def user_modules(monkeypatch):
    """A clean slate for user files a test imports (``--import FILE``, ``importlib``): ``sys.path``, the task
    registry and the preset registry are put back afterwards, and every module imported during the test from
    outside the environment and the package is dropped from ``sys.modules``."""
    from grpo_lab.algo import algorithms as algorithms_mod
    from grpo_lab import tasks as tasks_mod

    monkeypatch.setattr(sys, "path", list(sys.path))
    registries = [tasks_mod.TASKS, algorithms_mod.PRESETS]  # restored in place: modules hold references to them
    saved = [dict(r) for r in registries]
    before = set(sys.modules)
    yield
    for registry, contents in zip(registries, saved):
        registry.clear()
        registry.update(contents)
    keep = (str(Path(sys.prefix).resolve()), str(Path(sys.base_prefix).resolve()), str(Path(__file__).parents[1] / "grpo_lab"))
    for name in set(sys.modules) - before:
        path = getattr(sys.modules[name], "__file__", None)
        if path and not str(Path(path).resolve()).startswith(keep):
            del sys.modules[name]


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


@pytest.fixture(scope="session")
def stored_book_build(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """`jupyter-book build book --config _config.yml -W -n --keep-going --path-output <tmp>` (CI's book
    build, from the notebooks' stored outputs), run once per session: tests/repo/test_book_hygiene.py checks
    its log, tests/repo/test_book_render.py opens its pages (one build instead of two: each took minutes of
    the unit phase). Returns the finished process and the HTML directory; skips without jupyter-book."""
    candidate = Path(sys.executable).parent / "jupyter-book"
    exe = str(candidate) if candidate.exists() else shutil.which("jupyter-book")
    if exe is None:
        pytest.skip("jupyter-book is not installed")
    out = tmp_path_factory.mktemp("book")
    cmd = [exe, "build", "book", "--config", "_config.yml", "-W", "-n", "--keep-going", "--path-output", str(out)]
    proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=900)
    return proc, out / "_build" / "html"
