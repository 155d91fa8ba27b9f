"""No false positive from grpo_lab.tasks.gsm8k.score (issue 37): a wrong answer scores 0 in every
surface form the scorer accepts (plain and decimal numbers, thousands separators, currency, units,
degrees, trailing punctuation, equations, fractions, mixed numbers, percents), boxed and after
``####``. Each form is first shown to score 1 with the right value, so the property is not
vacuous; then hypothesis draws wrong values, many of them next to the gold (off by one, by a cent,
by a half, the gold as the whole part of a mixed number or as a percent's value), and checks that
none scores 1.
"""

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

pytest.importorskip("math_verify")

from grpo_lab.tasks.gsm8k import score

# A surface form: its text with N for the number, and the values the percent rule gives it.
NUMBER_FORMS = ["N", "N.", "N,", r"\$N", "$N", r"N \text{ dollars}", r"N^\circ", r"N^{\circ}", "N hours",
                r"N \text{ cm}^2", "x = N", r"x \approx N", "\u2212N"]
# Accepted after #### only: in a box math-verify reads these as products of symbols (documented).
HASH_FORMS = ["N dollars", "N km/h", "N apples", "**N**",
              "*N*", "_N_", "__N__", "***N***", "`N`", "``N``", "*N*."]  # Markdown emphasis and code (issue 54)
PERCENT_FORMS = [r"N\%", "N%", "N percent", "N pct", r"\text{N percent}", r"x = N\%"]
FORMS = ("boxed", "####")


def _decimal(w: Fraction) -> str | None:
    """``w`` written exactly as a decimal number (at most 6 places), or ``None``."""
    if 10**6 % w.denominator:
        return None
    return format((Decimal(w.numerator) / Decimal(w.denominator)).normalize(), "f")


def _completion(form: str, text: str) -> str:
    return r"\boxed{" + text + "}" if form == "boxed" else "#### " + text


def _texts(kind: str, w: Fraction, extra: tuple, form: str) -> list[tuple[str, set]]:
    """The answer texts of one drawn answer in ``form``, each with the set of values it may be read as."""
    if kind == "number":
        n = _decimal(w)
        out = [(t.replace("N", n.lstrip("-")) if t.startswith("\u2212") else t.replace("N", n), {w})
               for t in NUMBER_FORMS + (HASH_FORMS if form == "####" else [])
               if not (t.startswith("\u2212") and w >= 0)]
        out = [(t, {-w} if t.startswith("\u2212") else v) for t, v in out]
        if w.denominator == 1 and abs(w) >= 1000:
            grouped = f"{int(w):,}"
            out += [(grouped.replace(",", sep), {w}) for sep in (",", " ", r"\,", "{,}")]
        return out
    if kind == "percent":
        n = _decimal(w)
        return [(t.replace("N", n), {w, w / 100}) for t in PERCENT_FORMS]
    if kind == "fraction":
        num, den = extra
        return [(f"{num}/{den}", {Fraction(num, den)}), (rf"\frac{{{num}}}{{{den}}}", {Fraction(num, den)}),
                (rf"\dfrac{{{num}}}{{{den}}}", {Fraction(num, den)})]
    whole, num, den = extra  # a mixed number
    value = whole + Fraction(num, den)
    return [(f"{whole} {num}/{den}", {value}), (rf"{whole} \frac{{{num}}}{{{den}}}", {value}),
            (rf"{whole}\tfrac{{{num}}}{{{den}}}", {value}), (f"{whole} {num}/{den}.", {value})]


@pytest.mark.parametrize("form", FORMS)
def test_every_form_scores_one_with_the_right_value(form):
    # the control: each surface form is accepted when its value is the gold's
    for gold, kind, w, extra in (("1234", "number", Fraction(1234), ()), ("-7", "number", Fraction(-7), ()),
                                 ("18.25", "number", Fraction("18.25"), ()), ("12.5", "percent", Fraction("12.5"), ()),
                                 ("0.28", "percent", Fraction(28), ()), ("0.75", "fraction", None, (3, 4)),
                                 ("4.5", "mixed", None, (4, 1, 2))):
        for text, _ in _texts(kind, w if w is not None else Fraction(0), extra, form):
            assert score(_completion(form, text), gold) == 1.0, (form, text, gold)


_GOLDS = st.one_of(st.integers(1, 60).map(str), st.integers(-50, 20000).map(str),
                   st.decimals(min_value=0, max_value=1000, places=2).map(lambda d: format(d, "f")))
_STEPS = st.sampled_from([Fraction(1), Fraction(-1), Fraction(1, 100), Fraction(-1, 100), Fraction(1, 2),
                          Fraction(10), Fraction(-10), Fraction(1000), Fraction(1, 10)])


@st.composite
def _wrong_answers(draw):
    gold = draw(_GOLDS)
    g = Fraction(gold)
    kind = draw(st.sampled_from(["number", "percent", "fraction", "mixed"]))
    extra = ()
    w = Fraction(0)
    if kind in ("number", "percent"):
        w = draw(st.one_of(_STEPS.map(lambda step: g + step), _STEPS.map(lambda step: g * 100 + step),
                           st.integers(-100, 100000).map(Fraction)))
        assume(_decimal(w) is not None)
    elif kind == "fraction":
        num, den = draw(st.integers(0, 500)), draw(st.integers(2, 50))
        if draw(st.booleans()) and g.denominator == 1 and g >= 0:
            num = int(g)  # the gold as the numerator
        extra = (num, den)
    else:
        den = draw(st.integers(2, 60))
        num = draw(st.integers(1, den - 1))
        whole = draw(st.integers(0, 300))
        role = draw(st.sampled_from(["whole", "numerator", "neither"])) if g.denominator == 1 and g >= 1 else "neither"
        if role == "whole":  # the gold as the whole part: 4 4/9 against 4
            whole = int(g)
        elif role == "numerator":  # the gold as the numerator (math-verify 0.9.0 reads 2 1/2 as 1)
            num, den = int(g), int(g) + draw(st.integers(1, 60))
        extra = (whole, num, den)
    form = draw(st.sampled_from(FORMS))
    texts = _texts(kind, w, extra, form)
    text, values = texts[draw(st.integers(0, len(texts) - 1))]
    assume(g not in values)
    return gold, text, form


@settings(max_examples=200, deadline=None, derandomize=True)
@given(_wrong_answers())
def test_no_wrong_answer_scores_one(case):
    gold, text, form = case
    assert score(_completion(form, text), gold) == 0.0, (form, text, gold)
