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
# (sec-scale-out)=
# # Scale out: the same objective in TRL and verl
#
# `grpo_lab` trains on one device. Past a few billion parameters you move to
# [verl](https://github.com/volcengine/verl) (Ray, many GPUs and nodes) or
# [TRL](https://github.com/huggingface/trl) (accelerate, DeepSpeed). Both implement GRPO, DAPO,
# Dr.GRPO, GSPO, CISPO and SAPO (verl GMPO, KL-Cov and Clip-Cov as well, and it selects their
# tokens per micro-batch, not per minibatch), some under their names and some as combinations of
# settings: CISPO and SAPO are a loss name in both, GSPO is verl's `loss_mode=gspo` but TRL's
# `importance_sampling_level="sequence"`, Dr.GRPO is an aggregation plus an unscaled advantage in
# both (TRL's `loss_type="dr_grpo"` with `scale_rewards="none"`), and DAPO's parts are separate
# settings (dynamic sampling exists only in verl); the translation table below has each. Both
# compute, given the same settings, exactly
# what `grpo_lab` computes: on identical float64 batches their own loss code and
# {py:func}`grpo_lab.algo.objectives.policy_loss` agree to within $10^{-16}$ in loss and gradient
# (`tests/export/xcheck/test_xcheck_trl.py`, `tests/export/xcheck/test_xcheck_verl.py`, run by `make xcheck`). But their
# **defaults** are not the papers', and the differences change the gradient:
#
# * TRL 1.16: `use_bias_correction_kl=True` by default, which is DeepSeek-V3.2's importance-corrected
#   KL (its Eq. 7), not DeepSeekMath's $k_3$ (Eq. 3); `loss_type="dr_grpo"` divides by
#   $B\cdot L_{\max}$ and counts fully masked rows in $B$; the advantage's $\epsilon$ is hard-coded
#   at $10^{-4}$.
# * verl 0.9.1: the GRPO advantage's $\epsilon$ is $10^{-6}$; a dual clip (`clip_ratio_c=3`) caps
#   $r > 3$ for $A < 0$, which is in neither DeepSeekMath nor DAPO; GSPO's default aggregation is
#   `token-mean`, not GSPO's Eq. 5; `seq-mean-token-sum-norm` divides by the tensor's width unless
#   `loss_scale_factor` is set.
#
# {py:mod}`grpo_lab.export` translates a preset into each library's settings with every one of
# these pinned, and **raises** where the library would train something else, naming what would be
# lost and the exact alternative. It exports the optimisation too (learning-rate schedule and warm-up
# with the same step-0 convention as grpo_lab, Adam's betas, weight decay, gradient clipping,
# precision), writes runnable jobs ({py:func}`grpo_lab.export.jobs.trl_job`,
# {py:func}`grpo_lab.export.jobs.verl_job`), and reads the libraries' configs back
# ({py:func}`grpo_lab.export.lint.from_trl`, {py:func}`grpo_lab.export.lint.from_verl`). The tables on this page
# are generated from it.

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
PROFILE = "cpu"  # this page trains nothing; the profile does not change it

# %% tags=["hide-input"]
import importlib.util
import re
import tempfile
import warnings
from pathlib import Path

import pandas as pd
from IPython.display import Markdown, display

from grpo_lab.lab import book
from grpo_lab import export
from grpo_lab.algo.algorithms import DAPO, PRESETS, deepseek_v32
from grpo_lab.tasks import GSM8KTask
from grpo_lab.training.trainer import TrainerConfig

book.setup_notebook(seed=0)


def table(df: pd.DataFrame) -> Markdown:
    """A DataFrame as a Markdown table, rendered as a table by the book (GitHub-flavoured Markdown,
    `nb_render_markdown_format` in _config.yml). A `|` in a cell (`1/|o_i|`) is escaped, else it
    would end the cell there and cut the rest of the row."""
    return Markdown(df.astype(str).replace(r"\|", r"\\|", regex=True).to_markdown(index=False))


# %% [markdown]
# ## Which presets export exactly
#
# For every preset and each library: exact, or the differences that make `to_trl` / `to_verl`
# raise, and the exact alternative (the grpo_lab algorithm that the library's settings do compute).
# DeepSeek-V3.2's objective is not a fixed preset; the row uses $\beta = 0.01$, $\delta = 0.02$,
# $\varepsilon = 0.2$ (chapter 3's choice).

# %% tags=["nbval-ignore-output"]
# Built from the registry (every preset of grpo_lab.algo.algorithms.PRESETS), so a new preset changes this table: its
# content is tested in tests/export/test_export.py, and nbval does not compare it (no re-execution for a new preset).
algorithms = {**PRESETS, "DeepSeek-V3.2": deepseek_v32(beta=0.01, delta=0.02, eps=0.2)}
support = export.support_table(algorithms, group_size=16, max_new_tokens=1024)


def fields(issues: str) -> str:
    """'[lost] overlong_filter: verl has no ...; [approximate] ...' -> 'overlong_filter (lost); ...'
    (the full text of each difference is in the errors printed below)."""
    return "; ".join(f"{name} ({kind})" for kind, name in re.findall(r"\[(\w+)\] ([\w ]+?):", issues)) or "—"


shown = support.assign(issues=support["issues"].map(fields),
                       exact_alternative=support["exact_alternative"].replace("", "—"))
assert set(support["target"]) == {"trl", "verl"} and len(support) == 2 * len(algorithms)
assert support.set_index(["algorithm", "target"]).loc[("DR_GRPO", "verl"), "exact"]  # Dr.GRPO maps exactly
display(table(shown[["algorithm", "target", "exact", "issues", "exact_alternative"]]))

# %% [markdown]
# ## The translation table
#
# One row per choice on each axis: the `grpo_lab` value, TRL's and verl's settings, and what is
# exact and what is not.

# %% tags=["nbval-ignore-output"]
# (tested in tests/export/test_export.py: a row for every choice the export maps; not compared by nbval)
mapping = export.mapping_table()
display(table(mapping))

# %% [markdown]
# ## Worked example: DAPO on verl, at the paper's scale
#
# DAPO's §4.1 setting: Qwen2.5-32B base, 512 prompts per rollout, $G = 16$, mini-batches of 512
# responses (so 16 optimiser steps per rollout), a 20,480-token budget with $L_{\mathrm{cache}} =
# 4{,}096$, learning rate $10^{-6}$ with 20 warm-up steps, $\varepsilon_{\mathrm{low}} = 0.2$,
# $\varepsilon_{\mathrm{high}} = 0.28$. The paper was run on verl but **does not state its node or
# GPU count** in the text our notes transcribe; the cluster below (16 nodes of 8 GPUs, one sequence
# per GPU per forward) is our illustration, not the paper's.
#
# The `DAPO` preset does not export exactly: verl 0.9.1 has no Overlong Filtering, no per-group
# token normaliser (Eq. 12 as written), and a fixed advantage $\epsilon$:
#
# **Minibatches hold whole groups.** Eq. 12 (and CISPO's Eq. 4) divides each group's token sum by
# that group's whole length $\sum_i|o_i|$, so `grpo_lab` shuffles a rollout's *groups*, not its
# rows, before cutting it into minibatches, and `minibatches` must divide `prompts_per_step`. A
# minibatch holding a fragment of a group would divide the fragment by its own length: a response
# alone in its minibatch by $|o_i|$, the length bias Eq. 12 removes. verl's
# `ppo_mini_batch_size` counts prompts (it is multiplied by `rollout.n`), so its mini-batches are
# whole groups too, divided by their tokens (`token-mean`). TRL 1.16 shuffles the *rows* of a
# generation batch across its `steps_per_generation` steps, which is harmless for its
# `loss_type="dapo"` and `"cispo"`: both divide by the whole generation batch's tokens, not per
# group.

# %%
paper = dict(prompts_per_step=512, group_size=16, minibatches=16, max_new_tokens=20480, lr=1e-6, warmup=20,
             nnodes=16, n_gpus_per_node=8, micro_batch_size=1, precision="bfloat16")
try:
    export.to_verl(DAPO, **paper)
except export.ExportError as err:
    print(err)

# %% [markdown]
# The exact alternative of the loss still differs in one place, the warm-up: verl steps its
# learning-rate scheduler once per rollout (after all 16 optimiser updates), grpo_lab and TRL after
# every update, so DAPO's 20 warm-up steps are a staircase of 20 rollouts in verl (which is how the
# paper, run on verl, counted them) and a ramp of 20 updates in grpo_lab. With `strict=False` the
# export keeps the paper's 20 and lists that difference; everything else is exact:

# %%
verl_dapo = DAPO.replace(adv_eps=1e-6, aggregation="token_mean", overlong_filter=False)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    overrides = export.to_verl(verl_dapo, strict=False, **paper)
differences = [str(w.message) for w in caught if issubclass(w.category, export.ApproximateExportWarning)]
assert len(differences) == 1 and "lr_schedule" in differences[0]
print("\n".join(differences))
assert "actor_rollout_ref.actor.clip_ratio_high=0.28" in overrides and "data.max_response_length=20480" in overrides
assert "actor_rollout_ref.actor.optim.betas=[0.9,0.99]" in overrides  # verl's default beta2 0.999 overridden
command = " \\\n    ".join(["python3 -m verl.trainer.main_ppo",
                           "actor_rollout_ref.model.path=Qwen/Qwen2.5-32B",
                           "data.train_files=$DATA/dapo-math-17k.parquet", *overrides])
print(command)

# %% [markdown]
# ## The same on one GPU with TRL
#
# TRL's `GRPOTrainer` on a single GPU, with a small instruct model: eight prompts of 16 responses
# per rollout, a 1,024-token budget, one optimiser step per rollout. `to_trl(DAPO)` raises for the
# per-group normaliser and for dynamic sampling, which TRL 1.16 does not have; the exact alternative
# trains on every group with TRL's `loss_type="dapo"` (a token mean over the batch):

# %%
one_gpu = dict(prompts_per_step=8, group_size=16, minibatches=1, max_new_tokens=1024, lr=1e-6, warmup=20,
               micro_batch_size=8, precision="bfloat16")
try:
    export.to_trl(DAPO, **one_gpu)
except export.ExportError as err:
    print(err)
trl_dapo = DAPO.replace(aggregation="token_mean", dynamic_sampling=False)
kwargs = export.to_trl(trl_dapo, **one_gpu)
assert kwargs["loss_type"] == "dapo" and kwargs["use_bias_correction_kl"] is False and kwargs["beta"] == 0.0
# the optimisation is exported too: TRL's defaults (linear decay to 0, beta2 0.999) are overridden
assert kwargs["lr_scheduler_type"] == "constant_with_warmup" and kwargs["adam_beta2"] == 0.99 and kwargs["bf16"]
print("GRPOConfig(output_dir=..., " + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")")

# %% [markdown]
# The soft overlong punishment is a reward function in TRL, not a `GRPOConfig` field:
# {py:func}`grpo_lab.export.translation.trl_reward_funcs` returns TRL's own, sized with the budget's
# $L_{\mathrm{cache}}$, to add to your task's reward functions.
#
# ## A runnable job, not a fragment
#
# {py:func}`grpo_lab.export.jobs.trl_job` writes everything a TRL run needs into one folder: `train.py`
# (the settings above as a literal dict you can read and edit, the model, `trl.GRPOTrainer`),
# `dataset.jsonl` (the task's prompts exactly as the grpo_lab policy sees them, with the gold
# answers), `rewards.py` (a TRL reward function that calls grpo_lab's own scorer, plus DAPO's soft
# overlong punishment) and a README with every note and difference of the translation. The budget
# comes from a {py:class}`~grpo_lab.training.trainer.TrainerConfig`
# ({py:func}`grpo_lab.export.optimisation.budget_from_config`), so nothing is typed twice. `tests/export/xcheck/test_xcheck_trl_job.py`
# runs such a job for 2 steps on the CPU in CI and checks that its first step's advantages, loss and
# gradient equal grpo_lab's on the same batch. The jobs below are written from the few GSM8K problems
# shipped with grpo_lab (`source="fixture"`), so that this page builds offline; the export warns that
# such a job is for trying only (`JobCaveatWarning`, silenced here). For a real run give
# `GSM8KTask(source="hub")` or a local copy (on the command line, `--task gsm8k` reads the hub, or
# `--task-arg source=PATH`).

# %%
gpu_config = TrainerConfig(**{k: v for k, v in one_gpu.items()})
jobs = Path(tempfile.mkdtemp(prefix="grpo_lab_jobs_"))


def load(path: Path):
    """Import a file a job wrote (its reward adapter) as a module."""
    spec = importlib.util.spec_from_file_location(path.stem + "_" + path.parent.name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sample = GSM8KTask(source="fixture")  # offline: the shipped problems; GSM8KTask(source="hub") for a real run
with warnings.catch_warnings():
    warnings.simplefilter("ignore", export.JobCaveatWarning)  # "for trying the job": said in the text above
    trl_dir = export.trl_job(trl_dapo, sample, "Qwen/Qwen2.5-0.5B-Instruct", jobs / "trl", config=gpu_config,
                             steps=200)
print("files:", ", ".join(sorted(p.name for p in trl_dir.iterdir())))
script = (trl_dir / "train.py").read_text()
assert repr(export.to_trl(trl_dapo, **export.budget_from_config(gpu_config)))[1:40] in script.replace("\n", "")
print("run: cd <job> && accelerate launch train.py   (or: python train.py --cpu --max-steps 2)")
rewards = load(trl_dir / "rewards.py")
first = pd.read_json(trl_dir / "dataset.jsonl", lines=True, dtype=False).head(1).to_dict("list")
gold = first["answer"][0]
right, wrong = f"... so the answer is \\boxed{{{gold}}}.", f"... so the answer is \\boxed{{{int(gold) + 1}}}."
scores = rewards.reward([right, wrong], **{k: v * 2 for k, v in first.items() if k != "prompt"})
assert scores == [1.0, 0.0]
print(f"rewards.reward of a right and a wrong boxed answer to the first problem (gold {gold}): {scores}")

# %% [markdown]
# {py:func}`grpo_lab.export.jobs.verl_job` does the same for verl: `train.parquet` / `test.parquet` in
# verl's RL dataset schema, `reward.py` with the `compute_score` that verl's
# `custom_reward_function` calls, the Hydra overrides and `run.sh`. The reward file matters more
# than it looks: verl's built-in GSM8K scorer reads only a `#### <number>` line, so a policy that
# boxes its answers, as grpo_lab's GSM8K prompts ask, would score 0 on every completion. The job's
# reward is grpo_lab's scorer, which reads both. `tests/export/xcheck/test_xcheck_verl.py` composes the overrides
# with verl's own Hydra config, runs verl's `validate_config` on them and loads `reward.py` through
# verl's own loader.

# %%
paper_config = TrainerConfig(**{k: v for k, v in paper.items() if k not in ("nnodes", "n_gpus_per_node")})
with warnings.catch_warnings():
    warnings.simplefilter("ignore", export.ApproximateExportWarning)  # the warm-up difference printed above
    warnings.simplefilter("ignore", export.JobCaveatWarning)  # the shipped sample, as for the TRL job
    verl_dir = export.verl_job(verl_dapo, sample, "Qwen/Qwen2.5-32B", jobs / "verl", config=paper_config,
                               steps=100, nnodes=16, n_gpus_per_node=8, strict=False)
print("files:", ", ".join(sorted(p.name for p in verl_dir.iterdir())))
lines = (verl_dir / "overrides.txt").read_text().split()
assert all(line in lines for line in overrides)  # the overrides above, then the job's data, reward and model
print("\n".join(line.replace(str(verl_dir), "<job>") for line in lines if line not in overrides))
score = load(verl_dir / "reward.py").compute_score
for answer in (right, f"... {gold} in all.\n#### {gold}", wrong):
    print(f"compute_score({answer[-26:]!r}) = {score('grpo_lab/gsm8k', answer, str(gold))}")

# %% [markdown]
# ## Reading a TRL or verl config back
#
# The reverse direction, for a run that already has a config: {py:func}`grpo_lab.export.lint.from_trl`
# and {py:func}`grpo_lab.export.lint.from_verl` return the grpo_lab `Algorithm` the config computes, the
# paper it is nearest to, and every place it departs from that paper; `python -m grpo_lab
# check-config FILE` prints the same report. The readings go through the export's own tables
# backwards and are exported again to check them, and `tests/export/xcheck/test_xcheck_lint.py` checks each
# reading's loss against the library's own loss code. Here are the libraries' defaults: TRL's
# `GRPOConfig()` and verl's trainer with `algorithm.adv_estimator=grpo`.

# %%
for reading in (export.from_trl({}), export.from_verl(["algorithm.adv_estimator=grpo"])):
    print(reading.report(), end="\n\n")
trl_default = export.from_trl({})
assert trl_default.preset == "GRPO" and trl_default.algorithm.aggregation == "token_mean"
assert any("lr_scheduler_type = 'linear'" in note for note in trl_default.notes)  # decays to 0: not grpo_lab's
verl_default = export.from_verl(["algorithm.adv_estimator=grpo"])
assert not verl_default.exact and any(line.startswith("dual clip c = 3") for line in verl_default.inexact)

# %% [markdown]
# ## What does not move
#
# Routing Replay for Mixture-of-Experts policies (GSPO §5.3, `TrainerConfig.routing_replay`) and
# choices registered outside `grpo_lab` raise for both libraries: the export cannot know what they
# compute. A run with a value model (PPO, VAPO) is verl's `gae` estimator with its critic, which
# this export does not cover yet.
#
# ## At scale
#
# At scale the choice of library decides more than the loss: rollout engines (vLLM, SGLang), the
# sharding of weights and optimiser states (FSDP, Megatron), and how prompts are batched across
# devices. Those do not change the objective, and the objective is what this page pins: the
# settings above make TRL's and verl's losses the papers' (or say which paper's equation they are
# not), and `make xcheck` re-checks that against each library's own code whenever either is
# upgraded.
