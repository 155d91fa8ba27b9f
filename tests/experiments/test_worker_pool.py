"""Sharing work between runs: the step-0 evaluation of a base policy, and the worker processes.

Both only save time; every test here checks that the numbers are those of runs that share nothing.
"""

from __future__ import annotations

from grpo_lab.experiments import runs as runs_mod
from grpo_lab.experiments import workers as workers_mod
import os
import shutil
from dataclasses import replace

import pandas as pd
import pytest

import grpo_lab.experiments as ex
from grpo_lab.algo.algorithms import GRPO
from grpo_lab.experiments import Profile, run
from grpo_lab.policy.models import TinyConfig, build_char_tokenizer, tiny_policy
from grpo_lab.training.trainer import Trainer, TrainerConfig

TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)
TIMING = ["tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "peak_mem_mb"]


@pytest.fixture
def profile(tmp_path):
    base = tmp_path / "base"
    tok = build_char_tokenizer()
    tiny_policy(tok, TINY, seed=0).save_pretrained(base, safe_serialization=True)
    tok.save_pretrained(base)
    return Profile(name="t", base=str(base), task="arithmetic", steps=2,
                   config=TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=1),
                   task_kwargs=(("test_size", 5),))


@pytest.fixture
def count_evals(monkeypatch):
    calls = []
    original = Trainer._evaluation  # what train() calls for each evaluation (the row and its sample table)

    def counting(self):
        calls.append(self.step)
        return original(self)

    monkeypatch.setattr(Trainer, "_evaluation", counting)
    monkeypatch.setattr(ex.runs, "_BASE_EVALS", {})  # the memo _train_one reads
    return calls


def test_the_base_policy_is_evaluated_once_per_process(profile, count_evals):
    other = GRPO.replace(name="other", eps_low=0.1, eps_high=0.1, beta=0.0, kl=None)
    first = runs_mod._train_one(GRPO, profile, 2, 0, False)
    assert count_evals == [0, 1, 2]
    second = runs_mod._train_one(other, profile, 2, 1, False)  # another algorithm and seed, same base
    assert count_evals == [0, 1, 2, 1, 2]  # no step-0 evaluation this time ...
    pd.testing.assert_series_equal(first.iloc[0], second.iloc[0], check_names=False)  # ... the same row

    # ... and it is the row a run that shares nothing computes: clear the memo and train again
    ex.runs._BASE_EVALS.clear()
    fresh = runs_mod._train_one(other, profile, 2, 1, False)
    assert count_evals[-3:] == [0, 1, 2]
    pd.testing.assert_frame_equal(second.drop(columns=TIMING), fresh.drop(columns=TIMING), check_exact=True)


def test_the_shared_evaluation_follows_what_it_depends_on(profile, tmp_path):
    cfg = replace(profile.config, seed=0)
    key = runs_mod._base_eval_key(profile.base, profile, cfg)
    assert key is not None
    assert runs_mod._base_eval_key(profile.base, profile, replace(cfg, seed=7)) == key  # not the seed
    assert runs_mod._base_eval_key(profile.base, profile, replace(cfg, max_new_tokens=9)) != key
    assert runs_mod._base_eval_key(profile.base, replace(profile, task_kwargs=(("test_size", 6),)), cfg) != key
    # not shared: no evaluation, a sampled one (it draws the seed's random numbers), a hub id
    assert runs_mod._base_eval_key(profile.base, profile, replace(cfg, eval_every=0)) is None
    assert runs_mod._base_eval_key(profile.base, profile, replace(cfg, eval_sampled=True)) is None
    assert runs_mod._base_eval_key("org/model", profile, cfg) is None
    # a rebuilt checkpoint (same path, a file rewritten) is evaluated again
    weights = next(f for f in os.listdir(profile.base) if f.endswith(".safetensors"))
    path = os.path.join(profile.base, weights)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert runs_mod._base_eval_key(profile.base, profile, cfg) != key
    # and a copy elsewhere is another checkpoint
    copy = tmp_path / "copy"
    shutil.copytree(profile.base, copy)
    assert runs_mod._base_eval_key(str(copy), replace(profile, base=str(copy)), cfg) != key


def test_worker_processes_are_kept_between_calls_and_give_the_serial_numbers(profile, monkeypatch):
    monkeypatch.setenv("GRPO_LAB_RUN_CACHE", "off")
    ex.shutdown_workers()
    serial = run("GRPO", profile=profile, seeds=[0, 1], progress=False)
    try:
        a = run("GRPO", profile=profile, seeds=[0, 1], progress=False, n_jobs=2)
        pool = workers_mod._POOL["executor"]
        assert pool is not None
        pids = set(pool._processes)
        b = run(GRPO.replace(name="again"), profile=profile, seeds=[1, 0], progress=False, n_jobs=2)
        assert workers_mod._POOL["executor"] is pool and set(pool._processes) == pids  # the same workers
        # a Jupyter kernel's interrupt or shutdown signals the whole process group: idle workers
        # ignore SIGINT (before, each printed a KeyboardInterrupt traceback and died)
        import signal
        import time

        for pid in pids:
            os.kill(pid, signal.SIGINT)
        time.sleep(1.0)
        assert all(p.is_alive() for p in pool._processes.values())
        for r in (a, b):
            pd.testing.assert_frame_equal(
                r.history.drop(columns=TIMING + ["algo"]).sort_values(["seed", "step"]).reset_index(drop=True),
                serial.history.drop(columns=TIMING + ["algo"]).sort_values(["seed", "step"]).reset_index(drop=True),
                check_exact=True)

        # a choice registered since the workers started: they lack it, so the pool is replaced
        from grpo_lab.algo.objectives import SURROGATES

        monkeypatch.setitem(SURROGATES, "toy_reuse", SURROGATES["ppo"])
        assert workers_mod._worker_pool(2) is not pool and pool._shutdown_thread  # (no process is started yet)
        assert workers_mod._worker_pool(2) is workers_mod._POOL["executor"]  # and the new one is kept
    finally:
        ex.shutdown_workers()
    assert workers_mod._POOL["executor"] is None


def test_a_failing_job_stops_the_workers_and_raises(profile, monkeypatch):
    monkeypatch.setenv("GRPO_LAB_RUN_CACHE", "off")
    bad = replace(profile, base=str(profile.base) + "-missing")
    with pytest.raises(Exception, match="missing"):
        run("GRPO", profile=bad, seeds=[0, 1], progress=False, n_jobs=2, steps=1)
    assert workers_mod._POOL["executor"] is None


def test_a_task_registered_by_a_users_module_reaches_the_workers(profile, tmp_path, monkeypatch):
    # found writing the book's "own task" page: a task registered by a module that a notebook
    # imports was unknown in the spawned workers (they import only grpo_lab); the workers now
    # import the module that defines it, which registers it there too
    import sys

    from grpo_lab import tasks as tasks_mod

    (tmp_path / "my_words_task.py").write_text(
        "from dataclasses import dataclass\n"
        "from grpo_lab.tasks import ArithmeticTask, register_task\n\n\n"
        "@register_task('my_words')\n"
        "@dataclass\n"
        "class MyTask(ArithmeticTask):\n"
        "    name: str = 'my_words'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("GRPO_LAB_RUN_CACHE", "off")
    monkeypatch.setattr(tasks_mod, "TASKS", dict(tasks_mod.TASKS))
    import my_words_task  # noqa: F401  (registers "my_words" here)

    assert workers_mod._user_modules(GRPO, replace(profile, task="my_words")) == ("my_words_task",)
    assert workers_mod._user_modules(GRPO, profile) == ()  # everything from grpo_lab
    mine = replace(profile, task="my_words")
    try:
        ser = run("GRPO", profile=mine, seeds=[0, 1], steps=1, progress=False)
        par = run("GRPO", profile=mine, seeds=[0, 1], steps=1, progress=False, n_jobs=2)
    finally:
        ex.shutdown_workers()
        sys.modules.pop("my_words_task", None)
    pd.testing.assert_frame_equal(par.history.drop(columns=TIMING), ser.history.drop(columns=TIMING), check_exact=True)

    # a module that a worker cannot import: a clear error that says what to do
    with pytest.raises(ValueError, match="cannot import 'not_a_module_here'.*Register it at the top level"):
        runs_mod._train_one(GRPO, profile, 1, 0, False, None, ("not_a_module_here",))
    with pytest.raises(ValueError, match="task 'unregistered' is not registered.*n_jobs=1"):
        runs_mod._train_one(GRPO, replace(profile, task="unregistered"), 1, 0, False)


def test_a_worker_imports_a_module_given_as_a_file_path(profile, tmp_path, monkeypatch):
    # fresh-user review (issue 15): `python -m grpo_lab --import path/to/task.py` imports a module
    # whose directory need not be on a worker's sys.path; the worker is given that directory
    # along with the module's name and puts it on its path when the name alone does not import
    import sys

    from grpo_lab.cli import main as cli
    from grpo_lab import tasks as tasks_mod

    mod = tmp_path / "somewhere" / "pool_file_task.py"
    mod.parent.mkdir()
    mod.write_text(
        "from dataclasses import dataclass\n"
        "from grpo_lab.tasks import ArithmeticTask, register_task\n\n\n"
        "@register_task('pool_file_task')\n"
        "@dataclass\n"
        "class FileTask(ArithmeticTask):\n"
        "    name: str = 'pool_file_task'\n"
        "    test_size: int = 4\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(tasks_mod, "TASKS", dict(tasks_mod.TASKS))
    root = str(mod.parent.resolve())
    try:
        cli.load_user_module(str(mod))  # what --import does in the parent process
        mine = replace(profile, task="pool_file_task")
        assert workers_mod._user_modules(GRPO, mine) == ("pool_file_task",)
        assert workers_mod._module_roots(workers_mod._user_modules(GRPO, mine)) == (("pool_file_task", root),)
        # a fresh worker: neither the module, nor its task, nor its directory
        del sys.modules["pool_file_task"]
        del tasks_mod.TASKS["pool_file_task"]
        sys.path.remove(root)
        with pytest.raises(ValueError, match="cannot import 'pool_file_task'"):  # the name alone: not found
            runs_mod._train_one(GRPO, mine, 0, 0, False, None, ("pool_file_task",))
        rows = runs_mod._train_one(GRPO, mine, 0, 0, False, None, (("pool_file_task", root),))
        assert sys.path[0] == root and "pool_file_task" in tasks_mod.TASKS
        assert rows["step"].tolist() == [0]  # steps=0: the base policy's evaluation only
    finally:
        sys.modules.pop("pool_file_task", None)


def test_workers_exit_when_their_parent_dies_without_stopping_them(tmp_path):
    """A parent that ends by os._exit (as a Jupyter kernel whose client has gone: no atexit handler
    runs, so shutdown_workers is never called) leaves no worker behind: each exits within seconds.
    Before the parent watch, the two idle workers of every executed chapter stayed alive (about 0.7 GB
    each) until the machine rebooted."""
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import math, os\n"
        "from grpo_lab.experiments import map_workers\n"
        "from grpo_lab.experiments.workers import _POOL\n"
        "if __name__ == '__main__':\n"
        "    assert map_workers(math.sqrt, [4.0, 9.0], n_jobs=2) == [2.0, 3.0]\n"
        "    print(' '.join(map(str, _POOL['executor']._processes)), flush=True)\n"
        "    os._exit(0)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(
        os.path.abspath(ex.__file__))), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    workers = [int(p) for p in out.stdout.split()]
    assert len(workers) == 2 and os.getpid() not in workers

    def alive(pid: int) -> bool:  # a zombie (exited, not yet reaped by whoever adopted it) counts as gone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        status = f"/proc/{pid}/status"
        if os.path.exists(status):
            with open(status) as f:
                return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
        return True

    deadline = time.monotonic() + 30
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [p for p in workers if alive(p)]
    for p in left:  # do not leave them to the rest of the suite
        os.kill(p, 9)
    assert not left, f"workers {left} outlived their parent"
