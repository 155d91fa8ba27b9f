"""TRL's reward-function contract, whole (issue 54): trainer_state, log_metric / log_extra, async functions,
reward models, one column per function, the sampled completion_ids; the TRL / verl metrics and names, the
completions table; an empty data file; a reward function that raises.

The reward functions are written in the shapes TRL 1.16's GRPOTrainer documentation gives them (its "Using a
custom reward function" section): a curriculum reward reading ``trainer_state.global_step``, a function logging
with ``log_metric`` / ``log_extra``, an ``async def`` judge, a reward model."""

import asyncio
import json
import time
import warnings

import datasets
import numpy as np
import pytest
import torch

from grpo_lab.algo.algorithms import GRPO
from grpo_lab.paths import checkpoint_dir
from grpo_lab.policy.models import load_policy
from grpo_lab.policy.rollout import Rollout
from grpo_lab.tasks import DatasetTask, Problem
from grpo_lab.tasks.dataset_task import RewardFunctionError, RewardModelFunc, RewardTrainerState
from grpo_lab.training.callbacks import TRL_METRIC_NAMES, VERL_METRIC_NAMES, logged_row
from grpo_lab.training.collection import Scored, completion_id_lists
from grpo_lab.training.history import HISTORY_COLUMNS, sample_metrics
from grpo_lab.training.trainer import Trainer, TrainerConfig

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10, 14) for b in range(10, 14)]
CFG = dict(prompts_per_step=2, group_size=3, max_new_tokens=5, eval_every=0, progress=False, lr=3e-3, seed=0)


@pytest.fixture(scope="module")
def base():
    return load_policy(checkpoint_dir("arithmetic-base"))


# ------------------------------------------------------------- functions in TRL's documented shapes
def curriculum_reward(completions, trainer_state, **kwargs):
    """TRL docs: a reward whose weight grows with training progress (reads trainer_state.global_step)."""
    STATES.append(trainer_state)
    return [min(1.0, trainer_state.global_step / 10) * len(c) for c in completions]


def logging_reward(completions, answer, log_metric=None, log_extra=None, **kwargs):
    """TRL docs: log a scalar and a per-sample column from inside a reward function."""
    rewards = [float(c.strip() == a) for c, a in zip(completions, answer)]
    if log_metric is not None:
        log_metric("accuracy_seen", float(np.mean(rewards)))
    if log_extra is not None:
        log_extra("golden_answer", list(answer))
    return rewards


async def async_judge(prompts, completions, **kwargs):
    """TRL docs: an async reward function (an LLM judge over the network, simulated by a sleep)."""
    await asyncio.sleep(0.05)
    return [0.5] * len(completions)


async def async_judge_2(prompts, completions, **kwargs):
    await asyncio.sleep(0.05)
    return [0.25] * len(completions)


STATES: list = []


def test_trl_shaped_functions_train_and_get_their_own_columns(base, tmp_path):
    STATES.clear()
    policy, tok = base
    task = DatasetTask(datasets.Dataset.from_list(ROWS), [curriculum_reward, logging_reward, async_judge],
                       reward_weights=[0.1, 1.0, 2.0], max_new_tokens=5)
    cfg = TrainerConfig(**CFG, minibatches=2, output_dir=str(tmp_path), log_completions_every=1, metric_names="trl",
                        report_to=("jsonl", "tensorboard"))
    h = Trainer(policy, tok, task, GRPO, cfg).train(2)
    # trainer_state: TRL's global_step counts optimiser updates (2 per step here), max_steps those of the run
    assert [s.global_step for s in STATES] == [0, 2] and {s.max_steps for s in STATES} == {4}
    n_train = task.num_train_rows
    assert [s.epoch for s in STATES] == [0.0, pytest.approx(2 / n_train)] and STATES[0].num_train_epochs == \
        pytest.approx(2 * 2 / n_train)
    for name in ("curriculum_reward", "logging_reward", "async_judge"):
        assert {f"rewards/{name}/mean", f"rewards/{name}/std"} <= set(h.columns)
    assert (h["rewards/async_judge/mean"] == 0.5).all() and (h["rewards/async_judge/std"] == 0.0).all()
    assert (h["rewards/curriculum_reward/mean"].iloc[0] == 0.0) and "accuracy_seen" in h.columns
    assert (h["accuracy_seen"] == h["rewards/logging_reward/mean"]).all()  # one round per step: the same mean
    # the trackers: TRL's names in metrics.jsonl, one completions.jsonl line per trained sample with its reward,
    # each function's value, the log_extra column and the advantage
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {"completions/mean_length", "completions/clipped_ratio", "learning_rate", "num_loss_tokens"} <= set(lines[0])
    assert "length" not in lines[0] and lines[0]["completions/mean_length"] == h["length"].iloc[0]
    tokens = h["input_tokens"].tolist()
    assert [r["num_tokens"] for r in lines] == [tokens[0], tokens[0] + tokens[1]]  # TRL's running count
    table = [json.loads(x) for x in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert len(table) == 2 * 6 and [r["step"] for r in table] == [1] * 6 + [2] * 6
    assert {"prompt", "completion", "reward", "curriculum_reward", "golden_answer", "advantage"} <= set(table[0])
    first = table[:6]  # GRPO: (r - mean) / (std + eps) within each group of 3 (hand check of the first group)
    r = np.array([x["reward"] for x in first[:3]])
    assert [x["advantage"] for x in first[:3]] == pytest.approx((r - r.mean()) / (r.std(ddof=1) + 1e-4), abs=1e-5)
    assert all(x["golden_answer"] == str(sum_of(x["prompt"])) for x in table)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert [e.value for e in acc.Scalars("completions/mean_length")] == pytest.approx(h["length"].tolist())
    texts = acc.Tensors("completions/text_summary")
    assert [t.step for t in texts] == [1, 2] and "| step | prompt | completion | reward |" in \
        texts[0].tensor_proto.string_val[0].decode()


def sum_of(prompt: str) -> int:
    a, b = prompt.rstrip("=").split("+")
    return int(a) + int(b)


def test_async_functions_run_concurrently():
    task = DatasetTask(datasets.Dataset.from_list(ROWS), [async_judge, async_judge_2], max_new_tokens=5)
    p = task.test_set()[:2]
    t0 = time.perf_counter()
    assert task.rewards(["1", "2"], p) == [0.75, 0.75]
    assert time.perf_counter() - t0 < 0.095  # two 0.05 s sleeps awaited together, not one after the other


def test_a_reward_model_from_a_directory_or_a_module(tmp_path, base):
    from transformers import GPT2Config, GPT2ForSequenceClassification

    _, tok = base
    torch.manual_seed(0)
    model = GPT2ForSequenceClassification(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=16, n_layer=1,
                                                     n_head=2, num_labels=1, pad_token_id=tok.pad_token_id,
                                                     bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)).eval()
    model.save_pretrained(tmp_path / "tiny-rm")
    tok.save_pretrained(tmp_path / "tiny-rm")
    texts = ["12", "3", "45;#6"]
    p = DatasetTask(datasets.Dataset.from_list(ROWS), [lambda completions, **k: [0.0] * len(completions)],
                    max_new_tokens=5, test=0.25).test_set()[:3]
    with torch.no_grad():  # independent reference: each prompt + completion alone, no padding, logits[0, 0]
        want = [model(**tok(q.prompt + c, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()
                for q, c in zip(p, texts)]
    # named as TRL names it: the path's last component (a model never saved: its class)
    for spec, procs, name in ((str(tmp_path / "tiny-rm"), None, "tiny-rm"), (model, tok, type(model).__name__)):
        task = DatasetTask(datasets.Dataset.from_list(ROWS), [spec], reward_processing_classes=procs, max_new_tokens=5)
        assert isinstance(task._funcs[0], RewardModelFunc)
        assert task.function_rewards(texts, p) == {name: pytest.approx(want, abs=1e-5)}


def test_a_raising_function_is_named_with_the_step(base):
    calls = []

    def sandbox_reward(completions, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("sandbox timed out")
        return [0.0] * len(completions)

    policy, tok = base
    task = DatasetTask(datasets.Dataset.from_list(ROWS), [sandbox_reward], max_new_tokens=5)
    trainer = Trainer(policy, tok, task, GRPO, TrainerConfig(**CFG))
    with pytest.raises(RewardFunctionError, match=r"reward function 'sandbox_reward' raised RuntimeError at step 2: "
                                                  r"sandbox timed out; .*--resume") as info:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            trainer.train(3)
    assert info.value.step == 2 and info.value.function == "sandbox_reward" and trainer.step == 1
    assert isinstance(info.value.__cause__, RuntimeError) and isinstance(info.value, RuntimeError)


@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_an_empty_data_file_is_one_clear_error(tmp_path, text):
    path = tmp_path / "empty.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"the data file '.*empty\.jsonl' is empty \(no rows\)"):
        DatasetTask(str(path), [lambda completions, **k: [0.0] * len(completions)])


# ------------------------------------------------------------- the sampled ids and the metrics, by hand
def _rollout(ids, mask, truncated, prompt_mask):
    B, T = ids.shape
    return Rollout(prompt_ids=torch.zeros_like(prompt_mask), prompt_mask=prompt_mask, completion_ids=ids,
                   completion_mask=mask, behaviour_logp=torch.zeros(B, T), truncated=truncated,
                   texts=["x"] * B, problems=[Problem("p", "a")] * B, group_size=2, temperature=1.0)


def test_completion_ids_are_the_sampled_ids_with_eos_and_the_sample_metrics():
    eos, pad = 2, 0
    ids = torch.tensor([[5, 6, eos, pad], [7, eos, pad, pad], [8, 9, 10, 11], [eos, pad, pad, pad]])
    mask = (torch.arange(4) < torch.tensor([3, 2, 4, 1])[:, None]).float()
    ro = _rollout(ids, mask, torch.tensor([False, False, True, False]), torch.tensor([[1, 1]] * 3 + [[0, 1]]))
    assert completion_id_lists(ro) == [[5, 6, eos], [7, eos], [8, 9, 10, 11], [eos]]
    shaped = torch.tensor([1.0, 0.0, 0.5, 0.5])
    s = Scored(ro, shaped, torch.zeros(4, dtype=torch.bool), shaped,
               functions={"f": torch.tensor([1.0, float("nan"), 0.0, 1.0])}, logs={"metrics": {"m": 3.0}})
    got = sample_metrics([s])
    # by hand: lengths 3, 2, 4, 1; the terminated ones 3, 2, 1; tokens 7 prompt + 10 completion;
    # reward std of (1, 0, .5, .5) with Bessel: sqrt(0.5 / 3); f over its three values (1, 0, 1)
    assert got["length_min"] == 1 and got["length_max"] == 4 and got["length_terminated_mean"] == 2.0
    assert got["length_terminated_max"] == 3 and got["input_tokens"] == 17.0 and got["m"] == 3.0
    assert got["reward_std"] == pytest.approx((0.5 / 3) ** 0.5) and got["reward_min"] == 0 and got["reward_max"] == 1
    assert got["rewards/f/mean"] == pytest.approx(2 / 3) and got["rewards/f/std"] == pytest.approx((1 / 3) ** 0.5)
    assert {k for k in got if "/" not in k and k != "m"} <= set(HISTORY_COLUMNS)


def test_metric_names_rename_only_the_logged_keys():
    row = {"step": 3, "reward": 0.5, "length": 4.0, "clip_frac": 0.1, "num_tokens": 9.0, "input_tokens": 5.0,
           "rewards/f/mean": 1.0, "ratio_q50": 1.0}
    assert logged_row(row) == row
    trl = logged_row(row, "trl", [{"step": 0}, {"step": 1, "input_tokens": 2.0}, {"step": 2, "input_tokens": 3.0},
                                  row])
    assert trl["completions/mean_length"] == 4.0 and trl["clip_ratio/region_mean"] == 0.1
    assert trl["num_tokens"] == 10.0 and trl["num_loss_tokens"] == 9.0 and trl["rewards/f/mean"] == 1.0
    verl = logged_row(row, "verl")
    assert verl["critic/rewards/mean"] == 0.5 and verl["actor/pg_clipfrac"] == 0.1 and verl["step"] == 3
    assert set(TRL_METRIC_NAMES) <= set(HISTORY_COLUMNS) and set(VERL_METRIC_NAMES) <= set(HISTORY_COLUMNS)
    with pytest.raises(ValueError, match="metric_names"):
        TrainerConfig(metric_names="wandb")


def test_outside_a_trainer_the_state_is_zero():
    seen = []
    task = DatasetTask(datasets.Dataset.from_list(ROWS),
                       [lambda completions, trainer_state, **k: seen.append(trainer_state) or [0.0] * len(completions)])
    task.rewards(["1"], task.test_set()[:1])
    assert seen == [RewardTrainerState()]
