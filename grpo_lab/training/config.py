"""How a run samples and updates: :class:`~grpo_lab.training.trainer.TrainerConfig` (everything that is not the
algorithm or the task)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields

import torch

from ..algo.checks import choice, flag, non_negative_int, positive_int, positive_number, real_number
from ..policy.logprobs import check_truncation
from .lr_schedule import LR_SCHEDULES
from .precision import PRECISIONS

__all__ = ["TrainerConfig", "OUTPUT_FIELDS", "field_help"]


def _f(default, help: str):
    """A dataclass field with ``default`` and its one-line ``help`` in the metadata."""
    return field(default=default, metadata={"help": help})


#: The :class:`~grpo_lab.training.trainer.TrainerConfig` fields that decide what a run shows and writes (its progress
#: bar, its output directory, its trackers, its periodic checkpoints), never its numbers: two runs that differ
#: only in these are the same run. They are left out of :meth:`~grpo_lab.training.trainer.TrainerConfig.run_identity`,
#: hence out of the run cache's key, the results file's ``config_hash`` and the check a resumed run makes.
OUTPUT_FIELDS = ("progress", "output_dir", "report_to", "save_every", "save_total_limit", "log_completions_every",
                 "metric_names")


@dataclass(frozen=True)
class TrainerConfig:
    """How a run samples and updates: everything that is not the algorithm or the task.

    Frozen; every value is checked when it is built (``ValueError`` naming the field). Each field's help is in its
    metadata (:func:`~grpo_lab.training.config.field_help`). :data:`~grpo_lab.training.config.OUTPUT_FIELDS` never change a run's numbers.
    """

    prompts_per_step: int = _f(16, "questions per rollout")
    group_size: int = _f(8, "G, responses per question (a rollout has prompts_per_step × G rows)")
    max_new_tokens: int | None = _f(None, "generation budget, tokens (None: the task's)")
    temperature: float = _f(1.0, "sampling temperature; log-probs are computed at the same temperature")
    top_p: float = _f(1.0, "nucleus sampling of the rollout, in (0, 1]: each token drawn from the smallest top set of "
                           "probability >= top_p (at the temperature); 1.0: off; evaluation ignores it")
    top_k: int = _f(0, "top-k sampling of the rollout: only the top_k most probable tokens (with ties); 0: off; "
                       "evaluation ignores it (Algorithm.keep_sampling_mask scores π_θ on the same kept set)")
    lr: float = _f(1e-4, "the policy's AdamW learning rate")
    weight_decay: float = _f(0.0, "decoupled weight decay, on weight matrices only (grpo_lab.training.adamw)")
    betas: tuple = _f((0.9, 0.99), "AdamW's (β1, β2)")
    grad_clip: float = _f(1.0, "largest global gradient norm (clipped above it; > 0)")
    warmup: int = _f(0, "optimiser steps of linear learning-rate warm-up: update k gets lr · k / warmup "
                        "(transformers' convention: the first at 0)")
    lr_schedule: str = _f("constant", "after the warm-up: 'constant', 'linear' or 'cosine' decay towards 0 over "
                                      "lr_schedule_steps (transformers' schedulers, grpo_lab.training.lr_schedule)")
    lr_schedule_steps: int | None = _f(None, "RL steps the decay spans (× epochs × minibatches optimiser updates); "
                                             "needed by 'linear' / 'cosine' (experiments.run sets it to the run's steps)")
    epochs: int = _f(1, "μ, passes over each rollout")
    minibatches: int = _f(1, "optimiser steps per pass, each on prompts_per_step / minibatches whole groups "
                                 "(must divide prompts_per_step; the groups, not the rows, are shuffled)")
    micro_batch_size: int | None = _f(None, "rows per forward/backward inside a minibatch (gradient accumulation with "
                                            "global normalisers; π_old / π_ref scored in the same micro-batches); "
                                            "None: the whole minibatch")
    sort_by_length: bool = _f(True, "cut micro-batches from a minibatch's rows in order of length (the same "
                                    "gradient, less padding)")
    old_logp: str = _f("recompute", "π_old: 'recompute' (the policy before the rollout's first update, a forward "
                                    "pass) or 'behaviour' (the sampler's log-probs)")
    rollout_dtype: str = _f("float32", "'float32' samples with the policy; 'bfloat16' / 'float16' with a copy in "
                                       "that dtype (grpo_lab.policy.models.inference_copy), as an inference engine")
    rollout_fp32_lm_head: bool = _f(False, "that low-precision copy's output head in float32 (MiniMax-M1, arXiv "
                                           "2506.13585, §3.2)")
    eval_every: int = _f(10, "greedy test accuracy every this many steps, before the first and after the last; "
                             "0: never")
    eval_sampled: bool = _f(False, "also the sampled test accuracy (temperature, one sample)")
    eval_batch_size: int = _f(256, "test problems per generate call of an evaluation (regrouping can flip a "
                                   "greedy near-tie)")
    seed: int = _f(0, "seeds python, numpy (prompt sampling) and torch (initial state, sampling)")
    device: str = _f("cpu", "the training device, 'cpu' / 'cuda'")
    threads: int | None = _f(None, "torch intra-op threads (None: left alone)")
    progress: bool | None = _f(None, "tqdm bar; None: only when stderr is a terminal and $CI is unset")
    max_gen_rounds: int = _f(8, "dynamic sampling (DAPO Eq. 11): at most this many generation rounds per step "
                                "(verl's max_num_gen_batches)")
    topup: bool = _f(True, "dynamic sampling: later rounds sample ceil(missing / keep rate) questions (the run's "
                           "keep rate); False: a whole prompts_per_step batch each (verl's DAPO recipe)")
    on_gen_rounds_exhausted: str = _f("warn", "too few mixed groups after max_gen_rounds: 'warn' (train on those "
                                              "collected, or skip the update) or 'error'")
    value_lr: float | None = _f(None, "the critic's learning rate (None: lr); VAPO §5.1 uses twice the actor's")
    routing_replay: bool = _f(False, "MoE policies: force π_old's experts whenever π_θ is scored on the same rollout "
                                     "(GSPO, arXiv 2507.18071, §5.3); needs old_logp='recompute'")
    value_init: str = _f("policy", "the critic built when the advantage estimator needs values: 'policy' (its "
                                   "backbone, zero head), 'scratch' or a saved critic's directory")
    value_warmup_steps: int = _f(0, "VAPO §4.1 value pretraining: steps of Trainer.pretrain_value before the first "
                                    "RL step (skipped when already pretrained)")
    precision: str = _f("float32", "autocast dtype of every forward: 'float32', 'bfloat16', 'float16' (with loss "
                                   "scaling) or 'auto' (resolve_precision); weights and optimiser stay float32")
    gradient_checkpointing: bool = _f(False, "recompute each layer's activations in the backward (less memory, one "
                                             "more forward); refused with routing_replay")
    output_dir: str | None = _f(None, "where the run writes (step log, trackers, periodic checkpoints); None: "
                                      "nothing is written")
    report_to: tuple = _f(("jsonl",), "trackers of each step's metrics: 'jsonl', 'tensorboard', 'wandb' "
                                      "(grpo_lab.training.callbacks); () for none; needs output_dir")
    save_every: int = _f(0, "a checkpoint under output_dir/checkpoints every this many steps and after the last; "
                            "0: never")
    save_total_limit: int | None = _f(2, "keep the newest this many periodic checkpoints (None: all)")
    log_completions_every: int = _f(0, "every this many steps, the step's trained completions with their rewards and "
                                       "advantages to every tracker (TRL's log_completions); 0: off")
    metric_names: str = _f("grpo_lab", "the names trackers log under: 'grpo_lab', 'trl' (TRL 1.16 GRPOTrainer's) or "
                                       "'verl' (verl 0.9.1's); the history keeps grpo_lab's")

    def __post_init__(self):
        for name in ("prompts_per_step", "group_size", "epochs", "minibatches", "max_gen_rounds", "eval_batch_size"):
            positive_int(f"TrainerConfig.{name}", getattr(self, name))
        positive_int("TrainerConfig.micro_batch_size", self.micro_batch_size, allow_none=True)
        positive_int("TrainerConfig.max_new_tokens", self.max_new_tokens, allow_none=True)
        self._check_lr_schedule()
        self._check_minibatches()
        choice("TrainerConfig.old_logp", self.old_logp, ("recompute", "behaviour"))
        top_p, top_k = check_truncation(self.top_p, self.top_k, "TrainerConfig.")
        object.__setattr__(self, "top_p", top_p)
        object.__setattr__(self, "top_k", top_k)
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

    def _check_minibatches(self) -> None:
        """``minibatches`` must divide ``prompts_per_step``: every minibatch holds whole groups (DAPO Eq. 12 and
        MiniMax-M1 Eq. 4 divide each group by its whole length); ``ValueError`` listing the valid choices."""
        if self.prompts_per_step % self.minibatches:
            divisors = [d for d in range(1, self.prompts_per_step + 1) if self.prompts_per_step % d == 0]
            raise ValueError(
                f"TrainerConfig: minibatches={self.minibatches} does not divide prompts_per_step="
                f"{self.prompts_per_step}: every minibatch holds whole groups (DAPO's and CISPO's loss divides "
                f"each group by its whole token count), so the groups must split evenly; choose minibatches among "
                f"{divisors}")

    def _check_lr_schedule(self) -> None:
        """Validate ``lr_schedule`` (a key of :data:`~grpo_lab.training.lr_schedule.LR_SCHEDULES`) and
        ``lr_schedule_steps`` (``None`` or a positive int, stored as a python int); ``ValueError`` naming the field."""
        choice("TrainerConfig.lr_schedule", self.lr_schedule, tuple(LR_SCHEDULES))
        positive_int("TrainerConfig.lr_schedule_steps", self.lr_schedule_steps, allow_none=True)
        if self.lr_schedule_steps is not None:
            object.__setattr__(self, "lr_schedule_steps", int(self.lr_schedule_steps))

    def _check_outputs(self) -> None:
        """Validate and normalise :data:`~grpo_lab.training.config.OUTPUT_FIELDS` (``ValueError`` naming the field)."""
        if self.output_dir is not None:
            if not isinstance(self.output_dir, (str, os.PathLike)) or not str(self.output_dir).strip():
                raise ValueError(f"TrainerConfig.output_dir must be a directory path or None, got {self.output_dir!r}")
            object.__setattr__(self, "output_dir", str(self.output_dir))
        report = (self.report_to,) if isinstance(self.report_to, str) else self.report_to
        if not isinstance(report, (tuple, list)) or not all(isinstance(r, str) and r for r in report):
            raise ValueError(f"TrainerConfig.report_to must be a list of tracker names, got {self.report_to!r}")
        object.__setattr__(self, "report_to", tuple(dict.fromkeys(report)))
        non_negative_int("TrainerConfig.save_every", self.save_every)
        non_negative_int("TrainerConfig.log_completions_every", self.log_completions_every)
        choice("TrainerConfig.metric_names", self.metric_names, ("grpo_lab", "trl", "verl"))
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


# the API reference lists every field with its help (one source: the field metadata above)
if TrainerConfig.__doc__:  # None under python -OO
    TrainerConfig.__doc__ += "\n    Attributes:\n" + "".join(f"        {f.name}: {f.metadata['help']}\n"
                                                        for f in fields(TrainerConfig))
TrainerConfig.__module__ = "grpo_lab.training.trainer"  # documented, pickled and imported as grpo_lab.training.trainer.TrainerConfig


def field_help(name: str) -> str:
    """The help of the :class:`~grpo_lab.training.trainer.TrainerConfig` field ``name`` (what, unit, paper reference).

    Raises:
        KeyError: ``name`` is not a field.
    """
    for f in fields(TrainerConfig):
        if f.name == name:
            return f.metadata["help"]
    raise KeyError(f"TrainerConfig has no field {name!r}")
