"""grpo_lab.lab.decision_tree: the seed's tree as written, ours where a measurement differs, and the figure.

The seed's tree is checked against its text (SEED_TREE_TEXT, parsed here line by line) and against the shape
the review quotes, typed here by hand; the trees' evidence keys against the names the chapters glue (book/_py),
and the figure by its artists.
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

LC = "Mathematical/Code Reasoning (Long CoT)"
# The seed's shape, typed by hand from the review (issue 57, item 1): root "Task Type?" with four answers; the
# long-CoT node has three children (MoE, dense, extreme stability), each leaf the presets it names.
QUOTED = {
    (LC, "MoE Architecture"): ("GSPO", "DR_GRPO"),
    (LC, "Dense Model"): ("DAPO", "VAPO"),
    (LC, "Extreme Stability Requirements"): ("CISPO",),
    ("General Dialogue Alignment",): ("GRPO", "PPO"),
    ("Multi-turn Tool Calls / Agents",): ("DAPO",),
    ("Next-Generation Base Models",): ("RPT",),
}


def _parse_seed(text):
    """The seed's tree text -> (root question, {path: leaf text}), from its box-drawing indentation."""
    lines = text.rstrip("\n").split("\n")
    leaves, stack = {}, []
    for line in lines[1:]:
        m = re.fullmatch(r"((?:│   |    )*)[├└]── (.+)", line)
        assert m, line
        depth = len(m.group(1)) // 4
        answer, _, leaf = m.group(2).partition(" → ")
        stack = stack[:depth] + [answer]
        if leaf:
            leaves[tuple(stack)] = leaf
    return lines[0], leaves


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
    # the seed's tree shows its leaves as written
    assert D.subtree(SECTION_TREE, (LC, "MoE Architecture")).label().startswith("GSPO + Dr.GRPO ideas\n")
    assert D.subtree(SECTION_TREE, ("Multi-turn Tool Calls / Agents",)).label().startswith("DAPO + Token-level Loss\n")
    assert _leaf(presets=("VAPO", "DAPO"), chapters=("06_vapo",), alternatives=True).presets_text() == "VAPO or DAPO"
    # by hand from the presets: GSPO sets ratio_level, eps_low/eps_high, kl/beta; Dr.GRPO advantage, aggregation, kl
    assert leaf.changed_axes() == {"GSPO": ("ratio level", "clipping", "regulariser"),
                                   "DR_GRPO": ("advantage", "aggregation", "regulariser")}
    assert _leaf().changed_axes() == {"GRPO": ()}
    assert leaf.algorithms() == (A.GSPO, A.DR_GRPO)


# -------------------------------------------------------------------------------------- the section
def test_the_section_tree_is_the_seeds_text():
    root, written = _parse_seed(D.SEED_TREE_TEXT)
    assert SECTION_TREE.question == root == "Task Type?"
    found = {path: leaf.quote or leaf.presets_text() for path, leaf in D.leaves(SECTION_TREE)}
    assert found == written and list(found) == list(written)  # every leaf as written, in the seed's order
    # the qualifiers the first edition dropped (review item 1)
    assert written[("General Dialogue Alignment",)].endswith("(Basic Enough)")
    assert written[("Next-Generation Base Models",)] == "RPT (Experimental)"
    assert "not absolute" in D.SEED_CAVEAT and "VAPO's value model" in D.SEED_CAVEAT
    assert "checklist of what to consider first" in D.SEED_CAVEAT


def test_the_section_tree_has_the_reviews_shape():
    found = {path: leaf.presets for path, leaf in D.leaves(SECTION_TREE)}
    assert found == QUOTED
    assert list(found) == list(QUOTED)  # in the seed's order
    assert SECTION_TREE.answers == (LC, "General Dialogue Alignment", "Multi-turn Tool Calls / Agents",
                                    "Next-Generation Base Models")
    # extreme stability is the long-CoT node's third child, not a root answer
    assert D.subtree(SECTION_TREE, (LC,)).answers == ("MoE Architecture", "Dense Model",
                                                      "Extreme Stability Requirements")
    # "DAPO / VAPO" and "GRPO / PPO" are alternatives; "GSPO + Dr.GRPO ideas" one recipe
    kinds = {p: leaf.alternatives for p, leaf in D.leaves(SECTION_TREE)}
    assert [p for p, alt in kinds.items() if alt] == [(LC, "Dense Model"), ("General Dialogue Alignment",)]


def test_dapo_plus_token_level_loss_is_the_dapo_preset():
    tools = D.subtree(SECTION_TREE, ("Multi-turn Tool Calls / Agents",))
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
        if f'book.glue("{name}"' not in src:  # glued under a computed name (a loop): read it from the notebook
            from grpo_lab.lab import book

            assert f'"{name}"' in src and book.glued(stem, name), f"{key}: chapter {stem} glues no {name!r}"


# ----------------------------------------------------------------------------------- ours, and why
def test_the_diff_is_exactly_the_changes():
    diff = D.diff_trees(SECTION_TREE, OUR_TREE)
    assert [d.path for d in diff] == list(CHANGES)  # every changed branch has its reason, and no reason is idle
    assert len(diff) == 2
    for d in diff:
        assert d.old == D.subtree(SECTION_TREE, d.path) and d.new == D.subtree(OUR_TREE, d.path)
        assert CHANGES[d.path].path == d.path


def test_unchanged_branches_are_the_sections_own_leaves():
    changed = set(CHANGES)
    for path, leaf in D.leaves(SECTION_TREE):
        if path not in changed:
            assert D.subtree(OUR_TREE, path) is leaf


def test_every_reason_cites_a_measurement_and_existing_sources():
    bib = (ROOT / "book" / "references.bib").read_text(encoding="utf-8")
    from grpo_lab.lab.scenarios import SCENARIOS

    chapter = re.compile(r"0[1-8]_[a-z_]+ §\d+\.\d+")
    for path, change in CHANGES.items():
        measured = [s for s in change.sources if chapter.fullmatch(s) or s.startswith("scenario_")]
        assert measured, f"{path}: a change needs a measurement (a chapter section or a scenario file)"
        for src in change.sources:
            if src.startswith("scenario_"):
                assert src.removeprefix("scenario_").removesuffix(".json") in SCENARIOS, src
                assert (ROOT / "benchmarks" / "results" / src).is_file(), src
            elif not chapter.fullmatch(src):
                assert f"{{{src.split()[0]}," in bib, f"{src}: not a key of book/references.bib"
            assert src in change.reason or src.startswith("scenario_"), (path, src)  # cited in the reason's text
        assert "papers.md" not in change.reason  # the reader cannot open papers.md (review item 6)


def test_the_branches_the_measurements_do_not_support_are_the_seeds():
    # review items 7-10: no change on the strength of a paper alone; the MoE, stability, tools and RPT leaves stay
    for path in [(LC, "MoE Architecture"), (LC, "Extreme Stability Requirements"), ("Multi-turn Tool Calls / Agents",),
                 ("Next-Generation Base Models",)]:
        assert D.subtree(OUR_TREE, path) is D.subtree(SECTION_TREE, path), path
    # chapter 5's contrary outcome at 16 updates per batch is among the stability leaf's evidence (item 7)
    stability = D.subtree(OUR_TREE, (LC, "Extreme Stability Requirements"))
    assert {"05_cispo:cispo_final_diff", "05_cispo:cispo_steps_ratio", "05_cispo:cispo_speed_verdict"} <= set(
        stability.evidence)
    assert "barely acts" not in " ".join(leaf.note for _, leaf in D.leaves(OUR_TREE))  # item 8
    # the dense default's reason is cost, and the book's outcome data are beside it (item 9)
    dense = CHANGES[(LC, "Dense Model")].reason
    assert "Cost, measured" in dense and "no penalty for VAPO" in dense and "probe" in dense


def test_a_change_needs_a_source_of_a_known_kind():
    for bad in ("a blog post", "09_future §9.1", "papers.md §4", "scenario_x.csv"):
        with pytest.raises(ValueError, match="is neither"):
            BranchChange(path=("x",), what="w", reason="r", sources=(bad,))
    with pytest.raises(ValueError, match="must not be empty"):
        BranchChange(path=("x",), what="w", reason="r", sources=())
    ok = ("zheng2025gspo §5.3", "yue2025vapo Table 1", "04_gspo §4.3", "scenario_dialogue.json")
    assert BranchChange(path=("x",), what="w", reason="r", sources=ok).sources == ok


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
    assert [p for p, _ in D.leaves(OUR_TREE)][:4] == [
        (LC, "MoE Architecture"), (LC, "Dense Model", "yes, both"), (LC, "Dense Model", "no, or not measured"),
        (LC, "Extreme Stability Requirements")]
    assert list(D.leaves(_leaf())) == [((), _leaf())]
    assert D.subtree(OUR_TREE, ()) is OUR_TREE
    with pytest.raises(ValueError, match="past a leaf"):
        D.subtree(OUR_TREE, ("General Dialogue Alignment", "more"))
    with pytest.raises(ValueError, match="not an answer"):
        D.subtree(OUR_TREE, ("poetry",))


def test_tree_table():
    table = D.tree_table(OUR_TREE)
    assert tuple(table.columns) == D.TABLE_COLUMNS == ("path", "presets", "chapters", "evidence", "axes vs GRPO",
                                                       "note")
    assert len(table) == len(list(D.leaves(OUR_TREE))) == 7
    row = table.set_index("path").loc[f"{LC} > MoE Architecture"]
    assert row["presets"] == "GSPO + Dr.GRPO" and row["chapters"] == "04_gspo, 03_dr_grpo"
    assert row["axes vs GRPO"] == "GSPO: ratio level, clipping, regulariser; DR_GRPO: advantage, aggregation, regulariser"
    dialogue = D.tree_table(SECTION_TREE).set_index("path").loc["General Dialogue Alignment"]
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
    gspo = by_gid[f"node:{LC} > MoE Architecture"].get_bbox_patch()
    assert matplotlib.colors.to_hex(gspo.get_edgecolor()) == ALGO_COLORS["GSPO"]
    shaded = {g for g, t in by_gid.items() if matplotlib.colors.to_hex(t.get_bbox_patch().get_facecolor())
              == D._MARK_FACE}
    # the changed leaves, and everything under a changed branch; nothing else
    assert f"node:{LC} > MoE Architecture" not in shaded and "node:(root)" not in shaded
    assert {f"node:{LC} > Dense Model", f"node:{LC} > Dense Model > yes, both",
            f"node:{LC} > Dense Model > no, or not measured", "node:General Dialogue Alignment"} == shaded
    assert _texts(fig, "legend")
    assert not _texts(D.plot_tree(SECTION_TREE), "legend")


def test_plot_tree_checks_highlight_and_draws_into_a_given_axes():
    with pytest.raises(ValueError, match="not a path of the tree"):
        D.plot_tree(OUR_TREE, highlight={("poetry",)})
    with pytest.raises(ValueError, match="collection of paths"):
        D.plot_tree(OUR_TREE, highlight="General Dialogue Alignment")
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
        D.subtree(OUR_TREE, "General Dialogue Alignment")
    plt.close(small)
