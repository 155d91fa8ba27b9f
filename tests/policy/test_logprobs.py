"""Tests for grpo_lab.policy.logprobs: chunked / fused paths equal the naive float64 formulas."""

import math

import pytest
import torch

from grpo_lab.policy.logprobs import (
    entropy_from_hidden,
    entropy_from_logits,
    token_logprobs,
    token_logprobs_from_hidden,
)

B, T, V, H = 3, 7, 13, 5  # B*T = 21 rows


def naive_logp(logits, ids, temperature=1.0):
    """log softmax(logits / tau) gathered at ids, in float64 — the definition."""
    lsm = torch.log_softmax(logits.double() / temperature, dim=-1)
    return lsm.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def naive_entropy(logits, temperature=1.0):
    """H = -sum_v p_v log p_v in float64 — the definition."""
    p = torch.softmax(logits.double() / temperature, dim=-1)
    return -(p * torch.log(p)).sum(-1)


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, T, V, generator=g) * 3
    ids = torch.randint(0, V, (B, T), generator=g)
    upstream = torch.randn(B, T, generator=g)  # random upstream gradient
    return logits, ids, upstream


# ------------------------------------------------------------------------------------------------
# hand-computed golden value
# ------------------------------------------------------------------------------------------------
def test_golden_uniform_and_two_token():
    # uniform logits over V=4: log p = -log 4 = -1.3862944; entropy = log 4
    logits = torch.zeros(1, 1, 4)
    ids = torch.tensor([[2]])
    assert token_logprobs(logits, ids).item() == pytest.approx(-math.log(4), abs=1e-6)
    assert entropy_from_logits(logits).item() == pytest.approx(math.log(4), abs=1e-6)
    # logits [log 3, 0] -> p = [3/4, 1/4]; log p(0) = log 0.75 = -0.2876821
    # with temperature 2: z = [log 3 / 2, 0] = [log sqrt3, 0] -> p(0) = sqrt3/(sqrt3+1) = 0.6339746
    logits = torch.tensor([[[math.log(3.0), 0.0]]])
    ids = torch.tensor([[0]])
    assert token_logprobs(logits, ids).item() == pytest.approx(math.log(0.75), abs=1e-6)
    s3 = math.sqrt(3.0)
    assert token_logprobs(logits, ids, temperature=2.0).item() == pytest.approx(math.log(s3 / (s3 + 1)), abs=1e-6)
    # entropy of [3/4, 1/4]: -(0.75 ln 0.75 + 0.25 ln 0.25) = 0.5623351
    assert entropy_from_logits(logits).item() == pytest.approx(0.5623351446, abs=1e-6)


# ------------------------------------------------------------------------------------------------
# logits path: chunked == naive (values and gradients)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_size", [None, 1, 4, 5, 8, 21, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.6, 2.5])
def test_token_logprobs_matches_naive(data, chunk_size, temperature):
    logits, ids, up = data
    x = logits.clone().requires_grad_()
    out = token_logprobs(x, ids, temperature=temperature, chunk_size=chunk_size)
    assert out.shape == (B, T) and out.dtype == torch.float32
    (grad,) = torch.autograd.grad((out * up).sum(), x)

    x64 = logits.double().requires_grad_()
    ref = naive_logp(x64, ids, temperature)
    (gref,) = torch.autograd.grad((ref * up.double()).sum(), x64)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad.double(), gref, atol=1e-6, rtol=1e-5)
    assert (out <= 0).all()


@pytest.mark.parametrize("chunk_size", [None, 3, 21])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_entropy_matches_definition(data, chunk_size, temperature):
    logits, _, up = data
    x = logits.clone().requires_grad_()
    ent = entropy_from_logits(x, temperature=temperature, chunk_size=chunk_size)
    (grad,) = torch.autograd.grad((ent * up).sum(), x)
    x64 = logits.double().requires_grad_()
    ref = naive_entropy(x64, temperature)
    (gref,) = torch.autograd.grad((ref * up.double()).sum(), x64)
    torch.testing.assert_close(ent.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad.double(), gref, atol=1e-5, rtol=1e-4)
    assert (ent >= -1e-6).all() and (ent <= math.log(V) + 1e-5).all()


def test_float64_stays_float64_and_exact(data):
    logits, ids, _ = data
    out = token_logprobs(logits.double(), ids, chunk_size=4)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, naive_logp(logits, ids), atol=1e-12, rtol=0)


@pytest.mark.parametrize("chunk_size", [None, 5])
def test_bfloat16_input_returns_float32_close_to_float32_path(data, chunk_size):
    logits, ids, up = data
    lb = logits.bfloat16().requires_grad_()
    out = token_logprobs(lb, ids, chunk_size=chunk_size)
    assert out.dtype == torch.float32
    # same bf16-rounded logits evaluated in float64: the only error is float32 arithmetic
    torch.testing.assert_close(out.double(), naive_logp(lb.detach().double(), ids), atol=1e-5, rtol=1e-5)
    (g,) = torch.autograd.grad((out * up).sum(), lb)
    assert g.dtype == torch.bfloat16
    x64 = lb.detach().double().requires_grad_()
    (gref,) = torch.autograd.grad((naive_logp(x64, ids) * up.double()).sum(), x64)
    torch.testing.assert_close(g.double(), gref, atol=2e-2, rtol=1e-2)  # bf16 rounding of the grad
    ent = entropy_from_logits(lb.detach(), chunk_size=chunk_size)
    assert ent.dtype == torch.float32
    torch.testing.assert_close(ent.double(), naive_entropy(lb.detach().double()), atol=1e-5, rtol=1e-5)


def test_non_viewable_logits_slice(data):
    # logits[:, :-1] of a [B, T+1, V] tensor cannot be viewed as [B*T, V]; must still work
    logits, ids, up = data
    full = torch.cat([logits, torch.randn(B, 1, V)], dim=1).requires_grad_()
    sl = full[:, :-1]
    for chunk in (None, 2, 100):
        out = token_logprobs(sl, ids, chunk_size=chunk)
        (g,) = torch.autograd.grad((out * up).sum(), full)
        torch.testing.assert_close(out.double(), naive_logp(logits, ids), atol=1e-5, rtol=1e-5)
        assert g[:, -1].abs().max() == 0
        full64 = full.detach().double().requires_grad_()
        (gref,) = torch.autograd.grad((naive_logp(full64[:, :-1], ids) * up.double()).sum(), full64)
        torch.testing.assert_close(g.double(), gref, atol=1e-6, rtol=1e-5)


def test_extreme_and_masked_logits_stay_finite():
    logits = torch.tensor([[[1e4, -1e4, 0.0, float("-inf")], [-1e4, -1e4, -1e4, -1e4]]]).requires_grad_()
    ids = torch.tensor([[1, 3 - 3]])
    out = token_logprobs(logits, ids, chunk_size=1)
    # token 1 of row 0 has logit -1e4 vs max 1e4: log p = -2e4 exactly representable
    assert out[0, 0].item() == pytest.approx(-2e4)
    assert out[0, 1].item() == pytest.approx(-math.log(4), abs=1e-6)
    out.sum().backward()
    assert torch.isfinite(logits.grad).all()
    ent = entropy_from_logits(logits.detach().requires_grad_(), chunk_size=None)
    assert torch.isfinite(ent).all()
    # row 0: a single dominant logit (and a -inf entry) -> entropy 0; row 1: uniform -> log 4
    assert ent[0, 0].item() == pytest.approx(0.0, abs=1e-6)
    assert ent[0, 1].item() == pytest.approx(math.log(4), abs=1e-6)


def test_entropy_with_minus_inf_logits_equals_entropy_of_the_rest():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 6, generator=g)
    masked = logits.clone()
    masked[..., 4:] = float("-inf")  # a top-k style mask
    x = masked.clone().requires_grad_()
    ent = entropy_from_logits(x, chunk_size=2)
    torch.testing.assert_close(ent.double(), naive_entropy(logits[..., :4]), atol=1e-5, rtol=1e-5)
    ent.sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad[..., 4:] == 0).all()


def test_empty_batch():
    out = token_logprobs(torch.randn(2, 0, 5), torch.zeros(2, 0, dtype=torch.long))
    assert out.shape == (2, 0)
    out2 = token_logprobs_from_hidden(torch.randn(2, 0, 3), torch.randn(5, 3), torch.zeros(2, 0, dtype=torch.long))
    assert out2.shape == (2, 0)


# ------------------------------------------------------------------------------------------------
# hidden-state path: equals the logits path, values and gradients (hidden, weight, bias)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_size", [1, 4, 5, 21, 1024])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_from_hidden_equals_logits_path(chunk_size, with_bias, temperature):
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64)
    bias = torch.randn(V, generator=g, dtype=torch.float64) if with_bias else None
    ids = torch.randint(0, V, (B, T), generator=g)
    up = torch.randn(B, T, generator=g, dtype=torch.float64)
    leaves = [hidden.requires_grad_(), weight.requires_grad_()] + ([bias.requires_grad_()] if with_bias else [])

    out = token_logprobs_from_hidden(hidden, weight, ids, temperature=temperature, chunk_size=chunk_size, bias=bias)
    grads = torch.autograd.grad((out * up).sum(), leaves)
    ref = naive_logp(torch.nn.functional.linear(hidden, weight, bias), ids, temperature)
    grefs = torch.autograd.grad((ref * up).sum(), leaves)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    for a, b in zip(grads, grefs):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)

    ent = entropy_from_hidden(hidden, weight, temperature=temperature, chunk_size=chunk_size, bias=bias)
    grads = torch.autograd.grad((ent * up).sum(), leaves)
    eref = naive_entropy(torch.nn.functional.linear(hidden, weight, bias), temperature)
    grefs = torch.autograd.grad((eref * up).sum(), leaves)
    torch.testing.assert_close(ent, eref, atol=1e-12, rtol=1e-12)
    for a, b in zip(grads, grefs):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_from_hidden_float32_and_partial_requires_grad():
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(B, T, H, generator=g).requires_grad_()
    weight = torch.randn(V, H, generator=g)  # frozen lm_head
    ids = torch.randint(0, V, (B, T), generator=g)
    out = token_logprobs_from_hidden(hidden, weight, ids, chunk_size=4)
    assert out.dtype == torch.float32
    (gh,) = torch.autograd.grad(out.sum(), hidden)
    h2 = hidden.detach().clone().requires_grad_()
    ref = token_logprobs(h2 @ weight.T, ids)
    (gh2,) = torch.autograd.grad(ref.sum(), h2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gh, gh2, atol=1e-5, rtol=1e-5)


def test_from_hidden_bfloat16():
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(B, T, H, generator=g).bfloat16().requires_grad_()
    weight = torch.randn(V, H, generator=g).bfloat16().requires_grad_()
    ids = torch.randint(0, V, (B, T), generator=g)
    out = token_logprobs_from_hidden(hidden, weight, ids, chunk_size=5)
    assert out.dtype == torch.float32
    ref = token_logprobs(hidden @ weight.T, ids)  # naive path, same bf16 matmul
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    gh, gw = torch.autograd.grad(out.sum(), [hidden, weight])
    gh2, gw2 = torch.autograd.grad(ref.sum(), [hidden, weight])
    assert gh.dtype == gw.dtype == torch.bfloat16
    torch.testing.assert_close(gh.float(), gh2.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(gw.float(), gw2.float(), atol=5e-2, rtol=2e-2)


def test_from_hidden_never_saves_a_full_logits_tensor():
    """Autograd must not keep any [B, T, V]-sized tensor for backward (memory bound)."""
    b, t, v, h = 4, 16, 500, 8
    hidden = torch.randn(b, t, h, requires_grad=True)
    weight = torch.randn(v, h, requires_grad=True)
    ids = torch.randint(0, v, (b, t))
    sizes = []

    def pack(x):
        sizes.append(x.numel())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = token_logprobs_from_hidden(hidden, weight, ids, chunk_size=8)
    assert max(sizes) < b * t * v / 4, sizes
    out.sum().backward()

    # the naive path does save full-size tensors (sanity check that the probe works)
    sizes.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        token_logprobs(torch.nn.functional.linear(hidden, weight), ids)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        torch.log_softmax(torch.nn.functional.linear(hidden, weight), -1)
    assert max(sizes) >= b * t * v


def test_logits_path_saves_only_input_and_per_row_stats():
    logits = torch.randn(B, T, V, requires_grad=True)
    ids = torch.randint(0, V, (B, T))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x) or x, lambda x: x):
        token_logprobs(logits, ids, chunk_size=4)
    big = [x for x in saved if x.numel() >= B * T * V]
    # the only full-size saved tensor is the input itself (no new float32 [B,T,V] copy)
    assert all(x.data_ptr() == logits.data_ptr() for x in big)


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_temperature(data, temperature):
    logits, ids, _ = data
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, ids, temperature=temperature)
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(logits, temperature=temperature)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_from_hidden(torch.randn(B, T, H), torch.randn(V, H), ids, temperature=temperature)


@pytest.mark.parametrize("chunk_size", [0, -3, 2.5, True])
def test_bad_chunk_size(data, chunk_size):
    logits, ids, _ = data
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(logits, ids, chunk_size=chunk_size)
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs_from_hidden(torch.randn(B, T, H), torch.randn(V, H), ids, chunk_size=chunk_size)


def test_hidden_chunk_size_none_rejected(data):
    _, ids, _ = data
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs_from_hidden(torch.randn(B, T, H), torch.randn(V, H), ids, chunk_size=None)


def test_bad_ids(data):
    logits, ids, _ = data
    with pytest.raises(ValueError, match="shape mismatch"):
        token_logprobs(logits, ids[:, :-1])
    with pytest.raises(ValueError, match=r"\[0, 13\)"):
        token_logprobs(logits, torch.full((B, T), V))
    with pytest.raises(ValueError, match=r"\[0, 13\)"):
        token_logprobs(logits, torch.full((B, T), -100))
    with pytest.raises(ValueError, match="integer"):
        token_logprobs(logits, ids.float())
    with pytest.raises(ValueError, match="floating"):
        token_logprobs(logits.long(), ids)


def test_bad_hidden_shapes(data):
    _, ids, _ = data
    with pytest.raises(ValueError, match="shape mismatch"):
        token_logprobs_from_hidden(torch.randn(B, T, H + 1), torch.randn(V, H), ids)
    with pytest.raises(ValueError, match="bias"):
        token_logprobs_from_hidden(torch.randn(B, T, H), torch.randn(V, H), ids, bias=torch.randn(V + 1))
    with pytest.raises(ValueError, match=r"\[V, H\]"):
        token_logprobs_from_hidden(torch.randn(B, T, H), torch.randn(V, H, 1), ids)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(data):
    logits, ids, up = data
    for chunk in (None, 4):
        x = logits.cuda().requires_grad_()
        out = token_logprobs(x, ids.cuda(), temperature=0.7, chunk_size=chunk)
        (g,) = torch.autograd.grad((out * up.cuda()).sum(), x)
        x2 = logits.clone().requires_grad_()
        ref = token_logprobs(x2, ids, temperature=0.7, chunk_size=chunk)
        (g2,) = torch.autograd.grad((ref * up).sum(), x2)
        torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(g.cpu(), g2, atol=1e-5, rtol=1e-5)
    hid = torch.randn(B, T, H, device="cuda", requires_grad=True)
    w = torch.randn(V, H, device="cuda", requires_grad=True)
    out = token_logprobs_from_hidden(hid, w, ids.cuda(), chunk_size=4)
    ref = token_logprobs(hid @ w.T, ids.cuda())
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_size", [None, 4])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_inputs_are_not_modified(data, dtype, chunk_size, temperature):
    logits, ids, _ = data
    x = logits.to(dtype).requires_grad_()
    before = x.detach().clone()
    token_logprobs(x, ids, temperature=temperature, chunk_size=chunk_size).sum().backward()
    entropy_from_logits(x, temperature=temperature, chunk_size=chunk_size).sum().backward()
    assert torch.equal(x.detach(), before)
    h, w = torch.randn(B, T, H, dtype=dtype), torch.randn(V, H, dtype=dtype)
    hb, wb = h.clone(), w.clone()
    token_logprobs_from_hidden(h, w, ids, temperature=temperature, chunk_size=chunk_size or 1024)
    assert torch.equal(h, hb) and torch.equal(w, wb)


# ------------------------------------------------------------------------------------------------
# undefined log-probs are an error naming the position (issue 8, item 7)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_size", [None, 2])
@pytest.mark.parametrize("poison", ["nan", "all_minus_inf"])
def test_undefined_logprob_raises_naming_the_position(data, chunk_size, poison):
    logits, ids, _ = data
    bad = logits.clone()
    if poison == "nan":
        bad[1, 4, 3] = float("nan")  # one NaN logit poisons the whole row's log-sum-exp
    else:
        bad[1, 4, :] = float("-inf")  # no token has any probability
    with pytest.raises(ValueError, match=r"position \(1, 4\)"):
        token_logprobs(bad, ids, chunk_size=chunk_size)


def test_undefined_logprob_from_hidden_raises_naming_the_position(data):
    _, ids, _ = data
    g = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(B, T, H, generator=g), torch.randn(V, H, generator=g)
    hidden[2, 0, 1] = float("nan")
    with pytest.raises(ValueError, match=r"position \(2, 0\)"):
        token_logprobs_from_hidden(hidden, weight, ids, chunk_size=4)


def test_minus_inf_logprob_of_an_impossible_token_is_not_an_error():
    # a -inf logit at the chosen id (a top-k masked token) is a well-defined log-prob of -inf
    logits = torch.tensor([[[0.0, float("-inf"), 1.0]]])
    out = token_logprobs(logits, torch.tensor([[1]]))
    assert out.item() == float("-inf")
