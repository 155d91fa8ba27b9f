"""Chapter 8's tables as data: the seed's table checked cell by cell, each branch's verdict, a practitioner's table.

* :data:`SEED_CELLS` / :func:`seed_table`: the seed's five-column table (its §15.4), cell by cell, beside the
  book's record (:data:`grpo_lab.lab.variant_records.RECORDS`), each with a verdict of :data:`SEED_VERDICTS` and its
  source (a paper's bib key and section). The seed's text is not in the repository: the cells are those the expert
  review of chapter 8 quotes (issue 57, items 2-5); the others read :data:`NOT_QUOTED`.
* :data:`BRANCHES` / :func:`load_branch_results` / :func:`branch_table`: each branch of the seed's tree
  (:data:`grpo_lab.lab.decision_tree.SECTION_TREE`) with the scenario that tests it
  (:data:`grpo_lab.lab.scenarios.SCENARIOS`) and the reading of its verdicts; a scenario whose results file is
  absent reads "not run: the branch rests on the paper".
* :func:`relative_costs` / :func:`practitioner_table`: per scenario, what to try first, when to switch, step time
  and peak memory relative to the reference arm (measured), the predicted held state on a GPU (given), what to
  resize; :func:`preflight_table`: the regime rules (:data:`grpo_lab.lab.regime.RULES`) as what to measure in a
  first 50 steps.

Imports :mod:`grpo_lab.lab.scenarios` and :mod:`grpo_lab.lab.regime`; pandas inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from . import regime, scenarios

__all__ = ["SEED_COLUMNS", "SEED_VERDICTS", "NOT_QUOTED", "SEED_CELLS", "seed_table", "Branch", "BRANCHES",
           "READINGS", "load_branch_results", "branch_reading", "branch_table", "relative_costs",
           "practitioner_table", "preflight_table"]

#: The seed table's columns, in its order, and the :class:`~grpo_lab.lab.variant_records.VariantRecord` field of each.
SEED_COLUMNS = {"core innovation": "innovation", "pain point solved": "pain_point", "typical use": "typical_use",
                "representative users": "users"}
#: The verdicts of a seed cell, in order, kept (the papers say it), corrected (the papers say otherwise, the book's
#: cell is the correction), unsupported (no source says it) and not quoted (the review does not quote the cell, so
#: the book's record stands alone).
SEED_VERDICTS = ("kept", "corrected", "unsupported", "not quoted")
#: What a cell the review does not quote reads.
NOT_QUOTED = "(not quoted by the review; the seed's text is not in the repository)"

#: ``{(preset, column): (seed's cell as the review quotes it, verdict, source)}``; every other cell is
#: :data:`NOT_QUOTED`. Sources are bib keys of ``book/references.bib`` with the section that settles the cell.
#:
#: :meta hide-value:
SEED_CELLS: Mapping[tuple[str, str], tuple[str, str, str]] = {
    ("GRPO", "pain point solved"): (
        "Critic memory overhead", "kept",
        "shao2024deepseekmath §4.1.1: PPO's value model is 'another model of comparable size as the policy model', "
        "a 'substantial memory and computational burden'"),
    ("DR_GRPO", "pain point solved"): (
        "Length explosion, reward hacking", "corrected",
        "liu2025drgrpo §3.1: a length bias from 1/|o_i| (incorrect answers grow longer) and a difficulty bias from "
        "std(R); 'reward hacking' is not the paper's framing"),
    ("DR_GRPO", "representative users"): (
        "Qwen Internal", "unsupported", "liu2025drgrpo Table 4: the authors' Oat-Zero models; no source names Qwen"),
    ("DAPO", "representative users"): (
        "Byte + Tsinghua", "kept", "yu2025dapo: the authors' affiliations (ByteDance Seed, Tsinghua AIR)"),
    ("GSPO", "representative users"): (
        "Qwen3 full line (235B, Thinking-2507, Coder)", "corrected",
        "zheng2025gspo §1: GSPO contributed to 'the latest Qwen3 models'; no model is named"),
    ("CISPO", "pain point solved"): (
        "Precision alignment (lightning attention, low precision)", "corrected",
        "minimax2025m1 §3.1: the clip drops rare tokens' gradients; the precision mismatch is a separate finding, "
        "fixed by an FP32 LM head (§3.2)"),
    ("VAPO", "representative users"): (
        "Byte Seed (internal training shifted from GRPO to VAPO)", "unsupported",
        "yue2025vapo: ByteDance Seed are the authors; no source reports a shift of its training"),
    ("RPT", "typical use"): (
        "Next-generation base models: L_LM + beta RL (experimental, not yet widely adopted)", "corrected",
        "dong2025rpt Eq. 4: pure RL (GRPO, zero KL, no language-modelling term), from R1-Distill-Qwen-14B, a "
        "reasoning model"),
}


def seed_table(records: Mapping[str, Any], presets: Optional[tuple] = None) -> Any:
    """One row per (preset, column) of the seed's table: the seed's cell, the book's, the verdict and its source.

    Args:
        records: ``{preset: VariantRecord}``, :data:`grpo_lab.lab.variant_records.RECORDS`.
        presets: the rows, in order (default: the presets :data:`SEED_CELLS` names, in the seed's order).

    Returns:
        a ``pandas.DataFrame`` indexed by ``(algorithm, column)`` with string columns ``seed``, ``book``,
        ``verdict`` (one of :data:`SEED_VERDICTS`) and ``source``.

    Raises:
        KeyError: a preset without a record (the message names it).
    """
    import pandas as pd

    order = presets or ("GRPO", "DR_GRPO", "DAPO", "GSPO", "CISPO", "VAPO", "RPT")
    rows = []
    for p in order:
        if p not in records:
            raise KeyError(f"seed_table: no record for {p!r}; records: {sorted(records)}")
        for column, field in SEED_COLUMNS.items():
            book = getattr(records[p], field)
            book = "; ".join(u for u, _ in book) if field == "users" and not isinstance(book, str) else str(book)
            seed, verdict, source = SEED_CELLS.get((p, column), (NOT_QUOTED, "not quoted", "the book's record"))
            rows.append({"algorithm": p, "column": column, "seed": seed, "book": book, "verdict": verdict,
                         "source": source})
    return pd.DataFrame(rows).set_index(["algorithm", "column"])


@dataclass(frozen=True)
class Branch:
    """A branch of the seed's tree and what tests it.

    Attributes:
        path: the answers to it in :data:`grpo_lab.lab.decision_tree.SECTION_TREE`.
        scenario: the key of :data:`grpo_lab.lab.scenarios.SCENARIOS` that tests it, or None (tested by a chapter).
        chapter: the chapter whose glued results bear on it (``"07_rpt"``), or None.
    """

    path: tuple
    scenario: Optional[str]
    chapter: Optional[str] = None


_LC = "Mathematical/Code Reasoning (Long CoT)"
#: The seed tree's branches in its order, each with its scenario (or chapter 7 for RPT).
BRANCHES = (Branch((_LC, "MoE Architecture"), "long_cot_moe"), Branch((_LC, "Dense Model"), "long_cot_dense"),
            Branch((_LC, "Extreme Stability Requirements"), "long_cot_stability"),
            Branch(("General Dialogue Alignment",), "dialogue"), Branch(("Multi-turn Tool Calls / Agents",), "tool_calls"),
            Branch(("Next-Generation Base Models",), None, "07_rpt"))

#: The readings of a branch, from its verdicts (:func:`branch_reading`).
READINGS = ("not run: the branch rests on the paper", "out of regime: the branch rests on the paper",
            "a measurement against an arm of the branch", "supported", "not separated: the branch rests on the paper")


def load_branch_results(names, results_dir: Optional[Path] = None) -> dict:
    """``{name: results dict or None}``: each scenario's results (:func:`grpo_lab.lab.scenarios.load_scenario`), None
    where its file is absent. ``results_dir`` (a folder of ``scenario_<name>.json``) replaces the repository's.

    Raises:
        KeyError: a name that is not a scenario of :data:`grpo_lab.lab.scenarios.SCENARIOS`; TypeError: ``names`` is a
            string.
    """
    import json

    if isinstance(names, str):
        raise TypeError(f"load_branch_results: pass a list of scenario names, not the string {names!r}")
    out = {}
    for name in names:
        if name not in scenarios.SCENARIOS:
            raise KeyError(f"unknown scenario {name!r}; known: {sorted(scenarios.SCENARIOS)}")
        if results_dir is None:
            try:
                out[name] = scenarios.load_scenario(name)
            except FileNotFoundError:
                out[name] = None
        else:
            path = Path(results_dir) / f"scenario_{name}.json"
            out[name] = json.loads(path.read_text()) if path.is_file() else None
    return out


def branch_reading(results: Optional[Mapping]) -> str:
    """The reading of a branch (one of :data:`READINGS`) from its scenario's verdicts: absent results -> not run;
    every verdict not tested -> out of regime; any contradicted -> a measurement against an arm; else any supported
    -> supported; else not separated. Raises TypeError for results without ``verdicts``, ValueError for results with no
    verdict or one not in :data:`grpo_lab.lab.scenarios.VERDICTS`."""
    if results is None:
        return READINGS[0]
    if not isinstance(results, Mapping) or "verdicts" not in results:
        raise TypeError(f"branch_reading: pass a scenario's results or None, got {type(results).__name__}")
    found = [v.get("verdict") for v in results["verdicts"]]
    unknown = sorted({str(v) for v in found if v not in scenarios.VERDICTS})
    if not found or unknown:
        raise ValueError(f"branch_reading: the results hold {'no verdict' if not found else f'unknown verdicts {unknown}'}"
                         f"; a verdict is one of {list(scenarios.VERDICTS)}")
    if all(v == scenarios.VERDICTS[3] for v in found):
        return READINGS[1]
    if "contradicted" in found:
        return READINGS[2]
    return READINGS[3] if "supported" in found else READINGS[4]


def branch_table(results: Mapping[str, Optional[Mapping]], chapter_readings: Mapping[str, str]) -> Any:
    """One row per branch of :data:`BRANCHES`: the seed's answer, what tests it, each verdict and the reading.

    Args:
        results: ``{scenario: results or None}`` (:func:`load_branch_results`).
        chapter_readings: ``{chapter stem: (reading, evidence text)}`` for the branches a chapter tests
            (``{"07_rpt": ("out of regime: ...", "RPT minus base ...")}``).

    Returns:
        a ``pandas.DataFrame`` indexed by the branch (answers joined by ``" > "``) with string columns
        ``tested by``, ``verdicts`` and ``reading``.

    Raises:
        KeyError: a branch's scenario or chapter missing from ``results`` / ``chapter_readings``.
    """
    import pandas as pd

    rows = []
    for b in BRANCHES:
        if b.scenario is not None:
            r = results[b.scenario]
            tested = f"scenario_{b.scenario}.json" + ("" if r is not None else " (absent)")
            verdicts = "; ".join(f"{v['mechanism']}: {v['verdict']}" for v in r["verdicts"]) if r else "none"
            reading = branch_reading(r)
        else:
            reading, verdicts = chapter_readings[b.chapter]
            tested = f"chapter {int(b.chapter[:2])}"
        rows.append({"branch": " > ".join(b.path), "tested by": tested, "verdicts": verdicts, "reading": reading})
    return pd.DataFrame(rows).set_index("branch")


def relative_costs(results: Mapping, arms=None) -> dict:
    """``{arm: (step time ratio, peak memory ratio)}`` against the results' reference arm, from each arm's
    ``step_seconds`` and ``peak_mem_mb`` (the worker's resident set on CPU); ``arms`` (default all) picks some.

    Raises:
        KeyError: an arm not in the results (the message lists them); TypeError: not a results dict, or ``arms`` a
            string.
    """
    if not isinstance(results, Mapping) or "arms" not in results or "design" not in results:
        raise TypeError(f"relative_costs: pass a scenario's results, got {type(results).__name__}")
    ref = results["arms"][results["design"]["reference"]]
    out = {}
    if isinstance(arms, str):
        raise TypeError(f"relative_costs: pass a list of arms, not the string {arms!r}")
    for arm in arms or results["arms"]:
        if arm not in results["arms"]:
            raise KeyError(f"relative_costs: no arm {arm!r}; arms: {list(results['arms'])}")
        a = results["arms"][arm]
        out[arm] = (a["step_seconds"] / ref["step_seconds"], a["peak_mem_mb"] / ref["peak_mem_mb"])
    return out


def practitioner_table(plays: Mapping[str, Mapping[str, str]], results: Mapping[str, Optional[Mapping]],
                       predicted_state: Mapping[str, float]) -> Any:
    """The practitioner's table: per scenario, what to try first, when to switch, costs relative to GRPO, what to
    resize, and the branch's reading.

    Args:
        plays: ``{scenario: {"try first": arm, "switch to": arm or "", "switch when": text, "resize": text}}``;
            the arms are labels of the scenario's results (and presets of ``predicted_state``).
        results: ``{scenario: results or None}``; a None row reads "not run" in the measured columns.
        predicted_state: ``{preset name: held state in GiB}`` from the memory model on a GPU profile, GRPO's
            included.

    Returns:
        a ``pandas.DataFrame`` indexed by scenario: ``try first``, ``switch to``, ``switch when``, ``step time vs
        GRPO`` and ``peak memory vs GRPO`` (measured, ``"arm a.aa×"``), ``held state vs GRPO (GPU, predicted)``,
        ``resize when scaling`` and ``reading`` (:func:`branch_reading`).

    Raises:
        KeyError: GRPO or a played arm missing from ``predicted_state``, or a played arm missing from a
            scenario's results.
    """
    import pandas as pd

    rows = []
    for name, play in plays.items():
        arms = [a for a in (play["try first"], play.get("switch to", "")) if a]
        r = results.get(name)
        if r is not None:
            costs = relative_costs(r, arms)
            step = "; ".join(f"{a} {c[0]:.2f}×" for a, c in costs.items())
            mem = "; ".join(f"{a} {c[1]:.2f}×" for a, c in costs.items())
        else:
            step = mem = "not run"
        state = "; ".join(f"{a} {predicted_state[_preset(a)] / predicted_state['GRPO']:.2f}×" for a in arms)
        rows.append({"scenario": name, "try first": play["try first"], "switch to": play.get("switch to") or "—",
                     "switch when": play["switch when"], "step time vs GRPO": step, "peak memory vs GRPO": mem,
                     "held state vs GRPO (GPU, predicted)": state, "resize when scaling": play["resize"],
                     "reading": branch_reading(r) if name in scenarios.SCENARIOS else play.get("reading", "")})
    return pd.DataFrame(rows).set_index("scenario")


def _preset(arm: str) -> str:
    """The preset an arm label starts with (``"GRPO + Routing Replay"`` -> ``"GRPO"``, ``"Dr.GRPO"`` -> ``"DR_GRPO"``)."""
    head = arm.split(",")[0].split(" + ")[0].strip()
    return {"Dr.GRPO": "DR_GRPO", "KL-Cov": "KL_COV", "Clip-Cov": "CLIP_COV"}.get(head, head)


_WINDOWS = {"late": "mean over steps 26-50, per seed", "run": "mean over steps 1-50", "last": "at step 50"}


def preflight_table() -> Any:
    """The regime rules (:data:`grpo_lab.lab.regime.RULES`) as a pre-flight checklist for a 50-step run of the
    GRPO preset (or of the arm named): what to log, over which steps, the threshold (a heuristic fixed before the
    scenario runs), what it tells you, and the mechanisms whose verdict uses it (from the scenarios).

    Returns:
        a ``pandas.DataFrame`` indexed by rule name: ``measure``, ``over``, ``at least``, ``tells you``,
        ``decides`` and ``paper``.

    Raises nothing.
    """
    import pandas as pd

    uses: dict = {}
    for name in scenarios.SCENARIOS:
        for m in scenarios.SCENARIOS[name].mechanisms:
            for rule, column in m.rules:
                # one name per mechanism across scenarios ("the unbiased normaliser" and "unbiased normaliser")
                key = m.name[4:] if m.name.startswith("the ") else m.name
                uses.setdefault(rule, {}).setdefault(key, column)
    rows = []
    for r in regime.RULES.values():
        cols = sorted({c for c in uses.get(r.name, {}).values() if c})
        measure = r.column or " / ".join(cols) or "the clip's own share"
        limit = f"{r.threshold:.2%}" if r.unit == "%" else f"{r.threshold:g} {r.unit}"
        rows.append({"rule": r.name, "measure": measure, "over": _WINDOWS[r.window], "at least": limit,
                     "tells you": r.acts, "decides": "; ".join(uses.get(r.name, {})) or "—", "paper": r.paper})
    return pd.DataFrame(rows).set_index("rule")
