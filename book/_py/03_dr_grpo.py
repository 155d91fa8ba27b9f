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
# (sec-drgrpo)=
# # 3. Dr.GRPO and DeepSeek-V3.2: the normalisation route
#
# **The problem.** GRPO's objective divides twice: by the length $\olen{i}$ of each response and by
# the standard deviation of each group's rewards. Dr.GRPO {cite:p}`liu2025drgrpo` shows that each
# division biases the update — the first by response length, the second by question difficulty —
# and removes both. DeepSeek-V3.2 {cite:p}`deepseekai2025v32` also drops the std, but keeps
# $1/\olen{i}$, and changes four more things: an importance-corrected KL estimate, a mask for stale
# negative samples, Keep Routing (MoE) and Keep Sampling Mask (top-p/top-k); the first two act in
# this book's setting.
#
# **Which axes they move:** advantage — `group_mean` ($r-\mean$); aggregation —
# `seq_mean_token_sum_norm` (a constant normaliser); regulariser — $k_3$ with importance correction
# (V3.2 Eq. 7); sampling — off-policy sequence masking (V3.2 Eqs. 8–9).
#
# **Prerequisites:** {ref}`sec-grpo`. **Run time:** {glue:text}`drgrpo_runtime` on two CPU cores
# (measured on the last execution).

# %% tags=["remove-cell"]
# Colab set-up: clone the repository (the chapters need its data/ folder) and install the package.
import os
import subprocess
import sys

if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    if not os.path.isdir("/content/grpo_lab"):
        subprocess.run(["git", "clone", "-q", "--depth", "1",
                        "https://github.com/grpo-lab/grpo_lab", "/content/grpo_lab"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "/content/grpo_lab"], check=True)
    sys.path.insert(0, "/content/grpo_lab")

# %% tags=["parameters"]
PROFILE = "cpu"  # "gpu" on a Colab GPU
SEEDS = (0, 1, 2, 3, 4)
N_JOBS = 2  # worker processes; results do not depend on it

# %% tags=["hide-input"]
import math
import time

import numpy as np
import pandas as pd
import torch
import matplotlib.pyplot as plt

from grpo_lab import book, experiments, plotting, stats
from grpo_lab.advantages import group_advantages, rloo_advantages
from grpo_lab.algorithms import DR_GRPO, GRPO
from grpo_lab.mhc import product_gain, sinkhorn_knopp
from grpo_lab.objectives import kl_estimate, offpolicy_sequence_mask, policy_loss

book.setup_notebook(seed=0)
CHAPTER_START = time.perf_counter()

# %% [markdown]
# ## 3.1 Two biases, two causes
#
# At $\theta=\theta_{\mathrm{old}}$, GRPO's gradient ({eq}`eq-grpo-grad`) gives every token of
# response $i$ the weight
#
# $$
# w_i^{\mathrm{GRPO}} = \frac{1}{G}\cdot\frac{1}{\olen{i}}\cdot\frac{r_i-\mean(\mathbf r)}{\std(\mathbf r)} .
# $$ (eq-drgrpo-weight)
#
# **(i) Length bias, from $1/\olen{i}$** (Dr.GRPO §3.1). For a correct answer ($\Ahat>0$) a
# shorter response gets a larger push per token; for a wrong answer ($\Ahat<0$) a *longer* response
# is pushed down *less* per token. Being wrong at length is cheap, so incorrect responses can grow.
#
# **(ii) Difficulty bias, from $1/\std(\mathbf r)$.** For 0/1 rewards with success rate $p$ in a
# group of $G$, $\std(\mathbf r)=\sqrt{G\,p(1-p)/(G-1)}$, so the normalisation multiplies every
# advantage of that question by
#
# $$
# \frac{1}{\std(\mathbf r)} = \sqrt{\frac{G-1}{G\,p(1-p)}} ,
# $$ (eq-drgrpo-difficulty)
#
# which grows like $1/\sqrt{p(1-p)}$ as $p$ nears 0 or 1: *per minority response*, and relative to
# Dr.GRPO, nearly-solved and nearly-hopeless questions get the largest weight. The question's total
# weight does not: summed over the group, GRPO's $|\Ahat_i|$ is $2\sqrt{G(G-1)\,p(1-p)}$ (exercise
# 1), which still peaks at $p=\tfrac12$ — it only falls off more slowly toward 0 and 1 than
# Dr.GRPO's $2Gp(1-p)$. An *exactly* all-equal group is not amplified — its centred rewards are all
# 0, so its advantage is exactly 0.
#
# The cell below reads both weights off autograd for a group of four responses, under GRPO and
# under Dr.GRPO (both without KL, so only the normalisation differs).

# %%
lengths = [5, 20, 5, 20]
labels = ["short right", "long right", "short wrong", "long wrong"]
rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
T, MAX_TOKENS = max(lengths), 32
mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])
weights = {}
for name, algo in [("GRPO", GRPO.replace(kl=None, beta=0.0)), ("Dr.GRPO", DR_GRPO)]:
    adv = algo.advantages(rewards, group_size=4)
    lp = torch.zeros(4, T, requires_grad=True)
    policy_loss(lp, torch.zeros(4, T), adv, mask, algo, max_tokens=MAX_TOKENS).loss.backward()
    weights[name] = -lp.grad[:, 0]
w = pd.DataFrame({"|o_i|": lengths, "GRPO": weights["GRPO"].numpy(), "Dr.GRPO": weights["Dr.GRPO"].numpy()},
                 index=labels)
print(w.round(5).to_string())
std = rewards.std().item()  # unbiased, as in group_advantages
assert torch.allclose(weights["GRPO"], (rewards - 0.5) / (std + 1e-4) / (4 * torch.tensor(lengths, dtype=torch.float)))
assert torch.allclose(weights["Dr.GRPO"], (rewards - 0.5) / (4 * MAX_TOKENS))  # same for every length

# %% [markdown]
# Under GRPO, a token of the long wrong answer is pushed down with a quarter of the force of a token
# of the short wrong one; under Dr.GRPO every token of the same sign gets the same weight. The
# difficulty factor {eq}`eq-drgrpo-difficulty` is checked next against `group_advantages` for
# every success count of a group of 8, together with the all-equal case.

# %%
G = 8
rows = []
for k in range(0, G + 1):
    r = torch.tensor([1.0] * k + [0.0] * (G - k))
    grpo, drg = group_advantages(r, G, eps=0.0), group_advantages(r, G, scale="none")
    ratio = float(grpo[0] / drg[0]) if k not in (0, G) else 0.0
    p = k / G
    analytic = math.sqrt((G - 1) / (G * p * (1 - p))) if k not in (0, G) else float("nan")
    rows.append({"k": k, "p": p, "GRPO/Dr.GRPO weight": ratio, "1/std analytic": analytic,
                 "max |A| GRPO": float(grpo.abs().max())})
difficulty = pd.DataFrame(rows).set_index("k")
print(difficulty.round(4).to_string())
inner = difficulty.iloc[1:-1]
assert np.allclose(inner["GRPO/Dr.GRPO weight"], inner["1/std analytic"], rtol=1e-5)
assert difficulty.loc[0, "max |A| GRPO"] == 0 and difficulty.loc[G, "max |A| GRPO"] == 0  # nothing amplified

# %% [markdown]
# ## 3.2 Dr.GRPO: the plain policy gradient
#
# Dr.GRPO removes both factors (§3.2): the advantage is $\tilde A_i = r_i - \mean(\mathbf r)$, and
# token losses are summed and divided by a **constant**, the generation budget `MAX_TOKENS`:
#
# $$
# \mathcal J_{\mathrm{Dr.GRPO}}(\theta)=\E\Bigg[\frac{1}{G}\sum_{i=1}^G\frac{1}{\mathrm{MAX\_TOKENS}}\sum_{t=1}^{\olen{i}}\min\Big(r_{i,t}\tilde A_i,\ \clip(r_{i,t},1-\varepsilon,1+\varepsilon)\tilde A_i\Big)\Bigg] .
# $$ (eq-drgrpo-objective)
#
# At $\theta=\theta_{\mathrm{old}}$ its gradient is
# $\frac{1}{G\cdot\mathrm{MAX\_TOKENS}}\sum_i (r_i-\mean(\mathbf r))\nabla\log\pitheta(o_i\given q)$:
# the policy gradient {eq}`eq-grpo-pg` with the group-mean baseline, scaled by a constant (App. A).
# Up to the factor $G/(G-1)$ the centred reward is the leave-one-out (RLOO) advantage, so the
# estimator is unbiased up to a learning-rate rescaling.

# %%
r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
assert torch.allclose(rloo_advantages(r, 4), 4 / 3 * group_advantages(r, 4, scale="none"), atol=1e-6)
# autograd: the Dr.GRPO loss gradient is -(r - mean) / (G * MAX_TOKENS) on every real token
adv = DR_GRPO.advantages(r[:4], group_size=4)
lp = torch.zeros(4, T, requires_grad=True)
policy_loss(lp, torch.zeros(4, T), adv, mask, DR_GRPO, max_tokens=MAX_TOKENS).loss.backward()
assert torch.allclose(lp.grad, -(adv[:, None] / (4 * MAX_TOKENS)) * mask)
print("Dr.GRPO gradient = plain policy gradient with mean baseline / (G * MAX_TOKENS): checked")

# %% [markdown]
# ## 3.3 DeepSeek-V3.2: what its RL section changes
#
# V3.2's "Scaling GRPO" (§3.1) keeps GRPO's form (Eq. 5) with $\Ahat_{i,t} = R_i-\mean(\mathbf R)$
# — **no std** — and changes the KL and the samples:
#
# **Unbiased KL gradient (Eq. 7).** The $k_3$ term is re-weighted by the importance ratio between
# the current and the sampling policy:
#
# $$
# \KL\big(\pitheta\|\piref\big)_{i,t}=\frac{\pitheta(o_{i,t}\given\cdot)}{\piold(o_{i,t}\given\cdot)}\Big(\frac{\piref(o_{i,t}\given\cdot)}{\pitheta(o_{i,t}\given\cdot)}-\log\frac{\piref(o_{i,t}\given\cdot)}{\pitheta(o_{i,t}\given\cdot)}-1\Big) .
# $$ (eq-drgrpo-v32-kl)
#
# In {ref}`sec-grpo` we saw that plain $k_3$, used as a loss, has the gradient of the *forward*
# divergence $\KL[\piref\|\pitheta]$. With the ratio in front (and not detached), the expected
# gradient becomes that of the *reverse* divergence $\KL[\pitheta\|\piref]$, the one the objective
# names. We check both by exact enumeration on a softmax policy over six outcomes using
# `kl_estimate`: plain $k_3$ on-policy ($\theta=\theta_{\mathrm{old}}$) gives the forward-KL
# gradient; Eq. 7, with samples from $\piold$ and $\theta\neq\theta_{\mathrm{old}}$, gives the
# value and the gradient of the reverse KL exactly.

# %%
g = torch.Generator().manual_seed(0)
theta_old = torch.randn(6, generator=g, dtype=torch.float64)
theta = (theta_old + 0.3 * torch.randn(6, generator=g, dtype=torch.float64)).requires_grad_()
ref = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), 0)
p_old = torch.softmax(theta_old, 0)


def expected_loss(kind_fn):
    """E_{x ~ pi_old}[estimator(x)]: every outcome x weighted by its sampling probability."""
    logp = torch.log_softmax(theta, 0)[None]
    est = kind_fn(logp)[0]
    return (p_old * est).sum()


plain = expected_loss(lambda lp: kl_estimate(lp, torch.log(ref)[None], "k3"))
corrected = expected_loss(lambda lp: kl_estimate(lp, torch.log(ref)[None], "k3", old_logp=torch.log(p_old)[None]))
g_plain = torch.autograd.grad(plain, theta)[0]
g_corr = torch.autograd.grad(corrected, theta)[0]
pi = lambda: torch.softmax(theta, 0)
g_reverse = torch.autograd.grad((pi() * torch.log(pi() / ref)).sum(), theta)[0]
reverse_value = (pi() * torch.log(pi() / ref)).sum().item()
assert abs(corrected.item() - reverse_value) < 1e-12  # Eq. 7 is unbiased for KL[pi_theta || pi_ref] ...
assert torch.allclose(g_corr, g_reverse, atol=1e-12)  # ... and so is its gradient
assert not torch.allclose(g_plain, g_reverse, atol=1e-3)  # plain k3 (off-policy samples) is not
# on-policy (theta = theta_old), plain k3 used as a loss has the gradient of the FORWARD divergence
theta0 = theta_old.clone().requires_grad_()
p0 = torch.softmax(theta_old, 0)
plain0 = (p0 * kl_estimate(torch.log_softmax(theta0, 0)[None], torch.log(ref)[None], "k3")[0]).sum()
g_plain0 = torch.autograd.grad(plain0, theta0)[0]
g_forward0 = torch.autograd.grad((ref * torch.log(ref / torch.softmax(theta0, 0))).sum(), theta0)[0]
g_reverse0 = torch.autograd.grad((torch.softmax(theta0, 0) * torch.log(torch.softmax(theta0, 0) / ref)).sum(), theta0)[0]
assert torch.allclose(g_plain0, g_forward0, atol=1e-12) and not torch.allclose(g_plain0, g_reverse0, atol=1e-3)
print("on-policy: grad of plain k3 == grad KL[ref || pi] (forward), != grad KL[pi || ref]")
print("grad, Eq. 7 k3  :", np.round(g_corr.numpy(), 4))
print("grad, KL[pi||ref]:", np.round(g_reverse.numpy(), 4))
print("grad, plain k3  :", np.round(g_plain.numpy(), 4))

# %% [markdown]
# **Off-policy sequence masking (Eqs. 8–9).** A response is dropped from the policy term when its
# advantage is negative *and* the sampling policy has drifted from the current one on it by more
# than $\delta$, measured as the mean per-token $\log\piold - \log\pitheta$:
#
# $$
# M_{i}=0\ \text{ if }\ \Ahat_{i}<0\ \text{ and }\ \frac{1}{\olen{i}}\sum_{t}\log\frac{\piold(o_{i,t}\given\cdot)}{\pitheta(o_{i,t}\given\cdot)}>\delta,\qquad M_{i}=1\ \text{ otherwise.}
# $$ (eq-drgrpo-v32-mask)
#
# Positive samples are always kept. V3.2's own reason: the model learns most from its own
# mistakes, and highly off-policy *negative* samples can be harmful and destabilise training. Our
# gloss (not the paper's): pushing down a bad answer the current policy has already moved away from
# spends gradient on a sample that no longer describes it, while a good answer it now finds less
# likely is still worth pushing up. A worked example with $\delta = 0.1$:

# %%
old = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]))
cur = torch.log(torch.tensor([[0.4, 0.4, 0.4], [0.4, 0.4, 0.4], [0.48, 0.48, 0.48], [0.6, 0.6, 0.6]]))
adv4 = torch.tensor([-1.0, 1.0, -1.0, -1.0])
m4 = torch.ones(4, 3)
keep = offpolicy_sequence_mask(old, cur, adv4, m4, delta=0.1)
drift = (old - cur).mean(1)
example = pd.DataFrame({"advantage": adv4.numpy(), "mean log(pi_old/pi_theta)": drift.numpy(),
                        "kept": keep.numpy()}, index=["neg, drifted", "pos, drifted", "neg, close", "neg, moved up"])
print(example.round(4).to_string())
assert keep.tolist() == [False, True, True, True]  # log(0.5/0.4) = 0.223 > 0.1 masks only the negative one

# %% [markdown]
# :::{admonition} Sidebar: mHC is an architecture, not a sampler
# :class: note
#
# mHC {cite:p}`xie2025mhc` (Manifold-Constrained Hyper-Connections) widens the residual stream into
# $n$ streams mixed by a learned $n\times n$ matrix per layer, and projects each mixing matrix onto
# the doubly stochastic matrices with Sinkhorn–Knopp iterations. A doubly stochastic matrix has
# spectral norm at most 1 and products of them stay doubly stochastic, so the depth-composite
# mixing can neither explode nor vanish. It has nothing to do with RL, and V3.2's RL section does
# not mention it. The figure below multiplies $L$ random mixing matrices (identity plus noise, as
# after initialisation and some training) with and without the projection.
# :::

# %% tags=["hide-input"]
g = torch.Generator().manual_seed(0)
n, depth = 4, 64
raw = torch.eye(n) + 0.15 * torch.randn(depth, n, n, generator=g)
projected = sinkhorn_knopp(raw / 0.3, iters=200)  # the same parameters, used as logits (exp, then Sinkhorn)
gains = pd.DataFrame({
    "L": list(range(1, depth + 1)),
    "unconstrained": [product_gain(raw[:L]) for L in range(1, depth + 1)],
    "Sinkhorn-projected": [product_gain(projected[:L]) for L in range(1, depth + 1)],
})
fig, ax = plt.subplots(figsize=(6.0, 2.8))
ax.plot(gains["L"], gains["unconstrained"], color="C3", label="unconstrained $H^{res}$")
ax.plot(gains["L"], gains["Sinkhorn-projected"], color="C0", label="Sinkhorn-projected (doubly stochastic)")
ax.set_yscale("log")
ax.set_xlabel("depth L")
ax.set_ylabel(r"spectral norm of $\prod H^{res}$")
ax.legend(fontsize=8)
fig.tight_layout()
book.glue("fig_mhc_gain", fig)

# %%
assert np.allclose(projected.sum(-1), 1, atol=1e-4) and np.allclose(projected.sum(-2), 1, atol=1e-4)
assert gains["Sinkhorn-projected"].max() <= 1 + 1e-4
assert gains["unconstrained"].iloc[-1] > 10 * gains["Sinkhorn-projected"].iloc[-1]
print(f"gain at L={depth}: unconstrained {gains['unconstrained'].iloc[-1]:.3g}, "
      f"projected {gains['Sinkhorn-projected'].iloc[-1]:.4f}")

# %% [markdown]
# ```{glue:figure} fig_mhc_gain
# :name: fig-mhc-gain
#
# Spectral norm of the product of $L$ residual mixing matrices ($n=4$ streams, identity plus
# Gaussian noise of scale 0.15), unconstrained versus the same parameters used as logits and
# projected onto doubly stochastic matrices by `grpo_lab.mhc.sinkhorn_knopp` (as mHC does). The
# unconstrained product's gain drifts away from 1 with depth; the projected one stays at 1.
# ```
#
# :::{admonition} Common misreadings
# :class: warning
#
# * **"The length bias comes from dividing by the std."** It comes from $1/\olen{i}$ (§3.1 above);
#   the std causes the *difficulty* bias. Removing only the std leaves the length bias in place.
# * **"When all answers are equal, std → 0 and the advantage explodes."** For *exact* ties this is
#   wrong: an all-equal group has centred rewards of exactly 0, hence advantage 0 (table in §3.1).
#   With shaped rewards, though, *near*-ties do get advantages of order one: in an all-correct
#   group of 8 where one response falls on DAPO's length-penalty ramp (reward 0.833), GRPO gives
#   the seven others +0.35 and that one −2.47, against +0.02 and −0.15 under Dr.GRPO; a reward gap
#   of only 1/4096 still gives −1.15 under GRPO's $\epsilon=10^{-4}$ (the cell after this box
#   computes all three). This matters for the rows of {ref}`sec-dapo` that use the soft penalty
#   without dynamic sampling.
# * **"Dividing by the std encourages reward variance, hence longer answers, hence R1-Zero's length
#   explosion."** Not in the paper, and not what the algebra says: Dr.GRPO ties length growth to the
#   $1/\olen{i}$ factor (§3.1 above); the std changes how much each *question* weighs, and an
#   objective that is a ratio of centred rewards to their spread has no term that rewards spread.
# * **"V3.2 uses zero KL for math."** The paper observes that some domains, maths among them, can
#   do better with a *weak or zero* KL; it is an observation, with no β reported, not a rule.
# * **"Self-verification and mHC are part of V3.2's RL."** V3.2's RL changes are the unbiased KL
#   estimate, off-policy sequence masking, Keep Routing and Keep Sampling Mask. Self-verification
#   rewards come from DeepSeekMath-V2 {cite:p}`shao2025deepseekmathv2` and are reused only by
#   V3.2-Speciale for proofs; mHC is an architecture paper (sidebar).
# * **"V3.2 pushes Dr.GRPO to its extreme."** V3.2 drops the std, as Dr.GRPO does, but keeps
#   GRPO's $1/\olen{i}$ (its Eq. 5 is GRPO's form), so the length bias of §3.1 stays.
# * **"V3.2-Speciale scores 97 on AIME 2025."** Its reported Pass@1 is **96.0** (23k output
#   tokens), above GPT-5-High's 94.6 and Gemini-3.0-Pro's 95.0.
# :::

# %%
# Near-ties with shaped rewards (the second misreading above): all-correct groups of 8 whose rewards
# differ only through a penalty. GRPO uses eps = 1e-4 in the std, as group_advantages does.
near_ties = {}
for label, low in [("one reward on the ramp (0.833)", 1 - 1 / 6), ("gap of 1/4096", 1 - 1 / 4096)]:
    r8 = torch.tensor([1.0] * 7 + [low], dtype=torch.float64)
    a_g, a_d = group_advantages(r8, 8), group_advantages(r8, 8, scale="none")
    near_ties[label] = {"GRPO: others": float(a_g[0]), "GRPO: the one": float(a_g[-1]),
                        "Dr.GRPO: others": float(a_d[0]), "Dr.GRPO: the one": float(a_d[-1])}
near_ties = pd.DataFrame(near_ties).T
print((near_ties.round(2) + 0.0).to_string())  # + 0.0 turns a rounded -0.00 into 0.00
ramp = near_ties.loc["one reward on the ramp (0.833)"]
assert round(ramp["GRPO: others"], 2) == 0.35 and round(ramp["GRPO: the one"], 2) == -2.47
assert round(ramp["Dr.GRPO: others"], 2) == 0.02 and round(ramp["Dr.GRPO: the one"], 2) == -0.15
assert round(near_ties.loc["gap of 1/4096", "GRPO: the one"], 2) == -1.15

# %% [markdown]
# ## 3.4 Experiments
#
# Three settings from `arithmetic-base`, 5 seeds each, CPU profile (40 steps, 16 questions × 8
# samples, two minibatches per rollout): GRPO without KL, Dr.GRPO (also without KL, as in the
# paper), and GRPO with the preset's $\beta=0.04$. The first pair isolates the normalisation; the
# GRPO pair isolates the KL term. The task lets the policy choose its length: a direct answer is 3–4
# tokens, a reasoned one 8–26.

# %%
settings = [GRPO.replace(name="GRPO (beta=0)", kl=None, beta=0.0), DR_GRPO.replace(name="Dr.GRPO"),
            GRPO.replace(name="GRPO (beta=0.04)")]
profile = experiments.get_profile(PROFILE)
print({s.name: {k: v for k, v in s.axes().items() if k in ("advantage", "aggregation", "kl", "beta")}
       for s in settings})

# %% tags=["nbval-ignore-output"]
grid = experiments.run_grid(settings, profile=PROFILE, seeds=SEEDS, n_jobs=N_JOBS)
hist = pd.concat([r.history for r in grid.values()], ignore_index=True)
print(f"{len(settings)} settings x {len(SEEDS)} seeds in {next(iter(grid.values())).provenance['wall_seconds']:.0f} s")

# %% tags=["hide-input", "nbval-ignore-output"]
# the book's colours (grpo_lab.plotting.ALGO_COLORS); GRPO with its KL term in grey, dashed by name
colors = {"GRPO (beta=0)": plotting.algo_color("GRPO"), "Dr.GRPO": plotting.algo_color("DR_GRPO"),
          "GRPO (beta=0.04)": plotting.algo_color("base")}
pair = hist[hist["algo"].isin(["GRPO (beta=0)", "Dr.GRPO"])]
train = pair[pair.step > 0]
fig, axes = plt.subplots(1, 3, figsize=(9.6, 2.9))
plotting.band_plot(axes[0], train, "step", "length_correct", colors=colors, title="length of correct responses",
                   smooth=5, band="ci95", bounds=(0, math.inf))
plotting.band_plot(axes[1], train, "step", "length_incorrect", colors=colors,
                   title="length of incorrect responses", smooth=5, band="ci95", bounds=(0, math.inf))
plotting.band_plot(axes[2], pair.dropna(subset=["test_accuracy"]), "step", "test_accuracy", colors=colors,
                   title="greedy test accuracy", legend=True, band="ci95", bounds=(0, 1))
for ax, unit in zip(axes, ("tokens", "tokens", "fraction correct")):
    ax.set_xlabel("RL step")
    ax.set_ylabel(unit)
fig.tight_layout()
book.glue("fig_drgrpo_lengths", fig)

# %% [markdown]
# ```{glue:figure} fig_drgrpo_lengths
# :name: fig-drgrpo-lengths
#
# GRPO against Dr.GRPO (both without KL), mean with 95% t interval over five seeds: length in tokens of the
# correct and of the incorrect sampled responses (moving average over 5 steps), and greedy test
# accuracy.
# ```

# %% tags=["nbval-ignore-output"]
def late_mean(r, col, last=10):
    h = r.history
    per_seed = h[h.step > h.step.max() - last].groupby("seed")[col].mean()
    return per_seed


summary = {}
for name, r in grid.items():
    f = r.final()
    inc, cor = late_mean(r, "length_incorrect"), late_mean(r, "length_correct")
    summary[name] = {"final greedy acc": stats.format_interval(stats.t_interval(f, bounds=(0, 1))),
                     "incorrect length (last 10, tokens)": stats.format_interval(stats.t_interval(inc), 1),
                     "correct length (last 10, tokens)": stats.format_interval(stats.t_interval(cor), 1),
                     "entropy (last 10, nats/token)": f"{late_mean(r, 'entropy').mean():.3f}"}
drgrpo_table = pd.DataFrame(summary).T
gap = {name: (late_mean(r, "length_incorrect") - late_mean(r, "length_correct")) for name, r in grid.items()}
book.glue("drgrpo_table", drgrpo_table)
book.glue("gap_grpo", stats.format_interval(stats.t_interval(gap["GRPO (beta=0)"]), 1))
book.glue("gap_drgrpo", stats.format_interval(stats.t_interval(gap["Dr.GRPO"]), 1))
book.glue("gap_diff", stats.format_interval(stats.paired_difference(gap["GRPO (beta=0)"], gap["Dr.GRPO"]), 1))
for name, key in [("GRPO (beta=0)", "b0"), ("GRPO (beta=0.04)", "b04")]:
    book.glue(f"ent_{key}", f"{late_mean(grid[name], 'entropy').mean():.3f}")
    book.glue(f"acc_{key}", stats.format_interval(stats.t_interval(grid[name].final(), bounds=(0, 1))))
book.glue("acc_diff_kl", stats.format_interval(stats.paired_difference(grid["GRPO (beta=0.04)"].final(),
                                                                        grid["GRPO (beta=0)"].final())))
book.glue("acc_diff_dr", stats.format_interval(stats.paired_difference(grid["Dr.GRPO"].final(),
                                                                        grid["GRPO (beta=0)"].final())))


def verdict(iv):
    """How a paired interval reads: which side of zero, if any."""
    if not iv.excludes(0.0):
        return "its interval includes zero: no difference is established over five seeds"
    return f"its interval excludes zero: {'higher' if iv.mean > 0 else 'lower'} over five seeds"


book.glue("verdict_dr", verdict(stats.paired_difference(grid["Dr.GRPO"].final(), grid["GRPO (beta=0)"].final())))
book.glue("verdict_kl", verdict(stats.paired_difference(grid["GRPO (beta=0.04)"].final(),
                                                        grid["GRPO (beta=0)"].final())))
book.glue("verdict_gap", verdict(stats.paired_difference(gap["GRPO (beta=0)"], gap["Dr.GRPO"])))
drgrpo_table

# %% [markdown]
# *Final greedy test accuracy and, over the last 10 steps, the mean length of incorrect and correct
# sampled responses and the entropy (mean [95% t interval] over five seeds).*
#
# ```{glue:} drgrpo_table
# ```

# %% [markdown]
# **Per-question weight against success rate: a sanity check.** We sample 8 responses to each of
# 96 test questions from the base policy and, for each group, compare GRPO's advantage with
# Dr.GRPO's. This is a check of the code on real groups, not evidence for the bias: with 0/1
# rewards the ratio is a fixed function of the group's success rate $\hat p$, so the points must
# fall on the curve whatever the policy does.

# %%
from grpo_lab.models import load_policy
from grpo_lab.paths import checkpoint_dir
from grpo_lab.rollout import generate
from grpo_lab.tasks import ArithmeticTask

policy, tokenizer = load_policy(checkpoint_dir("arithmetic-base"))
task = ArithmeticTask()
torch.manual_seed(0)
problems = task.test_set()[::2][:96]
ro = generate(policy, tokenizer, problems, group_size=8, max_new_tokens=task.max_new_tokens)
correct = torch.tensor([float(task.is_correct(t, p)) for t, p in zip(ro.texts, ro.problems)])
a_grpo, a_dr = group_advantages(correct, 8), group_advantages(correct, 8, scale="none")
groups = correct.view(-1, 8)
p_hat = groups.mean(1)
mixed = (p_hat > 0) & (p_hat < 1)
measured = (a_grpo.view(-1, 8)[:, 0] / a_dr.view(-1, 8)[:, 0])[mixed]
pp = np.linspace(0.02, 0.98, 200)
fig, ax = plt.subplots(figsize=(6.0, 2.8))
ax.plot(pp, np.sqrt(7 / (8 * pp * (1 - pp))), color="C0", label=r"analytic $\sqrt{(G-1)/(G\,p(1-p))}$")
ax.scatter(p_hat[mixed], measured, color="C1", s=18, zorder=3, label="measured groups (base policy)")
ax.set_xlabel("group success rate p")
ax.set_ylabel("GRPO weight / Dr.GRPO weight")
ax.legend(fontsize=8)
fig.tight_layout()
book.glue("fig_drgrpo_difficulty", fig)
print(f"{int(mixed.sum())} mixed groups, {int((~mixed).sum())} all-equal groups (weight exactly 0 in both)")
expected = torch.sqrt(7 / (8 * p_hat[mixed] * (1 - p_hat[mixed])))
assert torch.allclose(measured, 1 / (1 / expected + 1e-4), rtol=1e-3)  # eps=1e-4 in the std
assert torch.all(a_grpo.view(-1, 8)[~mixed] == 0)

# %% [markdown]
# ```{glue:figure} fig_drgrpo_difficulty
# :name: fig-drgrpo-difficulty
#
# How much GRPO's std normalisation re-weights each minority response relative to Dr.GRPO,
# against the group's success rate: analytic curve {eq}`eq-drgrpo-difficulty` and, as a sanity
# check of the code (the points cannot leave the curve for 0/1 rewards), the groups of 8 samples
# the base policy produced on 96 test questions. With $G=8$, a question solved by 1 (or 7) of 8 samples
# gets 1.5 times the weight of a 50/50 question (2.83 against 1.87); the curve keeps rising
# toward $p=0$ and $p=1$ for larger groups.
# ```

# %% tags=["hide-input", "nbval-ignore-output"]
kl_pair = hist[hist["algo"].isin(["GRPO (beta=0)", "GRPO (beta=0.04)"])]
fig, axes = plt.subplots(1, 2, figsize=(7.6, 2.9))
plotting.band_plot(axes[0], kl_pair.dropna(subset=["test_accuracy"]), "step", "test_accuracy", colors=colors,
                   title="greedy test accuracy", legend=True, band="ci95", bounds=(0, 1))
plotting.band_plot(axes[1], kl_pair[kl_pair.step > 0], "step", "entropy", colors=colors,
                   title="entropy", band="ci95", bounds=(0, math.inf))
for ax, unit in zip(axes, ("fraction correct", "nats per token")):
    ax.set_xlabel("RL step")
    ax.set_ylabel(unit)
fig.tight_layout()
book.glue("fig_drgrpo_kl", fig)

# %% [markdown]
# ```{glue:figure} fig_drgrpo_kl
# :name: fig-drgrpo-kl
#
# GRPO with and without the KL term ($\beta = 0.04$ vs $0$), mean with 95% t interval over five
# seeds: the accuracy curves overlap; from about step 20 the entropy stays slightly higher with the
# KL term.
# ```

# %%
for name, r in grid.items():
    assert r.final().mean() > r.base().mean() + 0.05, name  # every setting learns
assert hist["length_incorrect"].notna().any() and hist["length_correct"].notna().any()
print("checks passed")

# %% [markdown]
# **What reproduced, and what did not.** The mechanisms reproduce exactly and are asserted: the
# per-token weights of {eq}`eq-drgrpo-weight`, the difficulty factor {eq}`eq-drgrpo-difficulty`
# (on real groups only as a sanity check of the code), the RLOO relation, the forward/reverse KL gradients of plain and
# importance-corrected $k_3$, and the masking rule. The training-dynamics claim — that under GRPO
# *incorrect* responses grow longer than under Dr.GRPO — does **not** reproduce at this scale:
# over the last 10 steps incorrect responses are longer than correct ones by {glue:text}`gap_grpo`
# tokens under GRPO and {glue:text}`gap_drgrpo` under Dr.GRPO (mean [95% t interval] over seeds);
# the paired difference GRPO − Dr.GRPO is {glue:text}`gap_diff` tokens ({glue:text}`verdict_gap`),
# and the length curves overlap. Why: here the length of an answer is decided
# almost entirely by *whether* the policy reasons (3–4 tokens against 8–26 for a reasoned answer,
# whose length is fixed by the number of terms), so there is no free length for the bias to push;
# wrong reasoned answers are longer than right ones simply because four-term sums are both longer
# and harder. Dr.GRPO's bias experiment (its Fig. 5) used Qwen2.5-1.5B base with the R1 template
# on MATH, for about 150 policy steps, with responses of about 0.4k–1.8k tokens (the 7B model
# belongs to the separate Oat-Zero recipe). So what our toy lacks is not step count but response
# length: with well-formed answers of at most 26 tokens (within a 32-token budget) whose length is
# set by the question, a wrong answer has no room to ramble. Final greedy accuracy, Dr.GRPO − GRPO (both without KL, paired over
# seeds): {glue:text}`acc_diff_dr` — {glue:text}`verdict_dr`; differences of this size also move
# between machines. The KL comparison: with $\beta=0.04$ the final greedy accuracy is
# {glue:text}`acc_b04` against {glue:text}`acc_b0` without KL (paired difference
# {glue:text}`acc_diff_kl`; {glue:text}`verdict_kl`), and late entropy is {glue:text}`ent_b04`
# against {glue:text}`ent_b0` nats per token (mean over seeds): the KL term keeps the policy
# slightly more stochastic. Either way this is one 40-step setting; it is
# consistent with V3.2's remark that weak or no KL can work for maths, and no evidence for a
# general rule.
#
# ## 3.5 At scale
#
# What Dr.GRPO reports {cite:p}`liu2025drgrpo`, beside this chapter:

# %% tags=["hide-input", "nbval-ignore-output"]
paper_vs_ours = pd.DataFrame([
    {"": "headline", "Dr.GRPO paper": "Oat-Zero-7B (Qwen2.5-Math-7B + Dr.GRPO): AIME 2024 43.3, average of five "
                                      "benchmarks 51.4 (Table 4, 3k-token budget)",
     "this chapter": f"Dr.GRPO greedy accuracy {stats.format_interval(stats.t_interval(grid['Dr.GRPO'].final(), bounds=(0, 1)))}"},
    {"": "bias experiment", "Dr.GRPO paper": "Fig. 5: Qwen2.5-1.5B base, R1 template, MATH, about 150 policy steps, "
                                             "responses of about 0.4k-1.8k tokens",
     "this chapter": f"{profile.steps} steps, responses of at most {task.max_new_tokens} tokens"},
    {"": "recipe", "Dr.GRPO paper": "MATH levels 3-5, 27 hours on 8 A100 (7B); the README's 1.5B example run: "
                                    "lr 1e-6, beta 0, G = 8, 3,000-token budget",
     "this chapter": f"lr {profile.config.lr}, beta 0, G = {profile.config.group_size}"},
    {"": "length-biased losses in code (Table 2)", "Dr.GRPO paper": "trl, OpenRLHF, verl, SimpleRL-Zero, "
                                                                     "Open-Reasoner-Zero",
     "this chapter": "seq_mean_token_mean and token_mean are both in grpo_lab; seq_mean_token_sum_norm is Dr.GRPO's"},
]).set_index("")
from IPython.display import display

with pd.option_context("display.max_colwidth", None):  # show whole cells, not "..."
    display(paper_vs_ours)

# %% [markdown]
# Table 2's point is about the libraries' *defaults* at the time: each normalised its loss by a
# length-dependent token count (per response, like the $1/\olen{i}$ of {eq}`eq-drgrpo-weight`, or
# per batch), instead of a constant. The GPU
# profile (`PROFILE = "gpu"`) runs this chapter's grid at a larger scale; no GPU-profile results
# are stored for it yet, and a length-bias experiment that can show the effect needs responses
# whose length is free, which this chapter does not have yet.
#
# ## 3.6 Takeaways
#
# * GRPO's length bias comes from $1/\olen{i}$, its difficulty bias from $1/\std$; they are
#   independent and Dr.GRPO removes both (`group_mean` + `seq_mean_token_sum_norm`).
# * All-equal groups have advantage exactly 0 with or without the std.
# * Dr.GRPO is the plain policy gradient with a mean baseline; its centred reward is RLOO's up to
#   $G/(G-1)$.
# * V3.2: no std but $1/\olen{i}$ kept (it does not go all the way to Dr.GRPO), $k_3$ with the
#   importance ratio (reverse-KL gradient), and masking of stale negative samples. mHC and self-verification are not part of its RL recipe.
#
# ## Exercises
#
# 1. Show that for 0/1 rewards the *sum* of $|\Ahat_i|$ over a group is $2Gp(1-p)/\std$ under GRPO
#    and $2Gp(1-p)$ under Dr.GRPO. Which questions dominate each?
#
# :::{admonition} Solution
# :class: dropdown
#
# $k=Gp$ answers deviate by $1-p$ and $G-k$ by $p$: the total is $Gp(1-p)+G(1-p)p=2Gp(1-p)$ before
# the std division. Dr.GRPO weighs 50/50 questions most; GRPO's total is
# $2Gp(1-p)/\sqrt{Gp(1-p)/(G-1)}=2\sqrt{G(G-1)p(1-p)}$, which falls off more slowly toward 0 and 1.
# The cell below checks both for $G=8$.
# :::

# %%
for k in range(1, 8):
    r8 = torch.tensor([1.0] * k + [0.0] * (8 - k))
    p8 = k / 8
    assert abs(float(group_advantages(r8, 8, scale="none").abs().sum()) - 2 * 8 * p8 * (1 - p8)) < 1e-5
    assert abs(float(group_advantages(r8, 8, eps=0.0).abs().sum()) - 2 * math.sqrt(8 * 7 * p8 * (1 - p8))) < 1e-4
print("exercise checks passed")

# %% tags=["nbval-ignore-output", "remove-cell"]
book.glue("drgrpo_runtime", f"{(time.perf_counter() - CHAPTER_START) / 60:.1f} minutes")

# %% [markdown]
# ## References
#
# The papers cited in this chapter are listed in {ref}`sec-references`.
