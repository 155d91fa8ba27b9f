"""Behaviour log-probs recorded step by step during ``generate`` (issue 31) against the former computation:
``output_logits=True``, every step's logits stacked into ``[B, T, V]``, log-softmax, gather. The reference is
computed here in float64 (and, for bit-identity, with the former float32 arithmetic), from a second
``generate`` call with the same seed, so both calls draw the same tokens."""

import math

import pytest
import torch

import grpo_lab.policy.rollout as rollout_mod
from grpo_lab.policy.logprobs import token_logprobs
from grpo_lab.policy.models import inference_copy, tiny_policy
from grpo_lab.policy.rollout import evaluate, generate
from grpo_lab.tasks import ArithmeticTask, Problem

from _toys import TINY

EOS = 2
PROBLEMS = [Problem("1+2=", "3"), Problem("9+9+9+9+9+9=", "54"), Problem("12+3=", "15"), Problem("7*8=", "56")]


@pytest.fixture(scope="module")
def model(tok):
    m = tiny_policy(tok, TINY, seed=1)
    with torch.no_grad():
        m.model.embed_tokens.weight[EOS] *= 30  # EOS likely for about half the hidden states: rows end apart
    return m.eval()


def _reference(model, tok, problems, *, seed, group_size, max_new_tokens, temperature, greedy, top_p):
    """(completion ids [B, T], float64 log-probs [B, T], the former float32 log-probs [B, T]) of the former
    path: the same generation config with ``output_logits=True``, all steps stacked. Under top-p the draws
    come from the same truncating processor (so that they are the same draws), and the reference log-probs
    are those of the truncated distribution: a float64 log-softmax over the kept ids only."""
    rows = [p for p in problems for _ in range(group_size)]
    tok.padding_side = "left"
    enc = tok([p.prompt for p in rows], return_tensors="pt", padding=True, add_special_tokens=False)
    stops = rollout_mod.stop_token_ids(model, tok)
    config = rollout_mod._generation_config(model, tok, stops, max_new_tokens=max_new_tokens,
                                            temperature=temperature, greedy=greedy, top_p=top_p, top_k=0,
                                            cache_implementation=None)
    config.output_logits = True
    tau = 1.0 if greedy else temperature
    truncating = top_p < 1 and not greedy
    recorder = rollout_mod._BehaviourLogprobs(enc["input_ids"].shape[1], tau, top_p, 0) if truncating else None
    torch.manual_seed(seed)
    out, _ = rollout_mod._generate_with(model, enc["input_ids"], enc["attention_mask"], config, recorder)
    comp = out.sequences[:, enc["input_ids"].shape[1]:]
    logits = torch.stack(out.logits, dim=1)  # [B, T, V] float32 raw logits: what the former code held
    z = logits.double() / tau
    if truncating:  # -inf outside the recorded kept ids (padding -1 dropped), built here without restrict_to_kept
        kept = recorder.kept_ids(comp.shape[1]).long()
        inside = torch.zeros_like(z, dtype=torch.bool)
        for b, t, k in (kept >= 0).nonzero().tolist():
            inside[b, t, kept[b, t, k]] = True
        real = rollout_mod._cut_at_stop(comp, stops, tok.pad_token_id)[1] == 1  # after a stop: pad, not drawn
        assert inside.gather(-1, comp[..., None])[..., 0][real].all()  # every drawn token is in its kept set
        z = z.masked_fill(~inside, float("-inf"))
        logits = logits.masked_fill(~inside, float("-inf"))
    ref64 = torch.log_softmax(z, -1).gather(-1, comp[..., None])[..., 0]
    ref32 = token_logprobs(logits, comp, temperature=tau)
    if truncating:  # the pad ids after a stop may lie outside the kept set (-inf): 0 there, as generate records
        ref64, ref32 = ref64.masked_fill(~real, 0.0), ref32.masked_fill(~real, 0.0)
    return comp, ref64, ref32


CASES = [dict(temperature=0.7), dict(temperature=1.0), dict(greedy=True), dict(temperature=1.0, top_p=0.8),
         dict(temperature=0.7, top_p=0.6)]


@pytest.mark.parametrize("low_precision", [False, True], ids=["float32", "bfloat16-copy"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_behaviour_logp_equals_stacked_logits_path(model, tok, case, low_precision):
    sampler = inference_copy(model, torch.bfloat16) if low_precision else model
    kw = dict(group_size=4, max_new_tokens=10, temperature=case.get("temperature", 1.0),
              greedy=case.get("greedy", False), top_p=case.get("top_p", 1.0))
    torch.manual_seed(3)
    ro = generate(sampler, tok, PROBLEMS, **kw)
    comp, ref64, ref32 = _reference(sampler, tok, PROBLEMS, seed=3, **kw)
    mask = ro.completion_mask
    assert torch.equal(ro.completion_ids, comp.masked_fill(mask == 0, tok.pad_token_id))  # same draws
    if not kw["greedy"]:  # the fixture makes rows end at different steps, and some run out of budget
        assert ro.truncated.any() and not ro.truncated.all() and len(set(ro.lengths.tolist())) >= 3
    assert ro.behaviour_logp.dtype == torch.float32 and ro.temperature == (1.0 if kw["greedy"] else kw["temperature"])
    torch.testing.assert_close(ro.behaviour_logp.double(), ref64 * mask.double(), rtol=0, atol=2e-5)
    assert torch.equal(ro.behaviour_logp, ref32 * mask)  # the former float32 arithmetic, bit for bit
    assert (ro.behaviour_logp[mask == 0] == 0).all()
    truncating = kw["top_p"] < 1 and not kw["greedy"]
    assert (ro.kept_ids is not None) == truncating
    if truncating:  # a kept set of one token gives log-prob 0 (exactly: logsumexp of one logit is that logit)
        one = (ro.kept_ids >= 0).sum(-1) == 1
        assert ((ro.behaviour_logp == 0) == (one & (mask == 1)) | (mask == 0)).all()
        assert (ro.behaviour_logp[mask == 1] <= 0).all()
    else:
        assert (ro.behaviour_logp[mask == 1] < 0).all()


def test_recorder_goldens_and_undone_steps():
    """The recorder alone, driven as ``generate`` drives it (the processor sees a step's logits, the criterion
    then sees the ids with the drawn token appended): log-probs of each drawn token at the temperature; a step
    run and then undone (transformers' deferred stop check) is dropped; hooks called out of order are refused."""
    logits = [torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]]), torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 5.0]]),
              torch.tensor([[9.0, 0.0, 0.0], [0.0, 9.0, 0.0]])]
    tokens = torch.tensor([[2, 0, 1], [0, 2, 1]])
    ids = torch.zeros(2, 4, dtype=torch.long)  # a 4-token prompt
    rec = rollout_mod._BehaviourLogprobs(4, 0.5)
    for k, z in enumerate(logits):
        assert rec.processor(ids, z) is z  # scores pass through unchanged
        ids = torch.cat([ids, tokens[:, k:k + 1]], 1)
        assert not rec.criterion(ids, None).any() and rec.pending is None  # no row stopped; logits dropped
    got = rec.finish(tokens[:, :2])  # generate returned 2 tokens: the third step was undone
    want = torch.stack([torch.log_softmax(z.double() / 0.5, -1) for z in logits[:2]], 1)
    want = want.gather(-1, tokens[:, :2, None])[..., 0]
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)
    # by hand: z = logits / 0.5; row 0 step 0 picks z = 4 of [0, 2, 4]; row 1 step 1 picks z = 10 of [0, 0, 10]
    assert abs(float(got[0, 0]) + math.log(1 + math.exp(-2) + math.exp(-4))) < 1e-6
    assert abs(float(got[1, 1]) + math.log(1 + 2 * math.exp(-10))) < 1e-6
    rec = rollout_mod._BehaviourLogprobs(4, 1.0)
    with pytest.raises(RuntimeError, match="expected the ids of decoding step 1"):
        rec.criterion(torch.zeros(2, 5, dtype=torch.long), None)  # no logits seen yet
    rec.processor(torch.zeros(2, 4, dtype=torch.long), logits[0])
    with pytest.raises(RuntimeError, match="expected the ids of decoding step 1"):
        rec.criterion(torch.zeros(2, 6, dtype=torch.long), None)  # two tokens appended
    rec.criterion(torch.zeros(2, 5, dtype=torch.long), None)
    with pytest.raises(RuntimeError, match="1 decoding steps recorded for 3 new tokens"):
        rec.finish(tokens)


def test_evaluate_records_no_logprobs(model, tok, monkeypatch):
    """``evaluate`` generates with ``with_logprobs=False``: no recorder is installed (the behaviour log-probs
    are zeros), and the completions are those of the recording path; a bad batch size is refused."""
    installed = []
    real = rollout_mod._generate_with

    def spy(model, ids, attn, config, recorder=None):
        installed.append(recorder)
        return real(model, ids, attn, config, recorder)

    monkeypatch.setattr(rollout_mod, "_generate_with", spy)
    ro = generate(model, tok, PROBLEMS, greedy=True, max_new_tokens=10, with_logprobs=False)
    assert installed == [None] and torch.equal(ro.behaviour_logp, torch.zeros_like(ro.completion_mask))
    again = generate(model, tok, PROBLEMS, greedy=True, max_new_tokens=10)
    assert torch.equal(again.completion_ids, ro.completion_ids) and (again.behaviour_logp[again.completion_mask == 1] < 0).all()
    task = ArithmeticTask(test_size=3)
    evaluate(model, tok, task, greedy=True)
    assert installed[2:] == [None]
    with pytest.raises(ValueError, match="evaluate: batch_size must be a positive int, got 0"):
        evaluate(model, tok, task, batch_size=0)


def test_one_block_and_row_chunks_record_the_same_bits(model, tok, monkeypatch):
    """A small step's log-probs are computed in one block, a large vocabulary's in chunks of ceil(B / 8)
    rows: forcing the chunks on the same draws changes no bit (every operation is per row)."""
    kw = dict(group_size=8, max_new_tokens=10, temperature=0.7)
    got = {}
    assert len(PROBLEMS) * kw["group_size"] * model.config.vocab_size <= rollout_mod._ONE_BLOCK_LOGITS  # one block
    for limit in (rollout_mod._ONE_BLOCK_LOGITS, 0):  # 0: every step in row chunks
        monkeypatch.setattr(rollout_mod, "_ONE_BLOCK_LOGITS", limit)
        torch.manual_seed(5)
        got[limit] = generate(model, tok, PROBLEMS, **kw)
    one, chunked = got.values()
    assert torch.equal(one.completion_ids, chunked.completion_ids)
    assert torch.equal(one.behaviour_logp, chunked.behaviour_logp)
    assert (one.behaviour_logp[one.completion_mask == 1] < 0).all()
