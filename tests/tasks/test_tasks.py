"""Tests for grpo_lab.tasks: the arithmetic task, its strict parser, problem files and the registry."""

import builtins
import json
import signal
from collections import Counter

import numpy as np
import pytest

from grpo_lab.tasks import (TASKS, ArithmeticTask, CalculatorTask, DatasetTask, DialogueTask, GSM8KTask, LongChainTask, NextTokenTask, Problem, Task, get_task, task_from_spec,
                            task_spec)
from grpo_lab.tasks.arithmetic import direct_response, parse_answer, reasoning_response
from grpo_lab.tasks.base import load_problems, save_problems


# ------------------------------------------------------------------------------------ responses
@pytest.mark.parametrize("terms, expected", [
    # 3+5=8 -> "8+2+8;", 8+2=10 -> "10+8;", 10+8=18 -> "18;", then the answer
    ([3, 5, 2, 8], "8+2+8;10+8;18;#18"),
    ([4, 4], "8;#8"),
    ([9, 9, 9], "18+9;27;#27"),
    ([1, 2, 3, 4, 5, 6], "3+3+4+5+6;6+4+5+6;10+5+6;15+6;21;#21"),
    ([7], "#7"),  # one term: nothing to reduce
])
def test_reasoning_response_goldens(terms, expected):
    assert reasoning_response(terms) == expected
    assert parse_answer(expected) == str(sum(terms))


def test_direct_response_goldens():
    assert direct_response([3, 5, 2, 8]) == "#18"
    assert direct_response([9, 9, 9, 9, 9, 9]) == "#54"
    assert parse_answer("#54") == "54"


@pytest.mark.parametrize("text, expected", [
    ("8+2+8;10+8;18;#18", "18"),
    ("#18", "18"),
    ("#7", "7"),
    ("#0", "0"),
    ("1;#18", "18"),  # steps are not checked, only their shape (outcome reward)
    ("#999999", "999999"),
])
def test_parse_answer_accepts(text, expected):
    assert parse_answer(text) == expected


@pytest.mark.parametrize("text", [
    "", "18", "#", "##18", "#18#19", "#18 ", " #18", "#18x", "x#18", "#a", "#-3", "#1+2", "#1.0",
    "<pad>#18", "#1<pad>8", "#18<pad>", "#18<eos>", "8;;#8", "8+2+8;10+8;18;", "8+2+8;#18;",
    "8 + 2;#10", "#1234567", "#１８",  # full-width digits are not [0-9]
])
def test_parse_answer_rejects_malformed(text):
    assert parse_answer(text) is None


def test_parse_answer_rejects_trailing_newline():
    assert parse_answer("#18\n") is None
    assert parse_answer("8;#8\n") is None


def test_parse_never_evaluates(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("eval/exec/compile called")

    for name in ("eval", "exec", "compile"):
        monkeypatch.setattr(builtins, name, boom)
    task = ArithmeticTask()
    p = task.make_problem([1, 1])
    for text in ["#2", "1+1;#2", "__import__('os').system('true')", "#eval(2)", "#(1+1)", "2;#2"]:
        r = task.reward(text, p)
        assert r in (0.0, 1.0)


# ------------------------------------------------------------------------------------ scoring
def test_make_problem():
    p = ArithmeticTask().make_problem([3, 5, 2, 8])
    assert p == Problem("3+5+2+8=", "18")
    assert p.meta == {"n_terms": 4, "terms": [3, 5, 2, 8]}


def test_reward_and_is_correct():
    task = ArithmeticTask()
    p = task.make_problem([3, 5, 2, 8])
    cases = {
        "#18": True, "8+2+8;10+8;18;#18": True, "1;#18": True,
        "#17": False, "#018": False, "18": False, "#18#18": False, "": False, "#18 ": False,
    }
    for text, ok in cases.items():
        assert task.is_correct(text, p) is ok, text
        r = task.reward(text, p)
        assert isinstance(r, float) and r == (1.0 if ok else 0.0), text


def test_is_reasoning():
    is_r = ArithmeticTask.is_reasoning
    assert is_r("8+2+8;10+8;18;#18")
    assert is_r("8;#8")
    assert is_r("8;")  # a step, never answered
    assert not is_r("#18")
    assert not is_r("#8;")  # opens with '#'
    assert not is_r("18")
    assert not is_r("")
    assert not is_r("8#1;")  # the ';' comes after the first '#'


def test_demonstration_mixture():
    p = ArithmeticTask().make_problem([3, 5, 2, 8])
    rng = np.random.default_rng(0)
    assert ArithmeticTask(p_reason=1.0).demonstration(p, rng) == "8+2+8;10+8;18;#18"
    assert ArithmeticTask(p_reason=0.0).demonstration(p, rng) == "#18"
    demos = [ArithmeticTask(p_reason=0.3).demonstration(p, rng) for _ in range(2000)]
    frac = np.mean([d != "#18" for d in demos])
    assert 0.25 < frac < 0.35  # binomial sd = sqrt(.3*.7/2000) ~ 0.01


# ------------------------------------------------------------------------------------ sampling
def test_sample_deterministic_given_rng():
    task = ArithmeticTask()
    a = task.sample(50, np.random.default_rng(7))
    b = task.sample(50, np.random.default_rng(7))
    c = task.sample(50, np.random.default_rng(8))
    assert [p.prompt for p in a] == [p.prompt for p in b]
    assert [p.meta for p in a] == [p.meta for p in b]
    assert [p.prompt for p in a] != [p.prompt for p in c]
    # the caller's rng advances: a second draw from the same generator differs from the first
    rng = np.random.default_rng(7)
    assert [p.prompt for p in task.sample(5, rng)] != [p.prompt for p in task.sample(5, rng)]


@pytest.mark.parametrize("lo, hi, digits", [(2, 6, 1), (3, 3, 1), (1, 2, 2), (2, 4, 3)])
def test_sample_respects_term_range_and_digits(lo, hi, digits):
    task = ArithmeticTask(min_terms=lo, max_terms=hi, digits=digits)
    probs = task.sample(300, np.random.default_rng(0))
    counts = Counter(p.meta["n_terms"] for p in probs)
    assert set(counts) == set(range(lo, hi + 1))  # every count appears, nothing outside
    lo_d, hi_d = (1, 9) if digits == 1 else (10 ** (digits - 1), 10 ** digits - 1)
    for p in probs:
        terms = p.meta["terms"]
        assert len(terms) == p.meta["n_terms"]
        assert all(lo_d <= t <= hi_d for t in terms)
        assert p.prompt == "+".join(map(str, terms)) + "="
        assert p.answer == str(sum(terms))


def test_test_set_deterministic_unique_and_balanced():
    task = ArithmeticTask(min_terms=2, max_terms=6, digits=1, test_size=200)  # 5 counts -> 40 each
    a, b = task.generate_test_set(), task.generate_test_set()
    assert [(p.prompt, p.answer, p.meta) for p in a] == [(p.prompt, p.answer, p.meta) for p in b]
    assert len(a) == 200
    assert len({p.prompt for p in a}) == 200
    assert Counter(p.meta["n_terms"] for p in a) == {k: 40 for k in range(2, 7)}
    for p in a:
        assert p.answer == str(sum(p.meta["terms"]))
    # does not depend on any global RNG state
    np.random.seed(1)
    assert [p.prompt for p in task.generate_test_set()] == [p.prompt for p in a]


def test_test_set_share_per_term_count():
    # test_size is split into equal shares; the remainder is dropped (7 // 5 = 1 per count)
    def share(**kw):
        return Counter(p.meta["n_terms"] for p in ArithmeticTask(**kw).generate_test_set())

    assert share(min_terms=2, max_terms=6, digits=1, test_size=10) == {k: 2 for k in range(2, 7)}
    assert share(min_terms=2, max_terms=6, digits=1, test_size=7) == {k: 1 for k in range(2, 7)}
    assert share(min_terms=2, max_terms=4, digits=2, test_size=30) == {2: 10, 3: 10, 4: 10}


def test_impossible_test_set_raises_instead_of_hanging():
    def on_alarm(signum, frame):
        raise TimeoutError("generate_test_set did not return within 1 s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(ValueError):
            ArithmeticTask(min_terms=1, max_terms=1, digits=1, test_size=20).generate_test_set()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_test_set_file_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_LAB_DATA", str(tmp_path))
    task = ArithmeticTask(min_terms=2, max_terms=6, digits=1, test_size=10)
    path = task.test_set_path()
    assert path == tmp_path / "tasks" / "arithmetic_d1_2-6_test.jsonl"
    assert ArithmeticTask(min_terms=3, max_terms=4, digits=2).test_set_path().name == "arithmetic_d2_3-4_test.jsonl"
    assert not path.exists()
    regenerated = task.test_set()  # no file: regenerated
    assert task.write_test_set() == path and path.exists()
    from_file = task.test_set()
    assert [(p.prompt, p.answer, p.meta) for p in from_file] == [(p.prompt, p.answer, p.meta) for p in regenerated]
    # the file is what is read: a different file content is returned verbatim
    save_problems([Problem("1+1=", "2", {"n_terms": 2})], path)
    assert task.test_set() == [Problem("1+1=", "2")]


# ------------------------------------------------------------------------------------ problem files
def test_save_load_problems_round_trip(tmp_path):
    probs = [Problem("3+5=", "8", {"n_terms": 2, "terms": [3, 5]}), Problem("a b", "x y"), Problem("1=", "1", {})]
    path = tmp_path / "sub" / "p.jsonl"
    save_problems(probs, path)
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    assert json.loads(lines[0]) == {"prompt": "3+5=", "answer": "8", "meta": {"n_terms": 2, "terms": [3, 5]}}
    back = load_problems(path)
    assert [(p.prompt, p.answer, p.meta) for p in back] == [(p.prompt, p.answer, p.meta) for p in probs]


def test_load_problems_skips_blank_lines_and_defaults_meta(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n\n   \n{"prompt": "2+2=", "answer": "4"}\n')
    back = load_problems(path)
    assert back == [Problem("1+1=", "2"), Problem("2+2=", "4")]
    assert back[0].meta == {}


@pytest.mark.parametrize("bad", [
    "not json",
    '{"prompt": "1+1="}',
    '{"answer": "2"}',
    '{"prompt": "1+1=", "answer": 2}',
    '{"prompt": 11, "answer": "2"}',
    '["1+1=", "2"]',
    '"1+1="',
    "3",
])
def test_load_problems_rejects_malformed_line(tmp_path, bad):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n' + bad + "\n")
    with pytest.raises(ValueError, match=":2"):  # names the offending line
        load_problems(path)


def test_load_problems_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_problems(tmp_path / "nope.jsonl")


# ------------------------------------------------------------------------------------ registry
def test_get_task():
    assert TASKS == {"arithmetic": ArithmeticTask, "calculator": CalculatorTask, "dataset": DatasetTask, "gsm8k": GSM8KTask,
                     "next_token": NextTokenTask, "dialogue": DialogueTask, "long_chain": LongChainTask}
    t = get_task("arithmetic", max_terms=4, test_size=12)
    assert t == ArithmeticTask(max_terms=4, test_size=12)
    assert isinstance(t, Task)
    with pytest.raises(ValueError, match="arithmetic"):
        get_task("chess")


def test_task_spec_is_json_able():
    spec = task_spec(ArithmeticTask(max_terms=4, digits=2))
    assert spec["name"] == "arithmetic"
    assert spec["params"]["max_terms"] == 4 and spec["params"]["digits"] == 2
    assert json.loads(json.dumps(spec)) == spec
    with pytest.raises(ValueError):
        task_spec(object())


def test_task_spec_round_trip():
    for task in [ArithmeticTask(), ArithmeticTask(min_terms=3, max_terms=5, digits=2, p_reason=0.5, test_size=30)]:
        assert task_from_spec(json.loads(json.dumps(task_spec(task)))) == task


@pytest.mark.parametrize("kwargs", [
    dict(min_terms=0), dict(min_terms=4, max_terms=3), dict(digits=0), dict(digits=4),
    dict(p_reason=-0.1), dict(p_reason=1.5),
])
def test_arithmetic_task_validation(kwargs):
    with pytest.raises(ValueError, match="ArithmeticTask"):
        ArithmeticTask(**kwargs)


def test_answer_must_be_canonical_integer():
    # The docstring promised an integer comparison while "#018" scored 0: code and docstring now
    # agree that the answer is written in canonical form (no leading zeros), as the base policy's
    # demonstrations write it; "#0" is canonical.
    task = ArithmeticTask()
    p = task.make_problem([9, 9])
    assert parse_answer("#018") is None and parse_answer("9+9;#018") is None
    assert task.reward("#018", p) == 0.0 and not task.is_correct("#018", p)
    assert task.reward("#18", p) == 1.0
    assert parse_answer("#0") == "0" and parse_answer("#00") is None
    assert "leading zeros" in parse_answer.__doc__
