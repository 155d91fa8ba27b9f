"""The value model (critic) of PPO-style algorithms: its slot, its values, its pretraining, its metrics.

:class:`~grpo_lab.training.trainer.ValueModel` is the protocol a critic implements. The mixin ``ValueTraining``
gives :class:`~grpo_lab.training.trainer.Trainer` the critic's values at collect time and
:meth:`~grpo_lab.training.trainer.Trainer.pretrain_value` (VAPO's value pretraining); ``value_metrics`` computes
the advantage and critic columns of a history row. The critic's loss in the update is in
:mod:`grpo_lab.training.update`.
"""

from __future__ import annotations

import time
import warnings
from typing import Protocol

import numpy as np
import pandas as pd
import torch

from ..algo.advantages import VALUE_BASELINE_ESTIMATORS, explained_variance
from ..algo.objectives import value_loss
from ..policy.rollout import Rollout
from ..algo.checks import non_negative_int
from .collection import Batch

__all__ = ["ValueModel"]


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


class ValueTraining:
    """The critic's part of :class:`grpo_lab.training.trainer.Trainer`: values without grad, value pretraining and
    the checks of the value settings. Reads ``config``, ``algo``, ``value_model``, ``value_optimizer``,
    ``value_warmup_rows``, ``max_new_tokens``, ``rng``, ``scaler``; calls ``collect``, ``_autocast`` and
    ``_backward``."""

    def _check_value_settings(self) -> None:
        """Refuse or flag value-model settings that would silently do nothing (see :meth:`__init__`)."""
        c, algo = self.config, self.algo
        if self.value_model is None:
            if c.value_warmup_steps:
                raise ValueError(f"Trainer: TrainerConfig.value_warmup_steps={c.value_warmup_steps} but there is no value "
                                 f"model to pretrain: {algo.name!r} uses the advantage estimator {algo.advantage!r}, "
                                 "which needs none (use a value-based one such as 'gae', or pass value_model=)")
            if c.value_init != "policy":
                warnings.warn(f"Trainer: TrainerConfig.value_init={c.value_init!r} is ignored: {algo.name!r} builds no "
                              f"value model (its advantage estimator {algo.advantage!r} uses none)",
                              RuntimeWarning, stacklevel=3)
        if algo.advantage in VALUE_BASELINE_ESTIMATORS and algo.lam_alpha is not None:
            at_budget = 1.0 - 1.0 / (algo.lam_alpha * self.max_new_tokens)
            if at_budget < 0.5:
                warnings.warn(
                    f"Trainer: {algo.name!r} uses the length-adaptive lambda 1 - 1/(lam_alpha * l) with lam_alpha="
                    f"{algo.lam_alpha:g}, which is below 0.5 even at the generation budget of {self.max_new_tokens} "
                    f"tokens (0 for every response of at most {1 / algo.lam_alpha:g} tokens: pure TD, the reward "
                    "reaches only the last tokens). VAPO's alpha = 0.05 was sized for responses thousands of tokens "
                    "long; size it for yours, e.g. lam_alpha = 1 / (0.05 * typical length) puts lambda = 0.95 at "
                    "that length (--set lam_alpha=4 for the arithmetic task; chapter 6, section 6.4)",
                    RuntimeWarning, stacklevel=3)

    @torch.no_grad()
    def _values(self, ro: Rollout) -> torch.Tensor:
        """float32 ``[B, T]`` critic values of ``ro`` without grad, in micro-batches."""
        c = self.config
        micro = c.micro_batch_size or len(ro)
        out = torch.zeros(ro.completion_ids.shape, device=ro.completion_ids.device)
        for s in range(0, len(ro), micro):
            idx = torch.arange(s, min(s + micro, len(ro)))
            part = ro.select(idx)
            with self._autocast():
                v = checked_values(self.value_model.values(part), part)
            out[idx, : v.shape[1]] = v.float()
        return out

    def pretrain_value(self, steps: int) -> pd.DataFrame:
        """VAPO (arXiv 2504.05118) §4.1 *Value-Pretraining*: fit the critic to Monte-Carlo returns
        of the current policy, which is not updated.

        Each step collects a batch as :meth:`collect` does (the same sampling, selection and reward
        shaping, so it uses the training RNGs), computes the targets with GAE at ``lam = 1`` (the
        Monte-Carlo returns ``sum_l gamma^l r_{t+l}``, whatever the critic predicts) and takes
        ``minibatches`` optimiser steps of the plain squared-error :func:`grpo_lab.algo.objectives.value_loss`
        (no clipping) with the critic's own optimiser. The paper pretrains "until the value loss
        and explained variance are good" and saves the critic for reuse; save it with
        ``trainer.value_model.save(path)`` and pass the path as ``TrainerConfig.value_init``.

        Returns:
            The warm-up history so far (also ``trainer.value_warmup_rows``), one row per step:
            ``value_step``, ``value_loss`` (the mean over the step's minibatches), and, measured on
            each step's fresh batch *before* the critic is fitted to it (so on samples it has not
            seen), ``explained_variance`` (:func:`grpo_lab.algo.advantages.explained_variance`),
            ``value_mean`` and ``return_mean`` (over real tokens), plus ``seconds``.

        Raises:
            ValueError: the trainer has no value model, or ``steps`` is negative.
        """
        from ..algo.advantages import gae, outcome_token_rewards

        if self.value_model is None:
            raise ValueError("Trainer.pretrain_value: the trainer has no value model (use an algorithm whose advantage "
                             "estimator needs values, e.g. 'gae', or pass value_model=)")
        c = self.config
        for _ in range(non_negative_int("pretrain_value: steps", steps)):
            t0 = time.perf_counter()
            batch = self.collect()
            if batch.rollout is None:
                continue
            m = batch.loss_mask
            returns = gae(outcome_token_rewards(batch.rewards, m), batch.values, m, gamma=self.algo.gamma,
                          lam=1.0)[1].to(c.device)
            row = {"value_step": len(self.value_warmup_rows) + 1,
                   "explained_variance": explained_variance(batch.values, returns, m),
                   "value_mean": masked_mean(batch.values, m), "return_mean": masked_mean(returns, m)}
            losses = self._fit_value(batch, returns)
            row["value_loss"] = float(np.mean(losses)) if losses else float("nan")
            row["seconds"] = time.perf_counter() - t0
            self.value_warmup_rows.append(row)
        return pd.DataFrame(self.value_warmup_rows)

    def _fit_value(self, batch, returns: torch.Tensor) -> list[float]:
        """One value-pretraining step on ``batch``: ``minibatches`` optimiser steps of the critic towards
        ``returns`` (float32 ``[B, T]``), in a random order drawn from the trainer's numpy RNG; returns the
        loss of each optimiser step taken (minibatches without loss tokens are skipped)."""
        c, m = self.config, batch.loss_mask
        B = len(batch.rollout)
        n_mb = min(c.minibatches, B)
        bounds = [(k * B) // n_mb for k in range(n_mb + 1)]
        gen = torch.Generator().manual_seed(int(self.rng.integers(2**62)))
        order = torch.randperm(B, generator=gen)
        micro = c.micro_batch_size or B
        losses = []
        for k in range(n_mb):
            idx = order[bounds[k]:bounds[k + 1]]
            n_tok = float(m[idx].sum())
            if n_tok == 0:
                continue
            self.value_optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for s0 in range(0, len(idx), micro):
                sub = idx[s0:s0 + micro]
                part = batch.rollout.select(sub)
                T = part.completion_ids.shape[1]
                with self._autocast():
                    v = self.value_model.values(part)[:, :T].float()
                loss = value_loss(v, batch.values[sub, :T], returns[sub, :T], m[sub, :T], clip_eps=None,
                                  num_tokens=n_tok)
                self._backward(loss)
                step_loss += float(loss.detach())
            self._value_optimizer_step()
            losses.append(step_loss)
        return losses

    def _value_optimizer_step(self) -> None:
        """Clip the critic's gradients and step its optimiser (value pretraining, where the policy does not
        move); under float16 through the gradient scaler, skipping a step whose gradients overflowed
        (counted in ``amp_skipped_steps``)."""
        c = self.config
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.value_optimizer)
        vgn = torch.nn.utils.clip_grad_norm_(self.value_model.parameters(), c.grad_clip)
        if self.scaler.is_enabled():
            if torch.isfinite(vgn):
                self.scaler.step(self.value_optimizer)
            else:  # float16 overflow: no step, a lower scale
                self.amp_skipped_steps += 1
            self.scaler.update()
        else:
            self.value_optimizer.step()
