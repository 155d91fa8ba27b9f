"""benchmarks/choosing.py (chapter 8's one comparison under one budget): the compute charge, tokens to a target and
accuracy at matched compute on a hand-made history (hand goldens), the regime rules chapter 8 reports on hand-made
histories either side of each threshold, and a quick look whose file holds every stated column, whose intervals
recompute from its per-seed values and whose critic preset is charged its critic."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from _benchmarks import benchmark_module
from grpo_lab.experiments import stats



@pytest.fixture(scope="module")
def bench():
    with benchmark_module("choosing.py", "benchmark_choosing") as module:
        yield module


def _hand_history() -> pd.DataFrame:
    """One seed, G = 2: step 0 is the base's evaluation; step 3 trained nothing (dynamic sampling found no group)."""
    nan = float("nan")
    return pd.DataFrame({
        "seed": [0] * 5, "step": [0, 1, 2, 3, 4],
        "length": [nan, 3.0, 4.0, 2.0, 5.0], "generated_groups": [nan, 2, 3, 2, 2],
        "num_tokens": [nan, 5.0, 6.0, nan, 10.0], "trained_groups": [nan, 2, 2, 0, 2],
        "test_accuracy": [0.3, nan, 0.5, nan, 0.7]})


def test_compute_and_tokens_to_target_by_hand(bench):
    hist = _hand_history()
    plain = bench.step_compute(hist, group_size=2, updates=2, critic=False)
    # generated = length x groups x G: 12, 24, 8, 20; trained = num_tokens x 2 updates: 10, 12, 0, 20
    assert plain["generated_tokens"].tolist() == [12.0, 24.0, 8.0, 20.0]
    assert plain["trained_tokens"].tolist() == [10.0, 12.0, 0.0, 20.0]
    assert plain["units"].tolist() == [42.0, 60.0, 8.0, 80.0]  # generated + 3 x trained
    critic = bench.step_compute(hist, group_size=2, updates=2, critic=True)
    assert critic["units"].tolist() == [72.0, 96.0, 8.0, 140.0]  # + 3 x trained for the critic
    curve = bench.eval_curve(hist, plain, seed=0)
    assert curve["step"].tolist() == [0, 2, 4]
    assert curve["generated_tokens"].tolist() == [0.0, 36.0, 64.0]
    assert curve["units"].tolist() == [0.0, 102.0, 190.0]
    assert bench.eval_curve(hist, critic, seed=0)["units"].tolist() == [0.0, 168.0, 316.0]
    assert bench.tokens_to_target(curve, 0.5) == 36.0  # reached at step 2 exactly
    assert bench.tokens_to_target(curve, 0.6) == 64.0
    assert bench.tokens_to_target(curve, 0.2) == 0.0  # the base already meets it
    assert bench.tokens_to_target(curve, 0.8) is None  # not reached
    assert bench.median_reached([None, 10.0, 20.0]) == 20.0  # not reached counts as infinitely many tokens
    assert bench.median_reached([None, None, 10.0]) is None
    assert bench.median_reached([10.0, 30.0]) == 20.0
    assert bench.at_matched_compute(curve, 150.0) == (2, 0.5)
    assert bench.at_matched_compute(curve, 50.0) == (0, 0.3)
    started = bench.eval_curve(hist, plain, seed=0, start_units=200.0)  # a critic's pretraining before step 1
    assert started["units"].tolist() == [200.0, 302.0, 390.0]
    assert bench.at_matched_compute(started, 150.0) == (None, None)


def test_bad_arguments_are_clear(bench, tmp_path):
    with pytest.raises(SystemExit):
        bench.parse(["--presets", "GRPO", "NOPE"])
    with pytest.raises(SystemExit):
        bench.parse(["--seeds", "0"])
    with pytest.raises(SystemExit):  # a quick look must not overwrite the committed file chapter 8 reads
        bench.parse(["--seeds", "2", "--steps", "2"])
    with pytest.raises(SystemExit):
        bench.parse(["--presets", "GSPO"])
    with pytest.raises(SystemExit):  # a directory, refused before any training
        bench.parse(["--out", str(tmp_path)])
    assert bench.parse([]).out == bench.OUT  # the full run writes the committed file
    a = bench.parse(["--presets", "ppo", "RPT", "--steps", "3", "--out", str(tmp_path / "x.json")])
    assert a.presets == ["GRPO", "PPO"] and a.rpt and a.rpt_steps == 3  # GRPO added: every row's reference


def _recomputes(iv, bounds=(0.0, 1.0)):
    got = stats.t_interval(iv["per_seed"], bounds=bounds)
    assert (got.mean, got.lo, got.hi) == pytest.approx((iv["mean"], iv["lo"], iv["hi"]), abs=1e-12)


def test_quick_look_file(bench, tmp_path):
    out = tmp_path / "choosing.json"
    bench.main(["--presets", "GRPO", "PPO", "RPT", "--seeds", "2", "--steps", "2", "--n-jobs", "1", "--out", str(out)])
    d = json.loads(out.read_text())
    assert {"settings", "target", "base_accuracy", "base_binomial_se", "test_questions", "rows", "regime", "rpt",
            "run_seconds_sum", "runs_from_cache", "provenance", "compute_note", "matched_compute"} <= set(d)
    assert d["base_binomial_se"] == pytest.approx(stats.binomial_se(d["base_accuracy"], d["test_questions"]))
    rows = {r["preset"]: r for r in d["rows"]}
    assert list(rows) == ["GRPO", "PPO"]
    keys = {"final_accuracy", "minus_grpo", "tokens_to_target", "accuracy_at_matched_compute", "generated_tokens_total",
            "trained_tokens_total", "compute_units_total", "length_last_step", "entropy_last_step", "clip_frac",
            "clip_frac_high", "clip_frac_low", "grad_token_frac", "step_seconds", "peak_mem_mb", "curve", "settings"}
    for r in rows.values():
        assert keys <= set(r), keys - set(r)
        for col in ("final_accuracy", "clip_frac", "grad_token_frac"):
            _recomputes(r[col])
        _recomputes(r["compute_units_total"], (0.0, math.inf))
        assert r["tokens_to_target"]["n_seeds"] == 2
    d_ppo = stats.paired_difference(pd.Series(rows["PPO"]["final_accuracy"]["per_seed"]),
                                    pd.Series(rows["GRPO"]["final_accuracy"]["per_seed"]))
    assert rows["PPO"]["minus_grpo"]["mean"] == pytest.approx(d_ppo.mean) and rows["GRPO"]["minus_grpo"] is None
    # 13 s on 2 cores (2 presets x 2 seeds x 2 steps, RPT 2 seeds x 2 steps)
    for name, factor in (("GRPO", 3), ("PPO", 6)):  # the critic's forward + backward is charged to PPO
        r = rows[name]
        gen = np.array(r["generated_tokens_total"]["per_seed"])
        trained = np.array(r["trained_tokens_total"]["per_seed"])
        want = gen + factor * trained
        assert r["compute_units_total"]["per_seed"] == pytest.approx(want.tolist(), abs=0.2)
        if name == "PPO":  # more than GRPO would pay for the same generated and trained tokens
            assert (np.array(r["compute_units_total"]["per_seed"]) > gen + 3 * trained + 1).all()
    for name, reg in {**d["regime"], "RPT": d["rpt"]["regime"]}.items():
        assert reg["verdict"] == "in regime" or reg["verdict"].startswith("not tested in the paper's regime: ")
        assert reg["in_regime"] == all(c["holds"] for c in reg["checks"]) and reg["checks"]
        assert all({"precondition", "paper", "measured", "holds", "why"} <= set(c) for c in reg["checks"])
    rpt = d["rpt"]["row"]
    assert {"final_accuracy", "compute_units_total", "not_applicable"} <= set(rpt)
    assert "minus_grpo" in rpt["not_applicable"]
    _recomputes(rpt["final_accuracy"])


class _Run:
    """What the regime checks read of a run: its history."""

    def __init__(self, **cols):
        seeds, steps = [0, 0, 1, 1, 2, 2], [1, 2, 1, 2, 1, 2]  # three seeds, two training steps each
        self.history = pd.DataFrame({"seed": seeds, "step": steps, **{k: list(v) for k, v in cols.items()}})


def test_regime_rules_by_hand(bench):
    """The preconditions chapter 8 reports, on hand-made histories just either side of each threshold."""
    # a critic keeps pace: pretrained, the last explained variance >= half the first; fresh (0 at step 1), >= 0.1
    ev = lambda first, last: _Run(explained_variance_mc=[first, last] * 3)  # noqa: E731
    assert bench._pace(ev(0.4, 0.25))["holds"] and not bench._pace(ev(0.4, 0.15))["holds"]
    assert bench._pace(ev(0.0, 0.2))["holds"] and not bench._pace(ev(0.0, 0.03))["holds"]  # PPO's 0.03 fails
    # the covariance rules need >= 10 selected tokens per update: share x loss tokens per update
    cov = lambda share: {"KL_COV": _Run(kl_cov_selected=[share] * 6, num_tokens=[800.0] * 6),  # noqa: E731
                         "GRPO": _Run(entropy=[0.3, 0.1] * 3)}
    run = bench._regime_cov("KL_COV", "kl_cov_selected")
    low, high = run(cov(0.0015), {}), run(cov(0.02), {})  # 1.2 and 16 tokens per update
    assert [c["holds"] for c in low] == [True, False] and [c["holds"] for c in high] == [True, True]
    assert "1.2 tokens selected per update" in low[1]["why"]
    # Dr.GRPO's length bias is looked for in GRPO's runs: a gap in Dr.GRPO's runs alone does not count
    gap = _Run(length_incorrect=[12.0, 13.0, 11.0, 12.5, 12.2, 11.8], length_correct=[8.0] * 6)
    none = _Run(length_incorrect=[8.0, 9.0, 7.0, 8.5, 8.0, 7.5], length_correct=[8.0] * 6)
    probe = {"group_std_ratio": 2.0}
    assert bench._regime_dr_grpo({"GRPO": gap, "DR_GRPO": none}, probe)[0]["holds"]
    assert not bench._regime_dr_grpo({"GRPO": none, "DR_GRPO": gap}, probe)[0]["holds"]
    # DAPO's switches act only on >= 1% of groups / responses (their own threshold, SWITCH_ACTS)
    assert bench.SWITCH_ACTS == 0.01
    dapo = lambda share: {"DAPO": _Run(zero_adv_group_frac=[0.3] * 6, clip_frac_high=[0.02] * 6,  # noqa: E731
                                       truncation_rate=[share] * 6, overlong_frac_penalised=[share] * 6)}
    assert [c["holds"] for c in bench._regime_dapo(dapo(0.0001), {})] == [True, True, False, False]
    assert all(c["holds"] for c in bench._regime_dapo(dapo(0.02), {}))
    # GMPO's clip is held to the book's rule (regime.CLIP_ACTS, 0.5%, the second half of the updates)
    gmpo = lambda frac: {"GMPO": _Run(clip_frac=[frac] * 6, ratio_max=[3.0] * 6, ratio_min=[0.2] * 6)}  # noqa: E731
    assert not bench._regime_gmpo(gmpo(0.0049), {})[0]["holds"] and bench._regime_gmpo(gmpo(0.0051), {})[0]["holds"]
    # the old rule (>= 1% over all updates) is kept beside it: here it says "idle" where the book's rule says "acts"
    c = bench._regime_gmpo(gmpo(0.0051), {})[0]
    assert c["holds"] and not c["old_rule"]["holds"] and "< 1%" in c["old_rule"]["why"]


def test_clip_rule_reads_the_second_half(bench):
    """A clip check reads per seed the updates after the midpoint (steps 2 of 1-2 here), then the mean over seeds; the
    old rule read the mean over all updates against 1%; the verdict keeps both."""
    early = _Run(weight_capped_frac=[0.02, 0.0] * 3, zero_adv_group_frac=[0.3] * 6)  # binds only at step 1
    late = _Run(weight_capped_frac=[0.0, 0.008] * 3, zero_adv_group_frac=[0.3] * 6)  # 0.8% at step 2, 0.4% overall
    c_early = bench._regime_cispo({"CISPO": early}, {})[0]
    c_late = bench._regime_cispo({"CISPO": late}, {})[0]
    assert not c_early["holds"] and c_early["old_rule"]["holds"]  # the old rule's 1% run mean: 1% exactly
    assert c_late["holds"] and not c_late["old_rule"]["holds"]
    v = bench.verdict(bench._regime_cispo({"CISPO": late}, {}))
    assert v["in_regime"] and not v["old_rule"]["in_regime"] and v["old_rule"]["changed"]
    assert "IS-weight cap" in v["old_rule"]["reason"] and "< 1%" in v["old_rule"]["reason"]
    same = bench.verdict(bench._regime_cispo({"CISPO": _Run(weight_capped_frac=[0.02] * 6,
                                                           zero_adv_group_frac=[0.3] * 6)}, {}))
    assert same["in_regime"] and same["old_rule"]["in_regime"] and not same["old_rule"]["changed"]
    idle = bench.verdict(bench._regime_cispo({"CISPO": _Run(weight_capped_frac=[0.002] * 6,
                                                           zero_adv_group_frac=[0.3] * 6)}, {}))
    assert not idle["old_rule"]["changed"]  # idle by both rules: "< 1%" reworded "< 0.5%" is no change
    assert "< 0.5%" in idle["reason"] and "< 1%" in idle["old_rule"]["reason"]
    # a preset without a clip check carries no old rule
    assert "old_rule" not in bench.verdict([bench.check("x", "p", "m", True, "ok")])
    # GSPO: the tokens of responses clipped whole; the old rule asked for any response clipped
    gspo = {"GSPO": _Run(clip_frac=[0.0, 0.004] * 3, seq_clip_frac=[0.0, 0.01] * 3),
            "GRPO": _Run(clip_frac=[0.001] * 6)}
    g = bench._regime_gspo(gspo, {})[0]
    assert not g["holds"] and g["old_rule"]["holds"] and "responses clipped whole" in g["measured"]
