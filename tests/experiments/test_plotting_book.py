"""Tests of the book helpers: grpo_lab.experiments.plotting (figure style, mean ± sd bands) and grpo_lab.lab.book."""

from __future__ import annotations

import os
import random
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from grpo_lab.lab import book
from grpo_lab.experiments import plotting  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _restore_global_state():
    """setup_notebook/set_style change rcParams and environment variables: undo after each test."""
    rc = matplotlib.rcParams.copy()
    env = dict(os.environ)
    yield
    plt.close("all")
    matplotlib.rcParams.update(rc)
    os.environ.clear()
    os.environ.update(env)


def _long_frame() -> pd.DataFrame:
    """Two algorithms (listed DAPO first), three seeds, three x values; hand-checkable numbers."""
    rows = []
    values = {  # algo -> seed -> y at steps 0, 1, 2
        "DAPO": {0: [1.0, 2.0, 3.0], 1: [3.0, 4.0, 5.0], 2: [2.0, 6.0, 4.0]},
        "GRPO": {0: [0.0, 0.0, 1.0], 1: [0.0, 1.0, 1.0], 2: [0.0, 2.0, 1.0]},
    }
    for algo, per_seed in values.items():
        for seed, ys in per_seed.items():
            for step, y in enumerate(ys):
                rows.append({"algo": algo, "seed": seed, "step": step, "reward": y})
    return pd.DataFrame(rows)


def _band_limits(collection, xs) -> list[tuple[float, float]]:
    """(lower, upper) of a fill_between polygon at each x."""
    vertices = np.concatenate([p.vertices for p in collection.get_paths()])
    out = []
    for x in xs:
        ys = vertices[np.isclose(vertices[:, 0], x), 1]
        out.append((ys.min(), ys.max()))
    return out


# ---------------------------------------------------------------------------- plotting


def test_mean_sd_matches_hand_computation():
    stats = plotting.mean_sd(_long_frame(), "step", "reward")
    dapo = stats[stats.algo == "DAPO"].set_index("step")
    # step 1: seeds give 2, 4, 6 -> mean 4, sample sd 2
    assert dapo.loc[1, "mean"] == pytest.approx(4.0)
    assert dapo.loc[1, "sd"] == pytest.approx(2.0)
    assert dapo.loc[1, "n"] == 3
    # step 2: 3, 5, 4 -> mean 4, sd 1
    assert dapo.loc[2, "mean"] == pytest.approx(4.0)
    assert dapo.loc[2, "sd"] == pytest.approx(1.0)


def test_band_plot_draws_mean_line_and_sd_band():
    fig, ax = plt.subplots()
    plotting.band_plot(ax, _long_frame(), "step", "reward")
    # legend order follows ALGO_ORDER (GRPO before DAPO), not the order in the frame
    assert [line.get_label() for line in ax.lines] == ["GRPO", "DAPO"]
    grpo, dapo = ax.lines
    np.testing.assert_allclose(dapo.get_xdata(), [0, 1, 2])
    np.testing.assert_allclose(dapo.get_ydata(), [2.0, 4.0, 4.0])
    np.testing.assert_allclose(grpo.get_ydata(), [0.0, 1.0, 1.0])
    assert matplotlib.colors.to_hex(dapo.get_color()) == plotting.ALGO_COLORS["DAPO"]
    assert matplotlib.colors.to_hex(grpo.get_color()) == plotting.ALGO_COLORS["GRPO"]
    # DAPO band: sd over seeds is 1, 2, 1 at steps 0, 1, 2
    limits = _band_limits(ax.collections[1], [0, 1, 2])
    np.testing.assert_allclose(limits, [(1.0, 3.0), (2.0, 6.0), (3.0, 5.0)])
    assert ax.get_xlabel() == "step" and ax.get_ylabel() == "reward"


def test_band_plot_single_seed_has_zero_width_band_and_no_hue():
    df = pd.DataFrame({"seed": [0, 0, 0], "step": [0, 1, 2], "loss": [3.0, 2.0, 1.5]})
    fig, ax = plt.subplots()
    stats = plotting.band_plot(ax, df, "step", "loss", hue=None, label="loss")
    assert (stats["sd"] == 0).all()
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [3.0, 2.0, 1.5])
    assert ax.lines[0].get_label() == "loss"


def test_band_plot_smoothing_is_a_trailing_mean_per_seed():
    df = pd.DataFrame({"algo": "GRPO", "seed": 0, "step": [0, 1, 2, 3], "reward": [0.0, 2.0, 4.0, 6.0]})
    fig, ax = plt.subplots()
    plotting.band_plot(ax, df, "step", "reward", smooth=2)
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.0, 1.0, 3.0, 5.0])


def test_mean_sd_ignores_nan_and_reports_missing_columns():
    df = pd.DataFrame({"algo": "PPO", "seed": [0, 1], "step": [0, 0], "kl": [1.0, np.nan]})
    stats = plotting.mean_sd(df, "step", "kl")
    assert stats.loc[0, "mean"] == 1.0 and stats.loc[0, "n"] == 1 and stats.loc[0, "sd"] == 0.0
    with pytest.raises(KeyError, match="entropy"):
        plotting.mean_sd(df, "step", "entropy")


def _single_history() -> pd.DataFrame:
    """A frame shaped like one ``Trainer.history``: no ``algo`` and no ``seed`` column, an
    evaluation-only first row (NaN training metrics), evaluation merged into step 2's row.
    Hand-checkable numbers."""
    return pd.DataFrame(
        [
            {"step": 0, "test_accuracy": 0.25},
            {"step": 1, "reward": 0.5, "entropy": 1.2},
            {"step": 2, "reward": 0.75, "entropy": 1.0, "test_accuracy": 0.5},
            {"step": 3, "reward": 1.0, "entropy": 0.9},
        ]
    )


def test_band_plot_draws_a_single_trainer_history_as_one_line():
    # Used to raise KeyError: 'algo' (issue 15, item 5).
    fig, ax = plt.subplots()
    stats = plotting.band_plot(ax, _single_history(), "step", "reward")
    assert len(ax.lines) == 1 and ax.lines[0].get_label() == "reward"
    np.testing.assert_allclose(ax.lines[0].get_xdata(), [1, 2, 3])  # step 0 has no reward: dropped
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.5, 0.75, 1.0])
    # one run: n = 1 and a zero-width band at every step
    assert list(stats.columns) == ["step", "mean", "sd", "n"]
    assert (stats["n"] == 1).all() and (stats["sd"] == 0).all()
    np.testing.assert_allclose(_band_limits(ax.collections[0], [1, 2, 3]), [(0.5, 0.5), (0.75, 0.75), (1.0, 1.0)])

    fig, ax = plt.subplots()
    plotting.band_plot(ax, _single_history(), "step", "test_accuracy", label="greedy", band="ci95", smooth=2)
    assert ax.lines[0].get_label() == "greedy"
    # trailing mean over 2 points of the evaluation rows only: 0.25, (0.25 + 0.5) / 2
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.25, 0.375])


def test_mean_sd_without_seed_column_takes_the_band_over_the_rows_at_each_x():
    df = pd.DataFrame({"algo": ["GRPO", "GRPO", "GRPO", "DAPO"], "step": [0, 0, 1, 0], "reward": [1.0, 3.0, 2.0, 5.0]})
    stats = plotting.mean_sd(df, "step", "reward").set_index(["algo", "step"])
    # GRPO step 0: rows 1 and 3 -> mean 2, sample sd sqrt(((1-2)^2 + (3-2)^2) / 1) = sqrt(2)
    assert stats.loc[("GRPO", 0), "mean"] == pytest.approx(2.0)
    assert stats.loc[("GRPO", 0), "sd"] == pytest.approx(np.sqrt(2.0))
    assert stats.loc[("GRPO", 0), "n"] == 2
    assert stats.loc[("DAPO", 0), "mean"] == 5.0 and stats.loc[("DAPO", 0), "sd"] == 0.0
    # seed=None says the same explicitly, even when a seed column exists
    with_seed = df.assign(seed=[0, 1, 0, 0])
    pd.testing.assert_frame_equal(plotting.mean_sd(with_seed, "step", "reward", seed=None),
                                  plotting.mean_sd(df, "step", "reward"))


@pytest.mark.parametrize(
    "kwargs, missing",
    [
        ({"x": "epoch", "y": "reward"}, "'epoch' (x)"),
        ({"x": "step", "y": "kl"}, "'kl' (y)"),
        ({"x": "step", "y": "reward", "hue": "variant"}, "'variant' (hue)"),
        ({"x": "step", "y": "reward", "seed": "run"}, "'run' (seed)"),
    ],
)
def test_band_plot_names_a_missing_column_and_its_role(kwargs, missing):
    fig, ax = plt.subplots()
    with pytest.raises(KeyError) as info:
        plotting.band_plot(ax, _single_history(), **kwargs)
    message = str(info.value)
    assert missing in message and "band_plot" in message and "'test_accuracy'" in message  # lists the columns


def test_band_plot_names_every_missing_column_at_once():
    fig, ax = plt.subplots()
    with pytest.raises(KeyError, match=r"'epoch' \(x\), 'kl' \(y\)"):
        plotting.band_plot(ax, _single_history(), "epoch", "kl")


def test_curves_grid_on_a_single_history_has_one_line_per_panel_and_no_legend():
    fig = plotting.curves_grid(_single_history(), [("reward", "reward"), ("entropy", "entropy (nats)")])
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["reward", "entropy (nats)"]
    assert [len(ax.lines) for ax in visible] == [1, 1]
    np.testing.assert_allclose(visible[1].lines[0].get_ydata(), [1.2, 1.0, 0.9])
    assert not fig.legends


def test_curves_grid_has_one_panel_per_metric_and_one_shared_legend():
    df = _long_frame().assign(kl=lambda d: d.reward / 10)
    fig = plotting.curves_grid(df, [("reward", "reward"), ("kl", "KL"), ("reward", "again"), ("kl", "KL again")], ncols=3)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(fig.axes) == 6 and len(visible) == 4
    assert [ax.get_title() for ax in visible] == ["reward", "KL", "again", "KL again"]
    assert len(fig.legends) == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["GRPO", "DAPO"]
    assert all(ax.get_legend() is None for ax in visible)
    with pytest.raises(ValueError):
        plotting.curves_grid(df, [])


def test_algo_colours_are_fixed_distinct_and_cover_the_order():
    assert set(plotting.ALGO_ORDER) == set(plotting.ALGO_COLORS)
    assert len(set(plotting.ALGO_COLORS.values())) == len(plotting.ALGO_COLORS)
    # the reserve palette for unknown labels never repeats an algorithm's colour
    assert not set(plotting.EXTRA_COLORS) & set(plotting.ALGO_COLORS.values())
    for label in ("DeepSeek-V3.2", "deepseek_v32", "V3.2"):
        assert plotting.algo_color(label) == plotting.ALGO_COLORS["DEEPSEEK_V32"], label
    for alias in ("Dr.GRPO", "dr_grpo", "dr-grpo", "DrGRPO"):
        assert plotting.canonical_algo(alias) == "DR_GRPO"
    assert plotting.canonical_algo("Base") == "base"
    assert plotting.algo_color("gspo") == plotting.ALGO_COLORS["GSPO"]
    # unknown labels get reserve colours, stable and distinct within one figure
    extra = ["my_variant", "another"]
    c1, c2 = (plotting.algo_color(x, extra=extra) for x in extra)
    assert c1 != c2 and c1 not in plotting.ALGO_COLORS.values()
    assert plotting.algo_color("my_variant", extra=extra) == c1


def test_plotting_annotations_resolve_at_run_time():
    # the signatures' types are imported for real (no TYPE_CHECKING block), so they resolve
    import typing

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    assert typing.get_type_hints(plotting.band_plot)["ax"] is Axes
    assert typing.get_type_hints(plotting.mean_sd)["return"] is pd.DataFrame
    assert typing.get_type_hints(plotting.curves_grid)["return"] is Figure


def test_set_style_fixes_size_and_resolution():
    plotting.set_style()
    assert tuple(matplotlib.rcParams["figure.figsize"]) == plotting.FIGSIZE
    assert matplotlib.rcParams["figure.dpi"] == plotting.DPI
    fig = plt.figure()
    w, h = fig.get_size_inches() * fig.dpi
    assert repr(fig) == f"<Figure size {w:g}x{h:g} with 0 Axes>"


def test_fig_caption_safe():
    assert plotting.fig_caption_safe("DR_GRPO vs\n  *DAPO*") == r"DR\_GRPO vs \*DAPO\*"
    assert plotting.fig_caption_safe("mean ± sd over 3 seeds") == "mean ± sd over 3 seeds"


# ---------------------------------------------------------------------------- book helpers


def test_setup_notebook_prints_nothing_and_seeds_deterministically(capfd):
    import torch

    def draw():
        return random.random(), float(np.random.rand()), torch.rand(3).tolist()

    book.setup_notebook(seed=123)
    first = draw()
    book.setup_notebook(seed=123)
    assert draw() == first
    book.setup_notebook(seed=124)
    assert draw() != first
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"
    assert tuple(matplotlib.rcParams["figure.figsize"]) == plotting.FIGSIZE


def test_setup_notebook_threads_is_optional():
    import torch

    before = torch.get_num_threads()
    try:
        book.setup_notebook(threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    book.setup_notebook()
    assert torch.get_num_threads() == before


def test_glue_shim_without_myst_nb(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "myst_nb", None)  # `import myst_nb` now raises ImportError
    monkeypatch.setattr(book, "in_notebook", lambda: True)  # as on Colab
    book.glue("hidden", 0.123)
    assert capsys.readouterr().out == ""
    book.glue("shown", 0.123, display=True)
    assert "0.123" in capsys.readouterr().out


def test_glue_forwards_to_myst_nb_in_a_kernel(monkeypatch):
    calls = []
    fake = types.ModuleType("myst_nb")
    fake.glue = lambda name, value, display=True: calls.append((name, value, display))
    monkeypatch.setitem(sys.modules, "myst_nb", fake)
    monkeypatch.setattr(book, "in_notebook", lambda: True)
    book.glue("acc", 0.5)
    book.glue("acc2", 0.25, display=True)
    assert calls == [("acc", 0.5, False), ("acc2", 0.25, True)]


def test_glue_outside_a_kernel_is_silent_and_closes_figures(capsys):
    fig, ax = plt.subplots()
    book.glue("fig_x", fig)
    assert not plt.fignum_exists(fig.number)
    assert capsys.readouterr().out == ""


def test_in_colab_and_device(monkeypatch):
    import torch

    assert book.in_colab() is ("google.colab" in sys.modules)
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert book.in_colab() is True
    assert book.device() == ("cuda" if torch.cuda.is_available() else "cpu")
    assert book.in_notebook() is False


def test_execute_notebook_gives_a_quiet_fresh_run_with_png_figures(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# t"),
        nbformat.v4.new_code_cell("from grpo_lab.experiments import plotting\nfrom grpo_lab.lab import book\nbook.setup_notebook()"),
        nbformat.v4.new_code_cell("import warnings\nwarnings.warn('old', DeprecationWarning)\nprint(1 + 1)"),
        nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([0, 1])\nbook.glue('fig_t', fig)\nbook.glue('x', 0.5)"),
        nbformat.v4.new_code_cell("fig, ax = plt.subplots()\nax.plot([1, 0])\nplt.show()"),
    ]
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, path)
    pythonpath = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    book.execute_notebook(path, timeout=120, env={"PYTHONPATH": pythonpath})
    out = nbformat.read(path, as_version=4)
    code = [c for c in out.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == [1, 2, 3, 4]
    assert out.metadata.kernelspec.name == "python3"
    assert code[0].outputs == []  # setup_notebook is silent
    assert [o.get("text") for o in code[1].outputs] == ["2\n"]  # warning filtered, no stderr
    assert all("execution" not in c.metadata for c in code)  # no timing metadata
    glued = [k for o in code[2].outputs for k in o.get("data", {})]
    assert "application/papermill.record/image/png" in glued
    assert not any(k.endswith("svg+xml") for k in glued)
    assert [o.output_type for o in code[2].outputs] == ["display_data", "display_data"]  # glued fig not re-shown
    shown = code[3].outputs[0]["data"]
    assert "image/png" in shown and "image/svg+xml" not in shown
    w, h = (round(v * plotting.DPI) for v in plotting.FIGSIZE)
    assert shown["text/plain"] == f"<Figure size {w}x{h} with 1 Axes>"


def test_glue_stores_a_dataframe_with_whole_cells(monkeypatch):
    """A glued table keeps its long text cells whole: pandas' default (50 characters) cut the regime tables'
    sentences with '...' in the built book (chapters 5 and 6)."""
    import pandas as pd

    sentence = "the share of the reward in the critic target is small early on, hundreds of tokens back"
    stored = []
    fake = types.ModuleType("myst_nb")
    fake.glue = lambda name, value, display=True: stored.append(value._repr_html_())  # rendered while glued
    monkeypatch.setitem(sys.modules, "myst_nb", fake)
    monkeypatch.setattr(book, "in_notebook", lambda: True)
    book.glue("table", pd.DataFrame({"precondition": [sentence]}))
    assert sentence in stored[0]
    assert "..." not in stored[0]
    assert pd.get_option("display.max_colwidth") == 50  # the option is restored afterwards
