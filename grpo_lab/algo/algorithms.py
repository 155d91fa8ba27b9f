"""One dataclass that picks a choice on every axis of the GRPO family, plus named presets.

Every algorithm in the book is the same loop with different choices on a few independent axes:
how a response's advantage is computed, which importance ratio is used, what the trust region
clips, how token losses are averaged, and which KL regulariser is added. Each axis is a registry,
a dict from a choice's name to one function, in the module of that axis:

=================  ==========================================================
``advantage``      :data:`grpo_lab.algo.advantages.ADVANTAGE_ESTIMATORS`
``ratio_level``    :data:`grpo_lab.algo.objectives.RATIOS`
``clip``           :data:`grpo_lab.algo.objectives.SURROGATES`
``aggregation``    :data:`grpo_lab.algo.objectives.AGGREGATIONS`
``kl``             :data:`grpo_lab.algo.objectives.KL_ESTIMATORS` (or None)
=================  ==========================================================

An :class:`Algorithm` value names one choice per axis and is checked against those registries
when it is built, so a function registered from outside the package (``SURROGATES["mine"] = f``)
is a valid choice (``GRPO.replace(clip="mine")``). :func:`grpo_lab.algo.objectives.policy_loss` and
the trainer read nothing else. A new variant from a paper is a new preset, or one new function
on one axis.

The *sampling & shaping* axis (which samples train, and how rewards are shaped) is read by
:mod:`grpo_lab.algo.selection`, not by the loss: DAPO's dynamic sampling, overlong filtering and soft
overlong punishment (arXiv 2503.14476, §3.2 and §3.4).

Two DeepSeek-V3.2 (arXiv 2512.02556, §3.1) options are off by default, so every preset defined
without them is unchanged: ``kl_importance_correction`` (the importance-corrected k3 of Eq. 7) and
``offpolicy_mask_delta`` (Off-Policy Sequence Masking, Eqs. 8-9). V3.2 reports neither its KL
coefficient nor its threshold delta, so it gets no fixed preset: :func:`deepseek_v32` builds one
from values the caller must choose.

Where the presets depart from the papers, and why: GRPO's clip range is not stated in
DeepSeekMath's RL section, so the GRPO preset takes PPO's usual 0.2; DAPO's soft overlong
punishment is sized in tokens for this book's 32-token budget with the paper's proportion
``L_cache = L_max / 5`` (see the comment above :data:`DAPO`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch
from torch import Tensor

from . import hparams as _hp
from . import objectives as _obj
from . import selection
from . import checks as _v
from .advantages import (ADVANTAGE_ESTIMATORS, VALUE_BASELINE_ESTIMATORS, AdvantageBatch, gae, outcome_token_rewards)

__all__ = [
    "Algorithm",
    "ADVANTAGES",
    "RATIO_LEVELS",
    "CLIPS",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "GRPO",
    "DAPO",
    "DR_GRPO",
    "CISPO",
    "GSPO",
    "GSPO_TOKEN",
    "PPO",
    "VAPO",
    "RPT",
    "RPT_SAMPLING",
    "RPT_HYBRID",
    "GMPO",
    "SAPO",
    "KL_COV",
    "CLIP_COV",
    "deepseek_v32",
    "PRESETS",
    "get_algorithm",
]

#: live, read-only views of the names in each axis' registry (register in the registry itself)
ADVANTAGES = ADVANTAGE_ESTIMATORS.keys()
#: live, read-only view of the ratio levels, the keys of :data:`grpo_lab.algo.objectives.RATIOS`
RATIO_LEVELS = _obj.RATIOS.keys()
#: live, read-only view of the clipping choices, the keys of :data:`grpo_lab.algo.objectives.SURROGATES`
CLIPS = _obj.SURROGATES.keys()
#: live, read-only view of the aggregations, the keys of :data:`grpo_lab.algo.objectives.AGGREGATIONS`
AGGREGATIONS = _obj.AGGREGATIONS.keys()
#: KL estimator names; ``kl=None`` (no KL term) is accepted as well
KL_ESTIMATORS = _obj.KL_ESTIMATORS.keys()


@dataclass(frozen=True)
class Algorithm:
    """A point in the design space: one choice per axis, immutable and validated.

    Attributes:
        name: display name (used as the key in tables and plots).
        advantage: a key of :data:`grpo_lab.algo.advantages.ADVANTAGE_ESTIMATORS`: ``"group"`` —
            ``(r - mean_g) / (std_g + adv_eps)``, DeepSeekMath (arXiv 2402.03300) §4.1.2;
            ``"group_mean"`` — ``r - mean_g``, Dr.GRPO (arXiv 2503.20783) §3.2; ``"batch"`` —
            group mean, batch std; ``"rloo"`` — leave-one-out baseline; ``"gae"`` — per-token GAE
            advantages from a critic's values (PPO, VAPO; :func:`grpo_lab.algo.advantages.gae_advantages`).
        adv_eps: ``>= 0``, added to the std (``"group"``, ``"batch"``).
        ratio_level: a key of :data:`grpo_lab.algo.objectives.RATIOS`: ``"token"`` —
            ``r_t = pi_theta / pi_old`` per token (DeepSeekMath Eq. 3);
            ``"sequence"`` — ``s_i = exp(mean_t log r_t)``, GSPO (arXiv 2507.18071) Eq. 7, shared
            by all tokens of sequence i; ``"sequence_token"`` — GSPO-token, Eqs. 13-17:
            ``s_it = sg[s_i] pi_theta(y_it) / sg[pi_theta(y_it)]``, equal to ``s_i`` in value, with
            each token's gradient weighted by its own advantage.
        clip: a key of :data:`grpo_lab.algo.objectives.SURROGATES`: ``"ppo"`` —
            ``min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``; ``"is_weight"`` —
            ``sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi_theta``, MiniMax-M1 (arXiv
            2506.13585) Eqs. 4-5: the clip bounds a detached importance weight and every token
            keeps its gradient.
        eps_low: lower clip range, ``0 <= eps_low <= 1`` (``1 - eps_low`` is the floor of r; for
            ``"is_weight"`` the paper's ``eps^IS_low``, 1 = no floor).
        eps_high: upper clip range, finite, ``>= 0`` (DAPO's clip-higher raises only this one;
            for ``"is_weight"`` the paper's ``eps^IS_high``, the cap of the weight).
        mask_eps_low, mask_eps_high: ``None`` (default) or finite ``>= 0`` (``mask_eps_low <= 1``):
            the token mask ``M`` of MiniMax-M1's unified form, Eqs. 6-7, read by ``clip="is_weight"``:
            a token's term is dropped when ``A > 0`` and ``r > 1 + mask_eps_high`` or ``A < 0``
            and ``r < 1 - mask_eps_low`` (PPO's implicit mask). Rejected with ``clip="ppo"``, whose
            clip already is that mask.
        aggregation: a key of :data:`grpo_lab.algo.objectives.AGGREGATIONS`:
            ``"seq_mean_token_mean"`` (DeepSeekMath Eq. 3) | ``"token_mean"`` (DAPO,
            arXiv 2503.14476, Eq. 12, as verl and TRL compute it: over the whole batch) |
            ``"group_token_mean"`` (Eq. 12 as written: a token mean per group, then the mean over
            groups) | ``"seq_mean_token_sum_norm"`` (Dr.GRPO constant normaliser; needs
            ``max_tokens`` here or at call time).
        max_tokens: positive int or None; the constant normaliser of
            ``"seq_mean_token_sum_norm"`` (the generation budget, Dr.GRPO's MAX_TOKENS).
        kl: ``None`` or a key of :data:`grpo_lab.algo.objectives.KL_ESTIMATORS` (``"k1"`` | ``"k2"`` |
            ``"k3"``) — estimator of KL(pi_theta || pi_ref) added
            per token inside the token sum (DeepSeekMath Eq. 3-4 use k3).
        beta: ``>= 0`` KL coefficient (DeepSeekMath §4.2: 0.04). ``beta == 0`` or ``kl is None``
            means no KL term.
        dynamic_sampling: DAPO Eq. 11 (§3.2) — the trainer keeps sampling questions and trains
            only on groups whose raw accuracy (``task.is_correct``) is strictly between 0 and 1,
            until the batch holds ``prompts_per_step`` such groups (bounded by
            ``TrainerConfig.max_gen_rounds``).
        overlong_filter: DAPO §3.4 *Overlong Filtering* — truncated samples (no EOS within the
            generation budget) are masked out of the loss (and of its token/sequence counts);
            they still count in their group's reward statistics.
        overlong_cache_len: ``None`` (off) or a positive int ``L_cache``: DAPO Eq. 13 *Soft
            Overlong Punishment* is added to the task reward, with ``L_max`` = the trainer's
            generation budget (``max_new_tokens``) and the penalty starting after
            ``L_max - L_cache`` tokens (see :func:`grpo_lab.algo.rewards.overlong_penalty`). The
            trainer raises ``ValueError`` when it does not fit the budget (``L_cache > L_max / 2``,
            see :func:`grpo_lab.algo.selection.overlong_cache_tokens`). A fixed count suits one budget
            only: prefer ``overlong_cache_frac``.
        overlong_cache_frac: ``None`` or a float in ``(0, 0.5]``: the same penalty with ``L_cache``
            a fraction of the generation budget, ``L_cache = max(1, floor(frac * L_max + 1/2))``
            tokens, so that the preset keeps its proportion at any budget. DAPO §4.1 uses
            ``L_cache = 4,096`` of ``L_max = 20,480``: ``0.2`` (the ``DAPO`` preset). At most one of
            ``overlong_cache_len`` and ``overlong_cache_frac`` is set.
        kl_importance_correction: DeepSeek-V3.2 (arXiv 2512.02556) Eq. 7 — the per-token KL
            estimate is multiplied by the (non-detached) importance ratio ``pi_theta / pi_old``
            (:func:`grpo_lab.algo.objectives.kl_estimate` with ``old_logp``), which makes its gradient
            the unbiased gradient of KL(pi_theta || pi_ref) for tokens sampled from pi_old. Only
            acts when the loss has a KL term (``uses_kl``); default ``False``.
        offpolicy_mask_delta: ``None`` (off) or a finite ``delta >= 0``: DeepSeek-V3.2 Eqs. 8-9
            *Off-Policy Sequence Masking* — the policy (clipped-surrogate) term of a sequence is
            dropped iff its advantage is negative and ``1/|o_i| sum_t log(pi_old / pi_theta) >
            delta`` (see :func:`grpo_lab.algo.objectives.offpolicy_sequence_mask`). ``delta >= 0``
            keeps a purely on-policy step (divergence exactly 0) unmasked.
        gamma, lam: GAE's discount and lambda, both in ``[0, 1]`` (Schulman et al., arXiv
            1506.02438, Eq. 16), read by ``advantage="gae"`` (:func:`grpo_lab.algo.advantages.gae_advantages`):
            ``A_t = sum_l (gamma lam)^l delta_{t+l}``. PPO and VAPO take ``gamma = 1`` (VAPO §5.1).
        lam_alpha: ``None`` (every response uses ``lam``) or ``alpha > 0``: VAPO (arXiv 2504.05118)
            Eq. 5, *length-adaptive GAE*: the policy's lambda of a response of ``l`` tokens is
            ``1 - 1/(alpha l)``, clamped to ``[0, 1)`` (:func:`grpo_lab.algo.advantages.length_adaptive_lam`).
        critic_lam: ``None`` (the critic's targets use the policy's lambda) or a lambda in ``[0, 1]``
            for the critic's targets alone: VAPO §4.1 *Decoupled-GAE* (from VC-PPO) takes 1.0, whose
            targets are the Monte-Carlo returns (unbiased whatever the critic predicts), while the
            policy keeps ``lam`` / ``lam_alpha``.
        value_clip_eps: ``None`` or ``>= 0``: the clip range of the critic's loss,
            ``0.5 max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)``
            (:func:`grpo_lab.algo.objectives.value_loss`); ``None`` = the plain squared error.
        nll_coef: ``mu >= 0``, VAPO Eqs. 9-10: ``L = L_PPO + mu L_NLL``, where ``L_NLL`` is the
            negative log-likelihood of the *correct* responses of the batch, averaged over their
            tokens (:func:`grpo_lab.algo.objectives.positive_nll_loss`); 0 = off. VAPO uses 0.1.
        ntp_coef: ``>= 0``, the weight of a next-token-prediction term on the task's ground truth,
            ``L = L_RL + ntp_coef L_NTP``, where ``L_NTP`` is the mean negative log-likelihood
            (temperature 1) of each question's demonstration (``task.demonstration(problem, rng)``
            followed by EOS) given its prompt, once per question of the minibatch; 0 = off. Not
            any paper's method: it exists for the "``L_LM + beta RL``" retelling of RPT, which
            chapter 7 runs as an ablation (:data:`RPT_HYBRID`); RPT itself (Eq. 4) is pure RL.
            Works with any task that has ``demonstration`` (the trainer refuses one without);
            a task that draws its demonstration from ``rng`` (the arithmetic task does) advances
            the trainer's generator, so its later prompts differ from a run without the term.
        params: the values of the hyper-parameters that the functions this algorithm names declare
            (their keyword-only parameters, :mod:`grpo_lab.algo.hparams`) and that are not fields above,
            e.g. ``{"tau_pos": 1.0, "tau_neg": 1.05}`` for SAPO's surrogate. Missing ones are filled
            in with the functions' defaults when the algorithm is built, so ``params`` always shows
            every value used; ``replace(tau_neg=1.2)`` sets one. A variant's own hyper-parameters
            are stored only in the algorithms that name its function. Read-only
            (:class:`grpo_lab.algo.hparams.Params`).

    Raises:
        ValueError: (in ``__post_init__``) a choice on any axis that is not in its registry, a
            negative or
            non-finite ``eps_low`` / ``eps_high`` / ``adv_eps`` / ``beta``, ``eps_low > 1``,
            a negative or non-finite ``mask_eps_low`` / ``mask_eps_high``, ``mask_eps_low > 1``, a
            ``mask_eps_*`` with ``clip="ppo"`` (a custom surrogate that ignores them is not
            detected),
            a non-positive ``max_tokens`` or ``overlong_cache_len``, an ``overlong_cache_frac``
            outside ``(0, 0.5]`` or set together with ``overlong_cache_len``, a non-bool
            ``dynamic_sampling`` / ``overlong_filter`` / ``kl_importance_correction``, a
            negative or non-finite ``offpolicy_mask_delta``, an empty ``name``, ``gamma`` / ``lam`` /
            ``critic_lam`` outside ``[0, 1]``, a ``lam_alpha`` that is not ``> 0``, or a negative
            ``value_clip_eps`` / ``nll_coef`` / ``ntp_coef``; a key of ``params`` that no named
            function declares, or a value of the wrong type; a constraint a named function declares
            on another axis (``requires``), or its ``validate`` (e.g. ``eps_low > 1`` with a
            ratio-space clip, ``"ppo"`` and ``"is_weight"``).
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
    dynamic_sampling: bool = False
    overlong_filter: bool = False
    overlong_cache_len: Optional[int] = None
    overlong_cache_frac: Optional[float] = None
    kl_importance_correction: bool = False
    offpolicy_mask_delta: Optional[float] = None
    mask_eps_low: Optional[float] = None
    mask_eps_high: Optional[float] = None
    gamma: float = 1.0
    lam: float = 0.95
    lam_alpha: Optional[float] = None
    critic_lam: Optional[float] = None
    value_clip_eps: Optional[float] = None
    nll_coef: float = 0.0
    ntp_coef: float = 0.0
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        _v.choice("advantage", self.advantage, ADVANTAGE_ESTIMATORS)
        _v.choice("ratio_level", self.ratio_level, _obj.RATIOS)
        _v.choice("clip", self.clip, _obj.SURROGATES)
        _v.choice("aggregation", self.aggregation, _obj.AGGREGATIONS)
        _v.choice("kl", self.kl, _obj.KL_ESTIMATORS, extra=(None,))
        for name in ("adv_eps", "eps_high", "beta"):
            _v.real_number(name, getattr(self, name), minimum=0.0)
        _v.real_number("eps_low", self.eps_low)
        _v.positive_int("max_tokens", self.max_tokens, allow_none=True)
        for name in ("dynamic_sampling", "overlong_filter", "kl_importance_correction"):
            _v.flag(name, getattr(self, name))
        self._check_overlong()
        self._check_masks()
        self._check_value_fields()
        self._coerce()
        object.__setattr__(self, "params", self._checked_params())

    def _check_overlong(self) -> None:
        """DAPO's soft overlong punishment: ``overlong_cache_len`` or ``overlong_cache_frac``."""
        _v.positive_int("overlong_cache_len (L_cache, tokens)", self.overlong_cache_len, allow_none=True)
        if self.overlong_cache_frac is not None:
            if not 0 < _v.real_number("overlong_cache_frac", self.overlong_cache_frac) <= 0.5:
                raise ValueError(
                    f"overlong_cache_frac (L_cache / L_max) must be in (0, 0.5], got {self.overlong_cache_frac!r}: "
                    "DAPO uses 0.2 (4,096 of 20,480 tokens), and a ramp over more than half the budget "
                    "penalises ordinary answers")
            if self.overlong_cache_len is not None:
                raise ValueError(
                    f"set overlong_cache_len (L_cache in tokens, got {self.overlong_cache_len!r}) or "
                    f"overlong_cache_frac (L_cache as a fraction of the budget, got {self.overlong_cache_frac!r}), "
                    "not both. To use a fixed count with a preset that holds a fraction (DAPO, CISPO), clear "
                    "the fraction: DAPO.replace(overlong_cache_frac=None, "
                    f"overlong_cache_len={self.overlong_cache_len}) in Python, or --set overlong_cache_frac=none "
                    f"--set overlong_cache_len={self.overlong_cache_len} on the command line")

    def _check_masks(self) -> None:
        """V3.2's ``offpolicy_mask_delta`` and MiniMax-M1's ``mask_eps_low`` / ``mask_eps_high``."""
        if self.offpolicy_mask_delta is not None and _v.real_number(
                "offpolicy_mask_delta", self.offpolicy_mask_delta) < 0:
            raise ValueError(
                f"offpolicy_mask_delta must be >= 0 (a threshold on a KL estimate; a negative one "
                f"would mask on-policy sequences) or None, got {self.offpolicy_mask_delta!r}")
        for name in ("mask_eps_low", "mask_eps_high"):
            if getattr(self, name) is not None:
                _v.real_number(name, getattr(self, name), minimum=0.0)
        if self.mask_eps_low is not None and self.mask_eps_low > 1:
            raise ValueError(f"mask_eps_low must be in [0, 1] (the floor 1 - mask_eps_low must be >= 0), "
                             f"got {self.mask_eps_low!r}")
        if self.clip == "ppo" and (self.mask_eps_low is not None or self.mask_eps_high is not None):
            raise ValueError("mask_eps_low / mask_eps_high are the token mask of MiniMax-M1's unified form "
                             "(Eqs. 6-7), read by clip='is_weight'; PPO's clip (clip='ppo') already applies that "
                             "mask with eps_low / eps_high, so set those instead")

    def _check_value_fields(self) -> None:
        """GAE's ``gamma`` / ``lam`` / ``critic_lam`` / ``lam_alpha``, the critic's clip, the NLL / NTP weights."""
        for name in ("gamma", "lam"):
            if not 0 <= _v.real_number(name, getattr(self, name)) <= 1:
                raise ValueError(f"{name} (GAE) must be in [0, 1], got {getattr(self, name)!r}")
        if self.critic_lam is not None and not 0 <= _v.real_number("critic_lam", self.critic_lam) <= 1:
            raise ValueError(f"critic_lam (the critic's GAE lambda) must be in [0, 1] or None, got {self.critic_lam!r}")
        if self.lam_alpha is not None and _v.real_number("lam_alpha", self.lam_alpha) <= 0:
            raise ValueError(f"lam_alpha (VAPO's length-adaptive lambda = 1 - 1/(alpha * length)) must be > 0 or None, "
                             f"got {self.lam_alpha!r}")
        if self.value_clip_eps is not None:
            _v.real_number("value_clip_eps", self.value_clip_eps, minimum=0.0)
        _v.real_number("nll_coef", self.nll_coef, minimum=0.0)
        _v.real_number("ntp_coef", self.ntp_coef, minimum=0.0)

    def _coerce(self) -> None:
        """Store plain python numbers (numpy / tensor scalars would break JSON provenance later)."""
        for name in ("adv_eps", "eps_low", "eps_high", "beta", "offpolicy_mask_delta", "mask_eps_low",
                     "mask_eps_high", "overlong_cache_frac", "gamma", "lam", "lam_alpha", "critic_lam",
                     "value_clip_eps", "nll_coef", "ntp_coef"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, float(getattr(self, name)))
        for name in ("max_tokens", "overlong_cache_len"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))

    # ---------------------------------------------------------------- hyper-parameters of functions
    def _checked_params(self) -> dict:
        """``params`` checked against the hyper-parameters the named functions declare, with every
        default filled in; then each function's constraints on the other axes and its ``validate``."""
        if not isinstance(self.params, Mapping):
            raise ValueError(f"params must be a mapping {{hyper-parameter: value}}, got {type(self.params).__name__}")
        named = _named_functions(self.advantage, self.ratio_level, self.clip, self.aggregation, self.kl)
        own = _own_hyperparameters(named)
        unknown = sorted(k for k in self.params if k not in own)
        if unknown:
            raise ValueError(_unknown_message(unknown, own, named))
        out = {}
        for k, default in own.items():
            if k in self.params:
                hint = next((h for _, _, fn in named if (h := _hp.annotation(fn, k)) is not None), None)
                out[k] = _typed(k, self.params[k], default, hint)
            elif default is _hp.REQUIRED:
                raise ValueError(f"hyper-parameter {k!r} (declared without a default) needs a value: params={{{k!r}: ...}}")
            else:
                out[k] = default
        for axis, key, fn in named:
            _check_declaration(self, axis, key, fn, out)
        return _hp.Params(out)

    def values_for(self, fn: Callable) -> dict[str, Any]:
        """The values of ``fn``'s own hyper-parameters (its keyword-only parameters) under this
        algorithm (:mod:`grpo_lab.algo.hparams`): ``{name: value}`` from :attr:`params`, else the field of
        that name, else ``fn``'s default; what :func:`grpo_lab.algo.objectives.policy_loss` and
        :meth:`estimate_advantages` pass as keywords (to a whole-batch statistic too). A name with
        neither a value nor a default is left out (the call then raises ``TypeError``)."""
        out = {}
        for k, default in _hp.own_hyperparameters(fn).items():
            if k in self.params:
                out[k] = self.params[k]
            elif k in _FIELD_NAMES:
                out[k] = getattr(self, k)
            elif default is not _hp.REQUIRED:
                out[k] = default
        return out

    def hyperparameters(self) -> dict[str, Any]:
        """``{name: value}`` of every hyper-parameter the functions this algorithm names declare
        (fields such as ``eps_low`` included), in declaration order."""
        out: dict[str, Any] = {}
        for _, _, fn in _named_functions(self.advantage, self.ratio_level, self.clip, self.aggregation, self.kl):
            for part in (fn, *_hp.spec(fn).batch_statistics.values()):
                for k, v in self.values_for(part).items():
                    out.setdefault(k, v)
        return out

    # ----------------------------------------------------------------------------------------
    @property
    def uses_kl(self) -> bool:
        """True when the loss contains a KL term (``kl`` is set and ``beta > 0``)."""
        return self.kl is not None and self.beta > 0

    def functions(self) -> dict[str, Any]:
        """The registry entries this algorithm calls, keyed ``"REGISTRY['key']"``: its advantage
        estimator, ratio, surrogate, aggregation, group selector (:data:`grpo_lab.algo.selection.SELECTORS`)
        and, when the loss has a KL term, its KL estimator. Raises nothing (the keys were
        validated when the algorithm was built; an entry removed since then maps to ``None``)."""
        used = [("ADVANTAGE_ESTIMATORS", ADVANTAGE_ESTIMATORS, self.advantage),
                ("RATIOS", _obj.RATIOS, self.ratio_level), ("SURROGATES", _obj.SURROGATES, self.clip),
                ("AGGREGATIONS", _obj.AGGREGATIONS, self.aggregation),
                ("SELECTORS", selection.SELECTORS, selection.selector_name(self))]
        if self.uses_kl:
            used.append(("KL_ESTIMATORS", _obj.KL_ESTIMATORS, self.kl))
        return {f"{registry}[{key!r}]": table.get(key) for registry, table, key in used}

    def estimate_advantages(self, batch: AdvantageBatch) -> Tensor:
        """Advantages of ``batch`` under this algorithm's estimator,
        ``ADVANTAGE_ESTIMATORS[self.advantage](batch, self)``: ``[B]`` or ``[B, T]`` float32.

        Raises:
            ValueError: ``batch`` not an :class:`~grpo_lab.algo.advantages.AdvantageBatch`; the estimator
                returned something other than a finite float tensor of shape ``[B]`` or the mask's
                ``[B, T]``; or as the estimator (NaN reward, groups not contiguous or of unequal
                size, ...).
        """
        if not isinstance(batch, AdvantageBatch):
            raise ValueError(f"batch must be a grpo_lab.algo.advantages.AdvantageBatch, got {type(batch).__name__}")
        fn = ADVANTAGE_ESTIMATORS[self.advantage]
        adv = fn(batch, self) if _hp.positional_count(fn) == 2 else fn(batch, **self.values_for(fn))
        B = batch.rewards.shape[0]
        shapes = [(B,)] + ([tuple(batch.mask.shape)] if batch.mask is not None else [])
        if not isinstance(adv, Tensor) or tuple(adv.shape) not in shapes or not adv.is_floating_point():
            got = tuple(adv.shape) if isinstance(adv, Tensor) else type(adv).__name__
            raise ValueError(f"advantage estimator {self.advantage!r} must return a float tensor of shape "
                             f"{' or '.join(map(str, shapes))}, got {got}")
        if adv.numel() and not bool(torch.isfinite(adv).all()):
            raise ValueError(f"advantage estimator {self.advantage!r} returned NaN or inf")
        return adv

    def value_targets(self, batch: AdvantageBatch, advantages: Optional[Tensor] = None) -> Tensor:
        """The critic's regression targets ``[B, T]`` (float32) for ``batch`` (which has ``values``
        and a ``mask``).

        * ``critic_lam`` set (VAPO §4.1, *Decoupled-GAE*): the returns of
          :func:`grpo_lab.algo.advantages.gae` at ``lam = critic_lam``, ``gamma`` (each sequence's
          reward at its last real token). At ``critic_lam = 1`` they are the Monte-Carlo returns
          ``sum_l gamma^l r_{t+l}``, which do not depend on the critic's own predictions.
        * ``critic_lam=None`` with a value-based estimator (``advantage`` in
          :data:`grpo_lab.algo.advantages.VALUE_BASELINE_ESTIMATORS`, e.g. ``"gae"``): ``advantages +
          values`` (``advantages`` default: this algorithm's own estimate), GAE's return at the
          policy's lambda: the target of a PPO critic that shares the policy's lambda.
        * ``critic_lam=None`` with any other estimator (a critic trained beside GRPO, say): the
          Monte-Carlo returns (GAE at ``lam = 1``), since a group advantage plus the critic's own
          value is no estimate of the return.

        Values at masked positions are ignored (NaN included); targets there are 0.

        Raises:
            ValueError: ``batch`` has no ``values`` or no ``mask``.
        """
        if batch.values is None or batch.mask is None:
            raise ValueError("value_targets needs a batch with values and mask (AdvantageBatch.from_groups(..., "
                             "mask=, values=))")
        values = batch.values.detach().to(torch.float32)
        lam = self.critic_lam
        if lam is None and self.advantage not in VALUE_BASELINE_ESTIMATORS:
            lam = 1.0
        if lam is not None:
            rewards = outcome_token_rewards(batch.rewards, batch.mask)
            return gae(rewards, values, batch.mask, gamma=self.gamma, lam=lam)[1].to(values.device)
        adv = self.estimate_advantages(batch) if advantages is None else advantages
        adv = adv.to(values.device, torch.float32)
        out = (adv if adv.dim() == 2 else adv[:, None]) + values
        return torch.where(batch.mask.to(out.device) != 0, out, torch.zeros_like(out))

    def advantages(self, rewards: Tensor, group_size: int) -> Tensor:
        """Advantages ``[B]`` (float32) of ``rewards [B]`` in contiguous groups of ``group_size``.

        ``estimate_advantages(AdvantageBatch.from_groups(rewards, group_size))``: for the built-in
        estimators :func:`grpo_lab.algo.advantages.group_advantages` (``"group"``, ``"group_mean"``,
        ``"batch"``, with ``eps=adv_eps``) or :func:`grpo_lab.algo.advantages.rloo_advantages`.

        Raises:
            ValueError: as those functions (NaN reward, ``B % group_size != 0``, ...).
        """
        return self.estimate_advantages(AdvantageBatch.from_groups(rewards, group_size))

    def axes(self) -> dict[str, Any]:
        """The choice on each axis (keys in table order), for comparison tables.

        Keys: ``advantage``, ``ratio_level``, ``clip``, ``eps_low``, ``eps_high``,
        ``aggregation``, ``kl`` (None when the loss has no KL term), ``beta``,
        ``kl_importance_correction`` (DeepSeek-V3.2 Eq. 7; False without a KL term), then the
        sampling & shaping axis: ``dynamic_sampling``, ``overlong_filter``, ``overlong_cache_len``
        and ``overlong_cache_frac`` (both None when the soft overlong punishment is off),
        ``offpolicy_mask_delta`` (V3.2 Eqs. 8–9;
        None when off), ``mask_eps_low``, ``mask_eps_high`` (MiniMax-M1 Eq. 7; None when off), then
        the value-model fields ``gamma``, ``lam`` (None when ``lam_alpha`` replaces it),
        ``lam_alpha``, ``critic_lam``, ``value_clip_eps``, all None unless the advantage estimator is
        value-based (:data:`grpo_lab.algo.advantages.VALUE_BASELINE_ESTIMATORS`, which alone reads them), and
        ``nll_coef`` (VAPO's positive-example LM loss, 0.0 when off) and ``ntp_coef`` (the
        next-token-prediction term of the hybrid ablation, 0.0 when off), then the hyper-parameters in
        :attr:`params` (those of a variant's own functions, e.g. SAPO's ``tau_pos`` / ``tau_neg``).
        """
        value_based = self.advantage in VALUE_BASELINE_ESTIMATORS
        return {
            "advantage": self.advantage,
            "ratio_level": self.ratio_level,
            "clip": self.clip,
            "eps_low": self.eps_low,
            "eps_high": self.eps_high,
            "aggregation": self.aggregation,
            "kl": self.kl if self.uses_kl else None,
            "beta": self.beta if self.uses_kl else 0.0,
            "kl_importance_correction": self.kl_importance_correction and self.uses_kl,
            "dynamic_sampling": self.dynamic_sampling,
            "overlong_filter": self.overlong_filter,
            "overlong_cache_len": self.overlong_cache_len,
            "overlong_cache_frac": self.overlong_cache_frac,
            "offpolicy_mask_delta": self.offpolicy_mask_delta,
            "mask_eps_low": self.mask_eps_low,
            "mask_eps_high": self.mask_eps_high,
            "gamma": self.gamma if value_based else None,
            "lam": self.lam if value_based and self.lam_alpha is None else None,
            "lam_alpha": self.lam_alpha if value_based else None,
            "critic_lam": self.critic_lam if value_based else None,
            "value_clip_eps": self.value_clip_eps if value_based else None,
            "nll_coef": self.nll_coef,
            "ntp_coef": self.ntp_coef,
            **self.params,
        }

    def describe(self) -> dict[str, Any]:
        """Every field (``name`` first, ``params`` last) as a plain dict; suitable for JSON and provenance."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "Algorithm":
        """A copy with some fields or hyper-parameters changed (validated again), e.g.
        ``GRPO.replace(beta=0.0)`` or ``SAPO.replace(tau_neg=1.2)``.

        A key that is not a field is a hyper-parameter of a function the result names and goes into
        :attr:`params` (``SAPO.replace(tau_neg=1.2)`` is ``SAPO.replace(params={**SAPO.params,
        "tau_neg": 1.2})``). Hyper-parameters that the result's functions no longer declare are
        dropped (``SAPO.replace(clip="ppo")`` keeps no temperatures).

        Raises:
            ValueError: a key that is neither a field nor a hyper-parameter of the result's functions
                (the message lists both), or as :class:`Algorithm`.
        """
        fields = {k: v for k, v in changes.items() if k in _FIELD_NAMES}
        extra = {k: v for k, v in changes.items() if k not in _FIELD_NAMES}
        axes = {a: fields.get(a, getattr(self, a)) for a in _AXES}
        try:
            named = _named_functions(**axes)
        except (KeyError, TypeError):  # an unknown choice: the dataclass names it
            return dataclasses.replace(self, **fields)
        own = _own_hyperparameters(named)
        unknown = sorted(k for k in extra if k not in own)
        if unknown:
            raise ValueError(_unknown_message(unknown, own, named))
        params = dict(fields.pop("params")) if "params" in fields else {
            k: v for k, v in self.params.items() if k in own}
        return dataclasses.replace(self, **fields, params={**params, **extra})


#: the axis fields, in the order :func:`_named_functions` takes them
_AXES = ("advantage", "ratio_level", "clip", "aggregation", "kl")


def _named_functions(advantage: str, ratio_level: str, clip: str, aggregation: str,
                     kl: Optional[str]) -> list[tuple[str, str, Callable]]:
    """``[(axis field, choice, function)]`` of the registry functions these choices name (the KL
    estimator only when ``kl`` is set). Raises ``KeyError`` for a choice not in its registry."""
    out = [("advantage", advantage, ADVANTAGE_ESTIMATORS[advantage]),
           ("ratio_level", ratio_level, _obj.RATIOS[ratio_level]), ("clip", clip, _obj.SURROGATES[clip]),
           ("aggregation", aggregation, _obj.AGGREGATIONS[aggregation])]
    if kl is not None:
        out.append(("kl", kl, _obj.KL_ESTIMATORS[kl]))
    return out


def _own_hyperparameters(named: list) -> dict[str, Any]:
    """``{name: default}`` of the hyper-parameters ``named``'s functions declare that are not
    :class:`Algorithm` fields: the ones :attr:`Algorithm.params` holds."""
    out: dict[str, Any] = {}
    for _, _, fn in named:
        for k, d in _hp.hyperparameters(fn).items():
            if k not in _FIELD_NAMES:
                out.setdefault(k, d)
    return out


def _unknown_message(unknown: list, own: dict, named: list) -> str:
    choices = ", ".join(f"{axis}={key!r}" for axis, key, _ in named)
    return (f"unknown key(s) {unknown}: neither an Algorithm field nor a hyper-parameter of this algorithm's "
            f"functions ({choices}), which declare {sorted(own) or 'none'} beyond the fields; fields: "
            f"{sorted(_FIELD_NAMES - {'params'})}")


def _typed(name: str, value: Any, default: Any, hint: Any = None) -> Any:
    """``value`` checked against the declared type: the annotation ``hint`` (``float``, ``int``, ``bool``,
    ``str``, or one of them ``Optional``), else the type of ``default``. float: a finite real number, stored
    as float; int: an integer; bool: a bool; str: a string; None where the annotation or a ``None``
    default allows it. Without either, a number, bool, string or None."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds = [a for a in args if a is not type(None) and a is not None]
    kind = kinds[0] if len(kinds) == 1 and kinds[0] in (bool, int, float, str) else None
    kind = kind or next((t for t in (bool, int, float, str) if isinstance(default, t)), None)
    if value is None and (type(None) in args or default is None):
        return None
    if kind is bool:
        return _v.flag(name, value)
    if kind is int:
        if not _v.is_int(value):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        return int(value)
    if kind is float:
        return float(_v.real_number(name, value))
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {value!r}")
        return value
    if isinstance(value, (bool, str)):
        return value
    return int(value) if _v.is_int(value) else float(_v.real_number(name, value))


def _check_declaration(algo: "Algorithm", axis: str, key: str, fn: Callable, own: dict) -> None:
    """What ``fn`` (the choice ``key`` on ``axis``) declares: its constraints on the other axes and
    the ``validate`` of its hyper-parameters' values."""
    spec = _hp.spec(fn)
    if spec.batch_statistics and axis != "clip":
        raise ValueError(f"{axis}={key!r} ({getattr(fn, '__name__', fn)}) declares whole-batch statistics, which only a "
                         "surrogate (the clip axis) may: the trainer computes them for the loss")
    for other, allowed in spec.requires.items():
        if getattr(algo, other, None) not in allowed:
            want = " or ".join(repr(a) for a in allowed)
            raise ValueError(f"{axis}={key!r} ({getattr(fn, '__name__', fn)}) requires {other}={want}, "
                             f"got {other}={getattr(algo, other, None)!r}")
    if spec.validate is not None:
        values = {k: own[k] if k in own else getattr(algo, k, d)
                  for k, d in _hp.hyperparameters(fn).items()}
        spec.validate(values)


#: the names of :class:`Algorithm`'s fields (hyper-parameters shared by several functions live there)
_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(Algorithm))


#: GRPO as in DeepSeekMath (arXiv 2402.03300) Eq. 3-4 and §4.1.2 / §4.2 — token ratio, symmetric
#: clip eps = 0.2 (the paper's eps is not stated in its RL section; 0.2 is the usual PPO value),
#: ``1/G sum_i 1/|o_i| sum_t`` aggregation, k3 KL inside the token sum with beta = 0.04, group
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

#: DAPO (Yu et al., arXiv 2503.14476), the final recipe of its Table 1 (every row added):
#:
#: * Clip-Higher, Eq. 10 and §4.1: ``eps_low = 0.2``, ``eps_high = 0.28``;
#: * token-level policy-gradient loss, Eq. 12 as written: inside the expectation over questions,
#:   each group's token sum is divided by that group's ``sum_i |o_i|``, then groups are averaged
#:   (``"group_token_mean"``). The anchors compute something else under the same name: verl's
#:   ``loss_agg_mode="token-mean"`` and TRL's ``loss_type="dapo"`` divide by the token count of the
#:   whole (mini)batch, i.e. ``"token_mean"`` here, which weighs a group by its share of the batch's
#:   tokens; ``DAPO.replace(aggregation="token_mean")`` is that variant (chapter 2 measures both);
#: * no KL term (§2.3); group z-score advantages with the std kept (Eq. 9), token ratio;
#: * Dynamic Sampling, Eq. 11 (keep groups with 0 < accuracy < 1, resample to fill the batch);
#: * Overlong Filtering (§3.4; the "+ Overlong Filtering" row of the progressive Table 1, which
#:   the later rows keep). For a recipe that relies on the soft penalty alone, without masking
#:   truncated samples, use ``DAPO.replace(overlong_filter=False)``;
#: * Soft Overlong Punishment, Eq. 13. The paper uses ``L_max = 20,480`` (the generation budget)
#:   and ``L_cache = 4,096``: the penalty starts at the *expected maximum length* 16,384, i.e.
#:   ``L_cache = L_max / 5`` past the longest response it expects. The preset stores that
#:   proportion, ``overlong_cache_frac = 0.2``, so it fits any generation budget
#:   (:func:`grpo_lab.algo.selection.overlong_cache_tokens` rounds it to whole tokens). On the book's
#:   arithmetic task (budget ``L_max = 32``) that is ``L_cache = 6``: the longest well-formed answer
#:   (``198+99+99;297+99;396;#396``) is 25 characters + EOS = 26 tokens = 32 - 6, so no
#:   well-formed response is punished. A fixed count, ``DAPO.replace(overlong_cache_frac=None,
#:   overlong_cache_len=n)``, is checked against the budget when the trainer starts.
#:
#: DAPO's reward is +1/-1 (Eq. 7); with a task's {0, 1} reward the -1 overlong penalty weighs
#: twice as much relative to the correct/incorrect gap. The paper's G = 16, lr 1e-6 and 16
#: minibatches per rollout are trainer settings (:class:`grpo_lab.training.trainer.TrainerConfig`).
DAPO = GRPO.replace(
    name="DAPO",
    eps_high=0.28,
    aggregation="group_token_mean",
    kl=None,
    beta=0.0,
    dynamic_sampling=True,
    overlong_filter=True,
    overlong_cache_frac=0.2,
)

#: Dr. GRPO, GRPO with the two biases of §3.1 removed (Liu et al., "Understanding R1-Zero-Like
#: Training: A Critical Perspective", arXiv 2503.20783, §3.2 and Listing 1).
#:
#: * ``advantage="group_mean"``: ``A_i = R_i - mean(R)``, no division by std(R) (removes the
#:   question-level difficulty bias: low-spread groups no longer get extra weight); up to the
#:   factor ``G/(G-1)`` this is the RLOO advantage (App. A, Eqs. 4-6);
#: * ``aggregation="seq_mean_token_sum_norm"``: each sequence's token *sum* is divided by the
#:   constant MAX_TOKENS instead of ``|o_i|`` (removes the response-level length bias), then
#:   averaged over sequences. ``max_tokens=None`` here: the constant is the generation budget,
#:   which the trainer passes to :func:`~grpo_lab.algo.objectives.policy_loss` as ``max_tokens``
#:   (its ``max_new_tokens``). The paper notes other constants only rescale the gradient;
#: * token ratio and symmetric PPO clip ``eps = 0.2`` (Eq. 2 keeps the PPO surrogate; 0.2 is the
#:   usual value, as in our GRPO preset);
#: * no KL term: the paper takes ``beta = 0`` throughout (its README example run too).
DR_GRPO = GRPO.replace(
    name="DR_GRPO",
    advantage="group_mean",
    aggregation="seq_mean_token_sum_norm",
    kl=None,
    beta=0.0,
)

#: CISPO (MiniMax-M1, arXiv 2506.13585, §3.1) clips the importance-sampling weight, not the update.
#:
#: * ``clip="is_weight"``, Eqs. 4-5: ``sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi_theta``, ratio
#:   ``r = pi_theta / pi_old`` per token (Eq. 1; not inverted);
#: * ``eps_low = 1.0``: the paper sets "a large value" for ``eps^IS_low``, i.e. no effective
#:   floor; a floor of ``1 - 1 = 0`` never binds because ``r > 0``;
#: * ``eps_high = 0.28``: **our choice** -- the paper tunes only ``eps^IS_high`` and does not
#:   report its value. 0.28 is DAPO's clip-higher, so that CISPO and DAPO bound the ratio at the
#:   same place and differ in what happens beyond it (capped weight against dropped token) -- and
#:   in DAPO's overlong filter, off here (below), which acts only on truncated responses: the two
#:   presets are a one-axis comparison only where (almost) no response is truncated (chapter 5
#:   measures it).
#:   The anchors spell the cap differently: TRL caps the ratio at an *absolute* ``epsilon_high``
#:   (its documentation recommends 5.0), verl clips two-sided and relative (0.8 / 1.2 unless
#:   ``clip_ratio_low=1.0`` removes the floor); this preset is TRL's ``epsilon_high=1.28``;
#: * ``aggregation="group_token_mean"``: Eq. 4's ``1 / sum_i |o_i|`` sits inside the expectation
#:   over questions, per group, as in DAPO's Eq. 12 (verl and TRL divide by the batch's token
#:   count instead: ``"token_mean"``); no KL term (§3.1);
#: * DAPO's dynamic sampling and soft length penalty "are also used" (§3.1); overlong *filtering*
#:   is not mentioned, so it is off (``overlong_cache_frac = 0.2`` as in :data:`DAPO`);
#: * group z-score advantages (Eq. 2). MiniMax-M1's AdamW betas (0.9, 0.95) are a trainer setting
#:   (``TrainerConfig.betas``); its AdamW eps of 1e-15 is not exposed (the trainer uses torch's
#:   default, 1e-8).
CISPO = GRPO.replace(
    name="CISPO",
    clip="is_weight",
    eps_low=1.0,
    eps_high=0.28,
    aggregation="group_token_mean",
    kl=None,
    beta=0.0,
    dynamic_sampling=True,
    overlong_filter=False,
    overlong_cache_frac=0.2,
)

#: GSPO (Zheng et al., "Group Sequence Policy Optimization", arXiv 2507.18071), Eqs. 5-7 and §5.1:
#:
#: * ``ratio_level="sequence"``, Eq. 7: ``s_i = (pi_theta(y_i) / pi_old(y_i))^(1/|y_i|)``, the
#:   length-normalised sequence likelihood ratio, shared by every token of the response;
#: * PPO clip of ``s_i``, Eq. 5, with ``eps_low = 3e-4`` and ``eps_high = 4e-4`` (§5.1, "left" and
#:   "right" clipping ranges). Because ``s_i`` is a geometric mean, these are orders of magnitude
#:   below token-level ranges (the paper's GRPO baseline uses 0.2 / 0.27);
#: * ``aggregation="seq_mean_token_mean"``: Eq. 5 is ``1/G sum_i min(s_i A_i, clip(s_i) A_i)``.
#:   Its per-token loss is constant along a row, so the token mean of a row is that constant and
#:   the mean over responses is Eq. 5 exactly (and the gradient Eq. 10);
#: * group z-score advantages, Eq. 6: ``(r - mean) / std`` over the group (as GRPO, unbiased std
#:   plus ``adv_eps``);
#: * no KL term: the paper leaves it out throughout (§2, §5.1).
#:
#: Precision: a 4e-4 range is below bfloat16's resolution of a log-probability, so score ``logp``
#: and ``old_logp`` in float32; bfloat16 ``logp`` against float32 ``old_logp`` clips responses of an
#: unchanged policy: chapter 4 (§4.4, "Precision") measures the share outside the range with the
#: weights unchanged and bfloat16 autocast only, on its toy's short responses (on long ones the share
#: should be smaller: ``log s_i`` averages the per-token rounding over the response).
#:
#: The paper's 4 mini-batches per rollout batch (§5.1) are a trainer setting
#: (``TrainerConfig.minibatches``); with one optimiser step per rollout the ratio is 1 and the clip
#: never binds.
GSPO = GRPO.replace(
    name="GSPO",
    ratio_level="sequence",
    eps_low=3e-4,
    eps_high=4e-4,
    aggregation="seq_mean_token_mean",
    kl=None,
    beta=0.0,
)

#: GSPO-token (arXiv 2507.18071, Eqs. 13-17) is GSPO with ``ratio_level="sequence_token"``,
#: ``s_it = sg[s_i] pi_theta(y_it) / sg[pi_theta(y_it)]`` (Eq. 14), inside Eq. 13's
#: ``1/G sum_i 1/|y_i| sum_t`` (``"seq_mean_token_mean"``). Every other axis and hyperparameter is
#: :data:`GSPO`'s (§5.1 reports no separate setting for it). With one advantage per response it is
#: GSPO exactly (loss, clipping and gradient); it differs only with token-level advantages
#: (``[B, T]``, e.g. multi-turn credit), the case the paper introduces it for.
GSPO_TOKEN = GSPO.replace(name="GSPO_TOKEN", ratio_level="sequence_token")

#: PPO with a learned critic, as VAPO's *vanilla PPO* baseline (arXiv 2504.05118, §5.1):
#:
#: * ``advantage="gae"``: GAE (Schulman et al., arXiv 1506.02438, Eq. 16) over per-token values
#:   of a critic, ``gamma = 1.0``, ``lam = 0.95`` for the policy and for the critic's targets
#:   (``critic_lam=None``: one lambda, as before VC-PPO);
#: * token ratio, symmetric clip ``eps = 0.2``;
#: * sample-level loss: ``1/G sum_i 1/|o_i| sum_t`` (``"seq_mean_token_mean"``);
#: * no KL term: §5.1 lists none for the baseline;
#: * the critic's loss clipped at ``value_clip_eps = 0.2`` around its values at sampling time
#:   (:func:`grpo_lab.algo.objectives.value_loss`). **Our choice**: the paper does not report a value
#:   clip; 0.2 is the policy's range, the value of OpenAI's baselines implementation of PPO.
#:
#: Trainer settings of the paper's baseline: actor lr 1e-6, critic lr 2e-6
#: (``TrainerConfig.value_lr``), 8,192 prompts sampled once (``group_size=1``), value model
#: initialised from a reward model (here ``TrainerConfig.value_init="policy"``: the policy's
#: backbone with a zero head; there is no reward model in this book).
PPO = GRPO.replace(
    name="PPO",
    advantage="gae",
    gamma=1.0,
    lam=0.95,
    eps_low=0.2,
    eps_high=0.2,
    aggregation="seq_mean_token_mean",
    kl=None,
    beta=0.0,
    value_clip_eps=0.2,
)

#: VAPO (Yuan et al., arXiv 2504.05118) is PPO plus the changes of its §4 and §5.1 that live in the loss:
#:
#: * *Decoupled-GAE* (§4.1): the critic's targets use ``critic_lam = 1.0`` (Monte-Carlo returns);
#: * *Length-adaptive GAE*, Eqs. 4-5: the policy's lambda is ``1 - 1/(alpha l)`` for a response of
#:   ``l`` tokens, with the paper's ``alpha = 0.05`` (``lam_alpha``). Sized for responses
#:   thousands of tokens long: it is 0 for every response of at most 20 tokens (chapter 6 uses
#:   ``VAPO.replace(lam_alpha=...)`` sized for its short answers);
#: * *Clip-Higher*, Eq. 8: ``eps_low = 0.2``, ``eps_high = 0.28``;
#: * *token-level loss*, Eq. 7: ``1 / sum_i |o_i|`` over the batch (``"token_mean"``). Eq. 7 writes the
#:   sum over a group, ``sum_{i=1}^G |o_i|``, the form of DAPO's Eq. 12, which the ``DAPO`` preset takes
#:   as written (``"group_token_mean"``); this preset keeps the batch-wide normaliser of verl's and
#:   TRL's token-mean losses. The two weigh the tokens of a group alike and differ only in how groups
#:   weigh each other (by their token counts, or equally). ``VAPO.replace(aggregation="group_token_mean")``
#:   is Eq. 7 as written (chapter 6, §6.5);
#: * *positive-example LM loss*, Eqs. 9-10: ``nll_coef = mu = 0.1``.
#:
#: Not in the preset, because they are not the loss: *Value-Pretraining* (§4.1, 50 steps from the
#: reward model: :meth:`grpo_lab.training.trainer.Trainer.pretrain_value`, ``TrainerConfig.value_init`` /
#: ``value_warmup_steps``) and *Group-Sampling* (512 prompts x 16 samples: ``prompts_per_step``
#: and ``group_size``).
VAPO = PPO.replace(
    name="VAPO",
    lam_alpha=0.05,
    critic_lam=1.0,
    eps_high=0.28,
    aggregation="token_mean",
    nll_coef=0.1,
)

#: Reinforcement Pre-Training, RPT, of Dong et al. (arXiv 2506.08007) is GRPO on next-token reasoning
#: with the prefix-matching reward (Eq. 3, :func:`grpo_lab.algo.rewards.prefix_match_reward`, through
#: :class:`grpo_lab.tasks.NextTokenTask`), and the objective of Eq. 4, pure expected reward: **no KL**
#: (§3.3 / App. B: KL coefficient 0) and **no language-modelling term**. App. B (Table 5) lists an "actor
#: gradient clip 0.2" with the PPO mini-batch equal to the batch of 256, i.e. exact on-policy updates, where a
#: ratio clip never binds: it may be the gradient-norm clip, which the paper does not say. The preset keeps
#: GRPO's ratio clip 0.2 (inactive with one update per batch) and the trainer's gradient-norm clip
#: (``TrainerConfig.grad_clip``, 1.0). The loss aggregation is not stated (the paper trains with verl, whose default is a token mean),
#: so the preset keeps GRPO's. The sampling settings of App. B, G = 8 and temperature 0.8, are
#: trainer settings: :data:`RPT_SAMPLING`.
RPT = GRPO.replace(name="RPT", kl=None, beta=0.0)

#: RPT's sampling (App. B), as :class:`~grpo_lab.training.trainer.TrainerConfig` fields:
#: ``TrainerConfig(**RPT_SAMPLING, ...)``.
RPT_SAMPLING: dict[str, Any] = {"group_size": 8, "temperature": 0.8}

#: **Not the paper's method.** The "``L_LM + beta RL``" retelling of RPT, kept as an ablation: RPT's
#: loss plus a next-token-prediction term on each question's ground truth, ``L = L_RL + L_NTP``
#: (``ntp_coef = 1``: the two terms weighted equally).
RPT_HYBRID = RPT.replace(name="RPT hybrid (not the paper)", ntp_coef=1.0)

#: GMPO, Geometric-Mean Policy Optimization (Zhao et al., arXiv 2507.20673; official code ``callsys/GMPO``)
#: is GRPO with the arithmetic mean of token ratios replaced by their geometric mean, each token clipped
#: in log space on the side its advantage pushes (:func:`grpo_lab.algo.objectives.gmpo_surrogate`).
#: ``eps_low = eps_high = 0.4``: the paper's range ``(e^-0.4, e^0.4)``, read by the surrogate in log
#: space (its no-clip ablation is ``GMPO.replace(eps_low=1000, eps_high=1000)``); group z-score
#: advantages; no KL (the official script's ``--beta 0``); the mean over responses of Eq. 4
#: (``"seq_mean_token_mean"``, which the surrogate requires, as it requires ``ratio_level="token"``).
GMPO = GRPO.replace(name="GMPO", clip="gmpo", eps_low=0.4, eps_high=0.4, kl=None, beta=0.0)

#: SAPO, Soft Adaptive Policy Optimization (Gao et al., Qwen, arXiv 2511.20347), puts a smooth gate
#: ``4/tau sigmoid(tau (r - 1))`` instead of the hard clip (:func:`grpo_lab.algo.objectives.sapo_surrogate`),
#: with the paper's temperatures ``tau_pos = 1.0`` and ``tau_neg = 1.05`` (the surrogate's defaults,
#: held in ``params``; ``SAPO.replace(tau_neg=...)``); token ratio, ``1/G sum_i 1/|y_i| sum_t``
#: aggregation, group z-score advantages, no KL term.
SAPO = GRPO.replace(name="SAPO", clip="sapo", kl=None, beta=0.0)

#: KL-Cov (Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
#: arXiv 2505.22617, "Suppressing Tokens with High Covariances") is the unclipped policy gradient plus ``kl_cov_coef |log r|`` on the
#: ``kl_cov_ratio`` share of the minibatch's tokens with the largest covariance between advantage and
#: log-probability (:func:`grpo_lab.algo.objectives.kl_cov_surrogate`): ``kl_cov_ratio = 2e-3`` (the
#: paper's Qwen2.5-7B setting; 2e-4 for 32B) and ``kl_cov_coef = 1``, token-mean aggregation as in its
#: verl recipe, no KL to a reference, group z-score advantages. ``eps_low`` / ``eps_high`` are unused.
#: At toy scale ``floor(2e-3 N)`` is often 0 tokens, and at least one token is selected: the
#: effective share is then ``1/N``.
KL_COV = GRPO.replace(name="KL_COV", clip="kl_cov", aggregation="token_mean", kl=None, beta=0.0)

#: Clip-Cov (arXiv 2505.22617, same section) is PPO's clipped surrogate with the gradient of a random
#: ``clip_cov_ratio`` share of the tokens whose covariance lies in ``(clip_cov_lb, clip_cov_ub)``
#: removed (:func:`grpo_lab.algo.objectives.clip_cov_surrogate`): the paper's 2e-4, 1 and 5, token-mean
#: aggregation, no KL term. ``eps_low = eps_high = 1``: the authors' verl scripts set
#: ``clip_ratio_low = clip_ratio_high = 1``, so PPO's clip acts only outside ``[0, 2]`` and the
#: covariance-selected detachment is the trust region. Those scripts run in verl's DAPO recipe,
#: whose trainer filters groups (DAPO's dynamic sampling); the preset leaves that off so that only
#: the loss differs from GRPO (``CLIP_COV.replace(dynamic_sampling=True)`` for the scripts' setting;
#: the same holds for :data:`KL_COV`). The draw uses torch's global generator, which the trainer's
#: checkpoints save.
CLIP_COV = GRPO.replace(name="CLIP_COV", clip="clip_cov", eps_low=1.0, eps_high=1.0, aggregation="token_mean",
                        kl=None, beta=0.0)

#: The presets of this module by name (``python -m grpo_lab NAME`` trains one).
PRESETS: dict[str, Algorithm] = {"GRPO": GRPO, "DR_GRPO": DR_GRPO, "DAPO": DAPO, "GSPO": GSPO,
                                 "GSPO_TOKEN": GSPO_TOKEN, "CISPO": CISPO, "PPO": PPO, "VAPO": VAPO,
                                 "RPT": RPT, "GMPO": GMPO, "SAPO": SAPO, "KL_COV": KL_COV, "CLIP_COV": CLIP_COV}


def deepseek_v32(*, beta: float, delta: float, eps: float, kl: str = "k3") -> Algorithm:
    """The RL objective of DeepSeek-V3.2 (arXiv 2512.02556, §3.1 "Scaling GRPO"), Eqs. 5-9.

    Not a fixed preset: the paper reports neither its KL coefficient ``beta`` (only that some
    domains, maths among them, do better with a weak or no KL), nor the masking threshold
    ``delta``, nor the clip range ``eps`` of Eq. 5, so the caller must choose all three.

    * ``advantage="group_mean"``: ``A_i = R_i - mean(R)`` (Eq. 5, no std);
    * token ratio ``pi_theta / pi_old`` (Eq. 6), symmetric clip ``eps``;
    * ``aggregation="seq_mean_token_mean"``: Eq. 5 keeps ``1/G sum_i 1/|o_i| sum_t``;
    * KL ``kl`` (Eq. 7 is stated for k3) with ``beta``, importance-corrected (Eq. 7);
    * Off-Policy Sequence Masking with threshold ``delta`` (Eqs. 8-9).

    Not modelled: Keep Routing (MoE) and Keep Sampling Mask (top-p/top-k truncation; the book
    samples at temperature 1 without truncation), and the reward models / length and language
    rewards of the mixed RL stage.

    Raises:
        ValueError: as :class:`Algorithm` for invalid ``beta``, ``delta``, ``eps`` or ``kl``.
    """
    e = _v.real_number("eps", eps)
    return GRPO.replace(
        name="DeepSeek-V3.2",
        advantage="group_mean",
        eps_low=e,
        eps_high=e,
        kl=kl,
        beta=beta,
        kl_importance_correction=True,
        offpolicy_mask_delta=delta,
    )


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
