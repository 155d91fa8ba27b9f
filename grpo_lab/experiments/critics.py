"""Value pretraining as a seeded run: one critic design, one seed, fitted to the frozen base policy's returns.

VAPO (arXiv 2504.05118) §4.1 pretrains the critic on Monte-Carlo returns of the fixed initial policy
before any policy update (:meth:`grpo_lab.trainer.Trainer.pretrain_value`). Chapter 6 compares two
critic designs that way over several seeds, in the worker processes of
:func:`grpo_lab.experiments.map_workers`: :func:`pretrain_critic` is the module-level function a
worker imports (a function defined in a notebook is not importable there).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import pandas as pd

from ..algorithms import Algorithm
from .profiles import Profile

__all__ = ["pretrain_critic"]


def pretrain_critic(job: tuple[int, str, Optional[str]], *, algo: Algorithm, profile: Profile, steps: int,
                    value_lr: float) -> pd.DataFrame:
    """Pretrain one critic from ``profile``'s base policy, as VAPO §4.1, and return its warm-up history.

    Args:
        job: ``(seed, value_init, save_to)``: the trainer's seed (its sampling and the new value head's
            initialisation), :attr:`~grpo_lab.training.config.TrainerConfig.value_init` (``"policy"``: a copy
            of the policy's backbone with a new scalar head; ``"scratch"``: a separate transformer at random
            initialisation) and a directory to save the pretrained critic in (``None``: not saved), which
            ``value_init=save_to`` reuses.
        algo: an algorithm whose advantage estimator needs a critic (e.g. VAPO).
        profile: the base checkpoint, task and trainer settings (``seed``, ``value_init``, ``value_lr``,
            ``eval_every`` and ``progress`` are replaced).
        steps: pretraining steps, each a fresh batch of ``prompts_per_step x group_size`` responses.
        value_lr: the critic's learning rate.

    Returns:
        :meth:`~grpo_lab.trainer.Trainer.pretrain_value`'s history (``value_step``, ``value_loss``,
        ``explained_variance`` measured on each step's batch before the fit, ``value_mean``,
        ``return_mean``, ``seconds``) with the columns ``seed``, ``init``, ``value_parameters`` and
        ``policy_parameters`` (parameter counts) added.

    Raises:
        ValueError: ``algo`` has no critic, ``steps`` is negative, or an unknown ``value_init``.
    """
    from ..models import count_parameters, load_policy
    from ..tasks import get_task
    from ..trainer import Trainer

    seed, init, save_to = job
    policy, tokenizer = load_policy(profile.base)
    cfg = dataclasses.replace(profile.config, seed=seed, value_init=init, value_lr=value_lr, eval_every=0,
                              progress=False)
    trainer = Trainer(policy, tokenizer, get_task(profile.task, **dict(profile.task_kwargs)), algo, cfg)
    history = trainer.pretrain_value(steps)
    if save_to is not None:
        trainer.value_model.save(save_to)
    return history.assign(seed=seed, init=init, value_parameters=count_parameters(trainer.value_model),
                          policy_parameters=count_parameters(trainer.policy))
