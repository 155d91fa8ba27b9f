"""Routing of Mixture-of-Experts policies: record the experts each token is sent to, replay them.

In an MoE layer a router scores every expert per token and only the top ``k`` run. GSPO (Zheng
et al., arXiv 2507.18071, §5.3) finds that the experts a rollout activates change after a gradient
update, so a token's ratio ``pi_theta / pi_old`` compares two sub-networks; GRPO then needs
**Routing Replay** (cache the experts chosen under ``pi_old``, force them when scoring
``pi_theta``); GSPO's sequence-level ratio does not.

Forward hooks on the routers (``mlp.gate`` of transformers' ``Qwen3MoeSparseMoeBlock`` /
``Qwen2MoeSparseMoeBlock``, returning ``(router_logits, router_scores, router_indices)``):

* :func:`record_routing`: the top-k expert indices of every token of every MoE layer;
* :func:`replay_routing`: forces recorded indices, gate weights recomputed from the current
  logits (so the router still gets a gradient);
* :func:`routing_changes`: the (token, layer) top-k sets that differ between two records;
* :func:`expert_changes`: the activated experts of one record that the other no longer chooses (GSPO's measure);
* :class:`RoutingStore`: a rollout's routing in its own layout, so any subset of rows, trimmed as
  :meth:`grpo_lab.policy.rollout.Rollout.select` trims them, replays at the right positions
  (``TrainerConfig.routing_replay``).

Indices are ``torch.long`` ``[n_layers, B, L, k]``: MoE layers in model order, rows, positions of
the forward's input (prompt, completion and padding), ``k`` slots in the router's order; ``-1``
marks a token with no record, routed freely.

Departure from the paper's systems: routing is recorded by the trainer's own forward (the
recomputation of ``pi_old``), not by the inference engine that sampled the rollout.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["moe_routers", "is_moe", "RoutingRecord", "record_routing", "replay_routing", "routing_changes",
           "expert_changes", "RoutingStore"]


def _moe_blocks(model) -> list[tuple[str, torch.nn.Module, torch.nn.Module]]:
    """``(router name, block, router)`` of every MoE block, in model order (see :func:`moe_routers`)."""
    out = []
    for name, module in model.named_modules():
        gate, experts = getattr(module, "gate", None), getattr(module, "experts", None)
        if isinstance(gate, torch.nn.Module) and isinstance(experts, torch.nn.Module) \
                and isinstance(getattr(gate, "top_k", None), int) and isinstance(getattr(gate, "num_experts", None), int):
            out.append((f"{name}.gate" if name else "gate", module, gate))
    return out


def moe_routers(model) -> list[tuple[str, torch.nn.Module]]:
    """The top-k router of every Mixture-of-Experts block of ``model``, in model order.

    A MoE block is a module with a ``gate`` and an ``experts`` submodule whose ``gate`` has integer
    ``top_k`` and ``num_experts`` attributes (transformers v5's ``Qwen3MoeTopKRouter``,
    ``Qwen2MoeTopKRouter`` and routers of the same interface: ``forward(hidden [N, H])`` returns
    ``(router_logits [N, E], router_scores [N, k], router_indices long [N, k])``).

    Returns:
        ``[(name, router), ...]``, e.g. ``("model.layers.0.mlp.gate", Qwen3MoeTopKRouter)``; empty
        for a dense model. Raises nothing.
    """
    return [(name, router) for name, _, router in _moe_blocks(model)]


def is_moe(model) -> bool:
    """Whether ``model`` has at least one Mixture-of-Experts block (see :func:`moe_routers`)."""
    return bool(_moe_blocks(model))


@dataclass
class RoutingRecord:
    """The routing of the forward passes run inside :func:`record_routing` or :func:`replay_routing`.

    Attributes:
        layers: names of the MoE routers, in model order (``n_layers`` of them).
        calls: one long tensor ``[n_layers, B, L, k]`` per forward pass of the model, in order,
            appended as each forward's last MoE layer runs: the experts each router chose (inside
            :func:`replay_routing`: the experts it *would* have chosen from its current logits,
            before the replayed ones replaced them).
    """

    layers: list[str]
    calls: list[Tensor] = field(default_factory=list)

    @property
    def indices(self) -> Tensor:
        """long ``[n_layers, B, L, k]``: the routing of the one forward pass recorded.

        Raises:
            ValueError: no forward pass, or several (use :attr:`calls`).
        """
        if len(self.calls) != 1:
            raise ValueError(f"RoutingRecord.indices: {len(self.calls)} forward passes were recorded; "
                             "expected exactly one (read .calls for several)")
        return self.calls[0]


class _Recorder:
    """Forward hooks on the MoE blocks (input shape ``[B, L, H]``) and their routers (outputs)."""

    def __init__(self, model, what: str):
        blocks = _moe_blocks(model)
        if not blocks:
            raise ValueError(f"{what}: the model has no Mixture-of-Experts layers (no module with a `gate` router "
                             "of top_k experts next to `experts`); routing is defined for MoE policies only")
        self.routers = [(name, router) for name, _, router in blocks]
        self.blocks = [block for _, block, _ in blocks]
        self.shapes: dict[int, tuple[int, int]] = {}
        self.pending: dict[int, Tensor] = {}
        self.out = RoutingRecord([name for name, _ in self.routers])
        self.handles = []

    def install(self, router_hook) -> None:
        try:
            for layer, ((_, router), block) in enumerate(zip(self.routers, self.blocks)):
                self.handles.append(block.register_forward_pre_hook(self._shape_hook(layer), with_kwargs=True))
                self.handles.append(router.register_forward_hook(router_hook(layer, router)))
        except BaseException:
            self.remove()
            raise

    def _shape_hook(self, layer: int):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs.get("hidden_states")
            if hidden is None or hidden.dim() != 3:
                raise ValueError(f"routing hooks: MoE block of {self.routers[layer][0]!r} got an input of shape "
                                 f"{None if hidden is None else tuple(hidden.shape)}; expected [B, L, H]")
            self.shapes[layer] = (int(hidden.shape[0]), int(hidden.shape[1]))
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def shape(self, layer: int, n_tokens: int, k: int) -> tuple[int, int, int]:
        if layer not in self.shapes:
            raise ValueError(f"routing hooks: router {self.routers[layer][0]!r} was called outside its MoE block")
        B, L = self.shapes[layer]
        if B * L != n_tokens:
            raise ValueError(f"routing hooks: router {self.routers[layer][0]!r} saw {n_tokens} tokens, its block "
                             f"[{B}, {L}]; routers must be called by their MoE block")
        return B, L, k

    def store(self, layer: int, indices: Tensor) -> None:
        """Keep one layer's ``[N, k]`` indices as ``[B, L, k]``; after the last layer, append the call."""
        B, L, k = self.shape(layer, indices.shape[0], indices.shape[-1])
        self.pending[layer] = indices.detach().reshape(B, L, k).to(torch.long).clone()
        if layer == len(self.routers) - 1:
            missing = [j for j in range(len(self.routers)) if j not in self.pending]
            if missing:
                raise RuntimeError(f"routing hooks: MoE layers {missing} did not run in this forward")
            self.out.calls.append(torch.stack([self.pending[j] for j in range(len(self.routers))]))
            self.pending.clear()


@contextmanager
def record_routing(model):
    """Record the top-k experts chosen for every token by every MoE router of ``model``.

    Every forward pass of ``model`` inside the block (with or without grad, any batch shape) adds
    one entry to the yielded :class:`RoutingRecord`'s ``calls``: a long tensor
    ``[n_layers, B, L, k]`` (``B`` rows and ``L`` positions of that forward, padding positions
    included; ``k`` experts per token in the router's order). The forward itself is unchanged
    (hooks observe the routers' outputs); the hooks are removed on exit, also after an error.
    Used by the trainer to cache the routing of ``pi_old`` (GSPO, arXiv 2507.18071, §5.3).

    Args:
        model: a transformers causal LM with Mixture-of-Experts layers (:func:`moe_routers`).

    Yields:
        RoutingRecord, filled as the forwards run (each forward's entry appears when its last MoE
        layer has run).

    Raises:
        ValueError: ``model`` has no MoE layers; during a forward, a router called outside its
            MoE block or a block input that is not ``[B, L, H]``.
    """
    rec = _Recorder(model, "record_routing")

    def router_hook(layer, router):
        def hook(module, args, output):
            rec.store(layer, output[2])
        return hook

    rec.install(router_hook)
    try:
        yield rec.out
    finally:
        rec.remove()


def _check_indices(indices, routers, what: str) -> Tensor:
    if isinstance(indices, RoutingRecord):
        indices = indices.indices
    if not torch.is_tensor(indices) or indices.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8,
                                                             torch.uint8):
        raise ValueError(f"{what}: indices must be an integer tensor [n_layers, B, L, k] (or a RoutingRecord), "
                         f"got {type(indices).__name__}{'' if not torch.is_tensor(indices) else ' ' + str(indices.dtype)}")
    if indices.dim() != 4 or indices.shape[0] != len(routers):
        raise ValueError(f"{what}: indices must have shape [n_layers={len(routers)}, B, L, k], got "
                         f"{tuple(indices.shape)}")
    for layer, (name, router) in enumerate(routers):
        if indices.shape[-1] != router.top_k:
            raise ValueError(f"{what}: indices have k={indices.shape[-1]} experts per token but router {name!r} "
                             f"picks top_k={router.top_k}")
        if not isinstance(getattr(router, "norm_topk_prob", None), bool):
            raise ValueError(f"{what}: router {name!r} ({type(router).__name__}) has no boolean `norm_topk_prob`; "
                             "replay recomputes the gate weights as Qwen2-MoE / Qwen3-MoE routers do and needs it")
        x = indices[layer].long()
        missing = x < 0
        if bool((missing.any(-1) != missing.all(-1)).any()):
            raise ValueError(f"{what}: layer {layer} has tokens with some but not all of their k experts recorded "
                             "(-1 marks a whole token as unrecorded)")
        if bool((x >= router.num_experts).any()) or bool((x < -1).any()):
            raise ValueError(f"{what}: layer {layer} has expert indices outside [0, {router.num_experts}) (and -1)")
        if x.shape[-1] > 1:
            s = x.sort(-1).values
            if bool(((s[..., 1:] == s[..., :-1]) & (s[..., 1:] >= 0)).any()):
                raise ValueError(f"{what}: layer {layer} names an expert twice for one token; a top-k set has "
                                 "k distinct experts")
    return indices.long()


@contextmanager
def replay_routing(model, indices):
    """Force every MoE router of ``model`` to use recorded experts: GSPO's Routing Replay (arXiv 2507.18071, §5.3).

    Inside the block, token ``(b, l)`` of MoE layer ``j`` goes to the experts ``indices[j, b, l]``
    instead of the router's own top k (``-1``: routed freely). The gate weights come from the
    **current** logits, ``w = softmax(logits)[replayed]``, divided by their sum over the ``k`` slots iff
    ``norm_topk_prob``, cast to the logits' dtype: with unchanged weights the replayed forward equals a
    free one bit for bit, and the router still gets a gradient through ``w``. Hooks are removed on
    exit, also after an error.

    Args:
        model: a transformers causal LM with MoE layers (:func:`moe_routers`) whose routers have
            ``top_k``, ``num_experts`` and ``norm_topk_prob`` (Qwen2-MoE, Qwen3-MoE).
        indices: long ``[n_layers, B, L, k]`` (from :func:`record_routing` or
            :meth:`RoutingStore.get`), or a :class:`RoutingRecord` of exactly one forward pass; every
            forward inside the block replays it.

    Yields:
        RoutingRecord: per forward, the experts the routers *would* have chosen (their own top k).

    Raises:
        ValueError: ``model`` has no MoE layers; ``indices`` is not an integer tensor
            ``[n_layers, B, L, k]`` with ``k`` each router's ``top_k``, holds indices outside
            ``[0, num_experts)`` (or ``-1`` for a whole token), or repeats an expert within a token;
            a router without ``norm_topk_prob``; during a forward, a batch shape ``[B, L]`` other
            than the recorded one.
    """
    rec = _Recorder(model, "replay_routing")
    indices = _check_indices(indices, rec.routers, "replay_routing")

    def router_hook(layer, router):
        def hook(module, args, output):
            logits, _, free = output
            rec.store(layer, free)
            B, L, k = rec.shape(layer, logits.shape[0], free.shape[-1])
            if tuple(indices.shape[1:3]) != (B, L):
                raise ValueError(f"replay_routing: recorded routing has [B, L] = {tuple(indices.shape[1:3])} but "
                                 f"this forward has [{B}, {L}] (router {rec.routers[layer][0]!r})")
            idx = indices[layer].reshape(B * L, k).to(free.device)
            unrecorded = idx[:, 0] < 0
            if bool(unrecorded.any()):
                idx = torch.where(unrecorded[:, None], free, idx)
            probs = torch.nn.functional.softmax(logits, dtype=torch.float, dim=-1)
            weights = probs.gather(-1, idx)
            if module.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return logits, weights.to(logits.dtype), idx
        return hook

    rec.install(router_hook)
    try:
        yield rec.out
    finally:
        rec.remove()


def routing_changes(old: Tensor, new: Tensor, mask: Tensor | None = None) -> tuple[int, int]:
    """How many routing decisions differ: ``(changed, compared)``.

    A decision is one token's top-k expert *set* in one MoE layer; it has changed when the sets
    differ (the order of the ``k`` slots does not matter). GSPO (arXiv 2507.18071, §5.3) reports
    about 10% of activated experts changing after one update in a 48-layer MoE.

    Args:
        old, new: integer ``[n_layers, B, L, k]`` (the same shape), e.g. the routing under
            ``pi_old`` and after an update. Tokens where either is ``-1`` (not recorded) are not
            compared.
        mask: bool or float ``[B, L]``, the tokens to compare (nonzero = compare); default all.

    Returns:
        ``(changed, compared)``: python ints; ``compared = n_layers × (masked, recorded tokens)``.

    Raises:
        ValueError: shapes differ, are not 4-d, or ``mask`` is not ``[B, L]``.
    """
    if not (torch.is_tensor(old) and torch.is_tensor(new)) or old.dim() != 4 or old.shape != new.shape:
        raise ValueError(f"routing_changes: old and new must be [n_layers, B, L, k] of one shape, got "
                         f"{tuple(getattr(old, 'shape', ()))} and {tuple(getattr(new, 'shape', ()))}")
    keep = (old[..., 0] >= 0) & (new[..., 0] >= 0)
    if mask is not None:
        if tuple(mask.shape) != tuple(old.shape[1:3]):
            raise ValueError(f"routing_changes: mask must be [B, L] = {tuple(old.shape[1:3])}, got {tuple(mask.shape)}")
        keep = keep & (mask.to(keep.device) != 0)[None]
    diff = (old.sort(-1).values != new.to(old.device).sort(-1).values).any(-1)
    return int((diff & keep).sum()), int(keep.sum())


def expert_changes(old: Tensor, new: Tensor, mask: Tensor | None = None) -> tuple[int, int]:
    """How many activated experts are no longer chosen: ``(gone, activated)``, GSPO's measure.

    GSPO (arXiv 2507.18071, §5.3) counts the experts activated for a token under one policy that the
    other does not activate: a top-k set with one of its ``k`` members swapped counts ``1`` of ``k``
    (:func:`routing_changes` counts it as one changed set). ``gone / activated`` is the share the
    paper reports as about 10% per update.

    Args:
        old, new: integer ``[n_layers, B, L, k]`` (the same shape); ``old`` is the reference (e.g. the
            sampler's routing), ``new`` the other (e.g. the learner's). Tokens where either is ``-1``
            (not recorded) are not compared.
        mask: bool or float ``[B, L]``, the tokens to compare (nonzero = compare); default all.

    Returns:
        ``(gone, activated)``: python ints; ``activated = k × n_layers × (masked, recorded tokens)``.

    Raises:
        ValueError: shapes differ, are not 4-d, or ``mask`` is not ``[B, L]``.
    """
    if not (torch.is_tensor(old) and torch.is_tensor(new)) or old.dim() != 4 or old.shape != new.shape:
        raise ValueError(f"expert_changes: old and new must be [n_layers, B, L, k] of one shape, got "
                         f"{tuple(getattr(old, 'shape', ()))} and {tuple(getattr(new, 'shape', ()))}")
    new = new.to(old.device)
    keep = (old[..., 0] >= 0) & (new[..., 0] >= 0)
    if mask is not None:
        if tuple(mask.shape) != tuple(old.shape[1:3]):
            raise ValueError(f"expert_changes: mask must be [B, L] = {tuple(old.shape[1:3])}, got {tuple(mask.shape)}")
        keep = keep & (mask.to(keep.device) != 0)[None]
    gone = ~(old.unsqueeze(-1) == new.unsqueeze(-2)).any(-1)  # [n_layers, B, L, k]: old's expert not in new's set
    return int((gone & keep[..., None]).sum()), int(keep.sum()) * old.shape[-1]


class RoutingStore:
    """The routing of every row and position of one rollout, in the rollout's layout.

    A rollout's prompts are left-padded to width ``P`` and its completions right-padded to width
    ``T``; a forward over a subset of rows (:meth:`grpo_lab.policy.rollout.Rollout.select`) drops the
    leading prompt columns none of those rows uses and the trailing completion columns, so its
    width is ``P' + T'`` with ``P' <= P``, ``T' <= T`` and its column ``c`` is the rollout's column
    ``c + P - P'``. The store keeps ``indices`` long ``[n_layers, B_rollout, P + T, k]`` (``-1``
    where nothing was recorded) and writes and reads any subset at the right columns: routing
    recorded for one micro-batch replays exactly in another micro-batch, length order or
    padding. ``recorded`` (bool ``[B_rollout]``) marks the rows written.

    Args:
        n_layers: MoE layers; rows: rows of the rollout; prompt_width: ``P``; completion_width:
            ``T``; top_k: experts per token; device: where to keep the indices (default CPU).

    Raises:
        ValueError: a non-positive size.
    """

    def __init__(self, n_layers: int, rows: int, prompt_width: int, completion_width: int, top_k: int,
                 device: torch.device | str | None = None):
        for name, v in (("n_layers", n_layers), ("rows", rows), ("top_k", top_k)):
            if int(v) < 1:
                raise ValueError(f"RoutingStore: {name} must be >= 1, got {v}")
        if prompt_width < 0 or completion_width < 0 or prompt_width + completion_width < 1:
            raise ValueError(f"RoutingStore: invalid widths P={prompt_width}, T={completion_width}")
        self.prompt_width = int(prompt_width)
        self.width = int(prompt_width) + int(completion_width)
        self.indices = torch.full((n_layers, rows, self.width, top_k), -1, dtype=torch.long, device=device)
        self.recorded = torch.zeros(rows, dtype=torch.bool)

    def _columns(self, prompt_width: int, length: int) -> slice:
        off = self.prompt_width - int(prompt_width)
        if off < 0 or off + int(length) > self.width:
            raise ValueError(f"RoutingStore: a forward with prompt width {prompt_width} and length {length} does not "
                             f"fit the rollout's prompt width {self.prompt_width} and length {self.width}")
        return slice(off, off + int(length))

    def put(self, rows: Tensor, indices: Tensor, prompt_width: int) -> None:
        """Write the routing of a forward over ``rows`` (long ``[len(rows)]``, indices into the
        rollout) whose prompt part is ``prompt_width`` columns wide: ``indices`` long
        ``[n_layers, len(rows), L, k]``.

        Raises:
            ValueError: a shape that does not match the store or the rows, columns outside it, or
                ``rows`` that are not integer indices within the rollout (e.g. a boolean mask).
        """
        rows = self._rows(rows, "put")
        n, _, _, k = self.indices.shape
        if indices.dim() != 4 or indices.shape[0] != n or indices.shape[1] != len(rows) or indices.shape[3] != k:
            raise ValueError(f"RoutingStore.put: indices of shape {tuple(indices.shape)} for {len(rows)} rows; "
                             f"expected [{n}, {len(rows)}, L, {k}]")
        cols = self._columns(prompt_width, indices.shape[2])
        self.indices[:, rows.to(self.indices.device), cols] = indices.to(self.indices.device, torch.long)
        self.recorded[rows.cpu()] = True

    def get(self, rows: Tensor, prompt_width: int, length: int) -> Tensor:
        """long ``[n_layers, len(rows), length, k]``: the stored routing of ``rows`` for a forward
        whose prompt part is ``prompt_width`` columns wide and whose input has ``length`` columns
        (``-1`` where nothing was recorded: padding, or rows never written).

        Raises:
            ValueError: columns outside the rollout, or ``rows`` that are not integer indices
                within it.
        """
        rows = self._rows(rows, "get").to(self.indices.device)
        return self.indices[:, rows, self._columns(prompt_width, length)]

    def _rows(self, rows, who: str) -> Tensor:
        """``rows`` as long indices into the rollout, checked: integers (not a boolean mask), 1-d,
        within ``[0, B_rollout)``."""
        t = torch.as_tensor(rows)
        if t.dtype == torch.bool or t.is_floating_point() or t.is_complex() or t.dim() != 1:
            raise ValueError(f"RoutingStore.{who}: rows must be a 1-d tensor of integer row indices, got "
                             f"dtype {t.dtype} and shape {tuple(t.shape)} (convert a boolean mask with .nonzero())")
        t = t.to(torch.long).cpu()
        B = self.indices.shape[1]
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= B):
            raise ValueError(f"RoutingStore.{who}: row indices must lie in [0, {B}), got {int(t.min())}..{int(t.max())}")
        return t
