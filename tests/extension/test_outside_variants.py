"""Issue 53: no private override is ever needed. Four 2025 variants written in a file outside the package
(tests/extension/outside_variants.py: CE-GPPO, BAPO, Pass@k advantages, a TIS surrogate reading the sampler's
log-probs) are checked against float64 transcriptions of their papers, trained with ``experiments.run`` in two
worker processes and resumed from a checkpoint to the uninterrupted history, and trained from the command line
with ``--import``."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from _toys import tiny_profile
from grpo_lab import experiments
from grpo_lab.algo import algorithms
from grpo_lab.algo.advantages import ADVANTAGE_ESTIMATORS, GROUP_BASELINE_ESTIMATORS, AdvantageBatch
from grpo_lab.algo.objectives import SURROGATES, policy_loss
from grpo_lab.cli.main import load_user_module
from grpo_lab.experiments.run_dirs import checkpoints_dir, seed_dir
from grpo_lab.tasks import TASKS
from grpo_lab.training.config import TrainerConfig
from grpo_lab.training.history import MEASURED_COLUMNS

HERE = Path(__file__).resolve().parent
VARIANTS, TASK = HERE / "outside_variants.py", HERE / "coin_task.py"
F64 = torch.float64


@pytest.fixture(scope="module")
def v():
    """The user's two files imported as ``--import`` imports them; what they registered is removed afterwards."""
    path = list(sys.path)
    load_user_module(str(TASK))
    mod = load_user_module(str(VARIANTS))
    yield mod
    experiments.shutdown_workers()
    for k in ("ce_gppo", "bapo", "tis_ppo"):
        SURROGATES.pop(k, None)
    ADVANTAGE_ESTIMATORS.pop("passk", None)
    GROUP_BASELINE_ESTIMATORS.discard("passk")
    for k in ("CE_GPPO", "BAPO", "PASSK", "TIS_PPO"):
        algorithms.PRESETS.pop(k, None)
    TASKS.pop("coin", None)
    sys.modules.pop("outside_variants", None)
    sys.modules.pop("coin_task", None)
    sys.path[:] = path


def _batch(seed=0, b=4, t=5):
    g = torch.Generator().manual_seed(seed)
    old = -3 - torch.rand(b, t, generator=g, dtype=F64) * 3
    lr = (torch.randn(b, t, generator=g, dtype=F64) * 0.6).requires_grad_()
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[1, 3:] = False
    mask[3, 1:] = False
    adv = torch.tensor([1.3, -0.7, -1.1, 0.9], dtype=F64)[:b]
    return old, lr, adv, mask


def _token_mean_reference(per_token, lr, adv, mask):
    """float64 token-mean of ``per_token(lr_it, A_i)`` over real tokens, written with loops (the paper's sum)."""
    total, n = 0.0, 0
    for i in range(lr.shape[0]):
        for t in range(lr.shape[1]):
            if mask[i, t]:
                total, n = total + per_token(lr[i, t], float(adv[i])), n + 1
    return total / n


# ------------------------------------------------------------------------------------------------ float64 checks
def test_ce_gppo_loss_and_gradient_are_the_papers(v):
    # arXiv 2509.20712 Eq. 5, by case: the value is the clipped one outside the range, the gradient beta (1 -+ eps) A
    old, lr, adv, mask = _batch(0)
    algo = v.CE_GPPO
    out = policy_loss(old + lr, old, adv, mask, algo)
    (grad,) = torch.autograd.grad(out.loss, lr)
    el, eh, b1, b2 = 0.2, 0.28, 0.75, 1.0

    def value(x, a):
        r = math.exp(float(x))
        if a < 0 and r < 1 - el:
            return -b1 * (1 - el) * a
        if a > 0 and r > 1 + eh:
            return -b2 * (1 + eh) * a
        return -r * a

    # d loss / d log r equals the value in every case: r / sg(r) is 1 with slope 1, -r A has slope -r A
    slope = value
    n = int(mask.sum())
    assert out.loss.item() == pytest.approx(_token_mean_reference(value, lr.detach(), adv, mask), rel=1e-12)
    want = torch.tensor([[slope(lr.detach()[i, t], float(adv[i])) / n if mask[i, t] else 0.0 for t in range(lr.shape[1])]
                         for i in range(lr.shape[0])], dtype=F64)
    torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-15)
    assert out.metrics["gppo_low"] + out.metrics["gppo_high"] > 0  # the batch leaves the range
    assert "clip_frac" not in out.metrics  # no clip removes a gradient: the column is absent, not 0


def _bapo_reference(lr, adv, mask, lo=0.6, hi=1.2, lo_max=0.9, hi_max=3.0, step=0.05, rho0=0.5):
    """BAPO's search (WooooDyy/BAPO recipe/bapo/policy_loss.py) and loss on Python floats."""
    toks = [(math.exp(float(lr[i, t])), float(adv[i])) for i in range(lr.shape[0]) for t in range(lr.shape[1])
            if mask[i, t]]

    def rho(lo, hi):
        pos = neg = 0.0
        for r, a in toks:
            e = (min(r, hi) if a >= 0 else max(r, lo)) * a
            pos, neg = pos + max(e, 0.0), neg + max(-e, 0.0)
        return math.inf if neg <= 0 else pos / neg

    while rho(lo, hi) < rho0 and lo < lo_max:
        lo = min(lo + step, lo_max)
    while rho(lo, hi) < rho0 and hi < hi_max:
        hi = min(hi + step, hi_max)
    loss = sum(-min(r * a, min(max(r, lo), hi) * a) for r, a in toks) / len(toks)
    return lo, hi, loss


@pytest.mark.parametrize("seed, shift, rho0", [(0, 0.0, 0.5), (1, -0.8, 0.5), (2, 0.5, 3.0), (3, 0.0, 0.01)])
def test_bapo_search_and_loss_are_the_references(v, seed, shift, rho0):
    old, lr, adv, mask = _batch(seed)
    lr = (lr.detach() + shift).requires_grad_()
    algo = v.BAPO.replace(bapo_rho0=rho0)
    lo, hi, loss = _bapo_reference(lr.detach(), adv, mask, rho0=rho0)
    out = policy_loss(old + lr, old, adv, mask, algo)
    assert (out.metrics["bapo_c_low"], out.metrics["bapo_c_high"]) == pytest.approx((lo, hi), abs=1e-12)
    assert out.loss.item() == pytest.approx(loss, rel=1e-12)


def test_bapo_bounds_move_on_a_negative_heavy_batch(v):
    old, lr, adv, mask = _batch(0)
    adv = torch.tensor([0.2, -1.5, -1.1, 0.1], dtype=F64)
    lo, hi, _ = _bapo_reference(lr.detach(), adv, mask)
    assert lo == pytest.approx(0.9) and hi > 1.2  # the search acts: both bounds raised
    out = policy_loss(old + lr, old, adv, mask, v.BAPO)
    assert (out.metrics["bapo_c_low"], out.metrics["bapo_c_high"]) == pytest.approx((lo, hi), abs=1e-12)


def _passk_reference(correct, n, k):
    """arXiv 2508.10751's per-response advantages with math.comb, one group at a time."""
    out = []
    for g in range(0, len(correct), n):
        c = sum(correct[g:g + n])
        r = 1 - math.comb(n - c, k) / math.comb(n, k)
        s = math.sqrt(r * (1 - r))
        for x in correct[g:g + n]:
            if s == 0:
                out.append(0.0)
            elif x:
                out.append((1 - r) / s)
            else:
                out.append((1 - r - math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1)) / s)
    return out


@pytest.mark.parametrize("n, k", [(5, 1), (5, 4), (8, 4), (8, 2)])
def test_passk_advantages_are_the_papers_and_read_correctness_not_rewards(v, n, k):
    g = torch.Generator().manual_seed(n * 10 + k)
    correct = torch.cat([torch.arange(n) < c for c in range(n + 1)])  # every count of correct, 0 to n
    want = torch.tensor(_passk_reference(correct.tolist(), n, k), dtype=F64)
    shaped = torch.where(correct, 1.7, -0.3) + torch.rand(len(correct), generator=g) * 0.1  # not binary
    algo = v.PASSK.replace(passk_k=k)
    got = algo.estimate_advantages(AdvantageBatch.from_groups(shaped, n, correct=correct))
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-7)
    assert got.view(-1, n).sum(1).abs().max() < 1e-5  # c A_pos + (n - c) A_neg = 0
    # zero groups: none correct, or at least n - k + 1 correct (every k-subset then holds a correct response)
    zero = got.view(-1, n).eq(0).all(1).tolist()
    assert zero == [c == 0 or n - c < k for c in range(n + 1)]
    with pytest.raises(ValueError, match="correct"):
        algo.estimate_advantages(AdvantageBatch.from_groups(shaped, n))


def test_passk_refuses_a_group_no_larger_than_k_when_it_meets_the_run(v):
    with pytest.raises(ValueError, match=r"group_size > passk_k.*group_size=4, passk_k=4"):
        v.PASSK.check_config(TrainerConfig(group_size=4))
    v.PASSK.check_config(TrainerConfig(group_size=5))
    with pytest.raises(ValueError, match="passk_k must be an int >= 1"):
        v.PASSK.replace(passk_k=0)


def test_tis_surrogate_is_the_truncated_weight_times_ppo_and_needs_recomputed_old_logp(v):
    old, lr, adv, mask = _batch(4)
    beh = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(9), dtype=F64) * 0.8
    out = policy_loss(old + lr, old, adv, mask, v.TIS_PPO, inputs={"behaviour_logp": beh})
    # by hand (float64 loops): GRPO's sequence-mean of token means of min(rho, 2) * -min(r A, clip(r) A)
    rows, lr0 = [], lr.detach()
    for i in range(4):
        terms = [min(math.exp(float(old[i, t] - beh[i, t])), 2.0)
                 * -min(math.exp(float(lr0[i, t])) * float(adv[i]),
                        min(max(math.exp(float(lr0[i, t])), 0.8), 1.2) * float(adv[i]))
                 for t in range(5) if mask[i, t]]
        rows.append(sum(terms) / len(terms))
    assert out.loss.item() == pytest.approx(sum(rows) / 4, rel=1e-12)
    assert 0 < out.metrics["tis_capped"] < 1
    # the package's own TIS (mismatch axis, token_truncate at C = 2) computes the same loss
    builtin = policy_loss(old + lr, old, adv, mask, algorithms.GRPO.replace(kl=None, beta=0.0, mismatch="token_truncate"),
                          inputs={"behaviour_logp": beh})
    assert out.loss.item() == pytest.approx(builtin.loss.item(), rel=1e-12)
    with pytest.raises(ValueError, match="old_logp='recompute', got old_logp='behaviour'"):
        v.TIS_PPO.check_config(TrainerConfig(old_logp="behaviour"))


# ------------------------------------------------------------------------------------------------ training
@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tiny_profile(tmp_path_factory.mktemp("base"), steps=2, eval_every=0)


def _setting(v, name):
    """``(algorithm, TrainerConfig overrides)``: Pass@k at k = 2 (G = 4), TIS against a bfloat16 sampler."""
    return {"CE_GPPO": (v.CE_GPPO, {}), "BAPO": (v.BAPO, {}), "PASSK": (v.PASSK.replace(passk_k=2), {}),
            "TIS_PPO": (v.TIS_PPO, {"rollout_dtype": "bfloat16"})}[name]


def _numbers(h):
    return h.drop(columns=[c for c in MEASURED_COLUMNS if c in h]).reset_index(drop=True)


@pytest.mark.slow  # about 10 s a variant on 2 cores (two worker processes, reused across the four)
@pytest.mark.parametrize("name", ["CE_GPPO", "BAPO", "PASSK", "TIS_PPO"])
def test_trains_in_two_workers_and_resumes_to_the_uninterrupted_history(v, base, tmp_path, name):
    algo, cfg = _setting(v, name)
    kw = dict(profile=base, seeds=[0, 1], steps=2, n_jobs=2, cache=False, task="coin", progress=False,
              output_dir=str(tmp_path), save_every=1, save_total_limit=None, **cfg)
    whole = experiments.run(algo, **kw).history
    assert len(whole[whole["step"] > 0]) == 4 and whole["grad_norm"].dropna().gt(0).any()
    own = {"CE_GPPO": "gppo_low", "BAPO": "bapo_c_high", "PASSK": "zero_adv_group_frac", "TIS_PPO": "tis_capped"}
    assert whole[own[name]].notna().any()
    for s in (0, 1):  # as if killed during step 2: its checkpoint and the result are gone
        d = seed_dir(tmp_path, algo.name, s)
        shutil.rmtree(checkpoints_dir(d) / "step-000002")
        (d / "result.json").unlink()
    resumed = experiments.run(algo, resume=True, **kw).history
    pd.testing.assert_frame_equal(_numbers(resumed), _numbers(whole))


def _cli(*args, cwd):
    env = {**os.environ, "GRPO_LAB_RUN_CACHE": "off", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "grpo_lab", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow  # four processes, each imports torch and trains one step
def test_each_trains_from_the_command_line_with_import(base, tmp_path):
    sets = ["prompts_per_step=2", "group_size=4", "max_new_tokens=8", "eval_every=0"]
    extra = {"PASSK": ["passk_k=2"], "TIS_PPO": ["rollout_dtype=bfloat16"]}
    procs = {}
    for name in ("CE_GPPO", "BAPO", "PASSK", "TIS_PPO"):
        args = [name, "--import", str(VARIANTS), "--import", str(TASK), "--task", "coin", "--model", base.base,
                "--steps", "1", "--seeds", "0", "--out", str(tmp_path / f"{name}.json"), "--no-progress"]
        for s in sets + extra.get(name, []):
            args += ["--set", s]
        procs[name] = _cli(*args, cwd=tmp_path)
    for name, p in procs.items():
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, (name, err[-3000:])
        prov = json.loads((tmp_path / f"{name}.json").read_text())["provenance"]
        assert prov["algo"]["name"] == name
    prov = json.loads((tmp_path / "PASSK.json").read_text())["provenance"]
    assert prov["algo"]["advantage"] == "passk" and prov["algo"]["params"] == {"passk_k": 2}
