"""Choosing a variant, as data: the seed's decision tree as written, and ours where a measurement differs.

The seed the book is built from ends with a tree (:data:`SEED_TREE_TEXT`): *Task Type?* long-CoT maths/code
(MoE -> GSPO + Dr.GRPO ideas; dense -> DAPO / VAPO; extreme stability requirements -> CISPO), general dialogue
-> GRPO / PPO (basic enough), multi-turn tool calls / agents -> DAPO + token-level loss, next-generation base
models -> RPT (experimental), with a caveat (:data:`SEED_CAVEAT`), and asks of a new variant which direction it
moves (normalisation, sequence level, clipping, the value model:
:func:`grpo_lab.lab.variant_records.changed_axes`, :meth:`Leaf.changed_axes`).

* A tree is a :class:`Node` (a question and its answers, in order) ending in :class:`Leaf` values:
  presets (names of :mod:`grpo_lab.algo.algorithms` constants, checked), their chapters, and the
  book's glued results bearing on them (``"04_gspo:gspo_route_last"``: chapter and glue name).
* :data:`SECTION_TREE` is the seed's tree as data; :data:`OUR_TREE` changes a branch only where a
  measurement supports the change; :data:`CHANGES` gives each change's reason and
  sources, and :func:`diff_trees` (checked by ``tests/lab/test_decision_tree.py``) keeps the two in
  step. A claim our experiments could not test reads "not tested in the paper's regime".
* :func:`leaves` walks a tree, :func:`tree_table` tabulates its leaves, :func:`plot_tree` draws it
  with the changed branches shaded.

Imports :mod:`grpo_lab.algo.algorithms` and :mod:`grpo_lab.lab.variant_records`; matplotlib and
pandas only inside the functions that draw and tabulate.
"""

from __future__ import annotations

import re
import textwrap
import types
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Optional, Union

from ..algo import algorithms
from . import variant_records
from ..algo.algorithms import Algorithm

__all__ = [
    "CHAPTERS",
    "Leaf",
    "Node",
    "BranchDiff",
    "BranchChange",
    "SEED_TREE_TEXT",
    "SEED_CAVEAT",
    "SECTION_TREE",
    "OUR_TREE",
    "CHANGES",
    "leaves",
    "subtree",
    "diff_trees",
    "TABLE_COLUMNS",
    "tree_table",
    "plot_tree",
]

#: The book's chapters by file stem (``book/<stem>.ipynb``), in order; ``08_choosing`` (choosing a
#: variant) draws the trees. A :class:`Leaf` may name only these.
CHAPTERS: tuple[str, ...] = ("01_grpo", "02_dapo", "03_dr_grpo", "04_gspo", "05_cispo", "06_vapo", "07_rpt",
                             "08_choosing")

_EVIDENCE = re.compile(r"(?P<stem>\d\d_[a-z_]+):(?P<name>[a-z][a-z0-9_]*)")
# a source of a change: a chapter and its section ("04_gspo §4.3"), a paper by its bib key (book/references.bib) and
# section ("yue2025vapo §5.2", "yue2025vapo Table 1"), or a scenario's results file ("scenario_dialogue.json")
_SOURCE = re.compile(r"(?P<stem>\d\d_[a-z_]+) §\d+\.\d+|(?P<bib>[a-z]+\d{4}[a-z0-9]*) (?:§|Table |Fig\. )[\w.]+|"
                     r"scenario_(?P<scenario>[a-z_]+)\.json")
# display names of presets whose constant name is not how the book writes them
_DISPLAY = {"DR_GRPO": "Dr.GRPO", "GSPO_TOKEN": "GSPO-token", "KL_COV": "KL-Cov", "CLIP_COV": "Clip-Cov"}


def _strings(value: Any, what: str, *, allow_empty: bool = False) -> tuple[str, ...]:
    """``value`` (a tuple or list of non-empty strings) as a tuple; ValueError naming ``what`` otherwise."""
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
        raise ValueError(f"{what} must be a tuple of strings, got {value!r}")
    if not value and not allow_empty:
        raise ValueError(f"{what} must not be empty")
    for v in value:
        if not isinstance(v, str) or not v.strip():
            raise ValueError(f"{what} must hold non-empty strings, got {v!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"{what} names an entry twice: {list(value)}")
    return tuple(value)


def _is_preset(name: str) -> bool:
    return name.isupper() and isinstance(getattr(algorithms, name, None), Algorithm)


@dataclass(frozen=True)
class Leaf:
    """A recommendation: the presets to use, the chapters that cover them, the measurements that bear on it.

    Attributes:
        presets: names of preset constants of :mod:`grpo_lab.algo.algorithms`, ``("GSPO", "DR_GRPO")``
            (a list is accepted and stored as a tuple).
        chapters: file stems of :data:`CHAPTERS` that cover the recommendation, ``("04_gspo",)``.
        evidence: keys ``"<chapter stem>:<glued name>"`` of the book's measurements that bear on it
            (``"04_gspo:gspo_route_last"``: the name under which the chapter glues the number or the
            sentence); empty where no chapter measures the setting.
        note: one sentence: what the recommendation means, and on what it rests.
        alternatives: True where the presets are alternatives (the seed's "DAPO / VAPO"), False
            (the default) where they are one recipe combined ("GSPO + Dr.GRPO ideas").
        quote: the recommendation as the section words it, where that says more than the presets
            (``"GSPO + Dr.GRPO ideas"``, ``"DAPO + token-level loss"``); None (the default) for
            :meth:`presets_text`. :meth:`label` shows it.

    Raises:
        ValueError: (when built) ``presets`` or ``chapters`` empty or not strings, a name that is
            not a preset constant of :mod:`grpo_lab.algo.algorithms` (the message names it), a chapter
            not in :data:`CHAPTERS`, an evidence key not of the form ``stem:name`` or of an unknown
            chapter, a name given twice, an empty ``note``, or ``alternatives`` not a bool or True
            with a single preset; a ``quote`` that is neither None nor a non-empty string.
    """

    presets: tuple[str, ...]
    chapters: tuple[str, ...]
    evidence: tuple[str, ...]
    note: str
    alternatives: bool = False
    quote: Optional[str] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "presets", _strings(self.presets, "Leaf.presets"))
        object.__setattr__(self, "chapters", _strings(self.chapters, "Leaf.chapters"))
        object.__setattr__(self, "evidence", _strings(self.evidence, "Leaf.evidence", allow_empty=True))
        unknown = [p for p in self.presets if not _is_preset(p)]
        if unknown:
            raise ValueError(f"Leaf.presets: {unknown[0]!r} is not a preset of grpo_lab.algo.algorithms; "
                             f"known: {sorted(algorithms.PRESETS)}")
        for stem in self.chapters:
            if stem not in CHAPTERS:
                raise ValueError(f"Leaf.chapters: unknown chapter {stem!r}; the chapters are {list(CHAPTERS)}")
        for key in self.evidence:
            m = _EVIDENCE.fullmatch(key)
            if m is None or m["stem"] not in CHAPTERS:
                raise ValueError(f"Leaf.evidence: {key!r} is not '<chapter stem>:<glued name>' of a chapter "
                                 f"in {list(CHAPTERS)}")
        if not isinstance(self.note, str) or not self.note.strip():
            raise ValueError(f"Leaf.note must be a non-empty string, got {self.note!r}")
        if not isinstance(self.alternatives, bool) or (self.alternatives and len(self.presets) < 2):
            raise ValueError(f"Leaf.alternatives must be a bool, and True only with two presets or more, got "
                             f"{self.alternatives!r} with {list(self.presets)}")
        if self.quote is not None and (not isinstance(self.quote, str) or not self.quote.strip()):
            raise ValueError(f"Leaf.quote must be None or a non-empty string, got {self.quote!r}")

    def algorithms(self) -> tuple[Algorithm, ...]:
        """The presets as :class:`~grpo_lab.algo.algorithms.Algorithm` values, in order. Raises nothing
        (the names were checked when the leaf was built)."""
        return tuple(getattr(algorithms, p) for p in self.presets)

    def changed_axes(self) -> dict[str, tuple[str, ...]]:
        """Which direction each preset moves: ``{preset: axes it changes relative to GRPO}``, the axes
        in :data:`~grpo_lab.lab.variant_records.AXES` order, computed by
        :func:`grpo_lab.lab.variant_records.changed_axes` from the presets' fields (whose comments in
        :mod:`grpo_lab.algo.algorithms` cite the papers); ``()`` for GRPO itself. Raises nothing."""
        out = {}
        for name, algo in zip(self.presets, self.algorithms()):
            moved = variant_records.changed_axes(algo)
            out[name] = tuple(a for a in variant_records.AXES if a in moved)
        return out

    def presets_text(self) -> str:
        """The presets as the book writes them (``DR_GRPO`` as ``Dr.GRPO``), joined by ``" or "`` for
        :attr:`alternatives`, else by ``" + "``: ``"GSPO + Dr.GRPO"``, ``"VAPO or DAPO"``. Raises nothing."""
        return (" or " if self.alternatives else " + ").join(_DISPLAY.get(p, p) for p in self.presets)

    def label(self) -> str:
        """The text of the leaf in :func:`plot_tree`: :attr:`quote` (else :meth:`presets_text`), then the
        chapter numbers: ``"GSPO + Dr.GRPO ideas\\nch. 4, 3"``. Raises nothing."""
        return f"{self.quote or self.presets_text()}\nch. " + ", ".join(str(int(s[:2])) for s in self.chapters)


@dataclass(frozen=True)
class Node:
    """A question and its answers, in order, each leading to a :class:`Node` or a :class:`Leaf`.

    Built from a mapping ``{answer: child}`` (insertion order kept) or a sequence of
    ``(answer, child)`` pairs; stored as a tuple of pairs, so a Node is immutable and two Nodes are
    equal when their questions, answers and children are.

    Attributes:
        question: the question asked at this node, a non-empty string.
        branches: ``((answer, Node | Leaf), ...)``, at least two, answers unique non-empty strings.

    Raises:
        ValueError: (when built) an empty question, fewer than two branches (a question with one
            answer decides nothing), an empty or repeated answer, or a child that is neither a Node
            nor a Leaf.
    """

    question: str
    branches: tuple[tuple[str, Union[Node, Leaf]], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.question, str) or not self.question.strip():
            raise ValueError(f"Node.question must be a non-empty string, got {self.question!r}")
        raw = self.branches
        pairs = list(raw.items()) if isinstance(raw, Mapping) else list(raw) if isinstance(raw, (tuple, list)) else None
        if pairs is None or len(pairs) < 2:
            raise ValueError(f"Node {self.question!r}: branches must hold at least two (answer, child) pairs, "
                             f"got {raw!r}")
        seen = set()
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise ValueError(f"Node {self.question!r}: a branch must be an (answer, child) pair, got {pair!r}")
            answer, child = pair
            if not isinstance(answer, str) or not answer.strip():
                raise ValueError(f"Node {self.question!r}: an answer must be a non-empty string, got {answer!r}")
            if answer in seen:
                raise ValueError(f"Node {self.question!r}: the answer {answer!r} is given twice")
            if not isinstance(child, (Node, Leaf)):
                raise ValueError(f"Node {self.question!r}, answer {answer!r}: the child must be a Node or a "
                                 f"Leaf, got {type(child).__name__}")
            seen.add(answer)
        object.__setattr__(self, "branches", tuple(pairs))

    @property
    def answers(self) -> tuple[str, ...]:
        """The answers, in order."""
        return tuple(a for a, _ in self.branches)

    def child(self, answer: str) -> Union[Node, Leaf]:
        """The Node or Leaf that ``answer`` leads to.

        Raises:
            ValueError: ``answer`` is not one of :attr:`answers` (the message lists them).
        """
        for a, c in self.branches:
            if a == answer:
                return c
        raise ValueError(f"{answer!r} is not an answer to {self.question!r}; the answers are {list(self.answers)}")


def _check_tree(tree: Any, what: str = "tree") -> None:
    if not isinstance(tree, (Node, Leaf)):
        raise ValueError(f"{what} must be a Node or a Leaf, got {type(tree).__name__}")


def _walk(tree: Union[Node, Leaf], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Union[Node, Leaf]]]:
    """Every element of ``tree`` with its path of answers, in depth-first order, the root first."""
    yield path, tree
    if isinstance(tree, Node):
        for answer, child in tree.branches:
            yield from _walk(child, path + (answer,))


def leaves(tree: Union[Node, Leaf]) -> Iterator[tuple[tuple[str, ...], Leaf]]:
    """The leaves of ``tree`` with their paths, top to bottom (depth first, answers in order).

    A path is the tuple of answers from the root to the leaf, ``("Mathematical/Code Reasoning (Long CoT)", "MoE Architecture")``; a
    tree that is a single Leaf yields ``((), leaf)``. The trees of this module follow the seed's
    tree (see :data:`CHANGES` for the sources of ours).

    Args:
        tree: a :class:`Node` or a :class:`Leaf`.

    Yields:
        ``(path, leaf)``: ``path`` a ``tuple[str, ...]``, ``leaf`` a :class:`Leaf`.

    Raises:
        ValueError: ``tree`` neither a Node nor a Leaf.
    """
    _check_tree(tree)
    for path, element in _walk(tree):
        if isinstance(element, Leaf):
            yield path, element


def subtree(tree: Union[Node, Leaf], path: Iterable[str]) -> Union[Node, Leaf]:
    """The Node or Leaf that the answers of ``path`` lead to from the root of ``tree`` (``()``: the root).

    Args:
        tree: a :class:`Node` or a :class:`Leaf`, e.g. :data:`OUR_TREE` (sources in :data:`CHANGES`).
        path: the answers in order, ``("Mathematical/Code Reasoning (Long CoT)", "Dense Model")``.

    Returns:
        a :class:`Node` or a :class:`Leaf`.

    Raises:
        ValueError: ``tree`` neither a Node nor a Leaf, a path given as one string (it would be read
            letter by letter), a path that goes on past a Leaf, or an answer that the question at that
            point does not have (the message lists the answers).
    """
    _check_tree(tree)
    if isinstance(path, str):
        raise ValueError(f"subtree: the path is a tuple of answers, got the string {path!r}; write ({path!r},)")
    here: Union[Node, Leaf] = tree
    for i, answer in enumerate(tuple(path)):
        if isinstance(here, Leaf):
            raise ValueError(f"path {tuple(path)!r} goes on past a leaf after {i} answers")
        here = here.child(answer)
    return here


class BranchDiff(NamedTuple):
    """A branch on which two trees differ (:func:`diff_trees`).

    ``path`` is the tuple of answers to the branch; ``old`` and ``new`` are what it leads to in the
    first and in the second tree (a :class:`Leaf` or a :class:`Node`), None where that tree has no
    such branch.
    """

    path: tuple[str, ...]
    old: Optional[Union[Node, Leaf]]
    new: Optional[Union[Node, Leaf]]


def _diff(a: Optional[Union[Node, Leaf]], b: Optional[Union[Node, Leaf]], path: tuple[str, ...]) -> list[BranchDiff]:
    if a == b:
        return []
    if isinstance(a, Node) and isinstance(b, Node) and a.question == b.question:
        out: list[BranchDiff] = []
        for answer in a.answers + tuple(x for x in b.answers if x not in a.answers):
            out += _diff(a.child(answer) if answer in a.answers else None,
                         b.child(answer) if answer in b.answers else None, path + (answer,))
        return out
    return [BranchDiff(path, a, b)]


def diff_trees(a: Union[Node, Leaf], b: Union[Node, Leaf]) -> tuple[BranchDiff, ...]:
    """The branches on which tree ``b`` differs from tree ``a``, each at the highest point where they part.

    Two nodes that ask the same question are compared answer by answer (the answers of ``a`` in
    order, then those only ``b`` has); anything else that differs is one change at that path: two
    leaves that differ in any field (presets, chapters, evidence or note), a leaf replaced by a
    question, two different questions, or a branch only one tree has (None on the other side).
    ``diff_trees(SECTION_TREE, OUR_TREE)`` gives exactly the paths of :data:`CHANGES`, whose reasons
    cite the measurements and papers behind them (tests/lab/test_decision_tree.py checks it).

    Args:
        a: the first tree, a :class:`Node` or a :class:`Leaf`.
        b: the second tree.

    Returns:
        a tuple of :class:`BranchDiff` ``(path, old, new)`` in ``a``'s order; empty for equal trees.

    Raises:
        ValueError: ``a`` or ``b`` neither a Node nor a Leaf.
    """
    _check_tree(a, "a")
    _check_tree(b, "b")
    return tuple(_diff(a, b, ()))


@dataclass(frozen=True)
class BranchChange:
    """Why our tree differs from the seed's on one branch.

    Attributes:
        path: the answers to the branch, as :func:`diff_trees` reports it.
        what: what changed, in one or two sentences.
        reason: why: the measurement that supports the change (its interval is quoted beside the tree in the
            book) and the papers; any contrary result in the book is named.
        sources: where the reason comes from: ``"06_vapo §6.10"`` (a chapter's file stem and section),
            ``"yue2025vapo §5.2"`` (a paper's key in ``book/references.bib`` and its section, figure or table) or
            ``"scenario_dialogue.json"`` (a scenario's results file in ``benchmarks/results``).

    Raises:
        ValueError: (when built) an empty path, ``what`` or ``reason``, or a source of none of these forms, or a
            chapter stem not in :data:`CHAPTERS`.
    """

    path: tuple[str, ...]
    what: str
    reason: str
    sources: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", _strings(self.path, "BranchChange.path"))
        object.__setattr__(self, "sources", _strings(self.sources, "BranchChange.sources"))
        for name in ("what", "reason"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"BranchChange.{name} must be a non-empty string, got {value!r}")
        for src in self.sources:
            m = _SOURCE.fullmatch(src)
            if m is None or (m["stem"] is not None and m["stem"] not in CHAPTERS):
                raise ValueError(f"BranchChange.sources: {src!r} is neither '<chapter stem> §N.M' of a chapter in "
                                 f"{list(CHAPTERS)}, '<bib key> §<section>' nor 'scenario_<name>.json'")


# ------------------------------------------------------------------------------------ the two trees
#: The seed's decision tree (its §15.4) as it is written, reconstructed from the expert review of chapter 8 (issue
#: 57, item 1), which quotes it: the root question, four task types, the long-CoT node's three
#: children and the qualifiers. :data:`SECTION_TREE` is this text as data (``tests/lab/test_decision_tree.py``
#: parses the text and compares).
SEED_TREE_TEXT = """\
Task Type?
├── Mathematical/Code Reasoning (Long CoT)
│   ├── MoE Architecture → GSPO + Dr.GRPO ideas
│   ├── Dense Model → DAPO / VAPO
│   └── Extreme Stability Requirements → CISPO
├── General Dialogue Alignment → GRPO / PPO (Basic Enough)
├── Multi-turn Tool Calls / Agents → DAPO + Token-level Loss
└── Next-Generation Base Models → RPT (Experimental)
"""

#: The caveat the seed writes after its tree, as the review quotes it (item 1).
SEED_CAVEAT = ("This tree is not absolute: ByteDance Seed, for example, mixes DAPO's techniques with VAPO's value "
               "model. Read it as a checklist of what to consider first.")

_ROOT_QUESTION = "Task Type?"
_LONG_COT, _DIALOGUE, _TOOLS, _NEXT_GEN = (
    "Mathematical/Code Reasoning (Long CoT)", "General Dialogue Alignment", "Multi-turn Tool Calls / Agents",
    "Next-Generation Base Models")
_MOE, _DENSE, _STABILITY = "MoE Architecture", "Dense Model", "Extreme Stability Requirements"
# the seed's tree asks no question at its second level; a Node needs one, and this is the seed's three answers' own
_LONG_COT_QUESTION = "Architecture, or a stability requirement?"

_SECTION_MOE = Leaf(
    presets=("GSPO", "DR_GRPO"), chapters=("04_gspo", "03_dr_grpo"), quote="GSPO + Dr.GRPO ideas",
    evidence=("04_gspo:gspo_moe_verdict", "04_gspo:gspo_route_last", "03_dr_grpo:repro_verdict"),
    note="The seed's advice for a Mixture-of-Experts policy: GSPO's sequence-level ratio, with Dr.GRPO's ideas "
         "(the advantage without the std, a constant normaliser). GSPO's own comparison ran GRPO with Routing "
         "Replay; GSPO's gradient keeps the 1/|y_i| weight that Dr.GRPO's constant normaliser removes.")
_SECTION_DENSE = Leaf(
    presets=("DAPO", "VAPO"), chapters=("02_dapo", "06_vapo"), alternatives=True, quote="DAPO / VAPO",
    evidence=("06_vapo:vapo_critic_sentence", "06_vapo:vl_ev_vapo", "06_vapo:vapo_vs_dapo"),
    note="The seed's advice for a dense policy: DAPO's critic-free recipe or VAPO's value-model route.")
_SECTION_STABILITY = Leaf(
    presets=("CISPO",), chapters=("05_cispo",),
    evidence=("05_cispo:cispo_rare_verdict", "05_cispo:cispo_speed_verdict", "05_cispo:cispo_final_diff",
              "05_cispo:cispo_steps_ratio"),
    note="The seed's advice where stability matters most: CISPO's clipped, stop-gradient importance weight, "
         "which keeps every token's gradient (MiniMax-M1 claims stable exploration and speed). Chapter 5's outcome "
         "at 16 updates per batch (its evidence) is the book's one measurement of it.")
_SECTION_DIALOGUE = Leaf(
    presets=("GRPO", "PPO"), chapters=("01_grpo", "06_vapo"), evidence=(), alternatives=True,
    quote="GRPO / PPO (Basic Enough)",
    note="The seed's advice for general dialogue, which no chapter measures; the dialogue scenario "
         "(benchmarks/results/scenario_dialogue.json) does.")
_TOOLS_LEAF = Leaf(
    presets=("DAPO",), chapters=("02_dapo",), evidence=("02_dapo:mt_branch_verdict",),
    quote="DAPO + Token-level Loss",
    note="The seed's 'DAPO + Token-level Loss' is the DAPO preset, whose loss is token-level already (Eq. 12, "
         "aggregation group_token_mean); chapter 2 §2.6 reads the tool-call scenario.")
_RPT_LEAF = Leaf(
    presets=("RPT",), chapters=("07_rpt",), evidence=("07_rpt:rpt_d_greedy", "07_rpt:rpt_vs_ntp_sentence"),
    quote="RPT (Experimental)",
    note="The seed's Improvement Route Five, RL in pre-training, marked experimental. RPT starts from a reasoning "
         "model (R1-Distill-Qwen-14B) and its objective is pure RL (GRPO, zero KL, no language-modelling term).")

#: The seed's tree (:data:`SEED_TREE_TEXT`) as data, with the book's measurements that bear on each leaf. "DAPO +
#: Token-level Loss" is the DAPO preset, whose loss is token-level already (``DAPO.aggregation`` is
#: ``"group_token_mean"``, DAPO Eq. 12); "GRPO / PPO" and "DAPO / VAPO" are leaves of alternatives.
#:
#: :meta hide-value:
SECTION_TREE: Node = Node(_ROOT_QUESTION, {
    _LONG_COT: Node(_LONG_COT_QUESTION, {_MOE: _SECTION_MOE, _DENSE: _SECTION_DENSE, _STABILITY: _SECTION_STABILITY}),
    _DIALOGUE: _SECTION_DIALOGUE,
    _TOOLS: _TOOLS_LEAF,
    _NEXT_GEN: _RPT_LEAF,
})

_OUR_DENSE = Node("Can you pay for a critic, and does a probe show it keeps pace (explained variance held after "
                  "N policy steps)?", {
    "yes, both": Leaf(presets=("VAPO",), chapters=("06_vapo",),
                      evidence=("06_vapo:vl_ev_vapo", "06_vapo:vl_d_crit", "06_vapo:vapo_vs_dapo"),
                      note="VAPO, where its precondition is measured: a critic pretrained on the frozen policy's "
                           "returns whose explained variance on a held-out batch holds after N policy steps, and "
                           "memory for a second model with its optimiser state."),
    "no, or not measured": Leaf(
        presets=("DAPO",), chapters=("02_dapo", "06_vapo"),
        evidence=("06_vapo:vapo_speed_ratio_dapo", "06_vapo:vapo_state_ratio", "06_vapo:vapo_vs_dapo"),
        note="DAPO, which needs no critic: it costs less per step and holds one model's state; the book found no "
             "outcome penalty for VAPO, so cost, not accuracy, is the reason for the default."),
})
_OUR_DIALOGUE = Leaf(
    presets=("GRPO",), chapters=("01_grpo",), evidence=(),
    note="GRPO: in the dialogue scenario PPO (a learned critic, GAE, no KL) ended below GRPO on the gold reward; "
         "the scenario file's verdict and interval are quoted beside the tree.")

#: Our tree, the seed's changed on the branches of :data:`CHANGES` only, each where a measurement supports the
#: change (the reason cites it); every other branch is the seed's, the same :class:`Leaf`. :func:`diff_trees`
#: against :data:`SECTION_TREE` gives exactly the keys of :data:`CHANGES`.
#:
#: :meta hide-value:
OUR_TREE: Node = Node(_ROOT_QUESTION, {
    _LONG_COT: Node(_LONG_COT_QUESTION, {_MOE: _SECTION_MOE, _DENSE: _OUR_DENSE, _STABILITY: _SECTION_STABILITY}),
    _DIALOGUE: _OUR_DIALOGUE,
    _TOOLS: _TOOLS_LEAF,
    _NEXT_GEN: _RPT_LEAF,
})

_CHANGES = (
    BranchChange(
        path=(_LONG_COT, _DENSE),
        what="DAPO / VAPO -> a question first: DAPO by default; VAPO where you can pay for a critic and a short "
             "probe shows it keeps pace with the policy.",
        reason="Cost, measured: a VAPO step is slower than a DAPO step and holds twice the state (a second model "
               "and its optimiser), in chapter 6's timings and in the memory model (06_vapo §6.10). Outcome: the "
               "book found no penalty for VAPO (chapter 6's VAPO minus DAPO, quoted beside the leaf) although its "
               "critic lost its explained variance as the policy moved (06_vapo §6.12); VAPO's lead in the paper "
               "rests on a critic that keeps pace (without value pretraining it scores 11, yue2025vapo Table 1). "
               "The probe: pretrain the critic on the frozen policy's returns, run N policy steps, measure "
               "explained variance on a held-out batch.",
        sources=("yue2025vapo Table 1", "06_vapo §6.10", "06_vapo §6.12"),
    ),
    BranchChange(
        path=(_DIALOGUE,),
        what="GRPO / PPO (Basic Enough) -> GRPO.",
        reason="In the dialogue scenario (a learned proxy reward, the gold reward as the test metric, each arm at "
               "its best rate of a three-rate sweep) PPO ended below GRPO, the interval excluding zero after "
               "Bonferroni correction; that comparison changes the critic, GAE and the KL term together, so it "
               "says PPO as packaged here, not a critic alone, is the worse first choice on this task.",
        sources=("scenario_dialogue.json",),
    ),
)

#: The reason for every branch on which :data:`OUR_TREE` differs from :data:`SECTION_TREE`, as
#: ``{path: BranchChange}``, read-only, in the trees' order. Each reason cites the measurement behind it (a
#: scenario's results file or a chapter section) and the papers (bib key and section).
#:
#: :meta hide-value:
CHANGES: Mapping[tuple[str, ...], BranchChange] = types.MappingProxyType({c.path: c for c in _CHANGES})


# ------------------------------------------------------------------------------------------ the table
#: the columns of :func:`tree_table`, in order
TABLE_COLUMNS: tuple[str, ...] = ("path", "presets", "chapters", "evidence", "axes vs GRPO", "note")


def _path_text(path: tuple[str, ...]) -> str:
    return " > ".join(path) if path else "(root)"


def _axes_text(leaf: Leaf) -> str:
    """``"GSPO: ratio level, clipping, regulariser; ..."``, ``"none"`` for a preset that is GRPO."""
    return "; ".join(f"{p}: {', '.join(axes) or 'none'}" for p, axes in leaf.changed_axes().items())


def tree_table(tree: Union[Node, Leaf]) -> Any:
    """One row per leaf of ``tree``: where it is, what it recommends, where the book covers and measures it.

    Columns (:data:`TABLE_COLUMNS`), every cell a string: ``path`` (the answers joined by ``" > "``,
    ``"(root)"`` for a tree that is one leaf), ``presets`` (:meth:`Leaf.presets_text`), ``chapters`` (file
    stems joined by ``", "``), ``evidence`` (the keys joined by ``"; "``, or ``"none in this book"``),
    ``axes vs GRPO`` (:meth:`Leaf.changed_axes` per preset, computed from the presets, whose comments
    cite the papers) and ``note``. The sources of :data:`OUR_TREE`'s changes are in :data:`CHANGES`.

    Args:
        tree: a :class:`Node` or a :class:`Leaf`.

    Returns:
        a ``pandas.DataFrame`` with one row per leaf, top to bottom as :func:`leaves` yields them.

    Raises:
        ValueError: ``tree`` neither a Node nor a Leaf.
    """
    import pandas as pd

    rows = [(_path_text(path), leaf.presets_text(), ", ".join(leaf.chapters),
             "; ".join(leaf.evidence) or "none in this book", _axes_text(leaf), leaf.note)
            for path, leaf in leaves(tree)]
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


# ----------------------------------------------------------------------------------------- the figure
# The drawing is laid out in inches (one data unit is one inch) and sized to its texts, measured.
_ROW_H = 0.56  # inches per leaf row
_MARGIN = 0.1  # inches around the drawing
_ELBOW = 0.12  # inches from a box to the vertical stretch of its edges
_GAP = 0.1  # inches between an answer and the next column's boxes
_FONT = 8.5  # points, questions and leaves
_ANSWER_FONT = 7.5  # points, the answers on the edges
_WRAP_QUESTION, _WRAP_ANSWER = 24, 17  # characters per line
_PAD = 0.35  # box padding, in units of the font size
_PAD_IN = _PAD * _FONT / 72  # the same in inches
_NODE_FACE, _NODE_EDGE, _MARK_FACE, _EDGE = "#f2f2f2", "#767676", "#ffe9a8", "#555555"


def _rows(tree: Union[Node, Leaf]) -> tuple[dict[tuple[str, ...], float], int, int]:
    """``({path: y in inches from the top}, rows, depth)``: one row per leaf, top to bottom; a
    question centred between its first and last answers' rows; depth = the longest path."""
    found = list(leaves(tree))
    ys = {path: -_MARGIN - (row + 0.5) * _ROW_H for row, (path, _) in enumerate(found)}

    def place(node: Node, path: tuple[str, ...]) -> float:
        below = [place(c, path + (a,)) if isinstance(c, Node) else ys[path + (a,)] for a, c in node.branches]
        ys[path] = (below[0] + below[-1]) / 2
        return ys[path]

    if isinstance(tree, Node):
        place(tree, ())
    return ys, len(found), max(len(p) for p, _ in found)


def _marked(tree: Union[Node, Leaf], highlight: Any) -> set[tuple[str, ...]]:
    """The paths of every element under a highlighted path; ValueError for a path not in ``tree``."""
    if highlight is None:
        return set()
    if isinstance(highlight, (str, Node, Leaf)) or not isinstance(highlight, Iterable):
        raise ValueError(f"highlight must be a collection of paths (tuples of answers), got {highlight!r}")
    roots = []
    for path in highlight:
        if not isinstance(path, tuple):
            raise ValueError(f"highlight: a path is a tuple of answers, got {path!r}")
        try:
            subtree(tree, path)
        except ValueError as err:
            raise ValueError(f"highlight: {path!r} is not a path of the tree ({err})") from None
        roots.append(path)
    return {p for p, _ in _walk(tree) if any(p[:len(r)] == r for r in roots)}


def _box(ax: Any, path: tuple[str, ...], element: Union[Node, Leaf], y: float, marked: bool) -> Any:
    """One question or leaf as a text in a rounded box at x = 0 (placed later); a leaf's box is edged
    in its first preset's colour (:data:`grpo_lab.experiments.plotting.ALGO_COLORS`)."""
    from ..experiments.plotting import algo_color

    if isinstance(element, Leaf):
        text, face, edge, lw = element.label(), "white", algo_color(element.presets[0]), 1.8
    else:
        text, face, edge, lw = textwrap.fill(element.question, _WRAP_QUESTION), _NODE_FACE, _NODE_EDGE, 1.0
    if marked:
        face, lw = _MARK_FACE, lw + 1.0
    artist = ax.text(0.0, y, text, ha="left", va="center", fontsize=_FONT, linespacing=1.25,
                     fontweight="bold" if isinstance(element, Leaf) else "normal",
                     bbox=dict(boxstyle=f"round,pad={_PAD}", facecolor=face, edgecolor=edge, linewidth=lw))
    artist.set_gid("node:" + _path_text(path))
    return artist


def _answer(ax: Any, answer: str, path: tuple[str, ...], y: float) -> Any:
    """The answer that leads to ``path``, written just above its edge's last stretch (placed later)."""
    artist = ax.text(0.0, y + 0.03, textwrap.fill(answer, _WRAP_ANSWER), ha="left", va="bottom",
                     fontsize=_ANSWER_FONT, style="italic", color="#333333", linespacing=1.1)
    artist.set_gid("answer:" + _path_text(path))
    return artist


def _width(artist: Any) -> float:
    """A text's width in inches (without its box's padding), as the renderer lays it out."""
    return artist.get_window_extent().width / artist.figure.dpi


def _columns(tree: Union[Node, Leaf], boxes: Mapping, answers: Mapping, depth: int) -> list[float]:
    """x (inches) of each level's boxes, levels ``0 .. depth`` (the leaves' column is ``depth``):
    each column clears the widest box of the one before, its elbow and its widest answer."""
    box_w, ans_w = [0.0] * (depth + 1), [0.0] * (depth + 1)
    for path, element in _walk(tree):
        if isinstance(element, Node):
            box_w[len(path)] = max(box_w[len(path)], _width(boxes[path]))
            ans_w[len(path)] = max([ans_w[len(path)]] + [_width(answers[path + (a,)]) for a in element.answers])
    xs = [_MARGIN + _PAD_IN]
    for level in range(depth):
        xs.append(xs[-1] + box_w[level] + 2 * _PAD_IN + _ELBOW + 0.06 + ans_w[level] + _GAP)
    return xs


def _level(path: tuple[str, ...], element: Union[Node, Leaf], depth: int) -> int:
    return depth if isinstance(element, Leaf) else len(path)


def _edges(ax: Any, tree: Union[Node, Leaf], boxes: Mapping, answers: Mapping) -> None:
    """An elbow from each question's box to each answer's box, the answer above its last stretch."""
    for path, element in _walk(tree):
        if not isinstance(element, Node):
            continue
        x0, y0 = boxes[path].get_position()[0] + _width(boxes[path]) + _PAD_IN, boxes[path].get_position()[1]
        for answer in element.answers:
            child = boxes[path + (answer,)]
            x1, y1 = child.get_position()
            ax.plot([x0, x0 + _ELBOW, x0 + _ELBOW, x1 - _PAD_IN], [y0, y0, y1, y1], color=_EDGE, linewidth=1.0,
                    zorder=0)
            answers[path + (answer,)].set_x(x0 + _ELBOW + 0.06)


def plot_tree(tree: Union[Node, Leaf], ax: Any = None, highlight: Optional[Iterable[tuple[str, ...]]] = None) -> Any:
    """Draw a decision tree left to right: questions in grey boxes, answers on the edges, leaves on the right.

    Each leaf reads its presets and chapters (:meth:`Leaf.label`, ``"GSPO + Dr.GRPO\\nch. 4, 3"``) in a
    box edged with the first preset's colour of :data:`grpo_lab.experiments.plotting.ALGO_COLORS`. The
    layout is computed here (no graphviz): one row per leaf, leaves flush right, questions centred on
    their answers, columns as wide as their texts. Each question and leaf is a text with gid
    ``"node:<path>"`` (answers joined by ``" > "``, ``"(root)"``), each answer one with gid
    ``"answer:<path>"``. ``highlight`` shades the named branches and everything under them, with a line
    saying so (``plot_tree(OUR_TREE, highlight=CHANGES)``).

    Args:
        tree: a :class:`Node` or a :class:`Leaf`.
        ax: matplotlib Axes to draw into, laid out in inches from its top left corner; default a new
            figure sized to the tree.
        highlight: paths (tuples of answers) to shade, e.g. the keys of :data:`CHANGES`.

    Returns:
        the matplotlib Figure.

    Raises:
        ValueError: ``tree`` neither a Node nor a Leaf; ``highlight`` not a collection of tuples, or a
            path in it that is not in ``tree``; an ``ax`` smaller (in inches) than the tree needs.
    """
    import matplotlib.pyplot as plt

    _check_tree(tree)
    marked = _marked(tree, highlight)
    ys, rows, depth = _rows(tree)
    height = 2 * _MARGIN + rows * _ROW_H + (0.3 if marked else 0.0)
    own = ax is None
    fig = plt.figure(figsize=(8.0, height)) if own else ax.figure
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0)) if own else ax
    axis_was_on = ax.axison
    ax.set_axis_off()
    boxes = {p: _box(ax, p, e, ys[p], p in marked) for p, e in _walk(tree)}
    answers = {p + (a,): _answer(ax, a, p + (a,), ys[p + (a,)]) for p, e in _walk(tree) if isinstance(e, Node)
               for a in e.answers}
    xs = _columns(tree, boxes, answers, depth)
    for path, element in _walk(tree):
        boxes[path].set_x(xs[_level(path, element, depth)])
    width = xs[depth] + max(_width(boxes[p]) for p, _ in leaves(tree)) + _PAD_IN + _MARGIN + 0.04
    if own:
        fig.set_size_inches(width, height)
    pos = ax.get_position()
    have = (pos.width * fig.get_figwidth(), pos.height * fig.get_figheight())
    if not own and (have[0] < width - 1e-6 or have[1] < height - 1e-6):  # the lines would be cut off at its edges
        for artist in (*boxes.values(), *answers.values()):  # leave the caller's Axes as it was
            artist.remove()
        if axis_was_on:
            ax.set_axis_on()
        raise ValueError(f"plot_tree: the Axes is {have[0]:.2f} x {have[1]:.2f} inches, this tree needs "
                         f"{width:.2f} x {height:.2f}; give a larger Axes, or ax=None for a figure sized to it")
    ax.set_xlim(0, pos.width * fig.get_figwidth())
    ax.set_ylim(-pos.height * fig.get_figheight(), 0)
    _edges(ax, tree, boxes, answers)
    if marked:
        note = ax.text(_MARGIN, -height + _MARGIN, "shaded: changed from the seed's tree", ha="left",
                       va="bottom", fontsize=_ANSWER_FONT, color="#333333",
                       bbox=dict(boxstyle="square,pad=0.2", facecolor=_MARK_FACE, edgecolor="none"))
        note.set_gid("legend")
    return fig
