"""DeepSeek-V3.2's Keep Sampling Mask (arXiv 2512.02556, §3.1): the sampler's top-p / top-k kept set, recorded per
token by ``generate`` (``Rollout.kept_ids``), applied when the trainer scores π_θ, π_old and π_ref
(``Algorithm.keep_sampling_mask``). References are float64 transcriptions of the rule written here from the
definitions (top-k: the k largest logits with their ties; top-p: a token is kept when the probability ranked before
it is below p), and transformers' own warpers as an oracle on tie-free logits."""

import pytest
import torch

from _toys import TINY, HalfTask
from grpo_lab.algo.algorithms import GRPO, deepseek_v32
from grpo_lab.algo.objectives import policy_loss
from grpo_lab.policy.logprobs import restrict_to_kept, sampling_kept_ids, token_logprobs
from grpo_lab.policy.models import tiny_policy
from grpo_lab.policy.rollout import Rollout, generate, policy_logprobs
from grpo_lab.tasks import Problem
from grpo_lab.training.collection import concat_rollouts
from grpo_lab.training.trainer import Trainer, TrainerConfig

PROBLEMS = [Problem("1+2=", "3"), Problem("9+9+9+9+9+9=", "54"), Problem("12+3=", "15")]
SETTINGS = [dict(top_p=0.9), dict(top_p=0.5), dict(top_k=5), dict(top_p=0.9, top_k=10)]


def _kept64(z: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """float64 reference of the kept set of one row ``z`` (already divided by the temperature), a bool [V]."""
    V = len(z)
    order = sorted(range(V), key=lambda v: -float(z[v]))
    n = top_k if 0 < top_k < V else V
    prefix = order[:n]
    p = torch.softmax(z[prefix].double(), 0).tolist()
    last, before = 0, 0.0
    for j in range(n):  # a token is kept while the mass ranked before it is < top_p (the first always)
        if before < top_p:
            last = j
        before += p[j]
    if top_p >= 1.0:
        last = n - 1
    thr = float(z[order[last]])
    return z >= thr  # with the ties of the last kept token


@pytest.mark.parametrize("kw", SETTINGS + [dict(top_p=0.3, top_k=3)], ids=str)
def test_kept_set_matches_float64_rule_with_ties(kw):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 40, generator=g)
    z[:8, 1:4] = z[:8, :1]  # ties with the largest logit
    z[8:16] = torch.round(z[8:16] * 2) / 2  # many ties everywhere
    kept = sampling_kept_ids(z * 0.7, temperature=0.7, **kw)
    assert kept.dtype == torch.int32 and kept.shape[0] == 64
    for b in range(64):
        want = _kept64((z[b] * 0.7) / 0.7, kw.get("top_p", 1.0), kw.get("top_k", 0))
        ids = kept[b][kept[b] >= 0].long()
        got = torch.zeros(40, dtype=torch.bool)
        got[ids] = True
        assert torch.equal(got, want), b
        assert len(set(ids.tolist())) == len(ids)  # no id twice
    assert (kept[..., 0] >= 0).all()  # at least one token kept per row


@pytest.mark.parametrize("kw", SETTINGS, ids=str)
def test_kept_set_agrees_with_transformers_warpers_without_ties(kw):
    from transformers import TopKLogitsWarper, TopPLogitsWarper
    z = torch.randn(128, 52, generator=torch.Generator().manual_seed(1)) * 2
    s = z.clone()
    if kw.get("top_k"):
        s = TopKLogitsWarper(kw["top_k"])(None, s)
    if kw.get("top_p"):
        s = TopPLogitsWarper(kw["top_p"])(None, s)
    kept = restrict_to_kept(z, sampling_kept_ids(z, **kw))
    assert torch.equal(torch.isfinite(kept), torch.isfinite(s))


def test_restricted_logprob_is_the_truncated_distribution_float64():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 5, 30, generator=g, requires_grad=True)
    kept = sampling_kept_ids(logits.detach(), temperature=0.8, top_p=0.7)
    kept[0, 0] = -1  # a padding position (no kept id): the whole row
    ids = torch.randint(0, 30, (3, 5), generator=g)
    m = restrict_to_kept(logits.detach(), kept)
    ids = torch.where(torch.isfinite(m.gather(-1, ids[..., None]))[..., 0], ids, m.argmax(-1))  # tokens in the set
    lp = token_logprobs(restrict_to_kept(logits, kept), ids, temperature=0.8)
    z = logits.detach().double() / 0.8
    ref = torch.empty(3, 5, dtype=torch.float64)
    for b in range(3):
        for t in range(5):
            ks = [int(k) for k in kept[b, t] if k >= 0] or list(range(30))
            ref[b, t] = z[b, t, ids[b, t]] - torch.logsumexp(z[b, t, ks], 0)
    torch.testing.assert_close(lp.double(), ref, rtol=0, atol=1e-6)
    lp.sum().backward()
    outside = ~torch.isfinite(restrict_to_kept(logits.detach(), kept))
    assert outside.any() and (logits.grad[outside] == 0).all() and (logits.grad[~outside] != 0).any()


def test_restrict_errors():
    with pytest.raises(ValueError, match="leading shapes"):
        restrict_to_kept(torch.zeros(2, 3, 5), torch.zeros(2, 4, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        restrict_to_kept(torch.zeros(2, 5), torch.full((2, 1), 5, dtype=torch.int32))
    with pytest.raises(ValueError, match="top_p"):
        sampling_kept_ids(torch.zeros(2, 5), top_p=0.0)
    with pytest.raises(ValueError, match="TrainerConfig.top_k"):
        TrainerConfig(top_k=-1)
    with pytest.raises(ValueError, match="TrainerConfig.top_p"):
        TrainerConfig(top_p=1.5)
    assert sampling_kept_ids(torch.zeros(2, 5), top_p=1.0, top_k=5) is None  # top_k >= V truncates nothing


@pytest.fixture(scope="module")
def model(tok):
    return tiny_policy(tok, TINY, seed=0).eval()


@pytest.mark.parametrize("kw", SETTINGS, ids=str)
def test_generate_records_kept_set_and_truncated_logprobs(model, tok, kw):
    torch.manual_seed(0)
    ro = generate(model, tok, PROBLEMS, group_size=4, max_new_tokens=12, temperature=0.9, **kw)
    real = ro.completion_mask == 1
    kept = ro.kept_ids
    assert kept.dtype == torch.int32 and kept.shape[:2] == ro.completion_ids.shape
    assert (kept[~real] == -1).all() and (kept[real][:, 0] >= 0).all()
    assert ((kept == ro.completion_ids[..., None]).any(-1) | ~real).all()  # every drawn token is in its kept set
    if kw.get("top_k"):
        assert kept.shape[2] <= kw["top_k"] + 2  # ties aside
    # float64 reference from the training forward's logits: log-softmax over the kept set only
    ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
    attn = torch.cat([ro.prompt_mask, ro.completion_mask.long()], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                       use_cache=False).logits[:, -ro.completion_ids.shape[1] - 1:-1].double() / 0.9
    inside = torch.zeros_like(logits, dtype=torch.bool)
    for b, t, k in (kept >= 0).nonzero().tolist():
        inside[b, t, kept[b, t, k]] = True
    ref = torch.log_softmax(logits.masked_fill(~inside, float("-inf")), -1).gather(-1, ro.completion_ids[..., None])
    torch.testing.assert_close(ro.behaviour_logp[real].double(), ref[..., 0][real], rtol=0, atol=1e-5)
    with torch.no_grad():
        masked = policy_logprobs(model, ro, keep_mask=True)
        full = policy_logprobs(model, ro)
    torch.testing.assert_close(masked, ro.behaviour_logp, rtol=0, atol=1e-5)
    assert (full - ro.behaviour_logp)[real].abs().max() > 0.05  # the sampler's distribution is not the full one


def test_no_truncation_records_nothing_and_changes_nothing(model, tok):
    torch.manual_seed(0)
    a = generate(model, tok, PROBLEMS, group_size=2, max_new_tokens=8)
    torch.manual_seed(0)
    b = generate(model, tok, PROBLEMS, group_size=2, max_new_tokens=8, top_p=1.0, top_k=0)
    assert a.kept_ids is None and b.kept_ids is None
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.behaviour_logp, b.behaviour_logp)
    with torch.no_grad():
        assert torch.equal(policy_logprobs(model, a, keep_mask=True), policy_logprobs(model, a))
    torch.manual_seed(0)  # greedy ignores top-p / top-k
    assert generate(model, tok, PROBLEMS, greedy=True, max_new_tokens=4, top_p=0.5).kept_ids is None


def test_kept_ids_survive_select_and_concat(model, tok):
    torch.manual_seed(0)
    ro = generate(model, tok, PROBLEMS, group_size=2, max_new_tokens=10, top_p=0.9)
    torch.manual_seed(1)
    other = generate(model, tok, PROBLEMS[:1], group_size=2, max_new_tokens=6, top_k=3)
    part = ro.select([4, 1])
    T = part.completion_ids.shape[1]
    k = part.kept_ids.shape[2]
    assert torch.equal(part.kept_ids, ro.kept_ids[[4, 1], :T, :k])
    assert (ro.kept_ids[[4, 1], :T, k:] == -1).all() and (part.kept_ids >= 0).sum(-1).max() == k
    both = concat_rollouts([part, other], tok.pad_token_id)
    assert both.kept_ids.shape == (4, both.completion_ids.shape[1], max(k, other.kept_ids.shape[2]))
    for got, src in ((both.kept_ids[:2], part.kept_ids), (both.kept_ids[2:], other.kept_ids)):
        t, kk = src.shape[1:]
        assert torch.equal(got[:, :t, :kk], src) and (got[:, t:] == -1).all() and (got[:, :, kk:] == -1).all()
    with torch.no_grad():  # the same log-probs for a row whatever the padding around it
        torch.testing.assert_close(policy_logprobs(model, both, keep_mask=True)[:2, :T],
                                   policy_logprobs(model, part, keep_mask=True), rtol=0, atol=1e-6)
    plain = Rollout(**{**part.__dict__, "kept_ids": None})
    with pytest.raises(ValueError, match="kept sets"):
        concat_rollouts([part, plain], tok.pad_token_id)


def _ratios(tok, algo, *, old_logp, **cfg):
    """(log π_θ - log π_old, log π_θ - log π_ref) on the loss tokens of every micro-batch of one rollout, two
    epochs of two minibatches, the weights never changed (the optimiser step is a no-op)."""
    config = TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=10, eval_every=0, progress=False,
                           seed=0, minibatches=2, epochs=2, old_logp=old_logp, **cfg)
    seen = []

    def loss_fn(logp, old, adv, mask, algo, **kw):
        ref = kw.get("ref_logp")
        m = mask.bool()
        seen.append(((logp - old).detach()[m], None if ref is None else (logp - ref).detach()[m]))
        return policy_loss(logp, old, adv, mask, algo, **kw)

    tr = Trainer(tiny_policy(tok, TINY, seed=0), tok, HalfTask(test_size=5), algo, config, loss_fn=loss_fn)
    tr.optimizer.step = lambda *a, **k: None
    tr.train(1)
    assert len(seen) == 4
    return torch.cat([s[0] for s in seen]), (torch.cat([s[1] for s in seen]) if seen[0][1] is not None else None)


@pytest.mark.parametrize("kw", [dict(top_p=0.9), dict(top_k=5), dict(top_p=0.8, top_k=8)], ids=str)
def test_ratio_is_one_with_the_mask(tok, kw):
    algo = deepseek_v32(beta=0.01, delta=0.5, eps=0.2)  # keep_sampling_mask=True, a KL term against π_ref
    assert algo.keep_sampling_mask
    lr_old, lr_ref = _ratios(tok, algo, old_logp="recompute", **kw)
    assert lr_old.numel() > 0 and (lr_old == 0).all()  # exactly 1, every token, every epoch
    assert (lr_ref == 0).all()  # π_ref on the same kept set: the KL starts at exactly 0
    lr_old, _ = _ratios(tok, algo, old_logp="behaviour", **kw)
    assert lr_old.abs().max() < 1e-5  # the sampler's own arithmetic (KV cache): float32 rounding only
    # without the mask, π_θ is the full softmax and the behaviour log-probs the truncated one
    no_mask, _ = _ratios(tok, algo.replace(keep_sampling_mask=False), old_logp="behaviour", **kw)
    assert no_mask.abs().max() > 0.05 and (no_mask <= 1e-6).all()  # log π_θ(full) <= log π(truncated)


def _second_step_grads(tok, algo, **cfg):
    config = TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=0, progress=False,
                           lr=3e-3, seed=0, minibatches=2, top_p=0.8, top_k=10, **cfg)
    tr = Trainer(tiny_policy(tok, TINY, seed=0), tok, HalfTask(test_size=5), algo, config)
    grads, step = [], tr.optimizer.step

    def wrapped(*a, **k):
        grads.append([p.grad.clone() for p in tr.policy.parameters() if p.grad is not None])
        return step(*a, **k)

    tr.optimizer.step = wrapped
    torch.manual_seed(1)
    tr.train(1)
    return grads[-1]


@pytest.mark.parametrize("algo", [GRPO.replace(keep_sampling_mask=True), deepseek_v32(beta=0.01, delta=0.5, eps=0.2)],
                         ids=["GRPO+mask", "V3.2"])
def test_masked_update_is_micro_batch_invariant(tok, algo):
    whole = _second_step_grads(tok, algo)
    masked_off = _second_step_grads(tok, algo.replace(keep_sampling_mask=False))
    assert any((a - b).abs().max() > 1e-6 for a, b in zip(whole, masked_off))  # the mask acts
    for cfg in (dict(micro_batch_size=3), dict(micro_batch_size=1)):
        for a, b in zip(whole, _second_step_grads(tok, algo, **cfg)):
            torch.testing.assert_close(b, a, atol=1e-7, rtol=1e-4)


def test_set_reaches_top_p_top_k_and_the_mask():
    from grpo_lab.cli.main import parse_set
    cfg, algo = parse_set(["top_p=0.95", "top_k=20", "keep_sampling_mask=true"])
    assert cfg == {"top_p": 0.95, "top_k": 20} and algo == {"keep_sampling_mask": True}
    assert TrainerConfig(**cfg).top_p == 0.95 and GRPO.replace(**algo).axes()["keep_sampling_mask"] is True
