"""What a command-line run reports (``python -m grpo_lab``, :mod:`grpo_lab.cli.main`): a line per step and seed
while it trains, a labelled summary over seeds at the end, and a figure of the curves.

* :class:`StepPrinter` follows each seed's step log (``<seed dir>/metrics.jsonl``, which the ``jsonl`` tracker
  writes and flushes as each step ends, :class:`grpo_lab.training.callbacks.JsonlLogger`) from a thread of the
  calling process and prints one :func:`step_line` per new step. Seeds trained in worker processes
  (``--jobs 2``) are followed the same way, and the run itself is not touched: its numbers cannot change.
* :func:`summary_lines`: the final greedy test accuracy as mean ± sd over seeds with its 95% Student-t
  interval (:func:`grpo_lab.experiments.stats.t_interval`), each seed's value (and count of problems solved) and the
  test set's binomial standard error (:func:`grpo_lab.experiments.stats.binomial_se`), also for a single seed.
* :func:`save_curves`: test accuracy and reward against the step, mean and ±1 sd band over seeds in the
  book's colour of the preset (:func:`grpo_lab.experiments.plotting.curves_grid`), written as a PNG with matplotlib's
  Agg backend (no display needed).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

__all__ = ["STEP_COLUMNS", "step_line", "StepPrinter", "summary_lines", "count_test_problems", "figure_path", "save_curves"]

#: The history columns a step line shows, in order, with their format (a NaN or missing value is left out:
#: ``kl`` without a KL term, the update columns of a step that made no update, the multi-turn columns of a
#: single-turn task). ``turns_mean`` (model turns per episode), ``tool_calls_mean`` (environment steps per
#: episode) and ``observation_token_frac`` (the share of the episodes' tokens that the environment wrote) come
#: from a multi-turn task's episodes (:func:`grpo_lab.policy.episodes.generate_episodes`).
STEP_COLUMNS: tuple[tuple[str, str], ...] = (("reward", "{:.3f}"), ("accuracy", "{:.3f}"), ("kl", "{:.4f}"),
                                             ("clip_frac", "{:.3f}"), ("length", "{:.1f}"), ("turns_mean", "{:.2f}"),
                                             ("tool_calls_mean", "{:.2f}"), ("observation_token_frac", "{:.3f}"))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def step_line(row: Mapping[str, Any], *, label: str, steps: int | None = None) -> str:
    """One step of one seed as a line: ``GRPO seed 0 step 2/40 | reward 0.523 | accuracy 0.523 | kl 0.0031 |
    clip_frac 0.014 | length 8.3 | 1.3 s | test_accuracy 0.409``.

    Args:
        row: a history row (a line of ``metrics.jsonl``): ``step`` and any of :data:`STEP_COLUMNS`,
            ``step_seconds`` (wall seconds of the step), ``test_accuracy`` (greedy, on steps that evaluated),
            ``eval_seconds``. Step 0 is the base policy's evaluation.
        label: what the line starts with, e.g. ``"GRPO seed 0"``.
        steps: the run's step count (shown as ``step k/steps``), or ``None``.

    Returns:
        The line (no newline); columns that are missing or NaN are left out, metric names as in the history.
    """
    step = int(row.get("step", 0))
    width = len(str(steps)) if steps is not None else 0
    parts = [f"{label} step {step:>{width}}" + (f"/{steps}" if steps is not None else "")]
    if step == 0:
        parts.append("base policy")
    parts += [f"{name} {fmt.format(row[name])}" for name, fmt in STEP_COLUMNS if _finite(row.get(name))]
    if _finite(row.get("step_seconds")):
        parts.append(f"{row['step_seconds']:.1f} s")
    if _finite(row.get("test_accuracy")):
        seconds = f" (eval {row['eval_seconds']:.1f} s)" if _finite(row.get("eval_seconds")) else ""
        parts.append(f"test_accuracy {row['test_accuracy']:.3f}{seconds}")
    return " | ".join(parts)


class _Follower:
    """One seed's ``metrics.jsonl``, read as it grows: complete lines only, from where the last read stopped,
    from the start again when the file was replaced (the logger rewrites it atomically when a run resumes)."""

    def __init__(self, path: Path, after_step: int):
        self.path, self.last, self.offset, self.inode = path, after_step, 0, None

    def new_rows(self) -> list[dict]:
        """The rows of steps after the last one returned (in file order), ``[]`` when there are none."""
        try:
            stat = os.stat(self.path)
            if stat.st_ino != self.inode or stat.st_size < self.offset:
                self.inode, self.offset = stat.st_ino, 0
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:  # not written yet, or replaced while being read: the next poll reads it
            return []
        whole = data[:data.rfind(b"\n") + 1]
        self.offset += len(whole)
        rows = []
        for line in whole.decode("utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and _finite(row.get("step")) and int(row["step"]) > self.last:
                self.last = int(row["step"])
                rows.append(row)
        return rows


class StepPrinter:
    """Print a :func:`step_line` for every step each seed logs, while a run trains (a context manager).

    Inside the ``with`` block a daemon thread reads every seed's ``metrics.jsonl`` each ``interval`` seconds
    and prints the rows of steps it has not printed; leaving the block (also by Ctrl-C or SIGTERM) stops the
    thread and prints what is left. Only files are read, so the run (in this process or in worker processes) is unchanged.

    Args:
        seed_dirs: ``{seed: the seed's directory}`` (:func:`grpo_lab.experiments.run_dirs.seed_dir`), whose
            ``metrics.jsonl`` the ``jsonl`` tracker writes.
        name: the algorithm's name, the start of each line's label (``"GRPO seed 0"``).
        steps: the run's step count (for ``step k/steps``).
        emit: where a line goes (default ``print(line, flush=True)``).
        interval: seconds between two reads (> 0).
        after: ``{seed: step}``: print only steps after it (a resumed seed: its checkpoint's step; default
            ``-1``, every step from the base policy's step 0).

    Attributes:
        printed: ``{seed: number of lines printed}``.

    Raises:
        ValueError: ``interval`` is not positive.
    """

    def __init__(self, seed_dirs: Mapping[int, str | os.PathLike], *, name: str, steps: int | None,
                 emit: Callable[[str], None] | None = None, interval: float = 0.5,
                 after: Mapping[int, int] | None = None):
        if not interval > 0:
            raise ValueError(f"StepPrinter: interval must be > 0 seconds, got {interval!r}")
        after = dict(after or {})
        self.followers = {int(s): _Follower(Path(d) / "metrics.jsonl", int(after.get(s, -1)))
                          for s, d in seed_dirs.items()}
        self.name, self.steps, self.interval = name, steps, float(interval)
        self.emit = emit or (lambda line: print(line, flush=True))
        self.printed = {s: 0 for s in self.followers}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def poll(self) -> int:
        """Read every seed's file once and print the new steps' lines; returns how many were printed."""
        n = 0
        with self._lock:
            for seed, follower in self.followers.items():
                for row in follower.new_rows():
                    self.emit(step_line(row, label=f"{self.name} seed {seed}", steps=self.steps))
                    self.printed[seed] += 1
                    n += 1
        return n

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def __enter__(self) -> "StepPrinter":
        self._thread = threading.Thread(target=self._loop, name="grpo_lab-step-lines", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:  # the last steps, after Ctrl-C or SIGTERM too: the last line printed is the last step logged
            self.poll()
        except Exception:
            if exc[0] is None:
                raise  # an error of its own; otherwise the exception that ended the block goes on


# ------------------------------------------------------------------------------------------------ summary
def count_test_problems(task: str, task_kwargs: Sequence[tuple[str, Any]] | Mapping[str, Any] = ()) -> int | None:
    """The number of test problems of the registered task ``task`` built with ``task_kwargs``
    (what every greedy evaluation scores), or ``None`` when it cannot be built here. Raises nothing."""
    try:
        from ..tasks import get_task

        return len(list(get_task(task, **dict(task_kwargs)).test_set()))
    except Exception:  # noqa: BLE001 -- only a label of the summary; the run has reported a task that fails
        return None


def _solved(accuracy: float, n_test: int | None) -> str:
    """`` (135/198)`` when ``accuracy`` is a whole number of problems out of ``n_test``, else ``""``."""
    if not n_test:
        return ""
    k = accuracy * n_test
    return f" ({round(k)}/{n_test})" if abs(k - round(k)) < 1e-6 else ""


def _accuracy_lines(res, n_test: int | None) -> list[str]:
    """The summary's lines about the final greedy test accuracy (see :func:`summary_lines`)."""
    from ..experiments.stats import binomial_se, t_interval

    final, base = res.final(), res.base()
    k = len(final)
    where = f"greedy, {n_test} problems" if n_test else "greedy"
    start = f"base {base.mean():.3f} -> " if len(base) and base.notna().any() else ""
    if k > 1:
        iv = t_interval(final.to_numpy(), bounds=(0, 1))
        head = (f"test accuracy ({where}): {start}final {iv.mean:.3f} ± {final.std(ddof=1):.3f} (mean ± sd over {k} "
                f"seeds), 95% interval [{iv.lo:.3f}, {iv.hi:.3f}] (Student t over seeds)")
    else:
        head = f"test accuracy ({where}): {start}final {final.mean():.3f} (1 seed: no spread over seeds, no interval)"
    per_seed = ", ".join(f"s{s} {v:.3f}{_solved(v, n_test)}" for s, v in final.items())
    lines = [head, f"  per seed: {per_seed}"]
    if k > 1 and final.nunique() == 1:
        lines[-1] += f" (every seed ended at the same accuracy, hence sd {0:.3f})"
    if n_test:
        se = binomial_se(float(final.mean()), n_test)
        lines.append(f"  binomial standard error of one evaluation at {final.mean():.3f} on {n_test} problems: "
                     f"{se:.3f} (the test set's own sampling error)")
    return lines


def _last_step_line(h: pd.DataFrame) -> str | None:
    """``last step (mean over seeds): reward 0.523, kl 0.0031, ...`` from each seed's last training row."""
    if "reward" not in h.columns or not h["reward"].notna().any():
        return None
    last = h.dropna(subset=["reward"]).sort_values("step").groupby("seed").tail(1)
    parts = [f"{c} {fmt.format(last[c].mean())}" for c, fmt in STEP_COLUMNS
             if c in last.columns and last[c].notna().any()]
    return "last step (mean over seeds): " + ", ".join(parts)


def summary_lines(res, *, name: str, profile: str, n_test: int | None = None) -> list[str]:
    """The labelled summary of a run (:class:`grpo_lab.experiments.RunResult`), one string per line.

    First ``NAME [PROFILE] S steps x K seed(s), W s``; then, when the run evaluated, ``test accuracy (greedy,
    N problems): base a -> final m ± sd (mean ± sd over K seeds), 95% interval [lo, hi] (Student t over
    seeds)`` (:func:`grpo_lab.experiments.stats.t_interval`, clipped to [0, 1]; with one seed only ``final m``), each
    seed's final value (with ``solved/N``), and the binomial standard error ``sqrt(m (1 - m) / N)`` of one
    evaluation on the test set (:func:`grpo_lab.experiments.stats.binomial_se`); the last training step's metrics
    averaged over seeds; which seeds came from the run cache.

    Args:
        res: the run's result (``history`` with ``seed``, ``step``, ``test_accuracy``; ``provenance`` with
            ``steps``, ``seeds``, ``wall_seconds``, ``cached_seeds``).
        name: the algorithm's name. profile: the profile's name.
        n_test: the test set's size (:func:`count_test_problems`); ``None`` leaves the counts and the binomial
            error out.
    """
    prov = res.provenance
    seeds = prov.get("seeds", [])
    lines = [f"{name} [{profile}] {prov.get('steps')} steps x {len(seeds)} seed(s), {prov.get('wall_seconds')} s"]
    h = res.history
    if "test_accuracy" in h.columns and h["test_accuracy"].notna().any():
        lines += _accuracy_lines(res, n_test)
    else:
        lines.append("test accuracy: not measured (eval_every=0)")
    last = _last_step_line(h)
    if last:
        lines.append(last)
    if prov.get("cached_seeds"):
        lines.append(f"seeds {prov['cached_seeds']} from the run cache (--no-cache trains them again)")
    return lines


# ------------------------------------------------------------------------------------------------ figure
def figure_path(results_file: str | os.PathLike) -> Path:
    """The figure next to a results file: ``runs/grpo.json`` -> ``runs/grpo.png`` (``.png`` appended to a
    name without ``.json``)."""
    path = Path(results_file)
    return path.with_suffix(".png") if path.suffix == ".json" else path.with_name(path.name + ".png")


def save_curves(history: pd.DataFrame, path: str | os.PathLike, *, title: str | None = None) -> Path:
    """Write a PNG of the greedy test accuracy (where measured) and the training reward against the step:
    per algorithm (``algo`` column) the mean over seeds and a ±1 sd band (:func:`grpo_lab.experiments.plotting.curves_grid`
    in the book's style and colours, :func:`grpo_lab.experiments.plotting.set_style`, the style restored afterwards).
    matplotlib draws with the Agg backend unless ``matplotlib.pyplot`` is imported already (a notebook
    keeps its own backend).

    Args:
        history: a long history (columns ``step``, ``seed``, ``algo``, ``reward`` and/or ``test_accuracy``).
        path: the PNG file (its directory must exist).
        title: the figure's title.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: the history has neither a ``test_accuracy`` nor a ``reward`` value.
        OSError: the file cannot be written.
    """
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from ..experiments.plotting import DPI, curves_grid, set_style

    panels = [(c, t) for c, t in (("test_accuracy", "test accuracy (greedy)"), ("reward", "reward (training batch)"))
              if c in history.columns and history[c].notna().any()]
    if not panels:
        raise ValueError("save_curves: the history has no test_accuracy or reward value to draw")
    with matplotlib.rc_context():
        set_style()
        fig = curves_grid(history, panels, ncols=len(panels), panel_size=(4.0, 2.8), suptitle=title)
        for ax in fig.axes:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
            for line in ax.get_lines():  # the steps measured (evaluations are a few steps only)
                line.set_marker("o")
                line.set_markersize(3)
        try:
            fig.savefig(path, dpi=DPI)
        finally:
            plt.close(fig)
    return Path(path)
