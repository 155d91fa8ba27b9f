"""A task of your own for grpo_lab: reverse a word of lowercase letters.

Used by the book's page "Use it on your own problem" (``book/own_task.ipynb``): a task is any
object with the members of :class:`grpo_lab.tasks.Task`. This one is a dataclass, so that
``Trainer.save`` can store its fields and ``Trainer.resume`` can rebuild it once it is registered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_lab.tasks import Problem, register_task

LETTERS = "abcdefgh"


@register_task("reverse")
@dataclass(frozen=True)
class ReverseTask:
    """Reverse a word: prompt ``"abcd="``, answer ``"dcba"``.

    Attributes:
        name: the registry name (``"reverse"``).
        max_new_tokens: generation budget in tokens (the word, then EOS).
        min_len, max_len: word lengths, drawn uniformly (inclusive).
        test_size: number of test problems (a fixed seed, the same on every call).
    """

    name: str = "reverse"
    max_new_tokens: int = 8
    min_len: int = 3
    max_len: int = 5
    test_size: int = 100

    def sample(self, n: int, rng: np.random.Generator) -> list[Problem]:
        """``n`` problems, every random draw from ``rng`` (what makes runs repeat and resume exactly)."""
        words = ["".join(rng.choice(list(LETTERS), int(rng.integers(self.min_len, self.max_len + 1))))
                 for _ in range(n)]
        return [Problem(prompt=w + "=", answer=w[::-1]) for w in words]

    def is_correct(self, completion: str, problem: Problem) -> bool:
        """The exact reversed word, nothing after it."""
        return completion.strip() == problem.answer

    def reward(self, completion: str, problem: Problem) -> float:
        """1 for the exact answer; otherwise the fraction of the answer's letters right in place,
        halved (a partial credit that still ranks every exact answer above every inexact one)."""
        if self.is_correct(completion, problem):
            return 1.0
        hits = sum(a == b for a, b in zip(completion.strip(), problem.answer))
        return 0.5 * hits / max(len(problem.answer), len(completion.strip()), 1)

    def test_set(self) -> list[Problem]:
        """``test_size`` fixed problems (seed 12345)."""
        return self.sample(self.test_size, np.random.default_rng(12345))
