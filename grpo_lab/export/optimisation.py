"""The run's budget for an export, read from a :class:`~grpo_lab.trainer.TrainerConfig`, so that nothing is typed twice.

:func:`budget_from_config` returns the keyword arguments that :func:`~grpo_lab.export.translate`,
:func:`~grpo_lab.export.to_trl` and :func:`~grpo_lab.export.to_verl` take as ``**budget``
(:data:`~grpo_lab.export.BUDGET_KEYS`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["budget_from_config"]

#: TrainerConfig fields exported under the same budget key
_SAME_NAME = ("group_size", "prompts_per_step", "minibatches", "epochs", "lr", "weight_decay", "betas", "grad_clip",
              "warmup", "temperature", "max_new_tokens", "micro_batch_size")


def budget_from_config(config: Any, **extra: Any) -> dict:
    """The export budget of a trainer configuration.

    Args:
        config: a :class:`~grpo_lab.trainer.TrainerConfig`.
        **extra: further budget keys (``nnodes``, ``n_gpus_per_node``, ...), added as given; a key the config
            also sets raises.

    Returns:
        dict of budget keys (:data:`~grpo_lab.export.BUDGET_KEYS`) to python values; ``None`` fields of the
        config (``max_new_tokens``, ``micro_batch_size``) are left out. ``grad_clip`` is left out when it is 0
        (no clipping, which the budget cannot express: it needs a positive norm).

    Raises:
        TypeError: ``config`` is not a ``TrainerConfig``.
        ValueError: an ``extra`` key that the config already gives.
    """
    from ..training.config import TrainerConfig

    if not isinstance(config, TrainerConfig):
        raise TypeError(f"budget_from_config: expected a TrainerConfig, got {type(config).__name__}")
    budget = {name: getattr(config, name) for name in _SAME_NAME if getattr(config, name) is not None}
    if not budget.get("grad_clip"):
        budget.pop("grad_clip", None)
    budget["betas"] = tuple(budget["betas"])
    clash = sorted(set(extra) & set(budget))
    if clash:
        raise ValueError(f"budget_from_config: {clash} come from the TrainerConfig; change the config instead")
    return {**budget, **extra}
