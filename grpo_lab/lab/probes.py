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
* :func:`~grpo_lab.lab.sampler_routing`: one rollout sampled by the trainer's low-precision sampler, the
  share of its activated experts the float32 learner no longer chooses, before and after ``k`` of the
  update's optimiser steps; ``benchmarks/moe_sampler_routing.py`` measures it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import pandas as pd

from ..algo.algorithms import Algorithm
from ..experiments.profiles import Profile

__all__ = ["pretrain_critic", "routing_update", "sampler_routing", "update_probe"]


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


def _completion_routing(model, rollout) -> "torch.Tensor":
    """long ``[n_layers, B, T, k]``: ``model``'s experts at the positions that predict the completion tokens
    (position ``P - 1 + t`` predicts token ``t``), from one teacher-forced forward over the rollout."""
    import torch

    from ..policy.moe import record_routing
    from ..policy.rollout import policy_logprobs

    P, T = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    with torch.no_grad(), record_routing(model) as rec:
        policy_logprobs(model, rollout)
    return rec.indices[:, :, P - 1:P - 1 + T]


def sampler_routing(trainer, after: tuple = (1, 4, 16)) -> dict:
    """Sampler-vs-learner routing of a Mixture-of-Experts policy: GSPO's share of activated experts that change
    (arXiv 2507.18071, §5.3), between the low-precision copy that sampled a rollout and the float32 learner.

    The trainer collects a rollout (sampled, as in training, by :func:`grpo_lab.policy.models.inference_copy` when
    ``config.rollout_dtype`` is low precision) and computes its advantages. A copy of the policy in the rollout
    dtype (the sampler's weights) and the same copy with a float32 output head each score the rollout
    teacher-forced, recording every MoE layer's experts (:func:`grpo_lab.policy.moe.record_routing`); so does the
    learner before the update and after each optimiser step listed in ``after`` of ``trainer.update``.

    Args:
        trainer: a :class:`grpo_lab.training.trainer.Trainer` whose policy has MoE layers and whose
            ``config.routing_replay`` is off; advance it past the learning-rate warm-up first to probe
            full-rate updates.
        after: optimiser steps of this rollout's update after which the learner is scored (steps beyond the
            update's ``epochs x minibatches`` are left out of the result); empty: no update.

    Returns:
        ``{"before": float, "before_by_layer": [float] * n_layers, "after": {k: float},
        "fp32_head_routing_differs": int, "activated": int, "updates": int}``: the share of the sampler's
        activated experts on real completion tokens (all layers; and per MoE layer) that the learner does not
        choose, before the update and after ``k`` optimiser steps (``0.0`` before the update when the rollout
        dtype is float32: sampler and learner are one model); the number of (layer, token, slot) entries where
        the float32-head copy routes otherwise than the plain copy (``0``: the head acts after the last MoE
        layer); the activated experts compared (all layers); the update's optimiser steps (``0`` and no update
        when ``after`` is empty: the trainer is left as it was, its rollout drawn).

    Raises:
        ValueError: the policy has no MoE layer, ``routing_replay`` is on (the learner's own routing would be
            replaced), or ``after`` holds a step below 1.
    """
    from ..policy.models import inference_copy
    from ..policy.moe import expert_changes, is_moe

    if not is_moe(trainer.policy):
        raise ValueError("sampler_routing: the policy has no Mixture-of-Experts layers")
    if trainer.config.routing_replay:
        raise ValueError("sampler_routing: TrainerConfig.routing_replay=True replaces the learner's routing; "
                         "probe with routing_replay=False")
    if any(int(k) < 1 for k in after):
        raise ValueError(f"sampler_routing: `after` counts optimiser steps >= 1, got {tuple(after)}")
    c = trainer.config
    batch = trainer.collect()
    trainer.compute_advantages(batch)
    ro = batch.rollout
    mask = batch.loss_mask[:, :ro.completion_ids.shape[1]].bool()
    sampler = trainer.policy if c.rollout_dtype == "float32" else inference_copy(trainer.policy, c.rollout_dtype)
    old = _completion_routing(sampler, ro)
    head = old if c.rollout_dtype == "float32" else _completion_routing(
        inference_copy(trainer.policy, c.rollout_dtype, fp32_lm_head=True), ro)
    del sampler
    learner = _completion_routing(trainer.policy, ro)
    before, activated = expert_changes(old, learner, mask)
    layers = [expert_changes(old[j:j + 1], learner[j:j + 1], mask) for j in range(old.shape[0])]
    out = {"before": before / max(activated, 1), "before_by_layer": [g / max(n, 1) for g, n in layers], "after": {},
           "fp32_head_routing_differs": int((head != old).sum()), "activated": activated, "updates": 0}
    if not after:
        return out
    snapshots, wanted = {}, {int(k) for k in after}

    def snapshot(optimizer, args, kwargs):
        n = len(snapshots_seen) + 1
        snapshots_seen.append(n)
        if n in wanted:
            snapshots[n] = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}

    snapshots_seen: list = []
    handle = trainer.optimizer.register_step_post_hook(snapshot)
    try:
        trainer.update(batch)
    finally:
        handle.remove()
    final = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
    shares = {}
    for k in sorted(snapshots):
        trainer.policy.load_state_dict(snapshots[k])
        shares[k] = expert_changes(old, _completion_routing(trainer.policy, ro), mask)[0] / max(activated, 1)
    trainer.policy.load_state_dict(final)
    return {**out, "after": shares, "updates": len(snapshots_seen)}
