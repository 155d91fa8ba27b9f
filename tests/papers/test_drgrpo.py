"""Tests for Dr. GRPO (Liu et al., arXiv 2503.20783) and the DeepSeek-V3.2 options (arXiv
2512.02556, Eqs. 7-9), the DeepSeekMath-V2 self-verification reward (its Eqs. 5-6) and mHC's
Sinkhorn-Knopp projection.

Hand-worked goldens: the per-token gradient weights of both biases Dr. GRPO removes, the RLOO
relation of App. A, the gradient identity of V3.2 Eq. 7 by exact enumeration of a small
categorical policy, the masking rule of Eqs. 8-9 on a worked example."""

import math
import sys
from pathlib import Path

import pytest
import torch

from grpo_lab.algo.advantages import group_advantages, rloo_advantages
from grpo_lab.algo.algorithms import (
    DAPO,
    DR_GRPO,
    GRPO,
    PRESETS,
    Algorithm,
    deepseek_v32,
    get_algorithm,
)
from grpo_lab.algo.objectives import aggregate, kl_estimate, offpolicy_sequence_mask, policy_loss
from grpo_lab.algo.rewards import self_verification_reward

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "book" / "examples"))
from mhc import product_gain, sinkhorn_knopp  # noqa: E402  (book/examples/mhc.py, chapter 3's sidebar)


def _token_grads(algo, adv, mask, **kw):
    """d loss / d logp for an on-policy step (ratio 1, clip inactive, no KL)."""
    logp = torch.zeros(mask.shape, dtype=torch.float64, requires_grad=True)
    out = policy_loss(logp, logp.detach(), adv, mask, algo, **kw)
    out.loss.backward()
    return logp.grad


# ------------------------------------------------------------------ presets
def test_dr_grpo_preset_values():
    d = DR_GRPO.describe()
    assert d == {
        "name": "DR_GRPO", "advantage": "group_mean", "adv_eps": 1e-4, "ratio_level": "token",
        "surrogate": "ppo", "eps_low": 0.2, "eps_high": 0.2, "aggregation": "seq_mean_token_sum_norm",
        "max_tokens": None, "kl": None, "beta": 0.0, "dynamic_sampling": False,
        "overlong_filter": False, "overlong_cache_len": None, "overlong_cache_frac": None,
        "kl_importance_correction": False,
        "offpolicy_mask_delta": None, "mask_eps_low": None, "mask_eps_high": None, "mismatch": None, "keep_sampling_mask": False,
        "gamma": 1.0, "lam": 0.95, "lam_alpha": None, "critic_lam": None, "value_clip_eps": None, "nll_coef": 0.0,
        "ntp_coef": 0.0,
        "params": {},
    }
    assert not DR_GRPO.uses_kl  # the paper takes beta = 0 throughout
    assert PRESETS["DR_GRPO"] is DR_GRPO and get_algorithm("dr_grpo") is DR_GRPO
    # max_tokens=None: the budget must come from the caller (the trainer passes max_new_tokens)
    m = torch.ones(2, 3)
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="max_tokens"):
        policy_loss(lp, lp, torch.tensor([1.0, -1.0]), m, DR_GRPO)


def test_grpo_and_dapo_presets_unchanged():
    common = {"kl_importance_correction": False, "offpolicy_mask_delta": None, "mask_eps_low": None, "mismatch": None, "keep_sampling_mask": False,
              "mask_eps_high": None, "gamma": 1.0, "lam": 0.95, "lam_alpha": None, "critic_lam": None,
              "value_clip_eps": None, "nll_coef": 0.0, "ntp_coef": 0.0, "params": {}}
    assert GRPO.describe() == {
        "name": "GRPO", "advantage": "group", "adv_eps": 1e-4, "ratio_level": "token", "surrogate": "ppo",
        "eps_low": 0.2, "eps_high": 0.2, "aggregation": "seq_mean_token_mean", "max_tokens": None,
        "kl": "k3", "beta": 0.04, "dynamic_sampling": False, "overlong_filter": False,
        "overlong_cache_len": None, "overlong_cache_frac": None, **common,
    }
    assert DAPO.describe() == {
        "name": "DAPO", "advantage": "group", "adv_eps": 1e-4, "ratio_level": "token", "surrogate": "ppo",
        "eps_low": 0.2, "eps_high": 0.28, "aggregation": "group_token_mean", "max_tokens": None,
        "kl": None, "beta": 0.0, "dynamic_sampling": True, "overlong_filter": True,
        "overlong_cache_len": None, "overlong_cache_frac": 0.2, **common,
    }
    assert Algorithm().kl_importance_correction is False and Algorithm().offpolicy_mask_delta is None


def test_deepseek_v32_needs_its_unreported_values():
    with pytest.raises(TypeError):
        deepseek_v32()  # beta, delta and eps are not reported by the paper: no defaults
    a = deepseek_v32(beta=0.01, delta=0.5, eps=0.2)
    assert (a.advantage, a.aggregation, a.kl, a.beta) == ("group_mean", "seq_mean_token_mean", "k3", 0.01)
    assert a.kl_importance_correction and a.offpolicy_mask_delta == 0.5
    assert a.eps_low == a.eps_high == 0.2 and a.ratio_level == "token"
    assert "DeepSeek-V3.2" not in PRESETS
    with pytest.raises(ValueError, match="offpolicy_mask_delta"):
        deepseek_v32(beta=0.01, delta=-0.1, eps=0.2)


@pytest.mark.parametrize("kw, match", [
    ({"offpolicy_mask_delta": -0.5}, "offpolicy_mask_delta"),
    ({"offpolicy_mask_delta": float("nan")}, "offpolicy_mask_delta"),
    ({"offpolicy_mask_delta": "0.1"}, "offpolicy_mask_delta"),
    ({"kl_importance_correction": 1}, "kl_importance_correction"),
])
def test_new_fields_are_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        Algorithm(**kw)


# ------------------------------------------------------------------ bias 1: length (1/|o_i|)
def test_length_bias_per_token_weights():
    # seq 0: correct (A=+1), 2 tokens; seq 1: wrong (A=-1), 4 tokens; MAX_TOKENS = 8; 2 sequences
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    g_grpo = _token_grads(GRPO.replace(beta=0.0), adv, mask)
    # seq_mean_token_mean: d loss / d logp_it = -A_i / (|o_i| * n_seq)
    exp_grpo = torch.tensor([[-1 / 4, -1 / 4, 0, 0], [1 / 8] * 4], dtype=torch.float64)
    torch.testing.assert_close(g_grpo, exp_grpo, rtol=0, atol=1e-15)
    g_dr = _token_grads(DR_GRPO, adv, mask, max_tokens=8)
    # seq_mean_token_sum_norm: -A_i / (MAX_TOKENS * n_seq), the same for every length
    exp_dr = torch.tensor([[-1 / 16, -1 / 16, 0, 0], [1 / 16] * 4], dtype=torch.float64)
    torch.testing.assert_close(g_dr, exp_dr, rtol=0, atol=1e-15)
    # under 1/|o_i| a wrong answer twice as long is pushed down half as hard per token
    mask2 = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    g2 = _token_grads(GRPO.replace(beta=0.0), torch.tensor([-1.0, -1.0], dtype=torch.float64), mask2)
    assert g2[1, 0] == pytest.approx(g2[0, 0] / 2)
    g2d = _token_grads(DR_GRPO, torch.tensor([-1.0, -1.0], dtype=torch.float64), mask2, max_tokens=8)
    assert g2d[1, 0] == g2d[0, 0]


def test_dr_grpo_algorithm_max_tokens_and_call_time_budget_agree():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([0.5, -0.5], dtype=torch.float64)
    a = _token_grads(DR_GRPO, adv, mask, max_tokens=6)
    b = _token_grads(DR_GRPO.replace(max_tokens=6), adv, mask)
    assert torch.equal(a, b)


# ------------------------------------------------------------------ bias 2: difficulty (std)
@pytest.mark.parametrize("G", [4, 8])
def test_std_normalisation_weight_for_binary_rewards(G):
    for k in range(1, G):
        p = k / G
        r = torch.tensor([1.0] * k + [0.0] * (G - k))
        a_z = group_advantages(r, G, scale="group", eps=0.0)
        a_m = group_advantages(r, G, scale="none")
        torch.testing.assert_close(a_m, r - p, rtol=0, atol=1e-7)
        w = 1.0 / math.sqrt(p * (1 - p) * G / (G - 1))  # 1 / unbiased std of a 0/1 group
        torch.testing.assert_close(a_z, a_m * w, rtol=1e-6, atol=1e-7)
    # the weight is larger for near-all-right or near-all-wrong groups (the difficulty bias)
    w = lambda p: 1.0 / math.sqrt(p * (1 - p) * G / (G - 1))  # noqa: E731
    assert w(1 / G) > w(0.5) and w((G - 1) / G) > w(0.5)
    # all-equal groups: advantage exactly 0 under both, nothing is amplified
    for v in (0.0, 1.0):
        r = torch.full((G,), v)
        assert torch.equal(group_advantages(r, G, scale="group"), torch.zeros(G))
        assert torch.equal(DR_GRPO.advantages(r, G), torch.zeros(G))


def test_rloo_is_group_mean_times_g_over_g_minus_1():
    g = torch.Generator().manual_seed(0)
    for G in (2, 3, 5):
        r = torch.rand(4 * G, generator=g, dtype=torch.float64)
        torch.testing.assert_close(rloo_advantages(r, G), DR_GRPO.advantages(r, G) * G / (G - 1),
                                   rtol=1e-5, atol=1e-6)
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])  # golden: mean 0.25; RLOO 1 - 0 = 1 = 4/3 * 0.75
    torch.testing.assert_close(rloo_advantages(r, 4), torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))


# ------------------------------------------------------------------ V3.2 Eq. 7 by enumeration
def _categorical(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(6, generator=g, dtype=torch.float64) for _ in range(3)]


def _kl(p_log, q_log):
    return (p_log.exp() * (p_log - q_log)).sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_eq7_importance_corrected_k3_is_exact_reverse_kl(seed):
    th_old, ref_l, shift = _categorical(seed)
    ref = torch.log_softmax(ref_l, -1)
    old = torch.log_softmax(th_old, -1)
    for theta0 in (th_old, th_old + 0.5 * shift):  # at theta_old and away from it
        theta = theta0.clone().requires_grad_(True)
        logp = torch.log_softmax(theta, -1)
        # every outcome o enumerated, weighted by its probability under the sampler pi_old
        est = kl_estimate(logp[None], ref[None], "k3", old_logp=old[None])[0]
        loss = (old.exp() * est).sum()
        (g_est,) = torch.autograd.grad(loss, theta)
        theta2 = theta0.clone().requires_grad_(True)
        kl = _kl(torch.log_softmax(theta2, -1), ref)
        (g_kl,) = torch.autograd.grad(kl, theta2)
        # E_{pi_old}[pi/pi_old * k3] = KL(pi_theta || pi_ref) for every theta: value and gradient
        assert float(loss.detach()) == pytest.approx(float(kl.detach()), rel=1e-12, abs=1e-14)
        torch.testing.assert_close(g_est, g_kl, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_plain_k3_gives_the_forward_kl_gradient(seed):
    th_old, ref_l, _ = _categorical(seed)
    ref = torch.log_softmax(ref_l, -1)
    old = torch.log_softmax(th_old, -1)
    theta = th_old.clone().requires_grad_(True)  # on-policy: theta = theta_old
    logp = torch.log_softmax(theta, -1)
    loss = (old.exp() * kl_estimate(logp[None], ref[None], "k3")[0]).sum()
    (g_k3,) = torch.autograd.grad(loss, theta)
    t_f = th_old.clone().requires_grad_(True)
    (g_fwd,) = torch.autograd.grad(_kl(ref, torch.log_softmax(t_f, -1)), t_f)  # KL(pi_ref || pi_theta)
    t_r = th_old.clone().requires_grad_(True)
    (g_rev,) = torch.autograd.grad(_kl(torch.log_softmax(t_r, -1), ref), t_r)  # KL(pi_theta || pi_ref)
    torch.testing.assert_close(g_k3, g_fwd, rtol=1e-10, atol=1e-12)
    assert float((g_k3 - g_rev).abs().max()) > 1e-2  # not the reverse-KL gradient


def test_policy_loss_uses_eq7_only_when_asked():
    g = torch.Generator().manual_seed(3)
    B, T = 3, 4
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) - 0.1).requires_grad_(True)
    old = -(logp.detach() - 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)).abs()  # log-probs <= 0
    ref = -(logp.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).abs()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float64)
    adv = torch.zeros(B, dtype=torch.float64)  # isolate the KL term
    algo = GRPO.replace(beta=0.5)
    plain = policy_loss(logp, old, adv, mask, algo, ref_logp=ref).loss
    corr = policy_loss(logp, old, adv, mask, algo.replace(kl_importance_correction=True), ref_logp=ref).loss
    want_plain = 0.5 * aggregate(kl_estimate(logp, ref, "k3"), mask, "seq_mean_token_mean")
    want_corr = 0.5 * aggregate(kl_estimate(logp, ref, "k3", old_logp=old), mask, "seq_mean_token_mean")
    torch.testing.assert_close(plain, want_plain, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(corr, want_corr, rtol=1e-12, atol=1e-14)
    assert abs(float((plain - corr).detach())) > 1e-4
    # with beta = 0 the flag changes nothing
    a0 = policy_loss(logp, old, adv + 1.0, mask, GRPO.replace(beta=0.0), ref_logp=ref).loss
    a1 = policy_loss(logp, old, adv + 1.0, mask, GRPO.replace(beta=0.0, kl_importance_correction=True),
                     ref_logp=ref).loss
    assert torch.equal(a0, a1)


# ------------------------------------------------------------------ V3.2 Eqs. 8-9 masking
def _masking_example():
    # divergence d_i = mean over real tokens of (log pi_old - log pi_theta); delta = 0.25
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]],
                        dtype=torch.float64)
    diff = torch.tensor([
        [0.5, 0.5, 0.5, 0.5],        # A<0, d=0.5 > 0.25          -> masked
        [0.5, 0.5, 0.5, 0.5],        # A>0, d=0.5                 -> kept (positive never masked)
        [0.125, 0.125, 0.125, 0.125],  # A<0, d=0.125 <= 0.25      -> kept
        [2.0, -2.0, 0.0, 0.0],       # A<0, d=0 (one token far)   -> kept (sequence average)
        [0.5, 9.0, 9.0, 9.0],        # A<0, 1 real token d=0.5    -> masked (padding ignored)
        [0.25, 0.25, 0.25, 0.25],    # A<0, d=0.25 == delta       -> kept (strict >)
    ], dtype=torch.float64)
    adv = torch.tensor([-1.0, 1.0, -1.0, -1.0, -0.5, -1.0], dtype=torch.float64)
    logp = torch.full((6, 4), -3.0, dtype=torch.float64)  # so that log pi_old = logp + diff <= 0 at real tokens
    return logp, logp + diff, adv, mask


def test_offpolicy_mask_worked_example():
    logp, old, adv, mask = _masking_example()
    keep = offpolicy_sequence_mask(old, logp, adv, mask, 0.25)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False, True, True, True, False, True]
    # token-level advantages give M_it, [B, T]
    keep_t = offpolicy_sequence_mask(old, logp, adv[:, None].expand(6, 4), mask, 0.25)
    assert keep_t.shape == (6, 4) and keep_t.tolist()[0] == [False] * 4 and all(keep_t[1])
    # on-policy: d = 0, nothing masked even with delta = 0
    assert offpolicy_sequence_mask(logp, logp, adv, mask, 0.0).all()
    with pytest.raises(ValueError, match="delta"):
        offpolicy_sequence_mask(old, logp, adv, mask, -1.0)
    with pytest.raises(ValueError, match="advantages"):
        offpolicy_sequence_mask(old, logp, adv[:3], mask, 0.25)


def test_offpolicy_mask_in_policy_loss_keeps_the_normaliser():
    logp0, old, adv, mask = _masking_example()
    base = DR_GRPO.replace(eps_low=1.0, eps_high=10.0)  # clip never active in this example
    algo = base.replace(offpolicy_mask_delta=0.25)
    logp = logp0.clone().requires_grad_(True)
    out = policy_loss(logp, old, adv, mask, algo, max_tokens=8)
    out.loss.backward()
    # reference: Eq. 9 read literally, masked policy terms are 0 and still counted by 1/G, 1/MAX
    ratio = torch.exp(logp0 - old)
    keep = torch.tensor([0, 1, 1, 1, 0, 1], dtype=torch.float64)[:, None]
    want = -(keep * mask * ratio * adv[:, None]).sum(-1).div(8).sum() / 6
    torch.testing.assert_close(out.loss.detach(), want, rtol=1e-12, atol=1e-14)
    assert torch.equal(logp.grad[0], torch.zeros(4)) and torch.equal(logp.grad[4], torch.zeros(4))
    assert (logp.grad[[1, 2, 3, 5]] * mask[[1, 2, 3, 5]] != 0).all()
    assert out.metrics["offpolicy_masked_frac"] == pytest.approx(2 / 6)
    # off: the metric is 0 and the loss is the unmasked one
    off = policy_loss(logp0, old, adv, mask, base, max_tokens=8)
    assert off.metrics["offpolicy_masked_frac"] == 0.0
    torch.testing.assert_close(off.loss, -(mask * ratio * adv[:, None]).sum(-1).div(8).sum() / 6,
                               rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------ DeepSeekMath-V2 reward
def test_self_verification_reward_values():
    assert float(self_verification_reward(1, 1, 1)) == pytest.approx(1.0)
    assert float(self_verification_reward(1, 0.5, 1)) == pytest.approx(0.76 * 0.5 + 0.24)
    assert float(self_verification_reward(1, 1, 0)) == pytest.approx(0.76)
    assert float(self_verification_reward(0, 1, 1)) == 0.0
    r = self_verification_reward(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0.0, 0.5, 1.0]),
                                 torch.tensor([1.0, 0.25, 1.0]))
    assert r.dtype == torch.float32
    torch.testing.assert_close(r, torch.tensor([0.24, 0.38 + 0.06, 0.0]))
    assert float(self_verification_reward(1, 0.5, 0.5, alpha=0.5, beta=0.5)) == pytest.approx(0.5)


@pytest.mark.parametrize("args, kw, match", [
    ((1, 1.5, 1), {}, "r_y"),
    ((-0.1, 1, 1), {}, "r_format"),
    ((1, 1, float("nan")), {}, "r_z"),
    ((1, 1, 1), {"alpha": -0.1}, "alpha"),
    ((1, 1, 1), {"beta": float("inf")}, "beta"),
    ((torch.ones(2), torch.ones(3), 1), {}, "broadcast"),
    ((1, "x", 1), {}, "r_y"),
])
def test_self_verification_reward_validation(args, kw, match):
    with pytest.raises(ValueError, match=match):
        self_verification_reward(*args, **kw)


# ------------------------------------------------------------------ mHC sidebar
def test_sinkhorn_rows_and_columns_sum_to_one():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 4, 4, generator=g)
    h = sinkhorn_knopp(logits)  # mHC's 20 iterations suffice for logits of unit spread
    assert h.shape == (5, 4, 4) and h.dtype == torch.float32 and (h >= 0).all()
    torch.testing.assert_close(h.sum(-1), torch.ones(5, 4), rtol=0, atol=1e-5)
    torch.testing.assert_close(h.sum(-2), torch.ones(5, 4), rtol=0, atol=1e-5)
    wide = 2.0 * torch.randn(5, 4, 4, generator=g)  # spread logits need more iterations
    h2 = sinkhorn_knopp(wide, iters=200)
    torch.testing.assert_close(h2.sum(-1), torch.ones(5, 4), rtol=0, atol=1e-5)
    torch.testing.assert_close(h2.sum(-2), torch.ones(5, 4), rtol=0, atol=1e-5)
    big = sinkhorn_knopp(torch.tensor([[1000.0, 0.0], [0.0, -1000.0]]))
    assert torch.isfinite(big).all()
    torch.testing.assert_close(sinkhorn_knopp(torch.ones(3, 3), positive=True), torch.full((3, 3), 1 / 3))


def test_sinkhorn_is_invariant_to_row_and_column_scaling():
    g = torch.Generator().manual_seed(1)
    m = torch.rand(4, 4, generator=g, dtype=torch.float64) + 0.1
    a = torch.rand(4, generator=g, dtype=torch.float64) * 3 + 0.5
    b = torch.rand(4, generator=g, dtype=torch.float64) * 3 + 0.5
    h = sinkhorn_knopp(m, iters=200, positive=True)
    torch.testing.assert_close(sinkhorn_knopp(a[:, None] * m * b[None, :], iters=200, positive=True), h,
                               rtol=0, atol=1e-10)
    # in logits: adding per-row / per-column constants; exp(log m) gives the same matrix
    torch.testing.assert_close(sinkhorn_knopp(m.log() + a[:, None] + b[None, :], iters=200), h, rtol=0, atol=1e-10)


@pytest.mark.parametrize("x, kw, match", [
    (torch.zeros(3, 4), {}, "shape"),
    (torch.zeros(3, 3, dtype=torch.int64), {}, "floating"),
    (torch.tensor([[float("nan"), 0.0], [0.0, 0.0]]), {}, "finite"),
    (torch.tensor([[1.0, -1.0], [1.0, 1.0]]), {"positive": True}, ">= 0"),
    (torch.tensor([[0.0, 0.0], [1.0, 1.0]]), {"positive": True}, "all-zero"),
    (torch.zeros(2, 2), {"iters": 0}, "iters"),
])
def test_sinkhorn_validation(x, kw, match):
    with pytest.raises(ValueError, match=match):
        sinkhorn_knopp(x, **kw)


def test_product_gain():
    assert product_gain(torch.eye(3)[None].repeat(4, 1, 1)) == pytest.approx(1.0, abs=1e-12)
    shear = torch.tensor([[[1.0, 1.0], [0.0, 1.0]]])
    assert product_gain(shear) == pytest.approx((1 + math.sqrt(5)) / 2)  # golden ratio
    assert product_gain(shear, "max_row_sum") == 2.0 and product_gain(shear, "max_col_sum") == 2.0
    d = torch.tensor([[2.0, 0.0], [0.0, 0.5]]).repeat(3, 1, 1)
    assert product_gain(d) == pytest.approx(8.0)
    # products of doubly-stochastic matrices keep every gain at 1; unconstrained ones explode
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(24, 4, 4, generator=g)
    for kind in ("spectral", "max_row_sum", "max_col_sum"):
        assert product_gain(sinkhorn_knopp(logits, iters=50), kind) == pytest.approx(1.0, abs=1e-4)
    assert product_gain(logits.exp()) > 1e6
    with pytest.raises(ValueError, match="kind"):
        product_gain(d, "amax")
    with pytest.raises(ValueError, match="shape"):
        product_gain(torch.eye(2))
