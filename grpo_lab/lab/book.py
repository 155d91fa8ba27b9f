"""Notebook plumbing for the GRPO Lab book.

Every chapter starts with::

    from grpo_lab.lab import book
    book.setup_notebook()

which makes a fresh kernel reproducible and quiet (seeds, warning filters, no Hugging Face
progress bars or advisory logs, the book's figure style, inline PNG figures). It prints nothing,
so the cell's stored output is empty and stable under ``pytest --nbval``.

:func:`glue` wraps :func:`myst_nb.glue` so that a chapter also runs where myst-nb is not
installed (Google Colab, a plain ``python`` session). :func:`execute_notebook` produces the
committed reference outputs of a chapter: a fresh kernel, cells in order, outputs written back
in place (``python -m grpo_lab.lab.book execute book/01_grpo.ipynb``).

This module imports only the standard library at import time; numpy, torch, matplotlib,
IPython, transformers, myst-nb and nbclient are imported when a function needs them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import random
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

__all__ = [
    "setup_notebook",
    "glue",
    "glued",
    "run_time",
    "cache_note",
    "in_colab",
    "in_notebook",
    "device",
    "execute_notebook",
    "show_gpu_results",
    "gpu_regime",
    "GPU_REGIME_COLUMNS",
    "gpu_time_table",
    "CHAPTER_PROFILES",
]

#: Environment variables set by :func:`setup_notebook`. They also take effect for libraries
#: imported later in the session (transformers and huggingface_hub read them at import time).
QUIET_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",  # read when datasets is imported
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# (category, module regex) pairs silenced by setup_notebook. Deprecation chatter from the
# scientific stack changes with every release and would make the stored outputs drift; user
# warnings raised by grpo_lab itself are *not* silenced: they carry meaning.
_SILENCED_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (DeprecationWarning, ""),
    (PendingDeprecationWarning, ""),
    (FutureWarning, ""),
    (UserWarning, r"(transformers|huggingface_hub|tokenizers|torch|seaborn|matplotlib)(\..*)?"),
    (Warning, r"tqdm(\..*)?"),  # e.g. TqdmWarning "IProgress not found" when ipywidgets is absent
    (RuntimeWarning, r"(seaborn|pandas|numpy)(\..*)?"),
)

#: Warning categories a chapter silences because it measures and shows what they say:
#: ``DynamicSamplingShortfallWarning`` (steps that trained on fewer than ``prompts_per_step`` groups),
#: which chapters 2 and 7 report as the history's ``samples_per_trained`` and ``trained_groups``
#: (chapter 7: the share of full batches, in its regime table).
_MEASURED_WARNINGS = ("DynamicSamplingShortfallWarning",)


def in_colab() -> bool:
    """Return True when running inside Google Colab.

    Detection is by the ``google.colab`` module, which Colab imports into every kernel before
    the first cell runs; nothing is imported to find out.
    """
    return "google.colab" in sys.modules


def _ipython_shell() -> Any | None:
    """Return the running IPython shell, or None outside IPython (or without IPython)."""
    if "IPython" not in sys.modules:
        return None
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython partially installed
        return None
    return get_ipython()


def in_notebook() -> bool:
    """Return True inside a Jupyter kernel (a notebook, nbclient, nbval, Colab).

    A terminal IPython session or plain ``python`` returns False.
    """
    shell = _ipython_shell()
    return shell is not None and hasattr(shell, "kernel")


def device() -> str:
    """Return ``"cuda"`` when a CUDA device is available to torch, else ``"cpu"``.

    Chapters pass the result to models and tensors; the CPU profile never needs a GPU.
    """
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and every CUDA device)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds all CUDA devices
    if torch.backends.cudnn.is_available():
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def _quiet_warnings() -> None:
    """Install the warning filters of :data:`_SILENCED_WARNINGS` (idempotent)."""
    from ..training import learning_signal

    for category, module in _SILENCED_WARNINGS:
        warnings.filterwarnings("ignore", category=category, module=module)
    for name in _MEASURED_WARNINGS:
        warnings.filterwarnings("ignore", category=getattr(learning_signal, name))


def _quiet_huggingface() -> None:
    """Silence transformers / huggingface_hub logs, and their and datasets' progress bars, if installed."""
    for key, value in QUIET_ENV.items():
        os.environ[key] = value
    if importlib.util.find_spec("transformers") is not None:
        try:
            import transformers

            transformers.logging.set_verbosity_error()
            transformers.logging.disable_progress_bar()
        except Exception:  # pragma: no cover - a broken install must not break a chapter
            pass
    if importlib.util.find_spec("huggingface_hub") is not None:
        try:
            from huggingface_hub.utils import disable_progress_bars

            disable_progress_bars()
        except Exception:  # pragma: no cover
            pass
    if "datasets" in sys.modules:  # imported before the environment variable was set
        try:
            sys.modules["datasets"].disable_progress_bars()
        except Exception:  # pragma: no cover
            pass


def _inline_png() -> None:
    """Inside a Jupyter kernel, make matplotlib emit inline PNG only (never SVG).

    SVG outputs embed random ids and dates and would be compared by nbval; PNG is skipped by
    nbval and is what the book renders. Outside a kernel this does nothing.
    """
    shell = _ipython_shell()
    if shell is None or not hasattr(shell, "kernel"):
        return
    try:
        shell.run_line_magic("config", "InlineBackend.figure_formats = ['png']")
        # Keep rcParams under the book's control: the inline backend must not re-apply its own.
        shell.run_line_magic("config", "InlineBackend.rc = {}")
        shell.run_line_magic("matplotlib", "inline")
    except Exception:  # pragma: no cover - unusual front ends
        pass


#: The values of a chapter's ``PROFILE`` parameter.
CHAPTER_PROFILES = ("cpu", "gpu", "colab")


def setup_notebook(seed: int = 0, *, threads: int | None = None, profile: str | None = None) -> None:
    """Prepare a chapter's kernel: reproducible, quiet, book-styled. Prints nothing.

    Args:
        seed: Seed for Python's ``random``, NumPy's global generator and torch (CPU and CUDA).
            Experiments seed their own generators per run as well; this one covers the ad-hoc
            tensors of the chapter's worked examples.
        threads: If given, ``torch.set_num_threads(threads)``. ``None`` (default) leaves torch's
            choice alone; CPU results in this book are bit-identical across thread counts, but
            wall times are not.
        profile: the chapter's ``PROFILE`` parameter, checked first (``None``: not checked).

    Raises:
        ValueError: ``profile`` is not one of :data:`CHAPTER_PROFILES` (a misspelled ``"GPU"``
            would otherwise run the chapter as on CPU without a word).

    Effects:

    * warning filters for deprecation chatter and library ``UserWarning`` s (not grpo_lab's);
    * ``transformers`` verbosity ``error``, no advisory warnings, Hugging Face progress bars off
      (environment variables are set as well, so libraries imported later obey them);
    * :func:`grpo_lab.experiments.plotting.set_style` (fixed figure size, dpi, palette);
    * inside a Jupyter kernel, ``%config InlineBackend.figure_formats = ['png']``.

    Returns ``None`` and writes nothing to stdout/stderr, so the setup cell has no output.
    """
    if profile is not None and profile not in CHAPTER_PROFILES:
        raise ValueError(f"PROFILE must be one of {CHAPTER_PROFILES} (set in the chapter's parameters cell), got "
                         f"{profile!r}")
    _quiet_warnings()
    _quiet_huggingface()
    _seed_everything(seed)
    if threads is not None:
        import torch

        torch.set_num_threads(int(threads))
    _inline_png()  # before set_style: activating the inline backend may touch rcParams
    from grpo_lab.experiments import plotting

    plotting.set_style()


def _close_if_figure(value: Any) -> None:
    """Close a pyplot-managed matplotlib figure so the inline backend does not show it again."""
    if "matplotlib.figure" not in sys.modules:
        return
    from matplotlib.figure import Figure

    if isinstance(value, Figure) and "matplotlib.pyplot" in sys.modules:
        import matplotlib.pyplot as plt

        plt.close(value)


def run_time(start: float) -> str:
    """A chapter's run time for its **Run time** line: the minutes since ``start`` (a
    ``time.perf_counter()`` reading taken when the chapter began), and where its training runs came
    from (:func:`grpo_lab.experiments.run_tally`): ``"3.1 minutes from an empty run cache"`` when
    every run was trained, else ``"0.2 minutes, 14 of 15 runs read from the run cache"``, so that a
    re-execution never passes off a cache hit as the chapter's cost; ``"12 seconds, with no training
    run"`` for a chapter that trained nothing and read nothing from the cache. When ``make book`` executes
    chapters side by side (``$GRPO_LAB_CHAPTERS_AT_ONCE`` above 1, set by ``scripts/execute_cache.py``),
    it adds ``", while make book executed up to one other chapter on the same cores (alone it takes less)"``.

    Raises:
        ValueError: ``start`` is not a finite number, or is later than now.
    """
    from ..experiments import run_tally

    import math

    if isinstance(start, bool) or not isinstance(start, (int, float)) or not math.isfinite(start):
        raise ValueError(f"run_time: start must be a finite time.perf_counter() reading, got {start!r}")
    seconds = time.perf_counter() - float(start)
    if seconds < 0:
        raise ValueError(f"run_time: start ({start!r}) is later than time.perf_counter() now")
    t = run_tally()
    beside = f", {_beside()} (alone it takes less)" if _beside() else ""
    if t["loaded"] == 0 and t["trained"] == 0:  # a chapter that reads results files and trains nothing
        return f"{seconds:.0f} seconds, with no training run{beside}"
    if t["loaded"] == 0:
        return f"{seconds / 60:.1f} minutes from an empty run cache{beside}"
    return (f"{seconds / 60:.1f} minutes, {t['loaded']} of {t['loaded'] + t['trained']} runs read from the run "
            f"cache{beside}")


def _beside() -> str:
    """``""``, or, when ``$GRPO_LAB_CHAPTERS_AT_ONCE`` is above 1 (``make book`` executes that many chapters
    at the same time: ``scripts/execute_cache.py``), ``"while make book executed up to one other chapter on
    the same cores"`` ("up to": a chapter may also run alone for a while), so that a stated time is not read
    as what the chapter takes alone. Anything but a plain ASCII count adds nothing."""
    n = os.environ.get("GRPO_LAB_CHAPTERS_AT_ONCE", "").strip()
    if not (n.isascii() and n.isdigit()) or int(n) < 2:
        return ""
    others = "one other chapter" if int(n) == 2 else f"{int(n) - 1} other chapters"
    return f"while make book executed up to {others} on the same cores"


def cache_note(results: Any) -> str:
    """``""`` when every seed of ``results`` was trained, else ``" (N of M seeded runs read from the
    run cache)"``: appended to a cell's "trained ... in N s" line, so that a cache hit's seconds are
    not read as the training's cost; under ``make book``'s side-by-side execution (see :func:`run_time`)
    the note also says that another chapter shared the cores: ``" (while make book executed ...; alone it
    takes less)"``, after the cache count when there is one (``" (2 of 5 ...; while make book ...)"``).

    Args:
        results: a :class:`grpo_lab.experiments.RunResult` (what ``run`` returns), a mapping of them
            (what ``run_grid`` returns) or a sequence of them.

    Raises:
        TypeError: something that is not a RunResult, or a dict, list or tuple of them.
    """
    from ..experiments import RunResult

    many = list(results.values()) if isinstance(results, dict) else (
        [results] if isinstance(results, RunResult) else
        list(results) if isinstance(results, (list, tuple)) else [results])
    if not all(isinstance(r, RunResult) for r in many):
        raise TypeError(f"cache_note: expected RunResult(s), got {type(results).__name__}")
    loaded = sum(len(r.provenance.get("cached_seeds", [])) for r in many)
    total = sum(len(r.provenance.get("seeds", [])) for r in many)
    notes = ([f"{loaded} of {total} seeded runs read from the run cache"] if loaded else []) + \
        ([f"{_beside()}; alone it takes less"] if _beside() else [])
    return f" ({'; '.join(notes)})" if notes else ""


def glue(name: str, value: Any, display: bool = False) -> None:
    """Store ``value`` under ``name`` for the book's prose; a Colab-safe :func:`myst_nb.glue`.

    Args:
        name: Glue key, unique within the notebook. Refer to it in the same chapter with
            ``{glue:text}`name:.3f```, ``{glue:figure} name`` or ``{glue:}`name```; from another
            page prefix the document name: ``{glue:text}`01_grpo::name```.
        value: Any displayable object: a number, a string, a pandas DataFrame, a matplotlib
            Figure. What is stored is its *display* (text/plain, text/html, image/png), so round
            numbers before gluing them (``round(x, 3)``): the stored text is compared by nbval.
        display: Also show the value in the notebook output (default False).

    Behaviour:

    * In a Jupyter kernel with myst-nb installed: calls :func:`myst_nb.glue`.
    * Without myst-nb (Colab) or outside a kernel: shows the value when ``display`` is True
      (``IPython.display.display`` in IPython, ``print`` otherwise), else does nothing.
    * A matplotlib Figure is closed after gluing, so the inline backend does not render it a
      second time at the end of the cell.
    * A pandas DataFrame is stored with every cell whole (``display.max_colwidth`` unset while it
      is rendered): pandas' default cuts text cells at 50 characters with "...", which would cut the
      sentences of a regime table in the built book.
    """
    import contextlib

    whole = contextlib.nullcontext()
    if type(value).__name__ == "DataFrame" and type(value).__module__.startswith("pandas"):
        import pandas as pd

        whole = pd.option_context("display.max_colwidth", None)
    glue_fn = None
    if in_notebook():
        try:
            from myst_nb import glue as glue_fn
        except ImportError:
            glue_fn = None
    with whole:
        if glue_fn is not None:
            glue_fn(name, value, display=display)
        elif display:
            _show(value)
    _close_if_figure(value)


def glued(chapter: str, name: str, book_dir: str | os.PathLike | None = None) -> str:
    """The text another chapter glued under ``name``, read from its committed, executed notebook.

    Chapter 8 quotes the measurements of chapters 1-7 this way, so that no number of theirs is typed
    twice: the value is what :func:`glue` stored in ``book/<chapter>.ipynb`` (its ``text/plain``
    display; a glued string is returned without its quotes). It reads the committed notebook, not a
    run in progress: a chapter re-executed with other results must be committed before the chapter
    that quotes it is executed again.

    Args:
        chapter: the notebook's file stem (``"06_vapo"``).
        name: the glue key.
        book_dir: the folder holding the notebooks; default the repository's ``book/``.

    Returns:
        the stored text (``str``); a number is returned as its display text (``"0.404"``), a figure
        as its repr (``"<Figure size 1265x462 with 2 Axes>"``), which says nothing: quote numbers and
        sentences.

    Raises:
        FileNotFoundError: no ``<chapter>.ipynb`` in ``book_dir``.
        KeyError: the notebook glues nothing under ``name`` (the message lists how many names it glues).
        ValueError: the glued value has no ``text/plain`` display (an image glued alone).
    """
    import ast
    import json

    from ..paths import REPO_ROOT

    folder = Path(book_dir) if book_dir is not None else REPO_ROOT / "book"
    path = folder / f"{chapter}.ipynb"
    if not path.is_file():
        raise FileNotFoundError(f"glued: no notebook {path} for chapter {chapter!r}")
    found = {}
    for cell in json.loads(path.read_text(encoding="utf-8")).get("cells", []):
        for out in cell.get("outputs", []):
            meta = out.get("metadata", {}).get("scrapbook")
            if meta and "name" in meta:
                found[meta["name"]] = out.get("data", {}).get(meta.get("mime_prefix", "") + "text/plain")
    if name not in found:
        raise KeyError(f"glued: {chapter}.ipynb glues no {name!r} ({len(found)} names glued there)")
    text = found[name]
    if text is None:
        raise ValueError(f"glued: {chapter}:{name} has no text/plain display (a figure or table?)")
    text = "".join(text) if isinstance(text, list) else text
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return ast.literal_eval(text)
    return text


def gpu_time_table(runs: int, *, steps: int | None = None, generation_factor: float = 1.0,
                   train_factor: float = 1.0, too_small: Sequence[str] = (), profile: Any = None) -> "Any":
    """Expected wall time of ``runs`` runs of the ``"gpu"`` profile (or ``profile``) on a
    T4-class and an H100-class GPU (:func:`grpo_lab.experiments.expected_gpu_minutes`, from
    assumed speeds, not measurements), as a one-row DataFrame of hours rounded to 0.1; a GPU class
    in ``too_small`` reads "does not fit" instead (the run needs more memory than it has).

    Raises:
        ValueError: as :func:`grpo_lab.experiments.expected_gpu_minutes`.
    """
    import pandas as pd

    from grpo_lab import experiments

    prof = profile if profile is not None else experiments.get_profile("gpu")
    row = {f"{gpu}-class GPU (hours, estimated)": "does not fit" if gpu in too_small else
           round(experiments.expected_gpu_minutes(prof, runs, gpu, steps=steps, generation_factor=generation_factor,
                                                  train_factor=train_factor) / 60, 1)
           for gpu in ("T4", "H100")}
    return pd.DataFrame([{"runs": runs, **row}])


def show_gpu_results(chapter: str, algos: Sequence[Any], *, baseline: str | None = None,
                     seeds: Sequence[int] = (0, 1, 2, 3, 4), steps: int | None = None,
                     generation_factor: float = 1.0, train_factor: float = 1.0,
                     columns: Sequence[str] = ("test_accuracy",), too_small: Sequence[str] = (),
                     directory: str | os.PathLike[str] | None = None, profile: Any = None,
                     paper_regime: Mapping[str, Mapping[str, str]] | None = None) -> Any:
    """A chapter's results on the ``"gpu"`` profile (``profile``, default
    :func:`grpo_lab.lab.chapter_gpu_profile`: GSM8K; chapter 7, next-token reasoning), when
    they exist.

    With ``<chapter>.json`` in :func:`grpo_lab.lab.results_dir` (or ``directory``):
    checks the GPU facts (:func:`grpo_lab.lab.check_gpu_results`; an ``AssertionError``
    names the one that failed), prints the provenance in one line, displays the run's regime
    (:func:`gpu_regime`, with the ``paper_regime`` rows beside it), then
    :func:`grpo_lab.experiments.summarize_runs` for each history column of ``columns`` (default
    the greedy test accuracy: base and final, paired changes, differences from ``baseline``),
    draws test accuracy against step, one colour per algorithm, and returns the summaries,
    ``{column: DataFrame}``. Without it: prints what ``PROFILE = "gpu"``
    would train (``algos`` × ``seeds``, ``steps``) and its expected time on a T4-class and an
    H100-class GPU (:func:`gpu_time_table`), and returns ``None``.

    ``paper_regime``: the paper's values of the regime measures, as :func:`gpu_regime`'s ``paper``.

    Raises:
        ValueError: a malformed ``chapter`` or results file; a stored regime value that is ±inf or a
            fraction outside [0, 1] (:func:`gpu_regime`, naming the algorithm and the measure); a
            malformed ``paper_regime`` (also TypeError), checked whether or not results exist.
        AssertionError: a GPU fact does not hold for the stored results.
    """
    from grpo_lab import experiments, lab

    names = [a if isinstance(a, str) else a.name for a in algos]
    prof = profile if profile is not None else lab.chapter_gpu_profile(chapter)
    steps = prof.steps if steps is None else steps
    _paper_regime_rows(paper_regime, {})  # a malformed one fails on every machine, not only where results exist
    loaded = lab.load_chapter_gpu(chapter, directory)
    if loaded is None:
        _print_gpu_plan(chapter, names, seeds, steps, prof, directory, generation_factor=generation_factor,
                        train_factor=train_factor, too_small=too_small)
        return None
    results, prov = loaded
    lab.check_gpu_results(results, prov)
    _print_gpu_provenance(prov)
    regime = gpu_regime(results, paper_regime)
    if not regime.empty:
        print("the run's regime (mean over its RL steps, [95% t interval] over seeds)"
              + (", with the paper's values below it" if paper_regime else "")
              + ": read the differences as the paper's mechanism only where the regime is the paper's:")
        import pandas as pd

        with pd.option_context("display.max_colwidth", None):  # the paper's rows are sentences: not cut at 50
            _show(regime)
    summary = {}
    for column in columns:
        summary[column] = experiments.summarize_runs(results, baseline=baseline, column=column)
        print(f"{column} (mean [95% t interval] over seeds; differences paired by seed):")
        _show(summary[column])
    _show_accuracy_by_step(results)
    return summary


#: What :func:`gpu_regime` measures: history column -> its label (the preconditions of the chapters' mechanisms).
GPU_REGIME_COLUMNS = {"clip_frac": "tokens clipped (fraction)", "zero_adv_group_frac": "tied groups (fraction)",
                      "truncation_rate": "responses truncated (fraction)", "length": "response length (tokens)"}


def gpu_regime(results: dict, paper: Mapping[str, Mapping[str, str]] | None = None) -> Any:
    """The regime a (GPU) run trained in, per algorithm: the mean over its RL steps (step > 0) of each
    column of :data:`GPU_REGIME_COLUMNS` it has, as ``"mean [95% t interval]"`` over seeds
    (:func:`grpo_lab.experiments.stats.t_interval`; fractions clipped to [0, 1]): how often the clip
    acted, how many groups carried no signal, how many responses hit the budget, how long they were.
    A chapter sets these beside the paper's (``paper``) before it reads a difference as the paper's
    mechanism. NaN steps are skipped; one seed reads ``"(1 seed: no interval)"``, fewer seeds than the
    algorithm's ``"(k of m seeds)"``, a missing measure "not measured".

    Args:
        results: ``{algorithm name: RunResult}`` (:func:`grpo_lab.lab.load_chapter_gpu`).
        paper: ``{row label: {measure label: the paper's value, as text}}``, measure labels values of
            :data:`GPU_REGIME_COLUMNS` (a missing one reads "not reported"); rows after the runs'.

    Returns:
        A DataFrame, one row per algorithm with any measure (then the ``paper`` rows); columns
        ``seeds`` then one per measure, as text; empty when no algorithm has a measure.

    Raises:
        TypeError: ``results`` is not a dict of RunResult values (the first offending entry named);
            ``paper`` is not a mapping of mappings of str.
        ValueError: an RL step's value that is ±inf, or a fraction outside [0, 1] (beyond 1e-6),
            naming algorithm, measure, seed and step; a ``paper`` measure not in
            :data:`GPU_REGIME_COLUMNS`; a ``paper`` row label that is also an algorithm's name.
    """
    import pandas as pd

    from ..experiments import RunResult

    if not isinstance(results, dict):
        raise TypeError(f"gpu_regime: expected {{algorithm name: RunResult}}, got {type(results).__name__}")
    for name, r in results.items():
        if not isinstance(r, RunResult):
            raise TypeError(f"gpu_regime: results[{name!r}] is a {type(r).__name__}, not a RunResult")
    rows = {}
    for name, r in results.items():
        row = _regime_row(name, r.history)
        if row:
            rows[name] = row
    paper_rows = _paper_regime_rows(paper, results)
    if not rows:
        return pd.DataFrame()
    labels = list(GPU_REGIME_COLUMNS.values())
    measures = [m for m in labels if any(m in r for r in rows.values())]
    measures += [m for m in labels if m not in measures and any(m in r for r in paper_rows.values())]
    table = {k: {"seeds": v["seeds"], **{m: v.get(m, "not measured") for m in measures}} for k, v in rows.items()}
    table.update({k: {"seeds": "not reported", **{m: v.get(m, "not reported") for m in measures}}
                  for k, v in paper_rows.items()})
    return pd.DataFrame.from_dict(table, orient="index")


def _regime_row(name: str, h: Any) -> dict[str, Any]:
    """One algorithm's row of :func:`gpu_regime`: ``{"seeds": m, measure label: text}``, or ``{}``
    without ``step``/``seed`` columns or any measure. Raises its ValueErrors."""
    import numpy as np

    from grpo_lab.experiments import stats

    if "step" not in h.columns or "seed" not in h.columns:
        return {}
    train = h[h["step"] > 0]
    n_seeds = int(train["seed"].nunique())
    row: dict[str, Any] = {}
    for col, label in GPU_REGIME_COLUMNS.items():
        if col not in train.columns or not train[col].notna().any():
            continue
        values = train[col].astype(float)
        fraction = col != "length"
        bad = np.isinf(values) | (fraction & ((values < -1e-6) | (values > 1 + 1e-6)))
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            value, seed, step = float(values.iloc[i]), train["seed"].iloc[i], train["step"].iloc[i]
            what = "is not finite" if np.isinf(value) else "is outside [0, 1], and this measure is a fraction"
            raise ValueError(f"gpu_regime: algorithm {name!r}, measure {label!r} (history column {col!r}): "
                             f"{value} at seed {seed}, step {step} {what} ({int(bad.sum())} such value(s))")
        per_seed = values.groupby(train["seed"]).mean().dropna().to_numpy()
        iv = stats.t_interval(per_seed, bounds=(0.0, 1.0) if fraction else None)
        of = f"{iv.n} of {n_seeds} seeds" if iv.n < n_seeds else f"{iv.n} seed" + ("s" if iv.n > 1 else "")
        if iv.n == 1:  # no spread to estimate: a bare mean, never a zero-width interval
            row[label] = f"{stats.format_interval(iv, 3).split(' ')[0]} ({of}: no interval)"
        else:
            row[label] = stats.format_interval(iv, 3) + (f" ({of})" if iv.n < n_seeds else "")
    return {"seeds": n_seeds, **row} if row else {}


def _paper_regime_rows(paper: Any, results: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """``paper`` of :func:`gpu_regime`, checked: ``{}`` for ``None``."""
    if paper is None:
        return {}
    if not isinstance(paper, Mapping):
        raise TypeError(f"gpu_regime: paper must be {{row label: {{measure label: text}}}}, got {type(paper).__name__}")
    labels = list(GPU_REGIME_COLUMNS.values())
    out = {}
    for row, values in paper.items():
        if not isinstance(row, str):
            raise TypeError(f"gpu_regime: paper's row labels must be str, got {row!r}")
        if not isinstance(values, Mapping):
            raise TypeError(f"gpu_regime: paper[{row!r}] must map measure labels to text, got {type(values).__name__}")
        if row in results:
            raise ValueError(f"gpu_regime: paper row {row!r} has an algorithm's name; label it by the paper")
        for measure, text in values.items():
            if not isinstance(measure, str):
                raise TypeError(f"gpu_regime: paper[{row!r}] has a measure label that is not str: {measure!r}")
            if measure not in labels:
                raise ValueError(f"gpu_regime: paper[{row!r}] names the measure {measure!r}; the measures are {labels}")
            if not isinstance(text, str):
                raise TypeError(f"gpu_regime: paper[{row!r}][{measure!r}] must be text, got {type(text).__name__}")
        out[row] = dict(values)
    return out


def _print_gpu_plan(chapter: str, names: Sequence[str], seeds: Sequence[int], steps: int, prof: Any,
                    directory: str | os.PathLike[str] | None, *, generation_factor: float, train_factor: float,
                    too_small: Sequence[str]) -> None:
    """Without a chapter's GPU results: what ``PROFILE = "gpu"`` would train, and its expected time."""
    import textwrap

    from grpo_lab import experiments, lab
    from grpo_lab.paths import REPO_ROOT

    where = Path(directory) if directory is not None else lab.results_dir()
    try:  # "data/results/gpu" in a source checkout, wherever the kernel runs
        where = where.resolve().relative_to(REPO_ROOT)
    except ValueError:
        pass
    table = gpu_time_table(len(names) * len(seeds), steps=steps, generation_factor=generation_factor,
                           train_factor=train_factor, too_small=too_small, profile=prof)
    kw = dict(prof.task_kwargs)
    if prof.task == "next_token":
        what = (f"next-token reasoning (the Python reference) from {prof.base}: {len(seeds)} seeds each, {steps} "
                f"steps of {prof.config.prompts_per_step} positions x G = {prof.config.group_size}, budget "
                f"{kw['max_new_tokens']} tokens, greedy and sampled next-token accuracy on "
                f"{lab.RPT_GPU_TEST_SIZE} held-out positions every {prof.config.eval_every} steps"
                + (" with the held-out loss" if kw.get("eval_held_out_loss") else "")
                + "; then continued next-token prediction at the same compute per seed")
    else:
        what = (f"GSM8K from {prof.base}: {len(seeds)} seeds each, {steps} steps of {prof.config.prompts_per_step} "
                f"questions x G = {prof.config.group_size}, budget {kw['max_new_tokens']} tokens, greedy test "
                f"accuracy on {kw['test_size'] or 'all'} test problems every {prof.config.eval_every} steps")
    text = (f"No GPU results for this chapter yet ({where}/{chapter}.json is absent). "
            f"PROFILE = \"gpu\" trains {', '.join(names)} on {what}. "
            "Expected time, one run after the other (estimated from assumed speeds, not measured):")
    print(textwrap.fill(text, width=100, break_long_words=False, break_on_hyphens=False))  # paths stay whole
    _show(table.set_index("runs"))


def _print_gpu_provenance(prov: dict) -> None:
    """One line of the stored GPU results' provenance (and one of chapter 7's task data)."""
    head = ("DRY RUN of the GPU code path on " + str(prov["device"]) + " (not GPU results)" if prov.get("dry_run")
            else "GPU results")
    print(f"{head}: {prov['device_name']}, {prov['precision']}, {prov['base']}, seeds {prov['seeds']}, "
          f"{prov['steps']} steps, {_duration(prov['wall_seconds'])}, commit {str(prov.get('git_sha'))[:10]}, "
          f"torch {prov['torch']}, transformers {prov['transformers']}, {prov['date']}")
    data = prov.get("task_data")
    if data:  # chapter 7: the next-token task's data files, built for the model
        print(f"task data: built for {data.get('model')} (entropy proxy {data.get('proxy')}), "
              f"{data.get('train_positions')} training positions, {data.get('test_positions')} test positions")


def _show_accuracy_by_step(results: dict) -> None:
    """Greedy test accuracy against RL step, one colour per algorithm (95% t band over seeds)."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from grpo_lab.experiments import plotting

    fig, ax = plt.subplots()
    frame = pd.concat([r.history for r in results.values()], ignore_index=True).dropna(subset=["test_accuracy"])
    plotting.band_plot(ax, frame, "step", "test_accuracy", band="ci95", bounds=(0, 1), legend=True)
    ax.set_xlabel("RL step")
    ax.set_ylabel("greedy test accuracy (fraction)")
    _show(fig)
    _close_if_figure(fig)


def _duration(seconds: float) -> str:
    """``"2.4 h"``, ``"38 min"`` or ``"45 s"``."""
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min" if seconds >= 60 \
        else f"{seconds:.0f} s"


def _show(value: Any) -> None:
    """Display ``value`` in a notebook; print it elsewhere (a DataFrame whole, not cut to the terminal)."""
    if _ipython_shell() is not None:
        from IPython.display import display as ipy_display

        ipy_display(value)
    elif type(value).__name__ == "DataFrame":
        import pandas as pd

        with pd.option_context("display.width", 250, "display.max_columns", None, "display.max_colwidth", None):
            print(value)
    else:
        print(value)


def _inject_parameters(nb: Any, params: dict[str, Any]) -> None:
    """Insert a cell assigning ``params`` right after the cell tagged ``parameters`` (papermill's
    convention: tagged ``injected-parameters``).

    Raises:
        ValueError: the notebook has no ``parameters`` cell, or a name is not a parameter it assigns.
    """
    import ast

    import nbformat

    index = next((i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    if index is None:
        raise ValueError("execute: --param needs a cell tagged 'parameters' in the notebook")
    assigned = {t.id for node in ast.parse(nb.cells[index].source).body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    unknown = sorted(set(params) - assigned)
    if unknown:
        raise ValueError(f"execute: {unknown} not assigned in the parameters cell (it assigns {sorted(assigned)})")
    source = "\n".join(f"{k} = {v!r}" for k, v in params.items())
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))


@contextlib.contextmanager
def _local_kernel_manager(kernel_name: str) -> Iterator[Any]:
    """A kernel manager whose kernel talks to this process over local (Unix-domain) IPC sockets.

    jupyter_client's default transport is TCP on 127.0.0.1, and ipykernel >= 7 then logs "Kernel is
    running over TCP without encryption ... susceptible to eavesdropping" to the terminal for every
    kernel it starts (ipykernel/kernelapp.py, ``init_sockets``; its advice: "Use IPC transport").
    The sockets are files ``grpo-lab-<random>-ipc-<port>`` in Jupyter's runtime directory (created
    with mode 0700 if absent), an absolute path because the kernel runs in the notebook's folder;
    they are removed on exit (jupyter_client's own clean-up runs before the kernel has closed them).
    """
    import uuid

    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.paths import jupyter_runtime_dir

    runtime = Path(jupyter_runtime_dir())
    runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
    stem = f"grpo-lab-{uuid.uuid4().hex[:12]}-ipc"
    try:
        yield AsyncKernelManager(kernel_name=kernel_name, transport="ipc", ip=str(runtime / stem))
    finally:
        for socket_file in runtime.glob(stem + "-*"):
            socket_file.unlink(missing_ok=True)


def _shut_down(km: Any) -> None:
    """Shut down ``km``'s kernel, gracefully (a shutdown request, then a kill after its wait).

    nbclient leaves a kernel it was given running; the kernel then notices that this process
    exited and logs "[IPKernelApp] WARNING | Parent appears to have exited, shutting down." to the
    terminal after every chapter. A failed shutdown must not hide the chapter's own result, so it
    falls back to killing the kernel and, failing that, to the old behaviour (the kernel exits
    with this process), saying why on stderr.
    """
    from jupyter_core.utils import run_sync

    for now in (False, True):
        try:
            if run_sync(km.is_alive)():
                run_sync(km.shutdown_kernel)(now=now)
            return
        except Exception as err:  # noqa: BLE001 - best effort: the chapter's outcome is what counts
            reason = f"{type(err).__name__}: {err}"
    print(f"grpo_lab.lab.book: the kernel could not be shut down ({reason}); it exits with this process",
          file=sys.stderr)


def execute_notebook(
    path: str | os.PathLike[str],
    *,
    timeout: int = 600,
    kernel_name: str = "python3",
    env: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
    out: str | os.PathLike[str] | None = None,
) -> float:
    """Execute a chapter in place from a fresh kernel and return the wall time in seconds.

    This is how the committed outputs (the nbval reference) are produced: cells run in order in
    a new ``kernel_name`` kernel whose working directory is the notebook's folder, execution
    counts restart at 1, no per-cell timing metadata is recorded, and any cell error aborts
    (the notebook file is then left untouched). ``env`` entries are added to the kernel's
    environment (``PYTHONHASHSEED=0`` is always set). ``params`` (e.g. ``{"PROFILE": "gpu"}``)
    are assigned in a cell inserted after the ``parameters`` cell; ``out`` writes the executed
    notebook there instead of in place.

    Raises:
        ValueError: ``params`` names a variable the parameters cell does not assign.
    """
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    if params:
        _inject_parameters(nb, params)
    nb.metadata["kernelspec"] = {
        "name": kernel_name,
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    saved_env = dict(os.environ)
    os.environ.update({"PYTHONHASHSEED": "0", **(env or {})})
    start = time.perf_counter()
    try:
        with _local_kernel_manager(kernel_name) as km:  # IPC, not TCP: see _local_kernel_manager
            try:
                NotebookClient(nb, km=km, timeout=timeout, kernel_name=kernel_name, allow_errors=False,
                               record_timing=False,
                               resources={"metadata": {"path": str(path.parent.resolve())}}).execute()
            finally:
                _shut_down(km)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
    elapsed = time.perf_counter() - start
    nbformat.validate(nb)
    nbformat.write(nb, Path(out) if out is not None else path)
    return elapsed


def _main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m grpo_lab.lab.book execute [--timeout S] NOTEBOOK...``."""
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.lab.book", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("execute", help="execute notebooks in place from a fresh kernel")
    ex.add_argument("notebooks", nargs="+", type=Path)
    ex.add_argument("--timeout", type=int, default=600, help="per-cell timeout in seconds")
    ex.add_argument("--kernel", default="python3", help="kernel name (default python3)")
    ex.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="assign a parameter after the parameters cell; VALUE is a Python literal "
                         "(e.g. PROFILE='gpu', GPU_STEPS=3, GPU_SEEDS=(0,)); repeatable")
    ex.add_argument("--out", type=Path, help="write the executed notebook here (one notebook only)")
    args = parser.parse_args(argv)
    import ast

    params = {}
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep or not name.strip().isidentifier():
            parser.error(f"--param {item!r}: expected NAME=VALUE")
        try:
            params[name.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parser.error(f"--param {item!r}: VALUE must be a Python literal (quote strings: PROFILE='gpu')")
    if args.out is not None and len(args.notebooks) != 1:
        parser.error("--out takes one notebook")
    if args.out is not None and not args.out.resolve().parent.is_dir():  # before hours of execution, not after
        parser.error(f"--out {args.out}: the folder {args.out.resolve().parent} does not exist")
    missing = [str(p) for p in args.notebooks if not p.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    for nb_path in args.notebooks:
        seconds = execute_notebook(nb_path, timeout=args.timeout, kernel_name=args.kernel, params=params,
                                   out=args.out)
        print(f"executed {nb_path} in {seconds:.1f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main())
