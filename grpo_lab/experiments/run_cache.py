"""The run cache: finished runs stored under a key of everything their numbers depend on.

:func:`~grpo_lab.experiments.run_cache_dir` says where (``$GRPO_LAB_RUN_CACHE``),
:func:`~grpo_lab.experiments.run_fingerprint` hashes what a run depends on besides its
configuration (the package's source, the base checkpoint, the task files, the library versions,
the processor and thread count); one file per (algorithm, profile, steps, seed). The behaviour is
described in :mod:`grpo_lab.experiments`, where the public names are documented.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import warnings
from pathlib import Path

import pandas as pd
import torch

from ..algo.algorithms import Algorithm
from ..paths import write_text_atomically
from ..policy.models import VALUE_INITS
from ..paths import REPO_ROOT, checkpoint_dir, data_dir
from ..training.checkpoints import _json_default
from ..algo.checks import is_int
from .profiles import Profile
from .results import config_hash, processor_name

__all__ = ["run_cache_dir", "run_fingerprint"]

#: The package's source tree (``grpo_lab/``), every ``*.py`` file of which the fingerprint covers.
_PACKAGE = Path(__file__).resolve().parents[1]


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


def _reward_model_dir(prof: Profile) -> Path | None:
    """The checkpoint directory of the profile's task's ``reward_model`` (a task field or keyword), if it has one."""
    from ..tasks import TASKS

    name = dict(prof.task_kwargs).get("reward_model", getattr(TASKS.get(prof.task), "reward_model", None))
    if not isinstance(name, str) or not name:
        return None
    path = Path(name).expanduser()
    path = path if path.is_dir() else checkpoint_dir(name)
    return path if path.is_dir() else None


def run_fingerprint(prof: Profile) -> str:
    """sha256 (first 16 hex) of what a run's numbers depend on besides its configuration.

    Covers every file of the ``grpo_lab`` package, the base checkpoint's files, ``data/tasks/*``, the task's learned
    reward model's files (a ``reward_model`` field or keyword naming a checkpoint),
    the files of a saved critic named by ``TrainerConfig.value_init``,
    the versions of python, torch, transformers, tokenizers and numpy (and peft for a LoRA profile), the processor model and
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
    _hash_files(h, _PACKAGE, "*.py")
    base = checkpoint_dir(prof.base) if checkpoint_dir(prof.base).exists() else Path(prof.base)
    if not base.is_dir():
        raise ValueError(f"run_fingerprint: base {prof.base!r} is not a local checkpoint directory")
    _hash_files(h, base, "*")
    if (data_dir() / "tasks").is_dir():
        _hash_files(h, data_dir() / "tasks", "*")
    rm = _reward_model_dir(prof)
    if rm is not None:  # a task trained on a learned reward model (DialogueTask): its weights
        _hash_files(h, rm, "*")
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
    versions = [platform.python_version(), torch.__version__, transformers.__version__, tokenizers.__version__,
                numpy.__version__]
    if prof.lora is not None:  # LoRA runs also depend on peft (how it initialises and applies the adapters)
        from .results import _version

        versions.append(("peft", _version("peft")))
    h.update(json.dumps([*versions, machine, env], default=str).encode())
    return h.hexdigest()[:16]


def _uncacheable(algo: Algorithm, prof: Profile) -> list[str]:
    """The registry entries ``algo`` calls (:meth:`~grpo_lab.algo.algorithms.Algorithm.functions`) and the
    task class of ``prof`` whose code lives outside ``grpo_lab`` (a function registered by a user, a
    monkeypatched entry): the run-cache fingerprint hashes only the package's files, so runs that
    use them are never cached."""
    from ..tasks import TASKS

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
    try:
        write_text_atomically(path, json.dumps({"rows": rows}, default=_json_default))
    except OSError as exc:
        warnings.warn(f"run cache: could not store the run at {path} ({exc}); the result is returned but not "
                      "cached (GRPO_LAB_RUN_CACHE=off silences this)", RuntimeWarning, stacklevel=2)
