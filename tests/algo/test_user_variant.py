"""A fifth variant with a hyper-parameter of its own, added from outside the package
(book/examples/dual_clip_variant.py: dual-clip PPO, ``dual_clip_c``): it is validated, trains,
saves and resumes with its value, is listed and set on the command line, and is keyed in the run
cache, with no package file edited."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from grpo_lab.algo import algorithms, objectives
from grpo_lab.experiments import config_hash, get_profile
from _toys import TINY
from grpo_lab.policy.models import tiny_policy
from grpo_lab.tasks import ArithmeticTask
from grpo_lab.training.trainer import Trainer, TrainerConfig

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "book" / "examples" / "dual_clip_variant.py"
TIMING = ["tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "peak_mem_mb"]


@pytest.fixture
def variant():
    """The user module, imported from its file; what it registered is removed afterwards."""
    spec = importlib.util.spec_from_file_location("dual_clip_variant", MODULE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    objectives.SURROGATES.pop("dual_clip", None)
    algorithms.PRESETS.pop("DUAL_CLIP", None)


def _trainer(tok, algo, **kw):
    cfg = dict(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=0, progress=False, lr=1e-2,
               seed=0, minibatches=2)
    cfg.update(kw)
    return Trainer(tiny_policy(tok, TINY, seed=0), tok, ArithmeticTask(test_size=5), algo, TrainerConfig(**cfg))


def test_its_hyperparameter_is_declared_validated_and_shown(variant):
    algo = variant.DUAL_CLIP
    assert algo.params == {"dual_clip_c": 3.0} and algo.axes()["dual_clip_c"] == 3.0
    assert algo.replace(dual_clip_c=2.5).params == {"dual_clip_c": 2.5}
    assert algorithms.GRPO.params == {}  # no other preset carries it
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        algo.replace(dual_clip_c=0.5)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['dual_clip_k'\]"):
        algo.replace(dual_clip_k=2.0)
    # the run cache and the provenance key it: another value is another configuration
    prof = get_profile("cpu")
    assert config_hash(algo, prof, 2) != config_hash(algo.replace(dual_clip_c=2.5), prof, 2)


def test_the_loss_is_the_papers(variant):
    # Eq. 5 by hand: A = -1, r = e^2 ~ 7.39 > c = 3: the objective is c A = -3 (no gradient);
    # r = e^0.5 ~ 1.65 < c: PPO's min(r A, 1.2 A) = r A (gradient A r); A = +1, r = e^0.1: clip at 1.2 not binding
    old = torch.full((2, 2), -3.0, dtype=torch.float64)
    lr = torch.tensor([[2.0, 0.5], [0.1, 0.1]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([-1.0, 1.0], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    out = objectives.policy_loss(old + lr, old, adv, mask, variant.DUAL_CLIP.replace(aggregation="token_mean"))
    hand = (3.0 + torch.exp(torch.tensor(0.5, dtype=torch.float64)) - 2 * torch.exp(torch.tensor(0.1,
                                                                                                 dtype=torch.float64))) / 4
    torch.testing.assert_close(out.loss.detach(), hand, rtol=1e-12, atol=0)
    (g,) = torch.autograd.grad(out.loss, lr)
    assert g[0, 0] == 0 and out.metrics["clip_frac_low"] == 0.25


def test_it_trains_saves_and_resumes_with_its_value(tok, variant, tmp_path):
    algo = variant.DUAL_CLIP.replace(dual_clip_c=2.5)
    straight = _trainer(tok, algo)
    straight.train(3)
    first = _trainer(tok, algo)
    first.train(2)
    first.save(tmp_path / "ckpt")
    resumed = Trainer.resume(tmp_path / "ckpt")
    assert resumed.algo == algo and resumed.algo.params == {"dual_clip_c": 2.5}
    resumed.train(1)
    pd.testing.assert_frame_equal(straight.history.drop(columns=TIMING, errors="ignore"),
                                  resumed.history.drop(columns=TIMING, errors="ignore"), check_exact=True)
    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters()):
        assert torch.equal(a, b)


def _cli(*args, cwd):
    env = {**os.environ, "GRPO_LAB_RUN_CACHE": "off", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "grpo_lab", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_it_is_listed_and_set_on_the_command_line(tmp_path):
    out = _cli("list", "--import", str(MODULE), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "DUAL_CLIP" in out.stdout and "dual_clip_c" in out.stdout
    bad = _cli("DUAL_CLIP", "--import", str(MODULE), "--set", "dual_clip_c=0.5", "--steps", "1", cwd=tmp_path)
    assert bad.returncode == 2 and "dual_clip_c must be > 1" in bad.stderr
    res = tmp_path / "dual.json"
    run = _cli("DUAL_CLIP", "--import", str(MODULE), "--set", "dual_clip_c=2.5", "--steps", "1", "--seeds", "0",
               "--out", str(res), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    prov = json.loads(res.read_text())["provenance"]
    assert prov["algo"]["params"] == {"dual_clip_c": 2.5} and prov["algo"]["surrogate"] == "dual_clip"


def test_resume_without_the_module_says_to_import_it(tok, variant, tmp_path):
    tr = _trainer(tok, variant.DUAL_CLIP)
    tr.train(1)
    tr.save(tmp_path / "ckpt")
    objectives.SURROGATES.pop("dual_clip")  # a fresh process that has not imported the module
    with pytest.raises(ValueError, match="import it before Trainer.resume"):
        Trainer.resume(tmp_path / "ckpt")


def test_a_hyperparameter_named_like_a_trainer_setting_is_refused_on_the_command_line(monkeypatch, capsys):
    # a surrogate's own `temperature` would be hidden by TrainerConfig.temperature: --set says so
    from grpo_lab.cli import main as cli

    def warm(ctx, *, temperature: float = 2.0):
        return objectives.ppo_surrogate(ctx)

    monkeypatch.setitem(objectives.SURROGATES, "warm", warm)
    with pytest.raises(cli.UsageError, match="ambiguous, both a TrainerConfig field and a hyper-parameter"):
        cli.parse_set(["temperature=0.5"])
    assert algorithms.GRPO.replace(surrogate="warm", temperature=0.5).params == {"temperature": 0.5}
