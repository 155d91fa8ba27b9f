"""GSM8K: the task (:class:`GSM8KTask`), and the scorer that finds the final answer in a completion
and judges it against the gold answer.

GSM8K (Cobbe et al., "Training Verifiers to Solve Math Word Problems", arXiv 2110.14168) stores
each problem as ``{"question": ..., "answer": ...}``; the ``answer`` field is a worked rationale
that ends in a line ``#### 24``: the final answer, plain digits (``#### 57500``, never
``#### 57,500``). :func:`split_gold` splits that field; :func:`load_fixture` reads the small fixture
in that schema that ships with the package (``data/tasks/gsm8k_fixture.jsonl``, problems written
for grpo_lab, not taken from GSM8K). :class:`GSM8KTask` serves those problems, or GSM8K itself from
the Hugging Face hub or a local copy, with prompts in the policy's chat template.

Where the scorer's rules live:

* **the answer** (:func:`extract_answer`): the content of the *last* complete ``\\boxed{...}`` /
  ``\\fbox{...}`` (nested braces allowed) or the rest of the line after the *last* ``####``,
  whichever comes last; an unclosed box is not an answer.
* **the verdict** (:func:`score`): Hugging Face's `math-verify
  <https://github.com/huggingface/Math-Verify>`_ (``parse``, ``verify``), a box through
  ``LatexExtractionConfig``, a ``####`` answer through ``ExprExtractionConfig`` (as LaTeX if that
  finds nothing or the text holds ``\\frac``, ``\\sqrt``, ``\\cdot``, ...), the gold through
  ``ExprExtractionConfig`` after a strict check of its form (:data:`GOLD_RE`). Nothing is
  ``eval``-ed. math-verify's own rules stay: an equation counts by the right-hand side of its last
  ``=``, an expression by its value, a unit outside ``\\text`` is a symbol (``\\boxed{18 dollars}``
  is not 18).

What we add to math-verify, one line each:

1. one answer, not a hedge: neighbouring numbers must be joined by an operator or relation;
   ``#### 18 or 20``, ``18, 20``, ``18 -> 20`` score 0 (``_one_answer``);
2. true equations: numeric sides must equal the last one, ``\\boxed{2+3=6}`` scores 0 (``_sides_agree``);
3. mixed numbers ``a b/c`` and ``a \\frac{b}{c}`` are ``a + b/c``; an improper one scores 0 (``_mixed_numbers``);
4. normalisation (``_normalize``): Markdown emphasis or code around a whole ``####`` answer
   (``*73*``, ``_73_``, ``__73__``, ```73```) dropped, as math-verify drops bold ``**73**`` (not
   ``7*3`` or ``*7*3*``); final punctuation dropped, ``14{,}916`` / ``1\\,234`` /
   ``1 234`` one number, ``−`` a minus, ``°`` a degree, ``€ £ ¥`` dropped like ``\\$``;
5. numbers compared to :data:`FLOAT_ROUNDING` decimal places, not math-verify's default 6;
6. the percent rule: "p %" equals the gold p and the gold p/100 and no other gold, a decimal
   percentage and a text group such as ``\\text{28 percent}`` included (``_percent_readings``);
   a percent sign outside the box is not read;
7. bounded time (``_bounded``): math-verify's ``signal.alarm`` timeouts are off (they work
   only in the main thread), and answers that could make SymPy run for minutes score 0: longer
   than :data:`MAX_ANSWER_CHARS`, a command outside :data:`ALLOWED_COMMANDS`, a factorial, more
   than one power or a large or symbolic exponent, more than :data:`MAX_FREE_LETTERS` letters
   outside unit text and :data:`UNIT_WORDS`. So :func:`score` is the same function in any
   thread or process; calls from several threads are serialised by a lock.

The deliberate differences from Math-Verify's own test cases (decimal commas and units in a box,
a box spanning lines, a ``####`` answer ending at its line break) are listed in
``tests/tasks/test_gsm8k_math_verify_table.py``; ``tests/tasks/test_gsm8k_score.py`` compares :func:`score`
with math-verify called directly on a table of decorated answers.

The verdicts depend on the ANTLR runtime too: math-verify's LaTeX parser (latex2sympy2_extended) accepts
antlr4-python3-runtime 4.9.3 to 4.13.2 but does not parse the same with each (with 4.9.3, a percent in a box,
``\\boxed{25\\%}`` or ``\\boxed{28 pct}``, no longer scores). The tests are pinned to :data:`SCORER_ANTLR_VERSION`;
with another runtime installed, the first verdict warns once (:class:`ScorerVersionWarning`).
"""

from __future__ import annotations

import json
import logging
import re
import numbers
import os
import threading
import warnings
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from ..paths import data_dir, missing_data_hint
from .base import Problem, rows_sha256

__all__ = ["GOLD_RE", "FLOAT_ROUNDING", "MAX_ANSWER_CHARS", "MAX_FREE_LETTERS", "UNIT_WORDS",
           "ALLOWED_COMMANDS", "SCORER_ANTLR_VERSION", "ScorerVersionWarning", "check_antlr_runtime",
           "extract_answer", "answers_equivalent", "score", "split_gold", "parse_gold", "fixture_path", "load_fixture",
           "DEFAULT_INSTRUCTION", "GSM8KTask"]

#: The form of a GSM8K final answer (the text after ``####``): an optionally signed decimal
#: number, with or without comma thousands separators (``18``, ``-3``, ``1234``, ``1,234``, ``0.5``;
#: not ``0,111``, which math-verify would read as the decimal 0.111).
GOLD_RE = re.compile(r"[+-]?(?:[1-9]\d{0,2}(?:,\d{3})+|\d+)(?:\.\d+)?")

#: Decimal places to which math-verify rounds floats before comparing them (its default is 6).
FLOAT_ROUNDING = 10

#: Longest extracted answer (after normalisation) that is judged at all; longer ones score 0.
MAX_ANSWER_CHARS = 100

#: Most letters a boxed answer may have outside unit text and :data:`UNIT_WORDS` (``x = 5`` has
#: one); more score 0.
MAX_FREE_LETTERS = 3

#: Unit and percent words whose letters :data:`MAX_FREE_LETTERS` does not count when they end the
#: answer, bare (``25 percent``, ``3 miles per hour``) or inside ``\\text{...}`` / ``\\mbox{...}``
#: (``\\text{30 degrees}``): whole words, in any case, also with a plural ``s`` or ``es``
#: (``hours``, ``inches``), separated by spaces, ``/`` or ``.``. A unit word elsewhere
#: (``20 hours, not 18``) counts. Whether the answer is then right is math-verify's verdict (plus
#: the percent rule), not ours.
UNIT_WORDS = frozenset({
    "percent", "percentage", "pct",                                           # percent
    "degree", "deg",                                                          # angle, temperature
    "dollar", "cent", "euro", "pound", "usd",                                 # money
    "second", "sec", "minute", "min", "hour", "hr", "day", "week", "month", "year", "yr",  # time
    "mm", "cm", "km", "meter", "metre", "inch", "foot", "feet", "ft", "yard", "yd", "mile",  # length
    "sq", "acre", "ml", "liter", "litre", "gallon", "gal",                    # area, volume
    "mg", "gram", "kg", "ounce", "oz", "lb", "ton",                           # mass
    "mph", "kmh", "per",                                                      # speed
})

#: LaTeX commands (by name) a boxed answer may use; any other command scores 0. Escaped single
#: characters (``\\$``, ``\\%``, ``\\,``, ``\\{``) are always allowed.
ALLOWED_COMMANDS = frozenset({
    "frac", "dfrac", "tfrac", "text", "textbf", "textit", "textrm", "textsf", "textnormal", "mathrm",
    "mathbf", "mathit", "mbox", "boxed", "fbox", "left", "right", "cdot", "times", "div", "sqrt",
    "quad", "qquad", "displaystyle", "thinspace", "approx", "sim", "simeq",
})

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_MARKER = "####"
# Text-like groups: a unit (no digit inside) is dropped before letters are counted; a group with a
# digit (``\text{13}``) is read by math-verify as math, so its letters count.
_TEXT_GROUP = re.compile(r"\\(?:text|textbf|textit|textrm|textsf|textnormal|mathrm|mathbf|mathit|mbox)"
                         r"\s*\{([^{}]*)\}")
_COMMAND = re.compile(r"\\([A-Za-z]+|.)", re.DOTALL)
# A power: ``^``, or ``**`` between two operands (so that Markdown bold, ``**18**``, is not one).
_POWER = re.compile(r"\^|(?<=[\w.)}\]])\s*\*\*(?=\s*[-+]?[\w.({\[])")
_EXPONENT = re.compile(r"\s*(?:\{\s*[-+]?\d{1,2}\s*\}|[-+]?\d{1,2}(?![\d.]))")
_FACTORIAL = re.compile(r"(?<!\\)!")
# Thousands grouped by a space or a LaTeX space: 1 234, 1\,234, 1~234, 12\;345\;678.
_SEP = r"(?:\\[,;: ]|\\thinspace\s?|~|[ \u00a0\u2009\u202f])"
# (not before a "/": in "4 400/900" the 400 is a numerator, the mixed number 4 + 400/900)
_GROUPED = re.compile(rf"(?<![\d.])\d{{1,3}}(?:{_SEP}\d{{3}})+(?![\d]|\s*/)")
_TRAILING_PERCENT = re.compile(r"\s*\\?%\s*$")
# Sentence punctuation ending the answer (``42.``, ``5 \text{ cm}.``); not an ellipsis.
_TRAILING_PUNCT = re.compile(r"(?<!\.)\s*[.,;:]\s*$")
# Thousands written ``14{,}916`` or ``16,\!386``: a plain comma.
_LATEX_COMMA = re.compile(r"(?<=\d)(?:\{,\}|,\\!\s*)(?=\d)")
# A mixed number: a whole part, a space (or a LaTeX space), a fraction ``b/c`` or ``\frac{b}{c}``
# (no space needed before ``\frac``); not inside a longer number, a fraction or a command.
_MIXED_HEAD = r"(?<![\w.,/}^\\])([-+]?)(\d+)"
_MIXED_GAP = r"(?:[ \t\u00a0]|\\[,;: ]|~)"
_MIXED = re.compile(_MIXED_HEAD + _MIXED_GAP + r"+(0|[1-9]\d*)[ \t]*/[ \t]*(\d+)(?![\w.,/])"
                    + "|" + _MIXED_HEAD + _MIXED_GAP + r"*\\[dt]?frac\s*\{\s*(0|[1-9]\d*)\s*\}\s*\{\s*(\d+)\s*\}")
# What :func:`_one_answer` reads: arrows (a change of mind, ``18 -> 20``), fractions in LaTeX
# (``\frac12``, ``\frac{1}{2}``), numbers (``1,234.5`` and the decimal comma ``2,74`` are one
# number), and what may join two numbers of one answer: an operator or a relation.
_ARROW = re.compile(r"->|=>|\u2192|\u21d2|\\(?:to|rightarrow|Rightarrow|longrightarrow|implies)(?![A-Za-z])")
_FRAC_SKELETON = re.compile(r"\\[dtc]?frac\s*(\{[^{}]*\}|\d)\s*(\{[^{}]*\}|\d)")
_NUMBER = re.compile(r"[0-9]+(?:[.,][0-9]+)*")
_JOINER = re.compile(r"[-+*/\u00d7\u00f7^=]|\\(?:cdot|times|div|approx|sim|simeq|sqrt)(?![A-Za-z])")
# LaTeX that changes the value of a number written before it (``4\sqrt{2}``, ``2^{10}``,
# ``3 \cdot 6``): a ``####`` answer holding it is read as LaTeX, not by math-verify's plain-number
# reading (which reads ``4\sqrt{2}`` as 4). A degree sign is not such a power.
_VALUE_LATEX = re.compile(r"\\(?:[dtc]?frac|sqrt|cdot|times|div)(?![A-Za-z])|\^(?!\s*(?:\\circ|\{\s*\\circ))")
# Currency signs math-verify's LaTeX reading does not drop (it drops ``\$``).
_CURRENCY = str.maketrans("", "", "\u20ac\u00a3\u00a5")
# An ``=`` of an equation (not ``<=``, ``>=``, ``!=``, ``==``).
_EQUALS = re.compile(r"(?<![<>!=\\])=(?!=)")
# What a side of an equation may hold and still be a plain number (no letters are left after
# dropping these): unit text, ``\$``, spaces and arithmetic commands.
_NUMERIC_NOISE = re.compile(r"\\(?:text|textbf|textit|textrm|textsf|textnormal|mathrm|mathbf|mathit|mbox)\s*\{[^{}\d]*\}"
                            r"|\\(?:frac|dfrac|tfrac|cdot|times|div|sqrt|left|right)(?![A-Za-z])|\\.")
# A degree sign written as a power (``^\circ``, ``^{\circ}``): not a power for the guard.
_DEGREE = re.compile(r"\^\s*(?:\\circ(?![A-Za-z])|\{\s*\\circ\s*\})")
# The unit words that end an answer (``5 hours``, ``3 miles per hour``, ``2 km / h`` leaves ``h``):
# whole words, not the tail of a command (\sec) or of a longer word. Only a final run is exempt, so
# unit words cannot build a long product of sums, (cm+km)(kg+mm)..., that SymPy takes seconds on.
_UNIT_TAIL = re.compile(r"(?<![A-Za-z\\])(?:(?:" + "|".join(sorted(UNIT_WORDS, key=len, reverse=True))
                        + r")(?:e?s)?(?![A-Za-z])[\s/.]*)+$", re.IGNORECASE)
# A text group that is exactly one number and a percent marker: \text{28 percent}, \mbox{12.5\%}.
_TEXT_PERCENT = re.compile(r"\\(?:text|textbf|textit|textrm|textsf|textnormal|mathrm|mathbf|mathit|mbox)\s*"
                           rf"\{{\s*({GOLD_RE.pattern})\s*(?:\\?%|[Pp]ercent(?:age)?|[Pp]ct)\s*\}}")

# Markdown emphasis or code wrapping a whole ``####`` answer (``*73*``, ``_73_``, ``__73__``, ``***73***``,
# ```73```, ````73````), sentence punctuation after it allowed: the inner text, which holds no delimiter
# character and neither starts nor ends with a space (so ``7*3``, ``*7*3*``, ``_7_3_`` are not wrapped).
# Bold ``**73**`` is left to math-verify, which reads it already.
_WRAPPED = re.compile(r"(\*\*\*|\*|__|_|``|`)(?![\s*_`])([^*_`]+?)(?<![\s*_`])\1")

_LOCK = threading.Lock()
_log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ extraction
def _locate(completion: str) -> tuple[str, str] | None:
    """``(kind, text)`` of the final answer, kind ``"boxed"`` or ``"####"``; ``None`` if none."""
    # One pass matches every unescaped "{" with its "}" (a stack), so the scan is linear even for a
    # completion full of unclosed boxes.
    closing, stack, i, n = {}, [], 0, len(completion)
    while i < n:
        c = completion[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            closing[stack.pop()] = i
        i += 1
    box = None  # (start, end, content) of the last complete box
    for m in _BOX_OPEN.finditer(completion):
        end = closing.get(m.end() - 1)
        if end is not None:
            box = (m.start(), end, completion[m.end():end])
    marker = completion.rfind(_MARKER)
    if marker >= 0 and (box is None or marker > box[1]):
        line = completion[marker + len(_MARKER):].split("\n", 1)[0]
        return "####", line.strip()
    if box is not None:
        return "boxed", box[2].strip()
    return None


def extract_answer(completion: str) -> str | None:
    """The final answer of a completion, as text.

    It is the content of the last complete ``\\boxed{...}`` or ``\\fbox{...}`` (balanced braces,
    nested braces allowed; escaped braces ``\\{``, ``\\}`` are not counted; an unclosed box is not
    an answer), or the rest of the line after the last ``####``, whichever comes last (a ``####``
    inside the last box belongs to the box). Both are stripped of surrounding whitespace.

    >>> extract_answer(r"3+4=7, so \\boxed{7}. Check: \\boxed{\\frac{14}{2}} holds.")
    '\\\\frac{14}{2}'
    >>> extract_answer("9*2 = 18\\n#### 18")
    '18'
    >>> extract_answer("no answer here") is None
    True

    Args:
        completion: the model's completion only (not the prompt: a prompt that shows a boxed
            example would otherwise be read as the answer).

    Returns:
        ``str`` (possibly empty, e.g. for ``\\boxed{}``), or ``None`` if the completion has neither
        a complete box nor ``####``.

    Raises:
        TypeError: ``completion`` is not a ``str``.
    """
    if not isinstance(completion, str):
        raise TypeError(f"extract_answer: completion must be a str, got {type(completion).__name__}")
    found = _locate(completion)
    return None if found is None else found[1]


# ------------------------------------------------------------------------------- the gold
def split_gold(answer_field: str) -> tuple[str, str]:
    """Split a GSM8K ``answer`` field at its last ``####`` into ``(rationale, final)``.

    >>> split_gold("She has 6*3=<<6*3=18>>18 eggs.\\n#### 18")
    ('She has 6*3=<<6*3=18>>18 eggs.', '18')

    Returns:
        ``(rationale, final)``: the text before the marker without trailing whitespace, and the
        text after it stripped (GSM8K writes plain digits there, e.g. ``"57500"``).

    Raises:
        TypeError: ``answer_field`` is not a ``str``.
        ValueError: it has no ``####``, nothing after the last one, or more than one line after it.
    """
    if not isinstance(answer_field, str):
        raise TypeError(f"split_gold: answer_field must be a str, got {type(answer_field).__name__}")
    k = answer_field.rfind(_MARKER)
    if k < 0:
        raise ValueError(f"split_gold: the GSM8K answer field has no '####' final-answer line: {answer_field!r:.200}")
    rationale, final = answer_field[:k].rstrip(), answer_field[k + len(_MARKER):].strip()
    if not final or "\n" in final:
        raise ValueError(f"split_gold: expected one final answer after the last '####', got {final!r:.200}")
    return rationale, final


#: the antlr4-python3-runtime release the scorer's tables were checked with (``requirements/ci.txt`` pins it)
SCORER_ANTLR_VERSION = "4.13.2"


class ScorerVersionWarning(UserWarning):
    """The installed ANTLR runtime is not :data:`SCORER_ANTLR_VERSION`: math-verify may judge some answers otherwise."""


@lru_cache(maxsize=1)
def check_antlr_runtime() -> str | None:
    """Warn once per process (:class:`ScorerVersionWarning`) when the installed antlr4-python3-runtime is not
    :data:`SCORER_ANTLR_VERSION`; :func:`score` calls it before its first verdict.

    Returns:
        the installed version (from the package metadata), or None when it is not installed.
    """
    try:
        installed = metadata.version("antlr4-python3-runtime")
    except metadata.PackageNotFoundError:
        return None
    if installed != SCORER_ANTLR_VERSION:
        warnings.warn(f"grpo_lab.tasks.gsm8k: antlr4-python3-runtime {installed} is installed, the scorer was checked "
                      f"with {SCORER_ANTLR_VERSION}; math-verify's LaTeX parser does not read every answer the same "
                      "with both (e.g. \\boxed{25\\%}), so rewards may differ: pip install "
                      f"antlr4-python3-runtime=={SCORER_ANTLR_VERSION}", ScorerVersionWarning, stacklevel=3)
    return installed


def _math_verify():
    """The ``math_verify`` module, imported on first use (it is the optional ``math`` extra)."""
    try:
        import math_verify
    except ImportError as e:
        raise ImportError("grpo_lab.tasks.gsm8k needs math-verify to score answers: "
                          "pip install 'grpo_lab[math]' (or pip install math-verify)") from e
    _quiet_timeout_warning()
    check_antlr_runtime()
    return math_verify


@lru_cache(maxsize=1)
def _quiet_timeout_warning() -> None:
    # math-verify warns once that its timeout is off; ours is replaced by the bounds above.
    class _DropTimeoutOff(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not str(record.msg).startswith("Timeout is disabled")

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutOff())


@lru_cache(maxsize=4096)
def _parse_gold_cached(text: str) -> tuple:
    mv = _math_verify()
    with _LOCK:
        parsed = mv.parse(text, [mv.ExprExtractionConfig()], fallback_mode="no_fallback", parsing_timeout=None)
    return tuple(parsed)


def parse_gold(gold: str) -> list:
    """Parse a GSM8K final answer (the text after ``####``) for :func:`score`.

    Args:
        gold: e.g. ``"18"``, ``"-3"``, ``"1234"``, ``"1,234"``, ``"0.5"``; surrounding whitespace
            is ignored. It must match :data:`GOLD_RE`.

    Returns:
        math-verify's parse of it: a one-element ``list`` holding a SymPy number.

    Raises:
        TypeError: ``gold`` is not a ``str``.
        ValueError: ``gold`` is not a number of that form (the message names it).
        ImportError: math-verify is not installed.
    """
    if not isinstance(gold, str):
        raise TypeError(f"gold must be a str such as '18', got {type(gold).__name__} {gold!r:.60}")
    text = gold.strip()
    if not GOLD_RE.fullmatch(text):
        raise ValueError(f"gold {gold!r:.80} is not a GSM8K final answer (a decimal number such as "
                         "'18', '-3', '1234' or '1,234': the text after '####'; split_gold extracts it)")
    parsed = list(_parse_gold_cached(text.removeprefix("+")))  # math-verify's number regex has no "+"
    if len(parsed) != 1:  # cannot happen for GOLD_RE's numbers; kept as a guard against math-verify changes
        raise ValueError(f"math-verify could not parse the gold {gold!r:.80} (got {parsed!r:.80})")
    return parsed


# -------------------------------------------------------------------------------- scoring
def _normalize(text: str, kind: str) -> tuple[str, bool]:
    """``(answer, percent)``: the answer as math-verify should see it (see the module docstring's
    list), ``""`` for one that is refused (an invalid mixed number), and whether a trailing percent
    sign was dropped from it."""
    wrapped = _WRAPPED.fullmatch(_TRAILING_PUNCT.sub("", text)) if kind == "####" else None
    if wrapped:  # Markdown emphasis or code around the answer, read like bold (rule 4)
        text = wrapped.group(2)
    text = text.replace("\u2212", "-").replace("\u00b0", "^{\\circ}").translate(_CURRENCY)
    text = _LATEX_COMMA.sub(",", text)
    text = _GROUPED.sub(lambda m: re.sub(_SEP, "", m.group(0)), text)
    text = _mixed_numbers(_TRAILING_PUNCT.sub("", text))
    text = _TEXT_PERCENT.sub(lambda m: m.group(1) + "\\%", text)
    percent = bool(_TRAILING_PERCENT.search(text))
    text = _TRAILING_PERCENT.sub("", text)
    return text.strip(), percent


def _bounded(text: str, latex: bool) -> bool:
    """Whether math-verify can judge ``text`` in bounded time (the module docstring's rules).
    ``latex``: the text is read as LaTeX (letters reach SymPy) rather than by math-verify's plain
    number/expression regexes (which pass only digits and operators)."""
    if len(text) > MAX_ANSWER_CHARS or _FACTORIAL.search(text):
        return False
    text = _DEGREE.sub(" ", text)
    powers = list(_POWER.finditer(text))
    if len(powers) > 1 or any(not _EXPONENT.match(text, p.end()) for p in powers):
        return False
    if not latex:
        return True
    if any(m.group(1).isalpha() and m.group(1) not in ALLOWED_COMMANDS for m in _COMMAND.finditer(text)):
        return False
    plain = _TEXT_GROUP.sub(lambda m: m.group(1) if re.search(r"\d", m.group(1)) else " ", text)
    plain = re.sub(r"\\[A-Za-z]+", " ", plain)
    letters = sum(ch.isalpha() for ch in plain)  # unit words too: (cm+km+kg+1)^{99} hangs SymPy
    free_letters = sum(ch.isalpha() for ch in _UNIT_TAIL.sub(" ", plain.rstrip()))
    return free_letters <= MAX_FREE_LETTERS and not (powers and letters)


def _mixed_numbers(text: str) -> str:
    """``text`` with each mixed number ``a b/c`` or ``a \\frac{b}{c}`` written as the one fraction
    ``(a*c+b)/c`` (``\\frac{..}{..}`` for the LaTeX form), its sign in front; ``""`` (refused) if one
    is not a proper fraction (``c = 0`` or ``b >= c``: ``4 0/0``, ``11 7/6``)."""
    refused = []

    def rewrite(m: re.Match) -> str:
        latex = m.group(1) is None
        sign, whole, num, den = m.groups()[4:] if latex else m.groups()[:4]
        whole, num, den = int(whole), int(num), int(den)
        if den == 0 or num >= den:
            refused.append(m.group(0))
            return m.group(0)
        top = whole * den + num
        return f"{sign}\\frac{{{top}}}{{{den}}}" if latex else f"{sign}{top}/{den}"

    text = _MIXED.sub(rewrite, text)
    return "" if refused else text


def _one_answer(text: str) -> bool:
    """Whether ``text`` states one answer: every two neighbouring numbers in it are joined by an
    operator or a relation (``3 \\cdot 6 = 18``, ``\\frac{1}{2}``, ``50 \\text{ cm}^2``), not by
    words, commas or arrows alone (``18 or 20``, ``18, 20``, ``18 (not 20)``, ``18 -> 20``,
    ``17 18``): those list several candidates, and a hedge is not an answer."""
    skeleton = _FRAC_SKELETON.sub(r"(\1)/(\2)", _ARROW.sub(" ; ", text))
    numbers = list(_NUMBER.finditer(skeleton))
    for left, right in zip(numbers, numbers[1:]):
        between = skeleton[left.end():right.start()]
        if "," in between or ";" in between or not _JOINER.search(between):
            return False
    return True


def _sides_agree(mv, text: str, latex: list) -> bool:
    """Whether every side of an equation in ``text`` that is a plain number (no letters, no
    percent) equals the last such side: ``3 \\cdot 6 = 18`` agrees, ``3 \\cdot 6 = 20`` does not
    (math-verify alone judges an equation by its right-hand side only). Text without ``=``
    agrees. Called under :data:`_LOCK` on an answer that passed :func:`_bounded`."""
    sides = [side.strip() for side in _EQUALS.split(text)]
    numeric = [side for side in sides if side and "%" not in side
               and not re.search(r"[A-Za-z]", _NUMERIC_NOISE.sub(" ", side))]
    if len(sides) < 2 or len(numeric) < 2:
        return True
    values = [mv.parse("\\boxed{" + side + "}", latex, fallback_mode="no_fallback", parsing_timeout=None)
              for side in numeric]
    return all(values) and all(mv.verify(values[-1], value, float_rounding=FLOAT_ROUNDING, timeout_seconds=None)
                               for value in values[:-1])


def _judge(kind: str, text: str, gold: list, percent: bool) -> bool:
    """math-verify's verdict on the normalised answer ``text`` against the parsed ``gold``, with
    the module docstring's rules: one answer (:func:`_one_answer`), consistent equations
    (:func:`_sides_agree`), and the percent rule (``percent``: a trailing percent sign was dropped)."""
    if not _one_answer(text):
        return False
    mv = _math_verify()
    latex = [mv.LatexExtractionConfig(boxed_match_priority=0)]
    with _LOCK:
        pred = _read(mv, kind, text, latex)
        if not pred or not _sides_agree(mv, text, latex):  # its numeric sides pass the guard: no letters
            return False
        return any(mv.verify(gold, reading, float_rounding=FLOAT_ROUNDING, timeout_seconds=None)
                   for reading in _percent_readings(pred, percent))


def _read(mv, kind: str, text: str, latex: list) -> list:
    """math-verify's parse of the normalised answer ``text`` (``[]``: none, or not judged in bounded
    time): a ``####`` answer without value-changing LaTeX as a plain expression, else (a box, or that
    found nothing) as LaTeX in a box. Called under :data:`_LOCK`."""
    pred = []
    if kind == "####" and not _VALUE_LATEX.search(text) and _bounded(text, latex=False):
        pred = mv.parse(text, [mv.ExprExtractionConfig()], fallback_mode="no_fallback", parsing_timeout=None)
    if not pred and _bounded(text, latex=True):  # a box, or a #### answer written in LaTeX
        pred = mv.parse("\\boxed{" + text + "}", latex, fallback_mode="no_fallback", parsing_timeout=None)
    return pred


@lru_cache(maxsize=4096)
def _answer_value(answer: str) -> tuple:
    """The reading maj@k groups an extracted answer by: the normalised text read as a ``####`` answer
    (:func:`_read`), a percentage as its number (the percent rule's first reading); ``()`` for a hedge,
    an equation whose numeric sides disagree, or text math-verify cannot read."""
    text, percent = _normalize(answer, "####")
    if not text or not _one_answer(text):
        return ()
    mv = _math_verify()
    latex = [mv.LatexExtractionConfig(boxed_match_priority=0)]
    with _LOCK:
        pred = _read(mv, "####", text, latex)
        if not pred or not _sides_agree(mv, text, latex):
            return ()
    return tuple(_percent_readings(pred, percent)[0])


def answers_equivalent(a: str, b: str) -> bool:
    """Whether two extracted final answers (:func:`extract_answer`) are the same answer, as maj@k
    groups them (:func:`grpo_lab.experiments.evaluation.maj_at_k`): equal text, or both read by the
    scorer's rules (normalised, one answer, read as a ``####`` answer, a percentage as its number) and
    equal by math-verify's ``verify`` to :data:`FLOAT_ROUNDING` places. ``"18"``, ``"$18"``,
    ``"18.0"`` and ``"*18*"`` are one answer; ``"18 or 20"`` and an unreadable text equal only
    themselves.

    >>> answers_equivalent("$18", "18.0"), answers_equivalent("18", "20")
    (True, False)

    Raises:
        TypeError: ``a`` or ``b`` is not a ``str``. Nothing else: a math-verify error is ``False``.
        ImportError: math-verify is not installed.
    """
    if not isinstance(a, str) or not isinstance(b, str):
        raise TypeError(f"answers_equivalent: answers must be str, got {type(a).__name__} and {type(b).__name__}")
    if a == b:
        return True
    try:
        ra, rb = _answer_value(a), _answer_value(b)
        if not ra or not rb:
            return False
        mv = _math_verify()
        with _LOCK:
            return bool(mv.verify(list(ra), list(rb), float_rounding=FLOAT_ROUNDING, timeout_seconds=None))
    except Exception:  # math-verify / SymPy errors on odd input: not shown equal
        _log.debug("answers_equivalent: error while comparing two answers; not equivalent", exc_info=True)
        return False


def _percent_readings(pred: list, percent: bool) -> list[list]:
    """The readings of math-verify's parse ``pred`` under the percent rule: ``[pred]`` when it holds
    no percentage; else ``[number, value]``, each percentage ``X%`` (math-verify's
    ``X * UnevaluatedExpr(1/100)``; with ``percent``, the whole answer) read as ``X`` and as
    ``X/100``. Items that are not SymPy expressions (math-verify's string form) are kept as they are."""
    from sympy import Basic, Mul, Rational, UnevaluatedExpr
    from sympy.core.relational import Relational

    mark = UnevaluatedExpr(Rational(1, 100))

    def is_percentage(e) -> bool:
        return isinstance(e, Mul) and len(e.args) == 2 and e.args[1] == mark

    def read(expr, scale):
        if not isinstance(expr, Basic):
            return expr
        expr = expr.replace(is_percentage, lambda e: e.args[0] * scale)
        if not percent or scale == 1:
            return expr
        if isinstance(expr, Relational):
            return expr.func(expr.lhs, expr.rhs * scale, evaluate=False)
        return expr * scale

    if not percent and not any(isinstance(p, Basic) and p.has(mark) for p in pred):
        return [pred]
    return [[read(p, 1) for p in pred], [read(p, Rational(1, 100)) for p in pred]]


def score(completion: str, gold: str) -> float:
    """The GSM8K outcome reward: 1.0 if the completion's final answer equals ``gold``, else 0.0.

    The answer is found by :func:`extract_answer` (last box or ``####`` line) and judged with
    math-verify as the module docstring describes (equations by their right-hand side, their
    numeric sides checked; one answer, not a hedge; mixed numbers as ``a + b/c``; percents by the
    percent rule; numbers to :data:`FLOAT_ROUNDING` decimal places, units and ``\\$`` ignored;
    answers that could not be judged in bounded time score 0). Safe in any thread or process; never evaluates the text.

    Args:
        completion: the completion only, **not** the prompt followed by the completion: a boxed
            answer in the prompt (a few-shot example, or the instruction ``\\boxed{}``) would
            otherwise be scored as the model's answer.
        gold: the GSM8K final answer, the text after ``####`` (``"18"``, ``"-3"``, ``"1,234"``);
            see :func:`split_gold` and :func:`parse_gold`.

    Returns:
        ``1.0`` or ``0.0``. A completion with neither a complete box nor ``####`` scores 0.0; so
        does any answer math-verify cannot parse, or that raises inside it.

    Raises:
        TypeError: ``completion`` or ``gold`` is not a ``str``.
        ValueError: ``gold`` is not a GSM8K final answer (the message names it). Nothing about the
            completion raises.
        ImportError: math-verify is not installed.
    """
    gold_parsed = parse_gold(gold)
    if not isinstance(completion, str):
        raise TypeError(f"score: completion must be a str, got {type(completion).__name__}")
    try:
        found = _locate(completion)
        if found is None:
            return 0.0
        kind, text = found
        text, percent = _normalize(text, kind)
        return 1.0 if text and _judge(kind, text, gold_parsed, percent) else 0.0
    except Exception:  # math-verify / SymPy errors on odd input (KeyboardInterrupt still propagates)
        _log.debug("score: error while judging a completion; scored 0", exc_info=True)
        return 0.0


# -------------------------------------------------------------------------------- fixture
def fixture_path() -> Path:
    """``<data_dir>/tasks/gsm8k_fixture.jsonl`` (:func:`grpo_lab.paths.data_dir`); it need not
    exist. Raises nothing."""
    return data_dir() / "tasks" / "gsm8k_fixture.jsonl"


def load_fixture(path: str | Path | None = None) -> list[dict]:
    """Read GSM8K-schema problems from a JSON-lines file.

    Args:
        path: the file; ``None`` reads the fixture shipped with grpo_lab, :func:`fixture_path`
            (24 grade-school word problems written for grpo_lab, not taken from GSM8K).

    Returns:
        ``list[dict]``, one ``{"question": str, "answer": str}`` per non-empty line, in file
        order; each ``answer`` ends in a ``####`` final-answer line (:func:`split_gold`).

    Raises:
        FileNotFoundError: the file does not exist (for the default path, the message says where
            grpo_lab looked for its data).
        ValueError: a line is not a JSON object with string ``question`` and ``answer``, or its
            ``answer`` has no ``####`` final answer (the message gives ``path:line``).
    """
    default = path is None
    path = fixture_path() if default else Path(path)
    if not path.is_file():
        hint = f"; {missing_data_hint()}" if default else ""
        raise FileNotFoundError(f"load_fixture: no GSM8K problem file at {path}{hint}")
    out = []
    with path.open(encoding="utf-8") as f:
        for k, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"load_fixture: {path}:{k} is not JSON ({e})") from None
            if not isinstance(record, dict) or not all(isinstance(record.get(key), str) for key in ("question", "answer")):
                raise ValueError(f"load_fixture: {path}:{k} must be a JSON object with string 'question' and 'answer'")
            try:
                split_gold(record["answer"])
            except ValueError as e:
                raise ValueError(f"load_fixture: {path}:{k}: {e}") from None
            out.append({"question": record["question"], "answer": record["answer"]})
    return out


# ----------------------------------------------------------------------------------- the task
#: The instruction :class:`GSM8KTask` appends to each question by default. The empty box is what
#: the scorer reads (:func:`extract_answer`); it sits in the prompt, never in the completion the
#: reward scores.
DEFAULT_INSTRUCTION = "Solve the problem step by step. Put the final answer in \\boxed{}."

#: The sources of :class:`GSM8KTask` that are names rather than paths.
_NAMED_SOURCES = ("fixture", "hub")
#: File types a local ``source`` may have (a directory is the third kind).
_FILE_SUFFIXES = (".jsonl", ".parquet")


def _text_field(who: str, value, *, empty: bool = False, none: bool = False):
    """``value`` as a ``str`` (an ``os.PathLike`` becomes its path text); ``ValueError`` when it is
    not one, or is empty and ``empty`` is false. ``None`` passes when ``none``."""
    if value is None and none:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or (not value and not empty):
        kind = "a str" if empty else "a non-empty str"
        raise ValueError(f"GSM8KTask: {who} must be {kind}{' or None' if none else ''}, got {value!r:.80}")
    return value


def _split_file_rows(rows: list[dict], where: str) -> dict[str, list[dict]]:
    """A single file's rows as ``{"train": ..., "test": ...}``: the last ``len(rows) // 3`` rows
    are the test split, the others (in file order) the train split; the shipped fixture's 24
    problems give 16 and 8. ``ValueError`` for fewer than 3 rows (``where`` names the file)."""
    if len(rows) < 3:
        raise ValueError(f"GSM8KTask: {where} has {len(rows)} problems; a single file is split into train (the "
                         "first two thirds) and test (the last third) and needs at least 3")
    k = len(rows) - len(rows) // 3
    return {"train": rows[:k], "test": rows[k:]}


def _datasets_module(why: str):
    """The ``datasets`` module, imported on first use; ``ImportError`` naming ``why`` without it."""
    try:
        import datasets
    except ImportError as e:
        raise ImportError(f"GSM8KTask: {why} is read with Hugging Face datasets, which is not installed: "
                          "pip install datasets (or use source='fixture' or a .jsonl file)") from e
    return datasets


def _rows_of(dataset, where: str) -> list[dict]:
    """``{"question", "answer"}`` dicts from a ``datasets.Dataset``, each checked
    (``ValueError`` naming ``where`` and the row otherwise)."""
    missing = [c for c in ("question", "answer") if c not in dataset.column_names]
    if missing:
        raise ValueError(f"GSM8KTask: {where} lacks the column(s) {missing} of GSM8K's schema "
                         f"(question, answer); it has {dataset.column_names}")
    rows = []
    for i, (q, a) in enumerate(zip(dataset["question"], dataset["answer"])):
        if not isinstance(q, str) or not isinstance(a, str):
            raise ValueError(f"GSM8KTask: {where} row {i}: question and answer must be strings")
        try:
            split_gold(a)
        except ValueError as e:
            raise ValueError(f"GSM8KTask: {where} row {i}: {e}") from None
        rows.append({"question": q, "answer": a})
    return rows


def _reraise(exc: Exception, message: str):
    """``exc``'s type with ``message`` (``RuntimeError`` when that type cannot take one), from ``exc``."""
    try:
        new = type(exc)(message)
    except Exception:
        new = RuntimeError(message)
    raise new from exc


@dataclass
class GSM8KTask:
    """GSM8K grade-school math word problems, rewarded 1 for the right final answer, else 0.

    GSM8K: Cobbe et al. 2021, arXiv 2110.14168. The reward is DeepSeekMath's outcome reward (§4.1.2), judged by
    :func:`grpo_lab.tasks.gsm8k.score` on the completion only. Data and tokenizer are read at the first
    :meth:`sample` or :meth:`test_set` and kept off the fields (``task_spec``, equality and pickling see settings).
    Prompts (:meth:`format_prompt`): with ``tokenizer_name``, its chat template on an optional ``system_prompt``
    and the user turn (question, newline, ``instruction``) with the generation prompt; without, the plain
    ``"[system_prompt\\n\\n]Question: <question>\\n<instruction>\\nAnswer:"``.

    Args:
        source: ``"fixture"`` (24 shipped problems, :func:`grpo_lab.tasks.gsm8k.load_fixture`: 16 train, 8 test);
            ``"hub"`` (``datasets.load_dataset(dataset_id, config, split=...)``, offline, from the cache); a
            directory laid out as the hub repository; or a ``.jsonl`` / ``.parquet`` file with ``question`` and
            ``answer`` columns (the last ``len // 3`` test).
        dataset_id, config, train_split, test_split: for the hub and a directory (configs ``"main"``, ``"socratic"``).
        test_size, max_new_tokens: the first ``test_size`` test problems (``None``: all); the generation budget.
        system_prompt, instruction: the system turn or first paragraph; a line after each question.
        tokenizer_name: a local checkpoint or hub id whose chat template formats prompts (named, not passed,
            so that ``Trainer.resume`` rebuilds the task); ``None``: plain text.

    Raises:
        ValueError: a setting of the wrong type or value, or a ``source`` path that is not a directory, a
            ``.jsonl`` or a ``.parquet`` file.
        FileNotFoundError: a ``source`` path that does not exist.
    """

    source: str = "fixture"
    dataset_id: str = "openai/gsm8k"
    config: str = "main"
    train_split: str = "train"
    test_split: str = "test"
    test_size: int | None = None
    max_new_tokens: int = 512
    system_prompt: str | None = None
    instruction: str = DEFAULT_INSTRUCTION
    tokenizer_name: str | None = None
    name: str = "gsm8k"

    def __post_init__(self):
        self.source = _text_field("source", self.source)
        for key in ("dataset_id", "config", "train_split", "test_split"):
            setattr(self, key, _text_field(key, getattr(self, key)))
        self.system_prompt = _text_field("system_prompt", self.system_prompt, empty=True, none=True)
        self.instruction = _text_field("instruction", self.instruction, empty=True)
        self.tokenizer_name = _text_field("tokenizer_name", self.tokenizer_name, none=True)
        for key, allow_none in (("test_size", True), ("max_new_tokens", False)):
            value = getattr(self, key)
            if value is None and allow_none:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"GSM8KTask: {key} must be an int >= 1{' or None' if allow_none else ''}, "
                                 f"got {value!r}")
            setattr(self, key, int(value))
        self.name = _text_field("name", self.name)
        if self.source not in _NAMED_SOURCES:
            path = Path(self.source)
            if not path.exists():
                raise FileNotFoundError(f"GSM8KTask: source {self.source!r} is neither 'fixture', 'hub' nor an "
                                        "existing directory or .jsonl / .parquet file")
            if not path.is_dir() and path.suffix not in _FILE_SUFFIXES:
                raise ValueError(f"GSM8KTask: source file {self.source!r} must be a .jsonl or a .parquet file "
                                 "(or a directory laid out as the hub repository)")
        self._reset_cache()

    def _reset_cache(self) -> None:
        self._rows = None           # {"train": [...], "test": [...]} of {"question", "answer"} dicts
        self._tokenizer = None
        self._train_problems = {}   # train index -> Problem
        self._test_problems = None

    def __getstate__(self):  # pickled (sent to a worker process) without the data it has read
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reset_cache()

    # ------------------------------------------------------------------ data
    def rows(self) -> dict[str, list[dict]]:
        """The problems of the source, read on the first call and kept: ``{"train": [...],
        "test": [...]}``, each a list of ``{"question": str, "answer": str}`` in source order
        (the whole test split; :meth:`test_set` takes the first ``test_size``).

        Raises:
            ImportError: ``datasets`` is needed (hub, directory, parquet file) and not installed.
            FileNotFoundError: the source file or directory is gone.
            ValueError: a row outside GSM8K's schema (message names the source and row), a split
                that ``datasets`` cannot find in a directory, or a single file of fewer than 3 problems.
            OSError: ``datasets`` could not reach or find the hub dataset (offline and not cached;
                a ``ConnectionError`` is an ``OSError``); the message names the id and says what to do.
        """
        if self._rows is None:
            self._rows = self._read()
        return self._rows

    def _read(self) -> dict[str, list[dict]]:
        if self.source == "fixture":
            return _split_file_rows(load_fixture(), f"the fixture {fixture_path()}")
        if self.source == "hub":
            return {"train": self._load_split(self.dataset_id, self.train_split),
                    "test": self._load_split(self.dataset_id, self.test_split)}
        path = Path(self.source)
        if path.is_dir():
            return {"train": self._load_split(str(path), self.train_split),
                    "test": self._load_split(str(path), self.test_split)}
        if path.suffix == ".jsonl":
            return _split_file_rows(load_fixture(path), str(path))
        if not path.is_file():
            raise FileNotFoundError(f"GSM8KTask: source file {str(path)!r} does not exist")
        datasets = _datasets_module(f"the parquet file {str(path)!r}")
        dataset = datasets.load_dataset("parquet", data_files=str(path), split="train")
        return _split_file_rows(_rows_of(dataset, str(path)), str(path))

    def _load_split(self, path_or_id: str, split: str) -> list[dict]:
        """One split through ``datasets.load_dataset(path_or_id, config, split=split)``: the same
        call for the hub id and for a local directory in the hub repository's layout."""
        where = f"{path_or_id!r} (config {self.config!r}, split {split!r})"
        datasets = _datasets_module(f"source={self.source!r}")
        try:
            dataset = datasets.load_dataset(path_or_id, self.config, split=split)
        except Exception as exc:
            hint = ("a directory must be laid out as the hub repository: <config>/<split>-*.parquet and the "
                    "README.md that declares the configs" if self.source != "hub" else
                    "offline (HF_HUB_OFFLINE=1) the dataset must already be in the datasets cache; or download "
                    "it once and pass the directory as source")
            _reraise(exc, f"GSM8KTask: could not load {where} with datasets.load_dataset: {exc}; {hint}")
        return _rows_of(dataset, where)

    # ------------------------------------------------------------------ prompts
    def chat_tokenizer(self):
        """The tokenizer named by ``tokenizer_name``, loaded on the first call and kept; ``None``
        without one.

        Raises:
            ValueError: the tokenizer has no chat template (e.g. a base model's, or the tiny
                checkpoints' character tokenizer): use ``tokenizer_name=None`` for plain prompts.
            FileNotFoundError: ``tokenizer_name`` is a path that does not exist.
            OSError: it could not be loaded (e.g. a hub id offline and not in the cache).
        """
        if self.tokenizer_name is None:
            return None
        if self._tokenizer is None:
            from ..policy.models import load_tokenizer  # the loader load_policy uses, so the same class

            name = self.tokenizer_name
            if not Path(name).exists() and (name.startswith((".", "/", "~")) or name.count("/") != 1):
                raise FileNotFoundError(f"GSM8KTask: tokenizer_name {name!r} is neither an existing directory nor "
                                        "a hub id 'org/name'")
            try:
                tokenizer = load_tokenizer(self.tokenizer_name)
            except Exception as exc:
                _reraise(exc, f"GSM8KTask: could not load the tokenizer {self.tokenizer_name!r} (tokenizer_name): "
                              f"{exc}")
            if not getattr(tokenizer, "chat_template", None):
                raise ValueError(f"GSM8KTask: the tokenizer {self.tokenizer_name!r} has no chat template; leave "
                                 "tokenizer_name=None for plain-text prompts")
            self._tokenizer = tokenizer
        return self._tokenizer

    def format_prompt(self, question: str) -> str:
        """The prompt for one question: the chat template of ``tokenizer_name`` applied to the
        system turn (if any) and the user turn ``question + "\\n" + instruction``, with the
        assistant's generation prompt; without a tokenizer, the plain text
        ``"[system_prompt\\n\\n]Question: <question>\\n<instruction>\\nAnswer:"`` (an empty
        ``instruction`` leaves out its line).

        Raises:
            TypeError: ``question`` is not a ``str``.
            ValueError: from :meth:`chat_tokenizer`.
            OSError: from :meth:`chat_tokenizer`.
        """
        if not isinstance(question, str):
            raise TypeError(f"GSM8KTask.format_prompt: question must be a str, got {type(question).__name__}")
        user = f"{question}\n{self.instruction}" if self.instruction else question
        tokenizer = self.chat_tokenizer()
        if tokenizer is None:
            head = f"{self.system_prompt}\n\n" if self.system_prompt else ""
            return f"{head}Question: {user}\nAnswer:"
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) \
            + [{"role": "user", "content": user}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _problem(self, row: dict, index: int) -> Problem:
        return Problem(self.format_prompt(row["question"]), split_gold(row["answer"])[1],
                       {"question": row["question"], "index": index})

    # ------------------------------------------------------------------ the protocol
    def sample(self, n: int, rng) -> list[Problem]:
        """``n`` training problems drawn with ``rng`` (a ``numpy.random.Generator``) from the train
        split: ``rng.choice(len(train), n, replace=n > len(train))``, so a batch holds ``n``
        distinct problems when the split has that many.

        Returns:
            ``list[Problem]``: ``prompt`` (:meth:`format_prompt`), ``answer`` the gold final answer
            (the text after ``####``, :func:`grpo_lab.tasks.gsm8k.split_gold`), ``meta`` ``{"question", "index"}`` (the
            row in the train split).

        Raises:
            ValueError: ``n`` is not an int ``>= 1``; the train split is empty; what :meth:`rows`
                raises.
        """
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"GSM8KTask.sample: n must be an int >= 1, got {n!r}")
        train = self.rows()["train"]
        if not train:
            raise ValueError(f"GSM8KTask: the train split {self.train_split!r} of {self.source!r} is empty")
        out = []
        for i in rng.choice(len(train), size=int(n), replace=int(n) > len(train)).tolist():
            if i not in self._train_problems:
                self._train_problems[i] = self._problem(train[i], i)
            out.append(self._train_problems[i])
        return out

    def reward(self, completion: str, problem: Problem) -> float:
        """``score(completion, problem.answer)``: 1.0 if the completion's final answer (its last
        ``\\boxed{}`` or ``####`` line) equals the gold answer, else 0.0 (DeepSeekMath §4.1.2
        outcome reward). ``completion`` is the response only, never the prompt.

        Raises:
            TypeError: ``completion`` is not a ``str``.
            ValueError: ``problem.answer`` is not a GSM8K final answer.
        """
        return score(completion, problem.answer)

    def is_correct(self, completion: str, problem: Problem) -> bool:
        """Whether :meth:`reward` is 1.0."""
        return self.reward(completion, problem) == 1.0

    def extract_answer(self, completion: str) -> str | None:
        """:func:`grpo_lab.tasks.gsm8k.extract_answer`: the last box's content or ``####`` line, as
        text (what maj@k votes on, :func:`grpo_lab.experiments.evaluation.maj_at_k`, grouped by
        :meth:`answers_equivalent`).

        Raises:
            TypeError: ``completion`` is not a ``str``.
        """
        return extract_answer(completion)

    def fingerprint(self) -> dict:
        """What a checkpoint records (:func:`grpo_lab.tasks.base.task_fingerprint`): the content hash of
        the rows (:meth:`rows`, train then test; :func:`grpo_lab.tasks.base.rows_sha256`) and the reward,
        :meth:`reward`'s ``module:qualname``. Raises what :meth:`rows` raises."""
        rows = self.rows()
        return {"data": {"rows": {"dataset_sha256": rows_sha256([{split: rows[split]} for split in sorted(rows)])}}}

    @staticmethod
    def answers_equivalent(a: str, b: str) -> bool:
        """:func:`grpo_lab.tasks.gsm8k.answers_equivalent`: whether maj@k counts two extracted answers
        as one (``"18"``, ``"$18"``, ``"18.0"``). Raises ``TypeError`` for an answer that is not a ``str``."""
        return answers_equivalent(a, b)

    def test_set(self) -> list[Problem]:
        """The first ``test_size`` problems (all when ``None``) of the test split, built on the
        first call and the same list on every later one; ``meta["index"]`` is the row in the test
        split.

        Raises:
            ValueError: ``test_size`` exceeds the test split, or the test split is empty; what
                :meth:`rows` raises.
        """
        if self._test_problems is None:
            test = self.rows()["test"]
            n = len(test) if self.test_size is None else self.test_size
            if not test or n > len(test):
                raise ValueError(f"GSM8KTask: test_size={self.test_size} but the test split {self.test_split!r} of "
                                 f"{self.source!r} has {len(test)} problems")
            self._test_problems = [self._problem(row, i) for i, row in enumerate(test[:n])]
        return self._test_problems
