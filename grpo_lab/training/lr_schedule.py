"""The policy's learning-rate schedule (``TrainerConfig.lr_schedule``): constant, linear or cosine decay after a
linear warm-up, through transformers' schedulers (:func:`transformers.get_scheduler`).

The trainer sets the learning rate by hand before every optimiser step (:func:`policy_lr`): update ``k``
(0-based, the trainer's ``opt_steps``, the optimiser steps actually taken) gets ``lr * f(k + 1)``, where ``f``
is the multiplier (``lr_lambda``) of transformers' scheduler of the same name built with ``num_warmup_steps =
warmup`` and ``num_training_steps = H + 1``, ``H`` the horizon in optimiser updates (:func:`schedule_updates`).

Why ``k + 1`` and ``H + 1`` rather than transformers' own convention (update ``k`` gets ``f(k)`` with
``num_training_steps = H``):

* the first update gets ``lr / warmup`` (with a warm-up) or ``lr``, not 0: an update at learning rate 0 is a
  wasted rollout in RL, where every update costs a generation. This is the warm-up this package always used
  (``min(1, (k + 1) / warmup)``, bit for bit: :func:`policy_lr` for ``"constant"`` equals it exactly), so runs
  without a schedule keep their numbers;
* the peak ``lr`` is reached at update ``warmup - 1`` (the ``warmup``-th update); without a warm-up a
  decaying schedule starts one position into its decay (``"linear"``: ``lr × H / (H + 1)``);
* counting ``H + 1`` training steps puts transformers' final point (multiplier 0) one update after the last
  one: the last update (``k = H - 1``) gets ``f(H) > 0``, ``lr / (H + 1 - warmup)`` for ``"linear"``, and the
  decay spans the whole run. Equivalently: our update ``k`` gets exactly what transformers' scheduler gives
  its step ``k + 1`` of a run of ``H + 1`` steps, whose step 0 (at multiplier 0) is dropped.

Updates beyond the horizon (a run longer than ``lr_schedule_steps``, or a resumed run continued) keep the last
value ``f(H)`` (the position is clamped), rather than transformers' 0 (linear) or a cosine rising again.

Only the policy's learning rate follows the schedule: a value model (critic) trains at its constant
``TrainerConfig.value_lr``.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

__all__ = ["LR_SCHEDULES", "lr_lambda", "schedule_updates", "policy_lr"]

#: ``TrainerConfig.lr_schedule`` values, each mapped to the name of transformers' scheduler that computes it
LR_SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


@functools.lru_cache(maxsize=64)
def lr_lambda(schedule: str, warmup: int, num_training_steps: int | None) -> Callable[[int], float]:
    """transformers' learning-rate multiplier ``f(step) -> float`` of one schedule.

    Built by :func:`transformers.get_scheduler` on a throw-away optimiser (the trainer's own optimiser is
    never handed to a scheduler) and read back as the ``LambdaLR``'s ``lr_lambdas[0]``.

    Args:
        schedule: a key of :data:`LR_SCHEDULES` (``"constant"``, ``"linear"``, ``"cosine"``).
        warmup: ``num_warmup_steps`` (optimiser steps, ``>= 0``).
        num_training_steps: transformers' ``num_training_steps`` (needed by ``"linear"`` and ``"cosine"``;
            ignored by ``"constant"``).

    Raises:
        ValueError: an unknown ``schedule`` (the message lists the known ones), or ``"linear"`` /
            ``"cosine"`` without ``num_training_steps``.
    """
    from transformers import get_scheduler

    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown lr_schedule {schedule!r}; known: {list(LR_SCHEDULES)}")
    if schedule != "constant" and num_training_steps is None:
        raise ValueError(f"lr_schedule={schedule!r} needs a horizon (num_training_steps)")
    dummy = torch.optim.SGD([torch.nn.Parameter(torch.zeros(()))], lr=1.0)
    kwargs = {} if schedule == "constant" else {"num_training_steps": int(num_training_steps)}
    scheduler = get_scheduler(LR_SCHEDULES[schedule], dummy, num_warmup_steps=int(warmup), **kwargs)
    return scheduler.lr_lambdas[0]


def schedule_updates(config) -> int | None:
    """The schedule's horizon in optimiser updates: ``lr_schedule_steps × epochs × minibatches`` (the updates a
    run of ``lr_schedule_steps`` RL steps makes when every step makes all of them); ``None`` when
    ``config.lr_schedule_steps`` is ``None``.

    An RL step can make fewer updates: with dynamic sampling a step may have fewer rows than ``minibatches``
    (fewer minibatches) or none (no update), and a float16 step whose gradients overflow is skipped. The
    schedule counts the updates actually made (the trainer's ``opt_steps``), so such a run ends before the end
    of its schedule, at a learning rate somewhat above the planned last one.

    Args:
        config: a :class:`~grpo_lab.trainer.TrainerConfig`.
    """
    steps = config.lr_schedule_steps
    return None if steps is None else int(steps) * config.epochs * config.minibatches


def policy_lr(config, opt_steps: int) -> float:
    """The policy's learning rate for update ``opt_steps`` (0-based): ``config.lr * f(min(opt_steps + 1, H))``
    with ``f = lr_lambda(config.lr_schedule, config.warmup, H + 1)`` and ``H = schedule_updates(config)`` (see
    the module docstring for this convention; ``"constant"`` has no horizon and equals
    ``lr * min(1, (opt_steps + 1) / warmup)``, or ``lr`` without warm-up, bit for bit).

    Args:
        config: a :class:`~grpo_lab.trainer.TrainerConfig` (``lr``, ``warmup``, ``lr_schedule``,
            ``lr_schedule_steps``, ``epochs``, ``minibatches``).
        opt_steps: optimiser updates made before this one (``>= 0``).

    Raises:
        ValueError: ``"linear"`` / ``"cosine"`` without ``lr_schedule_steps``.
    """
    horizon = schedule_updates(config)
    position = opt_steps + 1
    if config.lr_schedule == "constant":
        return config.lr * lr_lambda("constant", config.warmup, None)(position)
    if horizon is None:
        raise ValueError(f"TrainerConfig.lr_schedule={config.lr_schedule!r} needs lr_schedule_steps, the RL steps "
                         "its decay spans (experiments.run sets it to the run's steps)")
    return config.lr * lr_lambda(config.lr_schedule, config.warmup, horizon + 1)(min(position, horizon))
