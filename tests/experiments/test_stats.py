"""grpo_lab.experiments.stats and the 95% band of plotting.band_plot."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from grpo_lab.experiments import plotting, stats  # noqa: E402


def test_t_interval_by_hand():
    # hand: values 1, 2, 3 -> mean 2, sd 1, n 3; t_{0.975, 2} = 4.30265273 (standard table, 9 significant digits)
    iv = stats.t_interval([1.0, 2.0, 3.0])
    half = 4.30265273 / math.sqrt(3)
    assert iv.mean == 2.0 and iv.n == 3 and iv.level == 0.95
    assert iv.lo == pytest.approx(2 - half, abs=1e-8) and iv.hi == pytest.approx(2 + half, abs=1e-8)
    assert iv.half_width == pytest.approx(half, abs=1e-8)
    assert iv.excludes(-1.0) and not iv.excludes(0.0)


def test_t_interval_one_value_and_bounds():
    iv = stats.t_interval([0.3])
    assert (iv.mean, iv.lo, iv.hi, iv.n) == (0.3, 0.3, 0.3, 1) and not iv.excludes(0.0)
    # a fraction near 0: the raw interval goes below 0, the bounded one does not
    raw = stats.t_interval([0.0, 0.0, 0.01])
    assert raw.lo < 0
    assert stats.t_interval([0.0, 0.0, 0.01], bounds=(0, 1)).lo == 0.0


def test_t_interval_bounds_clip_the_upper_end_too():
    # a fraction near 1: 1, 1, 0.99 -> mean 0.99667, sd 0.0057735, half-width 4.30265273 * sd / sqrt 3
    # = 0.01434 (hand, t table as above), so the raw hi is 1.0110 > 1. Catches bounds applied to lo
    # only, or hi clipped to the lower bound / lo to the upper one.
    raw = stats.t_interval([1.0, 1.0, 0.99])
    half = 4.30265273 * (0.01 / math.sqrt(3)) / math.sqrt(3)
    assert raw.hi == pytest.approx(2.99 / 3 + half, abs=1e-8) and raw.hi > 1
    iv = stats.t_interval([1.0, 1.0, 0.99], bounds=(0, 1))
    assert iv.hi == 1.0 and iv.lo == raw.lo and iv.mean == raw.mean and iv.n == 3  # lo inside: unchanged
    # both ends out of range (n = 2: t_{0.975, 1} = 12.7062047): both clipped, the mean kept
    both = stats.t_interval([0.0, 1.0], bounds=(0, 1))
    assert (both.lo, both.hi, both.mean) == (0.0, 1.0, 0.5)
    assert stats.t_interval([0.0, 1.0]).hi == pytest.approx(0.5 + 12.7062047 * math.sqrt(0.5) / math.sqrt(2), abs=1e-6)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_t_interval_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="t_interval"):
        stats.t_interval(bad)


def test_t_interval_rejects_bad_level():
    with pytest.raises(ValueError, match="level"):
        stats.t_interval([1.0, 2.0], level=1.0)


def test_paired_difference_uses_shared_seeds_only():
    a = pd.Series({0: 0.7, 1: 0.8, 2: 0.6, 3: 0.9})
    b = pd.Series({1: 0.7, 2: 0.5, 3: 0.85, 7: 0.1})
    iv = stats.paired_difference(a, b)  # seeds 1, 2, 3: differences 0.1, 0.1, 0.05
    assert iv.n == 3 and iv.mean == pytest.approx(0.25 / 3)
    ref = stats.t_interval([0.1, 0.1, 0.05])
    assert (iv.lo, iv.hi) == pytest.approx((ref.lo, ref.hi))
    # pairing removes the seed effect the two share: a shared offset per seed does not widen it
    seed_effect = pd.Series({1: 0.3, 2: -0.2, 3: 0.1})
    iv2 = stats.paired_difference(a + seed_effect, b + seed_effect)
    assert (iv2.lo, iv2.hi) == pytest.approx((iv.lo, iv.hi))


def test_paired_functions_reject_bad_input():
    with pytest.raises(ValueError, match="Series"):
        stats.paired_difference([1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="2 shared seeds"):
        stats.paired_difference(pd.Series({0: 1.0, 1: 2.0}), pd.Series({1: 1.0, 2: 2.0}))
    with pytest.raises(ValueError, match="duplicate"):
        stats.paired_difference(pd.Series([1.0, 2.0], index=[0, 0]), pd.Series({0: 1.0}))
    with pytest.raises(ValueError, match="> 0"):
        stats.paired_ratio(pd.Series({0: 1.0, 1: 0.0}), pd.Series({0: 1.0, 1: 2.0}))


def test_paired_ratio_is_a_geometric_mean():
    a = pd.Series({0: 2.0, 1: 8.0, 2: 4.0})
    b = pd.Series({0: 4.0, 1: 8.0, 2: 16.0})  # ratios 1/2, 1, 1/4 -> geometric mean 1/2
    iv = stats.paired_ratio(a, b)
    assert iv.mean == pytest.approx(0.5) and 0 < iv.lo < 0.5 < iv.hi


def test_binomial_se_and_format():
    assert stats.binomial_se(0.5, 198) == pytest.approx(math.sqrt(0.25 / 198))  # about 0.0355
    assert stats.binomial_se(0.0, 10) == 0.0
    with pytest.raises(ValueError):
        stats.binomial_se(1.2, 10)
    with pytest.raises(ValueError):
        stats.binomial_se(0.5, 0)
    assert stats.format_interval(stats.Interval(0.6774, 0.66, 0.69449, 5)) == "0.677 [0.660, 0.694]"
    # chapter 2 printed "-0.000 [-0.013, 0.012]": a sign the precision cannot resolve (hand-written goldens)
    assert stats.format_interval(stats.Interval(-0.0003, -0.0134, 0.0121, 5)) == "0.000 [-0.013, 0.012]"
    assert stats.format_interval(stats.Interval(0.0061, -0.0004, 0.0131, 5)) == "0.006 [0.000, 0.013]"
    assert stats.format_interval(stats.Interval(-0.004, -0.006, -0.002, 5), digits=2) == "0.00 [-0.01, 0.00]"


def test_band_plot_ci95_band_and_bounds():
    df = pd.DataFrame({"algo": "GRPO", "seed": [0, 1, 2, 0, 1, 2], "step": [1, 1, 1, 2, 2, 2],
                       "y": [0.0, 0.0, 0.03, 0.5, 0.6, 0.7]})
    fig, ax = plt.subplots()
    plotting.band_plot(ax, df, "step", "y", band="ci95", bounds=(0, 1))
    verts = ax.collections[0].get_paths()[0].vertices
    assert verts[:, 1].min() >= 0.0  # the bounded band never shows a negative fraction
    iv = stats.t_interval([0.5, 0.6, 0.7])
    assert np.isclose(verts[:, 1], iv.hi).any() and np.isclose(verts[:, 1], iv.lo).any()
    plt.close(fig)
    fig, ax = plt.subplots()
    out = plotting.band_plot(ax, df, "step", "y")  # the default stays mean ± sd, same columns
    assert list(out.columns) == ["algo", "step", "mean", "sd", "n"]
    verts = ax.collections[0].get_paths()[0].vertices
    assert np.isclose(verts[:, 1], 0.6 + 0.1).any()
    plt.close(fig)
    with pytest.raises(ValueError, match="band"):
        plotting.band_plot(plt.subplots()[1], df, "step", "y", band="se")


def test_t_interval_rejects_reversed_bounds():
    with pytest.raises(ValueError, match="bounds"):
        stats.t_interval([0.2, 0.3], bounds=(1, 0))


LEVELS = [0.5, 0.6827, 0.8, 0.9, 0.95, 0.975, 0.99, 0.999]


@pytest.mark.parametrize("level", LEVELS)
def test_t_interval_quantile_is_scipys_for_every_n(level):
    # the quantile is scipy.stats.t's, bit for bit: t.ppf((1 + level) / 2, n - 1), which is also the upper end
    # of scipy's standard interval t.interval(level, n - 1); the interval is mean ± q * sd / sqrt(n) exactly
    from scipy import stats as sps

    rng = np.random.default_rng(int(level * 1e4))
    for n in [*range(2, 41), 50, 64, 100, 200]:
        x = rng.normal(rng.uniform(-2, 2), rng.uniform(1e-3, 3), n)
        q = sps.t.ppf((1 + level) / 2, n - 1)
        assert sps.t.interval(level, n - 1)[1] == q
        mean, half = float(x.mean()), float(q * x.std(ddof=1) / math.sqrt(n))
        iv = stats.t_interval(x, level)
        assert (iv.mean, iv.lo, iv.hi, iv.n, iv.level) == (mean, mean - half, mean + half, n, level)
        # scipy's whole interval, t.interval(level, n - 1, loc=mean, scale=sem), is the same interval up to
        # rounding (its lower end is the lower quantile and the scale is rounded first), not bit for bit,
        # so the arithmetic above stays written out. How close depends on scipy's version: within 1e-12 with
        # ci.txt's scipy 1.17; min.txt's 1.10 computes the lower quantile separately, ~1.3e-9 apart relative
        # (scripts/check_min_versions.sh measured it), so 1e-7
        lo, hi = sps.t.interval(level, n - 1, loc=mean, scale=sps.sem(x))
        assert (iv.lo, iv.hi) == pytest.approx((lo, hi), rel=1e-7, abs=1e-7 * half)


def test_band_plot_ci95_is_the_t_interval_at_every_step():
    rng = np.random.default_rng(3)
    seeds = [0, 1, 2, 3, 4]
    df = pd.DataFrame([{"algo": "GRPO", "seed": s, "step": t, "y": float(rng.random())}
                       for s in seeds for t in range(6) if not (t == 5 and s > 1)])  # step 5: two seeds only
    fig, ax = plt.subplots()
    plotting.band_plot(ax, df, "step", "y", band="ci95")
    verts = np.concatenate([p.vertices for p in ax.collections[0].get_paths()])
    for t, part in df.groupby("step"):
        iv = stats.t_interval(part["y"])
        at = verts[verts[:, 0] == t, 1]
        assert np.isclose(at.min(), iv.lo, rtol=0, atol=1e-15) and np.isclose(at.max(), iv.hi, rtol=0, atol=1e-15)
    plt.close(fig)
