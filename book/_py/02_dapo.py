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
# (sec-dapo)=
# # 2. DAPO: clip-higher, dynamic sampling, token-level loss, overlong shaping
#
# **The problem.** Run naive GRPO long enough on long reasoning and four things go wrong, says DAPO
# {cite:p}`yu2025dapo`: entropy collapses (the policy stops exploring), more and more groups are
# all-correct or all-wrong and so carry no gradient, long responses are under-weighted by the
# per-sample average, and truncated responses get a wrong-answer reward for being long rather than
# wrong. DAPO fixes each with one switch, and its Table 1 adds them one at a time.
#
# **Which axes it moves** (see {ref}`sec-intro`): clipping — $\epshigh > \epslow$ (Eq. 10);
# aggregation — `token_mean` over the whole group (Eq. 12); sampling & shaping — dynamic sampling
# (Eq. 11), overlong filtering and soft overlong punishment (Eq. 13); regulariser — no KL term
# (§2.3). The advantage keeps GRPO's std (Eq. 9).
#
# **Prerequisites:** {ref}`sec-grpo`. **Run time:** {glue:text}`dapo_runtime` on two CPU cores
# (measured on the last execution; 30 training runs in two processes).

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
STEPS = 25  # RL steps per run in the CPU profile (6 settings x 5 seeds)
N_JOBS = 2  # worker processes; results do not depend on it

# %% tags=["hide-input"]
import math
import time

import numpy as np
import pandas as pd
import torch
import matplotlib.pyplot as plt

from grpo_lab import book, experiments, plotting, stats
from grpo_lab.advantages import group_advantages
from grpo_lab.algorithms import DAPO, GRPO
from grpo_lab.objectives import policy_loss
from grpo_lab.rewards import overlong_penalty

book.setup_notebook(seed=0)
CHAPTER_START = time.perf_counter()

# %% [markdown]
# ## 2.1 Clip-higher: how fast can a rare token rise?
#
# GRPO clips the ratio at $1+\varepsilon$ for a positive advantage ({ref}`sec-grpo-clip`). In
# probability, a token sampled with $\piold = p$ can rise to at most $p(1+\varepsilon)$ before its
# gradient is switched off. That cap is absolute for rare tokens and irrelevant for likely ones:
# with $\varepsilon = 0.2$, a token at $0.01$ may reach $0.012$, a token at $0.9$ may reach $1.08$ —
# no cap at all. Exploration tokens are the rare ones, so a symmetric clip slows exactly the
# updates that keep entropy up. DAPO decouples the two ends (Eq. 10):
#
# $$
# \mathcal J_{\mathrm{DAPO}}(\theta)=\E\Bigg[\frac{1}{\sum_{i=1}^G\olen{i}}\sum_{i=1}^G\sum_{t=1}^{\olen{i}}\min\Big(r_{i,t}(\theta)\Ahat_{i,t},\ \clip\big(r_{i,t}(\theta),1-\epslow,1+\epshigh\big)\Ahat_{i,t}\Big)\Bigg]
# \quad\text{s.t.}\quad 0<\big|\{o_i : o_i\ \text{correct}\}\big|<G
# $$ (eq-dapo-objective)
#
# with $\epslow = 0.2$ kept (lowering the floor would let rare tokens be pushed to zero and shrink
# the sampling space) and $\epshigh = 0.28$. The cell below finds, by autograd on `policy_loss`,
# the largest probability a positive-advantage token can reach with a non-zero gradient.

# %%
def highest_prob_with_gradient(p_old, algo):
    """Largest new probability (on a fine grid) at which the token's gradient is still non-zero."""
    probs = torch.linspace(p_old, min(1.0, 1.5 * p_old), 20001)[1:]
    lp = torch.log(probs)[:, None].clone().requires_grad_()
    old = torch.full_like(lp, math.log(p_old))
    adv = torch.ones(len(probs))
    loss = policy_loss(lp, old, adv, torch.ones_like(lp), algo.replace(kl=None, beta=0.0)).loss
    (grad,) = torch.autograd.grad(loss, lp)
    alive = grad[:, 0] != 0
    return float(probs[alive].max())


symmetric = GRPO.replace(name="symmetric")
rows = []
for p in (0.01, 0.1, 0.5, 0.9):
    rows.append({"p_old": p, "cap eps=0.2": highest_prob_with_gradient(p, symmetric),
                 "cap eps_high=0.28": highest_prob_with_gradient(p, DAPO)})
caps = pd.DataFrame(rows).set_index("p_old")
print(caps.round(4).to_string())
assert abs(caps.loc[0.01, "cap eps=0.2"] - 0.012) < 1e-5 and abs(caps.loc[0.01, "cap eps_high=0.28"] - 0.0128) < 1e-5
assert caps.loc[0.9, "cap eps=0.2"] > 0.99  # the cap p(1+eps) = 1.08 is above 1: no cap at all

# %% [markdown]
# The paper's example reproduces: $0.01 \to 0.012$ under the symmetric clip, $0.0128$ with
# clip-higher, while a token at $0.9$ is not capped at all.
#
# ## 2.2 Token-level loss: who gets the gradient?
#
# GRPO averages over the tokens of each response, then over responses
# (`seq_mean_token_mean`, {eq}`eq-grpo-objective`): every *response* weighs the same, so each token
# of a long response weighs less. DAPO's Eq. 12 divides the sum over all tokens of the group by
# the group's total token count (`token_mean`): every *token* weighs the same. The figure takes a
# group of four responses — short and long, right and wrong — and reads each token's gradient off
# autograd for both aggregations.

# %% tags=["hide-input"]
lengths = [5, 25, 5, 25]
labels = ["short right", "long right", "short wrong", "long wrong"]
adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
T = max(lengths)
mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])
weights = {}
for agg in ("seq_mean_token_mean", "token_mean"):
    lp = torch.zeros(4, T, requires_grad=True)
    algo = GRPO.replace(kl=None, beta=0.0, aggregation=agg)
    policy_loss(lp, torch.zeros(4, T), adv, mask, algo).loss.backward()
    weights[agg] = (-lp.grad[:, 0]).numpy()  # gradient of the objective w.r.t. one token's log-prob
fig, ax = plt.subplots(figsize=(6.4, 2.8))
x = np.arange(4)
ax.bar(x - 0.2, weights["seq_mean_token_mean"], 0.4, label="seq_mean_token_mean (GRPO)", color=plotting.algo_color("GRPO"))
ax.bar(x + 0.2, weights["token_mean"], 0.4, label="token_mean (DAPO Eq. 12)", color=plotting.algo_color("DAPO"))
ax.axhline(0, color="k", lw=0.6)
ax.set_xticks(x, [f"{l}\n|o|={n}" for l, n in zip(labels, lengths)])
ax.set_ylabel("gradient per token")
ax.legend(fontsize=8)
fig.tight_layout()
book.glue("fig_dapo_token_weights", fig)

# %%
w_seq, w_tok = weights["seq_mean_token_mean"], weights["token_mean"]
assert np.allclose(w_seq, adv.numpy() / (4 * np.array(lengths)))  # A_i / (G |o_i|)
assert np.allclose(w_tok, adv.numpy() / sum(lengths))  # A_i / sum_j |o_j|
print("per-token weight, long vs short response:",
      f"seq_mean_token_mean {w_seq[1] / w_seq[0]:.2f}x, token_mean {w_tok[1] / w_tok[0]:.2f}x")
print("share of the group's total gradient on the long responses:",
      f"seq_mean_token_mean {np.abs(w_seq * lengths)[[1, 3]].sum() / np.abs(w_seq * lengths).sum():.2f},",
      f"token_mean {np.abs(w_tok * lengths)[[1, 3]].sum() / np.abs(w_tok * lengths).sum():.2f}")

# %% [markdown]
# ```{glue:figure} fig_dapo_token_weights
# :name: fig-dapo-token-weights
#
# Gradient on one token's log-probability, for each response of a group of four, under the two
# aggregations (`grpo_lab.objectives.policy_loss`, on-policy, $|\Ahat|=1$). Per sample, a token of
# a 25-token response gets a fifth of the weight of a token of a 5-token response; per token, all
# tokens are equal, so the long responses carry 5/6 of the group's gradient instead of 1/2.
# ```
#
# This matters in both directions. A long *wrong* response is penalised gently per token under the
# per-sample average — patterns like repetition inside it are barely discouraged — and a long
# *right* response is rewarded gently. DAPO reports healthier entropy and length growth with the
# token-level loss. In code, Eq. 12's denominator is the token count of the *whole* batch: when a
# batch is split into micro-batches, each micro-batch must be divided by the global count
# (`num_tokens=`), or long and short micro-batches are weighted differently (tested in
# `tests/test_objectives.py` and `tests/test_dapo.py`).
#
# ## 2.3 Dynamic sampling: groups without a gradient
#
# If every response of a group gets the same reward, $r_i - \mean(\mathbf r) = 0$ for all of them:
# the group's advantage is exactly zero and so is its gradient. With per-question success rate
# $p$, a group of $G$ independent samples is uninformative with probability
#
# $$
# P(\text{all equal}) = p^G + (1-p)^G ,
# $$ (eq-dapo-zero-groups)
#
# which grows as training succeeds ($p\to1$) — the effective batch shrinks just when the policy
# gets good. DAPO's constraint in {eq}`eq-dapo-objective` (Eq. 11) keeps sampling questions and
# drops groups whose accuracy is 0 or 1 until the batch is full. The filter uses the *raw
# correctness*: a shaped reward (like the overlong penalty below) can differ inside a group whose
# answers are all right.

# %%
all_right = torch.ones(8)
a = group_advantages(all_right, group_size=8)
assert torch.equal(a, torch.zeros(8))  # exactly zero advantage -> zero gradient
p = np.linspace(0, 1, 101)
for G in (8, 16):
    zero = p ** G + (1 - p) ** G
    print(f"G={G}: P(all equal) at p=0.5: {0.5 ** G * 2:.4f}, at p=0.8: {0.8 ** G + 0.2 ** G:.3f}, at p=0.95: {0.95 ** G + 0.05 ** G:.3f}")

# %% [markdown]
# ## 2.4 Overlong reward shaping
#
# A response cut off at the generation budget has no answer, so it scores as wrong — a penalty for
# length that is noise with respect to reasoning quality. DAPO first *filters* such samples (their
# loss is masked: `overlong_filter=True`), then replaces the hard cut with a *soft punishment*
# added to the reward (Eq. 13):
#
# $$
# R_{\mathrm{length}}(y)=\begin{cases}0, & |y|\le \Lmax-L_{\mathrm{cache}}\\[2pt] \dfrac{(\Lmax-L_{\mathrm{cache}})-|y|}{L_{\mathrm{cache}}}, & \Lmax-L_{\mathrm{cache}}<|y|\le \Lmax\\[6pt] -1, & \Lmax<|y|\end{cases}
# $$ (eq-dapo-overlong)
#
# In the paper $\Lmax = 20{,}480$ is the generation cap and $L_{\mathrm{cache}} = 4{,}096$, so the
# penalty starts at $16{,}384$ tokens and reaches $-1$ at the cap.

# %% tags=["hide-input"]
L_max, L_cache = 20480, 4096
ys = torch.arange(0, 22001, 16)
pen = overlong_penalty(ys, max_len=L_max, cache_len=L_cache)
fig, ax = plt.subplots(figsize=(6.4, 2.6))
ax.plot(ys, pen, color="C1")
ax.axvline(L_max - L_cache, color="k", lw=0.6, ls="--")
ax.axvline(L_max, color="k", lw=0.6, ls="--")
ax.set_xlabel("response length |y| (tokens)")
ax.set_ylabel(r"$R_{length}(y)$")
fig.tight_layout()
book.glue("fig_dapo_overlong", fig)

# %%
checks = {16383: 0.0, 16384: 0.0, 16385: -1 / 4096, 18432: -0.5, 20480: -1.0, 20481: -1.0}
got = overlong_penalty(torch.tensor(list(checks)), max_len=L_max, cache_len=L_cache)
assert torch.allclose(got, torch.tensor(list(checks.values())), atol=1e-7), got
print({k: round(float(v), 6) for k, v in zip(checks, got)})

# %% [markdown]
# ```{glue:figure} fig_dapo_overlong
# :name: fig-dapo-overlong
#
# DAPO's soft overlong punishment (Eq. 13) with the paper's $\Lmax = 20{,}480$ and
# $L_{\mathrm{cache}} = 4{,}096$, computed by `grpo_lab.rewards.overlong_penalty`: zero up to
# $16{,}384$ tokens, then a linear ramp to $-1$ at the cap.
# ```
#
# :::{admonition} Common misreadings
# :class: warning
#
# * **"DAPO drops the std normalisation."** No: DAPO's advantage (Eq. 9) is GRPO's
#   $(R_i-\mean)/\std$. Dropping the std is Dr.GRPO's change {cite:p}`liu2025drgrpo`.
# * **"$\Lmax$ is where the penalty starts."** $\Lmax$ is the generation cap (20,480); the penalty
#   starts at $\Lmax - L_{\mathrm{cache}} = 16{,}384$, the "expected maximum length". Swapping the
#   two moves the whole ramp by 4,096 tokens.
# * **"Token-level loss = divide each micro-batch by its own token count."** Eq. 12's denominator
#   is the token count of the whole group/batch; a per-micro-batch mean re-weights tokens by which
#   micro-batch they landed in.
# * **"Dynamic sampling filters on the reward."** It filters on correctness (accuracy 0 or 1,
#   Eq. 11); with the overlong penalty added, rewards in an all-correct group can still differ.
# * **"DAPO reaches 50 on AIME 2024 in half the steps."** Half *of what* matters: DAPO reaches 50
#   with 50% of the training steps of DeepSeek-R1-Zero-Qwen-32B (which scores 47), on the same
#   Qwen2.5-32B base. It is a step comparison against R1-Zero's recipe, not against naive GRPO's
#   30 in Table 1.
# :::
#
# ## 2.5 Experiment: the progressive ablation at CPU scale
#
# Table 1 of the paper adds the techniques one at a time to "naive GRPO". The paper writes GRPO
# with its KL term (§2.2) and removes the KL only for DAPO (§2.3); it does not say whether its
# naive-GRPO row kept it. Our "naive GRPO" has no KL term, so that every row differs from the next
# by exactly one switch, and the KL question is {ref}`chapter 3's <sec-drgrpo>`. We do the same on the arithmetic task of {ref}`sec-grpo`, from the same base
# checkpoint, 5 seeds × 6 settings, all with two minibatches per rollout (so the second optimiser
# step is off-policy and the clip can act). The last row is the `DAPO` preset.

# %%
naive = GRPO.replace(name="naive GRPO", kl=None, beta=0.0)
settings = [
    naive,
    naive.replace(name="+ overlong filtering", overlong_filter=True),
    naive.replace(name="+ clip-higher", overlong_filter=True, eps_high=0.28),
    naive.replace(name="+ soft overlong punishment", overlong_filter=True, eps_high=0.28, overlong_cache_len=6),
    naive.replace(name="+ token-level loss", overlong_filter=True, eps_high=0.28, overlong_cache_len=6,
                  aggregation="token_mean"),
    DAPO.replace(name="+ dynamic sampling (DAPO)"),
]
profile = experiments.get_profile(PROFILE)
steps = STEPS if PROFILE == "cpu" else profile.steps
for s in settings:
    print(f"{s.name:28s}", {k: v for k, v in s.axes().items() if k in (
        "eps_high", "aggregation", "dynamic_sampling", "overlong_filter", "overlong_cache_len")})

# %% tags=["nbval-ignore-output"]
grid = experiments.run_grid(settings, profile=PROFILE, seeds=SEEDS, steps=steps, n_jobs=N_JOBS)
hist = pd.concat([r.history for r in grid.values()], ignore_index=True)
print(f"{len(settings)} settings x {len(SEEDS)} seeds x {steps} steps in "
      f"{next(iter(grid.values())).provenance['wall_seconds']:.0f} s")

# %% tags=["hide-input", "nbval-ignore-output"]
order = [s.name for s in settings]
# GRPO and DAPO in the book's colours (grpo_lab.plotting.ALGO_COLORS); the intermediate rows in colours
# no algorithm uses
colors = dict(zip(order, [plotting.algo_color("GRPO"), "#555555", "#ece133", "#fbafe4", "#8c564b",
                          plotting.algo_color("DAPO")]))
pair = hist[hist["algo"].isin(["+ overlong filtering", "+ clip-higher"])]
fig, axes = plt.subplots(1, 3, figsize=(9.6, 2.9))
plotting.band_plot(axes[0], pair[pair.step > 0], "step", "entropy", colors=colors, title="entropy",
                   band="ci95", bounds=(0, math.inf))
plotting.band_plot(axes[1], pair.dropna(subset=["test_accuracy"]), "step", "test_accuracy", colors=colors,
                   title="greedy test accuracy", legend=True, band="ci95", bounds=(0, 1))
plotting.band_plot(axes[2], pair[pair.step > 0], "step", "clip_frac_high", colors=colors,
                   title=r"tokens clipped at $1+\varepsilon_{high}$", band="ci95", bounds=(0, 1))
for ax, unit in zip(axes, ("nats per token", "fraction correct", "fraction of tokens")):
    ax.set_xlabel("RL step")
    ax.set_ylabel(unit)
fig.tight_layout()
book.glue("fig_dapo_clip_higher", fig)

# %% [markdown]
# ```{glue:figure} fig_dapo_clip_higher
# :name: fig-dapo-clip-higher
#
# Symmetric clip ($\varepsilon=0.2$) against clip-higher ($\epshigh=0.28$), both with overlong
# filtering, mean with 95% t interval over five seeds: entropy, greedy test accuracy, and the fraction of tokens
# whose gradient the upper clip removed.
# ```

# %% tags=["hide-input", "nbval-ignore-output"]
two = hist[hist["algo"].isin(["naive GRPO", "+ dynamic sampling (DAPO)"]) & (hist.step > 0)]
fig, axes = plt.subplots(1, 2, figsize=(7.6, 2.9))
plotting.band_plot(axes[0], two, "step", "zero_adv_group_frac", colors=colors,
                   title="zero-advantage groups (before filtering)", legend=True, band="ci95", bounds=(0, 1))
plotting.band_plot(axes[1], two, "step", "samples_per_trained", colors=colors,
                   title="samples generated per sample trained", band="ci95", bounds=(1, math.inf))
for ax, unit in zip(axes, ("fraction of groups", "responses per response")):
    ax.set_xlabel("RL step")
    ax.set_ylabel(unit)
fig.tight_layout()
book.glue("fig_dapo_dynamic", fig)

# %% [markdown]
# ```{glue:figure} fig_dapo_dynamic
# :name: fig-dapo-dynamic
#
# Left: fraction of generated groups whose answers are all right or all wrong (zero advantage),
# for naive GRPO and DAPO. Right: what dynamic sampling costs — responses generated per response
# that enters the loss (1 for every method without the filter).
# ```

# %% tags=["nbval-ignore-output"]
naive_final = grid["naive GRPO"].final()


def summarise(name, r):
    h, f = r.history, r.final()
    late = h[h.step > steps - 5]
    diff = "—" if name == "naive GRPO" else stats.format_interval(stats.paired_difference(f, naive_final))
    return {"final greedy acc": stats.format_interval(stats.t_interval(f, bounds=(0, 1))),
            "vs naive GRPO (paired)": diff,
            "entropy (last 5 steps)": f"{late['entropy'].mean():.3f}",
            "zero-adv groups": f"{h['zero_adv_group_frac'].mean():.3f}",
            "samples / trained": f"{h['samples_per_trained'].mean():.2f}",
            "truncated": f"{h['truncation_rate'].mean():.4f}"}


table = pd.DataFrame({name: summarise(name, r) for name, r in grid.items()}).T
book.glue("dapo_table", table)
for name, key in [("naive GRPO", "naive"), ("+ dynamic sampling (DAPO)", "dapo")]:
    book.glue(f"dapo_acc_{key}", table.loc[name, "final greedy acc"])
book.glue("dapo_diff_dapo", table.loc["+ dynamic sampling (DAPO)", "vs naive GRPO (paired)"])
separated = [n for n in list(grid)[1:-1]
             if stats.paired_difference(grid[n].final(), naive_final).excludes(0.0)]
book.glue("dapo_rows_separated", ", ".join(f"“{n}” ({table.loc[n, 'vs naive GRPO (paired)']})" for n in separated)
          if separated else "none of them")
book.glue("dapo_binom_se", f"{stats.binomial_se(float(naive_final.mean()), 198):.3f}")
book.glue("dapo_cost", round(float(grid["+ dynamic sampling (DAPO)"].history["samples_per_trained"].mean()), 2))
book.glue("dapo_trunc", round(float(hist["truncation_rate"].max()), 3))
table

# %%
# Robust facts at this scale (checked on every run).
base = grid["naive GRPO"].base().mean()
for name, r in grid.items():
    assert r.final().mean() > base + 0.05, name  # every setting learns
d = grid["+ dynamic sampling (DAPO)"].history
assert (d["samples_per_trained"].dropna() >= 1).all() and d["samples_per_trained"].mean() > 1.2  # filtering costs generation
assert (grid["naive GRPO"].history["samples_per_trained"].dropna() == 1).all()
assert hist["zero_adv_group_frac"].mean() > 0.05  # uninformative groups are common
assert grid["+ dynamic sampling (DAPO)"].final().mean() > grid["naive GRPO"].final().mean() + 0.02
print("checks passed")

# %% [markdown]
# ```{glue:} dapo_table
# ```
#
# *The progressive ablation (DAPO Table 1's rows) at CPU scale: final greedy test accuracy (mean
# [95% t interval] over five seeds, 25 steps), its paired difference from naive GRPO over the same
# seeds, mean entropy over the last five steps (nats per token), mean fraction of zero-advantage
# groups among generated groups, responses generated per response trained, and the truncation
# rate.*
#
# **What reproduced, and what did not.** The mechanisms reproduce exactly: the clip caps of
# §2.1, the per-token weights of §2.2, the zero gradient of all-equal groups and the penalty curve
# are computed by the package and asserted. In training, dynamic sampling does what it promises —
# every trained group has a non-zero advantage, although between a fifth and a quarter of generated groups have
# none — and its price is visible: {glue:text}`dapo_cost` responses generated per response
# trained. Full DAPO ends with the highest greedy accuracy ({glue:text}`dapo_acc_dapo` against
# {glue:text}`dapo_acc_naive` for naive GRPO; paired difference {glue:text}`dapo_diff_dapo`). These
# intervals describe the spread over seeds on our fixed 198-question test set; a different test
# set of that size would add a binomial error of about {glue:text}`dapo_binom_se` to each
# evaluation. This matches the paper's Table 1, where dynamic sampling
# is also the largest single step — but both settings train on 16 groups per step, and what
# differs is the generation behind them: the filtered batch is refilled from about twice as many
# generated responses, and this chapter has no control matched for that compute yet. Among the
# four intermediate rows, those whose paired 95% interval against naive GRPO excludes zero:
# {glue:text}`dapo_rows_separated`. Four comparisons at 95% each make one such exclusion by a
# hair likely by chance (with a Bonferroni correction for four, a lower bound this close to zero
# would not survive), and small differences move between machines ({ref}`the introduction
# <sec-intro>` on reproducibility), so the ordering of the intermediate rows is not evidence
# either way. Two rows can barely
# differ by construction: almost no response reaches the 32-token budget (largest truncation rate
# in any step: {glue:text}`dapo_trunc`), so overlong filtering and the soft punishment (which
# starts at 26 tokens) almost never act. And clip-higher does not keep entropy up here: the upper clip rarely
# binds (figure above) because with two minibatches per rollout the policy barely moves
# off-policy, and entropy falls the same way with and without it. The entropy collapse DAPO fights
# develops over thousands of steps with 16 optimiser steps per rollout; what this chapter gives
# you is the exact objective and switches, tested, and the paper's accuracy gains need its scale.
#
# ## 2.6 At scale
#
# DAPO's Table 1 adds the same switches one at a time on Qwen2.5-32B base (AIME 2024, avg@32; G = 16,
# 16 gradient updates per rollout, learning rate 1e-6, responses up to 20,480 tokens), beside this
# chapter's rows at CPU scale:

# %% tags=["hide-input", "nbval-ignore-output"]
paper_table1 = [30, 36, 38, 41, 42, 50]
at_scale = pd.DataFrame({
    "DAPO Table 1: AIME 2024 avg@32 (Qwen2.5-32B)": paper_table1,
    "this chapter: final greedy accuracy (arithmetic, 0.3M parameters)": [table.loc[n, "final greedy acc"] for n in grid],
}, index=list(grid))
at_scale

# %% [markdown]
# The two columns are not comparable in level (a different task, model and metric); what can be
# compared is the order and the size of the steps. In the paper each switch helps and dynamic
# sampling adds the most (+8). Here the intermediate rows whose paired interval against naive
# GRPO excludes zero are: {glue:text}`dapo_rows_separated` (see the caveat on multiple comparisons
# above); the overlong switches cannot act because almost nothing reaches the budget. DAPO's headline is a
# step comparison: 50 on AIME 2024 with 50% of the training steps of DeepSeek-R1-Zero-Qwen-32B,
# which scores 47. On a GPU, `PROFILE = "gpu"` in the parameters cell runs the same ablation at the
# GPU profile's scale; no GPU-profile results are stored for this chapter yet.
#
# ## 2.7 Takeaways
#
# * Clip-higher raises only $\epshigh$: it lets rare tokens grow faster ($0.01\to0.0128$ instead of
#   $0.012$) and leaves the floor alone.
# * `token_mean` weighs every token equally; its denominator is the whole batch's token count, so
#   micro-batches must use the global count.
# * All-correct and all-wrong groups have exactly zero advantage; dynamic sampling replaces them
#   at the cost of extra generation, and filters on correctness, not on the shaped reward.
# * Overlong shaping only matters when responses reach the budget; $\Lmax$ is the cap and the ramp
#   starts $L_{\mathrm{cache}}$ below it.
#
# ## Exercises
#
# 1. With $\epslow=0.2$, how low can a negative-advantage token at $\piold=0.5$ be pushed before
#    its gradient stops? Check with `policy_loss`.
# 2. For $G=16$ and a question of success rate $p=0.9$, what fraction of groups does dynamic
#    sampling throw away, and how many groups must be generated on average per kept group?
#
# :::{admonition} Solutions
# :class: dropdown
#
# 1. To $0.5\,(1-0.2) = 0.4$: below that the clipped branch is the minimum and the gradient is
#    zero (the cell below checks it).
# 2. $0.9^{16}+0.1^{16} \approx 0.185$ of the groups are dropped; the expected number generated per
#    kept group is $1/(1-0.185)\approx1.23$.
# :::

# %%
lp = torch.log(torch.tensor([[0.41], [0.39]])).requires_grad_()
loss = policy_loss(lp, torch.log(torch.full((2, 1), 0.5)), torch.tensor([-1.0, -1.0]), torch.ones(2, 1),
                   GRPO.replace(kl=None, beta=0.0)).loss
(g,) = torch.autograd.grad(loss, lp)
assert g[0, 0] != 0 and g[1, 0] == 0  # 0.41 still pushed down, 0.39 (< 0.4) no longer
drop = 0.9 ** 16 + 0.1 ** 16
assert abs(drop - 0.1853) < 1e-4 and abs(1 / (1 - drop) - 1.2275) < 1e-3
print("exercise checks passed")

# %% tags=["nbval-ignore-output", "remove-cell"]
book.glue("dapo_runtime", f"{(time.perf_counter() - CHAPTER_START) / 60:.1f} minutes")

# %% [markdown]
# ## References
#
# The papers cited in this chapter are listed in {ref}`sec-references`.
