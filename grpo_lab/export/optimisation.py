"""The optimisation half of an export: the run's budget read from a ``TrainerConfig``, and the optimiser,
learning-rate schedule and precision settings of TRL and verl that reproduce grpo_lab's.

:func:`budget_from_config` returns the ``**budget`` keyword arguments of
:func:`~grpo_lab.export.translation.translate` / ``to_trl`` / ``to_verl``
(:data:`~grpo_lab.export.translation.BUDGET_KEYS`); :func:`trl_optimisation` and
:func:`verl_optimisation` are each translation's optimisation part.

What is matched (TRL 1.16.0 with transformers' ``Trainer``; verl 0.9.1's FSDP engine):

* **schedule**: update ``k`` (0-based) gets ``lr * f(k)``, ``f`` transformers' multiplier
  (``constant_with_warmup`` / ``linear`` / ``cosine``) over ``H`` optimiser updates
  (:func:`horizon`), so a warm-up's first update has learning rate 0, as in both libraries. TRL:
  ``lr_scheduler_type`` (always written), ``warmup_steps``, ``max_steps = H``. verl:
  ``optim.lr_scheduler_type``, ``lr_warmup_steps`` (with ``lr_warmup_steps_ratio=0``),
  ``min_lr_ratio=0``, ``num_cycles=0.5``, ``zero_indexed_step=True``, ``trainer.total_training_steps``.
* **AdamW**: ``betas`` and ``weight_decay`` always written (the libraries' defaults differ from
  grpo_lab's); ``grad_clip`` is TRL's ``max_grad_norm``, verl's ``optim.clip_grad``.
* **precision**: grpo_lab autocasts to ``precision`` over float32 parameters, gradients and
  optimiser state; TRL ``bf16`` / ``fp16`` (always written: ``bf16`` defaults to True); verl
  ``fsdp_config.model_dtype=fp32`` and ``mixed_precision.param_dtype``.

Approximate (an issue each, one line): verl has no linear decay; verl steps its scheduler once per
RL step, not per update; verl's FSDP optimiser decays biases and norm weights
(:mod:`grpo_lab.training.adamw` does not); a 16-bit precision whose resolution near 1 (half its
``torch.finfo`` epsilon) is coarser than the clip range (``eps_low`` / ``eps_high``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import torch

from ..algo import checks as _v
from ..training.lr_schedule import LR_SCHEDULES

__all__ = ["budget_from_config", "EXPORT_PRECISIONS", "horizon", "precision_resolution", "check_optimisation",
           "trl_optimisation", "verl_optimisation"]

#: TrainerConfig fields exported under the same budget key
_SAME_NAME = ("group_size", "prompts_per_step", "minibatches", "epochs", "lr", "weight_decay", "betas", "grad_clip",
              "warmup", "lr_schedule", "lr_schedule_steps", "temperature", "max_new_tokens", "micro_batch_size")
#: budget ``precision`` values: grpo_lab's autocast dtypes (``"auto"`` resolved first) -> (TRL bf16, fp16, verl dtype)
EXPORT_PRECISIONS = {"float32": (False, False, "fp32"), "bfloat16": (True, False, "bf16"),
                     "float16": (False, True, "fp16")}
#: budget keys always exported; absent ones take TrainerConfig's default (the targets' defaults differ)
_ALWAYS = ("lr_schedule", "warmup", "betas", "weight_decay", "precision")
#: surrogates (Algorithm.surrogate) whose eps_low / eps_high are a clip range on the ratio
_CLIPPED = ("ppo", "cispo", "gmpo", "clip_cov")
#: verl's FSDP optimiser's scheduler names (``FSDPOptimizerConfig.lr_scheduler_type``)
_VERL_SCHEDULES = {"constant": "constant", "cosine": "cosine"}
_VERL_ACTOR = "actor_rollout_ref.actor."


def budget_from_config(config: Any, **extra: Any) -> dict:
    """The export budget of a trainer configuration.

    Args:
        config: a :class:`~grpo_lab.training.trainer.TrainerConfig`.
        **extra: further budget keys (``nnodes``, ``n_gpus_per_node``, ...), added as given; a key the config
            also sets raises.

    Returns:
        dict of budget keys (:data:`~grpo_lab.export.translation.BUDGET_KEYS`) to python values; ``None`` fields of the
        config (``max_new_tokens``, ``micro_batch_size``, ``lr_schedule_steps``) are left out. ``grad_clip`` is
        left out when it is 0. ``precision`` is the dtype the grpo_lab run computes in:
        ``"auto"`` is resolved for ``config.device`` (:func:`grpo_lab.training.trainer.resolve_precision`).
        The sampling side is always there: ``old_logp``, ``rollout_dtype``, ``top_p``, ``top_k``
        (:mod:`grpo_lab.export.sampling`).

    Raises:
        TypeError: ``config`` is not a ``TrainerConfig``.
        ValueError: an ``extra`` key that the config already gives.
    """
    from ..training.config import TrainerConfig
    from ..training.precision import resolve_precision

    if not isinstance(config, TrainerConfig):
        raise TypeError(f"budget_from_config: expected a TrainerConfig, got {type(config).__name__}")
    budget = {name: getattr(config, name) for name in _SAME_NAME if getattr(config, name) is not None}
    if not budget.get("grad_clip"):
        budget.pop("grad_clip", None)
    budget["betas"] = tuple(budget["betas"])
    budget["precision"] = resolve_precision(config.precision, config.device)
    for name, default in (("old_logp", "recompute"), ("rollout_dtype", "float32"), ("top_p", 1.0), ("top_k", 0)):
        budget[name] = getattr(config, name, default)  # the sampling side (grpo_lab.export.sampling)
    for name, default in (("value_lr", None), ("value_warmup_steps", 0), ("value_init", "policy")):
        if getattr(config, name, default) != default:
            budget[name] = getattr(config, name)  # the critic's settings (verl), when they differ from the default
    clash = sorted(set(extra) & set(budget))
    if clash:
        raise ValueError(f"budget_from_config: {clash} come from the TrainerConfig; change the config instead")
    return {**budget, **extra}


def check_optimisation(budget: dict, b: dict) -> None:
    """Validate the budget's schedule and precision keys into ``b`` and give each of ``lr_schedule``, ``warmup``,
    ``betas``, ``weight_decay`` and ``precision`` a value (TrainerConfig's default when the budget lacks it). Used
    by the export's budget check.

    Args:
        budget: the budget as given (dict of budget keys).
        b: the validated budget being built (dict, updated in place).

    Raises:
        ValueError: an unknown ``lr_schedule`` or ``precision`` (naming the known ones), a ``lr_schedule_steps``
            that is not a positive int, or a decaying schedule without ``lr_schedule_steps``.
    """
    from ..training.config import TrainerConfig

    if budget.get("lr_schedule") is not None:
        b["lr_schedule"] = _v.choice("lr_schedule", budget["lr_schedule"], tuple(LR_SCHEDULES))
    if budget.get("lr_schedule_steps") is not None:
        b["lr_schedule_steps"] = _v.positive_int("lr_schedule_steps", budget["lr_schedule_steps"])
    if budget.get("precision") is not None:
        if budget["precision"] == "auto":
            raise ValueError("precision='auto' depends on the device; pass the dtype the run computes in "
                             f"({list(EXPORT_PRECISIONS)}): budget_from_config resolves it for the config's device")
        b["precision"] = _v.choice("precision", budget["precision"], tuple(EXPORT_PRECISIONS))
    defaults = {f.name: f.default for f in dataclasses.fields(TrainerConfig)}
    for name in _ALWAYS:
        b.setdefault(name, tuple(defaults[name]) if name == "betas" else defaults[name])
    if b["lr_schedule"] != "constant" and "lr_schedule_steps" not in b:
        raise ValueError(f"lr_schedule={b['lr_schedule']!r} decays over a horizon: pass lr_schedule_steps= (the RL "
                         "steps it spans, TrainerConfig.lr_schedule_steps)")


def horizon(b: dict) -> Optional[int]:
    """The schedule's horizon ``H`` in optimiser updates, ``lr_schedule_steps x epochs x minibatches`` (as
    :func:`grpo_lab.training.lr_schedule.schedule_updates`), or None without ``lr_schedule_steps``.

    Args:
        b: a validated budget (dict).
    """
    if "lr_schedule_steps" not in b:
        return None
    return b["lr_schedule_steps"] * b.get("epochs", 1) * b.get("minibatches", 1)


def precision_resolution(precision: str) -> float:
    """The relative resolution of ``precision`` near 1: half its machine epsilon (``torch.finfo(dtype).eps / 2``,
    the largest relative rounding error): ``2^-8`` for bfloat16, ``2^-11`` for float16, ``2^-24`` for float32.

    Args:
        precision: a key of :data:`EXPORT_PRECISIONS`.

    Raises:
        ValueError: an unknown ``precision``.
    """
    _v.choice("precision", precision, tuple(EXPORT_PRECISIONS))
    return torch.finfo(getattr(torch, precision)).eps / 2


def _precision_issues(algo: Any, b: dict) -> list:
    """An approximate issue when ``b["precision"]`` cannot resolve the algorithm's clip range."""
    resolution = precision_resolution(b["precision"])
    if algo.surrogate not in _CLIPPED:
        return []
    fine = [(name, getattr(algo, name)) for name in ("eps_low", "eps_high") if 0 < getattr(algo, name) < resolution]
    if not fine:
        return []
    ranges = ", ".join(f"{name}={value:g}" for name, value in fine)
    return [dict(kind="approximate", axis="precision", budget_fix={"precision": "float32"},
                 message=f"precision={b['precision']!r} resolves ratios near 1 to {resolution:.2g} (2^"
                         f"{int(math.log2(resolution))} relative), coarser than {algo.name}'s clip range {ranges}: "
                         "log-probs and ratios in that range are rounding noise, so the clip acts on noise")]


def trl_optimisation(algo: Any, b: dict) -> tuple[dict, list, list]:
    """``GRPOConfig`` keyword arguments, notes and issues (as dicts of :class:`~grpo_lab.export.translation.Issue` fields) of
    the optimiser, schedule and precision of the validated budget ``b``.

    Args:
        algo: the :class:`~grpo_lab.algo.algorithms.Algorithm` (its clip range against the precision).
        b: the budget, validated by the export (``lr_schedule``, ``warmup``, ``betas``, ``weight_decay`` and
            ``precision`` always present).
    """
    bf16, fp16, _ = EXPORT_PRECISIONS[b["precision"]]
    kw = {"learning_rate": b["lr"]} if "lr" in b else {}
    kw.update(lr_scheduler_type=LR_SCHEDULES[b["lr_schedule"]], warmup_steps=b["warmup"], adam_beta1=b["betas"][0],
              adam_beta2=b["betas"][1], weight_decay=b["weight_decay"], bf16=bf16, fp16=fp16)
    if "grad_clip" in b:
        kw["max_grad_norm"] = b["grad_clip"]
    steps = horizon(b)
    if steps is not None:
        kw["max_steps"] = steps
    notes = [f"schedule: lr_scheduler_type={kw['lr_scheduler_type']!r}, warmup_steps={b['warmup']}"
             + (f", max_steps={steps} (H = lr_schedule_steps x epochs x minibatches optimiser updates, the run's "
                "length and the decay's num_training_steps)" if steps is not None else "")
             + ": update k gets lr * f(k), transformers' scheduler as grpo_lab's (exact)",
             f"AdamW: betas {b['betas']}, weight_decay {b['weight_decay']:g} on the same parameters as grpo_lab "
             "(transformers' Trainer.get_decay_parameter_names: not biases and norm weights) (exact)",
             f"precision {b['precision']}: bf16={bf16}, fp16={fp16}, transformers' autocast with float32 master "
             "weights, as grpo_lab; load the policy in float32 (GRPOConfig.model_init_kwargs={'dtype': 'float32'} "
             "if its checkpoint is stored in another dtype)"]
    return kw, notes, _precision_issues(algo, b)


def verl_optimisation(algo: Any, b: dict) -> tuple[dict, list, list]:
    """verl overrides (``{key: python value}``), notes and issues (as dicts of :class:`~grpo_lab.export.translation.Issue`
    fields) of the optimiser, schedule and precision of the validated budget ``b``.

    Args:
        algo: the :class:`~grpo_lab.algo.algorithms.Algorithm` (its clip range against the precision).
        b: the budget, validated by the export (``lr_schedule``, ``warmup``, ``betas``, ``weight_decay`` and
            ``precision`` always present).
    """
    o, issues = _VERL_ACTOR + "optim.", []
    schedule = _VERL_SCHEDULES.get(b["lr_schedule"], "cosine")
    ov = {o + "lr": b["lr"]} if "lr" in b else {}
    ov.update({o + "lr_scheduler_type": schedule, o + "lr_warmup_steps": b["warmup"], o + "lr_warmup_steps_ratio": 0.0,
               o + "min_lr_ratio": 0.0, o + "num_cycles": 0.5, o + "zero_indexed_step": True,
               o + "betas": list(b["betas"]), o + "weight_decay": b["weight_decay"]})
    if "grad_clip" in b:
        ov[o + "clip_grad"] = b["grad_clip"]
    if "lr_schedule_steps" in b:
        ov["trainer.total_training_steps"] = b["lr_schedule_steps"]
    _, _, dtype = EXPORT_PRECISIONS[b["precision"]]
    for role in ("actor", "ref"):
        ov[f"actor_rollout_ref.{role}.fsdp_config.model_dtype"] = "fp32"
        ov[f"++actor_rollout_ref.{role}.fsdp_config.mixed_precision.param_dtype"] = dtype
    issues += _verl_schedule_issues(b, schedule)
    if b["weight_decay"] > 0:
        issues.append(dict(kind="approximate", axis="weight_decay", budget_fix={"weight_decay": 0.0},
                           message=f"verl's FSDP optimiser decays every parameter (weight_decay={b['weight_decay']:g}), "
                                   "grpo_lab and TRL not the biases and norm weights"))
    notes = [f"schedule: optim.lr_scheduler_type={schedule!r} (verl's 'constant' is transformers' "
             "constant_with_warmup; warmup_style is deprecated and left unset), lr_warmup_steps with "
             "lr_warmup_steps_ratio=0, cosine with min_lr_ratio=0, num_cycles=0.5, zero_indexed_step=True: "
             "transformers' multiplier; trainer.total_training_steps is the horizon in RL steps",
             f"AdamW: optim.betas {list(b['betas'])}, optim.weight_decay {b['weight_decay']:g} (verl's defaults "
             "[0.9, 0.999] and 0.01 overridden)",
             f"precision {b['precision']}: fsdp_config.model_dtype=fp32 (float32 master weights), "
             f"mixed_precision.param_dtype={dtype} for actor and reference"]
    return ov, notes, issues + _precision_issues(algo, b)


def _verl_schedule_issues(b: dict, schedule: str) -> list:
    """verl's scheduler: no linear decay, and one step per RL step rather than per optimiser update."""
    out = []
    if schedule != b["lr_schedule"]:
        out.append(dict(kind="approximate", axis="lr_schedule", budget_fix={"lr_schedule": schedule},
                        message=f"verl's FSDP optimiser has no {b['lr_schedule']!r} schedule (lr_scheduler_type is "
                                f"'constant' or 'cosine'); exported as {schedule!r}, the same start and end, another "
                                "path in between"))
    updates = b.get("epochs", 1) * b.get("minibatches", 1)
    if updates > 1 and (b["warmup"] > 0 or b["lr_schedule"] != "constant"):
        out.append(dict(kind="approximate", axis="lr_schedule", budget_fix={"lr_schedule": "constant", "warmup": 0},
                        message=f"verl steps its scheduler once per RL step (after all {updates} optimiser updates of "
                                "epochs x minibatches), grpo_lab after every update: the warm-up and decay count RL "
                                "steps there, and the updates of one RL step share one learning rate"))
    return out
