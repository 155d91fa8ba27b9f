"""A checkpoint records a fingerprint of its task's data and reward functions; a resume with other
ones warns, and strict=True refuses (issue 54). The golds are the hand-made differences: another
file, another Dataset's content, another reward function; the same data built twice agrees."""

import copy
import json
import warnings

import datasets
import pytest

from grpo_lab.algo.algorithms import GRPO
from grpo_lab.paths import checkpoint_dir
from grpo_lab.policy.models import load_policy
from grpo_lab.tasks import ArithmeticTask, DatasetTask, GSM8KTask
from grpo_lab.tasks.base import check_fingerprint, source_fingerprint, task_fingerprint
from grpo_lab.training.trainer import Trainer, TrainerConfig

ROWS = [{"prompt": w + "=", "solution": w[::-1]} for w in ("1234", "567", "8912", "345", "6789", "123", "4567", "891")]


def exact(completions, solution, **kwargs):
    return [float(c.strip() == s) for c, s in zip(completions, solution)]


def length(completions, **kwargs):
    return [-abs(4 - len(c)) for c in completions]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _task(data, funcs=(exact,)):
    return DatasetTask(data, reward_funcs=list(funcs), answer_column="solution", test=0.25, max_new_tokens=4)


def _no_warning(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn()


def test_dataset_fingerprint_is_its_content_not_the_object():
    one = datasets.Dataset.from_list(ROWS)
    two = datasets.concatenate_datasets([datasets.Dataset.from_list(ROWS[:3]), datasets.Dataset.from_list(ROWS[3:])])
    assert one._fingerprint != two._fingerprint                        # datasets' own id follows the operations
    assert source_fingerprint(one) == source_fingerprint(two)          # the content is the same
    other = datasets.Dataset.from_list(ROWS[:-1] + [{"prompt": "9=", "solution": "9"}])
    assert source_fingerprint(other) != source_fingerprint(one)
    fp = task_fingerprint(_task(one, (exact, length)))
    assert fp["reward_funcs"] == [f"{__name__}:exact", f"{__name__}:length"]
    assert task_fingerprint(ArithmeticTask())["reward_funcs"] == ["grpo_lab.tasks.arithmetic:ArithmeticTask.reward"]
    assert task_fingerprint(ArithmeticTask())["data"] == {}


def test_fingerprint_comparison_names_what_differs(tmp_path):
    a = _task(_jsonl(tmp_path / "a.jsonl", ROWS))
    saved = task_fingerprint(a)
    _no_warning(lambda: check_fingerprint(saved, _task(_jsonl(tmp_path / "a.jsonl", ROWS)), where="ck"))  # same
    b = _task(_jsonl(tmp_path / "b.jsonl", ROWS[::-1]))
    with pytest.warns(RuntimeWarning, match=r"data file 'data': .*b\.jsonl .* is not the saved .*a\.jsonl"):
        check_fingerprint(saved, b, where="ck")
    ds = task_fingerprint(_task(datasets.Dataset.from_list(ROWS)))
    with pytest.warns(RuntimeWarning, match=r"dataset content 'data'"):
        check_fingerprint(ds, _task(datasets.Dataset.from_list(ROWS[:-1])), where="ck")
    with pytest.warns(RuntimeWarning, match=r"reward functions .*length.* \(saved .*exact"):
        check_fingerprint(saved, _task(_jsonl(tmp_path / "a.jsonl", ROWS), (length,)), where="ck")
    with pytest.raises(ValueError, match=r"strict=True refuses .*|data file"):
        check_fingerprint(saved, b, where="ck", strict=True)
    with pytest.warns(UserWarning, match="records no fingerprint"):
        check_fingerprint(None, b, where="ck", strict=True)              # an older checkpoint: a note, not an error


def test_gsm8k_fingerprint_is_the_content_of_its_rows():
    pytest.importorskip("math_verify")
    fp = task_fingerprint(GSM8KTask())
    assert set(fp["data"]) == {"rows"} and fp == task_fingerprint(GSM8KTask(test_size=2))  # same rows, same data
    assert fp["reward_funcs"] == ["grpo_lab.tasks.gsm8k:GSM8KTask.reward"]


def test_resume_with_other_data_warns_and_strict_raises(tmp_path):
    policy, tok = load_policy(checkpoint_dir("arithmetic-base"))
    cfg = TrainerConfig(prompts_per_step=2, group_size=2, max_new_tokens=4, eval_every=0, progress=False)
    Trainer(copy.deepcopy(policy), tok, _task(_jsonl(tmp_path / "a.jsonl", ROWS)), GRPO, cfg).save(tmp_path / "ck")
    state = json.loads((tmp_path / "ck" / "state.json").read_text())
    assert state["task"]["fingerprint"]["data"]["data"]["file"].endswith("a.jsonl")
    _no_warning(lambda: Trainer.resume(tmp_path / "ck", task=_task(str(tmp_path / "a.jsonl"))))  # the same data
    other = _task(_jsonl(tmp_path / "b.jsonl", ROWS[:-2]))
    with pytest.warns(RuntimeWarning, match=r"differ from those .*ck was trained with: data file"):
        Trainer.resume(tmp_path / "ck", task=other)
    with pytest.raises(ValueError, match="strict=True refuses"):
        Trainer.resume(tmp_path / "ck", task=other, strict=True)
    _jsonl(tmp_path / "a.jsonl", ROWS[:-1])                              # the saved file itself changed
    with pytest.warns(RuntimeWarning, match=r"a\.jsonl .* has other bytes than when saved"):
        Trainer.resume(tmp_path / "ck", task=_task(str(tmp_path / "a.jsonl")))
    del state["task"]["fingerprint"]                                     # a checkpoint saved before fingerprints
    (tmp_path / "ck" / "state.json").write_text(json.dumps(state))
    with pytest.warns(UserWarning, match="records no fingerprint"):
        Trainer.resume(tmp_path / "ck", task=other, strict=True)
