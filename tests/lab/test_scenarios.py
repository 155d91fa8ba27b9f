"""Scenario benchmarks (grpo_lab.lab.scenarios): endpoints, Bonferroni comparisons, the smallest detectable
difference and the four verdicts by hand on synthetic histories; the committed results read back into the tables."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from grpo_lab.algo.algorithms import DAPO, GRPO
from grpo_lab.experiments.profiles import PROFILES
from grpo_lab.lab import scenarios
from grpo_lab.lab.scenarios import Mechanism, Scenario


def _history(acc_by_seed: dict, obs=0.2, turns=2.0, clip=0.0):
    """Evaluations at steps 0, 5, 10 (accuracies given per seed for 5 and 10) and 10 training steps."""
    rows = []
    for seed, (a5, a10) in acc_by_seed.items():
        rows += [dict(seed=seed, step=0, test_accuracy=0.1), dict(seed=seed, step=5, test_accuracy=a5),
                 dict(seed=seed, step=10, test_accuracy=a10)]
        rows += [dict(seed=seed, step=t, observation_token_frac=obs, turns_mean=turns, clip_frac_high=clip,
                      length=20.0, length_min=5.0, length_max=40.0, step_seconds=1.5, peak_mem_mb=700.0)
                 for t in range(1, 11)]
    return pd.DataFrame(rows)


def _scenario(**kw):
    mech = (Mechanism("token-level loss", "B", "A", (("observation_share", ""), ("turns", ""), ("length_spread", ""))
                      , "B beats A"),
            Mechanism("clip-higher", "B", "A", (("clip_acts", "clip_frac_high"),), "B beats A", "with more"))
    return Scenario("toy", ("Task type?", "toy"), "B", PROFILES["cpu"], (("A", GRPO), ("B", DAPO)), "A", mech, **kw)


def test_endpoints_by_hand():
    e = scenarios.endpoints(_history({0: (0.5, 0.3), 1: (0.2, 0.6)}))
    # by hand: the step-0 row never counts; curve mean = mean of steps 5 and 10; final = step 10; best = max
    assert e.loc[0].tolist() == pytest.approx([0.4, 0.3, 0.5]) and e.loc[1].tolist() == pytest.approx([0.4, 0.6, 0.6])
    with pytest.raises(ValueError, match="no test evaluation after step 0"):
        scenarios.endpoints(pd.DataFrame([dict(seed=0, step=0, test_accuracy=0.5)]))


def test_smallest_detectable_by_hand():
    d = [0.01, -0.02, 0.03, 0.0, 0.04]
    sd = np.std(d, ddof=1)
    # by hand, t tables: t_{0.975, 4} = 2.7764, t_{0.8, 4} = 0.9410
    assert scenarios.smallest_detectable(d, 0.95) == pytest.approx((2.7764 + 0.9410) * sd / math.sqrt(5), rel=1e-4)
    with pytest.raises(ValueError):
        scenarios.smallest_detectable([0.1], 0.95)


def _comparison(lo, hi):
    return {"mean": (lo + hi) / 2, "lo": lo, "hi": hi, "smallest_detectable": 0.07, "level": 0.975}


@pytest.mark.parametrize("lo,hi,verdict", [(0.01, 0.2, "supported"), (-0.2, -0.01, "contradicted"),
                                           (-0.1, 0.1, "not separated")])
def test_the_four_verdicts(lo, hi, verdict):
    mech = _scenario().mechanisms[0]
    ok = [{"holds": True, "reason": "x acts: fine"}]
    v = scenarios.mechanism_verdict(mech, ok, _comparison(lo, hi))
    assert v["verdict"] == verdict and ("0.070" in v["reason"]) == (verdict == "not separated")
    v = scenarios.mechanism_verdict(mech, ok + [{"holds": False, "reason": "not: turns 1.0 turns"}], _comparison(lo, hi))
    assert v["verdict"] == "not tested in the paper's regime" and v["reason"].startswith("not: turns 1.0 turns (measured anyway: B - A")
    joint = scenarios.mechanism_verdict(_scenario().mechanisms[1], ok, _comparison(lo, hi))
    assert "does not isolate this switch" in joint["reason"]


def test_analyse_pairs_bonferroni_and_verdicts():
    sc = _scenario()
    a = _history({s: (0.3, 0.4) for s in range(5)})
    b = _history({s: (0.3 + 0.01 * s, 0.6) for s in range(5)}, clip=0.001)
    sweep = {"A": {lr: a for lr in sc.lrs}, "B": {lr: b for lr in sc.lrs}}
    res = scenarios.analyse(sc, sweep, {"A": 1e-4, "B": 3e-4}, {"A": a, "B": b}, {"sweep": 1.0, "comparison": 2.0})
    json.dumps(res)  # JSON-able
    (c,) = res["comparisons"]  # one pair (B vs A): both mechanisms share it, m = 1
    # by hand: B's curve means 0.45 + 0.005 s, A's 0.35 -> differences 0.10 + 0.005 s, mean 0.11
    assert c["m"] == 1 and c["level"] == 0.95 and c["mean"] == pytest.approx(0.11) and c["lo"] > 0
    token, clip = res["verdicts"]
    assert token["verdict"] == "supported"  # obs 20% >= 10%, 2 turns >= 1.5, spread (40 - 5) / 20 = 1.75 >= 1
    assert clip["verdict"] == "not tested in the paper's regime"  # 0.1% < 0.5%
    assert res["arms"]["B"]["lr"] == 3e-4 and res["arms"]["A"]["step_seconds"] == 1.5
    t = scenarios.scenario_table(res)
    assert t.loc["B", "minus A (Bonferroni)"] == "+0.110 [" + f"{c['lo']:+.3f}, {c['hi']:+.3f}]"
    assert list(scenarios.verdict_table(res)["verdict"]) == ["supported", "not tested in the paper's regime"]


def test_choose_lrs_takes_the_best_mean_and_the_smaller_on_ties():
    sc = _scenario()
    low, high = _history({100: (0.2, 0.2)}), _history({100: (0.5, 0.5)})
    assert scenarios.choose_lrs(sc, {"A": {1e-4: low, 3e-4: high, 1e-3: high}}) == {"A": 3e-4}


def test_scenario_checks_its_design():
    with pytest.raises(ValueError, match=r">= 5 distinct comparison seeds, got \[0, 0, 0, 0, 0\]"):
        _scenario(seeds=(0, 0, 0, 0, 0))
    with pytest.raises(ValueError, match=r">= 3 distinct learning rates"):
        _scenario(lrs=(1e-3, 1e-3, 1e-3))
    with pytest.raises(ValueError, match="metric must be an evaluation column"):
        _scenario(metric="accuracy")
    with pytest.raises(ValueError, match=">= 5 distinct comparison seeds"):
        _scenario(seeds=(0, 1, 2))
    with pytest.raises(ValueError, match="disjoint"):
        _scenario(seeds=(0, 1, 2, 3, 100))
    with pytest.raises(ValueError, match=">= 3 distinct learning rates"):
        _scenario(lrs=(1e-4, 3e-4))
    with pytest.raises(ValueError, match=r"\['C'\] are not arms"):
        Scenario("x", (), "", PROFILES["cpu"], (("A", GRPO),), "C", ())
    with pytest.raises(KeyError, match="has no arm 'Z'"):
        _scenario().arm("Z")


def test_run_scenario_sweeps_then_compares_at_the_chosen_rates(monkeypatch):
    sc, calls = _scenario(), []

    def fake_grid(sc_, pairs, seeds, n_jobs, cache, steps):
        calls.append((list(pairs), list(seeds)))
        good = {("A", 3e-4), ("B", 1e-3)}
        return {p: _history({s: (0.5, 0.5) if p in good else (0.1, 0.2) for s in seeds}) for p in pairs}, 1.0

    monkeypatch.setattr(scenarios, "_grid", fake_grid)
    res = scenarios.run_scenario(sc)
    assert calls[0] == ([(a, lr) for a in ("A", "B") for lr in sc.lrs], [100, 101, 102])
    assert calls[1] == ([("A", 3e-4), ("B", 1e-3)], [0, 1, 2, 3, 4]) and res["quick"] is None
    assert res["chosen_lr"] == {"A": 3e-4, "B": 1e-3} and set(res["sweep"]["A"]) == {"0.0001", "0.0003", "0.001"}


def test_an_arm_carries_trainer_overrides_into_its_runs(monkeypatch):
    """An arm may be (label, Algorithm, TrainerConfig overrides): each of its runs gets them with the sweep's rate;
    the other arms get only the rate."""
    import grpo_lab.experiments.runs as runs_mod

    sc = Scenario("toy", ("Q?", "toy"), "B", PROFILES["cpu"], (("A", GRPO), ("B", GRPO, {"routing_replay": True})),
                  "A", ())
    assert sc.arms[0] == ("A", GRPO, {}) and sc.overrides("B") == {"routing_replay": True} and sc.arm("B") is GRPO
    seen = {}

    def fake_run_grid(algos, *, overrides, **kw):
        seen.update(overrides)
        return {a.name: type("R", (), {"history": None})() for a in algos}

    monkeypatch.setattr(runs_mod, "run_grid", fake_run_grid)
    scenarios._grid(sc, [("A", 1e-4), ("B", 3e-4)], [0], 1, False, 1)
    assert seen == {"A @ lr=0.0001": {"lr": 1e-4}, "B @ lr=0.0003": {"routing_replay": True, "lr": 3e-4}}
    with pytest.raises(ValueError, match="not TrainerConfig fields"):
        Scenario("x", (), "", PROFILES["cpu"], (("A", GRPO, {"replay": True}),), "A", ())
    with pytest.raises(ValueError, match="the sweep's"):
        Scenario("x", (), "", PROFILES["cpu"], (("A", GRPO, {"lr": 1e-3}),), "A", ())
    with pytest.raises(ValueError, match="an arm is"):
        Scenario("x", (), "", PROFILES["cpu"], (("A", "GRPO"),), "A", ())


def test_the_moe_scenario_compares_routing_replay_and_gspo_on_the_moe_base():
    from grpo_lab.algo.algorithms import DR_GRPO, GSPO

    sc = scenarios.SCENARIOS["long_cot_moe"]
    assert sc.profile.base == "arithmetic-moe-base" and sc.profile.config.minibatches == 4  # GSPO §5.1: 4 minibatches
    assert sc.lrs == (3e-5, 1e-4, 3e-4) and sc.profile.steps == scenarios.MOE_STEPS
    assert [label for label, *_ in sc.arms] == ["GRPO", "GRPO + Routing Replay", "GSPO", "GSPO, Dr.GRPO advantage"]
    assert sc.overrides("GRPO + Routing Replay") == {"routing_replay": True} and sc.arm("GRPO + Routing Replay") == GRPO
    dra = sc.arm("GSPO, Dr.GRPO advantage")
    assert dra.advantage == DR_GRPO.advantage == "group_mean" and dra.replace(name="GSPO", advantage="group") == GSPO
    assert all(r == "routing_changes" for m in sc.mechanisms[:3] for r, _ in m.rules[:1])
    # 3 arms against GRPO, GSPO against Routing Replay and the advantage ablation: 5 Bonferroni pairs
    assert len(scenarios._pairs(sc)) == 5

def test_the_dialogue_scenario_reads_the_gold_reward():
    sc = scenarios.SCENARIOS["dialogue"]
    assert sc.metric == "test_gold_mean" and sc.reference == "GRPO" and sc.profile.task == "dialogue"
    assert {label for label, *_ in sc.arms} == {"GRPO", "PPO", "Dr.GRPO"}
    assert all(("proxy_hacked", "") in m.rules for m in sc.mechanisms)
    h = _history({0: (0.5, 0.3)}).rename(columns={"test_accuracy": "test_gold_mean"})
    # by hand: as test_endpoints_by_hand, on the gold column
    assert scenarios.endpoints(h, sc.metric).loc[0].tolist() == pytest.approx([0.4, 0.3, 0.5])
    with pytest.raises(KeyError, match="no column 'test_accuracy'"):
        scenarios.endpoints(h)


def test_every_scenario_builds_and_the_long_cot_ones_name_the_issues_arms():
    built = {name: scenarios.SCENARIOS[name] for name in scenarios.SCENARIOS}
    assert set(built) == {"tool_calls", "long_cot_dense", "long_cot_moe", "long_cot_stability", "dialogue"}
    labels = {name: [label for label, *_ in sc.arms] for name, sc in built.items()}
    # issue 55's arms: long-CoT dense GRPO, Dr.GRPO, DAPO, VAPO, CISPO, GSPO; extreme stability DAPO, CISPO, GRPO at 16
    assert set(labels["long_cot_dense"]) == {"GRPO", "Dr.GRPO", "DAPO", "VAPO", "CISPO", "GSPO"}
    assert set(labels["long_cot_stability"]) == {"GRPO", "DAPO", "CISPO"}
    assert built["long_cot_stability"].profile.config.minibatches == 16
    assert all(sc.branch[0] == "Task type?" for sc in built.values())
    with pytest.raises(KeyError, match="unknown scenario 'nope'"):
        scenarios.SCENARIOS["nope"]


def test_equal_differences_on_every_seed_are_not_separated_and_tables_refuse_a_name():
    # by hand: both arms tie on every seed -> differences all 0, no spread: no detectable difference is defined
    sc = _scenario()
    a = _history({s: (0.3, 0.4) for s in range(5)})
    res = scenarios.analyse(sc, {"A": {lr: a for lr in sc.lrs}, "B": {lr: a for lr in sc.lrs}}, {"A": 1e-4, "B": 1e-4},
                            {"A": a, "B": a}, {"sweep": 1.0, "comparison": 1.0})
    (c,) = res["comparisons"]
    assert c["smallest_detectable"] is None and (c["lo"], c["hi"]) == (0.0, 0.0)
    token = res["verdicts"][0]
    assert token["verdict"] == "not separated" and "every seed's difference is the same" in token["reason"]
    clip = res["verdicts"][1]  # not tested: the comparison is still reported
    assert clip["verdict"] == "not tested in the paper's regime" and "measured anyway: B - A +0.000" in clip["reason"]
    with pytest.raises(ValueError, match="no spread"):
        scenarios.smallest_detectable([0.1, 0.1, 0.1], 0.95)
    for table in (scenarios.scenario_table, scenarios.verdict_table):
        with pytest.raises(TypeError, match="load_scenario"):
            table("tool_calls")
