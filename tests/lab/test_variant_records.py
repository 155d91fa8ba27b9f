"""grpo_lab.lab.variant_records: the records of the papers, and the axes each preset changes, computed.

The expected axes below were derived by hand from the preset definitions in grpo_lab/algo/algorithms.py
(the fields each ``GRPO.replace(...)`` / ``PPO.replace(...)`` call sets, compared with GRPO's), not
from the function under test: a change to a preset or to the grouping must show up here.
"""

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from grpo_lab.algo import algorithms as A
from grpo_lab.lab import variant_records as V
from grpo_lab.lab.variant_records import ABSENT, AXES, AXIS_FIELDS, NOT_STATED, RECORDS

ROOT = Path(__file__).resolve().parents[2]

# By hand, from each preset's definition (fields that differ from GRPO's, grouped as in AXIS_FIELDS):
EXPECTED = {
    "GRPO": set(),
    # eps_high 0.28; group_token_mean; kl None, beta 0; dynamic_sampling, overlong_filter, overlong_cache_frac
    "DAPO": {"clipping", "aggregation", "regulariser", "sampling & shaping"},
    # group_mean; seq_mean_token_sum_norm; kl None, beta 0
    "DR_GRPO": {"advantage", "aggregation", "regulariser"},
    # ratio sequence; eps 3e-4 / 4e-4; kl None (aggregation stays seq_mean_token_mean)
    "GSPO": {"ratio level", "clipping", "regulariser"},
    # cispo, eps_low 1, eps_high 0.28; group_token_mean; kl None; dynamic_sampling, overlong_cache_frac
    "CISPO": {"clipping", "aggregation", "regulariser", "sampling & shaping"},
    # PPO's gae, value_clip_eps, kl None + eps_high 0.28, token_mean, lam_alpha, critic_lam, nll_coef
    "VAPO": {"advantage", "clipping", "aggregation", "regulariser", "value model / GAE", "extra loss terms"},
    # kl None, beta 0 only
    "RPT": {"regulariser"},
    # clip gmpo, eps 0.4; kl None
    "GMPO": {"clipping", "regulariser"},
    # clip sapo (+ tau_pos, tau_neg); kl None
    "SAPO": {"clipping", "regulariser"},
    # clip kl_cov (+ kl_cov_coef, kl_cov_ratio); token_mean; kl None
    "KL_COV": {"clipping", "aggregation", "regulariser"},
    # clip clip_cov, eps 1 (+ clip_cov_ratio / lb / ub); token_mean; kl None
    "CLIP_COV": {"clipping", "aggregation", "regulariser"},
}


# ------------------------------------------------------------------------------------ the grouping
def test_every_algorithm_field_is_on_exactly_one_axis():
    fields = [f.name for f in dataclasses.fields(A.Algorithm)]
    grouped = [f for group in AXIS_FIELDS.values() for f in group]
    assert len(grouped) == len(set(grouped)), f"a field on two axes: {sorted(f for f in grouped if grouped.count(f) > 1)}"
    assert not set(grouped) & set(V.ATTRIBUTED_FIELDS)
    missing = set(fields) - {"name"} - set(grouped) - set(V.ATTRIBUTED_FIELDS)
    assert not missing, f"Algorithm fields on no axis of AXIS_FIELDS (add them): {sorted(missing)}"
    unknown = (set(grouped) | set(V.ATTRIBUTED_FIELDS)) - set(fields)
    assert not unknown, f"AXIS_FIELDS names fields Algorithm does not have: {sorted(unknown)}"
    assert AXES == tuple(AXIS_FIELDS) and len(AXES) == 8
    assert set(V.REGISTRY_AXES.values()) <= set(AXES)


def test_axis_constants_are_the_axis_names():
    assert [V.ADVANTAGE, V.RATIO_LEVEL, V.CLIPPING, V.AGGREGATION, V.REGULARISER, V.SAMPLING, V.VALUE_MODEL,
            V.EXTRA_LOSS] == list(AXES)


# ---------------------------------------------------------------------------------- computed axes
@pytest.mark.parametrize("name", list(EXPECTED))
def test_changed_axes_of_each_preset(name):
    assert V.changed_axes(name) == frozenset(EXPECTED[name])
    assert V.changed_axes(A.PRESETS[name]) == frozenset(EXPECTED[name])


def test_dapo_changes_exactly_these_fields():
    assert V.axes_changed(A.DAPO) == {
        "clipping": {"eps_high": (0.2, 0.28)},
        "aggregation": {"aggregation": ("seq_mean_token_mean", "group_token_mean")},
        "regulariser": {"kl": ("k3", None), "beta": (0.04, 0.0)},
        "sampling & shaping": {"dynamic_sampling": (False, True), "overlong_filter": (False, True),
                               "overlong_cache_frac": (None, 0.2)},
    }
    assert list(V.axes_changed(A.DAPO)) == ["clipping", "aggregation", "regulariser", "sampling & shaping"]


def test_vapo_value_model_fields():
    changes = V.axes_changed(A.VAPO)
    assert changes["value model / GAE"] == {"lam_alpha": (None, 0.05), "critic_lam": (None, 1.0),
                                            "value_clip_eps": (None, 0.2)}
    assert changes["extra loss terms"] == {"nll_coef": (0.0, 0.1)}
    # against PPO, VAPO keeps the advantage and the regulariser
    assert V.changed_axes(A.VAPO, A.PPO) == {"clipping", "aggregation", "value model / GAE", "extra loss terms"}


@pytest.mark.parametrize("name", list(A.PRESETS))
def test_a_preset_against_itself_changes_nothing(name):
    assert V.axes_changed(A.PRESETS[name], A.PRESETS[name]) == {}
    assert V.describe_changes(name, name) == "none"


def test_grpo_against_itself_and_a_renamed_copy():
    assert V.axes_changed(A.GRPO) == {} and V.changed_axes(A.GRPO) == frozenset()
    assert V.axes_changed(A.GRPO.replace(name="GRPO again")) == {}  # the name is not an axis


def test_changes_are_symmetric_and_swap_their_pairs():
    for a in A.PRESETS.values():
        for b in A.PRESETS.values():
            ab, ba = V.axes_changed(a, b), V.axes_changed(b, a)
            assert set(ab) == set(ba)
            for axis, diff in ab.items():
                assert {k: (y, x) for k, (x, y) in diff.items()} == ba[axis]


def test_hyperparameters_count_under_the_axis_of_their_function():
    assert V.axes_changed(A.SAPO)["clipping"] == {"surrogate": ("ppo", "sapo"), "tau_pos": (ABSENT, 1.0),
                                                  "tau_neg": (ABSENT, 1.05)}
    assert V.axes_changed(A.GRPO, A.SAPO)["clipping"]["tau_neg"] == (1.05, ABSENT)
    # kl_cov_ratio is declared by a whole-minibatch statistic of the surrogate, not by the surrogate itself
    assert V.axes_changed(A.KL_COV)["clipping"]["kl_cov_ratio"] == (ABSENT, 2e-3)
    # a hyper-parameter alone: one axis
    assert V.axes_changed(A.SAPO.replace(tau_neg=1.2), A.SAPO) == {"clipping": {"tau_neg": (1.05, 1.2)}}
    assert repr(ABSENT) == "absent"


def test_a_registered_functions_hyperparameter_counts_under_its_axis(monkeypatch):
    from grpo_lab.algo import advantages

    def scaled(batch, *, adv_scale: float = 2.0):
        """Group z-score times ``adv_scale`` (a test estimator)."""
        return advantages.ADVANTAGE_ESTIMATORS["group"](batch, A.GRPO) * adv_scale

    monkeypatch.setitem(advantages.ADVANTAGE_ESTIMATORS, "scaled", scaled)
    mine = A.GRPO.replace(advantage="scaled")
    assert mine.params == {"adv_scale": 2.0}
    assert V.axes_changed(mine) == {"advantage": {"advantage": ("group", "scaled"), "adv_scale": (ABSENT, 2.0)}}
    assert V.axes_changed(mine.replace(adv_scale=3.0), mine) == {"advantage": {"adv_scale": (2.0, 3.0)}}


def test_v32_and_single_field_changes():
    v32 = A.deepseek_v32(beta=0.01, delta=0.1, eps=0.2)
    assert V.changed_axes(v32) == {"advantage", "ratio level", "regulariser", "sampling & shaping"}  # + Keep Sampling Mask
    assert V.changed_axes(A.GRPO.replace(max_tokens=32)) == {"aggregation"}
    assert V.changed_axes(A.GRPO.replace(gamma=0.9)) == {"value model / GAE"}  # raw fields, read or not
    assert V.changed_axes(A.RPT_HYBRID, A.RPT) == {"extra loss terms"}
    assert V.changed_axes(A.GSPO_TOKEN, A.GSPO) == {"ratio level"}


def test_describe_changes_renders_the_computed_pairs():
    assert V.describe_changes(A.DAPO) == (
        "clipping: eps_high 0.2 -> 0.28; aggregation: seq_mean_token_mean -> group_token_mean; "
        "regulariser: kl k3 -> None, beta 0.04 -> 0.0; sampling & shaping: dynamic_sampling False -> True, "
        "overlong_filter False -> True, overlong_cache_frac None -> 0.2")
    assert V.describe_changes("GSPO_TOKEN", "GSPO") == "ratio level: sequence -> sequence_token"
    assert "tau_pos absent -> 1.0" in V.describe_changes(A.SAPO)


def test_unknown_algorithm_is_refused():
    with pytest.raises(ValueError, match="algo: unknown algorithm 'NOPE'"):
        V.axes_changed("NOPE")
    with pytest.raises(ValueError, match="reference"):
        V.changed_axes(A.DAPO, reference=3)


# ------------------------------------------------------------------------------------ check_axes
def test_check_axes_accepts_the_right_answer_in_any_case_and_order():
    assert V.check_axes(A.DAPO, ["Sampling & shaping", "regulariser", "AGGREGATION", " clipping "]) is True
    assert V.check_axes("RPT", "regulariser") is True
    assert V.check_axes(A.GRPO, []) is True
    assert V.check_axes(A.VAPO, {"clipping", "aggregation", "value model / GAE", "extra loss terms"},
                        reference=A.PPO) is True


def test_check_axes_names_the_missed_axis():
    with pytest.raises(ValueError) as err:
        V.check_axes(A.DAPO, {"clipping", "aggregation", "regulariser"})
    msg = str(err.value)
    assert "missed 1 axis: 'sampling & shaping' (dynamic_sampling False -> True" in msg
    assert "wrongly named" not in msg
    assert msg.startswith("DAPO against GRPO: ")


def test_check_axes_names_the_wrongly_named_axis():
    with pytest.raises(ValueError) as err:
        V.check_axes(A.GSPO, {"ratio level", "clipping", "regulariser", "aggregation"})
    msg = str(err.value)
    assert "wrongly named 1 axis" in msg and "'aggregation' (aggregation seq_mean_token_mean, max_tokens None)" in msg
    assert "missed" not in msg
    with pytest.raises(ValueError, match=r"missed 2 axes: .*wrongly named 1 axis"):
        V.check_axes(A.DAPO, {"clipping", "aggregation", "advantage"})


def test_check_axes_refuses_names_that_are_not_axes():
    with pytest.raises(ValueError, match="'eps_high' is a field of the axis 'clipping'"):
        V.check_axes(A.DAPO, {"eps_high"})
    with pytest.raises(ValueError, match="unknown axis 'clip'.*the axes are"):
        V.check_axes(A.DAPO, {"clip"})
    with pytest.raises(ValueError, match="strings"):
        V.check_axes(A.DAPO, [1])
    with pytest.raises(ValueError, match="collection"):
        V.check_axes(A.DAPO, 3)


# --------------------------------------------------------------------------------------- records
def test_records_cover_the_eleven_variants_in_book_order():
    assert list(RECORDS) == ["GRPO", "DAPO", "DR_GRPO", "GSPO", "CISPO", "VAPO", "RPT", "GMPO", "SAPO", "KL_COV",
                             "CLIP_COV"]
    with pytest.raises(TypeError):
        RECORDS["PPO"] = RECORDS["GRPO"]  # read-only


@pytest.mark.parametrize("key", list(RECORDS))
def test_each_record_names_a_preset_and_a_well_formed_source(key):
    rec = RECORDS[key]
    assert rec.preset == key
    assert isinstance(getattr(A, rec.preset), A.Algorithm) and A.PRESETS[rec.preset] is getattr(A, rec.preset)
    assert re.fullmatch(r"\d{4}\.\d{5}", rec.arxiv)
    assert rec.year == 2000 + int(rec.arxiv[:2])
    if rec.chapter is not None:
        assert (ROOT / "book" / f"{rec.chapter}.ipynb").is_file(), rec.chapter
    if rec.users != NOT_STATED:
        for who, cite in rec.users:
            assert who.strip() and re.search(r"arXiv \d{4}\.\d{5}|PDF", cite), cite
            assert re.search(r"§|Table|Eq\.|App\.|abstract", cite), f"{key}: citation without a section: {cite!r}"
            if key not in _ABSTRACT_ONLY:  # the papers the reference sheet covers: traced to it
                assert "papers.md §" in cite, f"{key}: citation not traced to papers.md: {cite!r}"
    for text in (rec.innovation, rec.pain_point, rec.typical_use, rec.paper, rec.sources):
        assert text.strip() and "  " not in text


_ABSTRACT_ONLY = ("GMPO", "SAPO", "KL_COV", "CLIP_COV")


def test_the_papers_the_sheet_does_not_cover_are_read_from_their_abstracts():
    # issue 57 (review item 5): the abstracts state these papers' motivation and users; no cell says "not recorded"
    assert not [k for k, r in RECORDS.items() if r.users == NOT_STATED]
    for k in _ABSTRACT_ONLY:
        rec = RECORDS[k]
        assert rec.chapter is None and "(abstract)" in rec.pain_point and "Not recorded" not in rec.pain_point
        assert all("abstract" in cite and rec.arxiv in cite for _, cite in rec.users), rec.users
    assert "Qwen3-VL" in RECORDS["SAPO"].users[0][0] and "Mixture-of-Experts" in RECORDS["SAPO"].pain_point
    # DeepSeekMath §4.1.1 states GRPO's motivation: the value model's memory and compute (item 3)
    assert "§4.1.1" in RECORDS["GRPO"].pain_point and "memory" in RECORDS["GRPO"].pain_point


def test_chapters_follow_the_table_of_contents():
    toc = (ROOT / "book" / "_toc.yml").read_text()
    chapters = [r.chapter for r in RECORDS.values() if r.chapter]
    assert chapters == sorted(chapters) and all(f"file: {c}" in toc for c in chapters)


@pytest.mark.parametrize("change, match", [
    ({"arxiv": "2503.1447"}, "NNNN.NNNNN"),
    ({"arxiv": "arXiv:2503.14476"}, "NNNN.NNNNN"),
    ({"year": 2024}, "not the year"),
    ({"users": ()}, "not stated"),
    ({"users": (("someone", ""),)}, "citation"),
    ({"users": "nobody"}, "not stated"),
    ({"innovation": " "}, "innovation"),
    ({"chapter": ""}, "chapter"),
])
def test_variant_record_refuses_malformed_values(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(RECORDS["DAPO"], **change)


def test_users_text():
    assert dataclasses.replace(RECORDS["GMPO"], users=NOT_STATED).users_text() == "not stated"
    assert RECORDS["SAPO"].users_text() == "the Qwen3-VL model series (arXiv 2511.20347 abstract)"
    assert RECORDS["CISPO"].users_text().startswith("MiniMax-M1 (456B total, 45.9B active parameters) (arXiv 2506.13585")
    assert RECORDS["GRPO"].users_text().count("; ") == len(RECORDS["GRPO"].users) - 1


# ----------------------------------------------------------------------------------------- table
def test_records_table_has_one_full_row_per_record():
    table = V.records_table()
    assert table.shape == (11, len(V.TABLE_COLUMNS)) and list(table.columns) == list(V.TABLE_COLUMNS)
    assert {"preset", "paper", "arXiv", "innovation", "pain point", "typical use", "users",
            "changes vs GRPO"} <= set(table.columns)
    assert not table.isna().any().any()
    empty = [(r, c) for r in range(len(table)) for c in table.columns if not str(table.iloc[r][c]).strip()]
    assert not empty, f"empty cells: {empty}"
    rows = table.set_index("preset")
    assert rows.loc["GRPO", "changes vs GRPO"] == "none"
    assert rows.loc["DAPO", "changes vs GRPO"] == V.describe_changes(A.DAPO)
    assert rows.loc["SAPO", "users"] == V.RECORDS["SAPO"].users_text() and rows.loc["SAPO", "chapter"] == "not covered"
    assert list(rows.index) == list(RECORDS)


def test_records_table_refuses_what_is_not_a_record():
    with pytest.raises(ValueError, match="VariantRecord"):
        V.records_table({"x": "not a record"})
    with pytest.raises(ValueError, match="mapping of preset name to VariantRecord"):
        V.records_table([RECORDS["GMPO"]])
    with pytest.raises(ValueError, match="unknown algorithm"):
        V.records_table({"X": dataclasses.replace(RECORDS["GMPO"], preset="NOT_A_PRESET")})


# ------------------------------------------------------------------------------------ house rules
def test_module_imports_only_algorithms_and_pandas_lazily():
    tree = ast.parse((ROOT / "grpo_lab" / "lab" / "variant_records.py").read_text())
    package = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("grpo_lab")):
            # ``from ..algo import algorithms`` names the module algo.algorithms; ``from ..algo.algorithms import X``
            # names it too; ``from ..algo import policy_loss`` would name algo.policy_loss and fail
            package += [f"{node.module}.{a.name}" if node.module == "algo" else f"{node.module}" for a in node.names]
        elif isinstance(node, ast.Import):
            package += [a.name for a in node.names if a.name.startswith("grpo_lab")]
    assert set(package) == {"algo.algorithms"}, package
    top = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    assert "pandas" not in top
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "records_table")
    assert any(isinstance(n, ast.Import) and n.names[0].name == "pandas" for n in ast.walk(fn))


def test_public_functions_say_what_they_return_and_raise():
    import inspect

    for name in V.__all__:
        obj = getattr(V, name)
        if inspect.isfunction(obj):
            doc = inspect.getdoc(obj)
            assert "Returns" in doc or "returns" in doc.lower(), name
            assert "Raises" in doc, name
