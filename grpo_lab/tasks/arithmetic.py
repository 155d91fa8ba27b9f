"""Multi-term addition with optional step-by-step reasoning: the CPU task of the book.

A prompt is a sum of ``n_terms`` numbers, e.g. ``"56+77+95="`` (default: two to four
two-digit terms). A response is either

* **direct**: ``"#228"`` — the answer after ``#``; or
* **reasoning**: ``"133+95;228;#228"`` — the sum reduced one addition at a time, each step
  ended by ``;``, then the answer.

Both forms are valid and rewarded the same (outcome reward: 1 if the response is well formed and
the number after ``#`` equals the sum, else 0). Well formed includes writing the answer as a
canonical decimal integer, without leading zeros: ``#018`` is malformed and scores 0, as the
demonstrations the base policy learned from never pad a number. The check compares strings of
that canonical form, which is the same as comparing the integers. The base policy is pretrained on
a mixture in which only a fraction ``p_reason`` of demonstrations reason, so it mostly answers
directly: right on two terms, mostly wrong on three or four. That gives RL room to act in the way
the GRPO papers describe at scale: accuracy rises *by* producing longer reasoning, and response
length varies from 3 to ~40 characters, so length-related biases (Dr.GRPO) are measurable.

The reward never executes model output: it is a strict regular-expression parse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..paths import data_dir
from .base import Problem, load_problems, save_problems

__all__ = ["ArithmeticTask", "reasoning_response", "direct_response", "parse_answer"]

_RESPONSE = re.compile(r"^(?:[0-9+]+;)*#(0|[1-9][0-9]{0,5})$")


def reasoning_response(terms: list[int]) -> str:
    """The step-by-step response for ``terms``: reduce the first two terms until one is left.

    >>> reasoning_response([3, 5, 2, 8])
    '8+2+8;10+8;18;#18'
    >>> reasoning_response([4, 4])
    '8;#8'
    """
    cur = list(terms)
    steps = []
    while len(cur) > 1:
        cur = [cur[0] + cur[1]] + cur[2:]
        steps.append("+".join(str(x) for x in cur) + ";")
    return "".join(steps) + f"#{cur[0]}"


def direct_response(terms: list[int]) -> str:
    """The direct response: ``"#<sum>"``."""
    return f"#{sum(terms)}"


def parse_answer(completion: str) -> str | None:
    """The answer string of a well-formed response, else ``None`` (strict; never evaluates).

    Well formed: optional ``;``-terminated steps, then ``#`` and the answer as a canonical decimal
    integer of at most 6 digits (no sign, no leading zeros), nothing after it.

    >>> parse_answer("8+2+8;10+8;18;#18")
    '18'
    >>> parse_answer("#18") , parse_answer("18"), parse_answer("#18#19"), parse_answer("#018"), parse_answer("#0")
    ('18', None, None, None, '0')
    """
    m = _RESPONSE.fullmatch(completion)
    return m.group(1) if m else None


@dataclass
class ArithmeticTask:
    """Sums of ``min_terms..max_terms`` numbers of ``digits`` digits, optional reasoning.

    Args:
        min_terms, max_terms: range of the number of terms (inclusive), uniform.
        digits: 1 (terms 1–9), 2 (10–99) or 3 (100–999).
        max_new_tokens: the generation budget in characters (the default task's longest
            reasoning answer, four two-digit terms, is 25 characters plus EOS).
        p_reason: fraction of pretraining demonstrations that reason (used by
            :mod:`grpo_lab.pretrain`, not by RL).
        test_size: number of problems in the fixed test set (equal share per term count).
    """

    min_terms: int = 2
    max_terms: int = 4
    digits: int = 2
    max_new_tokens: int = 32
    p_reason: float = 0.3
    test_size: int = 198
    name: str = "arithmetic"

    def __post_init__(self):
        if not 1 <= self.min_terms <= self.max_terms:
            raise ValueError("ArithmeticTask: need 1 <= min_terms <= max_terms")
        if self.digits not in (1, 2, 3):
            raise ValueError("ArithmeticTask: digits must be 1, 2 or 3")
        if not 0.0 <= self.p_reason <= 1.0:
            raise ValueError("ArithmeticTask: p_reason must lie in [0, 1]")

    # ----------------------------------------------------------------- problems
    def make_problem(self, terms: list[int]) -> Problem:
        """The problem for an explicit list of terms."""
        return Problem("+".join(str(t) for t in terms) + "=", str(sum(terms)),
                       {"n_terms": len(terms), "terms": list(terms)})

    def sample(self, n: int, rng: np.random.Generator) -> list[Problem]:
        """``n`` problems drawn with ``rng`` (term count uniform, then each term uniform over the
        numbers with ``digits`` digits)."""
        out = []
        for _ in range(n):
            k = int(rng.integers(self.min_terms, self.max_terms + 1))
            out.append(self.make_problem(self._terms(rng, k)))
        return out

    def _terms(self, rng: np.random.Generator, k: int) -> list[int]:
        lo, hi = (1, 10) if self.digits == 1 else (10 ** (self.digits - 1), 10 ** self.digits)
        return [int(x) for x in rng.integers(lo, hi, size=k)]

    def generate_test_set(self) -> list[Problem]:
        """The fixed test set, regenerated deterministically (seed 12345, disjoint from training
        seeds by construction of the RNG stream)."""
        rng = np.random.default_rng(12345)
        counts = range(self.min_terms, self.max_terms + 1)
        per = self.test_size // len(counts)
        n_values = 9 if self.digits == 1 else 9 * 10 ** (self.digits - 1)
        for k in counts:
            if per > n_values ** k:
                raise ValueError(f"ArithmeticTask: only {n_values ** k} distinct {k}-term problems exist, "
                                 f"fewer than the {per} the test set needs per term count")
        seen, out = set(), []
        for k in counts:
            got = 0
            while got < per:
                p = self.make_problem(self._terms(rng, k))
                if p.prompt in seen:
                    continue
                seen.add(p.prompt)
                out.append(p)
                got += 1
        return out

    def test_set_path(self):
        return data_dir() / "tasks" / f"{self.name}_d{self.digits}_{self.min_terms}-{self.max_terms}_test.jsonl"

    def test_set(self) -> list[Problem]:
        """The fixed test set from ``data/tasks/`` (regenerated identically if the file is absent)."""
        path = self.test_set_path()
        if path.exists():
            return load_problems(path)
        return self.generate_test_set()

    def write_test_set(self):
        """Write the fixed test set to ``data/tasks/`` (``python -m grpo_lab.pretrain`` does it)."""
        save_problems(self.generate_test_set(), self.test_set_path())
        return self.test_set_path()

    # ----------------------------------------------------------------- scoring
    def is_correct(self, completion: str, problem: Problem) -> bool:
        """Raw correctness: well formed (:func:`parse_answer`) and the answer equals the sum."""
        return parse_answer(completion) == problem.answer

    def reward(self, completion: str, problem: Problem) -> float:
        """Outcome reward in {0, 1} (DeepSeekMath §4.1.2 outcome supervision)."""
        return 1.0 if self.is_correct(completion, problem) else 0.0

    @staticmethod
    def is_reasoning(completion: str) -> bool:
        """Whether a completion chose to reason: it does not open with ``#`` and writes at least
        one ``;``-terminated step before its first ``#``."""
        return not completion.startswith("#") and ";" in completion.split("#", 1)[0]

    # ----------------------------------------------------------------- pretraining data
    def demonstration(self, problem: Problem, rng: np.random.Generator) -> str:
        """A pretraining response: reasoning with probability ``p_reason``, else direct."""
        terms = problem.meta["terms"]
        return reasoning_response(terms) if rng.random() < self.p_reason else direct_response(terms)
