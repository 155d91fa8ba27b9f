"""Tests for GSPO and GSPO-token (Zheng et al., "Group Sequence Policy Optimization", arXiv 2507.18071).

GSPO, Eqs. 5-7 (to maximise)::

    J = 1/G sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i),
    s_i = (pi_theta(y_i) / pi_old(y_i))^(1/|y_i|) = exp(1/|y_i| sum_t log r_it),   A_i = (r - mean) / std

its gradient, Eq. 10, ``1/G sum_i s_i A_i 1/|y_i| sum_t grad log pi_theta(y_it)`` (unclipped
sequences), and GSPO-token, Eqs. 13-17: ``s_it = sg[s_i] pi_theta(y_it) / sg[pi_theta(y_it)]`` inside
``1/G sum_i 1/|y_i| sum_t min(s_it A_it, clip(s_it) A_it)``.

Where the goldens come from is said at each test: worked by hand (the numbers are written as the
hand formula), or float64 references written straight from the paper's equations as explicit loops
over sequences and tokens (no code shared with the package).
"""

import json
import math

import pytest
import torch

from grpo_lab.algo.algorithms import GRPO, GSPO, GSPO_TOKEN, PRESETS, get_algorithm
from grpo_lab.algo.metrics import reduce_micro_batches
from grpo_lab.algo.objectives import (
    METRIC_KEYS,
    RATIOS,
    policy_loss,
    sequence_log_ratio,
    sequence_ratio,
    sequence_token_ratio,
)

F64 = torch.float64
EL, EH = 3e-4, 4e-4  # GSPO §5.1


# ================================================================================================
# float64 references, one line of the paper at a time
# ================================================================================================
def _clip_term(s, a, eps_low, eps_high):
    """min(s A, clip(s, 1 - eps_low, 1 + eps_high) A) for one scalar ratio (autograd-able)."""
    unclipped = s * a
    clipped = torch.clamp(s, 1 - eps_low, 1 + eps_high) * a
    return unclipped if unclipped <= clipped else clipped


def ref_log_s(logp, old, mask, i):
    """log s_i of GSPO Eq. 7: 1/|y_i| sum_t log(pi_theta(y_it) / pi_old(y_it)) over the real tokens."""
    L = int(mask[i].sum())
    return sum(logp[i, t] - old[i, t] for t in range(logp.shape[1]) if mask[i, t]) / L


def ref_gspo_token_eq13(logp, old, adv, mask, eps_low=EL, eps_high=EH):
    """-J_GSPO-token, Eq. 13 with s_it of Eq. 14: 1/G sum_i 1/|y_i| sum_t min(s_it A_it, clip(s_it) A_it),
    s_it = sg[s_i] * pi_theta(y_it) / sg[pi_theta(y_it)]. Empty rows are not responses (not in G)."""
    B, T = logp.shape
    J = torch.zeros((), dtype=F64)
    G = 0
    for i in range(B):
        L = int(mask[i].sum())
        if L == 0:
            continue
        G += 1
        s_i = torch.exp(ref_log_s(logp, old, mask, i)).detach()
        row = torch.zeros((), dtype=F64)
        for t in range(T):
            if mask[i, t]:
                s_it = s_i * torch.exp(logp[i, t]) / torch.exp(logp[i, t]).detach()
                row = row + _clip_term(s_it, adv[i, t], eps_low, eps_high)
        J = J + row / L
    return -(J / max(G, 1))


def _batch(seed, B=7, T=9, spread=2e-3, dtype=F64):
    """Ragged float64 batch (random lengths, row 1 empty) whose token log-ratios are spread around 0 so
    that some sequence ratios fall inside GSPO's clip range [1 - 3e-4, 1 + 4e-4] and some outside, on
    both sides; per-sequence advantages of both signs (row 2: exactly 0)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3 - 0.1
    logp = old + spread * torch.randn(B, T, generator=g, dtype=F64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[1] = 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(B, generator=g, dtype=F64)
    adv[2] = 0.0
    return logp.to(dtype), old.to(dtype), adv.to(dtype), mask


def _grad(logp, old, adv, mask, algo, **kw):
    """(loss output, d loss / d logp) of policy_loss for a fresh leaf copy of ``logp``."""
    x = logp.detach().clone().requires_grad_()
    out = policy_loss(x, old, adv, mask, algo, **kw)
    (g,) = torch.autograd.grad(out.loss, x)
    return out, g


def _seq_ratios(logp, old, mask):
    """s_i of the non-empty rows (float64, from the definition)."""
    return torch.stack([torch.exp(ref_log_s(logp.double(), old.double(), mask, i))
                        for i in range(logp.shape[0]) if mask[i].any()])


# ================================================================================================
# the ratio
# ================================================================================================
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sequence_ratio_is_the_geometric_mean_of_token_ratios(seed):
    # golden: GSPO Eq. 7's first form, (pi_theta(y_i) / pi_old(y_i))^(1/|y_i|), with the sequence
    # likelihood ratio written as the product of the token ratios, in float64
    logp, old, _, mask = _batch(seed, spread=0.3)
    got = torch.exp(sequence_log_ratio(logp, old, mask))
    for i in range(logp.shape[0]):
        L = int(mask[i].sum())
        if L == 0:
            assert got[i] == 1.0  # an empty row: log s = 0 by convention
            continue
        prod = torch.ones((), dtype=F64)
        for t in range(L):
            prod = prod * (torch.exp(logp[i, t]) / torch.exp(old[i, t]))
        assert torch.allclose(got[i], prod ** (1.0 / L), rtol=1e-12, atol=0), i
    # the registry functions give the same value at every token of the row
    lp, ol = logp.masked_fill(~mask, 0.0), old.masked_fill(~mask, 0.0)
    log_s = sequence_log_ratio(logp, old, mask)
    for fn in (sequence_ratio, sequence_token_ratio):
        assert torch.equal(fn(lp, ol, mask), log_s[:, None].expand_as(lp)), fn.__name__
    assert RATIOS["sequence"] is sequence_ratio and RATIOS["sequence_token"] is sequence_token_ratio


def test_gspo_token_ratio_gradient_is_one_at_its_own_token():
    # Eq. 14: d log s_it / d log pi_theta(y_jk) = 1 if (j, k) = (i, t) else 0 (the stop-gradients remove
    # the 1/|y_i| coupling of Eq. 7). Checked by the full Jacobian.
    logp, old, _, mask = _batch(3, B=3, T=4, spread=0.3)
    lp, ol = logp.masked_fill(~mask, 0.0), old.masked_fill(~mask, 0.0)
    jac = torch.autograd.functional.jacobian(lambda x: sequence_token_ratio(x, ol, mask), lp)
    assert torch.equal(jac.reshape(12, 12), torch.eye(12, dtype=F64))
    # the plain sequence ratio spreads 1/|y_i| over the whole row instead
    jac_seq = torch.autograd.functional.jacobian(lambda x: sequence_ratio(x, ol, mask), lp)
    L = mask.sum(1)
    i = int(torch.argmax(L))
    n = int(L[i])
    assert n > 1 and torch.allclose(jac_seq[i, 0, i, :n], torch.full((n,), 1.0 / n, dtype=F64))


@pytest.mark.parametrize("algo", [GSPO, GSPO_TOKEN], ids=lambda a: a.name)
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_padding_never_leaks(algo, per_token_adv):
    # NaN / inf at masked positions of logp, old_logp and the advantages change nothing
    logp, old, adv, mask = _batch(4)
    if per_token_adv:
        adv = adv[:, None] * (1 + torch.arange(logp.shape[1], dtype=F64))[None, :] / 5
    clean_out, clean_g = _grad(logp, old, adv, mask, algo)
    dirty = [logp.clone(), old.clone(), adv.clone()]
    dirty[0][~mask] = float("nan")
    dirty[1][~mask] = float("inf")
    if per_token_adv:
        dirty[2][~mask] = -float("inf")
    out, g = _grad(*dirty, mask, algo)
    assert torch.equal(out.loss, clean_out.loss)
    assert torch.equal(g, clean_g) and torch.isfinite(g).all() and (g[~mask] == 0).all()
    assert dict(out.metrics) == dict(clean_out.metrics)
    assert torch.equal(sequence_log_ratio(dirty[0], dirty[1], mask), sequence_log_ratio(logp, old, mask))
    # a real token does move the ratio, so the comparison above can fail
    moved = logp.clone()
    moved[0, 0] -= 0.5
    assert not torch.equal(sequence_log_ratio(moved, old, mask), sequence_log_ratio(logp, old, mask))


# ================================================================================================
# GSPO-token vs GSPO
# ================================================================================================
@pytest.mark.parametrize("seed", [0, 5, 6])
def test_gspo_token_equals_gspo_for_shared_advantages(seed):
    # Eqs. 13-17: with A_it = A_i, "the objective, the clipping condition and the gradient" equal GSPO's
    logp, old, adv, mask = _batch(seed)
    s = _seq_ratios(logp, old, mask)
    assert ((s < 1 - EL) | (s > 1 + EH)).any() and ((s >= 1 - EL) & (s <= 1 + EH)).any()  # both regimes
    a, ga = _grad(logp, old, adv, mask, GSPO)
    for adv_tok in (adv, adv[:, None].expand_as(logp)):
        b, gb = _grad(logp, old, adv_tok, mask, GSPO_TOKEN)
        assert torch.allclose(b.loss, a.loss, rtol=1e-12, atol=1e-15)
        assert torch.allclose(gb, ga, rtol=1e-10, atol=1e-15)
        for k in ("clip_frac", "clip_frac_low", "clip_frac_high", "seq_clip_frac", "grad_token_frac"):
            assert b.metrics[k] == a.metrics[k], k
    assert a.metrics["seq_clip_frac"] > 0 and (ga != 0).any()
    # and GSPO-token is Eq. 13 written out (float64 reference, autograd through its stop-gradients)
    x = logp.clone().requires_grad_()
    ref = ref_gspo_token_eq13(x, old, adv[:, None].expand_as(logp), mask)
    (g_ref,) = torch.autograd.grad(ref, x)
    assert torch.allclose(a.loss, ref, rtol=1e-12) and torch.allclose(ga, g_ref, rtol=1e-10, atol=1e-15)


def test_gspo_token_differs_from_gspo_for_per_token_advantages():
    # per-token advantages: the value is the same (s_it = s_i), the gradients are not.
    # golden: GSPO-token's gradient, Eq. 17, -1/G 1/|y_i| s_i A_it at each unclipped token;
    # GSPO's with A_it, -1/G 1/|y_i| (1/|y_i| sum_{t unclipped} s_i A_it) at every token of the row.
    logp, old, adv, mask = _batch(7, spread=1e-4)  # every |log s_i| < 3e-4: no sequence is clipped
    T = logp.shape[1]
    adv_tok = adv[:, None] + torch.linspace(-1.0, 1.0, T, dtype=F64)[None, :]
    a, ga = _grad(logp, old, adv_tok, mask, GSPO)
    b, gb = _grad(logp, old, adv_tok, mask, GSPO_TOKEN)
    assert a.metrics["clip_frac"] == 0.0 == b.metrics["clip_frac"]
    assert torch.allclose(a.loss, b.loss, rtol=1e-12)
    assert not torch.allclose(ga, gb, rtol=1e-3, atol=1e-6)
    L = mask.sum(1)
    G = int((L > 0).sum())
    s = torch.exp(sequence_log_ratio(logp, old, mask))
    exp_tok, exp_seq = torch.zeros_like(logp), torch.zeros_like(logp)
    for i in range(logp.shape[0]):
        n = int(L[i])
        if n == 0:
            continue
        for t in range(n):
            exp_tok[i, t] = -s[i] * adv_tok[i, t] / (G * n)
        exp_seq[i, :n] = -s[i] * adv_tok[i, :n].sum() / n / (G * n)
    assert torch.allclose(gb, exp_tok, rtol=1e-10, atol=1e-15)
    assert torch.allclose(ga, exp_seq, rtol=1e-10, atol=1e-15)


def test_gspo_token_clips_per_token_by_advantage_sign():
    # one row with s_i = e^0.01 > 1 + eps_high and advantages of both signs: the clip removes the
    # A > 0 tokens only (the upper clip binds for A > 0); hand values
    L = 4
    old = torch.full((1, L), -2.0, dtype=F64)
    logp = old + 0.01
    adv = torch.tensor([[1.0, -1.0, 2.0, -0.5]], dtype=F64)
    mask = torch.ones(1, L, dtype=torch.bool)
    out, g = _grad(logp, old, adv, mask, GSPO_TOKEN)
    s = math.exp(0.01)
    expected = torch.tensor([[0.0, s * 1.0 / L, 0.0, s * 0.5 / L]], dtype=F64)
    assert torch.allclose(g, expected, rtol=1e-12, atol=0)
    assert out.metrics["clip_frac_high"] == pytest.approx(2 / 4) and out.metrics["clip_frac_low"] == 0.0
    assert out.metrics["seq_clip_frac"] == 0.0  # two tokens still train: the row is not clipped


# ================================================================================================
# GSPO's gradient, Eq. 10
# ================================================================================================
def test_gspo_gradient_matches_eq10_by_hand():
    # golden: Eq. 10, grad J = 1/G sum_i s_i A_i 1/|y_i| sum_t grad log pi_theta(y_it) for the sequences
    # the clip leaves alone, 0 for the clipped ones, so d(-J)/d log pi(y_it) = -s_i A_i / (G |y_i|).
    # Rows: (length, target log s_i, A_i) -> clipped?
    rows = [
        (3, 1e-4, 1.0),     # inside the range: trains
        (5, 1e-3, 0.7),     # s > 1 + 4e-4, A > 0: clipped
        (2, -1e-3, 0.5),    # s < 1 - 3e-4 but A > 0: the lower clip does not bind, trains
        (4, -1e-3, -1.2),   # s < 1 - 3e-4, A < 0: clipped
        (6, 1e-3, -0.3),    # s > 1 + 4e-4 but A < 0: trains (and its s A is unclipped)
        (0, 0.0, 0.9),      # empty row: not a response
        (4, -2e-4, -0.8),   # inside: trains
    ]
    clipped = [False, True, False, True, False, None, False]
    B, T = len(rows), 6
    old = -1.0 - 0.1 * torch.arange(B * T, dtype=F64).reshape(B, T) / (B * T)
    logp = old.clone()
    mask = torch.zeros(B, T, dtype=torch.bool)
    for i, (n, log_s, _) in enumerate(rows):
        wiggle = 0.05 * torch.tensor([(-1.0) ** t for t in range(n)], dtype=F64)  # token ratios far from 1...
        wiggle = wiggle - wiggle.mean()  # ...that average to 0
        logp[i, :n] = old[i, :n] + log_s + wiggle
        mask[i, :n] = True
    adv = torch.tensor([a for _, _, a in rows], dtype=F64)
    out, g = _grad(logp, old, adv, mask, GSPO)
    G = 6
    expected = torch.zeros(B, T, dtype=F64)
    J = 0.0
    for i, (n, log_s, a) in enumerate(rows):
        if n == 0:
            continue
        s = math.exp(log_s)
        J += min(s * a, min(max(s, 1 - EL), 1 + EH) * a)
        if not clipped[i]:
            expected[i, :n] = -s * a / (G * n)
    assert torch.allclose(g, expected, rtol=1e-9, atol=1e-15)
    assert out.loss.item() == pytest.approx(-J / G, rel=1e-9)
    # the clip metrics say the same: 2 of 6 sequences, 9 of 24 tokens (5 high + 4 low)
    assert out.metrics["seq_clip_frac"] == pytest.approx(2 / 6, rel=1e-12)
    assert out.metrics["clip_frac_high"] == pytest.approx(5 / 24)
    assert out.metrics["clip_frac_low"] == pytest.approx(4 / 24)


# ================================================================================================
# sequence-level metrics
# ================================================================================================
def _metric_batch():
    """Hand-built batch (T = 10, eps: GSPO 3e-4 / 4e-4, GRPO 0.2 / 0.2). Rows: length, token log-ratios, A:
    0: 10 tokens, [+0.5, -0.3] * 5 -> log s = 0.1,   A = +1
    1:  2 tokens, [-0.002, 0]      -> log s = -1e-3, A = -1
    2:  2 tokens, [0, 0]           -> log s = 0,     A = +0.5
    3:  2 tokens, [-0.5, -0.5]     -> log s = -0.5,  A = -1
    4:  empty
    5:  3 tokens, [0.01] * 3       -> log s = 0.01,  A = -1
    """
    lrs = [[0.5, -0.3] * 5, [-0.002, 0.0], [0.0, 0.0], [-0.5, -0.5], [], [0.01] * 3]
    B, T = len(lrs), 10
    old = torch.full((B, T), -3.0, dtype=F64)
    logp = old.clone()
    mask = torch.zeros(B, T, dtype=torch.bool)
    for i, lr in enumerate(lrs):
        logp[i, : len(lr)] += torch.tensor(lr, dtype=F64)
        mask[i, : len(lr)] = True
    adv = torch.tensor([1.0, -1.0, 0.5, -1.0, 0.3, -1.0], dtype=F64)
    log_s = [0.1, -1e-3, 0.0, -0.5, 0.01]
    return logp, old, adv, mask, [math.exp(v) for v in log_s]


def test_clip_metrics_count_a_clipped_sequence_once():
    logp, old, adv, mask = _metric_batch()[:4]
    n_tok, n_seq = 19, 5
    m = policy_loss(logp, old, adv, mask, GSPO).metrics
    # GSPO: row 0 clipped high (10 tokens), rows 1 and 3 clipped low (2 + 2 tokens); row 5 is outside the
    # range on the side that does not bind for A < 0
    assert m["clip_frac_high"] == pytest.approx(10 / n_tok, rel=1e-12)
    assert m["clip_frac_low"] == pytest.approx(4 / n_tok, rel=1e-12)
    assert m["clip_frac"] == pytest.approx(14 / n_tok, rel=1e-12)
    assert m["seq_clip_frac"] == pytest.approx(3 / n_seq, rel=1e-12)
    # the long row is 10/19 of the clipped tokens but one of the five sequences
    one_row = policy_loss(logp, old, adv * torch.tensor([1.0, 0, 1, 0, 1, 1], dtype=F64), mask, GSPO).metrics
    assert one_row["clip_frac"] == pytest.approx(10 / n_tok) and one_row["seq_clip_frac"] == pytest.approx(1 / n_seq)
    # GRPO, token ratios: 5 tokens of row 0 clipped high (r = e^0.5 > 1.2) but its 5 others train, so the
    # row is not clipped; row 3's two tokens (r = e^-0.5 < 0.8, A < 0) are, so row 3 is
    g = policy_loss(logp, old, adv, mask, GRPO.replace(kl=None, beta=0.0)).metrics
    assert g["clip_frac_high"] == pytest.approx(5 / n_tok) and g["clip_frac_low"] == pytest.approx(2 / n_tok)
    assert g["seq_clip_frac"] == pytest.approx(1 / n_seq, rel=1e-12)
    for metrics in (m, g):
        assert metrics["seq_clip_frac"].reduce == "mean" and metrics["seq_clip_frac"].weight == n_seq


@pytest.mark.parametrize("algo", [GSPO, GRPO.replace(kl=None, beta=0.0)], ids=["GSPO", "GRPO"])
def test_sequence_ratio_metrics_for_every_algorithm(algo):
    # golden: s_i = exp(mean_t log r_it) by hand for the five non-empty rows, whatever the ratio level
    logp, old, adv, mask, s = _metric_batch()
    m = policy_loss(logp, old, adv, mask, algo).metrics
    assert m["seq_ratio_mean"] == pytest.approx(sum(s) / 5, rel=1e-12)
    assert m["seq_ratio_min"] == pytest.approx(math.exp(-0.5), rel=1e-12)
    assert m["seq_ratio_max"] == pytest.approx(math.exp(0.1), rel=1e-12)
    assert m["seq_ratio_abs_dev"] == pytest.approx(sum(abs(v - 1) for v in s) / 5, rel=1e-12)
    how = {k: (m[k].reduce, m[k].weight) for k in ("seq_ratio_mean", "seq_ratio_min", "seq_ratio_max",
                                                    "seq_ratio_abs_dev")}
    assert how == {"seq_ratio_mean": ("mean", 5.0), "seq_ratio_min": ("min", 5.0), "seq_ratio_max": ("max", 5.0),
                   "seq_ratio_abs_dev": ("mean", 5.0)}
    # token_ratio_abs_dev: mean |r_it - 1| over the 19 real tokens, by hand, whatever the ratio level
    tok = [0.5, -0.3] * 5 + [-0.002, 0.0] + [0.0, 0.0] + [-0.5, -0.5] + [0.01] * 3
    assert m["token_ratio_abs_dev"] == pytest.approx(sum(abs(math.exp(v) - 1) for v in tok) / 19, rel=1e-12)
    assert (m["token_ratio_abs_dev"].reduce, m["token_ratio_abs_dev"].weight) == ("mean", 19.0)
    # the token ratio metrics stay per token (GRPO's ratio_max is e^0.5, a token's)
    assert m["ratio_max"] == pytest.approx(math.exp(0.5 if algo.ratio_level == "token" else 0.1), rel=1e-12)


@pytest.mark.parametrize("algo", [GSPO, GSPO_TOKEN, GRPO.replace(kl=None, beta=0.0)], ids=lambda a: a.name)
def test_sequence_metrics_reduce_exactly_over_micro_batches(algo):
    # the trainer splits rows into micro-batches and combines metrics with reduce_micro_batches
    logp, old, adv, mask = _metric_batch()[:4]
    full = policy_loss(logp, old, adv, mask, algo).metrics
    counts = dict(num_tokens=19, num_sequences=5)
    parts = [policy_loss(logp[sl], old[sl], adv[sl], mask[sl], algo, **counts).metrics
             for sl in (slice(0, 2), slice(2, 4), slice(4, 5), slice(5, 6))]  # slice(4, 5): the empty row alone
    assert parts[2]["seq_ratio_min"].weight == 0.0 and all(math.isfinite(v) for v in parts[2].values())
    red = reduce_micro_batches(parts)
    for k in ("seq_clip_frac", "seq_ratio_mean", "seq_ratio_min", "seq_ratio_max", "seq_ratio_abs_dev",
              "clip_frac", "loss"):
        assert red[k] == pytest.approx(float(full[k]), rel=1e-12, abs=1e-15), k


@pytest.mark.parametrize("algo", [GSPO, GSPO_TOKEN], ids=lambda a: a.name)
def test_empty_batch_gives_defined_sequence_metrics(algo):
    logp, old, adv, mask = _batch(8)
    out, g = _grad(logp, old, adv, torch.zeros_like(mask), algo)
    m = out.metrics
    assert out.loss.item() == 0.0 and (g == 0).all()
    assert list(m) == list(METRIC_KEYS) and all(math.isfinite(v) for v in m.values())
    assert m["seq_clip_frac"] == 0.0 and m["seq_ratio_abs_dev"] == 0.0
    assert m["seq_ratio_mean"] == m["seq_ratio_min"] == m["seq_ratio_max"] == 1.0
    assert m["seq_ratio_min"].weight == 0.0 and m["seq_clip_frac"].weight == 0.0


# ================================================================================================
# presets
# ================================================================================================
def test_gspo_presets():
    # GSPO §5.1: clip 3e-4 (left) / 4e-4 (right), no KL; Eq. 5 -> per-response mean; Eq. 6 -> group z-score
    assert GSPO.name == "GSPO" and PRESETS["GSPO"] is GSPO and get_algorithm("gspo") is GSPO
    assert GSPO.ratio_level == "sequence" and GSPO.surrogate == "ppo"
    assert (GSPO.eps_low, GSPO.eps_high) == (3e-4, 4e-4)
    assert GSPO.kl is None and GSPO.beta == 0.0 and not GSPO.uses_kl
    assert GSPO.advantage == "group" and GSPO.aggregation == "seq_mean_token_mean"
    assert not (GSPO.dynamic_sampling or GSPO.overlong_filter) and GSPO.overlong_cache_len is None
    # GSPO-token: only the ratio level differs
    assert GSPO_TOKEN.name == "GSPO_TOKEN" and PRESETS["GSPO_TOKEN"] is GSPO_TOKEN
    assert get_algorithm("gspo_token") is GSPO_TOKEN
    assert GSPO_TOKEN.replace(name="GSPO", ratio_level="sequence") == GSPO
    assert GSPO_TOKEN.functions()["RATIOS['sequence_token']"] is sequence_token_ratio
    json.dumps([GSPO.describe(), GSPO_TOKEN.describe()])  # serialisable for provenance
    assert GSPO.axes()["kl"] is None and GSPO.axes()["eps_high"] == 4e-4


@pytest.mark.parametrize("algo", [GSPO, GSPO_TOKEN], ids=lambda a: a.name)
def test_presets_run_with_trainer_arguments(algo):
    # policy_loss as Trainer._micro_step calls it (no ref_logp: no KL term; max_tokens, group_tokens and
    # the minibatch's counts), on float32 micro-batches: they sum to the full-batch loss and gradient,
    # which is GSPO Eq. 5 (float64 reference from the paper: ref_gspo_token_eq13 with shared advantages)
    logp, old, adv, mask = _batch(9, B=8, T=6, dtype=torch.float32)
    G = 4
    lm = mask.sum(1).double()
    group_tokens = lm.view(-1, G).sum(1).repeat_interleave(G)
    counts = dict(num_tokens=float(lm.sum()), num_sequences=float((lm > 0).sum()),
                  num_groups=float((lm.view(-1, G).sum(1) > 0).sum()))
    x = logp.clone().requires_grad_()
    total = torch.zeros(())
    for sl in (slice(0, 3), slice(3, 8)):
        out = policy_loss(x[sl], old[sl], adv[sl], mask[sl], algo, ref_logp=None, max_tokens=32,
                          group_tokens=group_tokens[sl], **counts)
        assert out.loss.dtype == torch.float32 and set(METRIC_KEYS) <= set(out.metrics)
        total = total + out.loss
    total.backward()
    xr = logp.double().requires_grad_()
    ref = ref_gspo_token_eq13(xr, old.double(), adv.double()[:, None].expand(8, 6), mask)
    ref.backward()
    assert total.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-8)
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=1e-4, atol=1e-8)
    # bfloat16 log-probs (a low-precision forward) are computed in float32
    bf = policy_loss(logp.bfloat16(), old.bfloat16(), adv, mask, algo)
    assert bf.loss.dtype == torch.float32 and math.isfinite(bf.loss.item())
