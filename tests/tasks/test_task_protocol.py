"""The task protocol, task registration and safe checkpoints of unregistered tasks (issue 15).

A fresh user wrote a reverse-a-string task: a missing method failed deep inside training, ``save``
refused (and once half-wrote) a checkpoint of the unregistered task, and ``resume`` had no way
to take the task. Each test here failed on the code before the fix (noted where not obvious)."""

import copy
import dataclasses
import doctest
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import grpo_lab.tasks as tasks_mod
import grpo_lab.tasks.base as base_mod
from grpo_lab.algo.algorithms import GRPO
from grpo_lab.policy.models import load_policy
from grpo_lab.paths import checkpoint_dir
from grpo_lab.tasks import (TASKS, ArithmeticTask, Problem, get_task, register_task, task_from_spec, task_spec,
                            validate_task)
from grpo_lab.training.trainer import Trainer, TrainerConfig

BASE = checkpoint_dir("arithmetic-base")
TIMING = ["tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "peak_mem_mb"]
# 2 prompts x 4 responses, 8 new tokens, two optimiser steps per rollout (the second one off-policy,
# so the optimiser state matters), greedy evaluation of the 4-problem test set every 2 steps
CFG = dict(prompts_per_step=2, group_size=4, max_new_tokens=8, minibatches=2, eval_every=2, progress=False,
           lr=3e-3, seed=0)


@dataclasses.dataclass
class ReverseTask:
    """The fresh user's task: reverse a string of digits. The reward gives partial credit (the
    share of the answer's distinct characters that the completion contains), so that the
    arithmetic base policy, which writes digits, gets mixed rewards and training moves."""

    name: str = "reverse"
    max_new_tokens: int = 8
    length: int = 4
    alphabet: str = "123456789"

    def sample(self, n, rng):
        words = ["".join(rng.choice(list(self.alphabet), self.length)) for _ in range(n)]
        return [Problem(w + "=", w[::-1]) for w in words]

    def is_correct(self, completion, problem):
        return completion == problem.answer

    def reward(self, completion, problem):
        return len(set(completion) & set(problem.answer)) / len(set(problem.answer))

    def test_set(self):
        return self.sample(4, np.random.default_rng(12345))


@pytest.fixture(autouse=True)
def _registry():
    """Every test sees the shipped registry and leaves it as it found it."""
    saved = dict(TASKS)
    yield
    TASKS.clear()
    TASKS.update(saved)


@pytest.fixture(scope="module")
def base():
    return load_policy(BASE)


def make_trainer(base, task, **kw):
    """A GRPO trainer on a fresh copy of the shipped arithmetic base policy."""
    policy, tok = base
    return Trainer(copy.deepcopy(policy), tok, task, GRPO, TrainerConfig(**{**CFG, **kw}))


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def history(rows):
    return pd.DataFrame(rows).drop(columns=TIMING, errors="ignore")


# ------------------------------------------------------------------------------------ protocol
def test_shipped_and_example_tasks_pass():
    assert validate_task(ArithmeticTask()) == ArithmeticTask()
    task = ReverseTask()
    assert validate_task(task, call=True) is task


def test_the_documented_example_runs():
    # The Task docstring's example (the protocol's documentation) is executed, outputs included.
    finder = doctest.DocTestFinder(recurse=False)
    (test,) = finder.find(base_mod.Task, "Task", globs={})
    assert test.examples, "the Task docstring lost its example"
    result = doctest.DocTestRunner().run(test)
    assert result.failed == 0 and result.attempted >= 4


class _NoTestSet:
    name = "reverse"
    max_new_tokens = 8

    def sample(self, n, rng):
        return [Problem("12=", "21")] * n

    def reward(self, completion, problem):
        return 0.0

    def is_correct(self, completion, problem):
        return False


def _variant(**members):
    return type("Variant", (_NoTestSet,), {"test_set": lambda self: [Problem("12=", "21")], **members})()


@pytest.mark.parametrize("task, expected", [
    (_NoTestSet(), ["missing method test_set()"]),  # the fresh user's AttributeError, deep in training
    (_variant(name=""), ["name must be a non-empty str"]),
    (_variant(name=3), ["name must be a non-empty str, got 3"]),
    (_variant(max_new_tokens=True), ["max_new_tokens must be an int >= 1, got True"]),
    (_variant(max_new_tokens=0), ["max_new_tokens must be an int >= 1, got 0"]),
    (_variant(max_new_tokens="8"), ["max_new_tokens must be an int >= 1, got '8' (str)"]),
    (_variant(reward=1.0), ["reward must be a method reward(completion, problem)"]),
    (_variant(sample=lambda self, n: []), ["cannot be called as sample(n, rng)"]),
    (_variant(is_correct=lambda self, completion, problem, strict: True), ["cannot be called as is_correct("]),
    (_variant(is_reasoning="yes"), ["is_reasoning must be a method"]),
    (_variant(model_metrics=lambda self: {}), ["cannot be called as model_metrics(model)"]),
])
def test_validate_task_names_the_problem(task, expected):
    with pytest.raises(TypeError, match="task protocol") as err:
        validate_task(task)
    for text in expected:
        assert text in str(err.value)


def test_validate_task_names_every_problem_at_once():
    class Empty:
        pass

    with pytest.raises(TypeError) as err:
        validate_task(Empty())
    msg = str(err.value)
    assert msg.startswith("Empty does not implement the task protocol")
    for member in ["name", "max_new_tokens", "sample(n, rng)", "reward(completion, problem)",
                   "is_correct(completion, problem)", "test_set()"]:
        assert f"missing attribute {member}" in msg or f"missing method {member}" in msg, member


def test_optional_signatures_accepted():
    # defaults, *args and static methods can all be called as the trainer calls them
    task = _variant(sample=lambda self, n, rng=None, extra=1: [], reward=staticmethod(lambda c, p: 0.0),
                    is_correct=lambda self, *args: False, is_reasoning=staticmethod(lambda c: False))
    assert validate_task(task) is task


@pytest.mark.parametrize("members, expected", [
    (dict(sample=lambda self, n, rng: ["12="] * n), "item 0 is str '12=', not a grpo_lab.tasks.Problem"),
    (dict(sample=lambda self, n, rng: [Problem("12=", "21")]), "returned 1 problems, not 2"),
    (dict(sample=lambda self, n, rng: [Problem(str(np.random.randint(1, 10**9)) + "=", "0") for _ in range(n)]),
     "different problems for two generators with the same seed"),
    (dict(reward=lambda self, c, p: None), "reward(completion, problem) returned None"),
    (dict(reward=lambda self, c, p: float("nan")), "not a finite real number"),
    (dict(is_correct=lambda self, c, p: "yes"), "is_correct(completion, problem) returned 'yes'"),
    (dict(test_set=lambda self: []), "test_set() returned no problems"),
    (dict(test_set=lambda self: 1 / 0), "test_set() raised ZeroDivisionError"),
])
def test_validate_task_call_checks_what_the_methods_return(members, expected):
    task = _variant(**members)
    assert validate_task(task) is task  # the cheap check runs none of this code
    with pytest.raises(TypeError) as err:
        validate_task(task, call=True)
    assert expected in str(err.value)


def test_trainer_checks_the_task_when_built(base):
    # Before: Trainer accepted the task and training failed later with AttributeError: 'test_set'.
    with pytest.raises(TypeError, match=r"_NoTestSet does not implement the task protocol(.|\n)*test_set\(\)"):
        make_trainer(base, _NoTestSet())


def test_building_a_trainer_runs_no_task_code(base):
    # The check reads attributes and signatures only: it samples nothing, so the trainer's RNG and
    # every result of existing runs are unchanged.
    calls = []

    class Watched(ReverseTask):
        def sample(self, n, rng):
            calls.append("sample")
            return super().sample(n, rng)

        def test_set(self):
            calls.append("test_set")
            return super().test_set()

    tr = make_trainer(base, Watched())
    assert calls == []
    assert tr.rng.bit_generator.state == np.random.default_rng(CFG["seed"]).bit_generator.state


# ------------------------------------------------------------------------------------ registry
def test_register_task_call_and_decorator():
    assert register_task("reverse", ReverseTask) is ReverseTask
    assert get_task("reverse", length=3) == ReverseTask(length=3)
    assert register_task("reverse", ReverseTask) is ReverseTask  # again, same class: no error

    @register_task("reverse2")
    @dataclasses.dataclass
    class Reverse2(ReverseTask):
        name: str = "reverse2"

    assert TASKS["reverse2"] is Reverse2 and TASKS["reverse"] is ReverseTask
    spec = task_spec(Reverse2(length=2))
    assert spec["name"] == "reverse2" and spec["params"]["length"] == 2
    assert task_from_spec(json.loads(json.dumps(spec))) == Reverse2(length=2)


def test_register_task_refuses_what_would_break_later():
    @dataclasses.dataclass
    class Other(ReverseTask):
        pass  # keeps the default name "reverse"

    register_task("reverse", ReverseTask)
    with pytest.raises(ValueError, match="already registered.*replace=True"):
        register_task("reverse", Other)
    assert TASKS["reverse"] is ReverseTask
    assert register_task("reverse", Other, replace=True) is Other and TASKS["reverse"] is Other
    with pytest.raises(ValueError, match="named 'reverse'.*not 'rev'"):  # task_spec looks classes up by task.name
        register_task("rev", ReverseTask)
    with pytest.raises(TypeError, match="must be a task class"):
        register_task("reverse3", ReverseTask())
    with pytest.raises(TypeError, match="missing method test_set"):
        register_task("nts", _NoTestSet)
    with pytest.raises(TypeError, match="name must be a str"):
        register_task(None, ReverseTask)
    with pytest.raises(ValueError, match="must not be empty"):
        register_task("", ReverseTask)
    assert set(TASKS) == {"arithmetic", "calculator", "dataset", "dialogue", "gsm8k", "long_chain", "next_token", "reverse"}


def test_task_spec_refuses_a_subclass_under_its_parents_name():
    # Before: a subclass of ArithmeticTask that keeps the name "arithmetic" got a spec, and resume
    # silently rebuilt a plain ArithmeticTask (another reward) from it.
    @dataclasses.dataclass
    class Lenient(ArithmeticTask):
        def reward(self, completion, problem):
            return 0.5

    with pytest.raises(ValueError, match="not a registered dataclass task"):
        task_spec(Lenient())
    spec = task_spec(ArithmeticTask())
    assert spec["class"] == "grpo_lab.tasks.arithmetic.ArithmeticTask"
    register_task("arithmetic", Lenient, replace=True)  # the name now means another class
    with pytest.raises(ValueError, match="now registered to"):
        task_from_spec(spec)


# ------------------------------------------------------------------------------------ save / resume
def test_unregistered_task_saves_and_resume_asks_for_it(base, tmp_path):
    # Before: save raised "ReverseTask is not a registered dataclass task" and resume had no task=.
    tr = make_trainer(base, ReverseTask(length=3))
    tr.train(1)
    ck = tr.save(tmp_path / "ck")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    state = json.loads((ck / "state.json").read_text())
    assert state["task"] == {"name": "reverse", "class": f"{__name__}.ReverseTask", "registered": False,
                             "params": {"name": "reverse", "max_new_tokens": 8, "length": 3, "alphabet": "123456789"},
                             # issue 54: no data of its own (generated from its fields), its reward method by name
                             "fingerprint": {"data": {}, "reward_funcs": [f"{__name__}:ReverseTask.reward"]}}
    with pytest.raises(ValueError) as err:
        Trainer.resume(ck)
    msg = str(err.value)
    assert "no task named 'reverse' is registered" in msg
    assert "task=ReverseTask(...)" in msg and "register_task('reverse', ReverseTask)" in msg
    resumed = Trainer.resume(ck, task=ReverseTask(length=3))
    assert resumed.step == 1 and resumed.task == ReverseTask(length=3)
    register_task("reverse", ReverseTask)  # a process that registers the class needs no task=
    assert Trainer.resume(ck).task == ReverseTask(length=3)


def test_a_subclass_under_its_parents_name_is_not_resumed_as_the_parent(base, tmp_path):
    @dataclasses.dataclass
    class Lenient(ArithmeticTask):
        def reward(self, completion, problem):
            return 0.5

    ck = make_trainer(base, Lenient(test_size=4)).save(tmp_path / "ck")
    with pytest.raises(ValueError, match=r"'arithmetic' is registered to grpo_lab\.tasks\.arithmetic\.ArithmeticTask"):
        Trainer.resume(ck)
    assert type(Trainer.resume(ck, task=Lenient(test_size=4)).task) is Lenient


def test_task_without_storable_fields_saves(base, tmp_path):
    class Plain:  # not a dataclass: nothing to rebuild it from
        name, max_new_tokens, length, alphabet = "plain", 8, 4, "123"
        sample, reward, is_correct, test_set = (ReverseTask.sample, ReverseTask.reward, ReverseTask.is_correct,
                                                ReverseTask.test_set)

    @dataclasses.dataclass
    class WithSet(ReverseTask):
        tags: set = dataclasses.field(default_factory=lambda: {"x"})  # JSON cannot hold a set

    for task in (Plain(), WithSet()):
        register_task(task.name, type(task))
        ck = make_trainer(base, task).save(tmp_path / type(task).__name__)
        assert json.loads((ck / "state.json").read_text())["task"]["params"] is None
        with pytest.raises(ValueError, match="fields were not stored.*task="):
            Trainer.resume(ck)  # even registered: the fields are unknown
        assert Trainer.resume(ck, task=task).task is task


def test_resume_warns_when_the_task_passed_differs(base, tmp_path):
    ck = make_trainer(base, ReverseTask()).save(tmp_path / "ck")
    with pytest.warns(RuntimeWarning, match=r"fields length=5 \(saved 4\)"):
        Trainer.resume(ck, task=ReverseTask(length=5))
    with pytest.warns(RuntimeWarning, match=r"class grpo_lab\.tasks\.arithmetic\.ArithmeticTask"):
        Trainer.resume(ck, task=ArithmeticTask(test_size=4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Trainer.resume(ck, task=ReverseTask())  # the same task: no warning
    with pytest.raises(TypeError, match="task protocol"):
        Trainer.resume(ck, task=_NoTestSet())


def test_checkpoint_of_an_older_version_still_resumes(base, tmp_path):
    # Older checkpoints store the task as {"name", "params"} only.
    ck = make_trainer(base, ArithmeticTask(test_size=4)).save(tmp_path / "ck")
    state = json.loads((ck / "state.json").read_text())
    state["task"] = {"name": "arithmetic", "params": state["task"]["params"]}
    (ck / "state.json").write_text(json.dumps(state))
    assert Trainer.resume(ck).task == ArithmeticTask(test_size=4)


def test_exact_resume_of_an_unregistered_task(base, tmp_path):
    straight = make_trainer(base, ReverseTask())
    w0 = weights(straight.policy)
    straight.train(4)
    assert not all(torch.equal(a, b) for a, b in zip(w0, straight.policy.parameters()))  # training moved

    first = make_trainer(base, ReverseTask())
    first.train(2)
    first.save(tmp_path / "ck")
    torch.manual_seed(999)
    np.random.seed(999)  # whatever happens in between must not matter
    resumed = Trainer.resume(tmp_path / "ck", task=ReverseTask())
    resumed.train(2)
    assert all(torch.equal(a, b) for a, b in zip(straight.policy.parameters(), resumed.policy.parameters()))
    assert list(resumed.history["step"]) == [0, 1, 2, 3, 4]
    pd.testing.assert_frame_equal(history(straight.rows), history(resumed.rows), check_exact=True, check_dtype=False)


def test_exact_resume_of_an_unregistered_task_in_a_fresh_process(base, tmp_path):
    # The resuming process has never seen the task registered (nor the training): task= is all it needs.
    straight = make_trainer(base, ReverseTask())
    straight.train(3)
    first = make_trainer(base, ReverseTask())
    first.train(2)  # (an evaluation ends every train call: split where straight evaluates too)
    first.save(tmp_path / "ck")
    script = textwrap.dedent(f"""
        import sys
        import torch
        torch.set_num_threads(1)
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_task_protocol import ReverseTask
        from grpo_lab.tasks import TASKS
        from grpo_lab.training.trainer import Trainer
        assert "reverse" not in TASKS
        try:
            Trainer.resume({str(tmp_path / "ck")!r})
        except ValueError as exc:
            assert "task=" in str(exc), exc
        else:
            raise SystemExit("resume without task= should have failed")
        tr = Trainer.resume({str(tmp_path / "ck")!r}, task=ReverseTask())
        tr.train(1)
        tr.save({str(tmp_path / "out")!r})
    """)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    policy, _ = load_policy(tmp_path / "out" / "policy")
    assert all(torch.equal(a, b) for a, b in zip(straight.policy.parameters(), policy.parameters()))
    rows = json.loads((tmp_path / "out" / "history.json").read_text())
    pd.testing.assert_frame_equal(history(straight.rows), history(rows), check_exact=True, check_dtype=False)


# ------------------------------------------------------------------------------------ atomic save
def _fail_on(monkeypatch, name, exc=OSError("disk full")):
    """Make ``torch.save`` raise ``exc`` when it writes ``name`` (after the policy and ref are written)."""
    real = torch.save

    def failing(obj, f, *a, **k):
        if str(f).endswith(name):
            raise exc
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", failing)


def test_failed_save_leaves_nothing(base, tmp_path, monkeypatch):
    # Before: the temporary .ck.saving directory (policy/, ref/, optimizer.pt) stayed behind.
    tr = make_trainer(base, ReverseTask())
    _fail_on(monkeypatch, "rng.pt")
    with pytest.raises(OSError, match="disk full"):
        tr.save(tmp_path / "runs" / "ck")
    assert list((tmp_path / "runs").iterdir()) == []
    _fail_on(monkeypatch, "optimizer.pt", KeyboardInterrupt())  # Ctrl-C half-way: the same
    with pytest.raises(KeyboardInterrupt):
        tr.save(tmp_path / "runs" / "ck")
    assert list((tmp_path / "runs").iterdir()) == []


def test_failed_save_over_a_checkpoint_keeps_it(base, tmp_path, monkeypatch):
    tr = make_trainer(base, ReverseTask())
    tr.train(1)
    ck = tr.save(tmp_path / "ck")
    tr.train(1)
    with monkeypatch.context() as m:
        _fail_on(m, "rng.pt")
        with pytest.raises(OSError):
            tr.save(ck)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # nothing but the old checkpoint
    assert Trainer.resume(ck, task=ReverseTask()).step == 1

    real_rename = Path.rename

    def rename(self, target):  # the new checkpoint cannot be moved into place
        if self.name == ".ck.saving":
            raise OSError("rename failed")
        return real_rename(self, target)

    with monkeypatch.context() as m:
        m.setattr(Path, "rename", rename)
        with pytest.raises(OSError, match="rename failed"):
            tr.save(ck)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # the old one was put back
    assert Trainer.resume(ck, task=ReverseTask()).step == 1

    assert tr.save(ck) == ck  # saving over a checkpoint replaces it once the new one is complete
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    assert Trainer.resume(ck, task=ReverseTask()).step == 2


def test_save_checks_before_writing(base, tmp_path):
    tr = make_trainer(base, ReverseTask())
    # a value JSON cannot hold in the history: before, it failed after the weights were written
    tr.rows.append({"step": 0, "note": object()})
    with pytest.raises(ValueError, match="history cannot be written as JSON"):
        tr.save(tmp_path / "ck")
    assert list(tmp_path.iterdir()) == []
    tr.rows.clear()

    (tmp_path / "file").write_text("keep")
    with pytest.raises(FileExistsError, match="is a file"):
        tr.save(tmp_path / "file")
    assert (tmp_path / "file").read_text() == "keep"

    # before: a directory of other files was deleted and replaced by the checkpoint
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not a trainer checkpoint"):
        tr.save(tmp_path / "results")
    assert [p.name for p in (tmp_path / "results").iterdir()] == ["notes.txt"]

    tr.task = _NoTestSet()  # replaced after construction
    with pytest.raises(TypeError, match="task protocol"):
        tr.save(tmp_path / "ck")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "results"]

    (tmp_path / "empty").mkdir()  # an empty directory is fine
    tr.task = ReverseTask()
    assert (tr.save(tmp_path / "empty") / "state.json").is_file()
