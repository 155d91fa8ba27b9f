"""GMPO, SAPO, KL-Cov and Clip-Cov (issue 30): each surrogate against a float64 transcription of its
paper's equations written here with loops over sequences and tokens (loss and gradient), the on-policy
gradient each one shares with GRPO, the constraints and hyper-parameter checks each one declares, and
the whole-minibatch statistics of the covariance variants.

References (goldens are these float64 loop transcriptions, not package output):
* GMPO, Zhao et al., arXiv 2507.20673, Eq. 4 (and the official code callsys/GMPO): per response,
  J_i = A_i exp(1/|o_i| sum_t sgn(A_i) min(sgn(A_i) l_t, sgn(A_i) clip(l_t, -eps, eps))).
* SAPO, Gao et al., arXiv 2511.20347, §3: per token f(r) A with f(r) = 4/tau sigmoid(tau (r - 1)),
  tau = tau_pos if A > 0 else tau_neg, averaged 1/G sum_i 1/|y_i| sum_t.
* KL-Cov / Clip-Cov, Cui et al., arXiv 2505.22617, "Suppressing Tokens with High Covariances": Cov_t = (A_t - mean A)(log pi_t -
  mean log pi) over the batch's tokens; KL-Cov adds k |log r| on the top ratio * N tokens by Cov and
  does not clip; Clip-Cov removes the gradient of a random ratio * N tokens with Cov in (lb, ub).
"""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from grpo_lab.algo.algorithms import CLIP_COV, GMPO, GRPO, KL_COV, PRESETS, SAPO
from grpo_lab.algo.objectives import batch_statistics, loss_inputs, policy_loss


def _batch(seed: int, B: int = 6, T: int = 5, spread: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.05
    logp = (old + spread * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[1] = 0.0
    lengths = torch.tensor([5, 3, 1, 4, 5, 2][:B])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return logp, old, adv, mask


def _grad(algo, logp, old, adv, mask, **kw):
    lp = logp.clone().requires_grad_()
    out = policy_loss(lp, old, adv, mask, algo, **kw)
    (g,) = torch.autograd.grad(out.loss, lp)
    return out, g


def _ref_grad(ref_fn, logp, old, adv, mask, **kw):
    lp = logp.clone().requires_grad_()
    loss = ref_fn(lp, old, adv, mask, **kw)
    (g,) = torch.autograd.grad(loss, lp)
    return loss.detach(), g


# ---------------------------------------------------------------------------------------------- GMPO
def gmpo_reference(logp, old, adv, mask, eps_low, eps_high):
    """-1/G sum_i J_i, written from GMPO Eq. 4 token by token (float64)."""
    total, G = 0.0, 0
    for i in range(logp.shape[0]):
        n = int(mask[i].sum())
        if n == 0:
            continue
        G += 1
        a = float(adv[i])
        s = math.copysign(1.0, a) if a != 0 else 0.0
        acc = 0.0
        for t in range(n):
            l = logp[i, t] - old[i, t]
            acc = acc + s * torch.minimum(s * l, s * torch.clamp(l, -eps_low, eps_high))
        total = total + a * torch.exp(acc / n)
    return -total / G


@pytest.mark.parametrize("eps", [0.4, 0.05, 1000.0])
def test_gmpo_matches_eq4(eps):
    logp, old, adv, mask = _batch(1, spread=0.5)
    algo = GMPO.replace(eps_low=eps, eps_high=eps)
    out, g = _grad(algo, logp, old, adv, mask)
    ref, g_ref = _ref_grad(gmpo_reference, logp, old, adv, mask, eps_low=eps, eps_high=eps)
    torch.testing.assert_close(out.loss.detach(), ref, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-14)
    if eps == 0.05:  # the clip binds somewhere, on the side the advantage pushes only
        assert out.metrics["clip_frac"] > 0


def test_gmpo_declares_its_constraints():
    with pytest.raises(ValueError, match=r"surrogate='gmpo' \(gmpo_surrogate\) requires ratio_level='token'"):
        GMPO.replace(ratio_level="sequence")
    with pytest.raises(ValueError, match="requires aggregation='seq_mean_token_mean'"):
        GMPO.replace(aggregation="token_mean")
    assert GMPO.replace(eps_low=1000.0).eps_low == 1000.0  # the paper's no-clip ablation is valid
    with pytest.raises(ValueError, match="GMPO clips log r"):
        GMPO.replace(eps_low=-0.1)
    with pytest.raises(ValueError, match=r"ratio floor 1 - eps_low"):  # PPO's own check, unchanged
        GRPO.replace(eps_low=1.5)


# ---------------------------------------------------------------------------------------------- SAPO
def sapo_reference(logp, old, adv, mask, tau_pos, tau_neg):
    total, G = 0.0, 0
    for i in range(logp.shape[0]):
        n = int(mask[i].sum())
        if n == 0:
            continue
        G += 1
        a = float(adv[i])
        tau = tau_pos if a > 0 else tau_neg
        row = 0.0
        for t in range(n):
            r = torch.exp(logp[i, t] - old[i, t])
            row = row + 4.0 / tau * torch.sigmoid(tau * (r - 1.0)) * a
        total = total + row / n
    return -total / G


@pytest.mark.parametrize("taus", [(1.0, 1.05), (0.5, 2.0)])
def test_sapo_matches_the_papers_gate(taus):
    logp, old, adv, mask = _batch(2, spread=0.6)
    algo = SAPO.replace(tau_pos=taus[0], tau_neg=taus[1])
    assert algo.params == {"tau_pos": taus[0], "tau_neg": taus[1]}
    out, g = _grad(algo, logp, old, adv, mask)
    ref, g_ref = _ref_grad(sapo_reference, logp, old, adv, mask, tau_pos=taus[0], tau_neg=taus[1])
    torch.testing.assert_close(out.loss.detach(), ref, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-14)
    assert out.metrics["clip_frac"] == 0.0  # a soft gate cuts nothing
    assert 0 < out.metrics["sapo_weight"] < out.metrics["ratio_max"]  # 4 s (1 - s) r <= r


def test_sapo_temperatures_live_in_params_only():
    assert SAPO.params == {"tau_pos": 1.0, "tau_neg": 1.05}  # the paper's values, filled in
    assert GRPO.params == {} and "tau_pos" not in GRPO.describe() and "tau_pos" not in GRPO.axes()
    assert SAPO.axes()["tau_neg"] == 1.05 and SAPO.describe()["params"] == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert SAPO.replace(surrogate="ppo").params == {}  # dropped with the function that declared them
    with pytest.raises(ValueError, match="tau_neg .* must be > 0"):
        SAPO.replace(tau_neg=0.0)
    with pytest.raises(ValueError, match="tau_pos must be a real number"):
        SAPO.replace(tau_pos="warm")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['tau_neg'\]"):
        GRPO.replace(tau_neg=1.2)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['tau_neg'\]"):
        type(GRPO)(name="x", params={"tau_neg": 1.2})
    assert type(SAPO)(**SAPO.describe()) == SAPO  # rebuilt from its description (checkpoints, provenance)
    with pytest.raises(TypeError, match="read-only"):
        SAPO.params["tau_neg"] = 2.0  # a frozen algorithm's values cannot change under it
    assert SAPO.params["tau_neg"] == 1.05 and pickle.loads(pickle.dumps(SAPO)) == SAPO


# ----------------------------------------------------------------------------------- KL-Cov, Clip-Cov
def _covariances(logp, adv, mask):
    """[(i, t, cov)] over real tokens, row-major, with means over the batch's tokens."""
    toks = [(i, t) for i in range(logp.shape[0]) for t in range(logp.shape[1]) if mask[i, t]]
    a_mean = sum(float(adv[i]) for i, _ in toks) / len(toks)
    l_mean = sum(float(logp[i, t]) for i, t in toks) / len(toks)
    return [(i, t, (float(adv[i]) - a_mean) * (float(logp[i, t]) - l_mean)) for i, t in toks]


def kl_cov_reference(logp, old, adv, mask, ratio, coef):
    covs = _covariances(logp.detach(), adv, mask)
    k = max(1, int(len(covs) * ratio))
    chosen = {(i, t) for i, t, _ in sorted(covs, key=lambda c: -c[2])[:k]}
    total = 0.0
    for i, t, _ in covs:
        l = logp[i, t] - old[i, t]
        term = -torch.exp(l) * float(adv[i])
        if (i, t) in chosen:
            term = term + coef * l.abs()
        total = total + term
    return total / len(covs)  # token mean over the batch (the paper's verl recipe)


@pytest.mark.parametrize("ratio", [2e-3, 0.2])
def test_kl_cov_matches_eq13(ratio):
    logp, old, adv, mask = _batch(3, spread=0.4)
    algo = KL_COV.replace(kl_cov_ratio=ratio, kl_cov_coef=0.5)
    out, g = _grad(algo, logp, old, adv, mask)
    ref, g_ref = _ref_grad(kl_cov_reference, logp, old, adv, mask, ratio=ratio, coef=0.5)
    torch.testing.assert_close(out.loss.detach(), ref, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-14)
    n = int(mask.sum())
    assert out.metrics["kl_cov_selected"] == pytest.approx(max(1, int(n * ratio)) / n)


def clip_cov_reference(logp, old, adv, mask, eps, ratio, lb, ub, seed):
    covs = _covariances(logp.detach(), adv, mask)
    cand = []
    for i, t, c in covs:
        r = math.exp(float(logp[i, t].detach() - old[i, t]))
        a = float(adv[i])
        clipped = -a * min(max(r, 1 - eps), 1 + eps) > -a * r
        if not clipped and lb < c < ub:
            cand.append((i, t))
    torch.manual_seed(seed)
    k = min(max(1, int(ratio * len(covs))), len(cand))
    chosen = {cand[j] for j in torch.randperm(len(cand))[:k].tolist()} if cand else set()
    total = 0.0
    for i, t, _ in covs:
        if (i, t) in chosen:
            continue
        r = torch.exp(logp[i, t] - old[i, t])
        a = float(adv[i])
        total = total - torch.minimum(r * a, torch.clamp(r, 1 - eps, 1 + eps) * a)
    return total / len(covs), chosen


def test_clip_cov_matches_eq12_with_the_same_draw():
    logp, old, adv, mask = _batch(4, spread=0.4)
    adv = adv * 6  # covariances above lb = 1 need large advantages at this size
    algo = CLIP_COV.replace(clip_cov_ratio=0.2, eps_low=0.2, eps_high=0.2)
    torch.manual_seed(7)
    out, g = _grad(algo, logp, old, adv, mask)
    lp = logp.clone().requires_grad_()
    ref, chosen = clip_cov_reference(lp, old, adv, mask, 0.2, 0.2, 1.0, 5.0, seed=7)
    (g_ref,) = torch.autograd.grad(ref, lp)
    assert chosen, "the test batch must give candidate tokens"
    torch.testing.assert_close(out.loss.detach(), ref.detach(), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-14)
    for i, t in chosen:
        assert g[i, t] == 0
    assert out.metrics["clip_cov_detached"] == pytest.approx(len(chosen) / int(mask.sum()))


def test_covariance_variants_check_their_hyperparameters():
    with pytest.raises(ValueError, match=r"kl_cov_ratio .* must be in \(0, 1\]"):
        KL_COV.replace(kl_cov_ratio=0.0)
    with pytest.raises(ValueError, match="kl_cov_coef must be >= 0"):
        KL_COV.replace(kl_cov_coef=-1.0)
    with pytest.raises(ValueError, match="clip_cov_lb must be below clip_cov_ub"):
        CLIP_COV.replace(clip_cov_lb=5.0, clip_cov_ub=1.0)
    with pytest.raises(ValueError, match="requires ratio_level='token'"):
        KL_COV.replace(ratio_level="sequence")
    assert KL_COV.params == {"kl_cov_coef": 1.0, "kl_cov_ratio": 2e-3}
    assert CLIP_COV.params == {"clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0}
    assert CLIP_COV.eps_low == CLIP_COV.eps_high == 1.0  # the authors' verl scripts: PPO's clip off inside [0, 2]


# ---------------------------------------------------------------------------- on-policy and invariance
@pytest.mark.parametrize("algo,aggregation", [(GMPO, "seq_mean_token_mean"), (SAPO, "seq_mean_token_mean"),
                                              (KL_COV, "token_mean")])
def test_on_policy_gradient_is_grpos(algo, aggregation):
    # at r = 1 the geometric mean, the soft gate and |log r| all reduce to the policy gradient A grad log pi
    logp, _, adv, mask = _batch(5)
    _, g = _grad(algo, logp, logp.detach(), adv, mask)
    _, g_grpo = _grad(GRPO.replace(kl=None, beta=0.0, aggregation=aggregation), logp, logp.detach(), adv, mask)
    torch.testing.assert_close(g, g_grpo, rtol=1e-12, atol=1e-15)


def _split_grad(algo, logp, old, adv, mask, rows_per_part, order):
    """The gradient of the loss summed over micro-batches of ``rows_per_part`` rows taken in ``order``,
    with global normalisers and the whole batch's statistics (what the trainer does)."""
    lp = logp.clone().requires_grad_()
    stats = batch_statistics(lp.detach(), old, adv, mask, algo, group_size=2)
    n_tok, n_seq = float(mask.sum()), float((mask.sum(1) > 0).sum())
    group_tokens = mask.sum(1).view(-1, 2).sum(1).repeat_interleave(2).to(torch.float64)
    n_groups = float((group_tokens.view(-1, 2)[:, 0] > 0).sum())
    # a sampler that is not pi_old, for the presets that declare it (TIS, MIS): old - 0.3 |noise|, so rho passes
    # TIS's cap of 2 nowhere and MIS's mask acts on some rows
    behaviour = (old - 0.3 * torch.rand(old.shape, generator=torch.Generator().manual_seed(1), dtype=old.dtype)) * mask
    inputs = {"behaviour_logp": behaviour} if "behaviour_logp" in loss_inputs(algo) else {}
    total = 0.0
    for start in range(0, len(order), rows_per_part):
        idx = order[start:start + rows_per_part]
        out = policy_loss(lp[idx], old[idx], adv[idx], mask[idx], algo, num_tokens=n_tok, num_sequences=n_seq,
                          max_tokens=5, group_tokens=group_tokens[idx], num_groups=n_groups,
                          correct=(adv[idx] > 0), num_correct_tokens=float(mask[adv > 0].sum()),
                          stats={k: v[idx] for k, v in stats.items()}, inputs={k: v[idx] for k, v in inputs.items()})
        total = total + out.loss
    (g,) = torch.autograd.grad(total, lp)
    return g


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_micro_batch_invariant(name):
    # the loss level of the trainer's promise: the same gradient whatever the split and the row order
    algo = PRESETS[name].replace(kl=None, beta=0.0) if PRESETS[name].uses_kl else PRESETS[name]
    if algo.advantage == "gae":  # a per-token advantage stands in for a critic's
        algo = algo.replace(advantage="group")
    logp, old, adv, mask = _batch(6, spread=0.3)
    if name == "CLIP_COV":
        adv = adv * 6
    algo = algo.replace(**({"clip_cov_ratio": 0.2} if name == "CLIP_COV" else {}),
                        **({"kl_cov_ratio": 0.2} if name == "KL_COV" else {}))
    whole_order = torch.arange(6)
    torch.manual_seed(0)
    g_whole = _split_grad(algo, logp, old, adv, mask, 6, whole_order)
    by_length = torch.argsort(mask.sum(1), stable=True)
    for rows, order in [(2, whole_order), (4, whole_order), (2, by_length), (1, by_length)]:
        torch.manual_seed(0)
        g = _split_grad(algo, logp, old, adv, mask, rows, order)
        torch.testing.assert_close(g, g_whole, rtol=1e-10, atol=1e-13)


def test_statistics_per_micro_batch_would_change_the_gradient():
    # why the statistics are computed over the whole minibatch: selecting per micro-batch (what a
    # surrogate alone would do) picks other tokens, so the gradient would depend on the split
    logp, old, adv, mask = _batch(6, spread=0.3)
    algo = KL_COV.replace(kl_cov_ratio=0.2)
    whole = batch_statistics(logp, old, adv, mask, algo)["kl_cov_selected"]
    parts = torch.cat([batch_statistics(logp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], algo)
                       ["kl_cov_selected"] for i in (0, 2, 4)])
    assert whole.shape == mask.shape and not torch.equal(whole, parts)
    assert int(whole.sum()) == max(1, int(int(mask.sum()) * 0.2)) and not (whole & ~mask).any()
    assert batch_statistics(logp, old, adv, mask, GRPO) == {}
