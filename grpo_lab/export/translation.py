"""Run a grpo_lab algorithm on TRL or verl with the same objective: settings, and what they mean.

TRL (``trl.GRPOTrainer``) and verl (Ray, many GPUs and nodes) name the same ideas differently and
compute some differently by default, so a preset copied field by field trains another objective
under the same name. This module translates an :class:`~grpo_lab.algo.algorithms.Algorithm` axis
by axis and says where the translation is exact:

* :func:`to_trl`: keyword arguments of ``trl.GRPOConfig`` (TRL 1.16.0);
* :func:`to_verl`: Hydra overrides of ``python -m verl.trainer.main_ppo`` (``ppo_trainer.yaml``; verl 0.9.1);
* :func:`translate`: either, with notes and every difference, as a :class:`Translation`;
  :attr:`Translation.computes` is the algorithm the settings compute *exactly* (checked against
  each library's loss code in float64 by ``tests/export/xcheck/test_xcheck_*.py``);
* :func:`mapping_table`: grpo_lab axis -> TRL field -> verl field -> note; :func:`support_table`:
  each preset x target, exact or what raises.

Where the libraries differ from the papers or from grpo_lab, one line each (read from TRL's
``grpo_trainer.py`` / ``grpo_config.py`` and verl's ``core_algos.py`` / ``losses.py`` / configs):

* KL: TRL's default ``use_bias_correction_kl`` is k3 times the ratio (DeepSeek-V3.2, arXiv
  2512.02556, Eq. 7), not DeepSeekMath Eqs. 3-4; TRL has k3 only, verl k1, k2 (``mse``), k3
  (``low_var_kl``, clamped at 10) and no importance-corrected form.
* advantage epsilon: hard-coded ``std + 1e-4`` in TRL, ``std + 1e-6`` in verl, so ``adv_eps`` is
  exact only at that value (the presets use 1e-4).
* aggregation: DAPO Eq. 12 as written (``"group_token_mean"``) exists in neither (both ``token_mean``);
  TRL's ``dr_grpo`` divides by ``B * max_completion_length``, verl's ``seq-mean-token-sum-norm`` by
  the padded width unless ``loss_scale_factor`` is set; both count fully masked rows, grpo_lab does not.
* clip: verl's dual clip (``clip_ratio_c = 3``) is in neither paper; the export sets
  ``clip_ratio_c = 1e10``, above any ratio verl can form (it clamps ``log r`` to +-20).
* CISPO (MiniMax-M1, arXiv 2506.13585, Eq. 4): TRL's ``epsilon_high`` is an absolute cap with no
  floor, verl's bounds relative as ours; both write ``-sg(w) A log pi_theta``, ours
  ``-sg(w) A log r`` (same gradient).
* GSPO (arXiv 2507.18071, Eq. 5): verl's ``gspo`` aggregates by ``loss_agg_mode``; the export sets
  ``seq-mean-token-mean``.
* V3.2 masking (Eqs. 8-9): TRL's ``off_policy_mask_threshold``; none in verl.
* sampling and shaping: dynamic sampling is verl's ``algorithm.filter_groups`` only; Overlong
  Filtering TRL's ``mask_truncated_completions`` only; soft overlong punishment verl's ``dapo``
  reward manager and TRL's reward function (:func:`trl_reward_funcs`).
* optimisation: :mod:`grpo_lab.export.optimisation`.
* the sampling side (``old_logp``, ``rollout_dtype``, top-p / top-k, the mismatch correction TIS / MIS, Keep
  Sampling Mask): :mod:`grpo_lab.export.sampling`. TRL never takes π_old from the sampler and has no sampler
  precision; verl's ``rollout_correction.bypass_mode`` does and ``rollout.dtype`` sets it.

Another installed TRL / verl than the verified releases gives a
:class:`~grpo_lab.export.versions.LibraryVersionWarning` (:mod:`grpo_lab.export.versions`).

Policy: strict by default: anything a target computes differently raises :class:`ExportError` (a
``ValueError``) naming what would be lost and the exact alternative (``preset.replace(...)``)
where one exists; ``strict=False`` returns the nearest mapping with one
:class:`ApproximateExportWarning` per difference (:attr:`Translation.issues`). The export fails
closed: each registry axis maps through a table per target keyed by the choice's name (the
surrogates: ``_TRL_SURROGATES``, ``_VERL_SURROGATES``), and a choice a table lacks (a registry
function from outside the package, RLOO in TRL, Routing Replay) raises whatever ``strict`` says.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from ..algo import advantages as _adv
from ..algo import objectives as _obj
from ..algo import selection as _selection
from ..algo import checks as _v
from ..algo.algorithms import PRESETS, Algorithm, get_algorithm
from . import optimisation as _opt
from . import sampling as _smp
from .versions import TRL_VERSION, VERL_VERSION, check_installed

__all__ = [
    "TRL_VERSION",
    "VERL_VERSION",
    "TARGETS",
    "TRL_ADV_EPS",
    "VERL_ADV_EPS",
    "VERL_DUAL_CLIP_OFF",
    "BUDGET_KEYS",
    "ExportError",
    "ApproximateExportWarning",
    "Issue",
    "Translation",
    "translate",
    "to_trl",
    "to_verl",
    "trl_reward_funcs",
    "mapping_table",
    "support_table",
]

#: the libraries this module exports to, as the ``target`` argument of :func:`translate` names them
TARGETS = ("trl", "verl")
#: TRL adds this to the reward std (``advantages / (std_rewards + 1e-4)``, hard-coded)
TRL_ADV_EPS = 1e-4
#: verl's ``compute_grpo_outcome_advantage`` default ``epsilon``; its trainer passes no other
VERL_ADV_EPS = 1e-6
#: ``clip_ratio_c`` that switches verl's dual clip off: above ``e^20``, the largest ratio verl forms
VERL_DUAL_CLIP_OFF = 1.0e10

#: The run's sizes that :func:`to_trl` / :func:`to_verl` accept (names as in
#: :class:`grpo_lab.training.trainer.TrainerConfig` where it has them); any other key raises.
BUDGET_KEYS: dict[str, str] = {
    "group_size": "G, responses per prompt (TRL num_generations, verl actor_rollout_ref.rollout.n)",
    "max_new_tokens": "generation budget L_max in tokens (TRL max_completion_length, verl data.max_response_length); "
                      "also Dr.GRPO's constant and DAPO's L_max",
    "prompts_per_step": "prompts per rollout (verl data.train_batch_size; TRL: the generation batch is "
                        "prompts_per_step * group_size rows)",
    "minibatches": "optimiser steps per pass over a rollout (TRL steps_per_generation = minibatches x "
                   "gradient_accumulation_steps, verl ppo_mini_batch_size = prompts_per_step / minibatches)",
    "epochs": "passes over each rollout, mu (TRL num_iterations, verl ppo_epochs)",
    "micro_batch_size": "rows per forward/backward on one device (TRL per_device_train_batch_size, "
                        "verl ppo_micro_batch_size_per_gpu); default: a device's whole share of a minibatch",
    "lr": "AdamW learning rate (TRL learning_rate, verl actor.optim.lr)",
    "weight_decay": "AdamW decoupled weight decay, not on biases and norm weights (TRL weight_decay, verl "
                    "actor.optim.weight_decay, which decays every parameter); always written, default 0",
    "betas": "AdamW (beta1, beta2) (TRL adam_beta1/adam_beta2, verl actor.optim.betas); always written, default "
             "(0.9, 0.99) (both targets default to beta2 = 0.999)",
    "grad_clip": "global gradient-norm clip (TRL max_grad_norm, verl actor.optim.clip_grad)",
    "warmup": "linear warm-up, in optimiser updates (TRL warmup_steps, verl actor.optim.lr_warmup_steps, which "
              "counts RL steps); always written, default 0",
    "lr_schedule": "the learning rate after the warm-up, 'constant' / 'linear' / 'cosine' (TrainerConfig.lr_schedule; "
                   "TRL lr_scheduler_type constant_with_warmup / linear / cosine, verl actor.optim.lr_scheduler_type "
                   "constant / cosine, no linear); update k gets lr * f(k), transformers' convention; always written, "
                   "default 'constant' (TRL's default 'linear' decays to 0)",
    "lr_schedule_steps": "RL steps the schedule spans (TrainerConfig.lr_schedule_steps); H = lr_schedule_steps x epochs "
                         "x minibatches optimiser updates (TRL max_steps = H, verl trainer.total_training_steps = "
                         "lr_schedule_steps); needed by 'linear' and 'cosine'",
    "precision": "autocast dtype with float32 master weights, 'float32' / 'bfloat16' / 'float16' "
                 "(TrainerConfig.precision, 'auto' resolved: budget_from_config; TRL bf16 / fp16, verl "
                 "fsdp_config.mixed_precision.param_dtype); always written, default 'float32' (TRL's bf16 defaults "
                 "to True); a clip range finer than its resolution is an approximate issue",
    "temperature": "sampling temperature (TRL temperature, verl actor_rollout_ref.rollout.temperature)",
    "nnodes": "machines (verl trainer.nnodes; TRL: sizes the per-device batch, launch with accelerate)",
    "n_gpus_per_node": "GPUs per machine (verl trainer.n_gpus_per_node; TRL: as nnodes)",
    "routing_replay": "GSPO's Routing Replay for MoE policies (TrainerConfig.routing_replay): not exported",
    "value_lr": "the critic's constant AdamW learning rate (TrainerConfig.value_lr; default lr; verl critic.optim.lr)",
    "value_warmup_steps": "critic-only steps before the policy trains (TrainerConfig.value_warmup_steps, VAPO's value "
                          "pretraining; verl trainer.critic_warmup)",
    "value_init": "the critic's start, 'policy' (TrainerConfig.value_init; verl critic.model.path = the policy's "
                  "checkpoint); another is not exported",
    **_smp.SAMPLING_KEYS,
}

_FIELD_ORDER = tuple(Algorithm.__dataclass_fields__)  # the dataclass fields, in order


class ExportError(ValueError):
    """A target cannot compute an algorithm exactly (strict export), or cannot express it at all."""


class ApproximateExportWarning(UserWarning):
    """``strict=False``: one way in which the exported settings differ from the algorithm."""


@dataclass(frozen=True)
class Issue:
    """One difference between an algorithm and what a target computes with the exported settings.

    Attributes:
        kind: ``"approximate"`` (the target computes something close but different),
            ``"lost"`` (a feature the target lacks; the export leaves it out) or ``"impossible"``
            (no counterpart; raises even with ``strict=False``).
        axis: the algorithm field or budget key concerned (``"aggregation"``, ``"adv_eps"``, ...).
        message: what differs, in words.
        fix: ``Algorithm.replace`` arguments under which the target is exact, or None.
        budget_fix: budget arguments under which the target is exact, or None.
    """

    kind: str
    axis: str
    message: str
    fix: Optional[dict] = None
    budget_fix: Optional[dict] = None

    def text(self) -> str:
        """``"[kind] axis: message"``, one line."""
        return f"[{self.kind}] {self.axis}: {self.message}"


@dataclass(frozen=True)
class Translation:
    """Result of :func:`translate`.

    Attributes:
        target: ``"trl"`` or ``"verl"``.
        algorithm: the :class:`~grpo_lab.algo.algorithms.Algorithm` that was translated.
        config: ``dict`` of ``trl.GRPOConfig`` keyword arguments (TRL) or ``list[str]`` of Hydra
            overrides (verl).
        notes: the semantic notes of this translation (how each field is to be read, what is
            exact and within which numerical domain), one string each.
        issues: every :class:`Issue` found (empty when the export is exact).
        budget: the validated budget.
    """

    target: str
    algorithm: Algorithm
    config: Union[dict, list]
    notes: tuple
    issues: tuple
    budget: dict

    @property
    def exact(self) -> bool:
        """True when the target computes :attr:`algorithm` exactly (no issue)."""
        return not self.issues

    @property
    def computes(self) -> Optional[Algorithm]:
        """The grpo_lab algorithm that the exported settings compute exactly, i.e. :attr:`algorithm`
        itself when :attr:`exact`, else ``algorithm.replace(**fixes)`` when every issue has an algorithm
        fix, else None (a difference that no algorithm field describes, or an impossible one)."""
        if any(i.kind == "impossible" or i.fix is None for i in self.issues):
            return None
        changes: dict = {}
        for i in self.issues:
            changes.update(i.fix)
        return self.algorithm.replace(**changes) if changes else self.algorithm

    @property
    def warnings(self) -> list:
        """The issues as one line of text each (what ``strict=False`` warns about)."""
        return [i.text() for i in self.issues]


# ---------------------------------------------------------------------------------------------
# budget
# ---------------------------------------------------------------------------------------------
def _check_budget(budget: dict) -> dict:
    unknown = sorted(set(budget) - set(BUDGET_KEYS))
    if unknown:
        raise ValueError(f"unknown budget key(s) {unknown}; known keys: {sorted(BUDGET_KEYS)}")
    b = {}
    for name in ("group_size", "max_new_tokens", "prompts_per_step", "minibatches", "epochs", "micro_batch_size",
                 "nnodes", "n_gpus_per_node"):
        if budget.get(name) is not None:
            b[name] = _v.positive_int(name, budget[name])
    if budget.get("warmup") is not None:
        b["warmup"] = _v.non_negative_int("warmup", budget["warmup"])
    for name in ("lr", "grad_clip", "temperature"):
        if budget.get(name) is not None:
            b[name] = _v.positive_number(name, budget[name])
    if budget.get("weight_decay") is not None:
        b["weight_decay"] = _v.real_number("weight_decay", budget["weight_decay"], minimum=0.0)
    if budget.get("betas") is not None:
        betas = budget["betas"]
        if (not isinstance(betas, (tuple, list)) or len(betas) != 2
                or not all(0 <= _v.real_number("betas", x) < 1 for x in betas)):
            raise ValueError(f"betas must be a pair (beta1, beta2) of numbers in [0, 1), got {betas!r}")
        b["betas"] = (float(betas[0]), float(betas[1]))
    if budget.get("value_lr") is not None:
        b["value_lr"] = _v.positive_number("value_lr", budget["value_lr"])
    if budget.get("value_warmup_steps") is not None:
        b["value_warmup_steps"] = _v.non_negative_int("value_warmup_steps", budget["value_warmup_steps"])
    if budget.get("value_init") is not None:
        b["value_init"] = str(budget["value_init"])
    if budget.get("routing_replay") is not None:
        b["routing_replay"] = _v.flag("routing_replay", budget["routing_replay"])
    _opt.check_optimisation(budget, b)
    _smp.check_sampling(budget, b)
    if b.get("group_size") == 1:
        raise ValueError("group_size must be >= 2: a group of one has no baseline (TRL requires num_generations >= 2)")
    return b


def _sizes(b: dict) -> Optional[dict]:
    """Rows per rollout, per minibatch, per device and per micro-batch, from the budget; None when
    the budget does not give both ``prompts_per_step`` and ``group_size``."""
    if "prompts_per_step" not in b or "group_size" not in b:
        for k in ("minibatches", "micro_batch_size"):
            if k in b:
                raise ValueError(f"budget key {k!r} needs prompts_per_step and group_size (it splits a rollout of "
                                 "prompts_per_step * group_size rows)")
        return None
    world = b.get("nnodes", 1) * b.get("n_gpus_per_node", 1)
    mb = b.get("minibatches", 1)
    if b["prompts_per_step"] % mb:
        raise ValueError(f"minibatches={mb} must divide prompts_per_step={b['prompts_per_step']} (a minibatch "
                         "holds whole groups)")
    rows_mb = b["prompts_per_step"] * b["group_size"] // mb
    if rows_mb % world:
        raise ValueError(f"the {rows_mb} rows of a minibatch do not split over {world} devices (nnodes x "
                         "n_gpus_per_node)")
    per_device = rows_mb // world
    micro = b.get("micro_batch_size", per_device)
    if per_device % micro:
        fits = max(d for d in range(1, min(micro, per_device) + 1) if per_device % d == 0)
        raise ValueError(f"micro_batch_size={micro} must divide the {per_device} rows of a minibatch on one device "
                         f"({rows_mb} rows over {world} device(s)): set micro_batch_size={fits} (--set "
                         f"micro_batch_size={fits}), or export for fewer devices (--gpus-per-node, --nnodes)")
    return {"world": world, "minibatches": mb, "rows_minibatch": rows_mb, "per_device": per_device,
            "micro": micro, "accumulation": per_device // micro}


def _cache_tokens(algo: Algorithm, b: dict) -> Optional[int]:
    if algo.overlong_cache_len is None and algo.overlong_cache_frac is None:
        return None
    if "max_new_tokens" not in b:
        raise ValueError(f"{algo.name}: the soft overlong punishment (DAPO Eq. 13) is sized by the generation budget; "
                         "pass max_new_tokens= (L_max)")
    return _selection.overlong_cache_tokens(algo, b["max_new_tokens"])


# ---------------------------------------------------------------------------------------------
# shared checks
# ---------------------------------------------------------------------------------------------
#: the target names of :data:`TARGETS` as messages write them
_LABELS = {"trl": f"TRL {TRL_VERSION}", "verl": f"verl {VERL_VERSION}"}


@dataclass
class _Draft:
    """A translation being built: the target's settings, the notes and the issues, in the order found."""

    config: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    issues: list = field(default_factory=list)

    def impossible(self) -> bool:
        """True when an issue has no counterpart at all (the export raises whatever ``strict`` says)."""
        return any(i.kind == "impossible" for i in self.issues)


def _package_functions(algo: Algorithm) -> list:
    """``(axis, registry, {name: this package's function})`` for each registry axis that ``algo`` uses.

    A name listed here is exported only while the registry holds this very function (a built-in name
    re-registered to another function is refused); a grpo_lab function not listed is exported when
    the target's table (:data:`_MAPPED`) has an entry for its name.
    """
    own = [
        ("advantage", _adv.ADVANTAGE_ESTIMATORS, {"group": _adv.group_zscore, "group_mean": _adv.group_mean_baseline,
                                                 "batch": _adv.batch_std, "rloo": _adv.rloo,
                                                 "gae": _adv.gae_advantages}),
        ("ratio_level", _obj.RATIOS, {"token": _obj.token_ratio, "sequence": _obj.sequence_ratio,
                                      "sequence_token": _obj.sequence_token_ratio}),
        ("surrogate", _obj.SURROGATES, {"ppo": _obj.ppo_surrogate, "cispo": _obj.cispo_surrogate}),
        ("aggregation", _obj.AGGREGATIONS, {k: getattr(_obj, k) for k in
                                            ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm",
                                             "group_token_mean")}),
    ]
    if algo.uses_kl:
        own.append(("kl", _obj.KL_ESTIMATORS, {"k1": _obj.k1, "k2": _obj.k2, "k3": _obj.k3}))
    return own


def _is_foreign(fn: Any, own_fn: Any) -> bool:
    """True when a registry entry is a function from outside grpo_lab, or a built-in name re-registered."""
    if own_fn is not None:
        return fn is not own_fn
    return not getattr(fn, "__module__", "").startswith("grpo_lab.")


def _builtin_choices(algo: Algorithm, target: str) -> list:
    """Issues for the choices ``target`` has no counterpart for: the export fails closed.

    A registry choice is exported only when it is this package's own function (see
    :func:`_package_functions`) *and* the target's mapping table (:data:`_MAPPED`) has an entry for
    it; any other is ``"impossible"`` (raises whatever ``strict`` says, naming the axis, the choice
    and the target). A new surrogate is thus refused until its mapping (or its refusal, with the
    reason) is one entry of ``_TRL_SURROGATES`` and of ``_VERL_SURROGATES``.
    """
    label = _LABELS[target]
    axes = _package_functions(algo)
    out = [Issue("impossible", axis, f"{axis}={getattr(algo, axis)!r} is a function registered from outside grpo_lab "
                 f"(or a built-in name re-registered): grpo_lab.export cannot tell what it computes, so it maps it to "
                 f"no {label} setting. A correction of the sampler-learner mismatch (TIS / MIS) is "
                 "Algorithm.mismatch, which maps to TRL's vllm_importance_sampling_* and verl's "
                 "algorithm.rollout_correction.*")
           for axis, registry, own in axes
           if _is_foreign(registry.get(getattr(algo, axis)), own.get(getattr(algo, axis)))]
    if not out and algo.advantage in _adv.VALUE_BASELINE_ESTIMATORS and target == "trl":
        out.append(Issue("impossible", "advantage", f"advantage={algo.advantage!r} needs a value model: TRL's "
                         "GRPOTrainer has no critic and no GAE (TRL's PPOTrainer is another, experimental script with "
                         "its own reward-model contract, not a GRPOConfig): export it with to='verl', whose "
                         "adv_estimator=gae trains a critic"))
    elif not out:
        for axis, _, _ in axes:
            key, mapped = getattr(algo, axis), _MAPPED[target][axis]
            if key not in mapped:
                out.append(Issue("impossible", axis, f"{axis}={key!r} is not mapped to {label}: grpo_lab.export maps "
                                 f"{axis} {list(mapped)} only, and exporting it as one of them would train another "
                                 "objective under its name"))
    if algo.nll_coef > 0:
        out.append(Issue("impossible", "nll_coef", f"nll_coef={algo.nll_coef:g} (VAPO's positive-example LM loss, "
                         f"Eqs. 9-10): {label} has no such loss term"))
    if algo.ntp_coef > 0:
        out.append(Issue("impossible", "ntp_coef", f"ntp_coef={algo.ntp_coef:g} (a next-token-prediction term on the "
                         f"task's demonstrations, the L_LM + beta RL ablation): {label}'s RL trainer has no such "
                         "loss term"))
    return out


def _common_sampling_notes(algo: Algorithm, cache: Optional[int], b: dict) -> list:
    notes = []
    if cache is not None:
        notes.append(f"soft overlong punishment (DAPO Eq. 13): L_max = {b['max_new_tokens']}, L_cache = {cache} tokens "
                     "(grpo_lab.algo.selection.overlong_cache_tokens), added to the task reward before the advantage; "
                     "lengths count the EOS token in all three")
    return notes


def _fix_text(algo: Algorithm, issues: list) -> str:
    fixes, budget_fixes = {}, {}
    for i in issues:
        fixes.update(i.fix or {})
        budget_fixes.update(i.budget_fix or {})
    if any(i.fix is None and i.budget_fix is None for i in issues):
        return ""
    name = next((k for k, v in PRESETS.items() if v == algo), "algo")
    parts = []
    if fixes:
        parts.append(f"{name}.replace({', '.join(f'{k}={v!r}' for k, v in fixes.items())})")
    if budget_fixes:
        parts.append("budget " + ", ".join(f"{k}={v!r}" for k, v in budget_fixes.items()))
    return " and ".join(parts)


# ---------------------------------------------------------------------------------------------
# TRL
# ---------------------------------------------------------------------------------------------
# Each axis maps through a table keyed by the algorithm's choice; a choice missing from a table is
# refused by _builtin_choices before any mapping runs (see _MAPPED).
def _trl_scaled_advantage(algo: Algorithm, d: _Draft) -> None:
    """``"group"`` / ``"batch"``: ``scale_rewards`` of the same name; TRL's epsilon is a fixed 1e-4."""
    d.config["scale_rewards"] = algo.advantage
    if algo.adv_eps != TRL_ADV_EPS:
        d.issues.append(Issue("approximate", "adv_eps",
                              f"TRL adds a hard-coded 1e-4 to the reward std (no setting); adv_eps={algo.adv_eps:g} "
                              "gives advantages that differ by a relative ~|adv_eps - 1e-4| / std",
                              fix={"adv_eps": TRL_ADV_EPS}))
    else:
        d.notes.append(f"advantage {algo.advantage!r}: scale_rewards={algo.advantage!r}, (r - mean_g) / (std + 1e-4) "
                       "with the unbiased std, TRL's hard-coded epsilon = adv_eps (exact)")


def _trl_group_mean_advantage(algo: Algorithm, d: _Draft) -> None:
    d.config["scale_rewards"] = "none"
    d.notes.append("advantage 'group_mean' (Dr.GRPO §3.2, V3.2 Eq. 5): scale_rewards='none', r - mean_g (exact)")


def _trl_no_rloo(algo: Algorithm, d: _Draft) -> None:
    d.issues.append(Issue("impossible", "advantage",
                          "TRL's GRPOTrainer has no leave-one-out baseline (trl.RLOOTrainer is another trainer, "
                          "not mapped); use advantage='group_mean' (RLOO up to the factor G/(G-1))"))


#: advantage estimator -> its TRL mapping (or its refusal, with the reason)
_TRL_ADVANTAGES = {"group": _trl_scaled_advantage, "batch": _trl_scaled_advantage,
                   "group_mean": _trl_group_mean_advantage, "rloo": _trl_no_rloo}
#: ratio level -> TRL's ``importance_sampling_level``
_TRL_IS_LEVELS = {"token": "token", "sequence": "sequence", "sequence_token": "sequence"}


def _trl_ratio(algo: Algorithm, d: _Draft) -> None:
    level = _TRL_IS_LEVELS[algo.ratio_level]
    d.config["importance_sampling_level"] = level
    if level == "sequence":
        d.notes.append(f"ratio {algo.ratio_level!r}: importance_sampling_level='sequence', s_i = exp(mean_t log r_it) "
                       "(GSPO Eq. 7, unclamped in TRL); "
                       + ("GSPO-token (Eq. 14) equals it in value and gradient because TRL's advantages are one "
                          "per response" if algo.ratio_level == "sequence_token" else "exact"))


#: aggregation -> TRL's ``loss_type`` under the PPO clip (DAPO Eq. 12, group_token_mean, has none: nearest 'dapo')
_TRL_PPO_LOSS_TYPES = {"seq_mean_token_mean": "grpo", "token_mean": "dapo", "seq_mean_token_sum_norm": "dr_grpo",
                       "group_token_mean": "dapo"}


def _trl_ppo_clip(algo: Algorithm, d: _Draft) -> str:
    loss_type = _TRL_PPO_LOSS_TYPES[algo.aggregation]
    d.config.update(loss_type=loss_type, epsilon=algo.eps_low, epsilon_high=algo.eps_high, delta=None)
    d.notes.append(f"PPO clip: epsilon={algo.eps_low:g} (1 - epsilon is the floor), epsilon_high={algo.eps_high:g} "
                   "(DAPO's clip-higher); delta=None keeps INTELLECT-2's two-sided clip off")
    return loss_type


def _trl_cispo(algo: Algorithm, d: _Draft) -> str:
    d.config.update(loss_type="cispo", epsilon=algo.eps_low, epsilon_high=1.0 + algo.eps_high, delta=None)
    d.notes.append(f"CISPO: TRL's epsilon_high is an absolute cap on the weight, min(r, epsilon_high): "
                   f"1 + eps_high = {1.0 + algo.eps_high:g} (TRL's docs recommend 5.0, ScaleRL's eps_max); TRL has no "
                   "floor. TRL's loss is -sg(w) A log pi_theta (MiniMax-M1 Eq. 4), ours -sg(w) A log r: the same "
                   "gradient, values that differ by sg(w) A log pi_old")
    if algo.ratio_level != "token":
        d.issues.append(Issue("impossible", "ratio_level",
                              f"surrogate='cispo' with ratio_level={algo.ratio_level!r} is not mapped (untested)"))
    if algo.eps_low < 1.0:
        d.issues.append(Issue("lost", "eps_low", f"TRL's CISPO weight has no floor; eps_low={algo.eps_low:g} "
                              f"(floor {1 - algo.eps_low:g}) would be lost", fix={"eps_low": 1.0}))
    if algo.mask_eps_low is not None or algo.mask_eps_high is not None:
        d.issues.append(Issue("lost", "mask_eps", "TRL's CISPO has no token mask M (MiniMax-M1 Eq. 7)",
                              fix={"mask_eps_low": None, "mask_eps_high": None}))
    return "cispo"


def _trl_sapo(algo: Algorithm, d: _Draft) -> str:
    tau_pos, tau_neg = algo.params["tau_pos"], algo.params["tau_neg"]
    d.config.update(loss_type="sapo", sapo_temperature_pos=tau_pos, sapo_temperature_neg=tau_neg)
    d.notes.append(f"SAPO: loss_type='sapo', gate 4/tau sigmoid(tau (r - 1)) with sapo_temperature_pos={tau_pos:g}, "
                   f"sapo_temperature_neg={tau_neg:g} (tau_neg where A <= 0, as grpo_lab); TRL does not clamp log r "
                   "(grpo_lab at +-20: equal inside) and holds the temperatures in float32 (1.05 is 1.0499999523), "
                   "which a float32 loss does anyway")
    return "sapo"


def _trl_refuse(reason: str):
    """A TRL surrogate entry that refuses the surrogate with ``reason`` (an "impossible" Issue)."""
    def refuse(algo: Algorithm, d: _Draft) -> str:
        d.issues.append(Issue("impossible", "surrogate", f"surrogate={algo.surrogate!r}: {reason}"))
        return ""
    return refuse


#: surrogate (``Algorithm.surrogate``) -> its TRL mapping: ``f(algo, draft)`` sets ``loss_type`` and the clip fields and
#: returns the ``loss_type`` (a key of :data:`_TRL_NORMALISERS`). A surrogate without an entry is refused (an
#: ExportError naming it and TRL): map a new one here, or refuse it here with the reason (an "impossible" Issue).
_TRL_SURROGATES = {
    "ppo": _trl_ppo_clip, "cispo": _trl_cispo, "sapo": _trl_sapo,
    "gmpo": _trl_refuse(f"TRL {TRL_VERSION} has GMPO only as a separate experimental trainer (trl.experimental.gmpo), "
                        "which this export does not configure; verl's loss_mode=geo_mean computes it"),
    "kl_cov": _trl_refuse(f"TRL {TRL_VERSION} has no covariance-based token selection (KL-Cov, arXiv 2505.22617); "
                          "verl's loss_mode=kl_cov computes it"),
    "clip_cov": _trl_refuse(f"TRL {TRL_VERSION} has no covariance-based token selection (Clip-Cov, arXiv 2505.22617); "
                            "verl's loss_mode=clip_cov computes it"),
}


def _trl_token_count(algo: Algorithm, b: dict, loss_type: str, d: _Draft) -> None:
    """``dapo`` / ``cispo``: the generation batch's token count, one minibatch's only with one minibatch."""
    if b.get("minibatches", 1) > 1:
        d.issues.append(Issue("approximate", "minibatches",
                              "TRL divides each minibatch's token sum by the generation batch's token count / "
                              "minibatches (the mean minibatch count, trl PR #6024), grpo_lab by that minibatch's own "
                              "count: each step's gradient differs by a positive factor", budget_fix={"minibatches": 1}))
    else:
        d.notes.append(f"aggregation: loss_type={loss_type!r} divides by the token count of the generation batch "
                       "(num_items_in_batch), which is one minibatch here: token_mean (exact)")


def _trl_sequence_mean(algo: Algorithm, b: dict, loss_type: str, d: _Draft) -> None:
    d.notes.append(f"aggregation: loss_type={loss_type!r}, 1/G sum_i 1/|o_i| sum_t (DeepSeekMath Eq. 3); TRL counts fully "
                   "masked rows in G, grpo_lab does not (equal unless a row is empty)")


def _trl_dr_grpo_constant(algo: Algorithm, b: dict, loss_type: str, d: _Draft) -> None:
    if "max_new_tokens" not in b:
        raise ValueError(f"{algo.name}: TRL's dr_grpo normaliser is max_completion_length; pass max_new_tokens= "
                         "(the generation budget, Dr.GRPO's MAX_TOKENS)")
    if algo.max_tokens is not None and algo.max_tokens != b["max_new_tokens"]:
        d.issues.append(Issue("approximate", "max_tokens",
                              f"TRL's dr_grpo constant is max_completion_length={b['max_new_tokens']}, not "
                              f"max_tokens={algo.max_tokens}", fix={"max_tokens": None}))
    d.notes.append(f"aggregation: loss_type='dr_grpo' divides the token sum by B * max_completion_length "
                   f"(= {b['max_new_tokens']}, Dr.GRPO's constant) and counts fully masked rows in B, grpo_lab does "
                   "not (equal unless a row is empty)")


#: TRL ``loss_type`` -> how it normalises the token sum (its notes and issues)
_TRL_NORMALISERS = {"dapo": _trl_token_count, "cispo": _trl_token_count, "grpo": _trl_sequence_mean,
                    "sapo": _trl_sequence_mean,
                    "dr_grpo": _trl_dr_grpo_constant}


def _trl_aggregation(algo: Algorithm, b: dict, loss_type: str, d: _Draft) -> None:
    agg = algo.aggregation
    if agg == "group_token_mean":
        d.issues.append(Issue("approximate", "aggregation",
                              "the per-group token mean (DAPO Eq. 12 as written, CISPO Eq. 4: a token mean per group, "
                              "then the mean over groups) is not in "
                              f"TRL; loss_type={loss_type!r} divides by the whole batch's token count ('token_mean'), "
                              "which weighs each group by its share of the tokens", fix={"aggregation": "token_mean"}))
    elif loss_type == "cispo" and agg != "token_mean":
        d.issues.append(Issue("approximate", "aggregation", f"TRL's cispo aggregates as 'token_mean', not {agg!r}",
                              fix={"aggregation": "token_mean"}))
    elif loss_type == "sapo" and agg != "seq_mean_token_mean":
        d.issues.append(Issue("approximate", "aggregation", f"TRL's sapo aggregates as 'seq_mean_token_mean', not "
                              f"{agg!r}", fix={"aggregation": "seq_mean_token_mean"}))
    if loss_type not in _TRL_NORMALISERS:
        raise ValueError(f"grpo_lab.export: TRL loss_type {loss_type!r} (surrogate={algo.surrogate!r}) has no entry in "
                         "_TRL_NORMALISERS")
    _TRL_NORMALISERS[loss_type](algo, b, loss_type, d)


#: KL estimator -> the one TRL computes for it (TRL has k3 only: another is an "approximate" issue)
_TRL_KL = {"k1": "k3", "k2": "k3", "k3": "k3"}


def _trl_kl(algo: Algorithm, d: _Draft) -> None:
    if not algo.uses_kl:
        d.config["beta"] = 0.0
        d.config["use_bias_correction_kl"] = False
        return
    d.config["beta"] = algo.beta
    d.config["use_bias_correction_kl"] = bool(algo.kl_importance_correction)
    if _TRL_KL[algo.kl] != algo.kl:
        d.issues.append(Issue("approximate", "kl", f"TRL has the k3 estimator only, not {algo.kl!r}",
                              fix={"kl": "k3"}))
    if algo.kl_importance_correction:
        d.notes.append("KL: k3 times the importance ratio, use_bias_correction_kl=True (DeepSeek-V3.2 Eq. 7; "
                       "TRL does not clamp the ratio, grpo_lab clamps log r to +-20)")
        if algo.ratio_level != "token":
            d.issues.append(Issue("approximate", "kl_importance_correction",
                                  "with importance_sampling_level='sequence' TRL multiplies the KL by the sequence "
                                  "ratio s_i, grpo_lab by the token ratio", fix={"kl_importance_correction": False}))
    else:
        d.notes.append("KL: k3 (DeepSeekMath Eq. 4) with use_bias_correction_kl=False; TRL's default True would be "
                       "DeepSeek-V3.2 Eq. 7 instead")


def _trl_masking_and_shaping(algo: Algorithm, b: dict, loss_type: str, d: _Draft) -> None:
    """V3.2's Off-Policy Sequence Masking, DAPO's dynamic sampling, Overlong Filtering and soft punishment."""
    d.config["off_policy_mask_threshold"] = algo.offpolicy_mask_delta
    if algo.offpolicy_mask_delta is not None:
        d.notes.append(f"Off-Policy Sequence Masking (V3.2 Eqs. 8-9): off_policy_mask_threshold="
                       f"{algo.offpolicy_mask_delta:g}; with vLLM TRL measures the divergence against the sampler's "
                       "log-probs, grpo_lab against old_logp (TrainerConfig.old_logp)")
    if algo.dynamic_sampling:
        d.issues.append(Issue("lost", "dynamic_sampling", "TRL 1.16 has no dynamic sampling (DAPO Eq. 11; trl issue "
                              "#3708): groups of equal accuracy would train with zero advantage",
                              fix={"dynamic_sampling": False}))
    d.config["mask_truncated_completions"] = bool(algo.overlong_filter)
    if algo.overlong_filter:
        if loss_type in ("grpo", "dr_grpo"):
            d.issues.append(Issue("approximate", "overlong_filter",
                                  f"mask_truncated_completions leaves empty rows that TRL's {loss_type!r} counts in "
                                  "its sequence mean (grpo_lab does not): the loss is scaled by non-empty/all rows",
                                  fix={"overlong_filter": False}))
        else:
            d.notes.append("Overlong Filtering (DAPO §3.4): mask_truncated_completions=True; masked rows add no token "
                           "to the token count (exact)")
    cache = _cache_tokens(algo, b)
    if cache is not None:
        d.notes.append(f"soft overlong punishment: not a GRPOConfig field; pass reward_funcs=[your_reward, "
                       f"*grpo_lab.export.trl_reward_funcs(algo, max_new_tokens={b['max_new_tokens']})] "
                       f"(trl.rewards.get_soft_overlong_punishment({b['max_new_tokens']}, {cache})); "
                       "sum_then_normalize adds it before the advantage")
    d.notes += _common_sampling_notes(algo, cache, b)


def _trl(algo: Algorithm, b: dict) -> tuple[dict, list, list]:
    """``GRPOConfig`` keyword arguments, notes and issues for ``algo``, axis by axis."""
    d = _Draft(issues=_builtin_choices(algo, "trl"))
    if d.impossible():
        return d.config, d.notes, d.issues
    _TRL_ADVANTAGES[algo.advantage](algo, d)
    d.config["multi_objective_aggregation"] = "sum_then_normalize"
    _trl_ratio(algo, d)
    loss_type = _TRL_SURROGATES[algo.surrogate](algo, d)
    if d.impossible():  # a surrogate TRL has no counterpart for (its entry says why)
        return d.config, d.notes, d.issues
    _trl_aggregation(algo, b, loss_type, d)
    _trl_kl(algo, d)
    _trl_masking_and_shaping(algo, b, loss_type, d)
    # --- what grpo_lab does not have -------------------------------------------------------------
    d.config.update(top_entropy_quantile=1.0, entropy_coef=0.0)
    d.notes.append("off: top_entropy_quantile=1.0, entropy_coef=0.0")
    _sampling_part(algo, b, d, _smp.trl_sampling(algo, b))
    _trl_budget(d.config, b, d.notes)
    _optimisation(algo, b, d, _opt.trl_optimisation)
    return d.config, d.notes, d.issues


def _sampling_part(algo: Algorithm, b: dict, d: _Draft, part: tuple) -> None:
    """The sampling settings (:mod:`grpo_lab.export.sampling`), ``(config, notes, issues)``, into the draft."""
    config, notes, issues = part
    d.config.update(config)
    d.notes.extend(notes)
    d.issues.extend(Issue(**i) for i in issues)


def _optimisation(algo: Algorithm, b: dict, d: _Draft, build) -> None:
    """The optimiser, schedule and precision settings (:mod:`grpo_lab.export.optimisation`) into the draft."""
    config, notes, issues = build(algo, b)
    d.config.update(config)
    d.notes.extend(notes)
    d.issues.extend(Issue(**i) for i in issues)


def _trl_budget(kw: dict, b: dict, notes: list) -> None:
    if "group_size" in b:
        kw["num_generations"] = b["group_size"]
    if "max_new_tokens" in b:
        kw["max_completion_length"] = b["max_new_tokens"]
    sizes = _sizes(b)
    if sizes is not None:
        kw["per_device_train_batch_size"] = sizes["micro"]
        kw["gradient_accumulation_steps"] = sizes["accumulation"]
        kw["steps_per_generation"] = sizes["accumulation"] * sizes["minibatches"]
        notes.append(f"sizes: a generation batch of {b['prompts_per_step']} prompts x {b['group_size']} = "
                     f"per_device_train_batch_size ({sizes['micro']}) x {sizes['world']} processes x "
                     f"steps_per_generation ({kw['steps_per_generation']}) rows; "
                     f"{sizes['minibatches'] * int(b.get('epochs', 1))} optimiser step(s) per generation "
                     f"({sizes['minibatches']} minibatch(es) x {int(b.get('epochs', 1))} pass(es), num_iterations). "
                     f"Launch with accelerate on {sizes['world']} process(es)")
    for ours, theirs in (("epochs", "num_iterations"), ("temperature", "temperature")):
        if ours in b:
            kw[theirs] = b[ours]


# ---------------------------------------------------------------------------------------------
# verl
# ---------------------------------------------------------------------------------------------
_A = "actor_rollout_ref.actor."


def _verl_grpo_advantage(algo: Algorithm, d: _Draft) -> None:
    """``"group"`` / ``"group_mean"``: verl's GRPO estimator, with or without the std (epsilon fixed at 1e-6)."""
    d.config["algorithm.adv_estimator"] = "grpo"
    d.config["algorithm.norm_adv_by_std_in_grpo"] = algo.advantage == "group"
    if algo.advantage == "group" and algo.adv_eps != VERL_ADV_EPS:
        d.issues.append(Issue("approximate", "adv_eps",
                              f"verl's GRPO estimator adds a hard-coded 1e-6 to the std (no setting), adv_eps="
                              f"{algo.adv_eps:g}: advantages differ by a relative ~|adv_eps - 1e-6| / std "
                              f"({abs(algo.adv_eps - VERL_ADV_EPS) / 0.5:.1g} for one success in a group of 4, "
                              "std 0.5)", fix={"adv_eps": VERL_ADV_EPS}))
    else:
        d.notes.append("advantage: algorithm.adv_estimator=grpo (not grpo_vectorized, which gives an all-equal "
                       "float64 group 0.0119 instead of 0), "
                       + ("norm_adv_by_std_in_grpo=True, (r - mean_g) / (std + 1e-6), unbiased std (exact)"
                          if algo.advantage == "group" else
                          "norm_adv_by_std_in_grpo=False, r - mean_g (Dr.GRPO §3.2; exact)"))


def _verl_rloo_advantage(algo: Algorithm, d: _Draft) -> None:
    d.config["algorithm.adv_estimator"] = "rloo"
    d.notes.append("advantage: algorithm.adv_estimator=rloo, G/(G-1) (r - mean_g) (exact up to rounding)")


def _verl_no_batch_std(algo: Algorithm, d: _Draft) -> None:
    d.issues.append(Issue("impossible", "advantage", "verl has no group-mean / batch-std estimator "
                          "(reinforce_plus_plus_baseline also subtracts the batch mean)"))


def _verl_gae_advantage(algo: Algorithm, d: _Draft) -> None:
    """``"gae"``: verl's ``compute_gae_advantage_return`` (its critic's returns use the same ``lam``), whitened over
    the batch; VAPO's decoupled and length-adaptive lambdas have no verl setting."""
    d.config["algorithm.adv_estimator"] = "gae"
    d.config["algorithm.gamma"] = algo.gamma
    d.config["algorithm.lam"] = algo.lam
    d.issues.append(Issue("approximate", "advantage", "verl whitens the GAE advantages over the whole batch "
                          "(verl_F.masked_whiten: (A - mean) / sqrt(var + 1e-8) over every real token), grpo_lab uses "
                          "them as GAE gives them: the same direction per token, another scale and shift"))
    if algo.critic_lam is not None and algo.critic_lam != algo.lam:
        d.issues.append(Issue("approximate", "critic_lam", f"critic_lam={algo.critic_lam:g} (VAPO's Decoupled-GAE): "
                              f"verl's critic targets are the GAE returns at the policy's lam={algo.lam:g} (returns = "
                              "advantages + values); it has no separate critic lambda", fix={"critic_lam": None}))
    if algo.lam_alpha is not None:
        d.issues.append(Issue("approximate", "lam_alpha", f"lam_alpha={algo.lam_alpha:g} (VAPO's length-adaptive "
                              "lambda 1 - 1/(alpha l), Eq. 5): verl's GAE has one fixed lam for every sequence; "
                              f"exported as lam={algo.lam:g}", fix={"lam_alpha": None}))
    d.notes.append(f"advantage: algorithm.adv_estimator=gae, gamma={algo.gamma:g}, lam={algo.lam:g}, the reward at "
                   "each response's last token (verl's token_level_rewards), a critic trained beside the actor")


def _verl_critic(algo: Algorithm, b: dict, d: _Draft) -> None:
    """verl's critic for a value-based estimator: its optimiser (``value_lr``, constant, no warm-up, the actor's
    betas / weight decay / clip), value clip, token-mean loss, sizes and ``trainer.critic_warmup``."""
    c = "critic."
    d.config[c + "enable"] = True
    if "lr" in b or "value_lr" in b:
        d.config[c + "optim.lr"] = b.get("value_lr", b.get("lr"))
    d.config.update({c + "optim.lr_scheduler_type": "constant", c + "optim.lr_warmup_steps": 0,
                     c + "optim.lr_warmup_steps_ratio": 0.0, c + "optim.betas": list(b["betas"]),
                     c + "optim.weight_decay": b["weight_decay"]})
    if "grad_clip" in b:
        d.config[c + "optim.clip_grad"] = b["grad_clip"]
    clip = algo.value_clip_eps
    d.config[c + "cliprange_value"] = math.inf if clip is None else clip
    d.config[c + "loss_agg_mode"] = "token-mean"
    micro = d.config.get(_A + "ppo_micro_batch_size_per_gpu")
    if micro is not None:
        d.config[c + "ppo_micro_batch_size_per_gpu"] = micro
    warm = b.get("value_warmup_steps", 0)
    d.config["trainer.critic_warmup"] = warm
    if warm:
        d.issues.append(Issue("approximate", "value_warmup_steps", f"value_warmup_steps={warm}: verl's "
                              "trainer.critic_warmup steps are the first of trainer.total_training_steps (the actor "
                              "trains that many fewer steps), grpo_lab's value pretraining comes before the run's steps"))
    if b.get("value_init", "policy") != "policy":
        d.issues.append(Issue("impossible", "value_init", f"value_init={b['value_init']!r}: verl builds its critic from "
                              "critic.model.path (a transformers checkpoint with a fresh value head); the export sets "
                              "it to the policy's checkpoint, as value_init='policy'"))
    d.notes.append(f"critic: critic.optim.lr={d.config.get(c + 'optim.lr', 'verl default')} constant without warm-up "
                   f"(grpo_lab's critic ignores the schedule), cliprange_value={d.config[c + 'cliprange_value']:g} "
                   "(inf: no clip), 0.5 (V - R)^2 token-mean as grpo_lab's value_loss; critic.model.path is the "
                   "policy's checkpoint (value_init='policy'), whose value head transformers initialises at random "
                   "where grpo_lab's starts at zero: the first values differ, the objective does not")


#: advantage estimator -> its verl mapping (or its refusal, with the reason)
_VERL_ADVANTAGES = {"group": _verl_grpo_advantage, "group_mean": _verl_grpo_advantage, "rloo": _verl_rloo_advantage,
                    "batch": _verl_no_batch_std, "gae": _verl_gae_advantage}
#: ratio level -> verl's ``policy_loss.loss_mode`` under the PPO clip
_VERL_PPO_LOSS_MODES = {"token": "vanilla", "sequence": "gspo", "sequence_token": "gspo"}


def _verl_ppo_clip(algo: Algorithm, d: _Draft) -> None:
    loss_mode = _VERL_PPO_LOSS_MODES[algo.ratio_level]
    d.config[_A + "policy_loss.loss_mode"] = loss_mode
    d.config[_A + "clip_ratio_low"] = algo.eps_low
    d.config[_A + "clip_ratio_high"] = algo.eps_high
    d.config[_A + "clip_ratio_c"] = VERL_DUAL_CLIP_OFF
    d.notes.append(f"PPO clip: clip_ratio_low={algo.eps_low:g}, clip_ratio_high={algo.eps_high:g} (verl's clip_ratio "
                   "is only their default); clip_ratio_c=1e10 switches off verl's dual clip (default 3: the loss of "
                   "an A<0 token capped at 3|A|, in neither DeepSeekMath nor DAPO) exactly, since verl clamps log r "
                   "to +-20")
    if loss_mode == "gspo":
        d.notes.append("GSPO: policy_loss.loss_mode=gspo computes GSPO-token (Eq. 14), equal to GSPO (Eq. 5, 10) in "
                       "value and gradient with one advantage per response, which verl's GRPO estimator gives; verl "
                       "clamps log s_i at 10")


def _verl_cispo(algo: Algorithm, d: _Draft) -> None:
    d.config[_A + "policy_loss.loss_mode"] = "cispo"
    d.config[_A + "clip_ratio_low"] = algo.eps_low
    d.config[_A + "clip_ratio_high"] = algo.eps_high
    d.notes.append(f"CISPO: policy_loss.loss_mode=cispo, clip(r, 1 - {algo.eps_low:g}, 1 + {algo.eps_high:g}) "
                   "relative, as ours (clip_ratio_low=1 removes the floor). verl's loss is -sg(w) A log pi_theta "
                   "(MiniMax-M1 Eq. 4), ours -sg(w) A log r: the same gradient, values that differ by "
                   "sg(w) A log pi_old")
    if algo.ratio_level != "token":
        d.issues.append(Issue("impossible", "ratio_level",
                              f"surrogate='cispo' with ratio_level={algo.ratio_level!r}: verl's cispo is token-level"))
    if algo.mask_eps_low is not None or algo.mask_eps_high is not None:
        d.issues.append(Issue("lost", "mask_eps", "verl's cispo has no token mask M (MiniMax-M1 Eq. 7)",
                              fix={"mask_eps_low": None, "mask_eps_high": None}))


def _verl_token_level(algo: Algorithm, d: _Draft, loss_mode: str) -> None:
    d.config[_A + "policy_loss.loss_mode"] = loss_mode
    if algo.ratio_level != "token":
        d.issues.append(Issue("impossible", "ratio_level", f"surrogate={algo.surrogate!r} with ratio_level={algo.ratio_level!r}: "
                              f"verl's {loss_mode} is token-level"))


def _verl_gmpo(algo: Algorithm, d: _Draft) -> None:
    _verl_token_level(algo, d, "geo_mean")
    d.config[_A + "clip_ratio_low"] = algo.eps_low
    d.config[_A + "clip_ratio_high"] = algo.eps_high
    d.notes.append(f"GMPO: policy_loss.loss_mode=geo_mean clips log r to [-{algo.eps_low:g}, {algo.eps_high:g}] on the "
                   "side of sign(A) (clip_ratio_low / _high read in log space), exp of each row's mean, times the row's "
                   "mean advantage; verl ignores loss_agg_mode and averages over every row of the call (an empty row "
                   "counts, with loss 0) and does not clamp the mean log-ratio (grpo_lab at +-20)")


def _verl_sapo(algo: Algorithm, d: _Draft) -> None:
    _verl_token_level(algo, d, "sapo")
    d.config[_A + "tau_pos"] = algo.params["tau_pos"]
    d.config[_A + "tau_neg"] = algo.params["tau_neg"]
    d.notes.append(f"SAPO: policy_loss.loss_mode=sapo with tau_pos={algo.params['tau_pos']:g}, "
                   f"tau_neg={algo.params['tau_neg']:g}; verl clamps log r to +-20 (as grpo_lab) and always aggregates "
                   "as seq-mean-token-mean, whatever loss_agg_mode says")
    if algo.aggregation != "seq_mean_token_mean":
        d.issues.append(Issue("approximate", "aggregation", f"verl's sapo aggregates as 'seq_mean_token_mean', not "
                              f"{algo.aggregation!r}", fix={"aggregation": "seq_mean_token_mean"}))


_PER_CALL = ("verl selects the tokens within each call of the policy loss, i.e. per micro-batch: the same tokens "
             "as grpo_lab, which selects over the whole minibatch, when ppo_micro_batch_size_per_gpu covers a "
             "device's whole minibatch (micro_batch_size unset) on one device")


def _verl_kl_cov(algo: Algorithm, d: _Draft) -> None:
    _verl_token_level(algo, d, "kl_cov")
    d.config[_A + "policy_loss.kl_cov_ratio"] = algo.params["kl_cov_ratio"]
    d.config[_A + "policy_loss.ppo_kl_coef"] = algo.params["kl_cov_coef"]
    d.notes.append(f"KL-Cov: policy_loss.loss_mode=kl_cov, kl_cov_ratio={algo.params['kl_cov_ratio']:g}, "
                   f"ppo_kl_coef={algo.params['kl_cov_coef']:g} (verl's default 0.1 is not the paper's 1); {_PER_CALL}")


def _verl_clip_cov(algo: Algorithm, d: _Draft) -> None:
    _verl_token_level(algo, d, "clip_cov")
    d.config[_A + "clip_ratio_low"] = algo.eps_low
    d.config[_A + "clip_ratio_high"] = algo.eps_high
    for k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"):
        d.config[_A + "policy_loss." + k] = algo.params[k]
    d.notes.append("Clip-Cov: policy_loss.loss_mode=clip_cov (PPO clip without verl's dual clip, as grpo_lab); the "
                   f"random draw uses torch's global generator in both, so the same tokens only from the same state; "
                   f"{_PER_CALL}")


#: the surrogates whose token selection verl computes per call of the policy loss (per micro-batch)
_VERL_PER_CALL = ("kl_cov", "clip_cov")


def _verl_per_call_statistics(algo: Algorithm, b: dict, d: _Draft) -> None:
    """KL-Cov / Clip-Cov select tokens over the whole minibatch in grpo_lab, per micro-batch call in verl."""
    sizes = _sizes(b)
    if algo.surrogate not in _VERL_PER_CALL or sizes is None:
        return
    if sizes["world"] > 1 or sizes["micro"] < sizes["per_device"]:
        d.issues.append(Issue("approximate", "micro_batch_size",
                              f"{_PER_CALL}; here a call sees {sizes['micro']} of the minibatch's "
                              f"{sizes['rows_minibatch']} rows, so the selections (and the gradient) differ",
                              budget_fix={"micro_batch_size": sizes["per_device"], "nnodes": 1,
                                          "n_gpus_per_node": 1}))


#: surrogate (``Algorithm.surrogate``) -> its verl mapping: ``f(algo, draft)`` sets ``policy_loss.loss_mode`` and the
#: clip ratios. A surrogate without an entry is refused (an ExportError naming it and verl): map a new one here,
#: or refuse it here with the reason (an "impossible" Issue).
_VERL_SURROGATES = {"ppo": _verl_ppo_clip, "cispo": _verl_cispo, "gmpo": _verl_gmpo, "sapo": _verl_sapo,
                    "kl_cov": _verl_kl_cov, "clip_cov": _verl_clip_cov}
#: aggregation -> verl's ``loss_agg_mode`` (DAPO Eq. 12, group_token_mean, has none: nearest token-mean)
_VERL_AGG_MODES = {"seq_mean_token_mean": "seq-mean-token-mean", "token_mean": "token-mean",
                   "seq_mean_token_sum_norm": "seq-mean-token-sum-norm", "group_token_mean": "token-mean"}


def _verl_aggregation(algo: Algorithm, b: dict, d: _Draft) -> None:
    agg = algo.aggregation
    d.config[_A + "loss_agg_mode"] = _VERL_AGG_MODES[agg]
    if agg == "group_token_mean":
        d.issues.append(Issue("approximate", "aggregation",
                              "the per-group token mean (DAPO Eq. 12 as written, CISPO Eq. 4: a token mean per group, "
                              "then the mean over groups) is not in "
                              "verl; token-mean divides by the minibatch's token count ('token_mean'), which weighs "
                              "each group by its share of the tokens", fix={"aggregation": "token_mean"}))
    elif agg == "token_mean":
        d.notes.append("aggregation: loss_agg_mode=token-mean divides by the minibatch's token count over all devices "
                       "(batch_num_tokens): token_mean (exact)")
    elif agg == "seq_mean_token_mean":
        d.notes.append("aggregation: loss_agg_mode=seq-mean-token-mean (DeepSeekMath Eq. 3); verl divides each row by "
                       "|o_i| + 1e-8, computed in float32 from its bool mask, i.e. |o_i| (exact); its trainer counts "
                       "every row of the minibatch in G (ppo_mini_batch_size x n), grpo_lab only non-empty rows (equal "
                       "unless a row is empty)")
    elif agg == "seq_mean_token_sum_norm":
        constant = algo.max_tokens if algo.max_tokens is not None else b.get("max_new_tokens")
        if constant is None:
            raise ValueError(f"{algo.name}: Dr.GRPO's constant normaliser must be given: pass max_new_tokens= (the "
                             "generation budget) or set Algorithm.max_tokens; without loss_scale_factor verl divides "
                             "by the padded width of each micro-batch")
        d.config[_A + "loss_scale_factor"] = int(constant)
        d.notes.append(f"aggregation: seq-mean-token-sum-norm with loss_scale_factor={constant} (Dr.GRPO's constant; "
                       "without it verl divides by the padded width of each micro-batch); rows counted as in "
                       "seq-mean-token-mean")


#: KL estimator -> verl's ``kl_loss_type``
_VERL_KL_TYPES = {"k1": "k1", "k2": "k2", "k3": "low_var_kl"}


def _verl_kl(algo: Algorithm, d: _Draft) -> None:
    if not algo.uses_kl:
        d.config[_A + "use_kl_loss"] = False
        return
    d.config[_A + "use_kl_loss"] = True
    d.config[_A + "kl_loss_type"] = _VERL_KL_TYPES[algo.kl]
    d.config[_A + "kl_loss_coef"] = algo.beta
    d.notes.append(f"KL: use_kl_loss=True, kl_loss_type={_VERL_KL_TYPES[algo.kl]}, kl_loss_coef={algo.beta:g}, "
                   "aggregated with the same loss_agg_mode and added to the policy loss (as inside DeepSeekMath Eq. 3)"
                   + ("; verl clamps its value to [-10, 10] (gradient 0 beyond) and log(pi_ref/pi) to +-20"
                      if algo.kl == "k3" else ""))
    if algo.kl_importance_correction:
        d.issues.append(Issue("lost", "kl_importance_correction",
                              "verl has no importance-corrected KL (DeepSeek-V3.2 Eq. 7); its KL loss is the plain "
                              "estimator", fix={"kl_importance_correction": False}))


def _verl_sampling_and_shaping(algo: Algorithm, b: dict, d: _Draft) -> None:
    """DAPO's dynamic sampling, Overlong Filtering (lost) and soft overlong punishment (the dapo reward manager)."""
    if algo.dynamic_sampling:
        d.config["algorithm.filter_groups.enable"] = True
        d.config["algorithm.filter_groups.metric"] = "acc"
        d.notes.append("dynamic sampling (DAPO Eq. 11): algorithm.filter_groups.enable=True, metric=acc (the raw "
                       "correctness score, as grpo_lab filters on task.is_correct; 'reward' would include the overlong "
                       "penalty); verl's V1 replay buffer refills groups prompt by prompt, grpo_lab in rounds")
    if algo.overlong_filter:
        d.issues.append(Issue("lost", "overlong_filter", "verl 0.9.1 has no Overlong Filtering (DAPO §3.4): truncated "
                              "responses would train", fix={"overlong_filter": False}))
    cache = _cache_tokens(algo, b)
    if cache is not None:
        d.config["reward.reward_manager.name"] = "dapo"
        d.config["++reward.reward_kwargs.max_resp_len"] = b["max_new_tokens"]
        d.config["++reward.reward_kwargs.overlong_buffer_cfg.enable"] = True
        d.config["++reward.reward_kwargs.overlong_buffer_cfg.len"] = cache
        d.config["++reward.reward_kwargs.overlong_buffer_cfg.penalty_factor"] = 1.0
        d.config["++reward.reward_kwargs.overlong_buffer_cfg.log"] = False
        d.notes.append("soft overlong punishment: the 'dapo' reward manager with overlong_buffer_cfg.len = L_cache and "
                       "penalty_factor=1.0 adds min(-(|y| - (L_max - L_cache)) / L_cache, 0), Eq. 13 (exact); it calls "
                       "your compute_score as the naive manager does")
    d.notes += _common_sampling_notes(algo, cache, b)


def _verl(algo: Algorithm, b: dict) -> tuple[dict, list, list]:
    """verl overrides (``{key: python value}``, in order), notes and issues for ``algo``, axis by axis."""
    d = _Draft(issues=_builtin_choices(algo, "verl"))
    if d.impossible():
        return d.config, d.notes, d.issues
    _VERL_ADVANTAGES[algo.advantage](algo, d)
    d.config["algorithm.use_kl_in_reward"] = False
    d.config["algorithm.rollout_correction.rollout_is"] = None
    _VERL_SURROGATES[algo.surrogate](algo, d)
    _verl_per_call_statistics(algo, b, d)
    _verl_aggregation(algo, b, d)
    _verl_kl(algo, d)
    d.config[_A + "entropy_coeff"] = 0
    if algo.offpolicy_mask_delta is not None:
        d.issues.append(Issue("lost", "offpolicy_mask_delta",
                              "verl has no Off-Policy Sequence Masking (DeepSeek-V3.2 Eqs. 8-9); its rollout rejection "
                              "sampling compares the sampler with pi_old and ignores the advantage's sign",
                              fix={"offpolicy_mask_delta": None}))
    _verl_sampling_and_shaping(algo, b, d)
    _sampling_part(algo, b, d, _smp.verl_sampling(algo, b, d.config.get(_A + "policy_loss.loss_mode")))
    _verl_budget(d.config, b, d.notes)
    _optimisation(algo, b, d, _opt.verl_optimisation)
    if algo.advantage in _adv.VALUE_BASELINE_ESTIMATORS:
        _verl_critic(algo, b, d)
    return d.config, d.notes, d.issues


#: per target, per registry axis: the table whose keys are the choices the export maps (see _builtin_choices)
_MAPPED = {
    "trl": {"advantage": _TRL_ADVANTAGES, "ratio_level": _TRL_IS_LEVELS, "surrogate": _TRL_SURROGATES,
            "aggregation": _TRL_PPO_LOSS_TYPES, "kl": _TRL_KL},
    "verl": {"advantage": _VERL_ADVANTAGES, "ratio_level": _VERL_PPO_LOSS_MODES, "surrogate": _VERL_SURROGATES,
             "aggregation": _VERL_AGG_MODES, "kl": _VERL_KL_TYPES},
}


def _verl_budget(ov: dict, b: dict, notes: list) -> None:
    if "group_size" in b:
        ov["actor_rollout_ref.rollout.n"] = b["group_size"]
    if "max_new_tokens" in b:
        ov["data.max_response_length"] = b["max_new_tokens"]
    sizes = _sizes(b)
    if sizes is not None:
        ov["data.train_batch_size"] = b["prompts_per_step"]
        ov[_A + "ppo_mini_batch_size"] = b["prompts_per_step"] // sizes["minibatches"]
        ov[_A + "ppo_micro_batch_size_per_gpu"] = sizes["micro"]
        notes.append(f"sizes: data.train_batch_size and ppo_mini_batch_size count prompts (verl multiplies by "
                     f"rollout.n): {b['prompts_per_step']} prompts, {sizes['minibatches']} minibatch(es) of "
                     f"{sizes['rows_minibatch']} rows over {sizes['world']} GPU(s)")
    if "nnodes" in b or "n_gpus_per_node" in b:
        ov["trainer.nnodes"] = b.get("nnodes", 1)
        ov["trainer.n_gpus_per_node"] = b.get("n_gpus_per_node", 1)
    for ours, theirs in (("epochs", _A + "ppo_epochs"), ("temperature", "actor_rollout_ref.rollout.temperature")):
        if ours in b:
            ov[theirs] = b[ours]


#: a string of two numbers joined by ``_`` (verl's IcePop ``rollout_is_threshold``), which Hydra must read as text
_NUMERIC_PAIR = re.compile(r"[0-9.eE+-]+_[0-9.eE+-]+")


def _hydra_value(v: Any) -> str:
    """A value in Hydra's override grammar (``True``, ``null``, ``1e-06``, ``[0.9,0.99]``, ``seq-mean-token-mean``)."""
    if v is None:
        return "null"
    if isinstance(v, str) and _NUMERIC_PAIR.fullmatch(v):
        return f"'{v}'"  # verl's 'lower_upper' threshold: quoted, a string for Hydra and YAML
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_hydra_value(x) for x in v) + "]"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "inf" if v > 0 else "-inf"
        short = f"{v:g}"  # 1e+10 rather than 10000000000.0, when it is the same float (1.0 stays 1.0)
        return short if "e" in short and float(short) == v else repr(v)
    return str(v)


# ---------------------------------------------------------------------------------------------
# public functions
# ---------------------------------------------------------------------------------------------
def translate(algo: Union[Algorithm, str], target: str, *, strict: bool = True, **budget: Any) -> Translation:
    """Translate ``algo`` into ``target``'s settings, with notes and every difference found.

    Args:
        algo: an :class:`~grpo_lab.algo.algorithms.Algorithm` or a preset's name.
        target: ``"trl"`` (TRL 1.16.0, ``GRPOConfig`` keyword arguments) or ``"verl"`` (verl 0.9.1,
            Hydra overrides of ``ppo_trainer.yaml``).
        strict: raise :class:`ExportError` unless the target computes ``algo`` exactly; ``False``: the nearest
            mapping, one :class:`ApproximateExportWarning` per difference (an impossible one still raises).
        **budget: the run's sizes, keys of :data:`BUDGET_KEYS`: only those given are exported, but ``lr_schedule``,
            ``warmup``, ``betas``, ``weight_decay`` and ``precision`` always are (the libraries' defaults differ;
            :mod:`grpo_lab.export.optimisation`); :func:`~grpo_lab.export.optimisation.budget_from_config` gives all.

    Returns:
        :class:`Translation` (``config`` is a dict for TRL, a list of ``key=value`` strings for verl).

    Raises:
        LibraryVersionWarning: (a warning, once per version) the installed target is not
            :data:`~grpo_lab.export.versions.TRL_VERSION` / :data:`~grpo_lab.export.versions.VERL_VERSION`.
        ExportError: (a ``ValueError``) with ``strict=True``, any difference (each listed, with its exact
            ``preset.replace(...)`` alternative if any); always, a choice with no counterpart (a registry function
            from outside grpo_lab, RLOO in TRL, the batch-std advantage in verl, ``routing_replay=True``, a mismatch
            correction with ``old_logp='behaviour'``, ...).
        ValueError: unknown ``target``; unknown or invalid budget keys or a budget that does not split; no
            ``max_new_tokens`` where the algorithm needs it (Dr.GRPO's constant, DAPO's L_max); an invalid ``algo``.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")
    if not isinstance(strict, bool):
        raise ValueError(f"strict must be True or False, got {strict!r}")
    algo = get_algorithm(algo)
    if not isinstance(algo, Algorithm):
        raise ValueError(f"algo must be a grpo_lab Algorithm or a preset name, got {type(algo).__name__}")
    b = _check_budget(budget)
    check_installed(target)
    config, notes, issues = (_trl if target == "trl" else _verl)(algo, b)
    if b.get("routing_replay"):
        issues.append(Issue("impossible", "routing_replay",
                            "GSPO's Routing Replay (TrainerConfig.routing_replay) is not exported: TRL 1.16 has none, "
                            "verl 0.9.1's actor.router_replay (modes R2/R3) belongs to its Megatron/VeOmni engines and "
                            "is not checked against grpo_lab; without it a MoE policy's ratios mix routing changes in"))
    label = _LABELS[target]
    call = f"to_{target}({algo.name})"
    impossible = [i for i in issues if i.kind == "impossible"]
    if impossible:
        raise ExportError(f"{call}: {label} cannot express {algo.name}:\n"
                          + "\n".join("  - " + i.text() for i in impossible))
    if issues and strict:
        fix = _fix_text(algo, issues)
        raise ExportError(f"{call} is not exact in {label}; the exported settings would differ in:\n"
                          + "\n".join("  - " + i.text() for i in issues)
                          + (f"\nExact alternative: {fix}." if fix else "")
                          + "\nPass strict=False to get this mapping with these differences as warnings.")
    for i in issues:
        warnings.warn(f"{call} ({label}): {i.text()}", ApproximateExportWarning, stacklevel=3)
    if target == "verl":
        config = [f"{k}={_hydra_value(v)}" for k, v in config.items()]
    return Translation(target, algo, config, tuple(notes), tuple(issues), b)


def to_trl(algo: Union[Algorithm, str], *, strict: bool = True, **budget: Any) -> dict:
    """Keyword arguments of ``trl.GRPOConfig`` (TRL 1.16.0) that train ``algo``.

    ``GRPOConfig(output_dir=..., **to_trl(DR_GRPO, group_size=8, max_new_tokens=1024))``. The
    translation, axis by axis (see :func:`mapping_table` and the module docstring): ``scale_rewards``
    (advantage; TRL's epsilon is a hard-coded 1e-4, so ``adv_eps`` must be 1e-4), ``loss_type`` from
    the clip object and the aggregation (``grpo`` = DeepSeekMath Eq. 3, ``dapo`` = token mean,
    ``dr_grpo`` = Dr.GRPO's constant ``max_completion_length``, ``cispo`` = MiniMax-M1 with
    ``epsilon_high = 1 + eps_high`` an absolute cap), ``epsilon`` / ``epsilon_high`` (clip-higher),
    ``importance_sampling_level`` (GSPO), ``beta`` with ``use_bias_correction_kl`` set explicitly
    (TRL's default True is DeepSeek-V3.2 Eq. 7, not DeepSeekMath Eq. 3-4),
    ``off_policy_mask_threshold`` (V3.2 Eqs. 8-9), ``mask_truncated_completions`` (DAPO Overlong
    Filtering), the sampler's ``top_p`` / ``top_k`` and the mismatch correction
    (``vllm_importance_sampling_*``, :mod:`grpo_lab.export.sampling`), and the sizes of ``budget``. Not a config
    field: DAPO's soft overlong punishment is a reward function, :func:`trl_reward_funcs`. TRL has no dynamic
    sampling, no sampler precision and no π_old taken from the sampler.

    Args:
        algo, strict, budget: as :func:`translate` (``budget`` as keyword arguments).

    Returns:
        dict of ``GRPOConfig`` keyword arguments (python values).

    Raises:
        ExportError, ValueError: as :func:`translate`.
    """
    return translate(algo, "trl", strict=strict, **budget).config


def to_verl(algo: Union[Algorithm, str], *, strict: bool = True, **budget: Any) -> list:
    """Hydra overrides of verl 0.9.1's PPO/GRPO trainer that train ``algo``.

    They go on verl's command line, ``["python", "-m", "verl.trainer.main_ppo",
    *to_verl(GRPO.replace(adv_eps=1e-6), group_size=8, max_new_tokens=1024), ...]`` (``...``: the
    model, data and rollout-engine settings). The axes map as :func:`mapping_table` lists them
    (``algorithm.adv_estimator``, ``policy_loss.loss_mode``, ``clip_ratio_*``, ``loss_agg_mode``,
    ``loss_scale_factor``, ``kl_loss_*``, ``algorithm.filter_groups``, the ``dapo`` reward manager's
    ``overlong_buffer_cfg``), the sampler (``rollout.dtype`` / ``top_p`` / ``top_k``), π_old and the mismatch
    correction (``algorithm.rollout_correction.*``, :mod:`grpo_lab.export.sampling`), plus the sizes of
    ``budget``. verl has no Overlong Filtering, no importance-corrected KL and no Off-Policy Sequence Masking.

    Args:
        algo, strict, budget: as :func:`translate` (``budget`` as keyword arguments).

    Returns:
        list of ``key=value`` strings in Hydra's override grammar (keys verl's config lacks are
        added with ``++``).

    Raises:
        ExportError, ValueError: as :func:`translate`.
    """
    return translate(algo, "verl", strict=strict, **budget).config


def trl_reward_funcs(algo: Union[Algorithm, str], *, max_new_tokens: int) -> list:
    """The reward functions TRL needs *in addition to* the task's for ``algo``'s reward shaping.

    DAPO's soft overlong punishment (arXiv 2503.14476, Eq. 13) is a reward function in TRL,
    ``trl.rewards.get_soft_overlong_punishment(L_max, L_cache)``, not a ``GRPOConfig`` field: pass
    ``reward_funcs=[task_reward, *trl_reward_funcs(DAPO, max_new_tokens=L_max)]`` with
    ``GRPOConfig(max_completion_length=L_max, multi_objective_aggregation="sum_then_normalize")``
    (what :func:`to_trl` sets) so that it is added to the task reward before the advantage, as in
    :func:`grpo_lab.algo.selection.shape`. ``L_cache`` is :func:`grpo_lab.algo.selection.overlong_cache_tokens`.

    Args:
        algo: an Algorithm or a preset name.
        max_new_tokens: the generation budget ``L_max`` (positive int).

    Returns:
        ``[]`` when ``algo`` has no soft overlong punishment, else a one-element list.

    Raises:
        ValueError: invalid ``max_new_tokens``, an ``L_cache`` that does not fit it.
        ImportError: trl is not installed.
    """
    algo = get_algorithm(algo)
    cache = _cache_tokens(algo, {"max_new_tokens": _v.positive_int("max_new_tokens", max_new_tokens)})
    if cache is None:
        return []
    from trl.rewards import get_soft_overlong_punishment

    return [get_soft_overlong_punishment(max_completion_len=max_new_tokens, soft_punish_cache=cache)]


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------
_T, _V = f"TRL {TRL_VERSION}", f"verl {VERL_VERSION}"
_A_ = "actor_rollout_ref.actor"
#: (axis, grpo_lab value, TRL, verl, note): the rows of :func:`mapping_table`
_ROWS = (
    ("advantage", "group (adv_eps)", "scale_rewards='group' (epsilon 1e-4, fixed)",
     "algorithm.adv_estimator=grpo, norm_adv_by_std_in_grpo=True (epsilon 1e-6, fixed)",
     "(r - mean_g) / (std_g + eps), unbiased std (DeepSeekMath §4.1.2); exact in TRL iff adv_eps = 1e-4, in verl iff "
     "adv_eps = 1e-6 (the presets use 1e-4); verl's grpo_vectorized gives an all-equal float64 group 0.0119, not 0"),
    ("advantage", "group_mean", "scale_rewards='none'", "algorithm.norm_adv_by_std_in_grpo=False",
     "r - mean_g (Dr.GRPO §3.2, DeepSeek-V3.2 Eq. 5); exact"),
    ("advantage", "batch", "scale_rewards='batch'", "-", "group mean, batch std; verl has no such estimator"),
    ("advantage", "gae (PPO, VAPO: gamma, lam, lam_alpha, critic_lam)", "- (GRPOTrainer has no critic)",
     "algorithm.adv_estimator=gae, gamma, lam; critic.* (optim.lr = value_lr, cliprange_value = value_clip_eps, "
     "token-mean loss), trainer.critic_warmup = value_warmup_steps",
     "TRL refuses (no critic in GRPOTrainer); verl is approximate: it whitens GAE advantages over the batch, its "
     "critic shares the policy's lam (no critic_lam), it has no length-adaptive lam (lam_alpha) and no "
     "positive-example NLL (nll_coef: refused)"),
    ("advantage", "rloo", "- (trl.RLOOTrainer is another trainer)", "algorithm.adv_estimator=rloo",
     "leave-one-out baseline, G/(G-1) (r - mean_g)"),
    ("ratio_level", "token", "importance_sampling_level='token'", f"{_A_}.policy_loss.loss_mode=vanilla (or cispo)",
     "r_t = pi_theta / pi_old (DeepSeekMath Eq. 3); both clamp nothing (TRL) / log r to +-20 (verl, as grpo_lab)"),
    ("ratio_level", "sequence, sequence_token", "importance_sampling_level='sequence'",
     f"{_A_}.policy_loss.loss_mode=gspo",
     "s_i = exp(mean_t log r_t) (GSPO Eq. 7); verl's gspo is GSPO-token (Eq. 14), equal to GSPO with one advantage per "
     "response (the case in both); verl clamps log s_i at 10"),
    ("surrogate", "ppo (eps_low, eps_high)", "epsilon=eps_low, epsilon_high=eps_high, delta=None",
     f"{_A_}.clip_ratio_low=eps_low, clip_ratio_high=eps_high, clip_ratio_c=1e10",
     "min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) (DAPO Eq. 10 clip-higher); verl's dual clip (clip_ratio_c=3 caps "
     "the loss of A<0 tokens at 3|A|) is in neither DeepSeekMath nor DAPO: 1e10 > e^20 turns it off exactly; TRL's "
     "delta (INTELLECT-2 two-sided clip) stays off"),
    ("surrogate", "cispo (CISPO)", "loss_type='cispo', epsilon_high=1 + eps_high (absolute cap; needs eps_low = 1)",
     f"{_A_}.policy_loss.loss_mode=cispo, clip_ratio_low=eps_low, clip_ratio_high=eps_high (relative)",
     "sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi (MiniMax-M1 Eqs. 4-5); TRL's epsilon_high is the cap itself "
     "(its docs recommend 5.0), verl's is relative like ours; both compute -w A log pi_theta, we -w A log r: same "
     "gradient, values differ by w A log pi_old; the token mask of Eq. 7 (mask_eps_*) is in neither"),
    ("surrogate", "gmpo (GMPO: eps_low, eps_high in log space)", "- (trl.experimental.gmpo is another trainer)",
     f"{_A_}.policy_loss.loss_mode=geo_mean, clip_ratio_low=eps_low, clip_ratio_high=eps_high",
     "A_i exp(mean_t of the sign-aware log-space clip of log r) (GMPO Eq. 4); verl ignores loss_agg_mode and averages "
     "over every row of a call (an empty row counts with loss 0)"),
    ("surrogate", "sapo (SAPO: tau_pos, tau_neg)", "loss_type='sapo', sapo_temperature_pos / _neg",
     f"{_A_}.policy_loss.loss_mode=sapo, {_A_}.tau_pos / tau_neg",
     "-4/tau sigmoid(tau (r - 1)) A (SAPO §3); both aggregate as seq_mean_token_mean whatever else is set"),
    ("surrogate", "kl_cov (KL-Cov: kl_cov_ratio, kl_cov_coef)", "-",
     f"{_A_}.policy_loss.loss_mode=kl_cov, policy_loss.kl_cov_ratio, policy_loss.ppo_kl_coef",
     "-r A + coef |log r| on the top-covariance tokens (arXiv 2505.22617); verl selects per micro-batch call, "
     "grpo_lab over the minibatch (equal with one call per minibatch)"),
    ("surrogate", "clip_cov (Clip-Cov: clip_cov_ratio, clip_cov_lb, clip_cov_ub)", "-",
     f"{_A_}.policy_loss.loss_mode=clip_cov, clip_ratio_low / _high, policy_loss.clip_cov_ratio / _lb / _ub",
     "PPO clip with a random draw of covariance-band tokens detached (same paper); per-call selection as kl_cov; the draw "
     "uses torch's global generator in both"),
    ("aggregation", "seq_mean_token_mean", "loss_type='grpo'", f"{_A_}.loss_agg_mode=seq-mean-token-mean",
     "1/G sum_i 1/|o_i| sum_t (DeepSeekMath Eq. 3); both count fully masked rows in G (grpo_lab does not); verl divides "
     "by |o_i| + 1e-8, which its bool mask makes a float32 sum equal to |o_i|"),
    ("aggregation", "token_mean", "loss_type='dapo'", f"{_A_}.loss_agg_mode=token-mean",
     "sum over the batch's tokens / their count; TRL divides by the generation batch's count / minibatches (exact only "
     "with one minibatch per rollout), verl by each minibatch's own count (exact)"),
    ("aggregation", "seq_mean_token_sum_norm (max_tokens)", "loss_type='dr_grpo' (constant = max_completion_length)",
     f"{_A_}.loss_agg_mode=seq-mean-token-sum-norm, loss_scale_factor=max_tokens",
     "1/G sum_i sum_t / MAX_TOKENS (Dr.GRPO §3.2); TRL divides by B * max_completion_length counting masked rows; "
     "verl divides by the padded width unless loss_scale_factor is set"),
    ("aggregation", "group_token_mean", "-", "-",
     "DAPO Eq. 12 / MiniMax-M1 Eq. 4 as written (per-group token mean, then mean over groups); nearest: token_mean, "
     "which weighs groups by their share of the tokens"),
    ("kl", "None or beta = 0", "beta=0.0", f"{_A_}.use_kl_loss=False, algorithm.use_kl_in_reward=False", "no KL term"),
    ("kl", "k3 (beta)", "beta=beta, use_bias_correction_kl=False",
     f"{_A_}.use_kl_loss=True, kl_loss_type=low_var_kl, kl_loss_coef=beta",
     "k3 inside the token sum (DeepSeekMath Eqs. 3-4); TRL's default use_bias_correction_kl=True is V3.2 Eq. 7; verl "
     "clamps k3 at 10"),
    ("kl", "k1, k2", "-", f"{_A_}.kl_loss_type=k1 / k2", "TRL has k3 only; verl's k2 ('mse') is D^2 / 2 as ours"),
    ("kl_importance_correction", "True (DeepSeek-V3.2 Eq. 7)", "use_bias_correction_kl=True", "-",
     "k3 times pi_theta / pi_old; TRL multiplies by the sequence ratio with importance_sampling_level='sequence'"),
    ("offpolicy_mask_delta", "delta (DeepSeek-V3.2 Eqs. 8-9)", "off_policy_mask_threshold=delta", "-",
     "drop the policy term of A<0 sequences with mean log(pi_old/pi_theta) > delta; TRL measures against the vLLM "
     "sampler's log-probs when it uses vLLM; verl's rollout rejection sampling is another rule"),
    ("dynamic_sampling", "True (DAPO Eq. 11)", "-", "algorithm.filter_groups.enable=True, metric=acc",
     "train only groups of mixed accuracy; verl refills prompt by prompt, grpo_lab in rounds; 'acc' is the raw "
     "correctness score, as grpo_lab's filter"),
    ("overlong_filter", "True (DAPO §3.4)", "mask_truncated_completions=True", "-",
     "truncated responses leave the loss; TRL's sequence means count their empty rows"),
    ("overlong_cache_frac / overlong_cache_len", "L_cache (DAPO Eq. 13)",
     "reward_funcs += trl.rewards.get_soft_overlong_punishment(L_max, L_cache) (grpo_lab.export.trl_reward_funcs)",
     "reward.reward_manager.name=dapo, ++reward.reward_kwargs.{max_resp_len=L_max, overlong_buffer_cfg.{enable=True, "
     "len=L_cache, penalty_factor=1.0}}",
     "penalty min(((L_max - L_cache) - |y|) / L_cache, 0) added to the task reward; exact in both"),
    ("mismatch", "None", "vllm_importance_sampling_correction=False",
     "algorithm.rollout_correction.rollout_is=null", "TRL's default True reweights by the vLLM sampler's ratio"),
    ("mismatch", "token_truncate / token_mask / sequence_truncate / sequence_mask (TIS / MIS), is_cap = C",
     "use_vllm=True, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode = the same name, "
     "vllm_importance_sampling_clip_max = C, clip_min=None",
     "algorithm.rollout_correction.rollout_is = token / sequence, rollout_is_threshold = C (truncate) or "
     "'1e-9_C' (mask, IcePop), bypass_mode=False; rollout.calculate_log_probs=True",
     "w = pi_old / pi_sampler per token or its product over the response; min(w, C) or w 1[w <= C], times each "
     "token's loss; verl clamps log w to +-20, geo_mean geo-averages w (approximate); needs old_logp='recompute'"),
    ("keep_sampling_mask", "True (DeepSeek-V3.2 §3.1)", "-", "-",
     "lost in both when top_p < 1 or top_k > 0 (neither restricts pi_theta, pi_old to the kept set); a no-op else"),
    ("budget", "old_logp (recompute, behaviour)", "- (always the trained model's: recomputed, or sg(pi_theta))",
     "algorithm.rollout_correction.bypass_mode = False / True (loss_type=ppo_clip)",
     "'behaviour' with a low-precision or truncated sampler: approximate in TRL; in verl exact with the PPO clip on "
     "token ratios only (bypass mode replaces loss_mode)"),
    ("budget", "rollout_dtype (float32, bfloat16, float16)", "- (no sampler precision in GRPOConfig)",
     "actor_rollout_ref.rollout.dtype (always written; verl's default bfloat16)",
     "approximate in TRL unless float32 without vLLM (the trained model samples)"),
    ("budget", "top_p, top_k (0: off)", "top_p, top_k (0: off)",
     "actor_rollout_ref.rollout.top_p, top_k (-1: off)", "always written; both libraries' vLLM log-probs are "
     "processed_logprobs (after truncation)"),
    ("budget", "group_size", "num_generations", "actor_rollout_ref.rollout.n", "G"),
    ("budget", "max_new_tokens", "max_completion_length", "data.max_response_length", "L_max"),
    ("budget", "prompts_per_step", "per_device_train_batch_size x processes x steps_per_generation = prompts x G rows",
     "data.train_batch_size (prompts)", "verl counts prompts, TRL rows"),
    ("budget", "minibatches", "steps_per_generation = minibatches x gradient_accumulation_steps",
     f"{_A_}.ppo_mini_batch_size = prompts_per_step / minibatches (prompts)", "optimiser steps per pass"),
    ("budget", "epochs", "num_iterations", f"{_A_}.ppo_epochs", "mu"),
    ("budget", "micro_batch_size", "per_device_train_batch_size", f"{_A_}.ppo_micro_batch_size_per_gpu",
     "rows per forward/backward on one device"),
    ("budget", "lr, weight_decay, betas, grad_clip, warmup",
     "learning_rate, weight_decay, adam_beta1/adam_beta2, max_grad_norm, warmup_steps",
     f"{_A_}.optim.lr, optim.weight_decay, optim.betas, optim.clip_grad, optim.lr_warmup_steps (+ "
     "lr_warmup_steps_ratio=0)",
     "AdamW; betas, weight_decay and warm-up always written (TRL's beta2 0.999, verl's 0.999 and weight decay 0.01); "
     "grpo_lab and TRL do not decay biases and norm weights, verl decays every parameter (approximate when "
     "weight_decay > 0); verl counts the warm-up in RL steps"),
    ("budget", "lr_schedule (constant, linear, cosine), lr_schedule_steps",
     "lr_scheduler_type (constant_with_warmup, linear, cosine), max_steps = lr_schedule_steps x epochs x minibatches",
     f"{_A_}.optim.lr_scheduler_type (constant, cosine; no linear), min_lr_ratio=0, num_cycles=0.5, "
     "zero_indexed_step=True, trainer.total_training_steps = lr_schedule_steps",
     "update k gets lr * f(k) (transformers' scheduler, num_training_steps = H updates): exact in TRL; verl steps its "
     "scheduler once per RL step (exact with epochs x minibatches = 1) and has no linear decay. Always written: TRL's "
     "default 'linear' decays to 0"),
    ("budget", "precision (float32, bfloat16, float16)", "bf16, fp16 (always written: bf16 defaults to True)",
     f"{_A_}.fsdp_config.model_dtype=fp32, ++fsdp_config.mixed_precision.param_dtype (fp32, bf16, fp16), "
     "actor and ref",
     "autocast with float32 master weights; approximate when the clip range is finer than the dtype's resolution "
     "near 1 (finfo.eps / 2: 2^-8 for bfloat16), e.g. GSPO's 3e-4 / 4e-4"),
    ("budget", "temperature", "temperature", "actor_rollout_ref.rollout.temperature", "sampling temperature"),
    ("budget", "nnodes, n_gpus_per_node", "(processes launched by accelerate)", "trainer.nnodes, trainer.n_gpus_per_node",
     "devices"),
    ("routing_replay", "True (GSPO §5.3)", "-", "- (not mapped)", "raises for both targets"),
)


def mapping_table():
    """The translation table: one row per grpo_lab axis value, its TRL and verl settings, and a note.

    Returns:
        ``pandas.DataFrame`` with columns ``axis``, ``grpo_lab``, ``TRL 1.16.0``, ``verl 0.9.1``,
        ``note`` (``"-"``: the target has no counterpart). A book appendix renders it as is.
    """
    import pandas as pd

    return pd.DataFrame(list(_ROWS), columns=["axis", "grpo_lab", _T, _V, "note"])


def support_table(algorithms: Optional[dict] = None, **budget: Any):
    """Each algorithm x target: ``"exact"``, or what the strict export raises about, with the exact
    alternative (:attr:`Translation.computes`).

    Args:
        algorithms: ``{name: Algorithm}``; default :data:`grpo_lab.algo.algorithms.PRESETS`.
        budget: keyword arguments as :func:`translate` (``max_new_tokens`` is needed by Dr.GRPO and DAPO's shaping;
            default 1024).

    Returns:
        ``pandas.DataFrame`` with columns ``algorithm``, ``target``, ``exact`` (bool), ``issues``
        (``"; "``-joined) and ``exact_alternative`` (the ``replace`` arguments, or ``""``).

    Raises:
        ValueError: as :func:`translate` for the budget.
    """
    import pandas as pd

    budget = {"max_new_tokens": 1024, **budget}
    rows = []
    for name, algo in (algorithms if algorithms is not None else PRESETS).items():
        for target in TARGETS:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ApproximateExportWarning)
                    tr = translate(algo, target, strict=False, **budget)
            except ExportError as exc:
                rows.append({"algorithm": name, "target": target, "exact": False, "issues": str(exc),
                             "exact_alternative": ""})
                continue
            alt = tr.computes
            changes = {} if alt is None else {f: getattr(alt, f) for f in _FIELD_ORDER
                                               if getattr(alt, f) != getattr(algo, f)}
            rows.append({"algorithm": name, "target": target, "exact": tr.exact,
                         "issues": "; ".join(i.text() for i in tr.issues),
                         "exact_alternative": ", ".join(f"{k}={v!r}" for k, v in changes.items())})
    return pd.DataFrame(rows, columns=["algorithm", "target", "exact", "issues", "exact_alternative"])
