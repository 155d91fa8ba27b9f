"""Measurements a chapter takes once per seed, in the worker processes: each a module-level function of one
``job`` that :func:`grpo_lab.experiments.map_workers` can send to a worker (a function defined in a notebook
is not importable there).

* :func:`~grpo_lab.lab.pretrain_critic`: VAPO (arXiv 2504.05118) §4.1's value pretraining of
  one critic design from the frozen base policy (:meth:`grpo_lab.training.trainer.Trainer.pretrain_value`);
  chapter 6 §6.7 compares two designs over seeds.
* :func:`~grpo_lab.lab.update_probe`: one rollout and the trainer's update stage on it, with
  the token log-ratios between the updated policy and the one that sampled; chapter 4 §4.7 counts,
  per seed, where a token trust region and a sequence one disagree.
* :func:`~grpo_lab.lab.routing_update`: one more rollout of a trainer's MoE policy and its
  update, with every token's experts recorded before and after; chapter 4 §4.6 and
  ``benchmarks/moe_granularity.py`` measure routing drift with it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import pandas as pd

from ..algo.algorithms import Algorithm
from ..experiments.profiles import Profile

__all__ = ["pretrain_critic", "routing_update", "update_probe"]


def pretrain_critic(job: tuple[int, str, Optional[str]], *, algo: Algorithm, profile: Profile, steps: int,
                    value_lr: float) -> pd.DataFrame:
    """Pretrain one critic from ``profile``'s base policy, as VAPO §4.1, and return its warm-up history.

    Args:
        job: ``(seed, value_init, save_to)``: the trainer's seed (its sampling and the new value head's
            initialisation), the critic's design as ``TrainerConfig.value_init`` takes it (``"policy"``: a
            copy of the policy's backbone with a new scalar head; ``"scratch"``: a separate transformer at
            random initialisation) and a directory to save the pretrained critic in (``None``: not saved),
            which ``value_init=save_to`` reuses.
        algo: an algorithm whose advantage estimator needs a critic (e.g. VAPO).
        profile: the base checkpoint, task and trainer settings (``seed``, ``value_init``, ``value_lr``,
            ``eval_every`` and ``progress`` are replaced).
        steps: pretraining steps, each a fresh batch of ``prompts_per_step x group_size`` responses.
        value_lr: the critic's learning rate.

    Returns:
        :meth:`~grpo_lab.training.trainer.Trainer.pretrain_value`'s history (``value_step``, ``value_loss``,
        ``explained_variance`` measured on each step's batch before the fit, ``value_mean``,
        ``return_mean``, ``seconds``) with the columns ``seed``, ``init``, ``value_parameters`` and
        ``policy_parameters`` (parameter counts) added.

    Raises:
        ValueError: ``algo`` has no critic, ``steps`` is negative, or an unknown ``value_init``.
    """
    from ..policy.models import count_parameters, load_policy
    from ..tasks import get_task
    from ..training.trainer import Trainer

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


def update_probe(seed: int, *, algo: Algorithm, profile: Profile, prompts_per_step: int,
                 minibatches: int) -> dict:
    """One rollout of ``profile``'s base policy and the trainer's update stage on it; the token log-ratios.

    The trainer (seed ``seed``) collects ``prompts_per_step x group_size`` responses, computes ``algo``'s
    advantages and takes ``minibatches`` optimiser steps on them (:meth:`grpo_lab.training.trainer.Trainer.update`:
    the first on-policy, the others off-policy, as a training step's); the policy is then scored again on
    the same responses.

    Args:
        seed: the trainer's seed (sampling, minibatch order).
        algo: the algorithm whose advantages and loss the update uses.
        profile: the base checkpoint, task and trainer settings (``seed``, ``prompts_per_step``,
            ``minibatches``, ``eval_every`` and ``progress`` are replaced).
        prompts_per_step: questions in the rollout.
        minibatches: optimiser steps on the rollout.

    Returns:
        ``{"log_ratio": float64 [B, T] (log pi_new - log pi_old per completion token, 0 on padding),
        "mask": bool [B, T] (real completion tokens), "advantages": float64 [B]}`` (torch tensors, CPU),
        ``B = prompts_per_step x group_size``.
    """
    import torch

    from ..policy.models import load_policy
    from ..policy.rollout import policy_logprobs
    from ..tasks import get_task
    from ..training.trainer import Trainer

    policy, tokenizer = load_policy(profile.base)
    cfg = dataclasses.replace(profile.config, seed=seed, prompts_per_step=prompts_per_step, minibatches=minibatches,
                              eval_every=0, progress=False)
    trainer = Trainer(policy, tokenizer, get_task(profile.task, **dict(profile.task_kwargs)), algo, cfg)
    batch = trainer.collect()
    trainer.compute_advantages(batch)
    with torch.no_grad():
        before = policy_logprobs(trainer.policy, batch.rollout).double()
    trainer.update(batch)
    with torch.no_grad():
        after = policy_logprobs(trainer.policy, batch.rollout).double()
    mask = batch.loss_mask.bool()
    return {"log_ratio": torch.where(mask, after - before, torch.zeros_like(after)), "mask": mask,
            "advantages": batch.advantages.double()}


def routing_update(trainer) -> tuple:
    """One rollout of ``trainer`` and its update stage, with the experts of every token recorded under
    π_old and after the update (GSPO, arXiv 2507.18071, §5.3: the routing drift Routing Replay acts on).

    The trainer collects a rollout and computes its advantages; the policy scores it (no grad) while
    :func:`grpo_lab.policy.moe.record_routing` records each MoE layer's top-k experts; ``trainer.update``
    takes its optimiser steps on it; the policy scores it again, recording again.

    Args:
        trainer: a :class:`grpo_lab.training.trainer.Trainer` whose policy has MoE layers (e.g.
            ``arithmetic-moe-base``); advance it past the learning-rate warm-up first to probe
            full-rate updates.

    Returns:
        ``(batch, updates, (routing_old, logp_old), (routing_new, logp_new))``: the rollout's
        ``Batch``, ``trainer.update``'s per-update metrics, and
        for each side the routing record (``.indices``: long ``[layers, B, S, k]`` over the ``S``
        prompt + completion positions) and the completion log-probs (float64 ``[B, T]``).

    Raises:
        ValueError: the policy has no MoE layer (from :func:`~grpo_lab.policy.moe.record_routing`).
    """
    import torch

    from ..policy.moe import record_routing
    from ..policy.rollout import policy_logprobs

    batch = trainer.collect()
    trainer.compute_advantages(batch)
    with torch.no_grad(), record_routing(trainer.policy) as rec_old:
        logp_old = policy_logprobs(trainer.policy, batch.rollout).double()
    updates, _, _ = trainer.update(batch)
    with torch.no_grad(), record_routing(trainer.policy) as rec_new:
        logp_new = policy_logprobs(trainer.policy, batch.rollout).double()
    return batch, updates, (rec_old, logp_old), (rec_new, logp_new)
