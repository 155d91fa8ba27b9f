"""Long sums reduced step by step: the long chain-of-thought task (issue 55).

A prompt is a sum of ``min_terms..max_terms`` numbers (default 3-14 one-digit terms), e.g.
``"5+7+9+2="``. A response reduces the sum in the format of :class:`~grpo_lab.tasks.ArithmeticTask`,
each ``;``-terminated step rewriting what is left of the sum, then ``#`` and the answer. Responses differ
in **thoroughness**, how many additions a step makes:

* **careful**: one addition per step, ``"12+9+2;21+2;23;#23"`` (:func:`~grpo_lab.tasks.long_chain.careful_response`), so a
  14-term sum takes 13 steps and 195-198 characters (tokens: the tokenizer has one per character), a sum of
  ``n`` terms about ``n^2`` of them;
* **hasty**: two or three additions per step, ``"21+2;23;#23"`` (:func:`~grpo_lab.tasks.long_chain.hasty_response`), fewer and
  shorter steps, each a harder sum for a small model;
* **direct**: the answer only, ``"#23"``.

The reward is the outcome reward of :class:`~grpo_lab.tasks.ArithmeticTask`: 1 if the response is well
formed (:func:`~grpo_lab.tasks.arithmetic.parse_answer`, a strict regular expression; model output is never
executed) and the answer equals the sum, else 0. The steps are not checked: only the answer counts.
The base policy (``python -m grpo_lab.lab.pretrain long-chain``) is pretrained on a mixture of the three
(``p_careful``, ``p_hasty``, the rest direct), so its chains vary in length and in care, and the generation
budget ``max_new_tokens`` cuts some careful chains of the largest sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arithmetic import ArithmeticTask, direct_response, parse_answer
from .base import Problem

__all__ = ["LongChainTask", "careful_response", "hasty_response", "thoroughness", "THOROUGHNESS"]

#: The thoroughness labels of :func:`~grpo_lab.tasks.long_chain.thoroughness`, from most to least careful, then malformed responses.
THOROUGHNESS = ("careful", "hasty", "direct", "malformed")


def _reduce(terms: list[int], sizes: list[int]) -> str:
    """Steps that each replace the first ``size + 1`` numbers of the sum by their total, then the answer."""
    cur, steps = list(terms), []
    for size in sizes:
        cur = [sum(cur[:size + 1])] + cur[size + 1:]
        steps.append("+".join(str(x) for x in cur) + ";")
    return "".join(steps) + f"#{cur[0]}"


def careful_response(terms: list[int]) -> str:
    """One addition per step (``len(terms) - 1`` steps), then the answer.

    >>> careful_response([56, 77, 95, 12])
    '133+95+12;228+12;240;#240'

    Raises:
        ValueError: ``terms`` is empty.
    """
    if not terms:
        raise ValueError("careful_response: no terms")
    return _reduce(terms, [1] * (len(terms) - 1))


def hasty_response(terms: list[int], rng: np.random.Generator) -> str:
    """Two or three additions per step (each uniform, drawn with ``rng``; the last step takes what is
    left), then the answer; a two-term sum gets its one step.

    >>> hasty_response([56, 77, 95, 12, 30, 41], np.random.default_rng(0))
    '240+30+41;311;#311'

    Raises:
        ValueError: ``terms`` is empty.
    """
    if not terms:
        raise ValueError("hasty_response: no terms")
    left, sizes = len(terms) - 1, []
    while left > 0:
        size = min(left, int(rng.integers(2, 4)))
        sizes.append(size)
        left -= size
    return _reduce(terms, sizes)


def thoroughness(completion: str, n_terms: int) -> str:
    """How carefully a response to an ``n_terms``-term sum reduced it: ``"careful"`` (well formed, one
    step per addition: ``n_terms - 1`` steps), ``"hasty"`` (well formed, at least one step but fewer),
    ``"direct"`` (well formed, no step) or ``"malformed"`` (what :func:`~grpo_lab.tasks.arithmetic.parse_answer`
    rejects, e.g. a chain the budget cut, or more steps than additions).

    >>> [thoroughness(c, 4) for c in ("133+95+12;228+12;240;#240", "228+12;240;#240", "#240", "133+95+12;")]
    ['careful', 'hasty', 'direct', 'malformed']

    Raises:
        ValueError: ``n_terms < 1``.
    """
    if n_terms < 1:
        raise ValueError(f"thoroughness: n_terms must be >= 1, got {n_terms!r}")
    if parse_answer(completion) is None:
        return "malformed"
    steps = completion.count(";")
    if steps == 0:
        return "direct"
    if steps == n_terms - 1:
        return "careful"
    return "hasty" if steps < n_terms - 1 else "malformed"


@dataclass
class LongChainTask(ArithmeticTask):
    """Sums of ``min_terms..max_terms`` numbers of ``digits`` digits whose careful answer is a long chain.

    Problems, test set (seed 12345, ``test_size`` split evenly over the term counts), parsing and
    reward are :class:`~grpo_lab.tasks.ArithmeticTask`'s, without filler; only the pretraining
    demonstrations differ (:meth:`~grpo_lab.tasks.LongChainTask.demonstration`).

    Args:
        min_terms, max_terms, digits, test_size: as :class:`~grpo_lab.tasks.ArithmeticTask`.
        max_new_tokens: the generation budget in tokens (characters); the default, 180, is shorter
            than the careful chain of a 14-term sum of one-digit terms (196-199 tokens with EOS) and
            longer than that of a 13-term one (169-172).
        p_careful, p_hasty: shares of careful and hasty pretraining demonstrations; the rest are
            direct (used by :mod:`grpo_lab.lab.pretrain`, not by RL).

    Raises:
        ValueError: out-of-range arguments (as :class:`~grpo_lab.tasks.ArithmeticTask`), shares outside
            [0, 1] or summing above 1, or a filler (this task has no filler variant).
    """

    min_terms: int = 3
    max_terms: int = 14
    digits: int = 1
    max_new_tokens: int = 180
    p_reason: float = 0.0
    test_size: int = 300
    name: str = "long_chain"
    p_careful: float = 0.6
    p_hasty: float = 0.25

    def __post_init__(self):
        super().__post_init__()
        if self.filler:
            raise ValueError("LongChainTask: no filler variant (filler must be '')")
        for label, p in (("p_careful", self.p_careful), ("p_hasty", self.p_hasty)):
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
                raise ValueError(f"LongChainTask: {label} must lie in [0, 1], got {p!r}")
        if self.p_careful + self.p_hasty > 1.0 + 1e-12:
            raise ValueError(f"LongChainTask: p_careful + p_hasty must be <= 1, got {self.p_careful} + {self.p_hasty}")

    def thoroughness(self, completion: str, problem: Problem) -> str:
        """:func:`~grpo_lab.tasks.long_chain.thoroughness` of ``completion`` for ``problem``'s term count."""
        return thoroughness(completion, problem.meta["n_terms"])

    def demonstration(self, problem: Problem, rng: np.random.Generator) -> str:
        """A pretraining response drawn with ``rng``: careful with probability ``p_careful``, hasty with
        probability ``p_hasty``, else direct (:func:`~grpo_lab.tasks.long_chain.careful_response`, :func:`~grpo_lab.tasks.long_chain.hasty_response`)."""
        terms = problem.meta["terms"]
        u = rng.random()
        if u < self.p_careful:
            return careful_response(terms)
        if u < self.p_careful + self.p_hasty:
            return hasty_response(terms, rng)
        return direct_response(terms)
