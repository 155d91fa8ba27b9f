"""Run directories: where each seed of a run writes (its step log, its trackers' files, its periodic
checkpoints), and the records that let a run killed mid-way resume exactly where it stopped.

The layout under a run's ``output_dir`` (the CLI's ``--out`` without its ``.json``)::

    <output_dir>/<algorithm name>/seed-<k>/     = TrainerConfig.output_dir of that seed (seed_dir)
        run.json                                what the seed trains: algorithm, trainer configuration
                                                (run_identity), profile, base, task, LoRA adapters
        result.json                             its history, once it has trained every step
        metrics.jsonl, tensorboard/, wandb/     its trackers (TrainerConfig.report_to)
        checkpoints/step-000010/ ...            periodic checkpoints (TrainerConfig.save_every)
        final/                                  the trained policy and its tokenizer (save_pretrained; LoRA:
                                                merged, and the adapters alone in final/adapter/), when
                                                run(..., save_model=True) asked for it (save_final_model)

:func:`grpo_lab.experiments.run` writes ``run.json`` before a seed trains and ``result.json`` after; with
``resume=True`` a seed whose ``result.json`` holds its ``steps`` is not trained again, one with a
checkpoint continues from the latest (:func:`latest_checkpoint`), and a ``run.json`` that differs from
the run asked for is refused, naming every field that differs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Sequence

from ..paths import write_text_atomically
from ..training.checkpoints import CHECKPOINTS_DIR, _json_default, periodic_checkpoints
from ..training.config import TrainerConfig
from ..algo.algorithms import migrate_fields
from ..algo.checks import is_int

__all__ = ["run_directory", "seed_dir", "checkpoints_dir", "latest_checkpoint", "FINAL_MODEL_DIR", "final_model_dir",
           "save_final_model", "ADAPTER_DIR", "LOCK_FILE", "RunDirectoryLocked", "run_lock", "lock_holder"]

#: The file of a seed's directory that records what it trains (``_run_record``).
RUN_FILE = "run.json"
#: The file of a seed's directory that holds its history once every step has trained.
RESULT_FILE = "result.json"
#: The subdirectory of a seed's directory that holds its trained model (:func:`save_final_model`).
FINAL_MODEL_DIR = "final"
#: The subdirectory of ``final/`` that holds a LoRA run's adapters alone (:func:`save_final_model`).
ADAPTER_DIR = "adapter"

#: The file of a run's ``output_dir`` that its writer holds locked (:func:`run_lock`).
LOCK_FILE = ".grpo_lab.lock"

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _dir_name(algo_name: str) -> str:
    """``algo_name`` as a directory name: itself when it is made of letters, digits, ``.``, ``_`` and ``-``
    (and does not start with a dot); otherwise the other characters replaced by ``_`` and the first 8 hex
    digits of its sha256 appended, so that two names never share a directory (``"mu=4"`` -> ``mu_4-...``)."""
    safe = _UNSAFE.sub("_", algo_name).strip("._")
    if safe == algo_name:
        return safe
    digest = hashlib.sha256(algo_name.encode()).hexdigest()[:8]
    return f"{safe or 'algo'}-{digest}"


def run_directory(results_file: str | os.PathLike) -> Path:
    """The run directory that goes with a results file (the ``output_dir`` the command line and
    :func:`grpo_lab.lab.run_chapter_gpu` give :func:`grpo_lab.experiments.run`): the file's path
    without its ``.json`` suffix (``runs/grpo.json`` -> ``runs/grpo``), or with ``.d`` appended when it
    has no such suffix (``runs/grpo`` -> ``runs/grpo.d``, never the file itself)."""
    path = Path(results_file)
    return path.with_suffix("") if path.suffix == ".json" else path.with_name(path.name + ".d")


def seed_dir(output_dir: str | os.PathLike, algo_name: str, seed: int) -> Path:
    """The directory one seed of one algorithm writes into: ``output_dir / <algo_name, made
    filesystem-safe> / f"seed-{seed}"`` (the ``TrainerConfig.output_dir`` that
    :func:`grpo_lab.experiments.run` gives that seed).

    Args:
        output_dir: the run's output directory (need not exist).
        algo_name: the algorithm's display name (``Algorithm.name``); a name with
            other characters than letters, digits, ``.``, ``_``, ``-`` gets them replaced by ``_`` and a
            short hash of the name appended (two names never share a directory).
        seed: the run's seed (int).

    Raises:
        ValueError: ``algo_name`` is not a non-empty string, or ``seed`` is not an integer.
    """
    if not isinstance(algo_name, str) or not algo_name:
        raise ValueError(f"seed_dir: algo_name must be a non-empty string, got {algo_name!r}")
    if not is_int(seed):
        raise ValueError(f"seed_dir: seed must be an integer, got {seed!r}")
    return Path(output_dir) / _dir_name(algo_name) / f"seed-{int(seed)}"


def checkpoints_dir(seed_directory: str | os.PathLike) -> Path:
    """Where a seed's periodic checkpoints go (``TrainerConfig.save_every``): ``seed_directory / "checkpoints"``,
    one ``step-NNNNNN`` directory per checkpoint."""
    return Path(seed_directory) / CHECKPOINTS_DIR


def latest_checkpoint(seed_directory: str | os.PathLike) -> Path | None:
    """The newest finished periodic checkpoint of a seed's directory (the highest step whose directory
    holds a ``state.json``; a half-written one that a killed save left behind is ignored), or ``None``."""
    found = periodic_checkpoints(checkpoints_dir(seed_directory))
    return found[-1][1] if found else None


def final_model_dir(seed_directory: str | os.PathLike) -> Path:
    """Where a seed's trained model goes (:func:`save_final_model`): ``seed_directory / "final"``."""
    return Path(seed_directory) / FINAL_MODEL_DIR


def save_final_model(trainer, seed_directory: str | os.PathLike) -> tuple[Path, str]:
    """Write the trained policy of ``trainer`` and its tokenizer to :func:`final_model_dir` of
    ``seed_directory`` with ``save_pretrained`` (safetensors), so that
    :func:`grpo_lab.policy.models.load_policy` (or ``transformers.AutoModelForCausalLM.from_pretrained``) loads it
    and ``--model DIR`` trains from it. A LoRA policy (a ``peft.PeftModel``) is written as a copy with its
    adapters merged into the base weights (:func:`grpo_lab.policy.models.plain_copy`: one plain checkpoint, the
    same function), and its adapters alone in ``final/adapter`` as peft writes them (``adapter_config.json``,
    ``adapter_model.safetensors``; ``peft.PeftModel.from_pretrained(base, "final/adapter")`` loads them) with
    ``grpo_lab_base.json`` naming the base (:func:`grpo_lab.policy.lora.base_record`). The weights are the trainer's (float32 master weights). Nothing the run computes
    changes: the policy is only read (the LoRA merge happens on the copy).

    The files go to a sibling ``.final.saving`` directory first, renamed into place once complete (an
    earlier ``final/`` is replaced), so a killed save never leaves half a model at ``final/``.

    Args:
        trainer: a :class:`~grpo_lab.training.trainer.Trainer` (its ``policy`` and ``tokenizer`` are written).
        seed_directory: the seed's directory (:func:`seed_dir`); created if missing.

    Returns:
        ``(path, kind)``: the model's directory and ``"full weights"`` or ``"LoRA adapters merged into the
        base weights"``.

    Raises:
        OSError: writing failed (the temporary directory is removed; an earlier ``final/`` stays).
    """
    from ..policy.models import _progress_bars, is_peft_model, plain_copy
    from ..training.checkpoints import _replace_dir

    final = Path(os.path.abspath(final_model_dir(seed_directory)))
    lora = is_peft_model(trainer.policy)
    model = plain_copy(trainer.policy) if lora else trainer.policy
    tmp = final.with_name(f".{final.name}.saving")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a process killed while saving
    try:
        tmp.mkdir(parents=True)
        with _progress_bars(trainer._show_progress()):  # transformers' "Writing model shards" bar
            model.save_pretrained(tmp, safe_serialization=True)
            trainer.tokenizer.save_pretrained(tmp)
            if lora:  # the adapters alone too, as peft writes them (TRL's save_model of a LoRA run)
                from ..policy.lora import BASE_FILE, base_record

                trainer.policy.save_pretrained(tmp / ADAPTER_DIR, safe_serialization=True)
                with contextlib.suppress(ValueError):  # a base built in memory: peft's own record only
                    (tmp / ADAPTER_DIR / BASE_FILE).write_text(json.dumps(base_record(trainer.policy), indent=2))
        _replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final_model_dir(seed_directory), ("LoRA adapters merged into the base weights" if lora else "full weights")


# ------------------------------------------------------------------------------- the run directory's lock
class RunDirectoryLocked(RuntimeError):
    """Another process writes into the run directory (:func:`run_lock`); the message names it (pid, host)."""


#: The locks this process holds: ``{resolved lock file: [open file, depth]}`` (:func:`run_lock` is reentrant).
_HELD: dict[str, list] = {}


def lock_holder(output_dir: str | os.PathLike) -> dict | None:
    """What the lock file of ``output_dir`` says of its last holder (``pid``, ``host``, ``since``, ``argv``),
    or ``None`` (no lock file, or an empty one: released). It does not say whether the lock is held."""
    try:
        text = (Path(output_dir) / LOCK_FILE).read_text()
        return json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def run_lock(output_dir: str | os.PathLike):
    """Hold the run directory ``output_dir`` (created if missing) for this process while the block runs: an
    exclusive ``fcntl.flock`` on ``output_dir/.grpo_lab.lock``, which records the holder (pid, host, start
    time, command line). The kernel releases the lock when the process dies, so the lock of a killed run is
    taken over (a line on stderr names its old holder); on release the record is emptied. Reentrant within
    a process; on a platform without ``fcntl`` (Windows) nothing is locked.

    Raises:
        RunDirectoryLocked: another live process holds the lock (its pid, host and start time named).
    """
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no lock
        yield
        return
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    path = str((Path(output_dir) / LOCK_FILE).resolve())
    if path in _HELD:
        _HELD[path][1] += 1
        try:
            yield
        finally:
            _HELD[path][1] -= 1
        return
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise RunDirectoryLocked(_locked_message(output_dir)) from None
    _take_over(f, output_dir)
    _HELD[path] = [f, 1]
    try:
        yield
    finally:
        del _HELD[path]
        f.seek(0)
        f.truncate()
        f.flush()
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def _locked_message(output_dir) -> str:
    """The refusal of a second writer, naming the holder the lock file records."""
    who = lock_holder(output_dir) or {}
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(who["since"])) if "since" in who else "?"
    return (f"run directory {output_dir} is in use by pid {who.get('pid', '?')} on host {who.get('host', '?')} "
            f"(since {since}); wait for that run to end or stop it (a SIGTERM writes a checkpoint), then --resume")


def _take_over(f, output_dir) -> None:
    """Write this process into the locked file ``f``; a line on stderr when a holder that died left its record."""
    f.seek(0)
    old = f.read().strip()
    if old:
        try:
            who = json.loads(old)
        except ValueError:
            who = {}
        print(f"run directory {output_dir}: taking over the lock of pid {who.get('pid', '?')} on host "
              f"{who.get('host', '?')}, which no longer runs (killed?)", file=sys.stderr, flush=True)
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                        "argv": sys.argv}))
    f.flush()


# ------------------------------------------------------------------------------- records of a seed's run
def _plain(value: Any) -> Any:
    """``value`` as JSON gives it back (tuples as lists, numpy scalars as python numbers)."""
    def default(o):
        try:
            return _json_default(o)
        except TypeError:
            return str(o)

    return json.loads(json.dumps(value, sort_keys=True, default=default))


def _run_record(algo, prof, seed: int) -> dict:
    """What one seed trains, as ``run.json`` holds it: the algorithm (every field), the trainer
    configuration with the run's seed and without its output fields (``TrainerConfig.run_identity``),
    the profile's name, base checkpoint, task and task arguments, and its LoRA adapters when set."""
    record = {"algo": asdict(algo), "config": replace(prof.config, seed=int(seed)).run_identity(),
              "profile": prof.name, "base": prof.base, "task": prof.task, "task_kwargs": dict(prof.task_kwargs)}
    if getattr(prof, "lora", None) is not None:
        record["lora"] = prof.lora.to_dict()
    return _plain(record)


def _flat(record: dict) -> dict:
    """A record's fields by the names a user sets them with: the algorithm's and the trainer
    configuration's fields by their own names (an algorithm's ``params`` by the hyper-parameters'
    names, its ``name`` as ``"algorithm name"``), the rest as they are."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if key not in ("algo", "config") or not isinstance(value, dict):
            out[key] = value
            continue
        for k, v in value.items():
            if key == "algo" and k == "params" and isinstance(v, dict):
                out.update(v)
            else:
                out["algorithm name" if (key, k) == ("algo", "name") else k] = v
    return out


def _record_diffs(saved: dict, requested: dict) -> list[str]:
    """``"lr: 0.0003 in the checkpoint, 0.0001 requested"`` for every field that differs between two
    records (:func:`_run_record`; a field only ``saved`` lacks counts only when ``saved`` has its group)."""
    a, b = _flat(saved), _flat(requested)
    out = []
    for key in list(b) + [k for k in a if k not in b]:
        if a.get(key, "absent") != b.get(key, "absent"):
            was = repr(a[key]) if key in a else "absent"
            now = repr(b[key]) if key in b else "absent"
            out.append(f"{key}: {was} in the checkpoint, {now} requested")
    return out


def _saved_record(directory: Path) -> dict | None:
    """The record of the run in a seed's directory: its ``run.json``, else what its latest checkpoint's
    ``state.json`` says (algorithm and trainer configuration), else ``None``. The algorithm's fields are
    migrated to today's names (:func:`grpo_lab.algo.algorithms.migrate_fields`).

    Raises:
        ValueError: ``run.json`` or that ``state.json`` is not valid JSON.
    """
    path = directory / RUN_FILE
    if not path.is_file():
        ckpt = latest_checkpoint(directory)
        if ckpt is None:
            return None
        path = ckpt / "state.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"run: {path} cannot be read ({exc}); delete {directory} to start that seed over") from None
    if path.name == RUN_FILE:
        return {**data, "algo": migrate_fields(data["algo"])} if isinstance(data, dict) and isinstance(data.get("algo"), dict) else data
    return _plain({"algo": migrate_fields(data["algo"]),
                   "config": TrainerConfig.from_dict(data["config"]).run_identity()})


def _check_seed_dir(directory: Path, record: dict, steps: int, resume: bool) -> None:
    """Before a seed trains into ``directory``: without ``resume`` it must hold no earlier run; with
    ``resume`` an earlier run there must be this one and its latest checkpoint no later than ``steps``.

    Raises:
        ValueError: a checkpoint directory without ``state.json``; an earlier run without ``resume`` (the message
            says how to continue or start over); a
            run that differs from ``record`` (naming every field that differs, e.g. ``lr: 0.0003 in the
            checkpoint, 0.0001 requested``); a checkpoint past ``steps``.
    """
    _check_checkpoint_dirs(directory)
    saved = _saved_record(directory)
    if saved is None:
        return
    if not resume:
        raise ValueError(f"run: {directory} holds an earlier run; pass resume=True (command line: --resume) to "
                         "continue it, or delete that directory (or choose another output_dir) to start over")
    diffs = _record_diffs(saved, record)
    if diffs:
        raise ValueError(f"run: cannot resume {directory}: it holds another run than the one requested; "
                         + "; ".join(diffs))
    found = periodic_checkpoints(checkpoints_dir(directory))
    if found and found[-1][0] > steps and _finished_rows(directory, steps) is None:
        raise ValueError(f"run: cannot resume {directory} to steps={steps}: its latest checkpoint "
                         f"{found[-1][1].name} is past it; ask for at least {found[-1][0]} steps")


def _check_checkpoint_dirs(directory: Path) -> None:
    """Before a seed trains: a ``step-NNNNNN`` directory under its ``checkpoints/`` without ``state.json`` (a
    partial copy: a save never leaves one) would be found only at the next save over it; refused now.

    Raises:
        ValueError: naming the directory to delete and the checkpoint the run then resumes from.
    """
    ckpts = checkpoints_dir(directory)
    if not ckpts.is_dir():
        return
    bad = sorted(d for d in ckpts.iterdir() if d.is_dir() and re.fullmatch(r"step-\d{6,}", d.name)
                 and not (d / "state.json").is_file())
    if bad:
        latest = latest_checkpoint(directory)
        then = f"from {latest.name}" if latest is not None else "from step 0"
        raise ValueError(f"run: {bad[0]} is not a complete checkpoint (no state.json; a partial copy?); delete it "
                         f"(rm -r {bad[0]}) and the run resumes {then}")


def _check_run_dirs(jobs: Sequence[tuple], steps: int, resume: bool) -> None:
    """:func:`_check_seed_dir` for every ``(algo, seed, profile)`` job that has an ``output_dir``, before
    any trains (the same errors)."""
    for algo, seed, prof in jobs:
        if prof.config.output_dir is not None:
            _check_seed_dir(seed_dir(prof.config.output_dir, algo.name, seed), _run_record(algo, prof, seed),
                            steps, resume)


def _write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (a temporary file renamed into place)."""
    write_text_atomically(path, json.dumps(data, indent=1, default=_json_default))


def _start_seed(directory: Path, record: dict) -> None:
    """Write the seed's ``run.json`` (its :func:`_run_record`) unless it is there already."""
    if not (directory / RUN_FILE).is_file():
        _write_json(directory / RUN_FILE, record)


def _finished_rows(directory: Path, steps: int) -> list[dict] | None:
    """The history in the seed's ``result.json`` when it holds a run of exactly ``steps`` steps, else ``None``."""
    try:
        data = json.loads((directory / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("steps") != steps or not isinstance(data.get("rows"), list):
        return None
    return data["rows"]


def _unreadable_result(directory: Path) -> str | None:
    """Why the seed's ``result.json``, which exists, cannot be read back (not JSON, or not a history), or
    ``None`` (readable, or absent)."""
    path = directory / RESULT_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or not is_int(data.get("steps")):
        return "not a history (no 'steps' and 'rows')"
    return None


def _finish_seed(directory: Path, steps: int, rows: list[dict]) -> None:
    """Write the seed's ``result.json``: its ``steps`` and history."""
    _write_json(directory / RESULT_FILE, {"steps": steps, "rows": rows})


def _runs_in(output_dir: str | os.PathLike) -> dict[str, list[int]]:
    """The runs an output directory holds: ``{algorithm name: [seeds]}`` from each seed's ``run.json``."""
    found: dict[str, list[int]] = {}
    for path in sorted(Path(output_dir).glob(f"*/seed-*/{RUN_FILE}")):
        try:
            record = json.loads(path.read_text())
            name, seed = record["algo"]["name"], record["config"]["seed"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found.setdefault(name, []).append(seed)
    return found


def _remove_seed_dirs(output_dir: str | os.PathLike) -> None:
    """Delete the seed directories of ``output_dir`` that hold a run (a ``run.json``), and the algorithm
    directories that leaves empty; nothing else is touched. ``RunDirectoryLocked`` while a run writes there."""
    with run_lock(output_dir):  # not under a run that is writing there
        _remove_seed_dirs_unlocked(output_dir)


def _remove_seed_dirs_unlocked(output_dir) -> None:
    for path in Path(output_dir).glob(f"*/seed-*/{RUN_FILE}"):
        shutil.rmtree(path.parent, ignore_errors=True)
        try:
            path.parent.parent.rmdir()
        except OSError:
            pass
