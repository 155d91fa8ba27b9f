"""grpo_lab.lab.choosing_tables: the seed's table with verdicts, the branches' readings, the practitioner's table.

The scenario results here are small dicts written by hand (two arms, hand-picked step times and memory), so every
expected ratio is worked out by hand in the comment beside it; the present/absent branch of a scenario file is
tested with a temporary results folder and with a monkeypatched results path.
"""

import json
from pathlib import Path

import pytest

from grpo_lab.lab import choosing_tables as C
from grpo_lab.lab import decision_tree as D
from grpo_lab.lab import scenarios
from grpo_lab.lab.variant_records import RECORDS

pd = pytest.importorskip("pandas")


def _results(verdicts, grpo=(2.0, 800.0), other=("DAPO", 3.0, 1000.0)):
    """A minimal results dict: GRPO the reference and one other arm, with the given verdicts."""
    name, secs, mem = other
    return {"design": {"reference": "GRPO"}, "arms": {"GRPO": {"step_seconds": grpo[0], "peak_mem_mb": grpo[1]},
                                                      name: {"step_seconds": secs, "peak_mem_mb": mem}},
            "comparisons": [], "verdicts": [{"mechanism": f"m{i}", "verdict": v} for i, v in enumerate(verdicts)]}


def test_the_branches_are_the_seed_trees_leaves_and_scenarios():
    assert [b.path for b in C.BRANCHES] == [p for p, _ in D.leaves(D.SECTION_TREE)]
    named = {b.scenario for b in C.BRANCHES if b.scenario}
    assert named == set(scenarios.SCENARIOS)  # every scenario tests one branch, every branch but RPT has one
    for b in C.BRANCHES:
        if b.scenario:  # the scenario's own branch path ends with the same answer, up to case
            assert scenarios.SCENARIOS[b.scenario].branch[-1].lower().split(" /")[0] in b.path[-1].lower()


@pytest.mark.parametrize("verdicts, reading", [
    (["not tested in the paper's regime"] * 2, C.READINGS[1]),
    (["not tested in the paper's regime", "contradicted"], C.READINGS[2]),
    (["supported", "not separated"], C.READINGS[3]),
    (["not separated", "not tested in the paper's regime"], C.READINGS[4]),
])
def test_branch_reading(verdicts, reading):
    assert C.branch_reading(_results(verdicts)) == reading


def test_branch_reading_of_an_absent_file_and_bad_input():
    assert C.branch_reading(None) == "not run: the branch rests on the paper"
    with pytest.raises(TypeError, match="scenario's results or None"):
        C.branch_reading("dialogue")
    with pytest.raises(ValueError, match="no verdict"):
        C.branch_reading(_results([]))
    with pytest.raises(ValueError, match="unknown verdicts \\['bogus'\\]"):
        C.branch_reading(_results(["bogus"]))


def test_load_branch_results_reads_a_folder_present_or_absent(tmp_path):
    (tmp_path / "scenario_dialogue.json").write_text(json.dumps(_results(["contradicted"])))
    found = C.load_branch_results(["dialogue", "long_cot_stability"], results_dir=tmp_path)
    assert found["long_cot_stability"] is None and found["dialogue"]["verdicts"][0]["verdict"] == "contradicted"
    with pytest.raises(KeyError, match="unknown scenario"):
        C.load_branch_results(["poetry"], results_dir=tmp_path)
    with pytest.raises(TypeError, match="not the string 'dialogue'"):
        C.load_branch_results("dialogue", results_dir=tmp_path)


def test_load_branch_results_goes_through_load_scenario(tmp_path, monkeypatch):
    # the repository's path replaced: a file that lands later is read by re-running, with no code change
    monkeypatch.setattr(scenarios, "results_path", lambda name: tmp_path / f"scenario_{name}.json")
    assert C.load_branch_results(["long_cot_dense"]) == {"long_cot_dense": None}
    (tmp_path / "scenario_long_cot_dense.json").write_text(json.dumps(_results(["supported"])))
    table = C.branch_table(C.load_branch_results([b.scenario for b in C.BRANCHES if b.scenario]),
                           {"07_rpt": ("out of regime: the branch rests on the paper", "RPT minus base")})
    dense = table.loc["Mathematical/Code Reasoning (Long CoT) > Dense Model"]
    assert dense["reading"] == "supported" and dense["verdicts"] == "m0: supported"
    stability = table.loc["Mathematical/Code Reasoning (Long CoT) > Extreme Stability Requirements"]
    assert stability["reading"] == C.READINGS[0] and stability["tested by"].endswith("(absent)")
    assert table.loc["Next-Generation Base Models", "tested by"] == "chapter 7"


def test_relative_costs_by_hand():
    # DAPO 3.0 s against GRPO's 2.0 s: 1.5x; 1000 MiB against 800: 1.25x
    assert C.relative_costs(_results([])) == {"GRPO": (1.0, 1.0), "DAPO": (1.5, 1.25)}
    with pytest.raises(KeyError, match="no arm 'VAPO'"):
        C.relative_costs(_results([]), ["VAPO"])
    with pytest.raises(TypeError):
        C.relative_costs({"arms": {}})
    with pytest.raises(TypeError, match="not the string 'DAPO'"):
        C.relative_costs(_results([]), "DAPO")


def test_practitioner_table_by_hand():
    plays = {"tool_calls": {"try first": "DAPO", "switch to": "", "switch when": "w", "resize": "r"},
             "long_cot_stability": {"try first": "DAPO", "switch to": "CISPO", "switch when": "w", "resize": "r"}}
    predicted = {"GRPO": 8.0, "DAPO": 6.0, "CISPO": 6.0}  # GiB: DAPO 6 / 8 = 0.75x
    table = C.practitioner_table(plays, {"tool_calls": _results(["not separated"]), "long_cot_stability": None},
                                 predicted)
    row = table.loc["tool_calls"]
    assert row["step time vs GRPO"] == "DAPO 1.50×" and row["peak memory vs GRPO"] == "DAPO 1.25×"
    assert row["held state vs GRPO (GPU, predicted)"] == "DAPO 0.75×" and row["switch to"] == "—"
    assert row["reading"] == C.READINGS[4]
    absent = table.loc["long_cot_stability"]
    assert absent["step time vs GRPO"] == "not run" and absent["reading"] == C.READINGS[0]
    assert absent["held state vs GRPO (GPU, predicted)"] == "DAPO 0.75×; CISPO 0.75×"
    with pytest.raises(KeyError):
        C.practitioner_table({"tool_calls": dict(plays["tool_calls"], **{"try first": "VAPO"})},
                             {"tool_calls": None}, predicted)


def test_seed_table_cells_verdicts_and_sources():
    table = C.seed_table(RECORDS)
    assert len(table) == 7 * 4 and set(table["verdict"]) <= set(C.SEED_VERDICTS)
    grpo = table.loc[("GRPO", "pain point solved")]
    assert grpo["seed"] == "Critic memory overhead" and grpo["verdict"] == "kept" and "§4.1.1" in grpo["source"]
    assert "§4.1.1" in grpo["book"]  # the book's cell says it too now (review item 3)
    assert table.loc[("DR_GRPO", "representative users"), "verdict"] == "unsupported"
    quoted = table[table["verdict"] != "not quoted"]
    assert len(quoted) == len(C.SEED_CELLS) and (table.loc[table["verdict"] == "not quoted", "seed"] == C.NOT_QUOTED).all()
    keys = (Path(__file__).resolve().parents[2] / "book" / "references.bib").read_text(encoding="utf-8")
    for source in quoted["source"]:
        assert f"{{{source.split()[0].rstrip(':')}," in keys, source
    with pytest.raises(KeyError, match="no record for 'NOPE'"):
        C.seed_table(RECORDS, ("NOPE",))


def test_preflight_table_covers_every_rule():
    from grpo_lab.lab import regime

    table = C.preflight_table()
    assert list(table.index) == list(regime.RULES)
    assert table.loc["tied_groups", "measure"] == "zero_adv_group_frac" and table.loc["tied_groups", "at least"] == "1.00%"
    assert "dynamic sampling" in table.loc["tied_groups", "decides"]
    decides = table.loc["length_spread", "decides"].split("; ")
    assert len(decides) == len(set(decides)) and "the unbiased normaliser (Dr.GRPO §3.2)" not in decides
    assert table.loc["long_responses", "at least"] == "100 tokens" and table.loc["long_responses", "over"] == "at step 50"
