"""The long chain-of-thought task (issue 55): demonstrations, thoroughness, strict reward, test set, registry."""

from collections import Counter

import numpy as np
import pytest

from grpo_lab.lab.pretrain import RECIPES, make_task
from grpo_lab.tasks import LongChainTask, get_task, task_from_spec, task_spec, validate_task
from grpo_lab.tasks.base import load_problems
from grpo_lab.tasks.long_chain import careful_response, hasty_response, thoroughness


def test_careful_response_golden():
    # by hand: 56+77=133, 133+95=228, 228+12=240
    assert careful_response([56, 77, 95, 12]) == "133+95+12;228+12;240;#240"
    assert careful_response([7]) == "#7"
    with pytest.raises(ValueError, match="no terms"):
        careful_response([])


@pytest.mark.parametrize("seed", range(20))
def test_hasty_response_makes_two_or_three_additions_per_step(seed):
    rng = np.random.default_rng(seed)
    terms = [int(x) for x in rng.integers(10, 100, size=int(rng.integers(3, 13)))]
    text = hasty_response(terms, rng)
    steps = text.split("#")[0].split(";")[:-1]
    counts = [len(terms)] + [s.count("+") + 1 for s in steps]
    drops = np.diff(counts) * -1
    assert all(d in (2, 3) for d in drops[:-1]) and 1 <= drops[-1] <= 3   # the last takes what is left
    assert counts[-1] == 1 and text.endswith(f"#{sum(terms)}")
    assert all(int(s.split("+")[0]) == sum(terms[:len(terms) - c + 1]) for s, c in zip(steps, counts[1:]))
    assert thoroughness(text, len(terms)) in (("hasty",) if len(terms) > 3 else ("hasty", "careful"))


def test_thoroughness_labels():
    assert thoroughness("133+95+12;228+12;240;#240", 4) == "careful"
    assert thoroughness("240;#240", 4) == "hasty"
    assert thoroughness("#240", 4) == "direct"
    assert thoroughness("133+95+12;228+12;2", 4) == "malformed"                 # cut by the budget
    assert thoroughness("133+95+12;228+12;240;240;#240", 4) == "malformed"      # more steps than additions
    assert thoroughness("#240", 1) == "direct"
    with pytest.raises(ValueError, match="n_terms"):
        thoroughness("#1", 0)


@pytest.mark.parametrize("completion,reward", [
    ("133+95+12;228+12;240;#240", 1.0), ("#240", 1.0), ("240;#240", 1.0),
    ("133+95+12;228+12;241;#241", 0.0),   # a wrong step carried to the answer
    ("1+1;#240", 1.0),                    # only the answer is scored, not the steps
    ("#0240", 0.0), ("#240 ", 0.0), ("240", 0.0), ("#240#240", 0.0), ("#+240", 0.0), ("", 0.0),
    ("133+95+12;228+12;24", 0.0),         # truncated
    ("__import__('os').system('true')", 0.0), ("#56+77+95+12", 0.0),
])
def test_reward_is_a_strict_parse(completion, reward):
    task = LongChainTask()
    problem = task.make_problem([56, 77, 95, 12])
    assert task.reward(completion, problem) == reward


def test_demonstration_mixture_follows_the_shares():
    task = LongChainTask(p_careful=0.5, p_hasty=0.3)
    rng = np.random.default_rng(0)
    problems = task.sample(3000, rng)
    labels = Counter(task.thoroughness(task.demonstration(p, rng), p) for p in problems)
    # 3-term sums: a hasty chain of one 2-addition step is the careful chain's length 1 step, i.e. hasty
    assert labels["malformed"] == 0
    assert abs(labels["careful"] / 3000 - 0.5) < 0.03 and abs(labels["hasty"] / 3000 - 0.3) < 0.03
    assert all(task.reward(task.demonstration(p, rng), p) == 1.0 for p in problems[:200])


def test_test_set_is_deterministic_and_even():
    a, b = LongChainTask().generate_test_set(), LongChainTask().generate_test_set()
    assert [p.prompt for p in a] == [p.prompt for p in b] and len(a) == 300
    assert Counter(p.meta["n_terms"] for p in a) == {k: 25 for k in range(3, 15)}
    assert all(1 <= t <= 9 for p in a for t in p.meta["terms"])
    assert len({p.prompt for p in a}) == 300
    assert all(int(p.answer) == sum(p.meta["terms"]) for p in a)
    shipped = LongChainTask().test_set_path()
    assert shipped.name == "long_chain_d1_3-14_test.jsonl"
    assert [p.prompt for p in load_problems(shipped)] == [p.prompt for p in a]


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="filler"):
        LongChainTask(filler=".")
    with pytest.raises(ValueError, match="p_careful"):
        LongChainTask(p_careful=1.5)
    with pytest.raises(ValueError, match="p_hasty"):
        LongChainTask(p_hasty=-0.1)
    with pytest.raises(ValueError, match="<= 1"):
        LongChainTask(p_careful=0.7, p_hasty=0.4)
    with pytest.raises(ValueError, match="min_terms"):
        LongChainTask(min_terms=5, max_terms=4)


def test_registered_and_rebuilt_from_its_spec():
    task = get_task("long_chain", max_terms=6)
    assert isinstance(task, LongChainTask) and task.max_terms == 6
    assert task_from_spec(task_spec(task)) == task
    validate_task(task)


def test_recipe_builds_the_task_and_records_its_fields():
    rec = RECIPES["long-chain"]
    task = make_task(rec)
    assert task == LongChainTask(max_new_tokens=rec.max_new_tokens, p_careful=rec.p_careful, p_hasty=rec.p_hasty)
    d = rec.to_dict()
    assert d["task"] == "long_chain" and d["p_careful"] == 0.6 and d["max_new_tokens"] == 180 and d["digits"] == 1
    assert "p_reason" not in d and "p_tool" not in d and "filler" not in d
    assert "p_careful" not in RECIPES["arithmetic"].to_dict()
    # the context holds the longest prompt (14 one-digit terms and '=': 28 tokens) and the budget
    assert rec.model.max_position_embeddings >= 28 + rec.max_new_tokens


def test_test_size_and_budget_are_checked():
    # a regenerated set follows test_size: 12 term counts x 2 problems, by hand (the shipped file wins when present)
    small = LongChainTask(test_size=24).generate_test_set()
    assert len(small) == 24 and Counter(p.meta["n_terms"] for p in small) == {k: 2 for k in range(3, 15)}
    for bad in ({"test_size": 5}, {"test_size": -5}, {"test_size": 1.5}, {"max_new_tokens": 0}, {"max_new_tokens": -3}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LongChainTask(**bad)
