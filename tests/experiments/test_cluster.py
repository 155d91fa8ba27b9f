"""A run that survives a cluster: SIGTERM writes a checkpoint and exits 143 with the resume command, a second
writer on a run directory is refused (a stale lock taken over), a failed checkpoint save says so in one line,
a damaged checkpoint directory is found before training, divergence names the learning rate."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grpo_lab.cli import main as cli
from grpo_lab.experiments.run_dirs import checkpoints_dir, latest_checkpoint, seed_dir
from grpo_lab.training.history import MEASURED_COLUMNS

from _toys import tiny_profile

pytestmark = pytest.mark.filterwarnings("ignore::grpo_lab.training.learning_signal.NoLearningSignalWarning")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    return tiny_profile(tmp_path_factory.mktemp("base"), steps=STEPS, eval_every=2)


def _args(profile, out: Path) -> list[str]:
    return ["GRPO", "--model", str(profile.base), "--seeds", "0", "--steps", str(STEPS), "--set",
            "prompts_per_step=2", "--set", "group_size=4", "--set", "max_new_tokens=8", "--set", "eval_every=2",
            "--set", "threads=1", "--out", str(out), "--no-progress", "--no-save-model", "--no-cache"]


def _history(out: Path) -> list[dict]:
    """The run's history without the measured columns (wall times, memory)."""
    return [{k: v for k, v in row.items() if k not in MEASURED_COLUMNS}
            for row in json.loads(out.read_text())["history"]]


_CHILD = """
import sys, time
from grpo_lab.training.trainer import Trainer
step = Trainer._train_step
def slow_step(self):  # a step long enough for the parent's SIGTERM to arrive in the middle of it
    row = step(self)
    time.sleep(0.5)
    return row
Trainer._train_step = slow_step
from grpo_lab.cli.main import main
sys.exit(main(sys.argv[1:], prog="grpo-lab"))
"""


@pytest.mark.slow  # about 6 s: a second python process imports torch and transformers
def test_sigterm_writes_a_checkpoint_exits_143_and_resume_is_bit_identical(profile, tmp_path):
    out = tmp_path / "run.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", GRPO_LAB_RUN_CACHE="off")
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_CHILD)] + _args(profile, out), env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = seed_dir(tmp_path / "run", "GRPO", 0) / "metrics.jsonl"
    deadline = time.monotonic() + 120
    try:
        while not (log.is_file() and log.read_text().count("\n") >= 2):  # the base evaluation and step 1 logged
            assert child.poll() is None, child.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "no step within 120 s"
            time.sleep(0.02)
        child.send_signal(signal.SIGTERM)  # during step 2's sleep: it finishes, then the checkpoint
        err = child.communicate(timeout=60)[1]
    finally:
        child.kill()
    assert child.returncode == 143, err
    d = seed_dir(tmp_path / "run", "GRPO", 0)
    ckpt = latest_checkpoint(d)
    assert ckpt is not None and 2 <= int(ckpt.name[5:]) < STEPS and not (d / "result.json").exists()
    assert f"stopped by SIGTERM after step {int(ckpt.name[5:])}; checkpoint {ckpt}" in err
    assert "--resume" in err and str(ckpt) in err
    assert cli.main(_args(profile, out) + ["--resume"]) == 0
    whole = tmp_path / "whole.json"
    assert cli.main(_args(profile, whole)) == 0  # the uninterrupted run
    assert _history(out) == _history(whole)


_SLOW_STEPS = """
from grpo_lab.training.trainer import Trainer
import time
step = Trainer._train_step
def slow_step(self):  # imported by every interpreter of the run (sitecustomize): the workers' steps are slow too
    row = step(self)
    time.sleep(0.5)
    return row
Trainer._train_step = slow_step
"""


@pytest.mark.slow  # about 15 s: a parent and two spawned workers import torch and transformers
def test_sigterm_with_jobs_is_forwarded_and_every_worker_writes_a_checkpoint(profile, tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_SLOW_STEPS)
    out = tmp_path / "run.json"
    args = _args(profile, out) + ["--jobs", "2"]
    args[args.index("--seeds") + 1:args.index("--seeds") + 2] = ["0", "1"]
    env = dict(os.environ, PYTHONPATH=f"{hooks}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1", GRPO_LAB_RUN_CACHE="off")
    child = subprocess.Popen([sys.executable, "-m", "grpo_lab"] + args, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    logs = [seed_dir(tmp_path / "run", "GRPO", s) / "metrics.jsonl" for s in (0, 1)]
    deadline = time.monotonic() + 120
    try:
        while not all(f.is_file() and f.read_text().count("\n") >= 2 for f in logs):  # step 1 of both logged
            assert child.poll() is None, child.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "no step within 120 s"
            time.sleep(0.02)
        child.send_signal(signal.SIGTERM)  # the parent only: it forwards to the workers
        err = child.communicate(timeout=60)[1]
    finally:
        child.kill()
    assert child.returncode == 143, err
    assert "SIGTERM: forwarded to 2 worker process(es)" in err
    for s in (0, 1):
        d = seed_dir(tmp_path / "run", "GRPO", s)
        ckpt = latest_checkpoint(d)
        assert ckpt is not None and 2 <= int(ckpt.name[5:]) < STEPS and not (d / "result.json").exists(), err
        assert str(ckpt) in err  # named in the message and the resume hint
    assert "--resume" in err
    assert cli.main(args[:-2] + ["--resume"]) == 0  # without --jobs 2: in this process


# ------------------------------------------------------------------------------- the run directory's lock
def _hold_lock(out: Path, ready) -> None:
    from grpo_lab.experiments.run_dirs import run_lock

    with run_lock(out):
        ready.set()
        time.sleep(60)


def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holder_is_taken_over(profile, tmp_path, capsys):
    from grpo_lab.experiments import run
    from grpo_lab.experiments.run_dirs import LOCK_FILE, RunDirectoryLocked, lock_holder, run_lock

    import multiprocessing

    out = tmp_path / "run"
    fork = multiprocessing.get_context("fork")  # a second process without a second import of torch
    ready = fork.Event()
    held = fork.Process(target=_hold_lock, args=(out, ready), daemon=True)
    held.start()
    try:
        assert ready.wait(30)
        with pytest.raises(RunDirectoryLocked, match=rf"run directory {out} is in use by pid {held.pid} on host "):
            run("GRPO", profile=profile, seeds=[0], steps=1, progress=False, cache=False, output_dir=str(out))
        assert not (out / "GRPO").exists()  # refused before anything was written
    finally:
        held.kill()
        held.join()
    assert lock_holder(out)["pid"] == held.pid  # killed: its record stays, its flock is gone
    capsys.readouterr()
    with run_lock(out):
        assert lock_holder(out)["pid"] == os.getpid()
        with run_lock(out):  # reentrant in one process
            pass
    assert f"taking over the lock of pid {held.pid} on host" in capsys.readouterr().err
    assert lock_holder(out) is None and (out / LOCK_FILE).is_file()  # released: the record emptied


# ------------------------------------------------------------------------------- wandb
def test_wandb_keeps_its_run_id_across_resumes_and_opens_no_run_before_the_first_row(tmp_path, monkeypatch):
    import types

    from grpo_lab.algo.algorithms import GRPO
    from grpo_lab.training.callbacks import WandbLogger
    from grpo_lab.training.trainer import TrainerConfig

    inits, logged = [], []

    class Run:  # a stand-in for wandb's Run: records what is logged
        resumed, starting_step = False, 0

        def log(self, data, step):
            logged.append(step)

        def finish(self):
            pass

    stub = types.SimpleNamespace(init=lambda **kw: inits.append(kw) or Run(), Settings=lambda **kw: kw)
    monkeypatch.setitem(sys.modules, "wandb", stub)
    monkeypatch.setattr("grpo_lab.training.callbacks._require", lambda *a: None)
    trainer = types.SimpleNamespace(algo=GRPO, config=TrainerConfig(seed=3), task=types.SimpleNamespace(name="t"),
                                    rows=[])
    first = WandbLogger(tmp_path)
    first.on_train_begin(trainer)
    first.on_train_end(trainer)  # killed or stopped before a row: no wandb run at all
    assert inits == []
    trainer.rows += [{"step": 1}, {"step": 2}]
    first.on_train_begin(trainer)
    first.on_step(trainer, trainer.rows[-1])
    first.on_train_end(trainer)
    run_id = inits[0]["id"]
    assert len(run_id) == 8 and inits[0]["resume"] == "allow" and logged == [1, 2]
    again = WandbLogger(tmp_path)  # a resumed run (a new process): the same id
    trainer.rows.append({"step": 3})
    again.on_train_begin(trainer)
    again.on_step(trainer, trainer.rows[-1])
    assert [kw["id"] for kw in inits] == [run_id, run_id] and logged == [1, 2, 1, 2, 3]
    assert (tmp_path / "wandb" / WandbLogger.RUN_ID_FILE).read_text() == run_id + "\n"


# ------------------------------------------------------------------------------- --resume messages
def test_resume_says_what_each_seed_resumes_from_only_after_the_checks(profile, tmp_path, capsys):
    out = tmp_path / "r.json"
    args = _args(profile, out) + ["--save-every", "1"]
    args[args.index("--steps") + 1] = "2"
    assert cli.main(args) == 0
    d = seed_dir(tmp_path / "r", "GRPO", 0)
    capsys.readouterr()
    assert cli.main(args + ["--resume", "--set", "lr=1e-3"]) == 2  # D9: the refusal, and no "read back" before it
    captured = capsys.readouterr()
    assert "in the checkpoint, 0.001 requested" in captured.err and "read back" not in captured.out
    assert cli.main(args + ["--resume"]) == 0
    assert f"seed 0: finished earlier, read back from {d / 'result.json'} (nothing to train)" in capsys.readouterr().out
    (d / "result.json").write_text('{"steps": 2, "rows": [')  # damaged (D13): said so, not silently retrained
    assert cli.main(args + ["--resume"]) == 0
    assert (f"seed 0: {d / 'result.json'} is unreadable (JSONDecodeError: Expecting value: line 1 column 23 (char 22)):"
            f" not read back; resumes from {d / 'checkpoints' / 'step-000002'} (step 2 of 2)") in capsys.readouterr().out


# ------------------------------------------------------------------------------- a full disk, a damaged checkpoint
def test_a_full_disk_at_a_save_is_one_line_and_a_directory_without_state_json_is_refused_before_training(
        profile, tmp_path, monkeypatch):
    import torch

    from grpo_lab.experiments import run
    from grpo_lab.training.checkpoints import CheckpointWriteError

    out = tmp_path / "out"
    kw = dict(profile=profile, seeds=[0], progress=False, cache=False, output_dir=str(out), save_every=1)
    run("GRPO", steps=1, **kw)
    real = torch.save

    def full(obj, f, *a, **k):  # what torch.save raises when the disk fills mid-file
        if str(f).endswith("optimizer.pt"):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1129920 vs 1129808")
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", full)
    ckpts = checkpoints_dir(seed_dir(out, "GRPO", 0))
    with pytest.raises(CheckpointWriteError) as info:
        run("GRPO", steps=2, resume=True, **kw)
    text = str(info.value)
    assert text.startswith(f"could not write the checkpoint {ckpts / 'step-000002'} (disk full? ")
    assert f"the previous checkpoint {ckpts / 'step-000001'} is intact" in text and "--resume" in text
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-000001"]  # nothing half-written left
    monkeypatch.setattr(torch, "save", real)
    (ckpts / "step-000002").mkdir()  # a partial copy: a step directory without state.json
    (ckpts / "step-000002" / "optimizer.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=rf"{ckpts / 'step-000002'} is not a complete checkpoint \(no state.json; "
                                         rf"a partial copy\?\); delete it .* resumes from step-000001"):
        run("GRPO", steps=2, resume=True, **kw)


def test_resume_of_a_registered_task_that_cannot_be_rebuilt_offers_only_task_equals(tmp_path):
    from grpo_lab.training.checkpoints import _resume_task

    spec = {"name": "arithmetic", "class": "grpo_lab.tasks.arithmetic.Arithmetic", "params": None, "registered": False}
    from grpo_lab.tasks import TASKS, _class_path

    spec["class"] = _class_path(TASKS["arithmetic"])
    with pytest.raises(ValueError) as info:
        _resume_task(spec, None, tmp_path)
    assert "Pass the task object" in str(info.value) and "register_task" not in str(info.value)  # D14


# ------------------------------------------------------------------------------- divergence names the lr (D6)
def test_divergence_names_the_lr_and_exits_1_from_the_cli(profile, tmp_path, tok, capsys, monkeypatch):
    from _toys import TINY, HalfTask
    from grpo_lab.algo.algorithms import GRPO
    from grpo_lab.policy.models import tiny_policy
    from grpo_lab.training.trainer import Trainer, TrainerConfig, TrainingDiverged

    def trainer(lr):
        config = TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=0, progress=False,
                               lr=lr, warmup=0, seed=0, epochs=2)
        return Trainer(tiny_policy(tok, TINY, seed=0), tok, HalfTask(test_size=5), GRPO, config)

    with pytest.raises(TrainingDiverged, match=r"the updates diverged at step 1 .*lr=1e\+09 is likely too large"):
        trainer(1e9).train(2)  # NaN log-probabilities after the first update
    with pytest.warns(RuntimeWarning, match=r"step 1: kl=.* nats per token .*diverged; lr=10 is likely too large"):
        trainer(10.0).train(1)  # finite, but a kl of ~1e11 nats per token
    # the CLI (the profile's tiny model earns no reward, so no update moves it): the second step's forward gives NaN
    step = Trainer._train_step

    def nan_after_an_update(self):
        if self.step == 1:
            raise ValueError("log-probability undefined (NaN) at position (0, 0) (18 position(s) in all)")
        return step(self)

    monkeypatch.setattr(Trainer, "_train_step", nan_after_an_update)
    args = _args(profile, tmp_path / "d.json") + ["--set", "lr=1e9", "--set", "warmup=0"]
    args[args.index("--steps") + 1] = "2"
    assert cli.main(args) == 1  # not 2, a user's mistake: a ValueError from the policy's log-probabilities
    err = capsys.readouterr().err
    assert "TrainingDiverged" in err and "lr=1e+09 is likely too large" in err
