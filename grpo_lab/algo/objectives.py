"""Policy objectives of the GRPO family as pure tensor functions: ratios, surrogates, KL, aggregation.

Notation: ``B`` sequences, ``T`` completion tokens (right-padded), ``mask [B, T]`` (bool or 0/1; 1 = real
token); ``logp``, ``old_logp``, ``ref_logp`` ``[B, T]``: log-probabilities of the sampled tokens under
pi_theta, pi_old and pi_ref (:mod:`grpo_lab.policy.logprobs`). DeepSeekMath (arXiv 2402.03300) Eq. 3,
maximised::

    J = 1/G sum_i 1/|o_i| sum_t { min[ r_it A_it, clip(r_it, 1-eps, 1+eps) A_it ] - beta D_KL,it }

Every function returns *losses* (``-J`` terms). Each axis of an :class:`~grpo_lab.algo.algorithms.Algorithm`
is a registry of functions with one signature:

* :data:`RATIOS` ``(logp, old_logp, mask) -> log_ratio [B, T]``;
* :data:`SURROGATES` ``(ctx: LossContext, *, hyper-parameters) -> (per_token_loss [B, T], indicators)``;
* :data:`KL_ESTIMATORS` ``(delta [B, T]) -> [B, T]``, ``delta = log pi_theta - log pi_ref``;
* :data:`AGGREGATIONS` ``(values, mask, norms) -> scalar``.

:func:`policy_loss` composes them; ``SURROGATES["mine"] = f`` makes ``algo.replace(surrogate="mine")``
valid. Keyword-only parameters are hyper-parameters (:mod:`grpo_lab.algo.hparams`).

Departures from the papers:

* log-ratios are clamped to ``[-20, 20]`` (:data:`LOG_RATIO_CLAMP`) before ``exp``; outside, no gradient;
* k3 is continued along its tangent below ``D = -KL_LOG_RATIO_CLAMP`` (:func:`k3`), finite where Eq. 4 overflows;
* a fully masked row is not counted as a sequence (not in Eq. 3's ``G``).

Conventions: float32 / bfloat16 / float16 inputs are computed and returned in float32, float64 in float64;
``old_logp``, ``ref_logp`` and advantages are detached; padded positions may hold anything (NaN, inf) and
affect neither values nor gradients.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Optional, Union

import torch
from torch import Tensor

from . import hparams as _hp
from . import metrics as _metrics
from . import checks as _v

__all__ = [
    "LossOutput",
    "LossContext",
    "Normalisers",
    "LOG_RATIO_CLAMP",
    "KL_LOG_RATIO_CLAMP",
    "METRIC_KEYS",
    "RATIOS",
    "SURROGATES",
    "SURROGATE_METRICS",
    "MISMATCH_CORRECTIONS",
    "mismatch_log_ratio",
    "token_truncate",
    "token_mask",
    "sequence_truncate",
    "sequence_mask",
    "KL_ESTIMATORS",
    "AGGREGATIONS",
    "token_log_ratio",
    "sequence_log_ratio",
    "sequence_ratio",
    "sequence_token_ratio",
    "ppo_clip_loss",
    "cispo_weight",
    "token_covariance",
    "batch_statistics",
    "loss_functions",
    "loss_inputs",
    "aggregate",
    "kl_estimate",
    "offpolicy_sequence_mask",
    "policy_loss",
    "VALUE_LOSS_MODES",
    "value_loss",
    "positive_nll_loss",
]

#: ``|log r|`` is clamped to this before exp in every importance ratio (e^20 ~ 4.85e8).
LOG_RATIO_CLAMP = 20.0
#: k3 = exp(-D) + D - 1 is continued along its tangent line below D = -KL_LOG_RATIO_CLAMP.
KL_LOG_RATIO_CLAMP = 20.0

#: the metrics always present in ``LossOutput.metrics``, ``{key: what it is}``: fractions and means over the
#: real tokens of the batch (0.0 for an empty mask), each a :class:`grpo_lab.algo.metrics.Metric` with its
#: reduction over micro-batches. ``rho`` is the ratio the surrogate uses, ``r`` the token ratio. Besides these:
#: ``nll_loss`` when ``nll_coef > 0``, and a custom surrogate's extra indicators (CISPO's
#: ``weight_capped_frac``, ``weight_floored_frac``). Tokens masked by Off-Policy Sequence Masking count in
#: neither ``clip_frac_*`` nor ``grad_token_frac``.
METRIC_KEYS = {
    "loss": "the loss to minimise (a sum over micro-batches)",
    "pg_loss": "the surrogate's part of the loss alone, aggregated the same way (a sum)",
    "kl": "mean per-token KL estimate (0.0 with weight 0 when not computed)",
    "clip_frac_low": "share of tokens with A < 0 whose gradient the surrogate removes (PPO: rho < 1 - eps_low)",
    "clip_frac_high": "share of tokens with A > 0 whose gradient the surrogate removes (PPO: rho > 1 + eps_high)",
    "clip_frac": "clip_frac_low + clip_frac_high (for CISPO the tokens its mask M, Eq. 7, removes)",
    "ratio_mean": "mean of rho",
    "ratio_min": "minimum of rho",
    "ratio_max": "maximum of rho",
    "ratio_q05": "5% quantile of rho",
    "ratio_q50": "median of rho",
    "ratio_q95": "95% quantile of rho",
    "grad_token_frac": "share of tokens with a non-zero policy-gradient signal",
    "adv_abs_mean": "mean |A|",
    "num_tokens": "real tokens in the batch (a sum)",
    "num_sequences": "non-empty rows in the batch (a sum)",
    "offpolicy_masked_frac": "share of rows masked by Off-Policy Sequence Masking (DeepSeek-V3.2 Eqs. 8-9)",
    "clip_high_prob_mean": "mean pi_theta of the tokens in clip_frac_high (DAPO §3.1, Fig. 3a)",
    "clip_high_prob_max": "largest pi_theta of the tokens in clip_frac_high",
    "token_prob_mean": "mean pi_theta of all real tokens",
    "seq_clip_frac": "share of rows whose every counted token is clipped (GSPO Eq. 5's clip for sequence ratios)",
    "seq_ratio_mean": "mean of s_i = exp(1/|o_i| sum_t log r_it) (GSPO Eq. 7), whatever the ratio level",
    "seq_ratio_min": "minimum of s_i",
    "seq_ratio_max": "maximum of s_i",
    "seq_ratio_abs_dev": "mean |s_i - 1|",
    "token_ratio_abs_dev": "mean |r_it - 1| of the token ratio, whatever the ratio level",
}

#: per-token indicators every surrogate returns, and the metric each becomes
SURROGATE_METRICS = {"clip_low": "clip_frac_low", "clip_high": "clip_frac_high", "grad": "grad_token_frac"}

Number = Union[int, float, Tensor]


class LossOutput(NamedTuple):
    """Result of :func:`policy_loss`: ``loss, metrics = policy_loss(...)``.

    Attributes:
        loss: 0-d float32 tensor (float64 for float64 inputs) with grad, to minimise.
        metrics: ``dict[str, Metric]``: :class:`grpo_lab.algo.metrics.Metric` values (python floats,
            never NaN, that also say how they combine over micro-batches); keys
            :data:`METRIC_KEYS`, plus any extra indicator a custom surrogate returns.
    """

    loss: Tensor
    metrics: dict


class Normalisers(NamedTuple):
    """The constants an aggregation may divide by (validated; ``None`` = not given).

    Attributes:
        max_tokens: positive int, the constant of ``"seq_mean_token_sum_norm"``.
        num_tokens: positive float, the global real-token count (micro-batching).
        num_sequences: positive float, the global non-empty-sequence count (micro-batching).
        group_tokens: ``[B]`` float tensor or None: for each row, the real-token count of its
            whole group (over every micro-batch of the batch), for ``"group_token_mean"``.
        num_groups: positive float or None: the number of groups with at least one real token in
            the whole batch, for ``"group_token_mean"``.
        inputs: ``{name: Tensor}``, the inputs the aggregation declares
            (:func:`grpo_lab.algo.hparams.declare`); None when it declares none.
    """

    max_tokens: Optional[int] = None
    num_tokens: Optional[float] = None
    num_sequences: Optional[float] = None
    group_tokens: Optional[Tensor] = None
    num_groups: Optional[float] = None
    inputs: Optional[Mapping[str, Tensor]] = None


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _broadcast_adv(advantages, shape: torch.Size, cdt: torch.dtype) -> Tensor:
    a = _v.float_tensor(advantages, "advantages")
    b, t = shape
    if a.dim() == 1 and a.shape[0] == b:
        a = a.unsqueeze(1).expand(b, t)
    elif a.shape != shape:
        raise ValueError(
            f"shape mismatch: advantages must have shape [B]=({b},) or [B, T]=({b}, {t}), got {tuple(a.shape)}"
        )
    return a.detach().to(cdt)


def _quantiles(x: Tensor, qs: tuple) -> list:
    """Linear-interpolation quantiles of a 1-D tensor via sort (:func:`grpo_lab.algo.metrics.quantiles`)."""
    return _metrics.quantiles(x, qs)


def _masked(x: Tensor, m: Tensor, cdt: torch.dtype) -> Tensor:
    """``x`` in the compute dtype with padded positions replaced by 0 (NaN / inf there vanish)."""
    return torch.where(m, x.to(cdt), torch.zeros((), dtype=cdt, device=x.device))


# --------------------------------------------------------------------------------------------
# ratios: (logp, old_logp, mask) -> log_ratio [B, T], on validated, padding-zeroed tensors
# --------------------------------------------------------------------------------------------
def token_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """``log r_it = log pi_theta(o_it) - log pi_old(o_it)`` (DeepSeekMath Eq. 3)."""
    return logp - old_logp


def _sequence_mean(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    lengths = mask.sum(dim=-1).clamp(min=1).to(logp.dtype)
    return (logp - old_logp).sum(dim=-1) / lengths


def sequence_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """``log s_i = 1/|o_i| sum_t log r_it`` (GSPO, arXiv 2507.18071, Eq. 7), on every token of row i.

    The log of the geometric mean of the token ratios, broadcast to the row so that the PPO clip
    and ``seq_mean_token_mean`` give Eq. 5 (``ratio_level="sequence"``). A registry function of
    :data:`RATIOS`: it expects what :func:`policy_loss` passes, validated tensors in one compute
    dtype with padded positions already set to 0 (called directly on NaN padding it returns NaN;
    use :func:`sequence_log_ratio`, which masks, for raw inputs).

    Args:
        logp: ``[B, T]`` log pi_theta (float32 / float64; grad flows).
        old_logp: ``[B, T]`` log pi_old, detached, same dtype.
        mask: ``[B, T]`` bool, True = real token (a fully masked row gives 0, ratio 1).

    Returns:
        ``[B, T]`` log-ratios, row i constant and equal to ``log s_i``; gradient ``1/|o_i|`` to each
        real token of row i. Raises nothing (inputs are validated by :func:`policy_loss`).
    """
    return _sequence_mean(logp, old_logp, mask).unsqueeze(1).expand(logp.shape)


def sequence_token_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO-token's log-ratio ``log s_it = sg[log s_i] + log pi_theta(y_it) - sg[log pi_theta(y_it)]``.

    GSPO (arXiv 2507.18071) Eqs. 13-17 in log space: equal to ``log s_i`` (Eq. 7) in value at every token,
    with gradient 1 to that token's ``log pi_theta`` only (Eq. 16), so each token is weighted by its own
    advantage; with ``A_it = A_i`` and ``"seq_mean_token_mean"`` the loss and gradient are GSPO's (Eqs. 5, 10).
    A function of :data:`RATIOS`: it expects the validated tensors :func:`policy_loss` passes, padding set to 0.

    Args:
        logp: ``[B, T]`` log pi_theta of the sampled tokens (float32 or float64; grad flows).
        old_logp: ``[B, T]`` log pi_old (detached), same dtype.
        mask: ``[B, T]`` bool, True = real token (a fully masked row gives 0).

    Returns:
        ``[B, T]`` log-ratios in the dtype of ``logp``.
    """
    log_s = _sequence_mean(logp.detach(), old_logp, mask).unsqueeze(1)
    return log_s + (logp - logp.detach())


#: importance-ratio level -> ``(logp, old_logp, mask) -> log_ratio [B, T]``
RATIOS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "token": token_ratio,
    "sequence": sequence_ratio,
    "sequence_token": sequence_token_ratio,
}


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
    _v.bt_tensor(logp, "logp")
    _v.bt_tensor(old_logp, "old_logp", logp.shape)
    cdt = _v.compute_dtype(logp, old_logp)
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
    _v.bt_tensor(logp, "logp")
    _v.bt_tensor(old_logp, "old_logp", logp.shape)
    m = _v.mask_bool(mask, logp.shape)
    cdt = _v.compute_dtype(logp, old_logp)
    return _sequence_mean(_masked(logp, m, cdt), _masked(old_logp.detach(), m, cdt), m)


# --------------------------------------------------------------------------------------------
# surrogates: (ctx: LossContext, *, hyper-parameters) -> (per_token_loss [B, T], indicators)
# --------------------------------------------------------------------------------------------
class LossContext(NamedTuple):
    """What a surrogate (and a whole-minibatch statistic) sees of one batch or micro-batch.

    Every ``[B, T]`` tensor is in the compute dtype (float32; float64 for float64 inputs), with
    padded positions (mask 0) set to 0.

    Attributes:
        logp: ``[B, T]`` log pi_theta of the sampled tokens; gradient flows.
        old_logp: ``[B, T]`` log pi_old (detached).
        log_ratio: ``[B, T]`` the log-ratio of the algorithm's ratio axis (:data:`RATIOS`); gradient
            flows (through ``logp``).
        advantages: ``[B, T]`` (detached; broadcast from ``[B]`` when given per sequence).
        mask: ``[B, T]`` bool, True = real token.
        ref_logp: ``[B, T]`` log pi_ref (detached) or None.
        group_size: contiguous group size when the caller gave one, else None.
        group_tokens: ``[B]`` float, each row's group's real-token count, or None.
        num_tokens, num_sequences: the global normalisers when the batch is a micro-batch, else None.
        stats: ``{name: Tensor [B, ...]}``: the whole-minibatch statistics the surrogate declares
            (:func:`grpo_lab.algo.hparams.declare`), the rows of this batch; empty when it declares none.
        behaviour_logp, correct, rewards, raw_rewards, entropy, group_ids, lengths: the declared inputs
            (:data:`grpo_lab.algo.hparams.INPUTS`): None unless a function of the loss declares it
            (``[B, T]`` ones in the compute dtype, padding set to 0; ``[B]`` ones as given).
    """

    logp: Tensor
    old_logp: Tensor
    log_ratio: Tensor
    advantages: Tensor
    mask: Tensor
    ref_logp: Optional[Tensor] = None
    group_size: Optional[int] = None
    group_tokens: Optional[Tensor] = None
    num_tokens: Optional[float] = None
    num_sequences: Optional[float] = None
    stats: Mapping[str, Tensor] = {}
    behaviour_logp: Optional[Tensor] = None
    correct: Optional[Tensor] = None
    rewards: Optional[Tensor] = None
    entropy: Optional[Tensor] = None
    group_ids: Optional[Tensor] = None
    lengths: Optional[Tensor] = None
    raw_rewards: Optional[Tensor] = None


def _ratio_floor(values: dict) -> None:
    """``eps_low`` of a ratio clipped in ratio space: the floor ``1 - eps_low`` must be >= 0."""
    if not 0 <= values["eps_low"] <= 1:
        raise ValueError(
            f"eps_low must be in [0, 1] (the ratio floor 1 - eps_low must be >= 0), got {values['eps_low']!r}")


def _ratio(log_ratio: Tensor) -> Tensor:
    """``r = exp(clamp(log r, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))``."""
    return torch.exp(torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _ppo_clip(log_ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
    """``(-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r)`` with ``r = exp(clamp(log r))``."""
    ratio = _ratio(log_ratio)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return -torch.minimum(ratio * adv, clipped * adv), ratio


def _ppo_indicators(ctx: LossContext, ratio: Tensor, eps_low: float, eps_high: float) -> dict:
    """PPO-clip's per-token indicators: ``clip_low``, ``clip_high``, ``grad`` (see :func:`ppo_surrogate`)."""
    with torch.no_grad():
        r, a = ratio.detach(), ctx.advantages
        low = (a < 0) & (r < 1.0 - eps_low)
        high = (a > 0) & (r > 1.0 + eps_high)
        grad = (a != 0) & ~low & ~high & (ctx.log_ratio.detach().abs() <= LOG_RATIO_CLAMP)
    return {"clip_low": low, "clip_high": high, "grad": grad}


@_hp.declare(validate=_ratio_floor)
def ppo_surrogate(ctx: LossContext, *, eps_low: float = 0.2, eps_high: float = 0.2) -> tuple[Tensor, dict]:
    """PPO's clipped surrogate (DeepSeekMath Eq. 3, DAPO Eq. 10) and which tokens the clip cuts.

    ``loss_it = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``, ``r = exp(ctx.log_ratio)``.
    Hyper-parameters: ``eps_low`` in ``[0, 1]``, ``eps_high >= 0`` (the ``Algorithm`` fields).

    Indicators (bool ``[B, T]``): ``clip_low`` — ``A < 0`` and ``r < 1 - eps_low``; ``clip_high``
    — ``A > 0`` and ``r > 1 + eps_high`` (exactly the tokens whose gradient the clip sets to 0);
    ``grad`` — ``A != 0``, not clipped, ``|log r|`` inside the clamp (a non-zero gradient).
    """
    loss, ratio = _ppo_clip(ctx.log_ratio, ctx.advantages, float(eps_low), float(eps_high))
    return loss, _ppo_indicators(ctx, ratio, eps_low, eps_high)


def cispo_weight(log_ratio: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """CISPO's clipped importance-sampling weight ``sg(clip(r, 1 - eps_low, 1 + eps_high))``.

    MiniMax-M1 (arXiv 2506.13585) Eq. 5, with ``r = exp(clamp(log_ratio, -20, 20))`` (the ratio
    ``pi_theta / pi_old`` of its Eq. 1, **not** inverted) and the stop-gradient of Eq. 4: the
    weight is a constant coefficient, so it never carries gradient.

    Args:
        log_ratio: ``[B, T]`` (any shape) log r, float32 / bfloat16 / float16 / float64.
        eps_low, eps_high: ``1 - eps_low`` is the floor, ``1 + eps_high`` the cap
            (``eps_low >= 0``, ``eps_high >= 0``, finite). The paper sets no effective floor
            (``eps_low = 1``: floor 0, and r > 0 always) and tunes only the cap.

    Returns:
        detached tensor of ``log_ratio``'s shape, in ``[1 - eps_low, 1 + eps_high]``: float32
        (float64 for float64 input; bfloat16 / float16 inputs are computed in float32, so the cap
        is not rounded).

    Raises:
        ValueError: a negative or non-finite ``eps_low`` / ``eps_high``; a non-floating ``log_ratio``.
    """
    el = _v.real_number("eps_low", eps_low, minimum=0.0)
    eh = _v.real_number("eps_high", eps_high, minimum=0.0)
    lr = _v.float_tensor(log_ratio, "log_ratio").detach()
    lr = lr.to(_v.compute_dtype(lr))
    r = torch.exp(torch.clamp(lr, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return torch.clamp(r, 1.0 - el, 1.0 + eh)


@_hp.declare(validate=_ratio_floor)
def cispo_surrogate(ctx: LossContext, *, eps_low: float, eps_high: float,
                    mask_eps_low: Optional[float] = None, mask_eps_high: Optional[float] = None
                    ) -> tuple[Tensor, dict]:
    """CISPO (MiniMax-M1, arXiv 2506.13585, Eqs. 4-5), and its unified masked form (Eqs. 6-7).

    Per token, to minimise::

        loss_it = - M_it * sg(w_it) * A_it * log r_it,     w_it = clip(r_it, 1 - eps_low, 1 + eps_high)

    (:func:`cispo_weight`; ``eps_low`` / ``eps_high`` are the paper's ``eps^IS_low`` / ``eps^IS_high``, the
    ``Algorithm``'s fields, no default here: :data:`grpo_lab.algo.algorithms.CISPO` sets 1.0 / 0.28).
    Departure: Eq. 4 has ``log pi_theta`` where we have ``log r``: the same gradient, a value that differs by
    ``M w A log pi_old`` (0 on-policy). No token loses its gradient to the clip.
    ``M_it`` (Eq. 7) is 1 unless ``mask_eps_*`` are set: 0 where ``A > 0, r > 1 + mask_eps_high`` or
    ``A < 0, r < 1 - mask_eps_low``.

    Indicators (bool ``[B, T]``): ``clip_low`` / ``clip_high`` (the tokens ``M`` removes), ``grad``
    (``A != 0`` and ``M = 1``), ``weight_capped_frac`` (``r > 1 + eps_high``, either sign of ``A``) and
    ``weight_floored_frac`` (``r < 1 - eps_low``).
    """
    el, eh, log_ratio, advantages = float(eps_low), float(eps_high), ctx.log_ratio, ctx.advantages
    w = cispo_weight(log_ratio, el, eh)
    with torch.no_grad():
        lr = log_ratio.detach().to(_v.compute_dtype(log_ratio))  # the same float32 r as the weight's
        r, a = torch.exp(torch.clamp(lr, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)), advantages
        none = torch.zeros_like(r, dtype=torch.bool)
        low = (a < 0) & (r < 1.0 - mask_eps_low) if mask_eps_low is not None else none
        high = (a > 0) & (r > 1.0 + mask_eps_high) if mask_eps_high is not None else none
        keep = ~(low | high)
        indicators = {"clip_low": low, "clip_high": high, "grad": (a != 0) & keep,
                      "weight_capped_frac": r > 1.0 + eh, "weight_floored_frac": r < 1.0 - el}
    loss = -(w * advantages) * log_ratio
    if mask_eps_low is not None or mask_eps_high is not None:
        loss = torch.where(keep, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
    return loss, indicators


def _row_mean(x: Tensor, m: Tensor) -> Tensor:
    """``[B]`` mean of ``x`` over each row's real tokens (0 for a row without one)."""
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    return torch.where(m, x, zero).sum(-1) / m.sum(-1).clamp(min=1).to(x.dtype)


def _log_space_range(values: dict) -> None:
    """GMPO clips ``log r`` to ``[-eps_low, eps_high]``: any size >= 0 (1000 = no clip)."""
    if values["eps_low"] < 0:
        raise ValueError(f"eps_low must be >= 0: GMPO clips log r to [-eps_low, eps_high] in log space (any size; "
                         f"its no-clip ablation uses 1000), got {values['eps_low']!r}")


@_hp.declare(requires={"ratio_level": "token", "aggregation": "seq_mean_token_mean"}, validate=_log_space_range)
def gmpo_surrogate(ctx: LossContext, *, eps_low: float, eps_high: float) -> tuple[Tensor, dict]:
    """GMPO, Geometric-Mean Policy Optimization (Zhao et al., arXiv 2507.20673, Eq. 4 / Alg. 1).

    Maximised per response ``i`` (``sgn = sign(A_i)``, ``l_it = log r_it`` the token log-ratio)::

        J_i = A_i * exp( 1/|o_i| sum_t sgn * min(sgn * l_it, sgn * clip(l_it, -eps_low, eps_high)) )

    the geometric mean of the token ratios, each clipped **in log space** and only on the side the
    advantage pushes (``l <= eps_high`` for ``A > 0``, ``l >= -eps_low`` for ``A < 0``). The loss
    is ``-J_i`` on every real token of row ``i``; with ``aggregation="seq_mean_token_mean"``
    (required) the batch loss is ``-1/G sum_i J_i``. The paper's ``eps = 0.4`` (a range of
    ``[e^-0.4, e^0.4]`` for the ratio), set by :data:`grpo_lab.algo.algorithms.GMPO` (no default here:
    ``eps_low`` / ``eps_high`` are the ``Algorithm``'s fields). Requires ``ratio_level="token"``: the surrogate takes the
    geometric mean itself. With ``[B, T]`` advantages ``A_i`` is their mean over the row's real
    tokens and ``sgn`` is taken per token (as verl's ``geo_mean``). The mean log-ratio is clamped to
    ``+-LOG_RATIO_CLAMP`` before ``exp``.

    Indicators (bool ``[B, T]``): ``clip_high`` — ``A > 0`` and ``l > eps_high``; ``clip_low`` —
    ``A < 0`` and ``l < -eps_low`` (the tokens whose gradient the clip removes); ``grad`` —
    ``A != 0`` and not clipped.
    """
    lr, a, m = ctx.log_ratio, ctx.advantages, ctx.mask
    sgn = torch.sign(a)
    kept = sgn * torch.minimum(sgn * lr, sgn * torch.clamp(lr, -eps_low, eps_high))
    log_w = torch.clamp(_row_mean(kept, m), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    loss = -(_row_mean(a, m) * torch.exp(log_w))[:, None].expand_as(lr)
    with torch.no_grad():
        low, high = (a < 0) & (lr.detach() < -eps_low), (a > 0) & (lr.detach() > eps_high)
    return loss, {"clip_low": low, "clip_high": high, "grad": (a != 0) & ~low & ~high}


def _positive_temperatures(values: dict) -> None:
    """SAPO's temperatures must be > 0 (the gate divides by them)."""
    for k in ("tau_pos", "tau_neg"):
        if not values[k] > 0:
            raise ValueError(f"{k} (a SAPO gate temperature) must be > 0, got {values[k]!r}")


@_hp.declare(validate=_positive_temperatures)
def sapo_surrogate(ctx: LossContext, *, tau_pos: float = 1.0, tau_neg: float = 1.05) -> tuple[Tensor, dict]:
    """SAPO, Soft Adaptive Policy Optimization (Gao et al., Qwen, arXiv 2511.20347, §3).

    A soft gate replaces the hard clip. Per token, to minimise::

        loss_it = -f(r_it) A_it,      f(r) = 4/tau * sigmoid(tau (r - 1)),
        tau = tau_pos if A_it > 0 else tau_neg

    with the paper's ``tau_pos = 1.0``, ``tau_neg = 1.05`` (``tau_neg > tau_pos``: negative
    advantages are damped faster off-policy). The gradient weight is ``f'(r) r = 4 s (1 - s) r``,
    ``s = sigmoid(tau (r - 1))``: exactly 1 on-policy (``r = 1``, the REINFORCE gradient), at most
    ``r``, and decaying smoothly to 0 as ``r`` moves far from 1 (just above 1 the factor ``r`` lifts
    it slightly over 1); no token's gradient is cut to 0 by a hard bound. The paper averages as
    ``1/G sum_i 1/|y_i| sum_t`` (``"seq_mean_token_mean"``). ``r = exp(clamp(log r, +-20))``.

    Indicators: ``clip_low`` / ``clip_high`` — none (nothing is cut); ``grad`` — ``A != 0`` and
    ``|log r|`` inside the clamp; ``sapo_weight`` — the gradient weight ``4 s (1 - s) r`` (float).
    """
    lr, a = ctx.log_ratio, ctx.advantages
    ratio = _ratio(lr)
    tau = torch.where(a > 0, torch.full_like(a, tau_pos), torch.full_like(a, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -(4.0 / tau) * gate * a
    with torch.no_grad():
        none = torch.zeros_like(a, dtype=torch.bool)
        s, r = gate.detach(), ratio.detach()
        grad = (a != 0) & (lr.detach().abs() <= LOG_RATIO_CLAMP)
    return loss, {"clip_low": none, "clip_high": none, "grad": grad, "sapo_weight": 4.0 * s * (1.0 - s) * r}


def token_covariance(ctx: LossContext) -> Tensor:
    """``Cov_t = (A_t - mean A) (log pi_theta,t - mean log pi_theta)`` per real token, both means over
    the batch's real tokens (Cui et al., arXiv 2505.22617, the covariance of its entropy-dynamics analysis, which
    "Suppressing Tokens with High Covariances" ranks tokens by); ``[B, T]``, 0 at padding,
    no gradient. Called on the whole minibatch (a statistic, :func:`batch_statistics`)."""
    m = ctx.mask
    with torch.no_grad():
        n = m.sum().clamp(min=1).to(ctx.logp.dtype)
        a, lp = ctx.advantages, ctx.logp.detach()
        zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
        cov = (a - torch.where(m, a, zero).sum() / n) * (lp - torch.where(m, lp, zero).sum() / n)
        return torch.where(m, cov, zero)


def _pick(candidates: Tensor, order: Tensor, k: int) -> Tensor:
    """A bool mask like ``candidates`` with the first ``k`` candidates in ``order`` (indices into
    ``candidates.nonzero()``) set."""
    where = candidates.nonzero()[order[:k].to(candidates.device)]
    out = torch.zeros_like(candidates)
    out[where[:, 0], where[:, 1]] = True
    return out


def kl_cov_selection(ctx: LossContext, *, kl_cov_ratio: float = 2e-3) -> Tensor:
    """KL-Cov's tokens (arXiv 2505.22617, "Suppressing Tokens with High Covariances"): the
    ``k = max(1, floor(kl_cov_ratio N))`` real tokens
    of largest :func:`token_covariance` among the batch's ``N`` real tokens; bool ``[B, T]`` (none when
    ``N = 0``). A whole-minibatch statistic of :func:`kl_cov_surrogate`."""
    m = ctx.mask
    n = int(m.sum())
    if n == 0:
        return torch.zeros_like(m)
    cov = token_covariance(ctx)[m]
    return _pick(m, torch.topk(cov, max(1, int(n * kl_cov_ratio))).indices, n)


def _cov_ratio(name: str, value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"{name} (the share of the batch's tokens selected by covariance) must be in (0, 1], "
                         f"got {value!r}")


def _kl_cov_values(values: dict) -> None:
    """``kl_cov_ratio`` in ``(0, 1]``, ``kl_cov_coef >= 0``."""
    _cov_ratio("kl_cov_ratio", values["kl_cov_ratio"])
    if values["kl_cov_coef"] < 0:
        raise ValueError(f"kl_cov_coef must be >= 0, got {values['kl_cov_coef']!r}")


@_hp.declare(requires={"ratio_level": "token"}, validate=_kl_cov_values,
             batch_statistics={"kl_cov_selected": kl_cov_selection})
def kl_cov_surrogate(ctx: LossContext, *, kl_cov_coef: float = 1.0) -> tuple[Tensor, dict]:
    """KL-Cov (Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    arXiv 2505.22617, section "Suppressing Tokens with High Covariances"; verl's ``kl_cov``).

    Per token, to minimise (no clip)::

        loss_t = -r_t A_t + kl_cov_coef * |log r_t| * [t in I_KL]

    where ``I_KL`` (:func:`kl_cov_selection`, hyper-parameter ``kl_cov_ratio``) holds the tokens of
    largest covariance between advantage and log-probability **over the whole minibatch** (a
    statistic computed once before micro-batching, so the gradient does not depend on the split).
    The paper: ``kl_cov_ratio = 2e-3`` (Qwen2.5-7B; 2e-4 for 32B), ``kl_cov_coef = 1``, token-mean
    aggregation. ``|log r|`` has zero gradient at ``r = 1``: on an exactly on-policy minibatch the
    penalty is inert. Requires ``ratio_level="token"``.

    Indicators: ``clip_low`` / ``clip_high`` — none; ``grad`` — ``A != 0`` (inside the log-ratio
    clamp) or a selected token with ``log r != 0``; ``kl_cov_selected`` — the token is in ``I_KL``.
    """
    lr, a = ctx.log_ratio, ctx.advantages
    sel = ctx.stats["kl_cov_selected"]
    pg = -_ratio(lr) * a
    loss = torch.where(sel, pg + kl_cov_coef * lr.abs(), pg)
    with torch.no_grad():
        none = torch.zeros_like(sel)
        inside = lr.detach().abs() <= LOG_RATIO_CLAMP
        grad = ((a != 0) & inside) | (sel & (lr.detach() != 0))
    return loss, {"clip_low": none, "clip_high": none, "grad": grad, "kl_cov_selected": sel}


def clip_cov_selection(ctx: LossContext, *, eps_low: float = 0.2, eps_high: float = 0.2,
                       clip_cov_ratio: float = 2e-4, clip_cov_lb: float = 1.0, clip_cov_ub: float = 5.0) -> Tensor:
    """Clip-Cov's tokens (arXiv 2505.22617, "Suppressing Tokens with High Covariances"): among the real
    tokens that PPO's clip
    leaves alone and whose :func:`token_covariance` lies in ``(clip_cov_lb, clip_cov_ub)``, draw
    ``min(max(1, floor(clip_cov_ratio N)), #candidates)`` uniformly at random (``torch.randperm`` on
    the global CPU generator, which the trainer's checkpoints save); bool ``[B, T]``. A
    whole-minibatch statistic of :func:`clip_cov_surrogate`."""
    m, a = ctx.mask, ctx.advantages
    with torch.no_grad():
        ratio = _ratio(ctx.log_ratio.detach())
        clipped = -a * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) > -a * ratio
        cov = token_covariance(ctx)
        cand = m & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        n_cand = int(cand.sum())
        k = min(max(1, int(clip_cov_ratio * int(m.sum()))), n_cand)
        return _pick(cand, torch.randperm(n_cand), k) if n_cand else cand


def _clip_cov_values(values: dict) -> None:
    """PPO's ``eps_low`` in ``[0, 1]``, ``clip_cov_ratio`` in ``(0, 1]``, ``clip_cov_lb < clip_cov_ub``."""
    _ratio_floor(values)
    _cov_ratio("clip_cov_ratio", values["clip_cov_ratio"])
    if not values["clip_cov_lb"] < values["clip_cov_ub"]:
        raise ValueError(f"clip_cov_lb must be below clip_cov_ub, got ({values['clip_cov_lb']!r}, "
                         f"{values['clip_cov_ub']!r})")


@_hp.declare(requires={"ratio_level": "token"}, validate=_clip_cov_values,
             batch_statistics={"clip_cov_detached": clip_cov_selection})
def clip_cov_surrogate(ctx: LossContext, *, eps_low: float = 0.2, eps_high: float = 0.2) -> tuple[Tensor, dict]:
    """Clip-Cov (Cui et al., arXiv 2505.22617, "Suppressing Tokens with High Covariances"; verl's
    ``clip_cov``): PPO's clipped surrogate
    (:func:`ppo_surrogate`) with the tokens of :func:`clip_cov_selection` (hyper-parameters
    ``clip_cov_ratio``, ``clip_cov_lb``, ``clip_cov_ub``; the paper's 2e-4, 1 and 5) removed from the
    loss: their term and gradient are 0. The selection is drawn once per minibatch, before
    micro-batching. Requires ``ratio_level="token"``.

    Indicators: PPO's ``clip_low`` / ``clip_high``; ``grad`` — PPO's, less the removed tokens;
    ``clip_cov_detached`` — the removed tokens (counted there, not in ``clip_frac``: the clip leaves
    them alone, so the tokens without gradient are ``clip_frac + clip_cov_detached``).
    """
    loss, ratio = _ppo_clip(ctx.log_ratio, ctx.advantages, float(eps_low), float(eps_high))
    det = ctx.stats["clip_cov_detached"]
    loss = torch.where(det, torch.zeros((), dtype=loss.dtype, device=loss.device), loss)
    ind = _ppo_indicators(ctx, ratio, eps_low, eps_high)
    return loss, {**ind, "grad": ind["grad"] & ~det, "clip_cov_detached": det}


#: surrogate (``Algorithm.surrogate``: the per-token objective and its trust region) ->
#: ``(ctx: LossContext, *, hyper-parameters) -> (per_token_loss [B, T], indicators)``.
#: ``indicators`` maps a name to a per-token ``[B, T]`` bool or float tensor; :func:`policy_loss`
#: reports its mean over the tokens whose policy term counts. It must hold the keys of
#: :data:`SURROGATE_METRICS` (``clip_low``, ``clip_high``, ``grad``); any other key becomes a
#: metric of that name (a name of :data:`METRIC_KEYS` is refused).
SURROGATES: dict[str, Callable[..., tuple[Tensor, dict]]] = {
    "ppo": ppo_surrogate,
    "cispo": cispo_surrogate,
    "gmpo": gmpo_surrogate,
    "sapo": sapo_surrogate,
    "kl_cov": kl_cov_surrogate,
    "clip_cov": clip_cov_surrogate,
}


# --------------------------------------------------------------------------------------------
# sampler-learner mismatch corrections: (ctx, *, is_cap) -> (weight [B, T], indicators)
# --------------------------------------------------------------------------------------------
def _is_cap_positive(values: dict) -> None:
    """``is_cap`` (C) must be a finite number > 0."""
    c = values["is_cap"]
    if not (isinstance(c, (int, float)) and math.isfinite(c) and c > 0):
        raise ValueError(f"is_cap (the cap C on the importance ratio pi_old / pi_sampler) must be finite and > 0, "
                         f"got {c!r}")


def mismatch_log_ratio(ctx: LossContext, level: str) -> Tensor:
    """``log rho = log pi_old - log pi_sampler`` of the sampled tokens, detached, padding 0: per token
    (``level="token"``, ``[B, T]``) or the sum over each row's real tokens broadcast to its tokens
    (``"sequence"``: the log of the product of the token ratios), clamped to ``+-LOG_RATIO_CLAMP`` so
    that ``exp`` never overflows. Reads the declared input ``ctx.behaviour_logp``.

    Raises:
        ValueError: ``ctx.behaviour_logp`` is None (the function did not declare it or it was not given).
    """
    if ctx.behaviour_logp is None:
        raise ValueError("a mismatch correction reads the sampler's log-probs: declare inputs=('behaviour_logp',) "
                         "and pass policy_loss(..., inputs={'behaviour_logp': ...})")
    zero = torch.zeros((), dtype=ctx.old_logp.dtype, device=ctx.old_logp.device)
    d = torch.where(ctx.mask, ctx.old_logp.detach() - ctx.behaviour_logp.detach(), zero)
    if level == "sequence":
        d = d.sum(dim=-1, keepdim=True).expand_as(d)
    return torch.clamp(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _mismatch(ctx: LossContext, level: str, mode: str, cap: float) -> tuple[Tensor, dict]:
    """The weight of :data:`MISMATCH_CORRECTIONS` and its indicators (see :func:`token_truncate`)."""
    with torch.no_grad():
        rho = torch.exp(mismatch_log_ratio(ctx, level))
        over = rho > cap
        w = torch.clamp(rho, max=cap) if mode == "truncate" else torch.where(over, torch.zeros_like(rho), rho)
    capped = over[:, 0] if level == "sequence" else over  # [B] per response, [B, T] per token
    return w, {"is_capped_frac": capped, "is_weight_mean": w}


_MISMATCH_DOC = """{title} ({level} level, {how}): the detached weight of the sampler-learner mismatch correction.

    ``rho = pi_old / pi_sampler`` of the sampled tokens ({rho}; log space, ``log rho`` clamped to
    ``+-LOG_RATIO_CLAMP``), ``C = is_cap``::

        w = {formula}

    :func:`policy_loss` multiplies the per-token policy-gradient loss by ``w`` before the KL term is added,
    as TRL 1.16's ``vllm_importance_sampling_mode="{mode}"`` (``vllm_importance_sampling_cap = C``; no lower
    bound) and verl 0.9.1's ``algorithm.rollout_correction`` ({verl}). Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training" (TIS, C = 2). Reads the declared input
    ``behaviour_logp`` (``Rollout.behaviour_logp``) and needs ``TrainerConfig.old_logp="recompute"`` (with
    ``"behaviour"`` pi_old *is* the sampler: ``w = 1``).

    Returns:
        ``(w, indicators)``: ``w`` ``[B, T]`` detached, in the compute dtype (0 at padding is not guaranteed:
        the loss masks it); ``is_capped_frac`` (bool, ``rho > C``: {capped}) and ``is_weight_mean`` (``w``,
        per token).

    Raises:
        ValueError: no ``ctx.behaviour_logp``.
    """

_MIS_DECL = dict(inputs=("behaviour_logp",), config={"old_logp": "recompute"}, validate=_is_cap_positive)


@_hp.declare(**_MIS_DECL)
def token_truncate(ctx: LossContext, *, is_cap: float = 2.0) -> tuple[Tensor, dict]:
    return _mismatch(ctx, "token", "truncate", float(is_cap))


@_hp.declare(**_MIS_DECL)
def token_mask(ctx: LossContext, *, is_cap: float = 2.0) -> tuple[Tensor, dict]:
    return _mismatch(ctx, "token", "mask", float(is_cap))


@_hp.declare(**_MIS_DECL)
def sequence_truncate(ctx: LossContext, *, is_cap: float = 2.0) -> tuple[Tensor, dict]:
    return _mismatch(ctx, "sequence", "truncate", float(is_cap))


@_hp.declare(**_MIS_DECL)
def sequence_mask(ctx: LossContext, *, is_cap: float = 2.0) -> tuple[Tensor, dict]:
    return _mismatch(ctx, "sequence", "mask", float(is_cap))


_TOKEN_RHO = "per token, ``rho_it = exp(log pi_old(o_it) - log pi_sampler(o_it))``"
_SEQ_RHO = ("per response, ``rho_i = prod_t rho_it`` over the row's real tokens, the same ``w_i`` on each of "
            "its tokens")
for _fn, _lvl, _how, _rho, _formula, _verl, _capped in (
        (token_truncate, "token", "truncated", _TOKEN_RHO, "min(rho_it, C)",
         "``rollout_is='token'``, IS weights truncated at ``rollout_is_threshold``", "per token"),
        (token_mask, "token", "masked", _TOKEN_RHO, "rho_it * 1[rho_it <= C]",
         "token-level rejection ``rollout_rs``, which also has a lower bound; ours has none, as TRL", "per token"),
        (sequence_truncate, "sequence", "truncated", _SEQ_RHO, "min(rho_i, C)",
         "``rollout_is='sequence'``, truncated at ``rollout_is_threshold``", "per response"),
        (sequence_mask, "sequence", "masked", _SEQ_RHO, "rho_i * 1[rho_i <= C]",
         "sequence-level rejection ``rollout_rs``, which also masks below a lower bound; ours has none, as TRL",
         "per response")):
    _fn.__doc__ = _MISMATCH_DOC.format(title={"truncate": "TIS", "mask": "MIS"}[_fn.__name__.split("_")[1]],
                                       level=_lvl, how=_how, rho=_rho, formula=_formula, mode=_fn.__name__,
                                       verl=_verl, capped=_capped)

#: sampler-learner mismatch correction (``Algorithm.mismatch``; None: none) ->
#: ``(ctx: LossContext, *, is_cap) -> (w [B, T] detached, indicators)``, TRL 1.16's four
#: ``vllm_importance_sampling_mode`` values. Each declares ``inputs=("behaviour_logp",)`` and
#: ``config={"old_logp": "recompute"}``.
MISMATCH_CORRECTIONS: dict[str, Callable[..., tuple[Tensor, dict]]] = {
    "token_truncate": token_truncate,
    "token_mask": token_mask,
    "sequence_truncate": sequence_truncate,
    "sequence_mask": sequence_mask,
}


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
    lr = _v.float_tensor(log_ratio, "log_ratio")
    if lr.dim() != 2:
        raise ValueError(f"log_ratio must have shape [B, T], got {tuple(lr.shape)}")
    el = float(eps_low)
    eh = float(eps_high)
    if not (math.isfinite(el) and 0 <= el <= 1):
        raise ValueError(f"eps_low must be in [0, 1], got {eps_low!r}")
    if not (math.isfinite(eh) and eh >= 0):
        raise ValueError(f"eps_high must be finite and >= 0, got {eps_high!r}")
    cdt = _v.compute_dtype(lr, advantages if isinstance(advantages, Tensor) else None)
    a = _broadcast_adv(advantages, lr.shape, cdt)
    return _ppo_clip(lr.to(cdt), a, el, eh)[0]


# --------------------------------------------------------------------------------------------
# aggregations: (values, mask, norms) -> scalar, on padding-zeroed values and a bool mask
# --------------------------------------------------------------------------------------------
def _num_sequences(mask: Tensor, norms: Normalisers, dtype: torch.dtype) -> Union[float, Tensor]:
    if norms.num_sequences is not None:
        return norms.num_sequences
    return (mask.sum(dim=-1) > 0).sum().clamp(min=1).to(dtype)


def seq_mean_token_mean(values: Tensor, mask: Tensor, norms: Normalisers) -> Tensor:
    """``1/N_seq sum_i 1/|o_i| sum_t v_it`` — DeepSeekMath Eq. 3's ``1/G sum_i 1/|o_i| sum_t``."""
    per_seq = values.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1).to(values.dtype)
    return per_seq.sum() / _num_sequences(mask, norms, values.dtype)


def token_mean(values: Tensor, mask: Tensor, norms: Normalisers) -> Tensor:
    """``sum_it v_it / N_tok`` — DAPO Eq. 12's ``1 / sum_i |o_i|``."""
    n_tok = norms.num_tokens if norms.num_tokens is not None else mask.sum().clamp(min=1).to(values.dtype)
    return values.sum() / n_tok


def seq_mean_token_sum_norm(values: Tensor, mask: Tensor, norms: Normalisers) -> Tensor:
    """``1/N_seq sum_i (sum_t v_it) / MAX_TOKENS`` — Dr.GRPO §3.2's constant normaliser."""
    if norms.max_tokens is None:
        raise ValueError(
            "aggregation 'seq_mean_token_sum_norm' needs max_tokens (the constant normaliser, "
            "e.g. the generation budget); pass max_tokens= or set Algorithm.max_tokens"
        )
    per_seq = values.sum(dim=-1) / float(norms.max_tokens)
    return per_seq.sum() / _num_sequences(mask, norms, values.dtype)


def group_token_mean(values: Tensor, mask: Tensor, norms: Normalisers) -> Tensor:
    """``1/N_groups sum_g (sum_{i in g} sum_t v_it) / (sum_{i in g} |o_i|)`` — DAPO Eq. 12 as written.

    DAPO (arXiv 2503.14476) Eq. 12 normalises by ``sum_{i=1}^G |o_i|`` *inside* the expectation over
    questions: a token mean per group, then a mean over groups (MiniMax-M1's Eq. 4 has the same
    form). ``"token_mean"`` instead divides by the token count of the whole batch, as verl and TRL
    do; the two agree when every group has the same number of tokens.
    """
    if norms.group_tokens is None or norms.num_groups is None:
        raise ValueError(
            "aggregation 'group_token_mean' needs the group structure: pass group_size= (contiguous "
            "groups of that size) or group_tokens= and num_groups= (the trainer passes them)")
    gt = norms.group_tokens.to(values.dtype).clamp(min=1)
    return (values.sum(dim=-1) / gt).sum() / norms.num_groups


#: aggregation mode -> ``(values [B, T], mask [B, T] bool, norms: Normalisers) -> scalar``;
#: ``values`` are in the compute dtype with padded positions set to 0.
AGGREGATIONS: dict[str, Callable[[Tensor, Tensor, Normalisers], Tensor]] = {
    "seq_mean_token_mean": seq_mean_token_mean,
    "token_mean": token_mean,
    "seq_mean_token_sum_norm": seq_mean_token_sum_norm,
    "group_token_mean": group_token_mean,
}


def _group_counts(mask: Tensor, group_size, group_tokens, num_groups):
    """``(group_tokens [B], num_groups)`` from ``group_size`` (contiguous groups of this batch) or as
    given (validated); ``(None, None)`` when neither is given."""
    if group_size is not None:
        if group_tokens is not None or num_groups is not None:
            raise ValueError("pass either group_size= or group_tokens= and num_groups=, not both")
        g = _v.positive_int("group_size", group_size)
        B = mask.shape[0]
        if B % g:
            raise ValueError(f"group_size={g} does not divide the batch of {B} rows (groups must be contiguous)")
        per_group = mask.sum(dim=-1).view(B // g, g).sum(dim=-1).to(torch.float64)
        return per_group.repeat_interleave(g), float((per_group > 0).sum().clamp(min=1))
    if (group_tokens is None) != (num_groups is None):
        raise ValueError("group_tokens= and num_groups= go together")
    if group_tokens is None:
        return None, None
    gt = _v.float_tensor(group_tokens, "group_tokens") if isinstance(group_tokens, Tensor) else None
    if gt is None or gt.shape != (mask.shape[0],):
        raise ValueError(f"group_tokens must be a float tensor of shape [B]=({mask.shape[0]},), "
                         f"got {getattr(group_tokens, 'shape', type(group_tokens).__name__)}")
    own = mask.sum(dim=-1).to(gt.dtype)
    if bool(((gt < own) | ~torch.isfinite(gt)).any()):
        raise ValueError("group_tokens must be finite and at least each row's own real-token count (it is the "
                         "token count of the row's whole group)")
    k = _v.positive_number("num_groups", num_groups)
    # each row holds own / group_tokens of its group's tokens: the groups this batch touches sum to at least that
    touched = float(torch.where(own > 0, own / gt.clamp(min=1), torch.zeros_like(own)).sum())
    if k < touched - 1e-6:
        raise ValueError(f"num_groups={k:g} is below the {touched:.6g} groups' worth of tokens in this batch "
                         "(num_groups counts the groups of the whole batch that micro-batches share)")
    return gt, k


def _normalisers(max_tokens, num_tokens, num_sequences, group_tokens=None, num_groups=None) -> Normalisers:
    return Normalisers(
        _v.positive_int("max_tokens", max_tokens, allow_none=True),
        None if num_tokens is None else _v.positive_number("num_tokens", num_tokens),
        None if num_sequences is None else _v.positive_number("num_sequences", num_sequences),
        group_tokens,
        None if num_groups is None else float(num_groups),
    )


def _check_counts(norms: Normalisers, n_tokens: float, n_sequences: float) -> None:
    """A global count below this batch's own count is a bug (it would inflate the loss)."""
    for name, given, present, what in (("num_tokens", norms.num_tokens, n_tokens, "real tokens"),
                                       ("num_sequences", norms.num_sequences, n_sequences, "non-empty rows")):
        if given is not None and given < present:
            raise ValueError(
                f"{name}={given:g} is smaller than the {present:g} {what} of this batch; it must be the "
                f"count over the whole batch (all micro-batches together), so at least this batch's")


def _reduce(values: Tensor, m: Tensor, mode: str, norms: Normalisers) -> Tensor:
    return AGGREGATIONS[mode](_masked(values, m, _v.compute_dtype(values)), m, norms)


def aggregate(
    values: Tensor,
    mask: Tensor,
    mode: str,
    *,
    max_tokens: Optional[int] = None,
    num_tokens: Optional[Number] = None,
    num_sequences: Optional[Number] = None,
    group_size: Optional[int] = None,
    group_tokens: Optional[Tensor] = None,
    num_groups: Optional[Number] = None,
) -> Tensor:
    """Reduce per-token values ``[B, T]`` to one scalar the way each paper averages token losses.

    With ``L_i = sum_t m_it`` and ``S`` the non-empty rows (:data:`AGGREGATIONS`):

    * ``"seq_mean_token_mean"`` — ``1/N_seq sum_{i in S} 1/L_i sum_t m_it v_it`` (DeepSeekMath Eq. 3);
    * ``"token_mean"`` — ``sum_it m_it v_it / N_tok`` (DAPO Eq. 12's normaliser batch-wide, as verl / TRL);
    * ``"seq_mean_token_sum_norm"`` — ``sum_it m_it v_it / max_tokens / N_seq`` (Dr.GRPO §3.2);
    * ``"group_token_mean"`` — ``1/N_groups sum_g (sum_{i in g} sum_t m_it v_it) / sum_{i in g} L_i``
      (DAPO Eq. 12 as written).

    Args:
        values, mask: ``[B, T]`` per-token values (any float dtype; padding may be NaN / inf); bool or 0/1 mask.
        mode: a key of :data:`AGGREGATIONS`.
        max_tokens: positive int, required for ``"seq_mean_token_sum_norm"``.
        num_tokens, num_sequences: ``N_tok`` / ``N_seq``, positive numbers (or 1-element tensors) at least this
            batch's counts (the default); a micro-batch passes the whole batch's, so results sum to the full one.
        group_size, group_tokens, num_groups: ``group_size`` alone, or ``group_tokens [B]`` (float: each row's
            group's token count) with ``num_groups``; validated whatever the mode.

    Returns:
        0-d float32 tensor (float64 for float64 values; 0 for an empty mask), differentiable w.r.t. ``values``.

    Raises:
        ValueError: unknown mode; shape mismatch; mask not 0/1; ``max_tokens`` missing or not a positive int;
            normalisers not positive or below this batch's counts; the group structure missing for
            ``"group_token_mean"``, given both ways, or inconsistent with the rows.
    """
    _v.choice("aggregation mode", mode, AGGREGATIONS)
    _v.bt_tensor(values, "values")
    m = _v.mask_bool(mask, values.shape)
    norms = _normalisers(max_tokens, num_tokens, num_sequences, *_group_counts(m, group_size, group_tokens, num_groups))
    if num_tokens is not None or num_sequences is not None:
        _check_counts(norms, *torch.stack([m.sum(), (m.sum(dim=-1) > 0).sum()]).tolist())
    return _reduce(values, m, mode, norms)


# --------------------------------------------------------------------------------------------
# KL estimators: delta = log pi_theta - log pi_ref  ->  per-token estimate of KL(pi_theta || pi_ref)
# --------------------------------------------------------------------------------------------
def k1(delta: Tensor) -> Tensor:
    """``D``: unbiased, high variance, negative for about half the tokens (Schulman 2020)."""
    return delta


def k2(delta: Tensor) -> Tensor:
    """``D^2 / 2``: biased (exact to second order), low variance, ``>= 0`` (Schulman 2020)."""
    return 0.5 * delta * delta


def k3(delta: Tensor) -> Tensor:
    """``exp(-D) + D - 1 >= 0`` (DeepSeekMath Eq. 4), stable for every finite D.

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


#: KL estimator -> ``(delta [B, T]) -> [B, T]``, ``delta = log pi_theta - log pi_ref`` of a token
#: sampled from pi_theta (Schulman 2020, "Approximating KL divergence")
KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {"k1": k1, "k2": k2, "k3": k3}


def _kl(logp: Tensor, ref_logp: Tensor, kind: str, old_logp: Optional[Tensor]) -> Tensor:
    """The estimate of ``kind``, times ``pi_theta / pi_old`` when ``old_logp`` is given (V3.2 Eq. 7)."""
    k = KL_ESTIMATORS[kind](logp - ref_logp)
    if old_logp is not None:
        k = torch.exp(torch.clamp(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)) * k
    return k


def kl_estimate(
    logp: Tensor,
    ref_logp: Tensor,
    kind: str = "k3",
    *,
    old_logp: Optional[Tensor] = None,
) -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from the sampled token's log-probs.

    With ``D = log pi_theta(o_t) - log pi_ref(o_t)`` and the token sampled from pi_theta (Schulman 2020,
    "Approximating KL divergence"): ``"k1"`` ``D`` (unbiased, high variance); ``"k2"`` ``D^2 / 2`` (biased,
    low variance, >= 0); ``"k3"`` ``exp(-D) + D - 1`` (DeepSeekMath Eq. 4; unbiased, >= 0), computed stably
    and continued along its tangent below ``D = -20`` (finite value and gradient).

    ``old_logp`` given: DeepSeek-V3.2 Eq. 7, the estimate times the *non-detached* ratio
    ``pi_theta / pi_old = exp(clamp(logp - old_logp, +-20))``, whose gradient is the unbiased gradient of
    the reverse KL for tokens drawn from pi_old (plain k3's gradient estimates the forward KL's; chapter 3).
    Allowed for every ``kind``; Eq. 7 is stated for k3.

    Args:
        logp: ``[B, T]`` current-policy log-probs (grad flows here).
        ref_logp: ``[B, T]`` reference log-probs (detached).
        kind: a key of :data:`KL_ESTIMATORS` (``"k1"`` | ``"k2"`` | ``"k3"``).
        old_logp: optional ``[B, T]`` behaviour log-probs (detached).

    Returns:
        ``[B, T]`` float32 estimates in nats (float64 for float64 input), unmasked.

    Raises:
        ValueError: unknown kind, shape mismatch, non-floating inputs, NaN or inf anywhere in the inputs
            (mask padding with 0 first, as :func:`policy_loss` does).
    """
    _v.choice("KL estimator kind", kind, KL_ESTIMATORS)
    _v.bt_tensor(logp, "logp")
    _v.bt_tensor(ref_logp, "ref_logp", logp.shape)
    if old_logp is not None:
        _v.bt_tensor(old_logp, "old_logp", logp.shape)
    named = [("logp", logp), ("ref_logp", ref_logp)] + ([("old_logp", old_logp)] if old_logp is not None else [])
    bad = [n for n, x in named if not bool(torch.isfinite(x).all())]
    if bad:
        raise ValueError(f"kl_estimate: non-finite values (NaN or inf) in {', '.join(bad)}")
    cdt = _v.compute_dtype(logp, ref_logp, old_logp)
    old = None if old_logp is None else old_logp.detach().to(cdt)
    return _kl(logp.to(cdt), ref_logp.detach().to(cdt), kind, old)


# --------------------------------------------------------------------------------------------
# DeepSeek-V3.2 off-policy sequence masking
# --------------------------------------------------------------------------------------------
def _keep_sequences(diff: Tensor, adv: Tensor, m: Tensor, delta: float) -> Tensor:
    """M of V3.2 Eq. 9 from ``diff = log pi_old - log pi_theta`` (0 at padding) and ``adv``."""
    div = diff.sum(dim=-1) / m.sum(dim=-1).clamp(min=1).to(diff.dtype)  # d_i, [B]
    far = div > float(delta)
    return ~((adv < 0) & (far if adv.dim() == 1 else far.unsqueeze(1)))


def offpolicy_sequence_mask(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    delta: float,
) -> Tensor:
    """DeepSeek-V3.2 (arXiv 2512.02556) Eqs. 8-9, *Off-Policy Sequence Masking*: the mask M.

    With ``d_i = 1/|o_i| sum_t log(pi_old(o_it) / pi_theta(o_it))`` over sequence i's real tokens (a
    length-normalised KL(pi_old || pi_theta) estimate, computed without gradient; 0 for an empty row)::

        M_it = 0   if  A_it < 0  and  d_i > delta,   else 1

    Only negative-advantage sequences are masked.

    Args:
        old_logp: ``[B, T]`` behaviour log-probs log pi_old.
        logp: ``[B, T]`` current log-probs log pi_theta (detached here).
        advantages: ``[B]`` per sequence or ``[B, T]`` per token.
        mask: ``[B, T]`` bool or 0/1, 1 = real token.
        delta: finite threshold ``>= 0`` (V3.2 does not report its value).

    Returns:
        bool M (True = keep), ``[B]`` for ``[B]`` advantages, ``[B, T]`` for ``[B, T]`` advantages.

    Raises:
        ValueError: shape mismatches, mask not 0/1, non-finite values at real tokens, ``delta``
            negative, non-finite or not a real number.
    """
    delta = _v.real_number("delta", delta, minimum=0.0)
    _v.bt_tensor(old_logp, "old_logp")
    shape = old_logp.shape
    _v.bt_tensor(logp, "logp", shape)
    m = _v.mask_bool(mask, shape)
    a = _v.float_tensor(advantages, "advantages")
    if not ((a.dim() == 1 and a.shape[0] == shape[0]) or a.shape == shape):
        raise ValueError(
            f"advantages must have shape [B]={shape[0]} or [B, T]={tuple(shape)}, got {tuple(a.shape)}")
    cdt = _v.compute_dtype(old_logp, logp, a)
    zero = torch.zeros((), dtype=cdt, device=logp.device)
    with torch.no_grad():
        diff = torch.where(m, old_logp.detach().to(cdt) - logp.detach().to(cdt), zero)
        if not bool(torch.isfinite(diff).all()):
            raise ValueError("offpolicy_sequence_mask: non-finite log-probs at real (mask=1) tokens")
        a_c = a.detach().to(cdt)
        a_real = a_c if a.dim() == 1 else torch.where(m, a_c, zero)
        if not bool(torch.isfinite(a_real).all()):
            raise ValueError("offpolicy_sequence_mask: non-finite advantages")
        return _keep_sequences(diff, a_real, m, delta)


# --------------------------------------------------------------------------------------------
# the whole objective
# --------------------------------------------------------------------------------------------
class _Inputs(NamedTuple):
    """policy_loss inputs after validation: compute dtype, padded positions set to 0."""

    logp: Tensor  # [B, T], grad flows
    old: Tensor  # [B, T], detached
    adv: Tensor  # [B, T], detached, broadcast from [B]
    ref: Optional[Tensor]  # [B, T], detached
    mask: Tensor  # [B, T] bool
    zero: Tensor  # 0-d zero of the compute dtype
    norms: Normalisers


def _check_algorithm(algo: Any) -> None:
    """``algo`` must be a :class:`grpo_lab.algo.algorithms.Algorithm` (checked by what the loss reads of it,
    so that this module needs no import of :mod:`grpo_lab.algo.algorithms`, which imports it)."""
    if not all(callable(getattr(algo, k, None)) for k in ("values_for", "axes")) or not hasattr(algo, "surrogate"):
        raise ValueError(f"algo must be a grpo_lab.algo.algorithms.Algorithm, got {type(algo).__name__}")


def loss_functions(algo: Algorithm) -> list:
    """``[(label, function)]`` of the registry functions :func:`policy_loss` calls for ``algo`` that may declare
    inputs: its surrogate, the surrogate's whole-batch statistics, its mismatch correction (if any) and its
    aggregation; ``label`` names each (``"surrogate='ppo'"``) for error messages."""
    fn = SURROGATES[algo.surrogate]
    out = [(f"surrogate={algo.surrogate!r}", fn)]
    out += [(f"statistic {k!r} of surrogate={algo.surrogate!r}", st) for k, st in _hp.spec(fn).batch_statistics.items()]
    mismatch = getattr(algo, "mismatch", None)
    if mismatch is not None:
        out.append((f"mismatch={mismatch!r}", MISMATCH_CORRECTIONS[mismatch]))
    out.append((f"aggregation={algo.aggregation!r}", AGGREGATIONS[algo.aggregation]))
    return out


def loss_inputs(algo: Algorithm) -> tuple:
    """The names of :data:`grpo_lab.algo.hparams.INPUTS` that ``algo``'s loss functions declare
    (:func:`loss_functions`), each once: what the trainer passes as ``policy_loss(..., inputs=)``."""
    out: list = []
    for _, fn in loss_functions(algo):
        out += [k for k in _hp.spec(fn).inputs if k not in out]
    return tuple(out)


#: the inputs of :data:`grpo_lab.algo.hparams.INPUTS` given per token (``[B, T]``); the others are per row (``[B]``)
_TOKEN_INPUTS = ("behaviour_logp", "entropy")


def _prepared_inputs(x: "_Inputs", algo: Algorithm, inputs: Optional[Mapping[str, Tensor]]) -> dict:
    """The inputs ``algo``'s loss functions declare, taken from ``inputs`` and checked: ``[B, T]`` ones in the
    compute dtype with padding set to 0 (``behaviour_logp`` finite and <= 0 at real tokens), ``[B]`` ones on
    the mask's device. An input nobody declares is not handed over.

    Raises:
        ValueError: a declared input missing (naming the function and the input), of the wrong shape, or
            (``behaviour_logp``) not log-probabilities at real tokens.
    """
    given = dict(inputs or {})
    out = {}
    B, T = x.mask.shape
    for label, fn in loss_functions(algo):
        for name in _hp.spec(fn).inputs:
            if name in out:
                continue
            if given.get(name) is None:
                raise ValueError(f"{label} ({getattr(fn, '__name__', fn)}) declares the input {name!r} "
                                 f"({_hp.INPUTS[name]}), which was not given: pass policy_loss(..., inputs={{{name!r}: "
                                 "...}}) (the Trainer supplies every declared input)")
            t = given[name]
            want = (B, T) if name in _TOKEN_INPUTS else (B,)
            if not isinstance(t, Tensor) or tuple(t.shape) != want:
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"input {name!r} of {label} must be a tensor of shape {want}, got {got}")
            out[name] = _masked(t.detach(), x.mask, x.zero.dtype) if name in _TOKEN_INPUTS else t.to(x.mask.device)
    beh = out.get("behaviour_logp")
    if beh is not None and not bool((torch.isfinite(beh) & (beh <= 0)).all()):
        raise ValueError("input 'behaviour_logp' must hold finite log-probabilities (<= 0) at real (mask=1) tokens")
    return out


def _context(x: "_Inputs", algo: Algorithm, groups: tuple, stats: Optional[Mapping[str, Tensor]],
             inputs: Optional[Mapping[str, Tensor]] = None) -> tuple[LossContext, dict]:
    """The :class:`LossContext` of validated inputs (the ratio axis' log-ratio, the declared ``inputs``, already
    prepared by :func:`_prepared_inputs`, and the surrogate's whole-batch statistics: ``stats``, or computed here
    over this batch when ``None``), and the statistics' metrics (``{}`` when ``stats`` were given)."""
    ratio_fn = RATIOS[algo.ratio_level]
    log_ratio = ratio_fn(x.logp, x.old, x.mask, **algo.values_for(ratio_fn))
    group_size, group_tokens, _ = groups
    norms = x.norms
    ctx = LossContext(x.logp, x.old, log_ratio, x.adv, x.mask, x.ref, group_size, group_tokens,
                      norms.num_tokens, norms.num_sequences, {}, **dict(inputs or {}))
    fn = SURROGATES[algo.surrogate]
    declared = _hp.spec(fn).batch_statistics
    if not declared:
        return ctx, {}
    if stats is None:
        computed, metrics = _statistics(ctx, fn, algo)
        return ctx._replace(stats=computed), metrics
    missing = [k for k in declared if k not in stats]
    bad = [k for k in declared if k in stats and (not isinstance(stats[k], Tensor) or stats[k].dim() == 0
                                                  or stats[k].shape[0] != x.mask.shape[0])]
    if missing or bad:
        raise ValueError(f"stats must hold the whole-batch statistics {sorted(declared)} of surrogate={algo.surrogate!r}, each a "
                         f"tensor with one row per sequence ({x.mask.shape[0]}); missing {missing}, wrong {bad}")
    return ctx._replace(stats={k: stats[k].to(x.mask.device) for k in declared}), {}


def _statistics(ctx: LossContext, fn: Callable, algo: Algorithm) -> tuple[dict, dict]:
    """Each whole-batch statistic ``fn`` declares, over ``ctx``, without gradient: ``({name: Tensor [B, ...]},
    {metric: float})``. A statistic returns a tensor with one row per sequence (any trailing shape), or
    ``(tensor, {metric name: number})`` whose metrics reach the step's history."""
    out, metrics = {}, {}
    with torch.no_grad():
        for name, stat in _hp.spec(fn).batch_statistics.items():
            v = stat(ctx, **algo.values_for(stat))
            if isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], Mapping):
                v, extra = v
                clash = sorted(set(extra) & set(METRIC_KEYS))
                if clash:
                    raise ValueError(f"whole-batch statistic {name!r} of surrogate={algo.surrogate!r} returns metrics "
                                     f"named like built-in metrics {clash}; rename them")
                metrics.update({k: float(m) for k, m in extra.items()})
            if not isinstance(v, Tensor) or v.dim() == 0 or v.shape[0] != ctx.mask.shape[0]:
                got = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
                raise ValueError(f"whole-batch statistic {name!r} of surrogate={algo.surrogate!r} must be a tensor of shape "
                                 f"[B, ...] with B = {ctx.mask.shape[0]} (one row per sequence: the trainer hands each "
                                 f"micro-batch its rows; a [B, T, ...] one also its tokens), or (tensor, {{metric: "
                                 f"float}}); got {got}")
            out[name] = v
    return out, metrics


def batch_statistics(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    algo: Algorithm,
    *,
    group_size: Optional[int] = None,
    group_tokens: Optional[Tensor] = None,
    inputs: Optional[Mapping[str, Tensor]] = None,
    return_metrics: bool = False,
):
    """The statistics over a whole minibatch that ``algo``'s surrogate declares
    (:func:`grpo_lab.algo.hparams.declare`), e.g. KL-Cov's covariance top-k: ``{name: Tensor [B, ...]}``
    without gradient, ``{}`` when it declares none.

    The trainer calls this once per minibatch, before micro-batching (with ``logp`` from a forward
    pass without gradient over the minibatch), and passes each micro-batch its rows as
    ``policy_loss(..., stats=)`` (a statistic whose first two dimensions are the mask's ``[B, T]`` also
    its tokens): the selection is then that of the whole minibatch, whatever ``micro_batch_size`` and
    ``sort_by_length``. :func:`policy_loss` without ``stats`` computes them over the batch it is given.

    Args:
        logp, old_logp, advantages, mask: as :func:`policy_loss` (``advantages`` ``[B]`` or ``[B, T]``).
        algo: a :class:`grpo_lab.algo.algorithms.Algorithm`.
        group_size, group_tokens: the group structure, as :func:`policy_loss`.
        inputs: the declared inputs, as :func:`policy_loss`.
        return_metrics: return ``(stats, {metric: float})``: the metrics the statistics emit.

    Raises:
        ValueError: as :func:`policy_loss` for the inputs.
    """
    _check_algorithm(algo)
    fn = SURROGATES[algo.surrogate]
    if not _hp.spec(fn).batch_statistics:
        return ({}, {}) if return_metrics else {}
    shape = _v.bt_tensor(logp, "logp").shape
    _v.bt_tensor(old_logp, "old_logp", shape)
    m = _v.mask_bool(mask, shape)
    cdt = _v.compute_dtype(logp, old_logp, advantages if isinstance(advantages, Tensor) else None)
    x = _Inputs(_masked(logp.detach(), m, cdt), _masked(old_logp.detach(), m, cdt),
                _masked(_broadcast_adv(advantages, shape, cdt), m, cdt), None, m,
                torch.zeros((), dtype=cdt, device=logp.device), Normalisers())
    with torch.no_grad():
        ctx, metrics = _context(x, algo, (group_size, group_tokens, None), None, _prepared_inputs(x, algo, inputs))
    return (ctx.stats, metrics) if return_metrics else ctx.stats


def _validated(logp, old_logp, advantages, mask, algo, ref_logp, num_tokens, num_sequences, max_tokens,
               groups=(None, None, None)) -> _Inputs:
    """Check every input of :func:`policy_loss` once (one device-to-host transfer for the values)."""
    _check_algorithm(algo)
    shape = _v.bt_tensor(logp, "logp").shape
    _v.bt_tensor(old_logp, "old_logp", shape)
    if ref_logp is not None:
        _v.bt_tensor(ref_logp, "ref_logp", shape)
    m = _v.mask_bool(mask, shape)
    if algo.uses_kl and ref_logp is None:
        raise ValueError(
            f"algorithm {algo.name!r} has a KL term (kl={algo.kl!r}, beta={algo.beta}) so ref_logp "
            "is required; pass ref_logp= or use an algorithm with beta=0 / kl=None"
        )
    norms = _normalisers(algo.max_tokens if max_tokens is None else max_tokens, num_tokens, num_sequences,
                         *_group_counts(m, *groups))
    cdt = _v.compute_dtype(logp, old_logp, ref_logp, advantages if isinstance(advantages, Tensor) else None)
    x = _Inputs(_masked(logp, m, cdt), _masked(old_logp.detach(), m, cdt),
                _masked(_broadcast_adv(advantages, shape, cdt), m, cdt),
                None if ref_logp is None else _masked(ref_logp.detach(), m, cdt),
                m, torch.zeros((), dtype=cdt, device=logp.device), norms)
    _check_values(x)
    return x


def _check_values(x: _Inputs) -> None:
    """Finite inputs, log-probs <= 0 and normalisers >= this batch's counts, at real tokens."""
    finite = {"logp": x.logp, "old_logp": x.old, "advantages": x.adv, "ref_logp": x.ref}
    finite = {k: t for k, t in finite.items() if t is not None}
    logprobs = {k: t for k, t in finite.items() if k != "advantages"}
    checks = [torch.isfinite(t).all() for t in finite.values()] + [(t <= 0).all() for t in logprobs.values()]
    counts = [x.mask.sum(), (x.mask.sum(dim=-1) > 0).sum()]
    host = torch.stack([c.to(torch.float64) for c in checks + counts]).tolist()
    bad = [k for k, ok in zip(finite, host) if not ok]
    if bad:
        raise ValueError(f"non-finite values (NaN or inf) at real (mask=1) tokens in: {', '.join(bad)}")
    for (k, t), ok in zip(logprobs.items(), host[len(finite):]):
        if not ok:
            b, i = (t > 0).nonzero()[0].tolist()
            raise ValueError(
                f"{k} must hold log-probabilities (<= 0), but {k}[{b}, {i}] = {float(t[b, i].detach()):.6g} > 0 at a "
                "real (mask=1) token; pass log pi of the sampled tokens, not logits or log-ratios")
    _check_counts(x.norms, *host[-2:])


def _kl_term(x: _Inputs, algo: Algorithm) -> Optional[Tensor]:
    """Per-token KL to pi_ref (with V3.2 Eq. 7's correction if asked); for the metric only, without
    gradient, when the loss has no KL term; None without ``ref_logp``."""
    if x.ref is None:
        return None
    if algo.uses_kl:
        return _kl(x.logp, x.ref, algo.kl, x.old if algo.kl_importance_correction else None)
    with torch.no_grad():
        return _kl(x.logp.detach(), x.ref, algo.kl or "k3", None)


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
    group_size: Optional[int] = None,
    group_tokens: Optional[Tensor] = None,
    num_groups: Optional[Number] = None,
    correct: Optional[Tensor] = None,
    num_correct_tokens: Optional[Number] = None,
    stats: Optional[Mapping[str, Tensor]] = None,
    inputs: Optional[Mapping[str, Tensor]] = None,
) -> LossOutput:
    """The full per-token objective of ``algo`` as a loss to minimise, plus diagnostics.

    Per token, each line ``algo``'s choice on one axis (the KL inside the token sum: DeepSeekMath Eq. 3)::

        rho_it  = RATIOS[algo.ratio_level](logp, old_logp, mask)         (as log rho)
        pg_it   = SURROGATES[algo.surrogate](ctx, **hyper-parameters)      (PPO: -min(rho A, clip(rho) A))
        pg_it   = w_it * pg_it, w = MISMATCH_CORRECTIONS[algo.mismatch]    (TIS / MIS, if set; w detached)
        pg_it   = M_it * pg_it                                            (V3.2 Eqs. 8-9, if set)
        loss_it = pg_it + beta * KL_ESTIMATORS[algo.kl](logp - ref_logp)  (if algo.uses_kl; V3.2 Eq. 7 if set)
        loss    = AGGREGATIONS[algo.aggregation](loss_it, mask, max_tokens or algo.max_tokens, ...)
                  + nll_coef * positive_nll_loss(logp, mask, correct)      (if algo.nll_coef > 0)

    A sequence masked by Eqs. 8-9 (:func:`offpolicy_sequence_mask`) still counts in every normaliser. With
    ``"sequence"`` ratios, ``[B]`` advantages and ``"seq_mean_token_mean"``: GSPO Eq. 5, its gradient Eq. 10.

    Args:
        logp, old_logp: ``[B, T]`` log pi_theta (grad flows here) and log pi_old (detached), any float dtype.
        advantages, mask: ``[B]`` or ``[B, T]`` advantages (detached); ``[B, T]`` bool or 0/1, 1 = real token.
        algo, ref_logp: an :class:`grpo_lab.algo.algorithms.Algorithm`; ``[B, T]`` log pi_ref, needed iff ``algo.uses_kl``.
        num_tokens, num_sequences, max_tokens, group_size, group_tokens, num_groups: as :func:`aggregate`.
        correct, num_correct_tokens: ``[B]`` bool and the global count of their tokens, for VAPO Eqs. 9-10.
        stats: the surrogate's whole-minibatch statistics (:func:`batch_statistics`); None: this batch's
            (their metrics then join ``metrics``).
        inputs: ``{name: Tensor}`` of :data:`grpo_lab.algo.hparams.INPUTS` (``[B, T]`` or ``[B]``): those the
            loss's functions declare (:func:`loss_inputs`) must be there; the others are not handed over.

    Returns:
        :class:`LossOutput` ``(loss, metrics)``: ``loss`` 0-d float32 with grad (float64 for float64
        inputs; 0 for an empty mask); ``metrics`` the keys of :data:`METRIC_KEYS`, described there.

    Raises:
        ValueError: ``algo`` not an Algorithm; shape mismatches; mask not 0/1; NaN / inf or a log-prob > 0 at a real
            token; no ``ref_logp`` with a KL term; what :func:`aggregate` refuses; ``nll_coef > 0`` without ``correct``.
    """
    groups = (group_size, group_tokens, num_groups)
    x = _validated(logp, old_logp, advantages, mask, algo, ref_logp, num_tokens, num_sequences, max_tokens, groups)
    given = _prepared_inputs(x, algo, inputs)
    agg_inputs = {k: given[k] for k in _hp.spec(AGGREGATIONS[algo.aggregation]).inputs}
    if agg_inputs:
        x = x._replace(norms=x.norms._replace(inputs=agg_inputs))
    ctx, stat_metrics = _context(x, algo, groups, stats, given)
    log_ratio = ctx.log_ratio
    pg_tok, indicators = _surrogate(ctx, algo)
    if getattr(algo, "mismatch", None) is not None:  # TIS / MIS: the detached weight, before the KL term (as TRL)
        fn = MISMATCH_CORRECTIONS[algo.mismatch]
        w, mis_ind = fn(ctx, **algo.values_for(fn))
        pg_tok = pg_tok * w
        indicators = {**indicators, **mis_ind}
    keep = None
    if algo.offpolicy_mask_delta is not None:  # DeepSeek-V3.2 Eqs. 8-9
        with torch.no_grad():
            keep = _keep_sequences(x.old - x.logp.detach(), x.adv, x.mask, algo.offpolicy_mask_delta)
        pg_tok = torch.where(keep, pg_tok, x.zero)
    kl_tok = _kl_term(x, algo)
    total = pg_tok + algo.beta * kl_tok if algo.uses_kl else pg_tok
    loss = _reduce(total, x.mask, algo.aggregation, x.norms)
    nll = None
    if algo.nll_coef > 0:  # VAPO Eqs. 9-10
        if correct is None:
            raise ValueError(f"{algo.name}: nll_coef={algo.nll_coef} (VAPO's positive-example LM loss) needs correct= "
                             "(a [B] bool tensor: which responses are correct)")
        nll = positive_nll_loss(x.logp, x.mask, correct, num_tokens=num_correct_tokens)
        loss = loss + algo.nll_coef * nll.to(loss.dtype)
    metrics = _loss_metrics(x, algo, loss, pg_tok, log_ratio, indicators, keep, kl_tok)
    if nll is not None:
        metrics["nll_loss"] = _metrics.total(float(nll.detach()))
    metrics.update({k: _metrics.seq_mean(v, metrics["num_sequences"]) for k, v in stat_metrics.items()})
    return LossOutput(loss, metrics)


def _surrogate(ctx: LossContext, algo: Algorithm) -> tuple[Tensor, dict]:
    """``SURROGATES[algo.surrogate]`` on ``ctx`` with its hyper-parameters' values."""
    fn = SURROGATES[algo.surrogate]
    return fn(ctx, **algo.values_for(fn))


# --------------------------------------------------------------------------------------------
# metrics of policy_loss
# --------------------------------------------------------------------------------------------
def _as_metric(name: str, value: float, n_tok: float, n_seq: float, kl_measured: bool,
               n_high: float = 0.0) -> _metrics.Metric:
    """The reduction of each metric of :func:`policy_loss` (see :mod:`grpo_lab.algo.metrics`)."""
    if name in ("loss", "pg_loss", "num_tokens", "num_sequences"):
        return _metrics.total(value)
    if name == "ratio_min":
        return _metrics.minimum(value, weight=n_tok)
    if name == "ratio_max":
        return _metrics.maximum(value, weight=n_tok)
    if name == "kl":
        return _metrics.token_mean(value, n_tok if kl_measured else 0.0)
    if name in ("offpolicy_masked_frac", "seq_clip_frac", "seq_ratio_mean", "seq_ratio_abs_dev"):
        return _metrics.seq_mean(value, n_seq)
    if name == "seq_ratio_min":
        return _metrics.minimum(value, weight=n_seq)
    if name == "seq_ratio_max":
        return _metrics.maximum(value, weight=n_seq)
    if name == "clip_high_prob_mean":
        return _metrics.token_mean(value, n_high)
    if name == "clip_high_prob_max":
        return _metrics.maximum(value, weight=n_high)
    return _metrics.token_mean(value, n_tok)


def _check_indicators(indicators: dict, surrogate: str, shape: tuple) -> None:
    """A surrogate's indicators hold ``grad``, both or neither of ``clip_low`` / ``clip_high`` (a surrogate
    without a clip reports no clip fraction), no name of :data:`METRIC_KEYS`, and each is ``[B, T]`` (per
    token) or ``[B]`` (per response); the keys of :data:`SURROGATE_METRICS` are per token."""
    missing = [k for k in ("grad",) if k not in indicators]
    if ("clip_low" in indicators) != ("clip_high" in indicators):
        missing.append("clip_high" if "clip_low" in indicators else "clip_low")
    if missing:
        raise ValueError(f"surrogate {surrogate!r} must return the per-token indicator 'grad', and 'clip_low' with "
                         f"'clip_high' (both or neither); missing {missing}")
    bad = [k for k, v in indicators.items() if not isinstance(v, Tensor) or tuple(v.shape) not in (shape, shape[:1])
           or (k in SURROGATE_METRICS and tuple(v.shape) != shape)]
    if bad:
        raise ValueError(f"surrogate {surrogate!r}: indicators {bad} must be tensors of shape [B, T] = {shape} (per "
                         f"token; {list(SURROGATE_METRICS)} always) or [B] = {shape[:1]} (per response)")
    clash = sorted(set(indicators) & set(METRIC_KEYS))
    if clash:
        raise ValueError(f"surrogate {surrogate!r} returns indicators named like built-in metrics {clash}; "
                         "rename them (they would replace those metrics)")


def _ratio_statistics(x: _Inputs, log_ratio: Tensor, n_f: Tensor) -> tuple[list, list, Tensor, Tensor]:
    """The ratio diagnostics of :func:`policy_loss` at real tokens (without gradient): the ratio axis' ratio
    (mean, min, max, 5/50/95% quantiles), the sequence ratio s_i = exp(mean_t log r_it) of every non-empty row
    (GSPO Eq. 7; mean, min, max, mean |s - 1|), the token ratio's mean |r - 1|, and the ratio at every real
    token (1-D, the quantiles' samples)."""
    m, zero = x.mask, x.zero
    ratio = torch.exp(torch.clamp(log_ratio.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))[m]
    if ratio.numel() > 0:
        r_stats = [ratio.mean(), ratio.min(), ratio.max(), *_quantiles(ratio, (0.05, 0.5, 0.95))]
    else:
        r_stats = [torch.ones_like(zero)] * 6
    seq_r = torch.exp(torch.clamp(_sequence_mean(x.logp.detach(), x.old, m), -LOG_RATIO_CLAMP,
                                  LOG_RATIO_CLAMP))[m.any(dim=-1)]
    if seq_r.numel() > 0:
        s_stats = [seq_r.mean(), seq_r.min(), seq_r.max(), (seq_r - 1.0).abs().mean()]
    else:
        s_stats = [torch.ones_like(zero)] * 3 + [zero]
    tok_r = torch.exp(torch.clamp(x.logp.detach() - x.old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return r_stats, s_stats, torch.where(m, (tok_r - 1.0).abs(), zero).sum() / n_f, ratio


def _loss_metrics(x: _Inputs, algo: Algorithm, loss, pg_tok, log_ratio, indicators, keep, kl_tok) -> dict:
    """The diagnostics of :func:`policy_loss`, by name, with one device-to-host transfer."""
    _check_indicators(indicators, algo.surrogate, tuple(x.mask.shape))
    m, zero = x.mask, x.zero
    clipping = "clip_low" in indicators
    with torch.no_grad():
        n_tok = m.sum()
        n_f = n_tok.clamp(min=1).to(zero.dtype)
        n_rows = (m.sum(dim=-1) > 0).sum().to(zero.dtype)
        counted = m if keep is None else m & keep  # tokens whose policy term is in the loss
        rows_counted = counted.any(dim=-1)  # responses with a counted token: what a per-response indicator averages
        frac = {k: (torch.where(counted, v, torch.zeros((), dtype=v.dtype, device=v.device)).sum() / n_f if v.dim() == 2
                    else torch.where(rows_counted, v, torch.zeros((), dtype=v.dtype, device=v.device)).sum()
                    / n_rows.clamp(min=1))
                for k, v in indicators.items()}
        r_stats, s_stats, tok_dev, ratios = _ratio_statistics(x, log_ratio, n_f)
        # a row is clipped when it has a counted token and the clip removes every one of them
        none = torch.zeros_like(m)
        cut = indicators["clip_low"].bool() | indicators["clip_high"].bool() if clipping else none
        seq_cut = counted.any(dim=-1) & ~(counted & ~cut).any(dim=-1)
        up = counted & indicators["clip_high"].bool() if clipping else none
        n_up = up.sum().to(zero.dtype)
        p_theta = torch.exp(x.logp.detach().to(zero.dtype))
        p_up = torch.where(up, p_theta, zero)
        values = {
            "loss": loss.detach(),
            "pg_loss": _reduce(pg_tok.detach(), m, algo.aggregation, x.norms),
            "kl": zero if kl_tok is None else torch.where(m, kl_tok.detach(), zero).sum() / n_f,
            "clip_frac_low": frac["clip_low"] if clipping else zero,
            "clip_frac_high": frac["clip_high"] if clipping else zero,
            "clip_frac": frac["clip_low"] + frac["clip_high"] if clipping else zero,
            **dict(zip(("ratio_mean", "ratio_min", "ratio_max", "ratio_q05", "ratio_q50", "ratio_q95"), r_stats)),
            "grad_token_frac": frac["grad"],
            "adv_abs_mean": x.adv.abs().sum() / n_f,
            "num_tokens": n_tok.to(zero.dtype),
            "num_sequences": n_rows,
            "offpolicy_masked_frac": zero if keep is None else (m & ~keep).any(dim=-1).sum().to(zero.dtype)
            / n_rows.clamp(min=1),
            "clip_high_prob_mean": p_up.sum() / n_up.clamp(min=1),
            "clip_high_prob_max": p_up.max() if p_up.numel() else zero,
            "token_prob_mean": torch.where(m, p_theta, zero).sum() / n_f,
            "seq_clip_frac": seq_cut.sum().to(zero.dtype) / n_rows.clamp(min=1),
            **dict(zip(("seq_ratio_mean", "seq_ratio_min", "seq_ratio_max", "seq_ratio_abs_dev"), s_stats)),
            "token_ratio_abs_dev": tok_dev,
            "clip_high_count": n_up,
            **{k: v for k, v in frac.items() if k not in SURROGATE_METRICS},
        }
        host = torch.stack([v.to(torch.float64).reshape(()) for v in values.values()]).tolist()
    vals = {k: (v if math.isfinite(v) else 0.0) for k, v in zip(values, host)}
    n, s, n_high = vals["num_tokens"], vals["num_sequences"], vals.pop("clip_high_count")
    if not clipping:  # a surrogate without a clip: no clip fraction (absent, not 0)
        for k in _CLIP_METRICS:
            vals.pop(k)
    per_response = {k for k, v in indicators.items() if v.dim() == 1}
    out = {k: (_metrics.seq_mean(v, s) if k in per_response else _as_metric(k, v, n, s, kl_tok is not None, n_high))
           for k, v in vals.items()}
    for k, q in _RATIO_QUANTILES.items():  # pooled over micro-batches, not averaged (reduce_micro_batches)
        out[k] = _metrics.sample_quantile(ratios, q, value=vals[k]) if ratios.numel() else out[k]
    return out


#: the ratio quantile metrics of :func:`policy_loss` and their levels
_RATIO_QUANTILES = {"ratio_q05": 0.05, "ratio_q50": 0.5, "ratio_q95": 0.95}


#: the metrics of a clip (absent for a surrogate that returns no ``clip_low`` / ``clip_high``)
_CLIP_METRICS = ("clip_frac_low", "clip_frac_high", "clip_frac", "clip_high_prob_mean", "clip_high_prob_max",
                 "seq_clip_frac")


# --------------------------------------------------------------------------------------------
# value model and VAPO's positive-example LM loss
# --------------------------------------------------------------------------------------------
#: The aggregation modes that :func:`value_loss` accepts, those that need no constant beyond the
#: global counts (``"seq_mean_token_sum_norm"`` needs ``max_tokens``, ``"group_token_mean"`` the
#: group structure, neither of which a value loss is given).
VALUE_LOSS_MODES = ("token_mean", "seq_mean_token_mean")


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_eps: Optional[float] = None,
    mode: str = "token_mean",
    num_tokens: Optional[Number] = None,
    num_sequences: Optional[Number] = None,
) -> Tensor:
    """The critic's loss: PPO's squared-error value loss (arXiv 1707.06347 Eq. 9), optionally clipped.

    Per real token, reduced with :func:`aggregate`::

        clip_eps is None:  0.5 (V - R)^2
        otherwise:         0.5 max[ (V - R)^2, (V_old + clip(V - V_old, -clip_eps, clip_eps) - R)^2 ]

    ``V = values`` (grad flows), ``V_old = old_values`` (at rollout time), ``R = returns`` (targets), both
    detached. Departure: the clipped form is not in the paper's text (OpenAI baselines' ``ppo2``).

    Args:
        values: ``[B, T]`` current value predictions (any float dtype).
        old_values: ``[B, T]`` rollout-time predictions (read only when clipping; always validated).
        returns: ``[B, T]`` value targets.
        mask: ``[B, T]`` bool or 0/1, 1 = real token; padded positions may hold anything.
        clip_eps: None or a finite number ``>= 0``.
        mode: one of :data:`VALUE_LOSS_MODES` (``"token_mean"``: VAPO's token-level loss).
        num_tokens, num_sequences: global counts for micro-batches (:func:`aggregate`).

    Returns:
        0-d float32 tensor (float64 for float64 inputs), differentiable w.r.t. ``values``; 0 for an empty mask.

    Raises:
        ValueError: inputs not floating ``[B, T]`` tensors of one shape; mask not 0/1; NaN / inf at a real
            token; ``clip_eps`` negative or not finite; unknown ``mode``; normalisers not positive or below
            this batch's counts.
    """
    _v.choice("value-loss aggregation mode", mode, VALUE_LOSS_MODES)
    shape = _v.bt_tensor(values, "values").shape
    _v.bt_tensor(old_values, "old_values", shape)
    _v.bt_tensor(returns, "returns", shape)
    m = _v.mask_bool(mask, shape)
    eps = None if clip_eps is None else _v.real_number("clip_eps", clip_eps, minimum=0.0)
    cdt = _v.compute_dtype(values, old_values, returns)
    v = _masked(values, m, cdt)
    v_old = _masked(old_values.detach(), m, cdt)
    ret = _masked(returns.detach(), m, cdt)
    finite = torch.stack([torch.isfinite(x.detach()).all() for x in (v, v_old, ret)]).tolist()
    bad = [n for n, ok in zip(("values", "old_values", "returns"), finite) if not ok]
    if bad:
        raise ValueError(f"non-finite values (NaN or inf) at real (mask=1) tokens in: {', '.join(bad)}")
    err = (v - ret).square()
    if eps is not None:
        v_clipped = v_old + torch.clamp(v - v_old, -eps, eps)
        err = torch.maximum(err, (v_clipped - ret).square())
    return aggregate(0.5 * err, m, mode, num_tokens=num_tokens, num_sequences=num_sequences)


def positive_nll_loss(
    logp: Tensor,
    mask: Tensor,
    correct: Tensor,
    *,
    num_tokens: Optional[Number] = None,
) -> Tensor:
    """VAPO's positive-example LM loss: the token-mean negative log-likelihood of the correct responses.

    VAPO (arXiv 2504.05118) Eq. 9, with ``T`` the correct responses of the batch (weight ``mu`` in Eq. 10)::

        L_NLL = - 1 / sum_{o_i in T} |o_i|  *  sum_{o_i in T} sum_t log pi_theta(a_t | s_t)

    Args:
        logp: ``[B, T]`` log pi_theta of the sampled tokens (grad flows here; float32 compute, float64 for
            float64); positions that do not count may hold anything.
        mask: ``[B, T]`` bool or 0/1, 1 = real token.
        correct: ``[B]`` bool (or 0/1), True for a correct response.
        num_tokens: the global count of correct responses' real tokens, for micro-batches; default this batch's.

    Returns:
        0-d float32 tensor (float64 for float64 input), differentiable w.r.t. ``logp``; 0 (still in the
        graph) without a correct response.

    Raises:
        ValueError: ``logp`` not a floating ``[B, T]`` tensor; mask not of its shape or not 0/1; ``correct``
            not a ``[B]`` tensor of bools or 0/1; NaN / inf or a log-prob > 0 at a counted token;
            ``num_tokens`` negative, not finite, or below this batch's count.
    """
    shape = _v.bt_tensor(logp, "logp").shape
    m = _v.mask_bool(mask, shape)
    if not isinstance(correct, Tensor) or correct.shape != (shape[0],):
        got = tuple(correct.shape) if isinstance(correct, Tensor) else type(correct).__name__
        raise ValueError(f"correct must be a [B] tensor with B={shape[0]} (True = correct response), got {got}")
    if correct.dtype != torch.bool:
        if correct.is_complex() or (correct.numel() and not bool(((correct == 0) | (correct == 1)).all())):
            raise ValueError("correct must hold bools or 0/1 (True = correct response); got other values")
        correct = correct != 0
    sel = m & correct.to(m.device).unsqueeze(1)  # the counted tokens: real tokens of correct responses
    cdt = _v.compute_dtype(logp)
    nll = _masked(-logp, sel, cdt)  # -log pi at counted tokens, +0 elsewhere (so an empty sum is +0, not -0)
    finite, nonpos, n = torch.stack([torch.isfinite(nll.detach()).all().to(torch.float64),
                                     (nll.detach() >= 0).all().to(torch.float64),
                                     sel.sum().to(torch.float64)]).tolist()  # one device-to-host transfer
    if not finite:
        raise ValueError("logp has non-finite values (NaN or inf) at real tokens of correct responses")
    if not nonpos:
        raise ValueError("logp must hold log-probabilities (<= 0) at real tokens of correct responses; got a "
                         "value > 0 (pass log pi of the sampled tokens, not logits)")
    denom = n
    if num_tokens is not None:
        if isinstance(num_tokens, Tensor):
            if num_tokens.numel() != 1:
                raise ValueError(f"num_tokens must be a scalar, got a tensor of shape {tuple(num_tokens.shape)}")
            num_tokens = float(num_tokens.detach().reshape(()))
        denom = _v.real_number("num_tokens", num_tokens, minimum=0.0)
        if denom < n:
            raise ValueError(
                f"num_tokens={denom:g} is smaller than the {n:g} real tokens of correct responses in this batch; it "
                "must be the count over the whole batch (all micro-batches together), so at least this batch's")
    return nll.sum() / max(denom, 1.0)
