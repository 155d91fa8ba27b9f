"""Products too large to compute in one's head, with a calculator tool: the toy multi-turn task (issue 56).

A prompt is ``"a*b+c="`` (default: ``a`` of three digits, ``b`` of two, ``c`` of one), e.g. ``"317*45+8="``.
The model may call a calculator in its text, ``calc(317*45)``: its turn ends at the ``)`` (the environment's
stop string) and the environment appends the result as an **observation**, ``"=14265\\n"``; the model then
goes on, calls again or answers. The answer is written as in :class:`~grpo_lab.tasks.ArithmeticTask`, ``#``
and the number, at the end of the episode. Episodes:

* direct: ``"#14273"`` (the tiny base models mostly get 3-digit × 2-digit products wrong);
* one call: ``"calc(317*45)=14265\\n#14273"`` (the model adds ``c`` itself);
* two calls: ``"calc(317*45)=14265\\ncalc(14265+8)=14273\\n#14273"``.

The reward reads the whole episode text (model turns and observations, as the environment contract
says: :mod:`grpo_lab.tasks.environment`) with one strict regular expression: any number of calls,
each followed by exactly the observation the environment writes for it, then ``#`` and a canonical
integer at the very end. An observation never holds ``#`` and always ends in a newline, so its number
is never read as the answer; an episode that ends on an observation (the turn limit, a truncation)
has no answer. Calls are parsed by a regular expression over digits and one operator, never ``eval``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..paths import data_dir
from .base import Problem, load_problems, save_problems
from .environment import StepResult

__all__ = ["CalculatorTask", "CalculatorEnvironment", "CALC_ALPHABET", "calc_result", "calc_observation",
           "parse_episode", "tool_response", "ERROR_OBSERVATION", "MAX_OPERAND_DIGITS"]

#: The character-level alphabet of the calculator checkpoint, that is the arithmetic alphabet
#: (:data:`grpo_lab.policy.models.CHARS`) and the call's parentheses.
CALC_ALPHABET = "0123456789+-*=#;.,:? abcdefghijklmnopqrstuvwxyz\n()"

#: The observation of a malformed call (no ``#``, ends in a newline like every observation).
ERROR_OBSERVATION = "=error\n"

#: The most digits an operand of a call may have; a longer operand is an error (no huge numbers).
MAX_OPERAND_DIGITS = 6

_CALL = re.compile(rf"calc\((\d{{1,{MAX_OPERAND_DIGITS}}})([*+-])(\d{{1,{MAX_OPERAND_DIGITS}}})\)")
_ANSWER = r"#(0|[1-9][0-9]{0,6})"
_OBS = r"=(?:-?[0-9]+|error)\n"
_EPISODE = re.compile(rf"((?:calc\([^()]*\){_OBS})*){_ANSWER}")
_CALL_OBS = re.compile(rf"calc\(([^()]*)\)({_OBS})")


def calc_result(expression: str) -> int | None:
    """The value of ``expression``, ``"<digits><op><digits>"`` with ``op`` one of ``*``, ``+``, ``-`` and each
    operand at most :data:`MAX_OPERAND_DIGITS` digits; ``None`` for anything else. Parsed, never evaluated.

    >>> calc_result("317*45"), calc_result("14265+28"), calc_result("3-5"), calc_result("3**4"), calc_result("1234567*2")
    (14265, 14293, -2, None, None)
    """
    m = _CALL.fullmatch(f"calc({expression})") if isinstance(expression, str) else None
    if m is None:
        return None
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return a * b if op == "*" else a + b if op == "+" else a - b


def calc_observation(expression: str) -> str:
    """The observation the environment writes for the call ``calc(expression)``: ``"=<result>\\n"``, or
    :data:`ERROR_OBSERVATION` for a malformed expression.

    >>> calc_observation("317*45"), calc_observation("x")
    ('=14265\\n', '=error\\n')
    """
    value = calc_result(expression)
    return ERROR_OBSERVATION if value is None else f"={value}\n"


def parse_episode(text: str) -> str | None:
    """The answer of a well-formed episode text, else ``None`` (strict; never evaluates).

    Well formed: any number of ``calc(...)`` calls, each followed by exactly the observation
    :func:`calc_observation` writes for it, then ``#`` and a canonical integer of at most 7 digits
    (no sign, no leading zero) ending the text. So an observation's number is never the answer.

    >>> parse_episode("calc(317*45)=14265\\n#14293"), parse_episode("#14293"), parse_episode("calc(317*45)=14265\\n")
    ('14293', '14293', None)
    >>> parse_episode("calc(317*45)=99\\n#99"), parse_episode("#14293\\n")
    (None, None)
    """
    if not isinstance(text, str):
        return None
    m = _EPISODE.fullmatch(text)
    if m is None:
        return None
    for call in _CALL_OBS.finditer(m.group(1)):
        if calc_observation(call.group(1)) != call.group(2):
            return None  # an "observation" the environment would not have written
    return m.group(2)


def tool_response(a: int, b: int, c: int, n_calls: int) -> str:
    """The demonstration episode that makes ``n_calls`` calls (0, 1 or 2) for ``a*b+c``, observations included.

    >>> tool_response(317, 45, 28, 1)
    'calc(317*45)=14265\\n#14293'
    >>> tool_response(317, 45, 28, 2)
    'calc(317*45)=14265\\ncalc(14265+28)=14293\\n#14293'

    Raises:
        ValueError: ``n_calls`` not 0, 1 or 2.
    """
    if n_calls not in (0, 1, 2):
        raise ValueError(f"tool_response: n_calls must be 0, 1 or 2, got {n_calls!r}")
    product, total = a * b, a * b + c
    text = "" if n_calls == 0 else f"calc({a}*{b})={product}\n"
    if n_calls == 2:
        text += f"calc({product}+{c})={total}\n"
    return text + f"#{total}"


class CalculatorEnvironment:
    """The calculator of one episode (:class:`~grpo_lab.tasks.environment.Environment`).

    A model turn ends at ``)`` (``stop_strings``); :meth:`step` reads the *last* ``calc(`` of the action and
    returns its result as the observation ``"=<result>\\n"`` (``done=False``), :data:`ERROR_OBSERVATION` for a
    malformed call (``done=False``), or ``""`` with ``done=True`` when the action holds no call. Per-turn
    rewards are 0. Stateless between turns apart from the turn count.

    Args:
        max_turns: model turns per episode at most (``>= 1``).

    Raises:
        ValueError: ``max_turns`` not an int ``>= 1``.
    """

    stop_strings: tuple[str, ...] = (")",)

    def __init__(self, max_turns: int = 3):
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"CalculatorEnvironment: max_turns must be an int >= 1, got {max_turns!r}")
        self.max_turns = max_turns
        self.problem: Problem | None = None
        self.calls = 0

    def reset(self, problem: Problem) -> None:
        """Start an episode on ``problem`` (the calculator does not read it)."""
        self.problem, self.calls = problem, 0

    def step(self, action: str) -> StepResult:
        """The observation for the model turn ``action`` (``str``): the last call's result, an error, or the end.

        Raises:
            TypeError: ``action`` is not a ``str``.
        """
        if not isinstance(action, str):
            raise TypeError(f"CalculatorEnvironment.step: action must be a str, got {type(action).__name__}")
        start = action.rfind("calc(")
        if start < 0:
            return StepResult("", done=True)
        self.calls += 1
        close = action.find(")", start)
        inner = action[start + 5:close] if close >= 0 else action[start + 5:]
        return StepResult(calc_observation(inner) if close >= 0 else ERROR_OBSERVATION, done=False)


@dataclass
class CalculatorTask:
    """``a*b+c=`` with a calculator tool (the module docstring shows the episodes).

    Args:
        a_digits, b_digits: digits of the two factors (1-4 each).
        c_max: ``c`` is uniform on ``1..c_max`` (``>= 1``).
        max_turns: model turns per episode (the environment's limit).
        max_new_tokens: the episode's budget in tokens, model and observation tokens together (the two-call
            episode of the largest default problem is 45 characters plus EOS).
        p_tool: share of pretraining demonstrations that call the tool (used by :mod:`grpo_lab.lab.pretrain`).
        p_second: share of those that also call it for the addition.
        test_size: problems in the fixed test set.

    Raises:
        ValueError: out-of-range arguments.
    """

    a_digits: int = 3
    b_digits: int = 2
    c_max: int = 9
    max_turns: int = 3
    max_new_tokens: int = 64
    p_tool: float = 0.4
    p_second: float = 0.5
    test_size: int = 200
    name: str = "calculator"

    def __post_init__(self):
        for k in ("a_digits", "b_digits"):
            if not 1 <= getattr(self, k) <= 4:
                raise ValueError(f"CalculatorTask: {k} must lie in 1..4, got {getattr(self, k)!r}")
        if self.c_max < 1 or self.max_turns < 1 or self.max_new_tokens < 1 or self.test_size < 1:
            raise ValueError("CalculatorTask: c_max, max_turns, max_new_tokens and test_size must be >= 1")
        for k in ("p_tool", "p_second"):
            if not 0.0 <= getattr(self, k) <= 1.0:
                raise ValueError(f"CalculatorTask: {k} must lie in [0, 1], got {getattr(self, k)!r}")

    def environment(self) -> CalculatorEnvironment:
        """A fresh calculator for one episode."""
        return CalculatorEnvironment(self.max_turns)

    # ----------------------------------------------------------------- problems
    def make_problem(self, a: int, b: int, c: int) -> Problem:
        """The problem ``a*b+c=``."""
        return Problem(f"{a}*{b}+{c}=", str(a * b + c), {"a": a, "b": b, "c": c})

    def sample(self, n: int, rng: np.random.Generator) -> list[Problem]:
        """``n`` problems drawn with ``rng`` (each factor uniform over its digit count, ``c`` over ``1..c_max``)."""
        out = []
        for _ in range(n):
            a = int(rng.integers(10 ** (self.a_digits - 1), 10 ** self.a_digits))
            b = int(rng.integers(10 ** (self.b_digits - 1), 10 ** self.b_digits))
            out.append(self.make_problem(a, b, int(rng.integers(1, self.c_max + 1))))
        return out

    def generate_test_set(self) -> list[Problem]:
        """The fixed test set: ``test_size`` distinct problems from seed 12345."""
        rng, seen, out = np.random.default_rng(12345), set(), []
        while len(out) < self.test_size:
            p = self.sample(1, rng)[0]
            if p.prompt not in seen:
                seen.add(p.prompt)
                out.append(p)
        return out

    def test_set_path(self):
        return data_dir() / "tasks" / f"{self.name}_a{self.a_digits}b{self.b_digits}c{self.c_max}_test.jsonl"

    def test_set(self) -> list[Problem]:
        """The fixed test set from ``data/tasks/`` (regenerated identically if the file is absent)."""
        path = self.test_set_path()
        return load_problems(path) if path.exists() else self.generate_test_set()

    def write_test_set(self):
        """Write the fixed test set to ``data/tasks/`` (``python -m grpo_lab.lab.pretrain calculator`` does it)."""
        save_problems(self.generate_test_set(), self.test_set_path())
        return self.test_set_path()

    # ----------------------------------------------------------------- scoring
    def extract_answer(self, completion: str) -> str | None:
        """The answer of a well-formed episode text (:func:`~grpo_lab.tasks.calculator.parse_episode`), else ``None``."""
        return parse_episode(completion)

    def is_correct(self, completion: str, problem: Problem) -> bool:
        """Well formed (:func:`~grpo_lab.tasks.calculator.parse_episode`) and the answer equals ``a*b+c``."""
        return parse_episode(completion) == problem.answer

    def reward(self, completion: str, problem: Problem) -> float:
        """Outcome reward in {0, 1} on the whole episode text; per-turn rewards are 0."""
        return 1.0 if self.is_correct(completion, problem) else 0.0

    @staticmethod
    def n_calls(completion: str) -> int:
        """Calls in an episode text (``calc(`` occurrences)."""
        return completion.count("calc(")

    # ----------------------------------------------------------------- pretraining data
    def demonstration(self, problem: Problem, rng: np.random.Generator) -> str:
        """A pretraining episode: with probability ``p_tool`` one call (then, with probability ``p_second``, a
        second call for the addition), else the direct answer; observations as the environment writes them."""
        a, b, c = (problem.meta[k] for k in ("a", "b", "c"))
        n_calls = 0
        if rng.random() < self.p_tool:
            n_calls = 2 if rng.random() < self.p_second else 1
        return tool_response(a, b, c, n_calls)
