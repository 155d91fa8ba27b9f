"""Runs: one algorithm (:func:`~grpo_lab.experiments.run`) or several
(:func:`~grpo_lab.experiments.run_grid`) trained from a profile's base checkpoint for several
seeds, from the run cache where possible, in this process or in the worker pool. Documented under
:mod:`grpo_lab.experiments`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import warnings
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import torch

from ..algo.advantages import GROUP_BASELINE_ESTIMATORS
from ..algo.algorithms import Algorithm, get_algorithm
from ..policy.lora import require_peft
from ..policy.models import load_policy
from ..paths import checkpoint_dir
from ..tasks import get_task
from ..training.trainer import Terminated, Trainer, TrainerConfig
from ..training.config import OUTPUT_FIELDS
from ..training.learning_signal import (DynamicSamplingShortfallWarning, NoLearningSignalWarning, no_signal_step, no_signal_warning, shortfall_steps, shortfall_warning)
from ..algo.checks import is_int
from .profiles import PROFILES, Profile, _task_fix, get_profile
from .results import RunResult, provenance
from .run_dirs import (_check_run_dirs, _check_seed_dir, _finish_seed, _finished_rows, _run_record, _unreadable_result, _start_seed, latest_checkpoint, run_lock, save_final_model, seed_dir)
from .run_cache import (_cache_load, _cache_path, _cache_store, _run_key, _uncacheable, run_cache_dir, run_fingerprint)
from .workers import (_FRESH_REGISTRIES, _import_user_module, _module_roots, _user_modules, _worker_pool, shutdown_workers)

__all__ = ["run", "run_grid", "run_tally", "RESUME_LOG"]

#: Seeded runs this process has asked :func:`run` / :func:`run_grid` for: ``trained`` (here or in a
#: worker) and ``loaded`` (read from the run cache). Read through :func:`run_tally`.
_TALLY = {"trained": 0, "loaded": 0}


def run_tally() -> dict[str, int]:
    """How many seeded runs :func:`run` and :func:`run_grid` have trained (``"trained"``: distinct
    configurations, in this process or its workers) and read from the run cache (``"loaded"``) since
    this process started: what a chapter's stated run time includes (:func:`grpo_lab.lab.book.run_time`).
    Work given to :func:`map_workers` directly is not counted (it is always done)."""
    return dict(_TALLY)


def _resolve(profile: str | Profile, config_overrides: dict) -> Profile:
    """The profile ``profile`` (a name or a :class:`Profile`) with ``config_overrides`` applied.

    Raises:
        TypeError: ``profile`` is neither a name nor a :class:`Profile`.
        ValueError: an unknown profile name, a ``seed`` override, an unknown
            :class:`~grpo_lab.training.trainer.TrainerConfig` field, or a CUDA device (from the overrides or
            the profile: the message says which) when CUDA is not available.
    """
    if not isinstance(profile, (str, Profile)):
        raise TypeError(f"run: profile must be a profile name ({sorted(PROFILES)}) or a Profile, got {profile!r}")
    prof = get_profile(profile) if isinstance(profile, str) else profile
    if "seed" in config_overrides:
        raise ValueError("run: pass seeds=[...] (one run per seed), not seed=; the profile's seed field is "
                         "replaced by each run's seed")
    if config_overrides:
        known = {f.name for f in fields(TrainerConfig)}
        unknown = sorted(set(config_overrides) - known)
        if unknown:
            raise ValueError(f"run: unknown TrainerConfig field(s) {unknown}; known: {sorted(known)}")
        prof = replace(prof, config=replace(prof.config, **config_overrides))
    device = prof.config.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        if "device" in config_overrides:
            where = f"device={device!r} (from the overrides: run(..., device=...), or --set device=...)"
            fix = "set device='cpu' (--set device=cpu) or run on a machine with CUDA"
        else:
            where = f"device={device!r} (from profile {prof.name!r})"
            fix = ("use a CPU profile (profile='cpu', --profile cpu), or set device='cpu' (--set device=cpu), "
                   "or run on a machine with CUDA")
        raise ValueError(f"run: {where} needs CUDA, which is not available in this process; {fix}")
    return prof


def _lr_horizon(prof: Profile, steps: int) -> Profile:
    """``prof`` with ``TrainerConfig.lr_schedule_steps`` set to the run's ``steps`` (at least 1) when its
    ``lr_schedule`` decays (``"linear"``, ``"cosine"``) and no horizon is given; otherwise ``prof`` itself
    (a constant schedule keeps ``None``: its runs are the runs made before schedules existed)."""
    c = prof.config
    if c.lr_schedule == "constant" or c.lr_schedule_steps is not None:
        return prof
    return replace(prof, config=replace(c, lr_schedule_steps=max(1, int(steps))))


def _check_seeds(seeds) -> list[int]:
    if isinstance(seeds, (int, str)) or not hasattr(seeds, "__iter__"):
        raise ValueError(f"seeds must be a sequence of ints such as (0, 1, 2), got {seeds!r}")
    seeds = list(seeds)
    bad = [s for s in seeds if not is_int(s)]
    if bad:
        raise ValueError(f"seeds must be integers such as (0, 1, 2), got {bad[0]!r} in {seeds!r}")
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("need at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct (a repeated seed repeats a run and shrinks the sd), got {seeds}")
    return seeds


def _check_steps(steps) -> int:
    if int(steps) != steps or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    return int(steps)


def _train_one(algo: Algorithm, prof: Profile, steps: int, seed: int, progress: bool | None,
               cache_path: Path | None = None,
               modules: Sequence[str | tuple[str, str | None]] = (), resume: bool = False,
               save_model: bool = False) -> pd.DataFrame:
    """One seed of one algorithm from the profile's base checkpoint (a process-pool task); the
    history is stored at ``cache_path`` when given. ``modules`` (:func:`_user_modules`, as names or
    as the ``(name, root)`` pairs of :func:`_module_roots`) are imported first, so that a worker
    registers the user's choices and task as the caller did.

    With a ``TrainerConfig.output_dir`` in the profile, the seed writes into its own directory under it
    (:func:`~grpo_lab.experiments.run_dirs.seed_dir`): ``run.json`` first, its trackers' files and periodic
    checkpoints while it trains, ``result.json`` at the end. With ``resume`` a seed whose
    ``result.json`` holds ``steps`` steps is read back instead of trained, and one with a periodic
    checkpoint continues from the latest (:meth:`~grpo_lab.training.trainer.Trainer.resume`), after the checks of
    ``_check_seed_dir`` (``ValueError`` naming what differs). With ``save_model`` (and a seed directory) the
    trained policy is written to its ``final/`` (:func:`~grpo_lab.experiments.run_dirs.save_final_model`)
    before ``result.json``; a seed read back from its ``result.json`` writes none."""
    for module in modules:
        _import_user_module(module)
    try:  # validate again here: a spawned worker has only the registry entries its imports made
        algo = algo.replace()
    except ValueError as exc:
        raise ValueError(f"{exc}. {_FRESH_REGISTRIES}") from None
    cfg = replace(prof.config, seed=int(seed), progress=progress)
    directory = None
    if cfg.output_dir is not None:
        directory = seed_dir(cfg.output_dir, algo.name, seed)
        cfg = replace(cfg, output_dir=str(directory))
        record = _run_record(algo, prof, seed)
        _check_seed_dir(directory, record, steps, resume)
        if resume and (rows := _finished_rows(directory, steps)) is not None:
            _cache_store(cache_path, rows)
            return pd.DataFrame(rows)
        _start_seed(directory, record)
    ckpt = latest_checkpoint(directory) if resume and directory is not None else None
    if ckpt is not None:
        trainer = Trainer.resume(ckpt, task=_profile_task(prof), device=cfg.device,
                                 output={k: getattr(cfg, k) for k in OUTPUT_FIELDS})
    else:
        trainer = _fresh_trainer(algo, prof, cfg)
    key = _base_eval_key(_base_of(prof), prof, cfg)
    if ckpt is None and key in _BASE_EVALS:  # this process already evaluated this base policy: the same numbers
        trainer.rows.append(dict(_BASE_EVALS[key]))
    with warnings.catch_warnings():  # run() warns once over all seeds (_warn_no_signal), in the caller's process
        warnings.simplefilter("ignore", NoLearningSignalWarning)
        warnings.simplefilter("ignore", DynamicSamplingShortfallWarning)
        trainer.train(steps - trainer.step)
    if key is not None and key not in _BASE_EVALS and trainer.rows and trainer.rows[0].get("step") == 0:
        _BASE_EVALS[key] = dict(trainer.rows[0])
    if directory is not None:
        if save_model:
            save_final_model(trainer, directory)
        _finish_seed(directory, steps, trainer.rows)
    _cache_store(cache_path, trainer.rows)
    return pd.DataFrame(trainer.rows)


#: Where :func:`~grpo_lab.experiments.run` says, with ``resume=True``, what each seed resumes from (INFO records, after the checks of
#: every seed's directory; the command line prints them).
RESUME_LOG = logging.getLogger("grpo_lab.experiments.resume")


def _log_resume_points(jobs, steps: int, resume: bool) -> None:
    """With ``resume``: one INFO record on :data:`RESUME_LOG` per seed with a directory, naming what it resumes
    from (its ``result.json``, read back; its latest checkpoint; or step 0)."""
    if not resume:
        return
    for algo, seed, prof in jobs:
        if prof.config.output_dir is None:
            continue
        d = seed_dir(prof.config.output_dir, algo.name, seed)
        ckpt = latest_checkpoint(d)
        if _finished_rows(d, steps) is not None:
            what = f"finished earlier, read back from {d / 'result.json'} (nothing to train)"
        elif ckpt is not None:
            what = f"resumes from {ckpt} (step {int(ckpt.name.split('-')[-1])} of {steps})"
        else:
            what = "no checkpoint, training from step 0"
        if (why := _unreadable_result(d)) is not None:  # a damaged result.json is not silently trained over
            RESUME_LOG.warning(f"seed {seed}: {d / 'result.json'} is unreadable ({why}): not read back; {what}")
        else:
            RESUME_LOG.info(f"seed {seed}: {what}")


def _base_of(prof: Profile) -> str:
    """The profile's base as :func:`~grpo_lab.policy.models.load_policy` is given it: the shipped checkpoint's
    directory when ``data/checkpoints`` has one of that name, else the name (a directory or a hub id)."""
    return checkpoint_dir(prof.base) if checkpoint_dir(prof.base).exists() else prof.base


def _profile_task(prof: Profile):
    """The profile's task object (``get_task(prof.task, **prof.task_kwargs)``).

    Raises:
        ValueError: the task is not registered in this process (a worker that did not import its module).
    """
    from ..tasks import TASKS

    if prof.task not in TASKS:
        raise ValueError(f"run: task {prof.task!r} is not registered in this process; known tasks: "
                         f"{sorted(TASKS)}. {_FRESH_REGISTRIES}")
    return get_task(prof.task, **dict(prof.task_kwargs))


def _fresh_trainer(algo: Algorithm, prof: Profile, cfg: TrainerConfig) -> Trainer:
    """A trainer of ``algo`` from the profile's base checkpoint (LoRA adapters drawn with ``cfg.seed``).

    Raises:
        OSError: the base cannot be loaded (:func:`_unloadable`).
        ValueError: the task is not registered in this process.
    """
    base = _base_of(prof)
    # float32 weights whatever the checkpoint's dtype (hub models ship bfloat16): the trainer keeps
    # float32 master weights and runs the forward passes in TrainerConfig.precision
    try:
        policy, tokenizer = load_policy(base, device=prof.config.device, dtype=torch.float32)
    except OSError as exc:  # a hub id offline and not cached, a gated or misspelled repository
        raise _unloadable(prof, exc) from exc
    if prof.lora is not None:  # the adapters, initialised with the run's seed (the base is the same for every seed)
        policy = prof.lora.apply(policy, seed=int(cfg.seed))
    return Trainer(policy, tokenizer, _profile_task(prof), algo, cfg)


def _unloadable(prof: Profile, exc: BaseException) -> OSError:
    """The error for a base model that could not be loaded (a hub id offline and not cached, a
    gated or misspelled repository), naming the profile and, for the GPU profile, the variable
    that names another model."""
    hint = (" It is the GPU profile's model (experiments.GPU_MODEL); $GRPO_LAB_GPU_MODEL names another, e.g. a "
            "local directory in the hub layout." if prof.name == "gpu" else "")
    return OSError(f"could not load the base model {prof.base!r} of profile {prof.name!r}: {str(exc).rstrip('. ')}.{hint}")


#: Step-0 evaluation rows of base policies, per process (:func:`_train_one`): the greedy evaluation
#: of a checkpoint before any update does not depend on the algorithm or the seed, so the seeds
#: and settings that one worker trains from the same base share it (``eval_seconds`` included:
#: the wall time of the evaluation that produced the row).
_BASE_EVALS: dict[str, dict] = {}


def _base_eval_key(base, prof: Profile, cfg: TrainerConfig) -> str | None:
    """What the step-0 evaluation of a run depends on, as a string; ``None`` when it is not shared.

    The base checkpoint directory (resolved path, and every file's size and modification time, so
    that a rebuilt checkpoint is evaluated again), the task and its arguments, and the trainer
    configuration without its seed and output fields (the generation budget, the device and the
    dtypes are in it). Not shared: no evaluation (``eval_every=0``), sampled evaluation
    (``eval_sampled``: it depends on the seed's random numbers), a base that is not a local
    directory (a hub id), or a LoRA profile (its adapters are drawn with each run's seed).
    """
    if not cfg.eval_every or cfg.eval_sampled or not Path(base).is_dir() or prof.lora is not None:
        return None
    root = Path(base).resolve()
    stamp = [(str(f.relative_to(root)), f.stat().st_size, f.stat().st_mtime_ns)
             for f in sorted(root.rglob("*")) if f.is_file()]
    return json.dumps([str(root), stamp, prof.task, [list(kv) for kv in prof.task_kwargs],
                       replace(cfg, seed=0).run_identity()], sort_keys=True, default=str)


def _warn_no_signal(algo: Algorithm, prof: Profile, frames: Sequence[pd.DataFrame]) -> None:
    """One :class:`~grpo_lab.training.learning_signal.NoLearningSignalWarning` for the seeds of ``algo``
    (labelled histories, :func:`_label`) that had every group tied for
    :data:`~grpo_lab.training.learning_signal.NO_SIGNAL_STEPS` steps in a row, in the caller's process
    (seeds trained in workers, or read from the run cache, included); none for a value baseline or G = 1."""
    if prof.config.group_size < 2 or algo.advantage not in GROUP_BASELINE_ESTIMATORS:
        return
    hits = [(int(f["seed"].iloc[0]), no_signal_step(f.to_dict("records"))) for f in frames if len(f)]
    hits = [(seed, at) for seed, at in hits if at is not None]
    if not hits:
        return
    first = frames[0][frames[0]["step"] == 0] if "step" in frames[0] else frames[0].iloc[:0]
    base = float(first["test_accuracy"].iloc[0]) if len(first) and "test_accuracy" in first else None
    warnings.warn(no_signal_warning(algo.name, prof.config.group_size, min(at for _, at in hits),
                                    seeds=[s for s, _ in hits], base_accuracy=base),
                  NoLearningSignalWarning, stacklevel=3)


def _warn_shortfall(algo: Algorithm, prof: Profile, frames: Sequence[pd.DataFrame], steps: int) -> None:
    """One :class:`~grpo_lab.training.learning_signal.DynamicSamplingShortfallWarning` for the seeds of
    ``algo`` whose dynamic sampling trained a step on fewer than ``prompts_per_step`` groups, in the caller's
    process (the trainer's per-step warnings are silenced in the seeds, :func:`_train_one`)."""
    c = prof.config
    short = {int(f["seed"].iloc[0]): n for f in frames if len(f) and "seed" in f
             for n in [shortfall_steps(f.to_dict("records"), c.prompts_per_step)] if n}
    if short:
        warnings.warn(shortfall_warning(algo.name, short, steps, c.prompts_per_step, c.max_gen_rounds),
                      DynamicSamplingShortfallWarning, stacklevel=3)


def _label(h: pd.DataFrame, algo: Algorithm, seed: int) -> pd.DataFrame:
    h.insert(0, "seed", int(seed))
    h.insert(0, "algo", algo.name)
    return h


def _map(jobs: list[tuple], n_jobs: int) -> list[pd.DataFrame]:
    """Run ``_train_one(*job)`` for every job, in ``n_jobs`` worker processes when ``n_jobs > 1``.

    Each run is independent and seeded, and uses the profile's thread count, so results do not
    depend on ``n_jobs``; processes are started with "spawn" (safe with torch and in notebooks)
    and kept for the next call (:func:`_worker_pool`, :func:`shutdown_workers`). A SIGTERM while workers train
    is forwarded to them (:class:`_ForwardSigterm`); once each has written its checkpoint, ``Terminated`` is
    raised naming every seed's checkpoint.
    """
    if n_jobs < 1:
        raise ValueError(f"n_jobs must be >= 1, got {n_jobs}")
    if n_jobs == 1 or len(jobs) <= 1:
        return [_train_one(*job) for job in jobs]
    pool = _worker_pool(n_jobs)
    try:
        with _ForwardSigterm(pool) as forward:
            out, left = _collect(pool, jobs, n_jobs, forward)
        stopped = [o for o in out if isinstance(o, Terminated)]
        if stopped or left:  # SIGTERM: every worker has finished its step and written its checkpoint
            raise Terminated(stopped[0].step, stopped[0].checkpoint, stopped[1:]) if stopped else Terminated(0, None)
        return out
    except BaseException:
        shutdown_workers(now=True)  # a failed or interrupted call leaves no worker busy with its other jobs
        raise


def _collect(pool, jobs: list[tuple], n_jobs: int, forward: "_ForwardSigterm") -> tuple[list, int]:
    """Run the jobs in ``pool``, at most ``n_jobs`` at a time (none waits in the pool's queue, so a SIGTERM
    starts no further job); returns each job's history (its :class:`~grpo_lab.training.trainer.Terminated` for
    one stopped by SIGTERM, ``None`` for one not started) and the number of jobs not started."""
    from concurrent.futures import FIRST_COMPLETED, wait

    out: list = [None] * len(jobs)
    queue, running = list(range(len(jobs))), {}
    while running or (queue and not forward.requested):
        while queue and len(running) < n_jobs and not forward.requested:
            i = queue.pop(0)
            running[pool.submit(_train_one, *jobs[i])] = i
        done, _ = wait(list(running), return_when=FIRST_COMPLETED)
        for f in done:
            i = running.pop(f)
            try:
                out[i] = f.result()
            except Terminated as exc:  # this worker's run: a checkpoint written
                out[i] = exc
    return out, len(queue)


class _ForwardSigterm:
    """While :func:`_map` waits for its worker processes (main thread, SIGTERM at its default): a SIGTERM starts
    no further job (:func:`_collect`) and is forwarded to every worker, each of which finishes its step in progress and
    writes a checkpoint (:meth:`grpo_lab.training.trainer.Trainer.train`); a second one is forwarded too (the
    workers then stop at once). ``requested``: a SIGTERM arrived."""

    def __init__(self, pool):
        self.pool, self.requested, self.previous = pool, False, None

    def __enter__(self) -> "_ForwardSigterm":
        import signal
        import threading

        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self.previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            import signal

            signal.signal(signal.SIGTERM, self.previous)

    def _handle(self, signum, frame) -> None:
        import signal
        import sys

        self.requested = True
        workers = [p for p in (getattr(self.pool, "_processes", None) or {}).values() if p.is_alive()]
        for proc in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        print(f"SIGTERM: forwarded to {len(workers)} worker process(es); waiting for each run to finish its step "
              "and write a checkpoint", file=sys.stderr, flush=True)


def _run_jobs(jobs: list[tuple[Algorithm, int, Profile]], steps: int, progress: bool | None, n_jobs: int,
              cache: bool, resume: bool = False,
              save_model: bool = False) -> tuple[list[pd.DataFrame], list[tuple[str, int]], str | None]:
    """Histories of every ``(algo, seed, profile)`` job, in order, each configuration trained once
    (two names for the same configuration share one run, unless the runs write into an
    ``output_dir``: each name then has its own directory), from the run cache where possible (never
    for a run with an ``output_dir``, which must write its files: it is only stored).

    Returns:
        ``(frames, hits, note)``: the histories, the pairs loaded from the cache, and why the cache
        was not used (``None`` when it was).

    Raises:
        ValueError: ``n_jobs < 1``; a seed directory that does not fit ``resume`` (``_check_run_dirs``).
    """
    if n_jobs < 1:
        raise ValueError(f"n_jobs must be >= 1, got {n_jobs}")
    with contextlib.ExitStack() as locks:  # one writer per run directory (run_dirs.run_lock)
        for out in dict.fromkeys(p.config.output_dir for _, _, p in jobs if p.config.output_dir is not None):
            locks.enter_context(run_lock(out))
        return _run_locked_jobs(jobs, steps, progress, n_jobs, cache, resume, save_model)


def _run_locked_jobs(jobs, steps, progress, n_jobs, cache, resume, save_model):
    """:func:`_run_jobs`'s body, its run directories locked."""
    _check_run_dirs(jobs, steps, resume)  # every seed's directory before any trains
    _log_resume_points(jobs, steps, resume)
    root, note = _cache_root(jobs, cache)
    prints: dict[str, str] = {}  # one fingerprint per distinct profile (base checkpoint, threads, device)
    if root is not None:
        try:
            for _, _, p in jobs:
                prints.setdefault(repr(p), run_fingerprint(p))
            root.mkdir(parents=True, exist_ok=True)
        except (ValueError, OSError) as exc:
            root, note = None, f"off: {exc}"
    fps = [prints.get(repr(p), "") for _, _, p in jobs]
    keys = [_run_key(fp, a, p, steps, s) + (f"/{a.name}" if p.config.output_dir is not None else "")
            for fp, (a, s, p) in zip(fps, jobs)]
    paths = {k: (_cache_path(root, fp, a, p, steps, s) if root is not None else None)
             for k, fp, (a, s, p) in zip(keys, fps, jobs)}
    writes = {k: p.config.output_dir is not None for k, (_, _, p) in zip(keys, jobs)}
    loaded = {k: None if writes[k] else _cache_load(path, steps) for k, path in paths.items()}
    hits = [(a.name, s) for (a, s, _), k in zip(jobs, keys) if loaded[k] is not None]
    todo = [k for k in dict.fromkeys(keys) if loaded[k] is None]
    first = {k: jobs[keys.index(k)] for k in todo}
    fresh = _map([(first[k][0], first[k][2], steps, first[k][1], progress, paths[k],
                   _module_roots(_user_modules(first[k][0], first[k][2])), resume, save_model) for k in todo], n_jobs)
    loaded.update(zip(todo, fresh))
    _TALLY["trained"] += len(todo)
    _TALLY["loaded"] += len(hits)
    frames = [_label(loaded[k].copy(), a, s) for (a, s, _), k in zip(jobs, keys)]
    return frames, hits, note


def _cache_root(jobs: list[tuple[Algorithm, int, Profile]], cache: bool) -> tuple[Path | None, str | None]:
    """The run cache's directory for these jobs, or ``None`` and why not (``cache=False``,
    ``$GRPO_LAB_RUN_CACHE``, code outside the package); a note that runs with an ``output_dir`` are stored
    but not loaded."""
    root, note = (run_cache_dir(), None) if cache else (None, "off (cache=False)")
    if cache and root is None:
        note = "off (GRPO_LAB_RUN_CACHE, or not a source checkout)"
    outside = sorted({x for a, _, p in jobs for x in _uncacheable(a, p)})
    if root is not None and outside:
        root, note = None, "off: code outside grpo_lab, " + ", ".join(outside)
    if root is not None and any(p.config.output_dir is not None for _, _, p in jobs):
        note = "store only (the runs write into output_dir, so none is loaded from the cache)"
    return root, note


def _check_outputs(prof: Profile, resume: bool, where: str = "run") -> None:
    """``resume`` and ``save_every`` need an ``output_dir``.

    Raises:
        ValueError: ``resume=True`` or ``save_every > 0`` without ``output_dir`` (naming both).
    """
    c = prof.config
    if resume and c.output_dir is None:
        raise ValueError(f"{where}: resume=True continues the runs in output_dir, which is None; pass "
                         "output_dir=... (the directory of the run to resume)")
    if c.save_every and c.output_dir is None:
        raise ValueError(f"{where}: save_every={c.save_every} writes checkpoints under output_dir, which is None; "
                         "pass output_dir=... or save_every=0")


def run(algo: Algorithm | str, *, profile: str | Profile = "cpu", seeds: Sequence[int] = (0, 1, 2),
        steps: int | None = None, progress: bool | None = None, n_jobs: int = 1, cache: bool = True,
        base: str | os.PathLike | None = None, task: str | None = None, lora=None, resume: bool = False,
        save_model: bool = False, **config_overrides) -> RunResult:
    """Train ``algo`` from the profile's base checkpoint once per seed.

    Every seed starts from the same base weights; the seed fixes prompt sampling, generation and minibatch order.
    Seeds run in turn or in ``n_jobs`` processes (same results). A killed run rerun with ``resume=True`` ends with
    the same history, bit for bit (but :data:`grpo_lab.training.history.MEASURED_COLUMNS`).

    Args:
        algo: an :class:`~grpo_lab.algo.algorithms.Algorithm` or a preset name (``"GRPO"``).
        profile, seeds, steps: ``"cpu"``, ``"gpu"`` or a :class:`Profile`; one seed or more; steps instead of the profile's.
        progress, n_jobs: a tqdm bar per seed (default: in an interactive terminal only); worker processes.
        cache: use the run cache (:mod:`grpo_lab.experiments`; ``GRPO_LAB_RUN_CACHE=off`` disables it).
        base: a checkpoint (as :func:`~grpo_lab.policy.models.load_policy` takes) instead of the profile's.
        task: a key of :data:`grpo_lab.tasks.TASKS` instead of the profile's (its ``task_kwargs`` then dropped).
        lora: LoRA adapters (:class:`grpo_lab.policy.lora.LoraSpec` or a dict) instead of the profile's; needs peft.
        resume: continue the runs in ``output_dir`` (finished seeds read back, checkpointed ones continued).
        save_model: write each seed's policy and tokenizer (:func:`~grpo_lab.experiments.run_dirs.save_final_model`).
        **config_overrides: :class:`~grpo_lab.training.trainer.TrainerConfig` fields; with ``output_dir=DIR`` each
            seed writes into ``DIR/<algorithm>/seed-<k>`` (:func:`~grpo_lab.experiments.run_dirs.seed_dir`).

    Returns:
        RunResult.

    Raises:
        ValueError: no seeds; unknown profile, algorithm or task; an empty ``base``; an invalid override;
            ``n_jobs < 1``; CUDA unavailable; ``resume``, ``save_every`` or ``save_model`` without ``output_dir``;
            an earlier run in a seed directory without ``resume``; with it, another run's directory (every
            differing field named) or a checkpoint past ``steps``.
        TypeError: ``task`` is not a ``str``, or ``lora`` neither a ``LoraSpec`` nor a dict.
        ImportError: ``lora`` is set and peft is not installed.
        Terminated: SIGTERM: the seed training (each seed training in a worker, with ``n_jobs > 1``: the
            parent forwards the signal and waits) finished its step and wrote a checkpoint; no further seed
            started (:class:`~grpo_lab.training.trainer.Terminated`, its ``others`` the further seeds stopped).
    """
    algo = get_algorithm(algo) if isinstance(algo, str) else algo
    seeds = _check_seeds(seeds)
    prof = _resolve(profile, config_overrides)
    if base is not None:
        if not isinstance(base, (str, os.PathLike)) or not str(base).strip():
            raise ValueError(f"run: base must be a checkpoint name, a directory or a hub id, got {base!r}")
        prof = replace(prof, base=str(base))
    if lora is not None:
        prof = replace(prof, lora=lora)
    if prof.lora is not None:
        require_peft(f"run(lora=...) (profile {prof.name!r}: LoRA adapters {prof.lora.to_dict()})")
    if task is not None:
        from ..tasks import TASKS

        if not isinstance(task, str):
            raise TypeError(f"run: task must be the name (str) of a registered task, got {task!r}; {_task_fix(task)}")
        if task not in TASKS:
            raise ValueError(f"run: unknown task {task!r}; known tasks: {sorted(TASKS)}")
        prof = replace(prof, task=task, task_kwargs=prof.task_kwargs if task == prof.task else ())
    steps = _check_steps(prof.steps if steps is None else steps)
    prof = _lr_horizon(prof, steps)
    _check_outputs(prof, resume)
    algo.check_config(prof.config)  # before any worker starts: what the algorithm's functions need of the run
    if save_model and prof.config.output_dir is None:
        raise ValueError("run: save_model=True writes each seed's model under output_dir, which is None; pass "
                         "output_dir=... (a directory) or save_model=False")
    t0 = time.perf_counter()
    frames, hits, note = _run_jobs([(algo, s, prof) for s in seeds], steps, progress, n_jobs, cache, resume,
                                   save_model)
    wall = time.perf_counter() - t0
    _warn_no_signal(algo, prof, frames)
    _warn_shortfall(algo, prof, frames, steps)
    prov = provenance(algo, prof, steps, seeds, wall)
    prov["cached_seeds"] = [s for _, s in hits]
    prov["run_cache"] = note or "on"
    return RunResult(pd.concat(frames, ignore_index=True), prov)


def run_grid(algos: Sequence[Algorithm], *, profile: str | Profile = "cpu", seeds: Sequence[int] = (0, 1, 2),
             steps: int | None = None, n_jobs: int = 1, cache: bool = True,
             overrides: Mapping[str, Mapping[str, Any]] | None = None, resume: bool = False,
             progress: bool | None = False, **config_overrides) -> dict[str, RunResult]:
    """:func:`run` for several algorithms, all (algorithm, seed) pairs spread over ``n_jobs`` processes.

    Args:
        overrides: per-setting :class:`~grpo_lab.training.trainer.TrainerConfig` fields, by algorithm name,
            applied on top of ``**config_overrides`` (e.g. ``{"mu=4": {"minibatches": 4}}``): settings
            that differ in the trainer rather than the algorithm share one pool of processes.
        progress: a tqdm bar per run (``None``: only in an interactive terminal); off by default.
        profile, seeds, steps, n_jobs, cache, resume, config_overrides: as :func:`run` (with an
            ``output_dir``, each algorithm's seeds write into ``output_dir/<algorithm name>/seed-<k>``).

    Returns:
        ``{algo.name: RunResult}`` in the order given (each ``provenance`` records the wall time
        of the whole grid, its own configuration, and ``cached_seeds``, the seeds of that
        algorithm loaded from the run cache).

    Raises:
        ValueError: duplicate algorithm names, no algorithms or seeds, an ``overrides`` name that
            is not one of the algorithms, or as :func:`run` (resuming included).
    """
    algos = [get_algorithm(a) if isinstance(a, str) else a for a in algos]
    names = [a.name for a in algos]
    if not algos or not seeds:
        raise ValueError("run_grid: need at least one algorithm and one seed")
    if len(set(names)) != len(names):
        raise ValueError(f"run_grid: algorithm names must be unique, got {names}")
    seeds = _check_seeds(seeds)
    overrides = dict(overrides or {})
    stray = sorted(set(overrides) - set(names))
    if stray:
        raise ValueError(f"run_grid: overrides for {stray}, which are not among the algorithms {names}")
    profs = {a.name: _resolve(profile, {**config_overrides, **dict(overrides.get(a.name, {}))}) for a in algos}
    default = _resolve(profile, config_overrides)
    steps = _check_steps(default.steps if steps is None else steps)
    profs = {name: _lr_horizon(p, steps) for name, p in profs.items()}
    for p in profs.values():
        _check_outputs(p, resume, "run_grid")
    t0 = time.perf_counter()
    frames, hits, note = _run_jobs([(a, s, profs[a.name]) for a in algos for s in seeds], steps, progress, n_jobs,
                                   cache, resume)
    wall = time.perf_counter() - t0
    out, k = {}, 0
    for a in algos:
        _warn_no_signal(a, profs[a.name], frames[k:k + len(seeds)])
        _warn_shortfall(a, profs[a.name], frames[k:k + len(seeds)], steps)
        prov = provenance(a, profs[a.name], steps, seeds, wall)
        prov["cached_seeds"] = [s for name, s in hits if name == a.name]
        prov["run_cache"] = note or "on"
        out[a.name] = RunResult(pd.concat(frames[k:k + len(seeds)], ignore_index=True), prov)
        k += len(seeds)
    return out
