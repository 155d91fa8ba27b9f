"""Periodic checkpoints and resume of runs: ``TrainerConfig.save_every`` (atomic, the newest
``save_total_limit`` kept), ``experiments.run(..., resume=True)``, the run directories
(:mod:`grpo_lab.experiments.run_dirs`) and the command line's ``--resume``. The central check: a run
killed with SIGKILL mid-way and resumed ends with the history of an uninterrupted run, bit for bit."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from grpo_lab.cli import main as cli
from grpo_lab.algo.algorithms import DAPO, GRPO
from grpo_lab.experiments import Profile, run
from grpo_lab.experiments.run_dirs import checkpoints_dir, latest_checkpoint, seed_dir
from grpo_lab.policy.models import build_char_tokenizer, tiny_policy
from grpo_lab.tasks import get_task
from grpo_lab.training.trainer import MEASURED_COLUMNS, Trainer, TrainerConfig

# these tests train a random tiny policy, which never solves a problem, on purpose (checkpoints and resume must not
# change the numbers, signal or none); the trainer's warning that it has no learning signal is tested in
# tests/training/test_learning_signal.py
pytestmark = pytest.mark.filterwarnings("ignore::grpo_lab.training.learning_signal.NoLearningSignalWarning")

from _toys import TINY, tiny_profile

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    return tiny_profile(tmp_path_factory.mktemp("base"), steps=STEPS, eval_every=2)


@pytest.fixture(scope="module")
def reference(profile):
    """The uninterrupted run (no output directory), two seeds."""
    return run("GRPO", profile=profile, seeds=[0, 1], progress=False, cache=False).history


def _numbers(h: pd.DataFrame) -> pd.DataFrame:
    return h.drop(columns=[c for c in MEASURED_COLUMNS if c in h]).reset_index(drop=True)


# ------------------------------------------------------------------------------- run directories
def test_seed_dir_layout_and_safe_names(tmp_path):
    assert seed_dir(tmp_path, "GRPO", 3) == tmp_path / "GRPO" / "seed-3"
    odd = seed_dir(tmp_path, "GRPO (beta=0.04)", 0)
    assert odd.parent.parent == tmp_path and odd.name == "seed-0"
    assert odd.parent.name.startswith("GRPO_beta_0.04-") and "(" not in odd.parent.name
    # two names that read the same once made safe never share a directory
    assert seed_dir(tmp_path, "a b", 0) != seed_dir(tmp_path, "a_b", 0) != seed_dir(tmp_path, "a/b", 0)
    assert seed_dir(tmp_path, "..", 0).parent.parent == tmp_path
    assert checkpoints_dir(odd) == odd / "checkpoints"
    with pytest.raises(ValueError, match="algo_name"):
        seed_dir(tmp_path, "", 0)


def test_save_every_needs_an_output_dir(profile, tok):
    policy = tiny_policy(tok, TINY, seed=0)
    with pytest.raises(ValueError, match="save_every=2.*output_dir"):
        Trainer(policy, tok, get_task("arithmetic", test_size=5), GRPO, TrainerConfig(save_every=2))
    with pytest.raises(ValueError, match="save_every=2.*output_dir"):
        run("GRPO", profile=profile, seeds=[0], save_every=2, progress=False)
    with pytest.raises(ValueError, match="resume=True.*output_dir"):
        run("GRPO", profile=profile, seeds=[0], resume=True, progress=False)


def test_periodic_checkpoints_keep_the_newest_and_ignore_a_half_written_one(tok, tmp_path):
    cfg = TrainerConfig(prompts_per_step=2, group_size=2, max_new_tokens=6, eval_every=0, output_dir=str(tmp_path),
                        save_every=2, save_total_limit=2, progress=False, report_to=())
    tr = Trainer(tiny_policy(tok, TINY, seed=0), tok, get_task("arithmetic", test_size=5), GRPO.replace(kl=None), cfg)
    ckpts = checkpoints_dir(tmp_path)
    ckpts.mkdir(parents=True)
    (ckpts / ".step-000001.saving").mkdir()  # as a save killed mid-way leaves it
    (ckpts / ".step-000001.saving" / "state.json").write_text("{}")
    tr.train(5)  # saves at 2, 4 and (the last step of the call) 5; keeps 4 and 5
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-000004", "step-000005"]
    assert latest_checkpoint(tmp_path) == ckpts / "step-000005"
    (ckpts / ".step-000006.saving").mkdir()
    (ckpts / "step-000007").mkdir()  # no state.json: not a finished checkpoint
    assert latest_checkpoint(tmp_path) == ckpts / "step-000005"
    back = Trainer.resume(ckpts / "step-000004", output={"output_dir": str(tmp_path / "moved"), "save_every": 1})
    assert back.step == 4 and back.config.output_dir == str(tmp_path / "moved") and back.config.save_every == 1
    with pytest.raises(ValueError, match="only the output fields.*'lr'"):
        Trainer.resume(ckpts / "step-000004", output={"lr": 1.0})
    cfg_none = TrainerConfig(prompts_per_step=2, group_size=2, max_new_tokens=6, eval_every=0, save_total_limit=None,
                             output_dir=str(tmp_path / "all"), save_every=1, progress=False, report_to=())
    Trainer(tiny_policy(tok, TINY, seed=0), tok, get_task("arithmetic", test_size=5), GRPO.replace(kl=None),
            cfg_none).train(3)
    assert len(list(checkpoints_dir(tmp_path / "all").iterdir())) == 3  # None keeps every one


# ------------------------------------------------------------------------------- resume in process
def test_checkpointing_does_not_change_the_numbers_and_a_finished_run_is_read_back(profile, reference, tmp_path,
                                                                                   monkeypatch):
    out = tmp_path / "out"
    a = run("GRPO", profile=profile, seeds=[0, 1], progress=False, output_dir=str(out), save_every=2)
    pd.testing.assert_frame_equal(_numbers(a.history), _numbers(reference))
    for s in (0, 1):
        d = seed_dir(out, "GRPO", s)
        assert json.loads((d / "run.json").read_text())["config"]["seed"] == s
        assert latest_checkpoint(d).name == f"step-{STEPS:06d}"
    from grpo_lab.experiments import runs

    def no_training(*a, **k):
        raise AssertionError("a finished seed must not be trained again")

    monkeypatch.setattr(runs, "_fresh_trainer", no_training)
    monkeypatch.setattr(runs.Trainer, "resume", no_training)
    b = run("GRPO", profile=profile, seeds=[0, 1], progress=False, output_dir=str(out), save_every=2, resume=True)
    pd.testing.assert_frame_equal(b.history, a.history)


def test_a_run_resumes_from_its_latest_checkpoint(profile, reference, tmp_path):
    out = tmp_path / "out"
    run("GRPO", profile=profile, seeds=[0], progress=False, output_dir=str(out), save_every=2, save_total_limit=None)
    d = seed_dir(out, "GRPO", 0)
    assert [p.name for p in sorted(checkpoints_dir(d).iterdir())] == ["step-000002", "step-000004", "step-000006"]
    import shutil

    for name in ("step-000004", "step-000006"):  # as if killed during step 5
        shutil.rmtree(checkpoints_dir(d) / name)
    (d / "result.json").unlink()
    more = run("GRPO", profile=profile, seeds=[0], progress=False, output_dir=str(out), save_every=2,
               save_total_limit=None, resume=True)
    pd.testing.assert_frame_equal(_numbers(more.history), _numbers(reference[reference["seed"] == 0]))
    (d / "result.json").unlink()
    with pytest.raises(ValueError, match="step-000006 is past it; ask for at least 6 steps"):
        run("GRPO", profile=profile, seeds=[0], steps=4, progress=False, output_dir=str(out), resume=True)


def test_resume_refuses_another_configuration_naming_every_difference(profile, tmp_path):
    out = tmp_path / "out"
    run("GRPO", profile=profile, seeds=[0], steps=1, progress=False, output_dir=str(out), save_every=1)
    with pytest.raises(ValueError, match="holds an earlier run; pass resume=True"):
        run("GRPO", profile=profile, seeds=[0], steps=1, progress=False, output_dir=str(out))
    with pytest.raises(ValueError) as info:
        run(GRPO.replace(eps_high=0.28), profile=profile, seeds=[0], steps=2, progress=False, output_dir=str(out),
            resume=True, lr=3e-4, save_every=5)
    text = str(info.value)
    assert "lr: 0.0001 in the checkpoint, 0.0003 requested" in text
    assert "eps_high: 0.2 in the checkpoint, 0.28 requested" in text
    assert "save_every" not in text  # an output field: not part of the run
    # a checkpoint of another preset under the same name
    with pytest.raises(ValueError, match="dynamic_sampling: False in the checkpoint, True requested"):
        run(DAPO.replace(name="GRPO"), profile=profile, seeds=[0], steps=2, progress=False, output_dir=str(out),
            resume=True)
    # a seed directory without run.json: the checkpoint's own state is compared
    (seed_dir(out, "GRPO", 0) / "run.json").unlink()
    with pytest.raises(ValueError, match="lr: 0.0001 in the checkpoint, 0.0003 requested"):
        run("GRPO", profile=profile, seeds=[0], steps=2, progress=False, output_dir=str(out), resume=True, lr=3e-4)


# ------------------------------------------------------------------------------- SIGKILL, then resume
_CHILD = """
import sys, time
from grpo_lab.experiments import Profile, run
from grpo_lab.training.trainer import Trainer, TrainerConfig

save = Trainer._periodic_save
def slow_save(self, final=False):  # time for the parent to kill this process between two steps or in a save
    out = save(self, final)
    time.sleep(0.4)
    return out
Trainer._periodic_save = slow_save
prof = Profile(name="t", base=sys.argv[1], task="arithmetic", steps={steps},
               config=TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=2, threads=1),
               task_kwargs=(("test_size", 5),))
run("GRPO", profile=prof, seeds=[0], progress=False, cache=False, output_dir=sys.argv[2], save_every=1)
"""


@pytest.mark.slow  # about 10 s: a second python process imports torch and transformers
def test_a_run_killed_with_sigkill_resumes_to_the_same_history_bit_for_bit(profile, reference, tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", GRPO_LAB_RUN_CACHE="off")
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_CHILD).format(steps=STEPS), profile.base,
                              str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ckpts = checkpoints_dir(seed_dir(out, "GRPO", 0))
    deadline = time.monotonic() + 120
    try:
        while not (ckpts / "step-000002" / "state.json").is_file():
            assert child.poll() is None, child.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.02)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    d = seed_dir(out, "GRPO", 0)
    assert not (d / "result.json").exists() and 2 <= int(latest_checkpoint(d).name[5:]) < STEPS
    resumed = run("GRPO", profile=profile, seeds=[0], progress=False, cache=False, output_dir=str(out),
                  save_every=1, threads=1, resume=True)
    pd.testing.assert_frame_equal(_numbers(resumed.history), _numbers(reference[reference["seed"] == 0]))


# ------------------------------------------------------------------------------- command line
def test_cli_writes_per_seed_directories_and_resumes(profile, tmp_path, capsys):
    out = tmp_path / "runs" / "r.json"
    args = ["GRPO", "--model", profile.base, "--seeds", "0", "--steps", "2", "--set", "prompts_per_step=2",
            "--set", "group_size=4", "--set", "max_new_tokens=8", "--set", "eval_every=1", "--out", str(out),
            "--no-progress"]
    assert cli.main(args + ["--save-every", "1"]) == 0
    d = seed_dir(tmp_path / "runs" / "r", "GRPO", 0)
    assert latest_checkpoint(d).name == "step-000002" and (d / "result.json").is_file()
    first = json.loads(out.read_text())
    capsys.readouterr()
    assert cli.main(args + ["--resume"]) == 0  # the existing --out is allowed with --resume
    assert json.loads(out.read_text())["history"] == first["history"]
    assert cli.main(args + ["--resume", "--set", "lr=1e-3"]) == 2
    err = capsys.readouterr().err
    assert "lr: 0.0003 in the checkpoint, 0.001 requested" in err
    assert cli.main(["DAPO"] + args[1:] + ["--resume"]) == 2
    assert "holds a run of GRPO, not of DAPO" in capsys.readouterr().err
    assert cli.main(args + ["--overwrite"]) == 0  # replaces the run and its directory
    assert cli.main(args[:-3] + ["--out", str(tmp_path / "none.json"), "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err


# ------------------------------------------------------------------------------- GPU chapter runs
def test_a_chapter_run_resumes_after_a_crash_and_starts_afresh_once_complete(profile, tmp_path, monkeypatch):
    from grpo_lab import experiments, lab
    from grpo_lab.experiments import runs

    kw = dict(seeds=(0, 1), steps=3, profile=profile, save_every=1, progress=False)
    whole = lab.run_chapter_gpu("99_whole", ["GRPO"], out=tmp_path / "whole.json", **kw)["GRPO"].history
    assert not checkpoints_dir(seed_dir(tmp_path / "whole", "GRPO", 0)).exists()  # deleted once finished
    assert (seed_dir(tmp_path / "whole", "GRPO", 1) / "result.json").is_file()

    save = Trainer._periodic_save

    def crash(self, final=False):  # seed 1 dies right after its step-2 checkpoint
        out = save(self, final)
        if self.config.seed == 1 and self.step == 2:
            raise RuntimeError("killed")
        return out

    monkeypatch.setattr(Trainer, "_periodic_save", crash)
    path = tmp_path / "99_crash.json"
    with pytest.raises(RuntimeError, match="killed"):
        lab.run_chapter_gpu("99_crash", ["GRPO"], out=path, **kw)
    assert experiments.load_results(path).provenance["complete"] is False  # seed 0 finished and was written
    monkeypatch.setattr(Trainer, "_periodic_save", save)
    fresh, resumed = [], []
    monkeypatch.setattr(runs, "_fresh_trainer", lambda *a, _f=runs._fresh_trainer: fresh.append(1) or _f(*a))
    monkeypatch.setattr(runs.Trainer, "resume", lambda *a, _r=Trainer.resume, **k: resumed.append(a[0]) or _r(*a, **k))
    again = lab.run_chapter_gpu("99_crash", ["GRPO"], out=path, **kw)["GRPO"].history
    assert fresh == [] and [p.name for p in resumed] == ["step-000002"]  # seed 0 read back, seed 1 resumed
    pd.testing.assert_frame_equal(_numbers(again), _numbers(whole))
    assert experiments.load_results(path).provenance["complete"] is True
    lab.run_chapter_gpu("99_crash", ["GRPO"], out=path, **kw)  # complete: trained afresh
    assert len(fresh) == 2
