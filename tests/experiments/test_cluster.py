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
