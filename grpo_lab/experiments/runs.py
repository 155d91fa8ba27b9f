"""Runs: one algorithm (:func:`~grpo_lab.experiments.run`) or several
(:func:`~grpo_lab.experiments.run_grid`) trained from a profile's base checkpoint for several
seeds, from the run cache where possible, in this process or in the worker pool. Documented under
:mod:`grpo_lab.experiments`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import torch

from ..algorithms import Algorithm, get_algorithm
from ..lora import require_peft
from ..models import load_policy
from ..paths import checkpoint_dir
from ..tasks import get_task
from ..trainer import Trainer, TrainerConfig
from ..validation import is_int
from .profiles import PROFILES, Profile, _task_fix, get_profile
from .results import RunResult, provenance
from .run_cache import _cache_load, _cache_path, _cache_store, _run_key, _uncacheable, run_cache_dir, run_fingerprint
from .workers import _FRESH_REGISTRIES, _import_user_module, _module_roots, _user_modules, _worker_pool, shutdown_workers

__all__ = ["run", "run_grid"]


def _resolve(profile: str | Profile, config_overrides: dict) -> Profile:
    """The profile ``profile`` (a name or a :class:`Profile`) with ``config_overrides`` applied.

    Raises:
        TypeError: ``profile`` is neither a name nor a :class:`Profile`.
        ValueError: an unknown profile name, a ``seed`` override, an unknown
            :class:`~grpo_lab.trainer.TrainerConfig` field, or a CUDA device (from the overrides or
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
               modules: Sequence[str | tuple[str, str | None]] = ()) -> pd.DataFrame:
    """One seed of one algorithm from the profile's base checkpoint (a process-pool task); the
    history is stored at ``cache_path`` when given. ``modules`` (:func:`_user_modules`, as names or
    as the ``(name, root)`` pairs of :func:`_module_roots`) are imported first, so that a worker
    registers the user's choices and task as the caller did."""
    for module in modules:
        _import_user_module(module)
    try:  # validate again here: a spawned worker has only the registry entries its imports made
        algo = algo.replace()
    except ValueError as exc:
        raise ValueError(f"{exc}. {_FRESH_REGISTRIES}") from None
    base = checkpoint_dir(prof.base) if checkpoint_dir(prof.base).exists() else prof.base
    # float32 weights whatever the checkpoint's dtype (hub models ship bfloat16): the trainer keeps
    # float32 master weights and runs the forward passes in TrainerConfig.precision
    try:
        policy, tokenizer = load_policy(base, device=prof.config.device, dtype=torch.float32)
    except OSError as exc:  # a hub id offline and not cached, a gated or misspelled repository
        raise _unloadable(prof, exc) from exc
    if prof.lora is not None:  # the adapters, initialised with the run's seed (the base is the same for every seed)
        policy = prof.lora.apply(policy, seed=int(seed))
    from ..tasks import TASKS

    if prof.task not in TASKS:
        raise ValueError(f"run: task {prof.task!r} is not registered in this process; known tasks: "
                         f"{sorted(TASKS)}. {_FRESH_REGISTRIES}")
    task = get_task(prof.task, **dict(prof.task_kwargs))
    cfg = replace(prof.config, seed=int(seed), progress=progress)
    trainer = Trainer(policy, tokenizer, task, algo, cfg)
    key = _base_eval_key(base, prof, cfg)
    if key in _BASE_EVALS:  # this process already evaluated this base policy: the same numbers, bit for bit
        trainer.rows.append(dict(_BASE_EVALS[key]))
    trainer.train(steps)
    if key is not None and key not in _BASE_EVALS and trainer.rows and trainer.rows[0].get("step") == 0:
        _BASE_EVALS[key] = dict(trainer.rows[0])
    _cache_store(cache_path, trainer.rows)
    return pd.DataFrame(trainer.rows)


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


def _label(h: pd.DataFrame, algo: Algorithm, seed: int) -> pd.DataFrame:
    h.insert(0, "seed", int(seed))
    h.insert(0, "algo", algo.name)
    return h


def _map(jobs: list[tuple], n_jobs: int) -> list[pd.DataFrame]:
    """Run ``_train_one(*job)`` for every job, in ``n_jobs`` worker processes when ``n_jobs > 1``.

    Each run is independent and seeded, and uses the profile's thread count, so results do not
    depend on ``n_jobs``; processes are started with "spawn" (safe with torch and in notebooks)
    and kept for the next call (:func:`_worker_pool`, :func:`shutdown_workers`).
    """
    if n_jobs < 1:
        raise ValueError(f"n_jobs must be >= 1, got {n_jobs}")
    if n_jobs == 1 or len(jobs) <= 1:
        return [_train_one(*job) for job in jobs]
    pool = _worker_pool(n_jobs)
    futures = [pool.submit(_train_one, *job) for job in jobs]
    try:
        return [f.result() for f in futures]
    except BaseException:
        shutdown_workers(now=True)  # a failed or interrupted call leaves no worker busy with its other jobs
        raise


def _run_jobs(jobs: list[tuple[Algorithm, int, Profile]], steps: int, progress: bool | None, n_jobs: int,
              cache: bool) -> tuple[list[pd.DataFrame], list[tuple[str, int]], str | None]:
    """Histories of every ``(algo, seed, profile)`` job, in order, each configuration trained once
    (two names for the same configuration share one run), from the run cache where possible.

    Returns:
        ``(frames, hits, note)``: the histories, the pairs loaded from the cache, and why the cache
        was not used (``None`` when it was).
    """
    if n_jobs < 1:
        raise ValueError(f"n_jobs must be >= 1, got {n_jobs}")
    root, note = (run_cache_dir(), None) if cache else (None, "off (cache=False)")
    if cache and root is None:
        note = "off (GRPO_LAB_RUN_CACHE, or not a source checkout)"
    outside = sorted({x for a, _, p in jobs for x in _uncacheable(a, p)})
    if root is not None and outside:
        root, note = None, "off: code outside grpo_lab, " + ", ".join(outside)
    prints: dict[str, str] = {}  # one fingerprint per distinct profile (base checkpoint, threads, device)
    if root is not None:
        try:
            for _, _, p in jobs:
                prints.setdefault(repr(p), run_fingerprint(p))
            root.mkdir(parents=True, exist_ok=True)
        except (ValueError, OSError) as exc:
            root, note = None, f"off: {exc}"
    fps = [prints.get(repr(p), "") for _, _, p in jobs]
    keys = [_run_key(fp, a, p, steps, s) for fp, (a, s, p) in zip(fps, jobs)]
    paths = {k: (_cache_path(root, fp, a, p, steps, s) if root is not None else None)
             for k, fp, (a, s, p) in zip(keys, fps, jobs)}
    loaded = {k: _cache_load(path, steps) for k, path in paths.items()}
    hits = [(a.name, s) for (a, s, _), k in zip(jobs, keys) if loaded[k] is not None]
    todo = [k for k in dict.fromkeys(keys) if loaded[k] is None]
    first = {k: jobs[keys.index(k)] for k in todo}
    fresh = _map([(first[k][0], first[k][2], steps, first[k][1], progress, paths[k],
                   _module_roots(_user_modules(first[k][0], first[k][2]))) for k in todo], n_jobs)
    loaded.update(zip(todo, fresh))
    frames = [_label(loaded[k].copy(), a, s) for (a, s, _), k in zip(jobs, keys)]
    return frames, hits, note


def run(algo: Algorithm | str, *, profile: str | Profile = "cpu", seeds: Sequence[int] = (0, 1, 2),
        steps: int | None = None, progress: bool | None = None, n_jobs: int = 1, cache: bool = True,
        base: str | os.PathLike | None = None, task: str | None = None, lora=None, **config_overrides) -> RunResult:
    """Train ``algo`` from the profile's base checkpoint once per seed.

    Every seed starts from the same base weights; the seed fixes prompt sampling, generation
    and minibatch order. Seeds run one after the other, or in ``n_jobs`` processes.

    Args:
        algo: an :class:`~grpo_lab.algorithms.Algorithm` or a preset name (``"GRPO"``).
        profile: ``"cpu"`` / ``"gpu"`` or a :class:`Profile`.
        seeds: at least one seed; the book always uses ≥ 3.
        steps: override the profile's step count.
        progress: tqdm bar per seed (default: only in an interactive terminal).
        n_jobs: worker processes (results are identical for any value).
        cache: load runs already made from the run cache and store new ones (see the module
            docstring; ``GRPO_LAB_RUN_CACHE=off`` turns it off everywhere).
        base: train from this checkpoint instead of the profile's ``base``: a checkpoint name
            under ``data/checkpoints`` (``"arithmetic-moe-base"``), a local directory or a hub id,
            as :func:`~grpo_lab.models.load_policy` takes. Recorded in the provenance.
        task: a key of :data:`grpo_lab.tasks.TASKS` (a name, not a task object) instead of the
            profile's ``task``; the profile's ``task_kwargs`` are kept only when it names the
            profile's own task.
        lora: train LoRA adapters (:class:`grpo_lab.lora.LoraSpec` or a dict such as ``dict(r=8,
            alpha=16, target_modules=("q_proj", "v_proj"))``) instead of the profile's
            :attr:`~grpo_lab.experiments.Profile.lora`; ``None`` keeps the profile's. Needs peft.
            Recorded in the provenance and the run cache's key.
        **config_overrides: fields of :class:`~grpo_lab.trainer.TrainerConfig` to override
            (e.g. ``minibatches=4``). A decaying ``lr_schedule`` (``"linear"``, ``"cosine"``) without
            ``lr_schedule_steps`` spans the run's ``steps``.

    Returns:
        RunResult.

    Raises:
        ValueError: no seeds, unknown profile/algorithm/task, an empty ``base``, an invalid
            override, ``n_jobs < 1``, a CUDA device without CUDA.
        TypeError: ``task`` is not a ``str`` (a task object: the message says how to name it).
            Or ``lora`` is neither a ``LoraSpec`` nor a dict (a bad value in it: ``ValueError``).
        ImportError: ``lora`` is set and peft is not installed.
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
    t0 = time.perf_counter()
    frames, hits, note = _run_jobs([(algo, s, prof) for s in seeds], steps, progress, n_jobs, cache)
    wall = time.perf_counter() - t0
    prov = provenance(algo, prof, steps, seeds, wall)
    prov["cached_seeds"] = [s for _, s in hits]
    prov["run_cache"] = note or "on"
    return RunResult(pd.concat(frames, ignore_index=True), prov)


def run_grid(algos: Sequence[Algorithm], *, profile: str | Profile = "cpu", seeds: Sequence[int] = (0, 1, 2),
             steps: int | None = None, n_jobs: int = 1, cache: bool = True,
             overrides: Mapping[str, Mapping[str, Any]] | None = None,
             **config_overrides) -> dict[str, RunResult]:
    """:func:`run` for several algorithms, all (algorithm, seed) pairs spread over ``n_jobs`` processes.

    Args:
        overrides: per-setting :class:`~grpo_lab.trainer.TrainerConfig` fields, by algorithm name,
            applied on top of ``**config_overrides`` (e.g. ``{"mu=4": {"minibatches": 4}}``): settings
            that differ in the trainer rather than the algorithm share one pool of processes.
        profile, seeds, steps, n_jobs, cache, config_overrides: as :func:`run`.

    Returns:
        ``{algo.name: RunResult}`` in the order given (each ``provenance`` records the wall time
        of the whole grid, its own configuration, and ``cached_seeds``, the seeds of that
        algorithm loaded from the run cache).

    Raises:
        ValueError: duplicate algorithm names, no algorithms or seeds, an ``overrides`` name that
            is not one of the algorithms, or as :func:`run`.
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
    t0 = time.perf_counter()
    frames, hits, note = _run_jobs([(a, s, profs[a.name]) for a in algos for s in seeds], steps, False, n_jobs,
                                   cache)
    wall = time.perf_counter() - t0
    out, k = {}, 0
    for a in algos:
        prov = provenance(a, profs[a.name], steps, seeds, wall)
        prov["cached_seeds"] = [s for name, s in hits if name == a.name]
        prov["run_cache"] = note or "on"
        out[a.name] = RunResult(pd.concat(frames[k:k + len(seeds)], ignore_index=True), prov)
        k += len(seeds)
    return out
