"""Four 2025 variants written from outside grpo_lab, the way a user adds them (issue 53): one function and one
registry line each, plus a preset; no private name of the package is touched.

Importing this module (``python -m grpo_lab CE_GPPO --import tests/extension/outside_variants.py``, or
``import outside_variants`` before ``grpo_lab.experiments.run``, whose worker processes import it again)
registers:

* ``SURROGATES["ce_gppo"]``, preset ``CE_GPPO``: CE-GPPO's gradient-preserving clip (arXiv 2509.20712).
* ``SURROGATES["bapo"]``, preset ``BAPO``: BAPO's clip bounds searched per minibatch (arXiv 2510.18927), the
  search one whole-minibatch statistic ``[B, 2]`` that reports both bounds as metrics.
* ``ADVANTAGE_ESTIMATORS["passk"]``, preset ``PASSK``: Pass@k-training's analytic advantages (arXiv 2508.10751)
  from the declared input ``correct``; ``group_size > passk_k`` checked against the run's ``TrainerConfig``.
* ``SURROGATES["tis_ppo"]``, preset ``TIS_PPO``: PPO's clip times the truncated sampler-learner weight
  ``min(pi_old / pi_sampler, tis_cap)`` (Yao et al. 2025), from the declared input ``behaviour_logp``; needs
  ``TrainerConfig.old_logp="recompute"``.
"""

from __future__ import annotations

import math

import torch

from grpo_lab.algo import hparams
from grpo_lab.algo.advantages import ADVANTAGE_ESTIMATORS, GROUP_BASELINE_ESTIMATORS, AdvantageBatch
from grpo_lab.algo.algorithms import GRPO, PRESETS
from grpo_lab.algo.objectives import LOG_RATIO_CLAMP, SURROGATES, LossContext

__all__ = ["ce_gppo_surrogate", "bapo_bounds", "bapo_surrogate", "passk_advantages", "tis_ppo_surrogate",
           "CE_GPPO", "BAPO", "PASSK", "TIS_PPO"]


def _ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


# ------------------------------------------------------------------------------------------------ CE-GPPO
def _gppo_values(values: dict) -> None:
    if not 0 <= values["eps_low"] <= 1 or values["eps_high"] < 0:
        raise ValueError(f"ce_gppo needs eps_low in [0, 1] and eps_high >= 0, got {values['eps_low']!r}, "
                         f"{values['eps_high']!r}")
    if values["gppo_beta1"] < 0 or values["gppo_beta2"] < 0:
        raise ValueError("ce_gppo needs gppo_beta1, gppo_beta2 >= 0")


@hparams.declare(validate=_gppo_values)
def ce_gppo_surrogate(ctx: LossContext, *, eps_low: float, eps_high: float, gppo_beta1: float = 0.75,
                      gppo_beta2: float = 1.0):
    """CE-GPPO (arXiv 2509.20712, Eq. 5; GPPO is beta1 = beta2 = 1): per token, to minimise,
    ``-beta1 (1 - eps_low) r / sg(r) A`` where ``A < 0, r < 1 - eps_low``; ``-beta2 (1 + eps_high) r / sg(r) A``
    where ``A > 0, r > 1 + eps_high``; ``-r A`` elsewhere (``r = exp(clamp(log r, +-20))``). Outside the range
    the value is the clipped one and the gradient is kept, scaled by beta. Indicators: no clip removes a
    gradient, so no ``clip_low`` / ``clip_high``; ``gppo_low`` / ``gppo_high`` (bool ``[B, T]``) mark the tokens
    outside the range; ``grad`` — ``A != 0`` (and ``beta != 0`` outside the range)."""
    a, r = ctx.advantages, _ratio(ctx.log_ratio)
    grad_only = r / r.detach()
    with torch.no_grad():
        low = (a < 0) & (r < 1.0 - eps_low)
        high = (a > 0) & (r > 1.0 + eps_high)
    loss = torch.where(low, -gppo_beta1 * (1.0 - eps_low) * grad_only * a,
                       torch.where(high, -gppo_beta2 * (1.0 + eps_high) * grad_only * a, -r * a))
    grad = (a != 0) & ~(low & (gppo_beta1 == 0)) & ~(high & (gppo_beta2 == 0))
    return loss, {"grad": grad, "gppo_low": low, "gppo_high": high}


# ------------------------------------------------------------------------------------------------ BAPO
def _pos_neg(r: torch.Tensor, a: torch.Tensor, m: torch.Tensor, c_low: float, c_high: float) -> float:
    """pos / neg of ``eff(r) A`` over real tokens (inf when neg is 0)."""
    eff = torch.where(a >= 0, torch.clamp(r, max=c_high), torch.clamp(r, min=c_low)) * a * m
    pos, neg = float(eff.clamp(min=0).sum()), float((-eff).clamp(min=0).sum())
    return math.inf if neg <= 0 else pos / neg


def bapo_bounds(ctx: LossContext, *, bapo_low_start: float = 0.6, bapo_low_max: float = 0.9,
                bapo_high_start: float = 1.2, bapo_high_max: float = 3.0, bapo_step: float = 0.05,
                bapo_rho0: float = 0.5):
    """BAPO's bound search (arXiv 2510.18927; WooooDyy/BAPO ``recipe/bapo/policy_loss.py``), once per minibatch:
    from ``[c_low, c_high] = [bapo_low_start, bapo_high_start]``, while ``pos / neg < bapo_rho0`` raise ``c_low``
    by ``bapo_step`` up to ``bapo_low_max``, then ``c_high`` up to ``bapo_high_max``. ``pos`` / ``neg``: the sums
    of the positive / negative parts of ``eff(r) A`` over real tokens, ``eff = min(r, c_high)`` for ``A >= 0``,
    ``max(r, c_low)`` for ``A < 0``. Returns ``([B, 2]`` float, each row ``(c_low, c_high)``, ``{"bapo_c_low",
    "bapo_c_high"})``. Departure: ``neg = 0`` reads ``inf`` without the reference's ``eps`` added to ``neg``."""
    r, a, m = _ratio(ctx.log_ratio.detach()), ctx.advantages, ctx.mask.to(ctx.advantages.dtype)
    lo, hi = bapo_low_start, bapo_high_start
    rho = _pos_neg(r, a, m, lo, hi)
    while rho < bapo_rho0 and lo < bapo_low_max:
        lo = min(lo + bapo_step, bapo_low_max)
        rho = _pos_neg(r, a, m, lo, hi)
    while rho < bapo_rho0 and hi < bapo_high_max:
        hi = min(hi + bapo_step, bapo_high_max)
        rho = _pos_neg(r, a, m, lo, hi)
    rows = torch.tensor([lo, hi], dtype=a.dtype, device=a.device).expand(a.shape[0], 2)
    return rows, {"bapo_c_low": lo, "bapo_c_high": hi}


def _bapo_values(values: dict) -> None:
    if not (0 < values["bapo_low_start"] <= values["bapo_low_max"] <= 1 <= values["bapo_high_start"]
            <= values["bapo_high_max"]) or values["bapo_step"] <= 0 or values["bapo_rho0"] < 0:
        raise ValueError("bapo needs 0 < bapo_low_start <= bapo_low_max <= 1 <= bapo_high_start <= bapo_high_max, "
                         "bapo_step > 0 and bapo_rho0 >= 0")


@hparams.declare(validate=_bapo_values, batch_statistics={"bapo_bounds": bapo_bounds})
def bapo_surrogate(ctx: LossContext):
    """BAPO's loss: PPO's clip with the minibatch's bounds of :func:`bapo_bounds` (explicit ratio bounds),
    ``-min(r A, clip(r, c_low, c_high) A)``. Departure from the reference: its dual clip (c = 3) is left off, as
    in grpo_lab's PPO presets. Indicators: ``clip_low`` (``A < 0``, ``r < c_low``), ``clip_high`` (``A > 0``,
    ``r > c_high``), ``grad`` — the others with ``A != 0``."""
    bounds = ctx.stats["bapo_bounds"]
    lo, hi = bounds[:, :1], bounds[:, 1:]
    a, r = ctx.advantages, _ratio(ctx.log_ratio)
    loss = -torch.minimum(r * a, torch.minimum(torch.maximum(r, lo), hi) * a)
    with torch.no_grad():
        low, high = (a < 0) & (r < lo), (a > 0) & (r > hi)
    return loss, {"clip_low": low, "clip_high": high, "grad": (a != 0) & ~low & ~high}


# ------------------------------------------------------------------------------------------------ Pass@k
def _k_positive(values: dict) -> None:
    if not (isinstance(values["passk_k"], int) and values["passk_k"] >= 1):
        raise ValueError(f"passk_k must be an int >= 1, got {values['passk_k']!r}")


def _group_above_k(config, values: dict) -> None:
    if config.group_size <= values["passk_k"]:
        raise ValueError(f"passk needs TrainerConfig.group_size > passk_k (with G <= k every advantage is 0), got "
                         f"group_size={config.group_size}, passk_k={values['passk_k']}")


@hparams.declare(inputs=("correct",), validate=_k_positive, validate_config=_group_above_k)
def passk_advantages(batch: AdvantageBatch, *, passk_k: int = 4) -> torch.Tensor:
    """Pass@k training's analytic advantages (arXiv 2508.10751, Sec. 3-4): per group of ``N`` responses with ``c``
    correct (the declared input ``correct``, whatever the shaped reward), ``R = 1 - C(N - c, k) / C(N, k)``,
    ``sigma = sqrt(R (1 - R))``, ``A_pos = (1 - R) / sigma`` for a correct response and
    ``A_neg = (1 - R - C(N - c - 1, k - 1) / C(N - 1, k - 1)) / sigma`` for a wrong one; ``sigma = 0`` gives 0.
    Returns ``[B]`` float32. Raises ``ValueError`` without ``batch.correct``."""
    if batch.correct is None:
        raise ValueError("passk reads the declared input 'correct': AdvantageBatch.from_groups(..., correct=...)")
    n, k = batch.group_size, int(passk_k)
    c = batch.correct.view(-1, n).to(torch.float64).sum(dim=1).tolist()
    out = torch.zeros(batch.correct.shape[0], dtype=torch.float64).view(-1, n)
    for g, cg in enumerate(int(x) for x in c):
        r = 1.0 - math.comb(n - cg, k) / math.comb(n, k)
        sigma = math.sqrt(max(r * (1.0 - r), 0.0))
        if sigma == 0:
            continue
        neg = (1.0 - r - math.comb(n - cg - 1, k - 1) / math.comb(n - 1, k - 1)) / sigma if cg < n else 0.0
        row = batch.correct.view(-1, n)[g].cpu()
        out[g] = torch.where(row, torch.tensor((1.0 - r) / sigma, dtype=torch.float64), torch.tensor(neg, dtype=torch.float64))
    return out.flatten().to(torch.float32).to(batch.rewards.device)


# ------------------------------------------------------------------------------------------------ TIS
def _cap_positive(values: dict) -> None:
    if not values["tis_cap"] > 0:
        raise ValueError(f"tis_cap must be > 0, got {values['tis_cap']!r}")


@hparams.declare(inputs=("behaviour_logp",), config={"old_logp": "recompute"}, validate=_cap_positive)
def tis_ppo_surrogate(ctx: LossContext, *, eps_low: float = 0.2, eps_high: float = 0.2, tis_cap: float = 2.0):
    """Truncated importance sampling against the sampler (Yao et al. 2025, "Your efficient RL framework secretly
    brings you off-policy RL training"): PPO's clipped loss times ``w = min(pi_old / pi_sampler, tis_cap)``
    per token (detached; ``log w`` clamped to +-20). Reads the declared ``behaviour_logp``; needs
    ``old_logp="recompute"`` (with ``"behaviour"`` ``w = 1``). Indicators: PPO's, and ``tis_capped``."""
    a, r = ctx.advantages, _ratio(ctx.log_ratio)
    with torch.no_grad():
        rho = _ratio(torch.where(ctx.mask, ctx.old_logp - ctx.behaviour_logp, torch.zeros_like(ctx.old_logp)))
        w = torch.clamp(rho, max=tis_cap)
    loss = -torch.minimum(r * a, torch.clamp(r, 1.0 - eps_low, 1.0 + eps_high) * a) * w
    with torch.no_grad():
        low, high = (a < 0) & (r < 1.0 - eps_low), (a > 0) & (r > 1.0 + eps_high)
    return loss, {"clip_low": low, "clip_high": high, "grad": (a != 0) & ~low & ~high, "tis_capped": rho > tis_cap}


SURROGATES["ce_gppo"] = ce_gppo_surrogate
SURROGATES["bapo"] = bapo_surrogate
SURROGATES["tis_ppo"] = tis_ppo_surrogate
ADVANTAGE_ESTIMATORS["passk"] = passk_advantages
GROUP_BASELINE_ESTIMATORS.add("passk")

#: CE-GPPO at the paper's beta1 = 0.75, beta2 = 1 with DAPO's eps 0.2 / 0.28 and token-mean loss, no KL
CE_GPPO = GRPO.replace(name="CE_GPPO", surrogate="ce_gppo", eps_low=0.2, eps_high=0.28, aggregation="token_mean",
                       kl=None, beta=0.0)
#: BAPO with the reference's start bounds [0.6, 1.2], maxima 0.9 / 3.0, step 0.05, rho0 0.5, token-mean loss
BAPO = GRPO.replace(name="BAPO", surrogate="bapo", aggregation="token_mean", kl=None, beta=0.0)
#: Pass@k training at k = 4 (needs group_size > 4), no KL
PASSK = GRPO.replace(name="PASSK", advantage="passk", kl=None, beta=0.0)
#: GRPO's clip with TIS against the sampler, C = 2, no KL
TIS_PPO = GRPO.replace(name="TIS_PPO", surrogate="tis_ppo", kl=None, beta=0.0)
PRESETS.update({"CE_GPPO": CE_GPPO, "BAPO": BAPO, "PASSK": PASSK, "TIS_PPO": TIS_PPO})
