"""Tests for grpo_lab.tasks.gsm8k.GSM8KTask: the protocol and registry, the fixture's split and
sampling, chat-templated prompts with a Qwen2.5-type tokenizer in the hub layout, the local copy of
the hub dataset read through the hub's call, and one GRPO step on CPU.

Nothing is downloaded: the "hub" model and dataset are stand-ins written by tests/_hub_fixture.py.
Expected answers below were read by hand from data/tasks/gsm8k_fixture.jsonl (row k is line k + 1)
and checked by hand arithmetic; expected prompts were written out by hand from the documented
format, not copied from the code's output.
"""

import json
import pickle
import sys

import numpy as np
import pytest

pytest.importorskip("math_verify")

import _hub_fixture as H

from grpo_lab.paths import checkpoint_dir
from grpo_lab.tasks import TASKS, GSM8KTask, Problem, Task, get_task, task_from_spec, task_spec, validate_task
from grpo_lab.tasks import gsm8k
from grpo_lab.tasks.gsm8k import DEFAULT_INSTRUCTION, load_fixture

# Final answers of the fixture's rows 16..23 (its last 8 rows, the test split), by hand:
# 75*24-1530 = 270; 432/18 = 24; 150*0.8-10 = 110; 14*5*6 = 420; 3000*0.92 = 2760;
# 12*3*2/24 = 3; 125 + (2*125-30) = 345; 1150*22-759 = 24541.
TEST_GOLDS = ["270", "24", "110", "420", "2760", "3", "345", "24541"]
# Rows 0..15 (the train split): 24*36-150 = 714, ..., 3*11 + 11 + 2*5 = 54.
TRAIN_GOLDS = ["714", "1060", "-7", "1340", "460", "10", "447", "2", "253", "12.5", "2736", "816", "7", "1320",
               "90", "54"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny Qwen2 instruct model with a Qwen2.5-type tokenizer, in the hub layout."""
    return H.write_tiny_instruct_model(tmp_path_factory.mktemp("tiny-instruct"))


@pytest.fixture(scope="module")
def hub_data(tmp_path_factory):
    """The fixture's problems in the layout of the hub repository openai/gsm8k."""
    pytest.importorskip("pyarrow")  # pandas writes parquet with it (datasets, which reads it, needs it too)
    return H.write_gsm8k_hub_dir(tmp_path_factory.mktemp("gsm8k-hub"))


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    """``datasets`` with its cache in tmp_path and the hub offline; the module."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", type(datasets.config.HF_DATASETS_CACHE)(tmp_path))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return datasets


# ------------------------------------------------------------------------- protocol, registry
def test_protocol_registry_and_spec_round_trip(tiny_dir):
    task = GSM8KTask()
    assert validate_task(task, call=True) is task and isinstance(task, Task)
    assert TASKS["gsm8k"] is GSM8KTask and get_task("gsm8k") == GSM8KTask()
    assert get_task("gsm8k", test_size=3).test_size == 3
    custom = GSM8KTask(tokenizer_name=tiny_dir, system_prompt="Be brief.", instruction="", test_size=4,
                       max_new_tokens=64)
    spec = json.loads(json.dumps(task_spec(custom)))  # JSON-able: the tokenizer is named, not held
    assert spec["name"] == "gsm8k" and spec["params"]["tokenizer_name"] == str(tiny_dir)
    again = task_from_spec(spec)
    assert again == custom and again is not custom
    assert again.test_set()[0].prompt == custom.test_set()[0].prompt


def test_settings_are_checked_when_built(tmp_path):
    for kwargs, match in [({"test_size": 0}, "test_size"), ({"max_new_tokens": True}, "max_new_tokens"),
                          ({"max_new_tokens": 2.0}, "max_new_tokens"), ({"config": ""}, "config"),
                          ({"instruction": None}, "instruction"), ({"tokenizer_name": ""}, "tokenizer_name"),
                          ({"source": 3}, "source")]:
        with pytest.raises(ValueError, match=match):
            GSM8KTask(**kwargs)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        GSM8KTask(source=str(tmp_path / "nowhere.jsonl"))
    (tmp_path / "data.csv").write_text("question,answer\n")
    with pytest.raises(ValueError, match=r"\.jsonl or a \.parquet"):
        GSM8KTask(source=str(tmp_path / "data.csv"))


def test_nothing_is_read_until_first_use_and_then_only_once(monkeypatch):
    calls = []
    real = gsm8k.load_fixture
    monkeypatch.setattr(gsm8k, "load_fixture", lambda *a: calls.append(a) or real(*a))
    task = GSM8KTask()
    validate_task(task)
    assert calls == []
    first = task.test_set()
    task.sample(4, np.random.default_rng(0))
    task.sample(4, np.random.default_rng(1))
    assert task.test_set() is first  # the same list on every call
    assert len(calls) == 1
    # A pickled task (sent to a worker) carries its settings, not what it has read.
    clone = pickle.loads(pickle.dumps(task))
    assert clone == task and clone._rows is None and clone.test_set() == first


def test_datasets_is_imported_only_for_hub_directory_and_parquet_sources(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    task = GSM8KTask()
    assert len(task.test_set()) == 8 and len(task.sample(3, np.random.default_rng(0))) == 3
    (tmp_path / "x.parquet").write_bytes(b"")
    for source in ("hub", str(tmp_path), str(tmp_path / "x.parquet")):
        lazy = GSM8KTask(source=source)  # building never imports it
        with pytest.raises(ImportError, match="pip install datasets"):
            lazy.test_set()


# ------------------------------------------------------------------------- fixture split, sampling
def test_fixture_split_is_the_first_16_rows_for_training_and_the_last_8_for_test():
    rows = GSM8KTask().rows()
    fixture = load_fixture()
    assert rows["train"] == fixture[:16] and rows["test"] == fixture[16:]
    test = GSM8KTask().test_set()
    assert [p.answer for p in test] == TEST_GOLDS
    assert [p.meta["index"] for p in test] == list(range(8))
    assert [p.meta["question"] for p in test] == [r["question"] for r in fixture[16:]]
    assert [p.answer for p in GSM8KTask(test_size=3).test_set()] == TEST_GOLDS[:3]
    with pytest.raises(ValueError, match="test_size=9 .* has 8 problems"):
        GSM8KTask(test_size=9).test_set()


def test_sample_is_reproducible_draws_only_training_problems_and_answers_are_the_gold_finals():
    task = GSM8KTask()
    a = task.sample(10, np.random.default_rng(7))
    assert a == GSM8KTask().sample(10, np.random.default_rng(7))  # a fresh task, the same seed
    assert a != task.sample(10, np.random.default_rng(8))
    assert len({p.meta["index"] for p in a}) == 10  # a batch no larger than the split has no repeats
    test_questions = {p.meta["question"] for p in task.test_set()}
    many = task.sample(40, np.random.default_rng(0))  # more than the 16 training problems: with replacement
    assert len(many) == 40 and {p.meta["index"] for p in many} <= set(range(16))
    for p in a + many:
        assert p.answer == TRAIN_GOLDS[p.meta["index"]]
        assert p.meta["question"] not in test_questions
        assert p.prompt == task.format_prompt(p.meta["question"])
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        task.sample(0, np.random.default_rng(0))


def test_single_jsonl_and_parquet_files_are_split_like_the_fixture(tmp_path, datasets_cache):
    import pandas as pd

    rows = load_fixture()[:6]  # 6 rows: the last 6 // 3 = 2 are the test split
    path = tmp_path / "six.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame(rows).to_parquet(tmp_path / "six.parquet", index=False)
    for source in (path, tmp_path / "six.parquet"):
        task = GSM8KTask(source=source)
        assert task.source == str(source)
        assert [p.answer for p in task.test_set()] == ["460", "10"]  # rows 4 and 5
        assert {p.answer for p in task.sample(4, np.random.default_rng(0))} == {"714", "1060", "-7", "1340"}
    pd.DataFrame({"problem": ["q"] * 3, "answer": ["#### 1"] * 3}).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['question'\]"):
        GSM8KTask(source=tmp_path / "bad.parquet").test_set()


# ------------------------------------------------------------------------- prompts
def test_plain_prompt_without_a_tokenizer():
    task = GSM8KTask(system_prompt="Be brief.", instruction="Box it.")
    assert task.format_prompt("What is 2+3?") == "Be brief.\n\nQuestion: What is 2+3?\nBox it.\nAnswer:"
    assert GSM8KTask(instruction="").format_prompt("What is 2+3?") == "Question: What is 2+3?\nAnswer:"
    assert GSM8KTask().format_prompt("Q?") == f"Question: Q?\n{DEFAULT_INSTRUCTION}\nAnswer:"
    assert GSM8KTask().chat_tokenizer() is None


def test_chat_template_prompt_with_the_hub_layout_tokenizer(tiny_dir):
    task = GSM8KTask(tokenizer_name=str(tiny_dir), instruction="Box it.")
    # Written out by hand from the ChatML template of _hub_fixture (a default system turn when none is given).
    assert task.format_prompt("What is 2+3?") == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?\nBox it.<|im_end|>\n"
        "<|im_start|>assistant\n")
    own_system = GSM8KTask(tokenizer_name=str(tiny_dir), instruction="Box it.", system_prompt="Be brief.")
    assert own_system.format_prompt("What is 2+3?") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3?\nBox it.<|im_end|>\n"
        "<|im_start|>assistant\n")
    for p in task.sample(3, np.random.default_rng(0)) + task.test_set():
        assert "<|im_start|>user\n" + p.meta["question"] + "\nBox it.<|im_end|>" in p.prompt
        assert p.prompt.endswith("<|im_start|>assistant\n")
    assert task.chat_tokenizer() is task.chat_tokenizer()  # loaded once
    assert type(task.chat_tokenizer()).__name__ == "Qwen2Tokenizer"


def test_a_tokenizer_without_chat_template_or_missing_is_a_clear_error(tmp_path):
    char_checkpoint = checkpoint_dir("arithmetic-base")
    if not char_checkpoint.is_dir():
        pytest.skip("the shipped checkpoint is not available")
    with pytest.raises(ValueError, match="has no chat template; leave tokenizer_name=None"):
        GSM8KTask(tokenizer_name=str(char_checkpoint)).test_set()
    with pytest.raises(FileNotFoundError, match="tokenizer_name '.*missing' is neither an existing directory"):
        GSM8KTask(tokenizer_name=str(tmp_path / "missing")).format_prompt("Q?")


def test_load_policy_reads_the_hub_layout_model_directory(tiny_dir):
    from grpo_lab.policy.models import load_policy
    from grpo_lab.policy.rollout import stop_token_ids

    model, tok = load_policy(tiny_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.config.num_hidden_layers == 2
    assert type(tok).__name__ == "Qwen2Tokenizer" and tok.pad_token == H.ENDOFTEXT and tok.bos_token is None
    ids = tok.convert_tokens_to_ids([H.IM_END, H.ENDOFTEXT])
    assert stop_token_ids(model, tok) == ids  # EOS <|im_end|>, then generation_config's <|endoftext|>
    text = "Tom has 1,234 apples.\n#### 1234 and \\boxed{42}"
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text  # byte-level: lossless


def test_a_chat_prompt_reaches_the_model_with_one_bos(tmp_path):
    """A template that writes the BOS itself (Llama 3's) and a tokenizer that adds one: generate
    encodes prompts with add_special_tokens=False, so the policy sees exactly one."""
    from grpo_lab.policy.models import load_policy
    from grpo_lab.policy.rollout import generate

    directory = H.write_tiny_instruct_model(tmp_path / "bos", bos=True)
    model, tok = load_policy(directory)
    task = GSM8KTask(tokenizer_name=str(directory), max_new_tokens=4)
    problems = task.sample(2, np.random.default_rng(0))
    assert problems[0].prompt.startswith(H.BOS + "<|im_start|>system")
    bos = tok.bos_token_id
    assert tok(problems[0].prompt).input_ids[:2] == [bos, bos]  # what add_special_tokens=True would do
    with pytest.warns(UserWarning, match="neutralised"):  # the checkpoint's sampling settings are not used
        ro = generate(model, tok, problems, max_new_tokens=4)
    for ids, mask in zip(ro.prompt_ids, ro.prompt_mask):
        real = ids[mask.bool()].tolist()
        assert real[0] == bos and real.count(bos) == 1


# ------------------------------------------------------------------------- local copy of the hub dataset
def test_a_local_directory_in_the_hub_layout_loads_through_the_hub_call(hub_data, datasets_cache, monkeypatch):
    real = datasets_cache.load_dataset
    calls = []

    def spy(path, *args, **kwargs):  # records the call; serves the hub id from the local copy
        calls.append((path, args, kwargs))
        return real(str(hub_data) if path == "openai/gsm8k" else path, *args, **kwargs)

    monkeypatch.setattr(datasets_cache, "load_dataset", spy)
    local, hub = GSM8KTask(source=str(hub_data)), GSM8KTask(source="hub")
    assert local.rows() == hub.rows() == GSM8KTask().rows()
    assert calls == [(str(hub_data), ("main",), {"split": "train"}), (str(hub_data), ("main",), {"split": "test"}),
                     ("openai/gsm8k", ("main",), {"split": "train"}), ("openai/gsm8k", ("main",), {"split": "test"})]
    assert [p.answer for p in local.test_set()] == TEST_GOLDS
    with pytest.raises(ValueError, match="'socratic'.*laid out as the hub repository"):
        GSM8KTask(source=str(hub_data), config="socratic").test_set()


def test_hub_dataset_offline_and_not_cached_is_a_clear_error(datasets_cache, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    task = GSM8KTask(source="hub", dataset_id="grpo-lab-tests/no-such-dataset")
    with pytest.raises(Exception, match="could not load 'grpo-lab-tests/no-such-dataset'.*HF_HUB_OFFLINE") as info:
        task.test_set()
    assert not isinstance(info.value, AssertionError)


# ------------------------------------------------------------------------- rewards read the completion only
def test_reward_reads_the_completion_not_the_prompt():
    task = GSM8KTask(system_prompt="Example: 40+2 gives \\boxed{42}.", instruction="Answer like \\boxed{42}.")
    p = Problem(task.format_prompt("What is 40+2?"), "42")
    assert "\\boxed{42}" in p.prompt
    assert task.reward(p.prompt + " I am not sure.", p) == 1.0  # what scoring prompt + completion would give
    assert task.reward(" I am not sure.", p) == 0.0 and task.is_correct(" I am not sure.", p) is False
    assert task.reward("40+2 = 42, so \\boxed{42}", p) == 1.0 and task.is_correct("\\boxed{42}", p) is True
    for q in GSM8KTask().test_set():
        assert task.reward(f"So the answer is \\boxed{{{q.answer}}}.", q) == 1.0
        assert task.reward("So the answer is \\boxed{1}.", q) == 0.0  # no test answer is 1
    assert GSM8KTask().test_set()[0].answer == "270"
    assert task.reward("75*24 = 1800 bottles; 1800 - 1530 = 270.\n#### 270", GSM8KTask().test_set()[0]) == 1.0


@pytest.mark.filterwarnings("ignore:generate. neutralised")
def test_rollout_texts_of_chat_prompts_are_the_completions_only(tiny_dir):
    from grpo_lab.policy.models import load_policy
    from grpo_lab.policy.rollout import generate

    model, tok = load_policy(tiny_dir)
    task = GSM8KTask(tokenizer_name=str(tiny_dir), system_prompt="Example: \\boxed{42}.")
    p = Problem(task.format_prompt("What is 40+2?"), "42")
    ro = generate(model, tok, [p], group_size=2, max_new_tokens=8)
    for text in ro.texts:
        assert "\\boxed{42}" not in text and "<|im_start|>system" not in text
        assert task.reward(text, p) == 0.0


# ------------------------------------------------------------------------- end to end on CPU
@pytest.mark.filterwarnings("ignore:generate. neutralised")
def test_one_grpo_step_and_evaluation_on_the_hub_layout_model(tiny_dir):
    from grpo_lab.policy.models import load_policy
    from grpo_lab.policy.rollout import evaluate
    from grpo_lab.training.trainer import Trainer, TrainerConfig

    model, tok = load_policy(tiny_dir)
    task = GSM8KTask(source="fixture", tokenizer_name=str(tiny_dir), max_new_tokens=16)
    cfg = TrainerConfig(prompts_per_step=2, group_size=2, eval_every=0, seed=0, progress=False)
    trainer = Trainer(model, tok, task, "GRPO", cfg)
    history = trainer.train(1)  # a random policy's rewards are (almost surely) 0: that is fine here
    assert trainer.step == 1 and len(history) == 1
    assert 0.0 <= history["reward"].iloc[0] <= 1.0 and 0.0 <= history["accuracy"].iloc[0] <= 1.0
    assert 1 <= history["length"].iloc[0] <= 16

    summary, frame = evaluate(model, tok, task)
    assert len(frame) == 8 and frame["prompt"].tolist() == [p.prompt for p in task.test_set()]
    assert frame["answer"].tolist() == TEST_GOLDS
    assert 0.0 <= summary["accuracy"] <= 1.0 and (frame["length"] <= 16).all()
    assert frame["index"].tolist() == list(range(8))
