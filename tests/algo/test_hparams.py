"""The mechanism by which registry functions own their hyper-parameters (grpo_lab.algo.hparams): declaration
by keyword-only parameters, typing from the annotation or the default, constraints between axes, and the
shapes and placement of whole-batch statistics. Uses throwaway surrogates registered for each test."""

from typing import Optional

import pytest
import torch

from grpo_lab.algo import hparams
from grpo_lab.algo.advantages import ADVANTAGE_ESTIMATORS, group_zscore
from grpo_lab.algo.algorithms import GRPO
from grpo_lab.algo.objectives import SURROGATES, batch_statistics, policy_loss, ppo_surrogate


def typed(ctx, *, k: float, cap: Optional[float] = None, n: int = 3, on: bool = False, mode: str = "a"):
    return ppo_surrogate(ctx)


def test_declared_keyword_only_parameters_are_the_hyperparameters():
    assert hparams.hyperparameters(typed) == {"k": hparams.REQUIRED, "cap": None, "n": 3, "on": False, "mode": "a"}
    assert hparams.hyperparameters(ppo_surrogate) == {"eps_low": 0.2, "eps_high": 0.2}
    assert hparams.annotation(typed, "cap") == Optional[float] and hparams.annotation(typed, "nope") is None


@pytest.mark.parametrize("params,message", [
    (dict(k="abc"), "k must be a real number"), (dict(k=None), "k must be a real number"),
    (dict(k=1.0, cap="1.5"), "cap must be a real number"), (dict(k=1.0, cap=True), "cap must be a real number"),
    (dict(k=1.0, n=2.5), "n must be an integer"), (dict(k=1.0, mode=3), "mode must be a string"),
    (dict(k=1.0, on="yes"), "on"), ({}, "'k' .* needs a value")])
def test_values_are_typed_by_the_annotation_or_the_default(monkeypatch, params, message):
    monkeypatch.setitem(SURROGATES, "typed", typed)
    with pytest.raises(ValueError, match=message):
        GRPO.replace(surrogate="typed", **params)


def test_typed_values_are_stored_as_python_values(monkeypatch):
    import numpy as np

    monkeypatch.setitem(SURROGATES, "typed", typed)
    got = GRPO.replace(surrogate="typed", k=np.float32(2), cap=np.int64(1), n=np.int64(4), on=True).params
    assert got == {"k": 2.0, "cap": 1.0, "n": 4, "on": True, "mode": "a"}
    assert [type(v) for v in got.values()] == [float, float, int, bool, str]
    assert GRPO.replace(surrogate="typed", k=1.0, cap=None).params["cap"] is None


def test_only_a_surrogate_may_declare_statistics(monkeypatch):
    stat = hparams.declare(batch_statistics={"s": lambda ctx: ctx.mask.float().sum(-1)})

    def estimator(batch, *, adv_eps: float = 1e-4):
        return group_zscore(batch, adv_eps=adv_eps)

    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "with_stat", stat(estimator))
    with pytest.raises(ValueError, match="only a surrogate"):
        GRPO.replace(advantage="with_stat")


def test_a_statistic_must_have_one_row_per_sequence(monkeypatch):
    def short(ctx):
        return torch.zeros(ctx.mask.shape[0] - 1, 16)

    @hparams.declare(batch_statistics={"short": short})
    def uses_short(ctx):
        return ppo_surrogate(ctx, eps_low=0.2, eps_high=0.2)

    monkeypatch.setitem(SURROGATES, "short", uses_short)
    algo = GRPO.replace(surrogate="short", kl=None, beta=0.0)
    lp = -torch.rand(4, 5)
    with pytest.raises(ValueError, match=r"statistic 'short' .* shape \[B, \.\.\.\] with B = 4"):
        batch_statistics(lp, lp, torch.ones(4), torch.ones(4, 5), algo)
    with pytest.raises(ValueError, match="statistic 'short'"):
        policy_loss(lp, lp, torch.ones(4), torch.ones(4, 5), algo)


def test_declare_refuses_what_it_cannot_use():
    with pytest.raises(ValueError, match="callable"):
        hparams.declare(validate=3)
    with pytest.raises(ValueError, match="keyed by name"):
        hparams.declare(requires={1: "token"})
