"""The torch.compile'd chunked path (``compile=True``) equals the eager chunked path.

Compiling costs tens of seconds on 2 CPU cores, so every test here uses the same dtype (float32),
vocabulary size and device: the four kernels (forward / backward x log-prob / entropy) are
compiled once per process (``grpo_lab.policy.logprobs`` caches them) and reused by all tests, plus one
extra graph per kernel for a chunk of a single row (torch specialises size-1 dimensions).
"""

import shutil

import pytest
import torch

from grpo_lab.policy import logprobs as lp_mod
from grpo_lab.policy.logprobs import entropy_from_hidden, token_logprobs_from_hidden

B, T, V, H = 3, 7, 13, 5  # B*T = 21 rows

# importing inductor triggers torch's own deprecation warning for torch.jit.script_method
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

needs_compiler = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
    reason="torch.compile on CPU needs a C++ compiler",
)


def _inputs(seed, with_bias=True, b=B, t=T):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, H, generator=g)
    weight = torch.randn(V, H, generator=g) * 0.7
    bias = torch.randn(V, generator=g) if with_bias else None
    ids = torch.randint(0, V, (b, t), generator=g)
    up = torch.randn(b, t, generator=g)
    return hidden, weight, bias, ids, up


def _value_and_grads(fn, hidden, weight, bias, args, up, **kw):
    leaves = [x.detach().clone().requires_grad_() for x in (hidden, weight) + ((bias,) if bias is not None else ())]
    h, w = leaves[0], leaves[1]
    b = leaves[2] if bias is not None else None
    out = fn(h, w, *args, bias=b, **kw)
    grads = torch.autograd.grad((out * up).sum(), leaves)
    return out, grads


@pytest.mark.slow
@needs_compiler
@pytest.mark.parametrize("chunk_size,temperature", [(4, 1.0), (5, 0.8), (64, 1.3)])
@pytest.mark.parametrize("kind", ["logp", "entropy"])
def test_compiled_equals_eager(kind, chunk_size, temperature):
    # chunk 4 on 21 rows leaves a last chunk of 1 row; 5 leaves 1 too; 64 is one chunk of 21
    hidden, weight, bias, ids, up = _inputs(0)
    fn, args = (token_logprobs_from_hidden, (ids,)) if kind == "logp" else (entropy_from_hidden, ())
    kw = dict(temperature=temperature, chunk_size=chunk_size)
    out_c, g_c = _value_and_grads(fn, hidden, weight, bias, args, up, compile=True, **kw)
    out_e, g_e = _value_and_grads(fn, hidden, weight, bias, args, up, compile=False, **kw)
    assert out_c.dtype == torch.float32 and out_c.shape == (B, T)
    torch.testing.assert_close(out_c, out_e, atol=1e-5, rtol=1e-5)
    for a, b in zip(g_c, g_e):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@needs_compiler
def test_compiled_non_viewable_slice_frozen_head_and_masked_vocab():
    """hidden[:, :-1] (chunked per sequence), a frozen lm_head, and -inf logits from the bias."""
    hidden, weight, bias, ids, up = _inputs(1, b=B, t=T + 1)
    bias[3] = float("-inf")  # a masked vocabulary entry: p = 0, no NaN in values or gradients
    ids = ids.masked_fill(ids == 3, 4)
    h_full = hidden.clone().requires_grad_()
    res = {}
    for compiled in (True, False):
        h = h_full[:, :-1]  # not viewable as [1, B*T, H]
        out = token_logprobs_from_hidden(h, weight, ids[:, :-1], chunk_size=3, bias=bias, compile=compiled)
        ent = entropy_from_hidden(h, weight, chunk_size=3, bias=bias, compile=compiled)
        (gh,) = torch.autograd.grad((out * up[:, :-1]).sum() + ent.sum(), h_full)
        assert torch.isfinite(out).all() and torch.isfinite(ent).all() and torch.isfinite(gh).all()
        res[compiled] = (out, ent, gh)
    for a, b in zip(res[True], res[False]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@needs_compiler
def test_new_row_counts_do_not_recompile():
    """The row dimension is dynamic: other batch / sequence / chunk sizes reuse the graphs."""
    hidden, weight, bias, ids, up = _inputs(2)
    h = hidden.clone().requires_grad_()
    token_logprobs_from_hidden(h, weight, ids, chunk_size=8, bias=bias, compile=True).sum().backward()  # warm
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for b, t, chunk in ((2, 11, 6), (5, 9, 7), (1, 40, 16)):  # no chunk of 1 row
        hidden, _, _, ids, up = _inputs(3, b=b, t=t)
        h = hidden.requires_grad_()
        out = token_logprobs_from_hidden(h, weight, ids, chunk_size=chunk, bias=bias, compile=True)
        (out * up).sum().backward()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before
    assert set(lp_mod._CK_COMPILED) <= {(d, k) for d in ("forward", "backward") for k in ("logp", "entropy")}


@pytest.mark.slow
@needs_compiler
def test_compiled_nan_logprob_still_raises():
    hidden, weight, bias, ids, _ = _inputs(4)
    hidden[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match=r"position \(1, 2\)"):
        token_logprobs_from_hidden(hidden, weight, ids, chunk_size=4, bias=bias, compile=True)


@pytest.mark.parametrize("bad", [1, 0, "yes", None])
def test_compile_flag_must_be_bool(bad):
    hidden, weight, bias, ids, _ = _inputs(5)
    with pytest.raises(ValueError, match="compile must be True or False"):
        token_logprobs_from_hidden(hidden, weight, ids, compile=bad)
    with pytest.raises(ValueError, match="compile must be True or False"):
        entropy_from_hidden(hidden, weight, compile=bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_cuda_bfloat16_matches_eager():
    """On CUDA (Triton kernels), bfloat16 inputs, temperature != 1: compiled == eager chunked path."""
    g = torch.Generator().manual_seed(6)
    v, h = 1000, 64
    hidden = torch.randn(4, 37, h, generator=g).bfloat16().cuda()
    weight = (torch.randn(v, h, generator=g) * h**-0.5).bfloat16().cuda()
    ids = torch.randint(0, v, (4, 37), generator=g).cuda()
    up = torch.randn(4, 37, generator=g).cuda()
    res = {}
    for compiled in (True, False):
        hh, ww = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        out = token_logprobs_from_hidden(hh, ww, ids, temperature=0.7, chunk_size=32, compile=compiled)
        ent = entropy_from_hidden(hh, ww, temperature=0.7, chunk_size=32, compile=compiled)
        gh, gw = torch.autograd.grad((out * up).sum() + ent.sum(), [hh, ww])
        assert gh.dtype == gw.dtype == torch.bfloat16
        res[compiled] = (out, ent, gh.float(), gw.float())
    for a, b in zip(res[True], res[False]):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)
