"""Checkpoints: everything a run needs to continue exactly (weights, optimiser states, every RNG state, step
counts, history, the task), written atomically (:func:`checkpoint_state`, :func:`write_checkpoint`) and read
back with every file checked first (:func:`load_checkpoint`, :func:`restore_training_state`); the periodic
checkpoints of ``TrainerConfig.save_every`` (:func:`periodic_checkpoint`, :func:`prune_checkpoints`).
``Trainer.save`` and ``Trainer.resume`` call them.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import warnings
from dataclasses import asdict, dataclass, is_dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..algo.algorithms import Algorithm
from ..policy.lora import (BASE_FILE, AdapterDisabled, BaseModelNotFound, adapter_checkpoint_missing, base_record)
from ..policy.models import CriticModel, _progress_bars, is_peft_model
from ..tasks import validate_task
from ..tasks.base import check_fingerprint, task_fingerprint
from ..algo.checks import is_int
from .config import OUTPUT_FIELDS, TrainerConfig
from .precision import Precision

__all__ = ["CHECKPOINTS_DIR", "CheckpointWriteError", "checkpoint_name", "periodic_checkpoints", "checkpoint_state", "write_checkpoint",
           "load_checkpoint", "restore_training_state", "LoadedCheckpoint", "check_checkpointing",
           "periodic_checkpoint", "prune_checkpoints"]

#: The subdirectory of ``TrainerConfig.output_dir`` that periodic checkpoints go to
#: (``TrainerConfig.save_every``), one directory ``step-NNNNNN`` per checkpoint.
CHECKPOINTS_DIR = "checkpoints"

_STEP_DIR = re.compile(r"step-(\d{6,})")


def checkpoint_name(step: int) -> str:
    """The directory name of the periodic checkpoint after ``step`` steps: ``step-000010`` (six digits at
    least, so that the names sort by step)."""
    return f"step-{int(step):06d}"


def periodic_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """The finished periodic checkpoints in ``directory`` (a ``checkpoints/`` folder) as ``(step, path)``,
    oldest first: the ``step-NNNNNN`` directories that hold a ``state.json``. The hidden ``.step-*.saving``
    directory a save killed mid-way leaves behind is not one (:meth:`~grpo_lab.training.trainer.Trainer.save` writes there
    and renames it only once complete). ``[]`` when ``directory`` does not exist."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), d) for d in directory.iterdir()
             if (m := _STEP_DIR.fullmatch(d.name)) and (d / "state.json").is_file()]
    return sorted(found)


def check_checkpointing(config: TrainerConfig) -> None:
    """At construction: ``TrainerConfig.save_every > 0`` needs an ``output_dir`` to write to.

    Raises:
        ValueError: ``save_every`` is set and ``output_dir`` is ``None`` (the message names both).
    """
    if config.save_every and config.output_dir is None:
        raise ValueError(f"Trainer: TrainerConfig.save_every={config.save_every} writes checkpoints under "
                         "TrainerConfig.output_dir, which is None; set output_dir (a directory) or save_every=0")


def periodic_checkpoint(config: TrainerConfig, step: int, final: bool) -> Path | None:
    """Where the periodic checkpoint after ``step`` steps goes, ``output_dir/checkpoints/step-NNNNNN``, when
    ``config.save_every`` asks for one: every ``save_every`` steps and after the last step of a ``train`` call
    (``final``); ``None`` otherwise (also with ``save_every=0`` or no ``output_dir``)."""
    if not config.save_every or config.output_dir is None or (step % config.save_every and not final):
        return None
    return Path(config.output_dir) / CHECKPOINTS_DIR / checkpoint_name(step)


def checkpoint_state(*, step: int, opt_steps: int, config: TrainerConfig, algo: Algorithm, task,
                     rng: np.random.Generator, value_warmup_rows: list, amp: Precision) -> dict:
    """The content of ``state.json``: step, optimiser steps, config, algorithm, task, the numpy and python
    RNG states, the value-warm-up rows and the float16 gradient scaler's state."""
    return {
        "step": step,
        "opt_steps": opt_steps,
        "config": config.to_dict(),
        "algo": asdict(algo),
        "task": _task_state(task),
        "numpy_rng": rng.bit_generator.state,
        "python_rng": _py_state_to_json(random.getstate()),
        "value_warmup_rows": value_warmup_rows,
        "grad_scaler": amp.scaler.state_dict() if amp.scaler.is_enabled() else None,
        "amp_skipped_steps": amp.skipped_steps,
    }


def write_checkpoint(path: str | Path, state: dict, rows: list, *, task, policy, tokenizer, optimizer,
                     ref_policy=None, value_model=None, value_optimizer=None, progress: bool = False) -> Path:
    """Write the checkpoint directory ``path`` atomically (``Trainer.save``): ``state`` (:func:`checkpoint_state`)
    as ``state.json``, the history ``rows`` as ``history.json``, the weights and optimiser states (written in a
    sibling ``.NAME.saving`` that replaces ``path`` once complete). ``progress``: transformers' writing bar.
    Returns ``path``; raises as ``Trainer.save`` says."""
    validate_task(task)
    final = Path(path)
    where = Path(os.path.abspath(final))
    if where.exists() and not where.is_dir():
        raise FileExistsError(f"Trainer.save: {final} is a file; a checkpoint is a directory")
    if where.is_dir() and not (where / "state.json").is_file() and any(where.iterdir()):
        raise FileExistsError(f"Trainer.save: {final} is a non-empty directory that is not a trainer checkpoint "
                              "(no state.json); refusing to replace it: choose a new path or an empty directory")
    state_text = json.dumps(state, indent=2, default=_json_default)
    base = base_record(policy) if is_peft_model(policy) else None  # LoRA: what resume loads again
    try:
        history_text = json.dumps(rows, default=_json_default)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"Trainer.save: the history cannot be written as JSON ({exc}); "
                         "nothing was written") from None
    tmp = where.with_name(f".{where.name}.saving")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a process killed while saving
    try:
        tmp.mkdir(parents=True)
        _write_checkpoint_files(tmp, policy, tokenizer, optimizer, ref_policy, value_model, value_optimizer, progress)
        if base is not None:
            (tmp / "policy" / BASE_FILE).write_text(json.dumps(base, indent=2))
        (tmp / "state.json").write_text(state_text)
        (tmp / "history.json").write_text(history_text)
        _replace_dir(tmp, where)
    except (OSError, RuntimeError) as exc:  # torch.save's "[enforce fail at inline_container.cc]" on a full disk
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(_write_failure(final, exc)) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, most often); nothing was left behind, the previous
    checkpoints are intact, and a run resumes from the newest once space is freed (``resumable``)."""

    resumable = True


def _write_failure(final: Path, exc: BaseException) -> str:
    """The one line of :class:`CheckpointWriteError`: the checkpoint, the cause, the free space, what is intact."""
    detail = " ".join(str(exc).split())[:200] or type(exc).__name__
    try:
        free = f"{shutil.disk_usage(final.parent).free / 2**20:.0f} MiB free there"
    except OSError:
        free = "free space unknown"
    previous = periodic_checkpoints(final.parent)
    kept = (f"the previous checkpoint {previous[-1][1]} is intact" if previous else "no earlier checkpoint was touched")
    return (f"could not write the checkpoint {final} (disk full? {free}; {type(exc).__name__}: {detail}); nothing "
            f"was left behind and {kept}: free some space and resume (--resume)")


def _write_checkpoint_files(tmp: Path, policy, tokenizer, optimizer, ref_policy, value_model, value_optimizer,
                            progress: bool) -> None:
    """Write the weights, the tokenizer, the optimiser states and the torch RNG states into the new
    checkpoint directory ``tmp`` (:func:`write_checkpoint` adds ``state.json`` and ``history.json``)."""
    from safetensors.torch import save_file

    with _progress_bars(progress):  # transformers' "Writing model shards" bar
        policy.save_pretrained(tmp / "policy", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "policy")
        if ref_policy is not None and not isinstance(ref_policy, AdapterDisabled):
            ref_policy.save_pretrained(tmp / "ref", safe_serialization=True)
    if value_model is not None:
        save_file({k: v.contiguous() for k, v in value_model.state_dict().items()}, tmp / "value.safetensors")
        if isinstance(value_model, CriticModel):  # rebuildable without the caller's help
            value_model.save(tmp / "critic")
        torch.save(value_optimizer.state_dict(), tmp / "value_optimizer.pt")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save({"torch": torch.random.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}, tmp / "rng.pt")


@dataclass
class LoadedCheckpoint:
    """What :func:`load_checkpoint` read: the parts ``Trainer.resume`` builds the trainer from, ``state``
    (``state.json``), the history ``rows`` and whether the checkpoint holds a critic (``has_value``)."""

    path: Path
    policy: Any
    tokenizer: Any
    ref_policy: Any
    task: Any
    algo: Algorithm
    config: TrainerConfig
    value_model: Any
    state: dict
    rows: list
    has_value: bool


def load_checkpoint(path: str | Path, *, task=None, device: str | None = None, value_model=None,
                    output: dict[str, Any] | None = None, strict: bool = False) -> LoadedCheckpoint:
    """Read and check the checkpoint ``path`` (every file looked for before anything is loaded) and load its
    models; the arguments and errors are ``Trainer.resume``'s."""
    path = Path(path)
    state, rows, has_value, value_model = _read_checkpoint_state(path, value_model)
    task = _resume_task(state["task"], task, path)
    check_fingerprint(state["task"].get("fingerprint"), task, where=str(path), strict=strict)
    config = TrainerConfig.from_dict(state["config"])
    if device is not None:
        config = replace(config, device=device)
    config = _with_outputs(config, output)
    algo = _saved_algorithm(state["algo"], path)
    adapter = (path / "policy" / "adapter_config.json").is_file()  # LoRA: the reference is the base (no ref/)
    if algo.uses_kl and not adapter and not (path / "ref").is_dir():
        raise ValueError(f"Trainer.resume: {path} has no ref/ but {algo.name!r} has a KL term; the reference "
                         "policy cannot be rebuilt from the trained weights")
    missing = _missing_checkpoint_files(path, ref=algo.uses_kl and (path / "ref").is_dir(), value=has_value,
                                        adapter=adapter)
    if missing:
        raise ValueError(f"Trainer.resume: corrupt checkpoint, {path} lacks " + ", ".join(missing)
                         + " (Trainer.save writes them all)")
    policy, tokenizer, ref = _load_checkpoint_models(path, config, algo, value_model if has_value else None,
                                                     adapter=adapter)
    return LoadedCheckpoint(path, policy, tokenizer, ref, task, algo, config, value_model, state, rows, has_value)


def restore_training_state(path: Path, state: dict, *, optimizer, value_optimizer, rng: np.random.Generator,
                           amp: Precision) -> None:
    """Load into a freshly built trainer's parts what they lack from the checkpoint ``path``: the optimiser states
    (``value_optimizer``: ``None`` when the checkpoint has no critic), the torch, CUDA, numpy (into ``rng``) and
    python RNG states, and the float16 gradient scaler (into ``amp``); ``state`` is ``state.json``.

    Raises:
        ValueError: ``optimizer.pt``, ``value_optimizer.pt`` or ``rng.pt`` is missing or corrupt.
    """
    optimizer.load_state_dict(_load_pt(path / "optimizer.pt"))
    if value_optimizer is not None:
        value_optimizer.load_state_dict(_load_pt(path / "value_optimizer.pt"))
    saved = _load_pt(path / "rng.pt")
    torch.random.set_rng_state(saved["torch"])
    if saved["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])
    rng.bit_generator.state = state["numpy_rng"]
    random.setstate(_py_state_from_json(state["python_rng"]))
    if state.get("grad_scaler") and amp.scaler.is_enabled():
        amp.scaler.load_state_dict(state["grad_scaler"])
    amp.skipped_steps = int(state.get("amp_skipped_steps", 0))


def _with_outputs(config: TrainerConfig, output: dict[str, Any] | None) -> TrainerConfig:
    """``config`` with the output fields ``output`` replaced (``Trainer.resume``'s ``output``).

    Raises:
        ValueError: a key of ``output`` is not in ``OUTPUT_FIELDS``.
    """
    if not output:
        return config
    bad = sorted(set(output) - set(OUTPUT_FIELDS))
    if bad:
        raise ValueError(f"Trainer.resume: output= may replace only the output fields {list(OUTPUT_FIELDS)}, got "
                         f"{bad}; the other fields are the run's own and come from the checkpoint")
    return replace(config, **output)


def _read_checkpoint_state(path: Path, value_model):
    """``state.json`` and ``history.json`` of the checkpoint ``path``, whether it has a value model, and the
    value model to load it into (``value_model``, or the :class:`~grpo_lab.policy.models.CriticModel` the
    checkpoint rebuilds). Returns ``(state, rows, has_value, value_model)``.

    Raises:
        FileNotFoundError: ``path`` has no ``state.json``.
        ValueError: either file is corrupt, or the checkpoint holds a value model of the caller's own
            and ``value_model`` is ``None``.
    """
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"Trainer.resume: {path} has no state.json (not a trainer checkpoint)")
    state = _read_json(path / "state.json", ("step", "config", "algo", "task", "numpy_rng", "python_rng"))
    rows = _read_json(path / "history.json", None)
    has_value = (path / "value.safetensors").is_file()
    if has_value and value_model is None and (path / "critic" / "critic.json").is_file():
        value_model = _load_checkpoint_part(path / "critic", lambda: CriticModel.load(path / "critic"))
    if has_value and value_model is None:
        raise ValueError(f"Trainer.resume: {path} holds a value model of your own; pass value_model= (a fresh one "
                         "of the same architecture)")
    if not isinstance(rows, list) or not is_int(state["step"]) or state["step"] < 0:
        raise ValueError(f"Trainer.resume: {path} has a corrupt step count or history (state.json, history.json)")
    return state, rows, has_value, value_model


def _load_checkpoint_models(path: Path, config: TrainerConfig, algo: Algorithm, value_model, *, adapter: bool = False):
    """The weights of the checkpoint ``path``: loads ``value.safetensors`` into ``value_model`` (when not
    ``None``), then the policy and its tokenizer from ``policy/`` (with ``adapter``, a LoRA policy:
    :func:`grpo_lab.policy.lora.load_adapter_policy`) and, when ``algo`` has a KL term and ``ref/`` exists, the
    reference policy from it, on ``config.device``. Returns ``(policy, tokenizer, ref or None)``.

    Raises:
        ValueError: a file is missing or damaged (named in the message).
        grpo_lab.policy.lora.BaseModelNotFound: the base model of a LoRA checkpoint cannot be loaded here.
    """
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from ..policy.models import load_policy

    if value_model is not None:
        value_model.load_state_dict(_load_checkpoint_part(path / "value.safetensors",
                                                          lambda: load_file(path / "value.safetensors")))
    from ..policy.lora import load_adapter_policy

    load = load_adapter_policy if adapter else load_policy
    policy, tokenizer = _load_checkpoint_part(
        path / "policy", lambda: load(path / "policy", device=config.device, progress=config.progress))
    ref = None
    if algo.uses_kl and (path / "ref").is_dir():
        def load_ref():
            with _progress_bars(config.progress):
                return AutoModelForCausalLM.from_pretrained(path / "ref", use_safetensors=True)

        ref = _load_checkpoint_part(path / "ref", load_ref).to(config.device)
    return policy, tokenizer, ref



def _task_state(task) -> dict:
    """The ``task`` entry of ``state.json``: :func:`grpo_lab.tasks.task_spec` plus ``"registered":
    True`` for a registered dataclass task; otherwise ``{"name", "class", "params",
    "registered": False}`` with ``params`` the dataclass fields, or ``None`` (not a dataclass).
    ``params`` that JSON cannot hold are stored as ``None`` (``resume`` then needs ``task=``).
    Never raises for a task that passes :func:`grpo_lab.tasks.validate_task`."""
    from ..tasks import _class_path, task_spec

    try:
        spec = dict(task_spec(task), registered=True)
    except ValueError:
        try:
            params = asdict(task) if is_dataclass(task) else None
        except Exception:  # a field that cannot be copied (a lock, a file handle): described by name only
            params = None
        spec = {"name": task.name, "class": _class_path(type(task)), "params": params, "registered": False}
    if spec["params"] is not None:
        try:
            spec["params"] = json.loads(json.dumps(spec["params"], default=_json_default))
        except (TypeError, ValueError):
            spec["params"] = None
    try:  # the task's data and reward functions, compared on resume (check_fingerprint)
        spec["fingerprint"] = task_fingerprint(task)
    except Exception as exc:  # the task's own fingerprint() failed: saved without one (resume notes it)
        spec["fingerprint"] = None
        warnings.warn(f"Trainer.save: no fingerprint of the task's data recorded ({type(exc).__name__}: {exc})",
                      RuntimeWarning, stacklevel=3)
    return spec


def _resume_task(spec, task, path: Path):
    """The task a resumed trainer continues with: ``task`` when given (a ``RuntimeWarning`` names
    what differs from the saved ``spec``), else the saved task rebuilt from the registry.

    Raises:
        ValueError: ``spec`` is corrupt, or the saved task cannot be rebuilt and ``task`` is ``None``
            (the message says why and names ``task=`` and ``register_task``).
    """
    from ..tasks import TASKS, _class_path, task_from_spec

    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"Trainer.resume: {path / 'state.json'} has no valid task entry ({spec!r:.80}); "
                         "the checkpoint is corrupt")
    name, stored, params = spec["name"], spec.get("class"), spec.get("params")
    if task is not None:
        validate_task(task)
        diffs = []
        if task.name != name:
            diffs.append(f"name {task.name!r} (saved {name!r})")
        if stored is not None and _class_path(type(task)) != stored:
            diffs.append(f"class {_class_path(type(task))} (saved {stored})")
        elif isinstance(params, dict) and is_dataclass(task):
            now = _task_state(task)["params"] or {}
            changed = sorted(k for k in set(now) | set(params) if now.get(k) != params.get(k))
            if changed:
                diffs.append("fields " + ", ".join(f"{k}={now.get(k)!r} (saved {params.get(k)!r})" for k in changed))
        if diffs:
            warnings.warn(f"Trainer.resume: the task passed as task= differs from the one saved in {path}: "
                          + "; ".join(diffs) + "; the run continues with the task passed, not as it would have",
                          RuntimeWarning, stacklevel=3)
        return task
    registered = TASKS.get(name)
    if registered is None:
        reason = f"no task named {name!r} is registered in this process (registered: {sorted(TASKS)})"
    elif stored is not None and _class_path(registered) != stored:
        reason = f"{name!r} is registered to {_class_path(registered)}, not to {stored}"
    elif not isinstance(params, dict):
        reason = "its fields were not stored (it is not a dataclass with fields JSON can hold)"
    else:
        try:
            return task_from_spec(spec)
        except Exception as exc:  # the class's own constructor rejected the stored fields
            reason = f"rebuilding it from the stored fields failed ({type(exc).__name__}: {exc})"
    short = stored.rsplit(".", 1)[-1] if stored else "YourTask"
    register = (f", or register its class first: grpo_lab.tasks.register_task({name!r}, {short})"
                if registered is None or (stored is not None and _class_path(registered) != stored) else "")
    raise ValueError(f"Trainer.resume: {path} was saved with the task {name!r}" + (f" ({stored})" if stored else "")
                     + f", which cannot be rebuilt here: {reason}. Pass the task object: "
                     f"Trainer.resume(path, task={short}(...)){register}")


def prune_checkpoints(directory: Path, keep: int | None) -> None:
    """Delete all but the newest ``keep`` periodic checkpoints of ``directory`` (``None``: keep all),
    and the hidden ``.step-*.saving`` directories that saves killed mid-way left there."""
    found = periodic_checkpoints(directory)
    stale = [d for _, d in found[:-keep]] if keep is not None and len(found) > keep else []
    stale += [d for d in directory.iterdir()
              if d.is_dir() and d.name.startswith(".step-") and d.name.endswith(".saving")]
    for d in stale:
        shutil.rmtree(d, ignore_errors=True)


def _replace_dir(new: Path, final: Path) -> None:
    """Move the finished directory ``new`` to ``final``. An older ``final`` is first renamed to
    ``.NAME.old`` and deleted once ``new`` is in place; if moving ``new`` fails, it is renamed back."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if not final.exists():
        new.rename(final)
        return
    final.rename(old)
    try:
        new.rename(final)
    except BaseException:
        old.rename(final)
        raise
    shutil.rmtree(old, ignore_errors=True)


#: Weight files of a ``save_pretrained`` directory (one file, or the index of a sharded one).
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def _saved_algorithm(fields: dict, path) -> Algorithm:
    """The :class:`~grpo_lab.algo.algorithms.Algorithm` a checkpoint stored (its fields and ``params``; a checkpoint
    written before ``clip`` was renamed ``surrogate`` loads through :meth:`Algorithm.from_dict`).

    Raises:
        ValueError: a choice or hyper-parameter the registries do not know, with the hint that the
            module registering it must be imported first (a variant from outside the package).
    """
    try:
        return Algorithm.from_dict(fields)
    except ValueError as exc:
        raise ValueError(f"Trainer.resume: {path} was saved with an algorithm this process cannot rebuild: {exc}. "
                         "If a module of yours registered that choice (or declared that hyper-parameter), import it "
                         "before Trainer.resume (on the command line: --import MODULE)") from None


def _missing_checkpoint_files(path: Path, *, ref: bool, value: bool, adapter: bool = False) -> list[str]:
    """The files of a :meth:`Trainer.save` checkpoint that ``path`` lacks (relative names, ``[]``
    when none): ``optimizer.pt``, ``rng.pt``, ``value_optimizer.pt`` (``value``), and for ``policy/``
    (and ``ref/`` when ``ref``) ``config.json`` and the safetensors weights; for ``policy/`` also the
    tokenizer (``grpo_lab.policy.models._missing_tokenizer_files``). With ``adapter`` (a LoRA checkpoint)
    ``policy/`` holds the adapters instead (:func:`grpo_lab.policy.lora.adapter_checkpoint_missing`). Reads
    nothing but the directory."""
    from ..policy.models import _missing_tokenizer_files

    names = ["optimizer.pt", "rng.pt"] + (["value_optimizer.pt"] if value else [])
    missing = [n for n in names if not (path / n).is_file()]
    if adapter:
        missing += adapter_checkpoint_missing(path / "policy")
    for sub in (["policy"] if not adapter else []) + (["ref"] if ref else []):
        if not (path / sub / "config.json").is_file():
            missing.append(f"{sub}/config.json")
        if not any((path / sub / n).is_file() for n in _WEIGHT_FILES):
            missing.append(f"{sub}/model.safetensors")
    if (path / "policy").is_dir() and not adapter:
        missing += [f"policy/{n}" for n in _missing_tokenizer_files(path / "policy")]
    return missing


def _load_checkpoint_part(what: Path, load):
    """``load()``; a ``ValueError`` naming ``what`` when it fails because a file is missing or
    damaged (``OSError``, a safetensors or JSON decoding error). Other errors pass unchanged (a
    CUDA device without CUDA is the caller's mistake, not a corrupt checkpoint)."""
    from safetensors import SafetensorError

    try:
        return load()
    except BaseModelNotFound:  # not a damaged file: the LoRA checkpoint's base is elsewhere (its message says where)
        raise
    except (OSError, SafetensorError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        detail = " ".join(str(exc).split())[:300]
        raise ValueError(f"Trainer.resume: {what} cannot be loaded ({type(exc).__name__}: {detail}); "
                         "the checkpoint is corrupt") from None


def _load_pt(path: Path):
    """``torch.load(path, weights_only=True)``; ``ValueError`` naming the file when it is missing or corrupt."""
    try:
        return torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"Trainer.resume: corrupt checkpoint, {path} is missing") from None
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, ... for a damaged file
        raise ValueError(f"Trainer.resume: {path} cannot be read as a checkpoint tensor file "
                         f"({type(exc).__name__}); the checkpoint is corrupt") from None


def _read_json(path: Path, keys: tuple | None):
    """Parse a checkpoint's JSON file; ``ValueError`` naming the file when it is corrupt or lacks ``keys``."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"Trainer.resume: corrupt checkpoint, {path} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"Trainer.resume: {path} is not valid JSON ({exc}); the checkpoint is corrupt") from None
    if keys is not None:
        missing = [k for k in keys if not isinstance(data, dict) or k not in data]
        if missing:
            raise ValueError(f"Trainer.resume: {path} lacks {missing}; the checkpoint is corrupt")
    return data


def _json_default(o: Any):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def _py_state_to_json(state):
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _py_state_from_json(state):
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
