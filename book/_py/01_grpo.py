# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# (sec-grpo)=
# # GRPO: group-relative policy optimisation
#
# **The problem.** PPO fine-tunes a language model with a learned value function as its baseline: a
# second network as large as the policy, trained alongside it, whose errors leak into every
# advantage. For tasks whose reward arrives once, at the end of a response (a verified answer), that
# critic is expensive and hard to train. GRPO {cite:p}`shao2024deepseekmath` drops it: it samples a
# *group* of $G$ responses to the same question and scores each response against the others.
#
# **Which axes it sets** (see the table in {ref}`sec-intro`): advantage = group z-score; ratio =
# per token; clipping = PPO's, symmetric; aggregation = mean over tokens, then over sequences;
# regulariser = the $k_3$ estimator of $\KL[\pitheta\|\piref]$ *in the loss*. Every later chapter
# changes one or two of these choices, so this chapter derives each of them.
#
# **Prerequisites:** {ref}`sec-notation`. **Run time:** {glue:text}`grpo_runtime` on two CPU cores
# (profile `cpu`, measured on the last execution). With `PROFILE = "gpu"` the chapter also trains GRPO
# on GSM8K from a hub instruct model ({ref}`sec-grpo-scale`: hours, not minutes).

# %% tags=["remove-cell"]
# Colab set-up, written by scripts/colab_cell.py from _config.yml's repository.url (edit there, then run it):
# clone the repository (the chapters need its data/ folder) and install the package with the extras the
# chapters need, pinned as CI pins them (scripts/colab_setup.py). $GRPO_LAB_REPO_URL overrides the URL (a fork,
# a local path), $GRPO_LAB_COLAB_ROOT the folder of the clone.
import os
import subprocess
import sys

if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    _root = os.environ.get("GRPO_LAB_COLAB_ROOT", "/content/grpo_lab")
    if not os.path.isdir(_root):
        _url = os.environ.get("GRPO_LAB_REPO_URL", "https://github.com/grpo-lab/grpo_lab")
        subprocess.run(["git", "clone", "-q", "--depth", "1", _url, _root], check=True)
    subprocess.run([sys.executable, os.path.join(_root, "scripts", "colab_setup.py"), _root], check=True)
    sys.path.insert(0, _root)

# %% tags=["parameters"]
PROFILE = "cpu"  # "gpu": also train §1.8's GSM8K comparison on a hub instruct model (CUDA)
GPU_SEEDS = (0, 1, 2, 3, 4)  # the GSM8K runs (PROFILE = "gpu" only)
GPU_STEPS = None  # None: the gpu profile's 60 steps
GPU_N_JOBS = 1  # GSM8K runs at a time, processes sharing the GPU
SEEDS = (0, 1, 2, 3, 4)
N_JOBS = 2  # worker processes, one seed each; results do not depend on it

# %% tags=["hide-input"]
import math
import time

import numpy as np
import pandas as pd
import torch
import matplotlib.pyplot as plt

from grpo_lab.lab import book
from grpo_lab.experiments import plotting, stats
from grpo_lab.algo.advantages import group_advantages
from grpo_lab.algo.algorithms import GRPO
from grpo_lab.algo.objectives import kl_estimate, policy_loss

book.setup_notebook(seed=0, profile=PROFILE)
CHAPTER_START = time.perf_counter()
torch.set_default_dtype(torch.float32)

# %% [markdown]
# ## 1.1 Why a baseline, and why a group
#
# The policy gradient {cite:p}`williams1992reinforce` of the expected reward of responses $o$ to a
# question $q$ is
#
# $$
# \nabla_\theta J(\theta) = \E_{q}\,\E_{o\sim\pitheta(\cdot\given q)}\big[(R(q,o) - b(q))\,\nabla_\theta \log\pitheta(o\given q)\big]
# $$ (eq-grpo-pg)
#
# for **any** baseline $b(q)$ that does not depend on the sampled $o$, because
#
# $$
# \E_{o\sim\pitheta}\big[b(q)\,\nabla_\theta\log\pitheta(o\given q)\big] = b(q)\,\nabla_\theta \sum_o \pitheta(o\given q) = b(q)\,\nabla_\theta 1 = 0 .
# $$ (eq-grpo-baseline)
#
# The baseline does not change the expected gradient; it changes its variance. PPO learns $b$ as a
# value network. GRPO estimates it from the group: the mean reward of the $G$ responses to the same
# question. Before deriving anything else, here is what the baseline buys, computed exactly on the
# smallest possible "language model": one question, four possible responses, a softmax policy
# $\pi = \mathrm{softmax}(\theta)$, rewards $R = (1, 1, 0, 1)$ (an easy question: most
# responses are right). For a softmax, $\nabla_\theta\log\pi(o) = e_o - \pi$. We draw 20,000
# groups of $G=8$ responses and compare three single-group gradient estimates.

# %%
rng = np.random.default_rng(0)
theta = np.array([0.5, 1.0, 0.0, -1.0])
pi = np.exp(theta) / np.exp(theta).sum()
R = np.array([1.0, 1.0, 0.0, 1.0])
grad_logp = np.eye(4) - pi  # row o: gradient of log pi(o) w.r.t. theta
exact = (pi[:, None] * R[:, None] * grad_logp).sum(0)  # the true policy gradient

G, N = 8, 20000
groups = rng.choice(4, size=(N, G), p=pi)  # N independent groups of G responses
r = R[groups]
estimators = {
    "no baseline": r,
    "group mean (Dr.GRPO)": r - r.mean(1, keepdims=True),
    "leave-one-out mean (RLOO)": r - (r.sum(1, keepdims=True) - r) / (G - 1),
}
rows, means = [], {}
for name, weight in estimators.items():
    g = (weight[..., None] * grad_logp[groups]).mean(1)  # one gradient estimate per group
    means[name] = g.mean(0)
    rows.append({"estimator": name,
                 "mean error": float(np.abs(g.mean(0) - exact).max()),
                 "total variance": float(g.var(0).sum())})
baselines = pd.DataFrame(rows).set_index("estimator")
print(f"exact gradient: {np.round(exact, 4)}")
print(baselines.round(4).to_string())

# %% [markdown]
# Both baselines cut the variance of the gradient estimate by a large factor (the last column) at
# no cost: no critic network, just $G$ samples of the same question. The leave-one-out mean (an
# old idea, brought to LLM fine-tuning as RLOO by {cite:t}`ahmadian2024rloo`) is exactly unbiased. The plain group mean includes the response
# itself, which shrinks every weight by $(G-1)/G$: its "error" above is exactly that factor
# ($\tfrac18$ of the gradient), a constant absorbed by the learning rate, not noise. This is
# Dr.GRPO's estimator. GRPO's is not in the table on purpose: it also divides by the group's
# standard deviation, a factor computed from the same samples, so its expected gradient is not
# $(G-1)/G\cdot\nabla J$ but a version re-weighted by question difficulty; {ref}`sec-drgrpo`
# derives that bias and the length bias of {eq}`eq-grpo-grad`.

# %%
v = baselines["total variance"]
assert v["group mean (Dr.GRPO)"] < 0.5 * v["no baseline"]
assert v["leave-one-out mean (RLOO)"] < 0.5 * v["no baseline"]
assert baselines.loc["leave-one-out mean (RLOO)", "mean error"] < 0.01  # unbiased (Monte Carlo error only)
assert baselines.loc["no baseline", "mean error"] < 0.01
assert np.allclose(means["group mean (Dr.GRPO)"], (G - 1) / G * exact, atol=0.005)  # shrunk by (G-1)/G

# %% [markdown]
# ## 1.2 Derivation of the GRPO objective
#
# **Group-relative advantage.** DeepSeekMath's outcome supervision (§4.1.2) normalises the rewards
# $\mathbf r = (r_1,\dots,r_G)$ of one group and gives every token of response $i$ the same
# advantage:
#
# $$
# \Ahat_{i,t} = \tilde r_i = \frac{r_i - \mean(\mathbf r)}{\std(\mathbf r)} .
# $$ (eq-grpo-adv)
#
# The subtraction is the baseline of {eq}`eq-grpo-pg`. The division by $\std$ is an extra choice:
# it makes the update scale-free per question — and it is exactly what Dr.GRPO later removes,
# because it re-weights questions by how hard they are. Implementations (and `grpo_lab`) use the
# unbiased standard deviation and add a small $\epsilon$ to it; an all-equal group has
# $r_i - \mean(\mathbf r) = 0$, so its advantage is exactly $0$ — it carries no gradient.
#
# **From sequences to tokens.** An autoregressive policy factorises, so
#
# $$
# \log\pitheta(o_i\given q) = \sum_{t=1}^{\olen{i}} \log\pitheta(o_{i,t}\given q, o_{i,<t}),
# $$ (eq-grpo-factor)
#
# and the sequence-level gradient $\Ahat_i\nabla\log\pitheta(o_i\given q)$ becomes a sum over
# tokens, each weighted by the same $\Ahat_i$.
#
# **Reusing samples: why a ratio appears.** Generating responses is the expensive part of a step,
# so each rollout is used for several optimiser steps. {eq}`eq-grpo-pg` needs responses drawn
# from the *current* policy $\pitheta$; after the first step the rollout's responses come from the
# policy that generated them, $\piold$. Importance sampling re-weights them: for any $f$,
# $\E_{o\sim\pitheta}[f(o)] = \E_{o\sim\piold}\big[\tfrac{\pitheta(o)}{\piold(o)}f(o)\big]$, so
#
# $$
# \nabla_\theta J(\theta) = \E_{o\sim\piold(\cdot\given q)}\Big[\frac{\pitheta(o\given q)}{\piold(o\given q)}\,\Ahat(q,o)\,\nabla_\theta\log\pitheta(o\given q)\Big], \qquad \Ahat(q,o) = R(q,o) - b(q) .
# $$ (eq-grpo-is-pg)
#
# This is exact for every $\theta$, but the sequence ratio is a product of $\lvert o\rvert$ token
# ratios, whose variance can grow exponentially with the length as $\pitheta$ leaves $\piold$. PPO {cite:p}`schulman2017ppo` instead
# weights each token by its own ratio,
#
# $$
# r_{i,t}(\theta) = \frac{\pitheta(o_{i,t}\given q, o_{i,<t})}{\piold(o_{i,t}\given q, o_{i,<t})} ,
# $$ (eq-grpo-ratio)
#
# and maximises the surrogate of its Eq. 6 (CPI: conservative policy iteration), where
# $\hat\E_t$ averages over the sampled tokens of a batch of responses:
#
# $$
# L^{\mathrm{CPI}}(\theta) = \hat\E_t\big[r_t(\theta)\,\Ahat_t\big] .
# $$ (eq-grpo-cpi)
#
# Why this function: $\nabla_\theta r_t = r_t\,\nabla_\theta\log\pitheta(o_t\given\cdot)$, and at
# $\theta=\theta_{\mathrm{old}}$ every $r_t = 1$, so
#
# $$
# \nabla_\theta L^{\mathrm{CPI}}(\theta)\big|_{\theta_{\mathrm{old}}} = \hat\E_t\big[\Ahat_t\,\nabla_\theta\log\pitheta(o_t\given q, o_{<t})\big]\big|_{\theta_{\mathrm{old}}} ,
# $$ (eq-grpo-cpi-grad)
#
# PPO's policy-gradient estimator (its Eq. 1): with every token of a response carrying that
# response's advantage, the factorisation {eq}`eq-grpo-factor` sums the token terms back into
# $\Ahat\,\nabla\log\pitheta(o\given q)$, the sample of {eq}`eq-grpo-pg`. Away from
# $\theta_{\mathrm{old}}$ the surrogate is only an approximation: a token's ratio ignores that its
# prefix $o_{<t}$ has also become more or less likely (the other factors of the sequence ratio in
# {eq}`eq-grpo-is-pg`). It is a good model of $J$ near $\piold$ only, and maximising it without a
# constraint "would lead to an excessively large policy update" (PPO §3). TRPO keeps the step in a
# KL trust region with a constrained second-order update; PPO's Eq. 7 gets a cheap substitute by
# clipping the ratio:
#
# $$
# L^{\mathrm{CLIP}}(\theta) = \hat\E_t\Big[\min\big(r_t(\theta)\Ahat_t,\ \clip\big(r_t(\theta), 1-\varepsilon, 1+\varepsilon\big)\Ahat_t\big)\Big] .
# $$ (eq-grpo-clip)
#
# For $r_t\in[1-\varepsilon,1+\varepsilon]$ the two terms agree, so $L^{\mathrm{CLIP}}$ has the same
# gradient at $\theta_{\mathrm{old}}$, {eq}`eq-grpo-cpi-grad`. Once a token's ratio has left the range
# *in the direction its advantage pushes it*, its term is constant and its gradient zero: no
# incentive to move it further. On the other side the $\min$ keeps the unclipped term (an update
# may always undo a mistake, {ref}`§1.4 <sec-grpo-clip>`), and since a $\min$ never exceeds its first term,
# $L^{\mathrm{CLIP}}\le L^{\mathrm{CPI}}$ everywhere: a pessimistic bound that costs one
# element-wise minimum.
# It is a trust region in incentive only — a token whose own gradient is zero still moves through
# the weights it shares with the others ({ref}`§1.7 <sec-grpo-mu>` measures how far) — and it can act only
# when some $r_t\ne 1$, that is from the second optimiser step on a rollout.
#
# **GRPO.** DeepSeekMath's Eq. 3 is {eq}`eq-grpo-clip` with the group advantage {eq}`eq-grpo-adv`
# for every token of a response, the average $\hat\E_t$ taken first over the tokens of a response
# and then over the group, and a KL term:
#
# $$
# \mathcal J_{\mathrm{GRPO}}(\theta)=\E_{q\sim P(Q),\,\{o_i\}_{i=1}^G\sim\piold(\cdot\given q)}\Bigg[\frac1G\sum_{i=1}^G\frac1{\olen{i}}\sum_{t=1}^{\olen{i}}\Big\{\min\big[r_{i,t}(\theta)\Ahat_{i,t},\ \clip\big(r_{i,t}(\theta),1-\varepsilon,1+\varepsilon\big)\Ahat_{i,t}\big]-\beta\,\KL\big[\pitheta\|\piref\big]\Big\}\Bigg]
# $$ (eq-grpo-objective)
#
# with the KL term estimated per token by Schulman's $k_3$ {cite:p}`schulman2020kl` (DeepSeekMath
# Eq. 4):
#
# $$
# \KL\big[\pitheta\|\piref\big] \approx k_3 = \frac{\piref(o_{i,t}\given\cdot)}{\pitheta(o_{i,t}\given\cdot)} - \log\frac{\piref(o_{i,t}\given\cdot)}{\pitheta(o_{i,t}\given\cdot)} - 1 .
# $$ (eq-grpo-k3)
#
# Two things to notice. The KL term sits *inside* the token sum — it is a loss term, not a
# penalty folded into the reward as in PPO-based RLHF. And the $1/\olen{i}$ factor means each token's
# weight depends on the length of its response: at $\theta=\theta_{\mathrm{old}}$ (ratio 1, inside
# the clip range) the gradient of {eq}`eq-grpo-objective` without the KL term is
#
# $$
# \nabla_\theta\mathcal J_{\mathrm{GRPO}} = \frac1G\sum_{i=1}^G\frac{\Ahat_i}{\olen{i}}\sum_{t=1}^{\olen{i}}\nabla_\theta\log\pitheta(o_{i,t}\given q,o_{i,<t}),
# $$ (eq-grpo-grad)
#
# which is *not* simply the policy gradient {eq}`eq-grpo-pg` with a group baseline: two factors
# depend on the sample. Each token of response $i$ gets weight $\Ahat_i/\olen{i}$, so short correct
# answers are pushed up harder per token and long wrong answers are pushed down more gently — the
# length bias Dr.GRPO {cite:p}`liu2025drgrpo` identifies; and $\Ahat_i$ divides by the group's
# $\std$, estimated from the same samples, which re-weights questions by difficulty. Both are
# measured in {ref}`sec-drgrpo`.

# %% [markdown]
# ## 1.3 Equation ↔ code
#
# The package implements {eq}`eq-grpo-adv` in `group_advantages` and the whole of
# {eq}`eq-grpo-objective` in `policy_loss`, driven by the `GRPO` preset:
#
# ```{literalinclude} ../grpo_lab/algo/algorithms.py
# :language: python
# :start-at: "GRPO = Algorithm("
# :end-at: ")"
# ```
#
# ```{literalinclude} ../grpo_lab/algo/advantages.py
# :language: python
# :pyobject: group_advantages
# ```
#
# **Advantages by hand.** Three groups of four 0/1 rewards. Group 1: mean $0.5$, unbiased std
# $\sqrt{4\cdot 0.25/3}=0.57735$, so $\Ahat=\pm 0.5/0.57745=\pm0.86588$ (with $\epsilon=10^{-4}$).
# Group 2 is all correct: advantage $0$. Group 3: mean $0.25$, std $\sqrt{(3\cdot0.0625+0.5625)/3}=0.5$,
# so $\Ahat = -0.25/0.5001 = -0.49990$ and $0.75/0.5001=1.49970$.

# %%
rewards = torch.tensor([1., 0., 0., 1.,  1., 1., 1., 1.,  0., 0., 0., 1.])
by_hand = torch.tensor([0.5 / (math.sqrt(1 / 3) + 1e-4), -0.5 / (math.sqrt(1 / 3) + 1e-4)] * 2)[[0, 1, 1, 0]]
by_hand = torch.cat([by_hand, torch.zeros(4), torch.tensor([-0.25, -0.25, -0.25, 0.75]) / (0.5 + 1e-4)])
package = group_advantages(rewards, group_size=4, scale="group", eps=1e-4)
print(pd.DataFrame({"reward": rewards, "by hand": by_hand, "grpo_lab": package}).round(5).T.to_string())
assert torch.allclose(package, by_hand.float(), atol=1e-6)

# %% [markdown]
# **The whole objective in float64.** Below, {eq}`eq-grpo-objective` and {eq}`eq-grpo-k3` are
# written as loops, token by token, in float64, on a ragged batch of two groups of three responses
# whose log-probs have drifted from $\piold$ (as after a few optimiser steps). The package's loss
# is $-\mathcal J$; it must agree, and so must its gradient.

# %%
gen = torch.Generator().manual_seed(0)
B, T, eps, beta = 6, 7, GRPO.eps_low, GRPO.beta
lengths = [7, 3, 5, 1, 6, 4]
mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])
old_logp = -torch.rand(B, T, generator=gen) * 2 - 0.1
logp = (old_logp + 0.3 * torch.randn(B, T, generator=gen)).requires_grad_()
ref_logp = old_logp + 0.2 * torch.randn(B, T, generator=gen)
adv = group_advantages(torch.tensor([1., 0., 1., 0., 0., 1.]), group_size=3)


def grpo_objective_float64(logp, old_logp, ref_logp, adv, lengths, eps, beta):
    """DeepSeekMath Eq. 3 with Eq. 4, literally: 1/G sum_i 1/|o_i| sum_t {min(...) - beta*k3}."""
    total = 0.0
    for i, n in enumerate(lengths):
        seq = 0.0
        for t in range(n):
            ratio = math.exp(logp[i][t] - old_logp[i][t])
            a = adv[i]
            surrogate = min(ratio * a, min(max(ratio, 1 - eps), 1 + eps) * a)
            pref_over_p = math.exp(ref_logp[i][t] - logp[i][t])
            k3 = pref_over_p - math.log(pref_over_p) - 1
            seq += surrogate - beta * k3
        total += seq / n
    return total / len(lengths)  # (the two groups together: mean over all 2G sequences)


as64 = lambda x: x.detach().double().tolist()
J_ref = grpo_objective_float64(as64(logp), as64(old_logp), as64(ref_logp), as64(adv), lengths, eps, beta)
out = policy_loss(logp, old_logp, adv, mask, GRPO, ref_logp=ref_logp)
out.loss.backward()
print(f"-J (float64 loops) = {-J_ref:.6f}   grpo_lab loss = {out.loss.item():.6f}")
assert abs(out.loss.item() - (-J_ref)) < 1e-5

# gradient check: float64 autograd of the same expression, written with tensor ops on the loops' terms
lp64 = logp.detach().double().requires_grad_()
terms = []
for i, n in enumerate(lengths):
    rt = torch.exp(lp64[i, :n] - old_logp[i, :n].double())
    a = adv[i].double()
    surr = torch.minimum(rt * a, torch.clamp(rt, 1 - eps, 1 + eps) * a)
    x = torch.exp(ref_logp[i, :n].double() - lp64[i, :n])
    terms.append((surr - beta * (x - torch.log(x) - 1)).sum() / n)
(-torch.stack(terms).mean()).backward()
assert torch.allclose(logp.grad.double(), lp64.grad, atol=1e-6)

# %% [markdown]
# **The gradient at $\theta=\theta_{\mathrm{old}}$ is {eq}`eq-grpo-grad`.** With ratio 1 and no KL
# term, the gradient of the loss with respect to each token's log-prob must be exactly
# $-\Ahat_i / (G\,\olen{i})$ — the per-token weight that later chapters argue about.

# %%
logp0 = old_logp.clone().requires_grad_()
no_kl = GRPO.replace(kl=None, beta=0.0)
policy_loss(logp0, old_logp, adv, mask, no_kl).loss.backward()
expected = -(adv[:, None] / (len(lengths) * mask.sum(1, keepdim=True))) * mask
assert torch.allclose(logp0.grad, expected, atol=1e-7)
print(pd.DataFrame({"|o_i|": lengths, "A_i": adv.numpy(),
                    "grad per token": logp0.grad[:, 0].numpy()}).round(4).to_string())

# %% [markdown]
# **The surrogate's gradient is the policy gradient — at $\theta_{\mathrm{old}}$ only.** The
# derivation makes three claims: the importance-sampled gradient {eq}`eq-grpo-is-pg` is exact for
# any $\theta$; the per-token surrogate {eq}`eq-grpo-cpi` has that gradient at
# $\theta_{\mathrm{old}}$, {eq}`eq-grpo-cpi-grad`; and inside the clip range {eq}`eq-grpo-clip`
# equals {eq}`eq-grpo-cpi`. We check them with exact expectations on a policy small enough to
# enumerate — responses of 3 tokens from a vocabulary of 4, each position its own softmax (an
# autoregressive policy whose conditionals happen to ignore the prefix), 64 possible responses, an
# arbitrary 0/1 reward and the baseline $b = J(\theta_{\mathrm{old}})$ — and differentiate the
# true $J(\theta)$, {eq}`eq-grpo-is-pg`, and the package's clipped loss with autograd, at
# $\theta_{\mathrm{old}}$ and after a small and a larger step away from it.

# %%
import itertools

V, L = 4, 3
gen = torch.Generator().manual_seed(1)
theta_old = torch.randn(L, V, generator=gen, dtype=torch.float64)
resp = torch.tensor(list(itertools.product(range(V), repeat=L)))  # [64, 3]: every response
R = (resp.sum(1) % 3 == 0).double()  # an arbitrary 0/1 reward


def token_logp(theta):  # log pi_theta(o_t | q, o_<t) of every token of every response, [64, 3]
    return torch.log_softmax(theta, -1)[torch.arange(L), resp]


p_old = token_logp(theta_old).sum(1).exp()  # pi_old(o); sums to 1
A = R - (p_old * R).sum()  # A = R - b with b = J(theta_old)


def J(th):  # the expected reward, exactly
    return (token_logp(th).sum(1).exp() * R).sum()


def is_pg_surrogate(th):  # a function whose gradient is eq-grpo-is-pg (the sequence ratio held fixed)
    lp = token_logp(th).sum(1)
    rho = (lp - token_logp(theta_old).sum(1)).exp().detach()
    return (p_old * rho * A * lp).sum()


def cpi(th):  # eq-grpo-cpi as an exact expectation: E_old[ sum_t r_t A ]
    return (p_old[:, None] * (token_logp(th) - token_logp(theta_old)).exp() * A[:, None]).sum()


def clipped(th):  # eq-grpo-clip through the package: -policy_loss of the GRPO preset without its KL term
    # policy_loss averages uniformly over the 64 responses and over their 3 tokens; weighting each
    # advantage by 64 * pi_old(o) makes that average the expectation over pi_old (the sign, so the
    # side of the clip, is kept), and * L undoes the token mean
    adv = A * p_old * len(resp)
    return -policy_loss(token_logp(th), token_logp(theta_old), adv, torch.ones(len(resp), L), no_kl).loss * L


def grad(f, th):
    th = th.clone().requires_grad_()
    return torch.autograd.grad(f(th), th)[0]


direction = torch.randn(L, V, generator=gen, dtype=torch.float64)
rel = lambda g, ref: float((g - ref).norm() / ref.norm())
rows = {}
for name, th in [("theta_old", theta_old), ("small step", theta_old + 0.04 * direction),
                 ("larger step", theta_old + 0.25 * direction)]:
    g_J, g_is, g_cpi, g_clip = (grad(f, th) for f in (J, is_pg_surrogate, cpi, clipped))
    ratio_t = (token_logp(th) - token_logp(theta_old)).exp()
    assert torch.allclose(g_is, g_J, atol=1e-12)  # eq-grpo-is-pg: exact at every theta
    inside = bool(((ratio_t > 1 - eps) & (ratio_t < 1 + eps)).all())
    if inside:  # no ratio outside [1 - eps, 1 + eps]: the clip is inactive
        assert torch.allclose(g_clip, g_cpi, atol=1e-6) and abs(clipped(th) - cpi(th)) < 1e-6
    assert clipped(th) <= cpi(th) + 1e-6  # a pessimistic bound
    rows[name] = {"ratios": f"[{ratio_t.min():.2f}, {ratio_t.max():.2f}]", "clip inactive": inside,
                  "eq-grpo-is-pg": f"{rel(g_is, g_J):.3f}", "L_CPI (eq-grpo-cpi)": f"{rel(g_cpi, g_J):.3f}",
                  "L_CLIP (policy_loss)": f"{rel(g_clip, g_J):.3f}"}
    if name == "theta_old":  # eq-grpo-cpi-grad: the package's clipped surrogate has the policy gradient at r = 1
        assert torch.allclose(g_clip, g_J, atol=1e-7) and torch.allclose(g_cpi, g_J, atol=1e-12)
    else:
        assert rel(g_cpi, g_J) > 0.01  # away from theta_old the per-token surrogate is an approximation
print("relative error of each gradient against the exact grad J(theta):")
print(pd.DataFrame(rows).T.to_string())

# %% [markdown]
# At $\theta_{\mathrm{old}}$ all three gradients are the policy gradient. After the small step every
# ratio is still inside $[0.8, 1.2]$, the clip is inactive and $L^{\mathrm{CLIP}} =
# L^{\mathrm{CPI}}$, yet their gradient is already a few percent off: that is the per-token
# approximation, not the clip. After the larger step the surrogate no longer describes $J$, which
# is why PPO keeps the update near $\piold$ rather than trusting it further; the clipped gradient
# is farther from $\nabla J$ still, because it has zeroed every token past the range — there it
# does not try to follow $J$, it stops the policy moving. The importance-sampled gradient stays exact throughout — in
# expectation; estimated from samples, the variance of its sequence ratio is the price.

# %% [markdown]
# (sec-grpo-clip)=
# ## 1.4 What the clip does: the two cases
#
# The clipped term $\min[r\Ahat, \clip(r, 1-\varepsilon, 1+\varepsilon)\Ahat]$ is pessimistic: it
# takes whichever of the two is smaller. Work through the signs.
#
# * $\Ahat>0$ (a good token): the objective grows with $r$ until $r = 1+\varepsilon$, then stays
#   flat. Past that point the gradient is **zero**: the policy may not make a good token much *more*
#   likely than the sampler did in one rollout. Below $1-\varepsilon$ nothing is clipped — if the
#   token became less likely, the full gradient pushes it back up.
# * $\Ahat<0$ (a bad token): the objective is flat for $r < 1-\varepsilon$ — once a bad token is
#   already much *less* likely, it is left alone — and unclipped above $1+\varepsilon$, where the
#   update must be allowed to undo a mistake.
#
# The figure evaluates `policy_loss` on single tokens over a grid of ratios and differentiates it
# with autograd; shaded: where the gradient is exactly zero.

# %% tags=["hide-input"]
ratios = torch.linspace(0.5, 1.5, 201)
one = torch.ones(1, 1)
fig, axes = plt.subplots(1, 2, figsize=(7.2, 2.8), sharey=False)
zero_grad_regions = {}
for ax, a in zip(axes, (1.0, -1.0)):
    vals, grads = [], []
    for rr in ratios:
        lp = torch.log(rr / 2).reshape(1, 1).clone().requires_grad_()  # pi_old = 1/2, ratio rr
        lo = policy_loss(lp, torch.full((1, 1), math.log(0.5)), torch.tensor([a]), one, no_kl).loss
        lo.backward()
        vals.append(-lo.item())
        grads.append(lp.grad.item())
    grads = np.array(grads)
    zero = np.abs(grads) == 0
    zero_grad_regions[a] = ratios[torch.from_numpy(zero)]
    ax.plot(ratios, vals, color="C0", label=r"objective $\min[r\hat A, \mathrm{clip}(r)\hat A]$")
    ax.plot(ratios, ratios * a, color="C7", ls=":", label=r"unclipped $r\hat A$")
    ax.fill_between(ratios, min(vals) - 0.1, max(vals) + 0.1, where=zero, color="C3", alpha=0.15,
                    label="zero gradient")
    ax.axvline(1 - eps, color="k", lw=0.6, ls="--")
    ax.axvline(1 + eps, color="k", lw=0.6, ls="--")
    ax.set_title(rf"$\hat A = {a:+.0f}$")
    ax.set_xlabel(r"ratio $r = \pi_\theta / \pi_{\theta_{old}}$")
axes[0].set_ylabel("per-token objective")
fig.tight_layout()
plotting.legend_below(fig, [axes[1]], ncols=3)  # the same three entries in both panels
book.glue("fig_grpo_clip", fig)

# %% [markdown]
# ```{glue:figure} fig_grpo_clip
# :name: fig-grpo-clip
#
# The per-token GRPO objective against the ratio for a positive (left) and a negative (right)
# advantage, computed by `grpo_lab.algo.objectives.policy_loss` ($\varepsilon=0.2$). Shaded: the ratio
# range where the clip zeroes the gradient — above $1+\varepsilon$ for good tokens, below
# $1-\varepsilon$ for bad ones. The other side is never clipped.
# ```

# %%
pos, neg = zero_grad_regions[1.0], zero_grad_regions[-1.0]
assert pos.min() > 1 + eps - 1e-6 and neg.max() < 1 - eps + 1e-6  # zero only on the pushing side
assert len(pos) > 0 and len(neg) > 0

# %% [markdown]
# ## 1.5 The $k_3$ estimator: unbiased, never negative
#
# The KL penalty is estimated from the sampled token only: the loss never sees the full
# distribution over the vocabulary. With $x\sim\pitheta$ and $\rho = \piref(x)/\pitheta(x)$,
# Schulman's three estimators are $k_1 = -\log\rho$, $k_2 = \tfrac12(\log\rho)^2$ and
# $k_3 = (\rho - 1) - \log\rho$ (= {eq}`eq-grpo-k3`). Since $\E_{x\sim\pitheta}[\rho] = 1$, the
# term $\rho - 1$ has mean zero: $k_3$ is $k_1$ plus a control variate, so it is unbiased; and
# $\log\rho \le \rho - 1$ makes it non-negative for every sample. We check both by exact
# enumeration over a small vocabulary, in float64, for 200 random pairs of distributions, and
# against `kl_estimate`. (In training the tokens are drawn from $\piold$, not $\pitheta$: the
# estimate is unbiased for the current policy only on the first, on-policy step of a rollout.)

# %%
rng = np.random.default_rng(1)
rows = []
for trial in range(200):
    V = int(rng.integers(2, 12))
    p = rng.dirichlet(np.ones(V) * rng.uniform(0.2, 3))  # pi_theta
    q = rng.dirichlet(np.ones(V) * rng.uniform(0.2, 3))  # pi_ref
    rho = q / p
    k1, k2, k3 = -np.log(rho), 0.5 * np.log(rho) ** 2, rho - 1 - np.log(rho)
    kl = float((p * np.log(p / q)).sum())
    pkg = {k: kl_estimate(torch.tensor(np.log(p))[None], torch.tensor(np.log(q))[None], kind=k)[0].double().numpy()
           for k in ("k1", "k2", "k3")}
    assert np.allclose(pkg["k3"], k3, rtol=1e-5, atol=1e-6) and np.allclose(pkg["k1"], k1, atol=1e-6)
    rows.append({"KL": kl, "E[k1]": p @ k1, "E[k2]": p @ k2, "E[k3]": p @ k3, "min k1": k1.min(),
                 "min k3": k3.min(), "sd k1": np.sqrt(p @ (k1 - kl) ** 2), "sd k3": np.sqrt(p @ (k3 - kl) ** 2)})
kl_table = pd.DataFrame(rows)
assert np.allclose(kl_table["E[k3]"], kl_table["KL"], atol=1e-12)  # unbiased, exactly
assert np.allclose(kl_table["E[k1]"], kl_table["KL"], atol=1e-12)
assert (kl_table["min k3"] >= 0).all() and (kl_table["min k1"] < 0).mean() > 0.9
bias = {k: (kl_table[f"E[{k}]"] - kl_table["KL"]).abs().mean() for k in ("k1", "k2", "k3")}
assert bias["k1"] < 1e-12 and bias["k3"] < 1e-12 and bias["k2"] > 0.1  # round-off only / a real bias
summary = pd.DataFrame({
    # float64 round-off (~1e-17) depends on the processor's summation order: print the bound, not the digits
    "mean bias": ["< 10^-12" if b < 1e-12 else f"{b:.2f}" for b in bias.values()],
    "samples < 0 possible": [bool((kl_table["min k1"] < 0).any()), False, bool((kl_table["min k3"] < 0).any())],
}, index=list(bias))
print(summary.to_string())
print(f"median per-sample sd, k1: {kl_table['sd k1'].median():.3f}   k3: {kl_table['sd k3'].median():.3f}")

# %% [markdown]
# $k_1$ and $k_3$ are exactly unbiased (errors below $10^{-12}$: float64 round-off), $k_2$ is
# biased; $k_1$ takes negative values on almost every pair, $k_3$ never does. The last line compares the spread
# of a single-sample estimate: on these random pairs, which are far apart, $k_3$'s advantage is
# not guaranteed — its variance is lowest when $\pitheta\approx\piref$, the regime a small $\beta$
# keeps training in.
#
# One more fact matters for later chapters: an unbiased estimate of the KL *value* does not make
# $k_3$ a correct *loss*. Differentiating the sampled $k_3$ (samples held fixed, as in training)
# gives $\E_{\pitheta}[(1-\rho)\nabla\log\pitheta] = \sum_x (\pitheta(x) - \piref(x))\nabla\log\pitheta(x)$,
# which is the gradient of the *forward* divergence $\KL[\piref\|\pitheta]$, not of
# $\KL[\pitheta\|\piref]$. The next cell checks this on a softmax policy; DeepSeek-V3.2
# {cite:p}`deepseekai2025v32` changes the estimator for this reason.

# %%
theta = torch.tensor([0.3, -1.0, 0.8, 0.0, 1.5], dtype=torch.float64, requires_grad=True)
ref = torch.softmax(torch.tensor([0.0, 0.5, -0.5, 1.0, 0.2], dtype=torch.float64), 0)
pi_t = lambda: torch.softmax(theta, 0)
rho = ref / pi_t()
k3_loss = (pi_t().detach() * (rho - 1 - torch.log(rho))).sum()  # samples from pi_theta, held fixed
g_k3 = torch.autograd.grad(k3_loss, theta)[0]
g_reverse = torch.autograd.grad((pi_t() * torch.log(pi_t() / ref)).sum(), theta)[0]  # KL[pi_theta || pi_ref]
g_forward = torch.autograd.grad((ref * torch.log(ref / pi_t())).sum(), theta)[0]  # KL[pi_ref || pi_theta]
assert torch.allclose(g_k3, g_forward, atol=1e-12) and not torch.allclose(g_k3, g_reverse, atol=1e-3)
print("grad of k3 as a loss :", np.round(g_k3.numpy(), 4))
print("grad KL[ref || pi]   :", np.round(g_forward.numpy(), 4))
print("grad KL[pi || ref]   :", np.round(g_reverse.numpy(), 4))

# %% [markdown]
# :::{admonition} Common misreadings
# :class: warning
#
# * **"GRPO penalises KL in the reward, like PPO-RLHF."** No: DeepSeekMath Eq. 3 subtracts
#   $\beta\,\KL$ *inside the per-token sum of the loss*, estimated by $k_3$ (Eq. 4); it never
#   enters the advantage.
# * **"DeepSeek-R1 uses a sequence-level ratio."** R1's Eq. 1 {cite:p}`deepseekai2025r1` writes
#   $\pitheta(o_i\given q)/\piold(o_i\given q)$ as shorthand for the same objective; the ratio
#   in DeepSeekMath's Eq. 3 is per token. A length-normalised sequence ratio is GSPO's change
#   {cite:p}`zheng2025gspo`.
# * **"R1-Zero reached 71.0 on AIME 2024 from a 32B model."** 71.0 (pass@1, averaged over 16
#   samples) is R1-Zero on the 671B DeepSeek-V3-Base. The 32B run, DeepSeek-R1-Zero-Qwen-32B,
#   scores 47.0 — the baseline DAPO and VAPO compare against.
# * **"The clip is what kept GRPO stable in DeepSeekMath."** DeepSeekMath-RL made a single policy
#   update per exploration stage (§4.2): every ratio was 1 and the clip never acted.
#   {ref}`§1.7 <sec-grpo-mu>` measures when it does.
# * **"$k_3$ is unbiased, so its gradient is the KL gradient."** Unbiased for the *value*; as a
#   loss its gradient is that of $\KL[\piref\|\pitheta]$ (checked above).
# :::
#
# ## 1.6 Experiment: GRPO trains a tiny transformer on CPU
#
# **The task.** Sums of two to four two-digit numbers, e.g. `56+77+95=`. A response either answers
# directly (`#228`) or reasons first, reducing the sum one addition at a time
# (`133+95;228;#228`). The reward is 1 for a well-formed response with the right answer, else 0,
# parsed by a regular expression (model output is never evaluated). **The base policy**
# (`data/checkpoints/arithmetic-base`: a 3-layer Qwen2-style transformer built from a
# `transformers` config, 0.3M parameters, character tokenizer) was pretrained by
# `python -m grpo_lab.lab.pretrain arithmetic` on demonstrations of which only 30% reason. It can add
# step by step, but prefers to answer at once — and answering at once is hard for it.

# %%
import json

from grpo_lab.policy.models import load_policy
from grpo_lab.paths import checkpoint_dir
from grpo_lab.policy.rollout import generate
from grpo_lab.tasks import ArithmeticTask

base_dir = checkpoint_dir("arithmetic-base")
recipe = json.loads((base_dir / "recipe.json").read_text())
m = recipe["metrics"]
print(f"parameters: {recipe['parameters']:,}   pretraining: {recipe['recipe']['steps']} steps")
print(f"greedy test accuracy {m['greedy_accuracy']:.3f}, reasoning in {m['greedy_reasoning_frac']:.0%} of greedy answers")
print(f"sampled (T=1) accuracy {m['sampled_accuracy']:.3f}, reasoning in {m['sampled_reasoning_frac']:.0%} of samples")
print("greedy accuracy by number of terms:", m["greedy_accuracy_by_terms"])

# %%
policy, tokenizer = load_policy(base_dir)
task = ArithmeticTask(**{k: recipe["recipe"][k] for k in ("min_terms", "max_terms", "digits")})
torch.manual_seed(3)
demo = generate(policy, tokenizer, [task.make_problem([56, 77, 95])], group_size=6,
                max_new_tokens=task.max_new_tokens, temperature=1.0)
for text in demo.texts:
    print(f"{'56+77+95=':>10} {text:<24} reward {task.reward(text, demo.problems[0]):.0f}")

# %% [markdown]
# Six samples of one question form one GRPO group: reasoning samples are right more often than
# direct ones (this group: one of two against none of four), so the group's advantages push
# probability toward reasoning. That is
# what GRPO has to discover by itself. The run below uses the `GRPO` preset unchanged ($\varepsilon
# = 0.2$, $\beta = 0.04$, $k_3$, `seq_mean_token_mean`) with the profile's sampling settings;
# each rollout is split into two minibatches, so the second optimiser step is off-policy and the
# clip can act. The learning rate warms up linearly over the first 10 optimiser steps: without it,
# Adam's first update (which moves every parameter by about the learning rate, whatever its
# gradient) collapsed a token's probability in one of our seeds, sending its ratio to 0 and its
# $k_3$ to 81 nats in a single step.

# %%
from grpo_lab import experiments, lab

profile = experiments.get_profile("cpu")  # on every machine: the GSM8K runs are §1.8's
STEPS = 30  # 30 of the profile's 40 steps, for the time budget
print(f"profile {profile.name}: {STEPS} steps x {profile.config.prompts_per_step} questions "
      f"x G={profile.config.group_size}, lr {profile.config.lr}, {profile.config.minibatches} minibatches/rollout, "
      f"seeds {list(SEEDS)}")

# %% tags=["nbval-ignore-output"]
result = experiments.run("GRPO", profile="cpu", seeds=SEEDS, steps=STEPS, n_jobs=N_JOBS)
hist = result.history
print(f"trained {len(SEEDS)} seeds in {result.provenance['wall_seconds']:.0f} s{book.cache_note(result)}")

# %% tags=["hide-input", "nbval-ignore-output"]
evals = hist.dropna(subset=["test_accuracy"])
train = hist[hist["step"] > 0]
lengths_long = pd.concat([
    train[["seed", "step", "length_correct"]].rename(columns={"length_correct": "length"}).assign(algo="correct"),
    train[["seed", "step", "length_incorrect"]].rename(columns={"length_incorrect": "length"}).assign(algo="incorrect"),
])
fig, axes = plt.subplots(2, 3, figsize=(9.6, 5.2))
ci = dict(band="ci95")
plotting.band_plot(axes[0, 0], evals, "step", "test_accuracy", title="greedy test accuracy", bounds=(0, 1), **ci)
plotting.band_plot(axes[0, 1], train, "step", "reward", title="train reward (sampled)", bounds=(0, 1), **ci)
plotting.band_plot(axes[0, 2], lengths_long, "step", "length", colors={"correct": "C2", "incorrect": "C3"},
                   title="response length", bounds=(0, math.inf), **ci)
plotting.band_plot(axes[1, 0], train, "step", "entropy", title="entropy", bounds=(0, math.inf), **ci)
plotting.band_plot(axes[1, 1], train, "step", "kl", title=r"KL to $\pi_{ref}$ ($k_3$)", bounds=(0, math.inf), **ci)
plotting.band_plot(axes[1, 2], train, "step", "clip_frac", title="clipped-token fraction", bounds=(0, 1), **ci)
units = ["fraction correct", "mean reward", "tokens", "nats per token", "nats per token", "fraction of tokens"]
for ax, unit in zip(axes.flat, units):
    ax.set_xlabel("RL step")
    ax.set_ylabel(unit)
fig.tight_layout()
plotting.legend_right(axes[0, 2])  # correct / incorrect: that panel's only, beside it
book.glue("fig_grpo_curves", fig)

# %% [markdown]
# ```{glue:figure} fig_grpo_curves
# :name: fig-grpo-curves
#
# GRPO from `arithmetic-base`, CPU profile, mean with 95% t interval over five seeds. Top: greedy accuracy on
# the fixed 198-question test set (step 0 is the base policy), the sampled training reward, and
# the length of correct and incorrect responses — incorrect ones are longer because a reasoned
# answer's length is set by its number of terms, and four-term sums are both the longest and the
# hardest (not the length bias, which {ref}`sec-drgrpo` tests). Bottom: policy entropy, the $k_3$
# KL to the reference (the base policy) and the fraction of tokens whose gradient the clip removed.
# ```

# %% tags=["nbval-ignore-output"]
base_acc, final_acc = result.base("test_accuracy"), result.final("test_accuracy")
last = hist[hist["step"] == hist["step"].max()].set_index("seed")
evals_by_seed = hist.dropna(subset=["test_accuracy"]).pivot(index="step", columns="seed", values="test_accuracy")
best_acc = evals_by_seed.iloc[1:].max()
table = pd.DataFrame({
    "base greedy acc": base_acc, "best greedy acc (biased upwards)": best_acc, "final greedy acc": final_acc,
    "gain": final_acc - base_acc,
    "final reasoning frac": last["test_reasoning_frac"], "final test length": last["test_length"],
})
table.loc["mean"] = table.mean()
table.loc["sd"] = table.iloc[:-1].std()
gain = final_acc - base_acc
book.glue("grpo_base_acc", round(float(base_acc.mean()), 3))
book.glue("grpo_final_acc", round(float(final_acc.mean()), 3))
book.glue("grpo_final_acc_sd", round(float(final_acc.std()), 3))
book.glue("grpo_final_ci", stats.format_interval(stats.t_interval(final_acc, bounds=(0, 1))))
book.glue("grpo_gain_ci", stats.format_interval(stats.paired_difference(final_acc, base_acc)))
book.glue("grpo_binom_se", f"{stats.binomial_se(float(final_acc.mean()), 198):.3f}")
book.glue("grpo_gain", round(float(gain.mean()), 3))
book.glue("grpo_best_acc", round(float(best_acc.mean()), 3))
book.glue("grpo_drop", round(float((best_acc - final_acc).max()), 3))
best_step = evals_by_seed.iloc[1:].idxmax()  # the step of each seed's best evaluation (the first, on ties)
early = best_step[best_step < evals_by_seed.index.max()]  # seeds whose best evaluation is not their last
book.glue("grpo_peak_sentence",
          f"In {len(early)} of {len(best_step)} seeds accuracy peaks before the last evaluation, "
          + (f"between steps {int(early.min())} and {int(early.max())}" if early.min() < early.max()
             else f"at step {int(early.min())}") + ", and then falls back"
          if len(early) else "No seed's accuracy falls back after a peak within these steps; the largest fall")
book.glue("grpo_kl_median", round(float(hist["kl"].median()), 3))
book.glue("grpo_kl_max", round(float(hist["kl"].max()), 1))
kl_top = hist.loc[hist["kl"].idxmax()]
book.glue("grpo_kl_max_seq", round(float(kl_top["kl"] * kl_top["length"])))
table.round(3)

# %%
# Robust facts, checked on every run (the numbers above vary slightly across machines).
assert (gain > 0.05).all(), gain  # every seed improves greedy accuracy
assert gain.mean() > 0.12, gain.mean()  # a floor well below the measured gain (see text)
kl_by_seed = hist.groupby("seed")["kl"].median()
assert (hist["kl"].dropna() >= 0).all() and (kl_by_seed < 0.5).all()  # k3 >= 0; typically small
assert hist["clip_frac"].dropna().max() > 0  # the clip acted on the off-policy minibatch
print("checks passed")

# %% [markdown]
# **What reproduced.** Greedy test accuracy rose from {glue:text}`grpo_base_acc` to
# {glue:text}`grpo_final_ci` at the last step (mean [95% t interval] over five seeds; sd
# {glue:text}`grpo_final_acc_sd`), a paired gain of {glue:text}`grpo_gain_ci`. One evaluation on the
# 198 test questions has a binomial standard error of about {glue:text}`grpo_binom_se` on its own:
# the t interval is over seeds on this fixed test set, and a different test set of that size would
# add that much error to each evaluation.
# The best evaluation of each seed averages {glue:text}`grpo_best_acc` — a maximum over that
# seed's noisy evaluations, so biased upwards; it is shown only to size the fall after the peak. The policy learned it by *reasoning more*: the fraction of reasoning
# answers and the response length both grew, the small-scale echo of the "response length grows
# during RL" curves of DeepSeek-R1 {cite:p}`deepseekai2025r1`. Entropy drops as the policy commits
# to reasoning. The per-token KL to the base policy is small at a typical step (median
# {glue:text}`grpo_kl_median` nats per token under $\beta = 0.04$) but not at all of them: the
# largest step mean of any one seed is {glue:text}`grpo_kl_max` nats per token, about {glue:text}`grpo_kl_max_seq`
# nats for a whole response of that step's mean length; $k_3$ is heavy-tailed, too — when a sampled token has become much
# less likely under $\pitheta$ than under $\piref$, $\rho = \piref/\pitheta$ is large and
# $k_3\approx\rho$ — which is why the warm-up above matters. {glue:text}`grpo_peak_sentence` — by
# up to {glue:text}`grpo_drop` for one seed between its best and its last evaluation: once the policy always reasons, the remaining errors are arithmetic slips
# inside the reasoning, and 0/1 rewards on 16 questions per step at this learning rate are a
# noisy signal that can also undo progress. The last evaluation is therefore a pessimistic,
# noisy summary; read the curves, not just the table.
# Only a small fraction of tokens is ever clipped: with two minibatches per rollout the second
# step is only slightly off-policy ({ref}`sec-grpo-mu` varies the number of steps per rollout). **What this scale does not show:** nothing here speaks to
# AIME-level numbers, and with a 0.3M-parameter model and 0/1 rewards on short answers, the
# length bias of {eq}`eq-grpo-grad` has little room to act — measuring it needs an experiment
# designed for it (the Dr.GRPO route).
#
# (sec-grpo-mu)=
# ## 1.7 Experiment: updates per rollout, and when the clip binds
#
# The clip of {eq}`eq-grpo-clip` can act only on an optimiser step that is not the first on its
# rollout. DeepSeekMath-RL made **a single policy update per exploration stage** (§4.2
# {cite:p}`shao2024deepseekmath`): every ratio was 1, and the clip never acted in the original
# GRPO. Later recipes reuse each rollout much more — R1-Zero split each rollout into 16
# minibatches (the Nature version of {cite:t}`deepseekai2025r1`), DAPO made 16 gradient updates
# per rollout {cite:p}`yu2025dapo` — and there the clip does the work {eq}`eq-grpo-clip` was
# derived for. We vary $\mu$, the number of optimiser steps per rollout, over 1, 2, 4 and 8.
#
# **What $\mu$ means here.** GRPO's Algorithm 1 calls $\mu$ the number of "GRPO iterations" over a
# batch: `epochs=μ` in `TrainerConfig`, $\mu$ passes over the whole rollout, $\mu$ times the
# backward passes. We use `minibatches=μ, epochs=1` instead: the rollout's
# {glue:text}`mu_rows` responses are split into $\mu$ minibatches, one optimiser step each. Every
# response is back-propagated once, so an RL step costs about the same at every $\mu$ (which is
# what made five seeds of four settings affordable), and it is the kind of reuse DAPO's "16
# gradient updates per rollout" and R1-Zero's 16 minibatches describe; for the clip the two
# readings are alike — the $k$-th step of a rollout is $k-1$ optimiser steps away from $\piold$.
# What else changes with $\mu$: each step sees $1/\mu$ of the groups, and the policy takes $\mu$
# Adam steps per rollout at the same learning rate, so it moves further per rollout. The warm-up
# spans the same {glue:text}`mu_warm_rollouts` rollouts at every $\mu$ ($5\mu$ optimiser steps), so
# $\mu = 2$ is exactly the run of §1.6 and is not trained again: its first
# {glue:text}`mu_steps` steps are reused (a run's first steps do not depend on how many follow —
# the learning rate is constant after warm-up, and evaluation does not touch the training RNG).
# The other settings train {glue:text}`mu_steps` steps, five seeds each, with the same seeds.

# %% tags=["nbval-ignore-output"]
MUS = (1, 2, 4, 8)
STEPS_MU = 10
warm_rollouts = profile.config.warmup / (profile.config.minibatches * profile.config.epochs)
book.glue("mu_rows", profile.config.prompts_per_step * profile.config.group_size)
book.glue("mu_steps", STEPS_MU)
book.glue("mu_warm_rollouts", f"{warm_rollouts:g}")
t0 = time.perf_counter()
mu_hist = {}
if profile.config.minibatches in MUS and profile.config.epochs == 1:  # §1.6's runs: reuse their first steps
    mu_hist[profile.config.minibatches] = result.history[result.history["step"] <= STEPS_MU]
todo = [mu for mu in MUS if mu not in mu_hist]
# one grid, one pool of N_JOBS workers: the settings differ only in the trainer (per-setting overrides)
mu_grid = experiments.run_grid(
    [GRPO.replace(name=f"mu={mu}") for mu in todo], profile="cpu", seeds=SEEDS, steps=STEPS_MU, n_jobs=N_JOBS,
    overrides={f"mu={mu}": {"minibatches": mu, "epochs": 1, "warmup": round(warm_rollouts * mu)} for mu in todo})
for mu in todo:
    mu_hist[mu] = mu_grid[f"mu={mu}"].history
mu_long = pd.concat([mu_hist[mu].assign(algo=f"μ = {mu}", mu=mu) for mu in MUS], ignore_index=True)
print(f"{len(todo)} settings x {len(SEEDS)} seeds x {STEPS_MU} steps in {time.perf_counter() - t0:.0f} s "
      f"(μ = {profile.config.minibatches} reused from §1.6){book.cache_note(mu_grid)}")

# %% tags=["hide-input", "nbval-ignore-output"]
from matplotlib.colors import to_hex

mu_colors = {f"μ = {mu}": to_hex(plt.cm.Blues(v)) for mu, v in zip(MUS, (0.6, 0.72, 0.86, 1.0))}
mu_train = mu_long[mu_long["step"] > 0]
sides = pd.concat([
    mu_train.groupby(["mu", "seed"], as_index=False)[col].mean().rename(columns={col: "frac"}).assign(algo=label)
    for col, label in (("clip_frac_low", r"low: $\hat A<0,\ r<1-\varepsilon$"),
                       ("clip_frac_high", r"high: $\hat A>0,\ r>1+\varepsilon$"))])
fig, axes = plt.subplots(1, 3, figsize=(10.2, 2.9))
plotting.band_plot(axes[0], mu_train, "step", "clip_frac", colors=mu_colors, band="ci95", bounds=(0, 1),
                   title="clipped tokens per rollout")
plotting.band_plot(axes[1], sides, "mu", "frac", colors=dict(zip(sides["algo"].unique(), ("C3", "C2"))),
                   band="ci95", bounds=(0, 1), title="clipped tokens, by side", legend=True)
plotting.band_plot(axes[2], mu_long.dropna(subset=["test_accuracy"]), "step", "test_accuracy", colors=mu_colors,
                   band="ci95", bounds=(0, 1), title="greedy test accuracy")
axes[1].set_xscale("log", base=2)
axes[1].set_xticks(MUS, [str(m) for m in MUS])
axes[2].set_xticks(sorted(mu_long.dropna(subset=["test_accuracy"])["step"].unique()))
for ax, xlabel, unit in zip(axes, ("RL step", r"updates per rollout $\mu$", "RL step"),
                            ("fraction of tokens", "fraction of tokens", "fraction correct")):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(unit)
fig.legend(*axes[0].get_legend_handles_labels(), loc="center right", frameon=False)  # the mu colours, all panels
fig.tight_layout(rect=(0, 0, 0.9, 1))
book.glue("fig_grpo_mu", fig)

# %% [markdown]
# ```{glue:figure} fig_grpo_mu
# :name: fig-grpo-mu
#
# GRPO with $\mu$ optimiser steps per rollout (`minibatches=μ`), mean with 95% t interval over five
# seeds. Left: the fraction of a rollout's tokens whose gradient the clip removed, averaged over its
# $\mu$ optimiser steps — exactly 0 at $\mu = 1$, growing with $\mu$. Middle: the same per seed,
# averaged over the {glue:text}`mu_steps` steps, split by side of the clip: the lower clip binds more.
# Right: greedy accuracy on the 198 test questions — the more a rollout is reused, the sooner accuracy
# rises, and the sooner it falls back.
# ```

# %% tags=["hide-input", "nbval-ignore-output"]
per_seed = mu_train.groupby(["mu", "seed"]).agg(
    clip_low=("clip_frac_low", "mean"), clip_high=("clip_frac_high", "mean"), clip=("clip_frac", "mean"),
    q05=("ratio_q05", "mean"), q95=("ratio_q95", "mean"), rmin=("ratio_min", "min"), rmax=("ratio_max", "max"))
mu_evals = mu_long.dropna(subset=["test_accuracy"])
eval_steps = sorted(mu_evals["step"].unique())
MID_MU = eval_steps[len(eval_steps) // 2]  # an evaluation halfway through (step 5 on the CPU profile)
acc = {(mu, s): mu_evals[(mu_evals["mu"] == mu) & (mu_evals["step"] == s)].set_index("seed")["test_accuracy"]
       for mu in MUS for s in (MID_MU, STEPS_MU)}
fmt = lambda iv, d=4: stats.format_interval(iv, d)
verdict = lambda iv: "excludes 0" if iv.excludes(0.0) else "includes 0"
diffs = {(mu, s): stats.paired_difference(acc[mu, s], acc[1, s]) for mu in MUS[1:] for s in (MID_MU, STEPS_MU)}
rows = {}
for mu in MUS:
    ps = per_seed.loc[mu]
    rows[f"μ = {mu}"] = {
        "rollout rows per optimiser step": str(profile.config.prompts_per_step * profile.config.group_size // mu),
        "clipped, low side (A<0)": fmt(stats.t_interval(ps["clip_low"], bounds=(0, 1))),
        "clipped, high side (A>0)": fmt(stats.t_interval(ps["clip_high"], bounds=(0, 1))),
        "ratio, 5% quantile": fmt(stats.t_interval(ps["q05"]), 3),
        "ratio, 95% quantile": fmt(stats.t_interval(ps["q95"]), 3),
        "ratio, smallest and largest": f"{ps['rmin'].min():.2g} and {ps['rmax'].max():.2g}",
        **{f"greedy acc, step {s}": fmt(stats.t_interval(acc[mu, s], bounds=(0, 1)), 3) for s in (MID_MU, STEPS_MU)},
        **{f"  minus μ = 1 (paired), step {s}": "—" if mu == 1 else fmt(diffs[mu, s], 3) for s in (MID_MU, STEPS_MU)},
    }
mu_table = pd.DataFrame(rows)
with pd.option_context("display.max_colwidth", None):  # whole cells, not "..."
    book.glue("mu_table", mu_table)  # shown below, with its caption
book.glue("mu_mid", int(MID_MU))
for mu in MUS:
    book.glue(f"mu_clip_{mu}", fmt(stats.t_interval(per_seed.loc[mu, "clip"], bounds=(0, 1))))
    for s, tag in ((MID_MU, "mid"), (STEPS_MU, "end")):
        book.glue(f"mu_acc_{mu}_{tag}", fmt(stats.t_interval(acc[mu, s], bounds=(0, 1)), 3))
        if mu > 1:
            book.glue(f"mu_diff_{mu}_{tag}", f"{fmt(diffs[mu, s], 3)}, {verdict(diffs[mu, s])}")
top = max(MUS)
side_diff = stats.paired_difference(per_seed.loc[top, "clip_low"], per_seed.loc[top, "clip_high"])
book.glue("mu_side_diff", f"{fmt(side_diff)}, {verdict(side_diff)}")
book.glue("mu_rmax", f"{per_seed.loc[top, 'rmax'].max():.2g}")
book.glue("mu_rmin", f"{per_seed.loc[top, 'rmin'].min():.2g}")
book.glue("mu_rmin_2", f"{per_seed.loc[2, 'rmin'].min():.2g}")
book.glue("mu_rmax_2", f"{per_seed.loc[2, 'rmax'].max():.2g}")
book.glue("mu_rows_top", profile.config.prompts_per_step * profile.config.group_size // top)
book.glue("mu_groups_top", profile.config.prompts_per_step // top)
end_top = diffs[top, STEPS_MU]
# the first edition's minibatches cut prompt groups at random (grpo_lab 0.2.0 and earlier); its mu = 8 - mu = 1 at
# the last evaluation, recorded from that edition's notebook, included zero
EARLIER_END_TOP = "-0.119 [-0.302, 0.064]"
book.glue("mu_end_reading", (
    f"Judged by its last evaluation alone, μ = {top} ends below μ = 1 (an earlier edition, whose "
    f"minibatches held fragments of prompt groups, could not tell them apart: {EARLIER_END_TOP})"
    if end_top.excludes(0.0) and end_top.mean < 0 else
    f"Judged by its last evaluation alone, μ = {top} gained nothing"))

# %%
# Robust facts, checked on every run.
on_policy = mu_hist[1]
assert (on_policy["clip_frac"].dropna() == 0).all()  # mu = 1: the only step is on-policy, r = 1 exactly ...
assert (on_policy["ratio_min"].dropna() == 1).all() and (on_policy["ratio_max"].dropna() == 1).all()  # ... every token
clip_by_mu = per_seed["clip"].unstack("mu")
assert (clip_by_mu[[m for m in MUS if m > 1]] > 0).all().all()  # off-policy steps clip, on every seed
assert clip_by_mu.mean().is_monotonic_increasing and (clip_by_mu[top] > clip_by_mu[2]).all()  # more reuse, more clipping
assert side_diff.lo > 0  # at mu = 8 the lower clip binds more often than the upper one
assert diffs[top, MID_MU].lo > 0  # halfway, the most reused rollouts have learned the most per rollout ...
assert diffs[top, STEPS_MU].mean < diffs[top, MID_MU].mean  # ... and lost that lead by the end:
assert acc[top, STEPS_MU].mean() < acc[top, MID_MU].mean() and diffs[top, STEPS_MU].lo < 0  # it fell back,
assert acc[1, STEPS_MU].mean() > acc[1, MID_MU].mean()  # while mu = 1 was still climbing
print("checks passed")

# %% [markdown]
# ```{glue:} mu_table
# ```
#
# *Updates per rollout at CPU scale, five seeds, {glue:text}`mu_steps` RL steps. Rollout rows per
# optimiser step; the fraction of tokens whose gradient the lower and the upper clip removed, and
# the 5% and 95% quantiles of the ratio, each averaged over the steps (mean [95% t interval] over
# seeds); the smallest and largest ratio of any token in any step of any seed; greedy test
# accuracy halfway and at the end, and its paired difference from $\mu = 1$ over the same seeds.*
#
# **When the clip binds.** At $\mu = 1$ every ratio is exactly 1 and the clip removed nothing
# (asserted): DeepSeekMath's setting. Every further step on the same rollout moves the policy
# away from the $\piold$ that sampled it, and the clipped fraction grows with $\mu$
# (asserted): {glue:text}`mu_clip_2` of the tokens at $\mu = 2$, {glue:text}`mu_clip_4` at
# $\mu = 4$, {glue:text}`mu_clip_8` at $\mu = 8$ — small fractions, because most ratios stay
# close to 1 (the table's 5% and 95% quantiles). The lower clip binds more than the upper: at
# $\mu = 8$, low − high = {glue:text}`mu_side_diff` (paired over seeds). One reason is arithmetic: $r = \pitheta/\piold \le 1/\piold$, so a token the old policy
# already gave probability above $1/(1+\varepsilon) \approx 0.83$ can never reach the upper clip,
# while any token can fall below $1-\varepsilon$ — the asymmetry DAPO's clip-higher
# ({ref}`chapter 2 <sec-dapo>`) targets. And the clip is a trust region in incentive only: some
# ratio reached {glue:text}`mu_rmax` at $\mu = 8$ (and {glue:text}`mu_rmax_2` even at $\mu = 2$),
# another fell to {glue:text}`mu_rmin` — far outside $[0.8, 1.2]$. Their own terms had
# no gradient, but the weights they share with other tokens kept moving.
#
# **Accuracy.** Reusing a rollout is meant to buy learning per sample, and halfway it does: at step
# {glue:text}`mu_mid` the greedy test accuracy is {glue:text}`mu_acc_1_mid` at $\mu = 1$ and
# {glue:text}`mu_acc_8_mid` at $\mu = 8$ (paired difference {glue:text}`mu_diff_8_mid`; $\mu = 2$:
# {glue:text}`mu_diff_2_mid`, $\mu = 4$: {glue:text}`mu_diff_4_mid`). By step
# {glue:text}`mu_steps` that lead is gone: {glue:text}`mu_acc_1_end` at $\mu = 1$ against
# {glue:text}`mu_acc_8_end` at $\mu = 8$ ({glue:text}`mu_diff_8_end`; $\mu = 2$:
# {glue:text}`mu_diff_2_end`, $\mu = 4$: {glue:text}`mu_diff_4_end`). The larger $\mu$ climbs
# sooner and then falls back, the peak-and-fall of §1.6 compressed into fewer rollouts, while
# $\mu = 1$ is still climbing (all three asserted). {glue:text}`mu_end_reading`; the curve shows it
# got there sooner and lost it. This experiment does not say how much of the fall is the clip: at $\mu = 8$ each
# optimiser step sees {glue:text}`mu_rows_top` responses ({glue:text}`mu_groups_top` groups) and
# the policy takes eight Adam steps of about the learning rate per rollout, so larger, noisier
# updates change together with the clipping. A control with the minibatch held fixed
# (`epochs=μ`, $\mu$ times the backward passes), or the learning rate scaled by $1/\mu$ as in
# {ref}`chapter 5 <sec-cispo>`, would separate them. What it does show is the mechanism the derivation
# predicts: the clip is idle on-policy and binds more the further a rollout is reused.

# %% [markdown]
# (sec-grpo-scale)=
# ## 1.8 At scale
#
# What DeepSeekMath reports for GRPO {cite:p}`shao2024deepseekmath`, beside this chapter:

# %% tags=["hide-input", "nbval-ignore-output"]
final_ci = stats.format_interval(stats.t_interval(final_acc, bounds=(0, 1)))
paper_vs_ours = pd.DataFrame([
    {"": "model", "DeepSeekMath-RL": "DeepSeekMath-Instruct 7B", "this chapter": "0.3M-parameter Qwen2-style"},
    {"": "result", "DeepSeekMath-RL": "GSM8K 88.2%, MATH 51.7% (chain of thought, no tools)",
     "this chapter": f"arithmetic greedy accuracy {final_ci}"},
    {"": "group size G", "DeepSeekMath-RL": "64", "this chapter": str(profile.config.group_size)},
    {"": "KL coefficient beta", "DeepSeekMath-RL": "0.04", "this chapter": "0.04"},
    {"": "learning rate", "DeepSeekMath-RL": "1e-6", "this chapter": str(profile.config.lr)},
    {"": "updates per rollout", "DeepSeekMath-RL": "1 (so the clip never acted)",
     "this chapter": f"{profile.config.minibatches} minibatches (the second off-policy); 1 to {max(MUS)} in §1.7"},
]).set_index("")
from IPython.display import display

with pd.option_context("display.max_colwidth", None):  # show whole cells, not "..."
    display(paper_vs_ours)

# %% [markdown]
# With a single update per batch of samples, DeepSeekMath's ratio was 1 at every update: its
# GRPO results owe nothing to the clip, which only acts off-policy — on the later minibatches of
# a rollout ({ref}`sec-grpo-mu`), and much more with the 16 updates per batch of
# {ref}`sec-cispo`.

# %% [markdown]
# **GSM8K on a GPU.** With `PROFILE = "gpu"` in the parameters cell, the next cell trains GRPO (the
# base model's accuracy is each seed's step 0, so the change is paired) on GSM8K from the hub
# instruct model named by `experiments.GPU_MODEL`, with the `gpu` profile
# (`experiments.gpu_profile`: prompts in the model's chat template, a 512-token budget, 16 questions
# × 8 responses per step, bfloat16 autocast on Ampere or newer GPUs and float16 with a gradient
# scaler on older ones), `GPU_SEEDS` seeds each, and writes `data/results/gpu/01_grpo.json` with its
# provenance. On every machine it then shows that file when it is present, after asserting what any
# GPU run must show (`lab.check_gpu_results`: CUDA, every seed to its last step, accuracies
# in range, finite gradients, a base model that solves more than 10% of the problems); the toy
# experiments above run the CPU profile on every machine, so their assertions hold on a GPU too.
# Without the file it prints what the run would train and its expected time.

# %%
GPU_ALGOS = [GRPO]
gpu_prof = None  # None: the gpu profile
if PROFILE == "colab":  # a free Colab T4 (experiments.colab_profile): LoRA, one seed, <= 30 min predicted
    GPU_SEEDS, gpu_prof = experiments.COLAB_SEEDS, experiments.colab_profile()
if PROFILE in ("gpu", "colab"):
    lab.run_chapter_gpu("01_grpo", GPU_ALGOS, seeds=GPU_SEEDS, steps=GPU_STEPS, n_jobs=GPU_N_JOBS,
                        profile=gpu_prof)
gpu_summary = book.show_gpu_results("01_grpo", GPU_ALGOS, seeds=GPU_SEEDS, steps=GPU_STEPS, profile=gpu_prof)

# %% [markdown]
# ## 1.9 Takeaways
#
# * GRPO replaces the value network by a **group baseline**: $G$ samples of the same question cut
#   the gradient's variance several-fold at no extra model. Its $1/\olen{i}$ and $1/\std$ make it a
#   biased version of that policy gradient ({ref}`sec-drgrpo`).
# * Dividing by the group's $\std$ is a separate choice from subtracting the mean; an all-equal
#   group has advantage exactly 0 and contributes no gradient.
# * The ratio comes from importance sampling: a rollout is reused for several optimiser steps, so
#   its samples come from $\piold$. PPO's per-token surrogate has the policy gradient at
#   $\theta_{\mathrm{old}}$ only; the clip is a cheap trust region that removes the incentive to move
#   a ratio past $1\pm\varepsilon$ on the side the advantage pushes toward, never on the other.
# * The clip only acts off-policy: never at one update per rollout (DeepSeekMath-RL's setting), more
#   the more optimiser steps reuse a rollout — and even then it bounds incentives, not ratios.
# * $k_3$ is an unbiased, non-negative estimate of $\KL[\pitheta\|\piref]$ — but as a loss its
#   gradient is that of the forward KL.
# * Per-token weight $\Ahat_i/\olen{i}$: the aggregation couples the update to response length.
#
# ## Exercises
#
# 1. For 0/1 rewards with $k$ successes in a group of $G$, show that the GRPO advantages are
#    $\Ahat^+ = (1-p)/s$ and $\Ahat^- = -p/s$ with $p = k/G$ and $s=\sqrt{G\,p(1-p)/(G-1)}$ (ignore
#    $\epsilon$), and check it with `group_advantages`.
# 2. Show that adding a constant to every reward of a group, or multiplying them all by $c>0$,
#    leaves {eq}`eq-grpo-adv` unchanged. Which of these invariances does Dr.GRPO's $r-\mean(\mathbf r)$ keep?
# 3. Rerun the experiment with `experiments.run(GRPO.replace(beta=0.0), profile="cpu", seeds=SEEDS)`.
#    Without a KL term the trainer keeps no reference model, so the `kl` column is NaN (not
#    measured). What happens to accuracy and entropy?
#
# :::{admonition} Solutions 1 and 2
# :class: dropdown
#
# 1. The mean is $p$; the $k$ ones deviate by $1-p$, the $G-k$ zeros by $-p$, so the unbiased
#    variance is $(k(1-p)^2 + (G-k)p^2)/(G-1) = G\,p(1-p)/(G-1)$. Dividing the deviations by its
#    square root gives the result; the cell below checks it for every $k$ with $G=8$.
# 2. $r+c$ shifts the mean by $c$ and leaves the std alone; $c\,r$ scales both by $c$. The
#    mean-only advantage of Dr.GRPO keeps the shift invariance but scales with $c$.
# :::

# %%
G = 8
for k in range(1, G):
    pk = k / G
    s = math.sqrt(G * pk * (1 - pk) / (G - 1))
    a = group_advantages(torch.tensor([1.0] * k + [0.0] * (G - k)), group_size=G, eps=0.0)
    assert torch.allclose(a, torch.tensor([(1 - pk) / s] * k + [-pk / s] * (G - k)), atol=1e-6)
r8 = torch.rand(G, generator=torch.Generator().manual_seed(0))
assert torch.allclose(group_advantages(3 * r8 + 5, group_size=G, eps=0.0), group_advantages(r8, group_size=G, eps=0.0), atol=1e-5)
assert torch.allclose(group_advantages(3 * r8 + 5, G, scale="none"), 3 * group_advantages(r8, G, scale="none"), atol=1e-5)
print("exercise checks passed")

# %% tags=["nbval-ignore-output", "remove-cell"]
book.glue("grpo_runtime", book.run_time(CHAPTER_START))

# %% [markdown]
# ## References
#
# The papers cited in this chapter are listed in {ref}`sec-references`.
