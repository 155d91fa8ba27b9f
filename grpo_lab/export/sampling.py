"""The sampling half of an export: where π_old comes from, the sampler's precision and truncation, and the
correction of the sampler–learner mismatch, in TRL 1.16.0's and verl 0.9.1's own settings.

The run's side (budget keys, :data:`SAMPLING_KEYS`, read from a ``TrainerConfig`` by
:func:`~grpo_lab.export.optimisation.budget_from_config`): ``old_logp``, ``rollout_dtype``, ``top_p``, ``top_k``.
The algorithm's side: ``Algorithm.mismatch`` (:data:`MISMATCH_MODES`, cap ``is_cap``) and
``Algorithm.keep_sampling_mask``. :func:`trl_sampling` and :func:`verl_sampling` are each translation's
sampling part, as ``(settings, notes, issues)``.

What each library computes (read from TRL's ``grpo_trainer.py`` / ``grpo_config.py`` and verl's
``rollout_corr_helper.py`` / ``core_algos.py`` / ``ray_trainer.py``; the mismatch weight
``w = pi_old / pi_sampler`` per token, or the product over a response's tokens, as both libraries compute it):

* mismatch: TRL ``vllm_importance_sampling_correction=True``, ``vllm_importance_sampling_mode`` = the grpo_lab
  name, ``vllm_importance_sampling_clip_max`` = C, ``clip_min`` None: truncate min(w, C), mask w 1[w <= C],
  multiplied into each token's surrogate loss; only with ``use_vllm=True``. verl (decoupled mode,
  ``bypass_mode=False``): ``rollout_is`` = ``token`` / ``sequence``, ``rollout_is_threshold`` = C (truncate) or
  ``"lower_upper"`` (IcePop: zero outside the bounds; the export's lower bound :data:`VERL_MASK_FLOOR` is below
  e^-20, the smallest weight verl forms, since it clamps log w to +-20).
* π_old: TRL scores it with the trained model (recomputed, or sg(π_θ) when the rollout trains one step), never
  with the sampler's log-probs; verl recomputes it, or with ``rollout_correction.bypass_mode=True`` takes the
  sampler's (``old_log_probs = rollout_log_probs``, then the PPO clip of ``loss_type='ppo_clip'`` whatever
  ``policy_loss.loss_mode`` says).
* the sampler: TRL ``top_p`` / ``top_k`` (0: off); verl ``rollout.top_p`` / ``rollout.top_k`` (-1: off) and
  ``rollout.dtype`` (default bfloat16). TRL's GRPOConfig has no sampler precision. Both libraries' vLLM log-probs
  are ``processed_logprobs`` (after temperature, top-p, top-k), as grpo_lab's ``generate`` records them.
* Keep Sampling Mask (DeepSeek-V3.2 §3.1): neither library restricts π_θ and π_old to the sampler's kept set.

Anything else is an issue (approximate or lost, with the exact alternative where there is one; a mismatch with
``old_logp='behaviour'`` is impossible). Never exact by default.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from ..algo import checks as _v

__all__ = ["SAMPLING_KEYS", "MISMATCH_MODES", "IS_CAP_DEFAULT", "VERL_MASK_FLOOR", "check_sampling",
           "mismatch_of", "trl_sampling", "verl_sampling", "read_mismatch"]

#: budget keys of the sampling side (names as in TrainerConfig), with what they export to
SAMPLING_KEYS: dict[str, str] = {
    "old_logp": "π_old, 'recompute' / 'behaviour' (TrainerConfig.old_logp; verl rollout_correction.bypass_mode, TRL "
                "none: it never takes the sampler's log-probs); always written, default 'recompute'",
    "rollout_dtype": "the sampler's precision, 'float32' / 'bfloat16' / 'float16' (TrainerConfig.rollout_dtype; "
                     "verl actor_rollout_ref.rollout.dtype, TRL none); always written, default 'float32'",
    "top_p": "nucleus truncation of the sampler, in (0, 1] (TrainerConfig.top_p; TRL top_p, verl rollout.top_p); "
             "always written, default 1.0",
    "top_k": "top-k truncation of the sampler, 0 = off (TrainerConfig.top_k; TRL top_k, verl rollout.top_k with "
             "-1 = off); always written, default 0",
}
#: ``Algorithm.mismatch`` choices, also TRL's ``vllm_importance_sampling_mode`` names
MISMATCH_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
#: the cap C of a mismatch correction when the algorithm gives none
IS_CAP_DEFAULT = 2.0
#: the lower bound of the export's verl IcePop threshold, below e^-20 (the smallest weight verl forms)
VERL_MASK_FLOOR = 1e-9
_DEFAULTS = {"old_logp": "recompute", "rollout_dtype": "float32", "top_p": 1.0, "top_k": 0}
_R = "actor_rollout_ref.rollout."
_C = "algorithm.rollout_correction."


def check_sampling(budget: dict, b: dict) -> None:
    """Validate the budget's sampling keys into ``b``, each given its TrainerConfig default when absent.

    Args:
        budget: the budget as given; b: the validated budget being built (updated in place).

    Raises:
        ValueError: ``old_logp`` / ``rollout_dtype`` not one of the choices (naming them), ``top_p`` outside
            (0, 1], ``top_k`` not a non-negative int.
    """
    if budget.get("old_logp") is not None:
        b["old_logp"] = _v.choice("old_logp", budget["old_logp"], ("recompute", "behaviour"))
    if budget.get("rollout_dtype") is not None:
        b["rollout_dtype"] = _v.choice("rollout_dtype", budget["rollout_dtype"], ("float32", "bfloat16", "float16"))
    if budget.get("top_p") is not None:
        p = _v.real_number("top_p", budget["top_p"])
        if not 0 < p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1.0: no nucleus truncation), got {p!r}")
        b["top_p"] = float(p)
    if budget.get("top_k") is not None:
        b["top_k"] = _v.non_negative_int("top_k", budget["top_k"])
    for k, default in _DEFAULTS.items():
        b.setdefault(k, default)


def mismatch_of(algo: Any) -> tuple:
    """``(mode, C, keep_sampling_mask)`` of an :class:`~grpo_lab.algo.algorithms.Algorithm`: ``algo.mismatch``
    (None: no correction), its cap ``is_cap`` (the algorithm's value for the mismatch function; None without a
    mode, :data:`IS_CAP_DEFAULT` for a function that declares none) and ``algo.keep_sampling_mask``."""
    from ..algo.objectives import MISMATCH_CORRECTIONS

    mode, keep = algo.mismatch, bool(algo.keep_sampling_mask)
    if mode is None:
        return None, None, keep
    fn = MISMATCH_CORRECTIONS.get(mode)
    cap = algo.values_for(fn).get("is_cap", IS_CAP_DEFAULT) if fn is not None else IS_CAP_DEFAULT
    return mode, float(cap), keep


def _truncated(b: dict) -> bool:
    return b["top_p"] < 1 or b["top_k"] > 0


def _common(algo: Any, b: dict, label: str) -> tuple:
    """``(mode, C, notes, issues)`` shared by both targets: the refusals and Keep Sampling Mask."""
    mode, cap, keep = mismatch_of(algo)
    notes, issues = [], []
    if mode is not None and mode not in MISMATCH_MODES:
        issues.append(dict(kind="impossible", axis="mismatch", message=f"mismatch={mode!r} is not mapped to {label}: "
                           f"grpo_lab.export maps {list(MISMATCH_MODES)} only"))
    elif mode is not None and not (math.isfinite(cap) and cap > 0):
        issues.append(dict(kind="impossible", axis="mismatch", message=f"is_cap={cap!r}: both libraries need a "
                           "finite positive cap C"))
    elif mode is not None and b["old_logp"] == "behaviour":
        issues.append(dict(kind="impossible", axis="mismatch", message=f"mismatch={mode!r} reweights by pi_old / "
                           "pi_sampler, which is 1 when pi_old is the sampler's (old_logp='behaviour'); it needs "
                           "old_logp='recompute'"))
    if any(i["kind"] == "impossible" for i in issues):
        mode = None  # nothing to map: the export raises whatever strict says
    if keep and _truncated(b):
        issues.append(dict(kind="lost", axis="keep_sampling_mask", fix={"keep_sampling_mask": False},
                           message=f"{label} scores pi_theta and pi_old on the full softmax: it has no Keep Sampling "
                                   "Mask (DeepSeek-V3.2 §3.1, the sampler's top-p / top-k kept set applied to both)"))
    elif keep:
        notes.append("Keep Sampling Mask: top_p = 1 and top_k = 0 keep every token, so the mask changes nothing")
    return mode, cap, notes, issues


def _behaviour_issue(why: str, what: str) -> dict:
    return dict(kind="approximate", axis="old_logp", budget_fix={"old_logp": "recompute"},
                message=f"old_logp='behaviour' takes pi_old from the sampler ({why}); {what}")


def trl_sampling(algo: Any, b: dict) -> tuple:
    """TRL 1.16.0's sampling settings for ``algo`` under the validated budget ``b``.

    Returns:
        ``(GRPOConfig keyword arguments, notes, issues)``; each issue a dict of
        :class:`~grpo_lab.export.translation.Issue` fields.
    """
    label = "TRL 1.16.0"
    mode, cap, notes, issues = _common(algo, b, label)
    cfg: dict = {"top_p": b["top_p"], "top_k": b["top_k"]}
    notes.append(f"sampler: top_p={b['top_p']:g}, top_k={b['top_k']} (0: off in both)")
    if mode is not None:
        cfg.update(use_vllm=True, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode,
                   vllm_importance_sampling_clip_max=cap, vllm_importance_sampling_clip_min=None)
        notes.append(f"mismatch {mode!r}: use_vllm=True (TRL corrects vLLM's samples only), "
                     f"vllm_importance_sampling_mode={mode!r}, clip_max={cap:g}, clip_min=None: w = pi_old / pi_vllm "
                     f"{'per token' if mode.startswith('token') else 'over the response (product)'}, "
                     f"{'min(w, C)' if mode.endswith('truncate') else 'w if w <= C else 0'}, times each token's loss "
                     "(exact); vLLM's log-probs are processed_logprobs (colocate mode; in server mode start "
                     "trl vllm-serve with --logprobs-mode processed_logprobs)")
    else:
        cfg["vllm_importance_sampling_correction"] = False
        notes.append("no mismatch correction: vllm_importance_sampling_correction=False (TRL's default True "
                     "reweights vLLM's samples by pi_old / pi_vllm)")
    if b["rollout_dtype"] != "float32" or mode is not None:
        issues.append(dict(kind="approximate", axis="rollout_dtype", budget_fix=None if mode else
                           {"rollout_dtype": "float32"},
                           message=f"rollout_dtype={b['rollout_dtype']!r}: {label}'s GRPOConfig has no sampler "
                                   "precision: without vLLM it samples with the trained model, with use_vllm=True in "
                                   "the dtype vLLM loads the checkpoint in (dtype 'auto', or trl vllm-serve --dtype)"))
    sampler_is_learner = b["rollout_dtype"] == "float32" and not _truncated(b)
    if b["old_logp"] == "behaviour" and sampler_is_learner:
        notes.append("old_logp='behaviour' with a float32 untruncated sampler: the sampler's log-probs are the "
                     "policy's, which TRL recomputes (equal up to rounding)")
    elif b["old_logp"] == "behaviour":
        issues.append(_behaviour_issue(
            f"rollout_dtype={b['rollout_dtype']!r}, top_p={b['top_p']:g}, top_k={b['top_k']}",
            f"{label} always scores pi_old with the trained model, so its ratio lacks the sampler-learner mismatch "
            "that grpo_lab's keeps; vllm_importance_sampling_correction is another estimator (Algorithm.mismatch)"))
    else:
        notes.append("old_logp='recompute': TRL scores pi_old with the trained model before the rollout's first "
                     "update (sg(pi_theta) when the rollout trains one step: the same value)")
    return cfg, notes, issues


def verl_sampling(algo: Any, b: dict, loss_mode: Optional[str]) -> tuple:
    """verl 0.9.1's sampling overrides for ``algo`` under the validated budget ``b``; ``loss_mode`` is the
    ``policy_loss.loss_mode`` the translation wrote.

    Returns:
        ``({dotted key: python value}, notes, issues)``; each issue a dict of
        :class:`~grpo_lab.export.translation.Issue` fields.
    """
    label = "verl 0.9.1"
    mode, cap, notes, issues = _common(algo, b, label)
    cfg: dict = {_C + "rollout_is": None, _R + "dtype": b["rollout_dtype"], _R + "top_p": b["top_p"],
                 _R + "top_k": b["top_k"] if b["top_k"] > 0 else -1}
    notes.append(f"sampler: rollout.dtype={b['rollout_dtype']} (verl's default bfloat16), top_p={b['top_p']:g}, "
                 f"top_k={cfg[_R + 'top_k']} (-1: off)")
    reads_sampler = mode is not None or (b["old_logp"] == "behaviour"
                                         and (b["rollout_dtype"] != "float32" or _truncated(b)))
    if reads_sampler:
        cfg.update({_R + "calculate_log_probs": True, _R + "logprobs_mode": "processed_logprobs",
                    _C + "rollout_rs": None, _C + "rollout_is_batch_normalize": False})
    if mode is not None:
        level, kind = mode.split("_")
        cfg[_C + "rollout_is"] = level
        cfg[_C + "rollout_is_threshold"] = cap if kind == "truncate" else f"{VERL_MASK_FLOOR:.9f}_{cap!r}"
        cfg[_C + "bypass_mode"] = False
        notes.append(f"mismatch {mode!r}: rollout_correction.rollout_is={level}, rollout_is_threshold="
                     f"{cfg[_C + 'rollout_is_threshold']} ({'TIS: min(w, C)' if kind == 'truncate' else 'IcePop: w '}"
                     f"{'' if kind == 'truncate' else 'inside [floor, C], else 0'}), bypass_mode=False (pi_old "
                     "recomputed), times each token's loss; verl clamps log w to +-20 (exact within)")
        if loss_mode == "geo_mean":
            issues.append(dict(kind="approximate", axis="mismatch", message="verl's geo_mean takes the geometric "
                               "mean of the token weights per response, grpo_lab multiplies each token's loss"))
    if b["old_logp"] == "behaviour" and not reads_sampler:
        notes.append("old_logp='behaviour' with a float32 untruncated sampler: the sampler's log-probs are the "
                     "policy's, which verl recomputes (equal up to rounding)")
    elif b["old_logp"] == "behaviour" and mode is None:
        cfg.update({_C + "bypass_mode": True, _C + "loss_type": "ppo_clip"})
        notes.append("old_logp='behaviour': rollout_correction.bypass_mode=True, loss_type=ppo_clip "
                     "(old_log_probs = the sampler's processed log-probs)")
        if loss_mode != "vanilla":
            issues.append(_behaviour_issue("bypass_mode=True", f"{label}'s bypass mode replaces policy_loss.loss_mode="
                                           f"{loss_mode} by the PPO clip (compute_policy_loss_vanilla)"))
    elif b["old_logp"] == "recompute":
        notes.append("old_logp='recompute': verl's decoupled mode recomputes old_log_probs before the updates")
    return cfg, notes, issues


def read_mismatch(mode: str, cap: float, fields: dict, inexact: list) -> None:
    """A library's mismatch correction read back (the linter): ``Algorithm.mismatch = mode`` and its cap
    ``is_cap = cap`` (a hyper-parameter: the linter puts it in ``params``) into ``fields`` (Algorithm keyword
    arguments); ``inexact`` is left as it is (kept for the readers' common signature).

    Args:
        mode: one of :data:`MISMATCH_MODES`; cap: the upper bound C (> 0).
    """
    fields["mismatch"] = mode
    if cap != IS_CAP_DEFAULT:
        fields["is_cap"] = cap
