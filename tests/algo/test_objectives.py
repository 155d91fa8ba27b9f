"""Tests for grpo_lab.algo.objectives.

The references below are written straight from the papers' equations as explicit loops over
sequences i and tokens t in float64 (no vectorisation, no shared code with the package), and
compared with the package's float32 results and autograd gradients.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_lab.algo.algorithms import GRPO, Algorithm
from grpo_lab.algo.objectives import (
    KL_LOG_RATIO_CLAMP,
    LOG_RATIO_CLAMP,
    METRIC_KEYS,
    LossOutput,
    aggregate,
    kl_estimate,
    policy_loss,
    ppo_clip_loss,
    sequence_log_ratio,
    token_log_ratio,
)

HYP = settings(max_examples=60, deadline=None)
MODES = ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]


# ================================================================================================
# float64 references, one line of the paper at a time
# ================================================================================================
def _surrogate(r, a, eps_low, eps_high):
    """min[r A, clip(r, 1-eps_low, 1+eps_high) A] for one token (python branch, autograd-able)."""
    unclipped = r * a
    clipped = torch.clamp(r, 1 - eps_low, 1 + eps_high) * a
    return unclipped if unclipped <= clipped else clipped


def _k3_eq4(logp_t, ref_t):
    """DeepSeekMath Eq. 4: pi_ref/pi_theta - log(pi_ref/pi_theta) - 1."""
    q = torch.exp(ref_t - logp_t)
    return q - torch.log(q) - 1


def _kl_token(kind, logp_t, ref_t):
    d = logp_t - ref_t
    return {"k1": d, "k2": 0.5 * d * d, "k3": _k3_eq4(logp_t, ref_t)}[kind]


def ref_grpo_eq3(logp, old, ref, adv, mask, eps_low=0.2, eps_high=0.2, beta=0.04, kind="k3"):
    """-J_GRPO of DeepSeekMath (arXiv 2402.03300) Eq. 3:
    J = 1/G sum_i 1/|o_i| sum_t { min[r A, clip(r) A] - beta * D_KL },  D_KL from Eq. 4.
    Fully masked rows are not sequences (excluded from G)."""
    B, T = logp.shape
    J = torch.zeros((), dtype=torch.float64)
    G = 0
    for i in range(B):
        L = int(mask[i].sum())
        if L == 0:
            continue
        G += 1
        s = torch.zeros((), dtype=torch.float64)
        for t in range(T):
            if not mask[i, t]:
                continue
            r = torch.exp(logp[i, t] - old[i, t])
            a = adv[i] if adv.dim() == 1 else adv[i, t]
            s = s + _surrogate(r, a, eps_low, eps_high)
            if beta:
                s = s - beta * _kl_token(kind, logp[i, t], ref[i, t])
        J = J + s / L
    return -(J / max(G, 1))


def ref_dapo_eq8(logp, old, ref, adv, mask, eps_low=0.2, eps_high=0.28, beta=0.0, kind="k3"):
    """-J_DAPO, DAPO (arXiv 2503.14476) Eq. 8 / Eq. 12: 1/sum_i|o_i| sum_i sum_t min[...]
    (plus -beta*KL inside the token sum when beta > 0)."""
    B, T = logp.shape
    J = torch.zeros((), dtype=torch.float64)
    n = 0
    for i in range(B):
        for t in range(T):
            if not mask[i, t]:
                continue
            n += 1
            r = torch.exp(logp[i, t] - old[i, t])
            a = adv[i] if adv.dim() == 1 else adv[i, t]
            J = J + _surrogate(r, a, eps_low, eps_high)
            if beta:
                J = J - beta * _kl_token(kind, logp[i, t], ref[i, t])
    return -(J / max(n, 1))


def ref_drgrpo(logp, old, ref, adv, mask, max_tokens, eps_low=0.2, eps_high=0.2, beta=0.0, kind="k3"):
    """-J of Dr.GRPO (arXiv 2503.20783) §3.2: 1/G sum_i (sum_t min[...]) / MAX_TOKENS."""
    B, T = logp.shape
    J = torch.zeros((), dtype=torch.float64)
    G = 0
    for i in range(B):
        if int(mask[i].sum()) == 0:
            continue
        G += 1
        for t in range(T):
            if not mask[i, t]:
                continue
            r = torch.exp(logp[i, t] - old[i, t])
            a = adv[i] if adv.dim() == 1 else adv[i, t]
            J = J + _surrogate(r, a, eps_low, eps_high) / max_tokens
            if beta:
                J = J - beta * _kl_token(kind, logp[i, t], ref[i, t]) / max_tokens
    return -(J / max(G, 1))


def ref_gspo_eq5(logp, old, adv, mask, eps_low, eps_high):
    """-J_GSPO, GSPO (arXiv 2507.18071) Eq. 5 with s_i of Eq. 7:
    s_i = exp(1/|y_i| sum_t log(pi/pi_old)); J = 1/G sum_i min[s_i A_i, clip(s_i) A_i]."""
    B, T = logp.shape
    J = torch.zeros((), dtype=torch.float64)
    G = 0
    for i in range(B):
        L = int(mask[i].sum())
        if L == 0:
            continue
        G += 1
        log_s = sum(logp[i, t] - old[i, t] for t in range(T) if mask[i, t]) / L
        J = J + _surrogate(torch.exp(log_s), adv[i], eps_low, eps_high)
    return -(J / max(G, 1))


def make_batch(B=6, T=7, seed=0, spread=0.3, empty_row=True, dtype=torch.float32):
    """Ragged batch: random lengths, one fully masked row, ratios spread so that some clip.
    Log-probs are <= 0 (perturbations that would cross 0 are reflected back below it)."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = -(logp + spread * torch.randn(B, T, generator=g, dtype=torch.float64)).abs()
    ref = -(logp + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)).abs()
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    if empty_row:
        lengths[1] = 0
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[2] = 0.0  # a zero-advantage sequence
    return logp.to(dtype), old.to(dtype), ref.to(dtype), adv.to(dtype), mask


def loss_and_grad(fn, logp, *args, **kwargs):
    x = logp.detach().clone().requires_grad_()
    out = fn(x, *args, **kwargs)
    loss = out.loss if isinstance(out, LossOutput) else out
    (g,) = torch.autograd.grad(loss, x)
    return loss, g, out


# ================================================================================================
# policy_loss vs the paper references
# ================================================================================================
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_grpo_matches_deepseekmath_eq3(seed, kind):
    logp, old, ref, adv, mask = make_batch(seed=seed)
    algo = GRPO.replace(kl=kind)
    loss, g, out = loss_and_grad(policy_loss, logp, old, adv, mask, algo, ref_logp=ref)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    rl, rg = loss_and_grad(
        lambda x: ref_grpo_eq3(x, old.double(), ref.double(), adv.double(), mask, beta=0.04, kind=kind),
        logp.double(),
    )[:2]
    torch.testing.assert_close(loss.double(), rl, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(g.double(), rg, atol=1e-7, rtol=1e-5)
    assert (g[~mask] == 0).all()
    # and some tokens really were clipped, so the test exercises both branches
    assert out.metrics["clip_frac"] > 0


@pytest.mark.parametrize("seed", [0, 3])
def test_token_mean_matches_dapo_eq8(seed):
    logp, old, ref, adv, mask = make_batch(seed=seed)
    algo = Algorithm(aggregation="token_mean", eps_low=0.2, eps_high=0.28, kl=None, beta=0.0)
    loss, g, _ = loss_and_grad(policy_loss, logp, old, adv, mask, algo)
    rl, rg = loss_and_grad(lambda x: ref_dapo_eq8(x, old.double(), ref.double(), adv.double(), mask), logp.double())[
        :2
    ]
    torch.testing.assert_close(loss.double(), rl, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(g.double(), rg, atol=1e-7, rtol=1e-5)
    # with KL inside the token sum
    algo = algo.replace(kl="k3", beta=0.1)
    loss, g, _ = loss_and_grad(policy_loss, logp, old, adv, mask, algo, ref_logp=ref)
    rl, rg = loss_and_grad(
        lambda x: ref_dapo_eq8(x, old.double(), ref.double(), adv.double(), mask, beta=0.1), logp.double()
    )[:2]
    torch.testing.assert_close(loss.double(), rl, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(g.double(), rg, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("from_algo", [True, False])
def test_sum_norm_matches_drgrpo(from_algo):
    logp, old, ref, adv, mask = make_batch(seed=4)
    algo = Algorithm(aggregation="seq_mean_token_sum_norm", advantage="group_mean", kl="k2", beta=0.05)
    kw = {}
    if from_algo:
        algo = algo.replace(max_tokens=16)
    else:
        kw["max_tokens"] = 16
    loss, g, _ = loss_and_grad(policy_loss, logp, old, adv, mask, algo, ref_logp=ref, **kw)
    rl, rg = loss_and_grad(
        lambda x: ref_drgrpo(x, old.double(), ref.double(), adv.double(), mask, 16, beta=0.05, kind="k2"),
        logp.double(),
    )[:2]
    torch.testing.assert_close(loss.double(), rl, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(g.double(), rg, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("eps", [(0.2, 0.2), (3e-4, 4e-4)])
def test_sequence_ratio_matches_gspo_eq5_and_eq10(eps):
    logp, old, _, adv, mask = make_batch(seed=5, spread=0.05)
    algo = Algorithm(ratio_level="sequence", eps_low=eps[0], eps_high=eps[1], kl=None)
    loss, g, out = loss_and_grad(policy_loss, logp, old, adv, mask, algo)
    rl, rg = loss_and_grad(lambda x: ref_gspo_eq5(x, old.double(), adv.double(), mask, *eps), logp.double())[:2]
    torch.testing.assert_close(loss.double(), rl, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(g.double(), rg, atol=1e-7, rtol=1e-5)
    # GSPO Eq. 10: for an unclipped sequence, every token gets -s_i A_i / (G |y_i|)
    L = mask.sum(1)
    G = int((L > 0).sum())
    s = torch.exp(((logp - old).double() * mask).sum(1) / L.clamp(min=1))
    for i in range(logp.shape[0]):
        if L[i] == 0:
            continue
        clipped = (adv[i] > 0 and s[i] > 1 + eps[1]) or (adv[i] < 0 and s[i] < 1 - eps[0])
        expected = 0.0 if clipped else float(-s[i] * adv[i] / (G * L[i]))
        torch.testing.assert_close(g[i, mask[i]].double(), torch.full((int(L[i]),), expected, dtype=torch.float64))


# ================================================================================================
# hand-computed golden cases
# ================================================================================================
def test_golden_two_tokens_positive_advantage():
    # one sequence, two tokens, A = +1, eps = 0.2, no KL
    #  token 0: r = 1.5 -> min(1.5*1, clip(1.5)=1.2 * 1) = 1.2  (clipped high: no gradient)
    #  token 1: r = 0.5 -> min(0.5, 0.8) = 0.5                 (unclipped: d/dlogp = r = 0.5)
    #  J = (1.2 + 0.5)/2 = 0.85 -> loss = -0.85
    #  grad of loss: token 0: 0; token 1: -(A r)/|o| = -0.5/2 = -0.25
    #  (pi_old = 1/2 and pi = r/2, so that both are probabilities)
    logp = torch.log(torch.tensor([[0.75, 0.25]]))
    old = torch.log(torch.full((1, 2), 0.5))
    mask = torch.ones(1, 2)
    algo = GRPO.replace(kl=None)
    loss, g, out = loss_and_grad(policy_loss, logp, old, torch.tensor([1.0]), mask, algo)
    assert loss.item() == pytest.approx(-0.85, abs=1e-6)
    torch.testing.assert_close(g, torch.tensor([[0.0, -0.25]]))
    m = out.metrics
    assert m["clip_frac_high"] == 0.5 and m["clip_frac_low"] == 0.0 and m["clip_frac"] == 0.5
    assert m["grad_token_frac"] == 0.5
    assert m["ratio_mean"] == pytest.approx(1.0) and m["ratio_min"] == pytest.approx(0.5)
    assert m["ratio_max"] == pytest.approx(1.5) and m["ratio_q50"] == pytest.approx(1.0)
    assert m["adv_abs_mean"] == 1.0 and m["pg_loss"] == pytest.approx(-0.85, abs=1e-6)


def test_golden_two_tokens_negative_advantage():
    # A = -1:
    #  token 0: r = 1.5 -> min(-1.5, -1.2) = -1.5   (unclipped: grad of loss = -A r/2 = +0.75)
    #  token 1: r = 0.5 -> min(-0.5, -0.8) = -0.8   (clipped low: no gradient)
    #  J = (-1.5 - 0.8)/2 = -1.15 -> loss = 1.15
    logp = torch.log(torch.tensor([[0.75, 0.25]]))  # pi_old = 1/2: ratios 1.5 and 0.5
    old = torch.log(torch.full((1, 2), 0.5))
    loss, g, out = loss_and_grad(policy_loss, logp, old, torch.tensor([-1.0]), torch.ones(1, 2), GRPO.replace(kl=None))
    assert loss.item() == pytest.approx(1.15, abs=1e-6)
    torch.testing.assert_close(g, torch.tensor([[0.75, 0.0]]))
    assert out.metrics["clip_frac_low"] == 0.5 and out.metrics["clip_frac_high"] == 0.0


def test_golden_k3_and_kl_in_loss():
    # pi = 2 pi_ref  (D = log 2): k3 = 1/2 - log(1/2) - 1 = log 2 - 1/2 = 0.1931472
    # pi = pi_ref / 2 (D = -log 2): k3 = 2 - log 2 - 1 = 0.3068528
    d = torch.tensor([[math.log(2), -math.log(2)]])
    k3 = kl_estimate(d, torch.zeros(1, 2), "k3")
    torch.testing.assert_close(k3, torch.tensor([[math.log(2) - 0.5, 1 - math.log(2)]]))
    torch.testing.assert_close(kl_estimate(d, torch.zeros(1, 2), "k1"), d)
    torch.testing.assert_close(kl_estimate(d, torch.zeros(1, 2), "k2"), 0.5 * d * d)
    # in the loss: A = 0 and r = 1, so loss = beta * mean_t k3 = 0.04 * (0.1931472 + 0.3068528)/2 = 0.01
    # (log-probs shifted by log 1/8, which leaves D unchanged, so that they are <= 0)
    s = math.log(1 / 8)
    out = policy_loss(d + s, d + s, torch.zeros(1), torch.ones(1, 2), GRPO, ref_logp=torch.full((1, 2), s))
    assert out.loss.item() == pytest.approx(0.04 * 0.5 / 2, abs=1e-7)
    assert out.metrics["kl"] == pytest.approx(0.25, abs=1e-6)
    assert out.metrics["pg_loss"] == 0.0 and out.metrics["grad_token_frac"] == 0.0


def test_sequence_log_ratio_golden():
    # row 0: log-ratios [log 2, 0, (pad)] -> (log 2 + 0)/2 = 0.3465736; row 1 fully masked -> 0
    logp = torch.tensor([[math.log(2), 0.0, 5.0], [1.0, 2.0, 3.0]])
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    torch.testing.assert_close(sequence_log_ratio(logp, old, mask), torch.tensor([math.log(2) / 2, 0.0]))


def test_aggregate_golden():
    # values [[1, 2, 3], [4, (pad), (pad)], [(pad) x3]]; lengths 3, 1, 0
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, float("nan")], [7.0, 8.0, 9.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    # seq_mean_token_mean: (mean(1,2,3)=2 + 4)/2 non-empty rows = 3
    assert aggregate(v, m, "seq_mean_token_mean").item() == pytest.approx(3.0)
    # token_mean: (1+2+3+4)/4 = 2.5 ; with num_tokens = 8 -> 10/8
    assert aggregate(v, m, "token_mean").item() == pytest.approx(2.5)
    assert aggregate(v, m, "token_mean", num_tokens=8).item() == pytest.approx(1.25)
    # sum_norm with max_tokens 5: (6/5 + 4/5)/2 = 1.0 ; with num_sequences = 4 -> 0.5
    assert aggregate(v, m, "seq_mean_token_sum_norm", max_tokens=5).item() == pytest.approx(1.0)
    assert aggregate(v, m, "seq_mean_token_sum_norm", max_tokens=5, num_sequences=4).item() == pytest.approx(0.5)
    assert aggregate(v, m, "seq_mean_token_mean", num_sequences=torch.tensor(3)).item() == pytest.approx(2.0)


# ================================================================================================
# clipping: which tokens get a gradient (autograd vs the PPO gradient formula)
# ================================================================================================
def test_clipping_gradient_cases():
    # one sequence of 6 tokens (N = 6 for seq_mean_token_mean), eps_low = 0.2, eps_high = 0.28
    r = torch.tensor([[1.5, 0.5, 0.5, 1.5, 1.1, 0.9]])
    A = torch.tensor([[1.0, -1.0, 2.0, -2.0, 1.0, -1.0]])
    # token 0: A>0, r > 1.28 -> clipped high, grad 0
    # token 1: A<0, r < 0.8  -> clipped low,  grad 0
    # token 2: A>0, r < 0.8  -> min picks r A (unclipped), grad = -A r / N = -2*0.5/6
    # token 3: A<0, r > 1.28 -> min picks r A (unclipped), grad = +2*1.5/6
    # tokens 4, 5: inside [0.8, 1.28] -> grad = -A r / N
    algo = Algorithm(eps_low=0.2, eps_high=0.28, kl=None)
    p_old = torch.full((1, 6), 0.5)  # pi_old = 1/2, pi = r/2
    loss, g, out = loss_and_grad(policy_loss, torch.log(r * p_old), torch.log(p_old), A, torch.ones(1, 6), algo)
    expected = -(A * r) / 6
    expected[0, 0] = 0.0
    expected[0, 1] = 0.0
    torch.testing.assert_close(g, expected)
    assert out.metrics["clip_frac_high"] == pytest.approx(1 / 6)
    assert out.metrics["clip_frac_low"] == pytest.approx(1 / 6)
    assert out.metrics["grad_token_frac"] == pytest.approx(4 / 6)
    # ppo_clip_loss alone: per-token values
    per_tok = ppo_clip_loss(torch.log(r), A, eps_low=0.2, eps_high=0.28)
    torch.testing.assert_close(per_tok, -torch.minimum(r * A, r.clamp(0.8, 1.28) * A))


def test_on_policy_ratio_is_one_and_gradient_is_reinforce():
    # old = logp.detach(): r = 1, no clipping, grad = -A / |o_i| / G (REINFORCE with baseline)
    logp, _, _, adv, mask = make_batch(seed=7)
    algo = GRPO.replace(kl=None)
    loss, g, out = loss_and_grad(lambda x: policy_loss(x, x.detach(), adv, mask, algo), logp)
    L = mask.sum(1, keepdim=True).clamp(min=1)
    G = int((mask.sum(1) > 0).sum())
    torch.testing.assert_close(g, torch.where(mask, -adv.unsqueeze(1) / L / G, torch.zeros(())))
    assert out.metrics["clip_frac"] == 0.0 and out.metrics["ratio_max"] == 1.0


# ================================================================================================
# invariances
# ================================================================================================
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_micro_batches_sum_to_full_batch(mode, ratio_level):
    logp, old, ref, adv, mask = make_batch(B=8, T=6, seed=8)
    algo = Algorithm(aggregation=mode, max_tokens=10, ratio_level=ratio_level, kl="k3", beta=0.1)
    n_tok = int(mask.sum())
    n_seq = int((mask.sum(1) > 0).sum())
    x = logp.clone().requires_grad_()
    full = policy_loss(x, old, adv, mask, algo, ref_logp=ref)
    (g_full,) = torch.autograd.grad(full.loss, x)

    x2 = logp.clone().requires_grad_()
    total = 0
    for sl in (slice(0, 3), slice(3, 4), slice(4, 8)):  # uneven split incl. the empty row 1
        part = policy_loss(
            x2[sl], old[sl], adv[sl], mask[sl], algo, ref_logp=ref[sl], num_tokens=n_tok, num_sequences=n_seq
        )
        total = total + part.loss
    (g_micro,) = torch.autograd.grad(total, x2)
    torch.testing.assert_close(total, full.loss, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(g_micro, g_full, atol=1e-7, rtol=1e-5)

    # without the global counts the micro-batch sum is NOT the full-batch loss (the test can fail)
    local = sum(
        policy_loss(logp[sl], old[sl], adv[sl], mask[sl], algo, ref_logp=ref[sl]).loss
        for sl in (slice(0, 3), slice(3, 4), slice(4, 8))
    )
    assert abs(local.item() - full.loss.item()) > 1e-3


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_micro_batch_invariance(mode):
    g = torch.Generator().manual_seed(9)
    v = torch.randn(7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    m = torch.rand(7, 5, generator=g) > 0.4
    m[3] = False
    n_tok, n_seq = int(m.sum()), int((m.sum(1) > 0).sum())
    full = aggregate(v, m, mode, max_tokens=5)
    parts = sum(
        aggregate(v[a:b], m[a:b], mode, max_tokens=5, num_tokens=n_tok, num_sequences=n_seq)
        for a, b in ((0, 2), (2, 3), (3, 7))
    )
    torch.testing.assert_close(parts, full, atol=1e-12, rtol=1e-12)
    (g1,) = torch.autograd.grad(full, v)
    (g2,) = torch.autograd.grad(parts, v)
    torch.testing.assert_close(g1, g2, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_permuting_sequences_leaves_loss_unchanged(mode):
    logp, old, ref, adv, mask = make_batch(B=8, seed=10)
    algo = Algorithm(aggregation=mode, max_tokens=10)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    a = policy_loss(logp, old, adv, mask, algo, ref_logp=ref)
    b = policy_loss(logp[perm], old[perm], adv[perm], mask[perm], algo, ref_logp=ref[perm])
    torch.testing.assert_close(a.loss, b.loss, atol=1e-6, rtol=1e-6)
    for k in ("clip_frac", "ratio_q50", "kl", "grad_token_frac"):
        assert a.metrics[k] == pytest.approx(b.metrics[k], abs=1e-6)


def test_per_sequence_and_per_token_advantages_agree():
    logp, old, ref, adv, mask = make_batch(seed=11)
    a = policy_loss(logp, old, adv, mask, GRPO, ref_logp=ref)
    b = policy_loss(logp, old, adv.unsqueeze(1).expand_as(logp).clone(), mask, GRPO, ref_logp=ref)
    torch.testing.assert_close(a.loss, b.loss)
    assert a.metrics == b.metrics


# ================================================================================================
# KL estimators: exact enumeration on a small categorical distribution
# ================================================================================================
def _two_dists(V=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(V, generator=g, dtype=torch.float64)
    logp_ref = torch.log_softmax(torch.randn(V, generator=g, dtype=torch.float64), 0)
    logp_old = torch.log_softmax(torch.randn(V, generator=g, dtype=torch.float64), 0)
    return theta, logp_ref, logp_old


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_estimators_exact_expectations(seed):
    theta, lref, _ = _two_dists(seed=seed)
    lp = torch.log_softmax(theta, 0)
    p = lp.exp()
    kl_true = float((p * (lp - lref)).sum())  # KL(pi || pi_ref)
    e = {k: float((p * kl_estimate(lp[None], lref[None], k)[0]).sum()) for k in ("k1", "k2", "k3")}
    assert e["k1"] == pytest.approx(kl_true, abs=1e-12)  # unbiased
    assert e["k3"] == pytest.approx(kl_true, abs=1e-12)  # unbiased (Schulman 2020)
    assert abs(e["k2"] - kl_true) > 1e-4  # biased
    assert kl_estimate(lp[None], lref[None], "k3").dtype == torch.float64


@pytest.mark.parametrize("seed", [0, 1])
def test_v32_importance_corrected_k3_value_and_gradient(seed):
    """DeepSeek-V3.2 Eq. 7: E_{x~pi_old}[(pi/pi_old) k3] = KL(pi||pi_ref) and its gradient is the
    exact gradient of KL(pi||pi_ref); plain k3's on-policy gradient is that of KL(pi_ref||pi)."""
    theta, lref, lold = _two_dists(seed=seed)
    th = theta.clone().requires_grad_()
    lp = torch.log_softmax(th, 0)
    kl_true = (lp.exp() * (lp - lref)).sum()
    (g_true,) = torch.autograd.grad(kl_true, th, retain_graph=True)
    p_old = lold.exp()
    est = (p_old * kl_estimate(lp[None], lref[None], "k3", old_logp=lold[None])[0]).sum()
    assert est.item() == pytest.approx(kl_true.item(), abs=1e-12)
    (g_est,) = torch.autograd.grad(est, th, retain_graph=True)
    torch.testing.assert_close(g_est, g_true, atol=1e-12, rtol=1e-10)

    # plain k3 as a loss, samples from the current policy (weights held fixed = sampling):
    p_fixed = lp.detach().exp()
    plain = (p_fixed * kl_estimate(lp[None], lref[None], "k3")[0]).sum()
    (g_plain,) = torch.autograd.grad(plain, th, retain_graph=True)
    forward_kl = (lref.exp() * (lref - lp)).sum()  # KL(pi_ref || pi)
    (g_fwd,) = torch.autograd.grad(forward_kl, th)
    torch.testing.assert_close(g_plain, g_fwd, atol=1e-12, rtol=1e-10)
    assert (g_plain - g_true).abs().max() > 1e-3


def test_kl_old_logp_gradient_formula():
    # d/dlogp [r k3] = r * D   (r = pi/pi_old, D = logp - ref_logp): the score-function gradient
    # of the reverse KL that DeepSeek-V3.2 Eq. 7 is written for
    logp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5]], dtype=torch.float64)
    old = torch.tensor([[-1.2, -2.5, -0.1]], dtype=torch.float64)
    k = kl_estimate(logp, ref, "k3", old_logp=old)
    (g,) = torch.autograd.grad(k.sum(), logp)
    r = torch.exp(logp.detach() - old)
    torch.testing.assert_close(g, r * (logp.detach() - ref))


@pytest.mark.parametrize("delta", [-1e4, -200.0, -25.0, -20.0, -1e-3, 0.0, 1e-3, 200.0, 1e4])
def test_kl_extreme_values_finite(delta):
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        lp = torch.tensor([[delta]], dtype=dtype, requires_grad=True)
        ref = torch.zeros(1, 1, dtype=dtype)
        for kind in ("k1", "k2", "k3"):
            k = kl_estimate(lp, ref, kind)
            (g,) = torch.autograd.grad(k.sum(), lp)
            assert torch.isfinite(k).all() and torch.isfinite(g).all(), (kind, dtype)
            if kind != "k1":
                assert (k >= 0).all()
        k = kl_estimate(lp, ref, "k3", old_logp=torch.zeros(1, 1, dtype=dtype))
        (g,) = torch.autograd.grad(k.sum(), lp)
        assert torch.isfinite(k).all() and torch.isfinite(g).all() and (k >= 0).all()


def test_k3_tangent_continuation_below_clamp():
    c = KL_LOG_RATIO_CLAMP
    lp = torch.tensor([[-c - 5.0, -c]], dtype=torch.float64, requires_grad=True)
    k = kl_estimate(lp, torch.zeros(1, 2, dtype=torch.float64), "k3")
    (g,) = torch.autograd.grad(k.sum(), lp)
    k3_c = math.exp(c) - c - 1
    slope = 1 - math.exp(c)
    torch.testing.assert_close(k[0], torch.tensor([k3_c + slope * -5.0, k3_c], dtype=torch.float64))
    torch.testing.assert_close(g[0], torch.tensor([slope, slope], dtype=torch.float64))


@HYP
@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32))
def test_kl_property_finite_nonnegative(delta):
    lp = torch.tensor([[delta]], dtype=torch.float32, requires_grad=True)
    ref = torch.zeros(1, 1)
    for kind in ("k1", "k2", "k3"):
        k = kl_estimate(lp, ref, kind)
        (g,) = torch.autograd.grad(k.sum(), lp)
        assert torch.isfinite(k).all() and torch.isfinite(g).all()
        if kind in ("k2", "k3"):
            assert k.item() >= 0
    if abs(delta) <= KL_LOG_RATIO_CLAMP:
        exact = math.exp(-delta) + delta - 1  # float64 reference of Eq. 4
        assert kl_estimate(lp.detach(), ref, "k3").item() == pytest.approx(exact, rel=1e-4, abs=1e-9)


# ================================================================================================
# aggregate properties and edge cases
# ================================================================================================
@HYP
@given(
    st.floats(-1e3, 1e3, allow_nan=False),
    st.integers(1, 6),
    st.integers(1, 8),
    st.integers(0, 2**31 - 1),
)
def test_aggregate_of_constant_is_constant(c, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(B, T, generator=g) > 0.5
    m[0, 0] = True  # at least one real token
    v = torch.full((B, T), c, dtype=torch.float64)
    v[~m] = float("nan")  # padding content must not matter
    for mode in ("token_mean", "seq_mean_token_mean"):
        assert aggregate(v, m, mode).item() == pytest.approx(c, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_empty_mask_is_zero(mode):
    v = torch.randn(3, 4, requires_grad=True)
    out = aggregate(v, torch.zeros(3, 4), mode, max_tokens=4)
    assert out.item() == 0.0
    out.backward()
    assert (v.grad == 0).all()


def test_aggregate_errors():
    v, m = torch.randn(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(v, m, "mean")
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate(v, m, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate(v, m, "seq_mean_token_sum_norm", max_tokens=0)
    with pytest.raises(ValueError, match="num_tokens"):
        aggregate(v, m, "token_mean", num_tokens=0)
    with pytest.raises(ValueError, match="num_sequences"):
        aggregate(v, m, "seq_mean_token_mean", num_sequences=-1)
    with pytest.raises(ValueError, match="shape mismatch"):
        aggregate(v, torch.ones(3, 2), "token_mean")
    with pytest.raises(ValueError, match="0 and 1"):
        aggregate(v, torch.full((2, 3), 0.5), "token_mean")


# ================================================================================================
# policy_loss edge cases
# ================================================================================================
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_fully_masked_batch(mode, ratio_level):
    logp, old, ref, adv, _ = make_batch(seed=12)
    algo = Algorithm(aggregation=mode, max_tokens=8, ratio_level=ratio_level)
    loss, g, out = loss_and_grad(policy_loss, logp, old, adv, torch.zeros_like(logp), algo, ref_logp=ref)
    assert loss.item() == 0.0 and (g == 0).all()
    assert set(out.metrics) == set(METRIC_KEYS)
    assert all(isinstance(v, float) and math.isfinite(v) for v in out.metrics.values())
    assert out.metrics["clip_frac"] == 0.0 and out.metrics["num_tokens"] == 0.0
    assert out.metrics["ratio_mean"] == 1.0


def test_fully_masked_row_contributes_nothing():
    logp, old, ref, adv, mask = make_batch(seed=13)
    assert mask[1].sum() == 0
    a = policy_loss(logp, old, adv, mask, GRPO, ref_logp=ref)
    keep = torch.tensor([i for i in range(logp.shape[0]) if i != 1])
    b = policy_loss(logp[keep], old[keep], adv[keep], mask[keep], GRPO, ref_logp=ref[keep])
    torch.testing.assert_close(a.loss, b.loss)


def test_garbage_in_padding_is_ignored():
    logp, old, ref, adv, mask = make_batch(seed=14)
    dirty = [t.clone() for t in (logp, old, ref)]
    dirty[0][~mask] = float("nan")
    dirty[1][~mask] = float("inf")
    dirty[2][~mask] = -float("inf")
    clean_loss, clean_g, _ = loss_and_grad(policy_loss, logp, old, adv, mask, GRPO, ref_logp=ref)
    loss, g, out = loss_and_grad(policy_loss, dirty[0], dirty[1], adv, mask, GRPO, ref_logp=dirty[2])
    torch.testing.assert_close(loss, clean_loss)
    torch.testing.assert_close(g, clean_g)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_extreme_logprobs_are_finite(ratio_level):
    # log-probs of +-1e4 scale: ratios exp(+-1e4) must not overflow, k3 must not overflow
    logp = torch.tensor([[-1e4, -1.0, -5.0, -1e4], [-0.1, -1e4, -3.0, -2.0]])
    old = torch.tensor([[-1.0, -1e4, -5.0, -1e4], [-1e4, -0.2, -3.0, -1.0]])
    ref = torch.tensor([[-1.0, -1.0, -1e4, -2.0], [-1e4, -0.1, -1.0, -2.0]])
    mask = torch.ones(2, 4)
    for adv in (torch.tensor([1.0, -1.0]), torch.tensor([-2.0, 3.0])):
        for kind in ("k1", "k2", "k3"):
            algo = GRPO.replace(kl=kind, ratio_level=ratio_level)
            loss, g, out = loss_and_grad(policy_loss, logp, old, adv, mask, algo, ref_logp=ref)
            assert torch.isfinite(loss) and torch.isfinite(g).all(), (kind, adv)
            assert all(math.isfinite(v) for v in out.metrics.values())
            assert out.metrics["ratio_max"] <= math.exp(LOG_RATIO_CLAMP) * 1.0001


def test_bfloat16_inputs():
    logp, old, ref, adv, mask = make_batch(seed=15)
    bf = [t.bfloat16() for t in (logp, old, ref, adv)]
    x = bf[0].clone().requires_grad_()
    out = policy_loss(x, bf[1], bf[3], mask, GRPO, ref_logp=bf[2])
    assert out.loss.dtype == torch.float32
    out.loss.backward()
    assert x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad.float()).all()
    # identical to the float32 path evaluated on the same bf16-rounded numbers
    same = policy_loss(*[t.float() for t in (bf[0], bf[1], bf[3])], mask, GRPO, ref_logp=bf[2].float())
    torch.testing.assert_close(out.loss, same.loss, atol=1e-7, rtol=1e-6)
    # and close to the full-precision float32 loss (bf16 has ~3 significant digits)
    full = policy_loss(logp, old, adv, mask, GRPO, ref_logp=ref)
    assert out.loss.item() == pytest.approx(full.loss.item(), abs=5e-2)


def test_float64_inputs_stay_float64():
    logp, old, ref, adv, mask = make_batch(seed=16, dtype=torch.float64)
    out = policy_loss(logp, old, adv, mask, GRPO, ref_logp=ref)
    assert out.loss.dtype == torch.float64
    torch.testing.assert_close(out.loss, ref_grpo_eq3(logp, old, ref, adv, mask), atol=1e-12, rtol=1e-12)


def test_old_and_ref_logp_are_constants():
    logp, old, ref, adv, mask = make_batch(seed=17)
    old = old.clone().requires_grad_()
    ref = ref.clone().requires_grad_()
    x = logp.clone().requires_grad_()
    out = policy_loss(x, old, adv, mask, GRPO, ref_logp=ref)
    out.loss.backward()
    assert old.grad is None and ref.grad is None and x.grad is not None
    assert token_log_ratio(x, old).grad_fn is not None
    (g,) = torch.autograd.grad(token_log_ratio(x, old).sum(), x)
    assert (g == 1).all()


def test_kl_metric_without_kl_term():
    logp, old, ref, adv, mask = make_batch(seed=18)
    algo = GRPO.replace(beta=0.0)
    out = policy_loss(logp, old, adv, mask, algo, ref_logp=ref)
    assert out.metrics["kl"] > 0  # computed for monitoring
    assert out.loss.item() == pytest.approx(out.metrics["pg_loss"], abs=1e-7)
    no_ref = policy_loss(logp, old, adv, mask, algo)
    assert no_ref.metrics["kl"] == 0.0
    torch.testing.assert_close(no_ref.loss, out.loss)
    k3 = kl_estimate(logp, ref, "k3")
    assert out.metrics["kl"] == pytest.approx(float(k3[mask].mean()), rel=1e-5)


def test_metrics_match_direct_computation():
    logp, old, ref, adv, mask = make_batch(B=10, T=9, seed=19, spread=0.4)
    out = policy_loss(logp, old, adv, mask, GRPO, ref_logp=ref)
    m = out.metrics
    assert set(m) == set(METRIC_KEYS)
    r = torch.exp(logp - old)[mask]
    a = adv.unsqueeze(1).expand_as(logp)[mask]
    assert m["ratio_mean"] == pytest.approx(float(r.mean()), rel=1e-6)
    assert m["ratio_min"] == pytest.approx(float(r.min()), rel=1e-6)
    assert m["ratio_max"] == pytest.approx(float(r.max()), rel=1e-6)
    for q in (5, 50, 95):
        assert m[f"ratio_q{q:02d}"] == pytest.approx(float(torch.quantile(r, q / 100)), rel=1e-6)
    low = ((a < 0) & (r < 0.8)).float().mean()
    high = ((a > 0) & (r > 1.2)).float().mean()
    assert m["clip_frac_low"] == pytest.approx(float(low)) and m["clip_frac_high"] == pytest.approx(float(high))
    assert m["clip_frac"] == pytest.approx(float(low + high))
    assert m["grad_token_frac"] == pytest.approx(float(((a != 0) & ~((a < 0) & (r < 0.8)) & ~((a > 0) & (r > 1.2))).float().mean()))
    assert m["adv_abs_mean"] == pytest.approx(float(a.abs().mean()), rel=1e-6)
    assert m["num_tokens"] == float(mask.sum()) and m["num_sequences"] == float((mask.sum(1) > 0).sum())
    assert m["loss"] == pytest.approx(out.loss.item())


def test_policy_loss_errors():
    logp, old, ref, adv, mask = make_batch(seed=20)
    with pytest.raises(ValueError, match="ref_logp is required"):
        policy_loss(logp, old, adv, mask, GRPO)
    policy_loss(logp, old, adv, mask, GRPO.replace(kl=None))  # fine without ref
    with pytest.raises(ValueError, match="Algorithm"):
        policy_loss(logp, old, adv, mask, "GRPO")
    with pytest.raises(ValueError, match="shape mismatch"):
        policy_loss(logp, old[:, :-1], adv, mask, GRPO, ref_logp=ref)
    with pytest.raises(ValueError, match="shape mismatch"):
        policy_loss(logp, old, adv, mask[:-1], GRPO, ref_logp=ref)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, old, adv[:-1], mask, GRPO, ref_logp=ref)
    with pytest.raises(ValueError, match="shape mismatch"):
        policy_loss(logp, old, adv, mask, GRPO, ref_logp=ref[:, :2])
    with pytest.raises(ValueError, match="0 and 1"):
        policy_loss(logp, old, adv, mask.float() * 0.5, GRPO, ref_logp=ref)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        policy_loss(logp[0], old[0], adv, mask[0], GRPO, ref_logp=ref[0])
    with pytest.raises(ValueError, match="max_tokens"):
        policy_loss(logp, old, adv, mask, Algorithm(aggregation="seq_mean_token_sum_norm"), ref_logp=ref)
    bad = logp.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="logp"):
        policy_loss(bad, old, adv, mask, GRPO, ref_logp=ref)
    bad_adv = adv.clone()
    bad_adv[0] = float("inf")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, old, bad_adv, mask, GRPO, ref_logp=ref)
    bad_ref = ref.clone()
    bad_ref[0, 0] = float("nan")
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, old, adv, mask, GRPO, ref_logp=bad_ref)
    with pytest.raises(ValueError, match="unknown KL"):
        kl_estimate(logp, ref, "k4")
    with pytest.raises(ValueError, match="eps_low"):
        ppo_clip_loss(logp - old, adv, eps_low=-0.1)


# ================================================================================================
# registries and metrics that name their reduction
# ================================================================================================
def test_registries_hold_the_package_functions():
    from grpo_lab.algo import objectives as obj

    logp, old, _, adv, mask = make_batch(seed=24)
    lp, ol = logp.masked_fill(~mask, 0.0), old.masked_fill(~mask, 0.0)
    torch.testing.assert_close(obj.RATIOS["token"](lp, ol, mask), token_log_ratio(lp, ol), rtol=0, atol=0)
    seq = obj.RATIOS["sequence"](lp, ol, mask)
    assert seq.shape == lp.shape and torch.equal(seq[:, 0], sequence_log_ratio(logp, old, mask))
    d = torch.linspace(-25, 3, 12).reshape(3, 4)
    for kind in ("k1", "k2", "k3"):
        assert torch.equal(obj.KL_ESTIMATORS[kind](d), kl_estimate(d, torch.zeros(3, 4), kind))
    v = torch.randn(3, 4)
    m = torch.rand(3, 4, generator=torch.Generator().manual_seed(0)) > 0.3
    for mode in MODES:
        norms = obj.Normalisers(max_tokens=7)
        assert torch.equal(obj.AGGREGATIONS[mode](v.masked_fill(~m, 0.0), m, norms),
                           aggregate(v, m, mode, max_tokens=7))
    ctx = obj.LossContext(lp, ol, lp - ol, adv[:, None].expand_as(lp), mask)
    loss, ind = obj.SURROGATES["ppo"](ctx, **GRPO.values_for(obj.SURROGATES["ppo"]))
    assert torch.equal(loss, ppo_clip_loss(lp - ol, adv))
    assert set(ind) == {"clip_low", "clip_high", "grad"} and all(t.dtype == torch.bool for t in ind.values())


def test_metrics_carry_their_reduction():
    from grpo_lab.algo.metrics import Metric

    logp, old, ref, adv, mask = make_batch(seed=25)
    m = policy_loss(logp, old, adv, mask, GRPO, ref_logp=ref).metrics
    assert list(m) == list(METRIC_KEYS) and all(isinstance(v, Metric) for v in m.values())
    n_tok, n_seq = float(mask.sum()), float((mask.sum(1) > 0).sum())
    how = {k: (v.reduce, v.weight) for k, v in m.items()}
    for k in ("loss", "pg_loss", "num_tokens", "num_sequences"):
        assert how[k][0] == "sum"
    assert how["ratio_min"] == ("min", n_tok) and how["ratio_max"] == ("max", n_tok)
    assert how["kl"] == ("mean", n_tok) and how["offpolicy_masked_frac"] == ("mean", n_seq)
    for k in ("clip_frac", "clip_frac_low", "ratio_mean", "ratio_q50", "grad_token_frac", "adv_abs_mean"):
        assert how[k] == ("mean", n_tok)
    # the KL metric of a loss without ref_logp was not measured: weight 0
    m0 = policy_loss(logp, old, adv, mask, GRPO.replace(kl=None)).metrics
    assert m0["kl"] == 0.0 and m0["kl"].weight == 0.0


def test_micro_batch_metrics_reduce_to_the_full_batch():
    from grpo_lab.algo.metrics import reduce_micro_batches

    logp, old, ref, adv, mask = make_batch(B=9, T=6, seed=26, spread=0.5)
    algo = Algorithm(aggregation="token_mean", eps_high=0.28, kl="k3", beta=0.1)
    n_tok, n_seq = int(mask.sum()), int((mask.sum(1) > 0).sum())
    full = policy_loss(logp, old, adv, mask, algo, ref_logp=ref).metrics
    parts = [policy_loss(logp[sl], old[sl], adv[sl], mask[sl], algo, ref_logp=ref[sl], num_tokens=n_tok,
                         num_sequences=n_seq).metrics for sl in (slice(0, 2), slice(1, 1), slice(2, 9))]
    red = reduce_micro_batches(parts)
    for k in ("loss", "pg_loss", "kl", "clip_frac", "clip_frac_low", "clip_frac_high", "ratio_mean",
              "grad_token_frac", "adv_abs_mean", "num_tokens", "num_sequences", "ratio_min", "ratio_max"):
        assert red[k] == pytest.approx(full[k], rel=1e-5, abs=1e-6), k


def test_custom_surrogate_contract(monkeypatch):
    from grpo_lab.algo import objectives as obj

    def plain_pg(ctx):  # REINFORCE-style, no clip
        ratio = torch.exp(ctx.log_ratio)
        grad = ctx.advantages != 0
        return -ratio * ctx.advantages, {"clip_low": torch.zeros_like(grad), "clip_high": torch.zeros_like(grad),
                                     "grad": grad, "ratio_above_1": (ratio > 1).float()}

    monkeypatch.setitem(obj.SURROGATES, "plain", plain_pg)
    logp, old, _, adv, mask = make_batch(seed=27)
    out = policy_loss(logp, old, adv, mask, Algorithm(surrogate="plain", kl=None))
    r = torch.exp(logp - old)[mask]
    assert out.metrics["ratio_above_1"] == pytest.approx(float((r > 1).float().mean()))
    assert out.metrics["clip_frac"] == 0.0 and list(out.metrics)[: len(METRIC_KEYS)] == list(METRIC_KEYS)
    monkeypatch.setitem(obj.SURROGATES, "bare", lambda ctx: (-ctx.log_ratio * ctx.advantages, {}))
    with pytest.raises(ValueError, match=r"surrogate 'bare' must return the per-token indicator 'grad'"):
        policy_loss(logp, old, adv, mask, Algorithm(surrogate="bare", kl=None))


# ================================================================================================
# bad input gets a clear error naming the problem (issue 8, item 7)
# ================================================================================================
@pytest.mark.parametrize("name", ["logp", "old_logp", "ref_logp"])
def test_policy_loss_rejects_positive_logprobs(name):
    logp, old, ref, adv, mask = make_batch(seed=22)
    t = {"logp": logp, "old_logp": old, "ref_logp": ref}
    t[name] = t[name].clone()
    t[name][0, 1] = 0.25  # a log-ratio or a logit, not a log-prob
    assert mask[0, 1]
    with pytest.raises(ValueError, match=rf"{name}\[0, 1\] = 0.25 > 0"):
        policy_loss(t["logp"], t["old_logp"], adv, mask, GRPO, ref_logp=t["ref_logp"])


def test_policy_loss_accepts_zero_logprobs_and_ignores_padding():
    logp, old, ref, adv, mask = make_batch(seed=22)
    logp, old, ref = logp.clone(), old.clone(), ref.clone()
    logp[0, 0] = old[0, 0] = ref[0, 0] = 0.0  # probability 1: allowed
    logp[~mask] = old[~mask] = ref[~mask] = 5.0  # padding may hold anything
    out = policy_loss(logp, old, adv, mask, GRPO, ref_logp=ref)
    assert math.isfinite(out.loss.item())


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_rejects_global_counts_below_this_batch(mode):
    v = torch.randn(3, 4)
    m = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])  # 6 real tokens, 2 non-empty rows
    aggregate(v, m, mode, max_tokens=4, num_tokens=6, num_sequences=2)  # equal counts are fine
    with pytest.raises(ValueError, match=r"num_tokens=5 is smaller than the 6 real tokens"):
        aggregate(v, m, mode, max_tokens=4, num_tokens=5)
    with pytest.raises(ValueError, match=r"num_sequences=1 is smaller than the 2 non-empty rows"):
        aggregate(v, m, mode, max_tokens=4, num_sequences=1)


def test_policy_loss_rejects_global_counts_below_this_batch():
    logp, old, ref, adv, mask = make_batch(seed=23)
    n_tok, n_seq = int(mask.sum()), int((mask.sum(1) > 0).sum())
    policy_loss(logp, old, adv, mask, GRPO, ref_logp=ref, num_tokens=n_tok, num_sequences=n_seq)
    with pytest.raises(ValueError, match="num_tokens"):
        policy_loss(logp, old, adv, mask, GRPO, ref_logp=ref, num_tokens=n_tok - 1)
    with pytest.raises(ValueError, match="num_sequences"):
        policy_loss(logp, old, adv, mask, GRPO, ref_logp=ref, num_sequences=n_seq - 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    logp, old, ref, adv, mask = make_batch(seed=21)
    for algo in (GRPO, GRPO.replace(ratio_level="sequence", aggregation="token_mean")):
        a = loss_and_grad(policy_loss, logp, old, adv, mask, algo, ref_logp=ref)
        b = loss_and_grad(policy_loss, logp.cuda(), old.cuda(), adv.cuda(), mask.cuda(), algo, ref_logp=ref.cuda())
        torch.testing.assert_close(b[0].cpu(), a[0], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(b[1].cpu(), a[1], atol=1e-6, rtol=1e-5)
        for k in METRIC_KEYS:
            assert b[2].metrics[k] == pytest.approx(a[2].metrics[k], rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_kl_estimate_rejects_non_finite_inputs(bad):
    lp = torch.zeros(2, 3)
    ref = torch.zeros(2, 3)
    ref[1, 2] = bad
    with pytest.raises(ValueError, match="ref_logp"):
        kl_estimate(lp, ref, "k3")
    with pytest.raises(ValueError, match="logp"):
        kl_estimate(ref, lp, "k1")
