"""grpo_lab.lab.decision_tree: the section's rule of thumb as a tree, ours where the evidence differs, and the figure.

The section's tree is checked against the quotation typed out here by hand (not read from the module), the
trees' evidence keys against the names the chapters glue (book/_py), and the figure by its artists.
"""

import re
from pathlib import Path

import pytest

from grpo_lab.algo import algorithms as A
from grpo_lab.lab import decision_tree as D
from grpo_lab.lab.decision_tree import CHANGES, OUR_TREE, SECTION_TREE, BranchChange, Leaf, Node

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# The section, typed by hand: "long-CoT math/code: MoE -> GSPO + Dr.GRPO ideas; dense -> VAPO or DAPO; extreme
# stability -> CISPO; general dialogue -> GRPO / PPO; multi-turn tool calls -> DAPO + token-level loss;
# next-generation base models -> RPT".
QUOTED = {
    ("long-CoT math/code", "MoE"): ("GSPO", "DR_GRPO"),
    ("long-CoT math/code", "dense"): ("VAPO", "DAPO"),
    ("extreme stability",): ("CISPO",),
    ("general dialogue",): ("GRPO", "PPO"),
    ("multi-turn tool calls",): ("DAPO",),
    ("next-generation base models",): ("RPT",),
}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _leaf(**kw):
    args = dict(presets=("GRPO",), chapters=("01_grpo",), evidence=(), note="A note.")
    args.update(kw)
    return Leaf(**args)


# ------------------------------------------------------------------------------------- the data types
def test_a_leaf_with_an_unknown_preset_raises_naming_it():
    with pytest.raises(ValueError, match="'GRPO_PLUS'"):
        _leaf(presets=("GSPO", "GRPO_PLUS"))
    with pytest.raises(ValueError, match="'get_algorithm'"):  # a function of the module, not a preset
        _leaf(presets=("get_algorithm",))
    with pytest.raises(ValueError, match="must not be empty"):
        _leaf(presets=())
    assert _leaf(presets=["GSPO", "DR_GRPO"]).presets == ("GSPO", "DR_GRPO")  # a list is stored as a tuple


@pytest.mark.parametrize("kw, message", [
    (dict(chapters=("09_future",)), "unknown chapter '09_future'"),
    (dict(chapters=()), "must not be empty"),
    (dict(evidence=("gspo_route_last",)), "not '<chapter stem>:<glued name>'"),
    (dict(evidence=("09_future:x",)), "not '<chapter stem>:<glued name>'"),
    (dict(note="  "), "note"),
    (dict(presets=("GRPO", "GRPO")), "twice"),
    (dict(alternatives=True), "two presets"),
    (dict(presets=("GRPO", "PPO"), alternatives="yes"), "bool"),
    (dict(quote="  "), "quote"),
])
def test_a_leaf_checks_its_fields(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _leaf(**kw)


def test_a_planned_chapter_may_be_named():
    assert _leaf(chapters=("08_choosing",)).chapters == ("08_choosing",)


def test_a_node_refuses_empty_questions_duplicate_answers_and_empty_branches():
    a, b = _leaf(), _leaf(presets=("DAPO",), chapters=("02_dapo",))
    with pytest.raises(ValueError, match="question"):
        Node("", {"x": a, "y": b})
    with pytest.raises(ValueError, match="'x' is given twice"):
        Node("Q?", [("x", a), ("x", b)])
    with pytest.raises(ValueError, match="at least two"):
        Node("Q?", {})
    with pytest.raises(ValueError, match="at least two"):
        Node("Q?", {"x": a})
    with pytest.raises(ValueError, match="answer must be a non-empty string"):
        Node("Q?", {"": a, "y": b})
    with pytest.raises(ValueError, match="Node or a Leaf"):
        Node("Q?", {"x": a, "y": "GRPO"})
    node = Node("Q?", {"x": a, "y": b})
    assert node.answers == ("x", "y") and node.child("y") is b and node == Node("Q?", [("x", a), ("y", b)])
    with pytest.raises(ValueError, match="'z' is not an answer"):
        node.child("z")


def test_leaf_label_and_axes():
    leaf = _leaf(presets=("GSPO", "DR_GRPO"), chapters=("04_gspo", "03_dr_grpo"))
    assert leaf.label() == "GSPO + Dr.GRPO\nch. 4, 3"
    quoted = _leaf(presets=("GSPO", "DR_GRPO"), chapters=("04_gspo", "03_dr_grpo"), quote="GSPO + Dr.GRPO ideas")
    assert quoted.label() == "GSPO + Dr.GRPO ideas\nch. 4, 3" and quoted.presets_text() == "GSPO + Dr.GRPO"
    # the section's tree shows its leaves as quoted
    assert D.subtree(SECTION_TREE, ("long-CoT math/code", "MoE")).label().startswith("GSPO + Dr.GRPO ideas\n")
    assert D.subtree(SECTION_TREE, ("multi-turn tool calls",)).label().startswith("DAPO + token-level loss\n")
    assert _leaf(presets=("VAPO", "DAPO"), chapters=("06_vapo",), alternatives=True).presets_text() == "VAPO or DAPO"
    # by hand from the presets: GSPO sets ratio_level, eps_low/eps_high, kl/beta; Dr.GRPO advantage, aggregation, kl
    assert leaf.changed_axes() == {"GSPO": ("ratio level", "clipping", "regulariser"),
                                   "DR_GRPO": ("advantage", "aggregation", "regulariser")}
    assert _leaf().changed_axes() == {"GRPO": ()}
    assert leaf.algorithms() == (A.GSPO, A.DR_GRPO)


# -------------------------------------------------------------------------------------- the section
def test_the_section_tree_is_the_quotation():
    found = {path: leaf.presets for path, leaf in D.leaves(SECTION_TREE)}
    assert found == QUOTED
    assert list(found) == list(QUOTED)  # in the section's order
    assert SECTION_TREE.answers == ("long-CoT math/code", "extreme stability", "general dialogue",
                                    "multi-turn tool calls", "next-generation base models")
    assert D.subtree(SECTION_TREE, ("long-CoT math/code",)).answers == ("MoE", "dense")
    # "VAPO or DAPO" and "GRPO / PPO" are alternatives; "GSPO + Dr.GRPO ideas" one recipe
    kinds = {p: leaf.alternatives for p, leaf in D.leaves(SECTION_TREE)}
    assert [p for p, alt in kinds.items() if alt] == [("long-CoT math/code", "dense"), ("general dialogue",)]


def test_dapo_plus_token_level_loss_is_the_dapo_preset():
    tools = D.subtree(SECTION_TREE, ("multi-turn tool calls",))
    assert tools.presets == ("DAPO",)
    # DAPO's loss is token-level already (Eq. 12): the note may say so only while the preset does
    assert A.DAPO.aggregation in ("group_token_mean", "token_mean")
    assert "token-level already" in tools.note


def test_every_leaf_names_existing_presets_and_the_chapters_that_cover_them():
    from grpo_lab.lab.variant_records import RECORDS

    for tree in (SECTION_TREE, OUR_TREE):
        for path, leaf in D.leaves(tree):
            for p in leaf.presets:
                assert isinstance(getattr(A, p), A.Algorithm), (path, p)
                chapter = RECORDS[p].chapter if p in RECORDS else None
                assert chapter is None or chapter in leaf.chapters, (path, p, chapter)
            for stem in leaf.chapters:
                assert (ROOT / "book" / f"{stem}.ipynb").is_file(), (path, stem)


def test_every_evidence_key_is_a_name_its_chapter_glues():
    keys = {k for tree in (SECTION_TREE, OUR_TREE) for _, leaf in D.leaves(tree) for k in leaf.evidence}
    assert len(keys) >= 10
    for key in sorted(keys):
        stem, name = key.split(":")
        src = (ROOT / "book" / "_py" / f"{stem}.py").read_text(encoding="utf-8")
        assert f'book.glue("{name}"' in src, f"{key}: chapter {stem} glues no {name!r}"


# ----------------------------------------------------------------------------------- ours, and why
def test_the_diff_is_exactly_the_changes():
    diff = D.diff_trees(SECTION_TREE, OUR_TREE)
    assert [d.path for d in diff] == list(CHANGES)  # every changed branch has its reason, and no reason is idle
    assert len(diff) == 4
    for d in diff:
        assert d.old == D.subtree(SECTION_TREE, d.path) and d.new == D.subtree(OUR_TREE, d.path)
        assert CHANGES[d.path].path == d.path


def test_unchanged_branches_are_the_sections_own_leaves():
    changed = set(CHANGES)
    for path, leaf in D.leaves(SECTION_TREE):
        if path not in changed:
            assert D.subtree(OUR_TREE, path) is leaf


def test_every_reason_cites_papers_md_or_a_chapter_section():
    source = re.compile(r"papers\.md §\d+|0[1-8]_[a-z_]+ §\d+\.\d+")
    for path, change in CHANGES.items():
        assert change.sources and all(source.fullmatch(s) for s in change.sources), path
        # the reason cites exactly its sources: each one in its text, and nothing it cites left out
        assert set(source.findall(change.reason)) == set(change.sources), path
        assert any(s.startswith("papers.md") for s in change.sources), path


def test_reasons_say_not_tested_where_our_experiments_could_not_test_the_claim():
    # chapters 4 (MoE routing), 6 (the critic) and 7 (reasoning) were outside the papers' regimes
    for path in [("long-CoT math/code", "MoE"), ("long-CoT math/code", "dense"), ("next-generation base models",)]:
        assert "not tested in the paper's regime" in CHANGES[path].reason, path
    assert "refut" not in CHANGES[("long-CoT math/code", "MoE")].reason
    # chapter 5's verdicts (the rare tokens of §5.4, the speed of §5.5) are quoted beside the leaves from its
    # notebook, not restated in the reason: the reason names what was measured, the leaves carry the outcome
    stability = CHANGES[("extreme stability",)].reason
    assert "quoted beside the leaves" in stability
    assert not any(w in stability for w in ("not tested", "ended more probable", "excludes zero"))
    leaves_ = dict(D.leaves(OUR_TREE))
    quoted = {k for path, leaf in leaves_.items() if path[0] == "extreme stability" for k in leaf.evidence}
    assert {"05_cispo:cispo_rare_verdict", "05_cispo:cispo_speed_verdict"} <= quoted


def test_a_change_needs_a_source_of_a_known_kind():
    with pytest.raises(ValueError, match="names neither"):
        BranchChange(path=("x",), what="w", reason="r", sources=("a blog post",))
    with pytest.raises(ValueError, match="names neither"):
        BranchChange(path=("x",), what="w", reason="r", sources=("09_future §9.1",))
    with pytest.raises(ValueError, match="must not be empty"):
        BranchChange(path=("x",), what="w", reason="r", sources=())
    assert BranchChange(path=("x",), what="w", reason="r", sources=("papers.md §4", "04_gspo §4.3")).sources


def test_diff_trees_reports_each_kind_of_change():
    a, b = _leaf(), _leaf(presets=("DAPO",), chapters=("02_dapo",))
    c = _leaf(presets=("CISPO",), chapters=("05_cispo",))
    t1 = Node("Q?", {"x": a, "y": b})
    assert D.diff_trees(t1, t1) == ()
    assert D.diff_trees(t1, Node("Q?", {"x": a, "y": c})) == ((("y",), b, c),)
    assert D.diff_trees(t1, Node("Q?", {"x": a, "z": c})) == ((("y",), b, None), (("z",), None, c))
    sub = Node("R?", {"u": b, "v": c})
    assert D.diff_trees(t1, Node("Q?", {"x": a, "y": sub})) == ((("y",), b, sub),)
    assert D.diff_trees(t1, Node("Other?", {"x": a, "y": b})) == (((), t1, Node("Other?", {"x": a, "y": b})),)
    assert D.diff_trees(t1, Node("Q?", {"x": _leaf(note="Another note."), "y": b}))[0].path == ("x",)
    with pytest.raises(ValueError, match="Node or a Leaf"):
        D.diff_trees(t1, {"x": a})


# ------------------------------------------------------------------------------- walking and tabulating
def test_leaves_and_subtree():
    assert [p for p, _ in D.leaves(OUR_TREE)][:3] == [
        ("long-CoT math/code", "MoE"), ("long-CoT math/code", "dense", "yes"),
        ("long-CoT math/code", "dense", "no, or not measured")]
    assert list(D.leaves(_leaf())) == [((), _leaf())]
    assert D.subtree(OUR_TREE, ()) is OUR_TREE
    with pytest.raises(ValueError, match="past a leaf"):
        D.subtree(OUR_TREE, ("general dialogue", "more"))
    with pytest.raises(ValueError, match="not an answer"):
        D.subtree(OUR_TREE, ("poetry",))


def test_tree_table():
    table = D.tree_table(OUR_TREE)
    assert tuple(table.columns) == D.TABLE_COLUMNS == ("path", "presets", "chapters", "evidence", "axes vs GRPO",
                                                       "note")
    assert len(table) == len(list(D.leaves(OUR_TREE))) == 8
    row = table.set_index("path").loc["long-CoT math/code > MoE"]
    assert row["presets"] == "GSPO" and row["chapters"] == "04_gspo, 03_dr_grpo"
    assert row["axes vs GRPO"] == "GSPO: ratio level, clipping, regulariser"
    dialogue = table.set_index("path").loc["general dialogue"]
    assert dialogue["presets"] == "GRPO or PPO" and dialogue["evidence"] == "none in this book"
    assert dialogue["axes vs GRPO"].startswith("GRPO: none; PPO: advantage")
    assert (table.map(lambda v: isinstance(v, str) and bool(v.strip()))).all().all()


# ------------------------------------------------------------------------------------------ the figure
def _texts(fig, prefix):
    return [t for ax in fig.axes for t in ax.texts if (t.get_gid() or "").startswith(prefix)]


@pytest.mark.parametrize("tree", [SECTION_TREE, OUR_TREE], ids=["section", "ours"])
def test_the_figure_has_one_text_per_node_and_every_leaf_label(tree):
    fig = D.plot_tree(tree)
    assert isinstance(fig, matplotlib.figure.Figure)
    elements = list(D._walk(tree))
    nodes = _texts(fig, "node:")
    assert len(nodes) == len(elements)
    shown = [t.get_text() for t in nodes]
    for _, leaf in D.leaves(tree):
        assert leaf.label() in shown
    answers = _texts(fig, "answer:")
    assert len(answers) == len(elements) - 1  # one answer per edge
    assert fig.get_figwidth() <= 9.0  # the book's width: legible without shrinking to nothing
    # no two boxes overlap (the layout computed by the module, measured by the renderer)
    fig.canvas.draw()
    boxes = [t.get_bbox_patch().get_window_extent() for t in nodes]
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not boxes[i].overlaps(boxes[j]), (shown[i], shown[j])
    # every text inside the figure
    width, height = fig.bbox.width, fig.bbox.height
    for t in nodes + answers:
        e = t.get_window_extent()
        assert e.x0 >= 0 and e.x1 <= width + 1 and e.y0 >= -1 and e.y1 <= height + 1, t.get_text()


def test_leaf_boxes_carry_the_book_colours_and_changes_are_shaded():
    from grpo_lab.experiments.plotting import ALGO_COLORS

    fig = D.plot_tree(OUR_TREE, highlight=CHANGES)
    by_gid = {t.get_gid(): t for t in _texts(fig, "node:")}
    gspo = by_gid["node:long-CoT math/code > MoE"].get_bbox_patch()
    assert matplotlib.colors.to_hex(gspo.get_edgecolor()) == ALGO_COLORS["GSPO"]
    shaded = {g for g, t in by_gid.items() if matplotlib.colors.to_hex(t.get_bbox_patch().get_facecolor())
              == D._MARK_FACE}
    # the changed leaves, and everything under a changed branch; nothing else
    assert "node:general dialogue" not in shaded and "node:(root)" not in shaded
    assert {"node:long-CoT math/code > MoE", "node:long-CoT math/code > dense",
            "node:long-CoT math/code > dense > yes", "node:extreme stability > no",
            "node:next-generation base models"} <= shaded
    assert len(shaded) == 8  # MoE, dense + 2, stability + 2, RPT
    assert _texts(fig, "legend")
    assert not _texts(D.plot_tree(SECTION_TREE), "legend")


def test_plot_tree_checks_highlight_and_draws_into_a_given_axes():
    with pytest.raises(ValueError, match="not a path of the tree"):
        D.plot_tree(OUR_TREE, highlight={("poetry",)})
    with pytest.raises(ValueError, match="collection of paths"):
        D.plot_tree(OUR_TREE, highlight="general dialogue")
    fig = plt.figure(figsize=(9, 5))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))  # 9 x 5 inches: the section's tree needs about 8 x 4.1
    assert D.plot_tree(SECTION_TREE, ax=ax) is fig
    assert len(_texts(fig, "node:")) == len(list(D._walk(SECTION_TREE)))
    # an Axes too small for the tree would cut its lines off at the edges (as a 2 x 1 grid of subplots did): refused
    small, axes = plt.subplots(2, 1, figsize=(9, 6))
    with pytest.raises(ValueError, match=r"the Axes is .* inches, this tree needs"):
        D.plot_tree(OUR_TREE, ax=axes[1])
    assert not axes[1].texts and axes[1].axison  # nothing left drawn on the refused Axes
    with pytest.raises(ValueError, match="tuple of answers, got the string"):
        D.subtree(OUR_TREE, "general dialogue")
    plt.close(small)
