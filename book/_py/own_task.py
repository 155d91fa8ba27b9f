# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# (sec-own-task)=
# # Use it on your own problem
#
# The chapters train one arithmetic task and one family of tiny checkpoints. This page does what a
# reader does next: bring a task, a model and a tokenizer of their own, train them with two
# presets, save, resume in a new process, and plot. Everything below runs on a laptop CPU in
# {glue:text}`own_runtime`; every step is the one you would take with a real model.
#
# You need three things:
#
# 1. **A task**: an object with `name`, `max_new_tokens`, `sample`, `reward`, `is_correct` and
#    `test_set` (the protocol {py:class}`grpo_lab.tasks.Task`). No base class to inherit.
# 2. **A policy and its tokenizer**: any `transformers` causal language model, loaded by
#    {py:func}`grpo_lab.policy.models.load_policy` from a local directory or a hub id.
# 3. **An algorithm**: a preset ({py:data}`grpo_lab.algo.algorithms.PRESETS`) or your own
#    {py:class}`grpo_lab.algo.algorithms.Algorithm`, and a {py:class}`grpo_lab.training.trainer.TrainerConfig`.
#
# The API reference ({doc}`api`) documents every function used here.

# %% tags=["remove-cell"]
# Colab set-up, written by scripts/colab_cell.py from _config.yml's repository.url (edit there, then run it):
# clone the repository (the chapters need its data/ folder) and install the package with the extras the
# chapters need, pinned as CI pins them (scripts/colab_setup.py). $GRPO_LAB_REPO_URL overrides the URL (a fork,
# a local path), $GRPO_LAB_COLAB_ROOT the folder of the clone.
import os
import subprocess
import sys

if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    _root = os.environ.get("GRPO_LAB_COLAB_ROOT", "/content/grpo_lab")
    if not os.path.isdir(_root):
        _url = os.environ.get("GRPO_LAB_REPO_URL", "https://github.com/grpo-lab/grpo_lab")
        subprocess.run(["git", "clone", "-q", "--depth", "1", _url, _root], check=True)
    subprocess.run([sys.executable, os.path.join(_root, "scripts", "colab_setup.py"), _root], check=True)
    sys.path.insert(0, _root)

# %% tags=["parameters"]
PROFILE = "cpu"  # this page trains its own tiny model; "gpu" only moves it to CUDA
SEEDS = (0, 1, 2, 3, 4)
N_JOBS = 2  # worker processes; results do not depend on it

# %% tags=["hide-input"]
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import matplotlib.pyplot as plt

import grpo_lab
from grpo_lab.lab import book
from grpo_lab import experiments
from grpo_lab.experiments import plotting, stats
from grpo_lab.algo.algorithms import DAPO, GRPO
from grpo_lab.policy.models import load_policy
from grpo_lab.policy.rollout import evaluate
from grpo_lab.algo.selection import overlong_cache_tokens
from grpo_lab.tasks import TASKS, validate_task
from grpo_lab.training.trainer import MEASURED_COLUMNS, Trainer, TrainerConfig

book.setup_notebook(seed=0)
CHAPTER_START = time.perf_counter()
DEVICE = "cuda" if PROFILE == "gpu" and torch.cuda.is_available() else "cpu"
WORK = tempfile.TemporaryDirectory(prefix="grpo_lab_own_task_")  # every file this page writes
work = Path(WORK.name)

# %% [markdown]
# ## A task
#
# The example task asks the policy to reverse a word of 3–5 letters: prompt `abcd=`, answer
# `dcba`. It lives in a module of its own, `book/examples/reverse_task.py`, and not in a notebook
# cell, for two reasons: worker processes (`n_jobs > 1`) and a resumed run in a new process must
# be able to import it, and importing it registers it under its name.
#
# ```{literalinclude} examples/reverse_task.py
# :pyobject: ReverseTask
# ```
#
# Three rules make a task work well with the trainer:
#
# * **`sample` draws every random number from the generator it is given.** The trainer passes its
#   own seeded generator and stores its state in checkpoints: that is what makes a seed repeat
#   and a resumed run continue exactly.
# * **`reward` parses the completion, it never runs it** (no `eval`). It may give partial credit:
#   here half the fraction of letters in place, so that groups of wrong answers still differ and
#   GRPO's group-normalised advantage has something to rank. **`is_correct`** is the raw 0/1
#   correctness used for accuracy and for DAPO's dynamic sampling.
# * **Register the class** (`@register_task("reverse")`, or
#   {py:func}`grpo_lab.tasks.register_task`) if you want `Trainer.resume` to rebuild the task by
#   itself; otherwise pass it: `Trainer.resume(path, task=ReverseTask())`.
#
# {py:func}`grpo_lab.tasks.validate_task` checks a task against the protocol; with `call=True` it
# also calls each method once (for you, while writing the task; the trainer runs only the cheap
# check, which calls nothing).

# %%
EXAMPLES = Path(grpo_lab.__file__).resolve().parents[1] / "book" / "examples"
sys.path.insert(0, str(EXAMPLES))
from reverse_task import ReverseTask  # noqa: E402  (importing it registers "reverse")

task = validate_task(ReverseTask(), call=True)
assert TASKS["reverse"] is ReverseTask
problem = task.sample(1, np.random.default_rng(0))[0]
print(problem)
for completion in (problem.answer, problem.answer[:-1] + "x", problem.answer[::-1], ""):
    print(f"{completion!r:10} reward {task.reward(completion, problem):.3f}  correct {task.is_correct(completion, problem)}")
assert task.reward(problem.answer, problem) == 1.0 and task.reward("", problem) == 0.0

# %% [markdown]
# A task that misses part of the protocol fails when the trainer is built, with every problem
# named, not deep inside training:

# %%
class Incomplete:
    name = "incomplete"
    max_new_tokens = 8

    def sample(self, n, rng):
        return []


try:
    validate_task(Incomplete())
except TypeError as err:
    print(err)

# %% [markdown]
# ## A model and a tokenizer of your own
#
# Any causal language model from `transformers` will do; here a two-layer GPT-2 with 0.1 M
# parameters, built from a config, and a character-level tokenizer built with `tokenizers`. Both
# are saved with `save_pretrained` into a local directory, which
# {py:func}`grpo_lab.policy.models.load_policy` reads exactly as it reads a hub model (it sets left
# padding for generation and falls back to EOS for a missing pad token). For a pretrained model,
# skip this and the next section and pass its hub id, e.g.
# `load_policy("Qwen/Qwen2.5-0.5B-Instruct")`.

# %% [markdown]
# ```{literalinclude} examples/reverse_task.py
# :pyobject: build_policy
# ```

# %%
from reverse_task import build_policy, warm_start  # noqa: E402

model, tokenizer = build_policy(seed=0)
print(f"{sum(p.numel() for p in model.parameters()):,} parameters;", tokenizer("bad=").input_ids,
      repr(tokenizer.decode(tokenizer("bad=").input_ids)))
assert tokenizer.decode(tokenizer("bad=").input_ids) == "bad="

# %% [markdown]
# ## A warm start
#
# RL improves what a policy already does sometimes; a randomly initialised model never writes a
# reversed word, every group would score alike, and every advantage would be zero. So, as with the
# chapters' checkpoints, a short supervised warm start first: next-token cross-entropy on the
# answers (prompt tokens are not scored), stopped early so that the policy is right only part of
# the time. Then the base policy is saved and loaded back, as any checkpoint would be. The same two
# functions make the shipped checkpoint `reverse-base` (`python -m grpo_lab.lab.pretrain reverse`), the
# README's command-line example of this task.
#
# ```{literalinclude} examples/reverse_task.py
# :pyobject: warm_start
# ```

# %%
WARM_STEPS = 50
losses = warm_start(model, tokenizer, task, steps=WARM_STEPS)  # 64 words a step, AdamW at lr 3e-3, seed 0
base_dir = work / "reverse-base"
model.save_pretrained(base_dir)
tokenizer.save_pretrained(base_dir)

policy, tok = load_policy(base_dir, device=DEVICE)
summary, samples = evaluate(policy, tok, task, greedy=True)
base_acc = summary["accuracy"]
print(f"after {WARM_STEPS} supervised steps: loss {losses[-1]:.2f}, greedy test accuracy {base_acc:.2f} "
      f"on {len(task.test_set())} words")
print(samples[["prompt", "completion", "correct"]].head(4).to_string(index=False))
book.glue("own_base_acc", f"{base_acc:.2f}")
book.glue("own_binom_se", f"{stats.binomial_se(base_acc, len(task.test_set())):.2f}")
assert 0.05 < base_acc < 0.8  # right sometimes: room for RL, and a signal to start from

# %% [markdown]
# ## Train with two presets
#
# {py:func}`grpo_lab.experiments.run` trains one algorithm for several seeds from a *profile*: a
# base checkpoint, a task and a {py:class}`grpo_lab.training.trainer.TrainerConfig`. Our profile names the
# directory just saved and the registered task. The generation budget comes from the task (8
# tokens), and DAPO's soft overlong penalty is a fraction of it (`overlong_cache_frac = 0.2`, so
# $L_{\mathrm{cache}} =$ {glue:text}`own_cache` tokens: no well-formed answer, at most 6 tokens
# with EOS, is penalised). The learning rate is higher than the chapters' because the model is
# smaller and the run shorter.

# %%
STEPS = 20
profile = experiments.Profile(
    name="reverse-cpu", base=str(base_dir), task="reverse", steps=STEPS,
    config=TrainerConfig(prompts_per_step=16, group_size=8, lr=1e-3, warmup=5, minibatches=2,
                         eval_every=5, threads=1, device=DEVICE))
book.glue("own_cache", overlong_cache_tokens(DAPO, task.max_new_tokens))
grid = experiments.run_grid([GRPO, DAPO], profile=profile, seeds=SEEDS, n_jobs=N_JOBS)
hist = pd.concat([r.history for r in grid.values()], ignore_index=True)
print(f"{len(grid)} presets x {len(SEEDS)} seeds x {STEPS} steps: {len(hist)} history rows, e.g. columns",
      ", ".join(["algo", "seed", "step", "test_accuracy", "reward", "entropy", "clip_frac", "grad_norm"]))
assert {"algo", "seed", "step", "test_accuracy", "reward", "entropy", "clip_frac", "grad_norm"} <= set(hist.columns)

# %% [markdown]
# The history is one row per (preset, seed, step), with every metric of
# {py:meth}`grpo_lab.training.trainer.Trainer.train`. {py:func}`grpo_lab.experiments.plotting.band_plot` draws the mean
# over seeds with a band (here a 95% t interval), in the book's colour of each preset:

# %% tags=["hide-input"]
fig, axes = plt.subplots(1, 3, figsize=(9.6, 2.9))
evals = hist.dropna(subset=["test_accuracy"])
train = hist[hist.step > 0]
plotting.band_plot(axes[0], evals, "step", "test_accuracy", title="greedy test accuracy", band="ci95",
                   bounds=(0, 1), legend=True)
plotting.band_plot(axes[1], train, "step", "reward", title="train reward (sampled)", band="ci95", bounds=(0, 1))
plotting.band_plot(axes[2], train, "step", "entropy", title="entropy", band="ci95", bounds=(0, np.inf))
for ax, unit in zip(axes, ["fraction correct", "mean reward", "nats per token"]):
    ax.set_xlabel("RL step")
    ax.set_ylabel(unit)
fig.tight_layout()
book.glue("fig_own_curves", fig)

# %% [markdown]
# ```{glue:figure} fig_own_curves
# :name: fig-own-curves
#
# GRPO and DAPO on the reverse-a-word task from the warm-started GPT-2, five seeds each, mean with
# 95% t interval over seeds. Step 0 is the base policy. Left: greedy accuracy on the 100 test
# words; middle: the sampled training reward (with partial credit); right: the policy entropy.
# ```

# %%
acc = {name: r.final() for name, r in grid.items()}
base = grid["GRPO"].base()
for name in grid:
    book.glue(f"own_gain_{name}", stats.format_interval(stats.paired_difference(acc[name], base)))
    print(f"{name}: final greedy accuracy {stats.format_interval(stats.t_interval(acc[name], bounds=(0, 1)))}, "
          f"gain over the base (paired) {stats.format_interval(stats.paired_difference(acc[name], base))}")
assert all((acc[name] > base).mean() >= 0.8 for name in grid)  # RL improves on the warm start

# %% [markdown]
# Both presets improve on the base policy: paired over seeds, GRPO gains
# {glue:text}`own_gain_GRPO` and DAPO {glue:text}`own_gain_DAPO` in greedy accuracy (mean [95% t
# interval]; one evaluation on 100 words has a binomial standard error of about
# {glue:text}`own_binom_se` on its own). This page does not compare the two: that needs an
# experiment designed for it, as in {ref}`sec-dapo`.
#
# ## Save, and resume in a new process
#
# {py:meth}`grpo_lab.training.trainer.Trainer.save` writes the policy, the reference policy, the optimiser,
# every random-number state, the configuration and the history. It checks everything before it
# writes, and writes into a temporary directory that it renames at the end, so a failure never
# leaves half a checkpoint. {py:meth}`grpo_lab.training.trainer.Trainer.resume` continues the run exactly:
# below, four steps, a save, and four more steps in a **new Python process** give the same weights
# and history, bit for bit, as eight steps in one go.

# %%
cfg = dataclasses.replace(profile.config, seed=0, progress=False, eval_every=4)


def fresh_trainer():
    pol, tk = load_policy(base_dir, device=DEVICE)
    return Trainer(pol, tk, ReverseTask(), GRPO, cfg)


straight = fresh_trainer()
straight.train(8)

first = fresh_trainer()
first.train(4)
first.save(work / "run-step4")
script = """
import sys
sys.path.insert(0, sys.argv[1])  # the directory of reverse_task.py
import reverse_task  # registers "reverse": resume rebuilds the task from the checkpoint
from grpo_lab.training.trainer import Trainer

trainer = Trainer.resume(sys.argv[2])  # or Trainer.resume(sys.argv[2], task=reverse_task.ReverseTask())
trainer.train(4)
trainer.save(sys.argv[3])
"""
print(script.strip())
done = subprocess.run([sys.executable, "-c", script, str(EXAMPLES), str(work / "run-step4"), str(work / "run-step8")],
                      capture_output=True, text=True)
assert done.returncode == 0, done.stderr[-2000:]

# %%
resumed = Trainer.resume(work / "run-step8")
same_weights = all(torch.equal(a, b) for a, b in zip(straight.policy.parameters(), resumed.policy.parameters()))
cols = [c for c in straight.history.columns if c not in MEASURED_COLUMNS]  # wall times and memory differ
same_history = straight.history[cols].equals(resumed.history[cols])
print(f"resumed at step {resumed.step}: same weights {same_weights}, same history {same_history}")
assert same_weights and same_history and resumed.step == 8

# %% [markdown]
# `band_plot` also draws a single run, straight from `Trainer.history` (one line, no band):

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(4.2, 2.6))
single = "GRPO, seed 0 (resumed at step 4)"
plotting.band_plot(ax, resumed.history.dropna(subset=["test_accuracy"]), "step", "test_accuracy",
                   label=single, colors={single: plotting.algo_color("GRPO")}, bounds=(0, 1))
ax.set_xlabel("RL step")
ax.set_ylabel("greedy test accuracy")
fig.tight_layout()
plotting.legend_below(fig)
book.glue("fig_own_single", fig)

# %% [markdown]
# ```{glue:figure} fig_own_single
# :name: fig-own-single
#
# One run, from a single trainer's history: greedy test accuracy of the resumed GRPO run (seed
# 0), evaluated every four steps. The resume at step 4 leaves no trace: the curve is that of the
# uninterrupted run.
# ```
#
# (sec-own-dataset)=
# ## Your data and TRL-style reward functions
#
# A task class is one way in. The other is the one TRL's `GRPOTrainer` uses: a dataset with a
# prompt column, and reward functions that score a batch of completions.
# {py:class}`grpo_lab.tasks.DatasetTask` takes both as they are written for TRL. The data is a
# `datasets.Dataset` or a local `.jsonl`, `.json`, `.parquet` or `.csv` file. A reward function
# has TRL's signature `(prompts, completions, **columns) -> list[float | None]` and gets every
# other column of the dataset as a keyword list, one value per completion. Below, the reverse
# task is written as two jsonl files: the training words, drawn as `ReverseTask` draws them, and
# its 100 test words.

# %%
def write_jsonl(path, problems):
    path.write_text("".join(json.dumps({"prompt": p.prompt, "solution": p.answer}) + "\n" for p in problems))


write_jsonl(work / "reverse_train.jsonl", task.sample(2000, np.random.default_rng(1)))
write_jsonl(work / "reverse_test.jsonl", task.test_set())
print((work / "reverse_train.jsonl").read_text().splitlines()[0])

# %% [markdown]
# Two reward functions, in the shape TRL's documentation gives them: an accuracy reward that
# reads the `solution` column through its keyword arguments, and a partial credit for the
# letters in place. Several functions are combined as TRL combines them: the weighted sum of their
# values (`reward_weights`, 1 each by default). A function returns `None` for a sample it does
# not apply to, and the sum leaves it out. If no function applies, the sample gets 0 and a
# warning. A function that returns the wrong number of values, a value that is not a number, or a
# NaN stops training with an error. The error names the function and the sample.
#
# The trainer calls each function once per generation round, with the whole batch. This is
# {py:class}`grpo_lab.tasks.Task`'s optional batched method `rewards`. `is_correct`, which the
# accuracy columns and DAPO's filter read, is the rule the task is given: here, the accuracy
# function must give at least 1 (`correct_reward`, `correct_threshold`).

# %%
from grpo_lab.tasks import DatasetTask  # noqa: E402


def accuracy_reward(completions, solution, **kwargs):
    return [1.0 if c.strip() == s else 0.0 for c, s in zip(completions, solution)]


def in_place_reward(completions, solution, **kwargs):
    return [sum(a == b for a, b in zip(c.strip(), s)) / max(len(s), len(c.strip()), 1)
            for c, s in zip(completions, solution)]


data_task = DatasetTask(str(work / "reverse_train.jsonl"), [accuracy_reward, in_place_reward],
                        answer_column="solution", reward_weights=[1.0, 0.5], test=str(work / "reverse_test.jsonl"),
                        max_new_tokens=8, correct_reward="accuracy_reward")
validate_task(data_task, call=True)
probe = data_task.test_set()[0]
completions = [probe.answer, probe.answer[:-1] + "x", ""]
print(probe.prompt, pd.DataFrame(data_task.function_rewards(completions, [probe] * 3), index=map(repr, completions))
      .assign(reward=data_task.rewards(completions, [probe] * 3)).to_string(), sep="\n")
assert data_task.rewards(completions, [probe] * 3) == [1.5, 0.5 * ((len(probe.answer) - 1) / len(probe.answer)), 0.0]
data_summary, _ = evaluate(policy, tok, data_task, greedy=True)
assert data_summary["accuracy"] == base_acc  # the same 100 words, the same base policy

# %% [markdown]
# It trains like any task. One GRPO run from the page's warm start, with the configuration of the
# runs above:

# %%
data_trainer = Trainer(load_policy(base_dir, device=DEVICE)[0], tok, data_task, GRPO,
                       dataclasses.replace(profile.config, seed=0, progress=False))
data_trainer.train(STEPS)
data_hist = data_trainer.history
data_acc = data_hist.dropna(subset=["test_accuracy"]).set_index("step")["test_accuracy"]
print(data_acc.to_frame().T.to_string())
book.glue("own_data_base", f"{data_acc.iloc[0]:.2f}")
book.glue("own_data_final", f"{data_acc.iloc[-1]:.2f}")
book.glue("own_steps", STEPS)
assert data_acc.iloc[0] == base_acc and data_acc.iloc[-1] > data_acc.iloc[0] + 0.05

# The trainer scores a round with the weighted sum of the two functions, once per function:
check = Trainer(load_policy(base_dir, device=DEVICE)[0], tok, data_task, GRPO, data_trainer.config)
scored = check.score(check.rollout())
parts = data_task.function_rewards(scored.rollout.texts, scored.rollout.problems)
hand = [1.0 * a + 0.5 * b for a, b in zip(parts["accuracy_reward"], parts["in_place_reward"])]
assert scored.raw.tolist() == torch.tensor(hand, dtype=torch.float32).tolist()

# %% [markdown]
# The run's greedy test accuracy goes from {glue:text}`own_data_base` to
# {glue:text}`own_data_final` in {glue:text}`own_steps` steps. This is one seed: it shows that the
# dataset task trains, and it does not compare the task with `ReverseTask` (that would need the
# five seeds and intervals used above).
#
# What carries over from TRL, and what does not:
#
# * **Conversational prompts.** A prompt cell may be a list of `{"role", "content"}` messages.
#   The task then writes it out with the tokenizer's chat template, and the completions reach
#   the reward functions as `[{"role": "assistant", "content": ...}]`, as in TRL.
#   `DatasetTask(..., tokenizer=tok)` takes the tokenizer object or its name.
#   `chat_template=True` also wraps plain-text prompts as a user message.
# * **Other arguments.** `completion_ids` are the token ids the model sampled, the EOS token
#   included, as TRL passes them. `trainer_state` carries TRL's `global_step` (optimiser
#   updates), `epoch`, `max_steps` and `num_train_epochs`; `log_metric(name, value)` adds a
#   history column and `log_extra(column, values)` a column of the completions table
#   (`TrainerConfig.log_completions_every`). `async def` functions are awaited together, and a
#   reward model (an `nn.Module`, a local directory or a hub id) scores as TRL's does. A function
#   returns `None` for a completion it does not apply to (TRL's convention); a NaN is an error
#   here, not "does not apply", because it is more often a bug than a choice.
# * **Resuming.** Resuming needs either `task=`, as for the reverse task above, or a task that
#   JSON can describe. For the second, `data` is a file path and the functions are import paths
#   (`reward_funcs=["my_rewards:accuracy_reward"]`). `Trainer.resume(path)` then rebuilds the
#   task, in a new process too. Functions defined in a notebook cell, as here, need
#   `Trainer.resume(path, task=data_task)`.

# %% [markdown]
# ## Your own algorithm
#
# An algorithm is one choice per axis. Change a preset with `replace`, e.g.
# `GRPO.replace(name="GRPO, token-level", aggregation="token_mean", eps_high=0.28)`, or register
# a new choice on an axis (a function and one registry line, see {doc}`api_algorithms`). A choice
# registered in a module, like the task above, reaches the worker processes of `run` too; one
# defined in a notebook cell needs `n_jobs=1`.
#
# ## At scale
#
# Everything above is what you would do with a real model: `load_policy` takes a hub id
# (`"Qwen/Qwen2.5-0.5B-Instruct"`) instead of a directory, `TrainerConfig(device="cuda")` moves
# training to a GPU, and a task that builds chat-formatted prompts and parses real answers takes
# the place of `ReverseTask`. The limits are those of a single-process trainer: one GPU, and
# generation with `transformers`' `generate`, without the batched inference engines (vLLM,
# SGLang) and the sharding that verl and TRL use for models of billions of parameters. The
# objective is the same function everywhere: the chapters check `grpo_lab`'s losses against the
# papers' equations.

# %% tags=["nbval-ignore-output", "remove-cell"]
WORK.cleanup()
book.glue("own_runtime", book.run_time(CHAPTER_START))
