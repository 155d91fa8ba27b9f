"""How a run samples and updates: :class:`~grpo_lab.training.trainer.TrainerConfig` (everything that is not the
algorithm or the task)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields

import torch

from ..algo.checks import choice, flag, non_negative_int, positive_int, positive_number, real_number
from .lr_schedule import LR_SCHEDULES
from .precision import PRECISIONS

__all__ = ["TrainerConfig", "OUTPUT_FIELDS"]

#: The :class:`~grpo_lab.training.trainer.TrainerConfig` fields that decide what a run shows and writes (its progress
#: bar, its output directory, its trackers, its periodic checkpoints), never its numbers: two runs that differ
#: only in these are the same run. They are left out of :meth:`~grpo_lab.training.trainer.TrainerConfig.run_identity`,
#: hence out of the run cache's key, the results file's ``config_hash`` and the check a resumed run makes.
OUTPUT_FIELDS = ("progress", "output_dir", "report_to", "save_every", "save_total_limit")


@dataclass(frozen=True)
class TrainerConfig:
    """How a run samples and updates (everything that is not the algorithm or the task).

    Attributes:
        prompts_per_step: questions per rollout.
        group_size: G, responses per question (rollout has ``prompts_per_step * G`` rows).
        max_new_tokens: generation budget (default: the task's).
        temperature: sampling temperature (log-probs are computed at the same temperature).
        lr, weight_decay, betas, grad_clip: AdamW and global-norm clipping (``grad_clip > 0``: the
            largest global gradient norm; 0 would zero every update). ``weight_decay`` is decoupled and
            applies to the weight matrices only, not to biases and norm weights (transformers' rule,
            :mod:`grpo_lab.training.adamw`).
        warmup: optimiser steps of linear learning-rate warm-up of the policy (Adam's first steps
            move every parameter by about ``lr`` whatever its gradient, which can collapse a token's
            probability in a tiny model; a short warm-up avoids it). Update ``k`` gets ``lr * k / warmup``
            while ``k < warmup`` (transformers' convention: the first update at 0). A value model trains at a
            constant ``value_lr``.
        lr_schedule: the policy's learning rate after the warm-up, through transformers' schedulers
            (:mod:`grpo_lab.training.lr_schedule`): ``"constant"`` (``lr``), ``"linear"`` (decays linearly
            towards 0) or ``"cosine"`` (half a cosine towards 0), over ``lr_schedule_steps``. Update ``k``
            (0-based) gets transformers' multiplier at ``k``, as in TRL and verl: with a warm-up the first
            update runs at learning rate 0 (:func:`grpo_lab.training.lr_schedule.policy_lr`).
        lr_schedule_steps: the RL steps the decay spans (``None`` or a positive int); the horizon in
            optimiser updates is ``lr_schedule_steps × epochs × minibatches``. Needed by ``"linear"`` and
            ``"cosine"`` (``Trainer`` raises without it); :func:`grpo_lab.experiments.run` sets it to the
            run's steps when it is ``None``. Ignored by ``"constant"``.
        epochs: μ passes over each rollout.
        minibatches: optimiser steps per pass (each on ``B / minibatches`` rows).
        micro_batch_size: rows per forward/backward inside a minibatch (gradient accumulation
            with global token counts); the no-grad π_old / π_ref forwards run on exactly the same
            micro-batches (rows, order, padding), so that a row's π_old and its π_θ in training
            come from forwards of the same shape; ``None`` = the whole minibatch.
        sort_by_length: cut micro-batches from the rows of a minibatch in order of length when
            there are several, so that each is trimmed to its own
            longest row: the same gradient (a sum over micro-batches with global normalisers, up to
            float rounding), less padding. With 16 × 8 rows of the arithmetic task, 46% of a
            minibatch's prompt + completion positions are real tokens; two length-sorted
            micro-batches of 32 instead of one of 64 took one forward + backward from 141 to 92 ms
            (one thread), about 5% of a whole CPU-profile run, and no measurable gain at two threads.
        old_logp: ``"recompute"`` (π_old = the policy before this rollout's first update,
            recomputed by a forward pass) or ``"behaviour"`` (the sampler's log-probs).
        rollout_dtype: ``"float32"`` (sample with the policy itself) or ``"bfloat16"`` /
            ``"float16"``: sample from a copy of the policy's current weights in that dtype
            (:func:`grpo_lab.policy.models.inference_copy`), as an inference engine does; the behaviour
            log-probs then come from that copy, and ``old_logp="behaviour"`` trains against them
            (with the default ``old_logp="recompute"`` they are recorded in the rollout but the
            loss does not use them: only the samples come from the low-precision copy).
        rollout_fp32_lm_head: with a low-precision ``rollout_dtype``, compute that copy's output
            head in float32 (MiniMax-M1, arXiv 2506.13585, §3.2: the fix for the mismatch).
        eval_every: greedy test accuracy every this many steps (and before the first and after
            the last step); 0 disables.
        eval_sampled: also measure sampled accuracy (temperature ``temperature``, 1 sample).
        eval_batch_size: test problems per ``generate`` call of an evaluation
            (:func:`grpo_lab.policy.rollout.evaluate`'s ``batch_size``; positive int). An evaluation's
            memory grows with it (the KV cache, and a few ``[rows, vocabulary]`` float32 tensors
            per decoding step). Changing it regroups the problems, so the left padding and the
            kernels' rounding change and a greedy completion can change at a near-tie.
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
            values (:data:`grpo_lab.algo.advantages.VALUE_BASELINE_ESTIMATORS`, e.g. ``"gae"``) and no
            ``value_model`` is passed: ``"policy"`` (a copy of the policy's backbone with a zero
            scalar head), ``"scratch"`` (a small randomly initialised transformer) or the
            directory of a saved critic (:meth:`grpo_lab.policy.models.CriticModel.save`, e.g. one
            pretrained with :meth:`Trainer.pretrain_value`); see :meth:`grpo_lab.policy.models.CriticModel.build`.
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
            (:func:`grpo_lab.policy.moe.replay_routing`), so the router still learns. Needs a MoE policy
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
        gradient_checkpointing: recompute each decoder layer's activations in the backward pass
            instead of keeping them (``transformers``' ``gradient_checkpointing_enable`` with
            ``use_reentrant=False``): the training forward keeps about one hidden state per layer
            instead of every intermediate, for about one more forward's compute. The gradient is
            the same (tested). Needs a policy that supports it (``supports_gradient_checkpointing``;
            ``Trainer`` raises ``ValueError`` otherwise) and is refused with ``routing_replay``
            (the recomputed forward runs after the replay context has closed, so it would route as
            the router chooses, not as π_old did).
        output_dir: the directory this run writes into (its step log ``metrics.jsonl``, its trackers'
            files, its periodic checkpoints); ``None``: nothing is written. :func:`grpo_lab.experiments.run`
            gives each seed its own directory under the one it is given.
        report_to: where each step's metrics go, a tuple of tracker names: ``"jsonl"`` (one JSON line per
            step in ``output_dir``, written and flushed as the step ends), ``"tensorboard"``, ``"wandb"``
            (see :mod:`grpo_lab.training.callbacks`); ``()`` for none. Only acts with an ``output_dir``.
        save_every: write a checkpoint (:meth:`Trainer.save`) under ``output_dir/checkpoints`` every this
            many steps (0: never); a run killed mid-way resumes from the latest one
            (``experiments.run(..., resume=True)``).
        save_total_limit: keep only the newest this many periodic checkpoints (``None``: all).
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
    lr_schedule: str = "constant"
    lr_schedule_steps: int | None = None
    epochs: int = 1
    minibatches: int = 1
    micro_batch_size: int | None = None
    sort_by_length: bool = True
    old_logp: str = "recompute"
    rollout_dtype: str = "float32"
    rollout_fp32_lm_head: bool = False
    eval_every: int = 10
    eval_sampled: bool = False
    eval_batch_size: int = 256
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
    gradient_checkpointing: bool = False
    output_dir: str | None = None
    report_to: tuple = ("jsonl",)
    save_every: int = 0
    save_total_limit: int | None = 2

    def __post_init__(self):
        for name in ("prompts_per_step", "group_size", "epochs", "minibatches", "max_gen_rounds", "eval_batch_size"):
            positive_int(f"TrainerConfig.{name}", getattr(self, name))
        positive_int("TrainerConfig.micro_batch_size", self.micro_batch_size, allow_none=True)
        positive_int("TrainerConfig.max_new_tokens", self.max_new_tokens, allow_none=True)
        self._check_lr_schedule()
        if (self.prompts_per_step * self.group_size) % self.minibatches:
            raise ValueError(
                f"TrainerConfig: minibatches={self.minibatches} does not divide the rollout size "
                f"{self.prompts_per_step * self.group_size}")
        choice("TrainerConfig.old_logp", self.old_logp, ("recompute", "behaviour"))
        flag("TrainerConfig.sort_by_length", self.sort_by_length)
        flag("TrainerConfig.topup", self.topup)
        flag("TrainerConfig.routing_replay", self.routing_replay)
        flag("TrainerConfig.gradient_checkpointing", self.gradient_checkpointing)
        if self.gradient_checkpointing and self.routing_replay:
            raise ValueError("TrainerConfig.gradient_checkpointing=True cannot be combined with routing_replay=True: "
                             "the backward pass recomputes each layer's forward after the replay of π_old's experts "
                             "has ended, so the recomputed forward would route differently from the one that was "
                             "scored; turn one of them off")
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
        self._check_outputs()
        for name in ("warmup", "eval_every", "seed", "value_warmup_steps"):
            non_negative_int(f"TrainerConfig.{name}", getattr(self, name))
        positive_int("TrainerConfig.threads", self.threads, allow_none=True)
        if len(tuple(self.betas)) != 2 or not all(0 <= real_number("TrainerConfig.betas", b) < 1 for b in self.betas):
            raise ValueError(f"TrainerConfig.betas must be two numbers in [0, 1), got {self.betas!r}")
        # numpy scalars pass the checks above: store python numbers (JSON, hashing, provenance)
        for name in ("prompts_per_step", "group_size", "epochs", "minibatches", "max_gen_rounds", "micro_batch_size",
                     "eval_batch_size", "max_new_tokens", "warmup", "eval_every", "seed", "threads", "value_warmup_steps"):
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

    def _check_lr_schedule(self) -> None:
        """Validate ``lr_schedule`` (a key of :data:`~grpo_lab.training.lr_schedule.LR_SCHEDULES`) and
        ``lr_schedule_steps`` (``None`` or a positive int, stored as a python int); ``ValueError`` naming the field."""
        choice("TrainerConfig.lr_schedule", self.lr_schedule, tuple(LR_SCHEDULES))
        positive_int("TrainerConfig.lr_schedule_steps", self.lr_schedule_steps, allow_none=True)
        if self.lr_schedule_steps is not None:
            object.__setattr__(self, "lr_schedule_steps", int(self.lr_schedule_steps))

    def _check_outputs(self) -> None:
        """Validate and normalise :data:`OUTPUT_FIELDS` (``ValueError`` naming the field)."""
        if self.output_dir is not None:
            if not isinstance(self.output_dir, (str, os.PathLike)) or not str(self.output_dir).strip():
                raise ValueError(f"TrainerConfig.output_dir must be a directory path or None, got {self.output_dir!r}")
            object.__setattr__(self, "output_dir", str(self.output_dir))
        report = (self.report_to,) if isinstance(self.report_to, str) else self.report_to
        if not isinstance(report, (tuple, list)) or not all(isinstance(r, str) and r for r in report):
            raise ValueError(f"TrainerConfig.report_to must be a list of tracker names, got {self.report_to!r}")
        object.__setattr__(self, "report_to", tuple(dict.fromkeys(report)))
        non_negative_int("TrainerConfig.save_every", self.save_every)
        positive_int("TrainerConfig.save_total_limit", self.save_total_limit, allow_none=True)
        object.__setattr__(self, "save_every", int(self.save_every))
        if self.save_total_limit is not None:
            object.__setattr__(self, "save_total_limit", int(self.save_total_limit))

    def to_dict(self) -> dict:
        """Every field as plain JSON/YAML values (tuples as lists), as checkpoints and results files store them."""
        d = asdict(self)
        d["betas"] = list(self.betas)
        d["report_to"] = list(self.report_to)
        return d

    def run_identity(self) -> dict:
        """:meth:`~grpo_lab.training.trainer.TrainerConfig.to_dict` without
        :data:`~grpo_lab.training.config.OUTPUT_FIELDS`: the fields a run's numbers depend on."""
        return {k: v for k, v in self.to_dict().items() if k not in OUTPUT_FIELDS}

    @classmethod
    def from_dict(cls, d: dict) -> "TrainerConfig":
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        if "report_to" in d and isinstance(d["report_to"], list):
            d["report_to"] = tuple(d["report_to"])
        return cls(**d)


TrainerConfig.__module__ = "grpo_lab.training.trainer"  # documented, pickled and imported as grpo_lab.training.trainer.TrainerConfig
