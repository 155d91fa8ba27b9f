"""The command line: ``python -m grpo_lab`` (or the ``grpo-lab`` console script).

Train one algorithm preset for several seeds and write a results file with its provenance::

    python -m grpo_lab GRPO --steps 2 --seeds 0                 # a quick try, results under runs/
    python -m grpo_lab DAPO --seeds 0 1 2 --jobs 2 --set eps_high=0.3 --out runs/dapo.json
    python -m grpo_lab GSPO --model arithmetic-moe-base --set routing_replay=true --set minibatches=2
    python -m grpo_lab GRPO --import my_task.py --task mytask   # a task of your own (register_task)
    python -m grpo_lab GRPO --lora-r 8 --lora-alpha 16 --lora-targets q_proj v_proj --set lr=1e-3   # LoRA (peft)
    python -m grpo_lab --config run.yaml --steps 5              # options from a YAML file, a flag on top
    python -m grpo_lab list                                     # presets, tasks, profiles, models, --set keys
    python -m grpo_lab check-config grpo.yaml                   # what a TRL / verl config computes (the linter)
    python -m grpo_lab export DAPO --to verl --task gsm8k --model Qwen/Qwen2.5-0.5B-Instruct --out job/ --approximate

What each part maps to (``--help`` of each command gives the details):

* ``train`` (the default command): a thin layer over :func:`grpo_lab.experiments.run` and
  :func:`grpo_lab.experiments.save_results`. ``--profile`` fixes the scale, ``--model`` / ``--task``
  replace its checkpoint and task, each ``--set KEY=VALUE`` overrides one field of
  :class:`~grpo_lab.training.trainer.TrainerConfig` or of the preset's
  :class:`~grpo_lab.algo.algorithms.Algorithm` (parsed with the field's type), ``--lora-r``
  trains LoRA adapters (:class:`grpo_lab.policy.lora.LoraSpec`; the KL reference is the base),
  ``--report-to`` picks the trackers (:mod:`grpo_lab.training.callbacks`).
* ``--import MODULE``: a module name or ``.py`` path imported first (and in ``--jobs`` workers), so
  what it registers (:func:`grpo_lab.tasks.register_task`, a registry entry) is a valid
  ``--task`` / ``--set`` value.
* ``--config FILE``: options from YAML / JSON (:mod:`grpo_lab.experiments.config_files`), with
  ``trainer:`` and ``algorithm:`` sections; flags win over the file, ``--set`` over its sections.
  The resolved configuration is written to ``<out>/config.yaml``; ``--config`` that file repeats the run.
* outputs: ``--out`` (refused if it exists, unless ``--overwrite`` / ``--resume``) and its run
  directory (:func:`grpo_lab.experiments.run_dirs.run_directory`), one ``<preset>/seed-<k>`` per
  seed; ``--resume`` continues a killed run of the same settings to the uninterrupted history.
* ``check-config``: :func:`grpo_lab.export.lint.check_config`. ``export``:
  :func:`~grpo_lab.export.jobs.trl_job` / :func:`~grpo_lab.export.jobs.verl_job`
  (``--approximate``: each difference a warning).
* what a run prints (step lines, the summary, the figure): :mod:`grpo_lab.cli.report`.

Errors: a user mistake (a ``ValueError`` or ``OSError`` from the package: an unknown name, a bad
value, a missing model, an unwritable path, a failing ``--import``) prints one line
``PROG: error: ...`` and exits 2; any other exception one line and exit 1; Ctrl-C exit 130 after
printing how to resume; SIGTERM (a preemption) exit 143 after the step in progress and a checkpoint
(:class:`~grpo_lab.training.trainer.Terminated`), printing how to resume; ``--debug`` adds the traceback. A warning prints as
``PROG: warning: Category: message``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import logging
import importlib
import inspect
import os
import re
import shlex
import sys
import tempfile
import textwrap
import time
import traceback
import types
import typing
import warnings
from pathlib import Path
from typing import Any, Sequence

__all__ = ["main", "build_parser", "parse_set", "parse_value", "settable_fields", "hyperparameter_keys", "default_out",
           "resolve_model", "load_user_module", "unknown_characters", "UsageError", "lora_option", "LORA_TARGETS",
           "report_to_option", "task_from_arguments", "flag_hints",
           "task_warnings"]

#: ``--set`` keys that exist as fields but are set by an option of their own
_RESERVED = {"seed": "use --seeds (one run per seed)", "progress": "use --progress / --no-progress"}
_RESERVED["report_to"] = "use --report-to NAME [NAME ...] (or --report-to none)"


#: the same fields in a ``--config`` file: where they go instead
_FILE_RESERVED = {"seed": "use seeds: [0, 1, 2] at the top level (one run per seed)",
                  "progress": "use progress: true/false at the top level",
                  "report_to": "use report_to: [jsonl, tensorboard] at the top level (or report_to: [none])"}


class UsageError(ValueError):
    """A mistake in the command line (printed as one line, exit status 2)."""


# ---------------------------------------------------------------------------------------- --set
def settable_fields() -> dict[str, tuple[str, Any, Any]]:
    """The keys ``--set`` accepts: every field of :class:`~grpo_lab.training.trainer.TrainerConfig` and of
    :class:`~grpo_lab.algo.algorithms.Algorithm`, except ``seed`` and ``progress`` (``--seeds``,
    ``--progress``) and ``params``, then every hyper-parameter that a registered function declares
    beyond those fields (:func:`hyperparameter_keys`, owner ``"Algorithm.params"``; the preset's
    functions must declare it, which ``preset.replace`` checks).

    Returns:
        ``{key: (owner, type_hint, default)}``, ``owner`` ``"TrainerConfig"`` or ``"Algorithm"``,
        ``type_hint`` the evaluated annotation (``float``, ``int | None``, ``Optional[str]``, ``tuple``),
        ``default`` the dataclass default (the profile or preset may set another value).
    """
    from ..algo.algorithms import Algorithm
    from ..training.trainer import TrainerConfig

    out: dict[str, tuple[str, Any, Any]] = {}
    for cls in (TrainerConfig, Algorithm):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in _RESERVED or not f.init or (cls is Algorithm and f.name == "params"):
                continue
            if f.name in out:  # a field of both would be ambiguous: refuse rather than guess
                raise RuntimeError(f"settable_fields: {f.name!r} is a field of both {out[f.name][0]} and "
                                   f"{cls.__name__}")
            default = f.default if f.default is not dataclasses.MISSING else None
            out[f.name] = (cls.__name__, hints[f.name], default)
    for key, (_, hint, default) in hyperparameter_keys().items():
        out.setdefault(key, ("Algorithm.params", hint, default))
    return out


def hyperparameter_keys() -> dict[str, tuple[str, Any, Any]]:
    """The hyper-parameters that the functions registered on the algorithm's axes declare beyond the
    :class:`~grpo_lab.algo.algorithms.Algorithm` fields (:mod:`grpo_lab.algo.hparams`; SAPO's ``tau_pos``, a user
    module's own): ``{name: (where, type_hint, default)}``, ``where`` the first choice declaring it
    (``"surrogate='sapo'"``), ``type_hint`` from the function's annotation (else the default's type)."""
    from ..algo import hparams
    from ..algo.advantages import ADVANTAGE_ESTIMATORS
    from ..algo.algorithms import Algorithm
    from ..algo.objectives import AGGREGATIONS, KL_ESTIMATORS, MISMATCH_CORRECTIONS, RATIOS, SURROGATES

    fields = {f.name for f in dataclasses.fields(Algorithm)}
    out: dict[str, tuple[str, Any, Any]] = {}
    for axis, registry in (("advantage", ADVANTAGE_ESTIMATORS), ("ratio_level", RATIOS), ("surrogate", SURROGATES),
                           ("aggregation", AGGREGATIONS), ("kl", KL_ESTIMATORS), ("mismatch", MISMATCH_CORRECTIONS)):
        for choice, fn in registry.items():
            for part in (fn, *hparams.spec(fn).batch_statistics.values()):
                for name, default in hparams.own_hyperparameters(part).items():
                    if name not in fields and name not in out:
                        out[name] = (f"{axis}={choice!r}", _hint_of(part, name, default), default)
    return out


def _hint_of(fn, name: str, default: Any):
    """The annotation of ``fn``'s parameter ``name`` (evaluated), else the type of ``default`` (float when none)."""
    try:
        return typing.get_type_hints(fn)[name]
    except Exception:  # an annotation that cannot be evaluated, or none
        return type(default) if isinstance(default, (bool, int, float, str)) else typing.Optional[float]


def _split_hint(hint) -> tuple[list, bool]:
    """``(types other than None, whether None is allowed)`` of an annotation."""
    if typing.get_origin(hint) in (typing.Union, getattr(types, "UnionType", typing.Union)):
        args = typing.get_args(hint)
        return [a for a in args if a is not type(None)], type(None) in args
    return [hint], False


def _type_name(hint) -> str:
    """How ``--set`` help and errors describe a field's type (``"float"``, ``"int or none"``)."""
    kinds, nullable = _split_hint(hint)
    names = {bool: "bool (true/false)", int: "int", float: "float", str: "str"}
    name = " or ".join("numbers a,b,..." if (k is tuple or typing.get_origin(k) is tuple) else names.get(k, str(k))
                       for k in kinds)
    return f"{name} or none" if nullable else name


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_value(key: str, text: str, hint) -> Any:
    """``text`` converted to the type ``hint`` of field ``key``.

    ``none`` / ``null`` (any case) is ``None`` where the field allows it; booleans are
    ``true/false``, ``1/0``, ``yes/no``, ``on/off``; ints are decimal (``32``, ``1_000``); floats any
    Python float literal (``1e-4``); tuples comma-separated numbers (``0.9,0.95``); strings as given.

    Raises:
        UsageError: the text is not a value of that type (the message names the key and the type).
    """
    kinds, nullable = _split_hint(hint)
    t = text.strip()
    if nullable and t.lower() in ("none", "null"):
        return None
    kind = kinds[0] if len(kinds) == 1 else None
    is_tuple = kind is tuple or typing.get_origin(kind) is tuple
    if kind not in (bool, int, float, str) and not is_tuple:
        raise UsageError(f"--set {key}: a field of type {hint!r} cannot be set on the command line")
    try:
        if kind is bool:
            if t.lower() in _TRUE | _FALSE:
                return t.lower() in _TRUE
        elif kind is int:
            return int(t, 10)
        elif kind is float:
            return float(t)
        elif is_tuple:
            parts = [p.strip() for p in t.split(",")]
            return tuple(int(p, 10) if p.lstrip("+-").isdigit() else float(p) for p in parts)
        elif t:  # str
            return t
    except ValueError:
        pass
    raise UsageError(f"--set {key}={text}: {key} must be {_type_name(hint)}, got {text!r}")


def parse_set(items: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``--set KEY=VALUE`` items into TrainerConfig and Algorithm overrides, values typed.

    A key given twice takes its last value.

    Returns:
        ``(config_overrides, algorithm_overrides)``: two dicts of field name to typed value.

    Raises:
        UsageError: an item without ``=``, an unknown key (the message names it, suggests a close
            key and lists the valid ones), a TRL / verl option name (one error for all of them: each
            with the grpo_lab field and value that mean the same, :mod:`grpo_lab.export.vocabulary`,
            and the linter ``check-config`` named when there are several), ``seed`` / ``progress``
            (their own options), a renamed field (``clip``: the message gives ``surrogate``), or a value
            that is not of the field's type (:func:`parse_value`).
    """
    from ..algo.algorithms import RENAMED_FIELDS, RENAMED_SURROGATES
    from ..export.vocabulary import combine, explain

    known = settable_fields()
    hyper = hyperparameter_keys()
    cfg: dict[str, Any] = {}
    algo: dict[str, Any] = {}
    foreign: list[tuple[str, str]] = []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set expects KEY=VALUE, got {item!r} (e.g. --set lr=1e-4)")
        if key in _RESERVED:
            raise UsageError(f"--set {key}: {_RESERVED[key]}")
        if key in hyper and known.get(key, ("",))[0] == "TrainerConfig":
            raise UsageError(f"--set {key}: ambiguous, both a TrainerConfig field and a hyper-parameter that "
                             f"{hyper[key][0]} declares; rename that function's parameter")
        if key in RENAMED_FIELDS:
            new = RENAMED_FIELDS[key]
            raise UsageError(f"--set {key}: renamed {new!r} (files written with {key!r} still load): --set "
                             f"{new}={RENAMED_SURROGATES.get(text.strip(), text.strip())}")
        if key not in known:
            said = explain(key, text, style="set")  # a TRL / verl name, or None for a plain typo
            if said is None:
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)  # 0.6 gave save_steps -> adv_eps
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise UsageError(f"--set: unknown key {key!r}{hint}; valid keys: {', '.join(sorted(known))}")
            foreign.append((key, f"--set {key}={text}: {said}"))
            continue
        owner, type_hint, _ = known[key]
        (cfg if owner == "TrainerConfig" else algo)[key] = parse_value(key, text, type_hint)
    if foreign:
        raise UsageError(combine(foreign))
    return cfg, algo


# ---------------------------------------------------------------------------------------- models, paths
def report_to_option(names: Sequence[str] | None) -> dict[str, tuple]:
    """The ``TrainerConfig`` override of ``--report-to NAME [NAME ...]``: ``{}`` when the option is absent
    (the config's default, ``("jsonl",)``), ``{"report_to": ()}`` for ``none``, else the names in order
    (repeats dropped).

    Raises:
        UsageError: ``none`` given together with tracker names.
    """
    if names is None:
        return {}
    if "none" in names and len(set(names)) > 1:
        raise UsageError(f"--report-to: 'none' cannot be combined with tracker names, got {' '.join(names)}")
    return {"report_to": () if "none" in names else tuple(dict.fromkeys(names))}


def _shipped_models() -> list[str]:
    from ..paths import data_dir

    root = data_dir() / "checkpoints"
    return sorted(d.name for d in root.iterdir() if (d / "config.json").is_file()) if root.is_dir() else []


def resolve_model(model: str) -> str:
    """Check ``--model`` before any training: the name of a checkpoint shipped in
    ``data/checkpoints`` (``arithmetic-base``), a local checkpoint directory, or a hub id ``org/name``
    (downloaded when training starts), in the order :func:`grpo_lab.policy.models.load_policy` tries them.

    Returns:
        ``model`` (a local directory with ``~`` expanded).

    Raises:
        UsageError: a directory without ``config.json``, a file, a missing ``DIR/NAME`` whose ``DIR`` exists
            (a path, not a hub id), or a name that is none of the three (the message lists the shipped checkpoints).
    """
    p = Path(model).expanduser()
    shipped = _shipped_models()
    if p.exists():
        if not p.is_dir() or not (p / "config.json").is_file():
            raise UsageError(f"--model {model}: not a checkpoint directory (no config.json in it)")
        return str(p)
    if model in shipped:
        return model
    if model.startswith((".", "/", "~")) or model.count("/") > 1 or (os.sep != "/" and os.sep in model):
        raise UsageError(f"--model {model}: no such directory")
    parts = model.split("/")
    if len(parts) == 2 and parts[0] and Path(parts[0]).is_dir():
        raise UsageError(f"--model {model}: no such directory ({parts[0]}/ exists here, so it is read as a path, "
                         "not a hub id)")
    if len(parts) == 2 and all(parts) and " " not in model:
        return model  # a hub id; load_policy downloads (or finds in the hub cache) when training starts
    close = difflib.get_close_matches(model, shipped, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UsageError(f"--model {model}: no such checkpoint{hint}; give a shipped one ({', '.join(shipped) or 'none'}), "
                     "a checkpoint directory, or a hub id org/name")


#: ``--lora-targets``' default: :data:`grpo_lab.policy.lora.DEFAULT_TARGETS`, the attention's query and value projections.
LORA_TARGETS = ("q_proj", "v_proj")  # = grpo_lab.policy.lora.DEFAULT_TARGETS (not imported here: it imports torch)


def lora_option(r: int | None, alpha: float | None, targets: Sequence[str] | None):
    """The :class:`grpo_lab.policy.lora.LoraSpec` of ``--lora-r R [--lora-alpha A] [--lora-targets M ...]``
    (alpha default ``2 R``, targets :data:`LORA_TARGETS`, no dropout: the trainer switches dropout off);
    ``None`` without ``--lora-r``.

    Raises:
        UsageError: another ``--lora-*`` option without ``--lora-r``, a bad value (named), or peft is
            not installed.
    """
    from ..policy.lora import LoraSpec, require_peft

    if r is None:
        given = [f"--lora-{k}" for k, v in (("alpha", alpha), ("targets", targets)) if v is not None]
        if given:
            raise UsageError(f"{', '.join(given)} without --lora-r: give the adapters' rank, e.g. --lora-r 8")
        return None
    try:
        spec = LoraSpec(r=r, alpha=2 * r if alpha is None else alpha, target_modules=tuple(targets or LORA_TARGETS))
        require_peft("--lora-r")
    except (ValueError, ImportError) as exc:
        raise UsageError(f"--lora-*: {exc}") from None
    return spec


def default_out(preset: str, profile: str, now: time.struct_time | None = None) -> Path:
    """``runs/<preset>-<profile>-<YYYYmmdd-HHMMSS>.json`` (relative to the current directory; ``/runs/`` is
    git-ignored), with ``-2``, ``-3``, ... before ``.json`` if that file exists already."""
    stamp = time.strftime("%Y%m%d-%H%M%S", now if now is not None else time.localtime())
    path = Path("runs") / f"{preset}-{profile}-{stamp}.json"
    k = 2
    while path.exists():
        path = Path("runs") / f"{preset}-{profile}-{stamp}-{k}.json"
        k += 1
    return path


def _check_out(out: Path, overwrite: bool = False) -> None:
    """Fail before training, not after: ``out`` must be a file name whose directory can be created
    and written (checked by creating and removing a temporary file there), or, with ``overwrite``,
    an existing file that can be written.

    Raises:
        UsageError: ``out`` is a directory; it exists and ``overwrite`` is false; its directory
            cannot be created or written; it exists and cannot be written.
    """
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; give a file name such as {out / 'results.json'}")
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise UsageError(f"--out {out} exists; pass --overwrite to replace it, or give another file name")
        if not os.access(out, os.W_OK):
            raise UsageError(f"--out {out} exists and cannot be written (no permission)")
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot create its directory ({exc.strerror or exc})") from None
    try:
        fd, probe = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot create a file in {out.parent} ({exc.strerror or exc})") from None


def _output_overrides(args, out: Path, algo_name: str, cfg_over: dict) -> dict:
    """The output fields the command line passes to ``run``: ``output_dir``
    (:func:`grpo_lab.experiments.run_dirs.run_directory` of ``out``, unless
    ``--set output_dir=...`` names another) and ``save_every`` (``--save-every``), after checking the run
    directory: without ``--resume`` it must hold no earlier run (``--overwrite`` deletes its seed
    directories); with ``--resume`` it must hold a run of this preset.

    Raises:
        UsageError: ``--save-every`` below 0; an earlier run without ``--resume`` or ``--overwrite``; with
            ``--resume`` no run to continue, or a run of another preset (both named).
    """
    from ..experiments.run_dirs import _remove_seed_dirs, _runs_in, run_directory

    over: dict[str, Any] = {}
    if args.save_every is not None:
        if args.save_every < 0:
            raise UsageError(f"--save-every must be >= 0 (0: no checkpoints), got {args.save_every}")
        over["save_every"] = args.save_every
    where = Path(cfg_over.get("output_dir") or run_directory(out))
    over["output_dir"] = str(where)
    runs = _runs_in(where)
    if args.resume and not runs:
        raise UsageError(f"--resume: nothing to resume at {where} (no seed directory with a run.json; a run writes "
                         "it next to its --out file when it starts)")
    if args.resume and algo_name not in runs:
        raise UsageError(f"--resume: {where} holds a run of {', '.join(sorted(runs))}, not of {algo_name}; give "
                         "the same preset (and settings) as the run to continue")
    if runs and not args.resume:
        if not args.overwrite:
            raise UsageError(f"--out {out}: {where} holds an earlier run ({', '.join(sorted(runs))}); --resume "
                             "continues it, --overwrite replaces it")
        _remove_seed_dirs(where)
    return over


# ---------------------------------------------------------------------------------------- --import
def load_user_module(spec: str) -> types.ModuleType:
    """Import the module ``spec`` names (``--import``), so that what it registers (a task with
    :func:`grpo_lab.tasks.register_task`, an entry of a registry) can be chosen on the command line.

    Args:
        spec: a module name importable from the current directory or ``PYTHONPATH`` (``my_tasks``,
            ``pkg.tasks``; the current directory is added to the end of ``sys.path`` if it is not on
            it, as for the ``grpo-lab`` script), or the path of a ``.py`` file (anything ending in
            ``.py`` or containing a path separator), imported as the top-level module named after
            the file (``tasks/sort.py`` is ``sort``) with its directory put first on ``sys.path``.
            Worker processes (``--jobs``) import it again by that name
            (:func:`grpo_lab.experiments.run`).

    Returns:
        The module (importing it twice imports it once).

    Raises:
        UsageError: no such file; no such module; the module raised while it was imported (the
            message names ``spec`` and the error); a file whose name is already taken by another
            module (``json.py``).
    """
    text = spec.strip()
    if not text:
        raise UsageError("--import expects a module name or the path of a .py file, got ''")
    is_path = text.endswith(".py") or "/" in text or os.sep in text
    if is_path:
        path = Path(text).expanduser().resolve()
        if not path.is_file():
            raise UsageError(f"--import {spec}: no such file")
        if path.suffix != ".py":
            raise UsageError(f"--import {spec}: not a .py file")
        name, root = path.stem, str(path.parent)
        if root not in sys.path:
            sys.path.insert(0, root)  # as `python path/to/file.py` does
    else:
        name, path = text, None
        cwd = os.getcwd()
        if not any(os.path.abspath(entry or ".") == cwd for entry in sys.path):
            sys.path.append(cwd)
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (exc.name == name or name.startswith(exc.name + ".")):
            raise UsageError(f"--import {spec}: no module named {name!r} (give a module importable from the current "
                             "directory or PYTHONPATH, or the path of a .py file)") from None
        raise UsageError(f"--import {spec}: importing it failed: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 -- whatever the user's module raises becomes one line naming it
        raise UsageError(f"--import {spec}: importing it failed: {type(exc).__name__}: {exc}") from exc
    if path is not None and Path(getattr(module, "__file__", "") or "").resolve() != path:
        raise UsageError(f"--import {spec}: the name {name!r} is already taken by the module "
                         f"{getattr(module, '__file__', None) or name}; rename the file")
    return module


def _import_options(argv: Sequence[str], prog: str) -> tuple[list[str], list[str]]:
    """``(the --import values, the other arguments)`` of ``argv``: read before the real parser,
    whose choices depend on what the modules register.

    Raises:
        UsageError: ``--import`` without a value.
    """
    pre = _Parser(prog=prog, add_help=False)
    pre.add_argument("--import", dest="imports", action="append", default=[])
    known, rest = pre.parse_known_args(list(argv))
    return known.imports, rest


def unknown_characters(tokenizer, prompts: Sequence[str]) -> list[str]:
    """The characters of ``prompts`` that ``tokenizer`` encodes as its unknown token.

    Args:
        tokenizer: a transformers tokenizer (``unk_token_id`` ``None`` means it has none: nothing is unknown).
        prompts: texts, encoded as the trainer does (``add_special_tokens=False``).

    Returns:
        The sorted distinct characters whose encoding alone contains ``unk_token_id``, looked at
        only in the prompts whose encoding contains it.
    """
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return []
    bad: set[str] = set()
    for prompt in prompts:
        if unk in tokenizer(prompt, add_special_tokens=False)["input_ids"]:
            bad |= {c for c in set(prompt) if unk in tokenizer(c, add_special_tokens=False)["input_ids"]}
    return sorted(bad)


def task_warnings(profile, task: str | None, model: str | None, prog: str) -> list[str]:
    """The warnings printed before training, one line each: the policy cannot read the task's prompts (its
    tokenizer maps their characters to the unknown token; checked for a ``--model``, and for the profile's own
    model on another ``--task``), and a GSM8K task that reads the 24-problem fixture shipped with grpo_lab (a
    check that the pipeline runs: its accuracies measure nothing).

    Args:
        profile: the run's :class:`grpo_lab.experiments.Profile`.
        task: ``--task`` (``None``: the profile's).
        model: ``--model``, resolved (``None``: the profile's).
        prog: the program name the lines start with.

    Returns:
        ``[]`` when there is nothing to say; a task that cannot be built here is left to the run to report.
    """
    from ..tasks import get_task
    from ..tasks.gsm8k import GSM8KTask, fixture_path, load_fixture

    name = task or profile.task
    kwargs = profile.task_kwargs if name == profile.task else ()
    out = []
    if model is not None or name != profile.task:
        who = f"--model {model}" if model is not None else f"the {profile.name} profile's model {profile.base}"
        said = _check_tokenizer(model or profile.base, name, kwargs, prog, who=who)
        out += [said] if said else []
    try:
        built = get_task(name, **dict(kwargs))
    except Exception:  # noqa: BLE001 -- the run itself reports a task that cannot be built
        return out
    if isinstance(built, GSM8KTask) and built.source == "fixture":
        n = len(load_fixture())
        shipped = (f"; {model or profile.base} is a tiny model pretrained on arithmetic only"
                   if _shipped(model or profile.base) else "")
        out.append(f"{prog}: warning: task {name!r} reads the {n}-problem fixture shipped with grpo_lab "
                   f"({fixture_path().name}, written for grpo_lab, not GSM8K){shipped}: a check that the pipeline runs, "
                   "its accuracies measure nothing; GSM8K itself: --profile gpu (a hub model, pip install "
                   "'grpo_lab[gsm8k]')")
    return out


def _shipped(model: str) -> bool:
    """Whether ``model`` names a checkpoint shipped with grpo_lab (``data/checkpoints/NAME``)."""
    from ..paths import checkpoint_dir

    try:
        return checkpoint_dir(model).is_dir()
    except Exception:  # noqa: BLE001 -- a hub id or a path is no shipped name
        return False


def _check_tokenizer(model: str, task: str, task_kwargs: Sequence, prog: str, n_prompts: int = 5,
                     who: str | None = None) -> str | None:
    """A one-line warning when the tokenizer of ``model`` maps a character of ``task``'s first
    ``n_prompts`` test prompts to its unknown token (the policy cannot read them); ``None`` when it
    does not, and when this cannot be checked cheaply (a hub model not in the local cache, a task
    that cannot be built here: training reports those itself)."""
    try:
        from ..policy.models import load_tokenizer  # the tokenizer load_policy gives the trainer
        from ..paths import checkpoint_dir
        from ..tasks import get_task

        where = checkpoint_dir(model) if checkpoint_dir(model).is_dir() else model
        tokenizer = load_tokenizer(str(where), local_files_only=True)
        built = get_task(task, **dict(task_kwargs))
        prompts = [p.prompt for p in list(built.test_set())[:n_prompts]]
        bad = unknown_characters(tokenizer, prompts)
        unwritable = _unwritable_stops(tokenizer, built)
    except Exception:  # noqa: BLE001 -- only a warning: the run itself reports a model or task that fails
        return None
    if unwritable and not bad:
        return (f"{prog}: warning: the tokenizer of {who or f'--model {model}'} cannot write {', '.join(map(repr, unwritable))}, which ends "
                f"a tool call of task {task!r} (its environment's stop strings): the policy can never call the tool "
                f"(a checkpoint trained on the task's tool calls can, e.g. --model {task}-base if it is shipped)")
    if not bad:
        return None
    example = next(p for p in prompts if any(c in p for c in bad))
    example = example if len(example) <= 40 else example[:37] + "..."
    return (f"{prog}: warning: the tokenizer of {who or f'--model {model}'} maps {''.join(bad)!r} (in the test prompts of "
            f"task {task!r}, e.g. {example!r}) to its unknown token {tokenizer.unk_token!r}: the policy cannot read them")


def _unwritable_stops(tokenizer, task) -> list[str]:
    """The stop strings of a multi-turn ``task``'s environment (``task.environment().stop_strings``) that
    ``tokenizer`` cannot write (encoding then decoding does not give them back); ``[]`` for a single-turn task."""
    if not callable(getattr(task, "environment", None)):
        return []
    stops = getattr(task.environment(), "stop_strings", ())
    return [s for s in stops if tokenizer.decode(tokenizer(s, add_special_tokens=False)["input_ids"]) != s]


# ---------------------------------------------------------------------------------------- parser
def _default_prog() -> str:
    return "grpo-lab" if Path(sys.argv[0]).stem == "grpo-lab" else "python -m grpo_lab"


class _Parser(argparse.ArgumentParser):
    """argparse, with every parse error raised as a :class:`UsageError` (one line, exit status 2)
    instead of argparse's usage block."""

    def error(self, message):  # noqa: D102 (argparse API)
        if message.startswith("argument --task: invalid choice"):
            message += "; a task of your own needs --import MODULE, the module that registers it"
        if message.startswith("unrecognized arguments: "):
            hints = flag_hints(self, message.removeprefix("unrecognized arguments: ").split())
            message = f"unrecognized arguments: {'; '.join(hints)}" if hints else message
        raise UsageError(f"{message} (see {self.prog} --help)")


def flag_hints(parser: argparse.ArgumentParser, words: Sequence[str]) -> list[str]:
    """What each unrecognised ``--name [VALUE]`` among ``words`` (argparse's leftovers) means, one text each.

    A near option (``--stpes``, ``--lora_r``: difflib ratio >= 0.75 after ``_`` -> ``-``) gets a did-you-mean.
    On a parser with ``--set``, a TrainerConfig / Algorithm field or a TRL / verl name given as a flag
    (``--lr 1e-4``, ``--num_generations 8``, ``--per_device_train_batch_size 4``) gets the fix ``--set``
    would give (:func:`grpo_lab.export.vocabulary.explain`), and another near field a did-you-mean.

    Returns:
        ``["--num_generations 8: num_generations is TRL's GRPOConfig name; ...: --set group_size=8"]``; ``[]``
        when no word is a flag.
    """
    from ..export.vocabulary import explain

    options = sorted({o for a in parser._actions for o in a.option_strings if o.startswith("--")})
    fields = {**settable_fields(), **hyperparameter_keys()} if "--set" in options else {}
    out, i = [], 0
    while i < len(words):
        word, i = words[i], i + 1
        if not word.startswith("--") or word == "--":
            continue
        name, eq, value = word[2:].partition("=")
        if not eq and i < len(words) and not words[i].startswith("--"):
            value, i = words[i], i + 1
        shown = f"--{name}" + (f" {value}" if value else "")
        key, value = name.replace("-", "_"), value or "VALUE"
        near = difflib.get_close_matches("--" + name.replace("_", "-"), options, n=1, cutoff=0.75)
        said = explain(key, value, style="set") if fields else None
        if key in fields:
            out.append(f"{shown}: {key} is a field, not an option: --set {key}={value}")
        elif said is not None:
            out.append(f"{shown}: {said}")
        elif near:
            out.append(f"{shown} (did you mean {near[0]}?)")
        else:
            close = difflib.get_close_matches(key, fields, n=1, cutoff=0.75)
            out.append(f"{shown}" + (f" (did you mean --set {close[0]}={value}?)" if close else ""))
    return out


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's layout and appends ``(default: ...)`` to every option that has a
    default other than ``None`` / ``False`` (argparse's ``ArgumentDefaultsHelpFormatter``, minus the
    noise of ``default: None`` on options whose default the help text explains)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if ("%(default)" in text or not action.option_strings or action.nargs == 0
                or action.default in (None, False, [], argparse.SUPPRESS)):
            return text  # flags (store_true/false: the help says what they do) and defaults explained in the text
        if isinstance(action.default, (list, tuple)):
            return text + " (default: " + " ".join(map(str, action.default)) + ")"
        return text + " (default: %(default)s)"


def _wrap(label: str, words: Sequence[str]) -> str:
    return textwrap.fill(", ".join(words), width=100, initial_indent=f"  {label:<10}",
                         subsequent_indent=" " * 12, break_on_hyphens=False)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The ``train`` parser (the default command), its help listing the presets
    (:data:`grpo_lab.algo.algorithms.PRESETS`), tasks (:data:`grpo_lab.tasks.TASKS`), profiles
    (:data:`grpo_lab.experiments.PROFILES`), shipped models and ``--set`` keys."""
    prog = prog or _default_prog()
    ap = _Parser(
        prog=prog, formatter_class=_Formatter, epilog=_epilog(prog),
        usage=(f"{prog} [train] PRESET [options]\n       {prog} list\n       {prog} check-config FILE [--library trl|verl]"
               f"\n       {prog} export PRESET --to trl|verl --model M --out DIR [options]   ({prog} export --help)"),
        description="Train an algorithm preset for one or more seeds from a base checkpoint and write the "
                    "results (one row per seed and step, with provenance) to a JSON file.",
    )
    _add_train_arguments(ap)
    return ap


def _epilog(prog: str) -> str:
    """The help's epilog: the choices (presets, tasks, profiles, models, ``--set`` keys), examples, exit status."""
    from ..algo.algorithms import PRESETS
    from ..experiments import PROFILES
    from ..tasks import TASKS

    profiles = [f"{p.name} ({p.base}, {p.task}, {p.steps} steps, {p.config.device})" for p in PROFILES.values()]
    return "\n".join([
        "choices:",
        _wrap("presets", list(PRESETS)) + "  (case-insensitive)",
        _wrap("tasks", sorted(TASKS)),
        _wrap("profiles", profiles),
        _wrap("models", _shipped_models() + ["a checkpoint directory", "a hub id org/name"]),
        _wrap("--set", sorted(settable_fields())),
        f"  ({prog} list shows every preset's choices and each --set key's type)",
        "",
        "examples:",
        f"  {prog} GRPO --steps 2 --seeds 0",
        f"  {prog} DAPO --seeds 0 1 2 --jobs 2 --set eps_high=0.3 --out runs/dapo.json",
        f"  {prog} GRPO --profile gpu --seeds 0 1 2 --out runs/grpo_gpu.json   # GSM8K on a GPU",
        f"  {prog} GRPO --import my_task.py --task mytask --seeds 0 1 --jobs 2   # a task of your own",
        f"  {prog} --config run.yaml --steps 5   # options from a YAML file, a flag on top",
        "  (my_task.py calls grpo_lab.tasks.register_task('mytask', MyTask); --import also takes a module",
        "  name such as my_package.tasks; give it to 'list' too to see what it registered)",
        "",
        "output: a line per step and seed while training (--quiet: none), then the test accuracy from base to",
        "  final (mean ± sd over seeds, 95% t interval, per seed, binomial standard error), each seed's model",
        "  (<run dir>/PRESET/seed-K/final; --no-save-model: none), a figure FILE.png next to the results FILE.json,",
        "  and the lines 'results: FILE.json' and 'configuration: FILE/config.yaml'.",
        "",
        "exit status: 0 done, 2 a mistake in the command line or a file/model problem (one line on",
        "stderr; --debug adds the traceback), 1 any other error (a diverged run included), 130 interrupted,",
        "143 stopped by SIGTERM after the step in progress, with a checkpoint written (--resume continues).",
    ])


def _add_train_arguments(ap: argparse.ArgumentParser) -> None:
    """The ``train`` command's positional PRESET and its options."""
    from .. import __version__
    from ..experiments import PROFILES
    from ..tasks import TASKS
    from ..training.callbacks import TRACKERS

    ap.add_argument("preset", metavar="PRESET", nargs="?",
                    help="algorithm preset, e.g. GRPO (see 'choices' below); may come from --config")
    ap.add_argument("--config", metavar="FILE.yaml",
                    help="read the run's options from a YAML (or JSON) file: top-level keys named as the options "
                         "(preset, steps, seeds, out, ...), a trainer: section of TrainerConfig fields and an "
                         "algorithm: section of Algorithm fields; flags given here win over the file")
    ap.add_argument("--profile", default="cpu", choices=list(PROFILES),
                    help="scale of the experiment: base model, task, steps, trainer settings")
    ap.add_argument("--task", choices=sorted(TASKS),
                    help="task to train on (default: the profile's); --import adds tasks of your own")
    ap.add_argument("--model", metavar="NAME|DIR|ORG/NAME",
                    help="base checkpoint: a shipped name, a local directory or a hub id (default: the profile's)")
    ap.add_argument("--steps", type=int, help="RL steps per seed (default: the profile's)")
    ap.add_argument("--lora-r", type=int, metavar="R",
                    help="train LoRA adapters of rank R instead of the whole model (needs peft: pip install "
                         "'grpo_lab[lora]'); the KL reference is then the base model itself")
    ap.add_argument("--lora-alpha", type=float, metavar="ALPHA", help="LoRA's scale numerator (default: 2 x R)")
    ap.add_argument("--lora-targets", nargs="+", metavar="MODULE",
                    help=f"modules that get adapters (default: {' '.join(LORA_TARGETS)})")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], metavar="SEED",
                    help="one run per seed")
    ap.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="worker processes, seeds trained in parallel (results do not depend on it)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a TrainerConfig or Algorithm field, e.g. --set lr=1e-4 --set eps_high=0.28 "
                         "(repeatable; 'none' for None, true/false for flags)")
    ap.add_argument("--out", metavar="FILE",
                    help="results file (default: runs/PRESET-PROFILE-YYYYmmdd-HHMMSS.json); a file that exists "
                         "is refused unless --overwrite is given")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the --out file if it exists, and the earlier run in its run directory")
    _add_checkpoint_arguments(ap)
    ap.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                    help="import MODULE first, so that the tasks and registry entries it registers are valid "
                         "--task and --set values: a module name importable from the current directory or "
                         "PYTHONPATH, or the path of a .py file (repeatable)")
    ap.add_argument("--no-cache", dest="cache", action="store_false",
                    help="do not store the runs in the run cache (a command line run writes its run directory, so it "
                         "always trains; experiments.run reads what it stores)")
    ap.add_argument("--report-to", nargs="+", metavar="NAME", choices=[*TRACKERS, "none"],
                    help="trackers of each seed's steps (TrainerConfig.report_to; written into the seed's output "
                         "directory): jsonl (the default), tensorboard, wandb (offline unless $WANDB_MODE says "
                         "otherwise); 'none' for none")
    ap.add_argument("--quiet", action="store_true",
                    help="no line per step and seed while training (the summary and the paths only)")
    ap.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="show the model-loading bars and a tqdm bar per seed on stderr (the step lines too, unless "
                         "--quiet); --no-progress: no bars (default: no loading bars, and the training bar only "
                         "with --quiet when stderr is a terminal)")
    ap.add_argument("--no-save-model", dest="save_model", action="store_false",
                    help="do not save each seed's trained model (by default it goes to <run dir>/PRESET/seed-K/final: "
                         "save_pretrained weights, LoRA adapters merged, and the tokenizer)")
    ap.add_argument("--debug", action="store_true", help="print the traceback of an error")
    ap.add_argument("--version", action="version", version=f"grpo_lab {__version__}")


def _add_checkpoint_arguments(ap: argparse.ArgumentParser) -> None:
    """The ``train`` command's periodic checkpoints and resume: ``--save-every N`` and ``--resume``
    (:func:`grpo_lab.experiments.run`'s ``save_every`` and ``resume``)."""
    ap.add_argument("--save-every", type=int, metavar="N",
                    help="write a checkpoint of each seed every N steps (and after the last) into the run "
                         "directory (--out without .json), the newest save_total_limit kept; same as --set "
                         "save_every=N")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run of --out (killed or finished) from its run directory: finished seeds "
                         "are read back, the others continue from their latest checkpoint; the same preset and "
                         "settings are required (an error names what differs)")


def _list(prog: str) -> str:
    """What ``list`` prints: presets with their choices, tasks, profiles, models and ``--set`` keys."""
    from ..algo.algorithms import GRPO, PRESETS
    from ..experiments import PROFILES
    from ..tasks import TASKS

    lines = [f"presets ({prog} PRESET):"]
    for name, algo in PRESETS.items():
        if algo is GRPO:
            text = " ".join(f"{k}={v}" for k, v in GRPO.axes().items() if v not in (None, False))
        else:
            diff = {k: v for k, v in dataclasses.asdict(algo).items()
                    if k not in ("name", "params") and getattr(GRPO, k) != v}
            text = "GRPO with " + " ".join(f"{k}={v}" for k, v in {**diff, **algo.params}.items())
        lines.append(f"  {name:<11} {text}")
    lines.append("tasks (--task; --import MODULE adds your own):")
    for name, cls in sorted(TASKS.items()):
        lines.append(f"  {name:<11} {(cls.__doc__ or '').strip().splitlines()[0] if cls.__doc__ else ''}")
    lines.append("profiles (--profile):")
    for p in PROFILES.values():
        c = p.config
        lines.append(f"  {p.name:<11} base {p.base}, task {p.task}, {p.steps} steps, {c.prompts_per_step} questions x "
                     f"{c.group_size} responses per step, lr {c.lr}, device {c.device}")
    lines.append("models (--model): " + ", ".join(_shipped_models()) + ", a checkpoint directory, or a hub id org/name")
    cpu = PROFILES["cpu"].config
    lines.append("--set KEY=VALUE (type, field of, value in profile cpu / preset GRPO):")
    where = hyperparameter_keys()
    for key, (owner, hint, default) in sorted(settable_fields().items()):
        if owner == "Algorithm.params":  # a hyper-parameter of some choices only: its default, where declared
            shown = "required" if default is inspect.Parameter.empty else repr(default)
            lines.append(f"  {key:<26} {_type_name(hint):<22} {'hyper-param.':<14} {shown} ({where[key][0]})")
            continue
        value = getattr(cpu if owner == "TrainerConfig" else GRPO, key)
        lines.append(f"  {key:<26} {_type_name(hint):<22} {owner:<14} {value!r}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- main
def _report(res, args, name: str, out: Path, config_file: Path, output_dir: Path) -> list[str]:
    """What a finished run prints: the labelled summary (:func:`grpo_lab.cli.report.summary_lines`, the test
    set's size from the task), each seed's saved model, the figure (:func:`grpo_lab.cli.report.save_curves`,
    next to the results file; a failure to draw is a warning on stderr, the results are kept), and the
    ``results:`` and ``configuration:`` paths (other tools read the line ``results: PATH``)."""
    from .. import experiments
    from .report import count_test_problems, figure_path, save_curves, summary_lines

    profile = experiments.get_profile(args.profile)
    task = args.task or profile.task
    n_test = count_test_problems(task, profile.task_kwargs if task == profile.task else ())
    lines = summary_lines(res, name=name, profile=args.profile, n_test=n_test)
    if args.save_model:
        lines += _model_lines(res, name, output_dir)
    figure = figure_path(out)
    seeds = list(res.provenance.get("seeds", []))
    try:
        save_curves(res.history, figure, title=_figure_title(name, seeds))
        lines.append(f"figure: {figure} (test accuracy and reward against the step, mean ± sd over seeds)")
    except Exception as exc:  # noqa: BLE001 -- the results are saved; a figure that cannot be drawn is a warning
        print(f"{_default_prog()}: warning: no figure written ({type(exc).__name__}: {exc})", file=sys.stderr)
    return lines + [f"results: {out}", f"configuration: {config_file}"]


def _figure_title(name: str, seeds: list) -> str:
    """The figure's title: ``"GRPO: seed 0"`` for one seed, else ``"GRPO: mean ± sd over 3 seeds"``."""
    return f"{name}: seed {seeds[0]}" if len(seeds) == 1 else f"{name}: mean ± sd over {len(seeds)} seeds"


def _model_lines(res, name: str, output_dir: Path) -> list[str]:
    """The saved models' lines: what they hold (LoRA runs: adapters merged into the base weights) and each
    seed's ``final/`` directory, or why a seed has none (read back from a run that saved none)."""
    from ..experiments.run_dirs import final_model_dir, seed_dir

    kind = "LoRA adapters merged into the base weights" if res.provenance.get("lora") else "full weights"
    lines = [f"final models ({kind}, and the tokenizer; grpo_lab.policy.models.load_policy(PATH) loads one, "
             "--model PATH trains on from it):"]
    for seed in res.provenance.get("seeds", []):
        path = final_model_dir(seed_dir(output_dir, name, seed))
        lines.append(f"  seed {seed}: {path}" if (path / "config.json").is_file()
                     else f"  seed {seed}: none (read back from a finished run that saved no model)")
    return lines


@contextlib.contextmanager
def _loading_bars(show: bool):
    """transformers' (and the hub's) progress bars off inside the block unless ``show``: in this
    process (transformers' global switch) and in the worker processes it spawns, which inherit
    ``HF_HUB_DISABLE_PROGRESS_BARS=1`` and read it when they import transformers. Both are put back
    afterwards, for callers that run :func:`main` in-process. A ``HF_HUB_DISABLE_PROGRESS_BARS``
    already set by the user wins (the hub gives it priority): nothing is changed then."""
    if show or os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") is not None:
        yield
        return
    # import first: huggingface_hub reads the variable once, when it is imported
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        if enabled:
            hf_logging.enable_progress_bar()


def _parser_with_config(argv: list[str], prog: str):
    """``(the train parser, the --config file checked or None)``: the modules of ``--import`` and of the file's
    ``import`` are imported first (the parser's choices include what they register), and the file's options
    become the parser's defaults, so that the flags given win over them."""
    from ..experiments import config_files as run_config

    imports, rest = _import_options(argv, prog)
    pre = _Parser(prog=prog, add_help=False)
    pre.add_argument("--config")
    path = pre.parse_known_args(rest)[0].config
    try:
        data = run_config.read_config_file(path) if path is not None else {}
        file_imports = run_config.file_imports(data, path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for spec in [*file_imports, *imports]:
        load_user_module(spec)
    parser = build_parser(prog)
    if path is None:
        return parser, None
    try:
        conf = run_config.load_run_config(data, path, parser, settable_fields(), _FILE_RESERVED)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    parser.set_defaults(**conf.options)
    return parser, conf


def _origin(conf, from_file: dict, from_set: dict) -> str:
    """Where overrides came from, for an error: ``--set``, ``--config FILE`` or both."""
    parts = (["--set"] if from_set else []) + ([f"--config {conf.path}"] if conf is not None and from_file else [])
    return " / ".join(parts) or "--set"


def _write_resolved(args, preset: str, algo, cfg_over: dict, model: str | None, out: Path, origin: str) -> Path:
    """Write the run's resolved configuration to ``<out>/config.yaml`` (:func:`grpo_lab.experiments.config_files.config_path`):
    every option (the profile's task, model and steps where none was given), the profile's
    :class:`~grpo_lab.training.trainer.TrainerConfig` with the overrides, and ``algo``. A learning-rate horizon
    (``lr_schedule_steps``) that was not given stays ``null``: the run's ``steps``, also when the file is
    reused with another ``--steps``. Raises :class:`UsageError` for overrides the ``TrainerConfig`` refuses
    (named after ``origin``)."""
    from .. import __version__, experiments
    from ..experiments import config_files as run_config

    profile = experiments.get_profile(args.profile)
    steps = profile.steps if args.steps is None else args.steps
    try:
        profile = dataclasses.replace(profile, config=dataclasses.replace(profile.config, **cfg_over))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{origin}: {exc}") from None
    options = dict(vars(args), preset=preset, task=args.task or profile.task, model=model or profile.base,
                   steps=steps, out=str(out))
    path = run_config.config_path(out)
    header = (f"The resolved configuration of a grpo_lab {__version__} run, {time.strftime('%Y-%m-%d %H:%M:%S')}.\n"
              f"{_default_prog()} --config {path} repeats it (give another --out, or --overwrite).")
    return run_config.write_config(path, run_config.resolved_config(options, profile.config, algo), header)


def _train(argv: list[str], prog: str) -> int:
    parser, conf = _parser_with_config(argv, prog)
    args = parser.parse_args(argv)
    from .. import experiments
    from ..algo.algorithms import PRESETS

    if args.preset is None:
        raise UsageError(f"give a PRESET such as GRPO, or preset: in a --config file (see {prog} --help)")
    algo = _preset(args.preset)
    preset = next(k for k, v in PRESETS.items() if v is algo)
    set_cfg, set_algo = parse_set(args.overrides)
    cfg_over = {**(conf.trainer if conf else {}), **set_cfg}  # --set wins over the file's sections
    algo_over = {**(conf.algorithm if conf else {}), **set_algo}
    cfg_over.update(report_to_option(args.report_to))
    if algo_over:
        try:
            algo = algo.replace(**algo_over)
        except ValueError as exc:
            raise UsageError(f"{_origin(conf, conf and conf.algorithm, set_algo)}: {exc}") from None
    if args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    if args.steps is not None and args.steps < 0:
        raise UsageError(f"--steps must be >= 0, got {args.steps}")
    model = resolve_model(args.model) if args.model is not None else None
    lora = lora_option(args.lora_r, args.lora_alpha, args.lora_targets)
    if args.resume and not args.out:
        raise UsageError("--resume needs --out, the results file of the run to continue")
    out = Path(args.out).expanduser() if args.out else default_out(preset, args.profile)
    _check_out(out, overwrite=args.overwrite or args.resume)
    cfg_over.update(_output_overrides(args, out, algo.name, cfg_over))
    for warning in task_warnings(experiments.get_profile(args.profile), args.task, model, prog):
        print(warning, file=sys.stderr)
    config_file = _write_resolved(args, preset, algo, cfg_over, model, out,
                                  _origin(conf, conf and conf.trainer, set_cfg))
    try:
        res = _run_and_follow(args, algo, cfg_over, model, lora)
    except (KeyboardInterrupt, OSError) as exc:
        if isinstance(exc, KeyboardInterrupt) or getattr(exc, "resumable", False):  # a full disk at a save
            print(_resume_hint(argv, args, out, prog, exc), file=sys.stderr)
        raise
    experiments.save_results(res, out)
    print("\n".join(_report(res, args, algo.name, out, config_file, Path(cfg_over["output_dir"]))))
    return 0


def _resume_hint(argv: list[str], args, out: Path, prog: str, exc: BaseException | None = None) -> str:
    """What to do after Ctrl-C, SIGTERM or a failed checkpoint save: the results file and the command that resumes
    the run (``argv`` with ``--out`` when it was defaulted, and ``--resume``)."""
    again = list(argv) + ([] if args.out else ["--out", str(out)]) + ([] if args.resume else ["--resume"])
    saved = [str(t.checkpoint) for t in (exc, *getattr(exc, "others", ())) if getattr(t, "checkpoint", None)]
    note = (f"(the seed(s) stopped by SIGTERM resume from {', '.join(saved)}; " if saved else
            "(a seed resumes mid-way only from a checkpoint, written with --save-every N or at a SIGTERM; ")
    return (f"{prog}: the run's results file is {out}; resume it with:\n  {prog} {shlex.join(again)}\n"
            f"{note}a seed without one trains again from step 0)")


def _run_and_follow(args, algo, cfg_over: dict, model: str | None, lora):
    """:func:`grpo_lab.experiments.run` as the command line asks, printing a line per step and seed while it
    trains (:class:`grpo_lab.cli.report.StepPrinter` on each seed's ``metrics.jsonl``) unless ``--quiet`` or the
    trackers (``--report-to``) write no ``jsonl``. The per-step tqdm bar shows with ``--progress`` (and by
    default, in a terminal, only with ``--quiet``: the lines replace it); transformers' loading bars only with
    ``--progress``. Seeds resumed from a checkpoint print the steps after it; finished seeds read back say so."""
    from .. import experiments
    from .report import StepPrinter
    from ..experiments.run_dirs import seed_dir

    profile = experiments.get_profile(args.profile)
    steps = profile.steps if args.steps is None else args.steps
    report_to = cfg_over.get("report_to", profile.config.report_to)
    lines = not args.quiet and "jsonl" in report_to
    if not args.quiet and not lines:
        print("(no per-step lines: they are read from each seed's metrics.jsonl, which --report-to without jsonl "
              "does not write)", flush=True)
    dirs = {s: seed_dir(cfg_over["output_dir"], algo.name, s) for s in args.seeds}
    after = _resume_points(dirs, steps) if args.resume else {}
    bar = args.progress if (args.quiet or args.progress is not None) else False
    printer = StepPrinter(dirs if lines else {}, name=algo.name, steps=steps, after=after, emit=_line_printer(bar))
    # transformers' loading bars: off unless --progress, in this process and in spawned workers (which
    # inherit the environment); put back afterwards for callers that run main() in-process.
    with _loading_bars(args.progress is True), printer, _resume_lines():
        return experiments.run(algo, profile=args.profile, seeds=args.seeds, steps=args.steps, progress=bar,
                               n_jobs=args.jobs, cache=args.cache, base=model, task=args.task, lora=lora,
                               resume=args.resume, save_model=args.save_model, **cfg_over)


def _line_printer(bar: bool | None):
    """How a step line is printed: ``print`` (flushed, so a pipe shows it at once), or ``tqdm.write`` when tqdm
    bars may show in this process (it keeps the bar below the lines)."""
    if bar is False:
        return lambda line: print(line, flush=True)
    from tqdm.auto import tqdm

    return lambda line: tqdm.write(line)


def _resume_points(dirs: dict, steps: int) -> dict[int, int]:
    """``{seed: step}`` after which a resumed seed's step lines are new: its latest checkpoint's step, or
    ``steps`` for a seed whose ``result.json`` holds the whole run (read back, not trained: printed as such)."""
    from ..experiments.run_dirs import _finished_rows, latest_checkpoint

    after = {}
    for seed, directory in dirs.items():  # what each seed resumes from is printed by run() once checked (RESUME_LOG)
        if _finished_rows(directory, steps) is not None:
            after[seed] = steps
        elif (ckpt := latest_checkpoint(directory)) is not None:
            after[seed] = int(ckpt.name.split("-")[-1])
    return after


@contextlib.contextmanager
def _resume_lines():
    """Within the block, :data:`grpo_lab.experiments.runs.RESUME_LOG`'s lines (what each seed resumes from) print
    on stdout."""
    from ..experiments.runs import RESUME_LOG

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, RESUME_LOG.level = RESUME_LOG.level, logging.INFO
    RESUME_LOG.addHandler(handler)
    try:
        yield
    finally:
        RESUME_LOG.removeHandler(handler)
        RESUME_LOG.setLevel(level)


def _check_config(argv: list[str], prog: str) -> int:
    """``check-config FILE [--library trl|verl]``: print :meth:`grpo_lab.export.lint.Reading.report`; exit status 0,
    or 1 when the file has keys the library does not know (a typo: the reading then holds the library's default for
    the key meant, so it may describe another objective), which stderr names."""
    from ..export.lint import LIBRARIES, check_config

    ap = _Parser(prog=f"{prog} check-config", description="Read a TRL GRPOConfig or a verl trainer config (a YAML "
                 "file) and print the grpo_lab Algorithm it computes, the paper it is nearest to and its departures.")
    ap.add_argument("file", help="YAML file: GRPOConfig fields (TRL), or a verl config mapping / override list")
    ap.add_argument("--library", choices=LIBRARIES, help="the library (default: guessed from the keys)")
    ap.add_argument("--debug", action="store_true", help="print the traceback of an error")
    args = ap.parse_args(argv)
    _refuse_run_config(args.file)
    reading = check_config(args.file, args.library)
    print(reading.report())
    if reading.unknown:
        print(f"{prog} check-config: {len(reading.unknown)} unknown key(s), read as absent (the library's default "
              f"holds): {'; '.join(reading.unknown)}", file=sys.stderr)
        return 1
    return 0


#: top-level keys of a grpo_lab run configuration that neither a TRL GRPOConfig nor a verl config has
_RUN_CONFIG_KEYS = ("preset", "profile", "seeds")


def _refuse_run_config(path: str) -> None:
    """Refuse ``check-config`` on grpo_lab's own run configuration (a top-level ``preset``, ``profile`` or
    ``seeds``), which the linter would misread as a verl config.

    Raises:
        UsageError: the file is a grpo_lab run configuration (to be given as ``--config FILE``).
    """
    from ..export.lint import load_yaml

    try:
        data = load_yaml(path)
    except (OSError, ValueError):
        return  # check_config reports it
    if isinstance(data, dict) and any(k in data for k in _RUN_CONFIG_KEYS):
        raise UsageError(f"{path} is a grpo_lab run configuration (--config {path}), not a TRL/verl config")


def _command_line_words(message: str) -> str:
    """An export error in the command line's words: ``Pass --approximate`` for ``strict=False``, and each
    ``X.replace(k=v, ...)`` / ``budget k=v`` alternative also as ``--set k=v`` options."""
    message = message.replace("Pass strict=False to get this mapping with these differences as warnings.",
                              "Pass --approximate to write the job with these differences as warnings (each listed in "
                              "its README).")

    def as_options(match: re.Match) -> str:
        pairs = re.findall(r"(\w+)=((?:\([^)]*\))|[^,()]+)", match.group(2))
        return match.group(0) + " On the command line: " + " ".join(f"--set {k}={v.strip().strip(chr(39))}"
                                                                    for k, v in pairs) + "."

    return re.sub(r"(\w+\.replace|budget) *\(?([^.\n]*?)\)?\.$", as_options, message, flags=re.M)


def _preset(name: str):
    """The preset called ``name`` (:func:`grpo_lab.algo.algorithms.get_algorithm`), or a :class:`UsageError` naming the
    closest preset and every known one."""
    from ..algo.algorithms import PRESETS, closest_preset, get_algorithm

    try:
        return get_algorithm(name)
    except ValueError:
        close = closest_preset(name)
        hint = f" (did you mean {close!r}?)" if close else ""
        raise UsageError(f"unknown preset {name!r}{hint}; known: {', '.join(PRESETS)}") from None


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the command line (``python -m grpo_lab --help`` describes it); never raises for user
    mistakes.

    Args:
        argv: the arguments (default ``sys.argv[1:]``). A first argument ``list`` prints the
            choices (after the modules of its ``--import`` options); ``check-config FILE`` prints what a TRL /
            verl config computes; ``train`` (optional) trains.
        prog: the program name in messages (default ``grpo-lab`` when run as that script, else
            ``python -m grpo_lab``).

    Returns:
        The exit status: 0 done, 2 a user mistake (one line on stderr: see the module docstring),
        1 any other error, 130 interrupted, 143 stopped by SIGTERM (a checkpoint written).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or _default_prog()
    with _short_warnings(prog):
        return _main(argv, prog)


@contextlib.contextmanager
def _short_warnings(prog: str):
    """Within the block, a Python warning prints as one line ``{prog}: warning: {Category}: {message}`` on stderr
    (not the file, line number and source line); the previous ``warnings.showwarning`` is put back afterwards."""
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        text = " ".join(str(message).split())
        print(f"{prog}: warning: {category.__name__}: {text}", file=file or sys.stderr, flush=True)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous


def _main(argv: list[str], prog: str) -> int:
    """:func:`main`'s body: the command, and every error turned into one line and an exit status."""
    debug = "--debug" in argv
    try:
        if argv[:1] == ["list"]:
            imports, extra = _import_options(argv[1:], prog)
            extra = [a for a in extra if a != "--debug"]
            if extra:
                raise UsageError(f"list takes no arguments but --import MODULE and --debug, got {' '.join(extra)}")
            for spec in imports:
                load_user_module(spec)
            print(_list(prog))
            return 0
        if argv[:1] == ["check-config"]:
            return _check_config(argv[1:], prog)
        if argv[:1] == ["export"]:
            return _export(argv[1:], prog)
        return _train(argv[1:] if argv[:1] == ["train"] else argv, prog)
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt as exc:
        trainer = sys.modules.get("grpo_lab.training.trainer")
        if trainer is not None and isinstance(exc, trainer.Terminated):  # SIGTERM: a checkpoint was written
            print(f"{prog}: {exc}", file=sys.stderr)
            return trainer.TERMINATED_EXIT_CODE
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 -- every error becomes one line (and a status); --debug shows it
        user = isinstance(exc, (ValueError, OSError))
        if debug:
            traceback.print_exc()
        message = " ".join(str(exc).split()) or type(exc).__name__
        if not user:
            message = f"{type(exc).__name__}: {message}"
        hint = "" if debug or isinstance(exc, UsageError) else " (--debug shows the traceback)"
        print(f"{prog}: error: {message}{hint}", file=sys.stderr)
        return 2 if user else 1


# ---------------------------------------------------------------------------------------- export
def _export_parser(prog: str) -> argparse.ArgumentParser:
    """The ``export`` command's parser: a runnable TRL or verl job (:func:`~grpo_lab.export.jobs.trl_job` /
    :func:`~grpo_lab.export.jobs.verl_job`)."""
    ap = _Parser(prog=f"{prog} export", formatter_class=_Formatter,
                 description="Write a runnable TRL or verl job (script or command line, data, a reward adapter "
                             "wrapping the task's scorer, README) for a preset, its budget read from TrainerConfig "
                             "(--set) as training would use it.")
    ap.add_argument("preset", nargs="?", help="an algorithm preset (case-insensitive); may come from --config / "
                                              "--run-dir")
    ap.add_argument("--to", required=True, choices=("trl", "verl"), help="the target library")
    ap.add_argument("--config", metavar="FILE.yaml",
                    help="the run's configuration file (as training reads it; <run dir>/config.yaml is the resolved "
                         "one): its preset, profile, task, model, steps and trainer: / algorithm: sections")
    ap.add_argument("--profile", default=None,
                    help="a profile (cpu, gpu, ...) whose TrainerConfig, task, model and steps the job takes, as "
                         "training with --profile does (default: TrainerConfig() and the task 'arithmetic')")
    ap.add_argument("--run-dir", metavar="DIR",
                    help="a run written by training: its results file (.json), its run directory (config.yaml) or a "
                         "seed directory (run.json); the job takes that run's settings")
    ap.add_argument("--task", default=None, help="a registered task (--import adds your own; default: the run's, "
                                                 "else 'arithmetic')")
    ap.add_argument("--task-arg", dest="task_args", action="append", default=[], metavar="KEY=VALUE",
                    help="a field of the task, e.g. --task-arg source=hub (gsm8k: 'hub', 'fixture', or a .jsonl / "
                         ".parquet file or hub-layout directory; default $GRPO_LAB_GSM8K_SOURCE or 'hub', as the GPU "
                         "profile)")
    ap.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                    help="import MODULE first (a module name or a .py file), so that the task it registers can be "
                         "exported (repeatable)")
    ap.add_argument("--model", default=None, help="a shipped checkpoint, a checkpoint directory or a hub id (default: "
                                                  "the run's, given --config / --profile / --run-dir)")
    ap.add_argument("--out", required=True, help="the job's directory; one with files in it is refused unless "
                                                 "--overwrite is given")
    ap.add_argument("--overwrite", action="store_true", help="write into a --out directory that has files, "
                                                             "replacing those of the same name")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: the run's, else "
                                                            "grpo_lab.export.DEFAULT_STEPS)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a TrainerConfig field or an Algorithm field / hyper-parameter, as for training")
    ap.add_argument("--nnodes", type=int, default=1, help="machines")
    ap.add_argument("--gpus-per-node", type=int, default=None, help="devices per machine (verl default 8, TRL 1)")
    ap.add_argument("--approximate", action="store_true",
                    help="export the nearest mapping when the target cannot compute the preset exactly "
                         "(strict=False: each difference is a warning and a line of the README)")
    ap.add_argument("--debug", action="store_true", help="print the traceback of an error")
    return ap


@dataclasses.dataclass(frozen=True)
class _ExportedRun:
    """The run a job reproduces: its algorithm, TrainerConfig, task (name and ``KEY=VALUE`` arguments), model,
    steps, and where these came from (``origin``, for messages)."""

    algo: Any
    config: Any
    task: str
    task_args: tuple
    model: str | None
    steps: int | None
    origin: str


def _run_dir_files(where: str) -> tuple[Path | None, dict | None, int | None]:
    """``(config.yaml, None, None)`` of a run directory (or of a results file's), else ``(None, run.json's record,
    result.json's steps or None)`` of a seed directory (or of the first seed under a run directory).

    Raises:
        UsageError: nothing there that training writes.
    """
    import json

    from ..experiments.run_dirs import run_directory

    path = Path(where).expanduser()
    if path.is_file() and path.name in ("run.json", "result.json") and (path.parent / "run.json").is_file():
        path = path.parent  # a seed directory's own file
    elif path.suffix == ".json":
        path = run_directory(path)  # a results file: its run directory
    if (path / "config.yaml").is_file():
        return path / "config.yaml", None, None
    seeds = [path] if (path / "run.json").is_file() else [p.parent for p in sorted(path.glob("*/seed-*/run.json"))]
    if not seeds:
        raise UsageError(f"--run-dir {where}: no run there (neither a config.yaml nor a seed directory with a "
                         "run.json); give the results file, the run directory or a seed directory of a training run")
    try:
        record = json.loads((seeds[0] / "run.json").read_text())
        done = seeds[0] / "result.json"
        steps = json.loads(done.read_text()).get("steps") if done.is_file() else None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--run-dir {where}: {seeds[0]} cannot be read ({exc})") from None
    return None, record, steps


def _run_file(path: Path | str, prog: str) -> tuple[dict, dict, dict]:
    """``(options, trainer, algorithm)`` of a run's configuration file, checked as training checks it (its
    ``import`` modules imported first)."""
    from ..experiments import config_files as run_config

    try:
        data = run_config.read_config_file(path)
        for spec in run_config.file_imports(data, path):
            load_user_module(spec)
        conf = run_config.load_run_config(data, path, build_parser(prog), settable_fields(), _FILE_RESERVED)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return conf.options, conf.trainer, conf.algorithm


def _exported_run(args, prog: str) -> _ExportedRun:
    """The settings ``export`` writes a job for: ``--run-dir`` (its ``config.yaml``, else a seed's ``run.json``),
    ``--config FILE`` or ``--profile NAME`` (that profile's TrainerConfig, task, model and steps), else
    ``TrainerConfig()`` on ``arithmetic``; the positional preset must be the run's, ``--task`` / ``--model`` /
    ``--steps`` / ``--profile`` win over the file's.

    Raises:
        UsageError: --run-dir with --config; no preset or another preset than the run's; an unknown profile; a
            file's bad key or value.
    """
    from .. import experiments
    from ..algo.algorithms import Algorithm
    from ..training.config import TrainerConfig

    if args.run_dir and args.config:
        raise UsageError("give --run-dir or --config, not both (a run directory's config.yaml is its --config file)")
    path, record, done = _run_dir_files(args.run_dir) if args.run_dir else (args.config, None, None)
    options, trainer, algorithm = _run_file(path, prog) if path is not None else ({}, {}, {})
    origin = f"--config {path}" if path is not None else (f"--run-dir {args.run_dir}" if record else "--set")
    if record is not None:
        options = {"profile": record.get("profile"), "task": record.get("task"), "model": record.get("base"),
                   "steps": done, "task_kwargs": record.get("task_kwargs") or {}}
    name = args.profile or options.get("profile")
    try:
        profile = experiments.get_profile(name) if name is not None else None
        base = profile.config if profile else TrainerConfig()
        config = TrainerConfig.from_dict(record["config"]) if record else dataclasses.replace(base, **trainer)
        algo = (Algorithm.from_dict(record["algo"]) if record else
                _preset(options.get("preset") or args.preset or "").replace(**algorithm))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{origin}: {exc}") from None
    if args.preset and (record or options.get("preset")) and _preset(args.preset).name != algo.name:
        raise UsageError(f"{origin} trained {algo.name}, not {args.preset}: leave PRESET out (the run's is used) "
                         "or change it with --set")
    task = args.task or options.get("task") or (profile.task if profile else "arithmetic")
    kwargs = options.get("task_kwargs") or (dict(profile.task_kwargs) if profile and task == profile.task else {})
    steps = args.steps if args.steps is not None else options.get("steps") or (profile.steps if profile else None)
    model = args.model or options.get("model") or (profile.base if profile else None)
    if model is None:
        raise UsageError("--model is required without --config, --profile or --run-dir (a shipped checkpoint, a "
                         "checkpoint directory or a hub id)")
    return _ExportedRun(algo, config, task, tuple(f"{k}={v}" for k, v in kwargs.items()), model, steps, origin)


def _export(argv: list[str], prog: str) -> int:
    """``export PRESET --to trl|verl --task T --model M --out DIR [--set k=v ...]``: write the job, print its path."""
    args = _export_parser(prog).parse_args(argv)
    from .. import export

    for spec in args.imports:
        load_user_module(spec)
    if not (args.preset or args.config or args.run_dir):
        raise UsageError(f"give a PRESET such as GRPO, or --config / --run-dir of a run (see {prog} export --help)")
    run = _exported_run(args, prog)
    if not (args.profile or args.config or args.run_dir):
        print(f"{prog} export: no --profile / --config / --run-dir: the job has TrainerConfig() defaults (lr, sizes, "
              "schedule; --set changes them); give --profile cpu (the profile you trained with) or --run-dir DIR to "
              "export a run's settings", file=sys.stderr)
    set_cfg, set_algo = parse_set(args.overrides)
    try:
        algo = run.algo.replace(**set_algo) if set_algo else run.algo
        config = dataclasses.replace(run.config, **set_cfg)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{run.origin}: {exc}") from None
    args.task = run.task
    task = task_from_arguments(run.task, [*run.task_args, *args.task_args])
    out = Path(args.out).expanduser()
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise UsageError(f"--out {args.out}: the directory has files in it; give an empty or new directory, or "
                         "--overwrite to replace the job's files there")
    gpus = args.gpus_per_node if args.gpus_per_node is not None else (8 if args.to == "verl" else 1)
    common = dict(config=config, steps=run.steps, strict=not args.approximate)
    try:
        if args.to == "trl":
            devices = {} if args.nnodes * gpus == 1 else {"nnodes": args.nnodes, "n_gpus_per_node": gpus}
            out = export.trl_job(algo, task, resolve_model(run.model), out, **common, **devices)
        else:
            out = export.verl_job(algo, task, resolve_model(run.model), out, nnodes=args.nnodes,
                                  n_gpus_per_node=gpus, **common)
    except export.ExportError as err:
        raise UsageError(_command_line_words(str(err))) from None
    except (ImportError, OSError) as err:
        source = getattr(task, "source", None)
        if source is None:
            raise
        raise UsageError(f"--task {args.task}: its problems could not be read from source {source!r} "
                         f"({type(err).__name__}: {err}); give --task-arg source=PATH (a local copy) or "
                         "source=fixture (the problems shipped with grpo_lab)") from None
    where = f" (source {task.source!r})" if isinstance(getattr(task, "source", None), str) else ""
    print(f"wrote the {args.to} job of {algo.name} on {args.task}{where} to {out} (README.md says how to run it)")
    return 0


def task_from_arguments(name: str, items: Sequence[str]) -> Any:
    """The registered task ``name`` built from ``--task-arg KEY=VALUE`` items, each value typed by
    the task class's field (as ``--set`` types a TrainerConfig field, :func:`parse_value`).

    ``gsm8k`` without a ``source`` item reads ``$GRPO_LAB_GSM8K_SOURCE``, else
    :data:`grpo_lab.experiments.GPU_GSM8K_SOURCE` (``"hub"``), as the GPU profile does: a job
    for GSM8K trains on GSM8K unless the shipped fixture is asked for.

    Raises:
        UsageError: an unknown task (close names suggested), an item without ``=``, a key that is not
            a field of the task's class (the fields listed), a value not of the field's type, or
            values the task refuses (its ``ValueError`` / ``OSError``, e.g. no file at ``source``).
    """
    from ..experiments import GPU_GSM8K_SOURCE
    from ..tasks import TASKS, get_task

    if name not in TASKS:
        close = difflib.get_close_matches(name, list(TASKS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"--task: unknown task {name!r}{hint}; known tasks: {', '.join(sorted(TASKS))} (--import "
                         "adds your own)")
    cls = TASKS[name]
    hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
    fields = {f.name for f in dataclasses.fields(cls) if f.init} if dataclasses.is_dataclass(cls) else set()
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, text = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise UsageError(f"--task-arg expects KEY=VALUE, got {item!r} (e.g. --task-arg source=hub)")
        if key not in fields:
            raise UsageError(f"--task-arg {key}: not a field of task {name!r} ({cls.__name__}); its fields: "
                             f"{', '.join(sorted(fields)) or 'none'}")
        try:
            kwargs[key] = parse_value(key, text, hints.get(key, str))
        except UsageError as err:
            raise UsageError(str(err).replace("--set", "--task-arg", 1)) from None
    if name == "gsm8k" and "source" not in kwargs:
        kwargs["source"] = os.environ.get("GRPO_LAB_GSM8K_SOURCE") or GPU_GSM8K_SOURCE
    try:
        return get_task(name, **kwargs)
    except (ValueError, OSError) as err:
        given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "its defaults"
        raise UsageError(f"--task {name} with {given}: {err}") from None
