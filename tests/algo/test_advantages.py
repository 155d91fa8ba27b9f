"""Tests for grpo_lab.algo.advantages: golden values by hand, invariances, properties, edge cases."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_lab.algo.advantages import group_advantages, rloo_advantages, tied_groups

HYP = settings(max_examples=60, deadline=None)


# ------------------------------------------------------------------------------------------------
# golden values worked out by hand
# ------------------------------------------------------------------------------------------------
def test_golden_group_scale():
    # rewards [1, 0, 0, 1], G = 4:
    #   mean = 2/4 = 0.5; deviations = +-0.5
    #   unbiased variance = (4 * 0.25) / (4 - 1) = 1/3; std = sqrt(1/3) = 0.5773502692
    #   A = +-0.5 / (0.5773502692 + 1e-4) = +-0.5 / 0.5774502692 = +-0.8658754298
    a = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4)
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert expected == pytest.approx(0.8658754298, abs=1e-10)
    torch.testing.assert_close(a, torch.tensor([expected, -expected, -expected, expected]), atol=1e-7, rtol=0)
    assert a.dtype == torch.float32
    # eps = 0: exactly +-sqrt(3)/2 = +-0.8660254038
    a0 = group_advantages([1.0, 0.0, 0.0, 1.0], 4, eps=0.0)
    torch.testing.assert_close(a0, torch.tensor([1.0, -1.0, -1.0, 1.0]) * math.sqrt(3) / 2, atol=1e-7, rtol=0)


def test_golden_two_groups_of_three():
    # group 0 = [2, 0, 1]: mean 1, unbiased var = (1 + 1 + 0)/2 = 1, std 1 -> A = [1, -1, 0]/(1 + 1e-4)
    # group 1 = [5, 5, 5]: all equal -> exactly 0
    a = group_advantages(torch.tensor([2.0, 0.0, 1.0, 5.0, 5.0, 5.0]), 3)
    c = 1 / (1 + 1e-4)  # 0.99990001
    torch.testing.assert_close(a, torch.tensor([c, -c, 0.0, 0.0, 0.0, 0.0]), atol=1e-7, rtol=0)
    assert (a[3:] == 0).all()


def test_golden_batch_scale():
    # rewards [1,0,0,1 | 3,3,3,3], G = 4; group means 0.5 and 3.
    # batch mean = 14/8 = 1.75; squared deviations: 0.5625*2 + 3.0625*2 + 1.5625*4 = 13.5
    # unbiased batch var = 13.5/7 = 1.9285714; std = 1.3887301
    # group 0: A = +-0.5 / (1.3887301 + 1e-4) = +-0.3600152; group 1 (all equal): 0
    a = group_advantages(torch.tensor([1.0, 0, 0, 1, 3, 3, 3, 3]), 4, scale="batch")
    e = 0.5 / (math.sqrt(13.5 / 7) + 1e-4)
    assert e == pytest.approx(0.3600152, abs=1e-7)
    torch.testing.assert_close(a, torch.tensor([e, -e, -e, e, 0, 0, 0, 0]), atol=1e-7, rtol=0)


def test_golden_none_scale():
    # Dr.GRPO: r - mean_g. [1,0,0,1] -> mean .5 -> [.5,-.5,-.5,.5]; [0.2, 0.8] -> mean .5 -> [-.3, .3]
    a = group_advantages(torch.tensor([1.0, 0, 0, 1]), 4, scale="none")
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, -0.5, 0.5]))
    a = group_advantages(torch.tensor([0.2, 0.8]), 2, scale="none")
    torch.testing.assert_close(a, torch.tensor([-0.3, 0.3]))


def test_golden_rloo():
    # [1,0,0,1]: A_0 = 1 - (0+0+1)/3 = 2/3; A_1 = 0 - (1+0+1)/3 = -2/3
    # and G/(G-1) (r - mean) = 4/3 * 0.5 = 2/3
    a = rloo_advantages(torch.tensor([1.0, 0, 0, 1]), 4)
    torch.testing.assert_close(a, torch.tensor([2, -2, -2, 2]) / 3.0)
    # G = 2: A = r_i - r_other
    torch.testing.assert_close(rloo_advantages([3.0, 1.0], 2), torch.tensor([2.0, -2.0]))


def test_tied_groups_golden():
    # the zero-advantage groups (DAPO §3.2): all rewards equal, so every estimator gives them 0
    assert tied_groups(torch.tensor([1.0, 0, 0, 1, 2, 2, 2, 2, 0, 0, 0, 0]), 4).tolist() == [False, True, True]
    assert tied_groups([1.0, 2.0], 1).tolist() == [True, True]  # a group of one is always a tie
    assert tied_groups(torch.zeros(0), 4).tolist() == []


# ------------------------------------------------------------------------------------------------
# relations and invariances
# ------------------------------------------------------------------------------------------------
def test_rloo_equals_scaled_centred_reward():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(6 * 5, generator=g, dtype=torch.float64)
    G = 5
    rloo = rloo_advantages(r, G).double()
    centred = group_advantages(r, G, scale="none").double()
    torch.testing.assert_close(rloo, G / (G - 1) * centred, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("scale", ["group", "batch", "none", "rloo"])
def test_permuting_whole_groups_permutes_advantages(scale):
    g = torch.Generator().manual_seed(1)
    G, n = 4, 5
    r = torch.randint(0, 3, (n * G,), generator=g).float()
    fn = (lambda x: rloo_advantages(x, G)) if scale == "rloo" else (lambda x: group_advantages(x, G, scale=scale))
    perm_groups = torch.randperm(n, generator=g)
    idx = (perm_groups.unsqueeze(1) * G + torch.arange(G)).reshape(-1)
    torch.testing.assert_close(fn(r[idx]), fn(r)[idx], atol=0, rtol=0)


@pytest.mark.parametrize("scale", ["group", "none"])
def test_permuting_within_a_group_permutes_advantages(scale):
    r = torch.tensor([0.0, 1.0, 0.5, 1.0, 2.0, 3.0])
    idx = torch.tensor([2, 0, 1, 5, 3, 4])
    torch.testing.assert_close(group_advantages(r[idx], 3, scale=scale), group_advantages(r, 3, scale=scale)[idx])


def test_group_std_is_unbiased_not_population():
    # [0, 1]: unbiased std = sqrt(0.5) = 0.7071 (population std would be 0.5)
    a = group_advantages([0.0, 1.0], 2, eps=0.0)
    torch.testing.assert_close(a, torch.tensor([-0.5, 0.5]) / math.sqrt(0.5))


# ------------------------------------------------------------------------------------------------
# property tests
# ------------------------------------------------------------------------------------------------
rewards_strategy = st.integers(min_value=1, max_value=6).flatmap(
    lambda G: st.tuples(
        st.just(G),
        st.lists(
            st.floats(min_value=-100, max_value=100, allow_nan=False, width=32),
            min_size=G,
            max_size=4 * G,
        ).map(lambda xs: xs[: len(xs) // G * G]),
    )
)


@HYP
@given(rewards_strategy, st.sampled_from(["group", "none", "batch"]))
def test_advantages_sum_to_zero_per_group(gr, scale):
    G, xs = gr
    r = torch.tensor(xs, dtype=torch.float64)
    a = group_advantages(r, G, scale=scale).double()
    assert torch.isfinite(a).all()
    sums = a.view(-1, G).sum(1)
    scale_ = a.abs().max().item() + 1.0
    assert (sums.abs() <= 1e-5 * scale_ * G).all()
    if G > 1:
        rl = rloo_advantages(r, G).double()
        assert (rl.view(-1, G).sum(1).abs() <= 1e-5 * (rl.abs().max().item() + 1) * G).all()


@HYP
@given(rewards_strategy, st.floats(0.1, 10), st.floats(-50, 50))
def test_group_scale_is_affine_invariant(gr, a, b):
    # (r - mean)/std is invariant to r -> a r + b (a > 0) when eps = 0
    G, xs = gr
    r = torch.tensor(xs, dtype=torch.float64)
    if G < 2:
        return
    spread = (r.view(-1, G).amax(1) - r.view(-1, G).amin(1)).min().item() if r.numel() else 1.0
    if spread < 1e-2:  # avoid near-constant groups where float32 rounding dominates
        return
    x = group_advantages(r, G, eps=0.0)
    y = group_advantages(a * r + b, G, eps=0.0)
    torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)


@HYP
@given(st.integers(1, 8), st.floats(-1e6, 1e6, allow_nan=False), st.integers(1, 4))
def test_all_equal_groups_are_exactly_zero(G, value, n):
    r = torch.full((G * n,), value, dtype=torch.float64)
    for scale in ("group", "batch", "none"):
        for eps in (1e-4, 0.0):
            assert (group_advantages(r, G, scale=scale, eps=eps) == 0).all()
    if G > 1:
        assert (rloo_advantages(r, G) == 0).all()


def test_all_equal_with_inexact_mean_is_exactly_zero():
    # 0.1 * 3 / 3 != 0.1 in floating point; the advantage must still be exactly 0
    r = torch.tensor([0.1, 0.1, 0.1], dtype=torch.float32)
    for scale in ("group", "batch", "none"):
        assert (group_advantages(r, 3, scale=scale) == 0).all()


# ------------------------------------------------------------------------------------------------
# edge cases and errors
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_of_one_is_zero(scale):
    a = group_advantages(torch.tensor([1.0, 0.0, 3.0]), 1, scale=scale)
    assert a.tolist() == [0.0, 0.0, 0.0]


def test_rloo_group_of_one_raises():
    with pytest.raises(ValueError, match="group_size >= 2"):
        rloo_advantages(torch.tensor([1.0, 0.0]), 1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_reward_raises(bad):
    r = torch.tensor([1.0, bad, 0.0, 1.0])
    with pytest.raises(ValueError, match="finite"):
        group_advantages(r, 2)
    with pytest.raises(ValueError, match="finite"):
        rloo_advantages(r, 2)
    with pytest.raises(ValueError, match="finite"):
        tied_groups(r, 2)


def test_group_size_must_divide_batch():
    with pytest.raises(ValueError, match="does not divide"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="does not divide"):
        rloo_advantages(torch.zeros(6), 4)


@pytest.mark.parametrize("G", [0, -2, 2.0, True])
def test_bad_group_size(G):
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(4), G)


def test_bad_scale_eps_and_shape():
    with pytest.raises(ValueError, match="unknown scale"):
        group_advantages(torch.zeros(4), 2, scale="std")
    with pytest.raises(ValueError, match="eps"):
        group_advantages(torch.zeros(4), 2, eps=-1e-4)
    with pytest.raises(ValueError, match="eps"):
        group_advantages(torch.zeros(4), 2, eps=float("nan"))
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 2), 2)


def test_dtypes_and_inputs():
    for r in (
        torch.tensor([1, 0, 0, 1]),
        torch.tensor([1.0, 0, 0, 1], dtype=torch.bfloat16),
        torch.tensor([1.0, 0, 0, 1], dtype=torch.float64),
        [1, 0, 0, 1],
    ):
        a = group_advantages(r, 4)
        assert a.dtype == torch.float32
        assert a[0].item() == pytest.approx(0.8658754298, abs=1e-6)
    assert group_advantages(torch.zeros(0), 4).shape == (0,)


def test_rewards_with_grad_are_detached():
    r = torch.tensor([1.0, 0.0], requires_grad=True)
    assert not group_advantages(r, 2).requires_grad


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda():
    r = torch.tensor([1.0, 0, 0, 1, 2, 2], device="cuda")
    a = group_advantages(r, 2)
    assert a.device.type == "cuda"
    torch.testing.assert_close(a.cpu(), group_advantages(r.cpu(), 2))
    torch.testing.assert_close(rloo_advantages(r, 2).cpu(), rloo_advantages(r.cpu(), 2))


# ------------------------------------------------------------------------------------------------
# ties up to rounding (issue 8, item 6): rewards equal up to rounding are a tie
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("eps", [0.0, 1e-4])
def test_rounding_tie_gives_zero_not_uncentred_advantages(scale, eps):
    # 0.1 + 0.2 = 0.30000000000000004 differs from 0.3 by one float64 ulp (5.6e-17). Before the
    # tie rule, eps=0 gave [0, -1, -1]: not even centred.
    r = [0.1 + 0.2, 0.3, 0.3]
    assert r[0] != r[1]
    a = group_advantages(r, 3, scale=scale, eps=eps)
    assert torch.equal(a, torch.zeros(3))
    assert torch.equal(rloo_advantages(r, 3), torch.zeros(3))
    assert tied_groups(r, 3).tolist() == [True]


def test_tie_rule_is_relative_to_scale_and_dtype():
    from grpo_lab.algo.advantages import TIE_ULPS, tied_groups

    big = 1e6
    # float64: a spread of a few ulps at 1e6 is a tie, a spread of 1e-6 (far above rounding) is not
    ulp = math.ulp(big)
    assert tied_groups([big, big + 2 * ulp], 2).tolist() == [True]
    assert tied_groups([big, big + 1e-6], 2).tolist() == [False]
    # the same 1e-6 difference at scale 1 is not a tie either (2^-20 * 2^52 ulps)
    assert tied_groups([1.0, 1.0 + 1e-6], 2).tolist() == [False]
    # float32 input: rounding of a float32 sum is a tie ...
    s32 = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float32)
    r32 = torch.stack([s32.sum(), s32.flip(0).sum()])  # summation order changes the last bit
    assert tied_groups(r32, 2).tolist() == [True]
    # ... and the tolerance is exactly TIE_ULPS float32 epsilons of the largest |reward|
    x = torch.tensor(1.0, dtype=torch.float32)
    tol = TIE_ULPS * torch.finfo(torch.float32).eps
    assert tied_groups(torch.stack([x, x + tol]), 2).tolist() == [True]
    assert tied_groups(torch.stack([x, x + 2 * tol]), 2).tolist() == [False]
    # integers: exact
    assert tied_groups(torch.tensor([3, 3, 4]), 3).tolist() == [False]
    # a real reward difference (DAPO overlong penalty -1/6) is never a tie, and stays centred
    a = group_advantages(torch.tensor([1.0, 1.0 - 1 / 6, 0.0]), 3)
    assert abs(float(a.double().sum())) < 1e-6 and torch.isfinite(a).all()


@given(st.floats(-1e6, 1e6, allow_nan=False), st.integers(2, 8), st.sampled_from(["group", "batch", "none"]))
@HYP
def test_sums_of_equal_terms_in_any_order_are_ties(value, G, scale):
    # G rewards that are the same sum computed in different orders: finite, centred, and zero
    terms = [value / 3, value / 7, value / 11, value / 13]
    rewards = [sum(terms[i:] + terms[:i]) for i in range(G)]
    a = group_advantages(rewards, G, scale=scale, eps=0.0)
    assert torch.equal(a, torch.zeros(G))


# ------------------------------------------------------------------------------------------------
# AdvantageBatch: the one argument of every advantage estimator
# ------------------------------------------------------------------------------------------------
def test_advantage_batch_from_groups():
    from grpo_lab.algo.advantages import AdvantageBatch

    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    b = AdvantageBatch.from_groups(r, 3, mask=torch.ones(6, 4))
    assert b.rewards is r and b.group_ids.tolist() == [0, 0, 0, 1, 1, 1] and b.group_ids.dtype == torch.int64
    assert b.group_size == 3 and b.values is None and b.mask.shape == (6, 4)
    # python lists become float64 tensors (the tie rule then uses float64, as for the list)
    assert AdvantageBatch.from_groups([1, 0], 2).rewards.dtype == torch.float64
    assert AdvantageBatch.from_groups(torch.zeros(0), 4).group_size == 1  # no groups


@pytest.mark.parametrize("ids, match", [
    ([0, 0, 1, 1, 0, 0], "contiguous"),
    ([0, 0, 0, 1, 1, 2], "same size"),
    ([0, 0, 1], "group_ids"),
])
def test_advantage_batch_checks_its_groups(ids, match):
    from grpo_lab.algo.advantages import AdvantageBatch

    b = AdvantageBatch(torch.zeros(6), torch.tensor(ids))
    with pytest.raises(ValueError, match=match):
        b.group_size


def test_advantage_batch_errors():
    from grpo_lab.algo.advantages import AdvantageBatch

    with pytest.raises(ValueError, match="does not divide"):
        AdvantageBatch.from_groups(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="group_size"):
        AdvantageBatch.from_groups(torch.zeros(4), 0)
    with pytest.raises(ValueError, match="finite"):
        AdvantageBatch.from_groups(torch.tensor([0.0, float("nan")]), 2)
    with pytest.raises(ValueError, match="mask must be a \\[B, T\\] tensor with B=4"):
        AdvantageBatch.from_groups(torch.zeros(4), 2, mask=torch.ones(3, 2))
    with pytest.raises(ValueError, match="shape mismatch"):
        AdvantageBatch.from_groups(torch.zeros(4), 2, mask=torch.ones(4, 2), values=torch.ones(4, 3))


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_subnormal_spread_gives_zero_not_inf(scale):
    # found by a fresh user: [5e-324, 0] with eps=0 gave [inf, nan] (the std is subnormal)
    a = group_advantages([5e-324, 0.0], 2, scale=scale, eps=0.0)
    assert torch.equal(a, torch.zeros(2))
