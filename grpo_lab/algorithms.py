"""One dataclass that picks a choice on every axis of the GRPO family, plus named presets.

Every algorithm in the book is the same loop with different choices on a few independent axes
(design §1): how a response's advantage is computed, which importance ratio is used, what the
trust region clips, how token losses are averaged, and which KL regulariser is added. An
:class:`Algorithm` value names one choice per axis; :func:`grpo_lab.objectives.policy_loss` and
the trainer read nothing else. A new variant from a paper is a new preset, or one new choice on
one axis.

Only the choices implemented so far are accepted; the others (``"gae"`` advantages, the
``"sequence_token"`` ratio, CISPO's ``"is_weight"`` clipping, the DeepSeek-V3.2 importance-
corrected KL, and the DAPO / Dr.GRPO / GSPO / CISPO / VAPO / RPT presets) arrive in later issues.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Optional

from torch import Tensor

from . import advantages as _adv

__all__ = [
    "Algorithm",
    "ADVANTAGES",
    "RATIO_LEVELS",
    "CLIPS",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "GRPO",
    "PRESETS",
    "get_algorithm",
]

#: advantage estimators: (r-mean)/std (GRPO), r-mean (Dr.GRPO), group mean / batch std, RLOO
ADVANTAGES = ("group", "group_mean", "batch", "rloo")
#: importance-ratio level: per token (GRPO) or length-normalised sequence ratio (GSPO Eq. 7)
RATIO_LEVELS = ("token", "sequence")
#: clipping object: PPO clip of the update
CLIPS = ("ppo",)
#: aggregation of token losses into one scalar (see grpo_lab.objectives.aggregate)
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")
#: KL-to-reference estimators (Schulman 2020); None = no KL term
KL_ESTIMATORS = (None, "k1", "k2", "k3")

_ADV_TO_SCALE = {"group": "group", "group_mean": "none", "batch": "batch"}


def _finite_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


@dataclass(frozen=True)
class Algorithm:
    """A point in the design space: one choice per axis (design §1), immutable and validated.

    Fields:
        name: display name (used as the key in tables and plots).
        advantage: ``"group"`` — ``(r - mean_g) / (std_g + adv_eps)``, DeepSeekMath (arXiv
            2402.03300) §4.1.2; ``"group_mean"`` — ``r - mean_g``, Dr.GRPO (arXiv 2503.20783)
            §3.2; ``"batch"`` — group mean, batch std; ``"rloo"`` — leave-one-out baseline.
        adv_eps: ``>= 0``, added to the std (``"group"``, ``"batch"``).
        ratio_level: ``"token"`` — ``r_t = pi_theta / pi_old`` per token (DeepSeekMath Eq. 3);
            ``"sequence"`` — ``s_i = exp(mean_t log r_t)``, GSPO (arXiv 2507.18071) Eq. 7, shared
            by all tokens of sequence i.
        clip: ``"ppo"`` — ``min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``.
        eps_low: lower clip range, ``0 <= eps_low <= 1`` (``1 - eps_low`` is the floor of r).
        eps_high: upper clip range, ``>= 0`` (DAPO's clip-higher raises only this one).
        aggregation: ``"seq_mean_token_mean"`` (DeepSeekMath Eq. 3) | ``"token_mean"`` (DAPO,
            arXiv 2503.14476, Eq. 12) | ``"seq_mean_token_sum_norm"`` (Dr.GRPO constant
            normaliser; needs ``max_tokens`` here or at call time).
        max_tokens: positive int or None; the constant normaliser of
            ``"seq_mean_token_sum_norm"`` (the generation budget, Dr.GRPO's MAX_TOKENS).
        kl: ``None`` | ``"k1"`` | ``"k2"`` | ``"k3"`` — estimator of KL(pi_theta || pi_ref) added
            per token inside the token sum (DeepSeekMath Eq. 3-4 use k3).
        beta: ``>= 0`` KL coefficient (DeepSeekMath §4.2: 0.04). ``beta == 0`` or ``kl is None``
            means no KL term.

    Raises:
        ValueError: (in ``__post_init__``) an unknown choice on any axis, a negative or
            non-finite ``eps_low`` / ``eps_high`` / ``adv_eps`` / ``beta``, ``eps_low > 1``,
            a non-positive ``max_tokens``, or an empty ``name``.
    """

    name: str = "custom"
    advantage: str = "group"
    adv_eps: float = 1e-4
    ratio_level: str = "token"
    clip: str = "ppo"
    eps_low: float = 0.2
    eps_high: float = 0.2
    aggregation: str = "seq_mean_token_mean"
    max_tokens: Optional[int] = None
    kl: Optional[str] = "k3"
    beta: float = 0.04

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        for axis, value, allowed in (
            ("advantage", self.advantage, ADVANTAGES),
            ("ratio_level", self.ratio_level, RATIO_LEVELS),
            ("clip", self.clip, CLIPS),
            ("aggregation", self.aggregation, AGGREGATIONS),
            ("kl", self.kl, KL_ESTIMATORS),
        ):
            if value not in allowed:
                raise ValueError(f"unknown {axis} {value!r}; expected one of {allowed}")
        adv_eps = _finite_number("adv_eps", self.adv_eps)
        eps_low = _finite_number("eps_low", self.eps_low)
        eps_high = _finite_number("eps_high", self.eps_high)
        beta = _finite_number("beta", self.beta)
        if adv_eps < 0:
            raise ValueError(f"adv_eps must be >= 0, got {self.adv_eps!r}")
        if eps_low < 0 or eps_low > 1:
            raise ValueError(
                f"eps_low must be in [0, 1] (the ratio floor 1 - eps_low must be >= 0), got {self.eps_low!r}"
            )
        if eps_high < 0:
            raise ValueError(f"eps_high must be >= 0, got {self.eps_high!r}")
        if beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta!r}")
        if self.max_tokens is not None:
            if (
                isinstance(self.max_tokens, bool)
                or not isinstance(self.max_tokens, numbers.Integral)
                or self.max_tokens < 1
            ):
                raise ValueError(f"max_tokens must be a positive int or None, got {self.max_tokens!r}")

    # ----------------------------------------------------------------------------------------
    @property
    def uses_kl(self) -> bool:
        """True when the loss contains a KL term (``kl`` is set and ``beta > 0``)."""
        return self.kl is not None and self.beta > 0

    def advantages(self, rewards: Tensor, group_size: int) -> Tensor:
        """Advantages ``[B]`` (float32) of ``rewards [B]`` under this algorithm's estimator.

        Dispatches to :func:`grpo_lab.advantages.group_advantages` (``"group"``, ``"group_mean"``,
        ``"batch"``, with ``eps=adv_eps``) or :func:`grpo_lab.advantages.rloo_advantages`.

        Raises:
            ValueError: as those functions (NaN reward, ``B % group_size != 0``, ...).
        """
        if self.advantage == "rloo":
            return _adv.rloo_advantages(rewards, group_size)
        return _adv.group_advantages(rewards, group_size, scale=_ADV_TO_SCALE[self.advantage], eps=self.adv_eps)

    def axes(self) -> dict[str, Any]:
        """The choice on each axis of design §1 (keys in table order), for comparison tables.

        Keys: ``advantage``, ``ratio_level``, ``clip``, ``eps_low``, ``eps_high``,
        ``aggregation``, ``kl`` (None when the loss has no KL term), ``beta``.
        """
        return {
            "advantage": self.advantage,
            "ratio_level": self.ratio_level,
            "clip": self.clip,
            "eps_low": self.eps_low,
            "eps_high": self.eps_high,
            "aggregation": self.aggregation,
            "kl": self.kl if self.uses_kl else None,
            "beta": self.beta if self.uses_kl else 0.0,
        }

    def describe(self) -> dict[str, Any]:
        """Every field (``name`` first) as a plain dict; suitable for JSON and provenance."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "Algorithm":
        """A copy with some fields changed (validated again), e.g. ``GRPO.replace(beta=0.0)``."""
        return dataclasses.replace(self, **changes)


#: GRPO as in DeepSeekMath (arXiv 2402.03300) Eq. 3-4 and §4.1.2 / §4.2: token ratio, symmetric
#: clip eps = 0.2 (the paper's eps is not stated in its RL section; 0.2 is the usual PPO value),
#: 1/G sum_i 1/|o_i| sum_t aggregation, k3 KL inside the token sum with beta = 0.04, group
#: z-score advantages (unbiased std).
GRPO = Algorithm(
    name="GRPO",
    advantage="group",
    adv_eps=1e-4,
    ratio_level="token",
    clip="ppo",
    eps_low=0.2,
    eps_high=0.2,
    aggregation="seq_mean_token_mean",
    max_tokens=None,
    kl="k3",
    beta=0.04,
)

PRESETS: dict[str, Algorithm] = {"GRPO": GRPO}


def get_algorithm(name: str) -> Algorithm:
    """Look up a preset by name, case-insensitively (``"grpo"`` -> :data:`GRPO`).

    Raises:
        ValueError: unknown name (the message lists the known presets).
    """
    if isinstance(name, Algorithm):
        return name
    if isinstance(name, str):
        for key, algo in PRESETS.items():
            if key.lower() == name.strip().lower():
                return algo
    raise ValueError(f"unknown algorithm {name!r}; known presets: {sorted(PRESETS)}")
