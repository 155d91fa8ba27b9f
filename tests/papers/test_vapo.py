"""VAPO and PPO in the trainer: presets, the critic (CriticModel), decoupled critic targets, the
positive-example NLL term, value pretraining, the new history columns and exact resume with a critic.

The math of each piece (GAE, length-adaptive lambda, value loss, NLL) is tested against float64
references in ``test_vapo_math.py``; here we check that the trainer wires them as the papers say.
"""

import warnings

import pandas as pd
import pytest
import torch

import grpo_lab.tasks as tasks_mod
from _toys import TINY, HalfTask
from grpo_lab.algo.advantages import AdvantageBatch, gae, outcome_token_rewards
from grpo_lab.algo.algorithms import GRPO, PPO, PRESETS, VAPO, get_algorithm
from grpo_lab.policy.models import CriticModel, tiny_policy
from grpo_lab.training.trainer import Trainer, TrainerConfig

TIMING = ["tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "peak_mem_mb"]




@pytest.fixture
def half(monkeypatch):
    monkeypatch.setitem(tasks_mod.TASKS, "half", HalfTask)


def make(tok, algo=VAPO, **kw):
    cfg = dict(prompts_per_step=4, group_size=4, max_new_tokens=8, eval_every=0, progress=False, lr=1e-2,
               value_lr=2e-2, seed=0, minibatches=2)
    cfg.update(kw)
    return Trainer(tiny_policy(tok, TINY, seed=0), tok, HalfTask(test_size=5), algo, TrainerConfig(**cfg))


# ---- presets ---------------------------------------------------------------------------------------
def test_ppo_preset_is_vapos_vanilla_baseline():
    # VAPO §5.1: GAE lambda 0.95, gamma 1.0, sample-level loss, clip 0.2 (no decoupling, no adaptive lambda)
    assert (PPO.advantage, PPO.gamma, PPO.lam, PPO.lam_alpha, PPO.critic_lam) == ("gae", 1.0, 0.95, None, None)
    assert (PPO.eps_low, PPO.eps_high, PPO.aggregation) == (0.2, 0.2, "seq_mean_token_mean")
    assert PPO.nll_coef == 0.0 and not PPO.uses_kl


def test_vapo_preset_adds_the_papers_loss_changes():
    # VAPO §5.1: decoupled lambda_critic = 1.0, alpha = 0.05, clip 0.2 / 0.28, token-level loss, mu = 0.1
    assert (VAPO.critic_lam, VAPO.lam_alpha) == (1.0, 0.05)
    assert (VAPO.eps_low, VAPO.eps_high, VAPO.aggregation, VAPO.nll_coef) == (0.2, 0.28, "token_mean", 0.1)
    # everything else is PPO's
    same = {k: v for k, v in PPO.describe().items()
            if k not in ("name", "critic_lam", "lam_alpha", "eps_high", "aggregation", "nll_coef")}
    assert {k: VAPO.describe()[k] for k in same} == same
    assert PRESETS["VAPO"] is VAPO and get_algorithm("ppo") is PPO


@pytest.mark.parametrize("field,value", [("gamma", 1.5), ("lam", -0.1), ("critic_lam", 2.0), ("lam_alpha", 0.0),
                                         ("value_clip_eps", -1.0), ("nll_coef", -0.1), ("lam", float("nan"))])
def test_bad_gae_fields_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        VAPO.replace(**{field: value})


# ---- critic targets ----------------------------------------------------------------------------------
def _batch():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float32)
    values = torch.tensor([[0.2, 0.4, 0.6, 9.0], [0.5, 0.1, 9.0, 9.0]])
    return AdvantageBatch.from_groups(torch.tensor([1.0, 0.0]), 1, mask=mask, values=values)


def test_decoupled_critic_targets_are_monte_carlo_returns():
    # lambda_critic = 1, gamma = 1, one outcome reward: the target of every real token is the reward
    # (worked by hand: R = 1 for row 0, 0 for row 1), whatever the critic predicts
    t = VAPO.value_targets(_batch())
    assert torch.equal(t, torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))


def test_shared_lambda_targets_are_advantage_plus_value():
    # critic_lam=None: the target is GAE's return at the policy's lambda = A + V (PPO before VC-PPO)
    b = _batch()
    adv = PPO.estimate_advantages(b)
    want = gae(outcome_token_rewards(b.rewards, b.mask), b.values, b.mask, gamma=1.0, lam=0.95)[1]
    assert torch.allclose(PPO.value_targets(b), want, atol=1e-6)
    assert torch.allclose(PPO.value_targets(b, adv), (adv + b.values) * b.mask, atol=1e-6)
    assert not torch.allclose(PPO.value_targets(b), VAPO.value_targets(b))


def test_gae_estimator_uses_the_length_adaptive_lambda():
    b = _batch()
    r = outcome_token_rewards(b.rewards, b.mask)
    # alpha = 0.5: lengths 3 and 2 give lambda = 1 - 1/1.5 = 1/3 and 1 - 1/1 = 0 (hand-worked)
    want = torch.cat([gae(r[:1], b.values[:1], b.mask[:1], lam=1 / 3)[0], gae(r[1:], b.values[1:], b.mask[1:], lam=0.0)[0]])
    got = VAPO.replace(lam_alpha=0.5).estimate_advantages(b)
    assert got.shape == (2, 4) and torch.allclose(got, want, atol=1e-6)
    fixed = VAPO.replace(lam_alpha=None, lam=0.95).estimate_advantages(b)
    assert torch.allclose(fixed, gae(r, b.values, b.mask, lam=0.95)[0], atol=1e-6)


# ---- the trainer ---------------------------------------------------------------------------------------
def test_trainer_builds_a_critic_only_when_the_estimator_needs_values(tok, half):
    assert isinstance(make(tok, VAPO.replace(lam_alpha=1.0)).value_model, CriticModel)
    assert make(tok, GRPO.replace(kl=None, beta=0.0)).value_model is None


def test_vapo_trains_policy_and_critic_and_logs_the_critic(tok, half):
    tr = make(tok, VAPO.replace(lam_alpha=1.0))
    w0 = [p.detach().clone() for p in tr.value_model.parameters()]
    h = tr.train(3)
    for col in ("value_loss", "explained_variance", "value_mean", "return_mean", "adv_mean", "adv_std", "adv_min",
                "adv_max", "peak_mem_mb", "step_seconds"):
        assert col in h and h[col].notna().all(), col
    assert (h["peak_mem_mb"] > 0).all() and (h["adv_min"] <= h["adv_max"]).all()
    assert h["return_mean"].between(0, 1).all()  # MC returns of a {0, 1} reward
    assert any(not torch.equal(a, b) for a, b in zip(w0, tr.value_model.parameters()))


def test_grpo_history_has_nan_critic_columns(tok, half):
    h = make(tok, GRPO.replace(kl=None, beta=0.0)).train(1)
    assert h["explained_variance"].isna().all() and h["adv_std"].notna().all()


def test_gae_runs_without_groups(tok, half):
    # no group baseline: one response per question is fine (VAPO's "without group sampling" row),
    # and the group_size=1 warning of group-baseline estimators does not fire
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        tr = make(tok, VAPO.replace(lam_alpha=1.0), prompts_per_step=8, group_size=1)
    h = tr.train(2)
    assert h["adv_std"].gt(0).all()


def test_nll_term_reaches_the_trainer_update(tok, half, capture_grads):
    # (that it counts correct responses only is tested on the loss itself in test_vapo_math.py)
    grads = {}
    for mu in (0.0, 0.1):
        tr = make(tok, VAPO.replace(lam_alpha=1.0, nll_coef=mu), minibatches=1)
        capture_grads(tr, grads, mu)
        tr.train(1)
    assert any(not torch.equal(a, b) for a, b in zip(grads[0.0], grads[0.1]))


def test_pretrain_value_fits_returns_and_leaves_the_policy(tok, half):
    tr = make(tok, VAPO.replace(lam_alpha=1.0), prompts_per_step=8)
    p0 = [p.detach().clone() for p in tr.policy.parameters()]
    w = tr.pretrain_value(12)
    assert list(w["value_step"]) == list(range(1, 13))
    assert all(torch.equal(a, b) for a, b in zip(p0, tr.policy.parameters()))
    # the zero-initialised critic predicts 0 (explained variance exactly 0 on the first batch, measured
    # before fitting); fitting moves its mean prediction to the mean return and lowers the loss
    assert w["value_mean"].iloc[0] == 0.0 and w["explained_variance"].iloc[0] == 0.0
    gap = (w["value_mean"] - w["return_mean"]).abs()
    assert gap.iloc[-4:].mean() < 0.5 * gap.iloc[0]
    assert w["value_loss"].iloc[-4:].mean() < 0.8 * w["value_loss"].iloc[0]
    with pytest.raises(ValueError, match="no value model"):
        make(tok, GRPO.replace(kl=None, beta=0.0)).pretrain_value(1)


def test_value_warmup_steps_pretrain_inside_train(tok, half):
    tr = make(tok, VAPO.replace(lam_alpha=1.0), value_warmup_steps=2)
    tr.train(1)
    assert len(tr.value_warmup_rows) == 2 and tr.step == 1


def test_saved_critic_is_reused_through_value_init(tok, half, tmp_path):
    tr = make(tok, VAPO.replace(lam_alpha=1.0))
    tr.pretrain_value(2)
    tr.value_model.save(tmp_path / "critic")
    again = make(tok, VAPO.replace(lam_alpha=1.0), value_init=str(tmp_path / "critic"))
    for (k, a), (_, b) in zip(tr.value_model.state_dict().items(), again.value_model.state_dict().items()):
        assert torch.equal(a, b), k
    with pytest.raises(FileNotFoundError, match="critic.json"):
        make(tok, VAPO, value_init=str(tmp_path / "nowhere"))


def test_scratch_critic_is_smaller_and_trains(tok, half):
    tr = make(tok, VAPO.replace(lam_alpha=1.0), value_init="scratch")
    assert isinstance(tr.value_model, CriticModel)
    assert tr.value_model.head.in_features == 64
    assert tr.train(1)["value_loss"].notna().all()


def test_exact_resume_with_a_critic(tok, half, tmp_path):
    algo = VAPO.replace(lam_alpha=1.0)
    straight = make(tok, algo, value_warmup_steps=1)
    straight.train(4)
    first = make(tok, algo, value_warmup_steps=1)
    first.train(2)
    first.save(tmp_path / "ck")
    assert (tmp_path / "ck" / "critic" / "critic.json").is_file()
    torch.manual_seed(123)
    resumed = Trainer.resume(tmp_path / "ck")  # the CriticModel is rebuilt from the checkpoint
    assert resumed.value_warmup_rows == first.value_warmup_rows
    resumed.train(2)
    for a, b in zip(straight.value_model.parameters(), resumed.value_model.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters()):
        assert torch.equal(a, b)
    pd.testing.assert_frame_equal(straight.history.drop(columns=TIMING, errors="ignore"),
                                  resumed.history.drop(columns=TIMING, errors="ignore"),
                                  check_exact=True, check_dtype=False)


def test_peak_memory_is_reset_per_step_on_linux_cpu():
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("VmHWM is Linux-only")
    # in a fresh process: in the test session's own, the 64 MiB can land on pages the allocator already holds
    # resident (left by earlier tests), which the resident set does not see grow (seen once in CI)
    import subprocess

    code = ("import torch\n"
            "from grpo_lab.training.trainer import peak_memory_mb, reset_peak_memory\n"
            "reset_peak_memory('cpu'); low = peak_memory_mb('cpu')\n"
            "big = torch.ones(64 * 2**20 // 4); big += 1  # 64 MiB, touched\n"
            "high = peak_memory_mb('cpu'); del big\n"
            "reset_peak_memory('cpu'); after = peak_memory_mb('cpu')\n"
            "print(low, high, after)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    low, high, after = map(float, out.stdout.split())
    assert high >= low + 48 and after < high - 48  # the window saw the 64 MiB, the next one does not


# ---- review fixes ------------------------------------------------------------------------------------------
def test_value_targets_ignore_nan_and_inf_at_padding():
    b = AdvantageBatch.from_groups(torch.tensor([1.0, 0.0]), 2, mask=torch.tensor([[1, 1, 0], [1, 0, 0.0]]),
                                   values=torch.tensor([[0.1, 0.2, float("nan")], [0.3, float("inf"), 0.0]]))
    for algo in (PPO, VAPO, GRPO.replace(kl=None, beta=0.0)):
        t = algo.value_targets(b)
        assert torch.isfinite(t).all() and (t[b.mask == 0] == 0).all(), algo.name


def test_a_critic_beside_a_group_estimator_regresses_on_monte_carlo_returns():
    # a group advantage plus the critic's own value is no return: with critic_lam=None and a non-value
    # estimator the targets are the outcome rewards (gamma = 1), whatever the critic predicts (by hand)
    b = AdvantageBatch.from_groups(torch.tensor([1.0, 1.0, 0.0, 0.0]), 2, mask=torch.ones(4, 2),
                                   values=torch.full((4, 2), 5.0))
    t = GRPO.replace(kl=None, beta=0.0).value_targets(b)
    assert torch.equal(t, torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))


def test_history_means_ignore_nan_values_at_padding(tok, half):
    class NanPad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.v = torch.nn.Embedding(len(tok), 1)

        def values(self, rollout):
            v = self.v(rollout.completion_ids).squeeze(-1)
            return torch.where(rollout.completion_mask != 0, v, torch.full_like(v, float("nan")))

    cfg = TrainerConfig(prompts_per_step=4, group_size=4, max_new_tokens=8, eval_every=0, progress=False, seed=0)
    tr = Trainer(tiny_policy(tok, TINY, seed=0), tok, HalfTask(test_size=5), VAPO.replace(lam_alpha=1.0), cfg,
                 value_model=NanPad())
    h = tr.train(1)
    assert h[["value_mean", "return_mean", "explained_variance", "value_loss"]].notna().all().all()


@pytest.mark.parametrize("bad, error, match", [
    (lambda ro: torch.zeros(len(ro)), ValueError, r"shape \[B, T\]"),
    (lambda ro: torch.zeros(ro.completion_ids.shape[0], ro.completion_ids.shape[1] + 2), ValueError, "shape"),
    (lambda ro: torch.zeros(ro.completion_ids.shape, dtype=torch.long), TypeError, "float tensor"),
    (lambda ro: torch.zeros(ro.completion_ids.shape), ValueError, "without grad"),
])
def test_a_value_model_of_the_wrong_shape_or_without_grad_is_named(tok, half, bad, error, match):
    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

        def values(self, rollout):
            return bad(rollout)

    cfg = TrainerConfig(prompts_per_step=2, group_size=2, max_new_tokens=8, eval_every=0, progress=False, seed=0)
    tr = Trainer(tiny_policy(tok, TINY, seed=0), tok, HalfTask(test_size=5), VAPO.replace(lam_alpha=1.0), cfg,
                 value_model=Bad())
    with pytest.raises(error, match=match):
        tr.train(1)


def test_settings_that_would_do_nothing_are_refused_or_flagged(tok, half):
    with pytest.raises(ValueError, match="no value model"):
        make(tok, GRPO.replace(kl=None, beta=0.0), value_warmup_steps=2)
    with pytest.warns(RuntimeWarning, match="value_init='scratch' is ignored"):
        make(tok, GRPO.replace(kl=None, beta=0.0), value_init="scratch")
    # VAPO's alpha = 0.05 at an 8-token budget: lambda = 0 for every response -> a warning with the fix
    with pytest.warns(RuntimeWarning, match="lam_alpha=0.05"):
        make(tok, VAPO)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        make(tok, VAPO.replace(lam_alpha=4.0))


def test_value_init_errors_say_what_to_pass(tok, half, tmp_path):
    tr = make(tok, VAPO.replace(lam_alpha=1.0))
    tr.save(tmp_path / "ck")
    with pytest.raises(FileNotFoundError, match="its critic is"):
        make(tok, VAPO.replace(lam_alpha=1.0), value_init=str(tmp_path / "ck"))
    assert isinstance(make(tok, VAPO.replace(lam_alpha=1.0), value_init=str(tmp_path / "ck" / "critic")).value_model,
                      CriticModel)


def test_axes_show_value_fields_only_for_value_based_estimators():
    assert VAPO.axes() != PPO.replace(eps_high=0.28, aggregation="token_mean").axes()
    assert {k: GRPO.axes()[k] for k in ("gamma", "lam", "lam_alpha", "critic_lam", "value_clip_eps")} == dict.fromkeys(
        ("gamma", "lam", "lam_alpha", "critic_lam", "value_clip_eps"))
    assert (VAPO.axes()["lam"], VAPO.axes()["lam_alpha"], PPO.axes()["lam"]) == (None, 0.05, 0.95)
