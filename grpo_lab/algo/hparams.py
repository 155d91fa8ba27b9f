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

A function also declares (:func:`declare`):

* ``inputs``: the tensors it reads beyond its axis' fixed arguments, names of :data:`INPUTS`
  (``behaviour_logp``, ``correct``, ``rewards``, ``entropy``, ``group_ids``, ``lengths``). The trainer
  supplies exactly the inputs the algorithm's functions declare (``entropy`` only then), and
  :class:`~grpo_lab.algo.objectives.LossContext` / :class:`~grpo_lab.algo.advantages.AdvantageBatch` hold
  them (None otherwise); a declared input that is not given raises ``ValueError`` naming the function.
* ``config``: ``{TrainerConfig field: allowed value(s)}`` it needs of the run (e.g. ``{"old_logp":
  "recompute"}``), and ``validate_config(config, values) -> None`` for anything else (``group_size > k``).
  Both are checked once, when the algorithm meets the run's ``TrainerConfig``
  (:meth:`grpo_lab.algo.algorithms.Algorithm.check_config`: ``Trainer`` construction, ``experiments.run``).

**Shared names.** A hyper-parameter named like an ``Algorithm`` field (``eps_low``, ``eps_high``,
``adv_eps``, ``gamma``, ...) is shared: the ``Algorithm``'s value is always the one used, never the
function's default. So that no default is silently replaced, a function whose own default for a shared
name differs from that field's default is refused when an ``Algorithm`` chooses it (the message names both
values); declare such a parameter without a default (``def f(ctx, *, eps_high: float)``) and set the value
on the preset (``GRPO.replace(surrogate="f", eps_high=0.28)``).

This module imports nothing from the package.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

__all__ = ["Spec", "Params", "declare", "spec", "hyperparameters", "own_hyperparameters", "annotation",
           "REQUIRED", "INPUTS", "declared_inputs"]

#: the inputs a registry function may declare (:func:`declare`), ``{name: what it is}``; B rows, T completion tokens
INPUTS = {
    "behaviour_logp": "[B, T] float: log-probs of the sampled tokens under the sampler (Rollout.behaviour_logp)",
    "correct": "[B] bool: the response is correct (the task's verdict, whatever the reward)",
    "rewards": "[B] float: the training rewards (the task's after shaping, e.g. DAPO's overlong penalty)",
    "raw_rewards": "[B] float: the task's rewards before shaping",
    "entropy": "[B, T] float: token entropy of pi_theta (nats, detached), computed only when declared",
    "group_ids": "[B] int64: the group (question) of each row",
    "lengths": "[B] int64: response lengths (real completion tokens)",
}

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
        batch_statistics: ``{name: statistic(ctx, **values) -> Tensor [B, ...] or (Tensor, {metric: float})}``.
        inputs: names of :data:`INPUTS` the function reads.
        config: ``{TrainerConfig field: allowed values (a tuple)}``.
        validate_config: ``None`` or ``validate_config(config, values: dict) -> None`` raising ``ValueError``.
    """

    requires: Mapping[str, tuple] = field(default_factory=dict)
    validate: Optional[Callable[[dict], None]] = None
    batch_statistics: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    inputs: tuple = ()
    config: Mapping[str, tuple] = field(default_factory=dict)
    validate_config: Optional[Callable[[Any, dict], None]] = None


_EMPTY = Spec()


def _allowed(mapping: Optional[Mapping[str, Any]]) -> dict:
    """``{key: tuple of allowed values}`` from ``{key: value or collection of values}``."""
    return {k: (tuple(v) if isinstance(v, (tuple, list, set, frozenset)) else (v,)) for k, v in (mapping or {}).items()}


def declare(*, requires: Optional[Mapping[str, Any]] = None, validate: Optional[Callable[[dict], None]] = None,
            batch_statistics: Optional[Mapping[str, Callable[..., Any]]] = None, inputs: tuple = (),
            config: Optional[Mapping[str, Any]] = None,
            validate_config: Optional[Callable[[Any, dict], None]] = None) -> Callable:
    """Decorator that attaches a :class:`Spec` to a registry function (read back by :func:`spec`).

    Args:
        requires: ``{Algorithm field: value or tuple of values}`` the function needs on other axes.
        validate: called with ``{name: value}`` of every hyper-parameter the function declares.
        batch_statistics: ``{name: statistic}``: statistics over the whole minibatch.
        inputs: names of :data:`INPUTS` the function reads (``("behaviour_logp",)``).
        config: ``{TrainerConfig field: value or tuple of values}`` the function needs of the run.
        validate_config: called with the run's ``TrainerConfig`` and the hyper-parameters' values.

    Raises:
        ValueError: a key that is not a string, an input not in :data:`INPUTS` (the message lists them), a
            non-callable ``validate``, ``validate_config`` or statistic.
    """
    req, cfg = _allowed(requires), _allowed(config)
    stats = dict(batch_statistics or {})
    if any(not isinstance(k, str) for k in (*req, *stats, *cfg)):
        raise ValueError("declare(): requires, config and batch_statistics are keyed by name (str)")
    if any(f is not None and not callable(f) for f in (validate, validate_config)) or not all(map(callable, stats.values())):
        raise ValueError("declare(): validate, validate_config and every batch statistic must be callable")
    inputs = (inputs,) if isinstance(inputs, str) else tuple(inputs)
    unknown = [k for k in inputs if k not in INPUTS]
    if unknown:
        raise ValueError(f"declare(): unknown input(s) {unknown}; the inputs a function may declare: {sorted(INPUTS)}")

    def attach(fn: Callable) -> Callable:
        fn.grpo_lab_spec = Spec(req, validate, stats, inputs, cfg, validate_config)
        return fn

    return attach


def spec(fn: Callable) -> Spec:
    """The :class:`Spec` declared on ``fn`` (an empty one when it declares nothing)."""
    s = getattr(fn, "grpo_lab_spec", None)
    return s if isinstance(s, Spec) else _EMPTY


def declared_inputs(fn: Callable) -> tuple:
    """The inputs ``fn`` reads: those it declares, then those of its whole-batch statistics, each once."""
    out = list(spec(fn).inputs)
    for stat in spec(fn).batch_statistics.values():
        out += [k for k in spec(stat).inputs if k not in out]
    return tuple(out)


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
