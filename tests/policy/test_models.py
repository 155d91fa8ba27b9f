"""Tests for grpo_lab.policy.models: the character tokenizer, tiny policies, load_policy, count_parameters."""

import dataclasses

import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2ForCausalLM

from grpo_lab.policy.models import CHARS, TinyConfig, build_char_tokenizer, count_parameters, load_policy, tiny_policy

TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------------------ tokenizer
def test_char_tokenizer_is_a_real_fast_tokenizer(tok):
    assert isinstance(tok, PreTrainedTokenizerFast)
    # 4 specials + 48 characters (10 digits, "+-*=#;.,:?", space, 26 letters, newline)
    assert len(CHARS) == 48
    assert len(tok) == 52


def test_special_ids(tok):
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token) == ("<pad>", "<bos>", "<eos>", "<unk>")
    # characters outside the alphabet map to <unk>
    assert _ids(tok, "A") == [3]
    assert _ids(tok, "é") == [3]


def test_every_char_round_trips(tok):
    for k, ch in enumerate(CHARS):
        assert _ids(tok, ch) == [4 + k], repr(ch)  # specials take 0..3, then CHARS in order
        assert tok.decode([4 + k]) == ch, repr(ch)
    ids = _ids(tok, CHARS)
    assert ids == list(range(4, 52))
    assert tok.decode(ids) == CHARS


def test_goldens(tok):
    # "0" -> 4 so digit d -> 4 + d; "+" is CHARS[10] -> 14; "=" is CHARS[13] -> 17;
    # "#" is CHARS[14] -> 18; ";" is CHARS[15] -> 19; " " is CHARS[20] -> 24
    assert _ids(tok, "3+5=") == [7, 14, 9, 17]
    assert _ids(tok, "8;#8") == [12, 19, 18, 12]
    assert _ids(tok, "  x") == [24, 24, 48]
    # no special tokens are added by default either (no BOS/EOS template)
    assert tok("3+5=")["input_ids"] == [7, 14, 9, 17]
    # decode joins with no separator and keeps special tokens verbatim
    assert tok.decode([5, 24, 12]) == "1 8"
    assert tok.decode([0, 5, 2]) == "<pad>1<eos>"
    assert tok.decode([0, 5, 2], skip_special_tokens=True) == "1"


def test_strings_with_repeated_newlines_round_trip(tok):
    for s in ["a\n\nb", "\n\n", "1\n\n\n2"]:
        assert tok.decode(_ids(tok, s)) == s


def test_left_padding(tok):
    assert tok.padding_side == "left"
    enc = tok(["1+2=", "12+3+4="], padding=True, add_special_tokens=False, return_tensors="pt")
    # "1+2=" -> [5, 14, 6, 17], padded on the left with three pads (id 0) to length 7
    assert enc["input_ids"].tolist() == [[0, 0, 0, 5, 14, 6, 17], [5, 6, 14, 7, 14, 8, 17]]
    assert enc["attention_mask"].tolist() == [[0, 0, 0, 1, 1, 1, 1], [1] * 7]


def test_repeated_alphabet_rejected():
    with pytest.raises(ValueError, match="repeated"):
        build_char_tokenizer("abca")


# ------------------------------------------------------------------------------------ tiny_policy
def test_tiny_policy_config_and_mode(tok):
    m = tiny_policy(tok, TINY)
    assert isinstance(m, Qwen2ForCausalLM)
    assert m.training
    assert m.config.vocab_size == 52
    assert (m.config.pad_token_id, m.config.bos_token_id, m.config.eos_token_id) == (0, 1, 2)
    assert (m.generation_config.pad_token_id, m.generation_config.eos_token_id) == (0, 2)
    assert next(m.parameters()).dtype == torch.float32


def test_tiny_policy_deterministic_for_a_seed(tok):
    a, b, c = tiny_policy(tok, TINY, seed=0), tiny_policy(tok, TINY, seed=0), tiny_policy(tok, TINY, seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.embed_tokens.weight"], sc["model.embed_tokens.weight"])


def test_tiny_policy_does_not_disturb_global_rng(tok):
    torch.manual_seed(123)
    expected = torch.rand(5)
    torch.manual_seed(123)
    tiny_policy(tok, TINY, seed=7)
    assert torch.equal(torch.rand(5), expected)


def test_llama_arch(tok):
    m = tiny_policy(tok, dataclasses.replace(TINY, arch="llama"))
    assert isinstance(m, LlamaForCausalLM)
    ids = torch.tensor([_ids(tok, "3+5=")])
    out = m(input_ids=ids)
    assert out.logits.shape == (1, 4, 52)
    assert torch.isfinite(out.logits).all()


def test_unknown_arch(tok):
    with pytest.raises(ValueError, match="unknown arch"):
        tiny_policy(tok, dataclasses.replace(TINY, arch="gpt2"))


def test_count_parameters_counts_tied_weights_once(tok):
    # Hand count for TINY (V=52, d=32, ffn=64, 1 layer, 2 heads of 16, 1 kv head):
    #   qwen2 attention: q 32*32+32, k 32*16+16, v 32*16+16, o 32*32 -> 1056+528+528+1024 = 3136
    #   mlp: 3 * 32*64 = 6144; two RMSNorms 2*32 = 64           -> layer 9344
    #   embedding 52*32 = 1664, final norm 32                   -> 11040 (lm_head tied)
    tied = tiny_policy(tok, TINY)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert count_parameters(tied) == 11040
    untied = tiny_policy(tok, dataclasses.replace(TINY, tie_word_embeddings=False))
    assert count_parameters(untied) == 11040 + 1664
    # llama has no q/k/v bias: 11040 - (32 + 16 + 16) = 10976
    assert count_parameters(tiny_policy(tok, dataclasses.replace(TINY, arch="llama"))) == 10976
    # frozen parameters are not counted
    tied.model.embed_tokens.weight.requires_grad_(False)
    assert count_parameters(tied) == 11040 - 1664


# ------------------------------------------------------------------------------------ load_policy
def _save(model, tok, path):
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_save_load_round_trip_identical_logits(tok, tmp_path, arch):
    model = tiny_policy(tok, dataclasses.replace(TINY, arch=arch), seed=3)
    model.eval()
    _save(model, tok, tmp_path)
    loaded, tok2 = load_policy(tmp_path)
    assert type(loaded) is type(model)
    assert not loaded.training
    assert tok2.padding_side == "left"
    assert (tok2.pad_token_id, tok2.eos_token_id) == (0, 2)
    enc = tok(["1+2=", "9+9+9+9="], padding=True, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        a = model(**enc).logits
        b = loaded(**enc).logits
    assert torch.equal(a, b)
    assert count_parameters(loaded) == count_parameters(model)


def test_load_policy_llama_tokenizer_identical(tok, tmp_path):
    _save(tiny_policy(tok, dataclasses.replace(TINY, arch="llama")), tok, tmp_path)
    _, tok2 = load_policy(tmp_path)
    assert _ids(tok2, CHARS) == _ids(tok, CHARS)
    assert tok2.decode(list(range(52))) == tok.decode(list(range(52)))


def test_load_policy_qwen2_tokenizer_identical(tok, tmp_path):
    _save(tiny_policy(tok, TINY), tok, tmp_path)
    _, tok2 = load_policy(tmp_path)
    assert _ids(tok2, CHARS) == _ids(tok, CHARS)
    assert _ids(tok2, " a b") == [24, 25, 24, 26]


def test_load_policy_dtype(tok, tmp_path):
    _save(tiny_policy(tok, TINY), tok, tmp_path)
    model, _ = load_policy(tmp_path, dtype=torch.float64)
    assert next(model.parameters()).dtype == torch.float64


def test_load_policy_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_policy(tmp_path / "does-not-exist")
    with pytest.raises(FileNotFoundError):
        load_policy("./no/such/checkpoint")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_policy(tmp_path / "empty")
    with pytest.raises(ValueError, match="hub id"):
        load_policy("not a hub id!!")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_load_policy_cuda_without_cuda_is_a_clear_error(tmp_path):
    from grpo_lab.paths import checkpoint_dir

    with pytest.raises(ValueError, match="CUDA"):
        load_policy(checkpoint_dir("arithmetic-base"), device="cuda")


def test_load_policy_by_shipped_checkpoint_name():
    # found by a fresh user: the README says load_policy loads the shipped checkpoints, but only a
    # full path worked
    from grpo_lab.policy.models import load_policy

    model, tok = load_policy("arithmetic-base", progress=False)
    assert model.config.model_type == "qwen2" and len(tok) == model.config.vocab_size
