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
