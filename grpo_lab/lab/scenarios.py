"""Scenario benchmarks: one branch of the seed's decision tree, tested in a toy built for that branch (issues 55, 56).

A :class:`Scenario` names a base checkpoint and task where the branch's mechanisms can act, the arms a practitioner
would weigh (presets, and ablations that switch one mechanism off), the arm every other is compared with, and the
mechanisms to judge. :func:`run_scenario` runs it in two phases:

1. **learning-rate sweep**: every arm at each rate of ``lrs`` on ``sweep_seeds`` (kept apart from the comparison's);
   each arm keeps the rate of the best mean primary endpoint (ties: the smaller rate);
2. **comparison**: every arm at its rate on ``seeds`` (at least 5), the same seeds for all (paired).

Its results (:func:`analyse`) hold, per arm, the primary endpoint chosen before the runs (``curve_mean``: the mean
greedy test accuracy over the evaluations after step 0) beside the final and the best evaluation (the best of
several evaluations is biased upwards), with 95% t-intervals; paired differences over shared seeds with Bonferroni
intervals over the scenario's comparisons and the smallest difference the design could detect; step time and peak
memory; and one verdict per mechanism from the book's regime rules (:data:`grpo_lab.lab.regime.RULES`, whose commit
the results record): *supported*, *contradicted*, *not separated* or *not tested in the paper's regime*.
``benchmarks/scenarios.py`` runs a scenario and writes ``benchmarks/results/scenario_<name>.json``; the book reads
that file with :func:`load_scenario`, :func:`scenario_table` and :func:`verdict_table`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ..algo.algorithms import CISPO, DAPO, DR_GRPO, GRPO, GSPO, PPO, VAPO, Algorithm
from ..experiments import stats
from ..experiments.profiles import PROFILES, Profile
from ..paths import REPO_ROOT
from . import regime

__all__ = ["Mechanism", "Scenario", "SCENARIOS", "ENDPOINTS", "VERDICTS", "run_scenario", "analyse", "endpoints",
           "mechanism_verdict", "smallest_detectable", "load_scenario", "scenario_table", "verdict_table",
           "results_path"]

#: The per-seed endpoints read from the greedy test evaluations (rows with the scenario's metric, ``test_accuracy``
#: by default, step > 0): ``curve_mean`` (mean over the evaluations), ``final`` (the last) and ``best`` (the largest:
#: biased upwards).
ENDPOINTS = ("curve_mean", "final", "best")

#: The four verdicts a mechanism can get.
VERDICTS = ("supported", "contradicted", "not separated", "not tested in the paper's regime")

_FAMILY_LEVEL = 0.95  # Bonferroni: each of m comparisons at 1 - 0.05 / m
_POWER = 0.8


@dataclass(frozen=True)
class Mechanism:
    """One mechanism to judge: the arm that has it, the arm it is compared with, the rules that say it can act.

    Attributes:
        name: e.g. ``"token-level loss (DAPO Eq. 12)"``.
        arm, against: arm labels; the claim is that ``arm`` ends better than ``against`` on the primary endpoint.
        rules: ``(rule name, column)`` pairs of :data:`grpo_lab.lab.regime.RULES` checked on ``arm``'s comparison
            runs (``column`` ``""`` unless the rule leaves it to the mechanism, as ``clip_acts`` does).
        claim: the claim in words (the paper's or the seed tree's).
        joint: the other switches that differ between ``arm`` and ``against`` (``""``: an ablation of this
            mechanism alone); a verdict with joint switches is the preset's, shared by its switches.
    """

    name: str
    arm: str
    against: str
    rules: tuple
    claim: str
    joint: str = ""


@dataclass(frozen=True)
class Scenario:
    """A branch of the seed's tree and the toy built for it.

    Attributes:
        name: the key in :data:`SCENARIOS` and the results file's suffix.
        branch: the path in the seed's tree, e.g. ``("Task type?", "Multi-turn tool calls")``.
        recommendation: the seed's answer on that branch.
        profile: base checkpoint, task, steps and trainer configuration (``lr`` replaced by the sweep's).
        arms: ``(label, Algorithm)`` pairs or ``(label, Algorithm, overrides)`` triples, ``overrides`` a dict of
            :class:`~grpo_lab.training.trainer.TrainerConfig` fields for that arm only (e.g.
            ``{"routing_replay": True}``: a trainer setting, not an axis of the algorithm); labels are unique.
            Stored as triples (``{}`` where none were given).
        reference: the label every arm is compared with.
        mechanisms: the :class:`Mechanism` s judged.
        lrs, sweep_seeds, seeds: the sweep's rates and seeds, the comparison's seeds (disjoint from the sweep's).
        endpoint: the primary endpoint, one of :data:`ENDPOINTS`, fixed before the runs.
        metric: the evaluation column the endpoints read (``"test_accuracy"``; ``"test_gold_mean"`` where the
            training reward is a proxy and the test metric the gold reward, as :class:`~grpo_lab.tasks.DialogueTask`).

    Raises:
        ValueError: repeated labels, an unknown reference or mechanism arm, fewer than 5 distinct comparison seeds,
            sweep and comparison seeds that overlap, fewer than 3 distinct rates, an unknown endpoint or rule, a metric
            that is not an evaluation column (``test_...``), or arm overrides that are not TrainerConfig fields or set
            ``lr`` (the sweep's).
    """

    name: str
    branch: tuple
    recommendation: str
    profile: Profile
    arms: tuple
    reference: str
    mechanisms: tuple
    lrs: tuple = (1e-4, 3e-4, 1e-3)
    sweep_seeds: tuple = (100, 101, 102)
    seeds: tuple = (0, 1, 2, 3, 4)
    endpoint: str = "curve_mean"
    metric: str = "test_accuracy"

    def __post_init__(self):
        object.__setattr__(self, "arms", tuple(_arm(self.name, a) for a in self.arms))
        labels = [label for label, *_ in self.arms]
        if len(set(labels)) != len(labels):
            raise ValueError(f"Scenario {self.name!r}: arm labels repeat: {labels}")
        named = {self.reference} | {m.arm for m in self.mechanisms} | {m.against for m in self.mechanisms}
        if named - set(labels):
            raise ValueError(f"Scenario {self.name!r}: {sorted(named - set(labels))} are not arms ({labels})")
        if len(set(self.seeds)) < 5 or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"Scenario {self.name!r}: need >= 5 distinct comparison seeds, got {list(self.seeds)}")
        if set(self.seeds) & set(self.sweep_seeds):
            raise ValueError(f"Scenario {self.name!r}: comparison seeds {sorted(set(self.seeds) & set(self.sweep_seeds))} "
                             "are also sweep seeds; they must be disjoint (the rates are chosen on other seeds)")
        if len(set(self.lrs)) < 3 or len(set(self.lrs)) != len(self.lrs):
            raise ValueError(f"Scenario {self.name!r}: need >= 3 distinct learning rates, got {list(self.lrs)}")
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"Scenario {self.name!r}: endpoint {self.endpoint!r} is not one of {ENDPOINTS}")
        if not isinstance(self.metric, str) or not self.metric.startswith("test_"):
            raise ValueError(f"Scenario {self.name!r}: metric must be an evaluation column ('test_...'), got "
                             f"{self.metric!r}")
        unknown = [r for m in self.mechanisms for r, _ in m.rules if r not in regime.RULES]
        if unknown:
            raise ValueError(f"Scenario {self.name!r}: unknown regime rules {unknown}; known: {sorted(regime.RULES)}")

    def arm(self, label: str) -> Algorithm:
        """The algorithm of arm ``label`` (KeyError naming the arms when unknown)."""
        for name, algo, _ in self.arms:
            if name == label:
                return algo
        raise KeyError(f"scenario {self.name!r} has no arm {label!r}; arms: {[n for n, *_ in self.arms]}")

    def overrides(self, label: str) -> dict:
        """The TrainerConfig fields arm ``label`` sets (``{}``: the profile's); KeyError naming the arms when
        unknown."""
        for name, _, over in self.arms:
            if name == label:
                return dict(over)
        raise KeyError(f"scenario {self.name!r} has no arm {label!r}; arms: {[n for n, *_ in self.arms]}")


def _arm(scenario: str, arm) -> tuple:
    """``(label, Algorithm)`` or ``(label, Algorithm, overrides)`` as a triple; overrides checked against
    TrainerConfig's fields (ValueError)."""
    from ..training.config import TrainerConfig

    if not isinstance(arm, tuple) or len(arm) not in (2, 3) or not isinstance(arm[1], Algorithm):
        raise ValueError(f"Scenario {scenario!r}: an arm is (label, Algorithm) or (label, Algorithm, overrides), "
                         f"got {arm!r}")
    over = dict(arm[2]) if len(arm) == 3 else {}
    unknown = sorted(set(over) - {f.name for f in dataclasses.fields(TrainerConfig)})
    if unknown or "lr" in over:
        raise ValueError(f"Scenario {scenario!r}: arm {arm[0]!r} overrides {unknown or ['lr']}: "
                         + ("not TrainerConfig fields" if unknown else "the learning rate is the sweep's"))
    return (arm[0], arm[1], over)


# ------------------------------------------------------------------------------------------------ the scenarios
def _tool_calls() -> Scenario:
    cpu = PROFILES["cpu"].config
    profile = Profile(name="tool-calls", base="calculator-base", task="calculator", steps=20,
                      config=dataclasses.replace(cpu, eval_every=5))
    dapo = ("clip-higher", "dynamic sampling", "a token-level loss", "overlong shaping")

    def joint_dapo(own: str) -> str:
        return "with " + ", ".join(x for x in dapo if x != own) + " and no KL"

    arms = (("GRPO", GRPO), ("DAPO", DAPO), ("DAPO, sample-level loss", DAPO.replace(
        name="DAPO_SEQ", aggregation="seq_mean_token_mean")), ("GSPO", GSPO), ("CISPO", CISPO))
    mechanisms = (
        Mechanism("token-level loss (DAPO Eq. 12)", "DAPO", "DAPO, sample-level loss",
                  (("observation_share", ""), ("turns", ""), ("length_spread", "")),
                  "the seed's tool-call branch: DAPO with a token-level loss"),
        Mechanism("clip-higher (DAPO Eq. 10)", "DAPO", "GRPO", (("clip_acts", "clip_frac_high"),),
                  "a higher upper clip keeps exploration (DAPO §3.1)", joint_dapo("clip-higher")),
        Mechanism("dynamic sampling (DAPO Eq. 11)", "DAPO", "GRPO", (("tied_groups", ""),),
                  "dropping tied groups keeps the gradient's signal (DAPO §3.2)", joint_dapo("dynamic sampling")),
        Mechanism("overlong shaping (DAPO Eq. 13)", "DAPO", "GRPO", (("truncation", ""), ("overlong_window", "")),
                  "truncated responses are not punished as wrong (DAPO §3.4)", joint_dapo("overlong shaping")),
        Mechanism("sequence-level ratio and clip (GSPO Eq. 7)", "GSPO", "GRPO",
                  (("routing_changes", ""), ("clip_acts", "clip_frac")),
                  "a sequence ratio is stabler where token ratios are volatile (GSPO §4, §5.3)", "and no KL"),
        Mechanism("clipped IS weight (CISPO, MiniMax-M1 Eq. 4)", "CISPO", "GRPO", (("clip_acts", "weight_capped_frac"),),
                  "keeping every token's gradient with a capped weight (MiniMax-M1 §3.1)",
                  "with dynamic sampling, a token-level loss and no KL"),
    )
    return Scenario("tool_calls", ("Task type?", "Multi-turn tool calls"), "DAPO + token-level loss", profile, arms,
                    "GRPO", mechanisms)


#: Training steps of the ``long_cot_moe`` scenario's runs (sized so that its 56 runs fit 30 min, two at a time).
MOE_STEPS = 15


def _moe() -> Scenario:
    cpu = PROFILES["cpu"].config
    # GSPO §5.1: each rollout split into 4 minibatches; arithmetic-moe-base until a long-CoT MoE twin replaces it
    profile = Profile(name="long-cot-moe", base="arithmetic-moe-base", task="arithmetic", steps=MOE_STEPS,
                      config=dataclasses.replace(cpu, minibatches=4, eval_every=5))
    grpo_nokl = "with GSPO's clip range and no KL"
    arms = (("GRPO", GRPO), ("GRPO + Routing Replay", GRPO, {"routing_replay": True}), ("GSPO", GSPO),
            ("GSPO, Dr.GRPO advantage", GSPO.replace(name="GSPO_DRA", advantage=DR_GRPO.advantage)))
    routing = ("routing_changes", "")
    mechanisms = (
        Mechanism("Routing Replay (GSPO §5.3)", "GRPO + Routing Replay", "GRPO", (routing,),
                  "GRPO on an MoE converges only when pi_old's experts are replayed (GSPO §5.3, Fig. 3)"),
        Mechanism("sequence-level ratio and clip (GSPO Eq. 7)", "GSPO", "GRPO", (routing, ("clip_acts", "clip_frac")),
                  "a sequence ratio is stable where routing changes make token ratios volatile (GSPO §4, §5.3)",
                  grpo_nokl),
        Mechanism("sequence-level ratio instead of Routing Replay (GSPO §5.3)", "GSPO", "GRPO + Routing Replay",
                  (routing, ("clip_acts", "clip_frac")),
                  "GSPO needs no Routing Replay and still trains MoE models at least as well (GSPO §5.3)", grpo_nokl),
        Mechanism("group-mean advantage (Dr.GRPO §3.1)", "GSPO, Dr.GRPO advantage", "GSPO", (),
                  "dividing by the group's std biases the update towards too easy and too hard questions "
                  "(Dr.GRPO §3.1); no regime rule measures that bias yet"),
    )
    # rates a third of the dense scenarios': the MoE base collapsed at 3e-4 in sizing runs (commit message)
    return Scenario("long_cot_moe", ("Task type?", "Mathematical/code reasoning (long CoT)", "MoE"),
                    "GSPO + Dr.GRPO ideas", profile, arms, "GRPO", mechanisms, lrs=(3e-5, 1e-4, 3e-4))


def _dialogue() -> Scenario:
    cpu = PROFILES["cpu"].config
    profile = Profile(name="dialogue", base="corpus-base", task="dialogue", steps=16,
                      config=dataclasses.replace(cpu, eval_every=4, warmup=2))
    arms = (("GRPO", GRPO), ("PPO", PPO), ("Dr.GRPO", DR_GRPO))
    mechanisms = (
        Mechanism("the critic's per-token credit (PPO with GAE)", "PPO", "GRPO", (("proxy_hacked", ""),),
                  "the seed's dialogue branch: GRPO or PPO on a learned reward model (InstructGPT uses PPO)",
                  "with a learned critic, GAE's per-token advantages and no KL"),
        Mechanism("the unbiased normaliser (Dr.GRPO §3.2)", "Dr.GRPO", "GRPO",
                  (("proxy_hacked", ""), ("length_spread", "")),
                  "no std and no per-response length normaliser removes GRPO's length and difficulty biases",
                  "and no KL"),
    )
    return Scenario("dialogue", ("Task type?", "General dialogue alignment"), "GRPO / PPO (basic enough)", profile,
                    arms, "GRPO", mechanisms, metric="test_gold_mean")


#: The long chain-of-thought scenarios' base, steps and rates: ``long-chain-base``, 12 steps (evaluations at 0, 4, 8
#: and 12) and rates a third of the short task's (the base was fine-tuned at 2e-3 and loses greedy accuracy within 5
#: steps at 3e-4); sized so that each scenario's runs fit 30 min, two at a time, with two sweep seeds.
LONG_COT_BASE, LONG_COT_STEPS, LONG_COT_LRS = "long-chain-base", 12, (3e-5, 1e-4, 3e-4)
_LONG_COT_SWEEP = (100, 101)


def _dapo_mechanisms(arm: str, against: str) -> tuple:
    """DAPO's four switches against ``against``, each with its rule, jointly with the other three and no KL."""
    dapo = ("clip-higher", "dynamic sampling", "a token-level loss", "overlong shaping")

    def joint(own: str) -> str:
        return "with " + ", ".join(x for x in dapo if x != own) + " and no KL"

    return (Mechanism("clip-higher (DAPO Eq. 10)", arm, against, (("clip_acts", "clip_frac_high"),),
                      "a higher upper clip keeps exploration (DAPO §3.1)", joint("clip-higher")),
            Mechanism("dynamic sampling (DAPO Eq. 11)", arm, against, (("tied_groups", ""),),
                      "dropping tied groups keeps the gradient's signal (DAPO §3.2)", joint("dynamic sampling")),
            Mechanism("token-level loss (DAPO Eq. 12)", arm, against, (("length_spread", ""),),
                      "long responses weigh by their tokens (DAPO §3.3)", joint("a token-level loss")),
            Mechanism("overlong shaping (DAPO Eq. 13)", arm, against, (("truncation", ""), ("overlong_window", "")),
                      "truncated responses are not punished as wrong (DAPO §3.4)", joint("overlong shaping")))


def _long_cot_dense() -> Scenario:
    cpu = PROFILES["cpu"].config
    # 8 prompts x 8 responses per step (half the short task's batch: the chains are ten times longer)
    profile = Profile(name="long-cot-dense", base=LONG_COT_BASE, task="long_chain", steps=LONG_COT_STEPS,
                      config=dataclasses.replace(cpu, prompts_per_step=8, eval_every=4, warmup=2))
    # VAPO's value pretraining (§4.1: 50 steps) resized to 8 (chapter 6: 16 before 20 steps); critic at the policy's rate
    arms = (("GRPO", GRPO), ("Dr.GRPO", DR_GRPO), ("DAPO", DAPO), ("VAPO", VAPO, {"value_warmup_steps": 8}),
            ("CISPO", CISPO), ("GSPO", GSPO))
    mechanisms = (
        Mechanism("unbiased normaliser (Dr.GRPO §3.2)", "Dr.GRPO", "GRPO", (("length_spread", ""),),
                  "removing 1/|o| and the std removes GRPO's length and difficulty biases (Dr.GRPO §3.1)", "and no KL"),
        *_dapo_mechanisms("DAPO", "GRPO"),
        Mechanism("value model with length-adaptive GAE (VAPO §4)", "VAPO", "GRPO",
                  (("long_responses", ""), ("critic_fits", "")),
                  "a critic's per-token credit helps where rewards arrive hundreds of tokens late (VAPO §4)",
                  "with clip-higher, a token-level loss, the positive-example LM loss and no KL"),
        Mechanism("clipped IS weight (CISPO, MiniMax-M1 Eq. 4)", "CISPO", "GRPO", (("clip_acts", "weight_capped_frac"),),
                  "keeping every token's gradient with a capped weight (MiniMax-M1 §3.1)",
                  "with dynamic sampling, a token-level loss and no KL"),
        Mechanism("sequence-level ratio and clip (GSPO Eq. 7)", "GSPO", "GRPO",
                  (("routing_changes", ""), ("clip_acts", "clip_frac")),
                  "a sequence ratio is stabler where token ratios are volatile (GSPO §4, §5.3)", "and no KL"),
    )
    return Scenario("long_cot_dense", ("Task type?", "Mathematical/code reasoning (long CoT)", "Dense"),
                    "DAPO or VAPO", profile, arms, "GRPO", mechanisms, lrs=LONG_COT_LRS, sweep_seeds=_LONG_COT_SWEEP)


def _stability() -> Scenario:
    cpu = PROFILES["cpu"].config
    # MiniMax-M1 §3.1: 16 off-policy updates per rollout; 16 questions per step, so one group per minibatch
    profile = Profile(name="long-cot-stability", base=LONG_COT_BASE, task="long_chain", steps=LONG_COT_STEPS,
                      config=dataclasses.replace(cpu, minibatches=16, eval_every=4, warmup=2))
    arms = (("GRPO", GRPO), ("DAPO", DAPO), ("CISPO", CISPO))
    mechanisms = (
        Mechanism("clipped IS weight (CISPO, MiniMax-M1 Eq. 4)", "CISPO", "DAPO", (("clip_acts", "weight_capped_frac"),),
                  "at 16 off-policy updates CISPO keeps the gradients PPO's clip drops and trains stabler than DAPO "
                  "(MiniMax-M1 §3.1, Fig. 2)", "with DAPO's overlong filter off"),
        Mechanism("clip-higher (DAPO Eq. 10)", "DAPO", "GRPO", (("clip_acts", "clip_frac_high"),),
                  "a higher upper clip keeps exploration under many off-policy updates (DAPO §3.1)",
                  "with dynamic sampling, a token-level loss, overlong shaping and no KL"),
    )
    return Scenario("long_cot_stability", ("Task type?", "Mathematical/code reasoning (long CoT)",
                                           "Extreme stability requirements"), "CISPO", profile, arms, "GRPO",
                    mechanisms, lrs=LONG_COT_LRS, sweep_seeds=_LONG_COT_SWEEP)


class _Scenarios(Mapping):
    """The scenarios by name, each built on first access (building one validates presets: at import time that
    would run inside Sphinx's autodoc, whose preserved defaults are not the functions' own)."""

    def __init__(self, factories: Mapping):
        self._factories, self._built = dict(factories), {}

    def __getitem__(self, name: str) -> Scenario:
        if name not in self._factories:
            raise KeyError(f"unknown scenario {name!r}; known: {sorted(self._factories)}")
        if name not in self._built:
            self._built[name] = self._factories[name]()
        return self._built[name]

    def __iter__(self):
        return iter(self._factories)

    def __len__(self) -> int:
        return len(self._factories)


#: The scenarios by name (``benchmarks/scenarios.py NAME`` runs one), each built when first read.
SCENARIOS = _Scenarios({"tool_calls": _tool_calls, "long_cot_dense": _long_cot_dense, "long_cot_moe": _moe,
                        "long_cot_stability": _stability, "dialogue": _dialogue})


# ------------------------------------------------------------------------------------------------ running
def _grid(sc: Scenario, pairs, seeds, n_jobs: int, cache: bool, steps: int | None):
    """One run_grid over ``(label, lr)`` pairs; returns ``({(label, lr): history}, wall seconds)``."""
    from ..experiments.runs import run_grid

    algos = [sc.arm(label).replace(name=f"{label} @ lr={lr:g}") for label, lr in pairs]
    t0 = time.perf_counter()
    res = run_grid(algos, profile=sc.profile, seeds=seeds, steps=steps or sc.profile.steps, n_jobs=n_jobs,
                   cache=cache, overrides={a.name: {**sc.overrides(label), "lr": lr}
                                           for a, (label, lr) in zip(algos, pairs)})
    return {pair: res[a.name].history for pair, a in zip(pairs, algos)}, time.perf_counter() - t0


def run_scenario(sc: Scenario, *, n_jobs: int = 2, cache: bool = True, steps: int | None = None,
                 sweep_seeds=None, seeds=None) -> dict:
    """The sweep, the choice of rates and the comparison of scenario ``sc``; returns :func:`analyse`'s dict.

    Args:
        sc: a :class:`Scenario`. n_jobs: runs at a time. cache: use the run cache.
        steps, sweep_seeds, seeds: smaller values for a quick look (the results then say so under ``quick``).

    Raises:
        as :func:`grpo_lab.experiments.run_grid`.
    """
    sweep_seeds, seeds = list(sweep_seeds or sc.sweep_seeds), list(seeds or sc.seeds)
    launched = {"launched_at": _git("rev-parse", "HEAD"), "rules_commit": _rules_commit()}
    hist, wall_sweep = _grid(sc, [(label, lr) for label, *_ in sc.arms for lr in sc.lrs], sweep_seeds, n_jobs,
                             cache, steps)
    sweep: dict = {}
    for (label, lr), h in hist.items():
        sweep.setdefault(label, {})[lr] = h
    chosen = choose_lrs(sc, sweep)
    comp, wall_comp = _grid(sc, list(chosen.items()), seeds, n_jobs, cache, steps)
    quick = {"steps": steps, "sweep_seeds": sweep_seeds, "seeds": seeds} if (
        steps or sweep_seeds != list(sc.sweep_seeds) or seeds != list(sc.seeds)) else None
    return analyse(sc, sweep, chosen, {label: h for (label, _), h in comp.items()},
                   {"sweep": wall_sweep, "comparison": wall_comp}, quick=quick, launched=launched)


def choose_lrs(sc: Scenario, sweep: Mapping[str, Mapping[float, pd.DataFrame]]) -> dict[str, float]:
    """Per arm, the sweep's rate with the largest mean primary endpoint over the sweep seeds (ties: the smaller)."""
    out = {}
    for label, by_lr in sweep.items():
        scores = {lr: float(endpoints(h, sc.metric)[sc.endpoint].mean()) for lr, h in by_lr.items()}
        out[label] = min(scores, key=lambda lr: (-scores[lr], lr))
    return out


def endpoints(history: pd.DataFrame, column: str = "test_accuracy") -> pd.DataFrame:
    """Per seed (index), the columns of :data:`ENDPOINTS` from a history's greedy test evaluations (step > 0) of
    ``column`` (a :attr:`Scenario.metric`).

    Raises:
        ValueError: no evaluation after step 0 (set ``eval_every``).
        KeyError: no column ``column``.
    """
    if column not in history.columns:
        raise KeyError(f"scenarios: the history has no column {column!r}")
    ev = history.dropna(subset=[column])
    ev = ev[ev["step"] > 0].groupby(["seed", "step"])[column].mean().reset_index()
    if ev.empty:
        raise ValueError("scenarios: no test evaluation after step 0 in the history (set eval_every)")
    g = ev.sort_values("step").groupby("seed")[column]
    return pd.DataFrame({"curve_mean": g.mean(), "final": g.last(), "best": g.max()}).astype(np.float64)


# ------------------------------------------------------------------------------------------------ analysis
def _iv(per_seed: pd.Series, bounds=(0.0, 1.0)) -> dict:
    iv = stats.t_interval(per_seed.to_numpy(), bounds=bounds)
    return {"mean": iv.mean, "lo": iv.lo, "hi": iv.hi, "n": iv.n,
            "per_seed": {int(k): float(v) for k, v in per_seed.items()}}


def _curve(history: pd.DataFrame, column: str = "test_accuracy") -> dict:
    ev = history.dropna(subset=[column]).groupby(["seed", "step"])[column].mean()
    return {int(k): float(v) for k, v in ev.groupby(level="step").mean().items()}


def smallest_detectable(diffs, level: float, power: float = _POWER) -> float:
    """The smallest true paired difference a two-sided paired t-test at ``level`` detects with probability ``power``:
    ``(t_{(1+level)/2, n-1} + t_{power, n-1}) * sd / sqrt(n)`` over the per-seed differences ``diffs``.

    It is post hoc (the observed spread stands for the true one): a guide to what the design could see, not a power
    analysis made before the runs.

    Raises:
        ValueError: fewer than 2 differences, a level / power outside (0, 1), or differences all equal (no spread:
            no test has a defined power).
    """
    from scipy import stats as sps

    d = np.asarray(diffs, dtype=np.float64)
    if d.size < 2 or not (0 < level < 1 and 0 < power < 1):
        raise ValueError("smallest_detectable: need >= 2 differences and level, power in (0, 1)")
    if np.ptp(d) == 0:
        raise ValueError(f"smallest_detectable: every difference equals {d[0]:+.4g}: no spread, no power to define")
    n = d.size
    return float((sps.t.ppf((1 + level) / 2, n - 1) + sps.t.ppf(power, n - 1)) * d.std(ddof=1) / math.sqrt(n))


def _compare(a: pd.Series, b: pd.Series, arm: str, against: str, m: int) -> dict:
    level = 1 - (1 - _FAMILY_LEVEL) / m
    iv = stats.paired_difference(a, b, level)
    seeds = sorted(set(a.index) & set(b.index))
    diffs = a.loc[seeds].to_numpy() - b.loc[seeds].to_numpy()
    spread = len(diffs) >= 2 and np.ptp(diffs) > 0
    return {"arm": arm, "against": against, "mean": iv.mean, "lo": iv.lo, "hi": iv.hi, "level": level, "m": m,
            "n": iv.n, "smallest_detectable": smallest_detectable(diffs, level) if spread else None,
            "per_seed": {int(s): float(d) for s, d in zip(seeds, diffs)}}


def mechanism_verdict(mech: Mechanism, checks: list[dict], comparison: dict) -> dict:
    """The verdict of ``mech`` (one of :data:`VERDICTS`) from its regime ``checks`` (:func:`grpo_lab.lab.regime.check_rule`
    results) and its Bonferroni ``comparison`` (``mean``, ``lo``, ``hi``, ``smallest_detectable``, ``level``):
    not tested when a check fails; else supported (interval above 0), contradicted (below 0) or not separated."""
    failed = [c["reason"] for c in checks if not c["holds"]]
    diff = (f"{mech.arm} - {mech.against} {comparison['mean']:+.3f} [{comparison['lo']:+.3f}, "
            f"{comparison['hi']:+.3f}]")
    mde = comparison.get("smallest_detectable")
    if failed:
        verdict, reason = VERDICTS[3], "; ".join(failed) + f" (measured anyway: {diff})"
    elif mde is None:
        verdict, reason = VERDICTS[2], f"{diff}: every seed's difference is the same, so no interval can separate it"
    elif comparison["lo"] > 0:
        verdict, reason = VERDICTS[0], diff
    elif comparison["hi"] < 0:
        verdict, reason = VERDICTS[1], diff
    else:
        verdict, reason = VERDICTS[2], (f"{diff}; the smallest difference this design detects (80% power at the "
                                        f"observed spread, post hoc): {mde:.3f}")
    if mech.joint and verdict != VERDICTS[3]:
        reason += f" (jointly {mech.joint}: the comparison does not isolate this switch)"
    return {"mechanism": mech.name, "arm": mech.arm, "against": mech.against, "claim": mech.claim, "joint": mech.joint,
            "checks": checks, "verdict": verdict, "reason": reason}


def _arm_summary(history: pd.DataFrame, lr: float, metric: str = "test_accuracy") -> dict:
    e = endpoints(history, metric)
    train = history[history["step"] > 0]
    base = history[(history["step"] == 0)].dropna(subset=[metric])[metric]
    out = {"lr": lr, **{k: _iv(e[k]) for k in ENDPOINTS}, "curve": _curve(history, metric),
           "base_accuracy": float(base.mean()) if len(base) else None,
           "step_seconds": float(train["step_seconds"].mean()), "peak_mem_mb": float(train["peak_mem_mb"].max())}
    for col in ("length", "turns_mean", "tool_calls_mean", "observation_token_frac", "zero_adv_group_frac"):
        if col in train and train[col].notna().any():
            out[col] = float(train[col].mean())
    return out


def _pairs(sc: Scenario) -> list[tuple[str, str]]:
    pairs = [(label, sc.reference) for label, *_ in sc.arms if label != sc.reference]
    return pairs + [p for p in dict.fromkeys((m.arm, m.against) for m in sc.mechanisms) if p not in pairs]


def analyse(sc: Scenario, sweep: Mapping, chosen: Mapping[str, float], comparison: Mapping[str, pd.DataFrame],
            walls: Mapping[str, float], quick: dict | None = None, launched: Mapping | None = None) -> dict:
    """The results of scenario ``sc`` as a JSON-able dict (the module docstring lists what it holds).

    Args:
        sweep: ``{label: {lr: history}}``; chosen: ``{label: lr}``; comparison: ``{label: history}`` of the
            comparison seeds; walls: wall seconds by phase; quick: the reduced settings of a quick look, or None;
            launched: the commit the runs started from and the rules' commit then (default: read now).

    Raises:
        ValueError: a history without test evaluations; KeyError: a label missing from ``comparison``.
    """
    ends = {label: endpoints(comparison[label], sc.metric)[sc.endpoint] for label, *_ in sc.arms}
    pairs = _pairs(sc)
    comps = [_compare(ends[a], ends[b], a, b, len(pairs)) for a, b in pairs]
    by_pair = {(c["arm"], c["against"]): c for c in comps}
    verdicts = [mechanism_verdict(m, [regime.check_rule(r, comparison[m.arm], col or None) for r, col in m.rules],
                                  by_pair[(m.arm, m.against)]) for m in sc.mechanisms]
    ref_mean = float(ends[sc.reference].mean())
    return {
        "scenario": sc.name, "branch": list(sc.branch), "recommendation": sc.recommendation,
        "design": _design(sc, ref_mean), "quick": quick, "provenance": {**_provenance(walls), **(launched or {})},
        "sweep": {label: {f"{lr:g}": {"curve_mean": _iv(endpoints(h, sc.metric)["curve_mean"]),
                                      "curve": _curve(h, sc.metric)}
                          for lr, h in by_lr.items()} for label, by_lr in sweep.items()},
        "chosen_lr": dict(chosen),
        "arms": {label: _arm_summary(comparison[label], chosen[label], sc.metric) for label, *_ in sc.arms},
        "comparisons": comps, "verdicts": verdicts,
    }


def _design(sc: Scenario, ref_mean: float) -> dict:
    from ..tasks import get_task

    task = get_task(sc.profile.task, **dict(sc.profile.task_kwargs))
    n_test = int(getattr(task, "test_size", 0) or len(task.test_set()))
    cfg = sc.profile.config
    return {"base": sc.profile.base, "task": sc.profile.task, "task_kwargs": dict(sc.profile.task_kwargs),
            "steps": sc.profile.steps, "eval_every": cfg.eval_every, "prompts_per_step": cfg.prompts_per_step,
            "group_size": cfg.group_size, "minibatches": cfg.minibatches, "lrs": list(sc.lrs),
            "sweep_seeds": list(sc.sweep_seeds), "seeds": list(sc.seeds), "endpoint": sc.endpoint,
            "metric": sc.metric, "endpoint_text": f"mean greedy {sc.metric} over the evaluations after step 0 "
                                                  "(chosen before the runs)",
            "test_size": n_test, "binomial_se_at_reference": stats.binomial_se(min(max(ref_mean, 0.0), 1.0), n_test),
            "arms": {label: algo.describe() for label, algo, _ in sc.arms},
            "arm_overrides": {label: over for label, _, over in sc.arms if over}, "reference": sc.reference,
            "bonferroni": f"each comparison at 1 - 0.05 / m, m = {len(_pairs(sc))}"}


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _rules_commit() -> str | None:
    return _git("log", "-1", "--format=%H", "--", "grpo_lab/lab/regime.py")


def _provenance(walls: Mapping[str, float]) -> dict:
    import torch

    from ..experiments.results import processor_name

    return {"git_sha": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain", "--", "grpo_lab")),
            "rules_commit": _rules_commit(),
            "date": time.strftime("%Y-%m-%d"), "machine": processor_name(), "python": platform.python_version(),
            "torch": torch.__version__, "wall_seconds": {k: round(float(v), 1) for k, v in walls.items()}}


# ------------------------------------------------------------------------------------------------ reading
def results_path(name: str) -> Path:
    """``benchmarks/results/scenario_<name>.json`` of a source checkout."""
    return REPO_ROOT / "benchmarks" / "results" / f"scenario_{name}.json"


def load_scenario(name: str) -> dict:
    """The committed results of scenario ``name`` (:func:`analyse`'s dict).

    Raises:
        FileNotFoundError: no results file (the message gives the command that writes it).
    """
    path = results_path(name)
    if not path.is_file():
        raise FileNotFoundError(f"no results for scenario {name!r} at {path}; run: python benchmarks/scenarios.py {name}")
    return json.loads(path.read_text())


def _fmt_iv(d: Mapping, digits: int = 3, signed: bool = False) -> str:
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    return f"{f.format(d['mean'])} [{f.format(d['lo'])}, {f.format(d['hi'])}]"


def _check_results(results: Any, who: str) -> None:
    if not isinstance(results, Mapping) or not {"design", "arms", "comparisons", "verdicts"} <= set(results):
        raise TypeError(f"{who}: pass a scenario's results (the dict load_scenario(name) returns), got "
                        f"{type(results).__name__}" + (f" {results!r}" if isinstance(results, str) else ""))


def scenario_table(results: Mapping) -> pd.DataFrame:
    """One row per arm: the rate chosen, the primary endpoint (its column named after the scenario's metric: accuracy,
    gold_mean, ...), final and best (mean [95% t]), the paired difference
    to the reference (Bonferroni interval), seconds per step and peak memory (MiB).

    Raises:
        TypeError: ``results`` is not a results dict (e.g. a scenario's name: load it with :func:`load_scenario`)."""
    _check_results(results, "scenario_table")
    ref = results["design"]["reference"]
    metric = results["design"].get("metric", "test_accuracy")
    what = "accuracy" if metric == "test_accuracy" else metric.removeprefix("test_")
    comps = {c["arm"]: c for c in results["comparisons"] if c["against"] == ref}
    rows = []
    for label, a in results["arms"].items():
        c = comps.get(label)
        rows.append({"arm": label, "lr": f"{a['lr']:g}", f"{what} over the curve": _fmt_iv(a["curve_mean"]),
                     "final": _fmt_iv(a["final"]), "best (biased up)": _fmt_iv(a["best"]),
                     f"minus {ref} (Bonferroni)": _fmt_iv(c, signed=True) if c else "reference",
                     "s / step": round(a["step_seconds"], 2), "peak MiB": round(a["peak_mem_mb"])})
    return pd.DataFrame(rows).set_index("arm")


def verdict_table(results: Mapping) -> pd.DataFrame:
    """One row per mechanism: the arms compared, each regime check (✓ / ✗ and the measured statistic), the verdict
    and its reason.

    Raises:
        TypeError: ``results`` is not a results dict (e.g. a scenario's name: load it with :func:`load_scenario`)."""
    _check_results(results, "verdict_table")
    rows = [{"mechanism": v["mechanism"], "compared": f"{v['arm']} vs {v['against']}",
             "regime": "; ".join(("✓ " if c["holds"] else "✗ ") + c["reason"].split(": ", 1)[-1] for c in v["checks"]),
             "verdict": v["verdict"], "reason": v["reason"]} for v in results["verdicts"]]
    return pd.DataFrame(rows).set_index("mechanism")

