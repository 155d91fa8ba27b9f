"""GPU chapter runs: a chapter's algorithms on the ``"gpu"`` profile, their results file, and the
facts every GPU result must show.

:func:`~grpo_lab.lab.run_chapter_gpu` writes ``<chapter>.json`` into
:func:`~grpo_lab.lab.results_dir`; :func:`~grpo_lab.lab.load_chapter_gpu` reads it
back and :func:`~grpo_lab.lab.check_gpu_results` asserts those facts. Documented under
:mod:`grpo_lab.experiments`.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ..algo.algorithms import Algorithm, get_algorithm
from ..paths import data_dir
from ..algo.checks import non_negative_int, positive_int
from ..experiments.memory_fit import check_algorithms_fit
from ..experiments.profiles import GPU_MODEL, Profile, get_profile, gpu_profile
from ..experiments.results import RunResult, load_results, save_results
from ..experiments.run_dirs import _remove_seed_dirs, checkpoints_dir, run_directory, seed_dir
from ..experiments.runs import _check_seeds, run_grid

__all__ = ["results_dir", "run_chapter_gpu", "load_chapter_gpu", "check_gpu_results", "check_results_location",
           "announce_gpu_runs"]

#: Seeds below which a chapter's GPU results are a look, not a claim (the book's claims use five).
_CLAIM_SEEDS = 5


def results_dir() -> Path:
    """Where GPU-profile results are written and read: ``$GRPO_LAB_RESULTS_DIR`` if set, else
    ``data/results/gpu`` under :func:`grpo_lab.paths.data_dir`."""
    env = os.environ.get("GRPO_LAB_RESULTS_DIR")
    return Path(env).expanduser() if env else data_dir() / "results" / "gpu"


def _chapter_name(chapter: str) -> str:
    if not isinstance(chapter, str) or not chapter or not all(ch.isalnum() or ch in "_-" for ch in chapter):
        raise ValueError(f"chapter must be a name such as '02_dapo' (letters, digits, '_', '-'), got {chapter!r}")
    return chapter


def _gpu_results_path(chapter: str, out, steps, n_jobs) -> Path:
    """The results file of a GPU chapter run, and the checks that must pass before hours of training:
    ``steps`` (when given) and ``n_jobs`` at least 1, and a file path that can be written."""
    # steps >= 1: a GPU run without an update has nothing to compare (and no compute to match)
    positive_int(f"{chapter}: steps", steps, allow_none=True)
    positive_int(f"{chapter}: n_jobs", n_jobs)
    path = Path(out) if out is not None else results_dir() / f"{chapter}.json"
    if path.is_dir():
        raise ValueError(f"{chapter}: the results file {path} is a directory (out is a file path; "
                         "$GRPO_LAB_RESULTS_DIR a directory)")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{chapter}: cannot write the results file {path}: {parent} is a file, not a "
                                 "directory (check out or $GRPO_LAB_RESULTS_DIR)")
            break
    return path


def run_chapter_gpu(chapter: str, algos: Sequence[Algorithm | str], *, seeds: Sequence[int] = (0, 1, 2, 3, 4),
                    steps: int | None = None, profile: Profile | None = None, n_jobs: int = 1,
                    overrides: Mapping[str, Mapping[str, Any]] | None = None,
                    out: str | Path | None = None, finish: bool = True, save_every: int | None = None,
                    keep_checkpoints: bool = False, progress: bool | None = True) -> dict[str, RunResult]:
    """Train a chapter's algorithms on the ``"gpu"`` profile and write ``<chapter>.json`` with
    provenance into :func:`results_dir` (or ``out``, a file path).

    Runs go one seed at a time (``n_jobs`` at a time), never from the run cache; the file is rewritten after
    each, ``complete`` false until the last. Each seed writes into ``<chapter>/<algorithm>/seed-<k>`` next to the
    file (:func:`~grpo_lab.experiments.run_dirs.run_directory`). Run again with the same arguments after a crash
    (file absent or not ``complete``), it resumes (:func:`~grpo_lab.experiments.run` with ``resume=True``); after
    a ``complete`` file, it trains afresh. The provenance records the commit, versions, GPU, precision, model,
    seeds, steps, wall time, ``dry_run`` (not CUDA) and :func:`~grpo_lab.experiments.provenance`;
    :func:`load_chapter_gpu` reads it back.

    Args:
        chapter, algos, seeds: the file stem (``"02_dapo"``); presets or names; seeds shared by every algorithm.
        steps, profile: RL steps per run (default: the profile's); default :func:`~grpo_lab.experiments.gpu_profile` ().
        n_jobs: runs at a time (processes sharing the GPU).
        overrides: per-algorithm :class:`~grpo_lab.training.trainer.TrainerConfig` fields (as ``run_grid``).
        out, finish: the results file; mark it ``complete`` after the last run (``False``: a caller adds more).
        save_every: steps between checkpoints (default: the profile's, else 10; 0: none); only the newest kept.
        keep_checkpoints, progress: keep each finished seed's last checkpoint; a tqdm bar per seed.

    Returns:
        ``{algo name: RunResult}``, as :func:`~grpo_lab.experiments.run_grid`.

    Raises:
        ValueError: a malformed ``chapter``; an algorithm the memory model says will not fit the card
            (:func:`grpo_lab.experiments.memory_fit.check_algorithms_fit`); ``save_every < 0``; as
            :func:`~grpo_lab.experiments.run_grid`.
    """
    chapter = _chapter_name(chapter)
    prof = profile if profile is not None else gpu_profile()
    prof = get_profile(prof) if isinstance(prof, str) else prof
    algos = [get_algorithm(a) if isinstance(a, str) else a for a in algos]
    seeds = _check_seeds(seeds)
    overrides = dict(overrides or {})
    path = _gpu_results_path(chapter, out, steps, n_jobs)
    check_results_location(path)
    announce_gpu_runs(chapter, prof, len(algos), len(seeds), steps)
    # before any weight is loaded: the reference copy, the critic
    check_algorithms_fit(prof, algos)
    outputs = _chapter_outputs(path, prof, save_every)
    t0 = time.perf_counter()
    grid: dict[str, RunResult] = {}
    # one seed at a time (n_jobs seeds at a time with n_jobs > 1), the file rewritten after each, so
    # that a crash hours in (out of memory on the last seed) keeps what finished
    batches = [seeds[i:i + n_jobs] for i in range(0, len(seeds), n_jobs)]
    for algo in algos:
        parts = []
        for batch in batches:
            one = {algo.name: overrides[algo.name]} if algo.name in overrides else None
            parts.append(run_grid([algo], profile=prof, seeds=batch, steps=steps, n_jobs=n_jobs, cache=False,
                                  overrides=one, progress=progress, **outputs)[algo.name])
            if not keep_checkpoints:  # finished: its results are in its result.json and the file
                for s in batch:
                    shutil.rmtree(checkpoints_dir(seed_dir(outputs["output_dir"], algo.name, s)), ignore_errors=True)
            done = [s for p in parts for s in p.provenance["seeds"]]
            grid[algo.name] = RunResult(pd.concat([p.history for p in parts], ignore_index=True),
                                        {**parts[0].provenance, "seeds": done,
                                         "wall_seconds": round(sum(p.provenance["wall_seconds"] for p in parts), 1)})
            complete = finish and algo is algos[-1] and batch is batches[-1]
            _save_chapter(path, chapter, prof, grid, seeds, time.perf_counter() - t0, complete)
    return grid


def check_results_location(path: Path, *, environ: Mapping[str, str] | None = None,
                           on_colab: bool | None = None) -> None:
    """Refuse, on Colab, to write a GPU run's results and checkpoints (gigabytes) to the VM's disk unasked.

    Colab deletes ``/content`` when it recycles the VM; Drive survives it. On Colab (``google.colab`` imported)
    with ``$GRPO_LAB_RESULTS_DIR`` unset and ``path`` outside ``/content/drive``, raise, saying how to proceed.
    Elsewhere, or with ``$GRPO_LAB_RESULTS_DIR`` set (to Drive, or on purpose to ``/content``), do nothing.

    Args:
        path: the results file; its run directory is next to it.
        environ, on_colab: for tests (default ``os.environ`` and whether ``google.colab`` is imported).

    Raises:
        RuntimeError: as above (one message: mount Drive and set the variable, or set it to accept the VM's disk).
    """
    import sys

    env = os.environ if environ is None else environ
    colab = "google.colab" in sys.modules if on_colab is None else on_colab
    if not colab or env.get("GRPO_LAB_RESULTS_DIR") or str(Path(path).resolve()).startswith("/content/drive/"):
        return
    raise RuntimeError(
        f"GPU results and checkpoints (gigabytes) would go to {Path(path).parent} on the Colab VM, lost when Colab "
        "recycles it. Mount Drive and point $GRPO_LAB_RESULTS_DIR there, in a cell before this one: "
        "from google.colab import drive; drive.mount('/content/drive'); import os; "
        "os.environ['GRPO_LAB_RESULTS_DIR'] = '/content/drive/MyDrive/grpo_lab_results'. To keep them on the VM "
        "anyway, set os.environ['GRPO_LAB_RESULTS_DIR'] = '/content/grpo_lab_results'. Then run this cell again "
        "(it resumes from the newest checkpoint there).")


def announce_gpu_runs(chapter: str, profile: Profile, n_algos: int, n_seeds: int, steps: int | None) -> str:
    """Print (and return) the predicted wall time of a chapter's GPU runs before they start, and, with fewer
    than five seeds, that the results are a look, not a claim.

    The time is :func:`~grpo_lab.experiments.colab_minutes` (Colab's T4, set-up included) for the
    ``"colab"`` profile, else :func:`~grpo_lab.experiments.expected_gpu_minutes` on an H100 and a T4:
    assumed speeds, never measured.
    """
    from ..experiments.profiles import colab_minutes, expected_gpu_minutes

    runs = n_algos * n_seeds
    if profile.name == "colab":
        when = f"about {colab_minutes(profile, runs, steps=steps):.0f} min on Colab's T4, set-up included"
    else:
        when = (f"about {expected_gpu_minutes(profile, runs, 'H100', steps=steps):.0f} min on an H100, "
                f"{expected_gpu_minutes(profile, runs, 'T4', steps=steps):.0f} min on a T4")
    line = (f"{chapter}: {runs} GPU run(s) ({n_algos} algorithm(s) x {n_seeds} seed(s), profile {profile.name!r}), "
            f"predicted {when} (assumed speeds, never measured)")
    if n_seeds < _CLAIM_SEEDS:
        line += f"; {n_seeds} seed(s): a look, not a claim"
    print(line, flush=True)
    return line


def _chapter_outputs(path: Path, prof: Profile | str, save_every: int | None) -> dict[str, Any]:
    """The output settings :func:`run_chapter_gpu` passes to :func:`~grpo_lab.experiments.run_grid`: ``output_dir`` (the run
    directory of ``path``), ``save_every``, ``save_total_limit=1`` and ``resume``, true unless ``path`` is a
    ``complete`` results file (then the earlier seed directories are deleted: a fresh start).

    Raises:
        ValueError: ``save_every`` below 0.
    """
    config = (get_profile(prof) if isinstance(prof, str) else prof).config
    every = non_negative_int("run_chapter_gpu: save_every",
                             save_every if save_every is not None else (config.save_every or 10))
    root = run_directory(path)
    try:
        complete = path.is_file() and load_results(path).provenance.get("complete") is True
    except ValueError:  # a damaged results file: the run directories (checked on resume) decide
        complete = False
    if complete:
        _remove_seed_dirs(root)
    return {"output_dir": str(root), "save_every": int(every), "save_total_limit": 1, "resume": not complete}


def _save_chapter(path: Path, chapter: str, prof: Profile, grid: Mapping[str, RunResult], seeds: list[int],
                  wall: float, complete: bool, extra: Mapping[str, Any] | None = None) -> None:
    """Write :func:`run_chapter_gpu`'s results file for the runs in ``grid`` so far."""
    from ..training.trainer import resolve_precision

    first = next(iter(grid.values())).provenance
    prov = {k: first[k] for k in ("git_sha", "grpo_lab", "torch", "transformers", "python", "device", "device_name",
                                   "profile", "base", "task", "steps", "date")}
    prov.update(chapter=chapter, seeds=list(seeds), complete=complete,
                precision=resolve_precision(prof.config.precision, prof.config.device),
                dry_run=not str(prof.config.device).startswith("cuda"),
                task_kwargs=dict(prof.task_kwargs), wall_seconds=round(wall, 1),
                max_new_tokens=prof.config.max_new_tokens or dict(prof.task_kwargs).get("max_new_tokens"),
                runs={name: r.provenance for name, r in grid.items()}, **dict(extra or {}))
    try:
        import datasets
        prov["datasets"] = datasets.__version__
    except ImportError:
        pass
    history = pd.concat([r.history for r in grid.values()], ignore_index=True)
    save_results(RunResult(history, prov), path)


def load_chapter_gpu(chapter: str, directory: str | Path | None = None) -> tuple[dict[str, RunResult], dict] | None:
    """The results :func:`run_chapter_gpu` wrote for ``chapter``, or ``None`` when there are none.

    Returns:
        ``({algo name: RunResult}, provenance)``: each RunResult holds that algorithm's rows and
        its own provenance; ``provenance`` is the file's common record.

    Raises:
        ValueError: a malformed ``chapter``, or a file that is not a chapter results file.
    """
    path = Path(directory if directory is not None else results_dir()) / f"{_chapter_name(chapter)}.json"
    if not path.is_file():
        return None
    whole = load_results(path)
    runs = whole.provenance.get("runs")
    if not isinstance(runs, dict) or "algo" not in whole.history.columns:
        raise ValueError(f"load_chapter_gpu: {path} is not a chapter results file (no per-algorithm runs)")
    out = {name: RunResult(whole.history[whole.history["algo"] == name].reset_index(drop=True), prov)
           for name, prov in runs.items()}
    return out, whole.provenance


def check_gpu_results(results: Mapping[str, RunResult], provenance: Mapping[str, Any]) -> None:
    """Assert the facts every GPU-profile result must show (a chapter's assertions on the GPU profile,
    where the CPU profile's are tuned to the toy task and do not apply):

    * it ran on CUDA (unless the provenance marks a ``dry_run`` of the code path on another device),
      with its precision recorded;
    * the file is ``complete`` (:func:`run_chapter_gpu` marks a file it is still writing);
    * every algorithm ran every seed of the provenance, to its last step, with a greedy test
      accuracy at step 0 and at the end, all in [0, 1];
    * the base policy's greedy accuracy agrees across algorithms and seeds within 0.02 (the same
      checkpoint and test set; GPU kernels are not bit-reproducible, so not exactly);
    * training accuracies are in [0, 1], mean rewards finite (shaped rewards, such as DAPO's overlong
      penalty, may be negative), gradient norms finite where an update was applied; under float16,
      fewer than half the optimiser steps were skipped for overflow;
    * with the profile's default model (:data:`~grpo_lab.experiments.GPU_MODEL`) on GSM8K, the base policy solves more
      than 10% of the test problems (an instruct model that can do grade-school arithmetic at all:
      below that the prompt or the answer extraction is broken).

    A run whose provenance marks it a ``baseline`` (:func:`run_rpt_gpu`'s continued NTP: no RL
    steps, only a base and a final evaluation) is held to the facts on seeds and test accuracies.

    Raises:
        AssertionError: the first fact that does not hold, named.
    """
    def fact(ok, what):
        if not ok:
            raise AssertionError(f"GPU results: {what}")

    fact(str(provenance.get("device", "")).startswith("cuda") or provenance.get("dry_run") is True,
         f"device {provenance.get('device')!r} is not CUDA")
    fact(provenance.get("complete", True) is not False,
         "the file is incomplete: the run stopped before every algorithm and seed finished (its runs so far are kept)")
    fact(provenance.get("precision") in ("bfloat16", "float16", "float32"),
         f"precision {provenance.get('precision')!r} not recorded")
    seeds, steps = list(provenance["seeds"]), int(provenance["steps"])
    bases = []
    for name, r in results.items():
        h = r.history
        fact(sorted(h["seed"].unique().tolist()) == sorted(seeds), f"{name} lacks seeds of {seeds}")
        fact(int(h["step"].max()) == steps, f"{name} stopped before step {steps}")
        final, base = r.final(), r.base()
        fact(final.size == len(seeds) and base.size == len(seeds), f"{name} lacks a base or final test accuracy")
        fact(bool(((final >= 0) & (final <= 1)).all() and ((base >= 0) & (base <= 1)).all()),
             f"{name}: a test accuracy outside [0, 1]")
        bases.extend(base.tolist())
        if provenance.get("runs", {}).get(name, {}).get("baseline"):
            continue
        trained = h[h["step"] > 0]
        fact(bool(trained["accuracy"].between(0, 1).all()), f"{name}: a training accuracy outside [0, 1]")
        fact(bool(np.isfinite(trained["reward"]).all()), f"{name}: a non-finite mean reward")
        grads = trained["grad_norm"].dropna()
        fact(bool(np.isfinite(grads).all()), f"{name}: a non-finite gradient norm")
        if "amp_skipped_steps" in trained:
            skipped = trained.groupby("seed")["amp_skipped_steps"].max()
            run_cfg = provenance["runs"][name]["config"]
            updates = steps * int(run_cfg["minibatches"]) * int(run_cfg.get("epochs", 1))
            fact(bool((skipped < updates / 2).all()), f"{name}: float16 skipped half the optimiser steps or more")
    fact(max(bases) - min(bases) <= 0.02, f"the base accuracy differs across runs ({min(bases):.3f} to {max(bases):.3f})")
    if provenance.get("base") == GPU_MODEL and provenance.get("task") == "gsm8k":
        fact(float(np.mean(bases)) > 0.10, f"{GPU_MODEL} solves only {np.mean(bases):.3f} of the test problems")
