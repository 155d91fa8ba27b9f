"""The book's regime rules: one threshold and one statistic per mechanism, used by every chapter.

A chapter may say "not tested in the paper's regime" only by a rule written here, fixed before its runs.
The intro (``book/intro.md``, "Regime rules") states them for the reader; ``tests/lab/test_regime.py``
checks that the intro's numbers are these.

**A clip acts** (PPO's, DAPO's clip-higher, CISPO's cap, GSPO's sequence clip, or any other trust region):

* statistic: per seed, the mean over the **second half** of the run's updates (RL steps ``> steps / 2``;
  for a probe of ``n`` optimiser steps, steps ``> n / 2``) of the share of loss tokens whose gradient the
  clip removes (a history column such as ``clip_frac``, ``clip_frac_high`` or ``zero_grad_frac``); then the
  mean over seeds, with its 95% t-interval beside it;
* threshold: the mean is at least :data:`CLIP_ACTS` = 0.5%.

**A cap on the sampler–learner weight acts** (TIS's truncation, MIS's mask of π_old / π_sampler): the same
statistic and threshold over the share of loss tokens whose weight the cap changes (truncates or masks); it is
the same mechanism, a bound on a per-token weight. Before any training, the share of tokens whose weight passes
the cap on the first rollout says whether a toy can reach the regime at all.

Why the second half: each rollout's first minibatch is on-policy and the first updates sit in the
learning-rate warm-up, where a clip cannot bind; the second half is where the off-policy drift the clip
answers has built up. Why 0.5%: a clip binding on under 1% of the tokens can decide an outcome (chapter 8's
control), so a 1% threshold would call such a clip idle.

**Every other precondition** (issue 55) is a :class:`Rule` of :data:`RULES`: a per-seed statistic of one history
column (or of a :data:`DERIVED` one) over a window of the run, its threshold, the paper's value and why the threshold
is what it is; :func:`check_rule` applies one to a run. The scenario benchmarks (:mod:`grpo_lab.lab.scenarios`)
record the commit of this file, which fixes the rules before their runs; a rule changed after a scenario's runs keeps
the old verdict beside the new one.

Earlier editions used other thresholds and windows per chapter; a chapter whose verdict moved under this rule
shows the old verdict beside the new one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..experiments import stats

__all__ = ["CLIP_ACTS", "late_mean", "clip_acts", "Rule", "RULES", "DERIVED", "length_spread", "rule_statistic", "check_rule"]

#: The share of loss tokens (per seed, averaged over the second half of the updates) above which a clip acts.
CLIP_ACTS = 0.005


def late_mean(history: pd.DataFrame, column: str) -> pd.Series:
    """Per seed, the mean of ``column`` over the second half of the run's training steps (step > last / 2).

    Args:
        history: a run's history (columns ``seed``, ``step`` and ``column``; rows with ``column`` NaN, such as
            evaluation rows, are ignored); steps count from 1.
        column: a per-step share in [0, 1], e.g. ``"clip_frac"``.

    Returns:
        float64 Series indexed by seed.

    Raises:
        KeyError: ``column`` or ``seed`` / ``step`` missing; ValueError: no training row.
    """
    for col in ("seed", "step", column):
        if col not in history.columns:
            raise KeyError(f"late_mean: the history has no column {col!r}")
    rows = history.dropna(subset=[column])
    rows = rows[rows["step"] > 0]
    if rows.empty:
        raise ValueError(f"late_mean: no training row with {column!r}")
    per_step = rows.groupby(["seed", "step"])[column].mean()
    last = per_step.index.get_level_values("step").max()
    late = per_step[per_step.index.get_level_values("step") > last / 2]
    return late.groupby(level="seed").mean().astype(np.float64)


def clip_acts(per_seed) -> tuple[bool, stats.Interval]:
    """The "a clip acts" rule on per-seed shares (:func:`late_mean`): ``(mean >= CLIP_ACTS, 95% t-interval)``.

    Raises ``ValueError`` (from :func:`grpo_lab.experiments.stats.t_interval`) on no seed or a NaN share."""
    iv = stats.t_interval(list(per_seed))
    return bool(iv.mean >= CLIP_ACTS), iv


# --------------------------------------------------------------------------------------------------- the rule table
# Issue 55: every precondition of every scenario, its threshold, the paper's value and why, in one table fixed
# before the scenarios' runs (the scenario results record the commit of this file: git log -1 -- this file).


@dataclass(frozen=True)
class Rule:
    """One precondition: a per-seed statistic of a history column, its threshold, the paper's value and why.

    Attributes:
        name: the key in :data:`RULES`.
        acts: what the rule says when it holds (e.g. ``"dynamic sampling acts"``).
        column: the history column (or a key of :data:`DERIVED` computed from several); ``""``: the column is
            given by the mechanism that uses the rule (a clip's own share, e.g. ``clip_frac_high``).
        window: ``"late"`` (per seed, steps > last / 2: :func:`late_mean`), ``"run"`` (all training steps) or
            ``"last"`` (the last training step).
        threshold: the rule holds when the mean over seeds of the per-seed statistic is ``>= threshold``.
        unit: how to print the statistic (``"%"`` shares, ``"x"`` ratios, ``"reward"`` differences of rewards,
            ``"tokens"``, ``"turns"``).
        paper: the paper's value of the statistic or of the setting that produces it (with the section).
        why: why the threshold is what it is.
    """

    name: str
    acts: str
    column: str
    window: str
    threshold: float
    unit: str
    paper: str
    why: str


def length_spread(h: pd.DataFrame) -> pd.Series:
    """Per history row, ``(length_max - length_min) / length``: the range of a step's response lengths over their mean
    (model tokens only on multi-turn episodes); NaN where the mean length is 0.

    Raises:
        KeyError: a column of the three missing."""
    return (h["length_max"] - h["length_min"]) / h["length"].where(h["length"] > 0)


#: Statistics derived from several history columns. ``length_spread`` is (longest - shortest) / mean response length
#: in a step (model tokens only on multi-turn episodes).
DERIVED = {"length_spread": length_spread}

_SWITCH = 0.01  # a switch acting on under 1 group or response in 100 changes too little to measure with 5 seeds

#: The book's regime rules by name, one rule per mechanism, fixed before the scenario runs (issue 55).
RULES = {r.name: r for r in (
    Rule("clip_acts", "the clip acts", "", "late", CLIP_ACTS, "%",
         "ranges, not binding rates: DAPO eps_high 0.28 (§4.1), CISPO eps_high (§3.1), GSPO 3e-4 / 4e-4 (§5.1); "
         "GSPO clips about 100x more tokens than GRPO (Fig. 2)",
         "each rollout's first minibatch is on-policy and warm-up keeps early ratios near 1, so only the second half "
         "can show a binding clip; chapter 8's control saw a clip on < 1% of tokens decide an outcome"),
    Rule("tied_groups", "dynamic sampling acts", "zero_adv_group_frac", "run", _SWITCH, "%",
         "DAPO Eq. 11 drops groups of accuracy 0 or 1; their share grows during training (DAPO §3.2), not tabulated",
         "with < 1% of generated groups tied, the filter replaces under one group in a hundred"),
    Rule("truncation", "overlong filtering acts", "truncation_rate", "run", _SWITCH, "%",
         "L_max 20,480 tokens (DAPO §4.1); truncation rate not reported",
         "with < 1% of responses at the budget, the filter masks under one response in a hundred"),
    Rule("overlong_window", "the soft overlong punishment acts", "overlong_frac_penalised", "run", _SWITCH, "%",
         "L_cache 4,096 of 20,480 tokens (DAPO Eq. 13); share penalised not reported",
         "with < 1% of responses in the punishment window, the penalty touches under one response in a hundred"),
    Rule("length_spread", "token- and sample-level losses differ", "length_spread", "run", 1.0, "x",
         "long-CoT responses of hundreds to 20,480 tokens (DAPO §3.3, §4.1); spread not tabulated",
         "the sample-level mean weighs a token by 1/|o_i|, the token-level one by 1/sum|o|: they differ by the "
         "ratio of lengths, and a range of at least the mean length (e.g. 10 and 30 tokens around 20) is where "
         "they weigh one response's tokens at least twice as much as another's"),
    Rule("long_responses", "responses are long", "length", "last", 100.0, "tokens",
         "thousands of tokens (VAPO §4, lambda 1 - 1/(0.05 l)); 0.95^100 = 0.006",
         "chapter 6: GAE's lambda matters once responses reach about 100 tokens (0.95^100 < 1%)"),
    Rule("critic_fits", "the critic tracks the returns", "explained_variance_mc", "late", 0.10, "%",
         "VAPO pretrains its value model for 50 steps (§4.1) so that its GAE does not start from a critic that explains "
         "nothing (§3.1, Fig. 1); the explained variance itself is not tabulated",
         "a value model's advantage beats the group mean only where its values explain part of the returns: below "
         "10% of their variance (Monte-Carlo returns, comparable across critics) in the second half of the run, its "
         "per-token credit is mostly noise and any difference from a critic-free method is not the critic's"),
    Rule("observation_share", "tool observations are a real share of the context", "observation_token_frac", "run",
         0.10, "%", "no paper tabulates it; MiniMax-M1's software-engineering sandboxes return long observations (§4)",
         "masking observations changes a normaliser by their share: under 10% the masked and unmasked losses differ "
         "by less than the seed spread of the toy's gradients"),
    Rule("turns", "episodes have several turns", "turns_mean", "run", 1.5, "turns",
         "multi-turn agentic episodes (DeepSeek-V3.2 §3; MiniMax-M1 §4), turn counts not tabulated",
         "a turn follows each tool call, so 1.5 turns is half a call per episode on average (e.g. half the episodes "
         "calling once, or a quarter calling twice): enough episodes that read an observation for its masking to "
         "matter"),
    Rule("routing_changes", "MoE routes change under the update", "routing_change_frac", "run", 0.10, "%",
         "about 10% of activated experts change after each update in the 48-layer Qwen3-30B-A3B (GSPO §5.3)",
         "GSPO's argument rests on the paper's 10%: below it, token ratios are not made volatile by routing. The "
         "column counts the (layer, token) top-k sets the rollout's first update changes, at least the paper's share "
         "of experts changed (a set of k with one expert swapped counts 1, the paper's measure 1/k): a set share "
         "under 10% puts the expert share under 10% too (benchmarks/moe_sampler_routing.py measures the expert share "
         "between sampler and learner)"),
    Rule("proxy_hacked", "the learned reward is over-optimised", "test_proxy_gold_gap", "late", 0.05, "reward",
         "not in the book's papers: Gao et al. 2022 (arXiv 2210.10760, Fig. 1) find the gold reward model's score "
         "peaks, then falls, as RL pushes a proxy reward model up; InstructGPT (arXiv 2203.02155, §3.5) fits its "
         "reward model to labels of the policy's samples; neither tabulates the proxy-gold gap",
         "the proxy is fitted to the gold reward of the base policy's samples, so on the base its mean gap on the "
         "64 test prompts is about 0 (-0.007); a gap of 0.05 (5% of the reward's range, about 2.5 standard errors of "
         "a 64-prompt gold mean) in the second half of the run is a policy where the proxy over-rates what it does, "
         "the regime in which a policy-gradient method can hack the reward"),
)}


def rule_statistic(rule: Rule, history: pd.DataFrame, column: str | None = None) -> pd.Series:
    """Per seed, ``rule``'s statistic: the ``window`` mean of the column's per-step means (NaN rows ignored).

    Args:
        rule: a :class:`Rule`. history: a run's history (``seed``, ``step`` and the column, or the columns of a
            :data:`DERIVED` statistic). column: the column, where the rule leaves it to the mechanism.

    Returns:
        float64 Series indexed by seed (empty when no training row has the column).

    Raises:
        ValueError: the rule needs a column and none is given; KeyError: a column is missing.
    """
    col = rule.column or column
    if not col:
        raise ValueError(f"rule {rule.name!r}: give the column it applies to (e.g. 'clip_frac_high')")
    h = history[history["step"] > 0]
    try:
        values = DERIVED[col](h) if col in DERIVED else h[col] if col in h.columns else None
    except KeyError as exc:
        raise KeyError(f"rule {rule.name!r}: the history has no column {exc.args[0]!r} (needed for {col!r})") from None
    if values is None:
        raise KeyError(f"rule {rule.name!r}: the history has no column {col!r}")
    per_step = pd.DataFrame({"seed": h["seed"], "step": h["step"], "v": values}).dropna()
    if per_step.empty:
        return pd.Series(dtype=np.float64)
    per_step = per_step.groupby(["seed", "step"])["v"].mean().reset_index()
    last = per_step["step"].max()
    if rule.window == "late":
        per_step = per_step[per_step["step"] > last / 2]
    elif rule.window == "last":
        per_step = per_step[per_step["step"] == last]
    return per_step.groupby("seed")["v"].mean().astype(np.float64)


def check_rule(name: str, history: pd.DataFrame, column: str | None = None) -> dict:
    """Rule ``name`` of :data:`RULES` on a run's history: ``{"rule", "acts", "column", "measured" (mean over seeds),
    "interval" ([lo, hi], 95% t), "threshold", "holds", "paper", "why", "reason"}``; a column never recorded (a dense
    model's routing) gives ``holds = False`` and the reason "not measured".

    Raises:
        KeyError: unknown rule name (the known ones listed); as :func:`rule_statistic`.
    """
    if name not in RULES:
        raise KeyError(f"unknown regime rule {name!r}; known: {sorted(RULES)}")
    rule = RULES[name]
    col = rule.column or column
    per_seed = rule_statistic(rule, history, column)
    out = {"rule": name, "acts": rule.acts, "column": col, "window": rule.window, "threshold": rule.threshold,
           "unit": rule.unit, "paper": rule.paper, "why": rule.why}
    if per_seed.empty:
        return {**out, "measured": None, "interval": None, "holds": False,
                "reason": f"{col} not recorded in these runs (it cannot be: e.g. routing on a dense model)"}
    iv = stats.t_interval(per_seed.to_numpy())
    holds = bool(iv.mean >= rule.threshold)
    text = f"{col} {_fmt(iv.mean, rule.unit)} against >= {_fmt(rule.threshold, rule.unit)}"
    return {**out, "measured": float(iv.mean), "interval": [float(iv.lo), float(iv.hi)], "holds": holds,
            "per_seed": {int(k): float(v) for k, v in per_seed.items()},
            "reason": f"{rule.acts}: {text}" if holds else f"not: {text}"}


def _fmt(value: float, unit: str) -> str:
    if unit == "%":
        return f"{100 * value:.2f}%"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "reward":
        return f"{value:+.3f}"
    return f"{value:.1f} {unit}"
