"""Tests for CISPO (MiniMax-M1, arXiv 2506.13585, §3.1-3.2): the surrogate, its preset, the FP32 LM
head / low-precision inference copy, and the trainer's low-precision rollout.

CISPO, Eqs. 4-5 (to maximise)::

    J = 1 / sum_i |o_i| * sum_i sum_t sg(w_it) A_it log pi_theta(o_it),
    w_it = clip(r_it, 1 - eps_low, 1 + eps_high),   r_it = pi_theta / pi_old

and the unified form, Eqs. 6-7, which multiplies each term by a token mask ``M_it``. The package
returns the loss ``-M sg(w) A log r`` per token (same gradient: log pi_old is a constant).

Where the goldens come from is said at each test: either worked by hand (the numbers are written
as the hand formula, e.g. ``-1.28 * 1.5 * ln 2``), or a float64 reference written straight from the
paper's equations (no code shared with the package).
"""

import copy
import math

import pytest
import torch

import grpo_lab.training.collection as collection_mod
from grpo_lab.algo.algorithms import CISPO as CISPO_PRESET
from grpo_lab.algo.algorithms import DAPO, GRPO, PRESETS, Algorithm, get_algorithm
from grpo_lab.algo.metrics import reduce_micro_batches
from grpo_lab.policy.models import FP32LMHead, TinyConfig, inference_copy, load_policy, tiny_policy, use_fp32_lm_head
from grpo_lab.algo.objectives import LOG_RATIO_CLAMP, SURROGATES, LossContext, cispo_surrogate, cispo_weight, policy_loss
from grpo_lab.tasks import ArithmeticTask
from grpo_lab.training.trainer import Trainer, TrainerConfig

F64 = torch.float64
TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)
# The loss-level tests below check the surrogate (Eqs. 4-7) under the batch token mean, as verl and
# TRL aggregate; the preset divides per group (Eq. 4's 1/sum_i |o_i| inside the expectation over
# questions: "group_token_mean", tested in test_group_token_mean.py) and is tested as such below.
CISPO = CISPO_PRESET.replace(aggregation="token_mean")
# the PPO-clip objective with CISPO's other axes (token_mean, no KL): DAPO's loss with any eps
PPO_TOKEN_MEAN = GRPO.replace(name="ppo_tm", kl=None, beta=0.0, aggregation="token_mean")
# the registry key of CISPO's surrogate (the preset is the reference: the key's spelling is not what is tested)
CLIP = CISPO.surrogate


def _grad(logp, old, adv, mask, algo, **kw):
    """(loss output, d loss / d logp) of policy_loss(..., **kw) for a fresh leaf copy of ``logp``."""
    lp = logp.detach().clone().requires_grad_()
    out = policy_loss(lp, old, adv, mask, algo, **kw)
    (g,) = torch.autograd.grad(out.loss, lp)
    return out, g


def _random_batch(seed, B=6, T=8, spread=4.0):
    """float64 log-probs with log r roughly uniform in [-spread, spread] (inside the +-20 clamp), advantages
    of both signs (a few exactly 0), a partly masked batch with one empty row."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=F64) * spread - 1e-3
    old = -torch.rand(B, T, generator=g, dtype=F64) * spread - 1e-3
    adv = torch.randn(B, T, generator=g, dtype=F64)
    adv[torch.rand(B, T, generator=g) < 0.1] = 0.0
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[2] = 0  # an empty row
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)
    return logp, old, adv, mask


# ================================================================================================
# 1. golden values worked by hand
# ================================================================================================
# Hand example, 2 x 3, row 1 padded at t = 2 (N_tok = 5), per-sequence advantages A = (1.5, -2):
#
#   token  r     A     w = clip(r, 1-eps_low, 1.28)       loss = -w A ln r      grad = -w A / 5
#   (0,0)  2.0   1.5   1.28 (capped)                      -1.92 ln 2            -0.384
#   (0,1)  0.5   1.5   0.5 (eps_low=1) | 0.8 (eps_low=.2)  0.75 ln 2 | 1.2 ln 2  -0.15 | -0.24
#   (0,2)  1.1   1.5   1.1                                -1.65 ln 1.1          -0.33
#   (1,0)  1.0   -2    1.0                                0                     +0.4
#   (1,1)  3.0   -2    1.28 (capped)                      +2.56 ln 3            +0.512
#   (1,2)  pad                                            0                     0
#
# Token (0,0) has A > 0 and r = 2 > 1 + eps_high: PPO-clip (DAPO) gives it gradient 0, CISPO
# -1.28 * 1.5 / 5 = -0.384.
OLD = [[-1.0, -2.0, -0.5], [-0.3, -1.5, -0.7]]
RATIO = [[2.0, 0.5, 1.1], [1.0, 3.0, 1.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
ADV = [1.5, -2.0]
LN2, LN3, LN11 = math.log(2.0), math.log(3.0), math.log(1.1)


def _hand_batch(dtype=F64):
    old = torch.tensor(OLD, dtype=F64)
    logp = old + torch.log(torch.tensor(RATIO, dtype=F64))
    return logp.to(dtype), old.to(dtype), torch.tensor(ADV, dtype=dtype), torch.tensor(MASK, dtype=dtype)


HAND = {  # eps_low -> (per-token loss, gradient wrt logp), by hand (table above)
    1.0: ([[-1.92 * LN2, 0.75 * LN2, -1.65 * LN11], [0.0, 2.56 * LN3, 0.0]],
          [[-0.384, -0.15, -0.33], [0.4, 0.512, 0.0]]),
    0.2: ([[-1.92 * LN2, 1.2 * LN2, -1.65 * LN11], [0.0, 2.56 * LN3, 0.0]],
          [[-0.384, -0.24, -0.33], [0.4, 0.512, 0.0]]),
}


@pytest.mark.parametrize("eps_low", [1.0, 0.2])
def test_hand_example_per_token_loss_value_and_gradient(eps_low):
    algo = CISPO.replace(eps_low=eps_low)
    hand_tok, hand_grad = (torch.tensor(x, dtype=F64) for x in HAND[eps_low])
    logp, old, adv, mask = _hand_batch()
    # the surrogate alone, per token ([B, T] advantages; the padded slot has r = 1, so loss 0 there)
    log_ratio = (logp - old).requires_grad_()
    ctx = LossContext(logp, old, log_ratio, adv[:, None].expand(2, 3), mask.bool())
    tok_loss, _ = SURROGATES[CLIP](ctx, **algo.values_for(SURROGATES[CLIP]))
    torch.testing.assert_close(tok_loss.detach(), hand_tok, rtol=1e-12, atol=1e-13)
    # the aggregated loss (token_mean: sum / 5) and its gradient -w A / N_tok
    out, g = _grad(logp, old, adv, mask, algo)
    assert out.loss.item() == pytest.approx(float(hand_tok.sum()) / 5, rel=1e-12)
    if eps_low == 1.0:  # the number, once: (-1.17 ln 2 - 1.65 ln 1.1 + 2.56 ln 3) / 5
        assert out.loss.item() == pytest.approx(0.3688406, abs=1e-6)
    assert out.metrics["pg_loss"] == pytest.approx(out.loss.item(), rel=1e-12)
    torch.testing.assert_close(g, hand_grad, rtol=1e-12, atol=1e-14)
    # PPO-clip with the same cap drops token (0,0) entirely; CISPO keeps it at the capped weight
    _, g_ppo = _grad(logp, old, adv, mask, PPO_TOKEN_MEAN.replace(eps_low=0.2, eps_high=0.28))
    assert g_ppo[0, 0].item() == 0.0 and g[0, 0].item() == pytest.approx(-(1 + 0.28) * 1.5 / 5, rel=1e-12)


def test_hand_example_float32_inputs():
    # the same hand numbers through the float32 path (computed in float32, returned as float32)
    logp, old, adv, mask = _hand_batch(torch.float32)
    out, g = _grad(logp, old, adv, mask, CISPO)
    assert out.loss.dtype == torch.float32
    assert out.loss.item() == pytest.approx((-1.17 * LN2 - 1.65 * LN11 + 2.56 * LN3) / 5, rel=1e-5)
    torch.testing.assert_close(g, torch.tensor(HAND[1.0][1], dtype=torch.float32), rtol=1e-5, atol=1e-6)


def test_on_policy_step_value_zero_gradient_reinforce():
    # by hand: log r = 0 -> w = 1, value -w A * 0 = 0, gradient -A / N_tok (REINFORCE)
    logp, _, adv, mask = _hand_batch()
    out, g = _grad(logp, logp.detach(), adv, mask, CISPO)
    assert out.loss.item() == 0.0
    torch.testing.assert_close(g, torch.tensor([[-1.5, -1.5, -1.5], [2.0, 2.0, 0.0]], dtype=F64) / 5)


# ================================================================================================
# 2. the weight is a stop-gradient coefficient
# ================================================================================================
@pytest.mark.parametrize("eps_low, eps_high", [(1.0, 0.28), (0.2, 0.28), (0.5, 2.0)])
def test_weight_is_detached_gradient_is_minus_w_a(eps_low, eps_high):
    # float64 reference from Eqs. 4-5: d/d logp of -1/N sum sg(w) A log pi_theta = -w A m / N,
    # with no d w / d logp term (that term, -A ln r * r / N inside the range, is O(0.1) here)
    logp, old, adv, mask = _random_batch(1)
    algo = CISPO.replace(eps_low=eps_low, eps_high=eps_high)
    _, g = _grad(logp, old, adv, mask, algo)
    w = torch.clamp(torch.exp(logp - old), 1 - eps_low, 1 + eps_high)
    expected = -w * adv * mask / mask.sum()
    torch.testing.assert_close(g, expected, rtol=1e-12, atol=1e-15)
    # the surrogate alone: d loss_t / d log r_t = -w A
    lr = (logp - old).requires_grad_()
    loss, _ = cispo_surrogate(LossContext(logp, old, lr, adv, mask.bool()), **algo.values_for(cispo_surrogate))
    (g_lr,) = torch.autograd.grad(loss.sum(), lr)
    torch.testing.assert_close(g_lr, -w * adv, rtol=1e-12, atol=1e-15)


def test_cispo_weight_never_requires_grad():
    x = torch.linspace(-3, 3, 13, dtype=F64).requires_grad_()
    for inp in (x, 2 * x, x.view(1, 13)):  # a leaf, a non-leaf with a graph, a view
        w = cispo_weight(inp, 1.0, 0.28)
        assert not w.requires_grad and w.grad_fn is None
        assert w.dtype == F64 and w.shape == inp.shape
    # values by hand: clip(e^x, 0, 1.28) and clip(e^x, 0.8, 1.28)
    torch.testing.assert_close(cispo_weight(x, 1.0, 0.28), torch.clamp(x.detach().exp(), max=1.28))
    torch.testing.assert_close(cispo_weight(x, 0.2, 0.28), torch.clamp(x.detach().exp(), 0.8, 1.28))


# CISPO with ratio_level="sequence" (the GSPO ratio s_i in place of r_it), token_mean aggregation.
# Derivation by hand: every real token t of sequence i has the same loss -w_i A_i log s_i, with
# log s_i = 1/|o_i| sum_t' log r_it' and w_i = sg(clip(s_i, 1 - eps_low, 1 + eps_high)), so
#   L = 1/N_tok sum_i |o_i| (-w_i A_i log s_i) = 1/N_tok sum_i (-w_i A_i) sum_t' log r_it'
# and d L / d logp_it = -w_i A_i / N_tok for each real token (|o_i| copies of the loss, each
# contributing d log s_i / d logp_it = 1/|o_i|); 0 at padding.
# On the hand batch: s_0 = (2 * 0.5 * 1.1)^(1/3) = 1.1^(1/3) (inside [0, 1.28]), s_1 = (1 * 3)^(1/2)
# = sqrt 3 (capped at 1.28), so the gradient is -1.1^(1/3) * 1.5 / 5 on row 0 and -1.28 * (-2) / 5 on
# the 2 real tokens of row 1; the loss is (3 * (-1.1^(1/3) * 1.5 * ln 1.1 / 3) + 2 * (1.28 * 2 * ln 3 / 2)) / 5.
def test_sequence_ratio_hand_example_gradient_is_minus_w_i_a_i_over_n_tok():
    # catches: a per-token weight r_it used with the sequence ratio (row 0 would get -0.384, -0.15,
    # -0.33), a missing 1/|o_i| in the chain rule (gradient x3 / x2), the uncapped s_1
    logp, old, adv, mask = _hand_batch()
    out, g = _grad(logp, old, adv, mask, CISPO.replace(ratio_level="sequence"))
    s0 = 1.1 ** (1 / 3)
    torch.testing.assert_close(g, torch.tensor([[-s0 * 1.5 / 5] * 3, [0.512, 0.512, 0.0]], dtype=F64),
                               rtol=1e-12, atol=1e-14)
    assert out.loss.item() == pytest.approx((-1.5 * s0 * LN11 + 2.56 * LN3) / 5, rel=1e-12)
    # weight_capped_frac counts the tokens of capped sequences: the 2 real tokens of row 1, of 5
    assert out.metrics["weight_capped_frac"] == pytest.approx(2 / 5, abs=1e-15)
    assert out.metrics["ratio_max"] == pytest.approx(math.sqrt(3), rel=1e-12)


@pytest.mark.parametrize("mask_eps", [(None, None), (0.2, 0.28)])
def test_sequence_ratio_random_batch_float64_reference(mask_eps):
    # float64 reference from Eqs. 4-7 with s_i in place of r_it: d L / d logp_it = -M_i w_i A_i m_it / N_tok
    # (derivation above), M_i = 0 where A_i > 0 and s_i > 1 + mask_eps_high or A_i < 0 and
    # s_i < 1 - mask_eps_low. Catches a token-level weight or mask with the sequence ratio, or a
    # gradient through the weight; the empty row 2 must get 0 (s = 1 there).
    e_l, e_h = mask_eps
    logp, old, adv_tok, mask = _random_batch(6)
    adv = adv_tok[:, 0].clone()  # per-sequence advantages [B]
    algo = CISPO.replace(ratio_level="sequence", mask_eps_low=e_l, mask_eps_high=e_h)
    out, g = _grad(logp, old, adv, mask, algo)
    log_s = ((logp - old) * mask).sum(1) / mask.sum(1).clamp(min=1)
    s = log_s.exp()
    w = torch.clamp(s, 1 - algo.eps_low, 1 + algo.eps_high)
    M = torch.ones_like(s)
    if e_l is not None:
        M[(adv < 0) & (s < 1 - e_l)] = 0.0
        M[(adv > 0) & (s > 1 + e_h)] = 0.0
    expected = (-M * w * adv)[:, None] * mask / mask.sum()
    torch.testing.assert_close(g, expected, rtol=1e-12, atol=1e-15)
    # the batch has capped and uncapped non-empty sequences, and masks a sequence when M is on
    real = mask.sum(1) > 0
    assert (s[real] > 1 + algo.eps_high).any() and (s[real] < 1 + algo.eps_high).any()
    assert ((M[real] == 0).any()) == (e_l is not None)
    # ... and the token-level CISPO gradient is different on this batch
    _, g_tok = _grad(logp, old, adv, mask, algo.replace(ratio_level="token"))
    assert (g_tok - g).abs().max() > 1e-3


# ================================================================================================
# 3. the unified masked form (Eqs. 6-7) with an unclipped weight is PPO-clip, token by token
# ================================================================================================
@pytest.mark.parametrize("e_l, e_h", [(0.2, 0.28), (0.1, 0.5), (None, 0.28), (0.2, None)])
def test_masked_form_equals_ppo_clip_gradient(e_l, e_h):
    # Reference: PPO-clip's gradient (DAPO Eq. 10, token_mean) with eps = mask_eps; an unset side of
    # M never masks, i.e. PPO with no floor (eps_low = 1) or an unreachable cap (eps_high = 1e9).
    logp, old, adv, mask = _random_batch(2)
    cispo = CISPO.replace(eps_low=1.0, eps_high=1e9, mask_eps_low=e_l, mask_eps_high=e_h)
    ppo = PPO_TOKEN_MEAN.replace(eps_low=1.0 if e_l is None else e_l, eps_high=1e9 if e_h is None else e_h)
    out_c, g_c = _grad(logp, old, adv, mask, cispo)
    out_p, g_p = _grad(logp, old, adv, mask, ppo)
    torch.testing.assert_close(g_c, g_p, rtol=1e-12, atol=1e-15)
    for k in ("clip_frac_low", "clip_frac_high", "clip_frac", "grad_token_frac"):
        assert out_c.metrics[k] == pytest.approx(out_p.metrics[k], abs=1e-15), k
    # the batch really exercises the mask on each side that is set, and only there
    assert (out_c.metrics["clip_frac_low"] > 0) == (e_l is not None)
    assert (out_c.metrics["clip_frac_high"] > 0) == (e_h is not None)
    # ... and without M (plain CISPO, same unclipped weight) the gradients differ
    _, g_plain = _grad(logp, old, adv, mask, cispo.replace(mask_eps_low=None, mask_eps_high=None))
    assert (g_plain - g_p).abs().max() > 1e-3


def test_masked_form_with_capped_weight_masks_and_caps():
    # by hand on the 2 x 3 example, CISPO's cap 1.28 plus M with mask_eps_high = 0.5: token (0,0)
    # (A > 0, r = 2 > 1.5) is masked (gradient 0); (1,1) (A < 0, r = 3) is not (only A > 0 is masked
    # on the high side) and keeps -1.28 * (-2) / 5; mask_eps_low = 0.2 masks nothing (the only
    # r < 0.8 has A > 0).
    logp, old, adv, mask = _hand_batch()
    out, g = _grad(logp, old, adv, mask, CISPO.replace(mask_eps_low=0.2, mask_eps_high=0.5))
    torch.testing.assert_close(g, torch.tensor([[0.0, -0.15, -0.33], [0.4, 0.512, 0.0]], dtype=F64),
                               rtol=1e-12, atol=1e-14)
    assert out.loss.item() == pytest.approx((0.75 * LN2 - 1.65 * LN11 + 2.56 * LN3) / 5, rel=1e-12)
    assert out.metrics["clip_frac_high"] == pytest.approx(1 / 5) and out.metrics["clip_frac_low"] == 0.0
    assert out.metrics["grad_token_frac"] == pytest.approx(4 / 5)
    assert out.metrics["weight_capped_frac"] == pytest.approx(2 / 5)


# Boundaries (strict inequalities of Eq. 7 and of the weight metrics), worked by hand. Weight range
# [1 - 0.5, 1 + 0.25] = [0.5, 1.25], mask M with mask_eps_low = 0.25, mask_eps_high = 0.5 (different
# eps, so that swapping the two pairs would show). Row 0 sits exactly on each boundary, row 1 just
# outside it (log r shifted by 1e-12 outward). Each ratio is exactly representable, and log r is built
# as (0 - (-ln r)) or (ln r - 0), both exact, so exp gives the boundary exactly (checked below).
#
#   token  r              A    on the boundary of          M   w      counted as
#   (0,0)  0.5            +1   floor 1 - eps_low           1   0.5    -
#   (0,1)  1.25           -1   cap 1 + eps_high            1   1.25   -
#   (0,2)  0.75           -1   mask floor 1 - mask_eps_low 1   0.75   -
#   (0,3)  1.5            +1   mask cap 1 + mask_eps_high  1   1.25   capped (1.5 > 1.25)
#   (1,0)  0.5 e^-1e-12   +1                               1   0.5    floored
#   (1,1)  1.25 e^1e-12   -1                               1   1.25   capped
#   (1,2)  0.75 e^-1e-12  -1                               0   0.75   masked low
#   (1,3)  1.5 e^1e-12    +1                               0   1.25   masked high, capped
#
# gradient -M w A / 8: row 0 (-0.0625, 0.15625, 0.09375, -0.15625), row 1 (-0.0625, 0.15625, 0, 0).
BOUNDARY_R = [0.5, 1.25, 0.75, 1.5]
BOUNDARY_A = [1.0, -1.0, -1.0, 1.0]


def test_boundaries_are_strict_for_mask_and_weight_metrics():
    # catches: >= / <= in place of > / < in M (tokens (0,2), (0,3) would lose their gradient) or in
    # weight_capped_frac / weight_floored_frac ((0,1) / (0,0) would be counted); the mask reading
    # eps_* or the metrics reading mask_eps_* (the boundaries differ)
    log_r = [math.log(v) for v in BOUNDARY_R]
    log_r = [log_r, [x + (1e-12 if x > 0 else -1e-12) for x in log_r]]
    logp = torch.tensor([[min(x, 0.0) for x in row] for row in log_r], dtype=F64)  # ln r (r < 1) or 0
    old = torch.tensor([[-max(x, 0.0) for x in row] for row in log_r], dtype=F64)  # 0 or -ln r (r > 1)
    assert torch.equal(torch.exp(logp - old)[0], torch.tensor(BOUNDARY_R, dtype=F64))  # exact boundaries
    r1 = torch.exp(logp - old)[1]
    assert (r1[[0, 2]] < torch.tensor([0.5, 0.75], dtype=F64)).all()  # just outside
    assert (r1[[1, 3]] > torch.tensor([1.25, 1.5], dtype=F64)).all()
    adv = torch.tensor([BOUNDARY_A, BOUNDARY_A], dtype=F64)
    mask = torch.ones(2, 4, dtype=F64)
    algo = CISPO.replace(eps_low=0.5, eps_high=0.25, mask_eps_low=0.25, mask_eps_high=0.5)
    out, g = _grad(logp, old, adv, mask, algo)
    torch.testing.assert_close(g, torch.tensor([[-0.0625, 0.15625, 0.09375, -0.15625],
                                                [-0.0625, 0.15625, 0.0, 0.0]], dtype=F64), rtol=1e-12, atol=0)
    m = out.metrics
    assert m["clip_frac_low"] == 1 / 8 and m["clip_frac_high"] == 1 / 8  # (1,2), (1,3) only
    assert m["grad_token_frac"] == 6 / 8
    assert m["weight_floored_frac"] == 1 / 8  # (1,0) only, not (0,0) at r = 1 - eps_low
    assert m["weight_capped_frac"] == 3 / 8  # (0,3), (1,1), (1,3), not (0,1) at r = 1 + eps_high
    # the value, by hand: -M w A ln r summed over the 6 unmasked tokens, / 8 (the 1e-12 shifts change
    # it by about 1e-13)
    hand = (0.5 * LN2 + 1.25 * math.log(1.25) + 0.75 * math.log(0.75) - 1.25 * math.log(1.5)
            + 0.5 * LN2 + 1.25 * math.log(1.25)) / 8
    assert out.loss.item() == pytest.approx(hand, abs=1e-12)


# ================================================================================================
# 4. unbiasedness, by exact enumeration over a categorical policy (float64)
# ================================================================================================
# pi_theta = softmax(THETA), behaviour pi_old = softmax(THETA_OLD): ratios r = pi_theta / pi_old are
# (1.321, 0.398, 2.178, 1.321, 0.218). A fixed advantage per token.
THETA = torch.tensor([0.5, -0.3, 1.2, 0.0, -1.0], dtype=F64)
THETA_OLD = torch.tensor([0.0, 0.4, 0.2, -0.5, 0.3], dtype=F64)
A_TOK = torch.tensor([1.0, -0.5, 0.8, -1.2, 0.3], dtype=F64)


def _expected_package_gradient(algo):
    """E_{a ~ pi_old}[grad_theta of the package's loss for one sampled token a]: each token a is a 1 x 1
    batch through policy_loss, and the per-row gradients are summed with weights pi_old(a)."""
    th = THETA.clone().requires_grad_()
    logp = torch.log_softmax(th, 0)
    old = torch.log_softmax(THETA_OLD, 0)
    one = torch.ones(1, 1, dtype=F64)
    total = torch.zeros(5, dtype=F64)
    for a in range(5):
        out = policy_loss(logp[a].view(1, 1), old[a].view(1, 1), A_TOK[a].view(1), one, algo)
        (g,) = torch.autograd.grad(out.loss, th, retain_graph=True)
        total += old[a].exp() * g
    return total


def _paper_gradient(weight):
    """-sum_a pi_old(a) weight(a) A(a) grad_theta log pi_theta(a), grad log softmax = e_a - pi_theta
    (written from Eq. 4 in closed form, float64)."""
    pi, pi_old = THETA.softmax(0), THETA_OLD.softmax(0)
    return -(pi_old * weight * A_TOK) @ (torch.eye(5, dtype=F64) - pi)


def test_unclipped_weight_is_unbiased_by_enumeration():
    pi, pi_old = THETA.softmax(0), THETA_OLD.softmax(0)
    # exact on-policy gradient of -E_{a~pi_theta}[A(a)] = -sum_a pi_theta(a) A(a) grad log pi_theta(a)
    th = THETA.clone().requires_grad_()
    (exact,) = torch.autograd.grad(-(th.softmax(0) * A_TOK).sum(), th)
    torch.testing.assert_close(exact, -(pi * A_TOK) @ (torch.eye(5, dtype=F64) - pi), rtol=1e-12, atol=1e-15)
    # CISPO with no effective clip (floor 0, cap 1e9 > e^20): weight r = pi_theta / pi_old
    g = _expected_package_gradient(CISPO.replace(eps_low=1.0, eps_high=1e9))
    torch.testing.assert_close(g, exact, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g, _paper_gradient(pi / pi_old), rtol=1e-12, atol=1e-14)
    # the inverted weight pi_old / pi_theta would be far off: the test can tell the two apart
    inverted = _paper_gradient(pi_old / pi)
    assert (inverted - exact).norm() > 1e-2 * exact.norm()
    assert (pi / pi_old).max() > 2.0 and (pi / pi_old).min() < 0.25  # really off-policy


def test_clip_bias_is_zero_below_the_cap_and_shrinks_with_eps_high():
    pi, pi_old = THETA.softmax(0), THETA_OLD.softmax(0)
    r = pi / pi_old
    exact = _paper_gradient(r)
    grid = [0.0, 0.05, 0.1, 0.2, 0.28, 0.5, 1.0, 1.17, 1.2, 1.5, 3.0]
    biases = []
    for eh in grid:
        g = _expected_package_gradient(CISPO.replace(eps_low=1.0, eps_high=eh))
        # float64 reference: Eq. 5's capped weight in Eq. 4
        torch.testing.assert_close(g, _paper_gradient(torch.clamp(r, max=1 + eh)), rtol=1e-12, atol=1e-14)
        bias = (g - exact).norm().item()
        if r.max() <= 1 + eh:
            assert bias < 1e-14, eh
        else:
            assert bias > 1e-4, eh
        biases.append(bias)
    assert all(b2 <= b1 + 1e-15 for b1, b2 in zip(biases, biases[1:])), biases
    assert biases[0] > 0.1 and biases[-1] < 1e-14  # r max = 2.178: capped at 1.0, not at 4.0


# ================================================================================================
# 5. metrics, padding
# ================================================================================================
def test_metrics_on_the_hand_example():
    # by hand (table above): r > 1.28 at (0,0) and (1,1), of 5 real tokens, whatever the sign of A
    logp, old, adv, mask = _hand_batch()
    out, _ = _grad(logp, old, adv, mask, CISPO)
    m = out.metrics
    assert m["weight_capped_frac"] == pytest.approx(2 / 5, abs=1e-15)
    assert m["weight_floored_frac"] == 0.0  # eps_low = 1: floor 0
    assert m["clip_frac"] == m["clip_frac_low"] == m["clip_frac_high"] == 0.0  # no mask M, nothing removed
    assert m["grad_token_frac"] == 1.0
    assert m["ratio_max"] == pytest.approx(3.0) and m["ratio_min"] == pytest.approx(0.5)
    assert m["num_tokens"] == 5 and m["num_sequences"] == 2
    # floor 0.8: r = 0.5 at (0,1) is floored
    m2 = _grad(logp, old, adv, mask, CISPO.replace(eps_low=0.2))[0].metrics
    assert m2["weight_floored_frac"] == pytest.approx(1 / 5, abs=1e-15)
    assert m2["weight_capped_frac"] == pytest.approx(2 / 5, abs=1e-15)
    # token advantages with A = 0 at 2 of the 5 real tokens: grad_token_frac 3/5 (no clip ever drops one)
    adv_t = torch.tensor([[1.5, 0.0, 1.5], [0.0, -2.0, -2.0]], dtype=F64)
    m3 = _grad(logp, old, adv_t, mask, CISPO)[0].metrics
    assert m3["grad_token_frac"] == pytest.approx(3 / 5, abs=1e-15) and m3["clip_frac"] == 0.0


def test_grad_token_frac_on_random_batch():
    # plain CISPO: fraction of real tokens with A != 0, however far the ratios are
    logp, old, adv, mask = _random_batch(3)
    m = _grad(logp, old, adv, mask, CISPO)[0].metrics
    real = mask.bool()
    assert m["grad_token_frac"] == pytest.approx(float((adv[real] != 0).double().mean()), abs=1e-15)
    assert m["grad_token_frac"] < 1.0  # some real tokens have A = 0
    assert m["clip_frac"] == 0.0
    r = (logp - old).exp()[real]
    assert m["weight_capped_frac"] == pytest.approx(float((r > 1.28).double().mean()), abs=1e-15)
    assert 0 < m["weight_capped_frac"] < 1


@pytest.mark.parametrize("junk", [float("nan"), float("inf"), -float("inf"), 5.0])
def test_padding_changes_nothing(junk):
    logp, old, adv, mask = _hand_batch()
    algo = CISPO.replace(eps_low=0.2, mask_eps_high=0.5)  # every indicator in play
    ref_out, ref_g = _grad(logp, old, adv, mask, algo)
    lp, ol = logp.clone(), old.clone()
    lp[1, 2], ol[1, 2] = junk, -junk if math.isfinite(junk) else junk  # a log-ratio of +-10 or non-finite
    out, g = _grad(lp, ol, adv, mask, algo)
    assert torch.isfinite(g).all() and g[1, 2] == 0.0
    assert torch.equal(g, ref_g)
    assert out.loss.item() == ref_out.loss.item()
    assert out.metrics == ref_out.metrics


MICRO_KEYS = ("loss", "pg_loss", "clip_frac_low", "clip_frac_high", "clip_frac", "grad_token_frac",
              "weight_capped_frac", "weight_floored_frac", "ratio_mean", "ratio_min", "ratio_max", "adv_abs_mean",
              "num_tokens", "num_sequences")


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize("mask_eps", [(None, None), (0.2, 0.28)])
def test_micro_batches_with_global_num_tokens_match_the_full_batch(ratio_level, mask_eps):
    # float64: rows 0-1 and rows 2-5 (with the empty row 2) as two micro-batches, each normalised by
    # the global N_tok, sum to the full batch's loss and gradient, and their metrics combine to the
    # full batch's. Catches token_mean ignoring num_tokens, and any coupling across rows (a batch-wide
    # statistic in the weight or in M) that a row split would change.
    algo = CISPO.replace(ratio_level=ratio_level, mask_eps_low=mask_eps[0], mask_eps_high=mask_eps[1])
    logp, old, adv, mask = _random_batch(9)
    full, g_full = _grad(logp, old, adv, mask, algo)
    parts = [slice(0, 2), slice(2, 6)]
    n_tok = mask.sum()
    outs, grads = zip(*(_grad(logp[s], old[s], adv[s], mask[s], algo, num_tokens=n_tok) for s in parts))
    assert sum(o.loss.item() for o in outs) == pytest.approx(full.loss.item(), rel=1e-12, abs=1e-15)
    torch.testing.assert_close(torch.cat(grads), g_full, rtol=1e-12, atol=1e-15)
    combined = reduce_micro_batches([o.metrics for o in outs])
    for k in MICRO_KEYS:
        assert combined[k] == pytest.approx(full.metrics[k], rel=1e-12, abs=1e-15), k
    assert (full.metrics["clip_frac"] > 0) == (mask_eps[0] is not None)  # M really removes tokens
    assert 0 < full.metrics["weight_capped_frac"] < 1
    # each micro-batch normalised by its own count does not add up (the two counts differ here)
    own = sum(policy_loss(logp[s], old[s], adv[s], mask[s], algo).loss.item() for s in parts)
    assert abs(own - full.loss.item()) > 1e-3 * abs(full.loss.item())


# ================================================================================================
# 6. extreme log-ratios
# ================================================================================================
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_extreme_log_ratios_finite_and_capped(dtype):
    # log r = (+25, -29, +25, -29), |log r| > 20, A = (2, 1, -1, -3). By hand, with r clamped at e^(+-20):
    # w = (1.28, e^-20, 1.28, e^-20); loss terms -w A log r = (-64, 29 e^-20, 32, -87 e^-20), so
    # loss = (-32 - 58 e^-20) / 4; gradient -w A / 4 = (-0.64, -e^-20/4, 0.32, 3 e^-20/4)
    old = torch.tensor([[-40.0, -1.0, -40.0, -1.0]], dtype=dtype)
    logp = torch.tensor([[-15.0, -30.0, -15.0, -30.0]], dtype=dtype)
    adv = torch.tensor([[2.0, 1.0, -1.0, -3.0]], dtype=dtype)
    mask = torch.ones(1, 4, dtype=dtype)
    out, g = _grad(logp, old, adv, mask, CISPO)
    tiny = math.exp(-LOG_RATIO_CLAMP)
    assert math.isfinite(out.loss.item()) and torch.isfinite(g).all()
    rel = 1e-12 if dtype == F64 else 1e-6
    assert out.loss.item() == pytest.approx((-32 - 58 * tiny) / 4, rel=rel)
    torch.testing.assert_close(g, torch.tensor([[-0.64, -tiny / 4, 0.32, 3 * tiny / 4]], dtype=dtype),
                               rtol=rel, atol=0)
    assert out.metrics["weight_capped_frac"] == 0.5
    assert all(math.isfinite(v) for v in out.metrics.values())
    assert out.metrics["ratio_max"] == pytest.approx(math.exp(LOG_RATIO_CLAMP), rel=1e-6)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask_eps", [(None, None), (0.2, 0.28)])
def test_low_precision_inputs_compute_in_float32(low, mask_eps):
    # bfloat16 / float16 log-probs and advantages: a float32 loss, finite, equal (to float32 rounding)
    # to the float32 path on the same rounded inputs. Catches a loss returned in the low dtype, or
    # log r / the weight / the product computed in it (8 or 11 significant bits: errors of order 1e-3,
    # far above the 1e-6 here), and non-finite values.
    algo = CISPO.replace(mask_eps_low=mask_eps[0], mask_eps_high=mask_eps[1])
    logp64, old64, adv64, mask64 = _random_batch(7)
    logp, old, adv, mask = (t.to(low) for t in (logp64, old64, adv64, mask64))
    out, g = _grad(logp, old, adv, mask, algo)
    assert out.loss.dtype == torch.float32 and g.dtype == low
    assert math.isfinite(out.loss.item()) and torch.isfinite(g).all()
    assert all(math.isfinite(v) for v in out.metrics.values())
    # reference: the rounded inputs, cast to float32, through the float32 path
    ref, g32 = _grad(logp.float(), old.float(), adv.float(), mask.float(), algo)
    assert out.loss.item() == pytest.approx(ref.loss.item(), rel=1e-6, abs=1e-7)
    # the gradient reaching a low-precision leaf is the float32 one rounded to it (relative 2^-8 at most)
    torch.testing.assert_close(g.float(), g32, rtol=2 ** -8, atol=1e-7)
    for k in ("clip_frac_low", "clip_frac_high", "grad_token_frac", "weight_capped_frac", "weight_floored_frac",
              "num_tokens"):
        assert out.metrics[k] == ref.metrics[k], k
    assert (out.metrics["clip_frac"] > 0) == (mask_eps[0] is not None)
    # the tolerance can tell: the unrounded float64 inputs give a loss farther from the reference than it
    unrounded = policy_loss(logp64.float(), old64.float(), adv64.float(), mask64.float(), algo).loss.item()
    assert abs(unrounded - ref.loss.item()) > 1e-5 * abs(ref.loss.item())


# ================================================================================================
# 7. preset and validation
# ================================================================================================
def test_cispo_preset_fields():
    # MiniMax-M1 §3.1: Eqs. 4-5, eps_low "large" (1 = no floor), token-level mean per group (Eq. 4), no KL, DAPO's dynamic
    # sampling and soft length penalty; eps_high = 0.28 is the package's choice (not in the paper)
    assert CISPO_PRESET.name == "CISPO" and CISPO_PRESET.surrogate != "ppo" and SURROGATES[CISPO_PRESET.surrogate] is cispo_surrogate
    assert CISPO_PRESET.eps_low == 1.0 and CISPO_PRESET.eps_high == 0.28
    assert CISPO_PRESET.aggregation == "group_token_mean"  # Eq. 4: 1/sum_i|o_i| per group
    assert CISPO_PRESET.kl is None and CISPO_PRESET.beta == 0.0 and not CISPO_PRESET.uses_kl
    assert CISPO_PRESET.advantage == "group" and CISPO_PRESET.ratio_level == "token"
    assert CISPO_PRESET.dynamic_sampling and not CISPO_PRESET.overlong_filter and CISPO_PRESET.overlong_cache_frac == 0.2
    assert CISPO_PRESET.mask_eps_low is None and CISPO_PRESET.mask_eps_high is None
    assert CISPO_PRESET.offpolicy_mask_delta is None and not CISPO_PRESET.kl_importance_correction
    assert PRESETS["CISPO"] is CISPO_PRESET
    assert get_algorithm("cispo") is CISPO_PRESET and get_algorithm(" CISPO ") is CISPO_PRESET
    assert Algorithm(surrogate=CLIP).surrogate == CLIP  # a valid choice of the clip axis
    ax = CISPO.axes()
    assert ax["mask_eps_low"] is None and ax["mask_eps_high"] is None and ax["surrogate"] == CLIP


@pytest.mark.parametrize("make, match", [
    (lambda: Algorithm(surrogate="ppo", mask_eps_high=0.2), "mask_eps"),
    (lambda: DAPO.replace(mask_eps_low=0.2), "mask_eps"),
    (lambda: CISPO.replace(mask_eps_low=1.5), "mask_eps_low"),
    (lambda: CISPO.replace(mask_eps_low=-0.1), "mask_eps_low"),
    (lambda: CISPO.replace(mask_eps_high=-0.1), "mask_eps_high"),
    (lambda: CISPO.replace(mask_eps_low=float("nan")), "mask_eps_low"),
    (lambda: CISPO.replace(mask_eps_high=float("nan")), "mask_eps_high"),
    (lambda: CISPO.replace(mask_eps_high=float("inf")), "mask_eps_high"),
    (lambda: CISPO.replace(mask_eps_high="0.2"), "mask_eps_high"),
    (lambda: CISPO.replace(mask_eps_low=True), "mask_eps_low"),
])
def test_mask_eps_validation(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_mask_eps_accepted_values_stored_as_float():
    import numpy as np

    a = CISPO.replace(mask_eps_low=1, mask_eps_high=np.float32(0.0))
    assert a.mask_eps_low == 1.0 and type(a.mask_eps_low) is float
    assert a.mask_eps_high == 0.0 and type(a.mask_eps_high) is float
    assert a.axes()["mask_eps_low"] == 1.0


# ================================================================================================
# 8. models: FP32 LM head and the low-precision inference copy
# ================================================================================================
@pytest.fixture(scope="module")
def tiny(tok):
    return tiny_policy(tok, TINY, seed=0)  # tied embeddings (TinyConfig default)


IDS = torch.tensor([[5, 9, 14, 7, 17, 12], [4, 4, 14, 8, 17, 6]])


def _logits(model):
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.parametrize("dtype", ["bfloat16", torch.bfloat16, "float16"])
def test_inference_copy_fp32_head(tiny, dtype):
    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    assert tiny.lm_head.weight is tiny.model.embed_tokens.weight  # tied to begin with
    low = {"bfloat16": torch.bfloat16, "float16": torch.float16}[str(dtype).replace("torch.", "")]
    cp = inference_copy(tiny, dtype, fp32_lm_head=True)
    assert isinstance(cp.lm_head, FP32LMHead)
    for name, p in cp.named_parameters():
        assert p.dtype == (torch.float32 if name.startswith("lm_head.") else low), name
        assert not p.requires_grad, name
    assert not cp.training
    # the head is the source's float32 weight, unrounded, in its own storage
    assert torch.equal(cp.lm_head.weight, tiny.lm_head.weight)
    assert cp.lm_head.weight.data_ptr() != tiny.lm_head.weight.data_ptr()
    assert _logits(cp).dtype == torch.float32
    # the source is unchanged: dtype, values, tying, trainability, config
    assert all(p.dtype == torch.float32 and p.requires_grad for p in tiny.parameters())
    after = tiny.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert tiny.lm_head.weight is tiny.model.embed_tokens.weight
    assert tiny.config.tie_word_embeddings and not cp.config.tie_word_embeddings
    assert type(tiny.lm_head) is torch.nn.Linear


def test_inference_copy_plain(tiny):
    cp = inference_copy(tiny)  # default bfloat16, head in bfloat16 too (still tied in the copy)
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in cp.parameters())
    assert cp.lm_head.weight is cp.model.embed_tokens.weight and type(cp.lm_head) is torch.nn.Linear
    assert _logits(cp).dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 and p.requires_grad for p in tiny.parameters())
    f32 = inference_copy(tiny, "float32")
    torch.testing.assert_close(_logits(f32), _logits(tiny), rtol=0, atol=0)
    # the bfloat16 copy (no float32 head here) is a real perturbation of the float32 logits
    assert (_logits(cp).float() - _logits(tiny)).abs().max() > 1e-4


@pytest.mark.parametrize("bad", ["float64", torch.float64, "int8", torch.int32, "bf16", None])
def test_inference_copy_bad_dtype(tiny, bad):
    with pytest.raises(ValueError, match="dtype"):
        inference_copy(tiny, bad)


def test_use_fp32_lm_head_on_fp32_model(tiny):
    m = copy.deepcopy(tiny)
    expected = _logits(tiny)
    out = use_fp32_lm_head(m)
    assert out is m and isinstance(m.lm_head, FP32LMHead)
    logits = _logits(m)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected, rtol=1e-6, atol=1e-6)
    # untied: the head is its own parameter now, the embeddings are untouched
    assert m.lm_head.weight is not m.model.embed_tokens.weight and not m.config.tie_word_embeddings
    assert m.model.embed_tokens.weight.dtype == torch.float32
    with torch.no_grad():
        m.model.embed_tokens.weight.add_(1.0)
    assert torch.equal(m.lm_head.weight, tiny.lm_head.weight)


def test_use_fp32_lm_head_with_source_and_shape_check(tiny, tok):
    body = copy.deepcopy(tiny).to(torch.bfloat16)
    use_fp32_lm_head(body, source=tiny)
    assert body.lm_head.weight.dtype == torch.float32 and torch.equal(body.lm_head.weight, tiny.lm_head.weight)
    assert body.model.embed_tokens.weight.dtype == torch.bfloat16
    assert _logits(body).dtype == torch.float32
    # FP32LMHead itself: a bfloat16 hidden state, float32 logits = linear(h.float(), W)
    h = torch.randn(3, TINY.hidden_size).to(torch.bfloat16)
    head = FP32LMHead(tiny.lm_head.weight)
    torch.testing.assert_close(head(h), torch.nn.functional.linear(h.float(), tiny.lm_head.weight.detach()),
                               rtol=0, atol=0)
    other = tiny_policy(tok, TinyConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(ValueError, match="source"):
        use_fp32_lm_head(copy.deepcopy(tiny), source=other)


def test_fp32_head_survives_a_cast_of_its_model(tiny):
    m = use_fp32_lm_head(copy.deepcopy(tiny))
    w = m.get_output_embeddings().weight.detach().clone()
    cp = inference_copy(m, "bfloat16")  # e.g. a policy that already trains with an FP32 head
    assert _logits(cp).dtype == torch.float32
    m.to(torch.bfloat16)  # casting the model keeps the head's float32 values exactly
    head = m.get_output_embeddings()
    assert head.weight.dtype == torch.float32 and torch.equal(head.weight, w)
    assert next(m.model.parameters()).dtype == torch.bfloat16


# ================================================================================================
# 9. trainer: low-precision rollout
# ================================================================================================
@pytest.mark.parametrize("kwargs, match", [
    (dict(rollout_fp32_lm_head=True), "rollout_fp32_lm_head"),
    (dict(rollout_fp32_lm_head=True, rollout_dtype="float32"), "rollout_fp32_lm_head"),
    (dict(rollout_dtype="float64"), "rollout_dtype"),
    (dict(rollout_dtype="bf16"), "rollout_dtype"),
    (dict(rollout_dtype=None), "rollout_dtype"),
    (dict(rollout_dtype="bfloat16", rollout_fp32_lm_head=1), "rollout_fp32_lm_head"),
])
def test_trainer_config_rollout_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainerConfig(**kwargs)


def test_trainer_config_rollout_accepted():
    for dt in ("float32", "bfloat16", "float16"):
        assert TrainerConfig(rollout_dtype=dt).rollout_dtype == dt
    c = TrainerConfig(rollout_dtype="bfloat16", rollout_fp32_lm_head=True)
    assert TrainerConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("fp32_head", [False, True])
def test_cispo_trains_one_step_from_a_bfloat16_rollout(monkeypatch, fp32_head):
    calls = []
    orig = collection_mod.inference_copy

    def recording(model, dtype, **kw):
        calls.append((dtype, kw))
        return orig(model, dtype, **kw)

    monkeypatch.setattr(collection_mod, "inference_copy", recording)  # where the rollout calls it
    policy, tokenizer = load_policy("arithmetic-base")
    cfg = TrainerConfig(prompts_per_step=4, group_size=4, eval_every=0, progress=False, seed=0,
                        old_logp="behaviour", rollout_dtype="bfloat16", rollout_fp32_lm_head=fp32_head)
    tr = Trainer(policy, tokenizer, ArithmeticTask(test_size=6), CISPO, cfg)
    w0 = [p.detach().clone() for p in tr.policy.parameters()]
    h = tr.train(1)
    assert calls and all(c == ("bfloat16", {"fp32_lm_head": fp32_head}) for c in calls)
    row = h.iloc[-1]
    assert row["trained_groups"] > 0
    for c in ("loss", "pg_loss", "grad_norm", "weight_capped_frac", "weight_floored_frac", "ratio_min",
              "ratio_max"):
        assert math.isfinite(row[c]), c
    assert row["clip_frac"] == 0.0 and math.isnan(row["kl"])  # no mask M, no KL term
    # the behaviour log-probs came from the bfloat16 copy: the float32 policy's ratios are not 1
    # (a float32 sampler gives 1 within 1e-5, tests/training/test_trainer.py::test_old_logp_behaviour_matches_recompute)
    assert max(abs(row["ratio_min"] - 1), abs(row["ratio_max"] - 1)) > 1e-3
    # the trained policy itself stays float32, tied, with a plain head, and it moved
    assert all(p.dtype == torch.float32 for p in tr.policy.parameters())
    assert type(tr.policy.lm_head) is torch.nn.Linear
    assert tr.policy.lm_head.weight is tr.policy.model.embed_tokens.weight
    assert any(not torch.equal(a, b) for a, b in zip(w0, tr.policy.parameters()))
