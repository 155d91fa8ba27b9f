"""Messages a fresh user's trial of issues 54, 56 and 58 found missing or wrong (each test fails on the code before
its fix): a tool task on a model that cannot write its tool calls, the export of a multi-turn task or of function
objects, a micro-batch that does not fit verl's devices, a log_extra of the wrong length, a log_metric under a
built-in column's name."""

import warnings

import datasets
import pytest
import torch

from grpo_lab.cli.main import task_warnings
from grpo_lab.experiments import get_profile
from grpo_lab.export.jobs import _task
from grpo_lab.export.translation import _sizes
from grpo_lab.tasks import DatasetTask, Problem
from grpo_lab.training.history import sample_metrics


def test_a_tool_task_on_a_model_that_cannot_write_the_call_is_warned_before_training():
    prof = get_profile("cpu")
    said = task_warnings(prof, "calculator", None, "prog")
    assert len(said) == 1 and "cannot write ')'" in said[0] and "never call the tool" in said[0]
    assert task_warnings(prof, "calculator", "calculator-base", "prog") == []  # its own checkpoint writes them


def test_the_export_refuses_a_multi_turn_task_and_names_import_paths_for_function_objects():
    with pytest.raises(ValueError, match="multi-turn: its environment reads the model's tool calls as plain text"):
        _task("calculator", "trl")

    def acc(completions, **kw):
        return [1.0] * len(completions)

    task = DatasetTask(data=datasets.Dataset.from_list([{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(20)]), reward_funcs=[acc])
    with pytest.raises(ValueError, match=r"reward_funcs=\['module:function'\]"):
        _task(task, "trl")


def test_a_micro_batch_that_does_not_fit_the_devices_names_the_fix():
    with pytest.raises(ValueError, match=r"set micro_batch_size=8 \(--set micro_batch_size=8\), or export for fewer"):
        _sizes({"prompts_per_step": 16, "group_size": 8, "minibatches": 2, "micro_batch_size": 32,
                      "n_gpus_per_node": 8})


def test_log_extra_needs_one_value_per_completion_and_names_the_function():
    def short(completions, log_extra, **kw):
        log_extra("short", [1] * (len(completions) - 1))
        return [0.0] * len(completions)

    task = DatasetTask(data=datasets.Dataset.from_list([{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(20)]), reward_funcs=[short])
    problems = [Problem("1+1=", "2")] * 3
    with pytest.raises(RuntimeError, match=r"short.*log_extra\('short', \.\.\.\): 2 values for a batch of 3"):
        task.function_rewards(["2", "3", "4"], problems)


def test_log_metric_never_replaces_a_built_in_column():
    class Round:  # the fields of a Scored round that sample_metrics reads
        rewards = torch.tensor([1.0, 0.0])
        functions = {"acc": torch.tensor([1.0, 0.0])}
        logs = {"metrics": {"rewards/acc/mean": 5.0, "mine": 2.0}}

        class rollout:
            lengths = torch.tensor([3, 4])
            truncated = torch.tensor([False, True])
            prompt_mask = torch.ones(2, 2)
            completion_mask = torch.ones(2, 4)

    with pytest.warns(RuntimeWarning, match="is a history column of its own"):
        out = sample_metrics([Round()])
    assert out["rewards/acc/mean"] == 0.5 and out["mine"] == 2.0
