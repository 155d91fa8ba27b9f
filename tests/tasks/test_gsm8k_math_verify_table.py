"""grpo_lab.tasks.gsm8k.score against Math-Verify's own test suite (issue 37).

Every case below is a gold-versus-prediction case of huggingface/Math-Verify's tests (the file
and test function are cited on each row) whose gold is a decimal number, as GSM8K's golds are,
rewritten as model completions: the prediction's final answer in a box and after ``####``
(``"both"``), or in the one form named. Prose around the answer in the original prediction
becomes the completion's text before the answer; a gold that Math-Verify writes as ``28\\%``,
``90^\\circ`` or ``125`` miles is written as GSM8K writes it, the plain number. The expected
verdict is Math-Verify's; the cases where ``score`` deliberately differs are in
:data:`DELIBERATE`, each with the reason the module docstring of grpo_lab.tasks.gsm8k gives.

Left out: golds that are not decimal numbers (expressions, sets, intervals, equations, symbols,
fractions such as 10/9), golds in a form GSM8K never writes (``1,22`` and ``0,111`` with a
decimal comma, which :data:`grpo_lab.tasks.gsm8k.GOLD_RE` refuses), and tests that check
parse output, configs, timeouts or string extraction rather than a gold-versus-prediction verdict.
"""

import pytest

pytest.importorskip("math_verify")

from grpo_lab.tasks.gsm8k import score

_ALL = "tests/test_all.py::"
_MIXED = "tests/test_mixed_number_extraction.py::"

# (source, gold, answer, prose before it, expected, forms)
TABLE = [
    (_ALL + "test_number_extraction", "-5", "-5", "", 1, "both"),
    (_ALL + "test_number_extraction", "7425000", "7,425,000", "", 1, "both"),
    (_ALL + "test_number_extraction", "1000", "1 000", "", 1, "both"),
    (_ALL + "test_number_extraction", "1000", "1000.0", "", 1, "both"),
    (_ALL + "test_number_extraction", "1000.0", "1,000.0", "", 1, "both"),
    (_ALL + "test_number_extraction", "1000.99", "1000,99", "", 1, "both"),
    (_ALL + "test_number_extraction", "2.74", "2,74 $", "Soucis : ", 1, "both"),
    (_ALL + "test_number_extraction", "0.4", ".4", "", 1, "both"),
    (_ALL + "test_number_extraction", "1000.99", "1,000.99", "", 1, "both"),
    (_ALL + "test_number_extraction", "1000.99", "$1,000.99", "", 1, "both"),
    (_ALL + "test_number_extraction", "1000.99", "1,000.99$", "", 1, "both"),
    (_ALL + "test_number_extraction", "1000.99", "1,000.99\u20ac", "the number is not 10 which is ", 1, "both"),
    (_ALL + "test_number_extraction", "1000.99", "1,000.99m\u00b2", "so the number is 10 which is ", 1, "both"),
    (_ALL + "test_number_extraction", "2", "AZYUK2A", "", 0, "both"),
    (_ALL + "test_sets_handling", "1", "-[0,1)", "", 0, "both"),
    (_ALL + "test_latex_notation", "9", "9", "Answer ", 1, "both"),
    (_ALL + "test_latex_notation", "10", "(9+1)", "Answer ", 1, "both"),
    (_ALL + "test_latex_notation", "9", " \n 9 \n ", "Answer ", 0, "both"),
    (_ALL + "test_latex_notation", "1", r"\frac3{3} ", "", 1, "both"),
    (_ALL + "test_percent_notation", "28", "28 percent", "", 1, "both"),
    (_ALL + "test_percent_notation", "28", "28 pct", "", 1, "both"),
    (_ALL + "test_percent_notation", "28", "28 %", "", 1, "both"),
    (_ALL + "test_percent_notation", "28", "28 percentage", "", 1, "both"),
    (_ALL + "test_percent_notation", "28", "28", "", 1, "both"),
    (_ALL + "test_percent_notation", "0.28", "28", "", 0, "both"),
    (_ALL + "test_percent_notation", "28", "28/100", "", 0, "both"),
    (_ALL + "test_percent_notation", "28", r"28\%", "making for a total loss of ", 1, "both"),
    (_ALL + "test_latex_notation_math", "90", r"90^\circ", "the angle between the lines is ", 1, "both"),
    (_ALL + "test_latex_notation_math", "2", "2", "there are ", 1, "both"),
    (_ALL + "test_latex_notation_math", "15", r"15\mbox{ cm}^2", "the area of the triangle is ", 1, "both"),
    (_ALL + "test_latex_notation_math", "9", "9", r"$129^{34}+96^{38} \equiv$ ", 1, "both"),
    (_ALL + "test_latex_notation_math", "0", "0", "the degree of $p(x)$ is ", 1, "both"),
    (_ALL + "test_latex_notation_math", "125", r"125\textnormal{ miles}", "The distance is ", 1, "both"),
    (_ALL + "test_relations_math", "11", "x=11", "", 1, "both"),
    (_ALL + "test_relations_math", "11", r"x\approx11", "", 1, "both"),
    (_ALL + "test_relations_math", "1", "k=1", "", 1, "both"),
    (_ALL + "test_matrix_extraction", "189", "189", "Thus, the area of the trapezoid is ", 1, "both"),
    (_ALL + "test_complex_math_expressions", "2", r"\frac{1+\sqrt{5}}{2}", "", 0, "both"),
    (_ALL + "test_complex_math_expressions", "4", r"\frac{34}{16}+\frac{\sqrt{1358}}{16}", "", 0, "both"),
    (_ALL + "test_math_extraction_edge_cases", "12", "12", "there are 12 distinct arithmetic sequences. ", 1, "both"),
    (_ALL + "test_math_extraction_edge_cases", "16386.20", r"\$16,\!386.20", "Paula's investment is worth ", 1, "both"),
    (_ALL + "test_math_extraction_edge_cases", "120", "120", "the volume of the prism is ", 1, "both"),
    (_ALL + "test_math_extraction_edge_cases", "12000023", "12,000,023", "The final answer is ", 1, "both"),
    (_ALL + "test_math_extraction_edge_cases", "14916", "14{,}916", "The smallest possible value of $N$ is ", 1, "both"),
    (_ALL + "test_math_extraction_edge_cases", "16386.17", r"\$16386.17", "Paula's investment is worth ", 1, "both"),
    (_ALL + "test_math_extraction_edge_cases", "20", r"20 \%", "the percentage of children is ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "3", "3 hours", "Jane started growing Sphere ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "19", "19", "the number of points is ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "34", "34", "Final Answer: The largest $n$ is ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "100", "100%.", "the minimum error increases by ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "16386.16", "16386.16", "Paula's investment is worth ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "5866608", "5866608", "the sum is ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "14400", "14400", "the number of ways is ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "14916", "14{,}916", "The final answer is ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "20", r"20\%", "the percentage of children is ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "7.78", "7.78.", "The final answer is ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "100", "100", "The final answer is ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "10455", "10,455", "The final answer is ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "11111111100", r"11,\! 111,\! 111,\! 100", "is ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "32349", r"32,\! 349", "is ", 1, "both"),
    (_ALL + "test_math_extraction_additional_cases", "32349", "32, 349", "is ", 0, "both"),
    (_ALL + "test_float_precision", "4.123105625617661", r"\sqrt{17}", "", 1, "both"),
    (_ALL + "test_sqrt_precision", "4", r"4\sqrt{2}", "", 0, "both"),
    (_ALL + "test_trailing_punctuation", "5", r"5 \text{ cm}.", "", 1, "both"),
    (_ALL + "test_trailing_punctuation", "42", "42.", "", 1, "both"),
    (_ALL + "test_trailing_punctuation", "2", "2^{10}.", "", 0, "both"),
    (_ALL + "test_trailing_punctuation", "1", "1/3.", "The answer is ", 0, "both"),
    ("tests/test_boxed.py::test_boxed", "004", "004", "the remainder is 004. ", 1, "both"),
    ("tests/test_boxed.py::test_boxed", "840", "840", "could answer therefore ", 1, "both"),
    ("tests/test_open_thoughts.py::test_open_thoughts", "667", "667", "", 1, "both"),
    ("tests/test_open_thoughts.py::test_open_thoughts", "143", "143", "the count is ", 1, "both"),
    ("tests/test_open_thoughts.py::test_open_thoughts", "0.06", r"0.06 \text{ yuan}", "", 1, "both"),
    ("tests/test_failed_latex_span.py::test_failed_latex_retains_independent_fallbacks", "42", "42",
     r"Final answer is $\sum_{k=0}^n\bigl(k\bigr)$. I hope. ", 1, "both"),
    ("tests/test_failed_latex_span.py::test_failed_latex_does_not_supply_an_embedded_number", "0",
     r"\sum_{k=0}^n\bigl(k\bigr)", "Final answer is ", 0, "both"),
    (_MIXED + "test_mixed_number_does_not_match_only_its_whole_number_prefix", "4", "4 4/9.", "The answer is ", 0, "both"),
    (_MIXED + "test_parse_mixed_number_with_zero_numerator_as_whole_value", "4", "4 0/9", "", 1, "both"),
    *[(_MIXED + "test_invalid_mixed_number_has_no_finite_component_equivalence", gold, answer, "", 0, "both")
      for answer, golds in (("4 4/0", ("4", "0")), ("4 0/0", ("4", "0")), ("-4 0/0", ("-4", "0")), ("0 0/0", ("0",)),
                            ("1 000 0/0", ("1000", "0")), ("-1 000 0/0", ("-1000", "0")),
                            ("11 6/6", ("11", "1", "12", "10")), ("11 7/6", ("11",)), ("11 6/6.", ("11", "1", "12", "10")),
                            ("4 0/0.", ("4", "0")))
      for gold in golds],
    (_MIXED + "test_line_separator_does_not_form_a_mixed_number", "5", "11\n5/6", "", 1, "both"),
    (_MIXED + "test_existing_expression_syntax_is_unchanged", "5", "10/2", "", 1, "both"),
    (_MIXED + "test_existing_expression_syntax_is_unchanged", "1000", "1 000", "", 1, "both"),
    (_MIXED + "test_existing_expression_syntax_is_unchanged", "5", "$5.00", "", 1, "both"),
    (_MIXED + "test_existing_expression_syntax_is_unchanged", "0.28", "28%", "", 1, "both"),
    (_MIXED + "test_existing_expression_syntax_is_unchanged", "2", "4 4/9 2", "", 1, "both"),
]

# (form, answer, gold) -> the module docstring's reason why score's verdict differs from Math-Verify's.
_LIST = "in a box a comma that is not a thousands separator separates a list (math-verify's LaTeX reading)"
DELIBERATE = {
    ("boxed", "1000,99", "1000.99"): _LIST,
    ("boxed", "2,74 $", "2.74"): _LIST,
    ("boxed", "1,000.99m\u00b2", "1000.99"): "in a box a unit outside \\text is not read as a unit",
    ("boxed", " \n 9 \n ", "9"): "the box's content is the answer; the rule is about $...$ inline math",
    ("boxed", "11\n5/6", "5"): "a box is read as LaTeX: 11\n5/6 is 55/6, not 5",
    ("####", "11\n5/6", "5"): "a #### answer ends at its line break: it is 11",
    **{(form, "4 4/9 2", "2"): "one answer: numbers not joined by an operator are a hedge" for form in ("boxed", "####")},
}

CASES = [(source, form, gold, prose, answer, expected)
         for source, gold, answer, prose, expected, forms in TABLE
         for form in (("boxed", "####") if forms == "both" else (forms,))]


def _completion(form: str, prose: str, answer: str) -> str:
    return prose + (r"\boxed{" + answer + "}" if form == "boxed" else "\n#### " + answer)


@pytest.mark.parametrize("source, form, gold, prose, answer, expected", CASES,
                         ids=[f"{c[1]} {c[4]!r} vs {c[2]}" for c in CASES])
def test_score_agrees_with_math_verifys_tests(source, form, gold, prose, answer, expected):
    key = (form, answer, gold)
    want = (1 - expected) if key in DELIBERATE else expected
    assert score(_completion(form, prose, answer), gold) == want, (source, DELIBERATE.get(key))


def test_the_table_runs_under_the_pinned_antlr_runtime():
    # the verdicts above hold for this runtime only (with 4.9.3, `make xcheck`'s omegaconf pin, \boxed{28 pct}
    # scores 0): a .venv whose runtime was changed fails here, not silently in a reward
    from importlib import metadata

    from grpo_lab.tasks.gsm8k import SCORER_ANTLR_VERSION

    assert metadata.version("antlr4-python3-runtime") == SCORER_ANTLR_VERSION


# Not from Math-Verify: Markdown emphasis and code around a #### answer are read like bold (issue 54), and
# the near misses that are not a wrapped answer stay as they were. Verdicts by hand: the wrapped text is the
# number itself; "7*3" is a product (21), the others are not a number math-verify can read.
EMPHASIS = [("*73*", "73", 1), ("_73_", "73", 1), ("__73__", "73", 1), ("***73***", "73", 1), ("`73`", "73", 1),
            ("``73``", "73", 1), ("*73*.", "73", 1), ("*$73*", "73", 1), ("*-5*", "-5", 1), ("**73**", "73", 1),
            ("*73*", "7", 0), ("`73`", "3", 0), ("_73_", "21", 0),
            ("7*3", "73", 0), ("7*3", "21", 1), ("*7*3*", "73", 0), ("*7*3*", "21", 0), ("_7_3_", "73", 0),
            ("7_3", "73", 0), ("*73_", "73", 0), ("*73", "73", 0), ("`7*3`", "73", 0), ("*7 3*", "73", 0)]


@pytest.mark.parametrize("answer, gold, expected", EMPHASIS, ids=[f"{a!r} vs {g}" for a, g, _ in EMPHASIS])
def test_emphasis_and_code_around_a_marker_answer_read_like_bold(answer, gold, expected):
    assert score("so the answer is\n#### " + answer, gold) == expected

