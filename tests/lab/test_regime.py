"""The book's regime rules (grpo_lab.lab.regime): the statistic by hand, and the intro states the same numbers."""

import re

import pandas as pd
import pytest

from grpo_lab.lab import regime
from grpo_lab.paths import REPO_ROOT


def _history():
    # two seeds x 4 steps, plus an evaluation row (NaN share) that must be ignored; two minibatches at step 4
    rows = [dict(seed=s, step=t, clip_frac=v) for s, vals in ((0, [0.0, 0.1, 0.01, 0.02]), (1, [0.0, 0.0, 0.0, 0.004]))
            for t, v in zip(range(1, 5), vals)]
    rows += [dict(seed=0, step=4, clip_frac=0.04), dict(seed=0, step=0, clip_frac=float("nan"))]
    return pd.DataFrame(rows)


def test_late_mean_is_the_second_half_by_hand():
    late = regime.late_mean(_history(), "clip_frac")
    # by hand: steps 3 and 4 (> 4 / 2); seed 0: step 3 = 0.01, step 4 = mean(0.02, 0.04) = 0.03 -> 0.02;
    # seed 1: (0.0 + 0.004) / 2 = 0.002; the large early 0.1 of seed 0 does not count
    assert late.to_dict() == pytest.approx({0: 0.02, 1: 0.002}, abs=1e-15)
    acts, iv = regime.clip_acts(late)
    assert acts and iv.mean == pytest.approx(0.011)  # mean 1.1% >= 0.5%
    assert not regime.clip_acts([0.004, 0.0049])[0]


def test_late_mean_errors_name_the_problem():
    with pytest.raises(KeyError, match="no column 'zero_grad_frac'"):
        regime.late_mean(_history(), "zero_grad_frac")
    with pytest.raises(ValueError, match="no training row"):
        regime.late_mean(_history().assign(clip_frac=float("nan")), "clip_frac")


def test_the_intro_states_the_rule_of_the_code():
    intro = (REPO_ROOT / "book" / "intro.md").read_text()
    section = intro[intro.index("## Regime rules"):intro.index("## Running the book")]
    assert f"**{regime.CLIP_ACTS:.1%}**" in section and "**second half**" in section
    assert re.search(r"grpo_lab\.lab\.regime", section)


def _steps(**cols):
    """Two seeds x 4 training steps (+ a step-0 evaluation row without the columns)."""
    rows = [dict(seed=s, step=t, **{k: v[s][t - 1] for k, v in cols.items()}) for s in (0, 1) for t in range(1, 5)]
    return pd.DataFrame(rows + [dict(seed=0, step=0)])


def test_rule_windows_by_hand():
    h = _steps(turns_mean={0: [1, 2, 3, 4], 1: [2, 2, 2, 2]}, length={0: [10, 20, 30, 40], 1: [5, 5, 5, 5]})
    # by hand: run window = mean of steps 1-4, last = step 4 only
    assert regime.rule_statistic(regime.RULES["turns"], h).to_dict() == {0: 2.5, 1: 2.0}
    assert regime.rule_statistic(regime.RULES["long_responses"], h).to_dict() == {0: 40.0, 1: 5.0}
    late = regime.Rule("x", "x acts", "turns_mean", "late", 1.0, "turns", "p", "w")
    assert regime.rule_statistic(late, h).to_dict() == {0: 3.5, 1: 2.0}  # steps 3, 4


def test_length_spread_by_hand():
    h = _steps(length={0: [10, 10, 10, 10], 1: [20, 20, 20, 20]}, length_min={0: [5] * 4, 1: [20] * 4},
               length_max={0: [25] * 4, 1: [20] * 4})
    # seed 0: (25 - 5) / 10 = 2.0; seed 1: 0 / 20 = 0 -> mean 1.0, exactly the threshold: holds
    c = regime.check_rule("length_spread", h)
    assert c["per_seed"] == {0: 2.0, 1: 0.0} and c["measured"] == 1.0 and c["holds"]


def test_check_rule_holds_fails_and_names_the_problem():
    h = _steps(observation_token_frac={0: [0.05] * 4, 1: [0.12] * 4}, clip_frac_high={0: [0.0] * 4, 1: [0.02] * 4})
    c = regime.check_rule("observation_share", h)  # mean 0.085 < 0.10
    assert not c["holds"] and c["reason"].startswith("not: observation_token_frac 8.50%")
    assert regime.check_rule("clip_acts", h, "clip_frac_high")["holds"]  # late mean 1% >= 0.5%
    routing = regime.check_rule("routing_changes", _steps(routing_change_frac={0: [float("nan")] * 4,
                                                                             1: [float("nan")] * 4}))
    assert not routing["holds"] and "not recorded" in routing["reason"]
    with pytest.raises(ValueError, match="give the column"):
        regime.check_rule("clip_acts", h)
    with pytest.raises(KeyError, match="unknown regime rule 'nope'"):
        regime.check_rule("nope", h)
    with pytest.raises(KeyError, match="no column 'length_max' \\(needed for 'length_spread'\\)"):
        regime.check_rule("length_spread", h)
    with pytest.raises(KeyError, match="no column 'truncation_rate'"):
        regime.check_rule("truncation", h)


def test_every_rule_says_its_paper_value_and_why_and_the_intro_lists_it():
    intro = (REPO_ROOT / "book" / "intro.md").read_text()
    section = intro[intro.index("## Regime rules"):intro.index("## Running the book")]
    for name, r in regime.RULES.items():
        assert r.name == name and r.paper and r.why and r.threshold > 0 and r.window in ("late", "run", "last")
        assert r.column == "" or r.column in regime.DERIVED or re.fullmatch(r"[a-z_]+", r.column)
        assert f"`{name}`" in section, f"the intro's regime rules do not list {name}"


def test_proxy_hacked_by_hand():
    # evaluation rows at steps 4, 8, 12, 16 (the dialogue scenario's); late window: steps 12 and 16
    rows = [dict(seed=s, step=t, test_proxy_gold_gap=g) for s, gaps in ((0, [0.0, 0.02, 0.1, 0.3]),
                                                                       (1, [0.0, 0.0, 0.01, 0.03]))
            for t, g in zip((4, 8, 12, 16), gaps)]
    h = pd.DataFrame(rows + [dict(seed=0, step=0, test_proxy_gold_gap=-0.01)])
    c = regime.check_rule("proxy_hacked", h)
    # by hand: seed 0 (0.1 + 0.3) / 2 = 0.2, seed 1 (0.01 + 0.03) / 2 = 0.02; mean 0.11 >= 0.05
    assert c["per_seed"] == pytest.approx({0: 0.2, 1: 0.02}) and c["measured"] == pytest.approx(0.11) and c["holds"]
    assert c["reason"] == "the learned reward is over-optimised: test_proxy_gold_gap +0.110 against >= +0.050"
    h.loc[h["seed"] == 0, "test_proxy_gold_gap"] = 0.0
    c = regime.check_rule("proxy_hacked", h)  # mean (0 + 0.02) / 2 = 0.01 < 0.05
    assert not c["holds"] and c["reason"].startswith("not: test_proxy_gold_gap +0.010")


def test_critic_fits_either_side_of_its_threshold():
    # late window of 4 steps: steps 3, 4. By hand: seed 0 (0.1 + 0.2) / 2 = 0.15, seed 1 (0.0 + 0.1) / 2 = 0.05;
    # mean 0.10, exactly the threshold: holds; a critic one hundredth worse on seed 1 does not
    ev = {0: [0.9, 0.9, 0.1, 0.2], 1: [0.5, 0.5, 0.0, 0.1]}
    c = regime.check_rule("critic_fits", _steps(explained_variance_mc=ev))
    assert c["per_seed"] == pytest.approx({0: 0.15, 1: 0.05}) and c["holds"]
    ev[1] = [0.5, 0.5, 0.0, 0.08]
    c = regime.check_rule("critic_fits", _steps(explained_variance_mc=ev))
    assert not c["holds"] and c["reason"].startswith("not: explained_variance_mc 9.50%")
