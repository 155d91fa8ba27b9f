"""Tests for grpo_lab.tasks.gsm8k: answer extraction, the math-verify scorer, and the GSM8K fixture.

Every expected score below was decided by hand from the rule stated in its comment (and in the
module docstring), not read off the code's output.
"""

import ast
import json
import operator
import re
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("math_verify")

from grpo_lab.paths import ENV_VAR
from grpo_lab.tasks import gsm8k
from grpo_lab.tasks.gsm8k import extract_answer, load_fixture, parse_gold, score, split_gold


def _score_in_thread(completion, gold, limit_s=30.0):
    """``score`` run in a worker thread (no signals there); fails if it takes over ``limit_s``.

    The limit catches slow Python-level work only: one long C call (SymPy raising 10 to the power
    10**10) holds the GIL, so the join cannot time out; test_bounds_are_what_refuse_the_hanging_answers
    checks that such answers never reach SymPy."""
    out = {}

    def work():
        try:
            out["value"] = score(completion, gold)
        except BaseException as e:  # reported below
            out["error"] = e

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"score did not return within {limit_s} s for {completion!r:.80}"
    if "error" in out:
        raise out["error"]
    return out["value"]


# ---------------------------------------------------------------------------------- extraction
def test_several_boxes_the_last_counts():
    # A model that corrects itself: only its last boxed answer is its answer.
    text = r"First guess \boxed{3}. Wait, I forgot the tip, so the total is \boxed{5}."
    assert extract_answer(text) == "5"
    assert score(text, "5") == 1.0
    assert score(text, "3") == 0.0


def test_nested_braces_inside_a_box():
    # The box ends at its own closing brace, not at the first "}" (that of \frac's numerator).
    assert extract_answer(r"so \boxed{\frac{1}{2}} of the cake") == r"\frac{1}{2}"
    # escaped braces are text, not grouping: the box holds the whole set
    assert extract_answer(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"


def test_box_versus_marker_whichever_comes_last():
    # "####" after the box wins; a box after "####" (even on its line) wins; "####" inside the last
    # box belongs to the box.
    assert extract_answer("\\boxed{5}\n#### 6") == "6"
    assert extract_answer("#### 6\nActually \\boxed{5}") == "5"
    assert extract_answer(r"\boxed{#### 7}") == "#### 7"
    assert score("\\boxed{5}\n#### 6", "6") == 1.0
    assert score("\\boxed{5}\n#### 6", "5") == 0.0


def test_marker_answer_is_the_rest_of_its_line():
    # The text after the last "####" up to the end of that line; later lines are not the answer.
    assert extract_answer("9*2 = 18\n#### 18\nQuestion: what is 3+4?") == "18"
    assert extract_answer("#### 1 2\n#### 18 ") == "18"
    assert extract_answer("####\n18") == ""   # a marker with an empty line: an empty answer
    assert score("####\n18", "18") == 0.0


def test_unclosed_box_is_not_an_answer():
    # A completion cut off inside its box has no answer there; an earlier complete box still counts.
    assert extract_answer(r"the total is \boxed{18") is None
    assert extract_answer(r"\boxed{18} ... so the total is \boxed{1") == "18"
    assert score(r"the total is \boxed{18", "18") == 0.0


def test_no_answer_scores_zero():
    # Neither a box nor "####": nothing to judge, even if the right number is in the text.
    assert extract_answer("She makes 9 * 2 = 18 dollars every day.") is None
    assert score("She makes 9 * 2 = 18 dollars every day.", "18") == 0.0
    assert score("", "18") == 0.0
    assert score(r"\boxed{}", "18") == 0.0


def test_answer_far_from_the_end_is_still_found():
    # A long tail of text (with numbers in it) after the box does not hide the box.
    tail = " Check: 3 + 4 = 7, and 7 * 6 = 42 again." * 400
    text = r"The answer is \boxed{42}." + tail
    assert len(text) > 10_000
    assert extract_answer(text) == "42"
    assert score(text, "42") == 1.0
    assert score(text, "7") == 0.0


def test_score_takes_the_completion_only():
    # The caller must pass the completion alone: a prompt with a worked, boxed example would be
    # read as the answer. Here the completion has no box, so it scores 0; prompt + completion
    # would wrongly score 1 on the example's box.
    prompt = r"Put the final answer in \boxed{}. Example: 9*2 = 18, so \boxed{18}. Now: Janet sells 9 eggs at $2. "
    completion = "She makes 9*2 = 18 dollars."
    assert score(completion, "18") == 0.0
    assert score(prompt + completion, "18") == 1.0  # the hazard score's docstring warns about


def test_extract_answer_rejects_non_strings():
    with pytest.raises(TypeError, match="completion must be a str"):
        extract_answer(None)
    with pytest.raises(TypeError, match="completion must be a str"):
        score(b"\\boxed{18}", "18")


# ------------------------------------------------------------------------------------ scoring
def test_text_wrapper_inside_a_box():
    # \text{13} is the number 13 (math-verify unwraps text that holds a number).
    assert score(r"\boxed{\text{13}}", "13") == 1.0
    assert score(r"\boxed{\text{13}}", "31") == 0.0


def test_minus_sign_matters():
    # Losing the minus sign is a wrong answer; keeping it (also as U+2212) is right.
    assert score(r"\boxed{3}", "-3") == 0.0
    assert score(r"\boxed{-3}", "-3") == 1.0
    assert score("\\boxed{\u22123}", "-3") == 1.0
    assert score("#### \u22123", "-3") == 1.0
    assert score("#### \u22123 degrees", "-3") == 1.0
    assert score(r"\boxed{-3}", "3") == 0.0


def test_fbox_counts_like_boxed():
    assert extract_answer(r"so \fbox{12}") == "12"
    assert score(r"so \fbox{12}", "12") == 1.0


def test_thousands_separator_versus_tuple():
    # "1,234" in a box is one number; "(1,234)" is an interval (math-verify), not 1234.
    assert score(r"\boxed{1,234}", "1234") == 1.0
    assert score(r"\boxed{(1,234)}", "1234") == 0.0
    assert score(r"\boxed{1{,}234}", "1234") == 1.0


def test_thousands_grouped_by_a_space():
    # math-verify alone reads "1\,234" and "1 234" as the mixed number 1 + 234 = 235; we join
    # the groups first, so they are 1234 and never 235.
    for text in (r"\boxed{1\,234}", r"\boxed{1 234}", r"\boxed{1~234}", r"\boxed{12\,345\,678}"):
        gold = "12345678" if "678" in text else "1234"
        assert score(text, gold) == 1.0, text
        assert score(text, "235") == 0.0, text
    assert score("#### 1 234", "1234") == 1.0


def test_equations_are_judged_by_their_right_hand_side():
    # math-verify judges an equation by the right side of its last "=": "x = 5" is 5, and so is
    # "2+3=5"; "5 = x" is x, not 5. Sides that are plain numbers must agree: "2+3=6" is refused
    # (math-verify alone would count it as 6).
    assert score(r"\boxed{x = 5}", "5") == 1.0
    assert score(r"\boxed{5 = x}", "5") == 0.0
    assert score(r"\boxed{2+3=5}", "5") == 1.0
    assert score(r"\boxed{2+3=6}", "6") == 0.0 and score(r"\boxed{2+3=6}", "5") == 0.0
    assert score("#### 9*2 = 18", "18") == 1.0 and score("#### 9*2 = 19", "19") == 0.0
    # an unevaluated expression counts by its value
    assert score(r"\boxed{2+3}", "5") == 1.0


def test_tiny_values_are_not_equal_by_a_loose_tolerance():
    # Floats are compared to FLOAT_ROUNDING = 10 places. 0.0002 is not 0.0001; nor is 0.0000002
    # 0.0000001 (math-verify's default of 6 places would call those two equal).
    assert gsm8k.FLOAT_ROUNDING == 10
    assert score(r"\boxed{0.0002}", "0.0001") == 0.0
    assert score(r"\boxed{0.0001}", "0.0001") == 1.0
    assert score(r"\boxed{0.0000002}", "0.0000001") == 0.0
    assert score(r"\boxed{0.0000001}", "0.0000001") == 1.0


def test_decimal_forms_of_integers():
    assert score(r"\boxed{3.0}", "3") == 1.0
    assert score("#### 18.00", "18") == 1.0
    assert score(r"\boxed{3.5}", "3") == 0.0


def test_fractions():
    # 1/2 = 0.5 exactly, in LaTeX or plain text, after "####" too.
    assert score(r"\boxed{\frac{1}{2}}", "0.5") == 1.0
    assert score(r"\boxed{\dfrac{3}{4}}", "0.75") == 1.0
    assert score("#### 1/2", "0.5") == 1.0
    assert score(r"#### \frac{1}{2}", "0.5") == 1.0  # no plain number there: read as LaTeX
    assert score(r"\boxed{\frac{1}{3}}", "0.33") == 0.0


def test_gsm8k_marker_answers():
    # GSM8K's own format, with or without currency, thousands separators, Markdown bold or a unit.
    assert score("Janet sells 16 - 3 - 4 = 9 eggs.\n#### 18", "18") == 1.0
    assert score("#### 18", "19") == 0.0
    assert score("#### $1,234", "1234") == 1.0
    assert score(r"#### \$18", "18") == 1.0
    assert score("#### **18**", "18") == 1.0
    assert score("#### 18 dollars", "18") == 1.0


def test_thousands_separators_in_gold():
    # GSM8K writes plain digits after "####", but a gold with comma separators means the same number.
    assert score(r"\boxed{1234}", "1,234") == 1.0
    assert score(r"\boxed{1,234}", "1,234") == 1.0
    assert score("#### 1234", "1,234") == 1.0
    assert score(r"\boxed{1234}", "1,235") == 0.0


def test_dollar_signs_and_units():
    # \$ and units in \text are ignored by math-verify.
    assert score(r"\boxed{\$18}", "18") == 1.0
    assert score(r"\boxed{18 \text{ dollars}}", "18") == 1.0
    assert score(r"\boxed{\$18.00}", "18") == 1.0
    assert score(r"\boxed{50 \text{ m}^2}", "50") == 1.0
    assert score(r"\boxed{\$18}", "17") == 0.0


def test_units_math_verify_does_not_read():
    # What math-verify makes of a unit outside \text: "18 dollars" in a box is 18 times a product
    # of symbols (it parses to 18*a*do*l*l*r*s), and \text{18 dollars} one symbol; neither is 18
    # (documented, kept).
    assert score(r"\boxed{18 dollars}", "18") == 0.0
    assert score(r"\boxed{\text{18 dollars}}", "18") == 0.0


def test_percent_is_a_unit():
    # The module's percent rule: "p %" equals the gold p (GSM8K writes a percent answer as its
    # number) and the gold p/100 (its value, as math-verify reads it), in every form math-verify
    # reads as a percentage, integer or decimal, and no other gold.
    for answer in (r"\boxed{25\%}", r"\boxed{25 \text{ percent}}", "#### 25%", r"\boxed{25\text{percent}}",
                   "#### 25 percent", r"\boxed{x = 25\%}", r"\boxed{25\%\text{ off}}", r"\boxed{1,234\%}"):
        gold = "1234" if "1,234" in answer else "25"
        assert score(answer, gold) == 1.0, answer
    assert score(r"\boxed{12.5\%}", "12.5") == 1.0 and score("#### 12.5%", "12.5") == 1.0
    assert score(r"\boxed{25\%}", "0.25") == 1.0 and score("#### 25%", "0.25") == 1.0
    assert score(r"\boxed{12.5\%}", "0.125") == 1.0 and score(r"\boxed{x = 25\%}", "0.25") == 1.0
    for wrong in ("26", "2.5", "0.025", "2500", "0.26"):
        assert score(r"\boxed{25\%}", wrong) == 0.0 and score("#### 25 percent", wrong) == 0.0, wrong


# -------------------------------------------------- decorations: math-verify's own verdict
def _math_verify_verdict(kind, answer, gold):
    """math-verify called directly, with the readings the module docstring names (a box as LaTeX; a
    #### line as a plain expression, else as LaTeX; the gold as a plain number; FLOAT_ROUNDING)."""
    import math_verify as mv

    def parse(text, configs):
        return mv.parse(text, configs, fallback_mode="no_fallback", parsing_timeout=None)

    latex = [mv.LatexExtractionConfig(boxed_match_priority=0)]
    pred = parse(answer, [mv.ExprExtractionConfig()]) if kind == "####" else []
    pred = pred or parse("\\boxed{" + answer + "}", latex)
    gold_parsed = parse(gold, [mv.ExprExtractionConfig()])
    return bool(pred) and mv.verify(gold_parsed, pred, float_rounding=gsm8k.FLOAT_ROUNDING, timeout_seconds=None)


# Answers with decorations that cannot make SymPy hang, each against golds it may or may not equal.
DECORATED = [
    (r"30^\circ", ("30", "31")), (r"30^{\circ}", ("30",)), (r"30 ^\circ", ("30",)), (r"-5^\circ", ("-5", "5")),
    (r"30^\circ C", ("30",)), (r"30^{\circ}\text{C}", ("30",)), (r"30^\circ\mathrm{F}", ("30",)),
    (r"30\,^\circ", ("30",)), (r"x = 30^\circ", ("30",)), (r"30 \text{ degrees}", ("30", "3")),
    (r"25\%", ("25", "0.25")), ("25%", ("25", "0.25")), (r"25 \%", ("25",)), (r"25\text{ percent}", ("25",)),
    (r"25\text{percent}", ("25", "0.25")), (r"25\text{\%}", ("25",)), (r"25 \mbox{ percent}", ("25",)),
    (r"25\text{ percentage}", ("25",)), (r"12.5\%", ("12.5", "0.125")), (r"x\approx 11\%", ("11",)),
    (r"18 \text{ dollars}", ("18",)), (r"5\text{ cm}", ("5",)), (r"5\ \text{cm}", ("5",)),
    (r"5\text{ cm}^2", ("5",)), (r"25\text{ km/h}", ("25",)), (r"\$25", ("25",)), (r"25 \text{ hours}", ("25", "24")),
    (r"x\approx 11", ("11",)), (r"x \sim 11", ("11",)), (r"\approx 11", ("11",)), (r"\sim 11", ("11",)),
    (r"11.2 \approx 11", ("11", "11.2")), (r"x \simeq 11", ("11",)), (r"\text{25\%}", ("25",)),
    # unit and percent words (UNIT_WORDS) ending the answer, bare: their letters are not free letters
    ("25 percent", ("25", "24", "0.25")), ("12.5 percent", ("12.5", "0.125")), ("25 pct", ("25", "26")),
    ("25 percentage", ("25",)), ("25 Percent", ("25",)), ("x = 25 percent", ("25", "24")),
    ("30 degrees", ("30", "31")), ("30 degree", ("30",)), ("5 cm", ("5", "6")), ("5 km", ("5",)),
    ("5 kg", ("5", "6")), ("5 hours", ("5", "6")), ("12 minutes", ("12", "13")), ("50 cents", ("50",)),
    ("18 dollars", ("18", "17")), ("3 miles per hour", ("3",)), ("25 km/h", ("25",)), ("4 inches", ("4",)),
    # ... and inside text: a number and a percent marker is the percent rule, anything else one symbol
    (r"\text{28 percent}", ("28", "27", "0.28")), (r"\text{28\%}", ("28", "27", "0.28")),
    (r"\mbox{12.5 pct}", ("12.5", "0.125")), (r"\text{30 degrees}", ("30",)), (r"\text{5 hours}", ("5",)),
]
# The module docstring's deliberate differences from math-verify: the percent rule (p % equals the
# gold p and the gold p / 100, a decimal p too; a text group of one number and a percent marker
# is p %) and the degree sign ° read as ^\circ.
DELIBERATE = {("boxed", r"12.5\%", "12.5"): 1.0,
              # math-verify's plain-number reading of a #### line does not see an escaped percent sign
              ("####", r"25\%", "0.25"): 1.0, ("####", r"12.5\%", "0.125"): 1.0,
              **{(kind, "12.5 percent", "12.5"): 1.0 for kind in ("boxed", "####")},
              **{(kind, text, gold): 1.0 for kind in ("boxed", "####")
                 for text in (r"\text{28 percent}", r"\text{28\%}", r"\text{25\%}")
                 for gold in (text[6:8], "0." + text[6:8])},
              **{(kind, r"\mbox{12.5 pct}", gold): 1.0 for kind in ("boxed", "####") for gold in ("12.5", "0.125")}}
CASES = [(kind, answer, gold) for answer, golds in DECORATED for gold in golds for kind in ("boxed", "####")]


@pytest.mark.parametrize("kind, answer, gold", CASES, ids=[f"{k} {a} vs {g}" for k, a, g in CASES])
def test_decorated_answers_get_math_verifys_verdict(kind, answer, gold):
    completion = r"\boxed{" + answer + "}" if kind == "boxed" else "#### " + answer
    oracle = 1.0 if _math_verify_verdict(kind, answer, gold) else 0.0
    expected = DELIBERATE.get((kind, answer, gold), oracle)
    if (kind, answer, gold) in DELIBERATE:
        assert expected != oracle, "listed as a deliberate difference, but math-verify now agrees"
    assert score(completion, gold) == expected


def test_the_table_exercises_both_verdicts():
    # the table is only a check if math-verify accepts some decorated answers and refuses others
    verdicts = {_math_verify_verdict(k, a, g) for k, a, g in CASES}
    assert verdicts == {True, False}


def test_degree_sign_is_a_degree():
    # deliberate: math-verify finds nothing in \boxed{30°}; ° is read as ^{\circ}, so it is 30
    assert score("\\boxed{30\u00b0}", "30") == 1.0 and score("#### 30\u00b0", "30") == 1.0
    assert score("\\boxed{30\u00b0}", "31") == 0.0


def test_decorations_pass_the_guard_but_powers_still_do_not():
    for text in (r"30^\circ", r"30^{\circ}\text{C}", r"x\approx 11", r"\sim 11", r"25\text{ percent}"):
        assert gsm8k._bounded(text, latex=True), text
    for text in (r"10^{10^{10}}^\circ", r"10^{\circ}^{10^{10}}", r"x^\circ^{99}", r"x \approx (x+y+z+1)^{99}",
                 r"30^\circle", r"30^{\circ 10^{10}}"):
        assert not gsm8k._bounded(text, latex=True), text


def test_mixed_numbers_are_whole_plus_fraction():
    # issue 37: math-verify 0.9.0 reads a mixed number on a #### line as its whole part (4 4/9 = 4) and
    # 4 4/9 in a box as 4*4/9; here both are 4 + 4/9, and an improper one is refused
    for text in ("4 4/9", r"4 \frac{4}{9}", r"4\frac{4}{9}", r"4\,\tfrac{4}{9}"):
        for completion in ("#### " + text, r"\boxed{%s}" % text):
            assert score(completion, "4") == 0.0 and score(completion, "4.4444444444") == 1.0, completion
    assert score("#### -2 1/2", "-2.5") == 1.0 and score("#### 2 1/2", "1") == 0.0
    assert score("#### 1 000 1/2", "1000.5") == 1.0 and score("#### 4 400/800", "4.5") == 1.0
    for bad, golds in (("4 0/0", ("4", "0")), ("0 0/0", ("0",)), ("4 4/0", ("4", "0")), ("11 7/6", ("11", "12"))):
        assert all(score("#### " + bad, g) == 0.0 for g in golds), bad


@pytest.mark.parametrize("completion", ["#### 18 (not 20)", "#### 18, 20", "#### 18 or 20", "#### 18 -> 20",
                                        r"\boxed{3 \cdot 6 = 20}", r"\boxed{18 \text{ or } 20}", "#### 18 20",
                                        r"\boxed{x = 18, x = 20}", r"#### 18 \Rightarrow 20", "#### 18 => 20"])
def test_hedges_and_false_equations_score_zero(completion):
    # the previous session's pinned false positives (math-verify counts a #### line's last number and
    # an equation's right-hand side): a hedge between two numbers is not one answer, and an equation
    # whose numeric sides differ is false; neither equals 18 nor 20
    assert score(completion, "20") == 0.0 and score(completion, "18") == 0.0


def test_a_text_group_of_a_number_and_a_percent_marker_is_that_percentage():
    # the percent rule reaches \text{28 percent} and \text{28\%} (math-verify reads each as one
    # symbol): equal to the number written, and never to another number
    for text in (r"\text{28 percent}", r"\text{28\%}", r"\mbox{28 pct}", r"\text{28 Percent}", r"x = \text{28\%}"):
        for form in (r"\boxed{%s}", "#### %s"):
            completion = form % text
            assert score(completion, "28") == 1.0, completion
            assert score(completion, "0.28") == 1.0, completion  # its value, as the percent rule reads it
            for wrong in ("27", "2.8", "280", "0.27"):
                assert score(completion, wrong) == 0.0, (completion, wrong)
    assert score(r"\boxed{\text{12.5 percent}}", "12.5") == 1.0 and score(r"\boxed{\text{12.5 percent}}", "12") == 0.0
    assert score(r"\boxed{\text{1,234\%}}", "1234") == 1.0 and score(r"\boxed{\text{-3 percent}}", "3") == 0.0


def test_unit_words_end_the_answer_to_be_exempt():
    # the letters of a final run of UNIT_WORDS are not free letters; elsewhere they count
    assert "percent" in gsm8k.UNIT_WORDS and "hour" in gsm8k.UNIT_WORDS
    for text in ("25 percent", "12.5 percent", "30 degrees", "3 miles per hour", "5 Hours", "x = 4 inches",
                 r"\text{30 degrees}", "2 km / hr", "25 pct."):
        assert gsm8k._bounded(text, latex=True), text
    for text in ("20 hours, not 18 hours", "percent + 5", r"\secant 5 percent", "5 hourglass"):
        assert not gsm8k._bounded(text, latex=True), text


# ------------------------------------------------------------------------------ bad gold input
@pytest.mark.parametrize("gold", ["", "abc", "18 dollars", "$18", "1,23", "0,111", "1/2", "\\frac{1}{2}", "18\n19", "--3"])
def test_unparseable_gold_raises_naming_it(gold):
    with pytest.raises(ValueError, match=re.escape(repr(gold)[:60]) + ".*not a GSM8K final answer"):
        score(r"\boxed{18}", gold)


def test_gold_must_be_a_string():
    with pytest.raises(TypeError, match="gold must be a str"):
        score(r"\boxed{18}", 18)


def test_parse_gold_forms():
    # the GSM8K forms all parse to one number; surrounding whitespace is ignored
    for gold in ("18", "-3", "+3", "1234", "1,234", "0.5", " 18 "):
        assert len(parse_gold(gold)) == 1


# ------------------------------------------------------------------ robustness: never raises
NASTY = [
    "",
    "{{{{", "}}}}", r"\boxed{", r"\boxed{{{{", r"\boxed{}}}}", r"\boxed{\frac{1}{", r"\boxed{\frac{}{}}",
    r"\boxed{" * 5000,                                   # many unclosed boxes: still linear
    "#" * 10_000, "####", "#### ", "#### \\", "####" * 1000,
    r"\boxed{10^{10000}}", r"\boxed{10^{10^{10}}}", r"\boxed{9^{9^{9^{9}}}}", r"\boxed{2^{2^{100}}}",
    r"\boxed{10^{-10^{10}}}", r"\boxed{5+10^{-10^{10}}}", r"\boxed{(x+y+z+1)^{99}}", r"\boxed{x^{x^{x}}}",
    r"\boxed{1000000!}", r"\boxed{(10^{100})!}", r"\boxed{\prod_{i=1}^{10^{9}} i}",
    r"\boxed{\sum_{i=1}^{10^{10}} i}", r"\boxed{\binom{10^{10}}{5000}}", r"\boxed{e^{e^{e^{100}}}}",
    "#### 9**9**9", "#### 10^999999999", "#### " + "9" * 5000, r"\boxed{" + "9" * 5000 + "}",
    r"\boxed{\frac{1}{0}}", r"\boxed{0^0}", r"\boxed{\infty}", r"\boxed{\sqrt{-1}}", r"\boxed{\int_0^1 x dx}",
    r"\boxed{a+b+c+d+e+f+g+h+i+j+k+l+m+n+o+p}", r"\boxed{\text{a+b+c+d+e+f+g+h+i+j+k+l+m+n}}",
    r"\boxed{(cm+km+kg+1)^{99}}", r"\boxed{5 (cm+km+kg+mm)^{99} \text{ percent}}",  # unit words in a power base
    r"\boxed{\frac{(cm+km)(kg+mm)(cm+km)(kg+mm)}{(cm+mm)(kg+km)(hr+km)(kg+mg)(cm+oz)}}",  # seconds in SymPy
    r"\boxed{\frac{a+b}{c+d}+\frac{e+f}{g+h}+\frac{i+j}{k+l}+\frac{m+n}{o+p}}",
    "\\boxed{\x00\x01\x02}", "\\boxed{\ud800}", "#### \u202e18", r"\boxed{\\\\\\}", r"\boxed{$$$}", r"\boxed{\left(}",
    r"\boxed{\begin{pmatrix}1&2\\3&4\end{pmatrix}}", r"\boxed{\undefinedmacro{5}}", r"\boxed{__import__('os')}",
]


@pytest.mark.parametrize("completion", NASTY, ids=range(len(NASTY)))
def test_never_raises_or_hangs_on_garbage(completion):
    # Each returns 0.0 (none of them is 5), in bounded time, from a worker thread (no signals).
    assert _score_in_thread(completion, "5") == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(
    st.sampled_from([r"\boxed{", r"\fbox{", "{", "}", "####", "\n", "^", "**", "!", "-", ",", ".", "=",
                     r"\frac", r"\text{", r"\$", r"\%", "10", "9", "x", " ", "(", ")", r"\left(", r"\,"]),
    st.text(max_size=6)), max_size=30).map("".join))
def test_never_raises_on_random_text(completion):
    # Any string at all scores exactly 0.0 or 1.0 and never raises.
    assert score(completion, "10") in (0.0, 1.0)


def test_bounds_are_what_refuse_the_hanging_answers():
    # The guard, not luck, keeps these out of SymPy: math-verify without a timeout runs for minutes on each.
    for text in (r"10^{10^{10}}", r"(x+y+z+1)^{99}", "1000000!", r"\prod_{i=1}^{10^{9}} i", "9" * 101,
                 r"(cm+km+kg+1)^{99}", r"(cm + km + kg + 1)^{99} percent", r"(1\text{cm}+km+kg+1)^{99}"):
        assert not gsm8k._bounded(text, latex=True), text
    assert not gsm8k._bounded("9**9**9", latex=False)
    assert not gsm8k._bounded("10^999999999", latex=False)
    # ... while GSM8K answers pass
    for text in ("18", r"\$1,234.50", r"\frac{1}{2}", r"18 \text{ dollars}", "x = 5", r"50 \text{ m}^2", "10^2"):
        assert gsm8k._bounded(text, latex=True), text


# ----------------------------------------------------------------------- threads and signals
def test_works_from_a_worker_thread():
    # math-verify's own timeout uses signal.alarm, which raises ValueError outside the main thread;
    # with it off, a worker thread gets the same scores as the main thread.
    assert _score_in_thread(r"\boxed{\frac{1}{2}}", "0.5") == 1.0
    assert _score_in_thread(r"\boxed{3}", "-3") == 0.0
    assert _score_in_thread("#### 1,234", "1234") == 1.0


def test_concurrent_threads_agree_with_serial_scores():
    # Many threads at once (the scorer holds a lock around math-verify) give the serial results.
    cases = [(r"\boxed{\frac{1}{2}}", "0.5"), (r"\boxed{3}", "-3"), ("#### 1,234", "1234"),
             (r"\boxed{x = 5}", "5"), (r"\boxed{5 = x}", "5"), (r"\boxed{18 \text{ dollars}}", "18")] * 8
    serial = [score(c, g) for c, g in cases]
    assert serial[:6] == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(lambda cg: score(*cg), cases)) == serial


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX interval timers")
def test_score_leaves_the_callers_alarm_alone():
    # math-verify with its timeout on would set SIGALRM and then cancel it (signal.alarm(0)),
    # silently disarming a timer the caller had set; score must not touch it.
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 600.0)
        assert score(r"\boxed{\frac{1}{2}}", "0.5") == 1.0
        assert score("#### 18", "18") == 1.0
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert remaining > 500.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not fired


# ------------------------------------------------------------------------------- split_gold
def test_split_gold():
    rationale, final = split_gold("He sprints 3*3=<<3*3=9>>9 times\n#### 540")
    assert (rationale, final) == ("He sprints 3*3=<<3*3=9>>9 times", "540")
    # the last marker counts
    assert split_gold("a #### b\n#### 7 ") == ("a #### b", "7")


@pytest.mark.parametrize("field", ["no marker", "work\n####", "work\n####   ", "#### 1\n2"])
def test_split_gold_rejects_fields_without_one_final_answer(field):
    with pytest.raises(ValueError, match="split_gold"):
        split_gold(field)


# ---------------------------------------------------------------------------------- fixture
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _arith(expr: str) -> Fraction:
    """Exact value of a calculator annotation's left side: numbers, + - * /, unary minus and
    parentheses only (an ast walk, never eval)."""

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Fraction(str(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = walk(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"not plain arithmetic: {ast.dump(node)[:60]}")

    return walk(ast.parse(expr, mode="eval"))


def test_arith_helper_is_exact_and_refuses_anything_else():
    # the checker itself: 48/2 = 24, 0.1+0.2 is exactly 3/10, and names/calls/powers are refused
    assert _arith("48/2") == 24
    assert _arith("0.1+0.2") == Fraction(3, 10)
    assert _arith("3*(16.50+22.50+42)") == 243
    assert _arith("-40+15") == -25
    for bad in ("__import__('os')", "2**10", "x+1", "[1]"):
        with pytest.raises(ValueError):
            _arith(bad)


_ANNOTATION = re.compile(r"<<([^<>=]+)=([^<>=]+)>>(-?\d[\d,]*(?:\.\d+)?)?")


def test_fixture_schema_and_size():
    problems = load_fixture()
    assert 20 <= len(problems) <= 30
    assert len({p["question"] for p in problems}) == len(problems)
    for p in problems:
        assert set(p) == {"question", "answer"}
        assert p["question"].strip().endswith("?")


def test_fixture_arithmetic_checks_out():
    # Every <<a op b=c>> annotation is right (exact rational arithmetic), the number written after
    # it shows c, and the final answer equals the last annotation's result.
    finals = []
    for k, p in enumerate(load_fixture(), 1):
        rationale, final = split_gold(p["answer"])
        notes = _ANNOTATION.findall(rationale)
        assert notes, f"problem {k} has no calculator annotation"
        for lhs, rhs, shown in notes:
            assert _arith(lhs) == Fraction(rhs), f"problem {k}: {lhs} != {rhs}"
            assert shown and Fraction(shown.replace(",", "")) == Fraction(rhs), f"problem {k}: shows {shown!r} for {rhs}"
        assert re.fullmatch(r"-?\d+(\.\d+)?", final), f"problem {k}: GSM8K writes plain digits after ####, got {final!r}"
        assert Fraction(final) == Fraction(notes[-1][1]), f"problem {k}: final {final} != last step {notes[-1][1]}"
        finals.append(Fraction(final))
    # the fixture covers thousands, a negative answer and a non-integer one
    assert sum(f >= 1000 for f in finals) >= 3
    assert any(f < 0 for f in finals)
    assert any(f.denominator != 1 for f in finals)


def test_fixture_answers_score_as_completions():
    # A gold rationale, used as a completion, scores 1 on its own final answer, 0 on a neighbour;
    # a boxed final answer scores 1.
    for p in load_fixture():
        _, final = split_gold(p["answer"])
        wrong = str(Decimal(final) + 1)  # a different number of the same form
        assert score(p["answer"], final) == 1.0, p["answer"]
        assert score(p["answer"], wrong) == 0.0, p["answer"]
        assert score(f"So the answer is \\boxed{{{final}}}.", final) == 1.0


def test_load_fixture_default_path_follows_the_data_dir(tmp_path, monkeypatch):
    # the default path is <data_dir>/tasks/gsm8k_fixture.jsonl; a missing one says where it looked
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "tasks" / "gsm8k_fixture.jsonl"))):
        load_fixture()
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "gsm8k_fixture.jsonl").write_text(json.dumps({"question": "q?", "answer": "a\n#### 1"}) + "\n")
    assert load_fixture() == [{"question": "q?", "answer": "a\n#### 1"}]


@pytest.mark.parametrize("line, message", [
    ("not json", "is not JSON"),
    ("[1, 2]", "must be a JSON object"),
    (json.dumps({"question": "q?"}), "must be a JSON object"),
    (json.dumps({"question": "q?", "answer": 18}), "must be a JSON object"),
    (json.dumps({"question": "q?", "answer": "no marker"}), "no '####'"),
])
def test_load_fixture_rejects_bad_lines(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"question": "q?", "answer": "a\n#### 1"}) + "\n\n" + line + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:3") + ".*" + re.escape(message)):
        load_fixture(path)


def test_a_hash_line_with_several_numbers_is_no_answer():
    # math-verify's number reading counts the last number of a #### line; several numbers not joined
    # by an operator are a hedge here, so none of them counts (issue 37)
    for completion in ("#### 17 18", "#### 18 apples and 3 pears"):
        assert score(completion, "18") == 0.0 and score(completion, "17") == 0.0 and score(completion, "3") == 0.0
    assert score("#### 18 apples", "18") == 1.0 and score("#### 3 * 6 = 18 apples", "18") == 1.0
