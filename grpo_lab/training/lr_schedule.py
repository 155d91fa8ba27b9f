"""The policy's learning-rate schedule (``TrainerConfig.lr_schedule``): constant, linear or cosine decay after a
linear warm-up, through transformers' schedulers (:func:`transformers.get_scheduler`).

Before optimiser update ``k`` (0-based, the trainer's ``opt_steps``) the trainer sets the learning rate to
``lr * f(k)`` (:func:`policy_lr`), ``f`` the multiplier (``lr_lambda``) of transformers' scheduler of that name
with ``num_warmup_steps = warmup`` over a horizon of ``H`` updates (:func:`schedule_updates`). This is
transformers' convention, hence TRL's, OpenRLHF's and verl's, so a run exported with :mod:`grpo_lab.export`
trains at the same learning rate update for update: with a warm-up of ``W`` the first update gets 0 and the
full ``lr`` is reached at update ``W``; ``"linear"`` gives the last update (``k = H - 1``) ``lr / (H - warmup)``.

Departures: updates beyond the horizon keep ``f(H - 1)`` (the position is clamped) rather than transformers'
0 or a rising cosine. Only the policy follows the schedule; a critic trains at its constant ``value_lr``.
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
        config: a :class:`~grpo_lab.training.trainer.TrainerConfig`.
    """
    steps = config.lr_schedule_steps
    return None if steps is None else int(steps) * config.epochs * config.minibatches


def policy_lr(config, opt_steps: int) -> float:
    """The policy's learning rate for update ``opt_steps`` (0-based): ``config.lr * f(min(opt_steps, H - 1))``
    with ``f = lr_lambda(config.lr_schedule, config.warmup, H)`` and ``H = schedule_updates(config)``,
    transformers' convention (see the module docstring); ``"constant"`` has no horizon and is
    ``lr * min(1, opt_steps / warmup)``, ``lr`` without warm-up.

    Args:
        config: a :class:`~grpo_lab.training.trainer.TrainerConfig` (``lr``, ``warmup``, ``lr_schedule``,
            ``lr_schedule_steps``, ``epochs``, ``minibatches``).
        opt_steps: optimiser updates made before this one (``>= 0``).

    Returns:
        the learning rate (a python float, in the units of ``config.lr``).

    Raises:
        ValueError: ``"linear"`` / ``"cosine"`` without ``lr_schedule_steps``.
    """
    horizon = schedule_updates(config)
    if config.lr_schedule == "constant":
        return config.lr * lr_lambda("constant", config.warmup, None)(opt_steps)
    if horizon is None:
        raise ValueError(f"TrainerConfig.lr_schedule={config.lr_schedule!r} needs lr_schedule_steps, the RL steps "
                         "its decay spans (experiments.run sets it to the run's steps)")
    return config.lr * lr_lambda(config.lr_schedule, config.warmup, horizon)(min(opt_steps, horizon - 1))
