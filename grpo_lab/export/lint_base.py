"""What the TRL and verl readers of :mod:`grpo_lab.export.lint` share: the draft of a reading, typed
access to a configuration's values, and the check of a reading against the export's own mapping.

A reader turns a configuration (library defaults filled in) into the keyword arguments of a grpo_lab
:class:`~grpo_lab.algo.algorithms.Algorithm` plus what no Algorithm field expresses. :func:`verify` then
exports that Algorithm back with :func:`grpo_lab.export.translation.translate` and compares, key by key, the loss
settings the export writes with the configuration's: the mapping tables of
:mod:`grpo_lab.export.translation` stay the one source of truth, and a reading the export would not
reproduce is reported rather than trusted.
"""

from __future__ import annotations

import difflib
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import translation as _tr
from .lint_io import parse_override

__all__ = ["Draft", "Values", "verify", "inverse", "did_you_mean"]


@dataclass
class Draft:
    """A reading being built.

    Attributes:
        library: ``"trl"`` or ``"verl"``.
        fields: keyword arguments of :class:`~grpo_lab.algo.algorithms.Algorithm`.
        inexact: what the library computes that no Algorithm field expresses, one line each (the
            reading's Algorithm is then the nearest, and ``Reading.exact`` is False).
        notes: settings read that are outside the loss (optimiser, sampling, sizes), one line each.
        explained: configuration keys whose value the reader has accounted for (:func:`verify` skips them).
        named: the preset name (a key of :data:`grpo_lab.algo.algorithms.PRESETS`, or ``"DeepSeek-V3.2"``)
            the configuration names by its choices, and how (``("DAPO", "loss_type='dapo'")``), or None.
    """

    library: str
    fields: dict = field(default_factory=dict)
    inexact: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    explained: set = field(default_factory=set)
    named: Optional[tuple] = None


class Values:
    """Typed access to a flat configuration ``{key: value}`` (library defaults filled in).

    Every accessor raises ``ValueError`` naming the library, the key, the value and the expected type.
    """

    def __init__(self, library: str, values: dict):
        self.library, self.values = library, values

    def _bad(self, key: str, kind: str):
        return ValueError(f"{self.library} config: {key} must be {kind}, got {self.values.get(key)!r}")

    def get(self, key: str) -> Any:
        """The raw value (None when absent)."""
        return self.values.get(key)

    def number(self, key: str, *, none: bool = False) -> Optional[float]:
        """A finite real number (``none``: or None), as a float."""
        v = self.values.get(key)
        if v is None and none:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            raise self._bad(key, "a number" + (" or null" if none else ""))
        return float(v)

    def integer(self, key: str, *, none: bool = False) -> Optional[int]:
        """An int (``none``: or None)."""
        v = self.values.get(key)
        if v is None and none:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._bad(key, "an integer" + (" or null" if none else ""))
        return v

    def flag(self, key: str) -> bool:
        """True or False."""
        v = self.values.get(key)
        if not isinstance(v, bool):
            raise self._bad(key, "true or false")
        return v

    def text(self, key: str, choices: Optional[tuple] = None, *, none: bool = False) -> Optional[str]:
        """A string, one of ``choices`` when given (the error then suggests the closest)."""
        v = self.values.get(key)
        if v is None and none:
            return None
        if not isinstance(v, str):
            raise self._bad(key, "a string")
        if choices is not None and v not in choices:
            raise ValueError(f"{self.library} config: unknown {key} {v!r}{did_you_mean(v, choices)}; "
                             f"known: {list(choices)}")
        return v


def did_you_mean(word: str, known) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``known`` (difflib, similarity ratio >= 0.75), or ``""``."""
    # 0.75, not difflib's 0.6: 0.6 offered torch_dtype -> torch_compile and dataset_name -> data_seed (other
    # options), while one- and two-letter slips of names this long stay above 0.8
    close = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def inverse(table: dict) -> dict:
    """A mapping table of :mod:`grpo_lab.export.translation` (grpo_lab choice -> library setting) read
    backwards: library setting -> the grpo_lab choice that the library computes *exactly* under it.

    Several grpo_lab choices may share one setting (``"token_mean"`` and ``"group_token_mean"`` both
    export as TRL's ``loss_type='dapo'``): the choice equal to the setting wins (TRL's ``_TRL_KL``
    maps ``k1``, ``k2``, ``k3`` to ``k3``), else the first in the table's order, which lists the exact
    mapping before the approximate ones.
    """
    out: dict = {}
    for ours, theirs in table.items():
        if theirs not in out or ours == theirs:
            out[theirs] = ours
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal as configuration values (numbers compared as floats, lists as tuples)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return float(a) == float(b)
    return a == b


def verify(algo, d: Draft, config: dict, budget: dict, moot: Callable[[str], bool],
           describe: Callable[[str, Any], str]) -> None:
    """Export ``algo`` back to ``d.library`` and add a line to ``d.inexact`` for each difference.

    ``config`` is the flat configuration (defaults filled in, values normalised as the export writes
    them); a key the export writes is compared unless the reader explained it (``d.explained``) or
    ``moot(key)`` says the library ignores it in this configuration. Each issue of the export itself
    (e.g. TRL counting the empty rows of Overlong Filtering in its sequence mean) is a line too.

    Args:
        algo: the reading's :class:`~grpo_lab.algo.algorithms.Algorithm`.
        d: the draft (its ``inexact`` grows).
        config: ``{key: value}``, keys as :func:`grpo_lab.export.translation.translate` writes them (verl: dotted,
            without ``+``).
        budget: the budget passed to the export (``max_new_tokens``, ``group_size``).
        moot: ``key -> True`` when the library ignores ``key`` in this configuration.
        describe: ``(key, configured value) -> text`` of what that value makes the library compute.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", _tr.ApproximateExportWarning)
            tr = _tr.translate(algo, d.library, strict=False, **budget)
    except ValueError as exc:  # ExportError, or a budget the reading does not fit (an L_cache > L_max / 2)
        d.inexact.append(" ".join(str(exc).split()))
        return
    exported = tr.config if isinstance(tr.config, dict) else dict(parse_override(line) for line in tr.config)
    for key, value in exported.items():
        if key in d.explained or key in budget_keys(d.library) or moot(key):
            continue
        if not _same(config.get(key), value):
            d.inexact.append(describe(key, config.get(key)))
    d.inexact.extend(f"{i.message}" for i in tr.issues)


def budget_keys(library: str) -> frozenset:
    """The keys the export writes from the budget (sizes, optimiser, schedule, precision), not from the algorithm:
    the optimisation keys are those :func:`grpo_lab.export.optimisation.trl_optimisation` /
    ``verl_optimisation`` write for a full budget (their values are read as notes, not as the loss)."""
    from ..algo.algorithms import GRPO
    from . import optimisation as _opt

    full = {"lr": 1e-6, "grad_clip": 1.0, "lr_schedule": "cosine", "lr_schedule_steps": 2, "warmup": 0,
            "betas": (0.9, 0.99), "weight_decay": 0.0, "precision": "float32", "epochs": 1, "minibatches": 1}
    if library == "trl":
        return frozenset({"num_generations", "max_completion_length", *_opt.trl_optimisation(GRPO, full)[0]})
    written = _opt.verl_optimisation(GRPO, full)[0]
    return frozenset({"actor_rollout_ref.rollout.n", "data.max_response_length", *(k.lstrip("+") for k in written)})

