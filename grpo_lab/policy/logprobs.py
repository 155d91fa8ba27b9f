"""Per-token log-probabilities and entropies, from logits or from hidden states + lm_head.

Every policy-gradient loss here starts from ``log pi(o_t | q, o_<t)`` of the sampled tokens.
``log_softmax(logits.float()).gather(...)`` would keep a float32 ``[B, T, V]`` tensor for
backward, usually the step's largest. This module avoids it:

* :func:`token_logprobs` / :func:`entropy_from_logits`: a custom autograd function that keeps only
  ``[B, T]`` row statistics (max, log-sum) for backward, writes the gradient into its output
  buffer and, with ``chunk_size``, processes the ``B*T`` rows in chunks (``O(chunk_size * V)``
  extra memory).
* :func:`token_logprobs_from_hidden` / :func:`entropy_from_hidden`: the lm_head matmul applied
  chunk by chunk in forward and *recomputed* chunk by chunk in backward (activation
  recomputation), so ``[B, T, V]`` logits never exist; ``compile=True`` fuses the per-chunk
  softmax work with ``torch.compile``.

Math (softmax with temperature tau > 0, z = logits / tau):

* ``log p_id = z_id - logsumexp(z)``; ``d log p_id / d z_j = 1[j = id] - p_j``.
* ``H = -sum_j p_j log p_j`` (nats); ``d H / d z_j = -p_j (log p_j + H)``.
* ``d / d logits = (d / d z) / tau``.

The softmax part runs in float32 (float64 stays float64); results are float32 (float64 for
float64 inputs), differentiable once.

Departures from the textbook ``log_softmax``: an all ``-inf`` row is shifted by 0, not its max;
a NaN log-probability raises ``ValueError`` naming the position (one NaN would poison the batch).
"""

from __future__ import annotations

import math
from typing import Iterator, Optional

import torch
from torch import Tensor

from ..algo import checks as _v

__all__ = [
    "token_logprobs",
    "token_logprobs_from_hidden",
    "entropy_from_logits",
    "entropy_from_hidden",
    "sampling_kept_ids",
    "restrict_to_kept",
    "check_truncation",
]

_KINDS = ("logp", "entropy")


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------
def _check_temperature(temperature: float) -> float:
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        raise ValueError(f"temperature must be a positive number, got {temperature!r}") from None
    if not math.isfinite(t) or t <= 0.0:
        raise ValueError(f"temperature must be finite and > 0, got {temperature!r}")
    return t


def _check_chunk_size(chunk_size: Optional[int], allow_none: bool) -> Optional[int]:
    return _v.positive_int("chunk_size", chunk_size, allow_none=allow_none)


def _check_finite_logp(out: Tensor, what: str) -> None:
    """Raise if a log-probability is NaN (one reduction over ``[B, T]``, not over the vocabulary)."""
    bad = torch.isnan(out.detach())
    if bool(bad.any()):
        pos = tuple(bad.nonzero()[0].tolist())
        raise ValueError(
            f"log-probability undefined (NaN) at position {pos} ({int(bad.sum())} position(s) in all): the "
            f"{what} there give logits that contain NaN (or +inf) or are all -inf; every position needs "
            "finite logits, padded ones included (mask them after computing log-probs)")


def _check_ids(ids: Tensor, lead_shape: torch.Size, vocab: int, what: str) -> Tensor:
    if not isinstance(ids, Tensor):
        raise ValueError(f"ids must be a torch.Tensor, got {type(ids).__name__}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"ids must be an integer tensor, got dtype {ids.dtype}")
    if tuple(ids.shape) != tuple(lead_shape):
        raise ValueError(
            f"shape mismatch: ids has shape {tuple(ids.shape)} but {what} has leading shape "
            f"{tuple(lead_shape)} (expected ids.shape == {what}.shape[:-1])"
        )
    if ids.numel() > 0:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(
                f"token ids must lie in [0, {vocab}) (vocabulary size); got min {lo}, max {hi}. "
                "Replace padding ids such as -100 by any valid id and mask those positions."
            )
    return ids.long()


# --------------------------------------------------------------------------------------------
# row blocks: iterate over [B', T', *] in chunks of at most `chunk` rows without copying
# --------------------------------------------------------------------------------------------
def _as_3d(x: Tensor, lead_shape: torch.Size) -> Tensor:
    """View ``x [*lead, D]`` as ``[B', T', D]`` without copying when at all possible.

    Preferred: ``[1, N, D]`` (rows can be chunked freely). If the rows are not uniformly strided
    (e.g. ``logits[:, :-1]`` of a contiguous tensor) but x is 3-D, keep ``[B, T, D]`` and chunk
    inside each sequence. Otherwise fall back to a reshape (which may copy).
    """
    d = x.shape[-1]
    n = math.prod(lead_shape)
    try:
        return x.view(1, n, d)
    except RuntimeError:
        if x.dim() == 3:
            return x
        return x.reshape(1, n, d)


def _blocks(b: int, t: int, chunk: Optional[int]) -> Iterator[tuple]:
    """Index tuples ``(b_index, slice(t0, t1))`` covering ``[b, t]`` in blocks of <= chunk rows."""
    if chunk is None:
        if b == 1:
            yield (0, slice(0, t))
        else:
            yield (slice(0, b), slice(0, t))
        return
    for i in range(b):
        for t0 in range(0, t, chunk):
            yield (i, slice(t0, min(t0 + chunk, t)))


# --------------------------------------------------------------------------------------------
# kernels on a block of scaled logits z [..., V] (compute dtype), ids [...]
# --------------------------------------------------------------------------------------------
def _kernel_forward(z: Tensor, ids: Optional[Tensor], kind: str, owned: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Return ``(out, mx, log_s)`` for a block, with ``logsumexp(z) = mx + log_s``.

    ``owned``: ``z`` is a temporary of ours and may be overwritten (saves one block-sized buffer).

    ``out`` is ``log p_id`` (kind 'logp') or the entropy (kind 'entropy'). The max and the log of
    the shifted sum are kept apart: ``log p = (z - mx) - log_s`` is then exact to float32 rounding
    of O(1) numbers even for logits of magnitude 1e4 (``z - (mx + log_s)`` would lose ~1e-3).
    """
    mx = z.amax(dim=-1, keepdim=True)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))  # an all -inf row stays -inf
    shifted = z.sub_(mx) if owned else z - mx
    if kind == "logp":
        picked = shifted.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        log_s = shifted.exp_().sum(dim=-1).log()
        out = picked - log_s
    else:
        log_s = shifted.exp().sum(dim=-1).log()
        logp = shifted.sub_(log_s.unsqueeze(-1))
        p = logp.exp()
        # p == 0 where a logit is -inf (e.g. a top-k mask): 0 * -inf must count as 0, not NaN.
        out = -torch.where(p > 0, p * logp, torch.zeros((), dtype=z.dtype, device=z.device)).sum(-1)
    return out, mx.squeeze(-1), log_s


def _kernel_backward_(
    buf: Tensor, ids: Optional[Tensor], mx: Tensor, log_s: Tensor, out: Tensor, g: Tensor, kind: str, tau: float
) -> Tensor:
    """Turn ``buf`` (holding z = logits / tau for the block) into d loss / d logits, in place."""
    buf.sub_(mx.unsqueeze(-1)).sub_(log_s.unsqueeze(-1))  # buf = log p
    if kind == "logp":
        buf.exp_().mul_(-g.unsqueeze(-1))  # -g * p
        buf.scatter_add_(-1, ids.unsqueeze(-1), g.unsqueeze(-1))  # + g at the sampled id
    else:
        p = buf.exp()
        buf.add_(out.unsqueeze(-1)).mul_(p).mul_(-g.unsqueeze(-1))  # -g * p * (log p + H)
        buf.masked_fill_(p == 0, 0.0)  # logits of -inf: no gradient (avoid 0 * inf = NaN)
    if tau != 1.0:
        buf.div_(tau)
    return buf


# --------------------------------------------------------------------------------------------
# autograd function: from logits
# --------------------------------------------------------------------------------------------
class _FromLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x3: Tensor, ids3: Optional[Tensor], kind: str, tau: float, chunk):  # type: ignore[override]
        b, t, _ = x3.shape
        cdt = _v.compute_dtype(x3)
        out = torch.empty((b, t), dtype=cdt, device=x3.device)
        mx = torch.empty((b, t), dtype=cdt, device=x3.device)
        log_s = torch.empty((b, t), dtype=cdt, device=x3.device)
        with torch.no_grad():
            for idx in _blocks(b, t, chunk):
                blk = x3[idx]
                z = blk.to(cdt)
                z = z / tau if tau != 1.0 else z
                owned = z.data_ptr() != blk.data_ptr()  # upcast or division made a copy
                out[idx], mx[idx], log_s[idx] = _kernel_forward(z, None if ids3 is None else ids3[idx], kind, owned)
        ctx.kind, ctx.tau, ctx.chunk = kind, tau, chunk
        ctx.save_for_backward(x3, ids3, mx, log_s, out)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_out: Tensor):  # type: ignore[override]
        x3, ids3, mx, log_s, out = ctx.saved_tensors
        if g_out is None or not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        b, t, v = x3.shape
        cdt = out.dtype
        grad = torch.empty((b, t, v), dtype=x3.dtype, device=x3.device)
        direct = grad.dtype == cdt  # write straight into the gradient buffer, no temporary
        g_out = g_out.to(cdt)
        for idx in _blocks(b, t, ctx.chunk):
            if direct:
                buf = grad[idx]
                buf.copy_(x3[idx])
            else:
                buf = x3[idx].to(cdt, copy=True)
            if ctx.tau != 1.0:
                buf.div_(ctx.tau)
            _kernel_backward_(
                buf, None if ids3 is None else ids3[idx], mx[idx], log_s[idx], out[idx], g_out[idx], ctx.kind, ctx.tau
            )
            if not direct:
                grad[idx] = buf
        return grad, None, None, None, None


# --------------------------------------------------------------------------------------------
# autograd function: from hidden states + lm_head (recomputes the logits in backward)
# --------------------------------------------------------------------------------------------
def _head_raw(h: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``h @ W^T + b`` for one block ``h [n, H]`` -> ``[n, V]``, in the inputs' (promoted) dtype,
    like the model's own lm_head."""
    mm_dtype = torch.promote_types(h.dtype, weight.dtype)
    return torch.nn.functional.linear(
        h.to(mm_dtype), weight.to(mm_dtype), None if bias is None else bias.to(mm_dtype)
    )


def _head_logits(h: Tensor, weight: Tensor, bias: Optional[Tensor], cdt: torch.dtype, tau: float) -> Tensor:
    """z = (h @ W^T + b) / tau for one block; the matmul runs in the inputs' dtype (like the
    model's own lm_head), the result is upcast to the compute dtype."""
    z = _head_raw(h, weight, bias).to(cdt)
    if tau != 1.0:
        z = z / tau
    return z


# --------------------------------------------------------------------------------------------
# torch.compile'd per-chunk kernels (opt-in: compile=True on the *_from_hidden functions)
#
# Functions of one chunk of raw logits x = h @ W^T + b ([n, V], matmul dtype, a temporary of the
# caller) and [n] row vectors in the compute dtype. ``tau`` is None for temperature 1 (no scaling
# at all, as in the eager path) or a 0-d tensor (a python float would be specialised: one
# compilation per temperature). They compute what _head_logits + _kernel_forward /
# _kernel_backward_ compute, in the same order of operations; the compiler fuses the element-wise
# work into the reductions (forward: two reads of x, no block-sized temporary) and into one
# element-wise pass (backward: written into x itself when x already has the compute dtype, so the
# backward needs no second block-sized buffer, like the eager in-place kernel). Each is compiled
# lazily on first use, once per process, with the row dimension marked dynamic (the last chunk of
# a sequence is shorter; T changes from batch to batch).
# --------------------------------------------------------------------------------------------
def _ck_scaled(x: Tensor, cdt: torch.dtype, tau: Optional[Tensor]) -> Tensor:
    z = x.to(cdt)
    return z if tau is None else z / tau


def _ck_forward_logp(x: Tensor, ids: Tensor, cdt: torch.dtype, tau: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    z = _ck_scaled(x, cdt, tau)
    mx = z.amax(dim=-1)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    shifted = z - mx.unsqueeze(-1)
    picked = shifted.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    log_s = shifted.exp().sum(dim=-1).log()
    return picked - log_s, mx, log_s


def _ck_forward_entropy(x: Tensor, cdt: torch.dtype, tau: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    z = _ck_scaled(x, cdt, tau)
    mx = z.amax(dim=-1)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    shifted = z - mx.unsqueeze(-1)
    log_s = shifted.exp().sum(dim=-1).log()
    logp = shifted - log_s.unsqueeze(-1)
    p = logp.exp()
    out = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(dim=-1)
    return out, mx, log_s


def _ck_finish_backward(x: Tensor, d: Tensor, tau: Optional[Tensor]) -> Tensor:
    if tau is not None:
        d = d / tau
    if x.dtype == d.dtype:
        return x.copy_(d)  # in place: x is the caller's temporary (no second [n, V] buffer)
    return d


def _ck_backward_logp(x: Tensor, ids: Tensor, mx: Tensor, log_s: Tensor, g: Tensor, tau: Optional[Tensor]) -> Tensor:
    z = _ck_scaled(x, mx.dtype, tau)
    p = ((z - mx.unsqueeze(-1)) - log_s.unsqueeze(-1)).exp()
    d = p * -g.unsqueeze(-1)  # -g * p
    cols = torch.arange(x.shape[-1], device=x.device)
    d = torch.where(cols == ids.unsqueeze(-1), d + g.unsqueeze(-1), d)  # + g at the sampled id
    return _ck_finish_backward(x, d, tau)


def _ck_backward_entropy(
    x: Tensor, mx: Tensor, log_s: Tensor, out: Tensor, g: Tensor, tau: Optional[Tensor]
) -> Tensor:
    z = _ck_scaled(x, mx.dtype, tau)
    logp = (z - mx.unsqueeze(-1)) - log_s.unsqueeze(-1)
    p = logp.exp()
    d = ((logp + out.unsqueeze(-1)) * p) * -g.unsqueeze(-1)  # -g * p * (log p + H)
    d = torch.where(p == 0, torch.zeros_like(d), d)  # logits of -inf: no gradient
    return _ck_finish_backward(x, d, tau)


_CK_PLAIN = {
    ("forward", "logp"): _ck_forward_logp,
    ("forward", "entropy"): _ck_forward_entropy,
    ("backward", "logp"): _ck_backward_logp,
    ("backward", "entropy"): _ck_backward_entropy,
}
_CK_COMPILED: dict = {}


def _compiled_kernel(direction: str, kind: str):
    """The ``torch.compile``-d version of ``_CK_PLAIN[(direction, kind)]``, created on first use."""
    key = (direction, kind)
    fn = _CK_COMPILED.get(key)
    if fn is None:
        fn = torch.compile(_CK_PLAIN[key], dynamic=None, fullgraph=True)
        _CK_COMPILED[key] = fn
    return fn


def _call_compiled(direction: str, kind: str, *args):
    """Call the compiled kernel with the row dimension of every tensor argument marked dynamic
    (a 0-d ``tau`` is left alone), so that chunks of any row count share one compiled graph.
    Returns what the kernel returns; a backward kernel may have overwritten its first argument."""
    for a in args:
        if isinstance(a, Tensor) and a.dim() > 0:
            torch._dynamo.maybe_mark_dynamic(a, 0)
    return _compiled_kernel(direction, kind)(*args)


class _FromHidden(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx, h3: Tensor, weight: Tensor, bias: Optional[Tensor], ids3, kind: str, tau: float, chunk: int,
        compiled: bool = False,
    ):
        b, t, _ = h3.shape
        cdt = _v.compute_dtype(h3, weight, bias)
        out = torch.empty((b, t), dtype=cdt, device=h3.device)
        mx = torch.empty((b, t), dtype=cdt, device=h3.device)
        log_s = torch.empty((b, t), dtype=cdt, device=h3.device)
        tau_t = torch.full((), tau, dtype=cdt, device=h3.device) if (compiled and tau != 1.0) else None
        with torch.no_grad():
            for idx in _blocks(b, t, chunk):
                if compiled:
                    x = _head_raw(h3[idx], weight, bias)
                    ids_args = () if ids3 is None else (ids3[idx],)
                    out[idx], mx[idx], log_s[idx] = _call_compiled("forward", kind, x, *ids_args, cdt, tau_t)
                    del x
                    continue
                z = _head_logits(h3[idx], weight, bias, cdt, tau)
                out[idx], mx[idx], log_s[idx] = _kernel_forward(z, None if ids3 is None else ids3[idx], kind, True)
                del z
        ctx.kind, ctx.tau, ctx.chunk, ctx.compiled = kind, tau, chunk, compiled
        ctx.has_bias = bias is not None
        ctx.save_for_backward(h3, weight, bias, ids3, mx, log_s, out)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_out: Tensor):  # type: ignore[override]
        h3, weight, bias, ids3, mx, log_s, out = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if g_out is None or not (need_h or need_w or need_b):
            return None, None, None, None, None, None, None, None
        b, t, _ = h3.shape
        cdt = out.dtype
        mm_dtype = torch.promote_types(h3.dtype, weight.dtype)
        g_out = g_out.to(cdt)
        grad_h = torch.empty_like(h3, memory_format=torch.contiguous_format) if need_h else None
        # weight / bias gradients are accumulated over chunks in the compute dtype (fp32), then cast
        grad_w = torch.zeros(weight.shape, dtype=cdt, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=cdt, device=bias.device) if (need_b and ctx.has_bias) else None
        w_mm = weight.to(mm_dtype)
        if ctx.compiled:
            g_out = g_out.contiguous()  # e.g. the stride-0 gradient of out.sum(): one graph for all
            tau_t = torch.full((), ctx.tau, dtype=cdt, device=h3.device) if ctx.tau != 1.0 else None
        for idx in _blocks(b, t, ctx.chunk):
            h = h3[idx]
            if ctx.compiled:
                with torch.no_grad():
                    x = _head_raw(h, weight, bias)
                if ctx.kind == "logp":
                    buf = _call_compiled("backward", "logp", x, ids3[idx], mx[idx], log_s[idx], g_out[idx], tau_t)
                else:
                    buf = _call_compiled("backward", "entropy", x, mx[idx], log_s[idx], out[idx], g_out[idx], tau_t)
                del x
            else:
                with torch.no_grad():
                    buf = _head_logits(h, weight, bias, cdt, ctx.tau)
                _kernel_backward_(
                    buf, None if ids3 is None else ids3[idx], mx[idx], log_s[idx], out[idx], g_out[idx], ctx.kind,
                    ctx.tau,
                )
            # buf = d loss / d (h W^T + b)  [n, V] in compute dtype
            if need_h:
                grad_h[idx] = (buf.to(mm_dtype) @ w_mm).to(h3.dtype)
            if need_w:
                grad_w.addmm_(buf.transpose(0, 1), h.to(cdt))
            if grad_b is not None:
                grad_b.add_(buf.sum(0))
            del buf
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
            None,
            None,
        )


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------
def _from_logits(logits: Tensor, ids: Optional[Tensor], kind: str, temperature, chunk_size) -> Tensor:
    _v.float_tensor(logits, "logits")
    if logits.dim() < 2:
        raise ValueError(f"logits must have shape [..., V] with at least 2 dims, got {tuple(logits.shape)}")
    tau = _check_temperature(temperature)
    chunk = _check_chunk_size(chunk_size, allow_none=True)
    lead = logits.shape[:-1]
    vocab = logits.shape[-1]
    if vocab < 1:
        raise ValueError("logits must have a non-empty vocabulary dimension (V >= 1)")
    if ids is not None:
        ids = _check_ids(ids, lead, vocab, "logits")
    cdt = _v.compute_dtype(logits)
    if math.prod(lead) == 0:
        return logits.new_zeros(lead, dtype=cdt) + 0.0 * logits.sum()
    x3 = _as_3d(logits, lead)
    ids3 = None if ids is None else ids.reshape(x3.shape[:2])
    out = _FromLogits.apply(x3, ids3, kind, tau, chunk).reshape(lead)
    if kind == "logp":
        _check_finite_logp(out, "logits")
    return out


def token_logprobs(
    logits: Tensor,
    ids: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: Optional[int] = None,
) -> Tensor:
    """Log-probability of each chosen token under ``softmax(logits / temperature)``.

    ``out[b, t] = z[b, t, ids[b, t]] - logsumexp_v z[b, t, v]`` with ``z = logits / temperature``:
    ``log pi_theta(o_{i,t} | q, o_{i,<t})`` of DeepSeekMath (arXiv 2402.03300) Eq. 3. Pass the
    *sampling* temperature, so the log-probs match the distribution the rollout was drawn from.

    Args:
        logits: ``[B, T, V]`` (any leading shape ``[..., V]``), float32 / bfloat16 / float16 /
            float64, aligned with ``ids`` (logits at t predict ``ids[:, t]``: drop a causal LM's last
            position yourself).
        ids: ``[B, T]`` integer token ids in ``[0, V)``, same leading shape as ``logits``; padding
            positions must hold a valid id (mask them afterwards).
        temperature: softmax temperature tau > 0.
        chunk_size: ``None``: all rows in one pass (one transient float32 ``[B, T, V]`` buffer in
            forward; backward keeps two ``[B, T]`` row statistics). An int: the flattened ``B*T``
            rows in chunks of at most that many, ``O(chunk_size * V)`` extra memory; the gradient
            w.r.t. ``logits`` is then the only full-size tensor.

    Returns:
        ``[B, T]`` float32 log-probabilities (nats, <= 0); float64 if ``logits`` is float64.
        Differentiable w.r.t. ``logits`` (once).

    Raises:
        ValueError: temperature <= 0 or not finite; chunk_size not a positive int; ids shape not
            ``logits.shape[:-1]``; ids not integer or outside ``[0, V)``; logits not floating point;
            a NaN log-probability (NaN or all ``-inf`` logits), naming the first such position.
    """
    return _from_logits(logits, ids, "logp", temperature, chunk_size)


def entropy_from_logits(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: Optional[int] = None,
) -> Tensor:
    """Entropy ``H = -sum_v p_v log p_v`` (nats) of ``softmax(logits / temperature)`` per position.

    The policy entropy the trainer logs (and an entropy bonus may use). Logits equal to ``-inf``
    (masked vocabulary entries) contribute 0, never NaN.

    Args:
        logits: ``[B, T, V]`` (any leading shape), float32 / bfloat16 / float16 / float64.
        temperature: tau > 0.
        chunk_size: ``None`` (one pass) or rows per chunk, as in :func:`token_logprobs`.

    Returns:
        ``[B, T]`` float32 entropies in nats, in ``[0, log V]``; float64 for float64 input.
        Differentiable (``dH/dz_j = -p_j (log p_j + H)``).

    Raises:
        ValueError: temperature <= 0 or not finite; bad chunk_size; logits not floating point.
    """
    return _from_logits(logits, None, "entropy", temperature, chunk_size)


def _from_hidden(hidden, weight, ids, kind, temperature, chunk_size, bias, compile_) -> Tensor:
    compile_ = _v.flag("compile", compile_)
    _v.float_tensor(hidden, "hidden")
    _v.float_tensor(weight, "weight")
    if hidden.dim() < 2:
        raise ValueError(f"hidden must have shape [..., H] with at least 2 dims, got {tuple(hidden.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight (lm_head) must have shape [V, H], got {tuple(weight.shape)}")
    vocab, hdim = weight.shape
    if hidden.shape[-1] != hdim:
        raise ValueError(
            f"shape mismatch: hidden has H={hidden.shape[-1]} but weight is [V={vocab}, H={hdim}]"
        )
    if vocab < 1:
        raise ValueError("weight must have V >= 1 rows")
    if bias is not None:
        _v.float_tensor(bias, "bias")
        if tuple(bias.shape) != (vocab,):
            raise ValueError(f"bias must have shape [V]=({vocab},), got {tuple(bias.shape)}")
    tau = _check_temperature(temperature)
    chunk = _check_chunk_size(chunk_size, allow_none=False)
    lead = hidden.shape[:-1]
    if ids is not None:
        ids = _check_ids(ids, lead, vocab, "hidden")
    cdt = _v.compute_dtype(hidden, weight, bias)
    if math.prod(lead) == 0:
        zero = 0.0 * hidden.sum() + 0.0 * weight.sum()
        return hidden.new_zeros(lead, dtype=cdt) + zero.to(cdt)
    h3 = _as_3d(hidden, lead)
    ids3 = None if ids is None else ids.reshape(h3.shape[:2])
    out = _FromHidden.apply(h3, weight, bias, ids3, kind, tau, chunk, compile_).reshape(lead)
    if kind == "logp":
        _check_finite_logp(out, "hidden states and lm_head")
    return out


def token_logprobs_from_hidden(
    hidden: Tensor,
    weight: Tensor,
    ids: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    bias: Optional[Tensor] = None,
    compile: bool = False,
) -> Tensor:
    """Per-token log-probs from final hidden states and the lm_head, never holding ``[B, T, V]``.

    Equals ``token_logprobs(hidden @ weight.T + bias, ids, temperature=...)`` (values and gradients
    w.r.t. ``hidden``, ``weight``, ``bias``), the ``log pi_theta(o_{i,t} | .)`` of DeepSeekMath
    (arXiv 2402.03300) Eq. 3, but forward keeps only each row's log-sum-exp and backward recomputes
    each chunk's logits: ``O(chunk_size * V)`` extra memory instead of ``O(B * T * V)``. The matmul
    runs in the inputs' dtype; softmax and the weight / bias gradients accumulate in float32.

    Args:
        hidden: ``[B, T, H]`` (any ``[..., H]``) final hidden states; hidden at t predicts ``ids[:, t]``.
        weight, bias: ``[V, H]`` lm_head weight (tied embeddings work too) and optional ``[V]`` bias.
        ids: ``[B, T]`` integer token ids in ``[0, V)``.
        temperature, chunk_size: tau > 0, dividing the logits; rows (of the flattened ``B*T``) per chunk, ``>= 1``.
        compile: run each chunk's softmax work (forward and backward) in ``torch.compile`` (inductor) fused
            kernels; same math, equal to float rounding; compiled once per process, dtype, ``V`` and device.

    Returns:
        ``[B, T]`` float32 log-probs (nats); float64 if any input is float64. Differentiable once
        w.r.t. hidden, weight and bias.

    Raises:
        ValueError: shape mismatch between hidden / weight / bias / ids; ids outside ``[0, V)``; temperature
            <= 0; a bad chunk_size or compile; non-floating inputs; a NaN log-probability (its position named).
        torch._dynamo.exc.BackendCompilerFailed: ``compile=True`` without a C++ compiler (CPU) or Triton (GPU).
    """
    return _from_hidden(hidden, weight, ids, "logp", temperature, chunk_size, bias, compile)


def entropy_from_hidden(
    hidden: Tensor,
    weight: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    bias: Optional[Tensor] = None,
    compile: bool = False,
) -> Tensor:
    """Entropy (nats) of ``softmax((hidden @ weight.T + bias) / temperature)``, chunked.

    Same memory behaviour as :func:`token_logprobs_from_hidden` (logits recomputed in backward);
    equals ``entropy_from_logits(hidden @ weight.T + bias, temperature=...)``.

    Args:
        hidden: ``[B, T, H]``; weight: ``[V, H]``; bias: optional ``[V]``.
        temperature: tau > 0. chunk_size: positive int (rows per chunk).
        compile: ``True`` fuses the per-chunk softmax / entropy work with ``torch.compile``, as
            in :func:`token_logprobs_from_hidden` (same results to float rounding).

    Returns:
        ``[B, T]`` float32 entropies in ``[0, log V]``; differentiable once.

    Raises:
        ValueError: shape mismatch, temperature <= 0, bad chunk_size, compile not a bool,
            non-floating inputs.
        torch._dynamo.exc.BackendCompilerFailed: with ``compile=True``, when inductor cannot
            build the kernels.
    """
    return _from_hidden(hidden, weight, None, "entropy", temperature, chunk_size, bias, compile)


# --------------------------------------------------------------------------------------------
# top-p / top-k truncation: the kept set of a sampler, and log-probs restricted to it
# --------------------------------------------------------------------------------------------
def check_truncation(top_p, top_k, owner: str = "") -> tuple[float, int]:
    """``(top_p, top_k)`` as python numbers; ``ValueError`` (the names prefixed by ``owner``, e.g.
    ``"TrainerConfig."``) unless ``0 < top_p <= 1`` (1: off) and ``top_k`` is an int ``>= 0`` (0: off)."""
    p = _v.real_number(f"{owner}top_p", top_p)
    if not 0.0 < p <= 1.0:
        raise ValueError(f"{owner}top_p (nucleus sampling) must be in (0, 1], 1.0 meaning no truncation, "
                         f"got {top_p!r}")
    return p, _v.non_negative_int(f"{owner}top_k", top_k)


def sampling_kept_ids(logits: Tensor, *, temperature: float = 1.0, top_p: float = 1.0,
                      top_k: int = 0) -> Optional[Tensor]:
    """The tokens a top-k / top-p (nucleus, Holtzman et al. 2019) sampler keeps, per row of ``logits``.

    With ``z = logits / temperature`` sorted in decreasing order: top-k keeps the ``top_k`` largest; top-p then
    keeps, of those, the shortest prefix whose renormalised probability reaches ``top_p`` (a token is kept when
    the mass of the tokens ranked before it is ``< top_p``; the first token always). Every token tied with the
    last kept one is kept too, so the set does not depend on how a sort orders ties (transformers'
    ``TopKLogitsWarper`` keeps such ties; its ``TopPLogitsWarper`` splits them by sort order). This is the set
    DeepSeek-V3.2 (arXiv 2512.02556, §3.1, "Keep Sampling Mask") keeps when scoring π_θ.

    Args:
        logits: float ``[..., V]`` raw logits (the temperature is applied here).
        temperature: tau > 0; top_p: in ``(0, 1]``, 1.0 off; top_k: int ``>= 0``, 0 (or ``>= V``) off.

    Returns:
        ``None`` when nothing is truncated (``top_p == 1`` and top-k off); else int32 ``[..., K]`` token ids in
        decreasing order of logit, ``K`` the largest kept set of the batch, padded with ``-1``.

    Raises:
        ValueError: a bad ``temperature``, ``top_p`` or ``top_k``.
    """
    tau = _check_temperature(temperature)
    top_p, top_k = check_truncation(top_p, top_k)
    V = logits.shape[-1]
    top_k = top_k if 0 < top_k < V else 0
    if top_p >= 1.0 and top_k == 0:
        return None
    zs, order = (logits.to(_v.compute_dtype(logits)) / tau).sort(dim=-1, descending=True)
    n = top_k or V  # [..] kept by top-k (before ties)
    if top_p < 1.0:
        p = torch.softmax(zs[..., :n], dim=-1)
        before = torch.cat([torch.zeros_like(p[..., :1]), p.cumsum(-1)[..., :-1]], dim=-1)  # non-decreasing
        last = (before < top_p).sum(-1, keepdim=True) - 1  # >= 0: the first token has 0 before it
    else:
        last = torch.full(zs.shape[:-1] + (1,), n - 1, dtype=torch.long, device=zs.device)
    count = (zs >= zs.gather(-1, last)).sum(-1, keepdim=True)  # with the ties of the last kept token
    K = int(count.max())
    cols = torch.arange(K, device=zs.device)
    return order[..., :K].masked_fill(cols >= count, -1).to(torch.int32)


def restrict_to_kept(logits: Tensor, kept_ids: Optional[Tensor]) -> Tensor:
    """``logits`` with ``-inf`` outside each position's kept set, so that ``softmax`` (and :func:`token_logprobs`)
    of the result is the sampler's truncated, renormalised distribution: ``log p_id = z_id - logsumexp_{kept} z``
    (DeepSeek-V3.2, arXiv 2512.02556, §3.1, Keep Sampling Mask).

    Args:
        logits: float ``[..., V]``; differentiable (the gradient outside the kept set is 0).
        kept_ids: ``None`` (``logits`` returned as they are) or integer ``[..., K]`` ids in ``[0, V)`` padded with
            ``-1`` (:func:`sampling_kept_ids`); a position with no id at all (padding) keeps its whole row.

    Returns:
        A new tensor like ``logits`` (one bool ``[..., V]`` mask is a temporary), or ``logits`` itself.

    Raises:
        ValueError: leading shapes differ; an id ``>= V``.
    """
    if kept_ids is None:
        return logits
    V = logits.shape[-1]
    if tuple(kept_ids.shape[:-1]) != tuple(logits.shape[:-1]):
        raise ValueError(f"restrict_to_kept: kept_ids has shape {tuple(kept_ids.shape)}, logits "
                         f"{tuple(logits.shape)}: their leading shapes must agree")
    if kept_ids.numel() and int(kept_ids.max()) >= V:
        raise ValueError(f"restrict_to_kept: a kept id {int(kept_ids.max())} is outside the vocabulary [0, {V})")
    idx = kept_ids.long().masked_fill(kept_ids < 0, V)  # padding -> a spare column, dropped below
    keep = torch.zeros(logits.shape[:-1] + (V + 1,), dtype=torch.bool, device=logits.device)
    keep = keep.scatter_(-1, idx, True)[..., :V]
    keep = keep | ~keep.any(-1, keepdim=True)
    return logits.masked_fill(~keep, float("-inf"))
