"""The task protocol: what the trainer needs from a task, and a shared evaluator."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

__all__ = ["Problem", "Task", "save_problems", "load_problems"]


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer.

    Attributes:
        prompt: the text given to the policy (no special tokens).
        answer: the reference answer as a canonical string (e.g. ``"18"``).
        meta: task-specific facts used for analysis (e.g. ``{"n_terms": 4}``).
    """

    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)


@runtime_checkable
class Task(Protocol):
    """What a task provides to the trainer and the book.

    ``sample`` draws training prompts from the task's distribution with the caller's RNG (so a
    resumed run continues exactly); ``reward`` scores one completion and must never execute or
    ``eval`` it; ``is_correct`` is the raw correctness used for accuracy and for DAPO's
    dynamic-sampling filter (a shaped reward may differ from it); ``test_set`` is fixed.
    """

    name: str
    max_new_tokens: int

    def sample(self, n: int, rng: np.random.Generator) -> list[Problem]: ...

    def reward(self, completion: str, problem: Problem) -> float: ...

    def is_correct(self, completion: str, problem: Problem) -> bool: ...

    def test_set(self) -> list[Problem]: ...


def save_problems(problems: Sequence[Problem], path: str | Path) -> None:
    """Write problems as JSON lines (``prompt``, ``answer``, ``meta``), one per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for p in problems:
            f.write(json.dumps(asdict(p), sort_keys=True) + "\n")


def load_problems(path: str | Path) -> list[Problem]:
    """Read problems written by :func:`save_problems`.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a line is not a JSON object with string ``prompt`` and ``answer``.
    """
    path = Path(path)
    out = []
    with path.open() as f:
        for k, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                prompt, answer = d["prompt"], d["answer"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"load_problems: {path}:{k} is not a problem record ({e})") from None
            if not isinstance(prompt, str) or not isinstance(answer, str):
                raise ValueError(f"load_problems: {path}:{k}: prompt and answer must be strings")
            out.append(Problem(prompt, answer, d.get("meta", {})))
    return out
