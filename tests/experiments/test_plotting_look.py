"""The book's look: colours readable on white and apart, legends off the data, numbers on every panel.

Contrast is the WCAG 2 ratio ``(L1 + 0.05) / (L2 + 0.05)`` of relative luminances
(https://www.w3.org/TR/WCAG21/#dfn-contrast-ratio); 3:1 is WCAG's minimum for graphics such as
lines (success criterion 1.4.11). Colour distance is CIE76 ΔE in CIELAB (D65), also after
simulating deuteranopia and protanopia with the severity-1 matrices of Machado, Oliveira and
Fernandes (2009) applied in linear RGB; and CIEDE2000 (Sharma, Wu and Dalal 2005), which weighs hue, chroma and
lightness as the eye does (CIE76 overstates distances between saturated blues).
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from grpo_lab.experiments import plotting  # noqa: E402

#: WCAG 1.4.11: graphical objects need 3:1 against the adjacent colour (the white page).
MIN_CONTRAST = 3.0
#: Smallest CIE76 distance between two algorithms' colours, normal colour vision / simulated CVD.
MIN_DELTA_E = 20.0
MIN_DELTA_E_CVD = 7.5

_DEUTERANOPIA = np.array([[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                          [-0.011820, 0.042940, 0.968881]])
_PROTANOPIA = np.array([[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                        [-0.003882, -0.048116, 1.051998]])


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _linear(color: str) -> np.ndarray:
    c = np.asarray(to_rgb(color))
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _contrast(color: str, background: str = "#ffffff") -> float:
    """WCAG 2 contrast ratio of two colours (1 to 21)."""
    lum = [float(_linear(c) @ [0.2126, 0.7152, 0.0722]) for c in (color, background)]
    return (max(lum) + 0.05) / (min(lum) + 0.05)


def _lab(linear_rgb: np.ndarray) -> np.ndarray:
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear_rgb
    f = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(f > 0.008856, np.cbrt(f), 7.787 * f + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _delta_e(a: str, b: str, vision: np.ndarray | None = None) -> float:
    m = np.eye(3) if vision is None else vision
    return float(np.linalg.norm(_lab(np.clip(m @ _linear(a), 0, 1)) - _lab(np.clip(m @ _linear(b), 0, 1))))


def test_wcag_contrast_formula_matches_known_values():
    assert _contrast("#000000") == pytest.approx(21.0)
    assert _contrast("#ffffff") == pytest.approx(1.0)
    assert _contrast("#767676") == pytest.approx(4.54, abs=0.01)  # the classic "AA on white" grey
    assert _contrast("#ece133") < MIN_CONTRAST  # the yellow chapter 2 used to draw
    assert _contrast("#ffffff", "#000000") == _contrast("#000000", "#ffffff")


@pytest.mark.parametrize("name", [*plotting.ALGO_COLORS, *(f"extra {c}" for c in plotting.EXTRA_COLORS)])
def test_every_book_colour_reads_on_white(name: str):
    color = plotting.ALGO_COLORS.get(name) or name.removeprefix("extra ")
    ratio = _contrast(color)
    assert ratio >= MIN_CONTRAST, f"{name} ({color}): contrast {ratio:.2f}:1 against white, below {MIN_CONTRAST}:1"


@pytest.mark.parametrize("vision, minimum", [(None, MIN_DELTA_E), (_DEUTERANOPIA, MIN_DELTA_E_CVD),
                                             (_PROTANOPIA, MIN_DELTA_E_CVD)], ids=["normal", "deutan", "protan"])
def test_algorithm_colours_stay_apart(vision, minimum):
    pairs = itertools.combinations(plotting.ALGO_COLORS.items(), 2)
    close = [(a, b, round(_delta_e(ca, cb, vision), 1)) for (a, ca), (b, cb) in pairs
             if _delta_e(ca, cb, vision) < minimum]
    assert not close, f"algorithm colours closer than ΔE {minimum}: {close}"
    extra = plotting.EXTRA_COLORS
    assert len(set(extra)) == len(extra) and not set(extra) & set(plotting.ALGO_COLORS.values())


#: Smallest CIEDE2000 distance between two algorithms' colours (normal vision). CIE76 overstates distances among
#: saturated blues: GRPO #0173b2 and the teal PPO had before issue 58 were 20+ apart in CIE76, 16.0 in CIEDE2000,
#: and read as one blue in figure 6.3.
MIN_DELTA_E_2000 = 20.0


def _ciede2000(lab1, lab2) -> float:
    """CIEDE2000 colour difference (kL = kC = kH = 1), as written in Sharma, Wu and Dalal (2005), Eqs. 1-17."""
    (L1, a1, b1), (L2, a2, b2) = lab1, lab2
    c_bar = (np.hypot(a1, b1) + np.hypot(a2, b2)) / 2
    g = 0.5 * (1 - np.sqrt(c_bar ** 7 / (c_bar ** 7 + 25.0 ** 7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = np.hypot(a1p, b1), np.hypot(a2p, b2)
    h1p = np.degrees(np.arctan2(b1, a1p)) % 360 if c1p else 0.0
    h2p = np.degrees(np.arctan2(b2, a2p)) % 360 if c2p else 0.0
    dh = 0.0 if c1p * c2p == 0 else (h2p - h1p + 180) % 360 - 180
    d_hp = 2 * np.sqrt(c1p * c2p) * np.sin(np.radians(dh / 2))
    l_bar, cp_bar = (L1 + L2) / 2, (c1p + c2p) / 2
    if c1p * c2p == 0:
        h_bar = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        h_bar = (h1p + h2p) / 2
    else:
        h_bar = (h1p + h2p + 360) / 2 if h1p + h2p < 360 else (h1p + h2p - 360) / 2
    t = (1 - 0.17 * np.cos(np.radians(h_bar - 30)) + 0.24 * np.cos(np.radians(2 * h_bar))
         + 0.32 * np.cos(np.radians(3 * h_bar + 6)) - 0.20 * np.cos(np.radians(4 * h_bar - 63)))
    r_c = 2 * np.sqrt(cp_bar ** 7 / (cp_bar ** 7 + 25.0 ** 7))
    s_l = 1 + 0.015 * (l_bar - 50) ** 2 / np.sqrt(20 + (l_bar - 50) ** 2)
    s_c, s_h = 1 + 0.045 * cp_bar, 1 + 0.015 * cp_bar * t
    r_t = -np.sin(np.radians(60 * np.exp(-(((h_bar - 275) / 25) ** 2)))) * r_c
    dl, dc, dhh = (L2 - L1) / s_l, (c2p - c1p) / s_c, d_hp / s_h
    return float(np.sqrt(dl ** 2 + dc ** 2 + dhh ** 2 + r_t * dc * dhh))


@pytest.mark.parametrize("lab1, lab2, expected", [  # pairs 1, 7, 17 and 25 of Sharma, Wu and Dalal's test data
    ((50.0, 2.6772, -79.7751), (50.0, 0.0, -82.7485), 2.0425),
    ((50.0, 0.0, 0.0), (50.0, -1.0, 2.0), 2.3669),
    ((50.0, 2.5, 0.0), (73.0, 25.0, -18.0), 27.1492),
    ((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387), 1.2644),
])
def test_ciede2000_matches_the_published_test_data(lab1, lab2, expected):
    assert _ciede2000(lab1, lab2) == pytest.approx(expected, abs=1e-4)
    assert _ciede2000(lab2, lab1) == pytest.approx(expected, abs=1e-4)


def test_algorithm_colours_are_perceptually_distinct():
    # every pair of algorithms, GRPO and PPO included (figure 6.3 draws both), at least MIN_DELTA_E_2000 apart
    pairs = itertools.combinations(plotting.ALGO_COLORS.items(), 2)
    distances = {(a, b): _ciede2000(_lab(_linear(ca)), _lab(_linear(cb))) for (a, ca), (b, cb) in pairs}
    close = {k: round(v, 1) for k, v in distances.items() if v < MIN_DELTA_E_2000}
    assert not close, f"algorithm colours closer than CIEDE2000 {MIN_DELTA_E_2000}: {close}"
    assert _ciede2000(_lab(_linear("#0173b2")), _lab(_linear("#0f8fa8"))) < MIN_DELTA_E_2000  # the old GRPO / PPO pair fails


def _frame(n_algos: int = 3) -> pd.DataFrame:
    """Curves that fill their panels (rising, falling, flat), so a legend inside would cover data."""
    rng = np.random.default_rng(0)
    rows = []
    for k, algo in enumerate(["GRPO", "DAPO", "GSPO", "CISPO"][:n_algos]):
        for seed in range(3):
            for step in range(40):
                y = [step / 40, 1 - step / 40, 0.5][k % 3] + 0.05 * rng.standard_normal()
                rows.append({"algo": algo, "seed": seed, "step": step, "reward": y, "kl": y / 10})
    return pd.DataFrame(rows)


def _bbox(artist, fig):
    fig.canvas.draw()
    return artist.get_window_extent(fig.canvas.get_renderer())


def test_legend_below_sits_under_every_panel():
    fig, axes = plt.subplots(1, 3, figsize=(9.6, 2.9))
    df = _frame()
    for ax, column in zip(axes, ("reward", "kl", "reward")):
        plotting.band_plot(ax, df, "step", column, legend=ax is axes[0])
    legend = fig.legends[0]
    box = _bbox(legend, fig)
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in axes)
    assert [t.get_text() for t in legend.get_texts()] == ["GRPO", "DAPO", "GSPO"]
    for ax in axes:
        panel = ax.get_tightbbox(fig.canvas.get_renderer())  # the panel with its tick labels and axis label
        assert box.y1 <= panel.y0, f"legend (top {box.y1:.0f}) overlaps a panel (bottom {panel.y0:.0f})"
    plotting.legend_below(fig)  # again, over all panels: replaces the first, never stacks
    assert len(fig.legends) == 1


def test_legend_right_sits_beside_its_panel():
    fig, ax = plt.subplots()
    plotting.band_plot(ax, _frame(), "step", "reward")
    legend = plotting.legend_right(ax)
    box, panel = _bbox(legend, fig), ax.get_window_extent()
    assert box.x0 >= panel.x1, "the legend overlaps the panel"


def test_legends_need_labelled_artists():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    with pytest.raises(ValueError, match="no labelled"):
        plotting.legend_below(fig)
    with pytest.raises(ValueError, match="no labelled"):
        plotting.legend_right(ax)


def test_curves_grid_gives_every_panel_its_x_numbers():
    """Five metrics in a 2x3 grid: the panel above the hidden sixth, and the whole upper row, keep their numbers."""
    metrics = [("reward", "a"), ("kl", "b"), ("reward", "c"), ("kl", "d"), ("reward", "e")]
    fig = plotting.curves_grid(_frame(), metrics, ncols=3)
    fig.canvas.draw()
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 5
    for ax in visible:
        shown = [t.get_text() for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        assert shown, f"panel {ax.get_title()!r} has no x tick numbers"
    legend_box = _bbox(fig.legends[0], fig)
    assert all(legend_box.y1 <= ax.get_tightbbox().y0 for ax in visible)


def test_legend_below_is_drawn_in_the_saved_tight_image():
    """savefig's tight bounding box grows to the legend, and the legend is drawn there (not cut off)."""
    import io

    from matplotlib.image import imread

    def saved(fig) -> np.ndarray:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", bbox_inches="tight", facecolor="white")
        return imread(io.BytesIO(buffer.getvalue()))[..., :3]

    fig, axes = plt.subplots(1, 2, figsize=(6.4, 2.4))
    for ax in axes:
        plotting.band_plot(ax, _frame(), "step", "reward")
        ax.set_xlabel("RL step")
    fig.tight_layout()
    plain = saved(fig)
    legend = plotting.legend_below(fig, [axes[0]])
    fig.tight_layout()  # again, after the legend: the legend follows the panels
    image = saved(fig)
    assert image.shape[0] > plain.shape[0] + 0.5 * _bbox(legend, fig).height, "the image did not grow to the legend"
    added = image[plain.shape[0]:]  # the rows the legend added at the bottom
    assert (added.mean(axis=2) < 0.6).mean() > 0.002, "the legend is not drawn in the rows added for it"
