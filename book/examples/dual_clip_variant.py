"""A variant of your own for grpo_lab, from outside the package: dual-clip PPO.

Dual-clip PPO (Ye et al., "Mastering Complex Control in MOBA Games with Deep Reinforcement
Learning", arXiv 1912.09729, Eq. 5; verl's ``clip_ratio_c``) bounds PPO's objective from below for
negative advantages: when ``A < 0`` and the ratio has grown far past ``1 + eps``, PPO-clip's
``r A`` is unbounded below, so the objective is ``max(min(r A, clip(r) A), c A)`` with ``c > 1``
(the paper's ``c = 3``). It brings a hyper-parameter of its own, ``dual_clip_c``: declared as a
keyword-only parameter of the surrogate, it lives in ``Algorithm.params`` of the algorithms that use
this surrogate only, and is validated, shown, settable (``DUAL_CLIP.replace(dual_clip_c=2.5)``,
``--set dual_clip_c=2.5``), saved in checkpoints and keyed in the run cache like any field.

Importing this module registers the surrogate (``surrogate="dual_clip"``) and the preset ``DUAL_CLIP``::

    python -m grpo_lab list --import book/examples/dual_clip_variant.py
    python -m grpo_lab DUAL_CLIP --import book/examples/dual_clip_variant.py --set dual_clip_c=2.5 --steps 2
"""

from __future__ import annotations

import torch

from grpo_lab.algo import hparams
from grpo_lab.algo.algorithms import GRPO, PRESETS
from grpo_lab.algo.objectives import LOG_RATIO_CLAMP, SURROGATES, LossContext


def _c_above_one(values: dict) -> None:
    """``dual_clip_c`` must be > 1 (at ``c <= 1`` the bound would cut ordinary negative-advantage tokens)."""
    if not values["dual_clip_c"] > 1:
        raise ValueError(f"dual_clip_c must be > 1, got {values['dual_clip_c']!r}")


@hparams.declare(validate=_c_above_one)
def dual_clip_surrogate(ctx: LossContext, *, eps_low: float = 0.2, eps_high: float = 0.2,
                        dual_clip_c: float = 3.0) -> tuple[torch.Tensor, dict]:
    """Per token, to minimise: ``-max(min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), c A)`` where
    ``A < 0``, PPO's ``-min(r A, clip(r) A)`` elsewhere; ``r = exp(clamp(log r, +-20))``.

    Indicators (bool ``[B, T]``): ``clip_low`` — ``A < 0`` and the gradient is cut (``r < 1 - eps_low``
    or ``r > c``); ``clip_high`` — ``A > 0`` and ``r > 1 + eps_high``; ``grad`` — the others with ``A != 0``.
    """
    a = ctx.advantages
    r = torch.exp(torch.clamp(ctx.log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    ppo = torch.minimum(r * a, torch.clamp(r, 1.0 - eps_low, 1.0 + eps_high) * a)
    objective = torch.where(a < 0, torch.maximum(ppo, dual_clip_c * a), ppo)
    with torch.no_grad():
        low = (a < 0) & ((r < 1.0 - eps_low) | (r > dual_clip_c))
        high = (a > 0) & (r > 1.0 + eps_high)
    return -objective, {"clip_low": low, "clip_high": high, "grad": (a != 0) & ~low & ~high}


SURROGATES["dual_clip"] = dual_clip_surrogate
#: GRPO with the dual clip at the paper's c = 3 and no KL term
DUAL_CLIP = GRPO.replace(name="DUAL_CLIP", surrogate="dual_clip", kl=None, beta=0.0)
PRESETS["DUAL_CLIP"] = DUAL_CLIP
