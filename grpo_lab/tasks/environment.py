"""The environment of a multi-turn task: what answers the model's turns (a tool, a sandbox, a game).

An episode alternates model turns and environment turns. A model turn ends at EOS or at the first of the
environment's ``stop_strings`` (kept in the action); at a stop string the environment's :meth:`grpo_lab.tasks.Environment.step`
receives the action's text and returns a :class:`StepResult`: the observation text appended to the context (never
trained: its tokens are outside the loss mask), whether the episode is over, and a per-turn reward summed into the
episode's reward. The shape is that of TRL's environments (``reset`` / ``step`` with state across turns) and verl's
multi-turn interactions (a turn limit, tool answers appended as observations); the rollout itself is
:func:`grpo_lab.policy.episodes.generate_episodes`.

A multi-turn task is a :class:`~grpo_lab.tasks.base.Task` with one more method, ``environment() -> Environment``
(a fresh environment for one episode); :func:`grpo_lab.tasks.is_multi_turn` tells the trainer which rollout to use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .base import Problem

__all__ = ["StepResult", "Environment", "is_multi_turn"]


@dataclass(frozen=True)
class StepResult:
    """What the environment returns for one model turn.

    Attributes:
        observation: text the environment appends to the context; its tokens are never trained.
        done: the episode is over: no further model turn.
        reward: a per-turn reward, summed into the episode's reward (added to the task's ``reward``).
    """

    observation: str        # text the environment appends to the context: its tokens are never trained
    done: bool              # the episode is over: no further model turn
    reward: float = 0.0     # a per-turn reward, summed into the episode's reward


class Environment(Protocol):
    """One episode's environment (a fresh one per episode, from the task's ``environment()``).

    Attributes:
        stop_strings: a model turn ends at EOS or at the first of these (kept in the action).
        max_turns: model turns per episode at most (>= 1).
    """

    stop_strings: tuple[str, ...]   # a model turn ends at EOS or at the first of these (kept in the action)
    max_turns: int                  # model turns per episode at most (>= 1)

    def reset(self, problem: Problem) -> None:
        """Start an episode on ``problem``."""
        ...

    def step(self, action: str) -> StepResult:
        """Answer the model turn that just ended (``action``: its text, the stop string included)."""
        ...


def is_multi_turn(task) -> bool:
    """Whether ``task`` is a multi-turn task: it has a callable ``environment`` attribute. Raises nothing."""
    return callable(getattr(task, "environment", None))
