"""The filler variant of the arithmetic task (chapter 3's length-bias experiment) and its base recipe."""

import builtins
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_lab.paths import checkpoint_dir
from grpo_lab.lab.pretrain import RECIPES, make_task
from grpo_lab.tasks import ArithmeticTask, task_from_spec, task_spec
from grpo_lab.tasks.arithmetic import filler_length, parse_answer


# ------------------------------------------------------------------------------------ parser
@pytest.mark.parametrize("text, expected", [
    ("#18", "18"),
    ("#18...", "18"),  # after the answer
    ("....#18", "18"),  # before the response
    ("8+2+8;..10+8;18;.#18..", "18"),  # between steps, before '#', after the answer
    ("..8;.#8..", "8"),
    ("#0.", "0"),
    ("." * 40 + "#999999", "999999"),
])
def test_parse_answer_with_filler_accepts(text, expected):
    assert parse_answer(text, filler=".") == expected


@pytest.mark.parametrize("text", [
    "#1.8",  # inside the answer
    "#.18",  # between '#' and the answer
    "8.;#8",  # inside a step, before its ';'
    "1.0;#1",  # inside a step's number
    "8+.2;#10",  # inside a step, after '+'
    "...",  # no answer
    "#18.#18",  # a second answer
    "#18,",  # another character than the filler
    "#018.",  # still no leading zeros
    "#18. ",  # nothing else after the answer
])
def test_parse_answer_with_filler_rejects(text):
    assert parse_answer(text, filler=".") is None


def test_plain_parser_still_rejects_filler():
    # the default task is unchanged: a dot anywhere makes the response malformed
    for text in ("#18.", ".#18", "8;.#8"):
        assert parse_answer(text) is None
        assert not ArithmeticTask().is_correct(text, ArithmeticTask().make_problem([9, 9]))


@pytest.mark.parametrize("bad", ["..", "1", "#", ";", "+", " ", "\n", "\t", 5])
def test_forbidden_fillers_raise(bad):
    with pytest.raises(ValueError, match="filler"):
        parse_answer("#1", filler=bad)
    with pytest.raises(ValueError, match="filler"):
        ArithmeticTask(filler=bad)


def test_filler_length_goldens():
    # counted by hand: 3 + 1 + 2 dots
    assert filler_length("...8;.#8..", ".") == 6
    assert filler_length("#8", ".") == 0
    assert filler_length("8+2+8;10+8;18;#18" + "." * 12, ".") == 12
    assert ArithmeticTask().filler_length("#8...") == 0  # the plain task has no filler
    with pytest.raises(ValueError):
        filler_length("#8", "")


def test_filler_task_scores_and_never_evaluates(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("eval/exec/compile called")

    for name in ("eval", "exec", "compile"):
        monkeypatch.setattr(builtins, name, boom)
    task = ArithmeticTask(filler=".")
    p = task.make_problem([56, 77, 95])  # 228
    assert task.reward("133+95;228;#228....", p) == 1.0
    assert task.reward("#228", p) == 1.0
    assert task.reward("#227....", p) == 0.0
    assert task.reward("#2.28", p) == 0.0
    assert task.reward("__import__('os').system('true')....", p) == 0.0
    assert task.is_reasoning("133+95;228;#228...") and not task.is_reasoning("#228...")


# ------------------------------------------------------------------------------------ demonstrations
def test_demonstrations_without_filler_are_unchanged():
    # the plain task's demonstrations (and so the committed arithmetic-base recipe) draw the same
    # numbers from the generator whether or not the filler fields exist
    plain, off = ArithmeticTask(), ArithmeticTask(filler=".")  # p_filler = 0: no run ever
    r1, r2 = np.random.default_rng(3), np.random.default_rng(3)
    probs = plain.sample(50, np.random.default_rng(0))
    assert [plain.demonstration(p, r1) for p in probs] == [off.demonstration(p, r2) for p in probs]


@pytest.mark.parametrize("position", ["end", "start"])
def test_demonstrations_with_filler(position):
    task = ArithmeticTask(filler=".", p_filler=0.5, max_filler=12, filler_position=position)
    rng = np.random.default_rng(0)
    probs = task.sample(2000, rng)
    demos = [task.demonstration(p, rng) for p in probs]
    assert all(task.is_correct(d, p) for d, p in zip(demos, probs))  # every demonstration is right
    runs = Counter(task.filler_length(d) for d in demos)
    assert set(runs) <= set(range(0, 13))
    assert 0.45 < 1 - runs[0] / len(demos) < 0.55  # half of them padded
    assert set(range(1, 13)) <= set(runs)  # every run length 1..12 occurs
    padded = [d for d in demos if "." in d]
    if position == "end":
        assert all(d.endswith(".") and not d.startswith(".") for d in padded)
    else:
        assert all(d.startswith(".") and not d.endswith(".") for d in padded)


@pytest.mark.parametrize("kwargs", [
    dict(p_filler=0.5, max_filler=3),  # no filler character
    dict(max_filler=3),
    dict(filler=".", p_filler=0.5, max_filler=0),
    dict(filler=".", p_filler=1.5, max_filler=3),
    dict(filler=".", max_filler=-1),
    dict(filler=".", filler_position="middle"),
])
def test_filler_settings_validated(kwargs):
    with pytest.raises(ValueError):
        ArithmeticTask(**kwargs)


def test_filler_task_spec_round_trip():
    task = ArithmeticTask(filler=".", max_new_tokens=64, p_filler=0.5, max_filler=12)
    again = task_from_spec(json.loads(json.dumps(task_spec(task))))
    assert again == task and again.is_correct("#4..", again.make_problem([2, 2]))


# ------------------------------------------------------------------------------------ recipe and checkpoint
def test_recipes():
    plain = RECIPES["arithmetic"].to_dict()
    assert not {"filler", "p_filler", "max_filler", "filler_position", "max_new_tokens", "init"} & set(plain)
    rec = RECIPES["arithmetic-filler"]
    d = rec.to_dict()
    assert (d["filler"], d["p_filler"], d["max_filler"], d["init"]) == (".", 0.5, 12, "arithmetic-base")
    task = make_task(rec)
    assert task.filler == "." and task.max_new_tokens == 64 and task.filler_position == "end"
    assert task.test_set_path() == make_task(RECIPES["arithmetic"]).test_set_path()  # the same questions


def test_pretrain_init_errors(tmp_path):
    from grpo_lab.lab.pretrain import pretrain

    with pytest.raises(ValueError, match="not found"):
        pretrain(replace(RECIPES["arithmetic-filler"], init="no-such-base", steps=1), tmp_path / "x",
                 progress=False, evaluate=False)
    with pytest.raises(ValueError, match="name"):
        pretrain(RECIPES["arithmetic-filler"], tmp_path / "y", progress=False, evaluate=False, name=" ")


def test_pretrain_from_init_is_deterministic(tmp_path):
    from grpo_lab.lab.pretrain import pretrain

    small = replace(RECIPES["arithmetic-filler"], steps=2, batch_size=8)
    a = pretrain(small, tmp_path / "a", progress=False, evaluate=False)
    b = pretrain(small, tmp_path / "b", progress=False, evaluate=False)
    assert a["model_sha256"] == b["model_sha256"]
    assert a["recipe"]["init"] == "arithmetic-base"


FILLER_BASE = checkpoint_dir("arithmetic-filler-base")


@pytest.mark.skipif(not (FILLER_BASE / "recipe.json").is_file(), reason="arithmetic-filler-base not built")
def test_committed_filler_checkpoint_matches_recipe():
    record = json.loads((FILLER_BASE / "recipe.json").read_text())
    assert record["recipe"] == RECIPES["arithmetic-filler"].to_dict()
    m = record["metrics"]
    # the base policy pads a fair share of its answers, without hitting the budget, and kept its arithmetic
    assert 0.2 < m["sampled_filler_frac"] < 0.8
    assert m["sampled_truncation_rate"] < 0.01
    assert 0.2 < m["greedy_accuracy"] < 0.7
    assert (FILLER_BASE / "model.safetensors").stat().st_size < 2_000_000


LONG_BASE = checkpoint_dir("arithmetic-long-base")


def test_long_recipe():
    rec = RECIPES["arithmetic-long"]
    d = rec.to_dict()
    assert (d["filler"], d["p_filler"], d["max_filler"], d["init"]) == (".", 0.75, 320, "arithmetic-base")
    assert d["model"]["max_position_embeddings"] == 512  # prompt (<= 12) + the 360-token budget fit
    task = make_task(rec)
    assert task.max_new_tokens == 360 and task.filler_position == "end"
    assert task.test_set_path() == make_task(RECIPES["arithmetic"]).test_set_path()  # the same questions


@pytest.mark.skipif(not (LONG_BASE / "recipe.json").is_file(), reason="arithmetic-long-base not built")
def test_committed_long_checkpoint_matches_recipe():
    record = json.loads((LONG_BASE / "recipe.json").read_text())
    assert record["recipe"] == RECIPES["arithmetic-long"].to_dict()
    m = record["metrics"]
    # long, varied responses (VAPO's regime, benchmarks/vapo_long.py) that rarely hit the budget, same arithmetic
    assert m["sampled_mean_length"] > 100 and m["sampled_length_sd"] > 80
    assert m["sampled_truncation_rate"] < 0.01
    assert 0.3 < m["greedy_accuracy"] < 0.6
    assert (LONG_BASE / "model.safetensors").stat().st_size < 2_000_000


def _vapo_long():
    from _benchmarks import benchmark_module

    with benchmark_module("vapo_long.py", "vapo_long") as mod:
        return mod


def test_vapo_long_decisive_tokens():
    """benchmarks/vapo_long.py: the tokens that decide the answer are those before its trailing dots (hand work:
    one token per character; the EOS token and padding are not decisive)."""
    mod = _vapo_long()
    task = ArithmeticTask(filler=".", max_new_tokens=360)
    texts = ["#4...", "2+2;4;#4", "#4"]
    mask = torch.zeros(3, 9)
    for i, t in enumerate(texts):
        mask[i, :len(t) + 1] = 1  # the characters and EOS
    got = mod._decisive_mask(texts, task, mask)
    want = torch.zeros(3, 9, dtype=torch.bool)
    want[0, :2] = True
    want[1, :8] = True
    want[2, :2] = True
    assert torch.equal(got, want)
