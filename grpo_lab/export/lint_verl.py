"""Read a verl 0.9.1 trainer config back as a grpo_lab Algorithm (the verl half of :mod:`grpo_lab.export.lint`).

The choices invert the export's own tables (``grpo_lab.export.translation._VERL_PPO_LOSS_MODES``,
``_VERL_AGG_MODES``, ``_VERL_KL_TYPES``); what the tables cannot say (the dual clip, the other
estimators and loss modes, verl's aliases of the KL names, the width normaliser of
``seq-mean-token-sum-norm`` without ``loss_scale_factor``) is read here, and
:func:`grpo_lab.export.lint_base.verify` checks the reading against the export.
"""

from __future__ import annotations

import math
from typing import Any

from . import sampling as _smp
from . import translation as _tr
from .lint_base import Draft, Values, inverse, verify

__all__ = ["read_verl", "verify_verl", "VERL_LOSS_MODES", "VERL_ADV_ESTIMATORS"]

_A = "actor_rollout_ref.actor."
#: every ``policy_loss.loss_mode`` of verl 0.9.1
VERL_LOSS_MODES = ("vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro",
                   "cispo", "bypass_mode")
#: every ``algorithm.adv_estimator`` of verl 0.9.1
VERL_ADV_ESTIMATORS = ("gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo", "opo",
                       "grpo_passk", "gpg", "rloo_vectorized", "grpo_vectorized", "optimal_token_baseline",
                       "tir_optimal_token_baseline", "gdpo")
#: loss_mode -> grpo_lab surrogate (``vanilla`` / ``gspo``: the PPO clip, through ``_VERL_PPO_LOSS_MODES``)
_SURROGATES = {"vanilla": "ppo", "gspo": "ppo", "cispo": "cispo", "geo_mean": "gmpo", "sapo": "sapo",
              "kl_cov": "kl_cov", "clip_cov": "clip_cov"}
#: verl's other spellings of the KL estimators (``kl_penalty_forward``)
_KL_ALIASES = {"kl": "k1", "mse": "k2", "k3": "low_var_kl"}
#: the paper each loss_mode names (preset key)
_NAMED = {"gspo": "GSPO", "cispo": "CISPO", "geo_mean": "GMPO", "sapo": "SAPO", "kl_cov": "KL_COV",
          "clip_cov": "CLIP_COV"}


def _advantage(v: Values, d: Draft) -> None:
    est = v.text("algorithm.adv_estimator", VERL_ADV_ESTIMATORS)
    std = v.flag("algorithm.norm_adv_by_std_in_grpo")
    if est == "grpo":
        d.fields["advantage"] = "group" if std else "group_mean"
        if std:
            d.fields["adv_eps"] = _tr.VERL_ADV_EPS
    elif est == "rloo":
        d.fields["advantage"] = "rloo"
    elif est == "gae":
        d.fields.update(advantage="gae", gamma=v.number("algorithm.gamma"), lam=v.number("algorithm.lam"))
        # the critic: _critic; verl's batch whitening of the advantages: the export's own issue (verify_verl)
    else:
        d.fields.update(advantage="group", adv_eps=_tr.VERL_ADV_EPS)
        why = ("computes the group mean in float32 (an all-equal float64 group does not get 0)"
               if est == "grpo_vectorized" else "has no grpo_lab counterpart")
        d.inexact.append(f"adv_estimator={est!r} {why}; read as the nearest, the group z-score")
    d.explained.update({"algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo"})
    if v.flag("algorithm.use_kl_in_reward"):
        d.inexact.append(f"use_kl_in_reward=True: a KL penalty ({v.get('algorithm.kl_penalty')}, coefficient "
                         f"{v.get('algorithm.kl_ctrl.kl_coef')}) is subtracted from the reward, not added to the loss")
    # rollout_correction.rollout_is is read as Algorithm.mismatch (_correction)
    d.explained.update({"algorithm.use_kl_in_reward", "algorithm.rollout_correction.rollout_is"})


def _clip_range(v: Values, d: Draft, floor: bool = True) -> None:
    base = v.number(_A + "clip_ratio")
    low = v.number(_A + "clip_ratio_low", none=True)
    high = v.number(_A + "clip_ratio_high", none=True)
    low, high = base if low is None else low, base if high is None else high
    if floor and low > 1:
        d.notes.append(f"clip_ratio_low = {low:g} puts the floor 1 - {low:g} below 0, where a ratio never is: "
                       "read as eps_low = 1 (no floor)")
        d.explained.add(_A + "clip_ratio_low")
    d.fields.update(eps_low=min(low, 1.0) if floor else low, eps_high=high)


def _surrogate(v: Values, d: Draft) -> None:
    mode = v.text(_A + "policy_loss.loss_mode", VERL_LOSS_MODES)
    d.fields["surrogate"] = _SURROGATES.get(mode, "ppo")
    d.fields["ratio_level"] = inverse(_tr._VERL_PPO_LOSS_MODES).get(mode, "token")
    _clip_range(v, d, floor=mode != "geo_mean")
    if mode == "vanilla":
        c = v.number(_A + "clip_ratio_c")
        if c < _tr.VERL_DUAL_CLIP_OFF / 1e2:  # e^20 ~ 4.9e8: above it the dual clip never acts
            d.inexact.append(f"dual clip c = {c:g}: the loss of an A < 0 token is capped at {c:g}|A| (Dual-clip PPO, "
                             "arXiv 1912.09729; verl's default 3), in no grpo_lab surrogate")
        d.explained.add(_A + "clip_ratio_c")
    elif mode == "sapo":
        d.fields.update(tau_pos=v.number(_A + "tau_pos"), tau_neg=v.number(_A + "tau_neg"))
    elif mode == "kl_cov":
        d.fields.update(kl_cov_ratio=v.number(_A + "policy_loss.kl_cov_ratio"),
                        kl_cov_coef=v.number(_A + "policy_loss.ppo_kl_coef"))
    elif mode == "clip_cov":
        d.fields.update({k: v.number(_A + "policy_loss." + k) for k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub")})
    elif mode not in _SURROGATES:
        d.inexact.append(f"policy_loss.loss_mode={mode!r} has no grpo_lab counterpart; read as the nearest, the PPO "
                         "clip")
        d.explained.add(_A + "policy_loss.loss_mode")
    d.named = (_NAMED[mode], f"policy_loss.loss_mode={mode}") if mode in _NAMED else None


def _aggregation(v: Values, d: Draft) -> None:
    modes = inverse(_tr._VERL_AGG_MODES)
    mode = v.text(_A + "loss_agg_mode", tuple(modes) + ("seq-mean-token-sum", "token-sum"))
    if d.fields["surrogate"] in ("sapo", "gmpo"):  # verl's sapo and geo_mean aggregate their own way
        d.fields["aggregation"] = "seq_mean_token_mean"
        d.explained.add(_A + "loss_agg_mode")
        return
    d.fields["aggregation"] = modes.get(mode, "seq_mean_token_sum_norm" if mode == "seq-mean-token-sum"
                                        else "token_mean")
    if mode not in modes:
        d.inexact.append(f"loss_agg_mode={mode!r} sums tokens without a normaliser; read as the nearest")
        d.explained.add(_A + "loss_agg_mode")
    if d.fields["aggregation"] == "seq_mean_token_sum_norm":
        factor = v.integer(_A + "loss_scale_factor", none=True)
        d.fields["max_tokens"] = factor if factor is not None else v.integer("data.max_response_length")
        if factor is None and mode == "seq-mean-token-sum-norm":
            d.inexact.append("seq-mean-token-sum-norm without loss_scale_factor divides by each micro-batch's padded "
                             "width, not by a constant (Dr.GRPO's MAX_TOKENS); read as max_tokens = "
                             "data.max_response_length")
            d.explained.add(_A + "loss_scale_factor")
        if d.named is None and d.fields.get("advantage") == "group_mean":
            d.named = ("DR_GRPO", "loss_agg_mode=seq-mean-token-sum-norm, norm_adv_by_std_in_grpo=False")


def _kl(v: Values, d: Draft) -> None:
    coef = v.number(_A + "kl_loss_coef")
    if not v.flag(_A + "use_kl_loss") or coef == 0:
        d.fields.update(kl=None, beta=0.0)
        d.notes.append(f"no KL loss (use_kl_loss = {v.get(_A + 'use_kl_loss')}, kl_loss_coef = {coef:g}); switched on, "
                       f"kl_loss_type = {v.get(_A + 'kl_loss_type')!r} would be "
                       + ("k3 clamped to [-10, 10]" if v.get(_A + "kl_loss_type") in ("low_var_kl", "k3")
                          else "verl's " + repr(v.get(_A + "kl_loss_type"))))
        return
    name = v.text(_A + "kl_loss_type")
    base = _KL_ALIASES.get(name.rstrip("+"), name.rstrip("+"))
    kl = inverse(_tr._VERL_KL_TYPES).get(base)
    if kl is None:
        d.inexact.append(f"kl_loss_type={name!r} has no grpo_lab counterpart; read as the nearest, k3")
    elif name.endswith("+") and base != "k2":
        d.inexact.append(f"kl_loss_type={name!r}: the value of {kl} with k2's gradient (straight-through), which "
                         "no grpo_lab estimator computes")
    d.fields.update(kl=kl or "k3", beta=coef)
    d.explained.add(_A + "kl_loss_type")


def _sampling(v: Values, d: Draft) -> None:
    """DAPO's dynamic sampling and the ``dapo`` reward manager's soft overlong punishment."""
    d.fields["dynamic_sampling"] = v.flag("algorithm.filter_groups.enable")
    if d.fields["dynamic_sampling"] and v.get("algorithm.filter_groups.metric") != "acc":
        d.inexact.append(f"filter_groups.metric={v.get('algorithm.filter_groups.metric')!r}: groups are filtered on "
                         "that metric, grpo_lab (DAPO Eq. 11) on the accuracy ('acc')")
        d.explained.add("algorithm.filter_groups.metric")
    if d.fields["dynamic_sampling"] and d.named is None:
        d.named = ("DAPO", "algorithm.filter_groups.enable=True")
    kw = "reward.reward_kwargs."
    manager = v.get("reward.reward_manager.name")
    if manager == "dapo" and v.get(kw + "overlong_buffer_cfg.enable"):
        d.fields["overlong_cache_len"] = int(v.number(kw + "overlong_buffer_cfg.len"))
        factor = v.number(kw + "overlong_buffer_cfg.penalty_factor")
        if factor != 1.0:
            d.inexact.append(f"overlong_buffer_cfg.penalty_factor = {factor:g}: the penalty of DAPO Eq. 13 scaled, "
                             "grpo_lab's is not")
        resp = v.get(kw + "max_resp_len")
        if resp is not None and resp != v.get("data.max_response_length"):
            d.inexact.append(f"reward_kwargs.max_resp_len = {resp} is not data.max_response_length = "
                             f"{v.get('data.max_response_length')}: the penalty ramps towards another L_max")
    d.explained.update(k for k in v.values if k.startswith(kw) or k == "reward.reward_manager.name")
    d.fields["overlong_filter"] = False  # verl 0.9.1 has no Overlong Filtering


#: verl's rollout ``dtype`` names -> grpo_lab's ``rollout_dtype``
_ROLLOUT_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
                   "half": "float16", "float32": "float32", "fp32": "float32", "float": "float32"}
_R, _C = "actor_rollout_ref.rollout.", "algorithm.rollout_correction."


def _correction(v: Values, d: Draft) -> None:
    """``rollout_correction.rollout_is`` (decoupled mode) as ``Algorithm.mismatch``; rejection sampling and batch
    normalisation, which grpo_lab has not, as inexact."""
    level, spec = v.text(_C + "rollout_is", ("token", "sequence"), none=True), v.get(_C + "rollout_is_threshold")
    if v.get(_C + "rollout_rs") is not None:
        d.inexact.append(f"rollout_correction.rollout_rs = {v.get(_C + 'rollout_rs')!r}: rollout rejection sampling "
                         "drops tokens or responses by their sampler divergence, which grpo_lab does not")
    if level is None:
        return
    if v.flag(_C + "rollout_is_batch_normalize"):
        d.inexact.append("rollout_is_batch_normalize=True: the mismatch weights are rescaled to mean 1 over the batch")
    low, cap = (None, float(spec)) if not isinstance(spec, str) or "_" not in spec else \
        tuple(float(x) for x in spec.split("_", 1))
    if low is not None and low > math.exp(-20):
        d.inexact.append(f"rollout_is_threshold = {spec!r}: weights below {low:g} are zeroed too; grpo_lab's mismatch "
                         "correction has an upper bound only")
    _smp.read_mismatch(f"{level}_{'truncate' if low is None else 'mask'}", cap, d.fields, d.inexact)


def _rollout(v: Values, d: Draft, budget: dict) -> None:
    """The sampler (dtype, top-p, top-k), where pi_old comes from (bypass mode) and the mismatch correction."""
    dtype = v.get(_R + "dtype")
    if dtype not in _ROLLOUT_DTYPES:
        raise ValueError(f"verl config: {_R}dtype={dtype!r}: expected one of {sorted(_ROLLOUT_DTYPES)}")
    top_k = v.integer(_R + "top_k")
    budget.update(rollout_dtype=_ROLLOUT_DTYPES[dtype], top_p=v.number(_R + "top_p"), top_k=max(top_k, 0))
    d.explained.update(k for k in v.values if k.startswith(_C)
                       or k in (_R + s for s in ("dtype", "top_p", "top_k", "logprobs_mode", "calculate_log_probs")))
    bypass = v.flag(_C + "bypass_mode")
    if bypass and v.get(_C + "loss_type") != "ppo_clip":
        d.inexact.append(f"bypass mode with rollout_correction.loss_type = {v.get(_C + 'loss_type')!r}: REINFORCE "
                         "weighted by pi_theta / pi_sampler, which no grpo_lab surrogate computes")
    if bypass:
        budget["old_logp"] = "behaviour"
        d.notes.append("bypass_mode=True: pi_old is the sampler's log-probs (old_logp='behaviour'); the PPO clip "
                       "replaces policy_loss.loss_mode")
    else:
        _correction(v, d)
    if (bypass or v.get(_C + "rollout_is")) and v.get(_R + "logprobs_mode") != "processed_logprobs":
        d.inexact.append(f"rollout.logprobs_mode = {v.get(_R + 'logprobs_mode')!r}: the sampler's log-probs are not "
                         "those of the distribution it sampled from (processed_logprobs)")


_K = "critic."


def _value_clip(v: Values) -> float:
    """``critic.cliprange_value``: a number >= 0 (``inf``: no clip; Hydra's ``inf`` may arrive as text)."""
    raw = v.get(_K + "cliprange_value")
    try:
        clip = float(raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError):
        clip = math.nan
    if not clip >= 0:
        raise ValueError(f"verl config: {_K}cliprange_value must be a number >= 0 (inf: no clip), got {raw!r}")
    return clip


def _critic(v: Values, d: Draft, budget: dict) -> None:
    """verl's critic, on when ``critic.enable`` says so, else for ``adv_estimator=gae`` (verl's ``need_critic``):
    ``cliprange_value`` as ``value_clip_eps`` (inf: None), ``critic.optim.lr`` as the budget's ``value_lr`` and
    ``trainer.critic_warmup`` as its ``value_warmup_steps``; a loss aggregation other than the token mean (verl's
    default is the actor's ``loss_agg_mode``) is a departure, the schedule and checkpoint are notes."""
    enable = None if v.get(_K + "enable") is None else v.flag(_K + "enable")
    gae = d.fields.get("advantage") == "gae"
    d.explained.update(k for k in v.values if k.startswith(_K) or k == "trainer.critic_warmup")
    if not (gae if enable is None else enable):
        if gae:
            d.inexact.append("critic.enable=False with adv_estimator='gae': verl's GAE reads the critic's values, "
                             "which no critic computes (the run fails)")
        return
    if not gae:
        d.notes.append(f"critic.enable=True with adv_estimator={v.get('algorithm.adv_estimator')!r}: verl trains a "
                       "critic whose values no advantage uses")
        return
    clip = _value_clip(v)
    d.fields["value_clip_eps"] = None if math.isinf(clip) else clip
    lr, warm = v.number(_K + "optim.lr"), v.integer("trainer.critic_warmup")
    budget.update(value_lr=lr, value_warmup_steps=max(warm, 0))
    agg = v.get(_K + "loss_agg_mode")
    agg, own = (agg, True) if agg is not None else (v.get(_A + "loss_agg_mode"), False)
    if agg != "token-mean":
        d.inexact.append(f"critic.loss_agg_mode = {agg!r}{'' if own else ' (the actor loss_agg_mode, verl default)'}"
                         ": the critic's 0.5 (V - R)^2 aggregated so; grpo_lab's value_loss takes the token mean")
    steps, ratio = v.get(_K + "optim.lr_warmup_steps"), v.get(_K + "optim.lr_warmup_steps_ratio")
    d.notes.append(f"critic: AdamW lr = {lr:g} (value_lr), lr_scheduler_type = "
                   f"{v.get(_K + 'optim.lr_scheduler_type')!r}, lr_warmup_steps = {steps} (ratio {ratio}) (grpo_lab's "
                   f"critic trains at a constant value_lr), cliprange_value = {clip:g} (value_clip_eps), "
                   f"loss_agg_mode = {agg!r}, trainer.critic_warmup = {warm} (value_warmup_steps), model.path = "
                   f"{v.get(_K + 'model.path') or 'verl default'!r}")


#: verl advantage estimators that compare a response with the other responses of its prompt's group
_GROUP_ESTIMATORS = ("grpo", "rloo", "grpo_passk", "opo", "drgrpo", "gpg", "grpo_vectorized")


def _notes(v: Values, d: Draft) -> None:
    ent = v.number(_A + "entropy_coeff")
    if ent != 0:
        d.inexact.append(f"entropy bonus entropy_coeff = {ent:g}: grpo_lab's loss has no entropy term")
    d.explained.add(_A + "entropy_coeff")
    g = lambda k: v.get(k)  # noqa: E731
    n = v.integer("actor_rollout_ref.rollout.n", none=True)
    if v.get("algorithm.adv_estimator") in _GROUP_ESTIMATORS and n is not None and n < 2:
        d.inexact.append(f"rollout.n = {n}: a group of one response has no baseline, so every group-relative "
                         "advantage is 0 and nothing trains (verl's default n is 1; set actor_rollout_ref.rollout.n "
                         ">= 2)")
    d.notes.append(f"sizes: rollout.n (G) = {g('actor_rollout_ref.rollout.n')}, data.train_batch_size = "
                   f"{g('data.train_batch_size')} prompts, ppo_mini_batch_size = {g(_A + 'ppo_mini_batch_size')}, "
                   f"ppo_epochs = {g(_A + 'ppo_epochs')}, data.max_response_length = {g('data.max_response_length')}"
                   f", {g('trainer.nnodes')} node(s) x {g('trainer.n_gpus_per_node')} GPU(s)")
    d.notes.append(f"optimiser: AdamW lr = {v.number(_A + 'optim.lr'):g}, betas = {g(_A + 'optim.betas')}, weight_decay = "
                   f"{g(_A + 'optim.weight_decay')}, clip_grad = {g(_A + 'optim.clip_grad')}, lr_scheduler_type = "
                   f"{g(_A + 'optim.lr_scheduler_type')!r}, lr_warmup_steps = {g(_A + 'optim.lr_warmup_steps')} "
                   f"(ratio {g(_A + 'optim.lr_warmup_steps_ratio')})")
    d.notes.append(f"sampling: temperature = {g('actor_rollout_ref.rollout.temperature')}, top_p = "
                   f"{g('actor_rollout_ref.rollout.top_p')}, top_k = {g('actor_rollout_ref.rollout.top_k')}; verl "
                   "0.9.1 has no Overlong Filtering (DAPO §3.4)")


def _moot(v: Values):
    mode = v.get(_A + "policy_loss.loss_mode")

    def moot(key: str) -> bool:
        if key == _A + "clip_ratio_c":
            return mode != "vanilla"
        if key in (_A + "clip_ratio_low", _A + "clip_ratio_high"):
            return mode in ("kl_cov", "sapo")
        if key.startswith("reward.reward_kwargs.") or key == "reward.reward_manager.name":
            return True  # read by _sampling
        if key.startswith(_K) or key == "trainer.critic_warmup":
            return True  # read by _critic (the optimiser's keys as notes, as the actor's)
        if key == _A + "use_kl_loss":
            return not v.get(_A + "kl_loss_coef")
        if key == _A + "loss_scale_factor":
            return v.get(_A + "loss_agg_mode") != "seq-mean-token-sum-norm"
        return key == "algorithm.filter_groups.metric" and not v.get("algorithm.filter_groups.enable")
    return moot


def _describe(key: str, value: Any) -> str:
    return f"{key} = {value!r}, which the export of the reading does not write (the library computes otherwise)"


def read_verl(values: dict) -> tuple:
    """``(Draft, budget, normalised config)`` of a verl config (``values``: dotted keys, defaults filled in).

    Raises:
        ValueError: a value of the wrong type or an unknown choice (naming the key).
    """
    v = Values("verl", values)
    d = Draft("verl")
    _advantage(v, d)
    _surrogate(v, d)
    _aggregation(v, d)
    _kl(v, d)
    _sampling(v, d)
    _notes(v, d)
    if d.named is None and v.get("algorithm.adv_estimator") == "grpo":
        d.named = ("GRPO", "algorithm.adv_estimator=grpo")
    budget = {"max_new_tokens": v.integer("data.max_response_length"), "precision": _precision(values)}
    _rollout(v, d, budget)
    _critic(v, d, budget)
    if (v.integer("actor_rollout_ref.rollout.n", none=True) or 0) >= 2:
        budget["group_size"] = v.integer("actor_rollout_ref.rollout.n")
    norm = dict(values)
    if isinstance(norm.get(_A + "kl_loss_type"), str):
        norm[_A + "kl_loss_type"] = _KL_ALIASES.get(norm[_A + "kl_loss_type"], norm[_A + "kl_loss_type"])
    return d, budget, norm


#: verl's FSDP ``mixed_precision.param_dtype`` names -> grpo_lab's precision names
_PARAM_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
                 "fp32": "float32", "float32": "float32"}


def _precision(values: dict) -> str:
    """The actor's compute precision as grpo_lab names it: ``actor.fsdp_config.mixed_precision.param_dtype``,
    bfloat16 when unset (verl 0.9.1's FSDP workers default to ``bf16``)."""
    dtype = values.get(_A + "fsdp_config.mixed_precision.param_dtype") or "bf16"
    if dtype not in _PARAM_DTYPES:
        raise ValueError(f"{_A}fsdp_config.mixed_precision.param_dtype={dtype!r}: expected one of "
                         f"{sorted(_PARAM_DTYPES)}")
    return _PARAM_DTYPES[dtype]


def verify_verl(algo, d: Draft, budget: dict, norm: dict) -> None:
    """:func:`grpo_lab.export.lint_base.verify` for verl (with ``adv_estimator=gae``, the export's issues name verl's
    batch whitening of the advantages)."""
    verify(algo, d, norm, budget, _moot(Values("verl", norm)), _describe)
