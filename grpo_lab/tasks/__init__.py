"""Tasks: what is rewarded. Each task samples prompts, scores completions and has a fixed test set.

The protocol a task implements is :class:`Task` (:mod:`grpo_lab.tasks.base`), checked by
:func:`validate_task`. Tasks are registered by name in :data:`TASKS` with :func:`register_task`;
a registered dataclass task is described in a checkpoint by :func:`task_spec` and rebuilt by
:func:`task_from_spec` (``Trainer.resume`` does both), and built by name with :func:`get_task`.
:class:`DatasetTask` (``"dataset"``) is a task over a dataset of your own, scored by reward
functions in TRL's shape.
"""

from __future__ import annotations

import inspect

from dataclasses import asdict, is_dataclass

from .arithmetic import ArithmeticTask
from .base import Problem, Task, correctness, validate_task
from .calculator import CalculatorTask
from .dataset_task import DatasetTask
from .dialogue import DialogueTask
from .environment import Environment, StepResult, is_multi_turn
from .gsm8k import GSM8KTask
from .long_chain import LongChainTask
from .next_token import NextTokenTask

__all__ = ["ArithmeticTask", "CalculatorTask", "DatasetTask", "DialogueTask", "GSM8KTask", "LongChainTask", "NextTokenTask", "Problem", "Task", "TASKS", "get_task",
           "register_task", "task_spec", "task_from_spec", "validate_task", "correctness", "Environment", "StepResult",
           "is_multi_turn"]

#: Registry of task classes by name (the ``name`` field of each task). Add to it with
#: :func:`register_task`, which checks what writing ``TASKS[name] = cls`` directly does not.
TASKS = {"arithmetic": ArithmeticTask, "calculator": CalculatorTask, "dataset": DatasetTask, "dialogue": DialogueTask,
         "gsm8k": GSM8KTask, "long_chain": LongChainTask, "next_token": NextTokenTask}


def _class_path(obj) -> str:
    """``"module.QualifiedName"`` of a class or function (of the class of anything else): how a
    checkpoint records which class its task was."""
    target = obj if hasattr(obj, "__qualname__") and hasattr(obj, "__module__") else type(obj)
    return f"{target.__module__}.{target.__qualname__}"


def register_task(name: str, cls: type | None = None, *, replace: bool = False):
    """Register the task class ``cls`` under ``name``, so that ``get_task(name, **kwargs)`` builds
    it and ``Trainer.resume(path)`` rebuilds it from a checkpoint without ``task=``.

    The registry lives in the process: a new process (a resumed run, a worker) must register the
    class again, e.g. at the bottom of the module that defines it. Registering a class is optional
    for training and saving; ``Trainer.resume(path, task=...)`` resumes any task. Works as a call,
    ``register_task("reverse", ReverseTask)``, or as a class decorator,
    ``@register_task("reverse")``.

    Args:
        name: the registry name; the instances' ``name`` attribute must equal it (it is how
            :func:`task_spec` finds the class), which is checked when the class has a ``str``
            default for ``name`` (a dataclass field with a default).
        cls: the task class (see :class:`Task`); ``None`` returns a decorator.
        replace: allow replacing another class already registered under ``name``
            (registering the same class again is always allowed and changes nothing).

    Returns:
        ``cls`` (or, without ``cls``, a decorator that registers and returns its class).

    Raises:
        TypeError: ``name`` is not a ``str``; ``cls`` is not a class, or lacks a protocol method
            or has one that cannot be called as the trainer calls it (the message lists them).
        ValueError: ``name`` is empty; the class's default ``name`` differs from ``name``; another
            class is registered under ``name`` and ``replace`` is false.
    """
    if not isinstance(name, str):
        raise TypeError(f"register_task: name must be a str, got {type(name).__name__}")
    if not name:
        raise ValueError("register_task: name must not be empty")
    if cls is None:
        return lambda c: register_task(name, c, replace=replace)
    if not isinstance(cls, type):
        raise TypeError(f"register_task: cls must be a task class, got {type(cls).__name__} {cls!r:.60}")
    from .base import _method_problems

    problems = _method_problems(cls, optional=False) + _method_problems(cls, optional=True)
    if problems:
        raise TypeError(f"register_task: {cls.__qualname__} does not implement the task protocol "
                        "(grpo_lab.tasks.Task):\n  - " + "\n  - ".join(problems))
    default = getattr(cls, "name", None)
    if isinstance(default, str) and default != name:
        raise ValueError(f"register_task: {cls.__qualname__}'s tasks are named {default!r} (its default name), not "
                         f"{name!r}; register it under {default!r}, or give the class the default name {name!r}")
    old = TASKS.get(name)
    if old is not None and old is not cls and not replace:
        raise ValueError(f"register_task: {name!r} is already registered to {_class_path(old)}; pass replace=True "
                         f"to register {_class_path(cls)} instead")
    TASKS[name] = cls
    return cls


def get_task(name: str, **kwargs) -> Task:
    """Instantiate a registered task by name.

    Raises:
        ValueError: unknown name (the message lists the known ones); a task whose constructor needs
            arguments that ``kwargs`` does not give (e.g. ``"dataset"``'s data and reward functions,
            which a command line ``--task`` cannot pass): the message names them and how to bind them.
    """
    try:
        cls = TASKS[name]
    except KeyError:
        raise ValueError(f"get_task: unknown task {name!r}; known tasks: {sorted(TASKS)}") from None
    missing = _missing_arguments(cls, kwargs)
    if missing:
        raise ValueError(f"get_task: task {name!r} needs {', '.join(missing)}, which were not given; build it in "
                         f"python ({cls.__name__}(...)), or, for --task, register a subclass of yours whose fields give "
                         f"them defaults (a dataclass subclass of {cls.__name__} with its own name) in a module "
                         "passed with --import")
    return cls(**kwargs)


def _missing_arguments(cls, kwargs: dict) -> list[str]:
    """The required parameters of ``cls``'s constructor that ``kwargs`` lacks (``[]`` when unknowable)."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.default is inspect.Parameter.empty and p.name not in kwargs
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def task_spec(task) -> dict:
    """A JSON-able description from which :func:`task_from_spec` rebuilds an equal task:
    ``{"name": task.name, "class": "module.Class", "params": dataclasses.asdict(task)}``.

    Only a dataclass task whose class is the one registered under its ``name`` has a spec: a
    subclass of a registered class that keeps the parent's ``name`` (say, a changed reward on
    ``ArithmeticTask``) would otherwise be rebuilt as the parent.

    Raises:
        ValueError: ``task`` is not a dataclass, or its class is not registered under its ``name``
            (:func:`register_task`).
    """
    name = getattr(task, "name", None)
    registered = isinstance(name, str) and TASKS.get(name) is type(task)
    if not is_dataclass(task) or isinstance(task, type) or not registered:
        raise ValueError(f"task_spec: {type(task).__name__} is not a registered dataclass task (register its class "
                         f"with grpo_lab.tasks.register_task(name, cls); registered: {sorted(TASKS)})")
    return {"name": name, "class": _class_path(type(task)), "params": asdict(task)}


def task_from_spec(spec: dict) -> Task:
    """Inverse of :func:`task_spec` (a spec without ``"class"``, as older checkpoints store it, is
    rebuilt from the registered class of its name).

    Raises:
        ValueError: the name is not registered, or is now registered to a class other than the
            spec's ``"class"``.
    """
    name = spec["name"]
    stored = spec.get("class")
    if stored is not None and name in TASKS and _class_path(TASKS[name]) != stored:
        raise ValueError(f"task_from_spec: the task {name!r} was a {stored}, but {name!r} is now registered to "
                         f"{_class_path(TASKS[name])}")
    params = {k: v for k, v in spec["params"].items() if k != "name"}
    return get_task(name, **params)
