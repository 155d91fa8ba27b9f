"""Statistics for comparing runs over seeds: t intervals, paired differences, binomial error.

The book's comparative claims rest on a few seeds per setting (five on the CPU profile). Each
setting is summarised by the mean over seeds with a two-sided Student-t interval (the seeds are
independent draws of the whole training run), and two settings that share seeds are compared by
the **paired** difference per seed: the seed fixes the prompts drawn, so the difference removes
the part of the spread the two settings share. A test-set accuracy has its own sampling error,
the binomial standard error ``sqrt(p (1 - p) / n)``, reported beside the intervals, or the Wilson
score interval of a count of successes (:func:`wilson_interval`), which stays inside [0, 1] and
keeps its coverage near 0 and 1, where ``p ± 1.96 se`` does not.

Quantiles come from :mod:`scipy.stats`. Everything here takes plain sequences, numpy arrays or
pandas Series (indexed by seed for the paired functions) and returns python floats.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np
import pandas as pd

__all__ = ["Interval", "t_interval", "paired_difference", "paired_ratio", "binomial_se", "wilson_interval",
           "format_interval"]


class Interval(NamedTuple):
    """A mean with its two-sided interval.

    Attributes:
        mean: the sample mean.
        lo, hi: interval bounds (for :func:`t_interval`, ``lo == hi == mean`` when ``n == 1``: no
            spread is measurable; :func:`wilson_interval` gives a proper interval for any ``n``).
        n: number of values (trials, for :func:`wilson_interval`).
        level: confidence level of the interval.
    """

    mean: float
    lo: float
    hi: float
    n: int
    level: float = 0.95

    @property
    def half_width(self) -> float:
        """``(hi - lo) / 2``."""
        return (self.hi - self.lo) / 2

    def excludes(self, value: float = 0.0) -> bool:
        """True when ``value`` lies outside ``[lo, hi]`` (with ``n >= 2``)."""
        return self.n >= 2 and not (self.lo <= value <= self.hi)


def _values(values, name: str) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    if x.size == 0:
        raise ValueError(f"{name}: no values")
    if not np.isfinite(x).all():
        raise ValueError(f"{name}: values must be finite (NaN or inf found)")
    return x


def t_interval(values: Sequence[float], level: float = 0.95, *, bounds: tuple[float, float] | None = None) -> Interval:
    """Mean and Student-t interval ``mean ± t_{(1+level)/2, n-1} * sd / sqrt(n)``.

    The quantile is ``scipy.stats.t.ppf`` (bit for bit the upper end of ``scipy.stats.t.interval(level,
    n - 1)``). The interval itself is written out: ``scipy.stats.t.interval(level, n - 1, loc=mean,
    scale=sem)`` is the same interval only up to rounding (it takes the lower quantile for the lower
    end and rounds the scale first), which would move the last bits of the book's numbers.

    Args:
        values: one value per seed (finite).
        level: confidence level in (0, 1).
        bounds: optional ``(low, high)`` range of the quantity (e.g. ``(0, 1)`` for a fraction):
            the interval's ends are clipped to it, so that a band never leaves the metric's range
            (the mean is not clipped: values inside the range have their mean inside it).

    Raises:
        ValueError: no values, a NaN / inf value, ``level`` outside (0, 1), ``bounds`` with
            ``low > high``.
    """
    if not 0 < level < 1:
        raise ValueError(f"t_interval: level must be in (0, 1), got {level!r}")
    if bounds is not None and not bounds[0] <= bounds[1]:
        raise ValueError(f"t_interval: bounds must be (low, high) with low <= high, got {bounds!r}")
    from scipy import stats

    x = _values(values, "t_interval")
    n, mean = x.size, float(x.mean())
    if n == 1:
        lo = hi = mean
    else:
        half = float(stats.t.ppf((1 + level) / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
        lo, hi = mean - half, mean + half
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    return Interval(mean, lo, hi, n, level)


def _shared(a: pd.Series, b: pd.Series, name: str) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(a, pd.Series) or not isinstance(b, pd.Series):
        raise ValueError(f"{name}: pass pandas Series indexed by seed (so that values are paired by seed)")
    if a.index.has_duplicates or b.index.has_duplicates:
        raise ValueError(f"{name}: duplicate seeds in the index")
    seeds = a.index.intersection(b.index)
    if len(seeds) < 2:
        raise ValueError(f"{name}: needs at least 2 shared seeds, got {list(seeds)}")
    return _values(a.loc[seeds], name), _values(b.loc[seeds], name)


def paired_difference(a: pd.Series, b: pd.Series, level: float = 0.95) -> Interval:
    """The mean over shared seeds of ``a[seed] - b[seed]``, with its t interval.

    Raises:
        ValueError: not Series, fewer than 2 shared seeds, duplicate seeds, non-finite values.
    """
    x, y = _shared(a, b, "paired_difference")
    return t_interval(x - y, level)


def paired_ratio(a: pd.Series, b: pd.Series, level: float = 0.95) -> Interval:
    """The geometric mean over shared seeds of ``a[seed] / b[seed]``: a t interval on the log
    ratios, exponentiated (so the interval is never below 0 and ``1`` means equal).

    Raises:
        ValueError: as :func:`paired_difference`, or a non-positive value.
    """
    x, y = _shared(a, b, "paired_ratio")
    if (x <= 0).any() or (y <= 0).any():
        raise ValueError("paired_ratio: values must be > 0")
    iv = t_interval(np.log(x) - np.log(y), level)
    return Interval(math.exp(iv.mean), math.exp(iv.lo), math.exp(iv.hi), iv.n, level)


def binomial_se(p: float, n: int) -> float:
    """Standard error ``sqrt(p (1 - p) / n)`` of an accuracy ``p`` measured on ``n`` questions.

    Raises:
        ValueError: ``p`` outside [0, 1] or ``n < 1``.
    """
    if not 0 <= float(p) <= 1:
        raise ValueError(f"binomial_se: p must be in [0, 1], got {p!r}")
    if int(n) < 1:
        raise ValueError(f"binomial_se: n must be >= 1, got {n!r}")
    return math.sqrt(float(p) * (1 - float(p)) / int(n))


def wilson_interval(successes: int, n: int, level: float = 0.95) -> Interval:
    """The Wilson score interval (Wilson 1927, "Probable inference, the law of succession, and
    statistical inference", JASA 22) of a binomial proportion: ``successes`` out of ``n``
    independent trials (e.g. problems answered correctly out of a test set of ``n``).

    The bounds are ``(p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)`` with ``p = successes / n``
    and ``z`` the ``(1 + level) / 2`` normal quantile, computed by
    ``scipy.stats.binomtest(successes, n).proportion_ci(level, method="wilson")`` (no continuity
    correction).

    Args:
        successes: ``int`` in ``[0, n]``.
        n: ``int >= 0`` trials. ``n = 0`` (nothing measured) gives ``mean`` NaN and the whole range
            ``[0, 1]`` (the limit of the interval as the data vanish).
        level: confidence level in (0, 1).

    Returns:
        :class:`Interval` ``(successes / n, lo, hi, n, level)``.

    Raises:
        ValueError: ``successes`` or ``n`` not an integer, ``n < 0``, ``successes`` outside
            ``[0, n]``, ``level`` outside (0, 1).
    """
    from scipy import stats

    for name, value in (("successes", successes), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"wilson_interval: {name} must be an int, got {type(value).__name__} {value!r}")
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: needs 0 <= successes <= n, got successes={successes}, n={n}")
    if not 0 < level < 1:
        raise ValueError(f"wilson_interval: level must be in (0, 1), got {level!r}")
    if n == 0:
        return Interval(math.nan, 0.0, 1.0, 0, level)
    ci = stats.binomtest(int(successes), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return Interval(int(successes) / int(n), float(ci.low), float(ci.high), int(n), level)


def format_interval(iv: Interval, digits: int = 3) -> str:
    """``"0.677 [0.660, 0.694]"`` (mean, then the interval), rounded to ``digits`` decimals.

    A value that rounds to zero prints without a sign (``0.000``, not ``-0.000``): a minus sign
    there would report a sign the shown precision cannot resolve."""

    def fmt(x: float) -> str:
        text = f"{x:.{digits}f}"
        return text[1:] if text.startswith("-") and float(text) == 0 else text

    return f"{fmt(iv.mean)} [{fmt(iv.lo)}, {fmt(iv.hi)}]"
