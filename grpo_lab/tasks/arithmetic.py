"""Multi-term addition with optional step-by-step reasoning: the CPU task of the book.

A prompt is a sum of ``n_terms`` numbers, e.g. ``"56+77+95="`` (default: two to four two-digit
terms). A response is either **direct**, ``"#228"`` (the answer after ``#``), or **reasoning**,
``"133+95;228;#228"`` (the sum reduced one addition at a time, each step ended by ``;``). Both are
rewarded the same: the outcome reward, 1 if the response is well formed (the answer a canonical
decimal integer: ``#018`` scores 0) and the number after ``#`` equals the sum, else 0. The reward
is a strict regular-expression parse; it never executes model output.

The base policy is pretrained on demonstrations of which only a fraction ``p_reason`` reason, so
it mostly answers directly, leaving RL room to raise accuracy *by* reasoning longer, as the GRPO
papers describe at scale, with response lengths varied enough for Dr.GRPO's length biases to show.

**Filler variant** (``ArithmeticTask(filler=".")``): a filler character may stand between a
response's parts (before, between or after the steps, after the answer; never inside a step or
number), e.g. ``"133+95;228;#228...."``. The parser skips it, so length is free of correctness,
which Dr.GRPO's length-bias argument needs. A fraction ``p_filler`` of that variant's pretraining
demonstrations carry filler after the answer (or, ``filler_position="start"``, before the response)
(:mod:`grpo_lab.lab.pretrain`, recipe ``arithmetic-filler``), so the base policy emits it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..paths import data_dir
from .base import Problem, load_problems, save_problems

__all__ = ["ArithmeticTask", "reasoning_response", "direct_response", "parse_answer", "filler_length",
           "FILLER_FORBIDDEN"]

_RESPONSE = re.compile(r"^(?:[0-9+]+;)*#(0|[1-9][0-9]{0,5})$")

#: Characters that cannot be the filler, since they carry the response's structure or answer (digits,
#: ``+``, ``;``, ``#``), or are invisible in a printed completion (whitespace).
FILLER_FORBIDDEN = "0123456789+;#"


def _check_filler(filler: str, who: str) -> str:
    if not isinstance(filler, str) or len(filler) > 1:
        raise ValueError(f"{who}: filler must be '' (no filler) or one character, got {filler!r}")
    if filler and (filler in FILLER_FORBIDDEN or filler.isspace() or not filler.isprintable()):
        raise ValueError(f"{who}: filler {filler!r} is not allowed (not a digit, '+', ';', '#', whitespace or "
                         "a non-printable character: the parser could not tell it from the response)")
    return filler


@lru_cache(maxsize=8)
def _response_pattern(filler: str) -> re.Pattern:
    if not filler:
        return _RESPONSE
    f = re.escape(filler)
    return re.compile(rf"^(?:{f}|[0-9+]+;)*#(0|[1-9][0-9]{{0,5}}){f}*$")


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


def parse_answer(completion: str, filler: str = "") -> str | None:
    """The answer string of a well-formed response, else ``None`` (strict; never evaluates).

    Well formed: optional ``;``-terminated steps, then ``#`` and the answer as a canonical decimal
    integer of at most 6 digits (no sign, no leading zeros), nothing after it. With a ``filler``
    character, any number of fillers may also stand at the start, between two steps, before
    ``#`` and after the answer, never inside a step or a number.

    >>> parse_answer("8+2+8;10+8;18;#18")
    '18'
    >>> parse_answer("#18") , parse_answer("18"), parse_answer("#18#19"), parse_answer("#018"), parse_answer("#0")
    ('18', None, None, None, '0')
    >>> parse_answer("..8;.#8..", filler="."), parse_answer("..8;.#8"), parse_answer("#1.8", filler=".")
    ('8', None, None)

    Raises:
        ValueError: ``filler`` is not ``""`` or one allowed character (see :data:`FILLER_FORBIDDEN`).
    """
    m = _response_pattern(_check_filler(filler, "parse_answer")).fullmatch(completion)
    return m.group(1) if m else None


def filler_length(completion: str, filler: str) -> int:
    """Number of ``filler`` characters in ``completion``: in a well-formed response, the part of
    its length that the parser ignores. The tokenizer is one token per character, so this is
    also a token count (EOS not included).

    >>> filler_length("...8;.#8..", "."), filler_length("#8", "."), filler_length("..", ".")
    (6, 0, 2)

    Raises:
        ValueError: ``filler`` is not one allowed character.
    """
    if not _check_filler(filler, "filler_length"):
        raise ValueError("filler_length: filler must be one character, got ''")
    return completion.count(filler)


@dataclass
class ArithmeticTask:
    """Sums of ``min_terms..max_terms`` numbers of ``digits`` digits, optional reasoning.

    Args:
        min_terms, max_terms: range of the number of terms (inclusive), uniform.
        digits: 1 (terms 1–9), 2 (10–99) or 3 (100–999).
        max_new_tokens: the generation budget in characters (the default task's longest
            reasoning answer, four two-digit terms, is 25 characters plus EOS).
        p_reason: fraction of pretraining demonstrations that reason (used by
            :mod:`grpo_lab.lab.pretrain`, not by RL).
        test_size: number of problems in the fixed test set (equal share per term count, so at least one
            per term count). A file at ``test_set_path()`` (the shipped one) is the test set verbatim, whatever
            its size: ``test_size`` sizes a regenerated set (``generate_test_set()``, ``write_test_set()``).
        filler: ``""`` (the plain task) or one character that a response may contain between
            its parts and after the answer, and that the parser ignores (:func:`~grpo_lab.tasks.arithmetic.parse_answer`):
            length without effect on correctness.
        p_filler: fraction of pretraining demonstrations with a run of filler (used by
            :mod:`grpo_lab.lab.pretrain`, not by RL; needs ``filler``).
        max_filler: that run's length is uniform on ``1..max_filler`` characters (needs
            ``filler`` when positive; at least 1 when ``p_filler > 0``).
        filler_position: where the demonstrations put that run: ``"end"`` (after the answer,
            where the policy has already written its answer when it chooses the length) or
            ``"start"`` (before the response).

    Raises:
        ValueError: out-of-range arguments (a ``max_new_tokens`` below 1, a ``test_size`` below the number of
            term counts), a forbidden filler character, or filler settings without a filler.
    """

    min_terms: int = 2
    max_terms: int = 4
    digits: int = 2
    max_new_tokens: int = 32
    p_reason: float = 0.3
    test_size: int = 198
    name: str = "arithmetic"
    filler: str = ""
    p_filler: float = 0.0
    max_filler: int = 0
    filler_position: str = "end"

    def __post_init__(self):
        if not 1 <= self.min_terms <= self.max_terms:
            raise ValueError("ArithmeticTask: need 1 <= min_terms <= max_terms")
        if self.digits not in (1, 2, 3):
            raise ValueError("ArithmeticTask: digits must be 1, 2 or 3")
        for label, v, low in (("max_new_tokens", self.max_new_tokens, 1),
                              ("test_size", self.test_size, self.max_terms - self.min_terms + 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{type(self).__name__}: {label} must be an int >= {low}, got {v!r}"
                                 + (" (one problem per term count at least)" if label == "test_size" else ""))
        if not 0.0 <= self.p_reason <= 1.0:
            raise ValueError("ArithmeticTask: p_reason must lie in [0, 1]")
        _check_filler(self.filler, "ArithmeticTask")
        if not 0.0 <= self.p_filler <= 1.0:
            raise ValueError(f"ArithmeticTask: p_filler must lie in [0, 1], got {self.p_filler!r}")
        if isinstance(self.max_filler, bool) or not isinstance(self.max_filler, int) or self.max_filler < 0:
            raise ValueError(f"ArithmeticTask: max_filler must be an int >= 0, got {self.max_filler!r}")
        if not self.filler and (self.p_filler > 0 or self.max_filler > 0):
            raise ValueError("ArithmeticTask: p_filler / max_filler need a filler character (filler='.')")
        if self.p_filler > 0 and self.max_filler < 1:
            raise ValueError("ArithmeticTask: p_filler > 0 needs max_filler >= 1")
        if self.filler_position not in ("end", "start"):
            raise ValueError(f"ArithmeticTask: filler_position must be 'end' or 'start', got {self.filler_position!r}")

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
        """Write the fixed test set to ``data/tasks/`` (``python -m grpo_lab.lab.pretrain`` does it)."""
        save_problems(self.generate_test_set(), self.test_set_path())
        return self.test_set_path()

    # ----------------------------------------------------------------- scoring
    def is_correct(self, completion: str, problem: Problem) -> bool:
        """Raw correctness: well formed (:func:`~grpo_lab.tasks.arithmetic.parse_answer`, with this task's filler) and the
        answer equals the sum."""
        return parse_answer(completion, self.filler) == problem.answer

    def reward(self, completion: str, problem: Problem) -> float:
        """Outcome reward in {0, 1} (DeepSeekMath §4.1.2 outcome supervision)."""
        return 1.0 if self.is_correct(completion, problem) else 0.0

    def extract_answer(self, completion: str) -> str | None:
        """The answer of a well-formed completion (:func:`~grpo_lab.tasks.arithmetic.parse_answer`, with this task's
        filler), ``None`` for a malformed one: what maj@k votes on (:func:`grpo_lab.experiments.evaluation.maj_at_k`)."""
        return parse_answer(completion, self.filler)

    @staticmethod
    def answers_equivalent(a: str, b: str) -> bool:
        """Whether two extracted answers are one integer (``"18"``, ``"018"``, ``"+18"``): what maj@k
        groups by (:func:`grpo_lab.experiments.evaluation.maj_at_k`); answers that are no integer
        compare as text. Raises nothing."""
        try:
            return int(a) == int(b)
        except (TypeError, ValueError):
            return a == b

    @staticmethod
    def is_reasoning(completion: str) -> bool:
        """Whether a completion chose to reason: it does not open with ``#`` and writes at least
        one ``;``-terminated step before its first ``#``."""
        return not completion.startswith("#") and ";" in completion.split("#", 1)[0]

    def filler_length(self, completion: str) -> int:
        """Filler characters of ``completion`` (:func:`filler_length`); 0 for the plain task."""
        return filler_length(completion, self.filler) if self.filler else 0

    # ----------------------------------------------------------------- pretraining data
    def demonstration(self, problem: Problem, rng: np.random.Generator) -> str:
        """A pretraining response: reasoning with probability ``p_reason``, else direct; with a
        filler, with probability ``p_filler`` a run of ``1..max_filler`` fillers (uniform) is
        appended (``filler_position="end"``) or prepended (``"start"``). Without filler the draws
        from ``rng`` are those of the plain task, so its demonstrations do not change."""
        terms = problem.meta["terms"]
        text = reasoning_response(terms) if rng.random() < self.p_reason else direct_response(terms)
        if self.p_filler > 0 and rng.random() < self.p_filler:
            run = self.filler * int(rng.integers(1, self.max_filler + 1))
            text = text + run if self.filler_position == "end" else run + text
        return text
