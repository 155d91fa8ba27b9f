"""The long-chain card (issue 55): its statistics on hand-made responses, and the shipped checkpoint's properties."""

import json

import numpy as np
import pandas as pd
import pytest

from grpo_lab.lab.long_chain_card import chain_stats, long_chain_card, point_biserial
from grpo_lab.lab.pretrain import RECIPES, make_task, sha256_file
from grpo_lab.paths import checkpoint_dir

BASE = checkpoint_dir("long-chain-base")


def test_point_biserial_golden():
    # by hand: deviations x (-1.5, -.5, .5, 1.5), y (-.5, -.5, .5, .5): cov-sum 2, norms sqrt(5) and 1
    assert point_biserial([1, 2, 3, 4], [0, 0, 1, 1]) == pytest.approx(2 / np.sqrt(5), abs=1e-12)
    assert point_biserial([1, 2, 3, 4], [True, True, False, False]) == pytest.approx(-2 / np.sqrt(5), abs=1e-12)
    assert point_biserial([1, 2, 3], [1, 1, 1]) is None and point_biserial([5, 5], [0, 1]) is None
    with pytest.raises(ValueError, match="one length"):
        point_biserial([1, 2], [0])
    with pytest.raises(ValueError, match="non-empty"):
        point_biserial([], [])


def _frame():
    # two 3-term prompts, two 4-term prompts, two responses each (worked out by hand below)
    rows = [("a", 3, True, 20, False, "careful"), ("a", 3, False, 5, False, "direct"),
            ("b", 3, True, 10, False, "hasty"), ("b", 3, True, 22, False, "careful"),
            ("c", 4, False, 40, True, "malformed"), ("c", 4, False, 6, False, "direct"),
            ("d", 4, True, 30, False, "careful"), ("d", 4, False, 12, False, "hasty")]
    return pd.DataFrame(rows, columns=["prompt", "n_terms", "correct", "length", "truncated", "thoroughness"])


def test_chain_stats_on_hand_made_responses():
    s = chain_stats(_frame(), group_size=2)
    assert s["accuracy"] == 0.5 and s["length_mean"] == pytest.approx(145 / 8, abs=1e-4)
    assert s["accuracy_by_terms"] == {3: 0.75, 4: 0.25}
    assert s["truncation_rate"] == 0.125 and s["truncation_rate_by_terms"] == {3: 0.0, 4: 0.25}
    assert s["tied_group_frac"] == 0.5 and s["all_correct_group_frac"] == 0.25 and s["all_wrong_group_frac"] == 0.25
    assert s["share_by_thoroughness"] == {"careful": 0.375, "hasty": 0.25, "direct": 0.25, "malformed": 0.125}
    assert s["accuracy_by_thoroughness"] == {"careful": 1.0, "hasty": 0.5, "direct": 0.0, "malformed": 0.0}
    # the pooled correlation against a float64 reference of Pearson's formula
    x = np.array([20, 5, 10, 22, 40, 6, 30, 12], float)
    y = np.array([1, 0, 1, 1, 0, 0, 1, 0], float)
    ref = ((x - x.mean()) * (y - y.mean())).sum() / np.sqrt(((x - x.mean()) ** 2).sum() * ((y - y.mean()) ** 2).sum())
    assert s["length_correct_corr"] == pytest.approx(ref, abs=1e-4)
    within = [point_biserial(x[:4], y[:4]), point_biserial(x[4:], y[4:])]
    assert s["length_correct_corr_within_terms"] == pytest.approx(np.mean(within), abs=1e-4)
    with pytest.raises(ValueError, match="3 responses"):
        chain_stats(_frame(), group_size=3)


@pytest.fixture(scope="module")
def record():
    return json.loads((BASE / "recipe.json").read_text())


def test_shipped_checkpoint_is_the_recipes(record):
    assert record["recipe"] == RECIPES["long-chain"].to_dict()
    assert sha256_file(BASE / "model.safetensors") == record["model_sha256"]
    assert (BASE / "model.safetensors").stat().st_size < 4 * 2**20


def test_shipped_card_has_the_issues_properties(record):
    m = record["metrics"]
    top = str(RECIPES["long-chain"].max_terms)
    assert m["sampled_length_mean_by_terms"][top] >= 100          # hundreds of tokens on the largest sums
    assert m["sampled_length_correct_corr"] > 0                    # longer responses are more often right
    assert m["sampled_length_correct_corr_within_terms"] > 0      # ... for one problem size too
    assert m["sampled_truncation_rate"] > 0                        # the budget cuts some responses
    assert 0.15 <= m["sampled_accuracy"] <= 0.65                  # room for RL (the design's 20-60% band)
    acc = m["sampled_accuracy_by_thoroughness"]
    assert acc["careful"] > max(acc["hasty"], acc["direct"])     # careful chains are the ones that pay
    assert 0.0 < m["sampled_tied_group_frac"] < 1.0 and m["sampled_entropy"] > 0


def test_card_rerun_on_the_largest_sums():
    from grpo_lab.policy.models import load_policy

    model, tok = load_policy(BASE)
    task = make_task(RECIPES["long-chain"])
    largest = [p for p in task.test_set() if p.meta["n_terms"] == task.max_terms][:12]
    card = long_chain_card(model, tok, task, largest, n_samples=8, batch_problems=12)
    assert card["problems"] == 12 and card["sampled_responses"] == 96
    assert card["sampled_length_mean"] >= 100 and card["sampled_truncation_rate"] > 0
    with pytest.raises(ValueError, match="n_samples"):
        long_chain_card(model, tok, task, largest, n_samples=1)
