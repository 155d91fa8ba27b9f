"""Tests for grpo_lab.algo.metrics: a Metric is a float that knows how it combines."""

import copy
import json
import math
import pickle

import pytest
import torch

from grpo_lab.algo.metrics import (
    REDUCTIONS,
    Metric,
    maximum,
    minimum,
    reduce_micro_batches,
    reduce_updates,
    seq_mean,
    token_mean,
    total,
)


def test_a_metric_is_a_float():
    m = token_mean(0.25, 8)
    assert isinstance(m, float) and m == 0.25 and m + 1 == 1.25 and f"{m:.2f}" == "0.25"
    assert repr(m) == "0.25" and json.dumps({"x": m}) == '{"x": 0.25}'
    assert (m.reduce, m.weight) == ("mean", 8.0)
    assert Metric(torch.tensor(1.5), "max", 2) == 1.5  # a 0-d tensor value is fine
    assert (total(3).reduce, seq_mean(0.5, 4).weight, minimum(1.0).reduce, maximum(2.0, weight=0).weight) == (
        "sum", 4.0, "min", 0.0)


@pytest.mark.parametrize("m", [token_mean(0.5, 3), total(-2.0), minimum(0.1, 0), maximum(math.nan, 0)])
def test_pickle_and_copy_keep_the_reduction(m):
    for back in (pickle.loads(pickle.dumps(m)), copy.copy(m), copy.deepcopy(m)):
        assert type(back) is Metric and (back.reduce, back.weight) == (m.reduce, m.weight)
        assert back == m or (math.isnan(back) and math.isnan(m))


@pytest.mark.parametrize("kw, match", [
    (dict(reduce="median"), "unknown metric reduction"),
    (dict(weight=-1.0), "weight"),
    (dict(weight=math.inf), "weight"),
    (dict(weight=math.nan), "weight"),
])
def test_metric_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        Metric(1.0, **kw)
    assert set(REDUCTIONS) == {"mean", "sum", "min", "max"}


def test_reduce_micro_batches():
    parts = [
        {"loss": total(0.5), "clip": token_mean(0.5, 2), "rmin": minimum(0.9, 2), "rmax": maximum(1.1, 2),
         "masked": seq_mean(1.0, 1)},
        {"loss": total(0.25), "clip": token_mean(0.0, 6), "rmin": minimum(0.7, 6), "rmax": maximum(1.3, 6),
         "masked": seq_mean(0.0, 3)},
        # an empty micro-batch: measured nothing
        {"loss": total(0.0), "clip": token_mean(0.0, 0), "rmin": minimum(1.0, 0), "rmax": maximum(1.0, 0),
         "masked": seq_mean(0.0, 0)},
    ]
    out = reduce_micro_batches(parts)
    assert out["loss"] == 0.75 and out["loss"].reduce == "sum"
    assert out["clip"] == pytest.approx(0.5 * 2 / 8) and out["clip"].weight == 8.0  # token-weighted
    assert out["masked"] == pytest.approx(1 / 4) and out["masked"].weight == 4.0  # sequence-weighted
    assert out["rmin"] == 0.7 and out["rmax"] == 1.3  # the empty batch's 1.0 is ignored
    assert all(v.reduce == parts[0][k].reduce for k, v in out.items())


def test_reduce_micro_batches_of_nothing_measured_is_nan():
    out = reduce_micro_batches([{"kl": token_mean(0.0, 0), "rmin": minimum(1.0, 0)}] * 2)
    assert math.isnan(out["kl"]) and out["kl"].weight == 0.0
    assert math.isnan(out["rmin"]) and out["rmin"].weight == 0.0
    # and such a NaN of weight 0 does not poison a later combination
    again = reduce_micro_batches([out, {"kl": token_mean(0.5, 4), "rmin": minimum(0.3, 4)}])
    assert again["kl"] == 0.5 and again["rmin"] == 0.3


def test_reduce_updates():
    steps = [
        {"loss": total(1.0), "clip": token_mean(0.2, 5), "rmin": minimum(0.5), "kl": token_mean(math.nan, 0)},
        {"loss": total(3.0), "clip": token_mean(0.4, 50), "rmin": minimum(0.2), "kl": token_mean(0.1, 9)},
    ]
    out = reduce_updates(steps)
    assert out == pytest.approx({"loss": 2.0, "clip": 0.3, "rmin": 0.2, "kl": 0.1})  # plain mean over steps
    assert all(type(v) is float for v in out.values())
    assert math.isnan(reduce_updates([{"kl": token_mean(math.nan, 0)}])["kl"])


def test_reductions_reject_plain_floats_and_mixed_reductions():
    with pytest.raises(ValueError, match="'x'"):
        reduce_micro_batches([{"x": 1.0}])
    with pytest.raises(ValueError, match="'x'"):
        reduce_micro_batches([{"x": total(1.0)}, {"x": token_mean(1.0, 1)}])
    with pytest.raises(ValueError, match="'y'"):
        reduce_updates([{"y": 0.5}])
