"""Tests for the value-model math of PPO / VAPO: GAE, outcome token rewards, VAPO's length-adaptive
lambda, explained variance, the (clipped) value loss and VAPO's positive-example NLL loss.

References: GAE (Schulman et al., arXiv 1506.02438) Eq. 16; VAPO (arXiv 2504.05118) Eqs. 5 and 9;
PPO (arXiv 1707.06347) Eq. 9. Goldens are worked out by hand in the comments next to them.
"""

import math

import pytest
import torch

from grpo_lab.algo.advantages import explained_variance, gae, length_adaptive_lam, outcome_token_rewards
from grpo_lab.algo.objectives import positive_nll_loss, value_loss

NAN, INF = float("nan"), float("inf")


# ------------------------------------------------------------------------------------------------
# a float64 reference written straight from GAE's Eq. 16 (not from the package's recursion)
# ------------------------------------------------------------------------------------------------
def gae_reference(rewards, values, mask, gamma, lams):
    """Naive O(T^2) GAE from Schulman et al. Eq. 16, one row at a time, in python floats.

    Row i's episode is its real positions t_1 < ... < t_n in order; V after the last one is 0.
    delta_k = r_{t_k} + gamma V_{t_{k+1}} - V_{t_k};  A_k = sum_{l >= 0} (gamma lam)^l delta_{k+l}
    (the infinite sum stops at the episode's end); returns_k = A_k + V_{t_k}.
    """
    B, T = mask.shape
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for i in range(B):
        pos = [t for t in range(T) if bool(mask[i, t])]
        n = len(pos)
        V = [float(values[i, t]) for t in pos] + [0.0]  # the value after the last real token is 0
        r = [float(rewards[i, t]) for t in pos]
        delta = [r[k] + gamma * V[k + 1] - V[k] for k in range(n)]
        for k in range(n):
            a = sum((gamma * lams[i]) ** l * delta[k + l] for l in range(n - k))
            adv[i][pos[k]] = a
            ret[i][pos[k]] = a + V[k]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def random_case(seed, *, holes):
    """Random [B, T] rewards / values / mask: right padding with a length per row (some rows empty,
    some full), and with ``holes`` also masked positions inside the response. Values at padding are
    garbage (large), rewards there are 0."""
    g = torch.Generator().manual_seed(seed)
    B, T = 7, 9
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0], lengths[1] = T, 0  # one full row, one empty row
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    if holes:
        mask &= torch.rand(B, T, generator=g) > 0.3
    rewards = torch.randn(B, T, generator=g) * mask
    values = torch.where(mask, torch.randn(B, T, generator=g), torch.full((B, T), 1e3))
    gamma = float(torch.rand((), generator=g)) * 0.5 + 0.5
    lam = float(torch.rand((), generator=g))
    return rewards, values, mask, gamma, lam


# ------------------------------------------------------------------------------------------------
# gae
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_eq16_reference_scalar_lam(seed, holes):
    rewards, values, mask, gamma, lam = random_case(seed, holes=holes)
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    ref_adv, ref_ret = gae_reference(rewards, values, mask, gamma, [lam] * mask.shape[0])
    assert adv.dtype == ret.dtype == torch.float32
    torch.testing.assert_close(adv.double(), ref_adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret.double(), ref_ret, atol=1e-5, rtol=1e-5)
    assert (adv[~mask] == 0).all() and (ret[~mask] == 0).all()


@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_eq16_reference_per_sequence_lam(seed, holes):
    rewards, values, mask, gamma, _ = random_case(100 + seed, holes=holes)
    lams = torch.rand(mask.shape[0], generator=torch.Generator().manual_seed(seed))
    lams[2], lams[3] = 0.0, 1.0  # the two ends of the range
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lams)
    ref_adv, ref_ret = gae_reference(rewards, values, mask, gamma, lams.tolist())
    torch.testing.assert_close(adv.double(), ref_adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret.double(), ref_ret, atol=1e-5, rtol=1e-5)


def test_gae_hand_worked_three_tokens():
    # rewards [0, 0, 1], V = [0.5, 0.6, 0.8], gamma = 0.9, lam = 0.5 (so gamma lam = 0.45); V after the end = 0
    #   delta_2 = 1 + 0.9 * 0   - 0.8 = 0.2
    #   delta_1 = 0 + 0.9 * 0.8 - 0.6 = 0.12
    #   delta_0 = 0 + 0.9 * 0.6 - 0.5 = 0.04
    #   A_2 = 0.2;  A_1 = 0.12 + 0.45 * 0.2 = 0.21;  A_0 = 0.04 + 0.45 * 0.21 = 0.1345
    #   returns = A + V = [0.6345, 0.81, 1.0]
    # A fourth, padded position holds garbage (V = 50) and must not be bootstrapped from.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.8, 50.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.1345, 0.21, 0.2, 0.0]]), atol=1e-7, rtol=0)
    torch.testing.assert_close(ret, torch.tensor([[0.6345, 0.81, 1.0, 0.0]]), atol=1e-7, rtol=0)


def test_gae_hand_worked_hole_is_jumped_over():
    # mask [1, 0, 1]: the episode is positions 0 and 2; V at the hole (99) is never used.
    # rewards [0, 0, 1], V = [0.5, 99, 0.8], gamma = 0.9, lam = 0.5:
    #   delta at 2 = 1 - 0.8 = 0.2;  delta at 0 = 0 + 0.9 * 0.8 - 0.5 = 0.22
    #   A = [0.22 + 0.45 * 0.2, 0, 0.2] = [0.31, 0, 0.2];  returns = [0.81, 0, 1.0]
    adv, ret = gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 99.0, 0.8]]),
                   torch.tensor([[True, False, True]]), gamma=0.9, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.31, 0.0, 0.2]]), atol=1e-7, rtol=0)
    torch.testing.assert_close(ret, torch.tensor([[0.81, 0.0, 1.0]]), atol=1e-7, rtol=0)


@pytest.mark.parametrize("garbage", [1e6, -1e6, NAN, INF, -INF])
@pytest.mark.parametrize("holes", [False, True])
def test_gae_never_bootstraps_from_padding(garbage, holes):
    rewards, values, mask, gamma, lam = random_case(7, holes=holes)
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    poisoned = torch.where(mask, values, torch.full_like(values, garbage))
    adv2, ret2 = gae(rewards, poisoned, mask, gamma=gamma, lam=lam)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    assert torch.isfinite(adv2).all() and torch.isfinite(ret2).all()


def test_gae_lam_zero_is_the_td_residual():
    rewards, values, mask, gamma, _ = random_case(11, holes=True)
    adv, _ = gae(rewards, values, mask, gamma=gamma, lam=0.0)
    for i in range(mask.shape[0]):  # delta_k = r_k + gamma V_{k+1} - V_k over the real positions
        pos = mask[i].nonzero().flatten().tolist()
        v_next = [float(values[i, p]) for p in pos[1:]] + [0.0]
        for k, p in enumerate(pos):
            delta = float(rewards[i, p]) + gamma * v_next[k] - float(values[i, p])
            assert float(adv[i, p]) == pytest.approx(delta, abs=1e-5)


def test_gae_lam_one_is_discounted_return_minus_value():
    rewards, values, mask, gamma, _ = random_case(12, holes=True)
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=1.0)
    for i in range(mask.shape[0]):  # A_k = sum_l gamma^l r_{k+l} - V_k: every V but V_k telescopes away
        pos = mask[i].nonzero().flatten().tolist()
        for k, p in enumerate(pos):
            mc = sum(gamma ** l * float(rewards[i, q]) for l, q in enumerate(pos[k:]))
            assert float(adv[i, p]) == pytest.approx(mc - float(values[i, p]), abs=1e-5)
            assert float(ret[i, p]) == pytest.approx(mc, abs=1e-5)


def test_gae_lam_one_outcome_reward_gives_r_minus_v_and_mc_returns_whatever_v():
    # gamma = 1, outcome reward R on the last token: A_t = R - V_t and returns_t = R at every real token
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    r = torch.tensor([2.0, -1.0, 5.0])
    token_r = outcome_token_rewards(r, mask)
    g = torch.Generator().manual_seed(3)
    v1, v2 = torch.randn(3, 5, generator=g), 10 * torch.randn(3, 5, generator=g)
    adv1, ret1 = gae(token_r, v1, mask, gamma=1.0, lam=1.0)
    _, ret2 = gae(token_r, v2, mask, gamma=1.0, lam=1.0)
    expected_ret = torch.where(mask, r.unsqueeze(1).expand(3, 5), torch.zeros(3, 5))
    torch.testing.assert_close(ret1, expected_ret, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret2, expected_ret, atol=1e-5, rtol=0)
    torch.testing.assert_close(adv1, torch.where(mask, expected_ret - v1, torch.zeros(3, 5)), atol=1e-6, rtol=0)


def test_gae_rejects_bad_input():
    r, v, m = torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="masked"):  # a reward at padding would be lost
        gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.zeros(1, 3), torch.tensor([[1, 1, 0]]))
    with pytest.raises(ValueError, match="masked"):
        gae(torch.tensor([[0.0, 0.0, NAN]]), torch.zeros(1, 3), torch.tensor([[1, 1, 0]]))
    with pytest.raises(ValueError, match="rewards must be finite"):
        gae(torch.tensor([[0.0, INF, 0.0]]), torch.zeros(1, 3), torch.ones(1, 3))
    with pytest.raises(ValueError, match="values must be finite"):
        gae(r, torch.tensor([[0.0, NAN, 0.0], [0.0, 0.0, 0.0]]), m)
    with pytest.raises(ValueError, match="shape mismatch"):
        gae(torch.zeros(2, 4), v, m)
    with pytest.raises(ValueError, match="mask"):
        gae(r, v, torch.ones(2, 4))
    with pytest.raises(ValueError, match="0 and 1"):
        gae(r, v, torch.full((2, 3), 2.0))
    for bad in (-0.1, 1.5, NAN, True, "1"):
        with pytest.raises(ValueError, match="gamma"):
            gae(r, v, m, gamma=bad)
        with pytest.raises(ValueError, match="lam"):
            gae(r, v, m, lam=bad)
    with pytest.raises(ValueError, match="lam"):
        gae(r, v, m, lam=torch.tensor([0.5, 1.2]))
    with pytest.raises(ValueError, match="lam"):
        gae(r, v, m, lam=torch.tensor([0.5, 0.5, 0.5]))


def test_gae_empty_shapes():
    adv, ret = gae(torch.zeros(0, 4), torch.zeros(0, 4), torch.zeros(0, 4))
    assert adv.shape == ret.shape == (0, 4)
    adv, ret = gae(torch.zeros(3, 0), torch.zeros(3, 0), torch.zeros(3, 0), lam=torch.zeros(3))
    assert adv.shape == ret.shape == (3, 0)


# ------------------------------------------------------------------------------------------------
# outcome_token_rewards
# ------------------------------------------------------------------------------------------------
def test_outcome_token_rewards_on_last_real_token():
    # row 0: right-padded, length 2 -> reward at t=1; row 1: full -> t=3; row 2: a hole, last real t=2;
    # row 3: empty -> nothing; row 4: a single real token at t=0
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]])
    out = outcome_token_rewards(torch.tensor([0.5, -1.0, 2.0, 7.0, 3.0]), mask)
    expected = torch.tensor([[0, 0.5, 0, 0], [0, 0, 0, -1.0], [0, 0, 2.0, 0], [0, 0, 0, 0], [3.0, 0, 0, 0]])
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    # the result is a valid reward for gae (nothing at padding) and bool / list inputs work the same way
    assert torch.equal(outcome_token_rewards([0.5, -1.0, 2.0, 7.0, 3.0], mask.bool()), out)
    gae(out, torch.zeros(5, 4), mask)


def test_outcome_token_rewards_rejects_bad_input():
    with pytest.raises(ValueError, match="finite"):
        outcome_token_rewards(torch.tensor([1.0, NAN]), torch.ones(2, 3))
    with pytest.raises(ValueError, match="shape mismatch"):
        outcome_token_rewards(torch.tensor([1.0, 0.0]), torch.ones(3, 3))
    with pytest.raises(ValueError, match="1-D"):
        outcome_token_rewards(torch.ones(2, 1), torch.ones(2, 3))
    with pytest.raises(ValueError, match="0 and 1"):
        outcome_token_rewards(torch.ones(2), torch.full((2, 3), 0.5))


# ------------------------------------------------------------------------------------------------
# length_adaptive_lam
# ------------------------------------------------------------------------------------------------
def test_length_adaptive_lam_by_hand():
    # alpha = 0.05: lam = 1 - 1/(0.05 l):  l=100 -> 1 - 1/5 = 0.8;  l=1000 -> 1 - 1/50 = 0.98;
    # l=40 -> 1 - 1/2 = 0.5;  l=21 -> 1 - 1/1.05 = 0.047619...;  l=20 -> 1 - 1/1 = 0;
    # l=10 -> 1 - 1/0.5 = -1, clamped to 0;  l=0 -> (formula: -inf) 0
    lam = length_adaptive_lam(torch.tensor([100, 1000, 40, 21, 20, 10, 0]))
    assert lam.dtype == torch.float32
    expected = torch.tensor([0.8, 0.98, 0.5, 1 - 1 / 1.05, 0.0, 0.0, 0.0])
    torch.testing.assert_close(lam, expected, atol=1e-7, rtol=0)
    # alpha = 0.5 (a horizon of half the response): l=10 -> 1 - 1/5 = 0.8; l=2 -> 0; l=1 -> clamped 0
    torch.testing.assert_close(length_adaptive_lam([10.0, 2.0, 1.0], alpha=0.5), torch.tensor([0.8, 0.0, 0.0]))


def test_length_adaptive_lam_sets_the_horizon_and_stays_below_one():
    lengths = torch.tensor([25.0, 60.0, 333.0, 4096.0])
    lam = length_adaptive_lam(lengths, alpha=0.05).double()
    # sum_t lam^t = 1 / (1 - lam) = alpha l  (VAPO Eq. 4-5)
    torch.testing.assert_close(1 / (1 - lam), 0.05 * lengths.double(), rtol=1e-4, atol=0)
    huge = length_adaptive_lam(torch.tensor([1e12, 1e30]))
    assert (huge < 1).all() and (huge > 0.9999).all()
    assert (length_adaptive_lam(torch.arange(0, 30)) >= 0).all()


def test_length_adaptive_lam_rejects_bad_input():
    for bad in (0, -0.05, NAN, INF, True, "0.05", torch.tensor([0.1, 0.2])):
        with pytest.raises(ValueError, match="alpha"):
            length_adaptive_lam([10.0], alpha=bad)
    for bad in ([-1.0], [NAN], [INF], [[1.0, 2.0]]):
        with pytest.raises(ValueError, match="lengths"):
            length_adaptive_lam(bad)


# ------------------------------------------------------------------------------------------------
# explained_variance
# ------------------------------------------------------------------------------------------------
def test_explained_variance_values():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    R = torch.tensor([[1.0, 2.0, NAN], [3.0, 0.0, 0.0]])  # real returns [1, 2, 3]; padding ignored
    assert explained_variance(R.clone(), R, mask) == 1.0  # perfect prediction
    assert explained_variance(torch.full((2, 3), 2.0), R, mask) == pytest.approx(0.0, abs=1e-12)  # the mean
    # V = [1, 2, 2]: residual [0, 0, 1], Var = 1/3 - 1/9 = 2/9; Var(R) = 2/3; EV = 1 - (2/9)/(2/3) = 2/3
    V = torch.tensor([[1.0, 2.0, 1e9], [2.0, INF, 0.0]])
    assert explained_variance(V, R, mask) == pytest.approx(2 / 3, abs=1e-12)
    # V = 2 R - mean: residual has the variance of R -> EV = 0; V = -R: residual 2R -> EV = 1 - 4 = -3
    assert explained_variance(-R, R, mask) == pytest.approx(-3.0, abs=1e-12)


def test_explained_variance_edge_cases_are_zero_not_nan():
    R = torch.tensor([[1.0, 2.0, 3.0]])
    assert explained_variance(torch.zeros(1, 3), R, torch.tensor([[1, 0, 0]])) == 0.0  # one real token
    assert explained_variance(torch.zeros(1, 3), R, torch.zeros(1, 3)) == 0.0  # none
    assert explained_variance(torch.zeros(1, 3), torch.full((1, 3), 0.7), torch.ones(1, 3)) == 0.0  # Var(R) = 0
    # equal returns whose float64 mean rounds (mean of three 0.1 != 0.1, so the computed Var is ~2e-34, not 0)
    third = torch.full((1, 3), 0.1, dtype=torch.float64)
    assert explained_variance(torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.float64), third, torch.ones(1, 3)) == 0.0
    tiny = torch.tensor([[1e-320, 0.0]], dtype=torch.float64)  # Var(R) underflows to 0
    assert explained_variance(torch.zeros(1, 2, dtype=torch.float64), tiny, torch.ones(1, 2)) == 0.0
    with pytest.raises(ValueError, match="finite"):
        explained_variance(torch.tensor([[NAN, 0.0]]), R[:, :2], torch.ones(1, 2))
    with pytest.raises(ValueError, match="shape mismatch"):
        explained_variance(torch.zeros(1, 2), R, torch.ones(1, 2))


# ------------------------------------------------------------------------------------------------
# value_loss
# ------------------------------------------------------------------------------------------------
def _one(x):
    return torch.tensor([[x]], dtype=torch.float64)


def test_value_loss_clipped_branch_wins_and_kills_the_gradient():
    # V_old = 0, V = 0.5, R = 0.4, clip 0.2: unclipped (0.5 - 0.4)^2 = 0.01;
    # clipped V_old + clip(0.5, -0.2, 0.2) = 0.2, (0.2 - 0.4)^2 = 0.04 -> max 0.04, loss 0.5 * 0.04 = 0.02.
    # V moved beyond the clip and the clipped branch wins: d loss / dV = 0.
    v = _one(0.5).requires_grad_()
    loss = value_loss(v, _one(0.0), _one(0.4), torch.ones(1, 1), clip_eps=0.2)
    assert loss.dtype == torch.float64
    assert loss.item() == pytest.approx(0.02, abs=1e-15)
    loss.backward()
    assert float(v.grad) == 0.0


def test_value_loss_unclipped_branch_wins():
    # V_old = 0, V = 0.5, R = 0: unclipped 0.25; clipped (0.2 - 0)^2 = 0.04 -> max 0.25, loss 0.125;
    # gradient of 0.5 (V - R)^2 is V - R = 0.5
    v = _one(0.5).requires_grad_()
    loss = value_loss(v, _one(0.0), _one(0.0), torch.ones(1, 1), clip_eps=0.2)
    assert loss.item() == pytest.approx(0.125, abs=1e-15)
    loss.backward()
    assert float(v.grad) == pytest.approx(0.5, abs=1e-15)
    # inside the clip range both branches coincide: V = 0.1, R = 1 -> 0.5 * 0.81 = 0.405, grad -0.9
    v = _one(0.1).requires_grad_()
    loss = value_loss(v, _one(0.0), _one(1.0), torch.ones(1, 1), clip_eps=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.405, abs=1e-15) and float(v.grad) == pytest.approx(-0.9, abs=1e-15)


def test_value_loss_without_clip_is_half_mse_over_real_tokens():
    g = torch.Generator().manual_seed(0)
    V, V_old, R = (torch.randn(4, 6, generator=g) for _ in range(3))
    mask = torch.rand(4, 6, generator=g) > 0.4
    V_old = V_old * 5  # far away: would matter if clipping were applied
    loss = value_loss(V, V_old, R, mask)
    expected = 0.5 * ((V - R)[mask] ** 2).sum() / mask.sum()
    torch.testing.assert_close(loss, expected)
    # seq_mean_token_mean: per-row mean, then mean over non-empty rows
    per_row = [0.5 * ((V[i] - R[i])[mask[i]] ** 2).mean() for i in range(4) if mask[i].any()]
    torch.testing.assert_close(value_loss(V, V_old, R, mask, mode="seq_mean_token_mean"), torch.stack(per_row).mean())


def test_value_loss_ignores_masked_tokens():
    g = torch.Generator().manual_seed(1)
    V, V_old, R = (torch.randn(3, 5, generator=g) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    v1 = V.clone().requires_grad_()
    l1 = value_loss(v1, V_old, R, mask, clip_eps=0.1)
    l1.backward()
    poison = lambda x, val: torch.where(mask, x, torch.full_like(x, val))  # noqa: E731
    v2 = poison(V, NAN).requires_grad_()
    l2 = value_loss(v2, poison(V_old, INF), poison(R, -1e9), mask, clip_eps=0.1)
    l2.backward()
    assert torch.equal(l1, l2)
    assert torch.equal(v1.grad, v2.grad)
    assert (v2.grad[~mask] == 0).all()


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean"])
def test_value_loss_micro_batches_sum_to_the_full_batch(mode):
    g = torch.Generator().manual_seed(2)
    V, V_old, R = (torch.randn(6, 5, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(6, 5, generator=g) > 0.3
    mask[0] = False
    v_full = V.clone().requires_grad_()
    full = value_loss(v_full, V_old, R, mask, clip_eps=0.3, mode=mode)
    full.backward()
    n_tok, n_seq = int(mask.sum()), int(mask.any(dim=1).sum())
    v_parts = V.clone().requires_grad_()
    total = sum(value_loss(v_parts[s], V_old[s], R[s], mask[s], clip_eps=0.3, mode=mode,
                           num_tokens=n_tok, num_sequences=n_seq) for s in (slice(0, 2), slice(2, 3), slice(3, 6)))
    total.backward()
    torch.testing.assert_close(total, full, atol=1e-12, rtol=0)
    torch.testing.assert_close(v_parts.grad, v_full.grad, atol=1e-12, rtol=0)


def test_value_loss_rejects_bad_input():
    x, m = torch.zeros(2, 3), torch.ones(2, 3)
    for bad in (-0.1, NAN, INF, "0.2"):
        with pytest.raises(ValueError, match="clip_eps"):
            value_loss(x, x, x, m, clip_eps=bad)
    with pytest.raises(ValueError, match="shape mismatch"):
        value_loss(x, torch.zeros(2, 4), x, m)
    with pytest.raises(ValueError, match="shape mismatch"):
        value_loss(x, x, x, torch.ones(3, 3))
    with pytest.raises(ValueError, match="returns"):
        value_loss(x, x, torch.tensor([[0.0, NAN, 0.0], [0.0, 0.0, 0.0]]), m)
    with pytest.raises(ValueError, match="mode"):
        value_loss(x, x, x, m, mode="seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="num_tokens"):
        value_loss(x, x, x, m, num_tokens=5)  # the batch has 6 real tokens
    assert float(value_loss(x, x, x, torch.zeros(2, 3))) == 0.0  # empty mask: 0, not NaN


# ------------------------------------------------------------------------------------------------
# positive_nll_loss
# ------------------------------------------------------------------------------------------------
def test_positive_nll_loss_by_hand():
    # correct rows 0 (3 real tokens, logp -1, -2, -3) and 2 (1 real token, logp -0.5); row 1 incorrect.
    # L = -(-1 - 2 - 3 - 0.5) / (3 + 1) = 6.5 / 4 = 1.625; d L / d logp = -1/4 at counted tokens, 0 elsewhere
    logp = torch.tensor([[-1.0, -2.0, -3.0, NAN], [-9.0, -9.0, -9.0, -9.0], [-0.5, -7.0, -7.0, -7.0]],
                        requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    correct = torch.tensor([True, False, True])
    loss = positive_nll_loss(logp, mask, correct)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(1.625, abs=1e-7)
    loss.backward()
    expected = torch.tensor([[-0.25, -0.25, -0.25, 0], [0, 0, 0, 0], [-0.25, 0, 0, 0]])
    torch.testing.assert_close(logp.grad, expected, atol=1e-7, rtol=0)
    assert float(positive_nll_loss(logp.detach(), mask, torch.tensor([1, 0, 1]))) == pytest.approx(1.625, abs=1e-7)


def test_positive_nll_loss_ignores_incorrect_responses():
    g = torch.Generator().manual_seed(4)
    logp = -torch.rand(4, 5, generator=g) * 3
    mask = torch.rand(4, 5, generator=g) > 0.2
    correct = torch.tensor([True, False, True, False])
    a = logp.clone().requires_grad_()
    la = positive_nll_loss(a, mask, correct)
    la.backward()
    changed = logp.clone()
    changed[~correct] = -20.0 * torch.rand(2, 5, generator=g)  # new log-probs for the incorrect rows
    b = changed.requires_grad_()
    lb = positive_nll_loss(b, mask, correct)
    lb.backward()
    assert torch.equal(la, lb) and torch.equal(a.grad, b.grad)
    assert (a.grad[~correct] == 0).all() and (a.grad[correct][mask[correct]] != 0).all()


def test_positive_nll_loss_micro_batches_sum_to_the_full_batch():
    g = torch.Generator().manual_seed(5)
    logp = -torch.rand(6, 5, generator=g, dtype=torch.float64) * 3
    mask = torch.rand(6, 5, generator=g) > 0.3
    correct = torch.tensor([True, False, True, True, False, True])
    full_in = logp.clone().requires_grad_()
    full = positive_nll_loss(full_in, mask, correct)
    full.backward()
    n = int((mask & correct.unsqueeze(1)).sum())
    parts_in = logp.clone().requires_grad_()
    total = sum(positive_nll_loss(parts_in[s], mask[s], correct[s], num_tokens=n)
                for s in (slice(0, 1), slice(1, 2), slice(2, 6)))  # slice(1, 2) has no correct response
    total.backward()
    torch.testing.assert_close(total, full, atol=1e-12, rtol=0)
    torch.testing.assert_close(parts_in.grad, full_in.grad, atol=1e-12, rtol=0)


def test_positive_nll_loss_without_correct_response_is_zero_with_a_finite_grad():
    logp = torch.tensor([[-1.0, NAN], [-2.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1, 0], [1, 1]])
    for correct, kw in ((torch.tensor([False, False]), {}), (torch.tensor([False, False]), {"num_tokens": 0}),
                        (torch.tensor([True, True]), {"num_tokens": 5, "mask": torch.zeros(2, 2)})):
        m = kw.pop("mask", mask)
        logp.grad = None
        loss = positive_nll_loss(logp, m, correct, **kw)
        assert loss.item() == 0.0 and not math.copysign(1.0, loss.item()) < 0  # +0, not -0 or NaN
        assert loss.grad_fn is not None
        loss.backward()
        assert torch.equal(logp.grad, torch.zeros(2, 2))


def test_positive_nll_loss_rejects_bad_input():
    logp, mask = -torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="num_tokens"):
        positive_nll_loss(logp, mask, torch.tensor([True, True]), num_tokens=5)  # 6 correct tokens here
    for bad in (-1, NAN, "6"):
        with pytest.raises(ValueError, match="num_tokens"):
            positive_nll_loss(logp, mask, torch.tensor([True, True]), num_tokens=bad)
    with pytest.raises(ValueError, match="correct"):
        positive_nll_loss(logp, mask, torch.tensor([True, True, False]))
    with pytest.raises(ValueError, match="correct"):
        positive_nll_loss(logp, mask, torch.tensor([2, 0]))
    with pytest.raises(ValueError, match="correct"):
        positive_nll_loss(logp, mask, [True, True])
    with pytest.raises(ValueError, match="non-finite"):
        positive_nll_loss(torch.tensor([[-1.0, NAN, -1.0], [-1.0, -1.0, -1.0]]), mask, torch.tensor([True, False]))
    with pytest.raises(ValueError, match="<= 0"):
        positive_nll_loss(torch.tensor([[-1.0, 0.5, -1.0], [-1.0, -1.0, -1.0]]), mask, torch.tensor([True, False]))
    # the same bad values in an incorrect response do not count, so they do not raise
    positive_nll_loss(torch.tensor([[-1.0, -1.0, -1.0], [NAN, 0.5, -1.0]]), mask, torch.tensor([True, False]))


# ------------------------------------------------------------------------------------------------
# low-precision inputs (CPU)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_low_precision_inputs(dtype):
    rewards, values, mask, gamma, lam = random_case(21, holes=True)
    r_lp, v_lp = rewards.to(dtype), values.to(dtype)
    adv, ret = gae(r_lp, v_lp, mask, gamma=gamma, lam=lam)
    assert adv.dtype == ret.dtype == torch.float32
    # the same as GAE of the rounded inputs computed in float64 (the compute is float64 whatever the input)
    ref_adv, ref_ret = gae_reference(r_lp.double(), v_lp.double(), mask, gamma, [lam] * mask.shape[0])
    torch.testing.assert_close(adv.double(), ref_adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret.double(), ref_ret, atol=1e-5, rtol=1e-5)
    y, p = ret.to(dtype).double()[mask], v_lp.double()[mask]  # 1 - Var(R - V) / Var(R), population variances
    ev = 1 - ((y - p) - (y - p).mean()).square().mean() / (y - y.mean()).square().mean()
    assert explained_variance(v_lp, ret.to(dtype), mask) == pytest.approx(float(ev), abs=1e-12)

    v = values.to(dtype).requires_grad_()
    loss = value_loss(v, v.detach(), ret.to(dtype), mask, clip_eps=0.2)
    assert loss.dtype == torch.float32
    loss.backward()
    assert v.grad.dtype == dtype and torch.isfinite(v.grad.float()).all()
    expected = 0.5 * ((values.to(dtype).float() - ret.to(dtype).float())[mask] ** 2).sum() / mask.sum()
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-6)

    logp = (-torch.rand(7, 9, generator=torch.Generator().manual_seed(0))).to(dtype).requires_grad_()
    correct = torch.tensor([True, False] * 3 + [True])
    nll = positive_nll_loss(logp, mask, correct)
    assert nll.dtype == torch.float32
    nll.backward()
    sel = mask & correct.unsqueeze(1)
    torch.testing.assert_close(nll, -logp.detach().float()[sel].sum() / sel.sum(), atol=1e-6, rtol=1e-6)
    assert torch.isfinite(logp.grad.float()).all()
