"""The book's figure style: one look, one colour per algorithm, means with bands over seeds.

* :func:`set_style` fixes the theme (seaborn ``whitegrid``, ``colorblind`` palette), the figure
  size (:data:`FIGSIZE`, inches) and resolution (:data:`DPI`), so every inline PNG in every
  chapter has the same size and the ``<Figure size WxH ...>`` text stored next to it is stable.
* :data:`ALGO_COLORS` / :data:`ALGO_ORDER` give each algorithm the same colour and legend
  position in every chapter (GRPO is always blue, DAPO always green, ...). Every colour, and
  every colour of :data:`EXTRA_COLORS` for other labels, has a WCAG contrast ratio of at least
  3:1 against the white page, so thin lines stay readable.
* :func:`legend_below` and :func:`legend_right` put a legend outside the axes, never on the data:
  one legend for a row or grid of panels under the whole figure, or one panel's legend to the
  right of a panel with nothing to its right.
* :func:`band_plot` draws one mean line and a band per algorithm (±1 sd, or the 95% t interval
  of the mean with ``band="ci95"``) from a long DataFrame with one row per (algorithm, seed, x);
  :func:`curves_grid` lays several metrics out as panels with one shared legend below them.

Means and standard deviations are computed with pandas and drawn with plain matplotlib
(``plot`` + ``fill_between``): no bootstrapping, so figures are deterministic. The lines and
bands are exactly the numbers :func:`mean_sd` returns. ``seaborn.lineplot`` (even with
``errorbar`` given the same t interval as a callable) would draw other numbers: its mean is
another summation (each x's values sorted by value, where :func:`mean_sd` takes a grouped mean
in seed order), so about one point in eight differs in the last bit, and it draws no band where an x has a single value (a gap where ``band_plot``
narrows to zero width, e.g. where one seed's run is shorter).
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.transforms import Bbox, IdentityTransform

__all__ = [
    "FIGSIZE",
    "DPI",
    "ALGO_ORDER",
    "ALGO_COLORS",
    "DEFAULT_HUE",
    "DEFAULT_SEED",
    "canonical_algo",
    "algo_color",
    "EXTRA_COLORS",
    "legend_below",
    "legend_right",
    "set_style",
    "mean_sd",
    "band_plot",
    "curves_grid",
    "fig_caption_safe",
]

#: Default figure size in inches (width, height) of a single-panel figure.
FIGSIZE: tuple[float, float] = (6.4, 3.6)
#: Resolution of inline PNGs and saved figures.
DPI: int = 110

#: Legend order of the algorithms, the same in every chapter. ``base`` is the untrained policy.
ALGO_ORDER: tuple[str, ...] = ("GRPO", "DR_GRPO", "DAPO", "GSPO", "CISPO", "VAPO", "PPO", "RPT", "DEEPSEEK_V32",
                                "base")

#: One fixed colour per algorithm, each with a WCAG contrast of 3 or more against white (GRPO blue,
#: DAPO bluish green, GSPO vermillion as in seaborn's colour-blind palette; the lighter colours of
#: that palette, below 3:1, replaced: Dr.GRPO wine, CISPO pink, VAPO brown, PPO dark green,
#: DeepSeek-V3.2's objective, :func:`grpo_lab.algo.algorithms.deepseek_v32`, indigo; ``RPT`` black;
#: ``base``, the untrained policy, dark grey and dashed). Chosen so that every pair stays apart
#: also under simulated deuteranopia and protanopia (tests/experiments/test_plotting_look.py checks both).
ALGO_COLORS: dict[str, str] = {
    "GRPO": "#0173b2",
    "DR_GRPO": "#a0306a",
    "DAPO": "#029e73",
    "GSPO": "#d55e00",
    "CISPO": "#d36fbb",
    "VAPO": "#8c564b",
    "PPO": "#185000",
    "RPT": "#000000",
    "DEEPSEEK_V32": "#332288",
    "base": "#767676",
}

#: Line styles that differ from solid (the untrained reference is dashed).
ALGO_LINESTYLES: dict[str, str] = {"base": "--"}

#: Colours for labels outside :data:`ALGO_COLORS` (ablations, user variants), none of them an
#: algorithm's, each at least 3:1 against white: purple, ochre, rose, navy, dark grey. Assigned in
#: sorted label order by :func:`algo_color`; a chapter may also take them in its own order.
EXTRA_COLORS: tuple[str, ...] = ("#7f3c8d", "#997700", "#e73f74", "#1f4e79", "#555555")

_ALIASES: dict[str, str] = {"DRGRPO": "DR_GRPO", "BASE": "base", "BASELINE": "base", "SFT": "base",
                             "DEEPSEEKV32": "DEEPSEEK_V32", "V32": "DEEPSEEK_V32"}


def canonical_algo(name: Any) -> str:
    """Map an algorithm label to its key in :data:`ALGO_COLORS` where one matches.

    Case, dots, dashes and spaces are ignored: ``"Dr.GRPO"``, ``"dr_grpo"``, ``"dr-grpo"`` and
    ``"DrGRPO"`` all give ``"DR_GRPO"``; ``"Base"`` gives ``"base"``. Other labels are returned
    unchanged (as strings).
    """
    text = str(name)
    key = re.sub(r"[\s.\-]+", "_", text.strip()).upper()
    key = _ALIASES.get(key.replace("_", ""), _ALIASES.get(key, key))
    if key in ALGO_COLORS:
        return key
    return text


def algo_color(name: Any, *, extra: Sequence[str] = ()) -> str:
    """Colour of an algorithm label (see :func:`canonical_algo`).

    A label outside :data:`ALGO_COLORS` gets a colour from a small reserve palette, chosen by
    its position among the sorted unknown labels in ``extra`` (pass all labels of the figure for
    a stable assignment), so the same figure always gets the same colours: :data:`EXTRA_COLORS`,
    repeating after its five colours.
    """
    key = canonical_algo(name)
    if key in ALGO_COLORS:
        return ALGO_COLORS[key]
    unknown = sorted({str(x) for x in extra if canonical_algo(x) not in ALGO_COLORS} | {key})
    return EXTRA_COLORS[unknown.index(key) % len(EXTRA_COLORS)]


def set_style() -> None:
    """Apply the book's matplotlib/seaborn style to the current session.

    seaborn theme ``context="notebook", style="whitegrid", palette="colorblind"``, figure size
    :data:`FIGSIZE`, dpi :data:`DPI` for display and ``savefig``, no top/right spines, frameless
    legends, and a fixed SVG hash salt so figures saved as SVG for print are byte-stable.
    Called by :func:`grpo_lab.lab.book.setup_notebook`; safe to call again.
    """
    import matplotlib as mpl
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    mpl.rcParams.update(
        {
            "figure.figsize": FIGSIZE,
            "figure.dpi": DPI,
            "savefig.dpi": DPI,
            "savefig.bbox": "tight",
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.titlesize": "medium",
            "axes.labelsize": "medium",
            "legend.frameon": False,
            "legend.fontsize": "small",
            "lines.linewidth": 1.8,
            "svg.hashsalt": "grpo_lab",
            "svg.fonttype": "none",
            "figure.max_open_warning": 50,
        }
    )


def _ordered(labels: Iterable[Any], order: Sequence[Any] | None) -> list[Any]:
    """Return the distinct ``labels`` in ``order`` (if given) else :data:`ALGO_ORDER`, then the rest sorted."""
    labels = list(dict.fromkeys(labels))
    if order is not None:
        return [x for x in order if x in labels]
    rank = {name: i for i, name in enumerate(ALGO_ORDER)}

    def key(x: Any) -> tuple[int, str]:
        return (rank.get(canonical_algo(x), len(rank)), str(x))

    return sorted(labels, key=key)


#: The default ``hue`` column of :func:`mean_sd`, :func:`band_plot` and :func:`curves_grid`;
#: it may be absent (a single ``Trainer.history`` has none), and then all rows are one line.
DEFAULT_HUE: str = "algo"
#: The default ``seed`` column of the same functions; it may be absent too, and then all rows
#: are one run.
DEFAULT_SEED: str = "seed"


def _resolve_columns(
    df: pd.DataFrame, x: str, y: str, hue: str | None, seed: str | None, caller: str
) -> tuple[str | None, str | None]:
    """The ``(hue, seed)`` columns to group by, ``None`` where there is none to group by.

    The default columns (:data:`DEFAULT_HUE`, :data:`DEFAULT_SEED`) are optional: when ``df``
    lacks one, it is treated as absent (all rows one line; all rows one run). Any other column
    named by the caller (``x``, ``y``, a non-default ``hue`` or ``seed``) must exist.

    Raises:
        KeyError: the missing columns, each with its role, and the columns ``df`` has.
    """
    if hue == DEFAULT_HUE and hue not in df.columns:
        hue = None
    if seed == DEFAULT_SEED and seed not in df.columns:
        seed = None
    named = {"x": x, "y": y, "hue": hue, "seed": seed}
    missing = [f"{col!r} ({role})" for role, col in named.items() if col is not None and col not in df.columns]
    if missing:
        raise KeyError(f"{caller}: column {', '.join(missing)} not in the DataFrame (its columns: {list(df.columns)})")
    return hue, seed


def mean_sd(
    df: pd.DataFrame,
    x: str,
    y: str,
    hue: str | None = DEFAULT_HUE,
    *,
    seed: str | None = DEFAULT_SEED,
    smooth: int | None = None,
) -> pd.DataFrame:
    """Mean and sample standard deviation of ``y`` over seeds, per ``hue`` and ``x``.

    Input: a long DataFrame with one row per (hue, seed, x) and columns ``x``, ``y``, ``seed``
    (and ``hue`` unless None). The default ``hue`` (``"algo"``) and ``seed`` (``"seed"``) columns
    may be absent, as in a single :attr:`grpo_lab.training.trainer.Trainer.history`: without ``algo`` all
    rows form one group (as ``hue=None``), without ``seed`` (or with ``seed=None``) all rows are
    one run, so the statistics at each ``x`` are over the rows at that ``x`` (one row per step
    gives ``sd = 0``, ``n = 1``). If ``smooth`` is given, each seed's curve is first smoothed with
    a trailing moving average of that many points (``min_periods=1``; state it in the caption).

    Returns a DataFrame with columns ``[hue,] x, mean, sd, n`` (``hue`` only when grouped by it):
    ``sd`` uses ``ddof=1`` and is 0 where only one seed is present; ``n`` is the number of seeds
    averaged. Rows with NaN ``y`` are ignored.

    Raises:
        KeyError: ``x``, ``y``, or a ``hue`` / ``seed`` other than the defaults, is not a column
            (the message names each missing column and its role).
    """
    hue, seed = _resolve_columns(df, x, y, hue, seed, "mean_sd")
    keys = [hue] if hue is not None else []
    runs = [*keys, seed] if seed is not None else keys
    data = df[[*runs, x, y]].dropna(subset=[y]).sort_values([*runs, x], kind="stable")
    if smooth is not None and smooth > 1:
        data = data.copy()

        def trailing(s):
            return s.rolling(int(smooth), min_periods=1).mean()

        data[y] = data.groupby(runs, sort=False)[y].transform(trailing) if runs else trailing(data[y])
    grouped = data.groupby([*keys, x], sort=True)[y]
    out = pd.DataFrame({"mean": grouped.mean(), "sd": grouped.std(ddof=1), "n": grouped.count()})
    out["sd"] = out["sd"].fillna(0.0)
    return out.reset_index()


def band_plot(
    ax: Axes,
    df: pd.DataFrame,
    x: str,
    y: str,
    hue: str | None = DEFAULT_HUE,
    *,
    seed: str | None = DEFAULT_SEED,
    order: Sequence[Any] | None = None,
    colors: Mapping[Any, str] | None = None,
    smooth: int | None = None,
    alpha: float = 0.2,
    label: str | None = None,
    legend: bool = False,
    title: str | None = None,
    band: str = "sd",
    bounds: tuple[float, float] | None = None,
) -> pd.DataFrame:
    """Draw mean ``y`` against ``x`` with a band over seeds, one line per ``hue`` value.

    Input: a long DataFrame, one row per (hue value, seed, x), e.g. trainer histories with ``algo``
    and ``seed`` columns; a single :attr:`grpo_lab.training.trainer.Trainer.history` (no ``algo``, no
    ``seed``) is one line (labelled ``label``, else ``y``). ``band="sd"`` (default): mean ± one sample
    standard deviation; ``band="ci95"``: ``mean ± t_{0.975, n-1} sd / sqrt(n)``; one seed: zero width.
    ``bounds=(low, high)`` clips the band to the metric's range. ``smooth``: a per-seed trailing moving
    average first (:func:`mean_sd`). Colours from :data:`ALGO_COLORS` (``colors``), legend order from
    :data:`ALGO_ORDER` (``order``).

    Sets the axis labels to the column names unless already set, the title if given, and, with
    ``legend``, this panel's legend under the figure (:func:`legend_below`).

    Returns:
        The plotted statistics (:func:`mean_sd`).

    Raises:
        KeyError: a column named by ``x``, ``y``, or a non-default ``hue`` / ``seed`` is missing
            (the message names them).
        ValueError: ``band`` is not ``"sd"`` or ``"ci95"``.
    """
    if band not in ("sd", "ci95"):
        raise ValueError(f"band must be 'sd' or 'ci95', got {band!r}")
    hue, seed = _resolve_columns(df, x, y, hue, seed, "band_plot")
    stats = mean_sd(df, x, y, hue, seed=seed, smooth=smooth)
    if band == "ci95":
        from scipy.stats import t as student_t

        n = stats["n"].to_numpy(dtype=float)
        q = np.where(n > 1, student_t.ppf(0.975, np.maximum(n - 1, 1)), 0.0)
        stats["half"] = q * stats["sd"].to_numpy(dtype=float) / np.sqrt(n)
    else:
        stats["half"] = stats["sd"]
    groups: list[tuple[Any, pd.DataFrame]]
    if hue is None:
        groups = [(label if label is not None else y, stats)]
    else:
        labels = _ordered(stats[hue].tolist(), order)
        groups = [(lab, stats[stats[hue] == lab]) for lab in labels]
    all_labels = [g[0] for g in groups]
    for lab, part in groups:
        part = part.sort_values(x)
        xs = part[x].to_numpy()
        mean = part["mean"].to_numpy(dtype=float)
        half = part["half"].to_numpy(dtype=float)
        lo, hi = mean - half, mean + half
        if bounds is not None:
            lo, hi = np.clip(lo, *bounds), np.clip(hi, *bounds)
        color = (colors or {}).get(lab) or algo_color(lab, extra=all_labels)
        style = ALGO_LINESTYLES.get(canonical_algo(lab), "-")
        ax.plot(xs, mean, color=color, linestyle=style, label=str(lab))
        ax.fill_between(xs, lo, hi, color=color, alpha=alpha, linewidth=0)
    if not ax.get_xlabel():
        ax.set_xlabel(x)
    if not ax.get_ylabel():
        ax.set_ylabel(y)
    if title is not None:
        ax.set_title(title)
    if legend:
        legend_below(ax.figure, [ax])
    return stats.drop(columns="half")


def _handles_labels(axes: Iterable[Axes]) -> tuple[list[Any], list[str]]:
    """The legend entries of ``axes`` in order, each label once (its first handle)."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(text, handle)
    return list(seen.values()), list(seen)


class _LegendBelowPanels(Legend):
    """A figure legend that hangs below the lowest panel decoration, measured at every draw.

    Its anchor is the bottom of the lowest panel's tick numbers and axis label, recomputed with
    the renderer each time the legend is drawn or measured, so a layout applied after
    :func:`legend_below` (``tight_layout``, constrained layout, the tight bounding box of
    ``savefig``) moves the legend with the panels.
    """

    def _anchor_below(self, renderer: Any) -> None:
        fig = self.figure
        if renderer is None:  # as matplotlib's own Legend.get_window_extent does
            renderer = fig._get_renderer()
        # (not the figure's own bottom edge: savefig's tight bounding box moves that edge to
        # include this legend, so measuring from it would push the legend out of the image)
        boxes = [ax.get_tightbbox(renderer) for ax in fig.axes if ax.get_visible()]
        y = min([b.y0 for b in boxes if b is not None], default=fig.bbox.y0)
        self.set_bbox_to_anchor(Bbox([[fig.bbox.x0, y], [fig.bbox.x1, y]]), transform=IdentityTransform())

    def draw(self, renderer: Any) -> None:
        """Re-anchor below the panels, then draw (matplotlib's Legend.draw)."""
        self._anchor_below(renderer)
        super().draw(renderer)

    def get_window_extent(self, renderer: Any = None) -> Any:
        """Re-anchor below the panels, then measure (matplotlib's Legend.get_window_extent)."""
        self._anchor_below(renderer)
        return super().get_window_extent(renderer)


def legend_below(
    fig: Figure, axes: Sequence[Axes] | None = None, *, ncols: int | None = None, title: str | None = None
) -> Any:
    """One legend for the figure, centred under all its panels, so it never covers data.

    Args:
        fig: the Figure.
        axes: the panels whose labelled artists form the legend, each label once, in order
            (default: every panel of ``fig``).
        ncols: legend columns (default: all entries in one row, up to 4 per row).
        title: an optional legend title.

    The legend hangs from the lowest panel's tick numbers and axis label (``loc="upper center"``),
    measured whenever the figure is drawn (so call it before or after ``tight_layout``, as
    convenient): it is below every axis label and tick number. The book saves and displays
    figures with ``bbox_inches="tight"`` (:func:`set_style`), which grows the image to include
    it. Any layout works (plain, ``tight_layout``, constrained). A legend earlier placed by this
    function on the same figure is replaced, so calling it twice never stacks two.

    Returns:
        The :class:`matplotlib.legend.Legend`.

    Raises:
        ValueError: the panels have no labelled artist (nothing to put in a legend).
    """
    handles, labels = _handles_labels(fig.axes if axes is None else axes)
    if not handles:
        raise ValueError("legend_below: no labelled line, band or marker in the given panels")
    for old in [leg for leg in fig.legends if isinstance(leg, _LegendBelowPanels)]:
        old.remove()
    legend = _LegendBelowPanels(fig, handles, labels, loc="upper center", ncols=ncols or min(len(labels), 4),
                                title=title, frameon=False)
    fig.legends.append(legend)
    legend._remove_method = fig.legends.remove
    fig.stale = True
    return legend


def legend_right(ax: Axes, *, title: str | None = None) -> Any:
    """The legend of one panel, outside it on the right (for a panel with nothing to its right).

    Args:
        ax: the panel; its labelled artists form the legend.
        title: an optional legend title.

    Returns:
        The :class:`matplotlib.legend.Legend` (placed at axes coordinates ``(1.02, 0.5)``,
        vertically centred; the tight bounding box of the saved figure includes it).

    Raises:
        ValueError: the panel has no labelled artist.
    """
    handles, labels = _handles_labels([ax])
    if not handles:
        raise ValueError("legend_right: no labelled line, band or marker in the panel")
    return ax.legend(handles, labels, loc="center left", bbox_to_anchor=(1.02, 0.5), title=title, frameon=False)


def curves_grid(
    df: pd.DataFrame,
    metrics: Sequence[tuple[str, str]],
    *,
    ncols: int = 3,
    x: str = "step",
    hue: str | None = DEFAULT_HUE,
    seed: str | None = DEFAULT_SEED,
    order: Sequence[Any] | None = None,
    colors: Mapping[Any, str] | None = None,
    smooth: int | None = None,
    panel_size: tuple[float, float] = (3.0, 2.4),
    xlabel: str | None = None,
    suptitle: str | None = None,
    band: str = "sd",
) -> Figure:
    """A grid of :func:`band_plot` panels, one per metric, with one shared legend below.

    Every panel shows its own x tick numbers (the panels share the x range, but a panel above a
    hidden one, or any upper row, would otherwise lose them); the legend is :func:`legend_below`.

    Input: the same long DataFrame as :func:`band_plot`; ``metrics`` is a list of
    ``(column, panel title)`` pairs, e.g. ``[("reward", "reward"), ("entropy", "entropy (nats)")]``.
    The figure shows each metric's mean and band over seeds (``band``, as in :func:`band_plot`) against ``x`` (default ``"step"``), one
    colour per algorithm, panels filled row by row; unused panels are hidden. The figure is
    ``ncols × panel_size[0]`` wide and ``nrows × panel_size[1]`` tall (plus the legend row).
    A single ``Trainer.history`` (no ``algo`` column) gives one line per panel and no legend.
    Returns the Figure (not shown, not closed: glue it or let the cell display it).

    Raises:
        ValueError: ``metrics`` is empty.
        KeyError: as :func:`band_plot` (a missing column, named).
    """
    import matplotlib.pyplot as plt

    if not metrics:
        raise ValueError("metrics must name at least one (column, title) pair")
    hue, seed = _resolve_columns(df, x, metrics[0][0], hue, seed, "curves_grid")
    ncols = max(1, min(int(ncols), len(metrics)))
    nrows = math.ceil(len(metrics) / ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(panel_size[0] * ncols, panel_size[1] * nrows + 0.5),
        squeeze=False,
        sharex=True,
        layout="constrained",
    )
    flat = axes.ravel()
    for ax, (column, title) in zip(flat, metrics):
        band_plot(ax, df, x, column, hue, seed=seed, order=order, colors=colors, smooth=smooth, title=title,
                  band=band)
        ax.set_ylabel("")
        ax.set_xlabel(xlabel if xlabel is not None else x)
    for ax in flat[len(metrics):]:
        ax.set_visible(False)
    for ax in flat[:len(metrics)]:
        ax.tick_params(labelbottom=True)  # sharex would keep the numbers of the bottom row only
    if hue is not None and flat[0].get_legend_handles_labels()[0]:
        legend_below(fig, [flat[0]], ncols=min(len(flat[0].get_legend_handles_labels()[1]), 6))
    if suptitle:
        fig.suptitle(suptitle)
    return fig


_MYST_SPECIAL = re.compile(r"([\\`*_{}\[\]<>|$#])")


def fig_caption_safe(text: Any) -> str:
    """Turn generated text into a one-line caption that MyST renders literally.

    Collapses whitespace (newlines included) to single spaces and backslash-escapes the
    characters MyST would otherwise interpret (`` ` * _ { } [ ] < > | $ # \\ ``). Use it on captions
    built from data (algorithm names like ``DR_GRPO``, config strings) before gluing them as text.
    """
    collapsed = " ".join(str(text).split())
    return _MYST_SPECIAL.sub(r"\\\1", collapsed)
