"""Configuration files: a run written down as YAML (``python -m grpo_lab --config run.yaml``), the resolved
configuration a run writes next to its results (``<out>/config.yaml``), and the file ``$GRPO_LAB_GPU_CONFIG``
names.

A run's file (YAML; JSON is YAML too) holds the command line's options as top-level keys, named as the
long option without its dashes (``lora_r`` for ``--lora-r``, ``cache: false`` for ``--no-cache``), and
two sections of fields::

    preset: DAPO
    profile: cpu
    seeds: [0, 1, 2]
    steps: 40
    out: runs/dapo.json
    trainer:                 # grpo_lab.training.trainer.TrainerConfig fields (--set keys of TrainerConfig)
      lr: 1.0e-4
      lr_schedule: cosine
      warmup: 5
    algorithm:               # grpo_lab.algo.algorithms.Algorithm fields and the hyper-parameters its functions declare
      eps_high: 0.28

Command-line flags win over the file (its options become the parser's defaults), ``--set`` over its
sections; ``--import`` and ``--set`` add to the file's. Values are checked against the types (a float
also from a string such as ``1e-4``, which YAML 1.1 reads as a string), then by the dataclasses'
validation. An unknown key is one error naming the file, the key, the closest and every known key.

The resolved configuration (:func:`resolved_config`) holds every option, the whole ``TrainerConfig``
(but ``seed``, ``progress`` and ``output_dir``) and the whole ``Algorithm``, so that
``--config <out>/config.yaml`` repeats the run. This module imports nothing from the package: the
command line (:mod:`grpo_lab.cli.main`) hands it its parser and ``--set`` keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..paths import write_text_atomically

__all__ = ["RunConfig", "read_config_file", "check_value", "check_fields", "load_run_config", "file_imports",
           "resolved_config", "write_config", "run_dir", "config_path", "NOT_IN_FILE", "DERIVED_TRAINER_FIELDS"]

#: argparse destinations that are not options of a run, hence not keys of a config file
NOT_IN_FILE = ("help", "version", "config", "overrides", "debug", "overwrite", "resume")
#: the ``TrainerConfig`` fields the resolved configuration leaves out, which are one per run (``seed``), a
#: top-level option (``progress``, ``report_to``) or decided by ``out`` (``output_dir``)
DERIVED_TRAINER_FIELDS = ("seed", "progress", "report_to", "output_dir")
#: the two sections of a run's file
SECTIONS = ("trainer", "algorithm")
_KEY_OF_DEST = {"imports": "import"}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A run's configuration file, checked (:func:`load_run_config`).

    Attributes:
        path: the file.
        options: ``{argparse destination: value}`` of its top-level keys (``imports`` for ``import``).
        trainer: ``{TrainerConfig field: value}`` of its ``trainer`` section.
        algorithm: ``{Algorithm field or hyper-parameter: value}`` of its ``algorithm`` section.
    """

    path: Path
    options: dict
    trainer: dict
    algorithm: dict


def read_config_file(path: str | os.PathLike, what: str = "--config") -> dict:
    """The mapping a YAML (or JSON) file holds, read with ``yaml.safe_load`` (never evaluated).

    Args:
        path: the file (``~`` expanded).
        what: how errors name where the path came from (``"--config"``, ``"$GRPO_LAB_GPU_CONFIG"``).

    Returns:
        ``{str: value}`` (``{}`` for an empty file).

    Raises:
        ValueError: no such file, not YAML (the message gives YAML's line and column), or not a mapping with
            string keys (each naming the file).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"{what} {path}: no such file" + (" (a directory)" if p.is_dir() else ""))
    try:
        with p.open(encoding="utf-8") as stream:  # YAML's messages then name the file
            data = yaml.safe_load(stream)
    except yaml.YAMLError as exc:
        raise ValueError(f"{what} {path}: not valid YAML: {' '.join(str(exc).split())}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} {path}: cannot be read ({exc})") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ValueError(f"{what} {path}: must be a mapping of names to values (key: value lines), got "
                         f"{type(data).__name__ if not isinstance(data, dict) else 'a non-string key'}")
    return data


def _split(hint) -> tuple[list, bool]:
    """``(the kinds of an annotation other than None, whether None is allowed)``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        return [a for a in args if a is not type(None)], type(None) in args
    return [hint], hint is None or hint is type(None)


def _describe(kinds: list, nullable: bool) -> str:
    names = [getattr(typing.get_origin(k) or k, "__name__", str(k)) for k in kinds]
    names = ["list" if n == "tuple" else n for n in names]  # YAML writes a tuple as a list
    return " or ".join(names) + (" or null" if nullable else "")


def check_value(name: str, value: Any, hint: Any) -> Any:
    """``value`` (from YAML) checked against the annotation ``hint`` and converted where YAML's types differ.

    ``bool``: a bool; ``int``: an int (not a bool); ``float``: a number, or a string that is one (YAML 1.1
    reads ``1e-4`` as a string); ``str``: a string; ``tuple`` / ``list``: a list (a ``tuple`` hint returns a
    tuple); ``None`` where the hint allows it (``Optional``). Other annotations (``Any``, ``Mapping``, a
    class) are not checked here (the dataclass validates them).

    Args:
        name: how the error names the value (``"--config run.yaml: trainer: lr"``).
        value: the value read from the file.
        hint: the field's annotation (``float``, ``int | None``, ``Optional[str]``, ``tuple``).

    Raises:
        ValueError: ``"{name} must be {type}, got {value!r}"``.
    """
    kinds, nullable = _split(hint)
    if value is None:
        if nullable or any(k is Any for k in kinds):
            return None
    elif any(k is Any or k not in (bool, int, float, str) and typing.get_origin(k) not in (tuple, list)
             and k not in (tuple, list) for k in kinds):
        return value  # an annotation this check does not know: the dataclass validates it
    elif isinstance(value, bool):
        if bool in kinds:
            return value
    elif isinstance(value, int) and int in kinds:
        return value
    elif isinstance(value, (int, float)) and float in kinds:
        return float(value)
    elif isinstance(value, str):
        if str in kinds:
            return value
        if float in kinds:
            try:
                return float(value)
            except ValueError:
                pass
    elif isinstance(value, (list, tuple)):
        for k in kinds:
            if k in (tuple, list) or typing.get_origin(k) in (tuple, list):
                return tuple(value) if (typing.get_origin(k) or k) is tuple else list(value)
    raise ValueError(f"{name} must be {_describe(kinds, nullable)}, got {value!r}")


def _foreign(where: str, key: str, value: Any, top: bool) -> str | None:
    """The error text for a TRL / verl option name (:func:`grpo_lab.export.vocabulary.explain`, fixes written as
    file lines; at the file's top level the linter named too), or None for a key neither library has."""
    from ..export.vocabulary import NO_VALUE, explain

    said = explain(key, NO_VALUE if value is ... else value, style="file")
    if said is None:
        return None
    hint = "; a whole TRL GRPOConfig or verl config file is read by: python -m grpo_lab check-config FILE" if top else ""
    return f"{where}: {key}: {said}{hint}"


def _unknown(where: str, key: str, known: list[str], extra: str = "", value: Any = ...,
             top: bool = False) -> ValueError:
    """The error for an unknown key: what a TRL / verl option name means in grpo_lab (:func:`_foreign`; ``value``
    the file's value, ``...`` when not known), else the closest known key (difflib) and every known key."""
    said = _foreign(where, key, value, top)
    if said is not None:
        return ValueError(said)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)  # difflib's 0.6 offers unrelated keys
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(f"{where}: unknown key {key!r}{hint}{extra}; known keys: {', '.join(sorted(known))}")


def check_fields(values: Mapping[str, Any], known: Mapping[str, Any], where: str,
                 elsewhere: Mapping[str, str] | None = None, found: list | None = None) -> dict:
    """``values`` with every key known and every value of its field's type (:func:`check_value`).

    Args:
        values: ``{key: value}`` read from a file.
        known: ``{key: annotation}`` of the keys allowed here.
        where: how errors name the place (``"run.yaml: trainer"``).
        elsewhere: ``{key: why}`` for keys that belong somewhere else (``"seed": "use seeds: ..."``): an
            unknown key found here gets that reason instead of a did-you-mean.
        found: None (the default: raise for this section's keys), or a list to which every unknown or TRL / verl
            key is appended as ``(key, message, is_foreign)`` instead, for one error over several sections
            (``_raise_found``).

    Raises:
        ValueError: an unknown key (naming it, the closest known key and every known key); TRL / verl option
            names (one error for all of them, each with the grpo_lab field and value that mean the same, and the
            linter ``check-config`` named when there are several); or a value of the wrong type.
    """
    from ..export.vocabulary import combine

    out, bad = {}, []
    for key, value in values.items():
        if key not in known:
            if elsewhere and key in elsewhere:
                bad.append((key, f"{where}: {key!r} does not belong here: {elsewhere[key]}", False))
            elif (said := _foreign(where, key, value, top=False)) is not None:
                bad.append((key, said, True))
            else:
                bad.append((key, str(_unknown(where, key, list(known))), False))
            if found is None and not bad[-1][2]:
                raise ValueError(bad[-1][1])
            continue
        out[key] = check_value(f"{where}: {key}", value, known[key])
    if found is not None:
        found.extend(bad)
    elif bad:
        raise ValueError(combine([(k, m) for k, m, _ in bad]))
    return out


def _raise_found(found: list) -> None:
    """One error for the keys :func:`check_fields` collected over several sections: the unknown ones, then the
    TRL / verl ones (:func:`grpo_lab.export.vocabulary.combine`); nothing when ``found`` is empty.

    Raises:
        ValueError: ``found`` is not empty.
    """
    from ..export.vocabulary import combine

    foreign = [(k, m) for k, m, is_foreign in found if is_foreign]
    plain = [m for _, m, is_foreign in found if not is_foreign]
    if len(plain) > 1:  # numbered: the command line prints an error on one line
        plain = [f"({i}) {m}" for i, m in enumerate(plain, 1)]
    if found:
        raise ValueError("\n".join(plain + ([combine(foreign)] if foreign else [])))


def _option_hints(parser) -> dict[str, tuple[Any, Any]]:
    """``{file key: (argparse action, annotation)}`` of the parser's options that a file may set: flags are
    bools (``--progress/--no-progress``: a bool or null), options of several values (``nargs='+'``,
    ``append``) lists, the others their ``type`` (a string without one), null allowed (not given)."""
    import argparse

    out = {}
    for action in parser._actions:  # argparse keeps no public list of its actions
        if action.dest in NOT_IN_FILE or action.dest is argparse.SUPPRESS:
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            hint = bool | None
        elif action.nargs == 0:
            hint = bool
        elif action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction):
            hint = list | None
        else:
            hint = (action.type if action.type in (int, float) else str) | None
        out[_KEY_OF_DEST.get(action.dest, action.dest)] = (action, hint)
    return out


def _check_option(where: str, key: str, action, hint, value: Any) -> Any:
    """One top-level value: its type (:func:`check_value`), each element's type for a list option, and the
    option's ``choices`` (with a did-you-mean)."""
    several = typing.get_origin(hint) in (typing.Union, types.UnionType) and list in typing.get_args(hint)
    if several and value is not None and not isinstance(value, (list, tuple)):
        value = [value]  # one value of an option that takes several: `seeds: 0` is `seeds: [0]`
    value = check_value(f"{where}: {key}", value, hint)
    if isinstance(value, list):
        elem = action.type if action.type in (int, float) else str
        value = [check_value(f"{where}: {key}[{i}]", v, elem) for i, v in enumerate(value)]
    if action.choices is not None and value is not None:
        for v in value if isinstance(value, list) else [value]:
            if v not in action.choices:
                close = difflib.get_close_matches(str(v), [str(c) for c in action.choices], n=1)
                hint_ = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"{where}: {key}: {v!r} is not a choice{hint_}; choices: "
                                 f"{', '.join(map(str, action.choices))}")
    return value


def file_imports(data: Mapping[str, Any], path: str | os.PathLike) -> list[str]:
    """The modules a run's file imports (its ``import`` key: a module or file name, or a list of them),
    read before the parser is built (its choices include what they register).

    Raises:
        ValueError: ``import`` is not a string or a list of strings (naming the file).
    """
    value = data.get("import", [])
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"--config {path}: import must be a module name or a list of them, got {value!r}")
    return value


def load_run_config(data: Mapping[str, Any], path: str | os.PathLike, parser, settable: Mapping[str, tuple],
                    reserved: Mapping[str, str] | None = None) -> RunConfig:
    """A run's file checked against the command line that will run it.

    Args:
        data: the file's mapping (:func:`read_config_file`).
        path: the file (for messages).
        parser: the ``train`` parser (:func:`grpo_lab.cli.main.build_parser`): its options are the top-level keys.
        settable: ``{key: (owner, annotation, default)}``, :func:`grpo_lab.cli.main.settable_fields`: owner
            ``"TrainerConfig"`` keys go under ``trainer``, the others under ``algorithm``.
        reserved: ``{field: why}`` for fields set by a top-level option (``seed``: ``seeds``).

    Returns:
        A :class:`RunConfig` (``options`` keyed by argparse destination, ready for ``parser.set_defaults``).

    Raises:
        ValueError: an unknown key at the top or in a section (naming the file, the key, the closest known
            key and the section's known keys; a field at the top level or in the other section is told where
            it goes), a section that is not a mapping, or a value of the wrong type or not among an option's
            choices.
    """
    where = f"--config {path}"
    options = _option_hints(parser)
    owners = {k: ("trainer" if owner == "TrainerConfig" else "algorithm") for k, (owner, _, _) in settable.items()}
    moved = {**{k: f"put it under {sec}:" for k, sec in owners.items()},
             **{k: f"{why} (a top-level key)" for k, why in (reserved or {}).items()}}
    out, found = {"options": {}, "trainer": {}, "algorithm": {}}, []
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise ValueError(f"{where}: {key} must be a mapping of fields to values, got {value!r}")
            if key == "algorithm":  # a file written before clip was renamed surrogate (and is_weight cispo)
                value = _migrated(value, f"{where}: algorithm")
            known = {k: settable[k][1] for k, sec in owners.items() if sec == key}
            other = {k: f"it belongs in the {sec}: section" for k, sec in owners.items() if sec != key}
            out[key] = check_fields(value, known, f"{where}: {key}", {**other, **(reserved or {})}, found)
        elif key in options:
            action, hint = options[key]
            out["options"][action.dest] = _check_option(where, key, action, hint, value)
        elif key in moved:
            raise ValueError(f"{where}: {raw_key!r} is not a top-level key: {moved[key]}")
        else:
            raise _unknown(where, raw_key, [*options, *SECTIONS], value=value, top=True)
    _raise_found(found)
    return RunConfig(Path(path), **out)


def _migrated(section: Mapping[str, Any], where: str) -> dict:
    """An ``algorithm:`` section with old names replaced (:func:`grpo_lab.algo.algorithms.migrate_fields`).

    Raises:
        ValueError: both ``clip`` and ``surrogate`` given (naming the file).
    """
    from ..algo.algorithms import migrate_fields

    try:
        return migrate_fields(section)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def resolved_config(options: Mapping[str, Any], config, algo) -> dict:
    """The resolved configuration of a run, as :func:`write_config` writes it and :func:`load_run_config`
    reads it back.

    Args:
        options: ``{argparse destination: value}`` of every option after file and flags (the effective
            preset, profile, task, model, steps, seeds, out, ...); destinations in :data:`NOT_IN_FILE` are
            left out.
        config: the :class:`~grpo_lab.training.trainer.TrainerConfig` the run uses (:data:`DERIVED_TRAINER_FIELDS`
            left out).
        algo: the :class:`~grpo_lab.algo.algorithms.Algorithm` it trains (``params`` become keys of ``algorithm``).

    Returns:
        ``{option key: value, ..., "trainer": {...}, "algorithm": {...}}`` of plain YAML values.
    """
    top = {_KEY_OF_DEST.get(k, k): (list(v) if isinstance(v, tuple) else v)
           for k, v in options.items() if k not in NOT_IN_FILE}
    trainer = {k: v for k, v in config.to_dict().items() if k not in DERIVED_TRAINER_FIELDS}
    described = algo.describe()
    params = dict(described.pop("params", {}) or {})
    algorithm = {k: (list(v) if isinstance(v, tuple) else v) for k, v in {**described, **params}.items()}
    return {**top, "trainer": trainer, "algorithm": algorithm}


def run_dir(out: str | os.PathLike) -> Path:
    """The directory of a run beside its results file: ``out`` without its ``.json`` suffix
    (``runs/dapo.json`` → ``runs/dapo``; another name gets ``.d``: ``runs/dapo`` → ``runs/dapo.d``), as
    :func:`grpo_lab.experiments.run_dirs.run_directory` says."""
    from .run_dirs import run_directory

    return run_directory(out)


def config_path(out: str | os.PathLike) -> Path:
    """Where the resolved configuration of the run whose results go to ``out`` is written:
    ``run_dir(out) / "config.yaml"``."""
    return run_dir(out) / "config.yaml"


class _Dumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` writing lists on one line (``seeds: [0, 1, 2]``), mappings as blocks."""


_Dumper.add_representer(list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data,
                                                                              flow_style=True))


def write_config(path: str | os.PathLike, resolved: Mapping[str, Any], header: str = "") -> Path:
    """Write ``resolved`` as YAML (``yaml.safe_dump``, keys in order), ``header`` as comment lines first;
    written beside and renamed over, so a reader never sees half a file.

    Raises:
        OSError: the directory cannot be created or the file written.
    """
    text = "".join(f"# {line}\n" for line in header.splitlines())
    text += yaml.dump(dict(resolved), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
    return write_text_atomically(path, text)
