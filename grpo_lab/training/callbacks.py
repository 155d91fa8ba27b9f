"""Callbacks and trackers: what a :class:`~grpo_lab.training.trainer.Trainer` tells the outside world as it trains.

A callback is any object with some of the hooks of :class:`TrainerCallback` (``on_train_begin``,
``on_step``, ``on_evaluate``, ``on_save``, ``on_train_end``); the trainer calls them in
:meth:`~grpo_lab.training.trainer.Trainer.train` and :meth:`~grpo_lab.training.trainer.Trainer.save`. The trackers
of ``TrainerConfig.report_to`` are callbacks too, built by :func:`make_callbacks` from
:data:`TRACKERS`:

* ``"jsonl"`` (:class:`JsonlLogger`): ``output_dir/metrics.jsonl``, one JSON object per history row,
  written and flushed when the step ends, so that a run killed at any point has logged every step it
  finished; the evaluations' sample completions go to ``output_dir/samples.jsonl``.
* ``"tensorboard"`` (:class:`TensorBoardLogger`): ``torch.utils.tensorboard`` event files under
  ``output_dir/tensorboard`` (scalars per step, the samples as a markdown table).
* ``"wandb"`` (:class:`WandbLogger`): a Weights & Biases run under ``output_dir/wandb``, offline
  unless ``$WANDB_MODE`` says otherwise (no network, no account needed).

Trackers write only when the run has an ``output_dir`` (``TrainerConfig.output_dir``); callbacks passed
as ``Trainer(callbacks=[...])`` always run. Observing a run does not change its numbers: the trainer calls
every hook with the python, numpy, torch (and CUDA) random states saved and restored around it
(:func:`call_hooks`), and each hook gets its own copy of the history row (after it is complete) and of
the samples table, so writing into them changes neither the history nor what the next callback sees.
The trainer itself is handed as it is: a hook that sets its weights or optimiser does change the run.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import json
import math
import os
import random
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch

from ..paths import write_text_atomically

__all__ = ["TrainerCallback", "JsonlLogger", "TensorBoardLogger", "WandbLogger", "TRACKERS", "HOOKS", "SAMPLE_ROWS",
           "SAMPLE_COLUMNS", "make_callbacks", "check_callbacks", "call_hooks", "samples_table", "markdown_table",
           "TRL_METRIC_NAMES", "VERL_METRIC_NAMES", "logged_row"]

#: The hooks a callback may implement, in the order a run calls them.
HOOKS = ("on_train_begin", "on_step", "on_evaluate", "on_completions", "on_save", "on_train_end")

#: History column -> the key TRL 1.16's ``GRPOTrainer`` logs the same quantity under (its ``_metrics`` keys in
#: ``trl/trainer/grpo_trainer.py``); ``rewards/<name>/mean|std`` are already TRL's. Under ``metric_names="trl"``
#: ``num_tokens`` is TRL's (the running sum of ``input_tokens``) and grpo_lab's own moves to ``num_loss_tokens``.
TRL_METRIC_NAMES = {
    "tied_group_frac": "frac_reward_zero_std", "clip_frac_low": "clip_ratio/low_mean",
    "clip_frac_high": "clip_ratio/high_mean", "clip_frac": "clip_ratio/region_mean",
    "length": "completions/mean_length", "length_min": "completions/min_length",
    "length_max": "completions/max_length", "truncation_rate": "completions/clipped_ratio",
    "length_terminated_mean": "completions/mean_terminated_length",
    "length_terminated_min": "completions/min_terminated_length",
    "length_terminated_max": "completions/max_terminated_length", "lr": "learning_rate",
    "num_tokens": "num_loss_tokens"}

#: History column -> verl 0.9.1's key for the same quantity (``trainer/ppo/metric_utils.py``
#: ``compute_data_metrics``, ``workers/utils/losses.py``, ``trainer/ppo/core_algos.py``, ``ray_trainer.py``).
#: ``reward`` is the shaped reward, verl's ``critic/rewards`` (its ``critic/score`` is before shaping).
VERL_METRIC_NAMES = {
    "reward": "critic/rewards/mean", "reward_min": "critic/rewards/min", "reward_max": "critic/rewards/max",
    "adv_mean": "critic/advantages/mean", "adv_min": "critic/advantages/min", "adv_max": "critic/advantages/max",
    "return_mean": "critic/returns/mean", "value_mean": "critic/values/mean",
    "explained_variance": "critic/vf_explained_var", "value_loss": "critic/vf_loss",
    "length": "response_length/mean", "length_min": "response_length/min", "length_max": "response_length/max",
    "truncation_rate": "response_length/clip_ratio", "pg_loss": "actor/pg_loss", "clip_frac": "actor/pg_clipfrac",
    "clip_frac_low": "actor/pg_clipfrac_lower", "kl": "actor/kl_loss", "entropy": "actor/entropy",
    "grad_norm": "actor/grad_norm", "lr": "actor/lr"}


def logged_row(row: dict, metric_names: str = "grpo_lab", rows: list | None = None) -> dict:
    """``row`` under the names ``metric_names`` asks for (``"grpo_lab"``: unchanged; ``"trl"``:
    :data:`TRL_METRIC_NAMES`; ``"verl"``: :data:`VERL_METRIC_NAMES`); ``step`` and unmapped columns keep their
    names. Under ``"trl"``, ``num_tokens`` is the sum of ``input_tokens`` over ``rows`` up to ``row``'s step (the
    history so far; TRL's running count). Returns a new dict; raises nothing."""
    table = {"trl": TRL_METRIC_NAMES, "verl": VERL_METRIC_NAMES}.get(metric_names)
    if table is None:
        return dict(row)
    out = {table.get(k, k): v for k, v in row.items()}
    if metric_names == "trl" and "input_tokens" in row:
        seen = [r.get("input_tokens", 0.0) for r in (rows or [row]) if 0 < r["step"] <= row["step"]]
        out["num_tokens"] = float(sum(v for v in seen if v == v))
    return out


def _names(trainer) -> str:
    return getattr(getattr(trainer, "config", None), "metric_names", "grpo_lab")

#: Sample completions per evaluation handed to ``on_evaluate``: the first this many test problems (the
#: task's fixed test set, in its order, greedy decoding), the same problems at every evaluation.
SAMPLE_ROWS = 8

#: The columns of the samples table (those of :func:`grpo_lab.policy.rollout.evaluate`'s frame).
SAMPLE_COLUMNS = ("prompt", "answer", "completion", "correct", "length", "truncated")


class TrainerCallback:
    """Base class of the trainer's callbacks: every hook does nothing; override the ones you need.

    Subclassing is optional: the trainer calls whichever of :data:`HOOKS` an object has. Hooks get the
    trainer itself (read ``trainer.step``, ``trainer.rows``, ``trainer.config``, ``trainer.algo``; change
    nothing). The random states are restored after each hook, so sampling in a hook does not change the run.
    """

    def on_train_begin(self, trainer) -> None:
        """Start of :meth:`~grpo_lab.training.trainer.Trainer.train` (each call), before the first step;
        ``trainer.rows`` holds the steps already done (a resumed run: up to its checkpoint)."""

    def on_step(self, trainer, row: dict) -> None:
        """A history row is complete (``row["step"]``; the row of an evaluation step holds its
        ``test_*`` columns). Also called for the step-0 row of the base policy's evaluation."""

    def on_evaluate(self, trainer, row: dict, samples: pd.DataFrame) -> None:
        """An evaluation ran (after ``on_step`` of the same ``row``). ``samples``: the first
        :data:`SAMPLE_ROWS` test problems' greedy completions, columns ``prompt``, ``answer``,
        ``completion``, ``correct`` (bool), ``length`` (tokens, EOS included), ``truncated`` (bool)."""

    def on_completions(self, trainer, row: dict, completions: pd.DataFrame) -> None:
        """Every ``TrainerConfig.log_completions_every`` steps (after ``on_step`` of the same ``row``):
        the step's trained completions (:func:`grpo_lab.training.history.completions_table`)."""

    def on_save(self, trainer, path: Path) -> None:
        """:meth:`~grpo_lab.training.trainer.Trainer.save` wrote the checkpoint directory ``path``."""

    def on_train_end(self, trainer) -> None:
        """End of :meth:`~grpo_lab.training.trainer.Trainer.train`, also when it raised: close files."""


def samples_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The samples table of ``on_evaluate``: the first :data:`SAMPLE_ROWS` rows of an evaluation's
    per-problem ``frame`` (:func:`grpo_lab.policy.rollout.evaluate`), its :data:`SAMPLE_COLUMNS` that exist."""
    columns = [c for c in SAMPLE_COLUMNS if c in frame.columns]
    return frame.head(SAMPLE_ROWS)[columns].reset_index(drop=True)


def check_callbacks(callbacks) -> list:
    """``callbacks`` as a list, each checked to be a callback object.

    Args:
        callbacks: ``None`` or an iterable of objects with at least one of :data:`HOOKS`.

    Raises:
        TypeError: ``callbacks`` is a single object or a string rather than a list; an entry is a class
            (``JsonlLogger`` instead of ``JsonlLogger(dir)``), a string (a tracker name: use
            ``TrainerConfig.report_to``) or has none of the hooks.
    """
    if callbacks is None:
        return []
    if isinstance(callbacks, (str, bytes)) or any(hasattr(callbacks, h) for h in HOOKS):
        raise TypeError(f"Trainer: callbacks must be a list of callback objects, got {type(callbacks).__name__}; "
                        "wrap it in a list: callbacks=[...]")
    out = list(callbacks)
    for cb in out:
        if isinstance(cb, str):
            raise TypeError(f"Trainer: callbacks=[{cb!r}] is a name; trackers are named in TrainerConfig.report_to")
        if isinstance(cb, type):
            raise TypeError(f"Trainer: callbacks holds the class {cb.__name__}, not an instance; "
                            f"pass {cb.__name__}(...)")
        if not any(callable(getattr(cb, h, None)) for h in HOOKS):
            raise TypeError(f"Trainer: the callback {cb!r:.80} has none of the hooks {', '.join(HOOKS)}")
    return out


@contextlib.contextmanager
def _random_states_kept():
    """Save the python, numpy (global), torch and (initialised) CUDA random states; restore them on exit."""
    py, npy, cpu = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def call_hooks(callbacks, hook: str, trainer, *args) -> None:
    """Call ``cb.<hook>(trainer, *args)`` for each callback that has the hook, in order, with the random
    states kept (:class:`TrainerCallback`) and each ``dict`` / ``DataFrame`` argument copied for each call
    (the history row stays the trainer's); an exception of a hook propagates (a broken tracker stops the
    run rather than losing its log silently)."""
    for cb in callbacks:
        method = getattr(cb, hook, None)
        if callable(method):
            own = tuple(dict(a) if isinstance(a, dict) else a.copy() if isinstance(a, pd.DataFrame) else a
                        for a in args)
            with _random_states_kept():
                method(trainer, *own)


# --------------------------------------------------------------------------------------------- JSONL
def _json_value(o):
    """``json.dumps``' default for the values of a history row: numpy scalars as python numbers."""
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _dumps(record: dict) -> str:
    """One JSON line: floats as ``repr`` (they read back bit for bit), NaN and infinities as ``NaN`` /
    ``Infinity`` (what ``json`` writes and reads by default, as the checkpoints' ``history.json``)."""
    return json.dumps(record, default=_json_value, allow_nan=True)


def _read_lines(path: Path) -> list[tuple[dict, str]]:
    """``(record, line)`` of each line of a JSONL file that parses to an object with a ``step``; others
    (a line cut short by a killed process) are dropped. ``[]`` for a missing file."""
    out = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "step" in record:
                out.append((record, line))
    return out


def _rewrite(path: Path, lines: list[str]) -> None:
    """Make ``path`` hold ``lines`` (atomically, through a sibling temporary file); no write when it does."""
    text = "".join(line + "\n" for line in lines)
    if path.is_file() and path.read_text() == text:
        return
    write_text_atomically(path, text)


class JsonlLogger(TrainerCallback):
    """``"jsonl"``: every history row as one JSON line of ``output_dir/metrics.jsonl``, each evaluation's
    sample completions as lines of ``output_dir/samples.jsonl`` (one per completion, with its ``step``).

    Each line is written and flushed when its step ends (``fsync=True`` also forces it to the disk, against
    a power cut rather than a killed process). Floats are written with ``repr`` and read back bit for bit;
    NaN (a column not measured that step: ``test_accuracy`` between evaluations, ``kl`` without a KL term)
    as ``NaN``, infinities as ``Infinity``, as Python's ``json`` and ``pandas.read_json(lines=True)``
    read them (strict JSON parsers such as ``jq`` do not).

    When a :meth:`~grpo_lab.training.trainer.Trainer.train` call begins, the file is made to agree with the trainer's
    history: a fresh trainer starts a new file; a resumed one (:meth:`~grpo_lab.training.trainer.Trainer.resume`)
    keeps the lines of the steps up to its checkpoint and drops those a killed run wrote after it (which
    the resumed run writes again); rows of the history the file lacks are added. Lines are only appended
    after that. ``samples.jsonl`` keeps the lines of the steps the history holds.

    Args:
        output_dir: the run's directory (created when training begins).
        fsync: ``os.fsync`` after each step's lines.
    """

    def __init__(self, output_dir: str | os.PathLike, *, fsync: bool = False):
        self.path = Path(output_dir) / "metrics.jsonl"
        self.samples_path = Path(output_dir) / "samples.jsonl"
        self.completions_path = Path(output_dir) / "completions.jsonl"
        self.fsync = bool(fsync)
        self._files: tuple | None = None

    def on_train_begin(self, trainer) -> None:
        """Bring both files in line with ``trainer.rows`` (see the class docstring) and open them to append."""
        self.on_train_end(trainer)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        logged = {}
        for record, line in _read_lines(self.path):
            logged.setdefault(record["step"], line)
        _rewrite(self.path, [logged.get(row["step"]) or _dumps(logged_row(row, _names(trainer), trainer.rows))
                             for row in trainer.rows])
        steps = {row["step"] for row in trainer.rows}
        kept = [line for record, line in _read_lines(self.samples_path) if record["step"] in steps]
        _rewrite(self.samples_path, kept)
        self._files = (open(self.path, "a"), open(self.samples_path, "a"))

    def _write(self, which: int, trainer, lines: list[str]) -> None:
        if self._files is None:
            self.on_train_begin(trainer)
        f = self._files[which]
        f.write("".join(line + "\n" for line in lines))
        f.flush()
        if self.fsync:
            os.fsync(f.fileno())

    def on_step(self, trainer, row: dict) -> None:
        """Append ``row`` (under ``TrainerConfig.metric_names``, :func:`logged_row`) to ``metrics.jsonl`` and flush."""
        self._write(0, trainer, [_dumps(logged_row(row, _names(trainer), trainer.rows))])

    def on_evaluate(self, trainer, row: dict, samples: pd.DataFrame) -> None:
        """Append one line per sample (``{"step": ..., "prompt": ..., ...}``) to ``samples.jsonl`` and flush."""
        self._write(1, trainer, [_dumps({"step": row["step"], **rec}) for rec in samples.to_dict("records")])

    def on_completions(self, trainer, row: dict, completions: pd.DataFrame) -> None:
        """Append one line per trained completion to ``completions.jsonl`` (created on first use) and flush."""
        self.completions_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.completions_path, "a") as f:
            f.write("".join(_dumps(rec) + "\n" for rec in completions.to_dict("records")))
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())

    def on_train_end(self, trainer) -> None:
        """Close both files."""
        for f in self._files or ():
            f.close()
        self._files = None


# --------------------------------------------------------------------------------------- TensorBoard
def _require(module: str, tracker: str) -> None:
    """``ImportError`` naming the pip package when ``module`` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"TrainerConfig.report_to: the {tracker!r} tracker needs the {module} package, which is "
                          f"not installed: pip install {module} (or pip install 'grpo_lab[track]')")


def _scalars(row: dict) -> dict[str, float]:
    """The real-number entries of a history row except ``step``, NaN left out (not measured that step)."""
    out = {}
    for k, v in row.items():
        if k != "step" and isinstance(v, (int, float, np.number)) and not math.isnan(float(v)):
            out[k] = float(v)
    return out


def markdown_table(frame: pd.DataFrame) -> str:
    """``frame`` as a markdown table (TensorBoard's text plugin renders markdown): ``|`` escaped, line
    breaks as ``<br>``."""
    def cell(v) -> str:
        return str(v).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(cell(c) for c in frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in rec) + " |" for rec in frame.itertuples(index=False)]
    return "\n".join(lines)


class TensorBoardLogger(TrainerCallback):
    """``"tensorboard"``: ``torch.utils.tensorboard.SummaryWriter`` event files under ``output_dir/tensorboard``:
    every real-valued column of each history row as a scalar at its step (NaN entries, columns not measured
    that step, are left out), flushed each step; each evaluation's samples as the text ``samples`` (a markdown
    table, :func:`markdown_table`).

    When training begins the writer logs the rows of ``trainer.rows`` it has not logged yet (all of them for a
    new logger, e.g. a resumed run) with ``purge_step`` at the first of them, so TensorBoard hides what an
    earlier (killed) run logged from that step on instead of showing both.

    Raises:
        ImportError: ``tensorboard`` is not installed.
    """

    def __init__(self, output_dir: str | os.PathLike):
        _require("tensorboard", "tensorboard")
        self.log_dir = Path(output_dir) / "tensorboard"
        self._writer = None
        self._last_step: int | None = None

    def on_train_begin(self, trainer) -> None:
        """Open a writer (``purge_step``: see the class docstring) and log the rows not logged yet."""
        from torch.utils.tensorboard import SummaryWriter

        self.on_train_end(trainer)
        pending = [r for r in trainer.rows if self._last_step is None or r["step"] > self._last_step]
        purge = pending[0]["step"] if pending else trainer.step + (1 if trainer.rows else 0)
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=int(purge))
        for row in pending:
            self.on_step(trainer, row)

    def on_step(self, trainer, row: dict) -> None:
        """Add the row's scalars at ``row["step"]`` and flush."""
        if self._writer is None:
            self.on_train_begin(trainer)
        step = int(row["step"])
        for k, v in _scalars(logged_row(row, _names(trainer), trainer.rows)).items():
            self._writer.add_scalar(k, v, step)
        self._writer.flush()
        self._last_step = step

    def on_evaluate(self, trainer, row: dict, samples: pd.DataFrame) -> None:
        """Add the samples table as the text ``samples`` at ``row["step"]``."""
        if self._writer is None:
            self.on_train_begin(trainer)
        self._writer.add_text("samples", markdown_table(samples), int(row["step"]))
        self._writer.flush()

    def on_completions(self, trainer, row: dict, completions: pd.DataFrame) -> None:
        """Add the trained completions as the text ``completions`` (a markdown table) at ``row["step"]``."""
        if self._writer is None:
            self.on_train_begin(trainer)
        self._writer.add_text("completions", markdown_table(completions), int(row["step"]))
        self._writer.flush()

    def on_train_end(self, trainer) -> None:
        """Close the writer (the next ``train`` call opens a new event file in the same directory)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


# --------------------------------------------------------------------------------------------- wandb
class WandbLogger(TrainerCallback):
    """``"wandb"``: a Weights & Biases run in ``output_dir/wandb``, opened at the first row a
    :meth:`~grpo_lab.training.trainer.Trainer.train` call logs (a run killed before it leaves none): it logs the
    history so far (the rows of ``trainer.rows``, e.g. a resumed run's first steps), then each row at its
    ``step``; each evaluation's samples as the ``wandb.Table`` ``samples``. The run is finished at the end of
    ``train``. Its id is kept in ``output_dir/wandb/grpo_lab_run_id`` and passed with ``resume="allow"``, so a
    resumed run (``--resume``, ``Trainer.resume``) continues the same wandb run (online: only the steps after
    the wandb run's last; offline, each ``offline-run-*`` directory holds the whole history: sync the newest).

    The mode is ``mode``, else ``$WANDB_MODE``, else ``"offline"``: by default nothing goes over the network
    and no account is needed; ``wandb sync output_dir/wandb/offline-run-*`` uploads a run later, and
    ``WANDB_MODE=online`` (after ``wandb login``) logs live. The run's project is ``project``, else
    ``$WANDB_PROJECT``, else ``"grpo_lab"``; its name ``<algorithm>-seed<seed>``, its group the algorithm's
    name, its config ``{"trainer": TrainerConfig.to_dict(), "algorithm": asdict(algo), "task": task.name}``.
    wandb's console capture is off (the trainer's output is left alone).

    Raises:
        ImportError: ``wandb`` is not installed.
    """

    def __init__(self, output_dir: str | os.PathLike, *, project: str | None = None, mode: str | None = None):
        _require("wandb", "wandb")
        self.dir = Path(output_dir)
        self.project, self.mode = project, mode
        self.run = None

    #: The file under ``output_dir/wandb`` that keeps the run's id, so that a resumed run logs into the same run.
    RUN_ID_FILE = "grpo_lab_run_id"

    def on_train_begin(self, trainer) -> None:
        """Finish a run still open; the next one starts at the first row logged, so that a run
        killed before its first step leaves no empty wandb run."""
        self.on_train_end(trainer)

    def _run_id(self) -> str:
        """The run's id: the one ``output_dir/wandb/grpo_lab_run_id`` keeps, else a new one written there."""
        import wandb

        path = self.dir / "wandb" / self.RUN_ID_FILE
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        path.parent.mkdir(parents=True, exist_ok=True)
        run_id = _wandb_run_id()
        path.write_text(run_id + "\n")
        return run_id

    def _start(self, trainer, row: dict) -> None:
        """Start the run (see the class docstring: id kept in the output directory, ``resume="allow"``) and log
        the history rows before ``row`` (a resumed wandb run: those after its last logged step)."""
        import dataclasses

        import wandb

        algo, c = trainer.algo, trainer.config
        self.run = wandb.init(
            project=self.project or os.environ.get("WANDB_PROJECT") or "grpo_lab",
            name=f"{algo.name}-seed{c.seed}", group=algo.name, dir=str(self.dir), id=self._run_id(), resume="allow",
            mode=self.mode or os.environ.get("WANDB_MODE") or "offline", reinit="create_new",
            config={"trainer": c.to_dict(), "algorithm": dataclasses.asdict(algo), "task": trainer.task.name},
            settings=wandb.Settings(console="off"))
        first = int(getattr(self.run, "starting_step", 0) or 0) if getattr(self.run, "resumed", False) else 0
        for earlier in trainer.rows:
            if earlier is row:
                break
            if int(earlier["step"]) >= first:
                self.run.log(logged_row(earlier, _names(trainer), trainer.rows), step=int(earlier["step"]))

    def on_step(self, trainer, row: dict) -> None:
        """Log the row at ``row["step"]`` (the first row of a ``train`` call starts the run)."""
        if self.run is None:
            self._start(trainer, row)
        self.run.log(logged_row(row, _names(trainer), trainer.rows), step=int(row["step"]))

    def on_evaluate(self, trainer, row: dict, samples: pd.DataFrame) -> None:
        """Log the samples table as ``samples`` at ``row["step"]``."""
        import wandb

        if self.run is None:
            self._start(trainer, row)
        self.run.log({"samples": wandb.Table(dataframe=samples)}, step=int(row["step"]))

    def on_completions(self, trainer, row: dict, completions: pd.DataFrame) -> None:
        """Log the trained completions as the ``wandb.Table`` ``completions`` at ``row["step"]``."""
        import wandb

        if self.run is None:
            self._start(trainer, row)
        self.run.log({"completions": wandb.Table(dataframe=completions)}, step=int(row["step"]))

    def on_train_end(self, trainer) -> None:
        """Finish the run (its offline files are then complete)."""
        if self.run is not None:
            self.run.finish()
            self.run = None


def _wandb_run_id() -> str:
    """A new wandb run id: 8 random lowercase letters and digits (wandb's own form)."""
    import secrets
    import string

    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


#: Tracker names of ``TrainerConfig.report_to``: each maps to a factory ``f(output_dir) -> callback``. Add
#: an entry to register a tracker of your own.
TRACKERS: dict[str, Callable[[Path], TrainerCallback]] = {
    "jsonl": JsonlLogger, "tensorboard": TensorBoardLogger, "wandb": WandbLogger}


def make_callbacks(report_to, output_dir: str | os.PathLike | None) -> list:
    """The trackers ``report_to`` names (:data:`TRACKERS`), writing into ``output_dir``.

    Args:
        report_to: a sequence of tracker names (``TrainerConfig.report_to``); ``()`` for none.
        output_dir: the run's directory; ``None``: no tracker (nothing is written), the names are
            still checked, and a ``RuntimeWarning`` says so when ``report_to`` names more than the
            default ``"jsonl"``.

    Returns:
        A list of callbacks, in the order of ``report_to``.

    Raises:
        ValueError: a name :data:`TRACKERS` does not hold (with a did-you-mean and the known names).
        ImportError: a tracker's package is not installed (naming the pip package).
    """
    names = (report_to,) if isinstance(report_to, str) else tuple(report_to)
    for name in names:
        if name not in TRACKERS:
            close = difflib.get_close_matches(str(name), list(TRACKERS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"TrainerConfig.report_to: unknown tracker {name!r}{hint}; known: "
                             f"{', '.join(TRACKERS)} (or () for none)")
    if output_dir is None:
        asked = [name for name in names if name != "jsonl"]  # "jsonl" is the default: silent without a directory
        if asked:
            warnings.warn(f"TrainerConfig.report_to={list(names)} but output_dir is None: {', '.join(asked)} "
                          "write nothing. Set TrainerConfig.output_dir (experiments.run(..., output_dir=...) and "
                          "the command line give each seed its own)", RuntimeWarning, stacklevel=3)
        return []
    return [TRACKERS[name](Path(output_dir)) for name in names]
