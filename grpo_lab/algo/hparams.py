"""Hyper-parameters that the registry functions declare, and what they require of the other axes.

A registry function (an advantage estimator, a ratio, a surrogate, an aggregation, a KL estimator) declares
its hyper-parameters as **keyword-only parameters with defaults**: ``def sapo_surrogate(ctx, *, tau_pos=1.0,
tau_neg=1.05)``. An :class:`~grpo_lab.algo.algorithms.Algorithm` gives each a value
(:meth:`~grpo_lab.algo.algorithms.Algorithm.values_for`): from ``Algorithm.params``, else the ``Algorithm``
field of that name (``eps_low``, ``adv_eps``, ``gamma``, ...), else the default; the value is checked against
the declared type, shown by ``axes()``, accepted by ``replace()`` and ``--set``, saved in checkpoints and
keyed in the run cache.

:func:`declare` adds ``requires`` (choices needed on other axes, e.g. GMPO's ``ratio_level="token"``),
``validate`` (``validate(values) -> None`` raising ``ValueError``) and ``batch_statistics`` (``{name:
statistic(ctx, **values) -> Tensor [B, ...]}``, computed once over the whole minibatch before micro-batching:
:func:`grpo_lab.algo.objectives.batch_statistics`).

This module imports nothing from the package.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

__all__ = ["Spec", "Params", "declare", "spec", "hyperparameters", "own_hyperparameters", "annotation",
           "REQUIRED"]

#: the default of a hyper-parameter declared without one (the algorithm must give a value)
REQUIRED = inspect.Parameter.empty


class Params(dict):
    """A read-only ``dict`` of hyper-parameter values (``Algorithm.params``): a frozen algorithm's values
    cannot change under it (``SAPO.params["tau_neg"] = 2`` raises ``TypeError``; use ``SAPO.replace(tau_neg=2)``).
    Still a ``dict`` for JSON, ``dataclasses.asdict``, copying and pickling."""

    def _read_only(self, *args, **kwargs):
        """Raises ``TypeError``: the values are read-only."""
        raise TypeError("Algorithm.params is read-only: use algo.replace(name=value) for another value")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only

    def __reduce__(self):
        return (type(self), (dict(self),))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


@dataclass(frozen=True)
class Spec:
    """What a registry function declares besides its hyper-parameters (see :func:`declare`).

    Attributes:
        requires: ``{Algorithm field: allowed values (a tuple)}``.
        validate: ``None`` or ``validate(values: dict) -> None`` raising ``ValueError``.
        batch_statistics: ``{name: statistic(ctx, **values) -> Tensor [B, ...]}``.
    """

    requires: Mapping[str, tuple] = field(default_factory=dict)
    validate: Optional[Callable[[dict], None]] = None
    batch_statistics: Mapping[str, Callable[..., Any]] = field(default_factory=dict)


_EMPTY = Spec()


def declare(*, requires: Optional[Mapping[str, Any]] = None, validate: Optional[Callable[[dict], None]] = None,
            batch_statistics: Optional[Mapping[str, Callable[..., Any]]] = None) -> Callable:
    """Decorator that attaches a :class:`Spec` to a registry function (read back by :func:`spec`).

    Args:
        requires: ``{Algorithm field: value or tuple of values}`` the function needs on other axes.
        validate: called with ``{name: value}`` of every hyper-parameter the function declares.
        batch_statistics: ``{name: statistic}``: statistics over the whole minibatch.

    Raises:
        ValueError: a ``requires`` key that is not a string, a non-callable ``validate`` or statistic.
    """
    req = {k: (tuple(v) if isinstance(v, (tuple, list, set, frozenset)) else (v,))
           for k, v in (requires or {}).items()}
    stats = dict(batch_statistics or {})
    if any(not isinstance(k, str) for k in req) or any(not isinstance(k, str) for k in stats):
        raise ValueError("declare(): requires and batch_statistics are keyed by name (str)")
    if validate is not None and not callable(validate) or not all(map(callable, stats.values())):
        raise ValueError("declare(): validate and every batch statistic must be callable")

    def attach(fn: Callable) -> Callable:
        fn.grpo_lab_spec = Spec(req, validate, stats)
        return fn

    return attach


def spec(fn: Callable) -> Spec:
    """The :class:`Spec` declared on ``fn`` (an empty one when it declares nothing)."""
    s = getattr(fn, "grpo_lab_spec", None)
    return s if isinstance(s, Spec) else _EMPTY


def own_hyperparameters(fn: Callable) -> dict[str, Any]:
    """``{name: default}`` of ``fn``'s keyword-only parameters, in order of declaration
    (:data:`REQUIRED` where it has no default). ``{}`` for a callable without a signature."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def hyperparameters(fn: Callable) -> dict[str, Any]:
    """``{name: default}`` of ``fn``'s hyper-parameters: its own keyword-only parameters
    (:func:`own_hyperparameters`), then those of the whole-batch statistics it declares that it does
    not declare itself (a statistic's default where ``fn`` has none)."""
    out = own_hyperparameters(fn)
    for stat in spec(fn).batch_statistics.values():
        for k, v in own_hyperparameters(stat).items():
            out.setdefault(k, v)
    return out


def annotation(fn: Callable, name: str) -> Any:
    """The evaluated annotation of hyper-parameter ``name`` of ``fn`` (or of the whole-batch statistic
    of ``fn`` that declares it), e.g. ``float`` or ``Optional[float]``; ``None`` when it has none or it
    cannot be evaluated."""
    for part in (fn, *spec(fn).batch_statistics.values()):
        if name in own_hyperparameters(part):
            try:
                return typing.get_type_hints(part).get(name)
            except Exception:  # an annotation naming something not importable here
                return None
    return None
