"""One trainer for every algorithm, in stages: collect → advantages → update → metrics.

The trainer knows the algorithmic axes only through an :class:`grpo_lab.algo.algorithms.Algorithm`
and the functions of each axis: :mod:`grpo_lab.algo.selection` (which samples train, reward shaping,
loss mask), :meth:`~grpo_lab.algo.algorithms.Algorithm.estimate_advantages` (the advantage
estimator) and :func:`grpo_lab.algo.objectives.policy_loss` (ratio, surrogate, KL, aggregation). It has
no branch on any algorithm's switch. What it owns is the plumbing: sampling groups, recomputing
π_old and π_ref log-probs, splitting a rollout into minibatches and micro-batches with *global*
token/sequence counts (so the gradient does not depend on how the batch is split), reducing
metrics as each metric says (:mod:`grpo_lab.algo.metrics`), logging, checkpointing and exact resume.

π_old: with ``epochs=1, minibatches=1`` the update is on-policy and the ratio is 1 in value;
clipping only acts when the same rollout is used for more than one optimiser step (``epochs`` ×
``minibatches`` > 1) or when π_old differs from the training forward (``old_logp="behaviour"``
uses the log-probs recorded by ``generate``).

Dropout is off throughout: the trainer sets every dropout probability (and MoE router jitter) of
the policy to 0 at construction (:func:`grpo_lab.training.dropout.disable_dropout`, TRL's
``disable_dropout``), then keeps it in **train mode**, which then computes the same function as
eval mode and lets gradient checkpointing (``TrainerConfig.gradient_checkpointing``) engage;
generation switches to eval mode for the call. The papers' importance ratio π_θ/π_old compares one
function of the weights at two points; with dropout active in the loss forward only, even an
on-policy ratio would be a ratio of two random dropout masks (a checkpoint with attention dropout
0.1 gave ratios down to 0 and clip fractions of 0.16 on a purely on-policy step). The KL reference
and the critic stay in eval mode.

π_old is scored in the layout of the update: the same micro-batches (rows, order, padding) as the
training forward that will compare against it, one no-grad forward per distinct layout (with
``minibatches > 1`` and ``epochs > 1`` each epoch's reshuffle is a new layout). Under bfloat16
autocast a row's log-probs depend on the rows that share its forward (its padding width): scored
in other chunks, GSPO's 3e-4 / 4e-4 range clipped about 3% of sequences of a policy whose weights
had not moved.

Mixture-of-Experts policies (:mod:`grpo_lab.policy.moe`): every step records the experts π_old chose
for each token (in the π_old forwards above) and logs ``routing_change_frac``, the fraction of
routing decisions that one optimiser step changed; ``TrainerConfig.routing_replay`` replays
π_old's experts whenever π_θ is scored on the same rollout (GSPO, arXiv 2507.18071, §5.3).

LoRA policies (``peft.PeftModel``, :mod:`grpo_lab.policy.lora`): the KL reference is the policy with its
adapters disabled (the base model, no copy of its weights, as in TRL), and checkpoints hold the
adapters and the name of the base.

Where the code departs from the papers: the KL reference is a frozen copy of the initial policy
(DeepSeekMath §4.2 also resets it periodically in iterative GRPO; we do not), and learning-rate
warm-up is linear (``TrainerConfig.warmup``).

Where the code lives: this module assembles :class:`Trainer` (construction and the training loop)
from one part per module of :mod:`grpo_lab.training`: :mod:`~grpo_lab.training.collection`
(rollout, scoring, selection), :mod:`~grpo_lab.training.update` (π_old / π_ref, minibatches,
micro-batches, the optimiser step), :mod:`~grpo_lab.training.value_model` (the critic),
:mod:`~grpo_lab.training.history` (the history rows, evaluation), :mod:`~grpo_lab.training.checkpoints`
(save, resume), :mod:`~grpo_lab.training.callbacks` (callbacks, trackers) and
:mod:`~grpo_lab.training.precision` (autocast, loss scaling), with
:mod:`~grpo_lab.training.config` and :mod:`~grpo_lab.training.memory`. Every public name stays
importable from here. The functions the trainer calls (``policy_loss``, ``policy_logprobs``,
``inference_copy``, ``replay_routing``, ...) can be replaced on this module, as chapter 3 does to
record the loss's inputs: setting one here sets it in the module of :mod:`grpo_lab.training` that
calls it.
"""

from __future__ import annotations

import copy
import random
import sys
import time
import types
import warnings

import numpy as np
import pandas as pd
import torch

from ..algo import selection
from ..algo.advantages import GROUP_BASELINE_ESTIMATORS, VALUE_BASELINE_ESTIMATORS, AdvantageBatch
from ..algo.algorithms import Algorithm, get_algorithm
from ..policy.lora import AdapterDisabled
from ..policy.models import CriticModel, is_peft_model
from ..policy.moe import moe_routers
from ..tasks import validate_task
from . import checkpoints, collection, history, update, value_model
from .callbacks import call_hooks, check_callbacks, make_callbacks
from .checkpoints import Checkpointing
from .collection import Batch, Collection, Scored
from .config import TrainerConfig
from .dropout import disable_dropout
from .history import History
from .learning_signal import (NO_SIGNAL_STEPS, DynamicSamplingShortfallWarning, NoLearningSignalWarning, no_signal_step, no_signal_warning)
from .memory import peak_memory_mb, reset_peak_memory
from .adamw import build_adamw
from .precision import PRECISIONS, MixedPrecision, resolve_precision
from .update import Update
from .value_model import ValueModel, ValueTraining
from ..algo.checks import non_negative_int

# The functions the training modules call, importable (and replaceable, see _TrainerModule) from here as
# they were before the trainer was split; and two helpers other modules and tests import from here.
from ..policy.models import inference_copy  # noqa: F401
from ..policy.moe import record_routing, replay_routing, routing_changes  # noqa: F401
from ..algo.objectives import policy_loss, value_loss  # noqa: F401
from ..policy.rollout import evaluate, generate, policy_logprobs  # noqa: F401
from .checkpoints import _json_default  # noqa: F401
from .collection import _concat_rollouts  # noqa: F401

__all__ = ["TrainerConfig", "Trainer", "Batch", "Scored", "ValueModel", "peak_memory_mb", "reset_peak_memory",
           "MEASURED_COLUMNS", "PRECISIONS", "resolve_precision", "NoLearningSignalWarning",
           "DynamicSamplingShortfallWarning"]

#: The history columns that measure the machine rather than the run, namely wall times, throughput and
#: memory. They differ between two runs that are otherwise bit-identical (a resumed run, a run in another
#: process), so drop them before comparing histories.
MEASURED_COLUMNS = ("tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "peak_mem_mb")

#: The values of :attr:`TrainerConfig.precision` (defined in :mod:`grpo_lab.training.precision`).
PRECISIONS = PRECISIONS


class Trainer(Collection, Update, ValueTraining, History, Checkpointing, MixedPrecision):
    """GRPO-family trainer for a ``transformers`` causal LM, in stages.

    One :meth:`train` step runs :meth:`collect` (generate, score, select, shape),
    :meth:`compute_advantages` and :meth:`update` (epochs × minibatches × micro-batches), then logs
    one history row. Every algorithmic choice comes from ``algo``: advantages through
    :meth:`~grpo_lab.algo.algorithms.Algorithm.estimate_advantages`, the loss through
    :func:`~grpo_lab.algo.objectives.policy_loss`, selection, shaping and the loss mask through
    :mod:`grpo_lab.algo.selection`.

    Args:
        policy: the causal LM to train (updated in place; its dropout is set to 0 and it is put in train
            mode, see the module docstring).
        tokenizer: its tokenizer.
        task: a :class:`grpo_lab.tasks.base.Task`.
        algo: the :class:`grpo_lab.algo.algorithms.Algorithm`.
        config: a :class:`TrainerConfig`.
        ref_policy: the KL reference; default a frozen copy of ``policy`` at construction
            (only created when ``algo`` has a KL term). For a LoRA policy (a ``peft.PeftModel``,
            :mod:`grpo_lab.policy.lora`) the default is the policy with its adapters disabled, i.e. the
            frozen base model, without a second copy of its weights.
        value_model: optional critic (see :class:`ValueModel`): its values are computed at collect
            time and handed to the advantage estimator, its loss is minimised in the update by its
            own AdamW (``TrainerConfig.value_lr``), and it is saved and resumed with the trainer.
            Default: none, unless the algorithm's advantage estimator needs values
            (:data:`grpo_lab.algo.advantages.VALUE_BASELINE_ESTIMATORS`): then the critic named by
            ``TrainerConfig.value_init`` (:meth:`grpo_lab.policy.models.CriticModel.build`).
        callbacks: a list of callback objects of your own (:class:`grpo_lab.training.callbacks.TrainerCallback`:
            ``on_train_begin``, ``on_step``, ``on_evaluate``, ``on_save``, ``on_train_end``), called after the
            trackers of ``TrainerConfig.report_to``. They run whether or not the config has an ``output_dir``,
            cannot change the run's numbers (the random states are restored around each hook) and are not
            saved in checkpoints. The trainer keeps them all in its list ``callbacks`` (append to it
            after :meth:`resume`).

    Trackers: with ``TrainerConfig.output_dir`` set, the trainer builds the trackers ``TrainerConfig.report_to``
    names (:func:`grpo_lab.training.callbacks.make_callbacks`; by default ``"jsonl"``, ``output_dir/metrics.jsonl``);
    without one it builds none and writes nothing.

    A task with the protocol's optional ``bind_tokenizer`` is handed ``tokenizer`` when the trainer
    is built (:class:`grpo_lab.tasks.Task`).

    ``train(steps)`` returns the history DataFrame (one row per step); ``save(path)`` and
    ``Trainer.resume(path)`` checkpoint and continue exactly.

    Raises:
        TypeError: ``task`` does not implement the task protocol (:func:`grpo_lab.tasks.validate_task`
            names every missing or ill-typed member).
            Or the algorithm has ``ntp_coef > 0`` and the task no ``demonstration`` method.
            Or ``callbacks`` is not a list of callback objects (:func:`grpo_lab.training.callbacks.check_callbacks`).
        ImportError: ``TrainerConfig.report_to`` names a tracker whose package is not installed (with an
            ``output_dir``).
        ValueError: ``TrainerConfig.report_to`` names an unknown tracker; the algorithm's sampling choices
            do not fit the config (:func:`grpo_lab.algo.selection.check`);
            ``TrainerConfig.gradient_checkpointing=True`` with a policy that does not support it;
            ``TrainerConfig.routing_replay=True`` with a policy that has no Mixture-of-Experts
            layers (:func:`grpo_lab.policy.moe.moe_routers`), or whose routers lack ``norm_topk_prob``
            or differ in ``top_k``; ``TrainerConfig.save_every > 0`` without an ``output_dir``; a ``"linear"``
            or ``"cosine"`` ``TrainerConfig.lr_schedule`` without ``lr_schedule_steps``.

    Warns:
        RuntimeWarning: ``group_size=1`` with an advantage estimator whose baseline is the group
            (:data:`grpo_lab.algo.advantages.GROUP_BASELINE_ESTIMATORS`): every advantage would be 0.
    """

    def __init__(self, policy, tokenizer, task, algo: Algorithm, config: TrainerConfig | None = None,
                 *, ref_policy=None, value_model=None, callbacks=None):
        validate_task(task)  # cheap: attributes and signatures only, no call into the task (no RNG is touched)
        self.config = c = config or TrainerConfig()
        algo = _checked_algorithm(algo)
        #: the callbacks :meth:`train` and :meth:`save` call: the trackers of ``config.report_to``, then ``callbacks``
        self.callbacks: list = make_callbacks(c.report_to, c.output_dir) + check_callbacks(callbacks)
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
        self._init_precision()
        self._init_policy(policy)
        self._init_reference(policy, ref_policy)
        self.optimizer = build_adamw(self.policy, lr=c.lr, weight_decay=c.weight_decay, betas=tuple(c.betas))
        self._init_value_model(policy, value_model)
        self.step = 0
        self.opt_steps = 0
        self.rows: list[dict] = []
        self.max_new_tokens = c.max_new_tokens or task.max_new_tokens
        self._check_algorithm_fits()
        self._check_value_settings()
        self._check_checkpointing()
        self._warn_group_size()
        random.seed(c.seed)
        self.rng = np.random.default_rng(c.seed)
        torch.manual_seed(c.seed)

    def _init_precision(self) -> None:
        """The device type and the float16 gradient scaler of :attr:`precision`."""
        c = self.config
        self._device_type = torch.device(c.device).type
        self.scaler = torch.amp.GradScaler(self._device_type, enabled=self.precision == "float16")
        self.amp_skipped_steps = 0

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


    # ------------------------------------------------------------------ the stages and the loop
    def compute_advantages(self, batch: Batch) -> torch.Tensor:
        """The *advantages* stage: ``algo``'s estimator on the batch view (rewards, group ids, loss
        mask, values), on the training device; with values, also the critic's targets
        (``batch.returns``, :meth:`~grpo_lab.algo.algorithms.Algorithm.value_targets`)."""
        view = AdvantageBatch.from_groups(batch.rewards, self.config.group_size, mask=batch.loss_mask,
                                          values=batch.values)
        batch.advantages = self.algo.estimate_advantages(view).to(self.config.device)
        if batch.values is not None:
            batch.returns = self.algo.value_targets(view, batch.advantages).to(self.config.device)
        return batch.advantages

    def train(self, steps: int) -> pd.DataFrame:
        """Run ``steps`` more steps; returns the whole history.

        Columns: ``step``, ``reward``, ``accuracy`` (train samples, raw correctness),
        ``length``, ``length_correct``, ``length_incorrect`` (tokens incl. EOS; NaN when a step
        has no correct/incorrect sample), ``entropy`` (nats/token), then every metric of
        :func:`grpo_lab.algo.objectives.policy_loss` reduced over the step's updates as the metric
        says (:mod:`grpo_lab.algo.metrics`): ``loss``, ``pg_loss``, ``kl`` (NaN when the algorithm has
        no KL term: no reference model is kept), ``clip_frac_low``, ``clip_frac_high``,
        ``clip_frac``, ``ratio_mean/min/max``, ``ratio_q05/q50/q95``, ``grad_token_frac``,
        ``adv_abs_mean``, ...; ``grad_norm`` (before clipping), ``lr`` (the policy's learning rate in the
        step's last optimiser update, :attr:`TrainerConfig.lr_schedule`; NaN when the step made none), ``zero_adv_group_frac`` (tied
        groups, :func:`grpo_lab.algo.advantages.tied_groups`), ``truncation_rate``,
        ``reasoning_frac`` (tasks that define it), ``tokens_per_s`` (generated tokens / step wall
        time), ``gen_seconds``, ``step_seconds``, ``test_accuracy`` and ``test_length`` (greedy,
        NaN on steps without evaluation; the row of step ``k`` holds the evaluation *after* ``k``
        updates, step 0 the base policy), ``test_<name>`` for every entry of the task's optional
        ``test_metrics(frame) -> dict`` (and ``test_sampled_<name>`` with ``eval_sampled``) and of its optional
        ``model_metrics(model) -> dict`` (e.g. ``test_held_out_loss``), ``eval_seconds`` (wall time of that evaluation, not
        included in ``step_seconds``); then the sampling & shaping columns of
        :func:`grpo_lab.algo.selection.sampling_metrics` (``gen_rounds``, ``generated_groups``, ``selected_groups``, ``trained_groups``,
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

        Callbacks (the list ``callbacks``): ``on_train_begin`` first; each row, once complete (its evaluation
        merged in), goes to ``on_step`` (the step-0 row of the base policy's evaluation too), then, when
        the step evaluated, to ``on_evaluate`` with the evaluation's sample completions; ``on_train_end``
        last, also when a step raised.
        """
        c = self.config
        end = self.step + non_negative_int("train: steps", steps)
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
            while self.step < end:
                row, samples = self._train_step(), None
                self.step += 1
                row["step"] = self.step
                if c.eval_every and (self.step % c.eval_every == 0 or self.step == end):
                    evaluation, samples = self._evaluation()
                    row.update({k: v for k, v in evaluation.items() if k != "step"})
                self._log_row(row, samples)
                self._check_learning_signal()
                self._periodic_save(final=self.step == end)  # save_every: see Checkpointing
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{row['reward']:.2f}", len=f"{row['length']:.1f}")
        finally:
            if bar is not None:
                bar.close()
            self._notify("on_train_end")
        return self.history

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

    def _train_step(self) -> dict:
        reset_peak_memory(self.config.device)
        t0 = time.perf_counter()
        batch = self.collect()
        updates, grad_norms, entropies = [], [], []
        if batch.rollout is not None:
            self.compute_advantages(batch)
            updates, grad_norms, entropies = self.update(batch)
        return self._row(batch, updates, grad_norms, entropies, time.perf_counter() - t0)


def _checked_algorithm(algo) -> Algorithm:
    """``algo``, or the preset it names; ``ValueError`` when it is neither an :class:`Algorithm` nor a name."""
    algo = get_algorithm(algo) if isinstance(algo, str) else algo
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


#: The modules of :mod:`grpo_lab.training` whose functions can be replaced through this module.
_PATCHABLE = (collection, update, value_model, history, checkpoints)


class _TrainerModule(types.ModuleType):
    """``grpo_lab.training.trainer``'s module type: setting an attribute that is also a global of one of
    :data:`_PATCHABLE` (the same object, e.g. ``policy_loss`` imported by ``training.update``) sets it
    there too, so that ``monkeypatch.setattr(grpo_lab.training.trainer, "policy_loss", f)`` (and undoing it)
    reaches the code that calls it."""

    def __setattr__(self, name: str, value) -> None:
        missing = object()
        old = self.__dict__.get(name, missing)
        super().__setattr__(name, value)
        if old is missing:
            return
        for module in _PATCHABLE:
            if module.__dict__.get(name, missing) is old:
                setattr(module, name, value)


sys.modules[__name__].__class__ = _TrainerModule
