"""DatasetTask: your data and your reward functions in TRL's shape (issue 32, item 4).

The reward functions below are written as TRL's GRPOTrainer documentation writes them: a format
reward by regex, an accuracy reward reading a dataset column through ``**kwargs``, a length reward,
and one that returns ``None`` for rows it does not apply to."""

import copy
import json
import math
import re
import sys
import textwrap
import warnings

import datasets
import numpy as np
import pytest
import torch

from grpo_lab.algo.algorithms import GRPO
from grpo_lab.policy.models import load_policy
from grpo_lab.paths import checkpoint_dir
from grpo_lab.tasks import TASKS, DatasetTask, Problem, validate_task
from grpo_lab.training.trainer import Trainer, TrainerConfig

WORDS = ["1234", "567", "8912", "345", "6789", "123", "4567", "891", "2345", "678", "9123", "456"]


def rows():
    """Reverse a string of digits; every third row is an 'echo' row (a different kind of problem)."""
    return [{"prompt": w + "=", "solution": w[::-1], "kind": "echo" if i % 3 == 2 else "reverse"}
            for i, w in enumerate(WORDS)]


# ---------------------------------------------------------------- reward functions, TRL's documented shapes
def format_reward(completions, **kwargs):
    """Digits only, as the whole completion (TRL's docs: a regex format reward)."""
    pattern = r"^[0-9]+$"
    matches = [re.match(pattern, c) for c in completions]
    return [1.0 if m else 0.0 for m in matches]


def accuracy_reward(completions, solution, **kwargs):
    """1 when the completion is the ``solution`` column's value (TRL's docs: ground truth via kwargs)."""
    return [1.0 if c.strip() == s else 0.0 for c, s in zip(completions, solution)]


def reward_len(completions, **kwargs):
    """TRL's docs' length reward: closeness to a target length (here 4 characters)."""
    return [-abs(4 - len(c)) for c in completions]


def reverse_only_reward(prompts, completions, kind, **kwargs):
    """Applies to 'reverse' rows only (TRL's multi-task example: ``None`` elsewhere)."""
    return [float(len(c) == len(p) - 1) if k == "reverse" else None for p, c, k in zip(prompts, completions, kind)]


def golden(completions, problems, weights):
    """The weighted nansum of the four functions above, written out by hand."""
    out = []
    for c, p in zip(completions, problems):
        parts = [1.0 if re.fullmatch("[0-9]+", c) else 0.0, 1.0 if c.strip() == p.meta["solution"] else 0.0,
                 -abs(4 - len(c)), None if p.meta["kind"] != "reverse" else float(len(c) == len(p.prompt) - 1)]
        out.append(sum(w * v for w, v in zip(weights, parts) if v is not None))
    return out


FUNCS = [format_reward, accuracy_reward, reward_len, reverse_only_reward]


def make(data=None, **kw):
    kw = {"reward_funcs": FUNCS, "answer_column": "solution", "test": 0.25, "max_new_tokens": 8,
          "correct_reward": "accuracy_reward", **kw}
    return DatasetTask(datasets.Dataset.from_list(rows()) if data is None else data, **kw)


# ---------------------------------------------------------------- data
def test_rows_become_problems_with_their_columns():
    task = validate_task(make(), call=True)
    assert TASKS["dataset"] is DatasetTask
    test = task.test_set()
    assert len(test) == 3 and task.test_set() == test  # 25% of 12, the same on every call
    train_prompts = {task._train[i]["prompt"] for i in range(len(task._train))}
    assert not train_prompts & {p.prompt for p in test} and len(train_prompts) == 9  # held out, not trained on
    p = task.sample(1, np.random.default_rng(0))[0]
    row = next(r for r in rows() if r["prompt"] == p.prompt)
    assert p.answer == row["solution"] and p.meta == {"solution": row["solution"], "kind": row["kind"]}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_local_files_give_the_same_task(tmp_path, fmt):
    path = tmp_path / f"data.{fmt}"
    ds = datasets.Dataset.from_list(rows())
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    elif fmt == "parquet":
        ds.to_parquet(str(path))
    else:
        ds.to_csv(str(path), index=False)
    from_file, in_memory = make(str(path)), make()
    assert from_file.test_set() == in_memory.test_set()
    assert from_file.sample(5, np.random.default_rng(3)) == in_memory.sample(5, np.random.default_rng(3))


def test_a_test_file_and_a_datasetdict_split(tmp_path):
    test_file = tmp_path / "test.jsonl"
    test_file.write_text(json.dumps({"prompt": "99=", "solution": "99", "kind": "reverse"}) + "\n")
    task = make(test=str(test_file))
    assert [p.prompt for p in task.test_set()] == ["99="] and len(task._train) == 12
    dd = datasets.DatasetDict(train=datasets.Dataset.from_list(rows()[:8]), test=datasets.Dataset.from_list(rows()[8:]))
    task = make(dd, test="test", test_size=2)
    assert [p.prompt for p in task.test_set()] == ["2345=", "678="] and len(task._train) == 8


def test_sampling_uses_the_given_rng_only():
    task = make()
    np.random.seed(0)
    a = task.sample(20, np.random.default_rng(7))
    np.random.seed(1)
    b = task.sample(20, np.random.default_rng(7))
    assert a == b and [p.meta for p in a] == [p.meta for p in b]
    assert a != task.sample(20, np.random.default_rng(8))


# ---------------------------------------------------------------- rewards
def test_weighted_combination_matches_a_hand_computed_golden():
    weights = [0.5, 2.0, 0.1, 1.0]
    task = make(reward_weights=weights)
    problems = task.sample(6, np.random.default_rng(0)) + task.test_set()
    completions = [p.answer if i % 2 else p.answer[:-1] + "x" for i, p in enumerate(problems)]
    got = task.rewards(completions, problems)
    assert got == pytest.approx(golden(completions, problems, weights), abs=1e-12)
    assert any(p.meta["kind"] == "echo" for p in problems)  # the None branch was taken
    assert [task.reward(c, p) for c, p in zip(completions, problems)] == got  # a batch of one agrees
    table = task.function_rewards(completions, problems)
    assert list(table) == ["format_reward", "accuracy_reward", "reward_len", "reverse_only_reward"]
    assert all(v is None for v, p in zip(table["reverse_only_reward"], problems) if p.meta["kind"] == "echo")


def test_reward_functions_get_trls_arguments(tok):
    seen = {}

    def spy(prompts, completions, completion_ids, trainer_state, **kwargs):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, state=trainer_state, **kwargs)
        return [0.0] * len(completions)

    task = make(reward_funcs=[spy], correct_reward=None, tokenizer=tok)
    problems = [p for p in task.sample(2, np.random.default_rng(0)) for _ in range(3)]  # G = 3 per prompt
    task.rewards(["1", "2", "3", "4", "5", "6"], problems)
    assert seen["prompts"] == [p.prompt for p in problems] and seen["completions"] == list("123456")
    assert seen["solution"] == [p.answer for p in problems] and seen["kind"] == [p.meta["kind"] for p in problems]
    assert seen["ids"] == [tok(c, add_special_tokens=False).input_ids for c in "123456"]
    assert seen["state"].global_step == 0 and seen["state"].epoch == 0.0 and "prompt" not in seen
    assert callable(seen["log_metric"]) and callable(seen["log_extra"])


def test_completion_ids_without_a_tokenizer():
    seen = []

    def optional_ids(completions, completion_ids=None, **kwargs):  # asks with a default: gets None
        seen.append(completion_ids)
        return [0.0] * len(completions)

    def needs_ids(completions, completion_ids, **kwargs):
        return [float(len(i)) for i in completion_ids]

    p = make().test_set()[0]
    assert make(reward_funcs=[optional_ids], correct_reward=None).rewards(["1"], [p]) == [0.0] and seen == [None]
    with pytest.raises(ValueError, match=r"reward function 'needs_ids' requires completion_ids, but the task has no "
                                         r"tokenizer.*pass tokenizer=.*Trainer"):
        make(reward_funcs=[needs_ids], correct_reward=None).rewards(["1"], [p])


def test_a_shipped_checkpoint_names_the_tokenizer(base):
    def n_tokens(completions, completion_ids, **kwargs):
        return [float(len(i)) for i in completion_ids]

    task = make(reward_funcs=[n_tokens], correct_reward=None, tokenizer="arithmetic-base")  # as load_policy takes it
    p = task.test_set()[0]
    assert task.rewards(["12+3"], [p]) == [float(len(base[1]("12+3", add_special_tokens=False).input_ids))]
    with pytest.raises(FileNotFoundError, match=r"tokenizer='arithmetic-bsae' is neither an existing directory nor "
                                                r"a shipped checkpoint \(shipped: .*arithmetic-base"):
        make(reward_funcs=[n_tokens], correct_reward=None, tokenizer="arithmetic-bsae").rewards(["1"], [p])
    with pytest.raises(FileNotFoundError, match=r"tokenizer='\./nowhere/tok' is neither"):
        make(tokenizer="./nowhere/tok", chat_template=True).test_set()


@pytest.mark.parametrize("func, message", [
    (lambda completions, answer, **kw: [0.0] * len(completions),
     r"reward function '<lambda>' requires the parameter 'answer', which is neither one of TRL's arguments "
     r"\['prompts', 'completions', 'completion_ids', 'trainer_state', 'log_metric', 'log_extra'\] nor a column of the data "
     r"\(\['solution', 'kind'\]\); give it a default"),
    (lambda completions, soluton, **kw: [0.0] * len(completions), r"'soluton'.*did you mean 'solution'\?"),
    (lambda completion, **kw: [0.0], r"'completion'.*did you mean 'completions'\?"),
    (lambda completions, solution: [0.0] * len(completions), r"takes no \*\*kwargs.*\['prompts', 'completion_ids'"),
    (lambda completions, /, **kw: [0.0] * len(completions), r"'completions', which is positional-only"),
])
def test_reward_function_signatures_are_checked_when_the_task_is_built(func, message):
    with pytest.raises(ValueError, match=message):
        make(reward_funcs=[format_reward, func], correct_reward=None)
    ok = make(reward_funcs=[lambda completions, answer=None, **kw: [0.0] * len(completions)], correct_reward=None)
    assert ok.rewards(["1"], ok.test_set()[:1]) == [0.0]


def test_every_function_none_warns_and_gives_zero():
    task = make(reward_funcs=[reverse_only_reward], correct_reward=None)
    echo = [p for p in task.sample(40, np.random.default_rng(0)) if p.meta["kind"] == "echo"][:2]
    with pytest.warns(RuntimeWarning, match="every reward function returned None for 2 of 2 samples"):
        assert task.rewards(["1", "2"], echo) == [0.0, 0.0]


def counted(func, calls):
    """``func`` recording ``(its name, the batch size)`` in ``calls`` at every call."""
    def wrapper(prompts, completions, **kwargs):
        calls.append((func.__name__, len(completions)))
        return func(prompts=prompts, completions=completions, **kwargs)
    wrapper.__name__ = func.__name__
    return wrapper


def test_is_correct_calls_only_the_named_function_and_correct_reuses_the_rewards():
    calls = []
    task = make(reward_funcs=[counted(f, calls) for f in FUNCS])
    problems = task.test_set()
    assert task.is_correct(problems[0].answer, problems[0]) and calls == [("accuracy_reward", 1)]
    calls.clear()
    completions = [p.answer if i % 2 else "0" for i, p in enumerate(problems)]
    assert task.correct(completions, problems) == [False, True, False] and calls == [("accuracy_reward", 3)]
    calls.clear()
    task.rewards(completions, problems)
    assert task.correct(completions, problems) == [False, True, False]
    assert calls == [(f.__name__, 3) for f in FUNCS]  # correct reused the values rewards computed
    assert task.correct(completions[::-1], problems[::-1]) == [False, True, False] and len(calls) == 5
    assert task.correct(["0"] * 3, problems) == [False] * 3 and len(calls) == 6  # other completions: called again


def test_is_correct_reads_the_named_function():
    task = make(reward_weights=[5.0, 1.0, 0.0, 0.0])
    p = task.test_set()[0]
    assert task.is_correct(p.answer, p) and not task.is_correct("0", p)  # "0": format 1, accuracy 0
    total = make(correct_reward=None, correct_threshold=5.0, reward_weights=[5.0, 1.0, 0.0, 0.0])
    assert total.is_correct("0", p) and total.is_correct(p.answer, p) and not total.is_correct("x", p)


# ---------------------------------------------------------------- chat templates
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"


@pytest.fixture
def chat_tok(tok):
    t = copy.deepcopy(tok)
    t.chat_template = TEMPLATE
    return t


def test_conversational_prompts_use_the_chat_template(chat_tok):
    conv = [{"prompt": [{"role": "system", "content": "reverse"}, {"role": "user", "content": r["prompt"]}],
             "solution": r["solution"], "kind": r["kind"]} for r in rows()]
    seen = []

    def conv_accuracy(prompts, completions, solution, **kwargs):  # TRL's conversational shape
        seen.append((prompts, completions))
        return [1.0 if c[0]["content"] == s else 0.0 for c, s in zip(completions, solution)]

    task = make(datasets.Dataset.from_list(conv), reward_funcs=[conv_accuracy], tokenizer=chat_tok,
                correct_reward="conv_accuracy")
    p = task.test_set()[0]
    user = next(r for r in conv if r["solution"] == p.answer)["prompt"]
    assert p.prompt == f"<system>reverse\n<user>{user[1]['content']}\n<assistant>"
    assert task.rewards([p.answer], [p]) == [1.0] and task.is_correct(p.answer, p)
    assert seen[0] == ([user], [[{"role": "assistant", "content": p.answer}]])
    wrapped = make(tokenizer=chat_tok, chat_template=True).test_set()[0]
    assert wrapped.prompt.startswith("<user>") and wrapped.prompt.endswith("=\n<assistant>")


# ---------------------------------------------------------------- errors: one clear error each
def test_wrong_number_of_values_names_the_function():
    task = make(reward_funcs=[lambda completions, **kw: [1.0]], correct_reward=None)
    with pytest.raises(TypeError, match=r"reward function '<lambda>' returned 1 values for a batch of 2"):
        task.rewards(["1", "2"], task.test_set()[:2])


@pytest.mark.parametrize("bad, exc, message", [
    ("1.0", TypeError, r"returned '1.0' \(str\) for sample 1 \(prompt '"),
    ([1.0], TypeError, r"returned \[1.0\] \(list\) for sample 1"),
    (float("nan"), ValueError, r"returned nan for sample 1 \(prompt '.*='\); a reward must be finite"),
    (math.inf, ValueError, r"returned inf for sample 1"),
])
def test_a_value_that_is_not_a_number_names_function_and_sample(bad, exc, message):
    def shaky_reward(completions, **kwargs):
        return [0.0, bad, 0.0][:len(completions)]

    task = make(reward_funcs=[format_reward, shaky_reward], correct_reward=None)
    with pytest.raises(exc, match="reward function 'shaky_reward' " + message):
        task.rewards(["1", "2", "3"], task.test_set())


def test_numpy_and_torch_values_are_numbers():
    task = make(reward_funcs=[lambda completions, **kw: np.array([0.5] * len(completions)),
                              lambda completions, **kw: [torch.tensor(0.25)] * len(completions)],
                correct_reward=None)
    assert task.rewards(["1", "2"], task.test_set()[:2]) == [0.75, 0.75]


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(prompt_column="question"), ValueError, r"data has no column 'question' \(prompt_column\).*columns"),
    (dict(answer_column="solutoin"), ValueError, r"no column 'solutoin'.*did you mean 'solution'"),
    (dict(reward_weights=[1.0]), ValueError, r"reward_weights must be a list of 4 numbers"),
    (dict(reward_weights=[1.0, 1.0, 1.0, math.nan]), ValueError, r"finite"),
    (dict(correct_reward="accuracy"), ValueError, r"did you mean 'accuracy_reward'"),
    (dict(reward_funcs=[]), ValueError, r"reward_funcs is empty"),
    (dict(reward_funcs=[3]), TypeError, r"reward_funcs\[0\] must be a callable"),
    (dict(reward_funcs=["no_such_module:f"]), ValueError, r"cannot be imported"),
    (dict(test=1.5), ValueError, r"test fraction must be in \(0, 1\)"),
    (dict(test="validation"), ValueError, r"neither a file .* nor a split"),
    (dict(max_new_tokens=0), ValueError, r"max_new_tokens must be an int >= 1"),
    (dict(data=[1, 2]), TypeError, r"data must be a datasets.Dataset"),
    (dict(data="missing.jsonl"), FileNotFoundError, r"does not exist"),
])
def test_bad_settings_get_one_clear_error(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        make(**kwargs)


def test_bad_files_splits_and_prompts(tmp_path):
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(ValueError, match=r"must end in one of"):
        make(str(tmp_path / "data.txt"))
    dd = datasets.DatasetDict(train=datasets.Dataset.from_list(rows()))
    with pytest.raises(ValueError, match=r"no split 'trian'; did you mean 'train'"):
        make(dd, train_split="trian")
    clash = datasets.Dataset.from_list([{**r, "completions": 1} for r in rows()])
    with pytest.raises(ValueError, match=r"\['completions'\] would clash"):
        make(clash)
    conv = datasets.Dataset.from_list([{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows()])
    with pytest.raises(ValueError, match=r"no tokenizer was given"):
        make(conv).test_set()
    with pytest.raises(ValueError, match=r"is a conversation, which needs a chat template"):
        make(conv, chat_template=False).test_set()


# ---------------------------------------------------------------- the trainer
@pytest.fixture(scope="module")
def base():
    return load_policy(checkpoint_dir("arithmetic-base"))


CFG = dict(prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=2, progress=False, lr=3e-3, seed=0)


def test_training_uses_the_combined_reward_once_per_round(base):
    log = []

    def logged(func):
        def wrapper(prompts, completions, **kwargs):
            out = func(prompts=prompts, completions=completions, **kwargs)
            log.append((func.__name__, list(completions), out))
            return out
        wrapper.__name__ = func.__name__
        return wrapper

    weights = [0.5, 2.0, 0.1, 1.0]
    task = make(reward_funcs=[logged(f) for f in FUNCS], reward_weights=weights)
    policy, tok = base
    trainer = Trainer(copy.deepcopy(policy), tok, task, GRPO, TrainerConfig(**CFG))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        trainer.train(2)
    batched = [entry for entry in log if len(entry[1]) == 8]  # the trainer's calls: one per function and step
    assert len(batched) == 4 * 2
    for step in (1, 2):
        calls = batched[4 * (step - 1): 4 * step]
        assert [c[0] for c in calls] == [f.__name__ for f in FUNCS]
        per_sample = [sum(w * c[2][i] for w, c in zip(weights, calls) if c[2][i] is not None) for i in range(8)]
        assert trainer.history.loc[trainer.history.step == step, "reward"].item() == pytest.approx(
            float(torch.tensor(per_sample, dtype=torch.float32).mean()), abs=1e-6)
    assert trainer.history["test_accuracy"].notna().sum() == 2  # evaluate ran with is_correct (steps 0 and 2)


def test_training_and_evaluation_score_each_batch_once(base):
    calls = []
    task = make(reward_funcs=[counted(f, calls) for f in FUNCS], reward_weights=[0.5, 2.0, 0.1, 1.0])
    policy, tok = base
    trainer = Trainer(copy.deepcopy(policy), tok, task, GRPO, TrainerConfig(**CFG))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        trainer.train(2)
    # two rounds of 8 (every function once: correctness reuses the rewards), two evaluations of the 3
    # test rows (the correct_reward function only); never a batch of one
    assert sorted(calls) == sorted([(f.__name__, 8) for f in FUNCS] * 2 + [("accuracy_reward", 3)] * 2)


def test_a_trl_length_reward_reads_the_trainers_tokenizer(base):
    seen = []

    def token_count_reward(completions, completion_ids, solution, **kwargs):  # a TRL length reward over token ids
        seen.append((list(completions), completion_ids, solution))
        return [-float(len(ids)) for ids in completion_ids]

    policy, tok = base
    task = make(reward_funcs=[accuracy_reward, token_count_reward], reward_weights=[1.0, 0.1])  # no tokenizer=
    trainer = Trainer(copy.deepcopy(policy), tok, task, GRPO, TrainerConfig(**{**CFG, "eval_every": 0}))
    trainer.train(1)
    completions, ids, solution = seen[0]
    # TRL's completion_ids: the sampled ids, EOS included (issue 54): the decoded text re-encoded, plus the EOS a
    # terminated row ends with (a truncated row has none), and their lengths are the history's length column
    eos, budget = tok.eos_token_id, trainer.max_new_tokens
    assert len(completions) == 8 and all(i == tok(c, add_special_tokens=False).input_ids + [eos] if i[-1] == eos
                                         else len(i) == budget and eos not in i for c, i in zip(completions, ids))
    assert float(np.mean([len(i) for i in ids])) == pytest.approx(trainer.history["length"].dropna().item())
    expected = [float(c.strip() == s) - 0.1 * len(i) for c, i, s in zip(completions, ids, solution)]
    assert trainer.history["reward"].dropna().item() == pytest.approx(float(torch.tensor(expected).mean()), abs=1e-6)


class BatchedCorrectTask:
    """A task with the optional batched ``correct`` that returns ``values`` (to check the trainer)."""

    name, max_new_tokens = "batched-correct", 4

    def __init__(self, values):
        self.values, self.sizes = values, []

    def sample(self, n, rng):
        return [Problem(f"{int(rng.integers(10))}=", "1") for _ in range(n)]

    def reward(self, completion, problem):
        return 0.0

    def correct(self, completions, problems):
        self.sizes.append(len(completions))
        return self.values(len(completions))

    def is_correct(self, completion, problem):
        raise AssertionError("the trainer must call correct, not is_correct")

    def test_set(self):
        return self.sample(3, np.random.default_rng(0))


@pytest.mark.parametrize("values, exc, message", [
    (lambda n: [True] * (n + 1), TypeError, r"task.correct returned 9 values for 8 completions"),
    (lambda n: [True] * (n - 1) + [1], TypeError, r"task.correct returned 1 \(int\) for sample 7 \(prompt '"),
])
def test_trainer_calls_a_batched_correct_once_per_round(base, values, exc, message):
    policy, tok = base
    good = BatchedCorrectTask(lambda n: [True, False] * (n // 2) + [True] * (n % 2))
    trainer = Trainer(copy.deepcopy(policy), tok, good, GRPO, TrainerConfig(**CFG))
    trainer.train(2)
    assert good.sizes == [3, 8, 8, 3] and trainer.history["accuracy"].dropna().tolist() == [0.5, 0.5]
    assert trainer.history["test_accuracy"].dropna().tolist() == pytest.approx([2 / 3, 2 / 3])
    bad = Trainer(copy.deepcopy(policy), tok, BatchedCorrectTask(values), GRPO, TrainerConfig(**{**CFG, "eval_every": 0}))
    with pytest.raises(exc, match=message):
        bad.train(1)


def test_validate_task_checks_that_batched_and_single_correctness_agree():
    class Disagreeing(BatchedCorrectTask):
        def is_correct(self, completion, problem):
            return True

    with pytest.raises(TypeError, match=r"correct\(\[completion\], \[problem\]\) gave False but is_correct"):
        validate_task(Disagreeing(lambda n: [False] * n), call=True)
    assert validate_task(Disagreeing(lambda n: [True] * n), call=True)
    with pytest.raises(TypeError, match=r"correct\(completions, problems\) returned \[1\] for one completion"):
        validate_task(Disagreeing(lambda n: [1] * n), call=True)


def test_same_seed_same_run(base):
    policy, tok = base

    def run():
        trainer = Trainer(copy.deepcopy(policy), tok, make(), GRPO, TrainerConfig(**{**CFG, "eval_every": 0}))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            trainer.train(2)
        return trainer.history.drop(columns=["tokens_per_s", "gen_seconds", "step_seconds", "peak_mem_mb"],
                                    errors="ignore")

    assert run().equals(run())


def test_a_bad_reward_function_stops_training_with_its_name(base):
    policy, tok = base
    task = make(reward_funcs=[lambda completions, **kw: [None] * (len(completions) - 1)], correct_reward=None)
    trainer = Trainer(copy.deepcopy(policy), tok, task, GRPO, TrainerConfig(**{**CFG, "eval_every": 0}))
    with pytest.raises(TypeError, match=r"reward function '<lambda>' returned 7 values for a batch of 8"):
        trainer.train(1)


class BatchedTask:
    """A task with the optional batched ``rewards`` that returns ``values`` (to check Trainer.score)."""

    name, max_new_tokens = "batched", 4

    def __init__(self, values):
        self.values = values

    def sample(self, n, rng):
        return [Problem(f"{int(rng.integers(10))}=", "1") for _ in range(n)]

    def reward(self, completion, problem):
        return 0.0

    def rewards(self, completions, problems):
        return self.values(len(completions))

    def is_correct(self, completion, problem):
        return False

    def test_set(self):
        return self.sample(2, np.random.default_rng(0))


@pytest.mark.parametrize("values, exc, message", [
    (lambda n: [0.0] * (n + 1), TypeError, r"task.rewards returned 9 values for 8 completions"),
    (lambda n: [0.0] * (n - 1) + ["x"], TypeError, r"task.rewards returned 'x' \(str\) for sample 7"),
    (lambda n: [0.0] * (n - 1) + [math.inf], ValueError, r"task.rewards returned inf for sample 7"),
])
def test_trainer_checks_a_batched_reward(base, values, exc, message):
    policy, tok = base
    trainer = Trainer(copy.deepcopy(policy), tok, BatchedTask(values), GRPO, TrainerConfig(**{**CFG, "eval_every": 0}))
    with pytest.raises(exc, match=message):
        trainer.train(1)


def test_validate_task_checks_that_batched_and_single_rewards_agree():
    with pytest.raises(TypeError, match=r"rewards\(\[completion\], \[problem\]\) gave 1.0 but reward"):
        validate_task(BatchedTask(lambda n: [1.0] * n), call=True)
    assert validate_task(BatchedTask(lambda n: [0.0] * n), call=True)


def test_resume_rebuilds_a_task_of_files_and_import_paths(base, tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent("""
        def accuracy_reward(completions, solution, **kwargs):
            return [1.0 if c.strip() == s else 0.0 for c, s in zip(completions, solution)]
        def reward_len(completions, **kwargs):
            return [-abs(4 - len(c)) for c in completions]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    task = make(str(path), reward_funcs=["my_rewards:accuracy_reward", "my_rewards.reward_len"], reward_weights=[1, .1])
    policy, tok = base
    cfg = TrainerConfig(**{**CFG, "eval_every": 0})
    straight = Trainer(copy.deepcopy(policy), tok, task, GRPO, cfg)
    straight.train(2)
    first = Trainer(copy.deepcopy(policy), tok, task, GRPO, cfg)
    first.train(1)
    first.save(tmp_path / "ckpt")
    resumed = Trainer.resume(tmp_path / "ckpt")  # no task=: rebuilt from the registry and the stored fields
    assert isinstance(resumed.task, DatasetTask) and resumed.task.reward_funcs == task.reward_funcs
    resumed.train(1)
    cols = ["step", "reward", "accuracy", "loss", "kl", "grad_norm"]
    assert straight.history[cols].equals(resumed.history[cols])
    in_memory = make()
    trainer = Trainer(copy.deepcopy(policy), tok, in_memory, GRPO, cfg)
    trainer.save(tmp_path / "mem")
    with pytest.raises(ValueError, match=r"task=DatasetTask\(\.\.\.\)"):
        Trainer.resume(tmp_path / "mem")
    assert Trainer.resume(tmp_path / "mem", task=in_memory).task is in_memory
    assert "my_rewards" in sys.modules
