"""Tests for grpo_lab.policy.rollout: group sampling, masks, behaviour log-probs, select, evaluate."""

import math

import pytest
import torch

import grpo_lab.policy.rollout as rollout_mod
from grpo_lab.policy.logprobs import token_logprobs
from grpo_lab.policy.models import TinyConfig, build_char_tokenizer, tiny_policy
from grpo_lab.policy.rollout import Rollout, evaluate, generate, policy_logprobs, position_ids_from_mask
from grpo_lab.tasks import ArithmeticTask, Problem

TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)
EOS = 2
# prompts of different lengths (4, 12 and 5 characters): rows 0-3 and 8-11 are left-padded
PROBLEMS = [Problem("1+2=", "3"), Problem("9+9+9+9+9+9=", "54"), Problem("12+3=", "15")]


@pytest.fixture(scope="module")
def model(tok):
    m = tiny_policy(tok, TINY, seed=0)
    with torch.no_grad():
        # A random tiny model puts ~1/52 on EOS; scaling the (tied) EOS embedding makes the EOS
        # logit large for about half of the hidden states, so that one rollout holds both
        # finished and truncated rows.
        m.model.embed_tokens.weight[EOS] *= 30
    m.eval()
    return m


@pytest.fixture(scope="module")
def ro(model, tok):
    torch.manual_seed(0)
    return generate(model, tok, PROBLEMS, group_size=4, max_new_tokens=8)


def _recompute(model, ro, **kw):
    was = model.training
    model.eval()
    with torch.no_grad():
        out = policy_logprobs(model, ro, **kw)
    model.train(was)
    return out


# ------------------------------------------------------------------------------------ generate
def test_generate_shapes_and_group_layout(ro, tok):
    B, P = 12, 12
    assert len(ro) == B and ro.group_size == 4 and ro.temperature == 1.0
    assert ro.prompt_ids.shape == (B, P) and ro.prompt_mask.shape == (B, P)
    T = ro.completion_ids.shape[1]
    assert 1 <= T <= 8
    for t in (ro.completion_mask, ro.behaviour_logp):
        assert t.shape == (B, T) and t.dtype == torch.float32
    assert ro.truncated.shape == (B,) and ro.truncated.dtype == torch.bool
    assert len(ro.texts) == len(ro.problems) == B
    assert ro.gen_seconds > 0
    # groups are contiguous: rows i*G .. i*G+G-1 belong to problem i
    for k in range(B):
        assert ro.problems[k] is PROBLEMS[k // 4]
    # prompts are left-padded, exactly as the tokenizer encodes them
    for k in range(B):
        ids = tok(PROBLEMS[k // 4].prompt, add_special_tokens=False)["input_ids"]
        n = len(ids)
        assert ro.prompt_ids[k, P - n:].tolist() == ids
        assert ro.prompt_mask[k].tolist() == [0] * (P - n) + [1] * n
        assert (ro.prompt_ids[k, :P - n] == tok.pad_token_id).all()


def test_completion_mask_up_to_first_eos(ro, tok):
    T = ro.completion_ids.shape[1]
    n_eos = n_trunc = 0
    for k in range(len(ro)):
        ids = ro.completion_ids[k].tolist()
        mask = ro.completion_mask[k].tolist()
        if EOS in ids:
            e = ids.index(EOS)
            n_eos += 1
            assert mask == [1.0] * (e + 1) + [0.0] * (T - e - 1)
            assert all(i == tok.pad_token_id for i in ids[e + 1:])
            assert not ro.truncated[k]
            assert ro.texts[k] == tok.decode(ids[:e])
        else:
            n_trunc += 1
            assert mask == [1.0] * T
            assert T == 8  # a truncated row used the whole budget
            assert ro.truncated[k]
            assert ro.texts[k] == tok.decode(ids)
        assert ro.lengths[k].item() == sum(mask)
        assert "<eos>" not in ro.texts[k]
    assert n_eos > 0 and n_trunc > 0  # the fixture covers both cases


def test_truncation_with_tiny_budget(model, tok):
    torch.manual_seed(1)
    ro1 = generate(model, tok, PROBLEMS, group_size=2, max_new_tokens=1)
    assert ro1.completion_ids.shape[1] == 1
    assert torch.equal(ro1.truncated, ro1.completion_ids[:, 0] != EOS)
    assert ro1.completion_mask.tolist() == [[1.0]] * 6


def test_behaviour_logp_equals_training_forward(model, ro):
    # The forward pass of policy_logprobs (left-padded prompts of different lengths, right-padded
    # completions, position ids from the mask) reproduces what generate sampled from.
    lp = _recompute(model, ro)
    assert lp.shape == ro.behaviour_logp.shape
    torch.testing.assert_close(lp, ro.behaviour_logp, atol=1e-5, rtol=0)
    assert (ro.behaviour_logp[ro.completion_mask == 0] == 0).all()
    assert (ro.behaviour_logp[ro.completion_mask == 1] < 0).all()


def test_ignoring_left_padding_would_be_detected(model, ro):
    # Negative control for the test above: attending to the left pads changes the log-probs of
    # the padded rows by far more than the tolerance.
    ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
    T = ro.completion_ids.shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[:, -T - 1:-1]
    lp = token_logprobs(logits, ro.completion_ids) * ro.completion_mask
    diff = (lp - ro.behaviour_logp).abs().amax(-1)
    assert diff[:4].min() > 1e-3 and diff[8:].min() > 1e-3  # the left-padded groups
    assert diff[4:8].max() < 1e-5  # the longest prompt has no padding


def test_temperature_is_applied(model, tok):
    torch.manual_seed(2)
    ro = generate(model, tok, PROBLEMS, group_size=2, max_new_tokens=6, temperature=0.7)
    assert ro.temperature == 0.7
    torch.testing.assert_close(_recompute(model, ro), ro.behaviour_logp, atol=1e-5, rtol=0)
    # the same tokens scored at temperature 1 differ: the temperature really enters
    assert (_recompute(model, ro, temperature=1.0) - ro.behaviour_logp).abs().max() > 1e-3


def test_sampling_reproducible_with_torch_seed(model, tok):
    torch.manual_seed(5)
    a = generate(model, tok, PROBLEMS, group_size=2, max_new_tokens=6)
    torch.manual_seed(5)
    b = generate(model, tok, PROBLEMS, group_size=2, max_new_tokens=6)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.behaviour_logp, b.behaviour_logp)


def test_greedy_is_deterministic_argmax(model, tok):
    torch.manual_seed(0)
    a = generate(model, tok, PROBLEMS, group_size=2, max_new_tokens=6, greedy=True)
    torch.manual_seed(1)
    b = generate(model, tok, PROBLEMS, group_size=2, max_new_tokens=6, greedy=True, temperature=0.0)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert a.temperature == 1.0
    assert a.texts[0] == a.texts[1]  # both samples of a group are the same under greedy decoding
    # every generated token is the argmax of the policy at its position
    ids = torch.cat([a.prompt_ids, a.completion_ids], 1)
    attn = torch.cat([a.prompt_mask, a.completion_mask.long()], 1)
    T = a.completion_ids.shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn),
                       use_cache=False).logits[:, -T - 1:-1]
    real = a.completion_mask.bool()
    assert torch.equal(logits.argmax(-1)[real], a.completion_ids[real])
    torch.testing.assert_close(_recompute(model, a), a.behaviour_logp, atol=1e-5, rtol=0)


def test_generate_restores_training_mode(model, tok):
    model.train()
    try:
        generate(model, tok, PROBLEMS[:1], max_new_tokens=2)
        assert model.training
    finally:
        model.eval()
    generate(model, tok, PROBLEMS[:1], max_new_tokens=2)
    assert not model.training


@pytest.mark.parametrize("kwargs, problems", [
    (dict(), []),
    (dict(group_size=0), PROBLEMS),
    (dict(temperature=0.0), PROBLEMS),
    (dict(temperature=-1.0), PROBLEMS),
    (dict(max_new_tokens=0), PROBLEMS),
    (dict(), [Problem("1+1=", "2"), Problem("", "0")]),
])
def test_generate_errors(model, tok, kwargs, problems):
    with pytest.raises(ValueError, match="generate"):
        generate(model, tok, problems, **kwargs)


# ------------------------------------------------------------------------------------ helpers
def test_position_ids_from_mask_goldens():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]])
    # cumsum - 1 on real tokens; padding gets 1 (generate's rule)
    assert position_ids_from_mask(mask).tolist() == [[1, 1, 0, 1, 2], [0, 1, 2, 3, 4], [1, 0, 1, 1, 1]]


def _handmade_rollout():
    lengths = [2, 5, 3, 1]
    B, T = 4, 5
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])
    comp = (torch.arange(B * T).view(B, T) + 4) * mask.long()
    return Rollout(
        prompt_ids=torch.arange(B * 3).view(B, 3), prompt_mask=torch.ones(B, 3, dtype=torch.long),
        completion_ids=comp, completion_mask=mask, behaviour_logp=-mask * 0.5,
        truncated=torch.tensor([False, True, False, False]), texts=["a", "b", "c", "d"],
        problems=[Problem(str(i), str(i)) for i in range(B)], group_size=2, temperature=0.9, gen_seconds=1.5,
        extras={"row": torch.tensor([10, 11, 12, 13]), "scalar": 7, "other": torch.zeros(3)},
    )


def test_rollout_select():
    r = _handmade_rollout()
    assert r.lengths.tolist() == [2, 5, 3, 1]
    s = r.select([2, 0])
    assert len(s) == 2
    assert s.completion_ids.shape == (2, 3)  # trimmed to the longest kept completion (3)
    assert torch.equal(s.completion_ids, r.completion_ids[[2, 0], :3])
    assert torch.equal(s.completion_mask, r.completion_mask[[2, 0], :3])
    assert torch.equal(s.behaviour_logp, r.behaviour_logp[[2, 0], :3])
    assert torch.equal(s.prompt_ids, r.prompt_ids[[2, 0]])
    assert s.truncated.tolist() == [False, False]
    assert s.texts == ["c", "a"] and [p.prompt for p in s.problems] == ["2", "0"]
    assert (s.group_size, s.temperature, s.gen_seconds) == (2, 0.9, 1.5)
    assert s.extras["row"].tolist() == [12, 10]  # per-row tensors are selected
    assert s.extras["scalar"] == 7 and s.extras["other"].shape == (3,)  # others pass through
    s1 = r.select(torch.tensor([3]))
    assert s1.completion_ids.shape == (1, 1) and s1.lengths.tolist() == [1]
    assert r.select([1]).completion_ids.shape == (1, 5)


def test_rollout_select_drops_left_padding_no_kept_row_uses(model, tok):
    # prompts of 2, 4 and 6 characters, left-padded to 6: keeping the two short ones needs 4 columns
    problems = [Problem("1+2=", "3"), Problem("1=", "1"), Problem("12+34=", "46")]
    ro = generate(model, tok, problems, group_size=1, max_new_tokens=4)
    assert ro.prompt_ids.shape[1] == 6
    s = ro.select([1, 0])
    assert s.prompt_ids.shape == (2, 4) and s.prompt_mask.sum(-1).tolist() == [2, 4]
    assert torch.equal(s.prompt_ids, ro.prompt_ids[[1, 0], 2:])
    assert torch.equal(s.token_counts(), ro.token_counts()[[1, 0]])
    # no real token moves: the same log-probs as the untrimmed rows (float rounding aside)
    with torch.no_grad():
        full, trimmed = policy_logprobs(model, ro), policy_logprobs(model, s)
    torch.testing.assert_close(trimmed, full[[1, 0], :trimmed.shape[1]], atol=1e-5, rtol=1e-5)
    assert ro.select([2]).prompt_ids.shape == (1, 6)  # the longest prompt keeps every column


# ------------------------------------------------------------------------------------ evaluate
def test_evaluate_real_generation(model, tok):
    task = ArithmeticTask(min_terms=2, max_terms=3, test_size=10)  # 2 term counts x 5 problems
    summary, frame = evaluate(model, tok, task, max_new_tokens=4)
    assert len(frame) == 10  # one row per test problem (greedy)
    assert list(frame["prompt"]) == [p.prompt for p in task.test_set()]
    for col in ("prompt", "answer", "completion", "correct", "length", "truncated", "n_terms", "reasoning"):
        assert col in frame
    assert "terms" not in frame  # non-scalar meta is left out
    assert 0.0 <= summary["accuracy"] <= 1.0
    assert summary["accuracy"] == frame["correct"].mean()
    assert 1 <= summary["mean_length"] <= 4
    assert set(summary) == {"accuracy", "mean_length", "truncation_rate", "reasoning_frac"}
    torch.manual_seed(0)
    _, sampled = evaluate(model, tok, task, task.test_set()[:3], greedy=False, n_samples=3, max_new_tokens=4)
    assert len(sampled) == 9
    assert list(sampled["prompt"]) == [p.prompt for p in task.test_set()[:3] for _ in range(3)]


def test_evaluate_accounting_with_scripted_generate(monkeypatch, tok):
    task = ArithmeticTask(max_new_tokens=48)
    problems = [task.make_problem(t) for t in ([3, 5, 2, 8], [1, 2], [4, 4], [9, 9])]
    # scripted completions: (text, tokens incl. EOS, truncated)
    script = {
        "3+5+2+8=": ("8+2+8;10+8;18;#18", 18, False),  # correct, reasoning
        "1+2=": ("#3", 3, False),  # correct, direct
        "4+4=": ("#9", 3, False),  # wrong
        "9+9=": ("9+9;9+9;9", 9, True),  # truncated, malformed, counts as reasoning
    }
    calls = []

    def fake_generate(model, tokenizer, chunk, *, group_size, max_new_tokens, temperature, greedy, with_logprobs):
        assert with_logprobs is False  # evaluation records no log-probs (issue 31)
        calls.append((len(chunk), group_size, max_new_tokens, greedy))
        rows = [p for p in chunk for _ in range(group_size)]
        T = max(script[p.prompt][1] for p in rows)
        mask = torch.tensor([[1.0] * script[p.prompt][1] + [0.0] * (T - script[p.prompt][1]) for p in rows])
        return Rollout(prompt_ids=torch.zeros(len(rows), 1, dtype=torch.long),
                       prompt_mask=torch.ones(len(rows), 1, dtype=torch.long),
                       completion_ids=torch.zeros(len(rows), T, dtype=torch.long), completion_mask=mask,
                       behaviour_logp=torch.zeros(len(rows), T),
                       truncated=torch.tensor([script[p.prompt][2] for p in rows]),
                       texts=[script[p.prompt][0] for p in rows], problems=rows, group_size=group_size)

    monkeypatch.setattr(rollout_mod, "generate", fake_generate)
    summary, frame = evaluate(None, tok, task, problems, batch_size=3)
    assert calls == [(3, 1, 48, True), (1, 1, 48, True)]  # batches of 3, task's budget
    assert frame["correct"].tolist() == [True, True, False, False]
    assert frame["reasoning"].tolist() == [True, False, False, True]
    assert frame["length"].tolist() == [18, 3, 3, 9]
    # accuracy 2/4; mean length (18+3+3+9)/4 = 8.25; truncation 1/4; reasoning 2/4
    assert summary == {"accuracy": 0.5, "mean_length": 8.25, "truncation_rate": 0.25, "reasoning_frac": 0.5}
    summary, frame = evaluate(None, tok, task, problems, greedy=False, n_samples=2, max_new_tokens=20)
    assert calls[-1] == (4, 2, 20, False)
    assert len(frame) == 8 and math.isclose(summary["accuracy"], 0.5)
