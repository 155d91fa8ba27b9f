"""Policy objectives of the GRPO family as pure tensor functions: ratios, PPO clip, KL, aggregation.

Notation (design §3): ``B`` sequences, ``T`` completion tokens (right-padded), ``mask [B, T]``
(bool or 0/1 float; 1 = real token). ``logp``, ``old_logp`` and ``ref_logp`` are per-token
log-probabilities of the sampled tokens under the current policy pi_theta, the behaviour policy
pi_old and the reference policy pi_ref (see :mod:`grpo_lab.logprobs`).

The GRPO objective, DeepSeekMath (arXiv 2402.03300) Eq. 3, maximised::

    J = 1/G sum_i 1/|o_i| sum_t { min[ r_it A_it, clip(r_it, 1-eps, 1+eps) A_it ] - beta D_KL,it }

with ``r_it = pi_theta / pi_old`` and ``D_KL,it`` the k3 estimator of Eq. 4. Every function here
returns *losses* (``-J`` terms), to be minimised. :func:`policy_loss` assembles the whole
objective of an :class:`~grpo_lab.algorithms.Algorithm`; the other functions are its parts.

Numerical conventions (callers rely on them):

* Inputs may be float32, bfloat16 or float16: everything is computed in float32 and returned as
  float32. float64 inputs are computed and returned in float64 (the book's reference checks).
* Log-ratios are clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] = [-20, 20]`` before ``exp``
  (``e^20 ~ 4.9e8``), so ratios never overflow; outside the clamp the ratio gets no gradient.
  Such a token is far outside any clip range, so for PPO clipping this only changes tokens with
  A < 0 and r > e^20, whose huge unclipped gradient would be destructive anyway.
* ``old_logp`` and ``ref_logp`` are constants: they are detached. Advantages are detached.
* Padded positions (mask 0) may hold anything, even NaN or inf: they are replaced before use, so
  they affect neither values nor gradients.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional, Union

import torch
from torch import Tensor

from .algorithms import AGGREGATIONS, Algorithm

__all__ = [
    "LossOutput",
    "LOG_RATIO_CLAMP",
    "KL_LOG_RATIO_CLAMP",
    "METRIC_KEYS",
    "token_log_ratio",
    "sequence_log_ratio",
    "ppo_clip_loss",
    "aggregate",
    "kl_estimate",
    "offpolicy_sequence_mask",
    "policy_loss",
]

#: |log r| is clamped to this before exp in every importance ratio (e^20 ~ 4.85e8).
LOG_RATIO_CLAMP = 20.0
#: k3 = exp(-D) + D - 1 is continued along its tangent line below D = -KL_LOG_RATIO_CLAMP.
KL_LOG_RATIO_CLAMP = 20.0

#: keys always present in ``LossOutput.metrics``
METRIC_KEYS = (
    "loss",
    "pg_loss",
    "kl",
    "clip_frac_low",
    "clip_frac_high",
    "clip_frac",
    "ratio_mean",
    "ratio_min",
    "ratio_max",
    "ratio_q05",
    "ratio_q50",
    "ratio_q95",
    "grad_token_frac",
    "adv_abs_mean",
    "num_tokens",
    "num_sequences",
    "offpolicy_masked_frac",
)

Number = Union[int, float, Tensor]


class LossOutput(NamedTuple):
    """Result of :func:`policy_loss`: ``loss, metrics = policy_loss(...)``.

    Attributes:
        loss: 0-d float32 tensor (float64 for float64 inputs) with grad, to minimise.
        metrics: ``dict[str, float]`` of python floats, never NaN; keys :data:`METRIC_KEYS`.
    """

    loss: Tensor
    metrics: dict


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _cdt(*tensors: Optional[Tensor]) -> torch.dtype:
    for t in tensors:
        if t is not None and t.dtype == torch.float64:
            return torch.float64
    return torch.float32


def _check_float_tensor(x, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def _check_bt(x, name: str, shape: Optional[torch.Size] = None) -> Tensor:
    x = _check_float_tensor(x, name)
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape [B, T], got {tuple(x.shape)}")
    if shape is not None and x.shape != shape:
        raise ValueError(f"shape mismatch: {name} has shape {tuple(x.shape)}, expected {tuple(shape)}")
    return x


def _mask_bool(mask, shape: torch.Size) -> Tensor:
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.shape != shape:
        raise ValueError(f"shape mismatch: mask has shape {tuple(mask.shape)}, expected {tuple(shape)}")
    if mask.dtype == torch.bool:
        return mask
    if mask.numel() > 0 and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must contain only 0 and 1 (1 = real token); got other values")
    return mask != 0


def _positive(name: str, value) -> Union[float, Tensor]:
    """Validate a positive normaliser (python number or 0-d / 1-element tensor)."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        v = float(value.detach().reshape(()))
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        v = float(value)
    else:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return v


def _broadcast_adv(advantages, shape: torch.Size, cdt: torch.dtype) -> Tensor:
    a = _check_float_tensor(advantages, "advantages")
    b, t = shape
    if a.dim() == 1 and a.shape[0] == b:
        a = a.unsqueeze(1).expand(b, t)
    elif a.shape != shape:
        raise ValueError(
            f"shape mismatch: advantages must have shape [B]=({b},) or [B, T]=({b}, {t}), got {tuple(a.shape)}"
        )
    return a.detach().to(cdt)


def _quantiles(x: Tensor, qs: tuple) -> list:
    """Linear-interpolation quantiles of a 1-D tensor via sort (no size limit, unlike
    torch.quantile)."""
    s = torch.sort(x).values
    n = s.numel()
    out = []
    for q in qs:
        pos = q * (n - 1)
        lo = int(math.floor(pos))
        hi = min(lo + 1, n - 1)
        frac = pos - lo
        out.append(s[lo] * (1 - frac) + s[hi] * frac)
    return out


# --------------------------------------------------------------------------------------------
# ratios
# --------------------------------------------------------------------------------------------
def token_log_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """Per-token log importance ratio ``log r_t = log pi_theta(o_t) - log pi_old(o_t)``.

    The ratio of DeepSeekMath (arXiv 2402.03300) Eq. 3 (and DAPO Eq. 9), in log space. Not
    clamped here (:func:`ppo_clip_loss` clamps before ``exp``). ``old_logp`` is detached.

    Args:
        logp: ``[B, T]`` current-policy log-probs (float32 / bfloat16 / float64).
        old_logp: ``[B, T]`` behaviour-policy log-probs.

    Returns:
        ``[B, T]`` float32 log-ratios (nats; float64 for float64 input); grad flows to ``logp``.

    Raises:
        ValueError: shape mismatch or non-floating inputs.
    """
    _check_bt(logp, "logp")
    _check_bt(old_logp, "old_logp", logp.shape)
    cdt = _cdt(logp, old_logp)
    return logp.to(cdt) - old_logp.detach().to(cdt)


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """Length-normalised sequence log-ratio ``log s_i = 1/|o_i| sum_t log r_it`` (GSPO Eq. 7).

    GSPO (arXiv 2507.18071) Eq. 7: ``s_i = (pi_theta(o_i) / pi_old(o_i))^(1/|o_i|)``, the geometric
    mean of the token ratios; this returns its log, the masked mean of the token log-ratios over
    the real tokens of each sequence. A fully masked row gives 0 (ratio 1). ``old_logp`` is
    detached; padded positions are ignored (they may hold NaN / inf).

    Args:
        logp, old_logp: ``[B, T]`` log-probs. mask: ``[B, T]`` bool or 0/1.

    Returns:
        ``[B]`` float32 (float64 for float64 input); gradient ``1/|o_i|`` to each real token.

    Raises:
        ValueError: shape mismatch, mask values other than 0/1, non-floating log-probs.
    """
    _check_bt(logp, "logp")
    _check_bt(old_logp, "old_logp", logp.shape)
    m = _mask_bool(mask, logp.shape)
    cdt = _cdt(logp, old_logp)
    zero = torch.zeros((), dtype=cdt, device=logp.device)
    lr = torch.where(m, logp.to(cdt), zero) - torch.where(m, old_logp.detach().to(cdt), zero)
    lengths = m.sum(dim=-1).clamp(min=1).to(cdt)
    return lr.sum(dim=-1) / lengths


# --------------------------------------------------------------------------------------------
# PPO clip
# --------------------------------------------------------------------------------------------
def ppo_clip_loss(
    log_ratio: Tensor,
    advantages: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
) -> Tensor:
    """Per-token clipped surrogate loss ``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``.

    The policy term of DeepSeekMath (arXiv 2402.03300) Eq. 3 (symmetric ``eps_low = eps_high``)
    and of DAPO (arXiv 2503.14476) Eq. 8/10 (decoupled clip-higher), with the sign flipped to a
    loss. The ratio is ``r = exp(clamp(log_ratio, -20, 20))`` (:data:`LOG_RATIO_CLAMP`): the clamp
    keeps ``r`` finite for any log-prob; where it is active the ratio gets no gradient.

    Gradient w.r.t. ``log_ratio`` (one token): ``-A r`` when the unclipped branch is active;
    0 when ``A > 0, r > 1 + eps_high`` or ``A < 0, r < 1 - eps_low`` (the clip removes the
    incentive to move further); inside the range both branches coincide.

    Args:
        log_ratio: ``[B, T]`` log r (e.g. :func:`token_log_ratio`, or a sequence log-ratio
            broadcast to ``[B, T]``). NaN stays NaN: mask padded positions first.
        advantages: ``[B]`` (one per sequence, broadcast) or ``[B, T]``; detached.
        eps_low, eps_high: clip ranges, ``0 <= eps_low <= 1``, ``eps_high >= 0``.

    Returns:
        ``[B, T]`` float32 per-token losses (unaggregated, unmasked); float64 for float64 input.

    Raises:
        ValueError: shape mismatch, bad eps values, non-floating inputs.
    """
    lr = _check_float_tensor(log_ratio, "log_ratio")
    if lr.dim() != 2:
        raise ValueError(f"log_ratio must have shape [B, T], got {tuple(lr.shape)}")
    el = float(eps_low)
    eh = float(eps_high)
    if not (math.isfinite(el) and 0 <= el <= 1):
        raise ValueError(f"eps_low must be in [0, 1], got {eps_low!r}")
    if not (math.isfinite(eh) and eh >= 0):
        raise ValueError(f"eps_high must be finite and >= 0, got {eps_high!r}")
    cdt = _cdt(lr, advantages if isinstance(advantages, Tensor) else None)
    a = _broadcast_adv(advantages, lr.shape, cdt)
    ratio = torch.exp(torch.clamp(lr.to(cdt), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    clipped = torch.clamp(ratio, 1.0 - el, 1.0 + eh)
    return -torch.minimum(ratio * a, clipped * a)


# --------------------------------------------------------------------------------------------
# aggregation
# --------------------------------------------------------------------------------------------
def aggregate(
    values: Tensor,
    mask: Tensor,
    mode: str,
    *,
    max_tokens: Optional[int] = None,
    num_tokens: Optional[Number] = None,
    num_sequences: Optional[Number] = None,
) -> Tensor:
    """Reduce per-token values ``[B, T]`` to one scalar the way each paper averages token losses.

    Let ``m`` be the mask, ``L_i = sum_t m_it`` and ``S = {i : L_i > 0}`` the non-empty rows.

    * ``"seq_mean_token_mean"`` — ``1/N_seq sum_{i in S} (1/L_i) sum_t m_it v_it``: DeepSeekMath
      (arXiv 2402.03300) Eq. 3's ``1/G sum_i 1/|o_i| sum_t``. ``N_seq = num_sequences`` if given,
      else ``|S|`` (fully masked rows contribute 0 and are not counted).
    * ``"token_mean"`` — ``sum_it m_it v_it / N_tok``: DAPO (arXiv 2503.14476) Eq. 12's
      ``1 / sum_i |o_i|``. ``N_tok = num_tokens`` if given, else ``sum m`` of this batch.
    * ``"seq_mean_token_sum_norm"`` — ``sum_it m_it v_it / max_tokens / N_seq``: Dr.GRPO
      (arXiv 2503.20783) §3.2, per-sequence token *sum* over a constant (the generation budget
      MAX_TOKENS), then the mean over sequences (``N_seq`` as above).

    Micro-batching: when one batch is split into micro-batches whose losses are summed (gradient
    accumulation), pass the *whole batch's* ``num_tokens`` (token_mean) or ``num_sequences``
    (sequence modes; count only non-empty rows to match the default) to every micro-batch; the
    micro-batch results (and gradients) then sum exactly to the full-batch result. Arguments a
    mode does not use are ignored. An empty mask gives 0 (never NaN).

    Args:
        values: ``[B, T]`` per-token values (any float dtype; padded entries may be NaN / inf).
        mask: ``[B, T]`` bool or 0/1. mode: one of the three names above.
        max_tokens: positive int, required for ``"seq_mean_token_sum_norm"``.
        num_tokens, num_sequences: optional positive numbers (python or 1-element tensors).

    Returns:
        0-d float32 tensor (float64 for float64 values), differentiable w.r.t. ``values``.

    Raises:
        ValueError: unknown mode; shape mismatch; mask not 0/1; ``max_tokens`` missing for
            ``"seq_mean_token_sum_norm"`` or not positive; non-positive ``num_tokens`` /
            ``num_sequences``.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGGREGATIONS}")
    _check_bt(values, "values")
    m = _mask_bool(mask, values.shape)
    cdt = _cdt(values)
    zero = torch.zeros((), dtype=cdt, device=values.device)
    v = torch.where(m, values.to(cdt), zero)
    if mode == "token_mean":
        if num_tokens is not None:
            denom = _positive("num_tokens", num_tokens)
        else:
            denom = m.sum().clamp(min=1).to(cdt)
        return v.sum() / denom

    lengths = m.sum(dim=-1)
    if num_sequences is not None:
        n_seq = _positive("num_sequences", num_sequences)
    else:
        n_seq = (lengths > 0).sum().clamp(min=1).to(cdt)
    if mode == "seq_mean_token_mean":
        per_seq = v.sum(dim=-1) / lengths.clamp(min=1).to(cdt)
    else:  # seq_mean_token_sum_norm
        if max_tokens is None:
            raise ValueError(
                "aggregation 'seq_mean_token_sum_norm' needs max_tokens (the constant normaliser, "
                "e.g. the generation budget); pass max_tokens= or set Algorithm.max_tokens"
            )
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        per_seq = v.sum(dim=-1) / float(max_tokens)
    return per_seq.sum() / n_seq


# --------------------------------------------------------------------------------------------
# KL estimators
# --------------------------------------------------------------------------------------------
def _k3(delta: Tensor) -> Tensor:
    """k3(D) = exp(-D) + D - 1 >= 0, stable for every finite D.

    * ``|D| < 1e-2``: Taylor series to D^6 (avoids the cancellation of expm1(-D) + D).
    * else ``expm1(-D) + D``.
    * ``D < -KL_LOG_RATIO_CLAMP``: continued along the tangent at ``-C``,
      ``k3(-C) + k3'(-C) (D + C)``, so value and gradient stay finite (no exp overflow) and the
      gradient still pushes log pi_theta up towards log pi_ref.
    """
    c = KL_LOG_RATIO_CLAMP
    dc = torch.clamp(delta, min=-c)
    small = dc.abs() < 1e-2
    ds = torch.where(small, dc, torch.zeros_like(dc))
    series = ds * ds * (0.5 + ds * (-1.0 / 6 + ds * (1.0 / 24 + ds * (-1.0 / 120 + ds * (1.0 / 720)))))
    main = torch.expm1(-dc) + dc
    k = torch.where(small, series, main)
    slope = -torch.expm1(-dc)  # k3'(D) = 1 - exp(-D), evaluated at the clamped point
    # (delta - dc) is 0 inside the clamp (value and gradient of this term vanish there)
    k = k + slope * (delta - dc)
    return k.clamp(min=0.0)


def kl_estimate(
    logp: Tensor,
    ref_logp: Tensor,
    kind: str = "k3",
    *,
    old_logp: Optional[Tensor] = None,
) -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from the sampled token's log-probs.

    With ``D = log pi_theta(o_t) - log pi_ref(o_t)`` (so ``pi_ref / pi_theta = exp(-D)``) and the
    token sampled from pi_theta (Schulman 2020, "Approximating KL divergence"):

    * ``"k1"``: ``D`` — unbiased, high variance, negative for about half the tokens.
    * ``"k2"``: ``D^2 / 2`` — biased (exact to second order), low variance, >= 0.
    * ``"k3"``: ``exp(-D) + D - 1 = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1`` —
      DeepSeekMath (arXiv 2402.03300) Eq. 4; unbiased, low variance, >= 0.

    k3 is computed stably: a Taylor series for ``|D| < 1e-2``, ``expm1(-D) + D`` otherwise, and
    for ``D < -20`` (pi_theta more than e^20 times less likely than pi_ref) its tangent-line
    continuation from ``D = -20``: value and gradient stay finite (value ~ 4.85e8 * (1 - D - 20),
    gradient -4.85e8), never inf / NaN, and the value is always >= 0.

    ``old_logp`` given: DeepSeek-V3.2 (arXiv 2512.02556) Eq. 7, the estimate multiplied by the
    importance ratio ``pi_theta / pi_old = exp(clamp(logp - old_logp, -20, 20))`` for tokens
    sampled from pi_old. The ratio is **not** detached, exactly as Eq. 7 is written: then the
    gradient of ``r * k3`` is ``r * D * grad log pi_theta``, the unbiased (score-function)
    gradient of the reverse KL for tokens drawn from pi_old, which is the point of Eq. 7; plain k3
    used as a loss has gradient ``(1 - pi_ref/pi_theta) grad log pi_theta``, whose expectation is
    the gradient of the *forward* KL (see papers.md §3). Allowed for every ``kind`` (importance
    weighting keeps any of them unbiased for its value), but Eq. 7 is stated for k3.

    Args:
        logp: ``[B, T]`` current-policy log-probs (grad flows here).
        ref_logp: ``[B, T]`` reference log-probs (detached).
        kind: ``"k1"`` | ``"k2"`` | ``"k3"``.
        old_logp: optional ``[B, T]`` behaviour log-probs (detached).

    Returns:
        ``[B, T]`` float32 estimates in nats (float64 for float64 input), unmasked.

    Raises:
        ValueError: unknown kind, shape mismatch, non-floating inputs, NaN or inf anywhere in
            the inputs (log-probs of sampled tokens are finite; mask padding with 0 first, as
            :func:`policy_loss` does).
    """
    if kind not in ("k1", "k2", "k3"):
        raise ValueError(f"unknown KL estimator kind {kind!r}; expected 'k1', 'k2' or 'k3'")
    _check_bt(logp, "logp")
    _check_bt(ref_logp, "ref_logp", logp.shape)
    if old_logp is not None:
        _check_bt(old_logp, "old_logp", logp.shape)
    named = [("logp", logp), ("ref_logp", ref_logp)] + ([("old_logp", old_logp)] if old_logp is not None else [])
    bad = [n for n, x in named if not bool(torch.isfinite(x).all())]
    if bad:
        raise ValueError(f"kl_estimate: non-finite values (NaN or inf) in {', '.join(bad)}")
    cdt = _cdt(logp, ref_logp, old_logp)
    lp = logp.to(cdt)
    delta = lp - ref_logp.detach().to(cdt)
    if kind == "k1":
        k = delta
    elif kind == "k2":
        k = 0.5 * delta * delta
    else:
        k = _k3(delta)
    if old_logp is not None:
        log_w = torch.clamp(lp - old_logp.detach().to(cdt), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        k = torch.exp(log_w) * k
    return k


# --------------------------------------------------------------------------------------------
# DeepSeek-V3.2 off-policy sequence masking
# --------------------------------------------------------------------------------------------
def offpolicy_sequence_mask(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    delta: float,
) -> Tensor:
    """DeepSeek-V3.2 (arXiv 2512.02556) Eqs. 8-9, *Off-Policy Sequence Masking*: the mask M.

    With ``d_i = 1/|o_i| sum_t log(pi_old(o_it) / pi_theta(o_it))`` over the real tokens of
    sequence i (a per-sequence, length-normalised estimate of KL(pi_old || pi_theta) from tokens
    sampled by pi_old; pi_old is the behaviour policy, in V3.2 the inference engine's
    probabilities, so training/inference mismatch counts too)::

        M_it = 0   if  A_it < 0  and  d_i > delta
        M_it = 1   otherwise

    Only negative-advantage samples are ever masked: pushing down a sequence the current policy
    has already drifted far from is what V3.2 finds destabilising; positive-advantage sequences
    always train. ``d_i`` is computed without gradient (the mask is a constant of the loss); an
    empty sequence has ``d_i = 0``.

    Args:
        old_logp: ``[B, T]`` behaviour log-probs log pi_old.
        logp: ``[B, T]`` current log-probs log pi_theta (detached here).
        advantages: ``[B]`` per sequence or ``[B, T]`` per token.
        mask: ``[B, T]`` bool or 0/1, 1 = real token.
        delta: finite threshold ``>= 0`` (V3.2 does not report its value).

    Returns:
        bool tensor M (True = keep, M = 1), shape ``[B]`` for ``[B]`` advantages and ``[B, T]``
        for ``[B, T]`` advantages.

    Raises:
        ValueError: shape mismatches, mask not 0/1, non-finite values at real tokens, ``delta``
            negative, non-finite or not a real number.
    """
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not math.isfinite(float(delta)):
        raise ValueError(f"delta must be a finite real number, got {delta!r}")
    if delta < 0:
        raise ValueError(f"delta must be >= 0, got {delta!r}")
    _check_bt(old_logp, "old_logp")
    shape = old_logp.shape
    _check_bt(logp, "logp", shape)
    m = _mask_bool(mask, shape)
    a = _check_float_tensor(advantages, "advantages")
    if not ((a.dim() == 1 and a.shape[0] == shape[0]) or a.shape == shape):
        raise ValueError(
            f"advantages must have shape [B]={shape[0]} or [B, T]={tuple(shape)}, got {tuple(a.shape)}")
    cdt = _cdt(old_logp, logp, a)
    zero = torch.zeros((), dtype=cdt, device=logp.device)
    with torch.no_grad():
        diff = torch.where(m, old_logp.detach().to(cdt) - logp.detach().to(cdt), zero)
        if not bool(torch.isfinite(diff).all()):
            raise ValueError("offpolicy_sequence_mask: non-finite log-probs at real (mask=1) tokens")
        a_c = a.detach().to(cdt)
        a_real = a_c if a.dim() == 1 else torch.where(m, a_c, zero)
        if not bool(torch.isfinite(a_real).all()):
            raise ValueError("offpolicy_sequence_mask: non-finite advantages")
        div = diff.sum(dim=-1) / m.sum(dim=-1).clamp(min=1).to(cdt)  # d_i, [B]
        far = div > float(delta)
        if a.dim() == 1:
            return ~((a_real < 0) & far)
        return ~((a_real < 0) & far.unsqueeze(1))


# --------------------------------------------------------------------------------------------
# the whole objective
# --------------------------------------------------------------------------------------------
def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    algo: Algorithm,
    *,
    ref_logp: Optional[Tensor] = None,
    num_tokens: Optional[Number] = None,
    num_sequences: Optional[Number] = None,
    max_tokens: Optional[int] = None,
) -> LossOutput:
    """The full per-token objective of ``algo`` as a loss to minimise, plus diagnostics.

    Per token (``l`` is ``algo``'s choice on each axis)::

        loss_it = -min(rho_it A_it, clip(rho_it, 1 - eps_low, 1 + eps_high) A_it) + beta * KL_it
        loss    = aggregate(loss_it, mask, algo.aggregation)

    * ``rho_it``: ``ratio_level="token"`` -> ``r_it = pi_theta/pi_old`` (DeepSeekMath, arXiv
      2402.03300, Eq. 3); ``"sequence"`` -> ``s_i`` of GSPO (arXiv 2507.18071) Eq. 7, the same
      for every token of sequence i, so with ``seq_mean_token_mean`` and per-sequence advantages
      the loss is exactly GSPO Eq. 5 (``-1/G sum_i min(s_i A_i, clip(s_i) A_i)``) and its gradient
      GSPO Eq. 10. With token-level advantages ``[B, T]`` the sequence ratio multiplies each
      token's advantage (not GSPO-token, Eq. 13-17, which is a later choice).
    * ``KL_it``: ``kl_estimate(logp, ref_logp, algo.kl)``, added **inside** the token sum as in
      DeepSeekMath Eq. 3, hence aggregated with the same mode; only when ``algo.kl`` is set and
      ``algo.beta > 0``. With ``algo.kl_importance_correction`` it is
      ``kl_estimate(..., old_logp=old_logp)``, DeepSeek-V3.2 (arXiv 2512.02556) Eq. 7.
    * ``algo.offpolicy_mask_delta`` set: DeepSeek-V3.2 Eqs. 8-9 — the clipped-surrogate term of
      every token with ``M_it = 0`` (:func:`offpolicy_sequence_mask`) is replaced by 0. Read
      literally, M multiplies only the policy term *inside* ``1/G sum_i 1/|o_i| sum_t``: a
      masked sequence still counts in every normaliser (``G``, ``|o_i|``, ``num_tokens``,
      ``num_sequences``, ``max_tokens``) and its KL term stays.
    * aggregation: see :func:`aggregate`; ``num_tokens`` / ``num_sequences`` are the global
      counts for micro-batch invariance; ``max_tokens`` falls back to ``algo.max_tokens``.

    Args:
        logp: ``[B, T]`` log pi_theta of the sampled tokens (grad flows here); float32 /
            bfloat16 / float16 / float64.
        old_logp: ``[B, T]`` log pi_old (behaviour policy; detached). Pass ``logp.detach()`` for
            a purely on-policy step (ratio 1, clipping inactive).
        advantages: ``[B]`` per sequence or ``[B, T]`` per token (detached).
        mask: ``[B, T]`` bool or 0/1, 1 = real token.
        algo: a :class:`grpo_lab.algorithms.Algorithm`.
        ref_logp: ``[B, T]`` log pi_ref; required iff ``algo.kl`` is not None and
            ``algo.beta > 0``. If given otherwise, the KL is still computed (without grad) for the
            ``kl`` metric, with ``algo.kl`` or k3 when ``algo.kl is None``.
        num_tokens, num_sequences: global normalisers (see :func:`aggregate`).
        max_tokens: constant normaliser for ``"seq_mean_token_sum_norm"``.

    Returns:
        :class:`LossOutput` ``(loss, metrics)``. ``loss``: 0-d float32 tensor with grad.
        ``metrics`` (python floats over the real tokens of *this* batch, never NaN):

        * ``loss``, ``pg_loss`` (the clipped-surrogate part alone, aggregated the same way),
          ``kl`` (mean per-token KL estimate over real tokens; 0.0 when not computed);
        * ``clip_frac_low`` — fraction of real tokens with ``A < 0`` and ``rho < 1 - eps_low``;
          ``clip_frac_high`` — ``A > 0`` and ``rho > 1 + eps_high``; ``clip_frac`` — their sum.
          These are exactly the tokens whose policy gradient the clip sets to 0 (sign-aware);
        * ``ratio_mean``, ``ratio_min``, ``ratio_max``, ``ratio_q05``, ``ratio_q50``,
          ``ratio_q95`` — of ``rho`` over real tokens (1.0, the no-change ratio, when there are no
          real tokens);
        * ``grad_token_frac`` — fraction of real tokens with a non-zero policy-gradient signal
          (``A != 0``, not clipped, log-ratio inside the clamp);
        * ``adv_abs_mean`` — mean ``|A|`` over real tokens;
        * ``num_tokens``, ``num_sequences`` — real tokens and non-empty rows in this batch (use
          them to weight metrics when averaging over micro-batches);
        * ``offpolicy_masked_frac`` — fraction of non-empty rows with at least one token masked
          by Off-Policy Sequence Masking (0.0 when ``algo.offpolicy_mask_delta`` is None).

        Tokens masked by Off-Policy Sequence Masking count in neither ``clip_frac_*`` nor
        ``grad_token_frac`` (their policy gradient is 0 because of the mask, not the clip).

        All fractions and means are 0.0 for an empty mask, and the loss is then 0.

    Raises:
        ValueError: ``algo`` not an Algorithm; shape mismatches; mask not 0/1; NaN / inf at a real
            token in ``logp``, ``old_logp``, ``ref_logp`` or ``advantages``; ``ref_logp`` missing
            when the algorithm has a KL term; ``max_tokens`` missing for
            ``"seq_mean_token_sum_norm"``; non-positive normalisers.
    """
    if not isinstance(algo, Algorithm):
        raise ValueError(f"algo must be a grpo_lab.algorithms.Algorithm, got {type(algo).__name__}")
    _check_bt(logp, "logp")
    shape = logp.shape
    _check_bt(old_logp, "old_logp", shape)
    if ref_logp is not None:
        _check_bt(ref_logp, "ref_logp", shape)
    m = _mask_bool(mask, shape)
    if algo.uses_kl and ref_logp is None:
        raise ValueError(
            f"algorithm {algo.name!r} has a KL term (kl={algo.kl!r}, beta={algo.beta}) so ref_logp "
            "is required; pass ref_logp= or use an algorithm with beta=0 / kl=None"
        )
    if max_tokens is None:
        max_tokens = algo.max_tokens
    cdt = _cdt(logp, old_logp, ref_logp, advantages if isinstance(advantages, Tensor) else None)
    dev = logp.device
    zero = torch.zeros((), dtype=cdt, device=dev)

    # replace padded positions before any arithmetic so that NaN/inf there never reaches a value
    # or a gradient
    lp = torch.where(m, logp.to(cdt), zero)
    old = torch.where(m, old_logp.detach().to(cdt), zero)
    adv = torch.where(m, _broadcast_adv(advantages, shape, cdt), zero)
    ref = None if ref_logp is None else torch.where(m, ref_logp.detach().to(cdt), zero)

    checks = [torch.isfinite(lp).all(), torch.isfinite(old).all(), torch.isfinite(adv).all()]
    names = ["logp", "old_logp", "advantages"]
    if ref is not None:
        checks.append(torch.isfinite(ref).all())
        names.append("ref_logp")
    ok = torch.stack(checks).tolist()
    bad = [n for n, good in zip(names, ok) if not good]
    if bad:
        raise ValueError(f"non-finite values (NaN or inf) at real (mask=1) tokens in: {', '.join(bad)}")

    # ---- ratio -----------------------------------------------------------------------------
    if algo.ratio_level == "token":
        log_ratio = lp - old
    else:  # "sequence": GSPO Eq. 7, broadcast over the tokens of each sequence
        log_ratio = sequence_log_ratio(lp, old, m).unsqueeze(1).expand(shape)

    # ---- clipped surrogate -------------------------------------------------------------------
    if algo.clip != "ppo":  # pragma: no cover - Algorithm validation makes this unreachable
        raise NotImplementedError(f"clip {algo.clip!r}")
    pg_tok = ppo_clip_loss(log_ratio, adv, eps_low=algo.eps_low, eps_high=algo.eps_high)
    keep = None
    if algo.offpolicy_mask_delta is not None:  # DeepSeek-V3.2 Eqs. 8-9
        keep = offpolicy_sequence_mask(old, lp.detach(), adv, m, algo.offpolicy_mask_delta)
        pg_tok = torch.where(keep, pg_tok, zero)

    # ---- KL ----------------------------------------------------------------------------------
    kl_tok = None
    if ref is not None:
        if algo.uses_kl:
            kl_tok = kl_estimate(lp, ref, algo.kl, old_logp=old if algo.kl_importance_correction else None)
        else:
            with torch.no_grad():
                kl_tok = kl_estimate(lp.detach(), ref, algo.kl or "k3")
    total = pg_tok + algo.beta * kl_tok if algo.uses_kl else pg_tok

    agg_kw = dict(max_tokens=max_tokens, num_tokens=num_tokens, num_sequences=num_sequences)
    loss = aggregate(total, m, algo.aggregation, **agg_kw)

    # ---- metrics (one device->host transfer) ---------------------------------------------------
    with torch.no_grad():
        pg_loss = aggregate(pg_tok.detach(), m, algo.aggregation, **agg_kw)
        n_tok = m.sum()
        n_f = n_tok.clamp(min=1).to(cdt)
        n_rows = (m.sum(dim=-1) > 0).sum().to(cdt)
        lr_d = log_ratio.detach()
        ratio = torch.exp(torch.clamp(lr_d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        clip_low = m & (adv < 0) & (ratio < 1.0 - algo.eps_low)
        clip_high = m & (adv > 0) & (ratio > 1.0 + algo.eps_high)
        if keep is not None:
            clip_low = clip_low & keep
            clip_high = clip_high & keep
        grad_tok = m & (adv != 0) & ~clip_low & ~clip_high & (lr_d.abs() <= LOG_RATIO_CLAMP)
        if keep is not None:
            grad_tok = grad_tok & keep
        r_real = ratio[m]
        if r_real.numel() > 0:
            q05, q50, q95 = _quantiles(r_real, (0.05, 0.5, 0.95))
            r_stats = [r_real.mean(), r_real.min(), r_real.max(), q05, q50, q95]
        else:
            r_stats = [torch.ones((), dtype=cdt, device=dev)] * 6
        kl_mean = zero if kl_tok is None else torch.where(m, kl_tok.detach(), zero).sum() / n_f
        f_low = clip_low.sum() / n_f
        f_high = clip_high.sum() / n_f
        values = [
            loss.detach(),
            pg_loss,
            kl_mean,
            f_low,
            f_high,
            f_low + f_high,
            *r_stats,
            grad_tok.sum() / n_f,
            adv.abs().sum() / n_f,
            n_tok.to(cdt),
            n_rows,
            zero if keep is None else (m & ~keep).any(dim=-1).sum().to(cdt) / n_rows.clamp(min=1),
        ]
        vals = torch.stack([v.to(torch.float64).reshape(()) for v in values]).tolist()
    metrics = {k: (float(v) if math.isfinite(v) else 0.0) for k, v in zip(METRIC_KEYS, vals)}
    return LossOutput(loss=loss, metrics=metrics)
