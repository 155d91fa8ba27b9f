"""Metrics that carry their own reduction, so that whoever aggregates them needs no list of names.

A :class:`Metric` is a python ``float`` (it prints, compares and serialises as one) with two extra
attributes: ``reduce``, how values from several micro-batches or optimiser steps combine
(``"mean"``, ``"sum"``, ``"min"`` or ``"max"``), and ``weight``, the weight of a ``"mean"`` (the
number of real tokens or sequences the value averages over). The functions that compute a metric
also say how it combines; the trainer only calls :func:`reduce_micro_batches` and
:func:`reduce_updates`.

Two levels, because a loss is split two ways:

* **micro-batches of one optimiser step**: each micro-batch loss is normalised by the *global*
  token count (:func:`grpo_lab.algo.objectives.aggregate`), so losses and counts add up (``"sum"``);
  means are weighted by their ``weight`` (a token-weighted mean over the micro-batches equals the
  mean over the whole minibatch); ``"min"``/``"max"`` ignore entries of weight 0 (an empty
  micro-batch has no minimum). A ``"mean"`` whose weights are all 0 was not measured: NaN. A
  :class:`SampleQuantile` (a quantile of token values) keeps its samples: the micro-batches' samples are
  pooled and the quantile taken of the pool (a mean of quantiles would depend on the split).
* **optimiser steps of one training step** (epochs × minibatches): the plain mean of the
  per-step values (``"min"``/``"max"``: the extreme), ignoring NaN; NaN when no step measured it.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

__all__ = ["Metric", "REDUCTIONS", "SampleQuantile", "token_mean", "seq_mean", "total", "minimum", "maximum",
           "sample_quantile", "quantiles", "reduce_micro_batches", "reduce_updates"]

#: The reductions a :class:`Metric` can carry (its ``reduce``), applied over micro-batches and updates.
REDUCTIONS = ("mean", "sum", "min", "max")


class Metric(float):
    """A float that knows how it is reduced.

    Args:
        value: the value (python number or 0-d tensor item).
        reduce: ``"mean"`` | ``"sum"`` | ``"min"`` | ``"max"``.
        weight: ``>= 0``; the weight of a ``"mean"`` (tokens or sequences averaged over); for
            ``"min"``/``"max"`` a weight of 0 marks "no data" (the entry is ignored).

    Raises:
        ValueError: unknown ``reduce`` or a negative / non-finite ``weight``.
    """

    __slots__ = ("reduce", "weight")

    def __new__(cls, value, reduce: str = "mean", weight: float = 1.0):
        if reduce not in REDUCTIONS:
            raise ValueError(f"unknown metric reduction {reduce!r}; expected one of {REDUCTIONS}")
        weight = float(weight)
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"metric weight must be finite and >= 0, got {weight!r}")
        obj = super().__new__(cls, value)
        obj.reduce = reduce
        obj.weight = weight
        return obj

    def __reduce__(self):  # pickling (multiprocessing) keeps the reduction
        return (Metric, (float(self), self.reduce, self.weight))


def token_mean(value, num_tokens) -> Metric:
    """A mean over ``num_tokens`` real tokens (combined token-weighted)."""
    return Metric(value, "mean", num_tokens)


def seq_mean(value, num_sequences) -> Metric:
    """A mean over ``num_sequences`` sequences (combined sequence-weighted)."""
    return Metric(value, "mean", num_sequences)


def total(value) -> Metric:
    """A quantity that adds up over micro-batches (a loss normalised by global counts, a count)."""
    return Metric(value, "sum")


def minimum(value, weight=1.0) -> Metric:
    """A minimum; ``weight=0`` marks an empty batch (ignored when combining)."""
    return Metric(value, "min", weight)


def maximum(value, weight=1.0) -> Metric:
    """A maximum; ``weight=0`` marks an empty batch (ignored when combining)."""
    return Metric(value, "max", weight)


class SampleQuantile(Metric):
    """A ``"mean"`` :class:`Metric` that is the ``q``-quantile of its ``samples`` (a detached 1-D tensor, its
    weight their count) and keeps them: :func:`reduce_micro_batches` takes the quantile of the concatenated
    samples of every micro-batch, not a mean of quantiles, so the result does not depend on how the rows were
    split. Pickled, it becomes a plain :class:`Metric` (the samples stay behind)."""

    __slots__ = ("samples", "q")


def sample_quantile(samples, q: float, value: float | None = None) -> Metric:
    """The ``q``-quantile (``0 <= q <= 1``, :func:`quantiles`) of the 1-D tensor ``samples`` as a
    :class:`SampleQuantile` of weight ``samples.numel()`` (0 for none: not measured). ``value``: the quantile
    when the caller has computed it already (else computed here; NaN without samples)."""
    samples = samples.detach().reshape(-1)
    if value is None:
        value = float(quantiles(samples, (q,))[0]) if samples.numel() else math.nan
    out = SampleQuantile(value, "mean", samples.numel())
    out.samples, out.q = samples, float(q)
    return out


def quantiles(x, qs: Iterable[float]) -> list:
    """The linear-interpolation quantiles (numpy's default, ``torch.quantile``'s ``"linear"``) ``qs`` of the
    non-empty 1-D tensor ``x``, as 0-d tensors of its dtype; by a sort, so without ``torch.quantile``'s size
    limit."""
    import torch

    s = torch.sort(x).values
    n = s.numel()
    out = []
    for q in qs:
        pos = q * (n - 1)
        lo = int(math.floor(pos))
        hi = min(lo + 1, n - 1)
        frac = pos - lo
        out.append(s[lo] * (1 - frac) + s[hi] * frac)
    return out


def _pooled_quantile(vs: list) -> Metric | None:
    """The quantile of the pooled samples of the :class:`SampleQuantile` values ``vs`` (one ``q``), as a plain
    mean :class:`Metric` of their total weight; ``None`` when they are not all such values."""
    if not all(isinstance(v, SampleQuantile) for v in vs) or len({v.q for v in vs}) != 1:
        return None
    import torch

    live = [v.samples for v in vs if v.samples.numel()]
    if not live:
        return Metric(math.nan, "mean", 0.0)
    pooled = torch.cat([t.to(live[0].device) for t in live])
    return Metric(float(quantiles(pooled, (vs[0].q,))[0].to(torch.float64)), "mean", pooled.numel())


def _by_name(dicts: Iterable[Mapping[str, Metric]]) -> dict[str, list]:
    """``{name: [value of each dict that has it]}``, names in order of first appearance."""
    out: dict[str, list] = {}
    for d in dicts:
        for k, v in d.items():
            out.setdefault(k, []).append(v)
    return out


def _how(name: str, values: list) -> str:
    hows = {getattr(v, "reduce", None) for v in values}
    if len(hows) != 1 or None in hows:
        raise ValueError(f"metric {name!r}: every value must be a Metric with one reduction, got {sorted(map(str, hows))}")
    return hows.pop()


def reduce_micro_batches(parts: Iterable[Mapping[str, Metric]]) -> dict[str, Metric]:
    """Combine the metrics of the micro-batches of one optimiser step (see the module docstring).

    Returns ``{name: Metric}`` with the same reductions; a mean's weight is the total weight.

    Raises:
        ValueError: a value that is not a :class:`Metric`, or one name with two reductions.
    """
    out = {}
    for k, vs in _by_name(parts).items():
        how = _how(k, vs)
        W = sum(v.weight for v in vs)
        if how == "sum":
            out[k] = Metric(sum(float(v) for v in vs), "sum")
        elif how == "mean" and (pooled := _pooled_quantile(vs)) is not None:
            out[k] = pooled
        elif how == "mean":
            # entries of weight 0 measured nothing (their value may be NaN): leave them out
            mean = sum(float(v) * (v.weight / W) for v in vs if v.weight > 0) if W > 0 else math.nan
            out[k] = Metric(mean, "mean", W)
        else:
            live = [float(v) for v in vs if v.weight > 0]
            pick = min if how == "min" else max
            out[k] = Metric(pick(live) if live else math.nan, how, float(bool(live)))
    return out


def reduce_updates(steps: Iterable[Mapping[str, Metric]]) -> dict[str, float]:
    """Combine per-optimiser-step metrics (from :func:`reduce_micro_batches`) into plain floats.

    ``"mean"`` and ``"sum"``: the plain mean over steps; ``"min"``/``"max"``: the extreme. NaN
    entries (not measured in that step) are skipped; a metric no step measured is NaN.
    """
    out = {}
    for k, vs in _by_name(steps).items():
        how = _how(k, vs)
        live = [float(v) for v in vs if not math.isnan(v)]
        if not live:
            out[k] = math.nan
        elif how in ("mean", "sum"):
            out[k] = sum(live) / len(live)
        else:
            out[k] = (min if how == "min" else max)(live)
    return out
