"""The text of the files that :func:`grpo_lab.export.jobs.trl_job` and :func:`grpo_lab.export.jobs.verl_job` write.

Each constant is a ``str.format`` template of a python file; the values filled in are python literals
(``repr`` / ``pprint.pformat`` of plain data), so the written files are plain, editable python and
their settings can be read back with ``ast.literal_eval``. The written reward files import
grpo_lab (the task's own scorer), so the job runs where grpo_lab is installed.

* ``TASK_SCORER`` — the part shared by both reward files: the task rebuilt from its
  :func:`grpo_lab.tasks.task_spec`, and ``score`` / ``correct``, grpo_lab's reward and correctness of
  a batch of completions;
* ``TRL_REWARDS`` — ``rewards.py``: TRL's ``reward(completions, **columns)`` and ``reward_funcs()``;
* ``TRL_TRAIN`` — ``train.py``: ``GRPOConfig(**SETTINGS, **RUN)`` and ``GRPOTrainer(...).train()``;
* ``VERL_REWARD`` — ``reward.py``: verl's ``compute_score(data_source, solution_str, ground_truth,
  extra_info)``.
"""

from __future__ import annotations

#: the templates are the export's own material, read through grpo_lab.export.trl_job / verl_job: nothing public
__all__: list[str] = []

#: shared head of both reward files; fields: ``doc`` (the module docstring), ``spec`` (task_spec literal)
TASK_SCORER = '''"""{doc}"""

import importlib
import json
import os
import sys

from grpo_lab.tasks import Problem, correctness, task_from_spec

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # a task module the export copied next to this file

#: the grpo_lab task (grpo_lab.tasks.task_spec): edit its params to change the task's settings
TASK_SPEC = {spec}
#: the params of TASK_SPEC that name files of this job, relative to this file's directory
JOB_FILES = {job_files}
for _key in JOB_FILES:
    TASK_SPEC["params"][_key] = os.path.join(os.path.dirname(os.path.abspath(__file__)), TASK_SPEC["params"][_key])
importlib.import_module(TASK_SPEC["class"].rsplit(".", 1)[0])  # the module that registers the task's class
TASK = task_from_spec(TASK_SPEC)


def problem(prompt, answer, meta=None):
    """The grpo_lab Problem of a dataset row (``meta`` is stored as JSON text)."""
    return Problem(str(prompt), str(answer), json.loads(meta) if meta else {{}})


def score(completions, problems):
    """grpo_lab's own reward of each completion: the task's batched ``rewards`` when it has one, else ``reward``."""
    if hasattr(TASK, "rewards"):
        return [float(r) for r in TASK.rewards(list(completions), list(problems))]
    return [float(TASK.reward(c, p)) for c, p in zip(completions, problems)]


def correct(completions, problems):
    """grpo_lab's correctness of each completion (``grpo_lab.tasks.correctness``)."""
    return correctness(TASK, completions, problems)
'''

#: the TRL part of ``rewards.py``; fields: ``algorithm`` (Algorithm.describe() literal), ``max_new_tokens``
TRL_REWARDS = '''

def _text(message):
    """A prompt's or completion's text: the string itself, or the last message's content (conversational)."""
    return message if isinstance(message, str) else message[-1]["content"]


def reward(completions, prompts=None, answer=None, meta=None, **columns):
    """TRL reward function: grpo_lab's reward of each completion (one float each, in order).

    TRL passes the completions, the prompts and every dataset column (``answer``: the gold answer,
    ``meta``: the problem's facts as JSON text).
    """
    n = len(completions)
    prompts = prompts if prompts is not None else [""] * n
    meta = meta if meta is not None else [None] * n
    problems = [problem(_text(p), a, m) for p, a, m in zip(prompts, answer, meta)]
    return score([_text(c) for c in completions], problems)


reward.__name__ = TASK.name  # TRL logs rewards/<name>/mean

#: the algorithm trained (grpo_lab.algo.algorithms.Algorithm fields): what the reward shaping reads
ALGORITHM = {algorithm}
#: the generation budget L_max in tokens (GRPOConfig.max_completion_length)
MAX_NEW_TOKENS = {max_new_tokens}


#: [name, weight] of each of the task's own reward functions (a DatasetTask): one TRL reward function each
FUNCTIONS = {functions}


def _function_reward(name):
    """TRL reward function of the task's reward function ``name``: its values before weighting (None stays None,
    which TRL reads as 'does not apply')."""
    def function_reward(completions, prompts=None, answer=None, meta=None, completion_ids=None, **columns):
        n = len(completions)
        prompts = prompts if prompts is not None else [""] * n
        meta = meta if meta is not None else [None] * n
        problems = [problem(_text(p), a, m) for p, a, m in zip(prompts, answer, meta)]
        ids = None if completion_ids is None else [list(map(int, c)) for c in completion_ids]  # TRL's sampled ids
        values = TASK.function_rewards([_text(c) for c in completions], problems, completion_ids=ids)[name]
        return [None if v is None else float(v) for v in values]

    function_reward.__name__ = name  # TRL logs rewards/<name>/mean
    return function_reward


def reward_funcs():
    """TRL's ``reward_funcs``: the task's reward (or each of its reward functions), plus DAPO's soft overlong
    punishment when the algorithm has one (grpo_lab.export.trl_reward_funcs), which TRL adds before the advantage."""
    from grpo_lab.algo.algorithms import Algorithm
    from grpo_lab.export import trl_reward_funcs

    own = [_function_reward(name) for name, _ in FUNCTIONS] or [reward]
    return [*own, *trl_reward_funcs(Algorithm.from_dict(ALGORITHM), max_new_tokens=MAX_NEW_TOKENS)]


def reward_weights():
    """``GRPOConfig.reward_weights``: the task's weights, 1 for the shaping terms; None for a single task reward."""
    if not FUNCTIONS:
        return None
    return [float(w) for _, w in FUNCTIONS] + [1.0] * (len(reward_funcs()) - len(FUNCTIONS))
'''

#: ``train.py``; fields: ``doc``, ``model``, ``settings``, ``run``
TRL_TRAIN = '''"""{doc}"""

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: the policy: a checkpoint directory or a hub id (loaded by grpo_lab.policy.models.load_policy)
MODEL = {model}
#: trl.GRPOConfig keyword arguments of the algorithm and its budget: grpo_lab.export.to_trl(...), unedited
SETTINGS = {settings}
#: trl.GRPOConfig keyword arguments of this run (steps, logging, seed); the command line overrides some
RUN = {run}


def parse_args(argv=None):
    """The command line: --max-steps, --output-dir, --cpu (use_cpu=True, bf16=False), --report-to."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=None,
                    help="optimiser updates, TRL's max_steps (default: RUN's: the RL steps x updates per rollout)")
    ap.add_argument("--output-dir", default=None, help="where TRL writes (default: RUN's output_dir)")
    ap.add_argument("--cpu", action="store_true", help="train on the CPU in float32 (use_cpu=True, bf16=False)")
    ap.add_argument("--report-to", nargs="+", default=None, help="trackers (none, tensorboard, wandb, ...)")
    return ap.parse_args(argv)


def grpo_config(args):
    """``trl.GRPOConfig(**SETTINGS, **RUN)`` with the command line's overrides."""
    from trl import GRPOConfig

    run = dict(RUN)
    if args.max_steps is not None:
        run["max_steps"] = args.max_steps
    if args.output_dir is not None:
        run["output_dir"] = args.output_dir
    run["output_dir"] = str(HERE / run["output_dir"])  # a relative output_dir is the job folder's
    if args.report_to is not None:
        run["report_to"] = args.report_to
    if args.cpu:
        run.update(use_cpu=True, bf16=False)
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    from rewards import reward_weights

    if reward_weights() is not None:
        run["reward_weights"] = reward_weights()  # one weight per reward function, as the grpo_lab task weights them
    return GRPOConfig(**{{**SETTINGS, **run}})


def build_trainer(argv=None):
    """The ``trl.GRPOTrainer`` of this job: the dataset file, the reward adapter, the model and the settings."""
    import torch
    from datasets import load_dataset
    from trl import GRPOTrainer

    from grpo_lab.policy.models import load_policy

    sys.path.insert(0, str(HERE))
    from rewards import reward_funcs

    args = parse_args(argv)
    dataset = load_dataset("json", data_files=str(HERE / "dataset.jsonl"), split="train")
    # float32 weights whatever the checkpoint stores: bf16 / fp16 is autocast over float32 master weights, as grpo_lab
    model, tokenizer = load_policy(MODEL, dtype=torch.float32)
    return GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward_funcs(), args=grpo_config(args),
                       train_dataset=dataset)


def main(argv=None):
    """Train, then save the model to the output directory; returns the trainer."""
    trainer = build_trainer(argv)
    trainer.train()
    trainer.save_model()
    return trainer


if __name__ == "__main__":
    main()
'''

#: the verl part of ``reward.py``; no fields
VERL_REWARD = '''

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """verl's custom reward function (reward.custom_reward_function): grpo_lab's reward of one response.

    Returns ``{{"score": reward, "acc": 1.0 or 0.0}}``: verl's reward managers take ``score`` as the reward and
    keep ``acc`` (grpo_lab's correctness), which DAPO's dynamic sampling filters on (filter_groups.metric=acc).
    """
    info = extra_info or {{}}
    one = [problem(info.get("prompt", ""), ground_truth, info.get("meta"))]
    return {{"score": score([solution_str], one)[0], "acc": float(correct([solution_str], one)[0])}}
'''
