"""The value model (critic) of PPO-style algorithms: its slot (:class:`~grpo_lab.training.trainer.ValueModel`), its values at collect time
(:func:`critic_values`), VAPO's value pretraining (:func:`pretrain_value_step`, :func:`fit_value`) and the
advantage and critic columns of a history row (:func:`value_metrics`). The critic's loss in the update is in
:mod:`grpo_lab.training.update`.
"""

from __future__ import annotations

import warnings
from typing import Protocol

import numpy as np
import torch

from ..algo.advantages import VALUE_BASELINE_ESTIMATORS, explained_variance
from ..algo.algorithms import Algorithm
from ..algo.objectives import value_loss
from ..policy.rollout import Rollout
from .collection import Batch
from .config import TrainerConfig
from .precision import Precision

__all__ = ["ValueModel", "value_metrics", "check_value_settings", "critic_values", "pretrain_value_step", "fit_value"]


class ValueModel(Protocol):
    """The value-model slot of :class:`Trainer` (filled by PPO-style algorithms with a critic).

    ``values(rollout)`` returns float32 ``[B, T]`` value estimates V(s_t) of the completion tokens
    (0 on padding). The trainer calls it without grad at collect time (the values handed to the
    advantage estimator as ``AdvantageBatch.values``, and the ``old_values`` of the clipped value
    loss) and with grad in the update, where it minimises
    :func:`grpo_lab.algo.objectives.value_loss` against the algorithm's critic targets
    (:meth:`grpo_lab.algo.algorithms.Algorithm.value_targets`), normalised by the minibatch's global
    token count. It is an ``nn.Module`` (``parameters``, ``state_dict``, ``to``, ``eval``);
    :class:`grpo_lab.policy.models.CriticModel` is the package's.
    """

    def values(self, rollout: Rollout) -> torch.Tensor: ...


ValueModel.__module__ = "grpo_lab.training.trainer"  # documented under its public import path


def checked_values(v, part: Rollout, grad: bool = False) -> torch.Tensor:
    """``v`` if it is what :class:`ValueModel` promises for ``part``: a float ``[B, T]`` tensor (``T`` the
    rollout's completion width), with grad in the update; ``TypeError`` / ``ValueError`` naming the
    method otherwise."""
    B, T = part.completion_ids.shape
    if not isinstance(v, torch.Tensor) or not v.is_floating_point():
        raise TypeError(f"ValueModel.values(rollout) must return a float tensor [B, T] = [{B}, {T}], got "
                        f"{type(v).__name__ if not isinstance(v, torch.Tensor) else v.dtype}")
    if tuple(v.shape) != (B, T):
        raise ValueError(f"ValueModel.values(rollout) must return one value per completion token, shape [B, T] = "
                         f"[{B}, {T}], got {tuple(v.shape)}")
    if grad and not v.requires_grad:
        raise ValueError("ValueModel.values(rollout) returned a tensor without grad in the update: compute it from the "
                         "value model's parameters (no torch.no_grad or detach inside values)")
    return v


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of ``x`` over ``mask != 0`` (values elsewhere, NaN included, are ignored); NaN when empty."""
    keep = mask != 0
    n = float(keep.sum())
    return float(torch.where(keep, x.double(), 0.0).sum() / n) if n else float("nan")


def value_metrics(batch: Batch, gamma: float = 1.0) -> dict:
    """The advantage and critic columns of a history row (NaN when absent): ``adv_mean``, ``adv_std``
    (population), ``adv_min``, ``adv_max`` over the tokens of the loss (a per-sequence advantage
    counts once per token); with a critic, on the step's batch *before* its update,
    ``explained_variance`` of the critic's targets by the values
    (:func:`grpo_lab.algo.advantages.explained_variance`), ``explained_variance_mc`` of the Monte-Carlo
    returns (GAE at ``lam = 1``, discount ``gamma``: the same yardstick for every critic, whatever
    its targets), ``value_mean`` and ``return_mean`` (the critic's targets)."""
    from ..algo.advantages import gae, outcome_token_rewards

    nan = float("nan")
    out = dict.fromkeys(("adv_mean", "adv_std", "adv_min", "adv_max", "explained_variance", "explained_variance_mc",
                         "value_mean", "return_mean"), nan)
    if batch.advantages is None or batch.loss_mask is None:
        return out
    m = batch.loss_mask.to(batch.advantages.device) != 0
    a = batch.advantages if batch.advantages.dim() == 2 else batch.advantages[:, None].expand(m.shape)
    a = a[m].double()
    if a.numel():
        out.update(adv_mean=float(a.mean()), adv_std=float(a.std(unbiased=False)), adv_min=float(a.min()),
                   adv_max=float(a.max()))
    if batch.values is not None and batch.returns is not None:
        lm = batch.loss_mask.to(batch.values.device)
        mc = gae(outcome_token_rewards(batch.rewards, lm), batch.values, lm, gamma=gamma, lam=1.0)[1]
        out.update(explained_variance=explained_variance(batch.values, batch.returns, lm),
                   explained_variance_mc=explained_variance(batch.values, mc.to(batch.values.device), lm),
                   value_mean=masked_mean(batch.values, lm), return_mean=masked_mean(batch.returns, lm))
    return out


def check_value_settings(config: TrainerConfig, algo: Algorithm, value_model, max_new_tokens: int) -> None:
    """Refuse or flag value-model settings that would silently do nothing (called by ``Trainer.__init__``).

    Raises:
        ValueError: ``config.value_warmup_steps > 0`` and there is no ``value_model``.

    Warns:
        RuntimeWarning: ``value_init`` set without a critic; VAPO's length-adaptive λ below 0.5 at the budget.
    """
    c = config
    if value_model is None:
        if c.value_warmup_steps:
            raise ValueError(f"Trainer: TrainerConfig.value_warmup_steps={c.value_warmup_steps} but there is no value "
                             f"model to pretrain: {algo.name!r} uses the advantage estimator {algo.advantage!r}, "
                             "which needs none (use a value-based one such as 'gae', or pass value_model=)")
        if c.value_init != "policy":
            warnings.warn(f"Trainer: TrainerConfig.value_init={c.value_init!r} is ignored: {algo.name!r} builds no "
                          f"value model (its advantage estimator {algo.advantage!r} uses none)",
                          RuntimeWarning, stacklevel=3)
    if algo.advantage in VALUE_BASELINE_ESTIMATORS and algo.lam_alpha is not None:
        at_budget = 1.0 - 1.0 / (algo.lam_alpha * max_new_tokens)
        if at_budget < 0.5:
            warnings.warn(
                f"Trainer: {algo.name!r} uses the length-adaptive lambda 1 - 1/(lam_alpha * l) with lam_alpha="
                f"{algo.lam_alpha:g}, which is below 0.5 even at the generation budget of {max_new_tokens} "
                f"tokens (0 for every response of at most {1 / algo.lam_alpha:g} tokens: pure TD, the reward "
                "reaches only the last tokens). VAPO's alpha = 0.05 was sized for responses thousands of tokens "
                "long; size it for yours, e.g. lam_alpha = 1 / (0.05 * typical length) puts lambda = 0.95 at "
                "that length (--set lam_alpha=4 for the arithmetic task; chapter 6, section 6.4)",
                RuntimeWarning, stacklevel=3)


@torch.no_grad()
def critic_values(value_model, ro: Rollout, micro_batch_size: int | None, amp: Precision) -> torch.Tensor:
    """float32 ``[B, T]`` values of ``value_model`` on ``ro`` without grad, in micro-batches of
    ``micro_batch_size`` rows (all at once when ``None``), under ``amp``'s autocast."""
    micro = micro_batch_size or len(ro)
    out = torch.zeros(ro.completion_ids.shape, device=ro.completion_ids.device)
    for s in range(0, len(ro), micro):
        idx = torch.arange(s, min(s + micro, len(ro)))
        part = ro.select(idx)
        with amp.autocast():
            v = checked_values(value_model.values(part), part)
        out[idx, : v.shape[1]] = v.float()
    return out


def pretrain_value_step(batch: Batch, value_model, value_optimizer, config: TrainerConfig, algo: Algorithm,
                        rng: np.random.Generator, amp: Precision) -> dict:
    """One step of VAPO's (arXiv 2504.05118) §4.1 *Value-Pretraining* on a collected ``batch`` (its ``values``
    filled): the Monte-Carlo returns (GAE at ``lam = 1``, discount ``algo.gamma``) as targets, then
    :func:`fit_value`. Returns the row ``explained_variance``, ``value_mean``, ``return_mean`` (measured before
    the fit, so on samples the critic has not seen) and ``value_loss`` (the mean over the step's minibatches)."""
    from ..algo.advantages import gae, outcome_token_rewards

    m = batch.loss_mask
    returns = gae(outcome_token_rewards(batch.rewards, m), batch.values, m, gamma=algo.gamma,
                  lam=1.0)[1].to(config.device)
    row = {"explained_variance": explained_variance(batch.values, returns, m),
           "value_mean": masked_mean(batch.values, m), "return_mean": masked_mean(returns, m)}
    losses = fit_value(batch, returns, value_model, value_optimizer, config, rng, amp)
    row["value_loss"] = float(np.mean(losses)) if losses else float("nan")
    return row


def fit_value(batch: Batch, returns: torch.Tensor, value_model, value_optimizer, config: TrainerConfig,
              rng: np.random.Generator, amp: Precision) -> list[float]:
    """``config.minibatches`` optimiser steps of the critic towards ``returns`` (float32 ``[B, T]``) with the
    plain squared-error :func:`grpo_lab.algo.objectives.value_loss` (no clipping), the rows in a random order
    drawn from ``rng``; returns the loss of each step taken (minibatches without loss tokens are skipped)."""
    c, m = config, batch.loss_mask
    B = len(batch.rollout)
    n_mb = min(c.minibatches, B)
    bounds = [(k * B) // n_mb for k in range(n_mb + 1)]
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    order = torch.randperm(B, generator=gen)
    micro = c.micro_batch_size or B
    losses = []
    for k in range(n_mb):
        idx = order[bounds[k]:bounds[k + 1]]
        n_tok = float(m[idx].sum())
        if n_tok == 0:
            continue
        value_optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0
        for s0 in range(0, len(idx), micro):
            sub = idx[s0:s0 + micro]
            part = batch.rollout.select(sub)
            T = part.completion_ids.shape[1]
            with amp.autocast():
                v = value_model.values(part)[:, :T].float()
            loss = value_loss(v, batch.values[sub, :T], returns[sub, :T], m[sub, :T], clip_eps=None,
                              num_tokens=n_tok)
            amp.backward(loss)
            step_loss += float(loss.detach())
        _value_optimizer_step(value_model, value_optimizer, c.grad_clip, amp)
        losses.append(step_loss)
    return losses


def _value_optimizer_step(value_model, value_optimizer, grad_clip: float, amp: Precision) -> None:
    """Clip the critic's gradients and step its optimiser (value pretraining, where the policy does not
    move); under float16 through the gradient scaler, skipping a step whose gradients overflowed
    (counted in ``amp.skipped_steps``)."""
    scaler = amp.scaler
    if scaler.is_enabled():
        scaler.unscale_(value_optimizer)
    vgn = torch.nn.utils.clip_grad_norm_(value_model.parameters(), grad_clip)
    if scaler.is_enabled():
        if torch.isfinite(vgn):
            scaler.step(value_optimizer)
        else:  # float16 overflow: no step, a lower scale
            amp.skipped_steps += 1
        scaler.update()
    else:
        value_optimizer.step()
