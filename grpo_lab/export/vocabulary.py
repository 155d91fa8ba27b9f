"""The field's vocabulary: which grpo_lab setting a TRL ``GRPOConfig`` or verl trainer-config option means.

grpo_lab refuses TRL's and verl's names (``num_generations``, ``beta``, ``loss_type``,
``clip_ratio_low``, ...; one spelling per setting) but says, for each, the grpo_lab field and value
that mean the same (:func:`explain`). Nothing is typed twice: the vocabulary is derived from the
export (:mod:`grpo_lab.export.translation`) and read back through the linter (:mod:`grpo_lab.export.lint`):

* **which key** (:func:`vocabulary`): each grpo_lab name the export writes from is perturbed in
  turn, GRPO exported with and without the change, and every library key whose value changes is
  that name's; a key written whatever the algorithm is a setting grpo_lab pins
  (``top_entropy_quantile=1.0``, ``clip_ratio_c=1e10``).
* **which value**: a choice the probes met is the export's table read backwards
  (:func:`grpo_lab.export.lint_base.inverse`); any other value is what
  :func:`~grpo_lab.export.lint.from_trl` / :func:`~grpo_lab.export.lint.from_verl` make of it.
* **which names**: a key by its full name or its last component, among the probed keys and those
  the linter knows (:mod:`grpo_lab.export.library_defaults`).

One reference is written by hand (:data:`SEE_ALSO`): verl's ``algorithm.kl_ctrl.kl_coef`` (a KL
penalty in the reward, switched off by the export) points at the key of grpo_lab's KL coefficient.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["Term", "NO_VALUE", "SEE_ALSO", "LIBRARY_NAMES", "vocabulary", "lookup", "translate_value", "explain",
           "combine", "RUN_OPTIONS"]

#: how messages name each library's configuration
LIBRARY_NAMES = {"trl": "TRL's GRPOConfig", "verl": "verl's trainer-config"}
#: library key -> (the switch the export pins off, the key whose grpo_lab name is the nearest setting)
SEE_ALSO = {("verl", "algorithm.kl_ctrl.kl_coef"): ("algorithm.use_kl_in_reward", "actor_rollout_ref.actor.kl_loss_coef")}
#: the preset the probes perturb
_BASE = "GRPO"
#: ``explain``'s ``value`` when no value is given (the message then names the grpo_lab setting only)
NO_VALUE = type("NoValue", (), {"__repr__": lambda self: "NO_VALUE"})()
_UNSET = NO_VALUE


@dataclass(frozen=True)
class Term:
    """One library option as grpo_lab reads it.

    Attributes:
        library: ``"trl"`` or ``"verl"``.
        key: the library's full name (verl: dotted, without Hydra's ``+``).
        names: the grpo_lab names (``Algorithm`` fields, ``TrainerConfig`` fields) whose export writes this key,
            in probe order; empty when grpo_lab has no such setting.
        same: the subset of ``names`` whose value the key carries unchanged (same value, same unit).
        values: ``{library value: {grpo_lab name: value}}``: the export's table read backwards (exact).
        pinned: the value the export always writes when ``names`` is empty (what grpo_lab computes), else
            ``None`` with ``pinned_known`` False.
        pinned_known: True when the export writes this key whatever the algorithm.
        linter: True when the linter (:mod:`grpo_lab.export.lint`) reads this key.
    """

    library: str
    key: str
    names: tuple = ()
    same: tuple = ()
    values: dict = field(default_factory=dict)
    pinned: Any = None
    pinned_known: bool = False
    linter: bool = False


# ---------------------------------------------------------------------------------------------
# the probes
# ---------------------------------------------------------------------------------------------
def _base_budget() -> dict:
    """The budget the probes export with: ``TrainerConfig()``'s, plus a generation budget and a schedule length."""
    from ..training.config import TrainerConfig
    from .optimisation import budget_from_config

    return budget_from_config(TrainerConfig(), max_new_tokens=64, lr_schedule_steps=10)


def _names() -> dict:
    """``{grpo_lab name: (owner, annotation)}`` of what the export writes from: Algorithm fields (but ``name``,
    ``params``) and the budget keys that are ``TrainerConfig`` fields."""
    from ..algo.algorithms import Algorithm
    from ..training.config import TrainerConfig
    from .translation import BUDGET_KEYS

    algo = typing.get_type_hints(Algorithm)
    cfg = typing.get_type_hints(TrainerConfig)
    out = {k: ("algorithm", h) for k, h in algo.items() if k not in ("name", "params")}
    out.update({k: ("trainer", cfg[k]) for k in BUDGET_KEYS if k in cfg})
    # the sampler's truncation (TrainerConfig.top_p / top_k, issue 53), also before its fields exist here
    out.update({k: ("trainer", h) for k, h in (("top_p", float), ("top_k", int)) if k not in out})
    return out


def _choices(target: str, name: str) -> list:
    """The string values a probe tries for ``name``: the export's own table keys for a registry axis."""
    from ..training.lr_schedule import LR_SCHEDULES
    from . import sampling as _smp
    from . import translation as _tr
    from .optimisation import EXPORT_PRECISIONS

    own = {"lr_schedule": LR_SCHEDULES, "precision": EXPORT_PRECISIONS, "old_logp": ("recompute", "behaviour"),
           "rollout_dtype": ("float32", "bfloat16", "float16"), "mismatch": _smp.MISMATCH_MODES, **_tr._MAPPED[target]}
    return list(own.get(name, ()))


def _alternatives(target: str, name: str, hint: Any, value: Any) -> list:
    """Values other than ``value`` for a probe of ``name`` (each tried; those the export refuses are skipped)."""
    union = typing.get_origin(hint) is typing.Union or type(hint).__name__ == "UnionType"
    kinds = [k for k in typing.get_args(hint) if k is not type(None)] if union else [hint]
    nullable = union and type(None) in typing.get_args(hint)
    kind = typing.get_origin(kinds[0]) or kinds[0]
    if isinstance(value, bool) or kind is bool:
        out = [not value]
    elif kind is str:
        out = _choices(target, name) + ([None] if nullable else [])
    elif isinstance(value, tuple) or kind is tuple:
        out = [tuple(v * 0.5 if j == i else v for j, v in enumerate(value)) for i in range(len(value))]
    elif value is None:
        out = [64, 8] if kind is int else [0.5, 0.25]
    elif kind is int:
        out = [value * 2, max(value // 2, 1), value + 1]
    else:
        out = [value * 0.5, value * 2] if value else [0.5]
    return [v for v in out if v != value]


def _export(target: str, algo, budget: dict) -> Optional[dict]:
    """``{library key: value}`` the export writes (verl's keys without Hydra's ``+``), or None when it refuses.

    The export's own axis-by-axis mapping (what :func:`~grpo_lab.export.translation.translate` runs after its
    checks), called without the installed-version check, so that a probe neither warns nor spends the
    once-per-process :class:`~grpo_lab.export.versions.LibraryVersionWarning` of a later export.
    """
    from . import translation as _tr

    try:
        config, _, issues = (_tr._trl if target == "trl" else _tr._verl)(algo, _tr._check_budget(budget))
    except ValueError:  # a combination the export does not split, or a size it needs
        return None
    if any(i.kind == "impossible" for i in issues):
        return None
    return {k.lstrip("+"): v for k, v in config.items()}


def _probe(target: str) -> tuple:
    """``(base config, [(name, value, config)], {name: base value})``: the base export, one export per perturbed
    value of each name, and each name's value in the base."""
    from ..algo.algorithms import get_algorithm

    algo, budget = get_algorithm(_BASE), _base_budget()
    runs = []
    for name, (owner, hint) in _names().items():
        value = getattr(algo, name) if owner == "algorithm" else budget.get(name)
        for alt in _alternatives(target, name, hint, value):
            try:
                changed = algo.replace(**{name: alt}) if owner == "algorithm" else algo
            except (ValueError, TypeError):
                continue
            cfg = _export(target, changed, budget if owner == "algorithm" else {**budget, name: alt})
            if cfg is not None:
                runs.append((name, alt, cfg))
    base_values = {n: (getattr(algo, n) if o == "algorithm" else budget.get(n)) for n, (o, _) in _names().items()}
    return _export(target, algo, budget), runs, base_values


def _same(a: Any, b: Any) -> bool:
    from .lint_base import _same as same

    return same(a, b)


def _terms(target: str) -> dict:
    """``{key: Term}`` of one library from the probes (see the module docstring)."""
    base, runs, base_values = _probe(target)
    names: dict = {}
    values: dict = {}
    carried: dict = {}
    for name, alt, cfg in runs:
        for key in set(cfg) | set(base):
            now = cfg.get(key, _UNSET)
            if now is not _UNSET and key in base and _same(now, base[key]) or now is _UNSET and key not in base:
                continue
            names.setdefault(key, []).count(name) or names[key].append(name)
            ok = now is not _UNSET and key in base and _same(now, alt) and _same(base[key], base_values[name])
            carried[(key, name)] = carried.get((key, name), True) and ok
            if _choice(now) and (now not in values.setdefault(key, {}) or now == alt):
                values[key][now] = {name: alt}  # the choice equal to the setting wins, else the first (inverse())
    out = {}
    for key in set(base) | set(names):
        found = tuple(names.get(key, ()))
        table = {base[key]: {n: base_values[n] for n in found}} if key in base and _choice(base[key]) and found else {}
        table.update({v: m for v, m in values.get(key, {}).items() if v not in table or v in m.values()})
        out[key] = Term(target, key, found, tuple(n for n in found if carried.get((key, n))), table,
                        None if found else base.get(key), not found)
    return out


def _choice(v: Any) -> bool:
    """True for a value that names a choice (a string, a flag, null), whose table entry means something; a
    number a setting is computed from (``per_device_train_batch_size``) is not one."""
    return isinstance(v, (str, bool, type(None)))


@functools.lru_cache(maxsize=None)
def vocabulary() -> dict:
    """Every library option the export writes or the linter reads, as a :class:`Term`.

    Built once per process (some hundred exports, about a second) and only when a foreign key is met.

    Returns:
        ``{(library, key): Term}``, library ``"trl"`` / ``"verl"``, key the library's full name.
    """
    from . import library_defaults as _D

    known = {"trl": set(_D.TRL_DEFAULTS), "verl": set(_D.VERL_DEFAULTS)}
    out = {}
    for library in ("trl", "verl"):
        terms = _terms(library)
        for key in known[library] - set(terms):
            terms[key] = Term(library, key)
        for key, term in terms.items():
            out[(library, key)] = dataclasses.replace(term, linter=key in known[library])
    return out


def lookup(key: str) -> list:
    """The :class:`Term` s a user's key may mean: in each library, its full name, else the keys it ends
    (``clip_ratio_low`` and ``actor.clip_ratio_low`` are verl's ``actor_rollout_ref.actor.clip_ratio_low``;
    ``temperature`` is TRL's and verl's ``actor_rollout_ref.rollout.temperature``).

    Args:
        key: the key as typed (``-`` read as ``_`` in a partial name, Hydra's ``+`` ignored).

    Returns:
        list of Terms, TRL's first; empty when neither library has the key.
    """
    key = str(key).lstrip("+").strip()
    out = []
    for library in ("trl", "verl"):
        keys = [k for (lib, k) in vocabulary() if lib == library]
        found = [k for k in keys if k == key] or [k for k in keys if k.endswith("." + key.replace("-", "_"))]
        out += [vocabulary()[(library, k)] for k in sorted(found)]
    return out


# ---------------------------------------------------------------------------------------------
# values
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _base_config(library: str) -> tuple:
    """The base preset's export to ``library`` (the probes' base), as ``((key, value), ...)``."""
    from ..algo.algorithms import get_algorithm

    return tuple(_export(library, get_algorithm(_BASE), _base_budget()).items())


def _reading(term: Term, value: Any = _UNSET):
    """The linter's reading of the base preset's export with ``key = value`` (unchanged when ``value`` is
    omitted), or the ValueError it raises."""
    from .lint import from_trl, from_verl

    config = dict(_base_config(term.library))
    if value is not _UNSET:
        config[term.key] = value
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return (from_trl if term.library == "trl" else from_verl)(config)
    except ValueError as exc:
        return exc


def translate_value(term: Term, value: Any) -> dict:
    """What ``term.key = value`` means in grpo_lab.

    Args:
        term: a :class:`Term` (:func:`lookup`).
        value: the library value (``"dr_grpo"``, ``8``, ``True``; a string that YAML reads as a number or a
            flag is read so).

    Returns:
        dict with ``settings`` (``{grpo_lab name: value}``, empty when none is known), ``exact`` (True: the
        value carries over, or the export's own table says so; False: the linter's nearest reading), ``notes``
        (the linter's words for what grpo_lab has no exact counterpart of, or its error for a value the library
        does not have) and ``preset`` (the preset the value names, or None).
    """
    from .lint_io import parse_value

    out = {"settings": {}, "exact": False, "notes": [], "preset": None}
    if term.same:  # the value as given: the fix repeats the user's own text
        out.update(settings={n: value for n in term.same}, exact=True)
        return out
    value = parse_value(value) if isinstance(value, str) else value
    if _choice(value) and value in term.values:
        out.update(settings=dict(term.values[value]), exact=True)
    if not term.linter:
        return out
    reading, base = _reading(term, value), _reading(term)
    if isinstance(reading, ValueError):  # a value the library does not have (the export's table wins)
        out["notes"] += [] if out["exact"] else [" ".join(str(reading).split())]
        return out
    short = term.key.rsplit(".", 1)[-1]
    if reading.named and f"{short}=" in reading.named[1]:
        out["preset"] = reading.named[0]
    old = () if isinstance(base, ValueError) else base.inexact
    out["notes"] += [line for line in reading.inexact if line not in old]
    if not out["settings"] and not isinstance(base, ValueError):
        fields = term.names or [f.name for f in dataclasses.fields(reading.algorithm) if f.name != "name"
                                and getattr(reading.algorithm, f.name) != getattr(base.algorithm, f.name)]
        out["settings"] = {n: getattr(reading.algorithm, n) for n in fields if hasattr(reading.algorithm, n)}
    return out


# ---------------------------------------------------------------------------------------------
# messages
# ---------------------------------------------------------------------------------------------
def _section(name: str) -> str:
    from ..algo.algorithms import Algorithm

    return "algorithm" if name in Algorithm.__dataclass_fields__ else "trainer"


def _text(value: Any) -> str:
    """A value as ``--set`` takes it (``none``, ``true``, ``0.9,0.99``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list)):
        return ",".join(_text(v) for v in value)
    return str(value)


def _fix(settings: dict, style: str) -> str:
    """``--set a=1 --set b=2`` (style ``"set"``) or ``a: 1 under trainer:, b: 2 under algorithm:`` (``"file"``)."""
    if style == "set":
        return " ".join(f"--set {k}={_text(v)}" for k, v in settings.items())
    return ", ".join(f"{k}: {_text(v) if not isinstance(v, (tuple, list)) else list(v)} under {_section(k)}:"
                     for k, v in settings.items())


def _see_also(term: Term, head: str, value: Any, style: str) -> str:
    """The message for a key of :data:`SEE_ALSO`: what the export pins off, and the nearest grpo_lab setting."""
    switch, near = SEE_ALSO[(term.library, term.key)]
    sw, nt = vocabulary()[(term.library, switch)], vocabulary()[(term.library, near)]
    fix = _fix({n: value for n in nt.same}, style) if value is not _UNSET else " / ".join(nt.same)
    return (f"{head}: it weighs a KL penalty in the reward ({switch}=true), which grpo_lab does not have (the export "
            f"writes {switch}={_text(sw.pinned)}); grpo_lab's KL term is in the loss, {' / '.join(nt.same)} (verl's "
            f"{near}): {fix}")


def _depends(term: Term, shown: tuple, style: str = "set") -> str:
    """For the names not in ``shown``: ``"; it also depends on minibatches (what minibatches is ...)"`` for
    budget names, and for an ``Algorithm`` field such as ``surrogate`` what to do (keep the preset's, or what another
    one changes)."""
    from .translation import BUDGET_KEYS

    rest = [n for n in term.names if n not in shown]
    if not rest:
        return ""
    budget = [n for n in rest if n in BUDGET_KEYS]
    fields = [n for n in rest if n not in BUDGET_KEYS]
    out = (f"; it also depends on {', '.join(budget)}" if shown and budget else "") + "".join(
        f" ({n}: {BUDGET_KEYS[n]})" for n in budget)
    if shown and fields:
        other = " or ".join(_fix({n: "NAME"}, style) for n in fields)
        out += (f"; this holds with the preset's {' and '.join(fields)}: keep {'them' if len(fields) > 1 else 'it'} "
                f"({other} changes its meaning)")
    return out


def _decide(names: tuple) -> str:
    return f"{' and '.join(names)} decide{'s' if len(names) == 1 else ''} it"


def _head(term: Term, typed: str) -> str:
    """``"TRL's GRPOConfig name"`` (with the full key when ``typed`` is shorter)."""
    return f"{LIBRARY_NAMES[term.library]} name" + (f" ({term.key})" if typed != term.key else "")


def _one(term: Term, typed: str, value: Any, style: str) -> str:
    """The message for one Term (see :func:`explain`)."""
    head = f"{typed} is {_head(term, typed)}"
    if (term.library, term.key) in SEE_ALSO:
        return _see_also(term, head, value, style)
    if not term.names:
        if term.pinned_known:
            from .lint_io import parse_value

            given = parse_value(value) if isinstance(value, str) else value
            drop = "; the value given is that one: drop the key" if value is not _UNSET and _same(given, term.pinned) \
                else ""
            return (f"{head}; grpo_lab has no such setting: it computes what {term.key}={_text(term.pinned)} "
                    f"does (what the export writes){drop}")
        return f"{head}; grpo_lab has no such setting (its linter reads it as outside the loss)"
    if value is _UNSET:
        return f"{head}; grpo_lab calls it {' / '.join(term.same or term.names)}"
    t = translate_value(term, value)
    if term.same:
        msg = f"{head}; grpo_lab calls it {' / '.join(term.same)}: {_fix(t['settings'], style)}"
    elif t["settings"]:
        how = "exactly" if t["exact"] else "the nearest reading"
        said = ", ".join(f"{k}={v!r}" for k, v in t["settings"].items())
        msg = f"{head}; in grpo_lab {_decide(term.names)}: {term.key}={_text(value)} is {said} ({how}): " \
              f"{_fix(t['settings'], style)}"
    else:
        msg = f"{head}; in grpo_lab {_decide(term.names)}"
    if t["preset"]:
        msg += _preset_hint(t["preset"], t["settings"])
    msg += _depends(term, tuple(t["settings"]) if term.same or t["settings"] else (), style)
    for note in t["notes"]:
        msg += f"; {note}" if t["settings"] else f"; no grpo_lab equivalent: {note}"
    return msg


def _preset_hint(name: str, settings: dict) -> str:
    """``", or the DAPO preset"``, or, where that preset sets a named field otherwise (DAPO's
    ``group_token_mean``, Eq. 12 per group, against TRL's ``loss_type=dapo``, a token mean over the
    batch), what it sets instead."""
    from ..algo.algorithms import get_algorithm

    try:
        preset = get_algorithm(name)
    except (KeyError, ValueError):
        return f", or the {name} preset"
    other = {k: getattr(preset, k) for k, v in settings.items() if hasattr(preset, k) and getattr(preset, k) != v}
    if not other:
        return f", or the {name} preset"
    said = ", ".join(f"{k}={v!r}" for k, v in other.items())
    return f" (the {name} preset differs here: it has {said})"


#: TRL names of a run's length, checkpoints, model and data (``TrainingArguments`` and the ``trl grpo`` script's
#: ``ModelConfig`` / ``ScriptArguments``), which no loss setting translates: ``{name: (what it is in TRL, the
#: grpo_lab fix on the command line, the fix in a run file)}``. ``N`` stands for the value given.
RUN_OPTIONS: dict = {
    "max_steps": ("TRL's run length in optimiser steps",
                  "--steps {v} (RL steps; each makes minibatches x epochs optimiser steps; a decaying lr schedule's "
                  "horizon is --set lr_schedule_steps={v})",
                  "steps: {v} at the top level (RL steps; a decaying lr schedule's horizon is lr_schedule_steps "
                  "under trainer:)"),
    "num_train_epochs": ("TRL's passes over the dataset",
                         "--steps N (grpo_lab counts RL steps of prompts_per_step prompts, not epochs)",
                         "steps: N at the top level (RL steps of prompts_per_step prompts, not epochs)"),
    "save_steps": ("TRL's checkpoint interval", "--set save_every={v}", "save_every: {v} under trainer:"),
    "model_name_or_path": ("TRL's ModelConfig model", "--model {v}", "model: {v} at the top level"),
    "dataset_name": ("TRL's ScriptArguments dataset",
                     "--task {v} (a registered task; your own data: a DatasetTask, see the guide's 'Your own data')",
                     "task: {v} at the top level (your own data: a DatasetTask)"),
}


def _run_option(key: str, value: Any, style: str) -> Optional[str]:
    """The text of :func:`explain` for a name of :data:`RUN_OPTIONS`, or None for another name."""
    typed = str(key).lstrip("+").strip()
    if typed not in RUN_OPTIONS:
        return None
    what, on_line, in_file = RUN_OPTIONS[typed]
    fix = (on_line if style == "set" else in_file)
    shown = "VALUE" if value is _UNSET or value is None else str(value).strip()
    return f"{typed} is {what}; in grpo_lab: {fix.format(v=shown)}"


def explain(key: str, value: Any = _UNSET, *, style: str = "set") -> Optional[str]:
    """What a TRL / verl option is called in grpo_lab, as the text of an error.

    Args:
        key: the key as the user typed it (full library name or its last component).
        value: the value given (text from ``--set``, or a YAML value); :data:`NO_VALUE` (the default): the
            names only.
        style: ``"set"`` (fixes written ``--set name=value``) or ``"file"`` (``name: value under trainer:``).

    Returns:
        ``"TRL's GRPOConfig num_generations; grpo_lab calls it group_size: --set group_size=8"`` (one clause
        per library that has the key, joined by ``" | "``), or None when neither library has ``key`` (the
        caller then suggests a close grpo_lab key).

    Raises:
        ValueError: an unknown ``style``.
    """
    if style not in ("set", "file"):
        raise ValueError(f"explain: style must be 'set' or 'file', got {style!r}")
    run = _run_option(key, value, style)
    if run is not None:
        return run
    terms = lookup(key)
    if not terms:
        return None
    typed = str(key).lstrip("+").strip()
    heads: dict[str, list[str]] = {}  # the message after its head -> the heads that share it
    for t in terms:
        head = _head(t, typed)
        heads.setdefault(_one(t, typed, value, style)[len(f"{typed} is {head}"):], []).append(head)
    return " | ".join(f"{typed} is {' and '.join(dict.fromkeys(h))}{body}" for body, h in heads.items())


def combine(found: list) -> str:
    """One error text for several foreign keys: their messages numbered (``(1) ... (2) ...``: the command line
    prints an error on one line), then a sentence pointing at the linter for whole TRL / verl files.

    Args:
        found: ``[(key as typed, its message)]``, in the order met.

    Returns:
        The message alone for one key; for several, the numbered messages and the ``check-config`` sentence.
    """
    if len(found) < 2:
        return "".join(m for _, m in found)
    keys = ", ".join(str(k) for k, _ in found)
    return "\n".join([f"({i}) {m}" for i, (_, m) in enumerate(found, 1)]
                     + [f"-- {len(found)} keys here are TRL / verl names ({keys}); to read a whole TRL GRPOConfig or verl "
                        "config as the grpo_lab algorithm it computes, run: python -m grpo_lab check-config FILE"])
