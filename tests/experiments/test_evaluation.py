"""Tests for grpo_lab.experiments.evaluation (pass@k, mean@k, maj@k, evaluate_at_k) and grpo_lab.experiments.stats.wilson_interval.

References are written independently of the code: pass@k by enumerating every k-subset of the n samples
(float64), the Wilson interval from its closed form (Wilson 1927) with the normal quantile of the standard
library, and small cases by hand.
"""

import itertools
import math
import types
from statistics import NormalDist

import numpy as np
import pytest
import torch

from grpo_lab.experiments.evaluation import evaluate_at_k, maj_at_k, mean_at_k, pass_at_k
from grpo_lab.experiments.stats import wilson_interval


# ------------------------------------------------------------------------------------ pass@k
def test_pass_at_k_hand_computed():
    # 1 - C(n-c, k)/C(n, k): n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-15)
    assert pass_at_k(10, 3, 1) == 0.3 == mean_at_k(10, 3, 1)         # pass@1 = c/n, as that quotient
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5, abs=1e-15)       # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(6, 0, 3) == 0.0                                 # no correct sample
    assert pass_at_k(6, 4, 3) == 1.0 and pass_at_k(3, 1, 3) == 1.0   # n - c < k: every k-subset has one
    assert pass_at_k(100, 1, 1) == pytest.approx(0.01, abs=1e-15)
    assert isinstance(pass_at_k(5, 2, 2), float)


def _brute_force(n, c, k):
    """The fraction of the k-subsets of n samples (the first c correct) that hold a correct sample."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_the_enumeration_of_all_subsets():
    for n in range(1, 11):
        for k in range(1, n + 1):
            c = np.arange(n + 1)
            expected = np.array([_brute_force(n, int(ci), k) for ci in c])
            np.testing.assert_allclose(pass_at_k(np.full(n + 1, n), c, k), expected, rtol=1e-12, atol=1e-15)


def test_pass_at_k_is_vectorised_over_problems_with_different_n():
    n = np.array([[5, 10], [7, 5]])
    c = np.array([[2, 3], [0, 5]])
    out = pass_at_k(n, c, 2)
    assert out.shape == (2, 2) and out.dtype == np.float64
    for i, j in itertools.product(range(2), range(2)):
        assert out[i, j] == pytest.approx(_brute_force(n[i, j], c[i, j], 2), rel=1e-12)
    assert pass_at_k([10, 10], 3, 1).tolist() == pytest.approx([0.3, 0.3])  # c broadcasts
    assert pass_at_k(np.array([], dtype=int), np.array([], dtype=int), 1).shape == (0,)


def test_pass_at_k_is_stable_for_large_n():
    # C(1000, 500) overflows float64; the product does not. Reference: exact rationals.
    from fractions import Fraction
    n, c, k = 1000, 7, 500
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize("n, c, k, message", [
    (3, 1, 4, "k=4 exceeds"), (3, 4, 1, "c must be <= n"), (3, -1, 1, ">= 0"), (-3, 0, 1, ">= 0"),
    (3, 1, 0, "k must be an int >= 1"), (3, 1, True, "k must be an int"), (3, 1, 1.0, "k must be an int"),
    (3.0, 1, 1, "n must be integers"), (3, 1.5, 1, "c must be integers"), (True, 1, 1, "n must be integers"),
    ([3, 4], [1, 2, 3], 1, "same shape"),
])
def test_pass_at_k_rejects_bad_counts(n, c, k, message):
    with pytest.raises(ValueError, match=message):
        pass_at_k(n, c, k)


def test_mean_at_k_is_c_over_n():
    assert mean_at_k(10, 3, 4) == pytest.approx(0.3)
    assert mean_at_k([4, 8], [1, 8], 2).tolist() == [0.25, 1.0]
    with pytest.raises(ValueError, match="k=5 exceeds"):
        mean_at_k(4, 1, 5)


# ------------------------------------------------------------------------------------ maj@k
def test_maj_at_k_votes_and_breaks_ties_by_first_vote():
    answers = [["7", "8", "8", "7", "9"],      # 4 voters: 7 and 8 tie 2-2; 7 voted first
               ["3", "4", "4", None, "3"],     # 4 voters: 4 wins 2-1
               [None, None, None, None, "5"],  # 4 voters: nobody answers -> 0
               ["1", "2", "3", "2", "2"]]      # 4 voters: 2 wins 2-1-1
    correct = [[True, False, False, True, False],
               [False, True, True, False, False],
               [False, False, False, False, True],
               [False, True, False, True, True]]
    assert maj_at_k(answers, correct, 4).tolist() == [1.0, 1.0, 0.0, 1.0]
    assert maj_at_k(answers, correct, 1).tolist() == [1.0, 0.0, 0.0, 0.0]   # the first sample alone
    # 5 voters: the fifth vote ties 3 with 4 (3 voted first, and is wrong) and gives problem 2 its only answer
    assert maj_at_k(answers, correct, 5).tolist() == [1.0, 0.0, 1.0, 1.0]
    # reordering the tied voters moves the tie-break
    assert maj_at_k([["8", "7", "7", "8"]], [[False, True, True, False]], 4).tolist() == [0.0]


@pytest.mark.parametrize("answers, correct, k, message", [
    ([["1"]], [[True]], 0, "k must be an int"), ([["1"]], [[True], [False]], 1, "answers has 1 problems"),
    ([["1", "2"]], [[True]], 1, "problem 0 has 2 answers and 1"), ([["1"]], [[True]], 2, "n >= k=2"),
    ([[1]], [[True]], 1, "str or None, got int"),
])
def test_maj_at_k_rejects_bad_input(answers, correct, k, message):
    with pytest.raises(ValueError, match=message):
        maj_at_k(answers, correct, k)


# ---------------------------------------------------------------------------------- Wilson
def _wilson_formula(s, n, level):
    """Wilson (1927): (p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n), float64."""
    z = NormalDist().inv_cdf((1 + level) / 2)
    p = s / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


@pytest.mark.parametrize("s, n, level", [(0, 10, 0.95), (10, 10, 0.95), (3, 10, 0.95), (77, 96, 0.9),
                                         (1, 1, 0.95), (500, 1319, 0.99), (1, 2, 0.5)])
def test_wilson_interval_matches_the_closed_form(s, n, level):
    iv = wilson_interval(s, n, level)
    lo, hi = _wilson_formula(s, n, level)
    assert iv.lo == pytest.approx(lo, abs=1e-12) and iv.hi == pytest.approx(hi, abs=1e-12)
    assert iv.mean == s / n and iv.n == n and iv.level == level and 0 <= iv.lo <= iv.mean <= iv.hi <= 1


def test_wilson_interval_of_nothing_is_the_whole_range():
    iv = wilson_interval(0, 0)
    assert math.isnan(iv.mean) and (iv.lo, iv.hi, iv.n) == (0.0, 1.0, 0)


@pytest.mark.parametrize("s, n, level, message", [(3, 2, 0.95, "successes <= n"), (-1, 2, 0.95, "0 <= successes"),
                                                  (1, -1, 0.95, "successes <= n"), (1.0, 2, 0.95, "successes must be an int"),
                                                  (1, 2, 1.0, "level must be in"), (True, 2, 0.95, "must be an int")])
def test_wilson_interval_rejects_bad_input(s, n, level, message):
    with pytest.raises(ValueError, match=message):
        wilson_interval(s, n, level)


# -------------------------------------------------------------------------------- evaluate_at_k
@pytest.fixture(scope="module")
def base():
    from grpo_lab.policy.models import load_policy
    from grpo_lab.tasks import ArithmeticTask

    policy, tokenizer = load_policy("arithmetic-base")
    task = ArithmeticTask()
    return policy, tokenizer, task, task.test_set()[:6]


def test_evaluate_at_k_is_seeded_and_consistent(base):
    policy, tokenizer, task, problems = base
    before = torch.random.get_rng_state()
    kw = dict(n=4, ks=(1, 2, 4), problems=problems, max_new_tokens=24, seed=3)
    summary, per_problem, responses = evaluate_at_k(policy, tokenizer, task, **kw)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's RNG is not advanced
    again = evaluate_at_k(policy, tokenizer, task, **kw)
    assert again[0].equals(summary) and again[1].equals(per_problem) and again[2].equals(responses)
    other = evaluate_at_k(policy, tokenizer, task, **{**kw, "seed": 4})[2]
    assert list(other["completion"]) != list(responses["completion"])
    # the frames agree with each other and with the metric functions
    assert len(responses) == 24 and responses["problem"].tolist() == [i // 4 for i in range(24)]
    c = responses.groupby("problem")["correct"].sum().to_numpy()
    assert per_problem["c"].tolist() == c.tolist() and per_problem["answer"].tolist() == [p.answer for p in problems]
    assert per_problem["pass@4"].tolist() == (c > 0).astype(float).tolist()
    np.testing.assert_allclose(per_problem["pass@2"], pass_at_k(np.full(6, 4), c, 2))
    votes = responses.groupby("problem")["extracted"].agg(list).tolist()
    oks = responses.groupby("problem")["correct"].agg(list).tolist()
    assert per_problem["maj@4"].tolist() == maj_at_k(votes, oks, 4).tolist()
    assert summary.loc["pass@2", "value"] == pytest.approx(per_problem["pass@2"].mean())
    assert summary.loc["mean@4", "value"] == pytest.approx(c.sum() / 24)
    assert summary.loc["sample_accuracy", "trials"] == 24
    lo, hi = _wilson_formula(int((c > 0).sum()), 6, 0.95)
    assert (summary.loc["pass@4", "lo"], summary.loc["pass@4", "hi"]) == pytest.approx((lo, hi), abs=1e-12)
    # a Wilson interval exactly where every problem's value is 0 or 1 (a count of problems)
    for metric in ("pass@1", "pass@2", "maj@2", "mean@4"):
        assert math.isnan(summary.loc[metric, "lo"]) != per_problem[metric].isin((0.0, 1.0)).all()


def test_evaluate_at_k_extract_and_bad_arguments(base):
    policy, tokenizer, task, problems = base
    kw = dict(problems=problems[:2], max_new_tokens=8)
    summary, _, responses = evaluate_at_k(policy, tokenizer, task, n=2, extract=lambda text: "same", **kw)
    assert set(responses["extracted"]) == {"same"} and "maj@1" in summary.index
    # problem 0's samples give no answer, problem 1's do: pandas 3 stores the column as strings, where None
    # becomes NaN when grouped; the vote must still see "no answer" (maj@k 0), not a NaN it refuses
    calls = []
    summary, per_problem, responses = evaluate_at_k(
        policy, tokenizer, task, n=2, ks=(1, 2), **kw, extract=lambda text: calls.append(text) or
        (None if len(calls) <= 2 else "7"))
    assert responses["extracted"].isna().tolist() == [True, True, False, False]
    # problem 1: both samples vote "7", and the vote is scored by the first such sample's own correctness
    assert per_problem["maj@2"].tolist() == [0.0, float(responses["correct"].iloc[2])]
    no_vote = types.SimpleNamespace(**{k: getattr(task, k) for k in ("name", "max_new_tokens", "is_correct")})
    summary = evaluate_at_k(policy, tokenizer, no_vote, n=2, **kw)[0]
    assert "maj@1" not in summary.index and "pass@1" in summary.index
    for bad, message in ((dict(n=0), "n must be a positive int"), (dict(n=2, ks=(3,)), r"ks must be .* \[1, n=2\]"),
                         (dict(n=2, ks=()), "ks must be"), (dict(n=2, temperature=0.0), "temperature"),
                         (dict(n=2, extract="x"), "extract must be a callable"), (dict(n=2, seed=-1), "seed"),
                         (dict(n=2, level=1.5), "level")):
        with pytest.raises(ValueError, match=message):
            evaluate_at_k(policy, tokenizer, task, **bad, **kw)


# ------------------------------------------------------------------- the tasks' extract_answer
def test_tasks_offer_the_answer_maj_at_k_votes_on():
    from grpo_lab.tasks import ArithmeticTask, GSM8KTask, validate_task

    assert ArithmeticTask().extract_answer("8+2+8;10+8;18;#18") == "18"
    assert ArithmeticTask().extract_answer("#18#19") is None                 # malformed: no vote
    assert GSM8KTask().extract_answer(r"so \boxed{\$18}.") == r"\$18"
    assert GSM8KTask().extract_answer("no answer") is None

    class TwoArguments(ArithmeticTask):
        def extract_answer(self, completion, problem):
            return completion

    with pytest.raises(TypeError, match=r"extract_answer.*cannot be called as extract_answer\(completion\)"):
        validate_task(TwoArguments())


# ------------------------------------------------------------------- maj@k on parsed answers (issue 54)
def test_maj_at_k_votes_on_the_tasks_equivalence():
    from grpo_lab.tasks import ArithmeticTask, GSM8KTask

    pytest.importorskip("math_verify")
    answers, correct = [["18", "$18", "18.0", "20", "20"]], [[True, True, True, False, False]]
    assert maj_at_k(answers, correct, 5).tolist() == [0.0]   # as strings: 20 has two votes, each 18 one
    assert maj_at_k(answers, correct, 5, equivalent=GSM8KTask().answers_equivalent).tolist() == [1.0]  # 18: three
    # a tie of groups (two 18s, two 20s) goes to the group whose first answer was drawn first
    tie = [["20", "18", "$18", "20.0"], ["18", "20", "20.0", "$18"]]
    oks = [[False, True, True, False], [True, False, False, True]]
    assert maj_at_k(tie, oks, 4, equivalent=GSM8KTask.answers_equivalent).tolist() == [0.0, 1.0]
    # integers for the arithmetic task: "018" is 18; text that is no integer only equals itself
    assert maj_at_k([["018", "18", "7", "7", "7"]], [[True, True, False, False, False]], 4,
                    equivalent=ArithmeticTask.answers_equivalent).tolist() == [1.0]
    assert not ArithmeticTask.answers_equivalent("x", "18") and ArithmeticTask.answers_equivalent("x", "x")
    with pytest.raises(ValueError, match="equivalent must be a callable"):
        maj_at_k(answers, correct, 5, equivalent="same")


def test_gsm8k_answers_equivalent_follows_the_scorer():
    pytest.importorskip("math_verify")
    from grpo_lab.tasks.gsm8k import answers_equivalent

    for a, b in (("18", r"\$18"), ("18", "18.0"), ("1,234", "1234"), (r"\frac{1}{2}", "0.5"), ("*18*", "18"),
                 ("25%", "25")):
        assert answers_equivalent(a, b) and answers_equivalent(b, a), (a, b)
    for a, b in (("18", "20"), ("18 or 20", "18"), ("18", "180"), ("x", "18")):
        assert not answers_equivalent(a, b), (a, b)
    with pytest.raises(TypeError, match="must be str"):
        answers_equivalent(18, "18")
