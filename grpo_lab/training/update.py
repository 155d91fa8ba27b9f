"""The *advantages* and *update* stages: advantages, π_old and π_ref log-probs, minibatches, micro-batches and
the optimiser steps, as functions of a :class:`Learner` (what the update reads and changes).

* :func:`compute_advantages`: the algorithm's estimator on the batch (and the critic's targets);
* :func:`plan_update`: the order of every epoch (whole groups shuffled with one draw from the numpy RNG, so
  every minibatch holds whole groups), the micro-batch layout of every epoch (minibatches, length-sorted
  with ``sort_by_length``, cut into micro-batches) and the no-grad π_old / π_ref log-probs scored in that
  layout, held by a :class:`RolloutUpdate`;
* :func:`run_update`: for each minibatch a :class:`Minibatch` (the whole-minibatch normalisers and, when
  the surrogate declares them (:func:`grpo_lab.algo.hparams.declare`, e.g. KL-Cov's covariance top-k), its
  whole-minibatch statistics), the forward and backward of each micro-batch (the policy forward with MoE
  routing record / replay, ``Learner.loss_fn``, the critic's loss), the next-token-prediction term and
  :func:`optimizer_step` (loss unscaling, clipping, the learning-rate schedule).

Every normaliser of the loss, and every statistic a surrogate declares, is a whole-minibatch quantity
of :class:`Minibatch`, so the gradient does not depend on ``TrainerConfig.micro_batch_size`` or
``sort_by_length`` (up to float rounding).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..algo import hparams
from ..algo.advantages import AdvantageBatch
from ..algo.algorithms import Algorithm
from ..algo.metrics import reduce_micro_batches, seq_mean, token_mean, total
from ..policy.moe import RoutingStore, record_routing, replay_routing, routing_changes
from ..algo.objectives import SURROGATES, batch_statistics, policy_loss, value_loss
from ..policy.rollout import Rollout, policy_logprobs
from .collection import Batch
from .config import TrainerConfig
from .lr_schedule import policy_lr
from .precision import Precision
from .value_model import checked_values

__all__ = ["Learner", "Minibatch", "RolloutUpdate", "UpdateResult", "compute_advantages", "plan_update", "run_update",
           "optimizer_step", "set_policy_lr", "group_token_counts", "logp_chunks", "declared_inputs"]


@dataclass
class RolloutUpdate:
    """One rollout's update in progress: what all its minibatches share.

    Attributes:
        batch: the :class:`~grpo_lab.training.trainer.Batch` trained on (its advantages filled in).
        orders: per epoch, ``[B]`` int64, the order in which the rows are cut into minibatches (groups kept
            whole and contiguous: ``_group_orders``).
        bounds: minibatch ``m`` of an epoch is ``order[bounds[m]:bounds[m + 1]]`` (multiples of ``group_size``).
        micro: rows per micro-batch.
        lengths: ``[B]`` real tokens per row (prompt and completion), what ``sort_by_length`` sorts by.
        layouts: per epoch, per minibatch, the micro-batches as ``[b]`` int64 row indices, in the order
            and with the companions the training forward will see (:func:`plan_update`).
        old_by_epoch: per epoch, the ``[B, T]`` float32 π_old log-probs scored in that epoch's layout (epochs
            with the same layout share one tensor), or ``None`` when the rollout feeds a single optimiser
            step (π_old = sg(π_θ) of each micro-batch's own forward). With ``old_logp="recompute"`` the rows
            of the first minibatch are written during its step.
        old_logp: the entry of ``old_by_epoch`` of the epoch being trained (set by :func:`run_update`).
        ref_logp: ``[B, T]`` float32 π_ref log-probs (scored in the first epoch's layout), or ``None`` when
            the algorithm has no KL term.
        routing: the rollout's :class:`~grpo_lab.policy.moe.RoutingStore` (Mixture-of-Experts policies whose
            rollout feeds several optimiser steps), or ``None``.
        entropies: ``(entropy sum, token count)`` of each first-epoch micro-batch, filled in as they run.
        n_updates: optimiser steps taken on this rollout so far.
    """

    batch: Batch
    orders: list
    bounds: list
    micro: int
    lengths: torch.Tensor
    layouts: list
    old_by_epoch: list | None
    ref_logp: torch.Tensor | None
    routing: RoutingStore | None
    old_logp: torch.Tensor | None = None
    entropies: list = field(default_factory=list)
    n_updates: int = 0


@dataclass
class Minibatch:
    """The rows of one optimiser step and the whole-minibatch quantities its micro-batches share.

    Computed once per minibatch, before it is cut into micro-batches, and handed to every
    micro-batch's :func:`grpo_lab.algo.objectives.policy_loss`: each micro-batch's loss is normalised by
    the same global quantities, so the summed gradient does not depend on how the minibatch is split.

    Attributes:
        rows: ``[n]`` int64 indices into the batch, in the order micro-batches are cut from them
            (by length with ``sort_by_length`` when there are several micro-batches).
        micro_batches: ``rows`` cut into the micro-batches the training forwards run on (``[b]`` int64 each).
        counts: the global normalisers, passed to ``policy_loss`` as keywords: ``num_tokens``,
            ``num_sequences``, ``num_correct_tokens`` and ``num_groups`` (floats).
        group_tokens: ``[B]`` float64, per row of the batch the loss-token count of its group within
            this minibatch (0 outside it), for the ``"group_token_mean"`` aggregation.
        stats: the whole-minibatch statistics of the algorithm's surrogate
            (:func:`grpo_lab.algo.objectives.batch_statistics`), ``{name: Tensor [B, ...]}`` indexed by the
            batch's rows (filled on this minibatch's rows); empty when the surrogate declares none.
        token_stats: the names of ``stats`` that are per token (``[B, T, ...]``: each micro-batch gets its rows
            and its tokens; the others only its rows).
        stat_metrics: the metrics the statistics emitted (``{name: float}``), added to the step's metrics.
    """

    rows: torch.Tensor
    counts: dict
    group_tokens: torch.Tensor
    stats: dict = field(default_factory=dict)
    micro_batches: list = field(default_factory=list)
    token_stats: set = field(default_factory=set)
    stat_metrics: dict = field(default_factory=dict)


@dataclass
class Learner:
    """What an update reads and changes: the models, their optimisers and the run's settings.

    ``Trainer`` owns these; it hands them to the update functions as one explicit argument.

    Attributes:
        policy: π_θ, trained in place (train mode, dropout off).
        optimizer: the policy's optimiser (its learning rate set before every step, :func:`optimizer_step`).
        algo: the :class:`~grpo_lab.algo.algorithms.Algorithm`.
        amp: the run's :class:`~grpo_lab.training.precision.Precision` (autocast, scaled backward).
        config, max_new_tokens: the run's :class:`~grpo_lab.training.trainer.TrainerConfig`, and the generation
            budget (the ``max_tokens`` of the loss's aggregation).
        loss_fn: the policy loss, :func:`grpo_lab.algo.objectives.policy_loss` or a callable of its signature
            returning its output (``Trainer(..., loss_fn=)``).
        ref_policy: the frozen KL reference, or ``None`` without a KL term.
        value_model, value_optimizer: the critic and its optimiser, or ``None``.
        moe_routers: the policy's Mixture-of-Experts routers (:func:`grpo_lab.policy.moe.moe_routers`).
        task, tokenizer: for the next-token-prediction term (``Algorithm.ntp_coef``).
        step: the training steps done before this update (for error messages).
    """

    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer
    algo: Algorithm
    config: TrainerConfig
    amp: Precision
    max_new_tokens: int
    loss_fn: Callable = policy_loss
    ref_policy: torch.nn.Module | None = None
    value_model: torch.nn.Module | None = None
    value_optimizer: torch.optim.Optimizer | None = None
    moe_routers: list = field(default_factory=list)
    task: object = None
    tokenizer: object = None
    step: int = 0


@dataclass
class UpdateResult:
    """What :func:`run_update` returns.

    Attributes:
        metrics: per optimiser step, the micro-batch-reduced loss metrics
            (:func:`grpo_lab.algo.metrics.reduce_micro_batches`).
        grad_norms: per optimiser step, the policy's gradient norm before clipping (NaN: a float16 step skipped).
        entropies: per first-epoch micro-batch, ``(entropy sum, token count)``.
        opt_steps: the optimiser steps taken over the run after this update (the learning-rate schedule's
            position).
    """

    metrics: list
    grad_norms: list
    entropies: list
    opt_steps: int


def compute_advantages(batch: Batch, algo: Algorithm, config: TrainerConfig) -> torch.Tensor:
    """The *advantages* stage: ``algo``'s estimator on the batch view (rewards, group ids, loss mask, values),
    written to ``batch.advantages`` (``[B]`` or ``[B, T]`` float32, on ``config.device``) and returned; with
    values, also the critic's targets ``batch.returns`` (:meth:`~grpo_lab.algo.algorithms.Algorithm.value_targets`)."""
    declared = algo.inputs()["advantage"]  # only what the estimator declares
    view = AdvantageBatch.from_groups(batch.rewards, config.group_size, mask=batch.loss_mask, values=batch.values,
                                      correct=batch.correct if "correct" in declared else None,
                                      raw_rewards=batch.raw if "raw_rewards" in declared else None)
    batch.advantages = algo.estimate_advantages(view).to(config.device)
    if batch.values is not None:
        batch.returns = algo.value_targets(view, batch.advantages).to(config.device)
    return batch.advantages


def plan_update(batch: Batch, learner: Learner, rng: np.random.Generator) -> RolloutUpdate:
    """The :class:`RolloutUpdate` of ``batch`` (its advantages filled): minibatch bounds, the row order of every
    epoch (a permutation of whole groups seeded by one draw from ``rng``: ``_group_orders``), the micro-batch
    layout of every epoch (``_layouts``), π_old and π_ref scored without grad in those layouts
    (``_reference_logps``) and an empty routing store for MoE policies (``_routing_store``)."""
    c, ro = learner.config, batch.rollout
    B = len(ro)
    orders, bounds = _group_orders(B, c.group_size, c.minibatches, c.epochs, int(rng.integers(2**62)))
    n_mb = len(bounds) - 1
    micro = c.micro_batch_size or (B // n_mb)
    lengths = ro.token_counts()
    layouts = _layouts(orders, bounds, micro, lengths, c.sort_by_length)
    store = _routing_store(ro, n_mb, learner.moe_routers, c)
    old_by_epoch, ref_logp = _reference_logps(ro, layouts, learner, routing=store)
    return RolloutUpdate(batch, orders, bounds, micro, lengths, layouts, old_by_epoch, ref_logp, store)


def run_update(run: RolloutUpdate, learner: Learner, rng: np.random.Generator, opt_steps: int) -> UpdateResult:
    """The optimiser steps of one planned rollout: ``epochs`` passes of ``minibatches`` optimiser steps, each
    summing ``micro_batch_size``-row micro-batches whose losses are normalised by the minibatch's global token
    and sequence counts (so the gradient does not depend on the split). ``rng``: the numpy RNG (the
    next-token-prediction term's demonstrations); ``opt_steps``: the optimiser steps taken so far."""
    result = UpdateResult([], [], run.entropies, opt_steps)
    for epoch, layout in enumerate(run.layouts):
        run.old_logp = run.old_by_epoch[epoch] if run.old_by_epoch is not None else None
        for m, micro_batches in enumerate(layout):
            mb = _minibatch(run, micro_batches, learner.config.group_size)
            if mb is None:  # every row of this minibatch was filtered out: nothing to learn
                continue
            metrics = _minibatch_backward(run, mb, learner, rng, first=epoch == 0 and m == 0, epoch=epoch)
            grad_norm, stepped = optimizer_step(learner, result.opt_steps)
            run.n_updates += 1
            result.opt_steps += stepped
            result.metrics.append(metrics)
            result.grad_norms.append(grad_norm)
    return result


def _group_orders(B: int, group_size: int, minibatches: int, epochs: int, seed: int) -> tuple[list, list]:
    """Per epoch the ``[B]`` int64 row order, and the minibatch bounds into it, such that every minibatch
    holds whole groups: the groups (rows ``k*G .. k*G+G-1``, as collect writes them) are shuffled, not the
    rows, so each response is normalised with its whole group (DAPO Eq. 12, MiniMax-M1 Eq. 4). Minibatch
    ``m`` holds groups ``m*K//n .. (m+1)*K//n - 1`` of the shuffled order (K groups, n = min(minibatches, K)
    minibatches): ``K/n`` each when n divides K (``TrainerConfig`` requires it of ``prompts_per_step``), else
    ``floor(K/n)`` or one more, which happens only when dynamic sampling fell short of a full batch.
    One minibatch: the rows in order, no shuffle."""
    K = B // group_size
    n_mb = min(minibatches, K)
    bounds = [(m * K) // n_mb * group_size for m in range(n_mb + 1)]
    gen = torch.Generator().manual_seed(seed)
    within = torch.arange(group_size)
    orders = [(torch.randperm(K, generator=gen)[:, None] * group_size + within).reshape(-1) if minibatches > 1
              else torch.arange(B) for _ in range(epochs)]
    return orders, bounds


def _layouts(orders: list, bounds: list, micro: int, lengths: torch.Tensor, sort_by_length: bool) -> list:
    """Per epoch, per minibatch, its micro-batches (``[b]`` int64 row indices): the minibatch's rows
    ``order[bounds[m]:bounds[m + 1]]``, sorted by ``lengths`` (stable) when they make several
    micro-batches and ``sort_by_length`` is on, cut every ``micro`` rows. What the training forwards
    will see, and so what π_old is scored in."""
    layouts = []
    for order in orders:
        epoch = []
        for m in range(len(bounds) - 1):
            idx = order[bounds[m]:bounds[m + 1]]
            if sort_by_length and micro < len(idx):
                idx = idx[torch.argsort(lengths[idx], stable=True)]
            epoch.append([idx[s:s + micro] for s in range(0, len(idx), micro)])
        layouts.append(epoch)
    return layouts


def _minibatch(run: RolloutUpdate, micro_batches: list, group_size: int) -> Minibatch | None:
    """The :class:`Minibatch` of the rows of ``micro_batches`` (one minibatch of ``_layouts``), with
    the minibatch's global counts; ``None`` when no row has a loss token."""
    batch = run.batch
    lm = batch.loss_mask  # [B, T]
    idx = torch.cat(micro_batches)  # [n] batch rows
    counts = dict(num_tokens=float(lm[idx].sum()), num_sequences=float((lm[idx].sum(-1) > 0).sum()),
                  num_correct_tokens=float(lm[idx][batch.correct[idx]].sum()))
    if counts["num_tokens"] == 0:
        return None
    group_tokens = group_token_counts(lm, idx, counts, group_size)
    return Minibatch(idx, counts, group_tokens, micro_batches=micro_batches)


def _minibatch_backward(run: RolloutUpdate, mb: Minibatch, learner: Learner, rng: np.random.Generator, *,
                        first: bool, epoch: int) -> dict:
    """Zero the gradients, then forward and backward of each micro-batch of ``mb`` (their metrics reduced by
    :func:`grpo_lab.algo.metrics.reduce_micro_batches`) and the next-token-prediction term; returns the
    metrics. ``first``: the rollout's first minibatch of its first epoch."""
    c, store, algo = learner.config, run.routing, learner.algo
    # The rollout's first optimiser step sees the weights that sampled it: π_old = sg(π_θ)
    # there, recorded into old_logp for later epochs (see _reference_logps).
    on_policy = first and c.old_logp == "recompute"
    # MoE: the on-policy forward routes as π_old (record it); later forwards score π_θ
    # (replay π_old's experts with routing_replay); the forward after the first update
    # measures how much routing moved (routing_change_frac).
    routing = None if store is None else "record" if on_policy else "replay" if c.routing_replay else None
    measure = store is not None and run.n_updates == 1
    if hparams.spec(SURROGATES[algo.surrogate]).batch_statistics:
        _minibatch_statistics(run, mb, learner, on_policy=on_policy, replay=routing == "replay")
    learner.optimizer.zero_grad(set_to_none=True)
    if learner.value_optimizer is not None:
        learner.value_optimizer.zero_grad(set_to_none=True)
    parts = [_micro_step(run, mb, sub, learner, on_policy=on_policy, routing=routing,
                         measure_routing=measure, entropies=run.entropies if epoch == 0 else None)
             for sub in mb.micro_batches]
    metrics = reduce_micro_batches(parts)
    metrics.update({k: seq_mean(v, 1.0) for k, v in mb.stat_metrics.items()})  # one value per minibatch
    if algo.ntp_coef > 0:  # the L_RL + ntp_coef L_NTP ablation (Algorithm.ntp_coef)
        metrics["ntp_loss"] = total(_ntp_backward(run.batch.rollout, mb.rows, learner, rng))
    return metrics


def _minibatch_statistics(run: RolloutUpdate, mb: Minibatch, learner: Learner, *, on_policy: bool,
                          replay: bool) -> None:
    """Fill ``mb.stats``, ``mb.token_stats`` and ``mb.stat_metrics``: the surrogate's whole-minibatch statistics (:func:`grpo_lab.algo.objectives.batch_statistics`) over the
    rows of ``mb``, indexed by batch row: π_θ scored without gradient at the current weights (in the
    micro-batches of the training forward, so the values are those the loss will see; with ``replay``
    π_old's MoE routing forced), π_old as the micro-batches will see it (``sg(π_θ)`` on an on-policy
    step), the advantages and the loss mask, with the rows in batch order (so a random draw or a tie in a
    top-k does not depend on the split either)."""
    batch = run.batch
    rows = torch.sort(mb.rows).values  # batch order, whatever the micro-batch order: the same draw or top-k
    B, T = batch.loss_mask.shape
    logp = torch.zeros(B, T, device=batch.loss_mask.device)
    ent = torch.zeros(B, T, device=batch.loss_mask.device)
    with torch.no_grad():
        for sub in mb.micro_batches:
            part = batch.rollout.select(sub)
            t = part.completion_ids.shape[1]
            lp, e, _ = _policy_forward(part, sub, batch.loss_mask[sub, :t], learner, run.routing,
                                       "replay" if replay else None, False)
            logp[sub, :t] = lp.float()  # [b, t] into [B, T]
            ent[sub, :t] = e.float()
    old = logp[rows] if on_policy or run.old_logp is None else run.old_logp[rows]
    inputs = declared_inputs(run, rows, T, learner, ent[rows])
    stats, mb.stat_metrics = batch_statistics(logp[rows], old, batch.advantages[rows].to(logp.device),
                                              batch.loss_mask[rows], learner.algo,
                                              group_tokens=mb.group_tokens[rows].to(logp.device), inputs=inputs,
                                              return_metrics=True)
    mb.stats, mb.token_stats = {}, set()
    for name, v in stats.items():  # [n, ...] in sorted rows -> [B, ...] by batch row
        mb.stats[name] = torch.zeros((B, *v.shape[1:]), dtype=v.dtype, device=v.device)
        mb.stats[name][rows] = v
        if v.dim() >= 2 and v.shape[1] == T:  # [n, T, ...]: per token
            mb.token_stats.add(name)


def declared_inputs(run: RolloutUpdate, sub: torch.Tensor, T: int, learner: Learner,
                    entropy: torch.Tensor | None) -> dict:
    """The inputs (:data:`grpo_lab.algo.hparams.INPUTS`) that the algorithm's loss functions declare, for the rows
    ``sub`` (``[b]`` int64) and the first ``T`` completion tokens, and only those: ``behaviour_logp`` (the
    rollout's), ``correct``, ``rewards`` (the training rewards), ``raw_rewards`` (the task's, before shaping),
    ``entropy`` (``entropy``: π_θ's of this
    forward), ``group_ids`` (row // G) and ``lengths`` (real completion tokens)."""
    batch, names = run.batch, learner.algo.inputs()["loss"]
    if not names:
        return {}
    ro = batch.rollout
    source = {
        "behaviour_logp": lambda: ro.behaviour_logp[sub, :T],
        "correct": lambda: batch.correct[sub],
        "rewards": lambda: batch.rewards[sub],
        "raw_rewards": lambda: batch.raw[sub],
        "entropy": lambda: entropy.detach(),
        "group_ids": lambda: sub // learner.config.group_size,
        "lengths": lambda: (ro.completion_mask[sub] != 0).sum(-1),
    }
    return {k: source[k]() for k in names}


def _micro_step(run: RolloutUpdate, mb: Minibatch, sub: torch.Tensor, learner: Learner, *, on_policy: bool = False,
                routing: str | None = None, measure_routing: bool = False, entropies: list | None = None) -> dict:
    """Forward and backward of the micro-batch of rows ``sub`` of the minibatch ``mb``; returns its loss
    metrics. ``on_policy`` (or ``run.old_logp is None``): π_old = sg(π_θ) of this forward, written into
    ``run.old_logp`` when there is one. ``entropies``: appended this micro-batch's
    ``(entropy sum, token count)``.

    MoE policies, with the rollout's routing store ``run.routing``: ``routing="record"`` writes this
    forward's experts into it (π_old's routing), ``"replay"`` forces the stored experts
    (:func:`grpo_lab.policy.moe.replay_routing`); ``measure_routing`` adds ``routing_change_frac``
    (the routers' own choices in this forward against the stored ones, on completion tokens).
    """
    batch = run.batch
    part = batch.rollout.select(sub)
    T = part.completion_ids.shape[1]  # this micro-batch's completion width (<= the batch's)
    mask = batch.loss_mask[sub, :T]  # [b, T]
    logp, ent, rec = _policy_forward(part, sub, mask, learner, run.routing, routing, measure_routing)
    if entropies is not None:
        entropies.append((float((ent * mask).sum()), float(mask.sum())))
    out = _policy_term(run, mb, sub, logp, mask, learner, on_policy, ent)
    metrics = dict(out.metrics)
    if measure_routing and rec is not None:
        metrics["routing_change_frac"] = _routing_change_frac(run.routing, part, sub, rec)
    if learner.value_model is not None:
        metrics["value_loss"] = total(_value_term(batch, part, sub, mask, mb.counts["num_tokens"], learner))
    return metrics


def _policy_forward(part: Rollout, sub: torch.Tensor, mask: torch.Tensor, learner: Learner,
                    store: RoutingStore | None, routing: str | None, measure_routing: bool):
    """π_θ's float32 ``[b, T]`` log-probs and entropies of the micro-batch ``part`` (the rows ``sub``, loss
    mask ``mask``), with grad, and the routing recorder (``None`` unless one was needed): with a routing
    ``store``, ``routing="replay"`` forces its experts, ``"record"`` writes this forward's into it,
    ``measure_routing`` records the routers' choices.

    Raises:
        RuntimeError: replay found a row of the loss without a recorded π_old routing (an internal error).
    """
    T = part.completion_ids.shape[1]
    P = part.prompt_ids.shape[1]
    ctx, rec = contextlib.nullcontext(), None
    if store is not None and routing == "replay":
        need = mask.sum(-1).cpu() > 0
        if not bool(store.recorded[torch.as_tensor(sub).cpu()][need].all()):
            raise RuntimeError("Trainer: routing replay found rows of the loss without a recorded π_old routing "
                               "(an internal error: every trained row is scored by π_old first)")
        ctx = replay_routing(learner.policy, store.get(sub, P, P + T))
    elif store is not None and (routing == "record" or measure_routing):
        ctx = record_routing(learner.policy)
    with ctx as rec, learner.amp.autocast():
        logp, ent = policy_logprobs(learner.policy, part, with_entropy=True, keep_mask=learner.algo.keep_sampling_mask)
    if routing == "record" and rec is not None:
        store.put(sub, rec.indices, P)
    return logp, ent, rec


def _policy_term(run: RolloutUpdate, mb: Minibatch, sub: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor,
                 learner: Learner, on_policy: bool, entropy: torch.Tensor | None = None):
    """``learner.loss_fn`` (:func:`grpo_lab.algo.objectives.policy_loss`) of one micro-batch (log-probs ``logp``
    and loss mask ``mask`` ``[b, T]`` of the rows ``sub``) with the minibatch's global normalisers, and its
    backward; returns the loss output. ``on_policy`` (or ``run.old_logp is None``): π_old = sg(``logp``),
    written into ``run.old_logp`` when there is one."""
    batch, T = run.batch, mask.shape[1]
    if on_policy or run.old_logp is None:
        old = logp.detach()  # [b, T]
        if run.old_logp is not None:
            run.old_logp[sub, :T] = old  # [B, T_batch] rows sub, trimmed to this micro-batch's width
    else:
        old = run.old_logp[sub, :T]  # [b, T]
    ref = run.ref_logp[sub, :T] if run.ref_logp is not None else None  # [b, T]
    adv = batch.advantages[sub] if batch.advantages.dim() == 1 else batch.advantages[sub, :T]  # [b] or [b, T]
    stats = {k: (v[sub, :T] if k in mb.token_stats else v[sub]) for k, v in mb.stats.items()} if mb.stats else None
    inputs = declared_inputs(run, sub, T, learner, entropy)
    extra = {"inputs": inputs} if inputs else {}  # a custom loss_fn of the old signature still works without inputs
    out = learner.loss_fn(logp, old, adv, mask, learner.algo, ref_logp=ref, max_tokens=learner.max_new_tokens,
                          group_tokens=mb.group_tokens[sub].to(logp.device),  # [b] float64
                          correct=batch.correct[sub].to(logp.device), stats=stats, **extra, **mb.counts)
    if learner.loss_fn is not policy_loss:
        _check_loss_output(out, learner.loss_fn)
    learner.amp.backward(out.loss)
    return out


def _check_loss_output(out, loss_fn) -> None:
    """A ``Trainer(loss_fn=...)``'s output must be :func:`grpo_lab.algo.objectives.policy_loss`'s: an object with a
    scalar ``loss`` that requires grad and a ``metrics`` dict (a ``LossOutput``); else a ``TypeError`` naming it."""
    name = getattr(loss_fn, "__name__", type(loss_fn).__name__)
    loss, metrics = getattr(out, "loss", None), getattr(out, "metrics", None)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not isinstance(metrics, dict):
        raise TypeError(f"Trainer(loss_fn={name}) returned {type(out).__name__}; it must return what policy_loss "
                        f"returns, a LossOutput(loss=<scalar tensor>, metrics=<dict>) (wrap policy_loss's output)")
    if not loss.requires_grad:
        raise TypeError(f"Trainer(loss_fn={name}): its loss does not require grad (it must be computed from logp)")


def _value_term(batch: Batch, part: Rollout, sub: torch.Tensor, mask: torch.Tensor, num_tokens: float,
                learner: Learner) -> float:
    """The critic's :func:`grpo_lab.algo.objectives.value_loss` on the micro-batch ``part`` (rows ``sub``, loss
    mask ``mask``), normalised by the minibatch's ``num_tokens``, and its backward; returns the loss."""
    T = part.completion_ids.shape[1]
    with learner.amp.autocast():
        values = checked_values(learner.value_model.values(part), part, grad=True)[:, :T].float()  # [b, T]
    vloss = value_loss(values, batch.values[sub, :T], batch.returns[sub, :T], mask,
                       clip_eps=learner.algo.value_clip_eps, num_tokens=num_tokens)
    learner.amp.backward(vloss)
    return float(vloss.detach())


def _routing_store(ro: Rollout, n_mb: int, routers: list, c: TrainerConfig) -> RoutingStore | None:
    """An empty :class:`~grpo_lab.policy.moe.RoutingStore` for ``ro`` when the policy is a MoE model (its
    ``routers``) whose π_old the trainer scores itself (``old_logp="recompute"``) and the rollout feeds more
    than one optimiser step; ``None`` otherwise (nothing to replay or compare)."""
    if not routers or c.old_logp != "recompute" or c.epochs * n_mb <= 1:
        return None
    ks = {r.top_k for _, r in routers}
    if len(ks) != 1:  # routers with different k: no common store (routing_replay is refused in __init__)
        return None
    return RoutingStore(len(routers), len(ro), ro.prompt_ids.shape[1], ro.completion_ids.shape[1],
                        ks.pop(), device=ro.completion_ids.device)


def _reference_logps(ro: Rollout, layouts: list, learner: Learner, routing: RoutingStore | None = None):
    """π_old log-probs per epoch and π_ref log-probs of the batch, scored without grad in the training layout.

    π_old: the sampler's log-probs (``old_logp="behaviour"``) for every epoch; ``None`` when the rollout
    feeds a single optimiser step (on-policy: ``sg(π_θ)`` per micro-batch); otherwise recomputed before
    the first update in exactly the micro-batches of ``_layouts`` (rows, order, padding), once per
    distinct epoch layout, so that on unchanged weights each row's π_old equals, bit for bit, its
    π_θ in the training forward that compares against it (under bfloat16 autocast a row's log-probs
    depend on the rows beside it). **Except** the first epoch's first minibatch: it is trained before any
    weight changes, so its π_old is ``sg(π_θ)`` of its own training forward; :func:`run_update` uses that
    (ratio exactly 1) and writes it into these rows (0 until then), which later epochs of the same
    layout read. With a ``routing`` store (MoE policies) the first epoch's π_old forward records the
    experts of every row it scores into it.

    π_ref: scored in the first epoch's micro-batches (so that the first update's KL is exactly 0); later
    epochs of another layout read these values.

    ``Algorithm.keep_sampling_mask``: π_old and π_ref are scored on the rollout's kept sets, as π_θ is. DeepSeek-V3.2
    (§3.1) names π_θ and π_old; π_ref is masked too, so that the KL compares two distributions over the same
    subset (unmasked, ``log π_ref - log π_θ`` would start at ``-log`` of π_ref's kept mass, not 0).

    Returns:
        ``(old_by_epoch, ref_logp)``: a list of ``epochs`` float32 ``[B, T]`` tensors (shared between
        epochs of the same layout) or ``None``, and a float32 ``[B, T]`` tensor or ``None``.
    """
    c, amp = learner.config, learner.amp
    keep = learner.algo.keep_sampling_mask  # π_old and π_ref on the sampler's kept sets, as π_θ
    n_updates = sum(len(epoch) for epoch in layouts)
    with torch.no_grad():
        if c.old_logp == "behaviour":
            old_by_epoch = [ro.behaviour_logp] * len(layouts)
        elif n_updates > 1:
            scored, old_by_epoch = {}, []
            for e, layout in enumerate(layouts):
                key = tuple(tuple(sub.tolist()) for mb in layout for sub in mb)
                if key not in scored:
                    chunks = [sub for m, mb in enumerate(layout) for sub in mb if e > 0 or m > 0]
                    scored[key] = logp_chunks(learner.policy, ro, chunks, amp, routing=routing if e == 0 else None,
                                              keep_mask=keep)
                old_by_epoch.append(scored[key])
        else:
            old_by_epoch = None
        ref_chunks = [sub for mb in layouts[0] for sub in mb]
        ref_logp = logp_chunks(learner.ref_policy, ro, ref_chunks, amp, keep_mask=keep) \
            if learner.ref_policy is not None else None
    return old_by_epoch, ref_logp


def group_token_counts(lm: torch.Tensor, idx: torch.Tensor, counts: dict, group_size: int) -> torch.Tensor:
    """Per row of the minibatch ``idx``, the loss-mask token count of its **whole** group ``Σ_{i in group} |o_i|``
    (0 outside the minibatch): ``[B]`` float64 from the ``[B, T]`` loss mask ``lm``; adds the number of groups
    the minibatch holds (with a loss token) to ``counts`` as ``num_groups``. Rows ``k*G .. k*G+G-1`` are group
    ``k`` (collect keeps whole groups, in order; G = ``group_size``); minibatches hold whole groups
    (``_group_orders``), and the count is the whole group's even for a fragment. For the ``"group_token_mean"``
    aggregation (DAPO Eq. 12, MiniMax-M1 Eq. 4). Raises ``ValueError`` when ``group_size`` does not divide B."""
    B = lm.shape[0]
    if B % group_size:
        raise ValueError(f"group_size={group_size} does not divide the rollout's {B} rows (groups must be whole)")
    per_group = lm.sum(-1).to(torch.float64).view(B // group_size, group_size).sum(-1)  # [K]
    gid = idx // group_size  # [n] group of each row
    counts["num_groups"] = float((per_group[torch.unique(gid)] > 0).sum())
    out = torch.zeros(B, dtype=torch.float64)
    out[idx] = per_group[gid]
    return out


@torch.no_grad()
def logp_chunks(model, ro: Rollout, chunks: list, amp: Precision, routing: RoutingStore | None = None,
                keep_mask: bool = False) -> torch.Tensor:
    """float32 ``[B, T]`` log-probs of ``model`` on the rows of ``ro`` that ``chunks`` (``[b]`` int64 row
    indices each) name, one no-grad forward per chunk under ``amp``'s autocast, the chunk's rows side by side
    in its order; 0 on the other rows. With a ``routing`` store (a MoE ``model``), the experts of every row
    scored are recorded into it. ``keep_mask``: on the rollout's top-p / top-k kept sets
    (:func:`~grpo_lab.policy.rollout.policy_logprobs`)."""
    B, T = len(ro), ro.completion_ids.shape[1]
    out = torch.zeros(B, T, device=ro.completion_ids.device)
    for idx in chunks:
        part = ro.select(idx)
        with (record_routing(model) if routing is not None else contextlib.nullcontext()) as rec, amp.autocast():
            lp = policy_logprobs(model, part, keep_mask=keep_mask)
        if rec is not None:
            routing.put(idx, rec.indices, part.prompt_ids.shape[1])
        out[idx, : lp.shape[1]] = lp
    return out


def _ntp_backward(ro: Rollout, idx: torch.Tensor, learner: Learner, rng: np.random.Generator) -> float:
    """Backward of ``ntp_coef`` times the next-token-prediction loss of the questions of the
    minibatch ``idx``: the mean NLL at temperature 1 of each question's demonstration
    (``task.demonstration(problem, rng)`` and EOS) given its prompt, each question once.
    Returns the loss (unweighted)."""
    seen, problems = set(), []
    for i in idx.tolist():
        p = ro.problems[i]
        if id(p) not in seen:
            seen.add(id(p))
            problems.append(p)
    demo = _demonstration_rollout(learner.tokenizer, learner.task, problems, rng, learner.config.device)
    with learner.amp.autocast():
        logp = policy_logprobs(learner.policy, demo, temperature=1.0)
    loss = -(logp * demo.completion_mask).sum() / demo.completion_mask.sum()
    learner.amp.backward(learner.algo.ntp_coef * loss)
    return float(loss.detach())


def optimizer_step(learner: Learner, opt_steps: int) -> tuple[float, bool]:
    """Unscale (float16), clip, set the policy's learning rate for update ``opt_steps`` (:func:`set_policy_lr`),
    step every optimiser. Returns the policy's gradient norm before clipping and whether the step was taken
    (a float16 step whose scaled gradients overflowed is skipped: NaN, ``False``, ``amp.skipped_steps`` + 1).

    Raises:
        FloatingPointError: a non-finite policy gradient norm outside float16 (the update is not applied).
    """
    c, amp, value_opt = learner.config, learner.amp, learner.value_optimizer
    scaler = amp.scaler
    if scaler.is_enabled():  # true gradients before clipping (GradScaler's recipe)
        scaler.unscale_(learner.optimizer)
        if value_opt is not None:
            scaler.unscale_(value_opt)
    gn = torch.nn.utils.clip_grad_norm_(learner.policy.parameters(), c.grad_clip)
    if scaler.is_enabled():
        vgn = (torch.nn.utils.clip_grad_norm_(learner.value_model.parameters(), c.grad_clip)
               if value_opt is not None else torch.zeros(()))
        if not (torch.isfinite(gn) and torch.isfinite(vgn)):
            # float16 overflow in the scaled gradients of the policy or the critic: neither optimiser
            # steps (GradScaler would skip only the one that overflowed), and update() lowers the
            # scale from the overflow that unscale_ recorded
            scaler.update()
            amp.skipped_steps += 1
            return float("nan"), False
    if not torch.isfinite(gn):
        algo = learner.algo
        raise FloatingPointError(
            f"Trainer: non-finite policy gradient norm ({float(gn)}) at step {learner.step + 1}; the update was "
            f"not applied. The loss of {algo.name!r} (surrogate {algo.surrogate!r}, aggregation "
            f"{algo.aggregation!r}) produced NaN/inf: check a custom registry function")
    set_policy_lr(learner.optimizer, c, opt_steps)
    if scaler.is_enabled():  # finite gradients, unscaled and clipped above
        scaler.step(learner.optimizer)
        if value_opt is not None:
            scaler.step(value_opt)
        scaler.update()
    else:
        learner.optimizer.step()
        if value_opt is not None:
            torch.nn.utils.clip_grad_norm_(learner.value_model.parameters(), c.grad_clip)
            value_opt.step()
    return float(gn), True


def set_policy_lr(optimizer: torch.optim.Optimizer, config: TrainerConfig, opt_steps: int) -> None:
    """Set the policy's learning rate for the next optimiser step: ``config.lr_schedule`` at update ``opt_steps``
    (:func:`grpo_lab.training.lr_schedule.policy_lr`: transformers' multiplier at ``opt_steps``, as TRL and verl;
    ``"constant"`` is ``lr * min(1, opt_steps / warmup)``). ``opt_steps`` is saved in checkpoints, so a resumed
    run continues its schedule. The value model's optimiser keeps its constant ``value_lr``."""
    lr = policy_lr(config, opt_steps)
    for group in optimizer.param_groups:
        group["lr"] = lr


def _routing_change_frac(store: RoutingStore, part: Rollout, sub: torch.Tensor, rec):
    """``routing_change_frac`` of one micro-batch: the fraction of its completion tokens' routing decisions
    (the experts recorded by ``rec`` in this forward) that differ from π_old's in ``store``
    (:func:`grpo_lab.policy.moe.routing_changes`), as a :func:`grpo_lab.algo.metrics.token_mean` weighted by the decisions
    compared (NaN when none)."""
    P, T = part.prompt_ids.shape[1], part.completion_ids.shape[1]
    real = torch.cat([torch.zeros_like(part.prompt_mask, dtype=torch.bool), part.completion_mask != 0], 1)
    changed, compared = routing_changes(store.get(sub, P, P + T), rec.indices, real)
    return token_mean(changed / compared if compared else float("nan"), compared)


def _demonstration_rollout(tokenizer, task, problems, rng: np.random.Generator, device) -> Rollout:
    """A teacher-forced batch of ``task.demonstration(problem, rng)`` + EOS after each prompt
    (prompts left-padded, demonstrations right-padded), for :attr:`Algorithm.ntp_coef`.

    Raises:
        TypeError: the task has no ``demonstration(problem, rng) -> str`` method.
    """
    demo_fn = getattr(task, "demonstration", None)
    if not callable(demo_fn):
        raise TypeError(f"Trainer: ntp_coef > 0 trains on the task's ground truth, but {type(task).__name__} has no "
                        "demonstration(problem, rng) -> str method")
    prompts = tokenizer([p.prompt for p in problems], add_special_tokens=False, padding=True, return_tensors="pt")
    demos = [tokenizer(demo_fn(p, rng), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
             for p in problems]
    T = max(len(d) for d in demos)
    comp = torch.full((len(demos), T), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(demos), T)
    for i, d in enumerate(demos):
        comp[i, :len(d)] = torch.tensor(d)
        mask[i, :len(d)] = 1.0
    return Rollout(prompt_ids=prompts["input_ids"].to(device), prompt_mask=prompts["attention_mask"].to(device),
                   completion_ids=comp.to(device), completion_mask=mask.to(device),
                   behaviour_logp=torch.zeros(len(demos), T, device=device),
                   truncated=torch.zeros(len(demos), dtype=torch.bool), texts=[""] * len(demos),
                   problems=list(problems), group_size=1, temperature=1.0)
