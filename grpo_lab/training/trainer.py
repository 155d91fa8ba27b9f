"""The trainer: one loop for every algorithm of the GRPO family, on a ``transformers`` causal LM.

A step reads top to bottom (``Trainer._train_step``): *collect* (sample groups of G responses, score
them, select the groups to train on; :mod:`grpo_lab.training.collection`) → *advantages* (the algorithm's
estimator) → *plan* (the minibatch and micro-batch layout of every epoch, π_old and π_ref scored in it) →
*optimiser steps* (:mod:`grpo_lab.training.update`) → one *history row* (:mod:`grpo_lab.training.history`).
The trainer knows the algorithmic axes only through an :class:`~grpo_lab.algo.algorithms.Algorithm` and
the functions of each axis (selection, advantage estimator, :func:`~grpo_lab.algo.objectives.policy_loss`);
it has no branch on any algorithm's switch. Every loss normaliser is a whole-minibatch quantity, so the
gradient does not depend on the micro-batch split.

π_old: with ``epochs=1, minibatches=1`` the update is on-policy (ratio 1 in value); otherwise π_old is
scored without grad in the update's own micro-batches (rows, order, padding), so that on unchanged weights
it equals π_θ bit for bit, or is the sampler's (``old_logp="behaviour"``). Dropout is off throughout
(:func:`grpo_lab.training.dropout.disable_dropout`, TRL's ``disable_dropout``) and the policy stays in train
mode, so the ratio π_θ/π_old compares one function at two points. Mixture-of-Experts policies record π_old's
experts, log ``routing_change_frac`` and with ``routing_replay`` replay them (GSPO, arXiv 2507.18071, §5.3).
LoRA policies take the base model (adapters disabled) as the KL reference.

Departures from the papers:

1. The KL reference is a frozen copy of the initial policy (DeepSeekMath §4.2 also resets it periodically).
2. Learning-rate warm-up is linear (``TrainerConfig.warmup``).
"""

from __future__ import annotations

import copy
import functools
import math
import os
import random
import signal
import socket
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Self

import numpy as np
import pandas as pd
import torch

from ..algo import selection
from ..algo.advantages import GROUP_BASELINE_ESTIMATORS, VALUE_BASELINE_ESTIMATORS
from ..algo.algorithms import Algorithm, get_algorithm
from ..algo.checks import non_negative_int
from ..algo.objectives import policy_loss
from ..policy.lora import AdapterDisabled
from ..policy.models import CriticModel, is_peft_model
from ..policy.moe import moe_routers
from ..policy.rollout import Rollout
from ..tasks import validate_task
from .adamw import build_adamw
from .callbacks import call_hooks, check_callbacks, make_callbacks
from .checkpoints import (CHECKPOINTS_DIR, check_checkpointing, checkpoint_name, checkpoint_state, load_checkpoint, periodic_checkpoint, prune_checkpoints,
                          restore_training_state, write_checkpoint)
from .collection import Batch, Scored, collect, reward_trainer_state, round_size, sample_rollout, score_rollout
from .config import TrainerConfig
from .dropout import disable_dropout
from .history import HISTORY_COLUMNS, MEASURED_COLUMNS, completions_table, evaluate_frame, evaluation_row, history_row
from .learning_signal import (NO_SIGNAL_STEPS, DynamicSamplingShortfallWarning, NoLearningSignalWarning, no_signal_step,
                              no_signal_warning)
from .memory import peak_memory_mb, reset_peak_memory
from .precision import PRECISIONS, Precision, resolve_precision
from .update import Learner, compute_advantages, plan_update, run_update
from .value_model import ValueModel, check_value_settings, critic_values, pretrain_value_step

__all__ = ["TrainerConfig", "Trainer", "Batch", "Scored", "ValueModel", "peak_memory_mb", "reset_peak_memory",
           "MEASURED_COLUMNS", "HISTORY_COLUMNS", "PRECISIONS", "resolve_precision", "NoLearningSignalWarning",
           "DynamicSamplingShortfallWarning", "Terminated", "TrainingDiverged", "TERMINATED_EXIT_CODE"]

#: The exit status of the command line after a SIGTERM stopped training and a checkpoint was written
#: (128 + 15, the status a process killed by SIGTERM reports): ``--resume`` continues the run.
TERMINATED_EXIT_CODE = 143

#: A per-token ``kl`` column above this after an update: the update diverged (a warning names the lr).
_DIVERGED_KL = 100.0


class Terminated(KeyboardInterrupt):
    """:meth:`Trainer.train` stopped on SIGTERM (a preemption) after finishing the step in progress and writing a
    checkpoint. A ``KeyboardInterrupt``, so that it passes through ``except Exception`` as Ctrl-C does.

    Attributes:
        step: the last step trained (int).
        checkpoint: the checkpoint written at that step (:class:`pathlib.Path`), or ``None`` without an
            ``output_dir`` (nothing to write into).
        others: the ``Terminated`` of further runs stopped by the same SIGTERM (several seeds trained in worker
            processes, :func:`grpo_lab.experiments.run` with ``n_jobs > 1``); empty for one run.
    """

    def __init__(self, step: int, checkpoint: Path | None, others: tuple = ()):
        super().__init__(step, checkpoint)
        self.step, self.checkpoint, self.others = step, checkpoint, tuple(others)

    def __str__(self) -> str:
        def where(t: Terminated) -> str:
            return f"checkpoint {t.checkpoint}" if t.checkpoint is not None else "no checkpoint"

        others = "".join(f"; another run after step {t.step}: {where(t)}" for t in self.others)
        return f"stopped by SIGTERM after step {self.step}; {where(self)}{others}"


class TrainingDiverged(FloatingPointError):
    """A step failed on non-finite numbers (log-probabilities, gradient norm) after the policy had been
    updated: the updates diverged, most often from too large a learning rate (the message names it)."""


class Trainer:
    """GRPO-family trainer for a ``transformers`` causal LM: it owns the policy, the KL reference, the critic,
    the optimisers, the RNGs and the history rows, and runs the stage functions on them.

    Args:
        policy, tokenizer: the float32 causal LM to train (in place; dropout 0, train mode) and its tokenizer.
        task: a :class:`grpo_lab.tasks.base.Task`.
        algo: an :class:`~grpo_lab.algo.algorithms.Algorithm` or a preset's name.
        config: a :class:`TrainerConfig` (default ``TrainerConfig()``).
        ref_policy: the KL reference (only with a KL term); default a frozen copy of ``policy``, or for a LoRA
            policy the base model (adapters disabled, no copy).
        value_model: a critic (:class:`ValueModel`), trained by its own AdamW (``value_lr``) and checkpointed;
            default none, unless the advantage estimator needs values: then ``TrainerConfig.value_init``'s.
        callbacks: :class:`grpo_lab.training.callbacks.TrainerCallback` objects, called after ``report_to``'s
            trackers (both in the list ``callbacks``); they cannot change the run's numbers; not checkpointed.
        loss_fn: :func:`grpo_lab.algo.objectives.policy_loss` or a callable with its signature and output (checked
            at the first update: ``TypeError``); its ``metrics`` become the loss columns. Not checkpointed.

    Raises:
        TypeError: ``task`` does not implement the task protocol; ``ntp_coef > 0`` and the task has no
            ``demonstration``; ``callbacks`` is not a list of callback objects; ``loss_fn`` is not callable.
        ImportError: ``report_to`` names a tracker whose package is not installed.
        ValueError: a non-float32 policy; an unknown tracker; sampling choices that do not fit the config
            (:func:`grpo_lab.algo.selection.check`); ``gradient_checkpointing`` or ``routing_replay`` the policy
            cannot do; ``save_every`` without ``output_dir``; a decaying ``lr_schedule`` without
            ``lr_schedule_steps``; ``value_warmup_steps`` without a critic; CUDA asked for and absent.

    Warns:
        RuntimeWarning: ``group_size=1`` with a group-baseline advantage estimator (every advantage 0).
    """

    def __init__(self, policy, tokenizer, task, algo: Algorithm, config: TrainerConfig | None = None,
                 *, ref_policy=None, value_model=None, callbacks=None, loss_fn: Callable = policy_loss):
        validate_task(task)  # cheap: attributes and signatures only, no call into the task (no RNG is touched)
        self.config = c = config or TrainerConfig()
        algo = _checked_algorithm(algo)
        algo.check_config(c)  # what the algorithm's functions need of the run (hparams.declare(config=...))
        #: the callbacks :meth:`train` and :meth:`save` call: the trackers of ``config.report_to``, then ``callbacks``
        self.callbacks: list = make_callbacks(c.report_to, c.output_dir) + check_callbacks(callbacks)
        if not callable(loss_fn):
            raise TypeError(f"Trainer: loss_fn must be a callable with policy_loss's signature, got "
                            f"{type(loss_fn).__name__}")
        #: the policy loss the update calls (:func:`grpo_lab.algo.objectives.policy_loss` by default)
        self.loss_fn = loss_fn
        if torch.device(c.device).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"Trainer: TrainerConfig.device={c.device!r} but CUDA is not available")
        if c.lr_schedule != "constant" and c.lr_schedule_steps is None:
            raise ValueError(f"Trainer: TrainerConfig.lr_schedule={c.lr_schedule!r} needs lr_schedule_steps, the RL "
                             "steps its decay spans (experiments.run sets it to the run's steps)")
        self.algo, self.task, self.tokenizer = algo, task, tokenizer
        if hasattr(task, "bind_tokenizer"):  # the task protocol's optional hook (DatasetTask's completion_ids)
            task.bind_tokenizer(tokenizer)
        if c.threads:
            torch.set_num_threads(c.threads)
        _check_float32(policy)
        #: the autocast dtype this trainer uses (:func:`resolve_precision` of ``config.precision``)
        self.precision = resolve_precision(c.precision, c.device)
        #: the autocast context, the scaled backward and the float16 gradient scaler
        self.amp = Precision(self.precision, c.device)
        self._init_policy(policy)
        self._init_reference(policy, ref_policy)
        self.optimizer = build_adamw(self.policy, lr=c.lr, weight_decay=c.weight_decay, betas=tuple(c.betas))
        self._init_value_model(policy, value_model)
        self.step = 0
        self.opt_steps = 0
        self.rows: list[dict] = []
        self.max_new_tokens = c.max_new_tokens or task.max_new_tokens
        self._check_algorithm_fits()
        check_value_settings(c, self.algo, self.value_model, self.max_new_tokens)
        check_checkpointing(c)
        self._warn_group_size()
        random.seed(c.seed)
        self.rng = np.random.default_rng(c.seed)
        torch.manual_seed(c.seed)

    @property
    def scaler(self) -> torch.amp.GradScaler:
        """The float16 gradient scaler (disabled under other precisions)."""
        return self.amp.scaler

    @property
    def amp_skipped_steps(self) -> int:
        """Optimiser steps skipped because float16 gradients overflowed."""
        return self.amp.skipped_steps

    @amp_skipped_steps.setter
    def amp_skipped_steps(self, n: int) -> None:
        self.amp.skipped_steps = n

    def _init_policy(self, policy) -> None:
        """The policy on the device, its dropout off and in train mode (gradient checkpointing on when the config
        asks), its Mixture-of-Experts routers, and the checks of ``routing_replay`` against them (``ValueError``,
        see the class docstring)."""
        c = self.config
        self.policy = policy.to(c.device)
        disable_dropout(self.policy)
        self.policy.train()
        if c.gradient_checkpointing:
            if not getattr(self.policy, "supports_gradient_checkpointing", False):
                raise ValueError(f"Trainer: TrainerConfig.gradient_checkpointing=True but the policy "
                                 f"({type(self.policy).__name__}) does not support gradient checkpointing "
                                 "(supports_gradient_checkpointing is not True); set gradient_checkpointing=False")
            enable = getattr(self.policy, "activation_checkpointing_enable", None)  # transformers >= 5.x's name
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
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

    def _init_reference(self, policy, ref_policy) -> None:
        """The frozen KL reference when the algorithm has a KL term, ``None`` otherwise: ``ref_policy``, or
        by default a copy of ``policy``; for a LoRA policy (a ``peft.PeftModel``) the policy itself with
        its adapters disabled (:class:`grpo_lab.policy.lora.AdapterDisabled`: the base model, no copy)."""
        c = self.config
        self.uses_kl = self.algo.uses_kl
        self.ref_policy = None
        if self.uses_kl and ref_policy is None and is_peft_model(self.policy):
            self.ref_policy = AdapterDisabled(self.policy)
        elif self.uses_kl:
            self.ref_policy = (ref_policy if ref_policy is not None else copy.deepcopy(policy)).to(c.device).eval()
            self.ref_policy.requires_grad_(False)

    def _init_value_model(self, policy, value_model) -> None:
        """The critic (``value_model``, or the one ``TrainerConfig.value_init`` names when the advantage
        estimator needs values) on the device in eval mode, with its own AdamW; ``None`` without one."""
        c, algo = self.config, self.algo
        if value_model is None and algo.advantage in VALUE_BASELINE_ESTIMATORS:
            value_model = CriticModel.build(c.value_init, policy, self.tokenizer, seed=c.seed)
        self.value_model, self.value_optimizer = value_model, None
        self.value_warmup_rows: list[dict] = []
        if value_model is not None:
            self.value_model = value_model.to(c.device).eval()
            self.value_optimizer = build_adamw(value_model, lr=c.value_lr or c.lr, weight_decay=c.weight_decay,
                                               betas=tuple(c.betas))

    def _check_algorithm_fits(self) -> None:
        """The algorithm's sampling choices against the config (:func:`grpo_lab.algo.selection.check`), and a
        ``TypeError`` when ``ntp_coef > 0`` and the task has no ``demonstration`` method."""
        c, algo, task = self.config, self.algo, self.task
        selection.check(algo, group_size=c.group_size, max_new_tokens=self.max_new_tokens)
        if algo.ntp_coef > 0 and not callable(getattr(task, "demonstration", None)):
            raise TypeError(f"Trainer: {algo.name!r} has ntp_coef={algo.ntp_coef:g}, a next-token-prediction term on the "
                            f"task's ground truth, but {type(task).__name__} has no demonstration(problem, rng) -> str "
                            "method to provide it")

    def _warn_group_size(self) -> None:
        """A ``RuntimeWarning`` (pointing at the caller of ``Trainer(...)``) when ``group_size=1`` meets an
        advantage estimator whose baseline is the group."""
        c, algo = self.config, self.algo
        if c.group_size == 1 and algo.advantage in GROUP_BASELINE_ESTIMATORS:
            warnings.warn(f"Trainer: group_size=1 with the advantage estimator {algo.advantage!r} of "
                          f"{algo.name!r}: its baseline is the other responses of the same group, so it needs "
                          "group_size >= 2 (G >= 2); with one response per question every advantage is 0 "
                          "('rloo' raises) and the loss has no policy-gradient signal. Set "
                          "TrainerConfig.group_size to 2 or more",
                          RuntimeWarning, stacklevel=3)


    # ------------------------------------------------------------------ the stages, as the step calls them
    def rollout(self, n_prompts: int | None = None) -> Rollout:
        """One rollout of the current policy: ``n_prompts`` questions (default ``prompts_per_step``) × G
        responses (:func:`grpo_lab.training.collection.sample_rollout`)."""
        n = self.config.prompts_per_step if n_prompts is None else n_prompts
        return sample_rollout(self.policy, self.tokenizer, self.task, self.config, self.rng, self.amp,
                              self.max_new_tokens, n)

    def score(self, ro: Rollout) -> Scored:
        """Rewards, correctness and shaped rewards of ``ro`` (:func:`grpo_lab.training.collection.score_rollout`)."""
        state = reward_trainer_state(self.task, self.config, step=self.step, opt_steps=self.opt_steps,
                                     end_step=getattr(self, "_end_step", self.step + 1))
        return score_rollout(self.task, self.algo, ro, self.max_new_tokens, trainer_state=state)

    def collect(self) -> Batch:
        """The *collect* stage (:func:`grpo_lab.training.collection.collect`): rounds of :meth:`rollout` and
        :meth:`score` until ``prompts_per_step`` groups are selected; the critic's values of the kept rows."""
        values = None if self.value_model is None else functools.partial(
            critic_values, self.value_model, micro_batch_size=self.config.micro_batch_size, amp=self.amp)
        return collect(lambda n: self.score(self.rollout(n)), self.algo, self.config, self.rows, step=self.step,
                       pad_id=self.tokenizer.pad_token_id, values=values)

    def round_size(self, missing: int, batch: Batch) -> int:
        """Questions to sample in the next dynamic-sampling round (:func:`grpo_lab.training.collection.round_size`)."""
        return round_size(missing, batch, self.config, self.rows)

    def compute_advantages(self, batch: Batch) -> torch.Tensor:
        """The *advantages* stage (:func:`grpo_lab.training.update.compute_advantages`): fills
        ``batch.advantages`` (and ``batch.returns`` with a critic) and returns the advantages."""
        return compute_advantages(batch, self.algo, self.config)

    def update(self, batch: Batch) -> tuple[list[dict], list[float], list[tuple[float, float]]]:
        """The *plan* and *optimiser steps* stages on ``batch`` (its advantages computed): ``epochs`` passes of
        ``minibatches`` optimiser steps (:func:`~grpo_lab.training.update.plan_update`,
        :func:`~grpo_lab.training.update.run_update`). Returns per optimiser step the loss metrics and the gradient norm before
        clipping, and per first-epoch micro-batch ``(entropy sum, token count)``."""
        learner = self._learner()
        result = run_update(plan_update(batch, learner, self.rng), learner, self.rng, self.opt_steps)
        self.opt_steps = result.opt_steps
        return result.metrics, result.grad_norms, result.entropies

    def _learner(self) -> Learner:
        """What the update functions read and change, handed to them explicitly."""
        return Learner(self.policy, self.optimizer, self.algo, self.config, self.amp, self.max_new_tokens,
                       loss_fn=self.loss_fn, ref_policy=self.ref_policy if self.uses_kl else None,
                       value_model=self.value_model, value_optimizer=self.value_optimizer,
                       moe_routers=self.moe_routers, task=self.task, tokenizer=self.tokenizer, step=self.step)

    def _train_step(self) -> dict:
        """One step, phase by phase; returns its history row (without ``step`` and the evaluation)."""
        reset_peak_memory(self.config.device)
        t0 = time.perf_counter()
        batch = self.collect()                                          # collect: sample, score, select
        update = None
        if batch.rollout is not None:  # None: dynamic sampling kept no group, no update this step
            learner = self._learner()
            compute_advantages(batch, self.algo, self.config)           # advantages
            plan = plan_update(batch, learner, self.rng)                # plan: layouts, π_old / π_ref scored in them
            update = run_update(plan, learner, self.rng, self.opt_steps)  # optimiser steps
            self.opt_steps = update.opt_steps
        every = self.config.log_completions_every  # TRL's log_completions: the trained rows, every N steps
        self._completions = completions_table(batch, self.step + 1) if every and (self.step + 1) % every == 0 else None
        return history_row(batch, update, config=self.config, algo=self.algo, task=self.task, amp=self.amp,
                           lr=self.optimizer.param_groups[0]["lr"], seconds=time.perf_counter() - t0)

    # ------------------------------------------------------------------ the loop, evaluation, the critic's warm-up
    def train(self, steps: int) -> pd.DataFrame:
        """Run ``steps`` more steps; returns the whole history, one row per step (the columns:
        :data:`~grpo_lab.training.history.HISTORY_COLUMNS`).

        With ``eval_every``, a row whose step evaluated holds the greedy test evaluation *after* that many
        updates (step 0: the base policy, before the first step). ``value_warmup_steps`` pretrain the critic
        first (:meth:`pretrain_value`). Callbacks: ``on_train_begin``; each complete row to ``on_step``, then,
        when it evaluated, to ``on_evaluate`` with the sample completions; ``on_train_end`` last, also when a
        step raised. Every ``save_every`` steps (and after the last) a periodic checkpoint.

        SIGTERM (a preemption; only when ``train`` runs in the main thread and SIGTERM has its default handler):
        the step in progress finishes, a checkpoint is written at it (``output_dir/checkpoints/step-NNNNNN``,
        whatever ``save_every``; the newest ``save_total_limit`` kept) and :class:`Terminated` is raised; a second
        SIGTERM raises it at once (the last checkpoint stays the newest). The previous handler is put back.

        Raises:
            ValueError: ``steps`` is negative; ``value_warmup_steps`` without a critic.
            Terminated: SIGTERM (see above).
            TrainingDiverged: a step failed on non-finite numbers after the policy had been updated.

        Warns:
            RuntimeWarning: a step's ``kl`` above 100 nats per token (the update diverged; names the lr).
        """
        c = self.config
        end = self._end_step = self.step + non_negative_int("train: steps", steps)
        if self.step == 0 and c.value_warmup_steps and not self.value_warmup_rows:
            if self.value_model is None:
                raise ValueError("Trainer: TrainerConfig.value_warmup_steps > 0 but the trainer has no value model")
            self.pretrain_value(c.value_warmup_steps)
        bar = None
        self._notify("on_train_begin")
        try:
            if self.step == 0 and c.eval_every and not self.rows:
                self._log_row(*self._evaluation())
            if self._show_progress():
                from tqdm.auto import tqdm
                bar = tqdm(total=steps, desc=f"{self.algo.name} seed {c.seed}", mininterval=1.0)
            with _SigtermFlag(self) as stop:
                while self.step < end:
                    row, samples = self._checked_step(), None
                    self.step += 1
                    row["step"] = self.step
                    if c.eval_every and (self.step % c.eval_every == 0 or self.step == end):
                        evaluation, samples = self._evaluation()
                        row.update({k: v for k, v in evaluation.items() if k != "step"})
                    self._log_row(row, samples)
                    if self._completions is not None:
                        self._notify("on_completions", row, self._completions)
                    self._check_learning_signal()
                    saved = self._periodic_save(final=self.step == end)  # save_every
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(reward=f"{row['reward']:.2f}", len=f"{row['length']:.1f}")
                    if stop.requested and self.step < end:
                        raise Terminated(self.step, saved or self._stop_checkpoint())
        finally:
            if bar is not None:
                bar.close()
            self._notify("on_train_end")
        return self.history

    @property
    def history(self) -> pd.DataFrame:
        """One row per step (:data:`~grpo_lab.training.history.HISTORY_COLUMNS`)."""
        return pd.DataFrame(self.rows)

    def evaluate(self, *, greedy: bool = True) -> dict:
        """Test-set accuracy now (:func:`grpo_lab.training.history.evaluate_frame`; advances no training RNG)."""
        return evaluate_frame(self.policy, self.tokenizer, self.task, self.config, self.amp, self.max_new_tokens,
                              greedy=greedy)[0]

    def _evaluation(self) -> tuple[dict, pd.DataFrame]:
        """The evaluation row now and its samples table (:func:`grpo_lab.training.history.evaluation_row`)."""
        return evaluation_row(self.policy, self.tokenizer, self.task, self.config, self.amp, self.max_new_tokens,
                              self.step)

    def pretrain_value(self, steps: int) -> pd.DataFrame:
        """VAPO (arXiv 2504.05118) §4.1 *Value-Pretraining*: ``steps`` times, collect a batch as :meth:`collect`
        does (same sampling and RNGs) and fit the critic to its Monte-Carlo returns
        (:func:`grpo_lab.training.value_model.pretrain_value_step`); the policy does not move. Save the critic
        with ``trainer.value_model.save(path)`` and reuse it as ``TrainerConfig.value_init``.

        Returns:
            The warm-up history so far (also ``value_warmup_rows``): ``value_step``, ``explained_variance``,
            ``value_mean``, ``return_mean`` (on each fresh batch before the fit), ``value_loss``, ``seconds``.

        Raises:
            ValueError: the trainer has no value model, or ``steps`` is negative.
        """
        if self.value_model is None:
            raise ValueError("Trainer.pretrain_value: the trainer has no value model (use an algorithm whose advantage "
                             "estimator needs values, e.g. 'gae', or pass value_model=)")
        for _ in range(non_negative_int("pretrain_value: steps", steps)):
            t0 = time.perf_counter()
            batch = self.collect()
            if batch.rollout is None:
                continue
            fit = pretrain_value_step(batch, self.value_model, self.value_optimizer, self.config, self.algo,
                                      self.rng, self.amp)
            row = {"value_step": len(self.value_warmup_rows) + 1, **fit, "seconds": time.perf_counter() - t0}
            self.value_warmup_rows.append(row)
        return pd.DataFrame(self.value_warmup_rows)

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | Path) -> Path:
        """Write a checkpoint directory atomically, everything :meth:`resume` needs to continue exactly.

        Files: ``policy/`` (safetensors + tokenizer; for a LoRA policy its adapters and ``grpo_lab_base.json``
        naming the base, :func:`grpo_lab.policy.lora.base_record`), ``ref/`` (a KL reference that is not the
        LoRA base), ``value.safetensors``, ``critic/`` and ``value_optimizer.pt`` (with a critic),
        ``optimizer.pt``, ``rng.pt``, ``state.json`` (steps, config, algorithm, task, numpy and python RNG
        states) and ``history.json``. A registered dataclass task is rebuilt by :meth:`resume`; any other is
        stored by name, class and fields and needs ``task=`` there.

        Everything that can be checked is checked first; the files go to a sibling ``.NAME.saving`` that
        replaces ``path`` only once complete, so a failure (an exception, a full disk, Ctrl-C) leaves ``path`` as
        it was. ``train`` calls it every ``save_every`` steps into ``output_dir/checkpoints/step-NNNNNN``.

        Returns:
            ``path`` (a :class:`pathlib.Path`).

        Raises:
            TypeError: the trainer's task no longer implements the task protocol.
            ValueError: the history holds a value JSON cannot write; a LoRA policy whose base was built in
                memory or that trains base parameters.
            FileExistsError: ``path`` is a file, or a non-empty directory without ``state.json``.
            CheckpointWriteError: an ``OSError``: writing failed, e.g. a full disk (one line naming the checkpoint,
                the free space and the previous checkpoint, intact; nothing is left behind).
        """
        validate_task(self.task)
        state = checkpoint_state(step=self.step, opt_steps=self.opt_steps, config=self.config, algo=self.algo,
                                 task=self.task, rng=self.rng, value_warmup_rows=self.value_warmup_rows, amp=self.amp)
        final = write_checkpoint(path, state, self.rows, task=self.task, policy=self.policy, tokenizer=self.tokenizer,
                                 optimizer=self.optimizer, ref_policy=self.ref_policy, value_model=self.value_model,
                                 value_optimizer=self.value_optimizer, progress=self._show_progress())
        self._notify("on_save", final)  # the callbacks' on_save (grpo_lab.training.callbacks)
        return final

    @classmethod
    def resume(cls, path: str | Path, *, task=None, device: str | None = None, value_model=None,
               output: dict[str, Any] | None = None, loss_fn: Callable = policy_loss, strict: bool = False) -> Self:
        """Rebuild a trainer from :meth:`save` so that ``train`` continues exactly (also a periodic checkpoint).

        Args:
            path: the checkpoint directory.
            task: the task to continue with; needed when the saved one cannot be rebuilt from the registry
                (:func:`grpo_lab.tasks.register_task`). A ``RuntimeWarning`` names what differs from the saved one.
            device: overrides the saved ``TrainerConfig.device``.
            value_model: a fresh critic of the saved architecture, when the checkpoint holds one of your own
                (a :class:`grpo_lab.policy.models.CriticModel` is rebuilt from the checkpoint).
            output: replacements for fields of ``grpo_lab.training.config.OUTPUT_FIELDS`` (e.g. a moved
                ``output_dir``); they never change the run's numbers.
            loss_fn: as :class:`Trainer`'s; a checkpoint does not store it (nor callbacks): pass it again.
            strict: raise when the task's data or reward functions differ from the checkpoint's fingerprint
                (:func:`grpo_lab.tasks.base.check_fingerprint`) instead of the ``RuntimeWarning`` naming them.

        Every file is looked for before anything is loaded.

        Raises:
            FileNotFoundError: ``path`` is not a checkpoint directory.
            TypeError: ``task`` does not implement the task protocol.
            ValueError: ``output`` names a non-output field; a file is missing or corrupt (named); ``ref/`` is
                missing for an algorithm with a KL term; a critic of your own and no ``value_model``; the task
                cannot be rebuilt and no ``task=`` (the message shows both remedies); ``strict`` and the task's
                data or reward functions differ from the saved fingerprint.
            grpo_lab.policy.lora.BaseModelNotFound: a LoRA checkpoint's base model cannot be loaded here.
            ImportError: a LoRA checkpoint and peft is not installed.
        """
        ck = load_checkpoint(path, task=task, device=device, value_model=value_model, output=output, strict=strict)
        trainer = cls(ck.policy, ck.tokenizer, ck.task, ck.algo, ck.config, ref_policy=ck.ref_policy,
                      value_model=ck.value_model, loss_fn=loss_fn)
        restore_training_state(ck.path, ck.state, optimizer=trainer.optimizer, rng=trainer.rng, amp=trainer.amp,
                               value_optimizer=trainer.value_optimizer if ck.has_value else None)
        trainer.step = int(ck.state["step"])
        trainer.opt_steps = int(ck.state.get("opt_steps", 0))
        trainer.rows = ck.rows
        trainer.value_warmup_rows = list(ck.state.get("value_warmup_rows", []))
        return trainer

    def _periodic_save(self, final: bool = False) -> Path | None:
        """After a training step: the periodic checkpoint ``TrainerConfig.save_every`` asks for
        (:func:`~grpo_lab.training.checkpoints.periodic_checkpoint`), then only the newest ``save_total_limit``
        are kept (and half-written ones a killed save left are deleted). Returns the checkpoint written, or
        ``None``."""
        path = periodic_checkpoint(self.config, self.step, final)
        if path is not None:
            self.save(path)
            prune_checkpoints(path.parent, self.config.save_total_limit)
        return path

    def _stop_checkpoint(self) -> Path | None:
        """The checkpoint SIGTERM asks for (:meth:`train`): ``output_dir/checkpoints/step-NNNNNN`` at the current
        step, the newest ``save_total_limit`` kept; ``None`` (nothing written) without an ``output_dir``."""
        if self.config.output_dir is None:
            return None
        path = Path(self.config.output_dir) / CHECKPOINTS_DIR / checkpoint_name(self.step)
        self.save(path)
        prune_checkpoints(path.parent, self.config.save_total_limit)
        return path

    def _checked_step(self) -> dict:
        """:meth:`_train_step`, with divergence named: non-finite log-probabilities or gradient norm after the
        policy has been updated raise :class:`TrainingDiverged` (naming the lr); a ``kl`` above
        ``_DIVERGED_KL`` warns. Nothing the step computes changes."""
        try:
            row = self._train_step()
        except (FloatingPointError, ValueError) as exc:
            text = str(exc)
            non_finite = isinstance(exc, FloatingPointError) or "log-probability undefined (NaN)" in text
            if not non_finite or not self.optimizer.state:  # no update yet: the learning rate is not the cause
                raise
            raise TrainingDiverged(f"Trainer: the updates diverged at step {self.step + 1} (non-finite numbers "
                                   f"after the policy was updated; {self._last_step_note()}): lr={self.config.lr:g} "
                                   f"is likely too large; lower it (--set lr=...) or add warm-up. The error: "
                                   f"{text}") from exc
        kl = row.get("kl")
        if isinstance(kl, float) and math.isfinite(kl) and kl > _DIVERGED_KL:
            warnings.warn(f"Trainer: step {self.step + 1}: kl={kl:.4g} nats per token from the reference after "
                          f"the update: the update diverged; lr={self.config.lr:g} is likely too large",
                          RuntimeWarning, stacklevel=4)
        return row

    def _last_step_note(self) -> str:
        """``"step N logged kl=..., grad_norm=..."`` from the last history row, or ``"no step logged"``."""
        last = next((r for r in reversed(self.rows) if "grad_norm" in r), None)
        if last is None:
            return "no step logged"
        return f"step {last.get('step')} logged kl={last.get('kl', float('nan')):.4g}, " \
               f"grad_norm={last.get('grad_norm', float('nan')):.4g}"

    def _log_row(self, row: dict, samples: pd.DataFrame | None) -> None:
        """Append the complete history ``row`` and hand it to the callbacks: ``on_step``, then ``on_evaluate``
        with ``samples`` when the row's step evaluated (``samples`` not ``None``)."""
        self.rows.append(row)
        self._notify("on_step", row)
        if samples is not None:
            self._notify("on_evaluate", row, samples)

    def _check_learning_signal(self) -> None:
        """:class:`~grpo_lab.training.learning_signal.NoLearningSignalWarning`, once per trainer, when each of
        the last :data:`~grpo_lab.training.learning_signal.NO_SIGNAL_STEPS` steps had every group tied (a group
        baseline's advantages all 0); nothing for a value baseline or ``group_size`` 1 (warned when built)."""
        if (getattr(self, "_no_signal_warned", False) or self.config.group_size < 2
                or self.algo.advantage not in GROUP_BASELINE_ESTIMATORS):
            return
        at = no_signal_step(self.rows[-NO_SIGNAL_STEPS:])
        if at is None:
            return
        self._no_signal_warned = True
        first = self.rows[0] if self.rows and self.rows[0].get("step") == 0 else {}
        warnings.warn(no_signal_warning(self.algo.name, self.config.group_size, at,
                                        base_accuracy=first.get("test_accuracy")),
                      NoLearningSignalWarning, stacklevel=3)

    def _notify(self, hook: str, *args) -> None:
        """Call ``hook`` of every callback (:func:`grpo_lab.training.callbacks.call_hooks`: the random states kept)."""
        call_hooks(self.callbacks, hook, self, *args)

    def _show_progress(self) -> bool:
        """Whether progress bars show: ``TrainerConfig.progress``, or with ``None`` only when stderr
        is a terminal and ``$CI`` is unset."""
        c = self.config
        return bool(c.progress) if c.progress is not None else (sys.stderr.isatty() and not _under_ci())


class _SigtermFlag:
    """While entered (in :meth:`Trainer.train`): SIGTERM sets ``requested`` (and prints one line); a second
    SIGTERM, a second or more after the first, raises :class:`Terminated` at once (one sent to the process group
    and forwarded by a parent count as one). Installed only in the main thread and when SIGTERM has its default
    handler or one marked ``defers_to_trainer`` (a worker's between runs); a handler of the caller's own is left
    alone; the previous handler is put back on exit."""

    def __init__(self, trainer: Trainer):
        self.trainer, self.requested, self.previous, self.at = trainer, False, None, 0.0

    def __enter__(self) -> Self:
        handler = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        if handler is signal.SIG_DFL or getattr(handler, "defers_to_trainer", False):
            self.previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)

    def _handle(self, signum, frame) -> None:
        t = self.trainer
        if self.requested:
            if time.monotonic() - self.at > 1.0:
                raise Terminated(t.step, None)
            return
        self.requested, self.at = True, time.monotonic()
        print(f"SIGTERM (pid {os.getpid()} on {socket.gethostname()}): finishing step {t.step + 1}, then writing "
              "a checkpoint; a second SIGTERM stops at once", file=sys.stderr, flush=True)


def _checked_algorithm(algo) -> Algorithm:
    """``algo``, or the preset it names; ``ValueError`` when it is neither an :class:`Algorithm` nor a name."""
    if isinstance(algo, str):
        try:
            algo = get_algorithm(algo)  # its message names the closest preset (algorithms.closest_preset)
        except ValueError as exc:
            raise ValueError(f"Trainer: {exc}") from exc
    if not isinstance(algo, Algorithm):
        raise ValueError(f"Trainer: algo must be an Algorithm or a preset name, got {type(algo).__name__}")
    return algo


def _check_float32(policy) -> None:
    """``ValueError`` unless every parameter of ``policy`` is float32 (the trainer's mixed-precision recipe);
    for a LoRA policy both the frozen base weights and the adapters."""
    not_fp32 = sorted({str(p.dtype) for p in policy.parameters() if p.dtype != torch.float32})
    if not_fp32:
        lora = (" A LoRA policy's adapters take the base model's dtype when peft creates them: load the base "
                "in float32 before adding them.") if is_peft_model(policy) else ""
        raise ValueError(f"Trainer: the policy has {', '.join(not_fp32)} parameters; the trainer keeps float32 "
                         "weights, gradients and optimiser state and runs the forward passes in "
                         "TrainerConfig.precision (autocast). Load it in float32 (load_policy(..., "
                         "dtype=torch.float32); hub checkpoints such as Qwen2.5's are stored in bfloat16) and set "
                         "precision='bfloat16' or 'auto'." + lora)


def _under_ci() -> bool:
    import os

    return bool(os.environ.get("CI"))
