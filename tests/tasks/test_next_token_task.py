"""RPT's next-token reasoning task (Dong et al., arXiv 2506.08007): ``grpo_lab.tasks.next_token``, the
RPT presets, the ``ntp_coef`` term of the trainer, and the byte-level BPE tokenizer it runs on.

Goldens are by hand: the entropy thresholds and sampling settings are the paper's (App. B, Table 1;
``/work/shared/reference/papers.md`` §8); the entropy reference below is written from the definition
in float64 with numpy (not from the code); the split masks, parse results, byte tables and byte counts
were worked out by hand next to each case. The tests that read the corpus data files and checkpoints
(``python -m grpo_lab.lab.pretrain corpus-proxy`` and ``... corpus``) skip when those are not built.
"""

import dataclasses
import hashlib
import json
import math
import warnings

import numpy as np
import pytest
import torch

from grpo_lab.algo.algorithms import GRPO, PRESETS, RPT, RPT_HYBRID, RPT_SAMPLING, Algorithm, get_algorithm
from grpo_lab.policy.models import TinyConfig, tiny_policy, train_bpe_tokenizer
from grpo_lab.paths import checkpoint_dir, data_dir
from grpo_lab.algo.rewards import prefix_match_reward
from grpo_lab.tasks import TASKS
from grpo_lab.tasks import next_token as nt
from grpo_lab.tasks.next_token import (ENTROPY_THRESHOLDS, NextTokenTask, char_start_mask, corpus_sha256,
                                       entropy_split, load_corpus, next_token_prompt, parse_prediction,
                                       split_corpus, token_strings, top_k_entropy)
from grpo_lab.training.trainer import Trainer, TrainerConfig

CORPUS_BASE = checkpoint_dir("corpus-base")
PROXY_BASE = checkpoint_dir("corpus-proxy-base")
TRAIN_FILE = data_dir() / "tasks" / nt.TRAIN_FILE
TEST_FILE = data_dir() / "tasks" / nt.TEST_FILE
HAVE_DATA = all(p.is_file() for p in (CORPUS_BASE / "recipe.json", PROXY_BASE / "recipe.json", TRAIN_FILE,
                                       TEST_FILE))
needs_data = pytest.mark.skipif(not HAVE_DATA, reason="the corpus checkpoints / next_token data files are not built "
                                "(python -m grpo_lab.lab.pretrain corpus-proxy && python -m grpo_lab.lab.pretrain corpus)")
TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)


def _recipe(path):
    return json.loads((path / "recipe.json").read_text())


# ---- corpus_chunks / split_corpus -------------------------------------------------------------------
# 1000 short synthetic topics: each is one chunk "topic-NNNN#0"
DOCS = {f"topic-{i:04d}": f"Text of topic {i}.\n\nA second paragraph." for i in range(1000)}
KEYS = [f"topic-{i:04d}#0" for i in range(1000)]
TWO = {"held": 0.2, "train": 0.8}


def _u(key, salt="grpo_lab-rpt"):
    """The docstring's rule, computed independently: sha256(salt + key) as a fraction of 2**256."""
    return int.from_bytes(hashlib.sha256((salt + key).encode()).digest(), "big") / 2**256


def test_corpus_chunks_by_hand():
    # "aaa\n\nbbb\n\nccc" with min_chars=4: the first blank line at or after offset 4 is at 8, so the
    # first chunk is the 10 characters up to and including it; the rest, "ccc", is the last chunk
    text = "aaa\n\nbbb\n\nccc"
    assert nt.corpus_chunks({"t": text}, min_chars=4) == [("t#0", "aaa\n\nbbb\n\n"), ("t#1", "ccc")]
    assert nt.corpus_chunks({"t": text}, min_chars=100) == [("t#0", text)]
    assert nt.corpus_chunks({"b": "x", "a": "y"}) == [("a#0", "y"), ("b#0", "x")]  # topic order


def test_corpus_chunks_of_the_real_corpus_join_back():
    docs = load_corpus()
    chunks = nt.corpus_chunks(docs)
    assert len({k for k, _ in chunks}) == len(chunks) > len(docs)
    for name, text in docs.items():
        mine = [c for k, c in chunks if k.rsplit("#", 1)[0] == name]
        assert "".join(mine) == text
        assert all(len(c) >= 2000 and c.endswith("\n\n") for c in mine[:-1])


def test_split_is_deterministic_disjoint_and_covers_every_chunk():
    parts = split_corpus(DOCS, TWO)
    assert list(parts) == ["held", "train"]
    shuffled = dict(reversed(list(DOCS.items())))
    assert parts == split_corpus(shuffled, TWO) == split_corpus(DOCS, TWO)
    held, train = [k for k, _ in parts["held"]], [k for k, _ in parts["train"]]
    assert held == sorted(held) and train == sorted(train)  # corpus order
    assert not set(held) & set(train) and set(held) | set(train) == set(KEYS)
    assert all(text == DOCS[k[:-2]] for k, text in parts["held"] + parts["train"])
    # Binomial(1000, 0.2): sd 12.6; the split is a fixed function, so this cannot flake
    assert 150 < len(held) < 250
    # the rule of the docstring: consecutive intervals of u in the order of the fractions
    assert held == [k for k in KEYS if _u(k) < 0.2]
    three = split_corpus(DOCS, {"a": 0.1, "b": 0.3, "c": 0.6})
    assert [k for k, _ in three["b"]] == [k for k in KEYS if 0.1 <= _u(k) < 0.4]
    assert set(k for k, _ in three["a"]) <= set(held)  # nested in the first fraction
    # a new topic moves no other chunk; another salt gives another split
    more = split_corpus({**DOCS, "a-new-topic": "new"}, TWO)
    assert [k for k, _ in more["held"] if k != "a-new-topic#0"] == held
    assert split_corpus(DOCS, TWO, salt="other")["held"] != parts["held"]
    # the default parts, in the documented order and sizes
    assert nt.SPLIT_FRACTIONS == {"test": 0.2, "rl": 0.2, "pretrain": 0.6}
    d = split_corpus(DOCS)
    assert list(d) == ["test", "rl", "pretrain"]
    assert 150 < len(d["test"]) < 250 and 150 < len(d["rl"]) < 250 and 520 < len(d["pretrain"]) < 680


@pytest.mark.parametrize("fractions", [{}, {"a": 0.0, "b": 1.0}, {"a": -0.2, "b": 1.2}, {"a": 0.5, "b": 0.4},
                                       {"a": 0.5, "b": 0.6}, {"a": "0.5", "b": 0.5}, {"a": math.nan, "b": 1.0}])
def test_split_rejects_bad_fractions(fractions):
    with pytest.raises(ValueError, match="fractions must be positive and sum to 1"):
        split_corpus(DOCS, fractions)


def test_split_rejects_an_empty_part():
    with pytest.raises(ValueError, match="no chunk falls in"):
        split_corpus({"one": "text"}, {"a": 0.5, "b": 0.5})


def test_the_real_corpus_split_is_the_recorded_one():
    path = CORPUS_BASE / "recipe.json"
    if not path.is_file():
        pytest.skip("data/checkpoints/corpus-base/recipe.json is not built (python -m grpo_lab.lab.pretrain corpus)")
    rec = _recipe(CORPUS_BASE)["corpus"]
    docs = load_corpus()
    if corpus_sha256(docs) != rec["sha256"]:
        pytest.skip("this CPython ships a different pydoc_data.topics than the one the checkpoint was built from")
    assert list(docs) == sorted(docs) and all(isinstance(v, str) and v for v in docs.values())
    parts = split_corpus(docs)
    assert "split" in rec, "corpus-base/recipe.json predates the chunk split: rebuild (python -m grpo_lab.lab.pretrain corpus)"
    assert {p: [k for k, _ in c] for p, c in parts.items()} == rec["split"]
    n = sum(len(c) for c in parts.values())
    assert n == len(nt.corpus_chunks(docs))
    assert 0.1 < len(parts["test"]) / n < 0.3 and 0.1 < len(parts["rl"]) / n < 0.3


def test_corpus_sha256_sees_names_and_texts():
    a = {"x": "one", "y": "two"}
    assert corpus_sha256(a) == corpus_sha256({"y": "two", "x": "one"})  # order-free
    assert corpus_sha256(a) != corpus_sha256({"x": "one", "y": "tw0"})
    assert corpus_sha256(a) != corpus_sha256({"x": "one", "z": "two"})
    assert corpus_sha256({"ab": "c"}) != corpus_sha256({"a": "bc"})  # the separator counts
    assert len(corpus_sha256(a)) == 64


# ---- top_k_entropy --------------------------------------------------------------------------------
def _entropy_reference(logits: np.ndarray, k: int) -> np.ndarray:
    """float64, row by row from the definition: keep the k largest logits, softmax them, -sum p log p."""
    flat = logits.reshape(-1, logits.shape[-1]).astype(np.float64)
    out = []
    for row in flat:
        top = np.sort(row)[::-1][:k]
        w = np.exp(top - top.max())
        p = w / w.sum()
        out.append(-sum(q * math.log(q) for q in p if q > 0))
    return np.array(out).reshape(logits.shape[:-1])


@pytest.mark.parametrize("k", [1, 5, 16, 100])
def test_top_k_entropy_matches_the_definition(k):
    g = torch.Generator().manual_seed(7)
    logits = 3.0 * torch.randn(4, 7, 50, generator=g)
    got = top_k_entropy(logits, k)
    assert got.dtype == torch.float32 and got.shape == (4, 7)
    np.testing.assert_allclose(got.numpy(), _entropy_reference(logits.numpy(), k), rtol=1e-5, atol=1e-6)
    assert float(got.min()) >= 0 and float(got.max()) <= math.log(min(k, 50)) + 1e-5
    if k == 1:
        assert torch.equal(got, torch.zeros(4, 7))


def test_top_k_entropy_special_values():
    # ties: uniform logits give log k (log V when k > V)
    u = torch.full((3, 50), 2.5)
    torch.testing.assert_close(top_k_entropy(u, 16), torch.full((3,), math.log(16)))
    torch.testing.assert_close(top_k_entropy(u, 100), torch.full((3,), math.log(50)))
    # -inf logits (masked tokens) contribute nothing: three finite equal logits -> log 3; one -> 0
    x = torch.full((2, 50), -math.inf)
    x[0, [3, 9, 20]] = 1.0
    x[1, 4] = -3.0
    h = top_k_entropy(x, 16)
    assert not torch.isnan(h).any()
    torch.testing.assert_close(h, torch.tensor([math.log(3), 0.0]))
    # the renormalisation uses the top k only: logits (0, 0, -1e4) with k=2 -> log 2
    torch.testing.assert_close(top_k_entropy(torch.tensor([0.0, 0.0, -1e4]), 2), torch.tensor(math.log(2)))
    # any float dtype, computed in float32; the input is not modified and gradients do not flow
    b = torch.randn(5, 30, dtype=torch.bfloat16)
    assert top_k_entropy(b, 16).dtype == torch.float32
    r = torch.randn(2, 30, requires_grad=True)
    assert not top_k_entropy(r).requires_grad


@pytest.mark.parametrize("logits, k, match", [
    (torch.zeros(3, 5), 0, "k must be an int >= 1"),
    (torch.zeros(3, 5), -2, "k must be an int >= 1"),
    (torch.zeros(3, 5), 1.5, "k must be an int >= 1"),
    (torch.zeros(3, 5), True, "k must be an int >= 1"),
    (torch.tensor(1.0), 16, "vocabulary dimension"),
    (torch.tensor([[0.0, float("nan")]]), 16, "NaN or \\+inf"),
    (torch.tensor([[0.0, math.inf]]), 16, "NaN or \\+inf"),
])
def test_top_k_entropy_errors(logits, k, match):
    with pytest.raises(ValueError, match=match):
        top_k_entropy(logits, k)


# ---- entropy_split --------------------------------------------------------------------------------
def test_entropy_split_default_thresholds_are_nested():
    # the paper's thresholds (Table 1): easy >= 0.5, medium >= 1.0, hard >= 1.5 nats
    assert ENTROPY_THRESHOLDS == {"easy": 0.5, "medium": 1.0, "hard": 1.5}
    e = [math.nan, 0.2, 0.5, 0.99, 1.0, 1.49, 1.5, 3.0]
    s = entropy_split(e)
    assert list(s) == ["easy", "medium", "hard"]
    # by hand, position by position
    assert s["easy"].tolist() == [False, False, True, True, True, True, True, True]
    assert s["medium"].tolist() == [False, False, False, False, True, True, True, True]
    assert s["hard"].tolist() == [False, False, False, False, False, False, True, True]
    assert all(m.dtype == bool for m in s.values())
    rng = np.random.default_rng(0)
    r = rng.uniform(0, 3, 500)
    r[rng.integers(0, 500, 40)] = np.nan
    s = entropy_split(r)
    assert not (s["hard"] & ~s["medium"]).any() and not (s["medium"] & ~s["easy"]).any()
    assert not any(m[np.isnan(r)].any() for m in s.values())  # NaN is in no split
    assert s["hard"].sum() > 0 and (s["easy"] & ~s["medium"]).sum() > 0
    assert ENTROPY_THRESHOLDS == {"easy": 0.5, "medium": 1.0, "hard": 1.5}  # not mutated


def test_entropy_split_custom_thresholds_and_errors():
    s = entropy_split(np.array([0.0, 2.0, 7.0]), {"all": 0, "top": 5.0})
    assert list(s) == ["all", "top"] and s["all"].tolist() == [True] * 3 and s["top"].tolist() == [False, False, True]
    with pytest.raises(ValueError, match="must be 1-D"):
        entropy_split(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="must be 1-D"):
        entropy_split(1.0)
    for bad in (-0.1, math.nan, math.inf, "1"):
        with pytest.raises(ValueError, match="threshold 'x' must be a finite number >= 0"):
            entropy_split([1.0], {"x": bad})


# ---- the format -----------------------------------------------------------------------------------
def test_prompt_and_parse_prediction():
    assert next_token_prompt("the cat") == "the cat<think>"
    assert parse_prediction("a</think>b</think> c") == " c"          # the last </think> wins
    assert parse_prediction("reasoning</think>  x \n") == "  x \n"   # nothing stripped
    assert parse_prediction("</think>") == ""
    assert parse_prediction("no close tag <think> here") is None
    assert parse_prediction("") is None
    assert parse_prediction("</think") is None


# ---- the tokenizer ---------------------------------------------------------------------------------
TEXTS = ["The cat sat on the mat. The dog sat on the log.", "def f(x):\n    return x + 1  # add one",
         "Python is a programming language; the cat is not.", "a , b . c ; d : e"] * 4


@pytest.fixture(scope="module")
def bpe():
    return train_bpe_tokenizer(TEXTS, 300, extra_special=("<think>", "</think>"))


def test_train_bpe_tokenizer_is_deterministic_and_exact(bpe):
    again = train_bpe_tokenizer(TEXTS, 300, extra_special=("<think>", "</think>"))
    assert bpe.backend_tokenizer.to_str() == again.backend_tokenizer.to_str()
    assert len(bpe) <= 300 and len(bpe) > 256 + 6  # some merges were learned
    # ids of the specials, in the documented order
    assert [bpe.convert_tokens_to_ids(t) for t in ("<pad>", "<bos>", "<eos>", "<unk>", "<think>", "</think>")] == \
        list(range(6))
    assert bpe.padding_side == "left"
    for text in ["The cat sat.", "naïve café — it’s 😀 Ω", "a , b . c", "  two  spaces\n\ttab", "x <think>y</think> z"]:
        ids = bpe(text, add_special_tokens=False)["input_ids"]
        assert bpe.unk_token_id not in ids
        assert bpe.decode(ids, skip_special_tokens=False) == text  # as the rollout decodes
    ids = bpe("x<think>y</think>z", add_special_tokens=False)["input_ids"]
    think, close = bpe.convert_tokens_to_ids("<think>"), bpe.convert_tokens_to_ids("</think>")
    assert ids.count(think) == 1 and ids.count(close) == 1
    assert bpe.decode(ids[ids.index(think):ids.index(think) + 1], skip_special_tokens=False) == "<think>"


@pytest.mark.parametrize("vocab_size", [262, 100, "1024", None])
def test_train_bpe_tokenizer_rejects_a_small_vocab(vocab_size):
    # 256 bytes + 4 specials + 2 extra = 262: the vocabulary must be larger
    with pytest.raises(ValueError, match="vocab_size must exceed 256 bytes \\+ 6 specials"):
        train_bpe_tokenizer(TEXTS, vocab_size, extra_special=("<think>", "</think>"))


def test_token_strings_joins_a_split_character(bpe):
    # "’" (E2 80 99) never occurs in TEXTS, so it stays three byte tokens
    text = "it’s ok"
    ids = bpe(text, add_special_tokens=False)["input_ids"]
    single = [bpe.decode([i], skip_special_tokens=False) for i in ids]
    assert sum("\ufffd" in s for s in single) >= 2  # the premise: the character is split across tokens
    pieces = token_strings(bpe, ids)
    assert all(isinstance(p, str) and p and "\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text
    assert len(pieces) == len(ids) - 2  # the three byte tokens of "’" became one piece
    assert any("’" in p for p in pieces)
    # a tail that never completes a character is dropped; everything before it is kept
    cut = next(i for i, s in enumerate(single) if "\ufffd" in s) + 1
    assert "".join(token_strings(bpe, ids[:cut])) == "it"
    # the pieces work as the reward's reference tokens: the text up to the end of the joined piece is a
    # boundary, and a prediction that stops just before "’" (inside that piece) is not
    j = next(i for i, q in enumerate(pieces) if "’" in q)
    upto = "".join(pieces[:j + 1])
    assert prefix_match_reward(upto, pieces) == 1.0
    if not pieces[j].startswith("’"):
        assert prefix_match_reward(upto[:upto.index("’")], pieces) == 0.0


def test_byte_alphabet_and_char_start_mask(bpe):
    from tokenizers import pre_tokenizers

    table = nt._bytes_to_unicode()
    assert len(table) == len(set(table)) == 256
    # identical to GPT-2's table (openai/gpt-2 encoder.py, transcribed): the bytes of three printable
    # ranges stand for themselves, every other byte, in order, for chr(256), chr(257), ...
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in keep]
    assert table == [chr(b) if b in keep else chr(256 + others.index(b)) for b in range(256)]
    assert set(table) == set(pre_tokenizers.ByteLevel.alphabet())
    # GPT-2's table by hand: printable ASCII maps to itself, space -> "Ġ" (U+0120), newline -> "Ċ" (U+010A)
    assert table[ord("A")] == "A" and table[32] == "\u0120" and table[10] == "\u010a"
    # the order agrees with tokenizers' own ByteLevel pre-tokenizer
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    for s in ["é", "’", "😀", "a b\n"]:
        assert pre.pre_tokenize_str(s)[0][0] == "".join(table[b] for b in s.encode())
    mask = char_start_mask(bpe)
    assert mask.dtype == bool and mask.shape == (len(bpe),)
    byte_of = {c: b for b, c in enumerate(table)}
    single = {byte_of[t]: i for t, i in bpe.get_vocab().items() if len(t) == 1 and t in byte_of}
    assert len(single) == 256  # every byte has its token
    false_bytes = sorted(b for b, i in single.items() if not mask[i])
    assert false_bytes == list(range(0x80, 0xC0))  # exactly the 64 continuation bytes
    special = [bpe.convert_tokens_to_ids(t) for t in bpe.all_special_tokens]
    assert mask[special].all()


# ---- presets -------------------------------------------------------------------------------------
def _differing(a, b):
    return {f.name for f in dataclasses.fields(Algorithm) if getattr(a, f.name) != getattr(b, f.name)}


def test_rpt_presets():
    # App. B: GRPO, KL coefficient 0, clip 0.2, no language-modelling term (Eq. 4 is pure RL)
    assert _differing(RPT, GRPO) == {"name", "kl", "beta"}
    assert RPT.kl is None and RPT.beta == 0.0 and not RPT.uses_kl
    assert (RPT.eps_low, RPT.eps_high, RPT.ntp_coef) == (0.2, 0.2, 0.0)
    assert PRESETS["RPT"] is RPT and get_algorithm("rpt") is RPT
    # App. B: G = 8, temperature 0.8, as trainer settings
    assert RPT_SAMPLING == {"group_size": 8, "temperature": 0.8}
    cfg = TrainerConfig(**RPT_SAMPLING)
    assert (cfg.group_size, cfg.temperature) == (8, 0.8)
    # the hybrid ablation: RPT plus ntp_coef, nothing else
    assert _differing(RPT_HYBRID, RPT) == {"name", "ntp_coef"}
    assert RPT_HYBRID.ntp_coef == 1.0 and "not the paper" in RPT_HYBRID.name
    assert RPT.axes()["ntp_coef"] == 0.0 and RPT_HYBRID.axes()["ntp_coef"] == 1.0
    assert RPT_HYBRID.describe()["ntp_coef"] == 1.0
    assert type(GRPO.replace(ntp_coef=np.float32(0.5)).ntp_coef) is float  # a plain float for JSON
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(ValueError, match="ntp_coef"):
            RPT.replace(ntp_coef=bad)


@pytest.mark.parametrize("target", ["trl", "verl"])
def test_export_refuses_the_ntp_term(target):
    from grpo_lab import export as E

    with pytest.raises(E.ExportError, match="ntp_coef"):
        E.translate(RPT_HYBRID, target, strict=False, max_new_tokens=32)
    with pytest.raises(E.ExportError, match="ntp_coef"):
        E.translate(GRPO.replace(ntp_coef=0.1), target, strict=False, max_new_tokens=32)
    with warnings.catch_warnings():  # RPT itself exports (GRPO without KL; verl's adv_eps is approximate)
        warnings.simplefilter("ignore", E.ApproximateExportWarning)
        E.translate(RPT, target, strict=False, max_new_tokens=32)


# ---- the task on the built data --------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus_tok():
    from grpo_lab.policy.models import load_policy

    _, tok = load_policy(str(CORPUS_BASE))
    return tok


@needs_data
def test_the_data_and_the_task_use_one_tokenizer():
    # the data files were tokenized with corpus-proxy-base's tokenizer, the task decodes with corpus-base's
    a, b = _recipe(CORPUS_BASE), _recipe(PROXY_BASE)
    assert a["tokenizer_sha256"] == b["tokenizer_sha256"]
    assert "split" in a["corpus"] and "split" in b["corpus"], "a corpus recipe.json predates the chunk split: rebuild"
    assert a["corpus"]["split"] == b["corpus"]["split"]
    assert a["corpus"]["sha256"] == b["corpus"]["sha256"]


@needs_data
def test_sample_is_seeded_and_respects_min_entropy():
    task = NextTokenTask(min_entropy=1.5)
    a, b = task.sample(6, np.random.default_rng(3)), task.sample(6, np.random.default_rng(3))
    c = task.sample(6, np.random.default_rng(4))
    key = lambda ps: [(p.prompt, p.answer, p.meta) for p in ps]  # noqa: E731
    assert key(a) == key(b) and key(a) != key(c)
    for p in a + c:
        assert p.prompt.endswith("<think>") and p.prompt.count("<think>") == 1
        assert p.meta["entropy"] >= 1.5
        assert 1 <= len(p.meta["reference_tokens"]) <= task.reference_tokens
        assert "".join(p.meta["reference_tokens"]) == p.answer
    # eligible positions, checked against the training file itself
    from safetensors.numpy import load_file

    d = load_file(str(TRAIN_FILE))
    ids, ent = d["ids"], d["entropy"]
    pos = task.eligible_positions()
    assert len(pos) > 100 and np.all(np.diff(pos) > 0)
    assert np.all(ent[pos] >= 1.5) and pos.min() >= task.context_tokens
    assert pos.max() <= len(ids) - task.reference_tokens
    expect = np.flatnonzero(np.nan_to_num(ent, nan=-1.0) >= 1.5)
    expect = expect[(expect >= 32) & (expect <= len(ids) - 8)]
    assert np.array_equal(pos, expect)
    assert len(NextTokenTask().eligible_positions()) > len(pos)
    with pytest.raises(ValueError, match="no training position"):
        NextTokenTask(min_entropy=50.0).eligible_positions()


@needs_data
def test_reward_on_sampled_problems():
    task = NextTokenTask()
    assert TASKS["next_token"] is NextTokenTask
    for p in task.sample(8, np.random.default_rng(0)):
        ref = p.meta["reference_tokens"]
        assert task.reward("</think>" + ref[0], p) == 1.0 and task.is_correct("</think>" + ref[0], p)
        assert not p.answer.startswith("zzzq")
        assert task.reward("</think>zzzq", p) == 0.0 and not task.is_correct("</think>zzzq", p)
        assert task.reward(ref[0], p) == 0.0  # no </think>: no prediction
        if len(ref) >= 2:
            assert task.reward("thinking</think>" + ref[0] + ref[1], p) == 1.0
        if len(ref[0].encode()) >= 2:  # stopping inside the first token earns nothing
            assert task.reward("</think>" + ref[0][:-1], p) == 0.0
        demo = task.demonstration(p, np.random.default_rng(0))
        assert demo == "</think>" + ref[0] and task.reward(demo, p) == 1.0
    assert task.is_reasoning("I think</think> x") and not task.is_reasoning(" </think> x")
    assert not task.is_reasoning("no close")


@needs_data
def test_test_set(corpus_tok):
    n = _recipe(PROXY_BASE)["metrics"]["test_positions"]
    problems = NextTokenTask().test_set()
    assert len(problems) == n == 600
    think = corpus_tok.convert_tokens_to_ids("<think>")
    assert think != corpus_tok.unk_token_id
    for p in problems:
        ref = p.meta["reference_tokens"]
        assert 1 <= len(ref) <= 8 and all(isinstance(t, str) and t for t in ref)
        assert "".join(ref) == p.answer
        assert p.prompt.endswith("<think>") and "\ufffd" not in p.prompt
        ids = corpus_tok(p.prompt, add_special_tokens=False)["input_ids"]
        assert ids[-1] == think and ids.count(think) == 1
        assert math.isfinite(p.meta["entropy"]) and p.meta["entropy"] >= 0
    assert len({p.meta["position"] for p in problems}) == len(problems)
    # the held-out positions cover the paper's three difficulty splits
    splits = entropy_split([p.meta["entropy"] for p in problems])
    assert all(m.sum() > 0 for m in splits.values())


@needs_data
def test_checkpoint_tokenizer_round_trips_as_the_rollout_decodes(corpus_tok):
    # the rollout decodes with skip_special_tokens=False and the tokenizer's own clean-up setting: a
    # clean-up of spaces would turn the prediction " ," into "," and lose the reward
    for text in ["a , b . c ; d ? e !", "x = f(y) ,z", "it’s café — 😀", "</think> names"]:
        ids = corpus_tok(text, add_special_tokens=False)["input_ids"]
        assert corpus_tok.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("field, value", [("max_new_tokens", 0), ("context_tokens", True), ("reference_tokens", 1.5),
                                          ("min_entropy", -1.0), ("min_entropy", math.nan),
                                          ("min_entropy", math.inf), ("min_entropy", "1")])
def test_constructor_rejects_bad_settings(field, value):
    with pytest.raises(ValueError, match=field):
        NextTokenTask(**{field: value})


# ---- the hybrid term in the trainer ------------------------------------------------------------------
def _trainer(tok, algo, task=None, **kw):
    cfg = dict(prompts_per_step=2, group_size=2, max_new_tokens=4, eval_every=0, threads=1, seed=0, progress=False,
               lr=1e-2)
    cfg.update(kw)
    return Trainer(tiny_policy(tok, TINY, seed=0), tok, task or NextTokenTask(max_new_tokens=4), algo,
                   TrainerConfig(**cfg))


class _RecordingTask(NextTokenTask):
    """NextTokenTask that remembers the problems its demonstrations were asked for."""

    def demonstration(self, problem, rng=None):
        self.asked = getattr(self, "asked", []) + [problem]
        return super().demonstration(problem, rng)


@needs_data
def test_hybrid_term_is_the_mean_nll_of_the_demonstrations(corpus_tok):
    base = _trainer(corpus_tok, RPT)
    h0 = base.train(1)
    task = _RecordingTask(max_new_tokens=4)
    hyb = _trainer(corpus_tok, RPT_HYBRID, task)
    p0 = tiny_policy(corpus_tok, TINY, seed=0).eval()  # the weights the single update starts from
    h1 = hyb.train(1)
    assert "ntp_loss" not in h0 or h0["ntp_loss"].isna().all()
    ntp = float(h1["ntp_loss"].iloc[0])
    assert math.isfinite(ntp)
    # the same rollout (the term draws no randomness), different weights after the update
    assert h0["reward"].tolist() == h1["reward"].tolist() and h0["length"].tolist() == h1["length"].tolist()
    assert any(not torch.equal(a, b) for a, b in zip(base.policy.parameters(), hyb.policy.parameters()))
    # independent recomputation: each asked problem once, unpadded, prompt + demonstration + EOS, the mean
    # over all demonstration tokens of -log p (temperature 1) under the starting weights
    uniq = list({id(p): p for p in task.asked}.values())
    assert 1 <= len(uniq) <= 2
    nll, n = 0.0, 0
    with torch.no_grad():
        for p in uniq:
            prompt = corpus_tok(p.prompt, add_special_tokens=False)["input_ids"]
            demo = corpus_tok(task.demonstration(p), add_special_tokens=False)["input_ids"] + [corpus_tok.eos_token_id]
            x = torch.tensor([prompt + demo])
            logp = torch.log_softmax(p0(input_ids=x).logits[0].double(), -1)
            for j, t in enumerate(demo):
                nll -= float(logp[len(prompt) + j - 1, t])
                n += 1
    assert ntp == pytest.approx(nll / n, rel=1e-4)
    assert abs(ntp - math.log(len(corpus_tok))) < 1.0  # a random policy: about log V nats per token


@needs_data
def test_hybrid_gradient_is_linear_in_ntp_coef(corpus_tok, capture_grads):
    grads = {}
    for c in (0.0, 1.0, 2.0):
        tr = _trainer(corpus_tok, RPT.replace(ntp_coef=c), minibatches=1, grad_clip=1e9)  # no clipping
        capture_grads(tr, grads, c)
        tr.train(1)
    d1 = [b - a for a, b in zip(grads[0.0], grads[1.0])]
    d2 = [b - a for a, b in zip(grads[1.0], grads[2.0])]
    assert any(float(x.abs().max()) > 1e-6 for x in d1)  # the term reaches the update
    for x, y in zip(d1, d2):
        torch.testing.assert_close(x, y, rtol=1e-3, atol=1e-6)


class _NoDemonstration:
    """A task with the protocol's members but no ``demonstration``."""

    def __init__(self):
        self._t = NextTokenTask(max_new_tokens=4)
        self.name, self.max_new_tokens = "no_demo", 4

    def sample(self, n, rng):
        return self._t.sample(n, rng)

    def reward(self, completion, problem):
        return self._t.reward(completion, problem)

    def is_correct(self, completion, problem):
        return self._t.is_correct(completion, problem)

    def test_set(self):
        return self._t.test_set()


@needs_data
def test_hybrid_term_needs_a_demonstration(corpus_tok):
    with pytest.raises(TypeError, match="demonstration"):
        _trainer(corpus_tok, RPT_HYBRID, _NoDemonstration()).train(1)
    _trainer(corpus_tok, RPT, _NoDemonstration()).train(1)  # RPT itself never asks for one


# ---- data defects found in review and fixed: references end with their chunk, prompts start on a character
def _train_arrays():
    from safetensors.numpy import load_file

    d = load_file(str(TRAIN_FILE))
    return d["ids"].astype(np.int64), d["entropy"]


@needs_data
def test_no_reference_runs_past_the_end_of_its_chunk(corpus_tok):
    task = NextTokenTask()
    ids, ent = _train_arrays()
    eos = corpus_tok.eos_token_id
    crossing = [int(t) for t in task.eligible_positions() if eos in ids[t:t + task.reference_tokens]][:20]
    bad = [t for t in crossing if any(corpus_tok.eos_token in r for r in
                                      task.problem_at(ids, t, float(ent[t])).meta["reference_tokens"])]
    bad += [p.meta["position"] for p in task.test_set() if any(corpus_tok.eos_token in r
                                                                 for r in p.meta["reference_tokens"])]
    assert not bad


@needs_data
def test_no_prompt_starts_inside_a_character(corpus_tok):
    task = NextTokenTask()
    ids, ent = _train_arrays()
    starts = char_start_mask(corpus_tok)
    pos = task.eligible_positions()
    inside = pos[~starts[ids[pos - task.context_tokens]]][:20]
    assert not any("\ufffd" in task.problem_at(ids, int(t), float(ent[t])).prompt for t in inside)


# ---- review findings (fresh-user review of chapter 7), each fixed -------------------------------------------
def test_top_k_entropy_of_a_row_of_only_minus_inf_is_zero():
    # by hand: no finite logit, no distribution: defined as 0 (was NaN); an empty vocabulary is refused
    x = torch.full((2, 5), -math.inf)
    x[1, 0] = 0.0
    assert torch.equal(nt.top_k_entropy(x, 3), torch.zeros(2))
    with pytest.raises(ValueError, match="empty"):
        nt.top_k_entropy(torch.zeros(2, 0), 3)


@pytest.mark.parametrize("min_chars", [0, -100, 1.5, True])
def test_corpus_chunks_refuses_a_bad_min_chars(min_chars):
    # -100 used to loop for ever (str.find reads a negative start from the end)
    with pytest.raises(ValueError, match="min_chars"):
        nt.corpus_chunks({"a": "x" * 200 + "\n\n" + "y" * 50}, min_chars=min_chars)


@pytest.mark.parametrize("refs", [None, {"a": 1}, 3])
def test_reward_refuses_a_reference_that_is_not_a_sequence(refs):
    with pytest.raises(TypeError, match="sequence"):
        prefix_match_reward("a", refs)


def test_min_entropy_refuses_a_bool():
    with pytest.raises(ValueError, match="min_entropy"):
        NextTokenTask(min_entropy=True)


@needs_data
def test_a_one_token_reference_is_never_empty():
    # a first token that is part of a multi-byte character has no text alone: the window widens
    task = NextTokenTask(reference_tokens=1)
    ids, ent = task._train()
    pos = task.eligible_positions()
    tok = task._tok()
    starts_split = [int(t) for t in pos if "\ufffd" in tok.decode([int(ids[t])])][:10]
    assert starts_split, "the corpus has multi-byte characters split over tokens"
    for t in starts_split:
        ref = task.problem_at(ids, t, float(ent[t])).meta["reference_tokens"]
        assert ref and "\ufffd" not in ref[0]


@needs_data
def test_settings_the_data_was_not_built_for_are_refused():
    with pytest.raises(ValueError, match="context_tokens=16"):
        NextTokenTask(context_tokens=16).sample(1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="context_tokens=16"):
        NextTokenTask(context_tokens=16).test_set()
    with pytest.raises(ValueError, match="tokenizer"):
        NextTokenTask(tokenizer="arithmetic-base").sample(1, np.random.default_rng(0))
