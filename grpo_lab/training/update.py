"""The *update* stage: π_old and π_ref log-probs, minibatches, micro-batches and the optimiser step.

:meth:`~grpo_lab.training.trainer.Trainer.update` trains on one rollout for ``epochs`` passes of
``minibatches`` optimiser steps, in small steps (methods of the mixin ``Update``):

* ``_plan_update``: the row order of every epoch (one draw from the trainer's numpy RNG), the
  micro-batch layout of every epoch (``_layouts``: minibatches, length-sorted with ``sort_by_length``,
  cut into micro-batches) and the no-grad π_old / π_ref log-probs scored in that layout
  (``_reference_logps``), held by a :class:`RolloutUpdate`;
* ``_minibatch``: one optimiser step's micro-batches and the whole-minibatch quantities every
  micro-batch's loss shares, a :class:`Minibatch`, computed once before the micro-batches run;
* ``_minibatch_statistics``: when the algorithm's surrogate declares statistics over the whole
  minibatch (:func:`grpo_lab.algo.hparams.declare`, e.g. KL-Cov's covariance top-k), a forward without
  gradient over the minibatch and :func:`grpo_lab.algo.objectives.batch_statistics`, once, before the
  micro-batches; each micro-batch's loss gets its rows;
* ``_minibatch_step``: zero the gradients, forward and backward of each micro-batch
  (``_micro_step``: the policy forward with MoE routing record / replay, the policy loss, the
  critic's loss), the next-token-prediction term (``_ntp_backward``), the optimiser step
  (``_optimizer_step``: loss unscaling, clipping, learning-rate warm-up).

Every normaliser of the loss, and every statistic a surrogate declares, is a whole-minibatch quantity
of :class:`Minibatch`, so the gradient does not depend on ``TrainerConfig.micro_batch_size`` or
``sort_by_length`` (up to float rounding).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch

from ..algo import hparams
from ..algo.metrics import reduce_micro_batches, token_mean, total
from ..policy.moe import RoutingStore, record_routing, replay_routing, routing_changes
from ..algo.objectives import SURROGATES, batch_statistics, policy_loss, value_loss
from ..policy.rollout import Rollout, policy_logprobs
from .collection import Batch
from .lr_schedule import policy_lr
from .value_model import checked_values

__all__ = ["Minibatch", "RolloutUpdate"]


@dataclass
class RolloutUpdate:
    """One rollout's update in progress: what all its minibatches share.

    Attributes:
        batch: the :class:`~grpo_lab.training.trainer.Batch` trained on (its advantages filled in).
        orders: per epoch, ``[B]`` int64, the order in which the rows are cut into minibatches.
        bounds: minibatch ``m`` of an epoch is ``order[bounds[m]:bounds[m + 1]]``.
        micro: rows per micro-batch.
        lengths: ``[B]`` real tokens per row (prompt and completion), what ``sort_by_length`` sorts by.
        layouts: per epoch, per minibatch, the micro-batches as ``[b]`` int64 row indices, in the order
            and with the companions the training forward will see (``Update._layouts``).
        old_by_epoch: per epoch, the ``[B, T]`` float32 π_old log-probs scored in that epoch's layout (epochs
            with the same layout share one tensor), or ``None`` when the rollout feeds a single optimiser
            step (π_old = sg(π_θ) of each micro-batch's own forward). With ``old_logp="recompute"`` the rows
            of the first minibatch are written during its step.
        old_logp: the entry of ``old_by_epoch`` of the epoch being trained (set by :meth:`~grpo_lab.training.trainer.Trainer.update`).
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
            (:func:`grpo_lab.algo.objectives.batch_statistics`), ``{name: Tensor [B] or [B, T]}`` indexed by the
            batch's rows (filled on this minibatch's rows); empty when the surrogate declares none.
    """

    rows: torch.Tensor
    counts: dict
    group_tokens: torch.Tensor
    stats: dict = field(default_factory=dict)
    micro_batches: list = field(default_factory=list)


class Update:
    """The *update* stage of :class:`grpo_lab.training.trainer.Trainer`. Reads ``config``, ``algo``, ``policy``,
    ``ref_policy``, ``uses_kl``, ``value_model``, ``optimizer``, ``value_optimizer``, ``scaler``,
    ``moe_routers``, ``rng``, ``task``, ``tokenizer``, ``max_new_tokens``, ``step`` and
    ``opt_steps``; calls ``_autocast`` and ``_backward``."""

    def update(self, batch: Batch) -> tuple[list[dict], list[float], list[tuple[float, float]]]:
        """The *update* stage: ``epochs`` passes of ``minibatches`` optimiser steps, each summing
        ``micro_batch_size``-row micro-batches whose losses are normalised by the minibatch's
        global token and sequence counts (so the gradient does not depend on the split).

        Returns:
            ``(metrics, grad_norms, entropies)``: per optimiser step the micro-batch-reduced
            metrics (:func:`grpo_lab.algo.metrics.reduce_micro_batches`) and the gradient norm before
            clipping; per first-epoch micro-batch ``(entropy sum, token count)``.
        """
        run = self._plan_update(batch)
        step_metrics, grad_norms = [], []
        for epoch, layout in enumerate(run.layouts):
            run.old_logp = run.old_by_epoch[epoch] if run.old_by_epoch is not None else None
            for m, micro_batches in enumerate(layout):
                mb = self._minibatch(run, micro_batches)
                if mb is None:  # every row of this minibatch was filtered out: nothing to learn
                    continue
                metrics, grad_norm = self._minibatch_step(run, mb, first=epoch == 0 and m == 0, epoch=epoch)
                step_metrics.append(metrics)
                grad_norms.append(grad_norm)
        return step_metrics, grad_norms, run.entropies

    def _plan_update(self, batch: Batch) -> RolloutUpdate:
        """The :class:`RolloutUpdate` of ``batch``: minibatch bounds, the row order of every epoch (a
        permutation seeded by one draw from the trainer's numpy RNG), the micro-batch layout of every epoch
        (:meth:`_layouts`), π_old and π_ref scored without grad in those layouts (:meth:`_reference_logps`)
        and an empty routing store for MoE policies (:meth:`_routing_store`)."""
        c, ro = self.config, batch.rollout
        B = len(ro)
        n_mb = min(c.minibatches, B)  # fewer rows than configured only when dynamic sampling fell short
        bounds = [(m * B) // n_mb for m in range(n_mb + 1)]  # = m * B / minibatches when it divides
        micro = c.micro_batch_size or (B // n_mb)
        gen = torch.Generator().manual_seed(int(self.rng.integers(2**62)))
        orders = [torch.randperm(B, generator=gen) if c.minibatches > 1 else torch.arange(B) for _ in range(c.epochs)]
        lengths = ro.token_counts()
        layouts = self._layouts(orders, bounds, micro, lengths)
        store = self._routing_store(ro, n_mb)
        old_by_epoch, ref_logp = self._reference_logps(ro, layouts, routing=store)
        return RolloutUpdate(batch, orders, bounds, micro, lengths, layouts, old_by_epoch, ref_logp, store)

    def _layouts(self, orders: list, bounds: list, micro: int, lengths: torch.Tensor) -> list:
        """Per epoch, per minibatch, its micro-batches (``[b]`` int64 row indices): the minibatch's rows
        ``order[bounds[m]:bounds[m + 1]]``, sorted by ``lengths`` (stable) when they make several
        micro-batches and ``sort_by_length`` is on, cut every ``micro`` rows. What the training forwards
        will see, and so what π_old is scored in."""
        layouts = []
        for order in orders:
            epoch = []
            for m in range(len(bounds) - 1):
                idx = order[bounds[m]:bounds[m + 1]]
                if self.config.sort_by_length and micro < len(idx):
                    idx = idx[torch.argsort(lengths[idx], stable=True)]
                epoch.append([idx[s:s + micro] for s in range(0, len(idx), micro)])
            layouts.append(epoch)
        return layouts

    def _minibatch(self, run: RolloutUpdate, micro_batches: list) -> Minibatch | None:
        """The :class:`Minibatch` of the rows of ``micro_batches`` (one minibatch of :meth:`_layouts`), with
        the minibatch's global counts; ``None`` when no row has a loss token."""
        batch = run.batch
        lm = batch.loss_mask
        idx = torch.cat(micro_batches)
        counts = dict(num_tokens=float(lm[idx].sum()), num_sequences=float((lm[idx].sum(-1) > 0).sum()),
                      num_correct_tokens=float(lm[idx][batch.correct[idx]].sum()))
        if counts["num_tokens"] == 0:
            return None
        group_tokens = self._group_tokens(lm, idx, counts)
        return Minibatch(idx, counts, group_tokens, micro_batches=micro_batches)

    def _minibatch_step(self, run: RolloutUpdate, mb: Minibatch, *, first: bool, epoch: int) -> tuple[dict, float]:
        """One optimiser step on ``mb``: zero the gradients, forward and backward of each micro-batch (their
        metrics reduced by :func:`grpo_lab.algo.metrics.reduce_micro_batches`), the next-token-prediction term,
        the optimiser step. ``first``: the rollout's first minibatch of its first epoch. Returns the
        metrics and the policy's gradient norm before clipping."""
        c, store = self.config, run.routing
        # The rollout's first optimiser step sees the weights that sampled it: π_old = sg(π_θ)
        # there, recorded into old_logp for later epochs (see _reference_logps).
        on_policy = first and c.old_logp == "recompute"
        # MoE: the on-policy forward routes as π_old (record it); later forwards score π_θ
        # (replay π_old's experts with routing_replay); the forward after the first update
        # measures how much routing moved (routing_change_frac).
        routing = None if store is None else "record" if on_policy else "replay" if c.routing_replay else None
        measure = store is not None and run.n_updates == 1
        if hparams.spec(SURROGATES[self.algo.surrogate]).batch_statistics:
            mb.stats = self._minibatch_statistics(run, mb, on_policy=on_policy, replay=routing == "replay")
        self._zero_grad()
        parts = [self._micro_step(run, mb, sub, on_policy=on_policy, routing=routing,
                                  measure_routing=measure, entropies=run.entropies if epoch == 0 else None)
                 for sub in mb.micro_batches]
        metrics = reduce_micro_batches(parts)
        if self.algo.ntp_coef > 0:  # the L_RL + ntp_coef L_NTP ablation (Algorithm.ntp_coef)
            metrics["ntp_loss"] = total(self._ntp_backward(run.batch.rollout, mb.rows))
        grad_norm = self._optimizer_step()
        run.n_updates += 1
        return metrics, grad_norm

    def _minibatch_statistics(self, run: RolloutUpdate, mb: Minibatch, *, on_policy: bool, replay: bool) -> dict:
        """The surrogate's whole-minibatch statistics (:func:`grpo_lab.algo.objectives.batch_statistics`) over the
        rows of ``mb``, indexed by batch row: π_θ scored without gradient at the current weights (in the
        micro-batches of the training forward, so the values are those the loss will see; with ``replay``
        π_old's MoE routing forced), π_old as the micro-batches will see it (``sg(π_θ)`` on an on-policy
        step), the advantages and the loss mask, with the rows in batch order (so a random draw or a tie in a
        top-k does not depend on the split either)."""
        batch = run.batch
        rows = torch.sort(mb.rows).values  # batch order, whatever the micro-batch order: the same draw or top-k
        B, T = batch.loss_mask.shape
        logp = torch.zeros(B, T, device=batch.loss_mask.device)
        with torch.no_grad():
            for sub in mb.micro_batches:
                part = batch.rollout.select(sub)
                t = part.completion_ids.shape[1]
                lp, _, _ = self._policy_forward(part, sub, batch.loss_mask[sub, :t], run.routing,
                                                "replay" if replay else None, False)
                logp[sub, :t] = lp.float()
        old = logp[rows] if on_policy or run.old_logp is None else run.old_logp[rows]
        stats = batch_statistics(logp[rows], old, batch.advantages[rows].to(logp.device), batch.loss_mask[rows],
                                 self.algo, group_tokens=mb.group_tokens[rows].to(logp.device))
        full = {}
        for name, v in stats.items():
            full[name] = torch.zeros((B, *v.shape[1:]), dtype=v.dtype, device=v.device)
            full[name][rows] = v
        return full

    def _micro_step(self, run: RolloutUpdate, mb: Minibatch, sub: torch.Tensor, *, on_policy: bool = False,
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
        T = part.completion_ids.shape[1]
        mask = batch.loss_mask[sub, :T]
        logp, ent, rec = self._policy_forward(part, sub, mask, run.routing, routing, measure_routing)
        if entropies is not None:
            entropies.append((float((ent * mask).sum()), float(mask.sum())))
        out = self._policy_term(run, mb, sub, logp, mask, on_policy)
        metrics = dict(out.metrics)
        if measure_routing and rec is not None:
            metrics["routing_change_frac"] = _routing_change_frac(run.routing, part, sub, rec)
        if self.value_model is not None:
            metrics["value_loss"] = total(self._value_term(batch, part, sub, mask, mb.counts["num_tokens"]))
        return metrics

    def _policy_forward(self, part: Rollout, sub: torch.Tensor, mask: torch.Tensor, store: RoutingStore | None,
                        routing: str | None, measure_routing: bool):
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
            ctx = replay_routing(self.policy, store.get(sub, P, P + T))
        elif store is not None and (routing == "record" or measure_routing):
            ctx = record_routing(self.policy)
        with ctx as rec, self._autocast():
            logp, ent = policy_logprobs(self.policy, part, with_entropy=True)
        if routing == "record" and rec is not None:
            store.put(sub, rec.indices, P)
        return logp, ent, rec

    def _policy_term(self, run: RolloutUpdate, mb: Minibatch, sub: torch.Tensor, logp: torch.Tensor,
                     mask: torch.Tensor, on_policy: bool):
        """:func:`grpo_lab.algo.objectives.policy_loss` of one micro-batch (log-probs ``logp`` and loss mask ``mask``
        ``[b, T]`` of the rows ``sub``) with the minibatch's global normalisers, and its backward; returns
        the loss output. ``on_policy`` (or ``run.old_logp is None``): π_old = sg(``logp``), written into
        ``run.old_logp`` when there is one."""
        batch, T = run.batch, mask.shape[1]
        if on_policy or run.old_logp is None:
            old = logp.detach()
            if run.old_logp is not None:
                run.old_logp[sub, :T] = old
        else:
            old = run.old_logp[sub, :T]
        ref = run.ref_logp[sub, :T] if run.ref_logp is not None else None
        adv = batch.advantages[sub] if batch.advantages.dim() == 1 else batch.advantages[sub, :T]
        stats = {k: (v[sub, :T] if v.dim() == 2 else v[sub]) for k, v in mb.stats.items()} if mb.stats else None
        out = policy_loss(logp, old, adv, mask, self.algo, ref_logp=ref, max_tokens=self.max_new_tokens,
                          group_tokens=mb.group_tokens[sub].to(logp.device), correct=batch.correct[sub].to(logp.device),
                          stats=stats, **mb.counts)
        self._backward(out.loss)
        return out

    def _value_term(self, batch: Batch, part: Rollout, sub: torch.Tensor, mask: torch.Tensor,
                    num_tokens: float) -> float:
        """The critic's :func:`grpo_lab.algo.objectives.value_loss` on the micro-batch ``part`` (rows ``sub``, loss
        mask ``mask``), normalised by the minibatch's ``num_tokens``, and its backward; returns the loss."""
        T = part.completion_ids.shape[1]
        with self._autocast():
            values = checked_values(self.value_model.values(part), part, grad=True)[:, :T].float()
        vloss = value_loss(values, batch.values[sub, :T], batch.returns[sub, :T], mask,
                           clip_eps=self.algo.value_clip_eps, num_tokens=num_tokens)
        self._backward(vloss)
        return float(vloss.detach())


    def _routing_store(self, ro: Rollout, n_mb: int) -> RoutingStore | None:
        """An empty :class:`~grpo_lab.policy.moe.RoutingStore` for ``ro`` when the policy is a MoE model
        whose π_old the trainer scores itself (``old_logp="recompute"``) and the rollout feeds more
        than one optimiser step; ``None`` otherwise (nothing to replay or compare)."""
        c = self.config
        if not self.moe_routers or c.old_logp != "recompute" or c.epochs * n_mb <= 1:
            return None
        ks = {r.top_k for _, r in self.moe_routers}
        if len(ks) != 1:  # routers with different k: no common store (routing_replay is refused in __init__)
            return None
        return RoutingStore(len(self.moe_routers), len(ro), ro.prompt_ids.shape[1], ro.completion_ids.shape[1],
                            ks.pop(), device=ro.completion_ids.device)

    def _reference_logps(self, ro: Rollout, layouts: list, routing: RoutingStore | None = None):
        """π_old log-probs per epoch and π_ref log-probs of the batch, scored without grad in the training layout.

        π_old: the sampler's log-probs (``old_logp="behaviour"``) for every epoch; ``None`` when the rollout
        feeds a single optimiser step (on-policy: ``sg(π_θ)`` per micro-batch); otherwise recomputed before
        the first update in exactly the micro-batches of :meth:`_layouts` (rows, order, padding), once per
        distinct epoch layout, so that on unchanged weights each row's π_old equals, bit for bit, its
        π_θ in the training forward that compares against it (under bfloat16 autocast a row's log-probs
        depend on the rows beside it). **Except** the first epoch's first minibatch: it is trained before any
        weight changes, so its π_old is ``sg(π_θ)`` of its own training forward; :meth:`update` uses that
        (ratio exactly 1) and writes it into these rows (0 until then), which later epochs of the same
        layout read. With a ``routing`` store (MoE policies) the first epoch's π_old forward records the
        experts of every row it scores into it.

        π_ref: scored in the first epoch's micro-batches (so that the first update's KL is exactly 0); later
        epochs of another layout read these values.

        Returns:
            ``(old_by_epoch, ref_logp)``: a list of ``epochs`` float32 ``[B, T]`` tensors (shared between
            epochs of the same layout) or ``None``, and a float32 ``[B, T]`` tensor or ``None``.
        """
        c = self.config
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
                        scored[key] = self._logp_chunks(self.policy, ro, chunks, routing=routing if e == 0 else None)
                    old_by_epoch.append(scored[key])
            else:
                old_by_epoch = None
            ref_chunks = [sub for mb in layouts[0] for sub in mb]
            ref_logp = self._logp_chunks(self.ref_policy, ro, ref_chunks) if self.uses_kl else None
        return old_by_epoch, ref_logp

    def _group_tokens(self, lm: torch.Tensor, idx: torch.Tensor, counts: dict) -> torch.Tensor:
        """Per row of the batch, the loss-mask token count of its group within the minibatch ``idx``
        (0 outside it); adds the minibatch's ``num_groups`` to ``counts``. Rows ``k*G .. k*G+G-1``
        are group ``k`` (collect keeps whole groups, in order). For ``"group_token_mean"``."""
        gid = idx // self.config.group_size
        uniq, inv = torch.unique(gid, return_inverse=True)
        per_group = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, lm[idx].sum(-1).to(torch.float64))
        counts["num_groups"] = float((per_group > 0).sum())
        out = torch.zeros(lm.shape[0], dtype=torch.float64)
        out[idx] = per_group[inv]
        return out

    @torch.no_grad()
    def _logp_chunks(self, model, ro: Rollout, chunks: list, routing: RoutingStore | None = None) -> torch.Tensor:
        """float32 ``[B, T]`` log-probs of ``model`` on the rows of ``ro`` that ``chunks`` (``[b]`` int64 row
        indices each) name, one no-grad forward per chunk, the chunk's rows side by side in its order; 0 on
        the other rows. With a ``routing`` store (a MoE ``model``), the experts of every row scored are
        recorded into it."""
        B, T = len(ro), ro.completion_ids.shape[1]
        out = torch.zeros(B, T, device=ro.completion_ids.device)
        for idx in chunks:
            part = ro.select(idx)
            with (record_routing(model) if routing is not None else contextlib.nullcontext()) as rec, self._autocast():
                lp = policy_logprobs(model, part)
            if rec is not None:
                routing.put(idx, rec.indices, part.prompt_ids.shape[1])
            out[idx, : lp.shape[1]] = lp
        return out

    def _ntp_backward(self, ro: Rollout, idx: torch.Tensor) -> float:
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
        demo = _demonstration_rollout(self.tokenizer, self.task, problems, self.rng, self.config.device)
        with self._autocast():
            logp = policy_logprobs(self.policy, demo, temperature=1.0)
        loss = -(logp * demo.completion_mask).sum() / demo.completion_mask.sum()
        self._backward(self.algo.ntp_coef * loss)
        return float(loss.detach())

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.value_optimizer is not None:
            self.value_optimizer.zero_grad(set_to_none=True)

    def _optimizer_step(self) -> float:
        """Clip, warm up the learning rate, step every optimiser; returns the policy grad norm."""
        c = self.config
        if self.scaler.is_enabled():  # true gradients before clipping (GradScaler's recipe)
            self.scaler.unscale_(self.optimizer)
            if self.value_optimizer is not None:
                self.scaler.unscale_(self.value_optimizer)
        gn = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), c.grad_clip)
        if self.scaler.is_enabled():
            vgn = (torch.nn.utils.clip_grad_norm_(self.value_model.parameters(), c.grad_clip)
                   if self.value_optimizer is not None else torch.zeros(()))
            if not (torch.isfinite(gn) and torch.isfinite(vgn)):
                # float16 overflow in the scaled gradients of the policy or the critic: neither optimiser
                # steps (GradScaler would skip only the one that overflowed), and update() lowers the
                # scale from the overflow that unscale_ recorded
                self.scaler.update()
                self.amp_skipped_steps += 1
                return float("nan")
        if not torch.isfinite(gn):
            raise FloatingPointError(
                f"Trainer: non-finite policy gradient norm ({float(gn)}) at step {self.step + 1}; the update was "
                f"not applied. The loss of {self.algo.name!r} (surrogate {self.algo.surrogate!r}, aggregation "
                f"{self.algo.aggregation!r}) produced NaN/inf: check a custom registry function")
        self._warm_up_learning_rate()
        if self.scaler.is_enabled():  # finite gradients, unscaled and clipped above
            self.scaler.step(self.optimizer)
            if self.value_optimizer is not None:
                self.scaler.step(self.value_optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
            if self.value_optimizer is not None:
                torch.nn.utils.clip_grad_norm_(self.value_model.parameters(), c.grad_clip)
                self.value_optimizer.step()
        self.opt_steps += 1
        return float(gn)

    def _warm_up_learning_rate(self) -> None:
        """Set the policy's learning rate for the next optimiser step: ``TrainerConfig.lr_schedule`` at update
        ``opt_steps`` (:func:`grpo_lab.training.lr_schedule.policy_lr`: transformers' multiplier at
        ``opt_steps``, as TRL and verl; the default ``"constant"`` is ``lr * min(1, opt_steps / warmup)``, ``lr``
        without a warm-up). The position is the trainer's ``opt_steps``, saved in checkpoints, so a resumed
        run continues its schedule. The value model's optimiser keeps its constant ``value_lr``."""
        lr = policy_lr(self.config, self.opt_steps)
        for group in self.optimizer.param_groups:
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
