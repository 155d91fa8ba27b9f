"""Declared inputs, run-configuration checks, the shared-name rule, statistics of any shape with metrics,
per-response indicators, an absent clip fraction, and the sampler-learner mismatch corrections (TIS / MIS)."""

import types

import pytest
import torch

from grpo_lab.algo import hparams
from grpo_lab.algo.advantages import ADVANTAGE_ESTIMATORS, AdvantageBatch
from grpo_lab.algo.algorithms import GRPO, MIS, TIS, Algorithm, CISPO, GMPO
from grpo_lab.algo.objectives import MISMATCH_CORRECTIONS, SURROGATES, policy_loss, ppo_surrogate


def _batch(seed=0, B=6, T=7, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g, dtype=dtype) * 2).requires_grad_()
    old = (logp.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=dtype)).clamp(max=0)
    beh = (old + 0.5 * torch.randn(B, T, generator=g, dtype=dtype)).clamp(max=0)
    adv = torch.randn(B, generator=g, dtype=dtype)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 4:] = False
    mask[3, 1:] = False
    return logp, old, beh, adv, mask


def test_declare_refuses_an_unknown_input_and_lists_the_known():
    with pytest.raises(ValueError, match=r"unknown input\(s\) \['sampler'\].*behaviour_logp"):
        hparams.declare(inputs=("sampler",))


def test_a_declared_input_is_required_and_an_undeclared_one_not_handed_over(monkeypatch):
    seen = {}

    @hparams.declare(inputs=("correct",))
    def reads_correct(ctx, *, eps_low: float = 0.2, eps_high: float = 0.2):
        seen.update(correct=ctx.correct, rewards=ctx.rewards, beh=ctx.behaviour_logp)
        return ppo_surrogate(ctx, eps_low=eps_low, eps_high=eps_high)

    monkeypatch.setitem(SURROGATES, "reads_correct", reads_correct)
    algo = GRPO.replace(surrogate="reads_correct", kl=None, beta=0.0)
    logp, old, beh, adv, mask = _batch()
    with pytest.raises(ValueError, match=r"surrogate='reads_correct' \(reads_correct\) declares the input 'correct'"):
        policy_loss(logp, old, adv, mask, algo)
    correct = torch.tensor([True, False, True, True, False, False])
    policy_loss(logp, old, adv, mask, algo, inputs={"correct": correct, "rewards": torch.ones(6)})
    assert torch.equal(seen["correct"], correct) and seen["rewards"] is None and seen["beh"] is None
    assert algo.inputs() == {"advantage": (), "loss": ("correct",)}


def test_shared_name_default_that_differs_from_the_field_is_refused(monkeypatch):
    def ce_like(ctx, *, eps_low: float = 0.2, eps_high: float = 0.28):
        return ppo_surrogate(ctx, eps_low=eps_low, eps_high=eps_high)

    monkeypatch.setitem(SURROGATES, "ce_like", ce_like)
    with pytest.raises(ValueError, match=r"eps_high=0.28 by default.*Algorithm field \(default 0.2\).*eps_high: float"):
        GRPO.replace(surrogate="ce_like")
    # the built-ins that set other values declare them without a default: the presets give them
    assert (CISPO.values_for(SURROGATES["cispo"]), GMPO.values_for(SURROGATES["gmpo"])) == (
        {"eps_low": 1.0, "eps_high": 0.28, "mask_eps_low": None, "mask_eps_high": None},
        {"eps_low": 0.4, "eps_high": 0.4})


def test_statistic_of_any_shape_with_metrics_and_per_response_indicators(monkeypatch):
    def bounds(ctx):
        b = ctx.mask.shape[0]
        return torch.stack([torch.full((b, 3), 0.2), torch.full((b, 3), 0.3)], 1), {"bounds_mean": 0.25}

    @hparams.declare(batch_statistics={"bounds": bounds})
    def adaptive(ctx, *, eps_low: float = 0.2, eps_high: float = 0.2):
        assert ctx.stats["bounds"].shape == (ctx.mask.shape[0], 2, 3)
        lo, hi = float(ctx.stats["bounds"][0, 0, 0]), float(ctx.stats["bounds"][0, 1, 0])
        loss, ind = ppo_surrogate(ctx, eps_low=lo, eps_high=hi)
        first = torch.zeros(ctx.mask.shape[0], dtype=torch.bool)
        first[0] = True
        return loss, {**ind, "row_flag": first}

    monkeypatch.setitem(SURROGATES, "adaptive", adaptive)
    algo = GRPO.replace(surrogate="adaptive", kl=None, beta=0.0)
    logp, old, beh, adv, mask = _batch(1)
    m = policy_loss(logp, old, adv, mask, algo).metrics
    assert m["bounds_mean"] == 0.25
    assert m["row_flag"] == pytest.approx(1 / 6) and m["row_flag"].weight == 6  # a mean over responses


def test_clip_fraction_is_absent_for_a_surrogate_without_a_clip(monkeypatch):
    monkeypatch.setitem(SURROGATES, "plain", lambda ctx: (-ctx.log_ratio * ctx.advantages,
                                                          {"grad": ctx.advantages != 0}))
    logp, old, beh, adv, mask = _batch(2)
    m = policy_loss(logp, old, adv, mask, Algorithm(surrogate="plain", kl=None)).metrics
    assert "clip_frac" not in m and "clip_frac_high" not in m and "grad_token_frac" in m
    assert "clip_frac" in policy_loss(logp, old, adv, mask, GRPO.replace(kl=None)).metrics


def _reference_loss(logp, old, beh, adv, mask, mode, cap, eps=0.2):
    """float64 loss written from the formula: GRPO's seq-mean-token-mean PPO clip times w (TRL 1.16's four modes)."""
    total, n = 0.0, 0
    for i in range(logp.shape[0]):
        idx = mask[i].nonzero().flatten().tolist()
        if not idx:
            continue
        row_rho = 1.0
        for t in idx:
            row_rho *= float(torch.exp(old[i, t] - beh[i, t]))
        acc = 0.0
        for t in idx:
            rho = row_rho if mode.startswith("sequence") else float(torch.exp(old[i, t] - beh[i, t]))
            w = min(rho, cap) if mode.endswith("truncate") else (rho if rho <= cap else 0.0)
            r = torch.exp(logp[i, t] - old[i, t])
            pg = -torch.minimum(r * adv[i], torch.clamp(r, 1 - eps, 1 + eps) * adv[i])
            acc = acc + w * pg
        total = total + acc / len(idx)
        n += 1
    return total / n


@pytest.mark.parametrize("mode", sorted(MISMATCH_CORRECTIONS))
@pytest.mark.parametrize("cap", [2.0, 1.2])
def test_mismatch_matches_a_float64_reference(mode, cap):
    logp, old, beh, adv, mask = _batch(3)
    algo = GRPO.replace(kl=None, beta=0.0, mismatch=mode, is_cap=cap)
    out = policy_loss(logp, old, adv, mask, algo, inputs={"behaviour_logp": beh})
    (g,) = torch.autograd.grad(out.loss, logp)
    ref = _reference_loss(logp, old, beh, adv, mask, mode, cap)
    (g_ref,) = torch.autograd.grad(ref, logp)
    torch.testing.assert_close(out.loss, ref, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(g, g_ref, atol=1e-12, rtol=1e-12)
    assert 0 <= out.metrics["is_capped_frac"] <= 1


def test_sampler_equal_to_pi_old_is_grpo_bit_for_bit():
    logp, old, beh, adv, mask = _batch(4, dtype=torch.float32)
    ref = old - 0.1
    base = policy_loss(logp, old, adv, mask, GRPO, ref_logp=ref)
    (g0,) = torch.autograd.grad(base.loss, logp)
    for algo in (TIS, MIS, GRPO.replace(mismatch="token_mask"), GRPO.replace(mismatch="sequence_truncate")):
        out = policy_loss(logp, old, adv, mask, algo, ref_logp=ref, inputs={"behaviour_logp": old})
        (g,) = torch.autograd.grad(out.loss, logp)
        assert torch.equal(out.loss, base.loss) and torch.equal(g, g0)


def test_sequence_ratio_never_overflows():
    logp, old, beh, adv, mask = _batch(5)
    beh = torch.full_like(old, -80.0)  # sum over a row of log rho: hundreds of nats
    for mode in MISMATCH_CORRECTIONS:
        out = policy_loss(logp, old, adv, mask, GRPO.replace(kl=None, mismatch=mode), inputs={"behaviour_logp": beh})
        assert torch.isfinite(out.loss)


def test_config_check_refuses_a_mismatch_with_behaviour_old_logp():
    cfg = types.SimpleNamespace(old_logp="behaviour", group_size=4)
    with pytest.raises(ValueError, match=r"TIS: mismatch='token_truncate' needs TrainerConfig."
                                         r"old_logp='recompute', got old_logp='behaviour'"):
        TIS.check_config(cfg)
    MIS.check_config(types.SimpleNamespace(old_logp="recompute"))
    GRPO.check_config(cfg)


def test_an_estimator_reads_correct_and_checks_the_group_size(monkeypatch):
    def k_below_g(config, values):
        if config.group_size <= values["k"]:
            raise ValueError(f"pass_at_k needs group_size > k={values['k']}, got {config.group_size}")

    @hparams.declare(inputs=("correct",), validate_config=k_below_g)
    def pass_at_k(batch, *, k: int = 2):
        assert batch.group_size == 4
        return batch.correct.float() - batch.correct.float().view(-1, 4).mean(1).repeat_interleave(4)

    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "pass_at_k", pass_at_k)
    algo = GRPO.replace(advantage="pass_at_k")
    with pytest.raises(ValueError, match=r"GRPO: advantage='pass_at_k': pass_at_k needs group_size > k=2, got 2"):
        algo.check_config(types.SimpleNamespace(group_size=2, old_logp="recompute"))
    rewards = torch.tensor([0.3, 0.9, 0.1, 0.0, 1.0, 1.0, 0.5, 0.2])  # not binary
    with pytest.raises(ValueError, match="declares the input 'correct'"):
        algo.estimate_advantages(AdvantageBatch.from_groups(rewards, 4))
    correct = rewards > 0.5
    adv = algo.estimate_advantages(AdvantageBatch.from_groups(rewards, 4, correct=correct))
    assert adv.shape == (8,) and float(adv[1]) == pytest.approx(0.75)
