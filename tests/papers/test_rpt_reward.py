"""RPT's prefix-matching reward (Dong et al., arXiv 2506.08007, Eq. 3): ``grpo_lab.algo.rewards.prefix_match_reward``.

    r = 1  iff  bytes(y) == bytes(x_{>=t})[0:l]  and  l in L_gt   (l = len(bytes(y)) > 0,
    L_gt = the cumulative byte lengths of the ground-truth tokens)

Every expected value below was worked out by hand from Eq. 3 (byte counts written next to the
case); none was printed from the code. The property test compares the reward with an independent
brute-force reading of Eq. 3 written here (:func:`eq3_reference`), not with the code's own walk.
"""

import itertools
import random

import pytest

from grpo_lab.algo.rewards import prefix_match_reward


def eq3_reference(prediction: str, tokens: list[str]) -> float:
    """Eq. 3 written literally: the set of boundaries, then a slice comparison of bytes."""
    y = prediction.encode("utf-8")
    x = b"".join(t.encode("utf-8") for t in tokens)
    boundaries = set(itertools.accumulate(len(t.encode("utf-8")) for t in tokens))
    l = len(y)
    return 1.0 if l > 0 and l in boundaries and x[:l] == y else 0.0


# --- hand-worked cases ---------------------------------------------------------------------------
# tokens ["The", " cat", " sat"]: bytes 3 + 4 + 4, boundaries {3, 7, 11}
CAT = ["The", " cat", " sat"]


@pytest.mark.parametrize("prediction, expected", [
    ("The", 1.0),           # l = 3, the first token exactly
    ("The cat", 1.0),       # l = 7, two tokens, ends on a boundary
    ("The cat sat", 1.0),   # l = 11, the whole reference
    ("The c", 0.0),         # l = 5: the bytes match, but 5 is inside " cat"
    ("Th", 0.0),            # l = 2: inside the first token
    ("The cat sat.", 0.0),  # l = 12: longer than the whole reference (no boundary at 12)
    ("The cat sat on", 0.0),
    ("A", 0.0),             # wrong first byte
    ("The dog", 0.0),       # l = 7 is a boundary, but the bytes differ
    ("the", 0.0),           # case matters (bytes)
    ("", 0.0),              # l = 0: an empty prediction predicts nothing
    ("The ", 0.0),          # l = 4: the space belongs to the next token " cat"
])
def test_cat_examples(prediction, expected):
    r = prefix_match_reward(prediction, CAT)
    assert type(r) is float and r == expected


def test_inside_a_token_gets_nothing_even_though_the_bytes_match():
    # the docstring's example: ["Python", " is"], boundaries {6, 9}
    assert prefix_match_reward("Pyth", ["Python", " is"]) == 0.0
    assert prefix_match_reward("Python i", ["Python", " is"]) == 0.0     # l = 8
    assert prefix_match_reward("Python", ["Python", " is"]) == 1.0
    assert prefix_match_reward("Python is", ["Python", " is"]) == 1.0
    # the same bytes "Python is" split differently: ["Pyt", "hon is"], boundaries {3, 9}
    assert prefix_match_reward("Python", ["Pyt", "hon is"]) == 0.0       # l = 6 is no boundary now
    assert prefix_match_reward("Pyt", ["Pyt", "hon is"]) == 1.0


def test_multi_byte_characters_count_in_bytes():
    # "é" is 2 bytes (C3 A9): tokens ["caf", "é"] have boundaries {3, 5}, not the character counts {3, 4}
    tokens = ["caf", "é"]
    assert prefix_match_reward("café", tokens) == 1.0    # l = 5
    assert prefix_match_reward("caf", tokens) == 1.0     # l = 3
    assert prefix_match_reward("cafe", tokens) == 0.0    # l = 4, ASCII "e": wrong bytes
    assert prefix_match_reward("café!", tokens) == 0.0   # l = 6, longer than the reference
    assert prefix_match_reward("café!", ["caf", "é", "!"]) == 1.0  # boundaries {3, 5, 6}
    # a reading that counted characters for one side and bytes for the other would give
    # len("café") = 4 chars against the boundary 5, or 5 bytes against {3, 4}: both 0
    assert prefix_match_reward("é", ["é", "t"]) == 1.0   # l = 2 = the first boundary
    assert prefix_match_reward("ét", ["é", "t"]) == 1.0  # l = 3
    # 3- and 4-byte characters: "’" (E2 80 99) and "😀" (F0 9F 98 80)
    assert prefix_match_reward("it’s", ["it", "’", "s"]) == 1.0    # boundaries {2, 5, 6}; l = 6
    assert prefix_match_reward("it’", ["it", "’s"]) == 0.0         # boundaries {2, 6}; l = 5
    assert prefix_match_reward("😀", ["😀", " ok"]) == 1.0          # l = 4
    # same visible text, different code points: "é" precomposed (2 bytes) vs "e" + U+0301 (3 bytes)
    assert prefix_match_reward("cafe\u0301", tokens) == 0.0


def test_a_leading_space_matters():
    # tokens [" cat", " sat"]: the prediction must carry the space the token starts with
    assert prefix_match_reward(" cat", [" cat", " sat"]) == 1.0
    assert prefix_match_reward("cat", [" cat", " sat"]) == 0.0
    assert prefix_match_reward("cat ", [" cat", " sat"]) == 0.0
    assert prefix_match_reward(" catsat", [" cat", " sat"]) == 0.0    # l = 7: no boundary, the space of " sat" missing
    assert prefix_match_reward(" cat sat", [" cat", " sat"]) == 1.0   # l = 8 = 4 + 4
    assert prefix_match_reward(" cat  sat", [" cat", " sat"]) == 0.0  # l = 9, longer than the reference
    assert prefix_match_reward(" cat sa", [" cat", " sat"]) == 0.0    # l = 7, inside " sat"


def test_any_sequence_of_tokens_works():
    assert prefix_match_reward("The cat", ("The", " cat")) == 1.0
    assert prefix_match_reward("The cat", (t for t in ["The", " cat"])) == 1.0  # an iterator is read once


# --- errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("prediction, tokens, exc, match", [
    (b"The", CAT, TypeError, r"prediction must be a str, got bytes"),
    (None, CAT, TypeError, r"prediction must be a str, got NoneType"),
    (3, CAT, TypeError, r"prediction must be a str, got int"),
    ("The", "The cat", TypeError, r"reference_tokens must be a sequence of token strings .*not one str"),
    ("The", b"The cat", TypeError, r"not one bytes"),
    ("The", [b"The"], TypeError, r"must hold str, got bytes at index 0"),
    ("The", ["The", 3], TypeError, r"must hold str, got int at index 1"),
    ("The", [], ValueError, r"reference_tokens is empty"),
    ("The", ["The", ""], ValueError, r"reference_tokens\[1\] is an empty string"),
    ("", [""], ValueError, r"reference_tokens\[0\] is an empty string"),
])
def test_errors_name_the_problem(prediction, tokens, exc, match):
    with pytest.raises(exc, match=match):
        prefix_match_reward(prediction, tokens)


# --- property test against the brute-force reference --------------------------------------------
# pieces of 1 to 4 bytes per character, spaces, and a character that repeats
ALPHABET = ["a", "b", " ", "é", "’", "😀", "\n", "{"]


def _random_tokens(r: random.Random) -> list[str]:
    return ["".join(r.choice(ALPHABET) for _ in range(r.randint(1, 3))) for _ in range(r.randint(1, 5))]


def test_every_prefix_against_eq3():
    r = random.Random(20250610)
    n_checked = n_one = 0
    for _ in range(300):
        tokens = _random_tokens(r)
        joined = "".join(tokens).encode("utf-8")
        boundaries = set(itertools.accumulate(len(t.encode("utf-8")) for t in tokens))
        for l in range(0, len(joined) + 1):
            try:
                pred = joined[:l].decode("utf-8")
            except UnicodeDecodeError:  # a cut inside a character is no str prediction
                continue
            got = prefix_match_reward(pred, tokens)
            assert got == eq3_reference(pred, tokens), (pred, tokens)
            # a prefix of the ground truth always matches in bytes: the reward is the boundary test alone
            assert got == (1.0 if l in boundaries else 0.0), (pred, tokens)
            n_checked += 1
            n_one += got == 1.0
        # predictions that do not match: a changed last character, and one character too many
        for pred in ("".join(tokens)[:-1] + "x", "".join(tokens) + "a", "x" + "".join(tokens)):
            assert prefix_match_reward(pred, tokens) == eq3_reference(pred, tokens) == 0.0, (pred, tokens)
    # the test exercised both outcomes many times
    assert n_one > 500 and n_checked - n_one > 500
