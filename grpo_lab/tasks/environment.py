"""The environment interface of multi-turn tasks (issue 56's contract; owned by the core helper's branch).

A multi-turn task is a :class:`~grpo_lab.tasks.Task` with one more method, ``environment() -> Environment``: a fresh
environment for one episode. The task's ``reward(completion, problem)`` / ``is_correct(...)`` receive the whole
episode text after the prompt: model turns and observations in order, exactly as the decoded ids. Episode reward =
``task.reward(...)`` + the sum of the :class:`StepResult` rewards. A model turn that ends at EOS ends the episode (no
``env.step``). A turn that ends at a stop string calls ``env.step(action)``; ``done=False``: the observation's ids are
appended and the model samples the next turn; ``done=True``: the observation (may be ``""``) is appended and the
episode ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .base import Problem

__all__ = ["StepResult", "Environment"]


@dataclass(frozen=True)
class StepResult:
    """What the environment returns for one model turn.

    Attributes:
        observation: text the environment appends to the context: its tokens are never trained.
        done: the episode is over: no further model turn.
        reward: a per-turn reward, summed into the episode's reward.
    """

    observation: str
    done: bool
    reward: float = 0.0


class Environment(Protocol):
    """One episode's environment: ``reset(problem)`` once, then ``step(action)`` after each model turn that ended at
    one of ``stop_strings`` (kept in the action), at most ``max_turns`` model turns (``>= 1``) per episode."""

    stop_strings: tuple[str, ...]
    max_turns: int

    def reset(self, problem: Problem) -> None: ...

    def step(self, action: str) -> StepResult: ...
