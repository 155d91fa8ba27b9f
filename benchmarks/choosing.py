"""Every preset on one task, one base policy and one budget of steps, with the compute each used: chapter 8's table.

    python benchmarks/choosing.py                     # 5 seeds x 20 steps, writes benchmarks/results/choosing.json
    python benchmarks/choosing.py --seeds 2 --steps 2 --out /tmp/choosing_quick.json     # a quick look
    python benchmarks/choosing.py --presets GRPO VAPO --seeds 1 --steps 2 --out /tmp/x.json  # some presets only

What it measures. GRPO, DR_GRPO, DAPO, GSPO, CISPO, PPO, VAPO, GMPO, SAPO, KL_COV and CLIP_COV train on the
``cpu`` profile (``arithmetic-base``, the arithmetic task, 16 questions x 8 responses per step, lr 3e-4, two
minibatches per rollout) for the same number of RL steps (20) from the same base, with the same seeds (0..4),
greedy test accuracy every 5 steps. Each preset is the package's preset, except where a chapter had to resize it to
run at this scale (VAPO's lambda horizon and its pretrained critic: chapter 6); :func:`presets` says which chapter
each setting comes from. Equal steps and questions per step are not equal compute: DAPO and CISPO generate refills
for tied groups (dynamic sampling) and PPO and VAPO train a critic. So every step is charged what it used
(:func:`step_compute`):

    compute units = generated tokens + 3 x trained tokens + (3 x trained tokens for a critic: PPO, VAPO)

in units of one token's forward pass (a backward costs about two forwards); VAPO is also charged its critic's
pretraining. It is an estimate: prompt tokens, the pi_old and reference forwards, the critic's forward at rollout
time and the rows the overlong filter masks (still computed) are not counted; see ``compute_note`` in the file.

Per preset (a row of the file): final greedy accuracy per seed and mean [95% t]; the paired difference to GRPO
over shared seeds; generated tokens to reach a target accuracy (the base's + half of GRPO's mean gain) per seed,
their median and how many seeds reached it; accuracy at matched compute (at the last evaluation whose cumulative
compute is within the smallest mean total compute of any preset); response length and entropy at the last step;
clip fractions (over all updates, and ``*_late`` over the second half of them: the book's regime statistic) and the
share of tokens with a gradient; seconds per step and peak memory (the process's peak
resident set on CPU: the worker's, which holds more than the run). RPT runs on its own task (next-token reasoning
on ``corpus-base``) with chapter 7's settings, with the same columns where they apply (``not_applicable`` says
which do not, and why). Before any verdict, ``regime`` states per preset whether the toy exercises what the preset
was designed for: each mechanism's precondition measured from the runs beside the paper's value, a boolean and a
one-line reason; a verdict is "in regime" or "not tested in the paper's regime: <why>", never "does not reproduce".
Whether a clip acts (clip-higher, CISPO's cap, GMPO's log-space clip, GSPO's sequence clip) is the book's one rule,
:mod:`grpo_lab.lab.regime` (>= 0.5% of tokens, per seed over the second half of the updates); each clip check and
each verdict also record, under ``old_rule``, what the rule this file used before (>= 1%, over all updates) said.
The switches (dynamic sampling's tied groups, truncations, the overlong punishment window) have their own threshold,
``SWITCH_ACTS`` (1% of the groups or responses).

Run time: 244-257 s of wall time at full size in three runs, two runs at a time on two cores (454-479 s of the
runs' own step and evaluation seconds; 2026-12-04), from an empty run cache; up to twice that with other work on the cores. A quick
look (2 seeds x 2 steps) takes 21-26 s. Chapter 8 reads the file (its ``RERUN = True`` runs this script first).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from grpo_lab import experiments, lab
from grpo_lab.experiments import stats
from grpo_lab.lab import regime
from grpo_lab.algo.advantages import VALUE_BASELINE_ESTIMATORS
from grpo_lab.algo.algorithms import (CISPO, CLIP_COV, DAPO, DR_GRPO, GMPO, GRPO, GSPO, KL_COV, PPO, RPT, RPT_SAMPLING,
                                 SAPO, VAPO)
from grpo_lab.policy.models import load_policy
from grpo_lab.tasks import get_task
from grpo_lab.tasks.next_token import ENTROPY_THRESHOLDS
from grpo_lab.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "choosing.json"
STEPS, EVAL_EVERY, SEEDS = 20, 5, 5
VAPO_ALPHA = 4.0  # chapter 6 (ALPHA): lambda_policy = 1 - 1/(4 l) = 0.95 at the base's median of 5 tokens
PRETRAIN_STEPS = 16  # chapter 6 (PRETRAIN_STEPS): value pretraining on the frozen base policy
RPT_STEPS, RPT_EVAL_EVERY, RPT_PROMPTS = 16, 4, 8  # chapter 7 (STEPS, EVAL_EVERY, P)
PACE = 0.5  # chapter 6's rule: the critic keeps pace if explained variance at the last step >= PACE x the first
SWITCH_ACTS = 0.01  # DAPO's and CISPO's switches (tied groups dropped, truncations, the punishment window) act on
# >= 1% of the groups or responses they can touch: the switches' own threshold (a clip is held to regime.CLIP_ACTS)
OLD_CLIP_RULE = 0.01  # before the book's one regime rule: a clip bound on >= 1% of tokens, mean over all updates
FRESH_EV = 0.1  # a critic that starts uninformed (explained variance 0) keeps pace only if it reaches this
MIN_SELECTED = 10  # tokens per update a covariance rule must select (the papers select thousands; 1-2 is noise)
PRESET_NAMES = ("GRPO", "DR_GRPO", "DAPO", "GSPO", "CISPO", "PPO", "VAPO", "GMPO", "SAPO", "KL_COV", "CLIP_COV")
ALL_NAMES = (*PRESET_NAMES, "RPT")
COMPUTE_NOTE = ("compute units = generated tokens + 3 x trained tokens (policy forward + backward) + 3 x trained "
                "tokens for a critic (PPO, VAPO), in units of one token's forward; generated tokens = mean length "
                "x generated_groups x G per step (every dynamic-sampling round included); trained tokens = "
                "num_tokens (the mean over the step's optimiser updates of the loss tokens) x the number of "
                "updates; VAPO also pays its critic's pretraining, (1 + 3) x its generated tokens, charged to every "
                "seed. An estimate: prompt tokens, the pi_old and reference forwards, the critic's forward at "
                "rollout and rows masked by the overlong filter (computed, not in the loss) are left out")


def presets(lr: float) -> dict[str, tuple]:
    """``{name: (algorithm, trainer overrides, where the settings come from)}`` for the arithmetic presets."""
    out = {a.name: (a, {}, "the package's preset, unchanged") for a in (GRPO, DR_GRPO, GSPO, GMPO, SAPO, KL_COV,
                                                                         CLIP_COV)}
    # chapter 2 trains DAPO at a 20-token budget so that its overlong switches have truncations to act on; here the
    # budget is part of the task every preset shares, so DAPO keeps the profile's (the regime reports truncation)
    out["DAPO"] = (DAPO, {}, "the preset; the profile's budget (chapter 2's 20-token budget is not used: one task)")
    # chapter 5 trains CISPO at 16 updates per rollout and lr 1e-4 to reach its regime; minibatches are compute here
    out["CISPO"] = (CISPO, {}, "the preset; 2 updates per rollout (chapter 5's 16 are not used: same updates)")
    # chapter 6: PPO's critic is a copy of the policy's backbone, not pretrained, at twice the policy's lr (VAPO
    # §5.1); chapter 6 samples it 64 x 1, here 16 x 8 like every preset (same questions per step)
    out["PPO"] = (PPO, {"value_init": "policy", "value_lr": 2 * lr},
                  "chapter 6: fresh critic (value_init='policy'), critic lr 2 x policy's; 16 x 8, not 64 x 1")
    # chapter 6: lam_alpha resized for 5-token answers (the paper's 0.05 gives lambda 0 below 20 tokens); a critic
    # pretrained 16 steps on the base policy (value_init set in main), critic lr 2 x the policy's (VAPO §5.1)
    out["VAPO"] = (VAPO.replace(lam_alpha=VAPO_ALPHA), {"value_lr": 2 * lr},
                   f"chapter 6: lam_alpha={VAPO_ALPHA:g}, critic pretrained {PRETRAIN_STEPS} steps, critic lr 2 x")
    return {k: out[k] for k in PRESET_NAMES}


def rpt_profile(steps: int) -> experiments.Profile:
    """Chapter 7's CPU profile for RPT, field for field (so that its runs can share chapter 7's run cache)."""
    base = experiments.get_profile("cpu")
    cfg = dataclasses.replace(base.config, **RPT_SAMPLING, prompts_per_step=RPT_PROMPTS, minibatches=1, epochs=1,
                              micro_batch_size=None, lr=base.config.lr, warmup=2,
                              eval_every=min(RPT_EVAL_EVERY, max(steps, 1)), eval_sampled=True)
    return dataclasses.replace(base, name="rpt-cpu", base="corpus-base", task="next_token", steps=steps,
                               task_kwargs={"min_entropy": ENTROPY_THRESHOLDS["easy"], "eval_held_out_loss": True},
                               config=cfg)


# ------------------------------------------------------------------------------------------ pure functions
def step_compute(hist: pd.DataFrame, group_size: int, updates: int, critic: bool) -> pd.DataFrame:
    """Per training step (rows with ``step > 0``): ``seed``, ``step``, ``generated_tokens`` (mean ``length`` x
    ``generated_groups`` x G: every sample generated, refills included), ``trained_tokens`` (``num_tokens``, the
    mean over the step's optimiser updates of the tokens in the loss, x ``updates``; 0 when the step made no update)
    and ``units`` (generated + 3 x trained, + 3 x trained more with a critic)."""
    h = hist[hist["step"] > 0]
    gen = (h["length"] * h["generated_groups"] * group_size).fillna(0.0)
    trained = (h["num_tokens"].fillna(0.0) * updates).where(h["trained_groups"].fillna(0) > 0, 0.0)
    units = gen + 3 * trained + (3 * trained if critic else 0.0)
    return pd.DataFrame({"seed": h["seed"].to_numpy(), "step": h["step"].to_numpy(), "generated_tokens": gen.to_numpy(),
                         "trained_tokens": trained.to_numpy(), "units": units.to_numpy()})


def eval_curve(hist: pd.DataFrame, compute: pd.DataFrame, seed: int, start_units: float = 0.0) -> pd.DataFrame:
    """One seed's evaluations (step 0 = the base): ``step``, ``test_accuracy`` and the cumulative ``generated_tokens``
    and ``units`` spent up to that step (``start_units`` before step 1: a critic's pretraining)."""
    c = compute[compute["seed"] == seed].sort_values("step")
    cum = pd.DataFrame({"step": [0, *c["step"]], "generated_tokens": np.cumsum([0.0, *c["generated_tokens"]]),
                        "units": start_units + np.cumsum([0.0, *c["units"]])})
    ev = hist[(hist["seed"] == seed) & hist["test_accuracy"].notna()][["step", "test_accuracy"]]
    return ev.merge(cum, on="step", how="left").sort_values("step").reset_index(drop=True)


def tokens_to_target(curve: pd.DataFrame, target: float) -> float | None:
    """Cumulative generated tokens at the first evaluation (``curve`` of :func:`eval_curve`) whose accuracy is at
    least ``target``; ``None`` when none reaches it."""
    hit = curve[curve["test_accuracy"] >= target - 1e-12]
    return None if hit.empty else float(hit["generated_tokens"].iloc[0])


def median_reached(values: list) -> float | None:
    """The median over seeds of :func:`tokens_to_target`, a seed that did not reach the target counting as
    infinitely many tokens; ``None`` when that median is not reached."""
    med = float(np.median([math.inf if v is None else v for v in values]))
    return None if math.isinf(med) else med


def at_matched_compute(curve: pd.DataFrame, budget: float) -> tuple[int | None, float | None]:
    """``(step, accuracy)`` of the last evaluation whose cumulative units are at most ``budget`` (``(None, None)``
    when even the first costs more, e.g. a critic's pretraining alone)."""
    ok = curve[curve["units"] <= budget * (1 + 1e-12)]
    return (None, None) if ok.empty else (int(ok["step"].iloc[-1]), float(ok["test_accuracy"].iloc[-1]))


def interval(values, bounds=(0.0, 1.0), digits: int = 4) -> dict:
    """Per-seed values (rounded to ``digits``) and their mean [95% t] computed from the rounded values."""
    vals = [round(float(v), digits) for v in values]
    iv = stats.t_interval(vals, bounds=bounds)
    return {"per_seed": vals, "mean": iv.mean, "lo": iv.lo, "hi": iv.hi,
            "text": stats.format_interval(iv, min(3, digits))}


# ------------------------------------------------------------------------------------------ per-seed columns
def training(res, col: str, how: str = "mean", last: bool = False) -> pd.Series:
    """Per seed: ``how`` over the training steps (``step > 0``) of ``col``, or its value at the last step; empty
    when the column is absent or never measured."""
    h = res.history
    if col not in h:
        return pd.Series(dtype=float)
    h = h[h["step"] > 0].dropna(subset=[col])
    if last:
        h = h[h["step"] == h.groupby("seed")["step"].transform("max")]
    return h.groupby("seed")[col].agg(how)


def _iv(series: pd.Series, bounds=(0.0, math.inf), digits: int = 4) -> dict | None:
    return interval(series.to_numpy(), bounds, digits) if len(series) else None


def paired(a: list, b: list, seeds: list) -> dict | None:
    """The paired difference ``a - b`` over shared seeds (from the stored per-seed values); ``None`` under 2 seeds."""
    if len(seeds) < 2:
        return None
    d = stats.paired_difference(pd.Series(a, index=seeds), pd.Series(b, index=seeds))
    return {"mean": d.mean, "lo": d.lo, "hi": d.hi, "n": d.n, "text": stats.format_interval(d, 3),
            "excludes_0": bool(d.excludes(0.0))}


def cost_columns(res, compute: pd.DataFrame, budget_tokens: int, start_units: float = 0.0) -> dict:
    """What a run used and how it ended: tokens, compute (``start_units`` added: a critic's pretraining), length,
    entropy, clip and gradient shares, seconds per step, peak memory."""
    tot = compute.groupby("seed")[["generated_tokens", "trained_tokens", "units"]].sum()
    out = {"generated_tokens_total": _iv(tot["generated_tokens"], digits=1),
           "trained_tokens_total": _iv(tot["trained_tokens"], digits=1),
           "compute_units_total": _iv(tot["units"] + start_units, digits=1),
           "length_last_step": _iv(training(res, "length", last=True), (0.0, float(budget_tokens)), 2),
           "entropy_last_step": _iv(training(res, "entropy", last=True)),
           "step_seconds": _iv(training(res, "step_seconds")),
           "peak_mem_mb": _iv(training(res, "peak_mem_mb", "max"), digits=1)}
    for col in ("clip_frac", "clip_frac_high", "clip_frac_low", "grad_token_frac"):
        out[col] = _iv(training(res, col), (0.0, 1.0), 6)
    for col in ("clip_frac", "clip_frac_high"):  # the book's regime statistic: per seed, the second half of the updates
        out[f"{col}_late"] = _iv(regime.late_mean(res.history, col), (0.0, 1.0), 6) if col in res.history else None
    return out


def _curves(res, compute: pd.DataFrame, start_units: float) -> dict:
    return {int(s): eval_curve(res.history, compute, int(s), start_units) for s in sorted(res.history["seed"].unique())}


def arithmetic_row(name: str, res, ctx: dict) -> dict:
    """One preset's row: accuracy, its difference to GRPO, tokens to target, accuracy at matched compute, costs."""
    curves, seeds = ctx["curves"][name], ctx["seeds"]
    final = interval(res.final().loc[seeds].to_numpy(), digits=6)
    ttt = [tokens_to_target(curves[s], ctx["target"]) for s in seeds]
    matched = [at_matched_compute(curves[s], ctx["budget"]) for s in seeds]
    acc_m = [a for _, a in matched]
    row = {"preset": name, "task": "arithmetic (cpu profile, arithmetic-base)", "settings": ctx["sources"][name],
           "final_accuracy": final,
           "minus_grpo": None if name == "GRPO" else paired(final["per_seed"], ctx["grpo_final"], seeds),
           "tokens_to_target": {"per_seed": ttt, "median": median_reached(ttt),
                                "n_reached": sum(v is not None for v in ttt), "n_seeds": len(seeds)},
           "accuracy_at_matched_compute": {"step_per_seed": [s for s, _ in matched],
                                           **(interval(acc_m, digits=6) if None not in acc_m else
                                              {"per_seed": acc_m, "mean": None, "text": "no evaluation fits"})},
           "critic_pretraining_units": ctx["start_units"].get(name, 0.0)}
    row.update(cost_columns(res, ctx["compute"][name], ctx["budget_tokens"], ctx["start_units"].get(name, 0.0)))
    row["curve"] = {str(s): curves[s].round(6).to_dict("list") for s in seeds}
    return row


# ------------------------------------------------------------------------------------------ regime check
def check(precondition: str, paper: str, measured: str, holds: bool, why: str) -> dict:
    """One precondition: what it needs, the paper's value, ours, whether it holds, and a one-line reason."""
    return {"precondition": precondition, "paper": paper, "measured": measured, "holds": bool(holds), "why": why}


def _verdict(holds: list[bool], whys: list[str], fixed: str | None) -> dict:
    failed = [w for h, w in zip(holds, whys) if not h] + ([fixed] if fixed else [])
    reason = "; ".join(failed) if failed else "; ".join(whys)
    return {"verdict": "in regime" if not failed else f"not tested in the paper's regime: {reason}",
            "in_regime": not failed, "reason": reason}


def verdict(checks: list[dict], fixed: str | None = None) -> dict:
    """``in regime`` when every check holds; otherwise ``not tested in the paper's regime: <the failed reasons>``.

    Where a check is a clip's (it carries ``old_rule``: what the rule used before the book's one regime rule said),
    ``old_rule`` holds the preset's verdict had every clip check been decided by that old rule, and ``changed``
    whether the verdict or a clip check's outcome differs under it (a reason reworded from "< 1%" to "< 0.5%" alone
    is no change): the chapter shows both where they differ."""
    if not checks and fixed is None:
        return {"verdict": "not tested in the paper's regime: no precondition measurable from the runs",
                "in_regime": False, "reason": "no precondition measurable from the runs", "checks": []}
    out = {**_verdict([c["holds"] for c in checks], [c["why"] for c in checks], fixed), "checks": checks}
    if any("old_rule" in c for c in checks):
        old = _verdict([c["old_rule"]["holds"] if "old_rule" in c else c["holds"] for c in checks],
                       [c["old_rule"]["why"] if "old_rule" in c else c["why"] for c in checks], fixed)
        out["old_rule"] = {**old, "rule": f"a clip binds on >= {OLD_CLIP_RULE:.0%} of tokens, run mean over all "
                           "updates (GSPO's sequence clip: any response clipped), the rule before the book's one "
                           f"regime rule (>= {regime.CLIP_ACTS:.1%}, second half of the updates)",
                           "changed": old["in_regime"] != out["in_regime"] or any(
                               c["old_rule"]["holds"] != c["holds"] for c in checks if "old_rule" in c)}
    return out


def _text(series: pd.Series, digits: int = 3, bounds=(0.0, math.inf)) -> str:
    if not len(series):
        return "not measured"
    return stats.format_interval(stats.t_interval(series.to_numpy(), bounds=bounds), digits)


def _positive(res, col: str, floor: float = 0.0, bounds=(0.0, 1.0)) -> tuple[str, bool]:
    """``(mean [95% t] over seeds of the run-mean of col, whether that mean exceeds floor)``."""
    s = training(res, col)
    return _text(s, 4, bounds), bool(len(s)) and float(s.mean()) > floor


def _mixed_groups(res, what: str) -> dict:
    tied = training(res, "zero_adv_group_frac")
    ok = len(tied) and float(tied.mean()) < 1
    return check(f"{what}: groups with both rewards (not tied)", "not reported; tied groups carry no signal",
                 f"tied share {_text(tied, bounds=(0.0, 1.0))}", ok,
                 "every group tied: no signal" if not ok else "mixed groups give a signal")


def _pace(res) -> dict:
    """Chapter 6's rule: explained variance (Monte-Carlo returns) at the last step >= half that at the first."""
    first = training(res, "explained_variance_mc", "first")
    last = training(res, "explained_variance_mc", last=True)
    if not len(first):
        return check("the critic keeps pace", "critic lr 2 x the actor's (VAPO §5.1)", "not measured", False,
                     "no explained variance recorded")
    f, l_ = float(first.mean()), float(last.mean())
    ok = l_ >= PACE * f if f > 0 else l_ >= FRESH_EV  # a fresh critic (0 at step 1) must become informative
    ev = (-math.inf, 1.0)
    return check(f"the critic keeps pace: explained variance at the last step >= half the first (chapter 6; >= "
                 f"{FRESH_EV:g} for a critic that starts at 0)",
                 "critic lr 2 x the actor's 'to keep pace' (VAPO §5.1); no explained variance given",
                 f"{_text(first, 2, ev)} at step 1, {_text(last, 2, ev)} at the last", ok,
                 "the critic does not keep pace with the policy" if not ok else "the critic keeps pace")


def _clip_binds(res, col: str, what: str, paper: str, old_floor: float = OLD_CLIP_RULE, old_col: str | None = None,
                old_text: str | None = None) -> dict:
    """The book's rule for a clip that acts (:mod:`grpo_lab.lab.regime`): per seed, the mean of ``col`` over the second
    half of the updates, then over seeds, >= ``regime.CLIP_ACTS``. Beside it, under ``old_rule``, what the rule this
    file used before said: the run mean over all updates of ``old_col`` (default ``col``) above ``old_floor`` (1%)."""
    late = regime.late_mean(res.history, col) if col in res.history else pd.Series(dtype=float)
    acts, iv = regime.clip_acts(late) if len(late) else (False, None)
    last = int(res.history["step"].max())
    late_text = stats.format_interval(iv, 4) if iv is not None else "not measured"
    all_text, old_ok = _positive(res, old_col or col, old_floor - 1e-12)
    c = check(f"{what} acts: >= {regime.CLIP_ACTS:.1%} of tokens, per seed over updates {last // 2 + 1}-{last} "
              f"(the book's rule)", paper, f"{col} {late_text} (over all updates {_text(training(res, col), 4)})",
              acts, f"{what} binds on < {regime.CLIP_ACTS:.1%} of tokens" if not acts else f"{what} binds")
    old_rule = (f">= {old_floor:.0%}" if old_floor > 0 else "> 0") + " of tokens, mean over all updates"
    c["share"] = {"column": col, "updates": [last // 2 + 1, last], "late": _iv(late, (0.0, 1.0), 6),
                  "all_updates": _iv(training(res, col), (0.0, 1.0), 6)}
    c["old_rule"] = {"rule": f"{old_col or col} {old_rule}", "measured": f"{old_col or col} {all_text}",
                     "holds": bool(old_ok),
                     "why": old_text or (f"{what} binds on < {old_floor:.0%} of tokens" if not old_ok else
                                         f"{what} binds")}
    return c


def _entropy_collapse(grpo) -> dict:
    """KL-Cov / Clip-Cov have something to prevent only if GRPO's entropy collapses: at least halved, first to last."""
    first, last = training(grpo, "entropy", "first"), training(grpo, "entropy", last=True)
    seeds = sorted(set(first.index) & set(last.index))
    d = paired(list(last.loc[seeds]), list(first.loc[seeds]), seeds)
    ok = len(seeds) > 0 and float(last.mean()) <= 0.5 * float(first.mean()) and (d is None or d["hi"] < 0)
    return check("entropy collapse in GRPO to prevent: GRPO's entropy at least halved from step 1 to the last",
                 "entropy collapses early in RL without intervention (Cui et al. 2505.22617; not in papers.md)",
                 f"GRPO entropy {_text(first)} -> {_text(last)} nats/token (last - first "
                 f"{d['text'] if d else 'one seed'})", ok,
                 "GRPO's entropy does not collapse at this scale" if not ok else "GRPO's entropy collapses")


def _regime_grpo(g, probe) -> list[dict]:
    kl_text, kl_ok = _positive(g["GRPO"], "kl", bounds=(0.0, math.inf))
    return [_mixed_groups(g["GRPO"], "group baseline (DeepSeekMath §4.1.2, G = 64)"),
            check("the KL term to the reference acts (beta = 0.04, k3)", "beta 0.04 (DeepSeekMath §4.2)",
                  f"kl {kl_text}", kl_ok, "the policy never leaves the reference" if not kl_ok else "KL > 0")]


def _regime_dr_grpo(g, probe) -> list[dict]:
    res = g["GRPO"]  # the bias Dr.GRPO removes must first be there: in GRPO's runs
    gap = (training(res, "length_incorrect") - training(res, "length_correct")).dropna()
    iv = stats.t_interval(gap.to_numpy()) if len(gap) else None
    ok_len = iv is not None and iv.excludes(0.0)
    spread = probe.get("group_std_ratio")
    return [check("removing 1/|o| matters: under GRPO, lengths of incorrect and correct responses differ",
                  "1/|o| lets incorrect answers grow longer (§3.1, Fig. 5); 3,000-token budget",
                  f"GRPO: incorrect - correct length {_text(gap, 2, None)} tokens (run mean per seed)", ok_len,
                  "no measurable length gap between GRPO's incorrect and correct responses" if not ok_len else
                  "lengths differ under GRPO"),
            check("removing the std matters: mixed groups' reward stds differ (one base batch, seed 100)",
                  "low-spread questions get more weight (§3.1)",
                  "not measured" if spread is None else f"largest / smallest std of mixed groups {spread:.3f}",
                  spread is not None and spread > 1, "group stds equal" if not spread or spread <= 1 else
                  "group stds differ")]


def _regime_dapo(g, probe) -> list[dict]:
    res = g["DAPO"]
    tied, ok_t = _positive(res, "zero_adv_group_frac", SWITCH_ACTS - 1e-12)
    trunc, ok_tr = _positive(res, "truncation_rate", SWITCH_ACTS - 1e-12)
    pen, ok_p = _positive(res, "overlong_frac_penalised", SWITCH_ACTS - 1e-12)
    return [check(f"dynamic sampling acts: >= {SWITCH_ACTS:.0%} of generated groups tied",
                  "filters accuracy 0 or 1 (Eq. 11)",
                  f"tied share {tied}", ok_t, "no tied group to drop" if not ok_t else "tied groups dropped"),
            _clip_binds(res, "clip_frac_high", "clip-higher (1 + 0.28)", "eps_high 0.28 (§4.1); rate not given"),
            check(f"overlong filtering acts: >= {SWITCH_ACTS:.0%} of responses reach the budget",
                  "L_max 20,480 tokens (§4.1)", f"truncation rate {trunc}", ok_tr,
                  f"under {SWITCH_ACTS:.0%} of responses reach the budget" if not ok_tr else "truncations"),
            check(f"soft overlong punishment acts: >= {SWITCH_ACTS:.0%} of responses inside the last L_cache tokens",
                  "L_cache 4,096 of 20,480 (Eq. 13)", f"share penalised {pen}", ok_p,
                  f"under {SWITCH_ACTS:.0%} of responses in the punishment window" if not ok_p else
                  "responses penalised")]


def _regime_gspo(g, probe) -> list[dict]:
    seq, _ = _positive(g["GSPO"], "seq_clip_frac")
    ours, grpo = training(g["GSPO"], "clip_frac"), training(g["GRPO"], "clip_frac")
    ratio = ""
    if len(ours) and len(grpo) and float(grpo.mean()) > 0:
        ratio = f"; GSPO / GRPO clip_frac {float(ours.mean()) / float(grpo.mean()):.2f} (paper: ~100, Fig. 2)"
    # the tokens of the responses clipped whole (clip_frac) are what the book's rule counts; the old rule asked only
    # that some response be clipped (seq_clip_frac > 0)
    c = _clip_binds(g["GSPO"], "clip_frac", "the sequence clip", "range 3e-4 / 4e-4, 4 minibatches (§5.1)",
                    old_floor=0.0, old_col="seq_clip_frac", old_text=None)
    c["measured"] += f"; responses clipped whole (seq_clip_frac) {seq}{ratio}"
    if not c["old_rule"]["holds"]:
        c["old_rule"]["why"] = "the sequence clip never binds"
    return [c]


def _regime_cispo(g, probe) -> list[dict]:
    res = g["CISPO"]
    tied, ok_t = _positive(res, "zero_adv_group_frac", SWITCH_ACTS - 1e-12)
    return [_clip_binds(res, "weight_capped_frac", "the IS-weight cap (tokens PPO-clip at 1.28 would silence)",
                        "16 off-policy updates per batch (§3.1); ours 2 (one off-policy); cap not reported"),
            check(f"dynamic sampling acts: >= {SWITCH_ACTS:.0%} of groups tied",
                  "DAPO's dynamic sampling is used (§3.1)",
                  f"tied share {tied}", ok_t, "no tied group to drop" if not ok_t else "tied groups dropped")]


def _regime_vapo(g, probe) -> list[dict]:
    res = g["VAPO"]
    length = training(res, "length", last=True)
    ok_len = len(length) and float(length.mean()) >= 100
    acc_text, ok_acc = _positive(res, "accuracy")
    return [_pace(res),
            check("length-adaptive GAE needs long responses (hundreds of tokens or more)",
                  "0.95^100 = 0.006 (§4); alpha 0.05 gives lambda 0.95 at 400 tokens",
                  f"mean length at the last step {_text(length, 1)} tokens (alpha resized to {VAPO_ALPHA:g})",
                  ok_len, "responses of a few tokens, not hundreds" if not ok_len else "long responses"),
            _clip_binds(res, "clip_frac_high", "clip-higher (1 + 0.28)", "eps_high 0.28 (§5.1); rate not given"),
            check("the positive-example LM loss has correct responses", "mu 0.1 on correct responses (Eq. 9)",
                  f"train accuracy {acc_text}", ok_acc, "no correct response" if not ok_acc else "correct responses")]


def _regime_gmpo(g, probe) -> list[dict]:
    """GMPO's geometric mean matters where token ratios leave its range often enough to move the update: its
    log-space clip acting by the book's rule (:mod:`grpo_lab.lab.regime`), as DAPO's and CISPO's clips are (a single
    outlier token in a run is not a regime)."""
    res = g["GMPO"]
    hi, lo = training(res, "ratio_max", "max"), training(res, "ratio_min", "min")
    binds = _clip_binds(res, "clip_frac", "GMPO's log-space clip (e^-0.4, e^0.4)",
                        "clip range (e^-0.4, e^0.4) (preset comment; GMPO is not in papers.md); rate not given")
    binds["measured"] += f"; run max of ratio_max {_text(hi)}, run min of ratio_min {_text(lo)}"
    return [binds]


def _regime_sapo(g, probe) -> list[dict]:
    res = g["SAPO"]
    q05, q95 = training(res, "ratio_q05"), training(res, "ratio_q95")
    ok = len(q05) and (float(q05.mean()) < 0.8 or float(q95.mean()) > 1.2)
    dev, _ = _positive(res, "token_ratio_abs_dev", bounds=(0.0, math.inf))
    w, _ = _positive(res, "sapo_weight", bounds=(0.0, math.inf))
    return [check("the soft gate acts: >= 5% of tokens with |r - 1| >= 0.2 (where it departs from the plain ratio "
                  "by >= 1%: weight ~ r (1 - tau^2 (r - 1)^2 / 4))",
                  "tau_pos 1.0, tau_neg 1.05 (preset comment; SAPO is not in papers.md)",
                  f"ratio q05 {_text(q05)}, q95 {_text(q95)}; mean |r - 1| {dev}; mean gate weight {w}", ok,
                  "ratios stay within 0.2 of 1: the gate is the plain ratio" if not ok else "ratios far from 1")]


def _regime_cov(name: str, col: str):
    def run(g, probe) -> list[dict]:
        text, _ = _positive(g[name], col)
        h = g[name].history
        h = h[h["step"] > 0].dropna(subset=[col, "num_tokens"])
        per_update = (h[col] * h["num_tokens"]).groupby(h["seed"]).mean()  # tokens selected per optimiser update
        ok = len(per_update) and float(per_update.mean()) >= MIN_SELECTED
        out = [check(f"the covariance selection acts: >= {MIN_SELECTED} tokens selected per update",
                     "2e-3 (KL-Cov, 7B) / 2e-4 (Clip-Cov) of a batch of millions of tokens: thousands per update "
                     "(preset comments; not in papers.md)",
                     f"{col} {text}; tokens per update {_text(per_update, 1)}", ok,
                     f"about {float(per_update.mean()):.1f} tokens selected per update (the papers' thousands)"
                     if not ok else "enough tokens selected")]
        if "GRPO" in g:
            out.insert(0, _entropy_collapse(g["GRPO"]))
        return out
    return run


def _regime_rpt(res) -> list[dict]:
    reason, ok = _positive(res, "reasoning_frac", 0.5)
    return [_mixed_groups(res, "GRPO signal (G = 8, positions with both outcomes)"),
            check("next-token reasoning: most samples reason before predicting", "reasoning mode, responses up "
                  "to 8,192 tokens (App. B); R1-Distill-Qwen-14B", f"share with a thinking span {reason}", ok,
                  "the tiny model does not reason (chapter 7)" if not ok else "samples reason")]


#: preset -> (its regime checks, a reason that holds whatever the runs show, or None)
REGIME = {"GRPO": (_regime_grpo, None), "DR_GRPO": (_regime_dr_grpo, None), "DAPO": (_regime_dapo, None),
          "GSPO": (_regime_gspo, "dense model: GSPO's motivation is MoE routing drift (§5.3), absent here"),
          "CISPO": (_regime_cispo, None), "PPO": (lambda g, p: [_pace(g["PPO"])], None),
          "VAPO": (_regime_vapo, None), "GMPO": (_regime_gmpo, None), "SAPO": (_regime_sapo, None),
          "KL_COV": (_regime_cov("KL_COV", "kl_cov_selected"), None),
          "CLIP_COV": (_regime_cov("CLIP_COV", "clip_cov_detached"), None)}


# ------------------------------------------------------------------------------------------ the runs
def group_std_probe(prof) -> dict:
    """One batch of the base policy (seed 100, GRPO's sampling): how much the reward stds of its mixed groups differ."""
    task = get_task(prof.task, **dict(prof.task_kwargs))
    cfg = dataclasses.replace(prof.config, seed=100, eval_every=0, progress=False)
    batch = Trainer(*load_policy(prof.base), task, GRPO, cfg).collect()
    std = batch.rewards.double().view(-1, prof.config.group_size).std(dim=1)  # unbiased, as group_advantages
    mixed = std[std > 0]
    return {"groups": int(std.numel()), "mixed_groups": int(mixed.numel()),
            "group_std_ratio": float(mixed.max() / mixed.min()) if mixed.numel() else None}


def critic_pretraining(prof, lr: float, steps: int) -> tuple[str, int]:
    """Chapter 6's critic: a copy of the policy's backbone pretrained ``steps`` steps on the frozen base (seed 0,
    critic lr 2 x the policy's); returns its directory (the run cache hashes its weights) and the steps taken."""
    critic = str(ROOT / "_build" / f"choosing_critic_{steps}")
    algo = VAPO.replace(lam_alpha=VAPO_ALPHA)
    warm = lab.pretrain_critic((0, "policy", critic), algo=algo, profile=prof, steps=steps, value_lr=2 * lr)
    return critic, int(warm["value_step"].max())


def context(grid: dict, table: dict, prof, seeds: list, start_units: dict) -> dict:
    """What every row needs: per-step compute, evaluation curves, the base accuracy, the target, the matched budget."""
    c = prof.config
    compute = {n: step_compute(r.history, c.group_size, c.minibatches * c.epochs,
                               table[n][0].advantage in VALUE_BASELINE_ESTIMATORS) for n, r in grid.items()}
    curves = {n: _curves(r, compute[n], start_units.get(n, 0.0)) for n, r in grid.items()}
    base = float(grid["GRPO"].base().mean())
    grpo_final = interval(grid["GRPO"].final().loc[seeds].to_numpy(), digits=6)["per_seed"]
    target = base + 0.5 * (float(np.mean(grpo_final)) - base)
    totals = {n: float((compute[n].groupby("seed")["units"].sum() + start_units.get(n, 0.0)).mean()) for n in grid}
    return {"compute": compute, "curves": curves, "base": base, "grpo_final": grpo_final, "target": target,
            "totals": totals, "budget": min(totals.values()), "seeds": seeds, "start_units": start_units,
            "sources": {n: table[n][2] for n in table},
            "budget_tokens": c.max_new_tokens or get_task(prof.task, **dict(prof.task_kwargs)).max_new_tokens}


def rpt_row(res, prof, seeds: list) -> dict:
    """RPT on its own task: the columns that apply (``not_applicable`` names the others and why)."""
    compute = step_compute(res.history, prof.config.group_size, prof.config.minibatches * prof.config.epochs, False)
    curves = _curves(res, compute, 0.0)
    task = get_task(prof.task, **dict(prof.task_kwargs))
    row = {"preset": "RPT", "task": "next-token reasoning (chapter 7: corpus-base, min_entropy = the easy threshold)",
           "settings": f"chapter 7's CPU profile: {prof.config.prompts_per_step} positions x G = "
                       f"{prof.config.group_size}, T = {prof.config.temperature}, one update per batch, warmup 2",
           "steps": int(res.history["step"].max()),
           "base_accuracy": float(res.base().mean()),
           "final_accuracy": interval(res.final().loc[seeds].to_numpy(), digits=6),
           "final_accuracy_sampled": _iv(res.final("test_accuracy_sampled").loc[seeds], (0.0, 1.0), 6),
           "test_questions": len(task.test_set()),
           "not_applicable": {
               "minus_grpo": "another task: GRPO did not train on it", "tokens_to_target": "the target is defined "
               "by GRPO's gain on arithmetic", "accuracy_at_matched_compute": "another task and base: compute is not "
               "comparable", "clip_frac": "one update per batch (exact on-policy): the clip cannot bind (0 by "
               "construction, still reported)"}}
    row.update(cost_columns(res, compute, prof.config.max_new_tokens or task.max_new_tokens))
    row["curve"] = {str(s): curves[s].round(6).to_dict("list") for s in seeds}
    return row


# ------------------------------------------------------------------------------------------ command line
def parse(argv=None) -> argparse.Namespace:
    """The command line, checked: clear errors for unknown presets and non-positive counts."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=SEEDS, help="seeds 0..N-1 (default 5)")
    ap.add_argument("--steps", type=int, default=STEPS, help="RL steps of every arithmetic preset (default 20)")
    ap.add_argument("--rpt-steps", type=int, default=None, help=f"RPT's steps (default min({RPT_STEPS}, --steps))")
    ap.add_argument("--presets", nargs="+", default=list(ALL_NAMES), metavar="NAME",
                    help=f"a subset of {' '.join(ALL_NAMES)} (GRPO is added: the reference of every row)")
    ap.add_argument("--n-jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    unknown = [p for p in a.presets if p.upper() not in ALL_NAMES]
    if unknown:
        ap.error(f"unknown preset(s) {unknown}; choose from {' '.join(ALL_NAMES)}")
    for name in ("seeds", "steps", "n_jobs") + (("rpt_steps",) if a.rpt_steps is not None else ()):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if not a.out.parent.is_dir():
        ap.error(f"--out: the directory {a.out.parent} does not exist")
    if a.out.is_dir():
        ap.error(f"--out: {a.out} is a directory; give a file name (--out {a.out / 'choosing.json'})")
    chosen = {p.upper() for p in a.presets}
    full = (a.seeds, a.steps, chosen, a.rpt_steps) == (SEEDS, STEPS, set(ALL_NAMES), None)
    if a.out.resolve() == OUT.resolve() and not full:  # checked before any training, not after it
        ap.error(f"--out: {OUT.relative_to(ROOT)} is the committed comparison chapter 8 reads; a run with other "
                 f"seeds, steps or presets must write elsewhere (--out /tmp/choosing_quick.json)")
    a.presets = [n for n in PRESET_NAMES if n in chosen or (n == "GRPO" and chosen - {"RPT"})]
    a.rpt = "RPT" in chosen
    a.rpt_steps = a.rpt_steps or min(RPT_STEPS, a.steps)
    return a


def run_arithmetic(a, prof) -> tuple[dict, dict, dict, int]:
    """The arithmetic presets' grid; returns it, the preset table, the critic's pretraining units and steps."""
    lr = prof.config.lr
    table = {n: v for n, v in presets(lr).items() if n in a.presets}
    overrides = {n: dict(o) for n, (_, o, _) in table.items() if o}
    pre_steps = 0
    if "VAPO" in table:
        critic, pre_steps = critic_pretraining(prof, lr, PRETRAIN_STEPS if a.steps >= STEPS else 2)
        overrides["VAPO"]["value_init"] = critic
    grid = experiments.run_grid([t[0] for t in table.values()], profile=prof, seeds=list(range(a.seeds)),
                                steps=a.steps, n_jobs=a.n_jobs, eval_every=min(EVAL_EVERY, a.steps),
                                overrides=overrides)
    grid = {n: grid[t[0].name] for n, t in table.items()}  # the preset's name: VAPO's resized copy is still "VAPO"
    start = {}
    if pre_steps:  # pretraining samples from the base: the step-1 rollouts' mean length, generated then fitted
        base_len = float(np.mean([r.history.query("step == 1")["length"].mean() for r in grid.values()]))
        c = prof.config
        start["VAPO"] = float(pre_steps * c.prompts_per_step * c.group_size * base_len * (1 + 3))
    return grid, table, start, pre_steps


def regime_table(grid: dict, probe: dict) -> dict:
    """The regime check of every preset that ran."""
    return {n: verdict(fn(grid, probe), fixed) for n, (fn, fixed) in REGIME.items() if n in grid}


def _seconds(results) -> tuple[float, int]:
    """The runs' own step and evaluation seconds (a cache hit keeps its original ones) and how many came from cache."""
    secs = sum(float(r.history[c].sum()) for r in results for c in ("step_seconds", "eval_seconds") if c in r.history)
    return round(secs, 1), sum(len(r.provenance.get("cached_seeds", [])) for r in results)


def main(argv=None) -> None:
    a = parse(argv)
    t0, seeds = time.perf_counter(), list(range(a.seeds))
    prof = experiments.get_profile("cpu")
    out = {"question": "every preset on one task, one base and one budget of steps, charged the compute it used",
           "settings": {"seeds": seeds, "steps": a.steps, "eval_every": min(EVAL_EVERY, a.steps),
                        "rpt_steps": a.rpt_steps if a.rpt else None}, "compute_note": COMPUTE_NOTE}
    results = []
    if a.presets:
        grid, table, start, pre_steps = run_arithmetic(a, prof)
        probe = group_std_probe(prof) if "DR_GRPO" in grid else {}
        ctx = context(grid, table, prof, seeds, start)
        test_n = len(get_task(prof.task, **dict(prof.task_kwargs)).test_set())
        out["settings"].update({
            "profile": {"name": prof.name, "base": prof.base, "task": prof.task, "prompts_per_step":
                        prof.config.prompts_per_step, "group_size": prof.config.group_size, "lr": prof.config.lr,
                        "minibatches": prof.config.minibatches, "budget_tokens": ctx["budget_tokens"]},
            "presets": {n: {"settings": t[2], "trainer_overrides": {k: str(v) for k, v in t[1].items()}}
                        for n, t in table.items()}})
        out.update({"base_accuracy": ctx["base"], "test_questions": test_n,
                    "base_binomial_se": stats.binomial_se(ctx["base"], test_n),
                    "target": {"accuracy": ctx["target"], "rule": "base accuracy + half of GRPO's mean gain "
                               "(final greedy accuracy over seeds - base)"},
                    "matched_compute": {"units": ctx["budget"], "rule": "the smallest mean total compute of any "
                                        "preset; each preset's accuracy at its last evaluation within it",
                                        "mean_total_units": ctx["totals"]},
                    "critic_pretraining_steps": pre_steps, "dr_grpo_probe": probe,
                    "rows": [arithmetic_row(n, grid[n], ctx) for n in grid], "regime": regime_table(grid, probe)})
        results += list(grid.values())
    if a.rpt:
        rprof = rpt_profile(a.rpt_steps)
        res = experiments.run(RPT, profile=rprof, seeds=seeds, n_jobs=a.n_jobs)
        out["rpt"] = {"row": rpt_row(res, rprof, seeds), "regime": verdict(_regime_rpt(res))}
        results.append(res)
    out["run_seconds_sum"], out["runs_from_cache"] = _seconds(results)
    whole = experiments.provenance(GRPO, prof, a.steps, seeds, time.perf_counter() - t0)
    out["n_jobs"] = a.n_jobs
    out["provenance"] = {k: whole[k] for k in ("git_sha", "grpo_lab", "torch", "transformers", "python",
                                               "device_name", "date", "wall_seconds")}
    a.out.write_text(json.dumps(out, indent=1, allow_nan=False) + "\n")
    _summary(out)
    print(f"wrote {a.out}")


def _summary(out: dict) -> None:
    for r in out.get("rows", []):
        d = r["minus_grpo"]["text"] if r["minus_grpo"] else ""
        print(f"{r['preset']:9s} {r['final_accuracy']['text']:24s} {d:26s} units {r['compute_units_total']['mean']:.0f}"
              f"  {out['regime'][r['preset']]['verdict'][:90]}", flush=True)
    if "rpt" in out:
        print("RPT", out["rpt"]["row"]["final_accuracy"]["text"], out["rpt"]["regime"]["verdict"][:90])


if __name__ == "__main__":
    main()
