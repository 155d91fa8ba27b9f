"""Profiles, multi-seed runs and results files with provenance.

A *profile* fixes everything about an experiment's scale: ``cpu`` is what the book executes in
CI on two cores (minutes), ``gpu`` is the same experiment at a larger scale for a Colab or
cluster GPU. Chapters call :func:`run`, which trains one algorithm from a base checkpoint for
several seeds and returns a long DataFrame (one row per seed × step) plus a provenance record;
:func:`save_results` / :func:`load_results` write and read ``data/results/<profile>/*.json``.

    python -m grpo_lab.experiments GRPO --profile gpu --seeds 0 1 2 3 4 --out data/results/gpu/grpo.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Sequence

import pandas as pd
import torch

from . import __version__
from .algorithms import Algorithm, get_algorithm
from .models import load_policy
from .paths import REPO_ROOT, checkpoint_dir
from .tasks import get_task
from .trainer import Trainer, TrainerConfig

__all__ = ["Profile", "PROFILES", "get_profile", "run", "run_grid", "RunResult", "save_results", "load_results",
           "provenance", "config_hash"]


@dataclass(frozen=True)
class Profile:
    """The scale of an experiment.

    Attributes:
        name: ``"cpu"`` or ``"gpu"``.
        base: checkpoint name under ``data/checkpoints`` (or a hub id / path).
        task: task name and keyword arguments.
        steps: RL steps per seed.
        config: the :class:`~grpo_lab.trainer.TrainerConfig`.
    """

    name: str
    base: str
    task: str
    steps: int
    config: TrainerConfig
    task_kwargs: tuple = ()


PROFILES = {
    # One chapter experiment (3 seeds) in about two minutes. One thread: the tiny model gains little
    # from more, and a fixed count keeps the numbers identical on machines with more cores.
    "cpu": Profile(
        name="cpu", base="arithmetic-base", task="arithmetic", steps=40,
        config=TrainerConfig(prompts_per_step=16, group_size=8, lr=3e-4, warmup=10, minibatches=2, epochs=1,
                             eval_every=5, threads=1, device="cpu"),
    ),
    # One GPU (Colab T4 or better): 4x the questions per step, twice the group, longer runs.
    "gpu": Profile(
        name="gpu", base="arithmetic-base", task="arithmetic", steps=150,
        config=TrainerConfig(prompts_per_step=64, group_size=16, lr=3e-4, warmup=20, minibatches=4, epochs=1,
                             eval_every=10, device="cuda"),
    ),
}


def get_profile(name: str) -> Profile:
    """The profile called ``name``.

    Raises:
        ValueError: unknown profile.
    """
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
    dev_name = torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() \
        else platform.processor() or platform.machine()
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
    prof = get_profile(profile) if isinstance(profile, str) else profile
    if config_overrides:
        known = {f.name for f in fields(TrainerConfig)}
        unknown = sorted(set(config_overrides) - known)
        if unknown:
            raise ValueError(f"run: unknown TrainerConfig field(s) {unknown}; known: {sorted(known)}")
        prof = replace(prof, config=replace(prof.config, **config_overrides))
    if prof.config.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"run: profile {prof.name!r} needs CUDA, which is not available; use profile='cpu'")
    return prof


def _check_seeds(seeds) -> list[int]:
    if isinstance(seeds, (int, str)) or not hasattr(seeds, "__iter__"):
        raise ValueError(f"seeds must be a sequence of ints such as (0, 1, 2), got {seeds!r}")
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


def _train_one(algo: Algorithm, prof: Profile, steps: int, seed: int, progress: bool | None) -> pd.DataFrame:
    """One seed of one algorithm from the profile's base checkpoint (a process-pool task)."""
    try:  # validate again here: a spawned worker has only the registry entries its imports made
        algo = algo.replace()
    except ValueError as exc:
        raise ValueError(
            f"{exc}. Worker processes (n_jobs > 1) start with fresh registries: a choice registered in a "
            "notebook or under `if __name__ == '__main__'` does not reach them. Register it at the top level "
            "of a module that the script imports, or use n_jobs=1") from None
    base = checkpoint_dir(prof.base) if checkpoint_dir(prof.base).exists() else prof.base
    policy, tokenizer = load_policy(base, device=prof.config.device)
    task = get_task(prof.task, **dict(prof.task_kwargs))
    cfg = replace(prof.config, seed=int(seed), progress=progress)
    h = Trainer(policy, tokenizer, task, algo, cfg).train(steps)
    h.insert(0, "seed", int(seed))
    h.insert(0, "algo", algo.name)
    return h


def _map(jobs: list[tuple], n_jobs: int) -> list[pd.DataFrame]:
    """Run ``_train_one(*job)`` for every job, in ``n_jobs`` fresh processes when ``n_jobs > 1``.

    Each run is independent and seeded, and uses the profile's thread count, so results do not
    depend on ``n_jobs``; processes are started with "spawn" (safe with torch and in notebooks).
    """
    if n_jobs < 1:
        raise ValueError(f"n_jobs must be >= 1, got {n_jobs}")
    if n_jobs == 1 or len(jobs) == 1:
        return [_train_one(*job) for job in jobs]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(n_jobs, len(jobs)), mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(_train_one, *job) for job in jobs]
        return [f.result() for f in futures]


def run(algo: Algorithm | str, *, profile: str | Profile = "cpu", seeds: Sequence[int] = (0, 1, 2),
        steps: int | None = None, progress: bool | None = None, n_jobs: int = 1,
        **config_overrides) -> RunResult:
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
        **config_overrides: fields of :class:`~grpo_lab.trainer.TrainerConfig` to override
            (e.g. ``minibatches=4``).

    Returns:
        RunResult.

    Raises:
        ValueError: no seeds, unknown profile/algorithm, an invalid override, ``n_jobs < 1``.
    """
    algo = get_algorithm(algo) if isinstance(algo, str) else algo
    seeds = _check_seeds(seeds)
    prof = _resolve(profile, config_overrides)
    steps = _check_steps(prof.steps if steps is None else steps)
    t0 = time.perf_counter()
    frames = _map([(algo, prof, steps, int(s), progress) for s in seeds], n_jobs)
    wall = time.perf_counter() - t0
    return RunResult(pd.concat(frames, ignore_index=True), provenance(algo, prof, steps, seeds, wall))


def run_grid(algos: Sequence[Algorithm], *, profile: str | Profile = "cpu", seeds: Sequence[int] = (0, 1, 2),
             steps: int | None = None, n_jobs: int = 1, **config_overrides) -> dict[str, RunResult]:
    """:func:`run` for several algorithms, all (algorithm, seed) pairs spread over ``n_jobs`` processes.

    Returns:
        ``{algo.name: RunResult}`` in the order given (each ``provenance`` records the wall time
        of the whole grid).

    Raises:
        ValueError: duplicate algorithm names, no algorithms or seeds, or as :func:`run`.
    """
    algos = [get_algorithm(a) if isinstance(a, str) else a for a in algos]
    names = [a.name for a in algos]
    if not algos or not seeds:
        raise ValueError("run_grid: need at least one algorithm and one seed")
    if len(set(names)) != len(names):
        raise ValueError(f"run_grid: algorithm names must be unique, got {names}")
    seeds = _check_seeds(seeds)
    prof = _resolve(profile, config_overrides)
    steps = _check_steps(prof.steps if steps is None else steps)
    jobs = [(a, prof, steps, int(s), False) for a in algos for s in seeds]
    t0 = time.perf_counter()
    frames = _map(jobs, n_jobs)
    wall = time.perf_counter() - t0
    out, k = {}, 0
    for a in algos:
        out[a.name] = RunResult(pd.concat(frames[k:k + len(seeds)], ignore_index=True),
                                provenance(a, prof, steps, seeds, wall))
        k += len(seeds)
    return out


def save_results(result: RunResult, path: str | Path) -> Path:
    """Write ``{"provenance": …, "history": [rows]}`` as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(result.history.to_json(orient="records"))
    path.write_text(json.dumps({"provenance": result.provenance, "history": rows}, indent=1) + "\n")
    return path


def load_results(path: str | Path) -> RunResult:
    """Read a file written by :func:`save_results`.

    Raises:
        FileNotFoundError: no such file. ValueError: not a results file.
    """
    d = json.loads(Path(path).read_text())
    if not isinstance(d, dict) or "provenance" not in d or "history" not in d:
        raise ValueError(f"load_results: {path} is not a grpo_lab results file")
    frame = pd.DataFrame(d["history"])
    for col in frame.columns:  # JSON has no NaN: all-missing numeric columns come back as None
        if col not in ("algo",) and frame[col].isna().all():
            frame[col] = frame[col].astype(float)
    return RunResult(frame, d["provenance"])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Train an algorithm for several seeds and save the results.")
    ap.add_argument("algo", help="preset name, e.g. GRPO")
    ap.add_argument("--profile", default="cpu", choices=sorted(PROFILES))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    if out.is_dir():
        ap.error(f"--out {out} is a directory; give a file name such as {out / 'results.json'}")
    try:  # fail now, not after hours of training
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        ap.error(f"--out {out}: cannot create its directory ({e})")
    res = run(a.algo, profile=a.profile, seeds=a.seeds, steps=a.steps)
    save_results(res, a.out)
    fin, base = res.final(), res.base()
    sd = f" ± {fin.std():.3f}" if len(fin) > 1 else ""
    print(f"{a.algo} [{a.profile}] test accuracy: base {base.mean():.3f} -> {fin.mean():.3f}{sd} "
          f"({len(a.seeds)} seeds, {res.provenance['wall_seconds']} s)")


if __name__ == "__main__":
    main()
