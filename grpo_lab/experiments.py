"""Profiles, multi-seed runs and results files with provenance.

A *profile* fixes everything about an experiment's scale: ``cpu`` is what the book executes in
CI on two cores (minutes, the tiny arithmetic policy); ``gpu`` (:func:`gpu_profile`) trains the hub
instruct model :data:`GPU_MODEL` on GSM8K on one CUDA GPU, in bfloat16 or float16 autocast. A
chapter's GSM8K comparison goes through :func:`run_chapter_gpu`, which writes
``data/results/gpu/<chapter>.json``; :func:`load_chapter_gpu`, :func:`summarize_runs` and
:func:`check_gpu_results` read it back. Chapters call :func:`run`, which trains one algorithm from a base checkpoint for
several seeds and returns a long DataFrame (one row per seed × step) plus a provenance record;
:func:`save_results` / :func:`load_results` write and read ``data/results/<profile>/*.json``.

    python -m grpo_lab.experiments GRPO --profile gpu --seeds 0 1 2 3 4 --out runs/grpo_gpu.json

Run cache: every (algorithm, profile, steps, seed) run is stored under ``_build/run_cache/`` and
loaded instead of trained again when an identical run is asked for (chapter 3 re-uses chapter 1's
GRPO seeds); one configuration asked for under two names is trained once. The key covers the
algorithm (not its display name), the profile and its trainer configuration, the step count and
seed, and a fingerprint of everything else the numbers depend on (:func:`run_fingerprint`): the
source of every file of the package, the base checkpoint's files, the task files under
``data/tasks``, the library versions, the processor and the thread count. Any code change therefore
invalidates it, and ``make book`` from a clean tree trains every run once. A run whose algorithm
or task uses code from outside the package (a registered choice, a monkeypatched entry) is never
cached, since that code is not in the fingerprint; neither is a run from a hub checkpoint.
``GRPO_LAB_RUN_CACHE`` moves the cache (a directory) or turns it off (``off``); installed outside
a source checkout, the package caches only when it is set. ``provenance["run_cache"]`` says whether
the cache was used, ``provenance["cached_seeds"]`` which seeds it supplied.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import time
import warnings
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from . import __version__
from .algorithms import Algorithm, get_algorithm
from .models import VALUE_INITS, load_policy
from .paths import REPO_ROOT, checkpoint_dir, data_dir
from .tasks import get_task
from .trainer import Trainer, TrainerConfig, _json_default
from .validation import is_int, positive_int

__all__ = ["Profile", "PROFILES", "GPU_MODEL", "GPU_GSM8K_SOURCE", "GPU_TEST_SIZE", "gpu_profile", "GPU_SPEEDS",
           "expected_gpu_minutes", "results_dir", "run_chapter_gpu", "load_chapter_gpu", "summarize_runs", "check_gpu_results",
           "RPT_GPU_TEST_SIZE", "rpt_data_dir", "rpt_gpu_profile", "chapter_gpu_profile", "rl_compute_units", "run_rpt_gpu",
           "get_profile", "run", "run_grid", "RunResult", "save_results", "load_results",
           "shutdown_workers", "map_workers", "provenance", "config_hash", "run_cache_dir", "run_fingerprint", "processor_name"]


@dataclass(frozen=True)
class Profile:
    """The scale of an experiment.

    Attributes:
        name: ``"cpu"`` or ``"gpu"`` (any label for a profile of your own).
        base: checkpoint name under ``data/checkpoints`` (or a hub id / path).
        task: the *name* of a registered task (a key of :data:`grpo_lab.tasks.TASKS`, e.g.
            ``"arithmetic"``), not a task object: every run builds its own task with
            ``get_task(task, **dict(task_kwargs))``, in worker processes too. A task class of
            your own is registered first (``register_task("sortletters", SortTask)``) and named
            here (``task="sortletters"``).
        steps: RL steps per seed.
        config: the :class:`~grpo_lab.trainer.TrainerConfig`.
        task_kwargs: the task's keyword arguments, as a dict (``{"max_len": 4}``) or as
            ``(key, value)`` pairs (``(("max_len", 4),)``); stored as a tuple of pairs sorted by
            key, so that equal arguments give equal (and equally hashed) profiles.

    Raises:
        TypeError: ``task`` is not a ``str`` (e.g. a task instance: the message says how to name
            it instead), or ``task_kwargs`` is neither a mapping nor ``(key, value)`` pairs with
            ``str`` keys.
        ValueError: ``task`` is empty, or a key repeats in ``task_kwargs``.
    """

    name: str
    base: str
    task: str
    steps: int
    config: TrainerConfig
    task_kwargs: tuple = ()

    def __post_init__(self):
        if not isinstance(self.task, str):
            raise TypeError(f"Profile: task must be the name (str) of a registered task, got {self.task!r}; "
                            f"{_task_fix(self.task)}")
        if not self.task.strip():
            raise ValueError("Profile: task must be the name of a registered task, got an empty string")
        object.__setattr__(self, "task_kwargs", _task_kwargs(self.task_kwargs))


def _task_fix(task: Any) -> str:
    """How to pass the task object ``task`` to :class:`Profile` or :func:`run` instead: register its
    class and give its name, its arguments (the dataclass fields that differ from their defaults) in
    ``task_kwargs``."""
    import dataclasses

    name = getattr(task, "name", None)
    name = name if isinstance(name, str) and name else "mytask"
    cls = task.__name__ if isinstance(task, type) else type(task).__name__
    kwargs = "{...}"
    if dataclasses.is_dataclass(task) and not isinstance(task, type):
        changed = {}
        for f in dataclasses.fields(task):
            if f.name == "name" or not f.init:
                continue
            value = getattr(task, f.name)
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            if default is dataclasses.MISSING or value != default:
                changed[f.name] = value
        kwargs = repr(changed)
    return (f"register the class (grpo_lab.tasks.register_task({name!r}, {cls})) and pass its name and arguments: "
            f"task={name!r}, task_kwargs={kwargs}")


def _task_kwargs(value: Any) -> tuple:
    """``Profile.task_kwargs`` as a tuple of ``(key, value)`` pairs sorted by key; from a mapping or pairs.

    Raises:
        TypeError: not a mapping or pairs, or a key that is not a ``str``. ValueError: a key repeats.
    """
    if isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        try:
            pairs = [tuple(kv) for kv in value]
        except TypeError:
            pairs = None
        if isinstance(value, (str, bytes)) or pairs is None or any(len(kv) != 2 for kv in pairs):
            raise TypeError(f"Profile: task_kwargs must be a dict such as {{'max_len': 4}} or (key, value) pairs "
                            f"such as (('max_len', 4),), got {value!r}")
    keys = [k for k, _ in pairs]
    bad = [k for k in keys if not isinstance(k, str)]
    if bad:
        raise TypeError(f"Profile: task_kwargs keys must be argument names (str), got {bad!r}")
    if len(set(keys)) != len(keys):
        twice = sorted(k for k in set(keys) if keys.count(k) > 1)
        raise ValueError(f"Profile: task_kwargs names an argument twice: {twice}")
    return tuple(sorted(pairs, key=lambda kv: kv[0]))


#: The experiment scales by name, ``"cpu"`` (what the book executes, minutes on two CPU cores) and
#: ``"gpu"`` (one GPU, larger batches and longer runs); :func:`get_profile` looks one up.
PROFILES = {
    # One thread per run, two runs at a time on two cores (the book's n_jobs=2): the tiny model gains
    # little from more threads, and a fixed count keeps the numbers identical on machines with more
    # cores. Micro-batches of 32 rows, cut in order of length (TrainerConfig.sort_by_length): the
    # same gradient as whole 64-row minibatches, with less padding.
    "cpu": Profile(
        name="cpu", base="arithmetic-base", task="arithmetic", steps=40,
        config=TrainerConfig(prompts_per_step=16, group_size=8, lr=3e-4, warmup=10, minibatches=2, epochs=1,
                             micro_batch_size=32, eval_every=5, threads=1, device="cpu"),
    ),
}

#: The hub instruct model the ``"gpu"`` profile trains: the one place it is named.
#: ``$GRPO_LAB_GPU_MODEL`` replaces it (a hub id, or a local directory in the hub layout) whenever
#: :func:`gpu_profile` is called without ``model``.
GPU_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"

#: Where the ``"gpu"`` profile reads GSM8K: ``"hub"`` (``openai/gsm8k`` through ``datasets``).
#: ``$GRPO_LAB_GSM8K_SOURCE`` replaces it (``"fixture"``, or a directory / .jsonl / .parquet file, as
#: :class:`grpo_lab.tasks.gsm8k.GSM8KTask` ``source`` takes).
GPU_GSM8K_SOURCE = "hub"

#: Test problems of the ``"gpu"`` profile (the first 500 of GSM8K's 1319-problem test split: a
#: binomial standard error of at most 0.022 per evaluation); a non-hub source uses its whole test split.
GPU_TEST_SIZE = 500


def gpu_profile(model: str | os.PathLike | None = None, *, source: str | os.PathLike | None = None,
                test_size: int | None = GPU_TEST_SIZE, steps: int = 60, environ: Mapping[str, str] | None = None,
                **config: Any) -> Profile:
    """The ``"gpu"`` profile: a hub instruct model trained on GSM8K on one CUDA GPU.

    The model is :data:`GPU_MODEL` (``$GRPO_LAB_GPU_MODEL`` if set), loaded in float32 and trained
    with ``precision="auto"`` (bfloat16 autocast on Ampere or newer, float16 with a gradient
    scaler on a T4 or V100: :func:`grpo_lab.trainer.resolve_precision`). The task is
    :class:`grpo_lab.tasks.gsm8k.GSM8KTask` with prompts in the model's own chat template
    (``tokenizer_name`` = the model) and a generation budget of 512 tokens. The scale is that of a
    small real GRPO run: 16 questions × G = 8 responses per step (128 completions), two
    minibatches per rollout (so the second update is off-policy and the clip can act), lr 1e-6
    (DeepSeekMath §4.2, DAPO §4.1) with 5 optimiser steps of warm-up, micro-batches of 4 rows
    (sized for a 16 GB T4 by arithmetic, not measured: about 10 GB of float32 weights, gradients,
    AdamW state and reference copy for 0.5B parameters, plus activations and a 151,936-token
    vocabulary's logits), 60
    steps, greedy test accuracy every 10 steps. :func:`expected_gpu_minutes` estimates its wall time.

    Args:
        model: a hub id or a local directory in the hub layout; ``None``: ``$GRPO_LAB_GPU_MODEL``
            or :data:`GPU_MODEL`. Also the tokenizer whose chat template formats the prompts.
        source: GSM8K's source; ``None``: ``$GRPO_LAB_GSM8K_SOURCE`` or :data:`GPU_GSM8K_SOURCE`.
        test_size: the first this many test problems (``None``: all); applies to the hub source
            only: any other source (the 8-problem fixture) is evaluated on its whole test split.
        steps: RL steps per seed.
        environ: where the ``$GRPO_LAB_GPU_*`` and ``$GRPO_LAB_GSM8K_SOURCE`` variables are read
            (default ``os.environ``; ``{}`` ignores them, as the import-time ``PROFILES["gpu"]`` does,
            so that a bad variable breaks only what builds the GPU profile: ``--profile gpu``, and the
            chapters' GPU cells, which build it on every profile to show the plan and its expected time).
        **config: :class:`~grpo_lab.trainer.TrainerConfig` fields that replace the defaults above
            (e.g. ``device="cpu"`` to run the same profile on CPU with a tiny stand-in model). The
            default ``device`` is ``$GRPO_LAB_GPU_DEVICE`` if set (``"cuda:1"``; ``"cpu"`` for a dry
            run of the GPU code path, which :func:`run_chapter_gpu` marks as one), else ``"cuda"``.
            ``$GRPO_LAB_GPU_CONFIG``, a JSON object of ``TrainerConfig`` fields (e.g.
            ``{"micro_batch_size": 2}`` for a GPU with less memory), is applied after the defaults
            and before these keyword arguments; it is parsed as JSON, never evaluated.

    Returns:
        A :class:`Profile` named ``"gpu"``.

    Raises:
        ValueError: an empty ``model`` or ``source``, an invalid ``TrainerConfig`` field, or a
            ``$GRPO_LAB_GPU_CONFIG`` that is not a JSON object of known fields.
    """
    env_ = os.environ if environ is None else environ
    model = str(model if model is not None else env_.get("GRPO_LAB_GPU_MODEL") or GPU_MODEL)
    source = str(source if source is not None else env_.get("GRPO_LAB_GSM8K_SOURCE") or GPU_GSM8K_SOURCE)
    if not model.strip() or not source.strip():
        raise ValueError(f"gpu_profile: model and source must be non-empty, got {model!r} and {source!r}")
    settings = dict(prompts_per_step=16, group_size=8, temperature=1.0, lr=1e-6, warmup=5, minibatches=2,
                    epochs=1, micro_batch_size=4, eval_every=10,
                    device=env_.get("GRPO_LAB_GPU_DEVICE") or "cuda", precision="auto")
    settings.update(config.pop("_defaults", {}))  # rpt_gpu_profile's own defaults, before the environment
    env = env_.get("GRPO_LAB_GPU_CONFIG")
    if env:
        try:
            extra = json.loads(env)
        except json.JSONDecodeError as exc:
            raise ValueError(f"gpu_profile: $GRPO_LAB_GPU_CONFIG is not JSON ({exc}): {env!r}") from None
        known = {f.name for f in fields(TrainerConfig)}
        if not isinstance(extra, dict) or set(extra) - known:
            raise ValueError(f"gpu_profile: $GRPO_LAB_GPU_CONFIG must be a JSON object of TrainerConfig fields, got "
                             f"{env!r}" + (f" (unknown: {sorted(set(extra) - known)})" if isinstance(extra, dict) else ""))
        settings.update(extra)
    settings.update(config)
    task_kwargs = {"source": source, "tokenizer_name": model, "max_new_tokens": 512,
                   "test_size": test_size if source == "hub" else None}
    given = {k: env_[k] for k in ("GRPO_LAB_GPU_DEVICE", "GRPO_LAB_GPU_CONFIG") if env_.get(k)}
    return Profile(name="gpu", base=model, task="gsm8k", steps=steps, config=_gpu_config(settings, given),
                   task_kwargs=task_kwargs)


def _gpu_config(settings: dict, given: Mapping[str, str]) -> TrainerConfig:
    """``TrainerConfig(**settings)``; a ValueError names the environment variables among ``given``
    (``$GRPO_LAB_GPU_DEVICE``, ``$GRPO_LAB_GPU_CONFIG``) that were set, since a bad value may come
    from there."""
    try:
        return TrainerConfig(**settings)
    except (TypeError, ValueError) as exc:
        if given:
            where = ", ".join(f"${k}={v!r}" for k, v in given.items())
            raise ValueError(f"gpu_profile: {exc} (the settings include {where})") from None
        raise


PROFILES["gpu"] = gpu_profile(environ={})  # the defaults; get_profile("gpu") applies the environment


#: Held-out positions of chapter 7's hub-model run (:func:`rpt_gpu_profile`): a binomial standard
#: error of at most 0.022 per evaluation, as :data:`GPU_TEST_SIZE` for GSM8K.
RPT_GPU_TEST_SIZE = 500


def rpt_data_dir(model: str | os.PathLike) -> Path:
    """Where :func:`run_rpt_gpu` keeps the next-token task's data files for ``model`` (built by
    :func:`grpo_lab.tasks.next_token.build_hub_task_data`): ``$GRPO_LAB_RPT_DATA`` if set, else
    ``<results_dir()>/next_token/<model as a file name>`` (so the data travels with the results
    that were measured on it)."""
    env = os.environ.get("GRPO_LAB_RPT_DATA")
    if env:
        return Path(env).expanduser()
    local = Path(model).expanduser()
    name = str(local.resolve()) if local.exists() else str(model)  # ./m, m/ and /abs/m: one directory
    slug = re.sub(r"[^A-Za-z0-9._-]+", "--", name.strip("/\\")).lstrip(".-") or "model"
    return results_dir() / "next_token" / slug[-100:]


def _same_model(a, b) -> bool:
    """Whether two model names (hub ids or local directories) name the same model: equal, or paths
    to the same existing directory (``m/``, ``./m`` and the absolute path)."""
    if a is None or b is None:
        return False
    if str(a) == str(b):
        return True
    pa, pb = Path(str(a)).expanduser(), Path(str(b)).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def rpt_gpu_profile(model: str | os.PathLike | None = None, *, data: str | os.PathLike | None = None,
                    steps: int = 60, environ: Mapping[str, str] | None = None, **config: Any) -> Profile:
    """Chapter 7's ``"gpu"`` profile: RPT's next-token reasoning with a hub instruct model.

    The model, device, precision and ``$GRPO_LAB_GPU_*`` variables are those of :func:`gpu_profile`
    (one place names the model); the task is :class:`grpo_lab.tasks.NextTokenTask` on the model's
    own tokenizer, in its chat template (``chat=True``), reading the data files of ``data``
    (default :func:`rpt_data_dir`), with a 256-token budget for the thinking span and the
    prediction, and the positions of proxy entropy >= 0.5 nats (the ``easy`` threshold, as the
    chapter's CPU run). The trainer settings are RPT's where the paper gives them
    (:data:`grpo_lab.algorithms.RPT_SAMPLING`: G = 8 at temperature 0.8; lr 1e-6) at the GPU
    profile's scale: 16 positions × 8 per step, one update per rollout, greedy and sampled test
    accuracy every 10 steps on :data:`RPT_GPU_TEST_SIZE` positions.

    Args:
        model, environ: as :func:`gpu_profile`.
        data: the data directory (``None``: :func:`rpt_data_dir` of the model).
        steps: RL steps per seed.
        **config: :class:`~grpo_lab.trainer.TrainerConfig` fields that replace these defaults
            (``$GRPO_LAB_GPU_CONFIG`` replaces them too, and these replace it, as in :func:`gpu_profile`).

    Returns:
        A :class:`Profile` named ``"gpu"`` with ``task="next_token"``.

    Raises:
        ValueError: as :func:`gpu_profile`.
    """
    from .algorithms import RPT_SAMPLING

    defaults = dict(RPT_SAMPLING, prompts_per_step=16, lr=1e-6, warmup=5, minibatches=1, epochs=1, eval_every=10,
                    eval_sampled=True)
    prof = gpu_profile(model, steps=steps, environ=environ, _defaults=defaults, **config)
    task_kwargs = {"tokenizer": prof.base, "data": str(data if data is not None else rpt_data_dir(prof.base)),
                   "chat": True, "max_new_tokens": 256, "min_entropy": 0.5}
    return replace(prof, task="next_token", task_kwargs=task_kwargs)


def chapter_gpu_profile(chapter: str) -> Profile:
    """The ``"gpu"`` profile a chapter's hub-model cell trains: :func:`rpt_gpu_profile` for
    ``"07_rpt"``, :func:`gpu_profile` (GSM8K) for the others."""
    return rpt_gpu_profile() if chapter == "07_rpt" else gpu_profile()


def get_profile(name: str) -> Profile:
    """The profile called ``name``; ``"gpu"`` is built afresh by :func:`gpu_profile` (so that
    ``$GRPO_LAB_GPU_MODEL`` and ``$GRPO_LAB_GSM8K_SOURCE`` set after import count).

    Raises:
        ValueError: unknown profile.
    """
    if name == "gpu":
        return gpu_profile()
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {sorted(PROFILES)}") from None


@dataclass
class RunResult:
    """What :func:`run` returns.

    Attributes:
        history: long DataFrame, one row per (seed, step), with ``algo`` and ``seed`` columns
            and every column of :meth:`grpo_lab.trainer.Trainer.train`.
        provenance: dict (see :func:`provenance`).
    """

    history: pd.DataFrame
    provenance: dict

    def final(self, column: str = "test_accuracy") -> pd.Series:
        """Per-seed value of ``column`` at the last step where it was measured."""
        h = self.history.dropna(subset=[column])
        return h.sort_values("step").groupby("seed")[column].last()

    def base(self, column: str = "test_accuracy") -> pd.Series:
        """Per-seed value of ``column`` at step 0 (the base policy)."""
        h = self.history[self.history["step"] == 0]
        return h.set_index("seed")[column]


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except Exception:
        return None


def config_hash(algo: Algorithm, profile: Profile, steps: int) -> str:
    """sha256 (first 12 hex) of the algorithm, profile and step count — identifies a results file."""
    payload = {"algo": asdict(algo), "profile": profile.name, "base": profile.base, "task": profile.task,
               "task_kwargs": dict(profile.task_kwargs), "config": profile.config.to_dict(), "steps": steps}
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def provenance(algo: Algorithm, profile: Profile, steps: int, seeds: Sequence[int], wall_seconds: float) -> dict:
    """Where a result comes from: code version, software, device, configuration and timing."""
    import transformers

    device = profile.config.device
    on_gpu = device.startswith("cuda") and torch.cuda.is_available()
    dev_name = torch.cuda.get_device_name(torch.device(device)) if on_gpu else processor_name()
    return {
        "git_sha": _git_sha(), "grpo_lab": __version__, "torch": torch.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(),
        "device": device, "device_name": dev_name, "threads": torch.get_num_threads(),
        "algo": asdict(algo), "profile": profile.name, "base": profile.base, "task": profile.task,
        "config": profile.config.to_dict(), "steps": steps, "seeds": list(seeds),
        "config_hash": config_hash(algo, profile, steps), "wall_seconds": round(wall_seconds, 1),
        "date": time.strftime("%Y-%m-%d"),
    }


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


_CACHE_OFF = ("", "0", "off", "false", "no", "none", "disabled")


def run_cache_dir() -> Path | None:
    """Where :func:`run` stores finished runs, or ``None`` (no cache).

    ``$GRPO_LAB_RUN_CACHE``: ``off`` (or ``0``, ``false``, ``no``, ``none``, ``disabled``, empty)
    turns the cache off; ``on`` (or ``1``, ``true``, ``yes``) is the default location; anything
    else is a directory (``~`` expanded, relative to the current directory). Unset: the default,
    ``<repo>/_build/run_cache`` when the package runs from a source checkout (next to its
    ``pyproject.toml``), no cache when it is installed elsewhere (e.g. ``site-packages``).
    """
    env = os.environ.get("GRPO_LAB_RUN_CACHE")
    value = "on" if env is None else env.strip()
    if value.lower() in _CACHE_OFF:
        return None
    if value.lower() in ("on", "1", "true", "yes"):
        return REPO_ROOT / "_build" / "run_cache" if (REPO_ROOT / "pyproject.toml").is_file() else None
    return Path(value).expanduser().resolve()


def _hash_files(h, root: Path, pattern: str) -> None:
    for f in sorted(root.rglob(pattern)):
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())


def processor_name() -> str:
    """The CPU model (``/proc/cpuinfo``'s ``model name`` on Linux, where ``platform.processor()`` is empty)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_fingerprint(prof: Profile) -> str:
    """sha256 (first 16 hex) of what a run's numbers depend on besides its configuration.

    Covers every file of the ``grpo_lab`` package, the base checkpoint's files, ``data/tasks/*``,
    the files of a saved critic named by ``TrainerConfig.value_init``,
    the versions of python, torch, transformers, tokenizers and numpy, the processor model and
    torch's CPU capability, the thread count the run will use (``TrainerConfig.threads``, else
    torch's current setting) and the environment variables that change CPU kernels or thread
    counts (``MKL_CBWR``, ``MKL_ENABLE_INSTRUCTIONS``, ``ATEN_CPU_CAPABILITY``, ``OMP_NUM_THREADS``,
    ``MKL_NUM_THREADS``); on CUDA also the GPU model, the CUDA and cuDNN versions and the TF32 /
    float32-matmul-precision settings. Code outside the package (a registered choice, a task) is
    not covered: :func:`run` does not cache such runs (see ``_uncacheable``).

    Raises:
        ValueError: ``prof.base`` is not a local checkpoint (a hub id: its weights cannot be
            fingerprinted offline).
    """
    import numpy
    import tokenizers
    import transformers

    h = hashlib.sha256()
    _hash_files(h, Path(__file__).resolve().parent, "*.py")
    base = checkpoint_dir(prof.base) if checkpoint_dir(prof.base).exists() else Path(prof.base)
    if not base.is_dir():
        raise ValueError(f"run_fingerprint: base {prof.base!r} is not a local checkpoint directory")
    _hash_files(h, base, "*")
    if (data_dir() / "tasks").is_dir():
        _hash_files(h, data_dir() / "tasks", "*")
    critic = Path(prof.config.value_init)
    if prof.config.value_init not in VALUE_INITS and critic.is_dir():  # a saved critic: its weights, not its path
        _hash_files(h, critic, "*")
    env = {k: os.environ.get(k) for k in ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY",
                                          "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    machine = [processor_name(), platform.machine(), torch.backends.cpu.get_cpu_capability(),
               prof.config.threads or torch.get_num_threads()]
    if torch.device(prof.config.device).type == "cuda" and torch.cuda.is_available():
        machine += [torch.cuda.get_device_name(0), torch.version.cuda, torch.backends.cudnn.version(),
                    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                    torch.get_float32_matmul_precision()]
    h.update(json.dumps([platform.python_version(), torch.__version__, transformers.__version__,
                         tokenizers.__version__, numpy.__version__, machine, env], default=str).encode())
    return h.hexdigest()[:16]


def _uncacheable(algo: Algorithm, prof: Profile) -> list[str]:
    """The registry entries ``algo`` calls (:meth:`~grpo_lab.algorithms.Algorithm.functions`) and the
    task class of ``prof`` whose code lives outside ``grpo_lab`` (a function registered by a user, a
    monkeypatched entry): the run-cache fingerprint hashes only the package's files, so runs that
    use them are never cached."""
    from .tasks import TASKS

    used = {**algo.functions(), f"TASKS[{prof.task!r}]": TASKS.get(prof.task)}
    outside = []
    for name, fn in used.items():
        module = getattr(fn, "__module__", None) or ""
        if not (module == "grpo_lab" or module.startswith("grpo_lab.")):
            outside.append(f"{name} from {module or '?'}")
    return outside


def _cache_path(cache: Path, fingerprint: str, algo: Algorithm, prof: Profile, steps: int, seed: int) -> Path:
    """The file of one run. The algorithm's ``name`` is a label, not part of the key: chapter 3's
    ``GRPO.replace(name="GRPO (beta=0.04)")`` is chapter 1's ``GRPO``."""
    return cache / f"run-s{seed}-{_run_key(fingerprint, algo, prof, steps, seed)}.json"


def _run_key(fingerprint: str, algo: Algorithm, prof: Profile, steps: int, seed: int) -> str:
    key = json.dumps({"fingerprint": fingerprint, "config_hash": config_hash(algo.replace(name="-"), prof, steps),
                      "seed": seed, "profile": prof.name}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:20]


def _cache_load(path: Path | None, steps: int) -> pd.DataFrame | None:
    """The history stored at ``path``; ``None`` (train) when absent, unreadable, or not the rows of
    a finished ``steps``-step run (every step 1..steps present, each row a dict with a ``step``)."""
    if path is None or not path.is_file():
        return None
    try:
        rows = json.loads(path.read_text())["rows"]
        if not isinstance(rows, list) or not all(isinstance(r, dict) and is_int(r.get("step")) for r in rows):
            return None
        if sorted(r["step"] for r in rows if r["step"] > 0) != list(range(1, steps + 1)):
            return None
        return pd.DataFrame(rows)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cache_store(path: Path | None, rows: list[dict]) -> None:
    """Write a run's rows atomically (python's json keeps every float bit for bit, NaN included).
    A failed write warns and loses only the cache entry, never the run."""
    if path is None:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"rows": rows}, default=_json_default))
        os.replace(tmp, path)
    except OSError as exc:
        warnings.warn(f"run cache: could not store the run at {path} ({exc}); the result is returned but not "
                      "cached (GRPO_LAB_RUN_CACHE=off silences this)", RuntimeWarning, stacklevel=2)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


_FRESH_REGISTRIES = ("Worker processes (n_jobs > 1) start with fresh registries: a choice or task registered in a "
                     "notebook cell or under `if __name__ == '__main__'` does not reach them. Register it at the top "
                     "level of a module (a .py file the notebook or script imports), or use n_jobs=1")


def _user_modules(algo: Algorithm, prof: Profile) -> tuple[str, ...]:
    """The importable modules outside ``grpo_lab`` that define the registry entries ``algo`` calls
    and the task class of ``prof`` (e.g. ``("reverse_task",)`` for a task registered by a module
    of the user's): a worker process imports them before it builds the run, which registers them
    there too. Code defined in ``__main__`` (a notebook cell, a script's main block) is left out."""
    from .tasks import TASKS

    owners = [*algo.functions().values(), TASKS.get(prof.task)]
    names = {getattr(f, "__module__", None) for f in owners if f is not None}
    return tuple(sorted(m for m in names if m and m not in ("__main__", "__mp_main__")
                        and not (m == "grpo_lab" or m.startswith("grpo_lab."))))


def _module_roots(modules: Sequence[str]) -> tuple[tuple[str, str | None], ...]:
    """``(name, root)`` for each module name: ``root`` the ``sys.path`` directory this process imported
    it from (the directory of ``reverse_task.py`` for ``reverse_task``, the parent of ``pkg/`` for
    ``pkg.mod``), ``None`` when unknown (not imported, or no file). A worker puts ``root`` on its
    ``sys.path`` when it cannot import the name otherwise: a module the caller imported from a file
    path (``python -m grpo_lab --import path/to/my_task.py``) whose directory is not on the
    worker's path."""
    import sys

    out = []
    for name in modules:
        file = getattr(sys.modules.get(name), "__file__", None)
        root = None
        if file:
            path = Path(os.path.abspath(file))
            depth = name.count(".") + (1 if path.name == "__init__.py" else 0)
            root = str(path.parents[depth])
        out.append((name, root))
    return tuple(out)


def _import_user_module(module: str | tuple[str, str | None]) -> None:
    """Import ``module`` (a name, or ``(name, root)`` from :func:`_module_roots`): by name, and if
    that module itself is not found, once more with ``root`` put first on ``sys.path``.

    Raises:
        ValueError: the module cannot be imported (the message names it and says what to do).
    """
    import importlib
    import sys

    name, root = (module, None) if isinstance(module, str) else module
    try:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if root is None or root in sys.path or exc.name not in (name, name.split(".")[0]):
                raise
            sys.path.insert(0, root)
            importlib.invalidate_caches()
            importlib.import_module(name)
    except ImportError as exc:
        raise ValueError(f"run: cannot import {name!r}, which defines the task or a choice of this run, in a "
                         f"worker process ({exc}). {_FRESH_REGISTRIES}") from None


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
    from .tasks import TASKS

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
    configuration without its seed and progress flag (the generation budget, the device and the
    dtypes are in it). Not shared: no evaluation (``eval_every=0``), sampled evaluation
    (``eval_sampled``: it depends on the seed's random numbers), or a base that is not a local
    directory (a hub id).
    """
    if not cfg.eval_every or cfg.eval_sampled or not Path(base).is_dir():
        return None
    root = Path(base).resolve()
    stamp = [(str(f.relative_to(root)), f.stat().st_size, f.stat().st_mtime_ns)
             for f in sorted(root.rglob("*")) if f.is_file()]
    return json.dumps([str(root), stamp, prof.task, [list(kv) for kv in prof.task_kwargs],
                       replace(cfg, seed=0, progress=None).to_dict()], sort_keys=True, default=str)


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


def map_workers(fn, items: Sequence[Any], n_jobs: int = 1) -> list[Any]:
    """``[fn(item) for item in items]``, in the worker processes that :func:`run` and
    :func:`run_grid` keep between calls when ``n_jobs > 1`` (no new interpreters to start when a
    grid has just run). For work that is not a trainer run, e.g. one seed of a baseline per item
    (chapter 7's continued-NTP runs, :func:`grpo_lab.pretrain.continued_ntp_run`).

    Args:
        fn: a picklable callable: a module-level function, or a ``functools.partial`` of one
            (workers are fresh ``spawn`` interpreters: a function defined in a notebook is not
            importable there).
        items: one argument per call.
        n_jobs: worker processes (``1``: in this process).

    Returns:
        The results, in the order of ``items``.

    Raises:
        ValueError: ``n_jobs < 1``.
        TypeError: with ``n_jobs > 1``, ``fn`` cannot be pickled (a lambda, a local function).
        Exception: whatever ``fn`` raises, after the workers are stopped.
    """
    if not isinstance(n_jobs, int) or isinstance(n_jobs, bool) or n_jobs < 1:
        raise ValueError(f"map_workers: n_jobs must be an int >= 1, got {n_jobs!r}")
    items = list(items)
    if n_jobs == 1 or len(items) <= 1:
        return [fn(item) for item in items]
    import pickle

    try:
        pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise TypeError(f"map_workers: fn cannot be sent to a worker process ({exc}); use a module-level function "
                        "or a functools.partial of one (a lambda or a function defined in a notebook is not "
                        "importable in a fresh interpreter), or n_jobs=1") from None
    pool = _worker_pool(n_jobs)
    futures = [pool.submit(fn, item) for item in items]
    try:
        return [f.result() for f in futures]
    except BaseException:
        shutdown_workers(now=True)
        raise


def _worker_init() -> None:
    """Worker processes ignore SIGINT: a Ctrl-C (or a Jupyter kernel's interrupt or shutdown, sent
    to the whole process group) reaches the caller, which stops the workers itself
    (:func:`shutdown_workers`), instead of every idle worker printing a traceback."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


_POOL: dict[str, Any] = {"executor": None, "key": None, "atexit": False}


def _pool_key(n_jobs: int) -> str:
    """What a reused worker must share with this process: the worker count, every registry's entries
    (workers start with the registries their imports make, so a choice registered here since the
    pool started must get fresh workers, which then fail with the clear message of
    :func:`_train_one` if it is not importable) and the package's source files (size and
    modification time: an edited package must not be run by workers that imported the old one)."""
    from . import advantages, objectives, sampling
    from .tasks import TASKS

    regs = {name: sorted((k, getattr(v, "__module__", "?"), getattr(v, "__qualname__", repr(v)))
                         for k, v in reg.items())
            for name, reg in (("advantages", advantages.ADVANTAGE_ESTIMATORS), ("ratios", objectives.RATIOS),
                              ("surrogates", objectives.SURROGATES), ("aggregations", objectives.AGGREGATIONS),
                              ("kl", objectives.KL_ESTIMATORS), ("selectors", sampling.SELECTORS), ("tasks", TASKS))}
    src = Path(__file__).resolve().parent
    files = [(str(f.relative_to(src)), f.stat().st_size, f.stat().st_mtime_ns)
             for f in sorted(src.rglob("*.py")) if "__pycache__" not in f.parts]
    return json.dumps([n_jobs, regs, files], sort_keys=True)


def _worker_pool(n_jobs: int):
    """The process pool of :func:`_map`, kept between calls: starting a worker (a fresh ``spawn``
    interpreter importing torch and transformers, then loading its first checkpoint) costs several
    seconds, once per worker instead of once per call. A pool is reused only while
    :func:`_pool_key` is unchanged; otherwise it is shut down and a new one started."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    key = _pool_key(n_jobs)
    pool = _POOL["executor"]
    if pool is not None and (_POOL["key"] != key or getattr(pool, "_broken", False)):
        shutdown_workers()
        pool = None
    if pool is None:
        pool = ProcessPoolExecutor(max_workers=n_jobs, mp_context=mp.get_context("spawn"), initializer=_worker_init)
        _POOL.update(executor=pool, key=key)
        if not _POOL.get("atexit"):  # stop the workers while the interpreter is still whole
            import atexit

            atexit.register(shutdown_workers)
            _POOL["atexit"] = True
    return pool


def shutdown_workers(now: bool = False) -> None:
    """Stop the worker processes that :func:`run` and :func:`run_grid` keep between calls with
    ``n_jobs > 1`` (they also stop when this interpreter exits). Frees their memory; the next
    parallel call starts new ones.

    Args:
        now: terminate the workers at once, abandoning the runs they are training (what a failed
            or interrupted call does); by default, wait for them to finish their current run.
    """
    pool, _POOL["executor"], _POOL["key"] = _POOL["executor"], None, None
    if pool is None:
        return
    if now:
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            if proc.is_alive():
                proc.terminate()
        for proc in processes:
            proc.join(timeout=10)
    else:
        pool.shutdown(wait=True, cancel_futures=True)


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
        base: str | os.PathLike | None = None, task: str | None = None, **config_overrides) -> RunResult:
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
        **config_overrides: fields of :class:`~grpo_lab.trainer.TrainerConfig` to override
            (e.g. ``minibatches=4``).

    Returns:
        RunResult.

    Raises:
        ValueError: no seeds, unknown profile/algorithm/task, an empty ``base``, an invalid
            override, ``n_jobs < 1``, a CUDA device without CUDA.
        TypeError: ``task`` is not a ``str`` (a task object: the message says how to name it).
    """
    algo = get_algorithm(algo) if isinstance(algo, str) else algo
    seeds = _check_seeds(seeds)
    prof = _resolve(profile, config_overrides)
    if base is not None:
        if not isinstance(base, (str, os.PathLike)) or not str(base).strip():
            raise ValueError(f"run: base must be a checkpoint name, a directory or a hub id, got {base!r}")
        prof = replace(prof, base=str(base))
    if task is not None:
        from .tasks import TASKS

        if not isinstance(task, str):
            raise TypeError(f"run: task must be the name (str) of a registered task, got {task!r}; {_task_fix(task)}")
        if task not in TASKS:
            raise ValueError(f"run: unknown task {task!r}; known tasks: {sorted(TASKS)}")
        prof = replace(prof, task=task, task_kwargs=prof.task_kwargs if task == prof.task else ())
    steps = _check_steps(prof.steps if steps is None else steps)
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


def save_results(result: RunResult, path: str | Path) -> Path:
    """Write ``{"provenance": …, "history": [rows]}`` as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(result.history.to_json(orient="records"))
    text = json.dumps({"provenance": result.provenance, "history": rows}, indent=1) + "\n"
    # written beside and renamed over: a process killed mid-write (the GPU runs rewrite their file after
    # every seed) leaves the previous file whole, never a truncated one
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_results(path: str | Path) -> RunResult:
    """Read a file written by :func:`save_results`.

    Raises:
        FileNotFoundError: no such file. ValueError: not a results file (not JSON, not UTF-8
            text, truncated, or JSON of another shape), the message naming the file.
    """
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"load_results: {path} is not a grpo_lab results file (not valid JSON: {exc}); a run "
                         "killed while writing it, or another file: delete it and rerun") from None
    if not isinstance(d, dict) or "provenance" not in d or "history" not in d:
        raise ValueError(f"load_results: {path} is not a grpo_lab results file")
    frame = pd.DataFrame(d["history"])
    for col in frame.columns:  # JSON has no NaN: all-missing numeric columns come back as None
        if col not in ("algo",) and frame[col].isna().all():
            frame[col] = frame[col].astype(float)
    return RunResult(frame, d["provenance"])


#: Assumed speeds of two GPU classes for the ``"gpu"`` profile's 0.5B-parameter model: the basis of
#: :func:`expected_gpu_minutes`. They are assumptions, not measurements (no GPU has run this profile
#: yet; ``scripts/gpu_check.sh`` prints the seconds per step it measures):
#:
#: * ``decode_step_s``: seconds per generated position of one batched ``transformers.generate`` call
#:   (batch of at most 256): at this model size a decoding step costs the kernel launches of 24
#:   layers more than arithmetic, so it hardly depends on the batch;
#: * ``train_tokens_per_s``: prompt + completion tokens per second through one forward and backward
#:   pass plus the two no-grad forwards (π_old, π_ref): about 10 N FLOPs per token at N = 0.5e9,
#:   at 20 TFLOP/s (T4, float16 tensor cores) and 300 TFLOP/s (H100, bfloat16, about 30% of peak).
GPU_SPEEDS = {
    "T4": {"decode_step_s": 0.045, "train_tokens_per_s": 4_000.0},
    "H100": {"decode_step_s": 0.020, "train_tokens_per_s": 60_000.0},
}


def expected_gpu_minutes(profile: Profile, runs: int, gpu: str, *, steps: int | None = None,
                         prompt_tokens: int = 150, completion_tokens: int = 250,
                         generation_factor: float = 1.0, train_factor: float = 1.0) -> float:
    """Estimated wall time, in minutes, of ``runs`` runs of ``profile`` one after the other on one
    GPU of class ``gpu``, from the assumed speeds of :data:`GPU_SPEEDS`.

    Per step: ``max_new_tokens`` decoding steps (a batch of 128 samples at temperature 1 usually
    has one that uses the whole budget) and ``prompts_per_step × G × (prompt_tokens +
    completion_tokens)`` training tokens; per evaluation (before the first step, every
    ``eval_every`` steps and after the last): ``ceil(test_size / 256)`` greedy batches of
    ``max_new_tokens`` steps, twice that with ``eval_sampled``. An estimate to plan a session with, good to a factor of about two.

    Args:
        profile: the profile (normally :func:`gpu_profile`).
        runs: runs (seeds × settings).
        gpu: a key of :data:`GPU_SPEEDS` (``"T4"``, ``"H100"``).
        steps: RL steps per run (default: the profile's).
        prompt_tokens, completion_tokens: assumed mean prompt and completion lengths in tokens
            (a chat-templated GSM8K question; a Qwen2.5-0.5B-Instruct solution).
        generation_factor: generation per step relative to one batch (DAPO's dynamic sampling
            generates about 1.3 batches per trained batch).
        train_factor: training compute relative to the policy's (a critic of the same size: 2).

    Raises:
        ValueError: an unknown ``gpu``, ``runs < 1`` or ``steps < 1``.
    """
    if gpu not in GPU_SPEEDS:
        raise ValueError(f"expected_gpu_minutes: unknown GPU class {gpu!r}; known: {sorted(GPU_SPEEDS)}")
    if not is_int(runs) or runs < 1:
        raise ValueError(f"expected_gpu_minutes: runs must be an int >= 1, got {runs!r}")
    if steps is not None and (not is_int(steps) or steps < 1):
        raise ValueError(f"expected_gpu_minutes: steps must be an int >= 1 or None, got {steps!r}")
    speed, c = GPU_SPEEDS[gpu], profile.config
    steps = profile.steps if steps is None else int(steps)
    budget = c.max_new_tokens or dict(profile.task_kwargs).get("max_new_tokens") or 512
    test_size = dict(profile.task_kwargs).get("test_size") or GPU_TEST_SIZE
    per_step = (generation_factor * budget * speed["decode_step_s"]
                + train_factor * c.prompts_per_step * c.group_size * (prompt_tokens + completion_tokens)
                / speed["train_tokens_per_s"])
    evals = (1 + steps // c.eval_every + (steps % c.eval_every != 0)) if c.eval_every else 0
    per_eval = -(-test_size // 256) * budget * speed["decode_step_s"] * (2 if c.eval_sampled else 1)
    return runs * (steps * per_step + evals * per_eval) / 60.0


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
                    out: str | Path | None = None, finish: bool = True) -> dict[str, RunResult]:
    """Train a chapter's algorithms on the ``"gpu"`` profile and write ``<chapter>.json`` with
    provenance into :func:`results_dir` (or ``out``, a file path).

    Runs go one seed at a time (``n_jobs`` at a time with ``n_jobs > 1``), never from the run
    cache, and the file is rewritten after each, with ``complete`` false until the last has
    finished. The file holds the history of every (algorithm, seed) and a provenance record: the commit,
    library versions, GPU name, resolved precision (:func:`grpo_lab.trainer.resolve_precision`),
    model, seeds, steps, wall time, ``dry_run`` (the profile's device is not CUDA: a check of the
    code path, e.g. with ``$GRPO_LAB_GPU_DEVICE=cpu``, not GPU results), and each algorithm's own
    :func:`provenance`.
    :func:`load_chapter_gpu` reads it back.

    Args:
        chapter: the chapter's file stem, e.g. ``"02_dapo"``.
        algos: presets or their names.
        seeds: shared by every algorithm (so that differences pair by seed).
        steps: RL steps per run (default: the profile's).
        profile: default :func:`gpu_profile` ().
        n_jobs: runs at a time (processes sharing the GPU).
        overrides: per-algorithm :class:`~grpo_lab.trainer.TrainerConfig` fields, as
            :func:`run_grid` takes them (e.g. VAPO's value pretraining and critic learning rate).
        out: the results file (default ``results_dir() / f"{chapter}.json"``).
        finish: mark the file ``complete`` after the last run; ``False`` leaves that to a caller
            that adds more runs (:func:`run_rpt_gpu`'s continued-NTP baseline).

    Returns:
        ``{algo name: RunResult}``, as :func:`run_grid`.

    Raises:
        ValueError: a malformed ``chapter``; as :func:`run_grid` (CUDA not available for a CUDA profile).
    """
    chapter = _chapter_name(chapter)
    prof = profile if profile is not None else gpu_profile()
    algos = [get_algorithm(a) if isinstance(a, str) else a for a in algos]
    seeds = _check_seeds(seeds)
    overrides = dict(overrides or {})
    path = _gpu_results_path(chapter, out, steps, n_jobs)
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
                                  overrides=one)[algo.name])
            done = [s for p in parts for s in p.provenance["seeds"]]
            grid[algo.name] = RunResult(pd.concat([p.history for p in parts], ignore_index=True),
                                        {**parts[0].provenance, "seeds": done,
                                         "wall_seconds": round(sum(p.provenance["wall_seconds"] for p in parts), 1)})
            complete = finish and algo is algos[-1] and batch is batches[-1]
            _save_chapter(path, chapter, prof, grid, seeds, time.perf_counter() - t0, complete)
    return grid


def rl_compute_units(history: pd.DataFrame, prompt_tokens: float, prompts_per_step: int, group_size: int) -> pd.Series:
    """Training compute of RL steps, per seed, in token-forward units (one unit: a forward pass
    over one token, 2N FLOPs for N parameters), as chapter 7 counts it: per step, the ``P × G``
    sampled sequences of ``prompt_tokens + length`` tokens cost one forward to generate and three
    (a forward and a backward) to train on, 4 units a token; next-token prediction costs 3.

    Args:
        history: rows of RL steps (``step > 0``) with ``seed`` and ``length`` (mean completion tokens).
        prompt_tokens: mean prompt length in tokens.
        prompts_per_step, group_size: P and G.

    Returns:
        units summed over each seed's steps, indexed by seed.
    """
    h = history[history["step"] > 0]
    units = 4 * prompts_per_step * group_size * (prompt_tokens + h["length"])
    return units.groupby(h["seed"]).sum()


def run_rpt_gpu(*, seeds: Sequence[int] = (0, 1, 2, 3, 4), steps: int | None = None, profile: Profile | None = None,
                n_jobs: int = 1, ntp_batch_size: int = 16, out: str | Path | None = None) -> dict[str, RunResult]:
    """Chapter 7 on a hub model: RPT trained on next-token reasoning, and continued next-token
    prediction on the same text at the same compute, per seed; written to ``07_rpt.json`` with
    provenance (:func:`run_chapter_gpu`).

    1. The task's data files for the model are built if :func:`rpt_data_dir` lacks them
       (:func:`grpo_lab.tasks.next_token.build_hub_task_data`, the model as its own entropy proxy,
       :data:`RPT_GPU_TEST_SIZE` test positions, on the profile's device).
    2. The ``RPT`` preset is trained on :func:`rpt_gpu_profile` (or ``profile``) for every seed.
    3. For each seed, the base model is trained by plain next-token prediction
       (:func:`grpo_lab.pretrain.continued_ntp_run`, ``p_format=0``: 64-token windows of the ``rl``
       part, at RPT's learning rate) for the number of steps whose compute (3 units a token) equals
       that seed's RPT run (:func:`rl_compute_units`), and evaluated greedy and sampled on the same
       test positions. It is stored as the algorithm ``"continued NTP"``: its step-0 row is the RPT
       run's base evaluation of that seed (the same model), its last row (at the RPT run's last
       step) the evaluation after training, and its provenance is marked ``baseline``.

    Args:
        seeds, steps, n_jobs, out: as :func:`run_chapter_gpu`.
        profile: default :func:`rpt_gpu_profile` ().
        ntp_batch_size: windows per next-token-prediction step.

    Returns:
        ``{"RPT": RunResult, "continued NTP": RunResult}``.

    Raises:
        ValueError: as :func:`run_chapter_gpu`; a profile whose task is not ``"next_token"``.
    """
    from .algorithms import RPT
    from .pretrain import RECIPES, continued_ntp_run
    from .tasks.next_token import TEST_FILE, TRAIN_FILE, build_hub_task_data

    prof = profile if profile is not None else rpt_gpu_profile()
    if prof.task != "next_token":
        raise ValueError(f"run_rpt_gpu: the profile's task must be 'next_token' (experiments.rpt_gpu_profile), got "
                         f"{prof.task!r}")
    positive_int("run_rpt_gpu: ntp_batch_size", ntp_batch_size)
    try:
        seeds = _check_seeds(seeds)
    except ValueError as exc:
        raise ValueError(f"run_rpt_gpu: {exc}") from None
    path = _gpu_results_path("07_rpt", out, steps, n_jobs)
    kw = dict(prof.task_kwargs)
    data = Path(kw["data"])
    where = "$GRPO_LAB_RPT_DATA" if os.environ.get("GRPO_LAB_RPT_DATA") else "the profile's data"
    if data.exists() and not data.is_dir():
        raise ValueError(f"run_rpt_gpu: the task's data directory {data} ({where}) is a file")
    summary = data / "summary.json"  # how the data files were built (model, proxy, token counts, entropies)
    if not ((data / TRAIN_FILE).is_file() and (data / TEST_FILE).is_file()):
        try:
            build_hub_task_data(prof.base, data, device=prof.config.device, test_size=RPT_GPU_TEST_SIZE)
        except (FileExistsError, NotADirectoryError, PermissionError):
            raise  # writing the data files failed, not loading the model: the error names the path
        except OSError as exc:
            raise _unloadable(prof, exc) from exc
    task_data = json.loads(summary.read_text()) if summary.is_file() else None
    if task_data is not None and not _same_model(task_data.get("model"), prof.base):
        fix = ("unset $GRPO_LAB_RPT_DATA (a directory per model) or point it at an empty directory"
               if os.environ.get("GRPO_LAB_RPT_DATA") else
               f"set $GRPO_LAB_RPT_DATA to an empty directory, or delete {data} to rebuild it")
        raise ValueError(f"run_rpt_gpu: the task's data files in {data} were built for {task_data.get('model')!r}, not "
                         f"for the profile's model {prof.base!r}: {fix}")
    if task_data is not None and task_data.get("test_positions") != RPT_GPU_TEST_SIZE:
        warnings.warn(f"run_rpt_gpu: the task's data files in {data} hold {task_data.get('test_positions')} test "
                      f"positions, not {RPT_GPU_TEST_SIZE} (they were built by hand); the results file records it",
                      RuntimeWarning, stacklevel=2)
    t0 = time.perf_counter()
    grid = run_chapter_gpu("07_rpt", [RPT], seeds=seeds, steps=steps, profile=prof, n_jobs=n_jobs, out=path,
                           finish=False)
    rpt = grid[RPT.name]
    task = get_task("next_token", **kw)
    tok = task._tok()  # the tokenizer the task's data files were cut with: the model's
    prompt_tokens = float(np.mean([len(tok(p.prompt, add_special_tokens=False)["input_ids"]) for p in task.test_set()]))
    units = rl_compute_units(rpt.history, prompt_tokens, prof.config.prompts_per_step, prof.config.group_size)
    window = RECIPES["corpus"].seq_len
    rows, ntp_steps, t1 = [], {}, time.perf_counter()
    last = int(rpt.history["step"].max())
    for seed in seeds:
        n = max(1, round(float(units.loc[seed]) / (3 * ntp_batch_size * window)))
        x = continued_ntp_run(seed, steps=n, base=prof.base, lr=prof.config.lr, temperature=prof.config.temperature,
                              batch_size=ntp_batch_size, threads=None, device=prof.config.device,
                              task_kwargs={**kw, "max_new_tokens": prof.config.max_new_tokens or kw["max_new_tokens"]},
                              precision=prof.config.precision, p_format=0.0)
        ntp_steps[seed] = n
        base_row = rpt.history[(rpt.history["seed"] == seed) & (rpt.history["step"] == 0)].iloc[0]
        rows.append({"step": 0, "seed": seed, "algo": "continued NTP",
                     **{k: base_row[k] for k in base_row.index if k.startswith("test_")}})
        final = {"step": last, "seed": seed, "algo": "continued NTP", "ntp_steps": n, "ntp_tokens": x["tokens"],
                 "ntp_loss_last": x["loss_last"], "test_accuracy": float(x["frame"]["correct"].mean()),
                 "test_length": float(x["summary"]["mean_length"]),
                 "test_accuracy_sampled": float(x["sampled_frame"]["correct"].mean())}
        if "reasoning_frac" in x["summary"]:
            final["test_reasoning_frac"] = float(x["summary"]["reasoning_frac"])
        final.update({f"test_{k}": v for k, v in task.test_metrics(x["frame"]).items()})
        final.update({f"test_sampled_{k}": v for k, v in task.test_metrics(x["sampled_frame"]).items()})
        rows.append(final)
        grid["continued NTP"] = RunResult(pd.DataFrame(rows), {
            "baseline": True, "what": "continued next-token prediction at the compute of the RPT run of the same seed",
            "config": {"lr": prof.config.lr, "batch_size": ntp_batch_size, "window_tokens": window, "p_format": 0.0,
                       "precision": prof.config.precision, "minibatches": 1, "epochs": 1, "warmup": 0,
                       "optimizer": f"AdamW, betas (0.9, 0.98), weight decay {RECIPES['corpus'].weight_decay}, "
                                    f"global-norm clip {RECIPES['corpus'].grad_clip} (grpo_lab.pretrain.continue_ntp)"},
            "ntp_steps": {str(k): v for k, v in ntp_steps.items()}, "rl_units": {str(k): float(units.loc[k])
                                                                                 for k in ntp_steps},
            "prompt_tokens_mean": round(prompt_tokens, 2), "seeds": list(ntp_steps),
            "wall_seconds": round(time.perf_counter() - t1, 1)})
        _save_chapter(path, "07_rpt", prof, grid, seeds, time.perf_counter() - t0, seed == seeds[-1],
                      extra={"task_data": task_data})
    return grid


def _save_chapter(path: Path, chapter: str, prof: Profile, grid: Mapping[str, RunResult], seeds: list[int],
                  wall: float, complete: bool, extra: Mapping[str, Any] | None = None) -> None:
    """Write :func:`run_chapter_gpu`'s results file for the runs in ``grid`` so far."""
    from .trainer import resolve_precision

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
    * with the profile's default model (:data:`GPU_MODEL`) on GSM8K, the base policy solves more
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


def summarize_runs(results: Mapping[str, RunResult], *, baseline: str | None = None,
                   column: str = "test_accuracy", level: float = 0.95) -> pd.DataFrame:
    """One row per algorithm: its base and final ``column`` (mean and t interval over seeds), the
    paired change final − base, and (with ``baseline``) the paired difference of its final value
    from the baseline's over the seeds both share. "Final" is each seed's last measured value;
    "base" its step-0 value (a training metric such as ``length_incorrect`` has none: "not measured").

    Returns:
        DataFrame with columns ``algorithm``, ``seeds``, ``base``, ``final``, ``final - base`` and,
        with a baseline, ``vs <baseline>``; interval columns are strings
        ``"0.412 [0.398, 0.426]"`` (:func:`grpo_lab.stats.format_interval`).

    Raises:
        ValueError: ``baseline`` is not among ``results``; no algorithm has ``column``.
    """
    from .stats import format_interval, paired_difference, t_interval

    if baseline is not None and baseline not in results:
        raise ValueError(f"summarize_runs: baseline {baseline!r} is not among {sorted(results)}")
    rows = []
    for name, r in results.items():
        if column not in r.history.columns:
            continue
        final, base = r.final(column), r.base(column).dropna()
        if final.empty:
            continue
        row = {"algorithm": name, "seeds": int(final.size),
               "base": format_interval(t_interval(base.values, level)) if base.size else "not measured",
               "final": format_interval(t_interval(final.values, level)),
               "final - base": (format_interval(paired_difference(final, base, level)) if base.size > 1 else
                                "n/a" if not base.size else "n/a (one seed)")}
        if baseline is not None and name != baseline:
            other = results[baseline].final(column)
            shared = final.index.intersection(other.index)
            row[f"vs {baseline}"] = (format_interval(paired_difference(final, other, level)) if len(shared) > 1
                                     else "n/a (fewer than 2 shared seeds)")
        rows.append(row)
    if not rows:
        raise ValueError(f"summarize_runs: no result has the column {column!r}")
    frame = pd.DataFrame(rows)
    if baseline is not None and f"vs {baseline}" in frame:
        frame[f"vs {baseline}"] = frame[f"vs {baseline}"].fillna("")
    return frame


def main(argv=None) -> None:
    """``python -m grpo_lab.experiments``: the command line of :mod:`grpo_lab.cli` (``python -m grpo_lab``)
    under its older name, kept for existing scripts; it takes every option of
    ``python -m grpo_lab --help`` (``--out`` is now optional).

    Raises:
        SystemExit: with the command's status when it is not 0 (2 for a mistake in the command line,
            after one line on stderr).
    """
    from .cli import main as cli_main

    status = cli_main(argv, prog="python -m grpo_lab.experiments")
    if status:
        raise SystemExit(status)


if __name__ == "__main__":
    main()
