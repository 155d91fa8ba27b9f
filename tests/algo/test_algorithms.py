"""Tests for grpo_lab.algo.algorithms: validation, presets, dispatch, descriptions."""

import dataclasses
import json

import re

import pytest
import torch

from grpo_lab.algo import advantages as adv
from grpo_lab.algo.algorithms import (
    ADVANTAGE_NAMES,
    AGGREGATION_NAMES,
    DAPO,
    GRPO,
    KL_ESTIMATOR_NAMES,
    PRESETS,
    RATIO_LEVEL_NAMES,
    SURROGATE_NAMES,
    Algorithm,
    get_algorithm,
)


def test_grpo_preset_is_deepseekmath_eq3():
    # DeepSeekMath (arXiv 2402.03300) Eq. 3-4, §4.1.2, §4.2
    assert GRPO.name == "GRPO"
    assert GRPO.advantage == "group" and GRPO.adv_eps == 1e-4
    assert GRPO.ratio_level == "token"
    assert GRPO.surrogate == "ppo" and GRPO.eps_low == GRPO.eps_high == 0.2
    assert GRPO.aggregation == "seq_mean_token_mean"
    assert GRPO.kl == "k3" and GRPO.beta == 0.04
    assert GRPO.uses_kl
    assert not GRPO.dynamic_sampling and not GRPO.overlong_filter and GRPO.overlong_cache_len is None
    assert PRESETS["GRPO"] is GRPO


def test_dapo_preset_is_the_papers_final_recipe():
    # DAPO (arXiv 2503.14476): clip-higher Eq. 10 / §4.1, token-level loss Eq. 12, no KL (§2.3),
    # z-score advantages with the std kept (Eq. 9), dynamic sampling Eq. 11, overlong filtering and
    # soft overlong punishment (§3.4, Eq. 13; L_cache sized for the arithmetic task's budget of 32)
    assert DAPO.name == "DAPO" and PRESETS["DAPO"] is DAPO
    # PRESETS lists every preset the module exports (RPT_HYBRID, an ablation that is not a paper's method, aside)
    import grpo_lab.algo.algorithms as algorithms_module

    exported = {k for k in algorithms_module.__all__ if isinstance(getattr(algorithms_module, k), Algorithm)}
    assert set(PRESETS) == exported - {"RPT_HYBRID"}
    assert {"GRPO", "DR_GRPO", "DAPO", "GSPO", "GSPO_TOKEN", "CISPO", "PPO", "VAPO", "RPT"} <= set(PRESETS)
    assert DAPO.eps_low == 0.2 and DAPO.eps_high == 0.28
    assert DAPO.aggregation == "group_token_mean"  # Eq. 12 as written: per group
    assert DAPO.kl is None and DAPO.beta == 0.0 and not DAPO.uses_kl
    assert DAPO.advantage == "group" and DAPO.ratio_level == "token" and DAPO.surrogate == "ppo"
    assert DAPO.dynamic_sampling and DAPO.overlong_filter and DAPO.overlong_cache_frac == 0.2 and DAPO.overlong_cache_len is None
    ax = DAPO.axes()
    assert ax["kl"] is None and ax["dynamic_sampling"] and ax["overlong_cache_frac"] == 0.2
    assert get_algorithm("dapo") is DAPO


def test_defaults_are_valid_and_frozen():
    a = Algorithm()
    assert a.name == "custom"
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.beta = 0.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(advantage="vtrace"), "unknown advantage"),
        (dict(advantage="GROUP"), "unknown advantage"),
        (dict(ratio_level="sequence_geometric"), "unknown ratio_level"),
        (dict(surrogate="nope"), "unknown surrogate"),
        (dict(surrogate="is_weight"), "is_weight. was renamed .cispo."),
        (dict(aggregation="seq_mean"), "unknown aggregation"),
        (dict(kl="k4"), "unknown kl"),
        (dict(kl="none"), "unknown kl"),
        (dict(eps_low=-0.1), "eps_low"),
        (dict(eps_low=1.5), "eps_low"),
        (dict(eps_low=float("nan")), "eps_low"),
        (dict(eps_high=-0.01), "eps_high"),
        (dict(eps_high=float("inf")), "eps_high"),
        (dict(beta=-1.0), "beta"),
        (dict(beta="0.1"), "beta"),
        (dict(adv_eps=-1e-6), "adv_eps"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=12.5), "max_tokens"),
        (dict(max_tokens=True), "max_tokens"),
        (dict(name=""), "name"),
        (dict(dynamic_sampling=1), "dynamic_sampling"),
        (dict(overlong_filter="yes"), "overlong_filter"),
        (dict(overlong_cache_len=0), "overlong_cache_len"),
        (dict(overlong_cache_len=2.5), "overlong_cache_len"),
        (dict(overlong_cache_len=True), "overlong_cache_len"),
    ],
)
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Algorithm(**kwargs)


def test_every_listed_choice_is_accepted():
    for a in ADVANTAGE_NAMES:
        Algorithm(advantage=a)
    for r in RATIO_LEVEL_NAMES:
        Algorithm(ratio_level=r)
    for g in AGGREGATION_NAMES:
        Algorithm(aggregation=g, max_tokens=16)
    for k in KL_ESTIMATOR_NAMES:
        Algorithm(kl=k)
    Algorithm(eps_low=0.0, eps_high=0.0, beta=0.0)
    Algorithm(eps_low=1.0, eps_high=10.0)


def test_replace_revalidates():
    assert GRPO.replace(beta=0.0).beta == 0.0
    assert not GRPO.replace(beta=0.0).uses_kl
    assert not GRPO.replace(kl=None).uses_kl
    with pytest.raises(ValueError):
        GRPO.replace(eps_high=-1)


def test_advantages_dispatch():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 1.0, 1.0])
    G = 4
    torch.testing.assert_close(Algorithm(advantage="group").advantages(r, G), adv.group_advantages(r, G))
    torch.testing.assert_close(
        Algorithm(advantage="group", adv_eps=0.0).advantages(r, G), adv.group_advantages(r, G, eps=0.0)
    )
    torch.testing.assert_close(
        Algorithm(advantage="group_mean").advantages(r, G), adv.group_advantages(r, G, scale="none")
    )
    torch.testing.assert_close(Algorithm(advantage="batch").advantages(r, G), adv.group_advantages(r, G, scale="batch"))
    torch.testing.assert_close(Algorithm(advantage="rloo").advantages(r, G), adv.rloo_advantages(r, G))
    with pytest.raises(ValueError, match="divide"):
        GRPO.advantages(r, 3)


def test_axes_and_describe():
    ax = GRPO.axes()
    assert list(ax) == ["advantage", "ratio_level", "keep_sampling_mask", "surrogate", "eps_low", "eps_high", "aggregation", "kl", "beta",
                        "kl_importance_correction", "dynamic_sampling", "overlong_filter", "overlong_cache_len",
                        "overlong_cache_frac",
                        "offpolicy_mask_delta", "mask_eps_low", "mask_eps_high", "gamma", "lam", "lam_alpha",
                        "critic_lam", "value_clip_eps", "nll_coef", "ntp_coef", "mismatch"]
    assert ax["kl_importance_correction"] is False and ax["offpolicy_mask_delta"] is None
    assert ax["mask_eps_low"] is None and ax["mask_eps_high"] is None
    assert ax["kl"] == "k3" and ax["beta"] == 0.04
    # no KL term -> the table shows None / 0 whatever the unused field holds
    ax0 = GRPO.replace(beta=0.0).axes()
    assert ax0["kl"] is None and ax0["beta"] == 0.0
    d = GRPO.describe()
    assert d["name"] == "GRPO" and set(d) == {f.name for f in dataclasses.fields(Algorithm)}
    json.dumps(d)  # serialisable for provenance


def test_get_algorithm():
    assert get_algorithm("GRPO") is GRPO
    assert get_algorithm("grpo") is GRPO
    assert get_algorithm(" Grpo ") is GRPO
    assert get_algorithm(GRPO) is GRPO
    with pytest.raises(ValueError, match="known presets: " + re.escape(str(sorted(PRESETS)))):
        get_algorithm("dapo-v2")
    with pytest.raises(ValueError, match="unknown algorithm"):
        get_algorithm(3)


def test_hashable_and_comparable():
    assert GRPO == GRPO.replace()
    assert len({GRPO, GRPO.replace(), Algorithm()}) == 2


# ------------------------------------------------------------------------------------------------
# registries: one per axis, checked at construction, open to functions registered from outside
# ------------------------------------------------------------------------------------------------
def test_the_choice_names_are_live_views_of_the_registries(monkeypatch):
    from grpo_lab.algo import objectives as obj

    assert list(ADVANTAGE_NAMES) == list(adv.ADVANTAGE_ESTIMATORS) == ["group", "group_mean", "batch", "rloo", "gae"]
    assert list(RATIO_LEVEL_NAMES) == list(obj.RATIOS) == ["token", "sequence", "sequence_token"]
    assert list(AGGREGATION_NAMES) == list(obj.AGGREGATIONS)
    assert list(SURROGATE_NAMES) == list(obj.SURROGATES) == ["ppo", "cispo", "gmpo", "sapo", "kl_cov", "clip_cov"]
    assert list(KL_ESTIMATOR_NAMES) == ["k1", "k2", "k3"]
    monkeypatch.setitem(obj.KL_ESTIMATORS, "k_abs", lambda d: d.abs())
    assert "k_abs" in KL_ESTIMATOR_NAMES
    assert Algorithm(kl="k_abs").kl == "k_abs"
    assert Algorithm(kl=None).kl is None  # no KL term is always a choice


def test_registered_choices_are_valid_and_used(monkeypatch):
    calls = []

    def halved(batch):
        calls.append(batch.group_size)
        return adv.group_advantages(batch.rewards, batch.group_size, scale="none") / 2

    with pytest.raises(ValueError, match="unknown advantage 'halved'"):
        Algorithm(advantage="halved")
    monkeypatch.setitem(adv.ADVANTAGE_ESTIMATORS, "halved", halved)
    algo = GRPO.replace(advantage="halved")
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    torch.testing.assert_close(algo.advantages(r, 3), adv.group_advantages(r, 3, scale="none") / 2)
    assert calls == [3]


def test_a_registry_function_of_the_removed_form_is_refused_when_the_algorithm_is_built(monkeypatch):
    # the form that took the whole algorithm positionally, fn(batch, algo) / fn(log_ratio, advantages, mask, algo)
    from grpo_lab.algo import objectives as obj

    monkeypatch.setitem(adv.ADVANTAGE_ESTIMATORS, "old", lambda batch, algo: batch.rewards)
    with pytest.raises(ValueError, match=r"advantage='old' .*positional parameters \['batch', 'algo'\].*\(batch\)"):
        GRPO.replace(advantage="old")
    monkeypatch.setitem(obj.SURROGATES, "old", lambda log_ratio, advantages, mask, algo: None)
    with pytest.raises(ValueError, match=r"surrogate='old' .*takes \(ctx\)"):
        GRPO.replace(surrogate="old")
    monkeypatch.setitem(obj.SURROGATES, "new", lambda ctx, *, k=1.0: None)  # the current form is accepted
    assert GRPO.replace(surrogate="new").params == {"k": 1.0}


def test_estimate_advantages_dispatches_through_the_registry():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 1.0, 1.0])
    batch = adv.AdvantageBatch.from_groups(r, 4, mask=torch.ones(8, 3))
    for name in ADVANTAGE_NAMES:
        if name in adv.VALUE_BASELINE_ESTIMATORS:  # needs a critic's values: tested in test_vapo.py
            with pytest.raises(ValueError, match="values"):
                Algorithm(advantage=name).estimate_advantages(batch)
            continue
        algo = Algorithm(advantage=name, adv_eps=1e-3)
        got = algo.estimate_advantages(batch)
        fn = adv.ADVANTAGE_ESTIMATORS[name]
        assert torch.equal(got, fn(batch, **algo.values_for(fn)))
        assert torch.equal(got, algo.advantages(r, 4)) and got.dtype == torch.float32
    with pytest.raises(ValueError, match="AdvantageBatch"):
        GRPO.estimate_advantages(r)
    # an empty batch has no groups: empty advantages under every estimator
    for name in set(ADVANTAGE_NAMES) - adv.VALUE_BASELINE_ESTIMATORS:
        assert Algorithm(advantage=name).advantages(torch.zeros(0), 4).shape == (0,)


def test_presets_state_only_what_differs_from_grpo():
    from grpo_lab.algo.algorithms import DR_GRPO, deepseek_v32

    assert DAPO == GRPO.replace(name="DAPO", eps_high=0.28, aggregation="group_token_mean", kl=None, beta=0.0,
                                dynamic_sampling=True, overlong_filter=True, overlong_cache_frac=0.2)
    assert DR_GRPO == GRPO.replace(name="DR_GRPO", advantage="group_mean", aggregation="seq_mean_token_sum_norm",
                                   kl=None, beta=0.0)
    v32 = deepseek_v32(beta=0.1, delta=0.5, eps=0.3)
    assert v32.describe() == {**GRPO.describe(), "name": "DeepSeek-V3.2", "advantage": "group_mean",
                              "eps_low": 0.3, "eps_high": 0.3, "beta": 0.1, "kl_importance_correction": True,
                              "offpolicy_mask_delta": 0.5, "keep_sampling_mask": True}


def test_numpy_hyperparameters_are_stored_as_python_numbers():
    # found by a fresh user: np.float32 eps_high was stored as is, and JSON provenance failed after the run
    import json

    import numpy as np

    algo = GRPO.replace(eps_high=np.float32(0.28), beta=np.float64(0.01), max_tokens=np.int64(32))
    assert type(algo.eps_high) is float and type(algo.beta) is float and type(algo.max_tokens) is int
    assert json.loads(json.dumps(algo.describe()))["max_tokens"] == 32
    assert GRPO.replace(beta=0) == GRPO.replace(beta=0.0)


def test_estimator_output_is_checked(monkeypatch):
    # found by a fresh user: a custom estimator's wrong shape or NaN passed silently
    from grpo_lab.algo.advantages import ADVANTAGE_ESTIMATORS, AdvantageBatch

    batch = AdvantageBatch.from_groups(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2, mask=torch.ones(4, 3))
    for name, out, match in [("short", lambda b: torch.zeros(3), "shape"),
                             ("list", lambda b: [0.0] * 4, "float tensor"),
                             ("nan", lambda b: torch.full((4,), float("nan")), "NaN")]:
        monkeypatch.setitem(ADVANTAGE_ESTIMATORS, name, out)
        with pytest.raises(ValueError, match=match):
            GRPO.replace(advantage=name).estimate_advantages(batch)
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "per_token", lambda b: torch.ones(4, 3))
    assert GRPO.replace(advantage="per_token").estimate_advantages(batch).shape == (4, 3)


def test_functions_are_the_registry_entries_the_algorithm_calls():
    from grpo_lab.algo.advantages import ADVANTAGE_ESTIMATORS
    from grpo_lab.algo.algorithms import DAPO, GRPO
    from grpo_lab.algo.objectives import KL_ESTIMATORS, SURROGATES
    from grpo_lab.algo.selection import SELECTORS

    f = GRPO.functions()
    assert f["ADVANTAGE_ESTIMATORS['group']"] is ADVANTAGE_ESTIMATORS["group"]
    assert f["SURROGATES['ppo']"] is SURROGATES["ppo"] and f["KL_ESTIMATORS['k3']"] is KL_ESTIMATORS["k3"]
    assert f["SELECTORS['all']"] is SELECTORS["all"]
    d = DAPO.functions()  # no KL term, dynamic sampling
    assert not any(k.startswith("KL_ESTIMATORS") for k in d) and d["SELECTORS['mixed_accuracy']"] is not None
