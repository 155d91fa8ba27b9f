"""Read a TRL 1.16.0 ``GRPOConfig`` back as a grpo_lab Algorithm (the TRL half of :mod:`grpo_lab.export.lint`).

The choices invert the export's own tables (``grpo_lab.export.translation._TRL_PPO_LOSS_TYPES``,
``_TRL_IS_LEVELS``, ``_TRL_KL``); what the tables cannot say (the other ``loss_type`` values, TRL's
absolute CISPO cap, the entropy terms, the vLLM correction) is read here, and
:func:`grpo_lab.export.lint_base.verify` checks the reading against the export.
"""

from __future__ import annotations

from typing import Any

from . import sampling as _smp
from . import translation as _tr
from .lint_base import Draft, Values, inverse, verify

__all__ = ["read_trl", "verify_trl", "TRL_LOSS_TYPES"]

#: every ``loss_type`` of TRL 1.16.0
TRL_LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")
#: TRL's ``scale_rewards`` -> the grpo_lab advantage (True / False are TRL's aliases of group / none)
_SCALE = {"group": "group", "batch": "batch", "none": "group_mean", True: "group", False: "group_mean"}
#: the paper each ``loss_type`` names (preset key)
_NAMED = {"grpo": "GRPO", "dapo": "DAPO", "dr_grpo": "DR_GRPO", "cispo": "CISPO", "sapo": "SAPO"}


def _advantage(v: Values, d: Draft) -> None:
    scale = v.get("scale_rewards")
    if isinstance(scale, str):
        scale = v.text("scale_rewards", ("group", "batch", "none"))
    elif not isinstance(scale, bool):
        raise ValueError(f"trl config: scale_rewards must be 'group', 'batch', 'none', true or false, got {scale!r}")
    d.fields["advantage"] = _SCALE[scale]
    if d.fields["advantage"] != "group_mean":
        d.fields["adv_eps"] = _tr.TRL_ADV_EPS
    d.explained.add("scale_rewards")


def _ppo_family(v: Values, d: Draft, loss_type: str) -> None:
    """``grpo`` / ``dapo`` / ``dr_grpo`` (the export's table) and ``bnpo`` (TRL's local token mean)."""
    eps = v.number("epsilon")
    high = v.number("epsilon_high", none=True)
    agg = inverse(_tr._TRL_PPO_LOSS_TYPES).get("dapo" if loss_type == "bnpo" else loss_type)
    d.fields.update(surrogate="ppo", eps_low=min(eps, 1.0), eps_high=eps if high is None else high, aggregation=agg)
    if eps > 1:
        d.notes.append(f"epsilon = {eps:g} puts the clip floor 1 - epsilon below 0, where it never binds: "
                       "read as eps_low = 1")
    if loss_type == "dr_grpo":
        d.fields["max_tokens"] = v.integer("max_completion_length")
    if loss_type == "bnpo":
        d.inexact.append("loss_type='bnpo' divides by the token count of each device's micro-batch, not of the "
                         "whole minibatch: token_mean only with one micro-batch per optimiser step on one device")
        d.explained.add("loss_type")


def _cispo(v: Values, d: Draft) -> None:
    high = v.number("epsilon_high", none=True)
    cap = v.number("epsilon") if high is None else high
    d.fields.update(surrogate="cispo", eps_low=1.0, eps_high=max(cap - 1.0, 0.0), aggregation="token_mean")
    d.notes.append(f"CISPO: TRL's epsilon_high = {cap:g} is an absolute cap on the weight, min(r, {cap:g}), "
                   f"without floor: eps_high = {cap - 1:g}, eps_low = 1 in grpo_lab's relative form (epsilon is "
                   "not read); TRL's value is -sg(w) A log pi, grpo_lab's -sg(w) A log r (the same gradient)")
    d.explained.update({"epsilon", "epsilon_high"})
    if cap < 1:
        d.inexact.append(f"CISPO cap epsilon_high = {cap:g} < 1 caps every weight below 1 (grpo_lab's cap 1 + "
                         "eps_high is at least 1)")


def _surrogate(v: Values, d: Draft) -> None:
    loss_type = v.text("loss_type", TRL_LOSS_TYPES)
    level = v.text("importance_sampling_level", tuple(inverse(_tr._TRL_IS_LEVELS)))
    d.fields["ratio_level"] = inverse(_tr._TRL_IS_LEVELS)[level]
    if loss_type in ("grpo", "dapo", "dr_grpo", "bnpo"):
        _ppo_family(v, d, loss_type)
    elif loss_type == "cispo":
        _cispo(v, d)
    elif loss_type == "sapo":
        d.fields.update(surrogate="sapo", aggregation="seq_mean_token_mean", tau_pos=v.number("sapo_temperature_pos"),
                        tau_neg=v.number("sapo_temperature_neg"))
    else:  # luspo, vespo: sequence-level losses no grpo_lab surrogate computes
        d.fields.update(surrogate="ppo", eps_low=min(v.number("epsilon"), 1.0), aggregation="seq_mean_token_mean")
        what = ("LUSPO: each sequence's loss scaled by its length" if loss_type == "luspo"
                else "VESPO: a Gamma-shaped weight of the sequence ratio")
        d.inexact.append(f"loss_type={loss_type!r} ({what}) has no grpo_lab counterpart; read as the nearest, "
                         "a PPO clip with a per-sequence token mean")
        d.explained.add("loss_type")
    if loss_type in ("cispo", "sapo") and level != "token":
        d.inexact.append(f"loss_type={loss_type!r} with importance_sampling_level={level!r} is not mapped "
                         "(grpo_lab's surrogate is token-level)")
    named = "GSPO" if level == "sequence" else _NAMED.get(loss_type)
    how = "importance_sampling_level='sequence'" if level == "sequence" else f"loss_type={loss_type!r}"
    d.named = (named, how) if named else None


def _kl(v: Values, d: Draft) -> None:
    beta = v.number("beta")
    if beta < 0:
        raise ValueError(f"trl config: beta must be >= 0, got {beta!r}")
    corrected = v.flag("use_bias_correction_kl")
    if beta > 0:
        d.fields.update(kl=inverse(_tr._TRL_KL)["k3"], beta=beta, kl_importance_correction=corrected)
        if corrected:
            d.notes.append("use_bias_correction_kl=True (TRL's default): the KL is DeepSeek-V3.2's importance-"
                           "corrected k3 (Eq. 7), not DeepSeekMath's (Eqs. 3-4)")
    else:
        d.fields.update(kl=None, beta=0.0)
        if corrected:
            d.notes.append("beta = 0: no KL term, so use_bias_correction_kl=True (TRL's default; DeepSeek-V3.2 Eq. 7) "
                           "has no effect; with beta > 0 it would make the KL V3.2's, not DeepSeekMath's")


def _extras(v: Values, d: Draft) -> None:
    """Off-policy masking, Overlong Filtering, and what no Algorithm field expresses."""
    d.fields["offpolicy_mask_delta"] = v.number("off_policy_mask_threshold", none=True)
    d.fields["overlong_filter"] = v.flag("mask_truncated_completions")
    delta = v.number("delta", none=True)
    if delta is not None:
        d.inexact.append(f"two-sided clip delta = {delta:g} (INTELLECT-2: the ratio of A < 0 tokens also capped at "
                         "delta), which no grpo_lab surrogate has")
        d.explained.add("delta")
    q = v.number("top_entropy_quantile")
    if q < 1:
        d.inexact.append(f"top_entropy_quantile = {q:g}: only the {q:g} highest-entropy tokens train (Beyond the "
                         "80/20 Rule, arXiv 2506.01939); grpo_lab trains every token")
    coef, adaptive = v.number("entropy_coef"), v.flag("use_adaptive_entropy")
    if coef != 0 or adaptive:
        d.inexact.append(f"entropy bonus entropy_coef = {coef:g}" + (" (adaptive, Skywork-OR1)" if adaptive else "")
                         + ": grpo_lab's loss has no entropy term")
    d.explained.update({"top_entropy_quantile", "entropy_coef"})
    _mismatch(v, d)
    if v.flag("sync_ref_model") and d.fields.get("beta", 0) > 0:
        d.inexact.append("sync_ref_model=True moves the KL reference towards the policy (TR-DPO); grpo_lab's "
                         "reference is fixed")


def _mismatch(v: Values, d: Draft) -> None:
    """TRL's vLLM importance-sampling correction (it acts with ``use_vllm=True`` only) as ``Algorithm.mismatch``."""
    d.explained.update({"use_vllm", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
                        "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min"})
    if not (v.flag("use_vllm") and v.flag("vllm_importance_sampling_correction")):
        return
    mode = v.text("vllm_importance_sampling_mode", _smp.MISMATCH_MODES)
    cap, low = v.number("vllm_importance_sampling_clip_max", none=True), v.number("vllm_importance_sampling_clip_min",
                                                                                  none=True)
    if v.get("vllm_importance_sampling_cap") is not None:  # deprecated: GRPOConfig.__post_init__ moves it to clip_max
        cap = v.number("vllm_importance_sampling_cap")
    if low is not None and low > 0:
        d.inexact.append(f"vllm_importance_sampling_clip_min = {low:g}: the weight is also "
                         f"{'raised to' if mode.endswith('truncate') else 'zeroed below'} C_min; grpo_lab's mismatch "
                         "correction has an upper bound only")
    if cap is None:
        d.inexact.append(f"vllm_importance_sampling_mode = {mode!r} without clip_max: no upper bound, which grpo_lab's "
                         "mismatch correction always has (is_cap)")
        return
    _smp.read_mismatch(mode, cap, d.fields, d.inexact)


def _notes(v: Values, d: Draft) -> None:
    d.notes.append(f"sizes: num_generations (G) = {v.get('num_generations')}, max_completion_length = "
                   f"{v.get('max_completion_length')}, num_iterations = {v.get('num_iterations')}, "
                   f"per_device_train_batch_size = {v.get('per_device_train_batch_size')}, "
                   f"gradient_accumulation_steps = {v.get('gradient_accumulation_steps')}, steps_per_generation = "
                   f"{v.get('steps_per_generation')}")
    d.notes.append(f"optimiser: AdamW lr = {v.number('learning_rate'):g}, betas = ({v.get('adam_beta1')}, "
                   f"{v.get('adam_beta2')}), weight_decay = {v.get('weight_decay')}, max_grad_norm = "
                   f"{v.get('max_grad_norm')}, lr_scheduler_type = {v.get('lr_scheduler_type')!r}, warmup_steps = "
                   f"{v.get('warmup_steps')}" + (" (linear decays the rate to 0 by the last step)"
                                                 if v.get("lr_scheduler_type") == "linear" else ""))
    bf16 = v.get("bf16") if v.get("bf16") is not None else not v.get("fp16")
    d.notes.append(f"precision: bf16 = {bf16}" + (" (TRL's default)" if v.get("bf16") is None else "")
                   + ("; a clip range below ~4e-3 is finer than bfloat16 resolves a log-probability"
                      if bf16 and min(d.fields.get("eps_low", 1), d.fields.get("eps_high", 1)) < 4e-3 else ""))
    d.notes.append(f"sampling: temperature = {v.get('temperature')}, top_p = {v.get('top_p')}, top_k = "
                   f"{v.get('top_k')}; TRL has no dynamic sampling (DAPO Eq. 11); a soft overlong punishment is a "
                   "reward function (trl.rewards.get_soft_overlong_punishment), not a GRPOConfig field, so the "
                   "config cannot show it")
    if v.get("multi_objective_aggregation") != "sum_then_normalize":
        d.notes.append(f"multi_objective_aggregation = {v.get('multi_objective_aggregation')!r}: with several "
                       "reward functions each is normalised before the sum (GDPO)")


def _moot(v: Values):
    def moot(key: str) -> bool:
        if key == "use_bias_correction_kl":
            return not v.get("beta")
        if key == "epsilon":
            return v.get("loss_type") in ("cispo", "sapo")
        return key == "multi_objective_aggregation"  # matters only with several reward functions (a note)
    return moot


def _describe(key: str, value: Any) -> str:
    return f"{key} = {value!r}, which the export of the reading does not write (the library computes otherwise)"


def read_trl(values: dict) -> tuple:
    """``(Draft, budget, normalised config)`` of a TRL config (``values``: its fields, defaults filled in).

    Raises:
        ValueError: a value of the wrong type or an unknown choice (naming the field).
    """
    v = Values("trl", values)
    d = Draft("trl")
    _advantage(v, d)
    _surrogate(v, d)
    _kl(v, d)
    _extras(v, d)
    _notes(v, d)
    budget = {"max_new_tokens": v.integer("max_completion_length"), "precision": _precision(values),
              "top_p": v.number("top_p"), "top_k": v.integer("top_k", none=True) or 0}
    if (v.integer("num_generations", none=True) or 0) >= 2:
        budget["group_size"] = v.integer("num_generations")
    norm = dict(values)
    if norm.get("epsilon_high") is None:
        norm["epsilon_high"] = norm.get("epsilon")
    return d, budget, norm


def _precision(values: dict) -> str:
    """The autocast precision of a TRL config as grpo_lab names it: ``fp16=True`` is float16; ``bf16`` True or
    None (TRL 1.16's default: True unless ``fp16``) is bfloat16; else float32."""
    if values.get("fp16"):
        return "float16"
    return "bfloat16" if values.get("bf16") in (None, True) else "float32"


def verify_trl(algo, d: Draft, budget: dict, norm: dict) -> None:
    """:func:`grpo_lab.export.lint_base.verify` for TRL."""
    verify(algo, d, norm, budget, _moot(Values("trl", norm)), _describe)

