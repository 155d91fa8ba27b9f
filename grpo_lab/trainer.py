"""One trainer for every algorithm, in stages: collect → advantages → update → metrics.

The trainer knows the algorithmic axes only through an :class:`grpo_lab.algorithms.Algorithm`
and the functions of each axis: :mod:`grpo_lab.sampling` (which samples train, reward shaping,
loss mask), :meth:`~grpo_lab.algorithms.Algorithm.estimate_advantages` (the advantage
estimator) and :func:`grpo_lab.objectives.policy_loss` (ratio, surrogate, KL, aggregation). It has
no branch on any algorithm's switch. What it owns is the plumbing: sampling groups, recomputing
π_old and π_ref log-probs, splitting a rollout into minibatches and micro-batches with *global*
token/sequence counts (so the gradient does not depend on how the batch is split), reducing
metrics as each metric says (:mod:`grpo_lab.metrics`), logging, checkpointing and exact resume.

π_old: with ``epochs=1, minibatches=1`` the update is on-policy and the ratio is 1 in value;
clipping only acts when the same rollout is used for more than one optimiser step (``epochs`` ×
``minibatches`` > 1) or when π_old differs from the training forward (``old_logp="behaviour"``
uses the log-probs recorded by ``generate``).

Every forward pass (generation, π_old, π_ref, the loss, evaluation) runs in **eval mode**, so
dropout is off throughout. The papers' importance ratio π_θ/π_old compares one function of the
weights at two points; with dropout active in the loss forward only, even an on-policy ratio
would be a ratio of two random dropout masks (a checkpoint with attention dropout 0.1 gave
ratios down to 0 and clip fractions of 0.16 on a purely on-policy step).

Mixture-of-Experts policies (:mod:`grpo_lab.moe`): every step records the experts π_old chose
for each token (in the π_old forwards above) and logs ``routing_change_frac``, the fraction of
routing decisions that one optimiser step changed; ``TrainerConfig.routing_replay`` replays
π_old's experts whenever π_θ is scored on the same rollout (GSPO, arXiv 2507.18071, §5.3).

Where the code departs from the papers: the KL reference is a frozen copy of the initial policy
(DeepSeekMath §4.2 also resets it periodically in iterative GRPO; we do not), and learning-rate
warm-up is linear (``TrainerConfig.warmup``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import numbers
import os
import random
import shutil
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import torch

from . import sampling
from .advantages import (GROUP_BASELINE_ESTIMATORS, VALUE_BASELINE_ESTIMATORS, AdvantageBatch, explained_variance,
                         tied_groups)
from .algorithms import Algorithm, get_algorithm
from .metrics import reduce_micro_batches, reduce_updates, token_mean, total
from .models import CriticModel, _progress_bars, inference_copy
from .moe import RoutingStore, moe_routers, record_routing, replay_routing, routing_changes
from .objectives import METRIC_KEYS, policy_loss, value_loss
from .rollout import Rollout, evaluate, generate, policy_logprobs
from .tasks import Problem, validate_task
from .validation import choice, flag, is_int, non_negative_int, positive_int, positive_number, real_number

__all__ = ["TrainerConfig", "Trainer", "Batch", "Scored", "ValueModel", "peak_memory_mb", "reset_peak_memory",
           "MEASURED_COLUMNS", "PRECISIONS", "resolve_precision"]

#: The history columns that measure the machine rather than the run, namely wall times, throughput and
#: memory. They differ between two runs that are otherwise bit-identical (a resumed run, a run in another
#: process), so drop them before comparing histories.
MEASURED_COLUMNS = ("tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "peak_mem_mb")


@dataclass(frozen=True)
class TrainerConfig:
    """How a run samples and updates (everything that is not the algorithm or the task).

    Attributes:
        prompts_per_step: questions per rollout.
        group_size: G, responses per question (rollout has ``prompts_per_step * G`` rows).
        max_new_tokens: generation budget (default: the task's).
        temperature: sampling temperature (log-probs are computed at the same temperature).
        lr, weight_decay, betas, grad_clip: AdamW and global-norm clipping (``grad_clip > 0``: the
            largest global gradient norm; 0 would zero every update).
        warmup: optimiser steps of linear learning-rate warm-up of the policy (Adam's first steps
            move every parameter by about ``lr`` whatever its gradient, which can collapse a token's
            probability in a tiny model; a short warm-up avoids it). A value model trains at a
            constant ``value_lr``.
        epochs: μ passes over each rollout.
        minibatches: optimiser steps per pass (each on ``B / minibatches`` rows).
        micro_batch_size: rows per forward/backward inside a minibatch (gradient accumulation
            with global token counts), and per chunk of the no-grad π_old / π_ref forwards;
            ``None`` = the whole minibatch (the whole rollout for the no-grad forwards).
        sort_by_length: cut micro-batches from the rows of a minibatch (and chunks of the no-grad
            forwards) in order of length when there are several, so that each is trimmed to its own
            longest row: the same gradient (a sum over micro-batches with global normalisers, up to
            float rounding), less padding. With 16 × 8 rows of the arithmetic task, 46% of a
            minibatch's prompt + completion positions are real tokens; two length-sorted
            micro-batches of 32 instead of one of 64 took one forward + backward from 141 to 92 ms
            (one thread), about 5% of a whole CPU-profile run, and no measurable gain at two threads.
        old_logp: ``"recompute"`` (π_old = the policy before this rollout's first update,
            recomputed by a forward pass) or ``"behaviour"`` (the sampler's log-probs).
        rollout_dtype: ``"float32"`` (sample with the policy itself) or ``"bfloat16"`` /
            ``"float16"``: sample from a copy of the policy's current weights in that dtype
            (:func:`grpo_lab.models.inference_copy`), as an inference engine does; the behaviour
            log-probs then come from that copy, and ``old_logp="behaviour"`` trains against them
            (with the default ``old_logp="recompute"`` they are recorded in the rollout but the
            loss does not use them: only the samples come from the low-precision copy).
        rollout_fp32_lm_head: with a low-precision ``rollout_dtype``, compute that copy's output
            head in float32 (MiniMax-M1, arXiv 2506.13585, §3.2: the fix for the mismatch).
        eval_every: greedy test accuracy every this many steps (and before the first and after
            the last step); 0 disables.
        eval_sampled: also measure sampled accuracy (temperature ``temperature``, 1 sample).
        seed: seeds python, numpy (prompt sampling) and torch (initial state, sampling).
        device: ``"cpu"`` / ``"cuda"``.
        threads: torch intra-op threads (``None`` leaves the setting alone).
        progress: tqdm bar; ``None`` = only when stderr is a terminal and not under CI.
        max_gen_rounds: dynamic sampling (DAPO Eq. 11) only: at most this many generation rounds
            per step while collecting ``prompts_per_step`` groups of mixed accuracy (verl's
            ``max_num_gen_batches``).
        topup: dynamic sampling only. ``True``: the first round samples ``prompts_per_step``
            questions and each further round only about as many as the groups still missing need,
            ``ceil(missing / keep_rate)`` questions (at most ``prompts_per_step``), where
            ``keep_rate`` is the fraction of generated groups the filter has kept over the run so
            far (this step's rounds included). With 23% zero-advantage groups that generates about
            1/(1-0.23) = 1.3 responses per trained response. ``False``: every round samples a
            whole ``prompts_per_step`` batch and the surplus groups of the last round are
            discarded (verl's DAPO recipe), about twice the generation at that rate.
        on_gen_rounds_exhausted: what happens when ``max_gen_rounds`` rounds did not yield
            enough mixed groups: ``"warn"`` (a ``RuntimeWarning``; train on the groups collected,
            or skip the update when there are none) or ``"error"`` (``RuntimeError``).
        value_lr: learning rate of the value model's optimiser (``None``: ``lr``); used only
            when the trainer has a value model. VAPO (§5.1) runs its critic at twice the actor's
            learning rate (2e-6 against 1e-6).
        value_init: the critic the trainer builds when the algorithm's advantage estimator needs
            values (:data:`grpo_lab.advantages.VALUE_BASELINE_ESTIMATORS`, e.g. ``"gae"``) and no
            ``value_model`` is passed: ``"policy"`` (a copy of the policy's backbone with a zero
            scalar head), ``"scratch"`` (a small randomly initialised transformer) or the
            directory of a saved critic (:meth:`grpo_lab.models.CriticModel.save`, e.g. one
            pretrained with :meth:`Trainer.pretrain_value`); see :meth:`grpo_lab.models.CriticModel.build`.
        value_warmup_steps: VAPO §4.1 *Value-Pretraining* inside the run: before the first RL
            step, this many steps of :meth:`Trainer.pretrain_value` (the critic fitted to
            Monte-Carlo returns of the initial policy, which is not updated). 0 = none. Skipped
            when the trainer's critic was already pretrained (``pretrain_value`` called before
            ``train``, or a resumed run). ``Trainer`` raises ``ValueError`` when there is no value
            model to pretrain.
        routing_replay: Routing Replay for Mixture-of-Experts policies (GSPO, arXiv 2507.18071,
            §5.3): the experts each token was routed to when π_old was scored (the no-grad π_old
            forward and the first minibatch's on-policy forward, whose detached log-probs are
            π_old) are forced whenever π_θ is scored on the same rollout in a later optimiser
            step; the gate weights are recomputed from the current router logits at those experts
            (:func:`grpo_lab.moe.replay_routing`), so the router still learns. Needs a MoE policy
            (``Trainer`` raises ``ValueError`` otherwise) and ``old_logp="recompute"`` (the
            sampler's routing is not recorded). It acts only when a rollout feeds more than one
            optimiser step (``epochs`` × ``minibatches`` > 1).
        precision: the dtype of the policy's (and critic's, and reference's) forward passes, in
            generation, scoring and training, through ``torch.autocast``; parameters, gradients,
            optimiser state and every log-prob the loss sees stay float32 (the usual
            mixed-precision recipe). ``"float32"``: no autocast. ``"bfloat16"``: autocast to
            bfloat16. ``"float16"``: autocast to float16 with a ``torch.amp.GradScaler`` (float16's
            range is too narrow for small gradients without loss scaling; a step whose scaled
            gradients overflow, in the policy or the critic, is skipped for both and counted in the
            history's ``amp_skipped_steps``, and the scale is lowered; a forward pass that overflows
            float16 is not caught by the scaler). ``"auto"``: :func:`resolve_precision`, bfloat16 on a CUDA GPU of
            compute capability 8.0 or more (A100, H100, L4), float16 on older ones (T4, V100),
            float32 on CPU. The policy's parameters must be float32 (``Trainer`` raises otherwise).
    """

    prompts_per_step: int = 16
    group_size: int = 8
    max_new_tokens: int | None = None
    temperature: float = 1.0
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.99)
    grad_clip: float = 1.0
    warmup: int = 0
    epochs: int = 1
    minibatches: int = 1
    micro_batch_size: int | None = None
    sort_by_length: bool = True
    old_logp: str = "recompute"
    rollout_dtype: str = "float32"
    rollout_fp32_lm_head: bool = False
    eval_every: int = 10
    eval_sampled: bool = False
    seed: int = 0
    device: str = "cpu"
    threads: int | None = None
    progress: bool | None = None
    max_gen_rounds: int = 8
    topup: bool = True
    on_gen_rounds_exhausted: str = "warn"
    value_lr: float | None = None
    routing_replay: bool = False
    value_init: str = "policy"
    value_warmup_steps: int = 0
    precision: str = "float32"

    def __post_init__(self):
        for name in ("prompts_per_step", "group_size", "epochs", "minibatches", "max_gen_rounds"):
            positive_int(f"TrainerConfig.{name}", getattr(self, name))
        positive_int("TrainerConfig.micro_batch_size", self.micro_batch_size, allow_none=True)
        positive_int("TrainerConfig.max_new_tokens", self.max_new_tokens, allow_none=True)
        if (self.prompts_per_step * self.group_size) % self.minibatches:
            raise ValueError(
                f"TrainerConfig: minibatches={self.minibatches} does not divide the rollout size "
                f"{self.prompts_per_step * self.group_size}")
        choice("TrainerConfig.old_logp", self.old_logp, ("recompute", "behaviour"))
        flag("TrainerConfig.sort_by_length", self.sort_by_length)
        flag("TrainerConfig.topup", self.topup)
        flag("TrainerConfig.routing_replay", self.routing_replay)
        if self.routing_replay and self.old_logp != "recompute":
            raise ValueError("TrainerConfig.routing_replay=True needs old_logp='recompute': routing replay forces the "
                             "experts π_old chose, which the trainer records when it scores π_old; the sampler's "
                             "routing (old_logp='behaviour') is not recorded")
        choice("TrainerConfig.rollout_dtype", self.rollout_dtype, ("float32", "bfloat16", "float16"))
        flag("TrainerConfig.rollout_fp32_lm_head", self.rollout_fp32_lm_head)
        if self.rollout_fp32_lm_head and self.rollout_dtype == "float32":
            raise ValueError("TrainerConfig.rollout_fp32_lm_head=True only acts with a low-precision rollout_dtype "
                             "('bfloat16' or 'float16'); the float32 sampler's head is already float32")
        choice("TrainerConfig.on_gen_rounds_exhausted", self.on_gen_rounds_exhausted, ("warn", "error"))
        choice("TrainerConfig.precision", self.precision, PRECISIONS)
        for name in ("temperature", "lr", "grad_clip"):
            positive_number(f"TrainerConfig.{name}", getattr(self, name))
        if self.value_lr is not None:
            positive_number("TrainerConfig.value_lr", self.value_lr)
        real_number("TrainerConfig.weight_decay", self.weight_decay, minimum=0)
        if not isinstance(self.value_init, (str, os.PathLike)) or not str(self.value_init).strip():
            raise ValueError(f"TrainerConfig.value_init must be 'policy', 'scratch' or the directory of a saved critic, "
                             f"got {self.value_init!r}")
        object.__setattr__(self, "value_init", str(self.value_init))
        for name in ("warmup", "eval_every", "seed", "value_warmup_steps"):
            non_negative_int(f"TrainerConfig.{name}", getattr(self, name))
        positive_int("TrainerConfig.threads", self.threads, allow_none=True)
        if len(tuple(self.betas)) != 2 or not all(0 <= real_number("TrainerConfig.betas", b) < 1 for b in self.betas):
            raise ValueError(f"TrainerConfig.betas must be two numbers in [0, 1), got {self.betas!r}")
        # numpy scalars pass the checks above: store python numbers (JSON, hashing, provenance)
        for name in ("prompts_per_step", "group_size", "epochs", "minibatches", "max_gen_rounds", "micro_batch_size",
                     "max_new_tokens", "warmup", "eval_every", "seed", "threads", "value_warmup_steps"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("temperature", "lr", "grad_clip", "weight_decay", "value_lr"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ValueError(f"TrainerConfig.device must be a torch device such as 'cpu' or 'cuda', "
                             f"got {self.device!r}") from None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainerConfig":
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)


#: The values of :attr:`TrainerConfig.precision`.
PRECISIONS = ("float32", "bfloat16", "float16", "auto")


def resolve_precision(precision: str, device: str | torch.device) -> str:
    """The autocast dtype name that ``precision`` means on ``device``.

    ``"auto"``: ``"bfloat16"`` on a CUDA device of compute capability 8.0 or more (Ampere and
    later: A100, L4, H100 have bfloat16 tensor cores), ``"float16"`` on an older CUDA device (T4,
    V100: bfloat16 there is emulated and slow, so float16 with loss scaling is the fast choice),
    ``"float32"`` on any other device. Anything else is returned as given.

    Args:
        precision: one of :data:`PRECISIONS`.
        device: the training device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device``).

    Returns:
        ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Raises:
        ValueError: ``precision`` is not one of :data:`PRECISIONS`.
    """
    choice("precision", precision, PRECISIONS)
    if precision != "auto":
        return precision
    dev = torch.device(device)
    if dev.type != "cuda":
        return "float32"
    return "bfloat16" if torch.cuda.get_device_capability(dev) >= (8, 0) else "float16"


def reset_peak_memory(device: str | torch.device) -> None:
    """Start a new window for :func:`peak_memory_mb`: on CUDA ``torch.cuda.reset_peak_memory_stats``;
    on Linux the process's peak resident set size (``VmHWM``) is reset to its current size by
    writing ``5`` to ``/proc/self/clear_refs``; elsewhere (or if that file is not writable) nothing
    can be reset and the peak covers the process's life."""
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_memory_mb(device: str | torch.device) -> float:
    """Peak memory in MiB since the last :func:`reset_peak_memory` (the trainer resets it at the
    start of every step, so the history's ``peak_mem_mb`` is that step's peak).

    * CUDA: the most memory torch allocated on the device (``torch.cuda.max_memory_allocated``):
      tensors only, not the caching allocator's reserve or the CUDA context.
    * CPU on Linux: the process's peak resident set size (``VmHWM`` of ``/proc/self/status``):
      everything the process holds (the interpreter, torch, every model in memory, the
      allocator's caches), so compare algorithms in fresh processes of the same kind.
    * Other systems: the peak resident set size since the process started (``ru_maxrss``).
    """
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10  # kB
    except (OSError, ValueError, IndexError):
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def _checked_values(v, part: Rollout, grad: bool = False) -> torch.Tensor:
    """``v`` if it is what :class:`ValueModel` promises for ``part``: a float ``[B, T]`` tensor (``T`` the
    rollout's completion width), with grad in the update; ``TypeError`` / ``ValueError`` naming the
    method otherwise."""
    B, T = part.completion_ids.shape
    if not isinstance(v, torch.Tensor) or not v.is_floating_point():
        raise TypeError(f"ValueModel.values(rollout) must return a float tensor [B, T] = [{B}, {T}], got "
                        f"{type(v).__name__ if not isinstance(v, torch.Tensor) else v.dtype}")
    if tuple(v.shape) != (B, T):
        raise ValueError(f"ValueModel.values(rollout) must return one value per completion token, shape [B, T] = "
                         f"[{B}, {T}], got {tuple(v.shape)}")
    if grad and not v.requires_grad:
        raise ValueError("ValueModel.values(rollout) returned a tensor without grad in the update: compute it from the "
                         "value model's parameters (no torch.no_grad or detach inside values)")
    return v


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of ``x`` over ``mask != 0`` (values elsewhere, NaN included, are ignored); NaN when empty."""
    keep = mask != 0
    n = float(keep.sum())
    return float(torch.where(keep, x.double(), 0.0).sum() / n) if n else float("nan")


def _value_metrics(batch: "Batch", gamma: float = 1.0) -> dict:
    """The advantage and critic columns of a history row (NaN when absent): ``adv_mean``, ``adv_std``
    (population), ``adv_min``, ``adv_max`` over the tokens of the loss (a per-sequence advantage
    counts once per token); with a critic, on the step's batch *before* its update,
    ``explained_variance`` of the critic's targets by the values
    (:func:`grpo_lab.advantages.explained_variance`), ``explained_variance_mc`` of the Monte-Carlo
    returns (GAE at ``lam = 1``, discount ``gamma``: the same yardstick for every critic, whatever
    its targets), ``value_mean`` and ``return_mean`` (the critic's targets)."""
    from .advantages import gae, outcome_token_rewards

    nan = float("nan")
    out = dict.fromkeys(("adv_mean", "adv_std", "adv_min", "adv_max", "explained_variance", "explained_variance_mc",
                         "value_mean", "return_mean"), nan)
    if batch.advantages is None or batch.loss_mask is None:
        return out
    m = batch.loss_mask.to(batch.advantages.device) != 0
    a = batch.advantages if batch.advantages.dim() == 2 else batch.advantages[:, None].expand(m.shape)
    a = a[m].double()
    if a.numel():
        out.update(adv_mean=float(a.mean()), adv_std=float(a.std(unbiased=False)), adv_min=float(a.min()),
                   adv_max=float(a.max()))
    if batch.values is not None and batch.returns is not None:
        lm = batch.loss_mask.to(batch.values.device)
        mc = gae(outcome_token_rewards(batch.rewards, lm), batch.values, lm, gamma=gamma, lam=1.0)[1]
        out.update(explained_variance=explained_variance(batch.values, batch.returns, lm),
                   explained_variance_mc=explained_variance(batch.values, mc.to(batch.values.device), lm),
                   value_mean=_masked_mean(batch.values, lm), return_mean=_masked_mean(batch.returns, lm))
    return out


class ValueModel(Protocol):
    """The value-model slot of :class:`Trainer` (filled by PPO-style algorithms with a critic).

    ``values(rollout)`` returns float32 ``[B, T]`` value estimates V(s_t) of the completion tokens
    (0 on padding). The trainer calls it without grad at collect time (the values handed to the
    advantage estimator as ``AdvantageBatch.values``, and the ``old_values`` of the clipped value
    loss) and with grad in the update, where it minimises
    :func:`grpo_lab.objectives.value_loss` against the algorithm's critic targets
    (:meth:`grpo_lab.algorithms.Algorithm.value_targets`), normalised by the minibatch's global
    token count. It is an ``nn.Module`` (``parameters``, ``state_dict``, ``to``, ``eval``);
    :class:`grpo_lab.models.CriticModel` is the package's.
    """

    def values(self, rollout: Rollout) -> torch.Tensor: ...


@dataclass
class Scored:
    """One generated rollout with its rewards (the *collect* stage's unit).

    Attributes:
        rollout: the :class:`~grpo_lab.rollout.Rollout`.
        raw: ``[B]`` float32 task rewards.
        correct: ``[B]`` bool raw correctness (``task.is_correct``).
        rewards: ``[B]`` float32 training rewards (``raw`` shaped by :func:`grpo_lab.sampling.shape`).
    """

    rollout: Rollout
    raw: torch.Tensor
    correct: torch.Tensor
    rewards: torch.Tensor


@dataclass
class Batch:
    """What one step trains on (the output of :meth:`Trainer.collect`).

    Attributes:
        generated: every rollout generated this step, scored (for the metrics).
        rollout: the rows kept for the update (groups contiguous), or ``None`` when none was kept.
        rewards: ``[B]`` float32 training rewards of those rows.
        loss_mask: ``[B, T]`` float32, the tokens that enter the loss.
        correct: ``[B]`` bool raw correctness of those rows (``task.is_correct``).
        values: ``[B, T]`` float32 value estimates when the trainer has a value model, else ``None``.
        advantages: ``[B]`` or ``[B, T]`` float32, filled by the *advantages* stage.
        returns: ``[B, T]`` float32 critic targets, filled by the *advantages* stage when there are
            values (:meth:`grpo_lab.algorithms.Algorithm.value_targets`).
        selected_groups: groups the selector kept over all rounds, before the surplus of the
            last round was dropped (the numerator of the running keep rate, :meth:`Trainer.round_size`).
    """

    generated: list[Scored]
    rollout: Rollout | None = None
    rewards: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    correct: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    selected_groups: int = 0


def _demonstration_rollout(tokenizer, task, problems, rng: np.random.Generator, device) -> Rollout:
    """A teacher-forced batch of ``task.demonstration(problem, rng)`` + EOS after each prompt
    (prompts left-padded, demonstrations right-padded), for :attr:`Algorithm.ntp_coef`.

    Raises:
        TypeError: the task has no ``demonstration(problem, rng) -> str`` method.
    """
    demo_fn = getattr(task, "demonstration", None)
    if not callable(demo_fn):
        raise TypeError(f"Trainer: ntp_coef > 0 trains on the task's ground truth, but {type(task).__name__} has no "
                        "demonstration(problem, rng) -> str method")
    prompts = tokenizer([p.prompt for p in problems], add_special_tokens=False, padding=True, return_tensors="pt")
    demos = [tokenizer(demo_fn(p, rng), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
             for p in problems]
    T = max(len(d) for d in demos)
    comp = torch.full((len(demos), T), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(demos), T)
    for i, d in enumerate(demos):
        comp[i, :len(d)] = torch.tensor(d)
        mask[i, :len(d)] = 1.0
    return Rollout(prompt_ids=prompts["input_ids"].to(device), prompt_mask=prompts["attention_mask"].to(device),
                   completion_ids=comp.to(device), completion_mask=mask.to(device),
                   behaviour_logp=torch.zeros(len(demos), T, device=device),
                   truncated=torch.zeros(len(demos), dtype=torch.bool), texts=[""] * len(demos),
                   problems=list(problems), group_size=1, temperature=1.0)


class Trainer:
    """GRPO-family trainer for a ``transformers`` causal LM, in stages.

    One :meth:`train` step runs :meth:`collect` (generate, score, select, shape),
    :meth:`compute_advantages` and :meth:`update` (epochs × minibatches × micro-batches), then logs
    one history row. Every algorithmic choice comes from ``algo``: advantages through
    :meth:`~grpo_lab.algorithms.Algorithm.estimate_advantages`, the loss through
    :func:`~grpo_lab.objectives.policy_loss`, selection, shaping and the loss mask through
    :mod:`grpo_lab.sampling`.

    Args:
        policy: the causal LM to train (updated in place; put in eval mode, see the module docstring).
        tokenizer: its tokenizer.
        task: a :class:`grpo_lab.tasks.base.Task`.
        algo: the :class:`grpo_lab.algorithms.Algorithm`.
        config: a :class:`TrainerConfig`.
        ref_policy: the KL reference; default a frozen copy of ``policy`` at construction
            (only created when ``algo`` has a KL term).
        value_model: optional critic (see :class:`ValueModel`): its values are computed at collect
            time and handed to the advantage estimator, its loss is minimised in the update by its
            own AdamW (``TrainerConfig.value_lr``), and it is saved and resumed with the trainer.
            Default: none, unless the algorithm's advantage estimator needs values
            (:data:`grpo_lab.advantages.VALUE_BASELINE_ESTIMATORS`): then the critic named by
            ``TrainerConfig.value_init`` (:meth:`grpo_lab.models.CriticModel.build`).

    ``train(steps)`` returns the history DataFrame (one row per step); ``save(path)`` and
    ``Trainer.resume(path)`` checkpoint and continue exactly.

    Raises:
        TypeError: ``task`` does not implement the task protocol (:func:`grpo_lab.tasks.validate_task`
            names every missing or ill-typed member).
            Or the algorithm has ``ntp_coef > 0`` and the task no ``demonstration`` method.
        ValueError: the algorithm's sampling choices do not fit the config (:func:`grpo_lab.sampling.check`);
            ``TrainerConfig.routing_replay=True`` with a policy that has no Mixture-of-Experts
            layers (:func:`grpo_lab.moe.moe_routers`), or whose routers lack ``norm_topk_prob``
            or differ in ``top_k``.

    Warns:
        RuntimeWarning: ``group_size=1`` with an advantage estimator whose baseline is the group
            (:data:`grpo_lab.advantages.GROUP_BASELINE_ESTIMATORS`): every advantage would be 0.
    """

    def __init__(self, policy, tokenizer, task, algo: Algorithm, config: TrainerConfig | None = None,
                 *, ref_policy=None, value_model=None):
        validate_task(task)  # cheap: attributes and signatures only, no call into the task (no RNG is touched)
        self.config = c = config or TrainerConfig()
        algo = get_algorithm(algo) if isinstance(algo, str) else algo
        if not isinstance(algo, Algorithm):
            raise ValueError(f"Trainer: algo must be an Algorithm or a preset name, got {type(algo).__name__}")
        if torch.device(c.device).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"Trainer: TrainerConfig.device={c.device!r} but CUDA is not available")
        self.algo, self.task, self.tokenizer = algo, task, tokenizer
        if c.threads:
            torch.set_num_threads(c.threads)
        not_fp32 = sorted({str(p.dtype) for p in policy.parameters() if p.dtype != torch.float32})
        if not_fp32:
            raise ValueError(f"Trainer: the policy has {', '.join(not_fp32)} parameters; the trainer keeps float32 "
                             "weights, gradients and optimiser state and runs the forward passes in "
                             "TrainerConfig.precision (autocast). Load it in float32 (load_policy(..., "
                             "dtype=torch.float32); hub checkpoints such as Qwen2.5's are stored in bfloat16) and set "
                             "precision='bfloat16' or 'auto'")
        #: the autocast dtype this trainer uses (:func:`resolve_precision` of ``config.precision``)
        self.precision = resolve_precision(c.precision, c.device)
        self._device_type = torch.device(c.device).type
        self.scaler = torch.amp.GradScaler(self._device_type, enabled=self.precision == "float16")
        self.amp_skipped_steps = 0
        self.policy = policy.to(c.device).eval()
        self.moe_routers = moe_routers(self.policy)
        if c.routing_replay and not self.moe_routers:
            raise ValueError(f"Trainer: TrainerConfig.routing_replay=True but the policy "
                             f"({type(self.policy).__name__}) has no Mixture-of-Experts layers (no `mlp.gate` "
                             "top-k router); routing replay applies to MoE policies only, e.g. "
                             "load_policy('arithmetic-moe-base')")
        if c.routing_replay and not all(isinstance(getattr(r, "norm_topk_prob", None), bool)
                                        for _, r in self.moe_routers):
            raise ValueError("Trainer: TrainerConfig.routing_replay=True needs routers with a boolean "
                             "`norm_topk_prob` (Qwen2-MoE / Qwen3-MoE), to recompute the gate weights")
        if c.routing_replay and len({r.top_k for _, r in self.moe_routers}) != 1:
            raise ValueError("Trainer: TrainerConfig.routing_replay=True needs every MoE layer to route to the same "
                             "number of experts (top_k)")
        self.uses_kl = algo.uses_kl
        self.ref_policy = None
        if self.uses_kl:
            self.ref_policy = (ref_policy if ref_policy is not None else copy.deepcopy(policy)).to(c.device).eval()
            self.ref_policy.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=c.lr, weight_decay=c.weight_decay,
                                           betas=tuple(c.betas))
        if value_model is None and algo.advantage in VALUE_BASELINE_ESTIMATORS:
            value_model = CriticModel.build(c.value_init, policy, tokenizer, seed=c.seed)
        self.value_model, self.value_optimizer = value_model, None
        self.value_warmup_rows: list[dict] = []
        if value_model is not None:
            self.value_model = value_model.to(c.device).eval()
            self.value_optimizer = torch.optim.AdamW(value_model.parameters(), lr=c.value_lr or c.lr,
                                                     weight_decay=c.weight_decay, betas=tuple(c.betas))
        self.step = 0
        self.opt_steps = 0
        self.rows: list[dict] = []
        self.max_new_tokens = c.max_new_tokens or task.max_new_tokens
        sampling.check(algo, group_size=c.group_size, max_new_tokens=self.max_new_tokens)
        if algo.ntp_coef > 0 and not callable(getattr(task, "demonstration", None)):
            raise TypeError(f"Trainer: {algo.name!r} has ntp_coef={algo.ntp_coef:g}, a next-token-prediction term on the "
                            f"task's ground truth, but {type(task).__name__} has no demonstration(problem, rng) -> str "
                            "method to provide it")
        self._check_value_settings()
        if c.group_size == 1 and algo.advantage in GROUP_BASELINE_ESTIMATORS:
            warnings.warn(f"Trainer: group_size=1 with the advantage estimator {algo.advantage!r} of "
                          f"{algo.name!r}: its baseline is the other responses of the same group, so it needs "
                          "group_size >= 2 (G >= 2); with one response per question every advantage is 0 "
                          "('rloo' raises) and the loss has no policy-gradient signal. Set "
                          "TrainerConfig.group_size to 2 or more",
                          RuntimeWarning, stacklevel=2)
        random.seed(c.seed)
        self.rng = np.random.default_rng(c.seed)
        torch.manual_seed(c.seed)

    def _check_value_settings(self) -> None:
        """Refuse or flag value-model settings that would silently do nothing (see :meth:`__init__`)."""
        c, algo = self.config, self.algo
        if self.value_model is None:
            if c.value_warmup_steps:
                raise ValueError(f"Trainer: TrainerConfig.value_warmup_steps={c.value_warmup_steps} but there is no value "
                                 f"model to pretrain: {algo.name!r} uses the advantage estimator {algo.advantage!r}, "
                                 "which needs none (use a value-based one such as 'gae', or pass value_model=)")
            if c.value_init != "policy":
                warnings.warn(f"Trainer: TrainerConfig.value_init={c.value_init!r} is ignored: {algo.name!r} builds no "
                              f"value model (its advantage estimator {algo.advantage!r} uses none)",
                              RuntimeWarning, stacklevel=3)
        if algo.advantage in VALUE_BASELINE_ESTIMATORS and algo.lam_alpha is not None:
            at_budget = 1.0 - 1.0 / (algo.lam_alpha * self.max_new_tokens)
            if at_budget < 0.5:
                warnings.warn(
                    f"Trainer: {algo.name!r} uses the length-adaptive lambda 1 - 1/(lam_alpha * l) with lam_alpha="
                    f"{algo.lam_alpha:g}, which is below 0.5 even at the generation budget of {self.max_new_tokens} "
                    f"tokens (0 for every response of at most {1 / algo.lam_alpha:g} tokens: pure TD, the reward "
                    "reaches only the last tokens). VAPO's alpha = 0.05 was sized for responses thousands of tokens "
                    "long; size it for yours, e.g. lam_alpha = 1 / (0.05 * typical length) puts lambda = 0.95 at "
                    "that length (--set lam_alpha=4 for the arithmetic task; chapter 6, section 6.4)",
                    RuntimeWarning, stacklevel=3)

    # ------------------------------------------------------------------ public API
    @property
    def history(self) -> pd.DataFrame:
        """One row per step (see :meth:`train`)."""
        return pd.DataFrame(self.rows)

    def evaluate(self, *, greedy: bool = True) -> dict:
        """Test-set accuracy now (does not advance any training RNG: the torch RNG state is
        saved and restored around sampled evaluation)."""
        return self._evaluate_frame(greedy=greedy)[0]

    def _evaluate_frame(self, *, greedy: bool) -> tuple[dict, pd.DataFrame]:
        """:meth:`evaluate`, with the per-problem frame of :func:`grpo_lab.rollout.evaluate`."""
        state = torch.random.get_rng_state()
        try:
            with self._autocast():
                return evaluate(self.policy, self.tokenizer, self.task, greedy=greedy,
                                temperature=self.config.temperature, max_new_tokens=self.max_new_tokens)
        finally:
            torch.random.set_rng_state(state)
            self.policy.eval()

    def train(self, steps: int) -> pd.DataFrame:
        """Run ``steps`` more steps; returns the whole history.

        Columns: ``step``, ``reward``, ``accuracy`` (train samples, raw correctness),
        ``length``, ``length_correct``, ``length_incorrect`` (tokens incl. EOS; NaN when a step
        has no correct/incorrect sample), ``entropy`` (nats/token), then every metric of
        :func:`grpo_lab.objectives.policy_loss` reduced over the step's updates as the metric
        says (:mod:`grpo_lab.metrics`): ``loss``, ``pg_loss``, ``kl`` (NaN when the algorithm has
        no KL term: no reference model is kept), ``clip_frac_low``, ``clip_frac_high``,
        ``clip_frac``, ``ratio_mean/min/max``, ``ratio_q05/q50/q95``, ``grad_token_frac``,
        ``adv_abs_mean``, ...; ``grad_norm`` (before clipping), ``zero_adv_group_frac`` (tied
        groups, :func:`grpo_lab.advantages.tied_groups`), ``truncation_rate``,
        ``reasoning_frac`` (tasks that define it), ``tokens_per_s`` (generated tokens / step wall
        time), ``gen_seconds``, ``step_seconds``, ``test_accuracy`` and ``test_length`` (greedy,
        NaN on steps without evaluation; the row of step ``k`` holds the evaluation *after* ``k``
        updates, step 0 the base policy), ``test_<name>`` for every entry of the task's optional
        ``test_metrics(frame) -> dict`` (and ``test_sampled_<name>`` with ``eval_sampled``),
        ``eval_seconds`` (wall time of that evaluation, not
        included in ``step_seconds``); then the sampling & shaping columns of
        :func:`grpo_lab.sampling.sampling_metrics` (``gen_rounds``, ``generated_groups``, ``selected_groups``, ``trained_groups``,
        ``samples_per_trained``, ``overlong_frac_penalised``); the advantage statistics ``adv_mean``,
        ``adv_std``, ``adv_min``, ``adv_max`` (over the tokens of the loss) and, with a value model,
        ``value_loss`` (the critic's loss, summed over micro-batches and averaged over optimiser
        steps like ``loss``), ``explained_variance`` (of the critic's own targets),
        ``explained_variance_mc`` (of the Monte-Carlo returns, comparable across critics whose
        targets differ), ``value_mean`` and ``return_mean`` (on the step's batch before the update;
        NaN without a value model); ``peak_mem_mb``
        (:func:`peak_memory_mb`: the step's peak CUDA allocation, or on Linux CPUs the process's peak
        resident set during the step); and
        ``routing_change_frac``: for Mixture-of-Experts policies, the fraction of routing
        decisions that the rollout's first optimiser step changed (GSPO, arXiv 2507.18071, §5.3,
        reports ~10% per update in a 48-layer MoE). A decision is the top-k expert set of one real
        completion token in one MoE layer (prompt tokens are not counted: they are shared by the
        G responses of a group and are not scored); it is compared between π_old (recorded when
        π_old was scored) and the policy after one update, on the rows of the rollout's second
        optimiser step, in that step's own forward (no extra pass). With ``routing_replay`` the
        routers' own choices are read from their logits before the replayed experts replace
        them, so the column means the same with and without replay. NaN for dense policies,
        with ``old_logp="behaviour"``, and when a rollout feeds a single optimiser step.

        Which samples each column describes: ``reward``, ``accuracy``, the lengths,
        ``reasoning_frac``, ``zero_adv_group_frac``, ``truncation_rate``, ``tokens_per_s`` and
        ``gen_seconds`` cover **every** sample generated in the step (with dynamic sampling, all
        rounds, before filtering, so they describe the policy, not the filtered batch); the
        loss, ratio, clip, KL, entropy and gradient columns cover the tokens of the update batch
        that enter the loss (overlong filtering removes truncated rows). ``reward`` is
        the shaped reward (task reward + overlong penalty), ``accuracy`` the raw correctness.
        A step whose dynamic sampling kept no group (``on_gen_rounds_exhausted="warn"``) makes no
        update: ``trained_groups`` is 0 and the update columns are NaN.
        """
        c = self.config
        end = self.step + non_negative_int("train: steps", steps)
        if self.step == 0 and c.value_warmup_steps and not self.value_warmup_rows:
            if self.value_model is None:
                raise ValueError("Trainer: TrainerConfig.value_warmup_steps > 0 but the trainer has no value model")
            self.pretrain_value(c.value_warmup_steps)
        if self.step == 0 and c.eval_every and not self.rows:
            self.rows.append(self._eval_row())
        bar = None
        if self._show_progress():
            from tqdm.auto import tqdm
            bar = tqdm(total=steps, desc=f"{self.algo.name} seed {c.seed}", mininterval=1.0)
        while self.step < end:
            row = self._train_step()
            self.step += 1
            row["step"] = self.step
            if c.eval_every and (self.step % c.eval_every == 0 or self.step == end):
                row.update({k: v for k, v in self._eval_row().items() if k != "step"})
            self.rows.append(row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{row['reward']:.2f}", len=f"{row['length']:.1f}")
        if bar is not None:
            bar.close()
        return self.history

    def _show_progress(self) -> bool:
        """Whether progress bars show: ``TrainerConfig.progress``, or with ``None`` only when stderr
        is a terminal and ``$CI`` is unset."""
        c = self.config
        return bool(c.progress) if c.progress is not None else (sys.stderr.isatty() and not _under_ci())

    # ------------------------------------------------------------------ stages
    def rollout(self, n_prompts: int | None = None) -> Rollout:
        """Sample one rollout (``n_prompts`` questions, default ``prompts_per_step``, × G responses)
        with the current policy.

        Raises:
            TypeError: ``task.sample(n, rng)`` did not return a list of exactly ``n``
                :class:`grpo_lab.tasks.Problem` with non-empty ``str`` prompts (the task protocol,
                :class:`grpo_lab.tasks.base.Task`); the message names the task and what it returned.
        """
        c = self.config
        n = c.prompts_per_step if n_prompts is None else n_prompts
        problems = self.task.sample(n, self.rng)
        _check_sampled(self.task, problems, n)
        sampler = self.policy
        if c.rollout_dtype != "float32":  # an "inference engine": a low-precision copy of the current weights
            sampler = inference_copy(self.policy, c.rollout_dtype, fp32_lm_head=c.rollout_fp32_lm_head)
        with self._autocast():
            return generate(sampler, self.tokenizer, problems, group_size=c.group_size,
                            max_new_tokens=self.max_new_tokens, temperature=c.temperature)

    def score(self, ro: Rollout) -> Scored:
        """Task rewards and correctness of a rollout, and the training reward (:func:`grpo_lab.sampling.shape`).

        Raises:
            TypeError: the task returned a reward that is not a real number (e.g. ``None`` or a
                string); the message names the sample index, its problem and its text.
            ValueError: a NaN or infinite reward (same details).
        """
        raw = torch.tensor([_check_reward(self.task.reward(t, p), i, t, p)
                            for i, (t, p) in enumerate(zip(ro.texts, ro.problems))], dtype=torch.float32)
        correct = torch.tensor([bool(self.task.is_correct(t, p)) for t, p in zip(ro.texts, ro.problems)])
        shaped = sampling.shape(self.algo, raw, ro.lengths.cpu(), self.max_new_tokens)
        return Scored(ro, raw, correct, shaped)

    def collect(self) -> Batch:
        """Generate, score and select this step's training rows.

        Rounds of generation are drawn until ``prompts_per_step`` groups were selected
        (:func:`grpo_lab.sampling.select_groups`; extras of the last round are dropped) or
        ``max_gen_rounds`` rounds were drawn. Keeping every group (the default selector) takes one
        rollout of ``prompts_per_step`` questions; DAPO's dynamic sampling (Eq. 11) may take
        several, sized by :meth:`round_size`.

        Raises:
            RuntimeError: too few groups after ``max_gen_rounds`` with ``on_gen_rounds_exhausted="error"``.
        """
        c, G = self.config, self.config.group_size
        batch, parts, n_kept = Batch(generated=[]), [], 0
        while n_kept < c.prompts_per_step and len(batch.generated) < c.max_gen_rounds:
            n_prompts = self.round_size(c.prompts_per_step - n_kept, batch) if batch.generated else c.prompts_per_step
            s = self.score(self.rollout(n_prompts))
            batch.generated.append(s)
            selected = sampling.select_groups(self.algo, s.correct, G)
            batch.selected_groups += len(selected)
            groups = selected[: c.prompts_per_step - n_kept]
            if len(groups) * G == len(s.rollout):
                parts.append((s.rollout, s.rewards, s.correct))
            elif len(groups):
                rows = (groups[:, None] * G + torch.arange(G)).flatten()
                parts.append((s.rollout.select(rows), s.rewards[rows], s.correct[rows]))
            n_kept += len(groups)
        if n_kept < c.prompts_per_step:
            self._short_of_groups(n_kept)
        if parts:
            batch.rollout = _concat_rollouts([p[0] for p in parts], self.tokenizer.pad_token_id)
            batch.rewards = torch.cat([p[1] for p in parts])
            batch.correct = torch.cat([p[2] for p in parts])
            batch.loss_mask = sampling.loss_mask(self.algo, batch.rollout.completion_mask, batch.rollout.truncated)
            if self.value_model is not None:
                batch.values = self._values(batch.rollout)
        return batch

    def round_size(self, missing: int, batch: Batch) -> int:
        """Questions to sample in the next dynamic-sampling round when ``missing`` groups are still
        needed: ``prompts_per_step`` with ``TrainerConfig.topup=False``; otherwise
        ``min(prompts_per_step, ceil(missing / keep_rate))``, where ``keep_rate`` is the fraction of
        generated groups selected over the run so far (earlier steps' ``selected_groups`` /
        ``generated_groups`` history columns plus this step's rounds); ``prompts_per_step`` while
        no group has been selected yet. Deterministic given the history, so resume stays exact."""
        c = self.config
        if not c.topup:
            return c.prompts_per_step
        G = c.group_size
        generated = sum(len(s.rollout) for s in batch.generated) // G
        selected = batch.selected_groups
        for r in self.rows:
            if "generated_groups" in r and "selected_groups" in r:
                generated += int(r["generated_groups"])
                selected += int(r["selected_groups"])
        if selected == 0:
            return c.prompts_per_step
        return max(1, min(c.prompts_per_step, -(-missing * generated // selected)))  # integer ceil

    def compute_advantages(self, batch: Batch) -> torch.Tensor:
        """The *advantages* stage: ``algo``'s estimator on the batch view (rewards, group ids, loss
        mask, values), on the training device; with values, also the critic's targets
        (``batch.returns``, :meth:`~grpo_lab.algorithms.Algorithm.value_targets`)."""
        view = AdvantageBatch.from_groups(batch.rewards, self.config.group_size, mask=batch.loss_mask,
                                          values=batch.values)
        batch.advantages = self.algo.estimate_advantages(view).to(self.config.device)
        if batch.values is not None:
            batch.returns = self.algo.value_targets(view, batch.advantages).to(self.config.device)
        return batch.advantages

    @torch.no_grad()
    def _values(self, ro: Rollout) -> torch.Tensor:
        """float32 ``[B, T]`` critic values of ``ro`` without grad, in micro-batches."""
        c = self.config
        micro = c.micro_batch_size or len(ro)
        out = torch.zeros(ro.completion_ids.shape, device=ro.completion_ids.device)
        for s in range(0, len(ro), micro):
            idx = torch.arange(s, min(s + micro, len(ro)))
            part = ro.select(idx)
            with self._autocast():
                v = _checked_values(self.value_model.values(part), part)
            out[idx, : v.shape[1]] = v.float()
        return out

    def update(self, batch: Batch) -> tuple[list[dict], list[float], list[tuple[float, float]]]:
        """The *update* stage: ``epochs`` passes of ``minibatches`` optimiser steps, each summing
        ``micro_batch_size``-row micro-batches whose losses are normalised by the minibatch's
        global token and sequence counts (so the gradient does not depend on the split).

        Returns:
            ``(metrics, grad_norms, entropies)``: per optimiser step the micro-batch-reduced
            metrics (:func:`grpo_lab.metrics.reduce_micro_batches`) and the gradient norm before
            clipping; per first-epoch micro-batch ``(entropy sum, token count)``.
        """
        c, ro = self.config, batch.rollout
        B, lm = len(ro), batch.loss_mask
        n_mb = min(c.minibatches, B)  # fewer rows than configured only when dynamic sampling fell short
        bounds = [(m * B) // n_mb for m in range(n_mb + 1)]  # = m * B / minibatches when it divides
        micro = c.micro_batch_size or (B // n_mb)
        gen = torch.Generator().manual_seed(int(self.rng.integers(2**62)))
        orders = [torch.randperm(B, generator=gen) if c.minibatches > 1 else torch.arange(B) for _ in range(c.epochs)]
        lengths = ro.token_counts()
        store = self._routing_store(ro, n_mb)
        old_logp, ref_logp = self._reference_logps(ro, n_mb, skip_rows=orders[0][:bounds[1]], routing=store)
        step_metrics, grad_norms, entropies = [], [], []
        n_updates = 0  # optimiser steps taken on this rollout so far
        for epoch, order in enumerate(orders):
            for m in range(n_mb):
                idx = order[bounds[m]:bounds[m + 1]]
                if c.sort_by_length and micro < len(idx):
                    idx = idx[torch.argsort(lengths[idx], stable=True)]
                counts = dict(num_tokens=float(lm[idx].sum()), num_sequences=float((lm[idx].sum(-1) > 0).sum()),
                              num_correct_tokens=float(lm[idx][batch.correct[idx]].sum()))
                if counts["num_tokens"] == 0:  # every row of this minibatch was filtered out: nothing to learn
                    continue
                group_tokens = self._group_tokens(lm, idx, counts)
                # The rollout's first optimiser step sees the weights that sampled it: π_old = sg(π_θ)
                # there, recorded into old_logp for later epochs (see _reference_logps).
                first = epoch == 0 and m == 0 and c.old_logp == "recompute"
                # MoE: the on-policy forward routes as π_old (record it); later forwards score π_θ
                # (replay π_old's experts with routing_replay); the forward after the first update
                # measures how much routing moved (routing_change_frac).
                routing = None if store is None else "record" if first else "replay" if c.routing_replay else None
                self._zero_grad()
                parts = [self._micro_step(batch, idx[s:s + micro], old_logp, ref_logp, counts, group_tokens,
                                          entropies if epoch == 0 else None, on_policy=first, routing=routing,
                                          store=store, measure_routing=store is not None and n_updates == 1)
                         for s in range(0, len(idx), micro)]
                step_metrics.append(reduce_micro_batches(parts))
                if self.algo.ntp_coef > 0:  # the L_RL + ntp_coef L_NTP ablation (Algorithm.ntp_coef)
                    step_metrics[-1]["ntp_loss"] = total(self._ntp_backward(ro, idx))
                grad_norms.append(self._optimizer_step())
                n_updates += 1
        return step_metrics, grad_norms, entropies

    # ------------------------------------------------------------------ update internals
    def _routing_store(self, ro: Rollout, n_mb: int) -> RoutingStore | None:
        """An empty :class:`~grpo_lab.moe.RoutingStore` for ``ro`` when the policy is a MoE model
        whose π_old the trainer scores itself (``old_logp="recompute"``) and the rollout feeds more
        than one optimiser step; ``None`` otherwise (nothing to replay or compare)."""
        c = self.config
        if not self.moe_routers or c.old_logp != "recompute" or c.epochs * n_mb <= 1:
            return None
        ks = {r.top_k for _, r in self.moe_routers}
        if len(ks) != 1:  # routers with different k: no common store (routing_replay is refused in __init__)
            return None
        return RoutingStore(len(self.moe_routers), len(ro), ro.prompt_ids.shape[1], ro.completion_ids.shape[1],
                            ks.pop(), device=ro.completion_ids.device)

    def _reference_logps(self, ro: Rollout, n_mb: int, skip_rows: torch.Tensor | None = None,
                         routing: RoutingStore | None = None):
        """π_old and π_ref log-probs of the batch.

        π_old: the sampler's log-probs (``old_logp="behaviour"``); ``None`` when the rollout feeds
        a single optimiser step (on-policy: ``sg(π_θ)`` per micro-batch); otherwise recomputed by a
        no-grad forward before the first update, **except** on ``skip_rows``, the rows of the
        rollout's first minibatch. Those are trained before any weight changes, with the weights,
        dtype and eval mode of this forward, so their π_old is exactly ``sg(π_θ)`` of their own
        training forward; :meth:`update` uses that (ratio exactly 1) and writes it into these rows
        (0 until then) for the later epochs.
        This skips ``1 / (epochs × minibatches)`` of the rows' old-policy forward (half of them at
        two minibatches and one epoch, the book's setting). With a ``routing`` store (MoE policies)
        the π_old forward records the experts of every row it scores into it.
        """
        c = self.config
        with torch.no_grad():
            if c.old_logp == "behaviour":
                old_logp = ro.behaviour_logp
            elif c.epochs * n_mb > 1:
                rows = torch.arange(len(ro))
                if skip_rows is not None:
                    keep = torch.ones(len(ro), dtype=torch.bool)
                    keep[skip_rows] = False
                    rows = rows[keep]
                old_logp = self._logp_batched(self.policy, ro, rows, routing=routing)
            else:
                old_logp = None
            ref_logp = self._logp_batched(self.ref_policy, ro) if self.uses_kl else None
        return old_logp, ref_logp

    def _group_tokens(self, lm: torch.Tensor, idx: torch.Tensor, counts: dict) -> torch.Tensor:
        """Per row of the batch, the loss-mask token count of its group within the minibatch ``idx``
        (0 outside it); adds the minibatch's ``num_groups`` to ``counts``. Rows ``k*G .. k*G+G-1``
        are group ``k`` (collect keeps whole groups, in order). For ``"group_token_mean"``."""
        gid = idx // self.config.group_size
        uniq, inv = torch.unique(gid, return_inverse=True)
        per_group = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, lm[idx].sum(-1).to(torch.float64))
        counts["num_groups"] = float((per_group > 0).sum())
        out = torch.zeros(lm.shape[0], dtype=torch.float64)
        out[idx] = per_group[inv]
        return out

    def _micro_step(self, batch: Batch, sub, old_logp, ref_logp, counts: dict, group_tokens: torch.Tensor,
                    entropies: list | None, on_policy: bool = False, routing: str | None = None,
                    store: RoutingStore | None = None, measure_routing: bool = False) -> dict:
        """Forward and backward of one micro-batch; returns its loss metrics. ``on_policy`` (or
        ``old_logp=None``): π_old = sg(π_θ) of this forward, written into ``old_logp`` when given.

        MoE policies, with a routing ``store`` of the rollout: ``routing="record"`` writes this
        forward's experts into it (π_old's routing), ``"replay"`` forces the stored experts
        (:func:`grpo_lab.moe.replay_routing`); ``measure_routing`` adds ``routing_change_frac``
        (the routers' own choices in this forward against the stored ones, on completion tokens).
        """
        part = batch.rollout.select(sub)
        T = part.completion_ids.shape[1]
        mask = batch.loss_mask[sub, :T]
        P = part.prompt_ids.shape[1]
        ctx, rec = contextlib.nullcontext(), None
        if store is not None and routing == "replay":
            need = mask.sum(-1).cpu() > 0
            if not bool(store.recorded[torch.as_tensor(sub).cpu()][need].all()):
                raise RuntimeError("Trainer: routing replay found rows of the loss without a recorded π_old routing "
                                   "(an internal error: every trained row is scored by π_old first)")
            ctx = replay_routing(self.policy, store.get(sub, P, P + T))
        elif store is not None and (routing == "record" or measure_routing):
            ctx = record_routing(self.policy)
        with ctx as rec, self._autocast():
            logp, ent = policy_logprobs(self.policy, part, with_entropy=True)
        if routing == "record" and rec is not None:
            store.put(sub, rec.indices, P)
        if entropies is not None:
            entropies.append((float((ent * mask).sum()), float(mask.sum())))
        if on_policy or old_logp is None:
            old = logp.detach()
            if old_logp is not None:
                old_logp[sub, :T] = old
        else:
            old = old_logp[sub, :T]
        ref = ref_logp[sub, :T] if ref_logp is not None else None
        adv = batch.advantages[sub] if batch.advantages.dim() == 1 else batch.advantages[sub, :T]
        out = policy_loss(logp, old, adv, mask, self.algo, ref_logp=ref, max_tokens=self.max_new_tokens,
                          group_tokens=group_tokens[sub].to(logp.device), correct=batch.correct[sub].to(logp.device),
                          **counts)
        self._backward(out.loss)
        metrics = dict(out.metrics)
        if measure_routing and rec is not None:
            real = torch.cat([torch.zeros_like(part.prompt_mask, dtype=torch.bool), part.completion_mask != 0], 1)
            changed, compared = routing_changes(store.get(sub, P, P + T), rec.indices, real)
            metrics["routing_change_frac"] = token_mean(changed / compared if compared else float("nan"), compared)
        if self.value_model is not None:
            with self._autocast():
                values = _checked_values(self.value_model.values(part), part, grad=True)[:, :T].float()
            vloss = value_loss(values, batch.values[sub, :T], batch.returns[sub, :T], mask,
                               clip_eps=self.algo.value_clip_eps, num_tokens=counts["num_tokens"])
            self._backward(vloss)
            metrics["value_loss"] = total(float(vloss.detach()))
        return metrics

    def _ntp_backward(self, ro: Rollout, idx: torch.Tensor) -> float:
        """Backward of ``ntp_coef`` times the next-token-prediction loss of the questions of the
        minibatch ``idx``: the mean NLL at temperature 1 of each question's demonstration
        (``task.demonstration(problem, rng)`` and EOS) given its prompt, each question once.
        Returns the loss (unweighted)."""
        seen, problems = set(), []
        for i in idx.tolist():
            p = ro.problems[i]
            if id(p) not in seen:
                seen.add(id(p))
                problems.append(p)
        demo = _demonstration_rollout(self.tokenizer, self.task, problems, self.rng, self.config.device)
        with self._autocast():
            logp = policy_logprobs(self.policy, demo, temperature=1.0)
        loss = -(logp * demo.completion_mask).sum() / demo.completion_mask.sum()
        self._backward(self.algo.ntp_coef * loss)
        return float(loss.detach())

    def _autocast(self):
        """The autocast context of :attr:`precision` (a no-op for float32)."""
        if self.precision == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self._device_type, dtype=getattr(torch, self.precision))

    def _backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, through the gradient scaler under float16."""
        (self.scaler.scale(loss) if self.scaler.is_enabled() else loss).backward()

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.value_optimizer is not None:
            self.value_optimizer.zero_grad(set_to_none=True)

    def _optimizer_step(self) -> float:
        """Clip, warm up the learning rate, step every optimiser; returns the policy grad norm."""
        c = self.config
        if self.scaler.is_enabled():  # true gradients before clipping (GradScaler's recipe)
            self.scaler.unscale_(self.optimizer)
            if self.value_optimizer is not None:
                self.scaler.unscale_(self.value_optimizer)
        gn = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), c.grad_clip)
        if self.scaler.is_enabled():
            vgn = (torch.nn.utils.clip_grad_norm_(self.value_model.parameters(), c.grad_clip)
                   if self.value_optimizer is not None else torch.zeros(()))
            if not (torch.isfinite(gn) and torch.isfinite(vgn)):
                # float16 overflow in the scaled gradients of the policy or the critic: neither optimiser
                # steps (GradScaler would skip only the one that overflowed), and update() lowers the
                # scale from the overflow that unscale_ recorded
                self.scaler.update()
                self.amp_skipped_steps += 1
                return float("nan")
        if not torch.isfinite(gn):
            raise FloatingPointError(
                f"Trainer: non-finite policy gradient norm ({float(gn)}) at step {self.step + 1}; the update was "
                f"not applied. The loss of {self.algo.name!r} (surrogate {self.algo.clip!r}, aggregation "
                f"{self.algo.aggregation!r}) produced NaN/inf: check a custom registry function")
        scale = min(1.0, (self.opt_steps + 1) / c.warmup) if c.warmup else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = c.lr * scale if c.warmup else c.lr
        if self.scaler.is_enabled():  # finite gradients, unscaled and clipped above
            self.scaler.step(self.optimizer)
            if self.value_optimizer is not None:
                self.scaler.step(self.value_optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
            if self.value_optimizer is not None:
                torch.nn.utils.clip_grad_norm_(self.value_model.parameters(), c.grad_clip)
                self.value_optimizer.step()
        self.opt_steps += 1
        return float(gn)

    def _train_step(self) -> dict:
        reset_peak_memory(self.config.device)
        t0 = time.perf_counter()
        batch = self.collect()
        updates, grad_norms, entropies = [], [], []
        if batch.rollout is not None:
            self.compute_advantages(batch)
            updates, grad_norms, entropies = self.update(batch)
        return self._row(batch, updates, grad_norms, entropies, time.perf_counter() - t0)

    def _row(self, batch: Batch, updates: list[dict], grad_norms: list, entropies: list, seconds: float) -> dict:
        """The history row of one step (see :meth:`train` for the columns)."""
        G, gen = self.config.group_size, batch.generated
        raw, shaped = torch.cat([s.raw for s in gen]), torch.cat([s.rewards for s in gen])
        correct = torch.cat([s.correct for s in gen])
        lengths = torch.cat([s.rollout.lengths.float().cpu() for s in gen])
        n_tok = sum(n for _, n in entropies)
        applied = [g for g in grad_norms if math.isfinite(g)]  # float16: skipped (overflowed) steps have none
        row = {
            "reward": float(shaped.mean()),
            "accuracy": float(correct.float().mean()),
            "length": float(lengths.mean()),
            "length_correct": float(lengths[correct].mean()) if correct.any() else float("nan"),
            "length_incorrect": float(lengths[~correct].mean()) if (~correct).any() else float("nan"),
            "entropy": sum(e for e, _ in entropies) / max(n_tok, 1.0) if entropies else float("nan"),
            "grad_norm": float(np.mean(applied)) if applied else float("nan"),
            "zero_adv_group_frac": float(tied_groups(shaped, G).float().mean()),
            "truncation_rate": float(torch.cat([s.rollout.truncated.cpu() for s in gen]).float().mean()),
            "tokens_per_s": sum(float(s.rollout.completion_mask.sum()) for s in gen) / seconds,
            "gen_seconds": sum(s.rollout.gen_seconds for s in gen),
            "step_seconds": seconds,
        }
        if hasattr(self.task, "is_reasoning"):
            row["reasoning_frac"] = float(np.mean([self.task.is_reasoning(t) for s in gen for t in s.rollout.texts]))
        row.update(_value_metrics(batch, self.algo.gamma))
        row["peak_mem_mb"] = peak_memory_mb(self.config.device)
        if self.scaler.is_enabled():
            row["amp_skipped_steps"] = self.amp_skipped_steps
            row["amp_scale"] = float(self.scaler.get_scale())
        row.update(reduce_updates(updates))
        row.setdefault("routing_change_frac", float("nan"))  # dense policy, or no second update on the rollout
        if not updates:  # no update this step: the loss metrics exist and are NaN (even if no step ever updated)
            row.update({k: float("nan") for k in METRIC_KEYS if k not in row})
        n_trained = len(batch.rollout) if batch.rollout is not None else 0
        row.update(sampling.sampling_metrics(raw, shaped, len(lengths), n_trained, len(gen), G,
                                             n_selected=batch.selected_groups * G))
        return row

    # ------------------------------------------------------------------ value pretraining
    def pretrain_value(self, steps: int) -> pd.DataFrame:
        """VAPO (arXiv 2504.05118) §4.1 *Value-Pretraining*: fit the critic to Monte-Carlo returns
        of the current policy, which is not updated.

        Each step collects a batch as :meth:`collect` does (the same sampling, selection and reward
        shaping, so it uses the training RNGs), computes the targets with GAE at ``lam = 1`` (the
        Monte-Carlo returns ``sum_l gamma^l r_{t+l}``, whatever the critic predicts) and takes
        ``minibatches`` optimiser steps of the plain squared-error :func:`grpo_lab.objectives.value_loss`
        (no clipping) with the critic's own optimiser. The paper pretrains "until the value loss
        and explained variance are good" and saves the critic for reuse; save it with
        ``trainer.value_model.save(path)`` and pass the path as ``TrainerConfig.value_init``.

        Returns:
            The warm-up history so far (also ``trainer.value_warmup_rows``), one row per step:
            ``value_step``, ``value_loss`` (the mean over the step's minibatches), and, measured on
            each step's fresh batch *before* the critic is fitted to it (so on samples it has not
            seen), ``explained_variance`` (:func:`grpo_lab.advantages.explained_variance`),
            ``value_mean`` and ``return_mean`` (over real tokens), plus ``seconds``.

        Raises:
            ValueError: the trainer has no value model, or ``steps`` is negative.
        """
        from .advantages import gae, outcome_token_rewards

        if self.value_model is None:
            raise ValueError("Trainer.pretrain_value: the trainer has no value model (use an algorithm whose advantage "
                             "estimator needs values, e.g. 'gae', or pass value_model=)")
        c = self.config
        for _ in range(non_negative_int("pretrain_value: steps", steps)):
            t0 = time.perf_counter()
            batch = self.collect()
            if batch.rollout is None:
                continue
            m = batch.loss_mask
            returns = gae(outcome_token_rewards(batch.rewards, m), batch.values, m, gamma=self.algo.gamma,
                          lam=1.0)[1].to(c.device)
            row = {"value_step": len(self.value_warmup_rows) + 1,
                   "explained_variance": explained_variance(batch.values, returns, m),
                   "value_mean": _masked_mean(batch.values, m), "return_mean": _masked_mean(returns, m)}
            B = len(batch.rollout)
            n_mb = min(c.minibatches, B)
            bounds = [(k * B) // n_mb for k in range(n_mb + 1)]
            gen = torch.Generator().manual_seed(int(self.rng.integers(2**62)))
            order = torch.randperm(B, generator=gen)
            micro = c.micro_batch_size or B
            losses = []
            for k in range(n_mb):
                idx = order[bounds[k]:bounds[k + 1]]
                n_tok = float(m[idx].sum())
                if n_tok == 0:
                    continue
                self.value_optimizer.zero_grad(set_to_none=True)
                step_loss = 0.0
                for s0 in range(0, len(idx), micro):
                    sub = idx[s0:s0 + micro]
                    part = batch.rollout.select(sub)
                    T = part.completion_ids.shape[1]
                    with self._autocast():
                        v = self.value_model.values(part)[:, :T].float()
                    loss = value_loss(v, batch.values[sub, :T], returns[sub, :T], m[sub, :T], clip_eps=None,
                                      num_tokens=n_tok)
                    self._backward(loss)
                    step_loss += float(loss.detach())
                if self.scaler.is_enabled():
                    self.scaler.unscale_(self.value_optimizer)
                vgn = torch.nn.utils.clip_grad_norm_(self.value_model.parameters(), c.grad_clip)
                if self.scaler.is_enabled():
                    if torch.isfinite(vgn):
                        self.scaler.step(self.value_optimizer)
                    else:  # float16 overflow: no step, a lower scale
                        self.amp_skipped_steps += 1
                    self.scaler.update()
                else:
                    self.value_optimizer.step()
                losses.append(step_loss)
            row["value_loss"] = float(np.mean(losses)) if losses else float("nan")
            row["seconds"] = time.perf_counter() - t0
            self.value_warmup_rows.append(row)
        return pd.DataFrame(self.value_warmup_rows)

    def _short_of_groups(self, n_kept: int) -> None:
        c = self.config
        msg = (f"dynamic sampling: only {n_kept} of prompts_per_step={c.prompts_per_step} groups had mixed "
               f"accuracy (0 < acc < 1) after max_gen_rounds={c.max_gen_rounds} rounds at step {self.step + 1}")
        if c.on_gen_rounds_exhausted == "error":
            raise RuntimeError(msg + "; raise TrainerConfig.max_gen_rounds or set on_gen_rounds_exhausted='warn'")
        warnings.warn(msg + ("; training on those groups" if n_kept else "; skipping this step's update")
                      + " (TrainerConfig.max_gen_rounds bounds the extra generation)", RuntimeWarning, stacklevel=4)

    def _eval_row(self) -> dict:
        t0 = time.perf_counter()
        row = {"step": self.step}
        s, frame = self._evaluate_frame(greedy=True)
        row["test_accuracy"] = s["accuracy"]
        row["test_length"] = s["mean_length"]
        if "reasoning_frac" in s:
            row["test_reasoning_frac"] = s["reasoning_frac"]
        extra = getattr(self.task, "test_metrics", None)
        if callable(extra):  # optional task member: more columns from the per-problem frame
            row.update({f"test_{k}": float(v) for k, v in extra(frame).items()})
        if self.config.eval_sampled:
            s2, frame2 = self._evaluate_frame(greedy=False)
            row["test_accuracy_sampled"] = s2["accuracy"]
            if callable(extra):
                row.update({f"test_sampled_{k}": float(v) for k, v in extra(frame2).items()})
        row["eval_seconds"] = time.perf_counter() - t0
        return row

    @torch.no_grad()
    def _logp_batched(self, model, ro: Rollout, rows: torch.Tensor | None = None,
                      routing: RoutingStore | None = None) -> torch.Tensor:
        """float32 ``[B, T]`` log-probs of ``model`` on ``rows`` (default all) of ``ro``, in
        micro-batches of ``micro_batch_size``; 0 on the other rows. With a ``routing`` store (a
        MoE ``model``), the experts of every row scored are recorded into it."""
        c = self.config
        B, T = len(ro), ro.completion_ids.shape[1]
        rows = torch.arange(B) if rows is None else rows
        micro = c.micro_batch_size or B
        if c.sort_by_length and micro < len(rows):
            rows = rows[torch.argsort(ro.token_counts()[rows], stable=True)]
        out = torch.zeros(B, T, device=ro.completion_ids.device)
        for s in range(0, len(rows), micro):
            idx = rows[s:s + micro]
            part = ro.select(idx)
            with (record_routing(model) if routing is not None else contextlib.nullcontext()) as rec, self._autocast():
                lp = policy_logprobs(model, part)
            if rec is not None:
                routing.put(idx, rec.indices, part.prompt_ids.shape[1])
            out[idx, : lp.shape[1]] = lp
        return out

    # ------------------------------------------------------------------ checkpointing
    def save(self, path: str | Path) -> Path:
        """Write a checkpoint directory atomically: ``policy/`` (safetensors + tokenizer), ``ref/``
        (safetensors, when a KL reference exists), ``value.safetensors`` and
        ``value_optimizer.pt`` (with a value model), ``optimizer.pt``, ``rng.pt``, ``state.json``
        (step, config, algorithm, task, numpy and python RNG states) and ``history.json``.

        Everything that can be checked is checked before anything is written: the task (still a
        task, :func:`grpo_lab.tasks.validate_task`), ``state.json`` and ``history.json`` are
        serialised in memory, and the destination must be absent, empty or a trainer checkpoint.
        The files then go to a sibling ``.NAME.saving`` directory, which replaces ``path`` only
        once it is complete (the previous checkpoint is moved aside to ``.NAME.old`` and deleted
        after the new one is in place; if that move fails, the previous one is put back). A
        failure at any point (an exception, a full disk, Ctrl-C) deletes the temporary directory
        and leaves ``path`` as it was: absent, or the previous checkpoint. Only a process killed
        between the two renames leaves the previous checkpoint at ``.NAME.old``.

        Any task can be saved. A registered dataclass task (:func:`grpo_lab.tasks.task_spec`) is
        stored so that :meth:`resume` rebuilds it; any other task is stored by name, class and (a
        dataclass with JSON-able fields) its fields, and :meth:`resume` takes it as ``task=``
        unless its class has been registered under its name by then.

        transformers' progress bar (``Writing model shards``) shows only when the trainer's
        progress bars do (``TrainerConfig.progress``; ``None``: stderr is a terminal, ``$CI`` unset).

        Returns:
            ``path`` (a :class:`pathlib.Path`).

        Raises:
            TypeError: the trainer's task no longer implements the task protocol.
            ValueError: the history holds a value that cannot be written as JSON.
            FileExistsError: ``path`` is a file, or a non-empty directory that is not a trainer
                checkpoint (no ``state.json``): it is never replaced.
            OSError: writing failed (nothing is left behind, see above).
        """
        from safetensors.torch import save_file

        validate_task(self.task)
        final = Path(path)
        where = Path(os.path.abspath(final))
        if where.exists() and not where.is_dir():
            raise FileExistsError(f"Trainer.save: {final} is a file; a checkpoint is a directory")
        if where.is_dir() and not (where / "state.json").is_file() and any(where.iterdir()):
            raise FileExistsError(f"Trainer.save: {final} is a non-empty directory that is not a trainer checkpoint "
                                  "(no state.json); refusing to replace it: choose a new path or an empty directory")
        state = {
            "step": self.step,
            "opt_steps": self.opt_steps,
            "config": self.config.to_dict(),
            "algo": asdict(self.algo),
            "task": _task_state(self.task),
            "numpy_rng": self.rng.bit_generator.state,
            "python_rng": _py_state_to_json(random.getstate()),
            "value_warmup_rows": self.value_warmup_rows,
            "grad_scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
            "amp_skipped_steps": self.amp_skipped_steps,
        }
        state_text = json.dumps(state, indent=2, default=_json_default)
        try:
            history_text = json.dumps(self.rows, default=_json_default)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"Trainer.save: the history cannot be written as JSON ({exc}); "
                             "nothing was written") from None
        tmp = where.with_name(f".{where.name}.saving")
        shutil.rmtree(tmp, ignore_errors=True)  # left by a process killed while saving
        try:
            tmp.mkdir(parents=True)
            with _progress_bars(self._show_progress()):  # transformers' "Writing model shards" bar
                self.policy.save_pretrained(tmp / "policy", safe_serialization=True)
                self.tokenizer.save_pretrained(tmp / "policy")
                if self.ref_policy is not None:
                    self.ref_policy.save_pretrained(tmp / "ref", safe_serialization=True)
            if self.value_model is not None:
                save_file({k: v.contiguous() for k, v in self.value_model.state_dict().items()},
                          tmp / "value.safetensors")
                if isinstance(self.value_model, CriticModel):  # rebuildable without the caller's help
                    self.value_model.save(tmp / "critic")
                torch.save(self.value_optimizer.state_dict(), tmp / "value_optimizer.pt")
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save({"torch": torch.random.get_rng_state(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}, tmp / "rng.pt")
            (tmp / "state.json").write_text(state_text)
            (tmp / "history.json").write_text(history_text)
            _replace_dir(tmp, where)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    @classmethod
    def resume(cls, path: str | Path, *, task=None, device: str | None = None, value_model=None) -> "Trainer":
        """Rebuild a trainer from :meth:`save` so that ``train`` continues exactly.

        Args:
            path: the checkpoint directory.
            task: the task to continue with. Needed when the checkpoint's task cannot be rebuilt
                from the registry (its class was not registered under its name in this process,
                :func:`grpo_lab.tasks.register_task`, or it is not a dataclass with JSON-able
                fields); otherwise it overrides the rebuilt task. Pass the same task as saved: a
                ``RuntimeWarning`` names what differs from the saved one (name, class, fields),
                since the run then does not continue as it would have.
            device: override the saved ``TrainerConfig.device``.
            value_model: a freshly built value model of the saved architecture, required when the
                checkpoint has one of your own (its weights and optimiser state are loaded into
                it); a :class:`grpo_lab.models.CriticModel` is rebuilt from the checkpoint.

        Every file the checkpoint needs is looked for before anything is loaded; transformers'
        loading bars follow the saved ``TrainerConfig.progress`` (as :func:`grpo_lab.models.load_policy`'s
        ``progress``).

        Raises:
            FileNotFoundError: ``path`` is not a checkpoint directory.
            TypeError: ``task`` does not implement the task protocol.
            ValueError: a file of the checkpoint is missing or corrupt (the message names it:
                ``optimizer.pt``, ``rng.pt``, ``policy/model.safetensors``, ``policy/tokenizer.json``, ...), the
                algorithm has a KL term but ``ref/`` is missing, the checkpoint has a value model
                and none was passed, or its task cannot be rebuilt and no ``task=`` was passed (the
                message says why and shows both remedies).
        """
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM

        from .models import load_policy

        path = Path(path)
        if not (path / "state.json").is_file():
            raise FileNotFoundError(f"Trainer.resume: {path} has no state.json (not a trainer checkpoint)")
        state = _read_json(path / "state.json", ("step", "config", "algo", "task", "numpy_rng", "python_rng"))
        rows = _read_json(path / "history.json", None)
        has_value = (path / "value.safetensors").is_file()
        if has_value and value_model is None and (path / "critic" / "critic.json").is_file():
            value_model = _load_checkpoint_part(path / "critic", lambda: CriticModel.load(path / "critic"))
        if has_value and value_model is None:
            raise ValueError(f"Trainer.resume: {path} holds a value model of your own; pass value_model= (a fresh one "
                             "of the same architecture)")
        if not isinstance(rows, list) or not is_int(state["step"]) or state["step"] < 0:
            raise ValueError(f"Trainer.resume: {path} has a corrupt step count or history (state.json, history.json)")
        task = _resume_task(state["task"], task, path)
        config = TrainerConfig.from_dict(state["config"])
        if device is not None:
            config = replace(config, device=device)
        algo = Algorithm(**state["algo"])
        if algo.uses_kl and not (path / "ref").is_dir():
            raise ValueError(f"Trainer.resume: {path} has no ref/ but {algo.name!r} has a KL term; the reference "
                             "policy cannot be rebuilt from the trained weights")
        missing = _missing_checkpoint_files(path, ref=algo.uses_kl, value=has_value)
        if missing:
            raise ValueError(f"Trainer.resume: corrupt checkpoint, {path} lacks " + ", ".join(missing)
                             + " (Trainer.save writes them all)")
        if has_value:
            value_model.load_state_dict(_load_checkpoint_part(path / "value.safetensors",
                                                              lambda: load_file(path / "value.safetensors")))
        policy, tokenizer = _load_checkpoint_part(
            path / "policy", lambda: load_policy(path / "policy", device=config.device, progress=config.progress))
        ref = None
        if algo.uses_kl:
            def load_ref():
                with _progress_bars(config.progress):
                    return AutoModelForCausalLM.from_pretrained(path / "ref", use_safetensors=True)

            ref = _load_checkpoint_part(path / "ref", load_ref).to(config.device)
        trainer = cls(policy, tokenizer, task, algo, config, ref_policy=ref, value_model=value_model)
        trainer.optimizer.load_state_dict(_load_pt(path / "optimizer.pt"))
        if has_value:
            trainer.value_optimizer.load_state_dict(_load_pt(path / "value_optimizer.pt"))
        rng = _load_pt(path / "rng.pt")
        torch.random.set_rng_state(rng["torch"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        trainer.rng.bit_generator.state = state["numpy_rng"]
        random.setstate(_py_state_from_json(state["python_rng"]))
        trainer.step = int(state["step"])
        trainer.opt_steps = int(state.get("opt_steps", 0))
        trainer.rows = rows
        trainer.value_warmup_rows = list(state.get("value_warmup_rows", []))
        if state.get("grad_scaler") and trainer.scaler.is_enabled():
            trainer.scaler.load_state_dict(state["grad_scaler"])
        trainer.amp_skipped_steps = int(state.get("amp_skipped_steps", 0))
        return trainer


def _task_state(task) -> dict:
    """The ``task`` entry of ``state.json``: :func:`grpo_lab.tasks.task_spec` plus ``"registered":
    True`` for a registered dataclass task; otherwise ``{"name", "class", "params",
    "registered": False}`` with ``params`` the dataclass fields, or ``None`` (not a dataclass).
    ``params`` that JSON cannot hold are stored as ``None`` (``resume`` then needs ``task=``).
    Never raises for a task that passes :func:`grpo_lab.tasks.validate_task`."""
    from .tasks import _class_path, task_spec

    try:
        spec = dict(task_spec(task), registered=True)
    except ValueError:
        try:
            params = asdict(task) if is_dataclass(task) else None
        except Exception:  # a field that cannot be copied (a lock, a file handle): described by name only
            params = None
        spec = {"name": task.name, "class": _class_path(type(task)), "params": params, "registered": False}
    if spec["params"] is not None:
        try:
            spec["params"] = json.loads(json.dumps(spec["params"], default=_json_default))
        except (TypeError, ValueError):
            spec["params"] = None
    return spec


def _resume_task(spec, task, path: Path):
    """The task a resumed trainer continues with: ``task`` when given (a ``RuntimeWarning`` names
    what differs from the saved ``spec``), else the saved task rebuilt from the registry.

    Raises:
        ValueError: ``spec`` is corrupt, or the saved task cannot be rebuilt and ``task`` is ``None``
            (the message says why and names ``task=`` and ``register_task``).
    """
    from .tasks import TASKS, _class_path, task_from_spec

    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"Trainer.resume: {path / 'state.json'} has no valid task entry ({spec!r:.80}); "
                         "the checkpoint is corrupt")
    name, stored, params = spec["name"], spec.get("class"), spec.get("params")
    if task is not None:
        validate_task(task)
        diffs = []
        if task.name != name:
            diffs.append(f"name {task.name!r} (saved {name!r})")
        if stored is not None and _class_path(type(task)) != stored:
            diffs.append(f"class {_class_path(type(task))} (saved {stored})")
        elif isinstance(params, dict) and is_dataclass(task):
            now = _task_state(task)["params"] or {}
            changed = sorted(k for k in set(now) | set(params) if now.get(k) != params.get(k))
            if changed:
                diffs.append("fields " + ", ".join(f"{k}={now.get(k)!r} (saved {params.get(k)!r})" for k in changed))
        if diffs:
            warnings.warn(f"Trainer.resume: the task passed as task= differs from the one saved in {path}: "
                          + "; ".join(diffs) + "; the run continues with the task passed, not as it would have",
                          RuntimeWarning, stacklevel=3)
        return task
    registered = TASKS.get(name)
    if registered is None:
        reason = f"no task named {name!r} is registered in this process (registered: {sorted(TASKS)})"
    elif stored is not None and _class_path(registered) != stored:
        reason = f"{name!r} is registered to {_class_path(registered)}, not to {stored}"
    elif not isinstance(params, dict):
        reason = "its fields were not stored (it is not a dataclass with fields JSON can hold)"
    else:
        try:
            return task_from_spec(spec)
        except Exception as exc:  # the class's own constructor rejected the stored fields
            reason = f"rebuilding it from the stored fields failed ({type(exc).__name__}: {exc})"
    short = stored.rsplit(".", 1)[-1] if stored else "YourTask"
    raise ValueError(f"Trainer.resume: {path} was saved with the task {name!r}" + (f" ({stored})" if stored else "")
                     + f", which cannot be rebuilt here: {reason}. Pass the task object: "
                     f"Trainer.resume(path, task={short}(...)), or register its class first: "
                     f"grpo_lab.tasks.register_task({name!r}, {short})")


def _replace_dir(new: Path, final: Path) -> None:
    """Move the finished directory ``new`` to ``final``. An older ``final`` is first renamed to
    ``.NAME.old`` and deleted once ``new`` is in place; if moving ``new`` fails, it is renamed back."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if not final.exists():
        new.rename(final)
        return
    final.rename(old)
    try:
        new.rename(final)
    except BaseException:
        old.rename(final)
        raise
    shutil.rmtree(old, ignore_errors=True)


#: Weight files of a ``save_pretrained`` directory (one file, or the index of a sharded one).
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def _missing_checkpoint_files(path: Path, *, ref: bool, value: bool) -> list[str]:
    """The files of a :meth:`Trainer.save` checkpoint that ``path`` lacks (relative names, ``[]``
    when none): ``optimizer.pt``, ``rng.pt``, ``value_optimizer.pt`` (``value``), and for ``policy/``
    (and ``ref/`` when ``ref``) ``config.json`` and the safetensors weights; for ``policy/`` also the
    tokenizer (``grpo_lab.models._missing_tokenizer_files``). Reads nothing but the directory."""
    from .models import _missing_tokenizer_files

    names = ["optimizer.pt", "rng.pt"] + (["value_optimizer.pt"] if value else [])
    missing = [n for n in names if not (path / n).is_file()]
    for sub in ["policy"] + (["ref"] if ref else []):
        if not (path / sub / "config.json").is_file():
            missing.append(f"{sub}/config.json")
        if not any((path / sub / n).is_file() for n in _WEIGHT_FILES):
            missing.append(f"{sub}/model.safetensors")
    if (path / "policy").is_dir():
        missing += [f"policy/{n}" for n in _missing_tokenizer_files(path / "policy")]
    return missing


def _load_checkpoint_part(what: Path, load):
    """``load()``; a ``ValueError`` naming ``what`` when it fails because a file is missing or
    damaged (``OSError``, a safetensors or JSON decoding error). Other errors pass unchanged (a
    CUDA device without CUDA is the caller's mistake, not a corrupt checkpoint)."""
    from safetensors import SafetensorError

    try:
        return load()
    except (OSError, SafetensorError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        detail = " ".join(str(exc).split())[:300]
        raise ValueError(f"Trainer.resume: {what} cannot be loaded ({type(exc).__name__}: {detail}); "
                         "the checkpoint is corrupt") from None


def _load_pt(path: Path):
    """``torch.load(path, weights_only=True)``; ``ValueError`` naming the file when it is missing or corrupt."""
    try:
        return torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"Trainer.resume: corrupt checkpoint, {path} is missing") from None
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, ... for a damaged file
        raise ValueError(f"Trainer.resume: {path} cannot be read as a checkpoint tensor file "
                         f"({type(exc).__name__}); the checkpoint is corrupt") from None


def _read_json(path: Path, keys: tuple | None):
    """Parse a checkpoint's JSON file; ``ValueError`` naming the file when it is corrupt or lacks ``keys``."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"Trainer.resume: corrupt checkpoint, {path} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"Trainer.resume: {path} is not valid JSON ({exc}); the checkpoint is corrupt") from None
    if keys is not None:
        missing = [k for k in keys if not isinstance(data, dict) or k not in data]
        if missing:
            raise ValueError(f"Trainer.resume: {path} lacks {missing}; the checkpoint is corrupt")
    return data


def _check_sampled(task, problems, n: int) -> None:
    """``TypeError`` unless ``problems``, what ``task.sample(n, rng)`` returned, is a list (or tuple)
    of exactly ``n`` :class:`~grpo_lab.tasks.Problem` with non-empty ``str`` prompts. Cheap: one
    ``isinstance`` per problem, no call into the task."""
    if not isinstance(problems, (list, tuple)):
        wrong = f"a {type(problems).__name__} ({problems!r:.80})"
    elif len(problems) != n:
        wrong = f"{len(problems)} problems"
    else:
        wrong = next((f"a list whose item {i} is {type(p).__name__} {p!r:.80}" if not isinstance(p, Problem)
                      else f"a list whose item {i} has the prompt {p.prompt!r:.80}"
                      for i, p in enumerate(problems)
                      if not isinstance(p, Problem) or not isinstance(p.prompt, str) or not p.prompt), None)
        if wrong is None:
            return
    raise TypeError(f"task {getattr(task, 'name', '?')!r} ({type(task).__name__}): sample({n}, rng) returned {wrong}; "
                    f"the task protocol (grpo_lab.tasks.Task) needs a list of exactly {n} grpo_lab.tasks.Problem "
                    "with a non-empty str prompt each, e.g. [Problem(prompt='2+3=', answer='5'), ...]")


def _check_reward(value, index: int, text: str, problem) -> float:
    """A task's reward as a python float; a clear error naming the sample when it is not a real number."""
    if not isinstance(value, numbers.Real):
        if not (torch.is_tensor(value) and value.numel() == 1 and not value.dtype.is_complex):
            raise TypeError(f"task.reward returned {value!r} ({type(value).__name__}) for sample {index} "
                            f"(prompt {problem.prompt!r}, completion {text!r}); a reward must be a real number")
    r = float(value)
    if not math.isfinite(r):
        raise ValueError(f"task.reward returned {r} for sample {index} (prompt {problem.prompt!r}, "
                         f"completion {text!r}); a reward must be finite")
    return r


def _concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """One :class:`Rollout` from several (the kept groups of several dynamic-sampling rounds).

    Rollouts of different prompt / completion widths are padded to the widest: prompts on the
    **left** (pad id, mask 0), completions, masks and behaviour log-probs on the **right** (pad
    id, 0, 0), keeping the layout of :func:`grpo_lab.rollout.generate`; position ids derive from
    the masks, so the extra padding changes no real token's position. Rows stay in order, so
    groups stay contiguous. Per-row ``extras`` tensors are concatenated when every part has them.

    Raises:
        ValueError: no parts, or parts with different ``group_size`` / ``temperature``.
    """
    if not parts:
        raise ValueError("_concat_rollouts: no rollouts given")
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if any(r.group_size != first.group_size or r.temperature != first.temperature for r in parts):
        raise ValueError("_concat_rollouts: rollouts differ in group_size or temperature")
    P = max(r.prompt_ids.shape[1] for r in parts)
    T = max(r.completion_ids.shape[1] for r in parts)

    def left(x, width, value):
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x, width, value):
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    extras = {}
    for k, v in first.extras.items():
        vs = [r.extras.get(k) for r in parts]
        if all(torch.is_tensor(x) and x.shape[:1] == r.truncated.shape for x, r in zip(vs, parts)):
            try:
                extras[k] = torch.cat(vs)
            except RuntimeError:
                pass
    return Rollout(
        prompt_ids=torch.cat([left(r.prompt_ids, P, pad_id) for r in parts]),
        prompt_mask=torch.cat([left(r.prompt_mask, P, 0) for r in parts]),
        completion_ids=torch.cat([right(r.completion_ids, T, pad_id) for r in parts]),
        completion_mask=torch.cat([right(r.completion_mask, T, 0.0) for r in parts]),
        behaviour_logp=torch.cat([right(r.behaviour_logp, T, 0.0) for r in parts]),
        truncated=torch.cat([r.truncated for r in parts]),
        texts=[t for r in parts for t in r.texts], problems=[p for r in parts for p in r.problems],
        group_size=first.group_size, temperature=first.temperature,
        gen_seconds=sum(r.gen_seconds for r in parts), extras=extras,
    )


def _under_ci() -> bool:
    import os

    return bool(os.environ.get("CI"))


def _json_default(o: Any):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def _py_state_to_json(state):
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _py_state_from_json(state):
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
