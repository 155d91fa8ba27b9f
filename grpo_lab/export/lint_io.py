"""Reading a TRL or verl configuration into a flat ``{key: value}`` dict, for :mod:`grpo_lab.export.lint`.

* TRL: a ``trl.GRPOConfig`` (its dataclass fields), a dict of its fields, or the path of a YAML file of
  them (TRL's ``--config`` form);
* verl: a nested dict (as ``ppo_trainer.yaml``), a dict of dotted keys, a list of Hydra overrides
  (``key=value``, ``+key=value``, ``++key=value``: what :func:`grpo_lab.export.translation.to_verl` returns), or the
  path of a YAML file holding either a mapping or such a list.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

__all__ = ["load_yaml", "parse_value", "parse_override", "flatten", "trl_values", "verl_values"]


def load_yaml(path: Any) -> Any:
    """The parsed content of a YAML (or JSON) file, or the list of its lines for a file of Hydra overrides
    one per line (``key=value``, as a verl job's ``overrides.txt``; ``#`` comments and blank lines skipped).

    Raises:
        FileNotFoundError: no such file (the message names it).
        ValueError: the file is not valid YAML (the message names it and the parser's reason).
    """
    import yaml

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file {str(p)!r} does not exist" if not p.exists()
                                else f"config path {str(p)!r} is not a file")
    text = p.read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if lines and all("=" in ln and not ln.startswith("-") and ":" not in ln.split("=", 1)[0] for ln in lines):
        return lines  # overrides, one a line: YAML would read them as one string
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"config file {str(p)!r} is not valid YAML: {' '.join(str(exc).split())}") from None


def parse_value(text: str) -> Any:
    """A Hydra override's value as a python value: ``True`` / ``null`` / ``[0.9,0.99]`` / ``1e-06`` /
    ``seq-mean-token-mean`` (YAML, plus the exponent floats without a dot that YAML 1.1 reads as text)."""
    import yaml

    try:
        v = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(v, str):
        try:
            return float(v) if v.strip().lower() not in ("nan", "inf", "-inf", "infinity") else v
        except ValueError:
            return v
    return v


def parse_override(line: Any) -> tuple:
    """``"++a.b=1e-06"`` -> ``("a.b", 1e-06)``.

    Raises:
        ValueError: not a string of the form ``key=value`` (the message shows it).
    """
    if not isinstance(line, str) or "=" not in line or not line.split("=", 1)[0].lstrip("+~").strip():
        raise ValueError(f"verl override {line!r} is not of the form key=value")
    key, value = line.split("=", 1)
    return key.lstrip("+~").strip(), parse_value(value.strip())


def flatten(tree: dict, prefix: str = "") -> dict:
    """A nested mapping as ``{dotted key: leaf}`` (lists are leaves; keys already dotted stay as they are)."""
    out: dict = {}
    for k, v in tree.items():
        key = f"{prefix}{str(k).lstrip('+')}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _source(config: Any) -> tuple:
    """``(content, label)``: a path is read (its name is the label), anything else is passed through."""
    if isinstance(config, (str, os.PathLike)):
        return load_yaml(config), str(config)
    return config, None


def trl_values(config: Any) -> tuple:
    """``({GRPOConfig field: value}, label)`` from a ``GRPOConfig``, a dict or a YAML file path.

    Raises:
        FileNotFoundError, ValueError: a missing file, invalid YAML, content that is not a mapping, or a
            key that is not a string.
    """
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}, type(config).__name__
    content, label = _source(config)
    if not isinstance(content, dict):
        where = f"config file {label!r}" if label else "config"
        raise ValueError(f"TRL {where} must be a mapping of GRPOConfig fields (name: value), got "
                         f"{type(content).__name__}")
    bad = [k for k in content if not isinstance(k, str)]
    if bad:
        raise ValueError(f"TRL config keys must be GRPOConfig field names (strings), got {bad[0]!r}")
    return dict(content), label


def verl_values(config: Any) -> tuple:
    """``({dotted key: value}, label)`` from a nested or dotted dict, a list of overrides or a YAML path.

    Raises:
        FileNotFoundError, ValueError: a missing file, invalid YAML, content that is neither a mapping nor
            a list of ``key=value`` strings, or a malformed override.
    """
    content, label = _source(config)
    if isinstance(content, (list, tuple)):
        return dict(parse_override(line) for line in content), label
    if not isinstance(content, dict):
        where = f"config file {label!r}" if label else "config"
        raise ValueError(f"verl {where} must be a mapping (as ppo_trainer.yaml) or a list of key=value "
                         f"overrides, got {type(content).__name__}")
    return flatten(content), label
