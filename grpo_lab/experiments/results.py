"""Results: what a run returns, where it comes from, its file, and its summary over seeds.

:class:`~grpo_lab.experiments.RunResult` (a long history and a provenance record),
:func:`~grpo_lab.experiments.provenance` and :func:`~grpo_lab.experiments.config_hash`,
:func:`~grpo_lab.experiments.save_results` / :func:`~grpo_lab.experiments.load_results` (JSON
files) and :func:`~grpo_lab.experiments.summarize_runs` (t intervals over seeds). Documented under
:mod:`grpo_lab.experiments`.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd
import torch

from .. import __version__
from ..algo.algorithms import Algorithm, migrate_fields
from ..paths import write_text_atomically
from ..paths import REPO_ROOT
from .profiles import Profile

__all__ = ["RunResult", "processor_name", "config_hash", "provenance", "save_results", "load_results",
           "summarize_runs"]


@dataclass
class RunResult:
    """What :func:`run` returns.

    Attributes:
        history: long DataFrame, one row per (seed, step), with ``algo`` and ``seed`` columns
            and every column of :meth:`grpo_lab.training.trainer.Trainer.train`.
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
    """sha256 (first 12 hex) of the algorithm, profile and step count — identifies a results file.
    The trainer configuration counts without its output fields (:data:`grpo_lab.training.config.OUTPUT_FIELDS`:
    where the run writes and what it shows do not change its numbers). The profile's LoRA adapters (:attr:`Profile.lora`) count when set (a run without them hashes as
    before they existed)."""
    payload = {"algo": asdict(algo), "profile": profile.name, "base": profile.base, "task": profile.task,
               "task_kwargs": dict(profile.task_kwargs), "config": profile.config.run_identity(), "steps": steps}
    if getattr(profile, "lora", None) is not None:
        payload["lora"] = profile.lora.to_dict()
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
        **({"lora": profile.lora.to_dict(), "peft": _version("peft")} if getattr(profile, "lora", None) else {}),
    }


def _version(package: str) -> str | None:
    """The installed version of ``package``, ``None`` when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def processor_name() -> str:
    """The CPU model (``/proc/cpuinfo``'s ``model name`` on Linux, where ``platform.processor()`` is empty)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def save_results(result: RunResult, path: str | Path) -> Path:
    """Write ``{"provenance": …, "history": [rows]}`` as JSON."""
    rows = json.loads(result.history.to_json(orient="records"))
    text = json.dumps({"provenance": result.provenance, "history": rows}, indent=1) + "\n"
    # written beside and renamed over: a process killed mid-write (the GPU runs rewrite their file after
    # every seed) leaves the previous file whole, never a truncated one
    return write_text_atomically(path, text)


def load_results(path: str | Path) -> RunResult:
    """Read a file written by :func:`save_results`; the provenance's algorithm fields in today's names
    (:func:`grpo_lab.algo.algorithms.migrate_fields`: ``clip`` -> ``surrogate``), so that
    ``Algorithm.from_dict(result.provenance["algo"])`` rebuilds it. The ``config_hash`` stored is left as written.

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
    prov = d["provenance"]
    if isinstance(prov, dict) and isinstance(prov.get("algo"), dict):
        prov = {**prov, "algo": migrate_fields(prov["algo"])}
    frame = pd.DataFrame(d["history"])
    for col in frame.columns:  # JSON has no NaN: all-missing numeric columns come back as None
        if col not in ("algo",) and frame[col].isna().all():
            frame[col] = frame[col].astype(float)
    return RunResult(frame, prov)


def summarize_runs(results: Mapping[str, RunResult], *, baseline: str | None = None,
                   column: str = "test_accuracy", level: float = 0.95) -> pd.DataFrame:
    """One row per algorithm: its base and final ``column`` (mean and t interval over seeds), the
    paired change final − base, and (with ``baseline``) the paired difference of its final value
    from the baseline's over the seeds both share. "Final" is each seed's last measured value;
    "base" its step-0 value (a training metric such as ``length_incorrect`` has none: "not measured").

    Returns:
        DataFrame with columns ``algorithm``, ``seeds``, ``base``, ``final``, ``final - base`` and,
        with a baseline, ``vs <baseline>``; interval columns are strings
        ``"0.412 [0.398, 0.426]"`` (:func:`grpo_lab.experiments.stats.format_interval`).

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
