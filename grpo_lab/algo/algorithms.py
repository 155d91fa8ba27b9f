"""One dataclass that picks a choice on every axis of the GRPO family, plus named presets.

Every algorithm in the book is the same loop with different choices on a few independent axes. Each
axis is a registry, a dict from a choice's name to one function:

=================  ==========================================================
``advantage``      :data:`grpo_lab.algo.advantages.ADVANTAGE_ESTIMATORS`
``ratio_level``    :data:`grpo_lab.algo.objectives.RATIOS`
``surrogate``      :data:`grpo_lab.algo.objectives.SURROGATES`
``aggregation``    :data:`grpo_lab.algo.objectives.AGGREGATIONS`
``kl``             :data:`grpo_lab.algo.objectives.KL_ESTIMATORS` (or None)
``mismatch``       :data:`grpo_lab.algo.objectives.MISMATCH_CORRECTIONS` (or None)
=================  ==========================================================

An :class:`Algorithm` is checked against those registries when it is built, so a function registered
from outside the package (``SURROGATES["mine"] = f``) is a valid choice
(``GRPO.replace(surrogate="mine")``). The *sampling & shaping* fields (DAPO §3.2, §3.4) are read by
:mod:`grpo_lab.algo.selection`, not by the loss. DeepSeek-V3.2's options (arXiv 2512.02556 Eqs. 7-9)
are off by default; :func:`deepseek_v32` builds that objective from values the caller must choose.

Departures from the papers: GRPO's clip range is not stated in DeepSeekMath's RL section (the preset
takes PPO's 0.2); DAPO's soft overlong punishment is stored as the paper's proportion
``L_cache = L_max / 5`` (``overlong_cache_frac``).

Files written before ``clip`` was renamed ``surrogate`` (and CISPO's ``"is_weight"`` renamed
``"cispo"``) load through :meth:`Algorithm.from_dict` / :func:`migrate_fields`.
"""

from __future__ import annotations

import dataclasses
import inspect
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
    "closest_preset",
    "migrate_fields",
    "ADDED_FIELDS",
    "ADVANTAGE_NAMES",
    "RATIO_LEVEL_NAMES",
    "SURROGATE_NAMES",
    "AGGREGATION_NAMES",
    "KL_ESTIMATOR_NAMES",
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
    "TIS",
    "MIS",
    "MISMATCH_NAMES",
    "ADVANTAGE_INPUTS",
    "deepseek_v32",
    "PRESETS",
    "get_algorithm",
]

#: live, read-only views of the choices on each axis, the keys of its registry (register in the registry itself)
ADVANTAGE_NAMES = ADVANTAGE_ESTIMATORS.keys()
#: the keys of :data:`grpo_lab.algo.objectives.RATIOS`
RATIO_LEVEL_NAMES = _obj.RATIOS.keys()
#: the keys of :data:`grpo_lab.algo.objectives.SURROGATES`
SURROGATE_NAMES = _obj.SURROGATES.keys()
#: the keys of :data:`grpo_lab.algo.objectives.AGGREGATIONS`
AGGREGATION_NAMES = _obj.AGGREGATIONS.keys()
#: the keys of :data:`grpo_lab.algo.objectives.KL_ESTIMATORS` (``kl=None``, no KL term, is accepted as well)
KL_ESTIMATOR_NAMES = _obj.KL_ESTIMATORS.keys()
#: the keys of :data:`grpo_lab.algo.objectives.MISMATCH_CORRECTIONS` (``mismatch=None``, no correction, is accepted as well)
MISMATCH_NAMES = _obj.MISMATCH_CORRECTIONS.keys()

#: fields renamed since files were first written — ``{old name: new name}`` (:func:`migrate_fields`)
RENAMED_FIELDS = {"clip": "surrogate"}
#: surrogate choices renamed — ``{old key: new key}`` of :data:`grpo_lab.algo.objectives.SURROGATES`
RENAMED_SURROGATES = {"is_weight": "cispo"}


#: fields added after runs were first stored -> the value that is the behaviour before they existed (a stored
#: record without one is read with it: :func:`migrate_fields`)
ADDED_FIELDS: Mapping[str, Any] = {"mismatch": None, "keep_sampling_mask": False}


def migrate_fields(fields: Mapping[str, Any]) -> dict:
    """An algorithm's stored fields (a checkpoint's ``state.json``, ``run.json``, a results file's provenance,
    a config file's ``algorithm:`` section) with old names replaced: ``clip`` -> ``surrogate`` and the
    surrogate ``"is_weight"`` -> ``"cispo"``; a field of :data:`ADDED_FIELDS` absent from a stored record of a
    whole algorithm (one holding every other field) gets its value from before it existed. Other keys pass
    unchanged; a new-style dict is returned as a copy.

    Raises:
        ValueError: both ``clip`` and ``surrogate`` given.
    """
    out = dict(fields)
    for old, new in RENAMED_FIELDS.items():
        if old in out:
            if new in out:
                raise ValueError(f"algorithm fields hold both {old!r} (the old name) and {new!r}; keep {new!r}")
            out[new] = out.pop(old)
    if isinstance(out.get("surrogate"), str):
        out["surrogate"] = RENAMED_SURROGATES.get(out["surrogate"], out["surrogate"])
    if set(_FIELD_NAMES) - set(ADDED_FIELDS) <= set(out):  # a whole stored algorithm, not a partial override
        for name, before in ADDED_FIELDS.items():
            out.setdefault(name, before)
    return out


def renamed_hint(key: str, value: Any = None) -> str:
    """``" (clip was renamed surrogate)"`` for an old field name or surrogate key, else ``""``: the hint in
    the errors that new input with an old spelling gets (``--set clip=ppo``, ``replace(clip=...)``)."""
    if key in RENAMED_FIELDS:
        return f" ({key} was renamed {RENAMED_FIELDS[key]})"
    if value in RENAMED_SURROGATES and key in ("surrogate", *RENAMED_FIELDS):
        return f" (the surrogate {value!r} was renamed {RENAMED_SURROGATES[value]!r})"
    return ""


@dataclass(frozen=True)
class Algorithm:
    """A point in the design space: one choice per axis, immutable and validated when built.

    Attributes:
        name: display name (the key in tables and plots).
        advantage: a key of :data:`~grpo_lab.algo.advantages.ADVANTAGE_ESTIMATORS` (``"group"``: DeepSeekMath §4.1.2).
        adv_eps: ``>= 0``, added to the std (``"group"``, ``"batch"``).
        ratio_level: a key of :data:`~grpo_lab.algo.objectives.RATIOS` (DeepSeekMath Eq. 3; GSPO Eqs. 7, 13-17).
        surrogate: a key of :data:`~grpo_lab.algo.objectives.SURROGATES` (``"cispo"``: MiniMax-M1 Eqs. 4-5).
        eps_low, eps_high: clip range, ``0 <= eps_low <= 1``, finite ``eps_high >= 0`` (DAPO Eq. 10; CISPO's ``eps^IS``).
        mask_eps_low, mask_eps_high: None or finite ``>= 0``: MiniMax-M1's token mask (Eqs. 6-7), ``"cispo"`` only.
        aggregation: a key of :data:`~grpo_lab.algo.objectives.AGGREGATIONS`, each paper's token average (DAPO Eq. 12).
        max_tokens: positive int or None: Dr.GRPO's constant normaliser MAX_TOKENS (None: the generation budget).
        kl: None or a key of :data:`~grpo_lab.algo.objectives.KL_ESTIMATORS`, per token (DeepSeekMath Eqs. 3-4: k3).
        beta: ``>= 0`` KL coefficient (DeepSeekMath §4.2: 0.04); 0 or ``kl=None`` means no KL term.
        dynamic_sampling: DAPO Eq. 11: train only on groups with 0 < accuracy < 1, resampling to fill the batch.
        overlong_filter: DAPO §3.4: truncated samples are masked out of the loss (not of their group's rewards).
        overlong_cache_len, overlong_cache_frac: DAPO Eq. 13's ``L_cache``, in tokens or a fraction of ``L_max``.
        kl_importance_correction: DeepSeek-V3.2 Eq. 7: the KL estimate times the ratio ``pi_theta / pi_old``.
        offpolicy_mask_delta: None or finite ``delta >= 0``: DeepSeek-V3.2 Eqs. 8-9's off-policy sequence mask.
        gamma, lam, critic_lam: GAE's discount and lambda (arXiv 1506.02438 Eq. 16), the critic's own (VAPO §4.1).
        lam_alpha: None or ``> 0``: VAPO Eq. 5, length-adaptive lambda ``1 - 1/(alpha l)``.
        value_clip_eps: None or ``>= 0``: the critic's loss clip (:func:`~grpo_lab.algo.objectives.value_loss`).
        nll_coef: ``mu >= 0``, VAPO Eqs. 9-10: weight of the NLL of correct responses; 0 = off.
        ntp_coef: ``>= 0``, weight of next-token prediction on demonstrations (not a paper's: :data:`RPT_HYBRID`).
        mismatch: None or a key of :data:`~grpo_lab.algo.objectives.MISMATCH_CORRECTIONS`: the sampler-learner
            mismatch correction (TIS / MIS; its cap ``is_cap`` in ``params``), which needs ``old_logp="recompute"``.
        keep_sampling_mask: DeepSeek-V3.2 §3.1's Keep Sampling Mask: π_θ, π_old (recomputed) and π_ref are scored as
            the softmax over the rollout's top-p / top-k kept set (``TrainerConfig.top_p`` / ``top_k``) at each token,
            the set the sampler drew from; a no-op when the sampler truncates nothing (top_p = 1, top_k = 0).
        params: the named functions' other hyper-parameters (:mod:`grpo_lab.algo.hparams`), e.g. SAPO's ``tau_pos``.

    Raises:
        ValueError: (when built) a choice not in its registry; a value out of range; ``mask_eps_*`` with ``"ppo"``;
            both ``overlong_cache_*``; an unknown or mistyped key of ``params``; a constraint a function declares.
    """

    name: str = "custom"
    advantage: str = "group"
    adv_eps: float = 1e-4
    ratio_level: str = "token"
    surrogate: str = "ppo"
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
    mismatch: Optional[str] = None
    keep_sampling_mask: bool = False
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        _v.choice("advantage", self.advantage, ADVANTAGE_ESTIMATORS)
        _v.choice("ratio_level", self.ratio_level, _obj.RATIOS)
        if self.surrogate in RENAMED_SURROGATES and self.surrogate not in _obj.SURROGATES:
            raise ValueError(f"unknown surrogate {self.surrogate!r}{renamed_hint('surrogate', self.surrogate)}; "
                             f"expected one of {tuple(_obj.SURROGATES)}")
        _v.choice("surrogate", self.surrogate, _obj.SURROGATES)
        _v.choice("aggregation", self.aggregation, _obj.AGGREGATIONS)
        _v.choice("kl", self.kl, _obj.KL_ESTIMATORS, extra=(None,))
        _v.choice("mismatch", self.mismatch, _obj.MISMATCH_CORRECTIONS, extra=(None,))
        for name in ("adv_eps", "eps_high", "beta"):
            _v.real_number(name, getattr(self, name), minimum=0.0)
        _v.real_number("eps_low", self.eps_low)
        _v.positive_int("max_tokens", self.max_tokens, allow_none=True)
        for name in ("dynamic_sampling", "overlong_filter", "kl_importance_correction", "keep_sampling_mask"):
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
        if self.surrogate == "ppo" and (self.mask_eps_low is not None or self.mask_eps_high is not None):
            raise ValueError("mask_eps_low / mask_eps_high are the token mask of MiniMax-M1's unified form "
                             "(Eqs. 6-7), read by surrogate='cispo'; PPO's clip (surrogate='ppo') already applies "
                             "that mask with eps_low / eps_high, so set those instead")

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
        named = _named_functions(*(getattr(self, a) for a in _AXES))
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
        for _, _, fn in _named_functions(*(getattr(self, a) for a in _AXES)):
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
                ("RATIOS", _obj.RATIOS, self.ratio_level), ("SURROGATES", _obj.SURROGATES, self.surrogate),
                ("AGGREGATIONS", _obj.AGGREGATIONS, self.aggregation),
                ("SELECTORS", selection.SELECTORS, selection.selector_name(self))]
        if self.uses_kl:
            used.append(("KL_ESTIMATORS", _obj.KL_ESTIMATORS, self.kl))
        if self.mismatch is not None:
            used.append(("MISMATCH_CORRECTIONS", _obj.MISMATCH_CORRECTIONS, self.mismatch))
        return {f"{registry}[{key!r}]": table.get(key) for registry, table, key in used}

    def inputs(self) -> dict[str, tuple]:
        """The inputs (:data:`grpo_lab.algo.hparams.INPUTS`) this algorithm's functions declare, by where the
        trainer supplies them: ``{"advantage": names, "loss": names}`` (``loss``: :func:`~grpo_lab.algo.objectives.loss_inputs`)."""
        fn = ADVANTAGE_ESTIMATORS[self.advantage]
        return {"advantage": _hp.declared_inputs(fn), "loss": _obj.loss_inputs(self)}

    def check_config(self, config: Any) -> None:
        """Check what this algorithm's functions need of the run (:func:`grpo_lab.algo.hparams.declare`'s
        ``config`` and ``validate_config``), once, when the algorithm meets the run's
        ``TrainerConfig`` (``Trainer`` and ``experiments.run`` call it).

        Raises:
            ValueError: naming the function, the ``TrainerConfig`` field, its value and what the function needs
                (e.g. ``mismatch='token_truncate'`` with ``old_logp='behaviour'``), or as a ``validate_config``.
        """
        for axis, key, fn in _named_functions(*(getattr(self, a) for a in _AXES)):
            for part in (fn, *_hp.spec(fn).batch_statistics.values()):
                spec = _hp.spec(part)
                fn_name = getattr(part, "__name__", str(part))
                where = f"{self.name}: {axis}={key!r}" + ("" if fn_name == key else f" ({fn_name})")
                for name, allowed in spec.config.items():
                    value = getattr(config, name, None)
                    if value not in allowed:
                        want = " or ".join(repr(a) for a in allowed)
                        raise ValueError(f"{where} needs TrainerConfig.{name}={want}, got {name}={value!r}")
                if spec.validate_config is not None:
                    try:
                        spec.validate_config(config, self.values_for(part))
                    except ValueError as exc:
                        raise ValueError(f"{where}: {exc}") from None

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
        for name in _hp.spec(fn).inputs:
            if name == "correct" and batch.correct is None:
                raise ValueError(f"advantage estimator {self.advantage!r} ({getattr(fn, '__name__', fn)}) declares the "
                                 "input 'correct', which the batch lacks: AdvantageBatch.from_groups(..., correct=)")
            if name == "raw_rewards" and batch.raw_rewards is None:
                raise ValueError(f"advantage estimator {self.advantage!r} ({getattr(fn, '__name__', fn)}) declares the "
                                 "input 'raw_rewards', which the batch lacks: AdvantageBatch.from_groups(..., raw_rewards=)")
            if name == "lengths" and batch.mask is None:
                raise ValueError(f"advantage estimator {self.advantage!r} ({getattr(fn, '__name__', fn)}) declares the "
                                 "input 'lengths', which needs the batch's mask: AdvantageBatch.from_groups(..., mask=)")
        adv = fn(batch, **self.values_for(fn))
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

        Keys: ``advantage``, ``ratio_level``, ``keep_sampling_mask`` (DeepSeek-V3.2's Keep Sampling Mask),
        ``surrogate``, ``eps_low``, ``eps_high``,
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
        next-token-prediction term of the hybrid ablation, 0.0 when off), ``mismatch`` (the sampler-learner
        mismatch correction, None when off), then the hyper-parameters in
        :attr:`params` (those of a variant's own functions, e.g. SAPO's ``tau_pos`` / ``tau_neg``).
        """
        value_based = self.advantage in VALUE_BASELINE_ESTIMATORS
        return {
            "advantage": self.advantage,
            "ratio_level": self.ratio_level,
            "keep_sampling_mask": self.keep_sampling_mask,
            "surrogate": self.surrogate,
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
            "mismatch": self.mismatch,
            **self.params,
        }

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> "Algorithm":
        """The algorithm whose :meth:`describe` is ``fields``; files written before the renames load too
        (:func:`migrate_fields`: ``clip`` -> ``surrogate``, ``"is_weight"`` -> ``"cispo"``).

        Raises:
            ValueError: as :func:`migrate_fields` and :class:`Algorithm`; a key that is not a field.
        """
        fields = migrate_fields(fields)
        unknown = sorted(set(fields) - _FIELD_NAMES)
        if unknown:
            raise ValueError(f"unknown Algorithm field(s) {unknown}; fields: {sorted(_FIELD_NAMES)}")
        return cls(**fields)

    def describe(self) -> dict[str, Any]:
        """Every field (``name`` first, ``params`` last) as a plain dict; suitable for JSON and provenance."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "Algorithm":
        """A copy with some fields or hyper-parameters changed (validated again), e.g.
        ``GRPO.replace(beta=0.0)`` or ``SAPO.replace(tau_neg=1.2)``.

        A key that is not a field is a hyper-parameter of a function the result names and goes into
        :attr:`params` (``SAPO.replace(tau_neg=1.2)`` is ``SAPO.replace(params={**SAPO.params,
        "tau_neg": 1.2})``). Hyper-parameters that the result's functions no longer declare are
        dropped (``SAPO.replace(surrogate="ppo")`` keeps no temperatures).

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
_AXES = ("advantage", "ratio_level", "surrogate", "aggregation", "kl", "mismatch")


def _named_functions(advantage: str, ratio_level: str, surrogate: str, aggregation: str,
                     kl: Optional[str], mismatch: Optional[str] = None) -> list[tuple[str, str, Callable]]:
    """``[(axis field, choice, function)]`` of the registry functions these choices name (the KL
    estimator only when ``kl`` is set, the mismatch correction only when ``mismatch`` is). Raises
    ``KeyError`` for a choice not in its registry."""
    out = [("advantage", advantage, ADVANTAGE_ESTIMATORS[advantage]),
           ("ratio_level", ratio_level, _obj.RATIOS[ratio_level]), ("surrogate", surrogate, _obj.SURROGATES[surrogate]),
           ("aggregation", aggregation, _obj.AGGREGATIONS[aggregation])]
    if kl is not None:
        out.append(("kl", kl, _obj.KL_ESTIMATORS[kl]))
    if mismatch is not None:
        out.append(("mismatch", mismatch, _obj.MISMATCH_CORRECTIONS[mismatch]))
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
    renamed = "".join(renamed_hint(k) for k in unknown)
    return (f"unknown key(s) {unknown}{renamed}: neither an Algorithm field nor a hyper-parameter of this algorithm's "
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


#: the positional parameters a registry function of each axis takes (the rest are keyword-only hyper-parameters)
_POSITIONAL = {"advantage": "batch", "ratio_level": "logp, old_logp, mask", "surrogate": "ctx",
               "aggregation": "values, mask, norms", "kl": "delta", "mismatch": "ctx"}


def _check_signature(axis: str, key: str, fn: Callable) -> None:
    """Refuse a registry function that needs more positional arguments than its axis passes (the removed form
    ``fn(log_ratio, advantages, mask, algo)`` of a surrogate, ``fn(batch, algo)`` of an estimator)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): called as it is
        return
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    needed = [p.name for p in params if p.kind in positional and p.default is inspect.Parameter.empty]
    expected = _POSITIONAL[axis].split(", ")
    if len(needed) > len(expected):
        raise ValueError(f"{axis}={key!r} ({getattr(fn, '__name__', fn)}) takes positional parameters {needed}; a "
                         f"function of this axis takes ({_POSITIONAL[axis]}) and its hyper-parameters keyword-only "
                         "(the removed form that took the whole algorithm positionally is not accepted)")


def _check_declaration(algo: "Algorithm", axis: str, key: str, fn: Callable, own: dict) -> None:
    """What ``fn`` (the choice ``key`` on ``axis``) declares: its constraints on the other axes and
    the ``validate`` of its hyper-parameters' values; first, that it takes the axis' positional arguments."""
    _check_signature(axis, key, fn)
    _check_shared_defaults(axis, key, fn)
    spec = _hp.spec(fn)
    if spec.inputs and axis not in _INPUT_AXES:
        raise ValueError(f"{axis}={key!r} ({getattr(fn, '__name__', fn)}) declares inputs {list(spec.inputs)}; only a "
                         f"function of {sorted(_INPUT_AXES)} may (the others are called without them)")
    bad = [k for k in spec.inputs if axis == "advantage" and k not in ADVANTAGE_INPUTS]
    if bad:
        raise ValueError(f"advantage={key!r} ({getattr(fn, '__name__', fn)}) declares inputs {bad}; an advantage "
                         f"estimator may read {list(ADVANTAGE_INPUTS)} (AdvantageBatch)")
    if spec.batch_statistics and axis != "surrogate":
        raise ValueError(f"{axis}={key!r} ({getattr(fn, '__name__', fn)}) declares whole-batch statistics, which only a "
                         "surrogate may: the trainer computes them for the loss")
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
#: the default of each field, for the shared-name rule (:func:`_check_shared_defaults`)
_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Algorithm) if f.default is not dataclasses.MISSING}
#: the axes whose functions may declare inputs (:func:`grpo_lab.algo.hparams.declare`)
_INPUT_AXES = frozenset({"advantage", "surrogate", "aggregation", "mismatch"})
#: the inputs an advantage estimator may declare (what :class:`~grpo_lab.algo.advantages.AdvantageBatch` carries)
ADVANTAGE_INPUTS = ("correct", "rewards", "raw_rewards", "group_ids", "lengths")


def _check_shared_defaults(axis: str, key: str, fn: Callable) -> None:
    """The shared-name rule (:mod:`grpo_lab.algo.hparams`): a hyper-parameter named like an :class:`Algorithm`
    field takes the field's value, so ``fn`` (or a statistic it declares) may not give it another default."""
    for part in (fn, *_hp.spec(fn).batch_statistics.values()):
        for k, d in _hp.own_hyperparameters(part).items():
            if k in _FIELD_DEFAULTS and d is not _hp.REQUIRED and d != _FIELD_DEFAULTS[k]:
                raise ValueError(
                    f"{axis}={key!r}: {getattr(part, '__name__', part)} declares {k}={d!r} by default, but {k} is an "
                    f"Algorithm field (default {_FIELD_DEFAULTS[k]!r}) and the Algorithm's value is the one used, so "
                    f"{d!r} would be silently replaced. Declare it without a default (def "
                    f"{getattr(part, '__name__', 'f')}(..., *, {k}: float)) and set it on the algorithm "
                    f"(.replace({axis}={key!r}, {k}={d!r}))")


#: GRPO, DeepSeekMath (arXiv 2402.03300) Eqs. 3-4, §4.1.2, §4.2 — token ratio, PPO clip 0.2 (not stated in the
#: paper's RL section: PPO's usual value), ``1/G sum_i 1/|o_i| sum_t``, k3 KL with beta = 0.04, group z-scores.
GRPO = Algorithm(
    name="GRPO",
    advantage="group",
    adv_eps=1e-4,
    ratio_level="token",
    surrogate="ppo",
    eps_low=0.2,
    eps_high=0.2,
    aggregation="seq_mean_token_mean",
    max_tokens=None,
    kl="k3",
    beta=0.04,
)

#: DAPO (arXiv 2503.14476), Table 1's final recipe — clip-higher 0.2 / 0.28 (Eq. 10), Eq. 12's token-level loss
#: as written (``"group_token_mean"``; verl / TRL divide by the batch's tokens: ``"token_mean"``), no KL,
#: dynamic sampling (Eq. 11), overlong filtering (§3.4) and soft overlong punishment (Eq. 13) with the paper's
#: ``L_cache = L_max / 5`` (4,096 of 20,480) stored as ``overlong_cache_frac = 0.2``. Eq. 12 divides each group by
#: its whole length ``Σ_i |o_i|``, so the trainer's minibatches hold whole groups (it shuffles groups, not rows); TRL
#: 1.16 shuffles rows and divides by the whole generation batch's tokens, verl's mini-batches are
#: ``ppo_mini_batch_size`` prompts × ``rollout.n`` rows (whole groups) divided by their tokens.
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

#: Dr. GRPO (arXiv 2503.20783, §3.2, Listing 1) — ``A_i = R_i - mean(R)`` (no std) and each sequence's token sum
#: divided by the constant MAX_TOKENS (``max_tokens=None``: the trainer passes the generation budget); PPO clip
#: 0.2, no KL (beta = 0 throughout the paper).
DR_GRPO = GRPO.replace(
    name="DR_GRPO",
    advantage="group_mean",
    aggregation="seq_mean_token_sum_norm",
    kl=None,
    beta=0.0,
)

#: CISPO (MiniMax-M1, arXiv 2506.13585, §3.1, Eqs. 4-5) — the clipped, detached IS weight times
#: ``A log pi_theta``; ``eps_low = 1`` (the paper's "large value": no floor); ``eps_high = 0.28`` is **our
#: choice** (the paper does not report it; DAPO's clip-higher, so the two presets cap the ratio alike);
#: ``"group_token_mean"`` (Eq. 4), no KL, DAPO's dynamic sampling and soft length penalty (§3.1), no
#: overlong filtering. In TRL's absolute spelling this is ``epsilon_high=1.28``. Like DAPO's, Eq. 4's normaliser is
#: the whole group's length, so minibatches hold whole groups (TRL 1.16's ``loss_type="cispo"`` divides by the
#: generation batch's tokens instead; verl's mini-batches are whole groups divided by their tokens).
CISPO = GRPO.replace(
    name="CISPO",
    surrogate="cispo",
    eps_low=1.0,
    eps_high=0.28,
    aggregation="group_token_mean",
    kl=None,
    beta=0.0,
    dynamic_sampling=True,
    overlong_filter=False,
    overlong_cache_frac=0.2,
)

#: GSPO (arXiv 2507.18071, Eqs. 5-7, §5.1) — the length-normalised sequence ratio ``s_i`` (Eq. 7) under the
#: PPO clip with the paper's ranges 3e-4 / 4e-4, ``1/G sum_i`` (Eq. 5), group z-scores (Eq. 6), no KL. The clip
#: binds only with several minibatches per rollout (§5.1: 4); score log-probs in float32 (a 4e-4 range is below
#: bfloat16's resolution: chapter 4, §4.4).
GSPO = GRPO.replace(
    name="GSPO",
    ratio_level="sequence",
    eps_low=3e-4,
    eps_high=4e-4,
    aggregation="seq_mean_token_mean",
    kl=None,
    beta=0.0,
)

#: GSPO-token (arXiv 2507.18071, Eqs. 13-17) — :data:`GSPO` with ``s_it = sg[s_i] pi_theta(y_it) / sg[pi_theta(y_it)]``;
#: equal to GSPO with one advantage per response, different with token-level advantages.
GSPO_TOKEN = GSPO.replace(name="GSPO_TOKEN", ratio_level="sequence_token")

#: PPO with a learned critic, VAPO's vanilla-PPO baseline (arXiv 2504.05118, §5.1) — GAE (arXiv 1506.02438
#: Eq. 16) with gamma = 1, lambda = 0.95 for policy and critic, token ratio, clip 0.2, ``"seq_mean_token_mean"``,
#: no KL; ``value_clip_eps = 0.2`` is **our choice** (not reported; OpenAI baselines' value).
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

#: VAPO (arXiv 2504.05118, §4, §5.1) — :data:`PPO` plus Decoupled-GAE (``critic_lam = 1``, §4.1),
#: length-adaptive GAE with alpha = 0.05 (Eq. 5), clip-higher 0.28 (Eq. 8), the batch-wide token-mean loss
#: (Eq. 7 writes a per-group sum: ``VAPO.replace(aggregation="group_token_mean")``) and the positive-example
#: LM loss with mu = 0.1 (Eqs. 9-10). Value-pretraining and group sampling are trainer settings.
VAPO = PPO.replace(
    name="VAPO",
    lam_alpha=0.05,
    critic_lam=1.0,
    eps_high=0.28,
    aggregation="token_mean",
    nll_coef=0.1,
)

#: Reinforcement Pre-Training (arXiv 2506.08007) — GRPO on next-token reasoning with the prefix-matching reward
#: (Eq. 3, :class:`grpo_lab.tasks.NextTokenTask`) and Eq. 4's pure expected reward: no KL (App. B), no LM term,
#: GRPO's ratio clip 0.2 (App. B's "actor gradient clip 0.2" is not said to be one). Its G = 8 and temperature 0.8 are trainer settings: :data:`RPT_SAMPLING`.
RPT = GRPO.replace(name="RPT", kl=None, beta=0.0)

#: RPT's sampling (App. B), as :class:`~grpo_lab.training.trainer.TrainerConfig` fields:
#: ``TrainerConfig(**RPT_SAMPLING, ...)``.
RPT_SAMPLING: dict[str, Any] = {"group_size": 8, "temperature": 0.8}

#: **Not the paper's method.** The "``L_LM + beta RL``" retelling of RPT, kept as an ablation: RPT's
#: loss plus a next-token-prediction term on each question's ground truth, ``L = L_RL + L_NTP``
#: (``ntp_coef = 1``: the two terms weighted equally).
RPT_HYBRID = RPT.replace(name="RPT hybrid (not the paper)", ntp_coef=1.0)

#: GMPO (arXiv 2507.20673) — the geometric mean of token ratios, clipped per token in log space to the paper's
#: ``(e^-0.4, e^0.4)`` (:func:`grpo_lab.algo.objectives.gmpo_surrogate`); no KL (the official script's beta 0).
GMPO = GRPO.replace(name="GMPO", surrogate="gmpo", eps_low=0.4, eps_high=0.4, kl=None, beta=0.0)

#: SAPO (arXiv 2511.20347) — a smooth gate instead of the hard clip (:func:`grpo_lab.algo.objectives.sapo_surrogate`),
#: temperatures ``tau_pos = 1.0``, ``tau_neg = 1.05`` (in ``params``); token ratio, group z-scores, no KL.
SAPO = GRPO.replace(name="SAPO", surrogate="sapo", kl=None, beta=0.0)

#: KL-Cov (arXiv 2505.22617, "Suppressing Tokens with High Covariances") — the unclipped policy gradient plus
#: ``kl_cov_coef |log r|`` on the ``kl_cov_ratio = 2e-3`` share of tokens with the largest covariance
#: (:func:`grpo_lab.algo.objectives.kl_cov_surrogate`); token mean, no KL. ``eps_low`` / ``eps_high`` unused.
KL_COV = GRPO.replace(name="KL_COV", surrogate="kl_cov", aggregation="token_mean", kl=None, beta=0.0)

#: Clip-Cov (arXiv 2505.22617) — PPO's surrogate with the gradient of a random ``clip_cov_ratio`` share of the
#: tokens whose covariance lies in ``(clip_cov_lb, clip_cov_ub)`` removed (the paper's 2e-4, 1, 5); clip 1 / 1
#: as the authors' scripts; token mean, no KL; dynamic sampling off (``replace(dynamic_sampling=True)``).
CLIP_COV = GRPO.replace(name="CLIP_COV", surrogate="clip_cov", eps_low=1.0, eps_high=1.0, aggregation="token_mean",
                        kl=None, beta=0.0)

#: TIS (truncated importance sampling against the sampler; Yao et al. 2025, "Your efficient RL framework secretly
#: brings you off-policy RL training") is :data:`GRPO` with each token's policy-gradient loss times
#: ``min(pi_old / pi_sampler, C)``, C = 2 (their value), per token
#: (:func:`grpo_lab.algo.objectives.token_truncate`; TRL 1.16 ``vllm_importance_sampling_mode="token_truncate"``,
#: verl 0.9.1 ``rollout_correction.rollout_is="token"``). Needs ``TrainerConfig.old_logp="recompute"``.
TIS = GRPO.replace(name="TIS", mismatch="token_truncate", is_cap=2.0)

#: MIS (masked importance sampling at sequence level) is :data:`GRPO` with each response's policy-gradient loss
#: times ``rho_i 1[rho_i <= C]``, ``rho_i = prod_t pi_old / pi_sampler`` (:func:`grpo_lab.algo.objectives.sequence_mask`),
#: C = 3: TRL 1.16's defaults (``vllm_importance_sampling_mode="sequence_mask"``, ``vllm_importance_sampling_cap=3.0``).
#: Needs ``TrainerConfig.old_logp="recompute"``.
MIS = GRPO.replace(name="MIS", mismatch="sequence_mask", is_cap=3.0)

#: The presets of this module by name (``python -m grpo_lab NAME`` trains one).
PRESETS: dict[str, Algorithm] = {"GRPO": GRPO, "DR_GRPO": DR_GRPO, "DAPO": DAPO, "GSPO": GSPO,
                                 "GSPO_TOKEN": GSPO_TOKEN, "CISPO": CISPO, "PPO": PPO, "VAPO": VAPO,
                                 "RPT": RPT, "GMPO": GMPO, "SAPO": SAPO, "KL_COV": KL_COV, "CLIP_COV": CLIP_COV,
                                 "TIS": TIS, "MIS": MIS}


def deepseek_v32(*, beta: float, delta: float, eps: float, kl: str = "k3") -> Algorithm:
    """The RL objective of DeepSeek-V3.2 (arXiv 2512.02556, §3.1 "Scaling GRPO"), Eqs. 5-9.

    Not a fixed preset: the paper reports neither its KL coefficient ``beta`` (only that some
    domains, maths among them, do better with a weak or no KL), nor the masking threshold
    ``delta``, nor the clip range ``eps`` of Eq. 5, so the caller must choose all three.

    * ``advantage="group_mean"``: ``A_i = R_i - mean(R)`` (Eq. 5, no std);
    * token ratio ``pi_theta / pi_old`` (Eq. 6), symmetric clip ``eps``;
    * ``aggregation="seq_mean_token_mean"``: Eq. 5 keeps ``1/G sum_i 1/|o_i| sum_t``;
    * KL ``kl`` (Eq. 7 is stated for k3) with ``beta``, importance-corrected (Eq. 7);
    * Off-Policy Sequence Masking with threshold ``delta`` (Eqs. 8-9);
    * Keep Sampling Mask (``keep_sampling_mask=True``): π_θ and π_old scored on the top-p / top-k set the
      sampler kept (``TrainerConfig.top_p`` / ``top_k``; a no-op without truncation, the book's default).

    Keep Routing (MoE experts chosen at sampling reused in training) is the book's Routing Replay, a
    setting of the run rather than of the loss: ``TrainerConfig.routing_replay`` (GSPO §5.3's name).
    Not modelled: the reward models / length and language rewards of the mixed RL stage.

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
        keep_sampling_mask=True,
    )


def get_algorithm(name: str) -> Algorithm:
    """Look up a preset by name, case-insensitively (``"grpo"`` -> :data:`GRPO`).

    Raises:
        ValueError: unknown name (the message suggests :func:`closest_preset` and lists the known ones).
    """
    if isinstance(name, Algorithm):
        return name
    if isinstance(name, str):
        for key, algo in PRESETS.items():
            if key.lower() == name.strip().lower():
                return algo
    close = closest_preset(str(name))
    hint = f" (did you mean {close!r}?)" if close else ""
    raise ValueError(f"unknown algorithm {name!r}{hint}; known presets: {sorted(PRESETS)}")


def closest_preset(name: str) -> Optional[str]:
    """The key of :data:`PRESETS` a mistyped ``name`` most likely meant, or ``None``: a preset spelt with the same
    letters (a transposition, ``"GPRO"`` -> ``"GRPO"``) first, else the closest by difflib's ratio if >= 0.75.
    Case-insensitive."""
    import difflib

    typed = name.strip().upper()
    same_letters = [k for k in PRESETS if sorted(k) == sorted(typed)]
    if same_letters:
        return same_letters[0]
    close = difflib.get_close_matches(typed, list(PRESETS), n=1, cutoff=0.75)
    return close[0] if close else None
