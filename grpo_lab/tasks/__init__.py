"""Tasks: what is rewarded. Each task samples prompts, scores completions and has a fixed test set."""

from __future__ import annotations

from dataclasses import asdict, is_dataclass

from .arithmetic import ArithmeticTask
from .base import Problem, Task

__all__ = ["ArithmeticTask", "Problem", "Task", "TASKS", "get_task", "task_spec", "task_from_spec"]

#: Registry of task classes by name (the ``name`` field of each task).
TASKS = {"arithmetic": ArithmeticTask}


def get_task(name: str, **kwargs) -> Task:
    """Instantiate a registered task by name.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    try:
        cls = TASKS[name]
    except KeyError:
        raise ValueError(f"get_task: unknown task {name!r}; known tasks: {sorted(TASKS)}") from None
    return cls(**kwargs)


def task_spec(task) -> dict:
    """A JSON-able description from which :func:`task_from_spec` rebuilds an equal task."""
    if not is_dataclass(task) or task.name not in TASKS:
        raise ValueError(f"task_spec: {type(task).__name__} is not a registered dataclass task")
    return {"name": task.name, "params": asdict(task)}


def task_from_spec(spec: dict) -> Task:
    """Inverse of :func:`task_spec`."""
    params = {k: v for k, v in spec["params"].items() if k != "name"}
    return get_task(spec["name"], **params)
