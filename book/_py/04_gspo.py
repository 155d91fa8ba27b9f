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
# (sec-gspo)=
# # GSPO: one importance ratio per response
#
# **The problem.** GRPO rewards a whole response but corrects for off-policy sampling token by
# token: each token's ratio $r_{i,t}=\pitheta/\piold$ is an importance weight computed from a
# single sample of that token's next-token distribution. Such a weight corrects nothing on its
# own; it only adds noise, and over a long response the noise of many tokens accumulates. On a
# Mixture-of-Experts (MoE) model it is worse: after an update the router sends some tokens to other
# experts, and their ratios jump for a reason unrelated to the policy's improvement. GSPO
# {cite:p}`zheng2025gspo` puts the importance weight where the reward is: one ratio per response,
# the geometric mean of its token ratios, clipped as a whole.
#
# **Which axis it moves:** the importance ratio, `ratio_level="sequence"` in `grpo_lab`, and with it
# the scale of the trust region (a clip range of $3\times10^{-4}$ / $4\times10^{-4}$ instead of
# $0.2$). Advantages stay GRPO's group z-scores, and there is no KL term.
#
# **Prerequisites:** {ref}`sec-grpo` (PPO's clip, several updates per rollout). **Run time:**
# {glue:text}`gspo_runtime` on two CPU cores (profile `cpu`, measured on the last execution). With
# `PROFILE = "gpu"` it also trains GRPO and GSPO on GSM8K from a hub instruct model (§4.8: hours).

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
PROFILE = "cpu"  # "gpu": also train §4.8's GSM8K comparison on a hub instruct model (CUDA)
GPU_SEEDS = (0, 1, 2, 3, 4)  # the GSM8K runs (PROFILE = "gpu" only)
GPU_STEPS = None  # None: the gpu profile's 60 steps
GPU_N_JOBS = 1  # GSM8K runs at a time, processes sharing the GPU
SEEDS = (0, 1, 2, 3, 4)
N_JOBS = 2  # worker processes; results do not depend on it

# %% tags=["hide-input"]
import dataclasses
import math
import time

import numpy as np
import pandas as pd
import torch
import matplotlib.pyplot as plt

from grpo_lab import book, experiments, plotting, stats
from grpo_lab.algorithms import GRPO, GSPO, GSPO_TOKEN
from grpo_lab.models import load_policy
from grpo_lab.objectives import policy_loss, sequence_log_ratio
from grpo_lab.rollout import policy_logprobs
from grpo_lab.tasks import get_task
from grpo_lab.trainer import Trainer

book.setup_notebook(seed=0, profile=PROFILE)
CHAPTER_START = time.perf_counter()

# %% [markdown]
# ## 4.1 The importance weight of a response, and why its raw form fails
#
# The reward $r(q, o_i)$ judges a whole response, so the importance weight that moves an
# expectation over responses from $\piold$ to $\pitheta$ is the likelihood ratio of the whole
# response, a product of token ratios:
#
# $$
# w_i(\theta)=\frac{\pitheta(o_i\given q)}{\piold(o_i\given q)}=\prod_{t=1}^{\olen{i}}r_{i,t}(\theta),
# \qquad
# \log w_i=\sum_{t=1}^{\olen{i}}\log r_{i,t},\qquad
# r_{i,t}(\theta)=\frac{\pitheta(o_{i,t}\given q,o_{i,<t})}{\piold(o_{i,t}\given q,o_{i,<t})} .
# $$ (eq-gspo-product)
#
# This weight is unbiased, and unusable: its log is a sum of $\olen{i}$ terms. If the token
# log-ratios were independent with variance $\sigma^2$, $\Var[\log w_i]=\olen{i}\,\sigma^2$, so
# the weight's spread grows exponentially with the length of the response (GSPO §3 makes the
# argument; the paper writes $y_i$ for our $o_i$). We measure it on real rollouts: 64 questions
# × 8 samples from chapter 1's base policy, then one rollout's worth of GRPO updates — four
# minibatch steps, as in GSPO's §5.1 — and the log-ratios of every sampled token between the
# policy after those updates and $\piold$. For each prefix length $t$ the cell computes the
# variance over responses of the log of the product of the first $t$ token ratios, and of their
# geometric mean.

# %% tags=["nbval-ignore-output"]
prof = experiments.get_profile("cpu")  # on every machine: the GSM8K runs are §4.8's
UPDATES = 4  # minibatch updates per rollout (GSPO §5.1: "each batch ... split into four minibatches")
policy, tokenizer = load_policy(prof.base)
task = get_task(prof.task, **dict(prof.task_kwargs))
GRPO_NOKL = GRPO.replace(name="GRPO", kl=None, beta=0.0, eps_high=0.27)  # GSPO §5.1's GRPO baseline
probe_cfg = dataclasses.replace(prof.config, seed=0, prompts_per_step=64, minibatches=UPDATES, eval_every=0,
                                progress=False)
probe = Trainer(policy, tokenizer, task, GRPO_NOKL, probe_cfg)
probe_batch = probe.collect()
probe.compute_advantages(probe_batch)
with torch.no_grad():
    lp_old = policy_logprobs(probe.policy, probe_batch.rollout).double()
probe_updates, _, _ = probe.update(probe_batch)  # the trainer's own update stage: 4 minibatch steps
with torch.no_grad():
    lp_new = policy_logprobs(probe.policy, probe_batch.rollout).double()
mask = probe_batch.loss_mask.bool()
log_r = torch.where(mask, lp_new - lp_old, torch.zeros_like(lp_new))  # [B, T] token log-ratios, 0 on padding
lengths = mask.sum(1)
prefix = log_r.cumsum(1)
rows = []
for t in range(1, int(lengths.max()) + 1):
    alive = lengths >= t
    if alive.sum() < 20:  # too few responses this long for a variance
        break
    s = prefix[alive, t - 1]
    rows.append({"t": t, "responses": int(alive.sum()), "var_log_product": float(s.var()),
                 "var_log_geomean": float((s / t).var())})
prefix_var = pd.DataFrame(rows)
sigma2 = float(log_r[mask].var())
print(f"{len(lengths)} responses, {int(mask.sum())} tokens, lengths {int(lengths.min())}-{int(lengths.max())}; "
      f"per-token variance of log r: {sigma2:.4f} nats^2")

# %% tags=["hide-input", "nbval-ignore-output"]
fig, ax = plt.subplots(figsize=(6.4, 2.9))
ax.plot(prefix_var["t"], prefix_var["var_log_product"], marker=".", color=plotting.algo_color("GRPO"),
        label=r"$\log\prod_{t'\leq t} r_{t'}$ (product of token ratios)")
ax.plot(prefix_var["t"], prefix_var["var_log_geomean"], marker=".", color=plotting.algo_color("GSPO"),
        label=r"$\frac{1}{t}\sum_{t'\leq t}\log r_{t'}$ (geometric mean, GSPO Eq. 7)")
ax.set_yscale("log")
ax.set_xlabel("prefix length t (tokens)")
ax.set_ylabel("variance over responses (nats²)")
fig.tight_layout()
plotting.legend_below(fig, ncols=1)
book.glue("fig_gspo_prefix_var", fig)

# %%
first, last = prefix_var.iloc[0], prefix_var.iloc[-1]
assert last["var_log_product"] > 3 * first["var_log_product"]  # the product's log spreads with length ...
assert last["var_log_geomean"] < first["var_log_geomean"] / 3  # ... the geometric mean's contracts
LONG = 1000  # tokens: a short reasoning trace at scale
book.glue("gspo_sigma2", f"{sigma2:.3f}")
book.glue("gspo_var_first", f"{first['var_log_product']:.3f}")
book.glue("gspo_var_last", f"{last['var_log_product']:.2f}")
book.glue("gspo_t_last", f"{int(last['t'])}")
book.glue("gspo_long", f"{LONG:,}")
book.glue("gspo_long_sd", f"{math.sqrt(LONG * sigma2):.1f}")
book.glue("gspo_long_factor", f"{math.exp(math.sqrt(LONG * sigma2)):,.0f}")
print(f"var of log product: {first['var_log_product']:.3f} at t = 1, {last['var_log_product']:.2f} "
      f"at t = {int(last['t'])}; of log geometric mean: {first['var_log_geomean']:.4f} -> {last['var_log_geomean']:.5f}")

# %% [markdown]
# ```{glue:figure} fig_gspo_prefix_var
# :name: fig-gspo-prefix-var
#
# Variance over responses of the log importance weight of a response prefix of $t$ tokens, after
# one rollout's four GRPO updates (base policy of chapter 1; 512 responses, prefix lengths held by
# at least 20 of them). Blue: the log of the product of token ratios {eq}`eq-gspo-product`, which
# spreads as the prefix grows. Orange: the log of their geometric mean {eq}`eq-gspo-ratio`, which
# contracts. Log scale.
# ```
#
# On our short responses the variance of the log-product grows from {glue:text}`gspo_var_first`
# at one token to {glue:text}`gspo_var_last` at {glue:text}`gspo_t_last`; it does not grow
# linearly, because a few decisive tokens (the first digit, the choice to reason) carry most of
# the log-ratio and the rest are near-deterministic. The per-token variance is
# {glue:text}`gspo_sigma2` nats². Extrapolated to a response of {glue:text}`gspo_long` tokens with
# independent tokens, the log-weight would have a standard deviation of
# {glue:text}`gspo_long_sd` nats: one response in six would carry more than
# {glue:text}`gspo_long_factor` times the weight of the median one. No clip range can make such a
# weight usable.
#
# ## 4.2 The geometric mean, and GSPO's objective
#
# GSPO takes the $\olen{i}$-th root of {eq}`eq-gspo-product`, which is the geometric mean of the
# token ratios (Eq. 7):
#
# $$
# s_i(\theta)=\left(\frac{\pitheta(o_i\given q)}{\piold(o_i\given q)}\right)^{1/\olen{i}}
# =\exp\Big(\frac{1}{\olen{i}}\sum_{t=1}^{\olen{i}}\log r_{i,t}(\theta)\Big).
# $$ (eq-gspo-ratio)
#
# The root divides the log by $\olen{i}$, so under the independence model above
# $\Var[\log s_i]=\sigma^2/\olen{i}$: the range no longer grows with length, and responses of
# different lengths share one scale, so one clip range serves them all (the orange curve). GSPO's
# objective clips that ratio once per response and averages over the group (Eqs. 5–6):
#
# $$
# \mathcal J_{\mathrm{GSPO}}(\theta)=\E\Bigg[\frac{1}{G}\sum_{i=1}^G
# \min\Big(s_i(\theta)\,\Ahat_i,\ \clip\big(s_i(\theta),1-\epslow,1+\epshigh\big)\,\Ahat_i\Big)\Bigg],
# \qquad \Ahat_i=\frac{r(q,o_i)-\mean(\{r(q,o_j)\}_{j=1}^G)}{\std(\{r(q,o_j)\}_{j=1}^G)} .
# $$ (eq-gspo-objective)
#
# In `grpo_lab` the ratio is one registry function, and GSPO is GRPO with three fields changed:
#
# ```{literalinclude} ../grpo_lab/objectives.py
# :pyobject: sequence_ratio
# ```
#
# ```{literalinclude} ../grpo_lab/algorithms.py
# :language: python
# :start-at: "GSPO = GRPO.replace("
# :end-at: ")"
# ```
#
# The ratio is broadcast to every token of its response and the aggregation is GRPO's
# `seq_mean_token_mean`: the per-token loss is constant along a row, so the mean over a row's
# tokens is the response's term of {eq}`eq-gspo-objective`, and the mean over rows is the $1/G$
# sum. The cell checks the geometric-mean identity and the objective by hand in float64, on a
# ragged batch whose padding holds garbage.

# %%
p_new = torch.tensor([[0.50, 0.90, 0.30, 0.70], [0.20, 0.60, 0.0, 0.0], [0.95, 0.80, 0.40, 0.0]],
                     dtype=torch.float64)
p_old = torch.tensor([[0.45, 0.90, 0.35, 0.60], [0.25, 0.55, 0.0, 0.0], [0.95, 0.85, 0.38, 0.0]],
                     dtype=torch.float64)
m3 = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
lp, lo = torch.log(p_new.clamp(min=1e-300)), torch.log(p_old.clamp(min=1e-300))
lp, lo = torch.where(m3, lp, torch.tensor(float("nan"))), torch.where(m3, lo, torch.tensor(float("inf")))
s_hand = torch.tensor([math.prod((p_new[i, :n] / p_old[i, :n]).tolist()) ** (1 / n)
                       for i, n in enumerate(m3.sum(1).tolist())], dtype=torch.float64)  # Eq. 7, literally
assert torch.allclose(sequence_log_ratio(lp, lo, m3).exp(), s_hand, rtol=1e-14)
adv3 = torch.tensor([1.0, -0.5, 0.8], dtype=torch.float64)
wide = GSPO.replace(eps_low=0.05, eps_high=0.05)  # a range these ratios straddle, so both branches occur
J_hand = sum(min(s * a, min(max(s, 1 - 0.05), 1 + 0.05) * a) for s, a in zip(s_hand.tolist(), adv3.tolist())) / 3
out3 = policy_loss(lp, lo, adv3, m3, wide)
assert abs(-out3.loss.item() - J_hand) < 1e-14
print("s_i =", np.round(s_hand.numpy(), 4).tolist(), "| J by hand =", round(J_hand, 6),
      f"| sequences clipped: {float(out3.metrics['seq_clip_frac']):.3f}")

# %% [markdown]
# ## 4.3 Two gradients
#
# Differentiating {eq}`eq-gspo-objective` where the clip is inactive, with
# $\nabla s_i=s_i\,\nabla\log s_i=s_i\frac1{\olen{i}}\sum_t\nabla\log\pitheta(o_{i,t})$ (Eq. 10):
#
# $$
# \nabla_\theta\mathcal J_{\mathrm{GSPO}}=\E\Bigg[\frac1G\sum_{i=1}^G s_i(\theta)\,\Ahat_i\cdot
# \frac{1}{\olen{i}}\sum_{t=1}^{\olen{i}}\nabla_\theta\log\pitheta(o_{i,t}\given q,o_{i,<t})\Bigg],
# $$ (eq-gspo-grad)
#
# against GRPO's (Eq. 11, KL left out as in the paper):
#
# $$
# \nabla_\theta\mathcal J_{\mathrm{GRPO}}=\E\Bigg[\frac1G\sum_{i=1}^G\Ahat_i\cdot
# \frac{1}{\olen{i}}\sum_{t=1}^{\olen{i}}r_{i,t}(\theta)\,\nabla_\theta\log\pitheta(o_{i,t}\given q,o_{i,<t})\Bigg].
# $$ (eq-gspo-grpo-grad)
#
# In {eq}`eq-gspo-grad` every token of a response gets the same weight $s_i\Ahat_i/\olen{i}$; in
# {eq}`eq-gspo-grpo-grad` each token gets its own $r_{i,t}$, which ranges over $(0,1+\varepsilon]$
# for a positive advantage and $[1-\varepsilon,\infty)$ for a negative one — the unequal weights
# the paper blames for accumulating noise. A clipped response contributes nothing in GSPO; in
# GRPO only its clipped tokens drop. The cell takes both gradients from autograd on
# `policy_loss` and asserts them against the two equations written by hand, with one response
# outside GSPO's range.

# %%
G, T = 3, 5
torch.manual_seed(1)
old_g = torch.log(torch.rand(G, T, dtype=torch.float64) * 0.8 + 0.1)
shift = torch.tensor([[2e-4, -1e-4, 1e-4, 0.0, 0.0], [3e-3, 2e-3, 1e-3, 0.0, 0.0], [-2e-4, 1e-4, -1e-4, 1e-4, 0.0]],
                     dtype=torch.float64)  # sequence 1 leaves [1 - 3e-4, 1 + 4e-4] with A > 0: clipped
mg = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
lp_g = (old_g + shift).requires_grad_()
adv_g = torch.tensor([0.7, 1.1, -0.9], dtype=torch.float64)
(grad_gspo,) = torch.autograd.grad(policy_loss(lp_g, old_g, adv_g, mg, GSPO).loss, lp_g)
n_i = mg.sum(1, keepdim=True).double()
s_i = ((shift * mg).sum(1, keepdim=True) / n_i).exp()
inside = torch.tensor([[True], [False], [True]])
eq10 = -(s_i * adv_g[:, None] / n_i * mg * inside) / G  # d(-J)/d log pi, Eq. 10; 0 for the clipped response
assert torch.allclose(grad_gspo, eq10, rtol=0, atol=1e-15)
(grad_grpo,) = torch.autograd.grad(policy_loss(lp_g, old_g, adv_g, mg, GRPO_NOKL).loss, lp_g)
r_it = shift.exp()
eq11 = -(adv_g[:, None] * r_it / n_i * mg) / G  # Eq. 11: no token leaves GRPO's 0.2 / 0.27 here
assert torch.allclose(grad_grpo, eq11, rtol=0, atol=1e-15)
print("GSPO: one weight per response (row 1 clipped, all zero):")
print(np.round(-grad_gspo.numpy() * G, 4) + 0.0)  # + 0.0: no negative zeros
print("GRPO: a weight per token:")
print(np.round(-grad_grpo.numpy() * G, 4) + 0.0)

# %% [markdown]
# **GSPO-token.** For per-token advantages $\Ahat_{i,t}$ (multi-turn credit, a process reward)
# the paper defines a token-level variant whose ratio has the value of $s_i$ and the gradient of
# one token (Eqs. 13–17):
#
# $$
# s_{i,t}(\theta)=\sg{s_i(\theta)}\cdot\frac{\pitheta(o_{i,t}\given q,o_{i,<t})}{\sg{\pitheta(o_{i,t}\given q,o_{i,<t})}} .
# $$ (eq-gspo-token)
#
# ```{literalinclude} ../grpo_lab/objectives.py
# :pyobject: sequence_token_ratio
# ```
#
# With one advantage per response, its loss, clipping and gradient are GSPO's exactly; with
# per-token advantages they differ (asserted; `tests/test_gspo.py` checks more cases).

# %%
lp_t = lp_g.detach().clone().requires_grad_()
out_seq, out_tok = policy_loss(lp_t, old_g, adv_g, mg, GSPO), policy_loss(lp_t, old_g, adv_g, mg, GSPO_TOKEN)
g_seq = torch.autograd.grad(out_seq.loss, lp_t, retain_graph=True)[0]
g_tok = torch.autograd.grad(out_tok.loss, lp_t)[0]
assert out_seq.loss.item() == out_tok.loss.item() and torch.allclose(g_seq, g_tok, rtol=0, atol=1e-16)
adv_tok = adv_g[:, None] * torch.linspace(0.5, 1.5, T, dtype=torch.float64)  # a per-token advantage
g_tok2 = torch.autograd.grad(policy_loss(lp_t, old_g, adv_tok, mg, GSPO_TOKEN).loss, lp_t)[0]
g_seq2 = torch.autograd.grad(policy_loss(lp_t, old_g, adv_tok, mg, GSPO).loss, lp_t)[0]
assert not torch.allclose(g_tok2, g_seq2)
print("shared advantages: GSPO-token = GSPO (value and gradient); per-token advantages: they differ")

# %% [markdown]
# ## 4.4 Why GSPO's clip range is three orders of magnitude smaller
#
# GSPO's §5.1 clips $s_i$ to $[1-3\times10^{-4},\,1+4\times10^{-4}]$, against $[0.8,\,1.27]$ for its
# GRPO baseline. The ranges differ because the quantities differ: a token ratio is one noisy
# factor, $s_i$ is a mean of $\olen{i}$ of them in log space, and most tokens of a response are
# near-deterministic: after the updates of §4.1, {glue:text}`gspo_still_share` of the tokens have a
# ratio within $10^{-3}$ of 1. The rollout of §4.1 shows the two spreads.
# We also compute the sequence range that leaves as many responses outside it as GRPO's range
# leaves tokens outside its own (a matched range), and the share of responses the paper's range
# would clip at our drift.

# %% tags=["nbval-ignore-output"]
adv_p = probe_batch.advantages.double()
rows_p = lengths > 0
r_tok = log_r[mask].exp()
s_seq = (log_r.sum(1)[rows_p] / lengths[rows_p]).exp()
quant = pd.DataFrame({
    "token ratios |r - 1|": np.quantile((r_tok - 1).abs().numpy(), [0.5, 0.9, 0.99]),
    "sequence ratios |s - 1|": np.quantile((s_seq - 1).abs().numpy(), [0.5, 0.9, 0.99])},
    index=["median", "90th percentile", "99th percentile"]).T
out_tok = float(((r_tok < 1 - GRPO_NOKL.eps_low) | (r_tok > 1 + GRPO_NOKL.eps_high)).double().mean())
eps_match = float(np.quantile((s_seq - 1).abs().numpy(), 1 - out_tok))
out_paper = float(((s_seq < 1 - GSPO.eps_low) | (s_seq > 1 + GSPO.eps_high)).double().mean())
book.glue("gspo_quant_table", quant.map(lambda v: f"{v:.2g}"))
book.glue("gspo_out_tok", f"{out_tok:.1%}")
book.glue("gspo_still_share", f"{float(((r_tok - 1).abs() < 1e-3).double().mean()):.0%}")
book.glue("gspo_eps_match", f"{eps_match:.3f}")
book.glue("gspo_len_range", f"{int(lengths.min())}–{int(lengths.max())}")
book.glue("gspo_len_median", f"{int(lengths.float().median())}")
book.glue("gspo_sd_1k", f"{math.sqrt(sigma2 / 1000):.4f}")
book.glue("gspo_sd_10k", f"{math.sqrt(sigma2 / 10000):.4f}")
book.glue("gspo_out_paper", f"{out_paper:.0%}")
print(quant.map(lambda v: f"{v:.2g}").to_string())
print(f"tokens outside [0.8, 1.27]: {out_tok:.2%}; matched sequence range: +-{eps_match:.4f}; "
      f"sequences outside the paper's range: {out_paper:.1%}")

# %% tags=["hide-input", "nbval-ignore-output"]
fig, ax = plt.subplots(figsize=(6.4, 2.9))
bins = np.logspace(-7, 1, 49)
ax.hist(np.clip((r_tok - 1).abs().numpy(), 1e-7, None), bins=bins, density=False, alpha=0.6,
        color=plotting.algo_color("GRPO"), label=f"tokens ({len(r_tok)})")
ax.hist(np.clip((s_seq - 1).abs().numpy(), 1e-7, None), bins=bins, density=False, alpha=0.6,
        color=plotting.algo_color("GSPO"), label=f"responses ({len(s_seq)})")
for x, style, lab in ((GRPO_NOKL.eps_low, "-", "GRPO's 0.2"), (eps_match, "--", "matched sequence range"),
                      (GSPO.eps_high, ":", "GSPO's 4e-4")):
    ax.axvline(x, color="k", ls=style, lw=1, label=lab)
ax.set_xscale("log")
ax.set_xlabel("|ratio − 1| after one rollout's four updates")
ax.set_ylabel("count")
fig.tight_layout()
plotting.legend_below(fig, ncols=3)
book.glue("fig_gspo_clip_scale", fig)

# %% [markdown]
# ```{glue:figure} fig_gspo_clip_scale
# :name: fig-gspo-clip-scale
#
# Distance from 1 of every token ratio (blue) and every response's geometric-mean ratio (orange),
# the same rollout as {ref}`the first figure <fig-gspo-prefix-var>`; log scale (values below $10^{-7}$ are drawn at
# $10^{-7}$). Vertical lines: GRPO's lower clip 0.2, the matched sequence range, and GSPO's upper
# clip $4\times10^{-4}$. Most tokens barely move; the geometric mean averages the few that do.
# ```
#
# ```{glue:} gspo_quant_table
# ```
#
# *Quantiles of $|r_{i,t}-1|$ over tokens and of $|s_i-1|$ over responses, same rollout.*
#
# GRPO's range leaves {glue:text}`gspo_out_tok` of the tokens outside it. The sequence range that
# leaves the same share of responses outside is $\pm${glue:text}`gspo_eps_match` — about as wide
# as GRPO's. At our lengths the geometric mean does not narrow the tail: responses have
# {glue:text}`gspo_len_range` tokens, half of them at most {glue:text}`gspo_len_median`, and in a five-token answer one decisive token moves $\log s_i$ by a
# fifth of its own log-ratio. What the root does narrow is the bulk, and it narrows it more the
# longer the response: under the independence model the standard deviation of $\log s_i$ is
# $\sigma/\sqrt{\olen{i}}$, which at our $\sigma^2=$ {glue:text}`gspo_sigma2` is
# {glue:text}`gspo_sd_1k` for a response of 1,000 tokens and {glue:text}`gspo_sd_10k` for one of
# 10,000. Long responses, and a per-update drift far smaller than ours, are what a range of
# $3\times10^{-4}$ / $4\times10^{-4}$ presupposes; the paper reports neither its drift nor its
# learning rate. At our drift, after a rollout's four updates, the paper's range leaves
# {glue:text}`gspo_out_paper` of the responses outside it on one side or the other; the clip
# removes those on the side their advantage pushes, about half of the off-policy responses in
# training (§4.5). The experiments therefore run GSPO twice, with the paper's range and
# with the matched one, $\pm${glue:text}`gspo_eps_used`. Like chapter 3's $\delta$, a clip range is
# a statement about the drift and the lengths of a setting, not a constant of the method.
#
# :::{admonition} Common misreadings
# :class: warning
#
# * **"GSPO's ratio is $\pitheta(o_i)/\piold(o_i)$."** That is {eq}`eq-gspo-product`, which the paper
#   rejects; Eq. 7 takes its $\olen{i}$-th root, the geometric mean of the token ratios
#   ({ref}`the first figure <fig-gspo-prefix-var>` shows why).
# * **"GSPO clips less than GRPO, that is why it is stable."** It clips *more*: about two orders of
#   magnitude more tokens in the paper's Fig. 2, and {glue:text}`gspo_clip_ratio` times more here
#   with the paper's range (§4.5). A clipped response drops all its tokens.
# * **"Use GSPO's 3e-4 / 4e-4 everywhere."** The range is tied to the per-update drift of the
#   setting (above); TRL's documentation gives the paper's values for the paper's setting.
# * **"GSPO-token is a different objective."** With one advantage per response it is GSPO exactly,
#   in value and gradient (§4.3).
# :::

# %% [markdown]
# ## 4.5 Experiment: GRPO against GSPO on the dense policy
#
# Chapter 1's policy and task, CPU profile, four minibatch updates per rollout (so three of four
# are off-policy and the ratios move), no KL term: GRPO with the paper's baseline range
# $[0.8, 1.27]$, GSPO with the paper's range, and GSPO with the matched range of §4.4
# (rounded); five seeds each, {glue:text}`gspo_steps` steps. The trainer logs, per step, the mean
# $|r_{i,t}-1|$ over tokens (`token_ratio_abs_dev`) and $|s_i-1|$ over responses
# (`seq_ratio_abs_dev`) for every algorithm, the fraction of tokens whose gradient the clip
# removes (`clip_frac`; for GSPO, the tokens of clipped responses — the quantity of the paper's
# Fig. 2) and the fraction of responses removed whole (`seq_clip_frac`).

# %% tags=["nbval-ignore-output"]
STEPS, EVAL_EVERY = 10, 5
EPS_MATCH = float(f"{eps_match:.1g}")  # the matched range, to one significant digit
GSPO_MATCHED = GSPO.replace(name="GSPO (matched range)", eps_low=EPS_MATCH, eps_high=EPS_MATCH)
dense_settings = [GRPO_NOKL, GSPO, GSPO_MATCHED]
book.glue("gspo_steps", str(STEPS))
book.glue("gspo_eps_used", f"{EPS_MATCH:g}")
t0 = time.perf_counter()
dense = experiments.run_grid(dense_settings, profile="cpu", seeds=SEEDS, n_jobs=N_JOBS, steps=STEPS,
                             minibatches=UPDATES, eval_every=EVAL_EVERY)
dense_hist = pd.concat([r.history for r in dense.values()], ignore_index=True)
print(f"{len(dense_settings)} settings x {len(SEEDS)} seeds x {STEPS} steps in {time.perf_counter() - t0:.0f} s")

# %% tags=["hide-input", "nbval-ignore-output"]
dense_names = [s.name for s in dense_settings]
dense_colors = {n: plotting.algo_color(n, extra=dense_names) for n in dense_names}
def training_panels(hist, colors, panels):
    """One row of band plots over RL steps: greedy accuracy, then ``(column, title, unit, log y)`` panels."""
    train = hist[hist.step > 0]
    fig, axes = plt.subplots(1, 1 + len(panels), figsize=(12.4, 2.9))
    plotting.band_plot(axes[0], hist.dropna(subset=["test_accuracy"]), "step", "test_accuracy", colors=colors,
                       band="ci95", bounds=(0, 1), title="greedy test accuracy")
    axes[0].set_ylabel("fraction correct")
    for ax, (col, title, unit, log) in zip(axes[1:], panels):
        plotting.band_plot(ax, train, "step", col, colors=colors, band="ci95",
                           bounds=(0, 1) if unit.startswith("fraction") else (0, math.inf), title=title)
        ax.set_ylabel(unit)
        if log:
            ax.set_yscale("log")
    for ax in axes:
        ax.set_xlabel("RL step")
    fig.tight_layout()
    plotting.legend_below(fig, [axes[0]])
    return fig


fig = training_panels(dense_hist, dense_colors, [
    ("token_ratio_abs_dev", "mean |r − 1| over tokens", "ratio units", True),
    ("seq_ratio_abs_dev", "mean |s − 1| over responses", "ratio units", True),
    ("clip_frac", "tokens clipped", "fraction of tokens", True)])
book.glue("fig_gspo_dense", fig)

# %% tags=["nbval-ignore-output"]
def per_seed(r, col):
    """Per seed, the mean of ``col`` over the training steps of run ``r``."""
    h = r.history
    return h[h.step > 0].groupby("seed")[col].mean()


def iv(values, digits=3, bounds=None):
    return stats.format_interval(stats.t_interval(values, bounds=bounds), digits)


def verdict(d, unit=""):
    """A paired interval and which side of zero it lies on."""
    side = ("the interval includes zero" if not d.excludes(0.0) else
            f"{'higher' if d.mean > 0 else 'lower'}, the interval excludes zero")
    return f"{stats.format_interval(d)}{unit} ({side})"


def summary_table(grid):
    return pd.DataFrame({n: {
        "final greedy acc": iv(r.final(), bounds=(0, 1)),
        "tokens clipped": iv(per_seed(r, "clip_frac"), 4, (0, 1)),
        "responses clipped whole": iv(per_seed(r, "seq_clip_frac"), 4, (0, 1)),
        "mean |r - 1|, tokens": iv(per_seed(r, "token_ratio_abs_dev"), 4, (0, math.inf)),
        "mean |s - 1|, responses": iv(per_seed(r, "seq_ratio_abs_dev"), 4, (0, math.inf)),
        "entropy (nats/token)": iv(per_seed(r, "entropy"), 3, (0, math.inf)),
    } for n, r in grid.items()}).T


dense_table = summary_table(dense)
book.glue("gspo_dense_table", dense_table)
clip_ratio = stats.paired_ratio(per_seed(dense["GSPO"], "clip_frac"), per_seed(dense["GRPO"], "clip_frac"))
clip_ratio_m = stats.paired_ratio(per_seed(dense[GSPO_MATCHED.name], "clip_frac"), per_seed(dense["GRPO"], "clip_frac"))
book.glue("gspo_clip_ratio", stats.format_interval(clip_ratio, 0))
book.glue("gspo_clip_ratio_m", stats.format_interval(clip_ratio_m, 1))
book.glue("gspo_clip_grpo", iv(per_seed(dense["GRPO"], "clip_frac"), 4, (0, 1)))
book.glue("gspo_clip_gspo", iv(per_seed(dense["GSPO"], "clip_frac"), 3, (0, 1)))
seq_off = per_seed(dense["GSPO"], "seq_clip_frac") * UPDATES / (UPDATES - 1)  # the first update clips nothing
book.glue("gspo_offpolicy_removed", iv(seq_off, 2, (0, 1)))
book.glue("gspo_clip_matched", iv(per_seed(dense[GSPO_MATCHED.name], "clip_frac"), 3, (0, 1)))
acc_d = {n: r.final() for n, r in dense.items()}
book.glue("gspo_acc_grpo", iv(acc_d["GRPO"], bounds=(0, 1)))
book.glue("gspo_acc_gspo", iv(acc_d["GSPO"], bounds=(0, 1)))
book.glue("gspo_acc_matched", iv(acc_d[GSPO_MATCHED.name], bounds=(0, 1)))
book.glue("gspo_dacc_gspo", verdict(stats.paired_difference(acc_d["GSPO"], acc_d["GRPO"])))
book.glue("gspo_dacc_matched", verdict(stats.paired_difference(acc_d[GSPO_MATCHED.name], acc_d["GRPO"])))
base_acc_dense = float(dense["GRPO"].base().mean())
d_gspo = stats.paired_difference(acc_d["GSPO"], acc_d["GRPO"])
book.glue("gspo_onpolicy_reading",
          f"Clipping this much cost it nothing measurable in {STEPS} steps, in line with the paper's "
          "observation that GSPO trains well although it clips far more." if d_gspo.hi > 0 else
          f"Clipping this much cost it accuracy in {STEPS} steps, unlike the paper's observation that "
          "GSPO trains well although it clips far more.")
m_iv = stats.t_interval(acc_d[GSPO_MATCHED.name], bounds=(0, 1))
book.glue("gspo_matched_vs_base", f", {'below' if m_iv.hi < base_acc_dense else 'above' if m_iv.lo > base_acc_dense else 'within the seed spread of'} "
                                  f"the base policy's {base_acc_dense:.3f}")
book.glue("gspo_base_dense", f"{base_acc_dense:.3f}")
book.glue("gspo_binom_se", f"{stats.binomial_se(base_acc_dense, len(task.test_set())):.3f}")
book.glue("gspo_n_test", len(task.test_set()))
dev_ratio = stats.paired_ratio(per_seed(dense["GRPO"], "token_ratio_abs_dev"),
                               per_seed(dense["GRPO"], "seq_ratio_abs_dev"))
book.glue("gspo_dev_ratio", stats.format_interval(dev_ratio, 1))
assert (per_seed(dense["GSPO"], "clip_frac") > 5 * per_seed(dense["GRPO"], "clip_frac")).all()  # GSPO clips far more
print(f"GSPO / GRPO tokens clipped: {stats.format_interval(clip_ratio, 0)}; matched: "
      f"{stats.format_interval(clip_ratio_m, 1)}")
dense_table

# %% [markdown]
# ```{glue:figure} fig_gspo_dense
# :name: fig-gspo-dense
#
# GRPO and GSPO on the dense policy, four minibatch updates per rollout, mean with 95% t interval
# over five seeds. From the left: greedy test accuracy; the mean distance from 1 of the token
# ratios and of the responses' geometric-mean ratios (averaged over the step's four updates, the
# first of which is on-policy; log scale); the fraction of trained tokens whose gradient the clip
# removes (log scale).
# ```
#
# ```{glue:} gspo_dense_table
# ```
#
# *Final greedy test accuracy, and per-seed means over training of: the fraction of tokens clipped
# and of responses clipped whole, the mean $|r-1|$ over tokens and $|s-1|$ over responses, and the
# entropy of the trained tokens. Each cell: mean [95% t interval] over five seeds.*

# %% [markdown]
# **What we see.** With the paper's range GSPO removes the gradient of {glue:text}`gspo_clip_gspo`
# of the trained tokens, GRPO of {glue:text}`gspo_clip_grpo`: {glue:text}`gspo_clip_ratio` times
# as many (paired geometric mean [95% interval] over seeds). The paper's Fig. 2 shows about two
# orders of magnitude; here it is one and a bit, because GSPO's clip can act only on the three
# off-policy minibatches of a rollout and only on responses with a non-zero advantage: it removes
# {glue:text}`gspo_offpolicy_removed` of the off-policy responses (responses clipped whole, over
# the three off-policy updates). Even so, GSPO's final greedy accuracy is {glue:text}`gspo_acc_gspo`
# against GRPO's {glue:text}`gspo_acc_grpo` (base {glue:text}`gspo_base_dense`); paired,
# GSPO − GRPO = {glue:text}`gspo_dacc_gspo`. {glue:text}`gspo_onpolicy_reading` With the matched
# range, as wide as GRPO's, GSPO clips about as much as GRPO ({glue:text}`gspo_clip_matched`) and
# ends at {glue:text}`gspo_acc_matched`{glue:text}`gspo_matched_vs_base`; paired against GRPO,
# {glue:text}`gspo_dacc_matched`. §4.7 shows why a range this wide
# is not a trust region for the tokens of short responses. Test-set binomial standard error of one
# evaluation: {glue:text}`gspo_binom_se` ({glue:text}`gspo_n_test` questions).
#
# ## 4.6 Experiment: a Mixture-of-Experts policy, and Routing Replay
#
# GSPO's §5.3 reports that in the 48-layer Qwen3-30B-A3B about 10% of the experts a rollout's
# tokens were routed to change after one gradient update. A token routed to other experts is
# scored by another sub-network, so its ratio $r_{i,t}$ jumps; GRPO needed **Routing Replay** to
# converge — cache the experts chosen under $\piold$ and force them when $\pitheta$ is scored —
# while GSPO, whose ratio averages over a response, did not. Our MoE policy is a Qwen3-MoE model
# of the same size as the dense one (3 layers, 8 experts of width 36 per layer, top-2 routing,
# built from a `transformers` config), pretrained on the same data by one command
# (`python -m grpo_lab.pretrain arithmetic-moe`). Routing Replay is a trainer option
# (`TrainerConfig.routing_replay=True`): forward hooks on each layer's router record the experts
# of every token when $\piold$ is scored and force them, with the gate weights recomputed from
# the current router so that the router still learns. The trainer logs `routing_change_frac`, the
# fraction of routing decisions — a completion token's top-2 set in one layer — that the
# rollout's first optimiser step changed (measured with or without replay).

# %% tags=["nbval-ignore-output"]
moe_prof = dataclasses.replace(prof, name=f"{prof.name}-moe", base="arithmetic-moe-base")
moe_policy, _ = load_policy(moe_prof.base)
book.glue("gspo_moe_params", f"{sum(p.numel() for p in moe_policy.parameters()):,}")
book.glue("gspo_dense_params", f"{sum(p.numel() for p in policy.parameters()):,}")
GRPO_RR = GRPO_NOKL.replace(name="GRPO + routing replay")
GRPO_ON = GRPO_NOKL.replace(name="GRPO, one update per rollout")  # control: ratio 1, routing never stale
moe_settings = [GRPO_NOKL, GRPO_RR, GSPO, GRPO_ON]
t0 = time.perf_counter()
moe = experiments.run_grid(moe_settings, profile=moe_prof, seeds=SEEDS, n_jobs=N_JOBS, steps=STEPS,
                           minibatches=UPDATES, eval_every=EVAL_EVERY,
                           overrides={GRPO_RR.name: {"routing_replay": True}, GRPO_ON.name: {"minibatches": 1}})
moe_hist = pd.concat([r.history for r in moe.values()], ignore_index=True)
print(f"{len(moe_settings)} settings x {len(SEEDS)} seeds x {STEPS} steps in {time.perf_counter() - t0:.0f} s")

# %% tags=["hide-input", "nbval-ignore-output"]
moe_names = [s.name for s in moe_settings]
moe_colors = {n: plotting.algo_color(n, extra=moe_names + dense_names) for n in moe_names}
fig = training_panels(moe_hist, moe_colors, [
    ("routing_change_frac", "routing decisions changed by one update", "fraction of decisions", False),
    ("token_ratio_abs_dev", "mean |r − 1| over tokens", "ratio units", True),
    ("clip_frac", "tokens clipped", "fraction of tokens", True)])
book.glue("fig_gspo_moe", fig)

# %% [markdown]
# ## 4.7 The cost: one ratio, one trust region per response
#
# A sequence ratio assigns trust per response. Two things follow, and both show here. First, a
# response inside the range keeps *all* its tokens, however far one of them has moved: in a
# response of $\olen{i}$ tokens a single token's log-ratio can reach $\olen{i}\,\varepsilon$ before
# $s_i$ leaves $[1-\varepsilon, 1+\varepsilon]$. Second, a response outside the range drops all its
# tokens, including those that barely moved. On the rollout of §4.1, with advantages, the cell
# counts the tokens on which the two rules disagree, with GRPO's range for tokens and the matched
# range for responses (both sign-aware: a bound binds only on the side the advantage pushes).

# %% tags=["nbval-ignore-output"]
pos, neg = (adv_p > 0)[:, None] & mask, (adv_p < 0)[:, None] & mask
r_all = log_r.exp()
tok_cut = (pos & (r_all > 1 + GRPO_NOKL.eps_high)) | (neg & (r_all < 1 - GRPO_NOKL.eps_low))
s_all = (log_r.sum(1) / lengths.clamp(min=1)).exp()[:, None]
seq_cut = (pos & (s_all > 1 + EPS_MATCH)) | (neg & (s_all < 1 - EPS_MATCH))
signal = pos | neg  # tokens with a non-zero advantage
n_sig = int(signal.sum())
let_through = float((tok_cut & ~seq_cut).sum()) / max(int(tok_cut.sum()), 1)
collateral = float((seq_cut & ~tok_cut).sum()) / max(int(seq_cut.sum()), 1)
book.glue("gspo_let_through", f"{let_through:.0%}")
book.glue("gspo_collateral", f"{collateral:.0%}")
book.glue("gspo_tok_cut_n", f"{int(tok_cut.sum())}")
book.glue("gspo_seq_cut_n", f"{int(seq_cut.sum())}")
print(f"{n_sig} tokens with a non-zero advantage; GRPO's clip stops {int(tok_cut.sum())}, of which "
      f"{let_through:.0%} are in responses the matched sequence range keeps; the sequence clip drops "
      f"{int(seq_cut.sum())}, of which {collateral:.0%} are inside GRPO's token range")
dev_m = stats.paired_ratio(per_seed(dense[GSPO_MATCHED.name], "token_ratio_abs_dev"),
                           per_seed(dense["GRPO"], "token_ratio_abs_dev"))
book.glue("gspo_dev_m", stats.format_interval(dev_m, 2))

# %% [markdown]
# GRPO's clip stops {glue:text}`gspo_tok_cut_n` tokens of this rollout; {glue:text}`gspo_let_through`
# of them sit in responses that the matched sequence range keeps, so GSPO goes on pushing them.
# Of the {glue:text}`gspo_seq_cut_n` tokens the sequence clip drops, {glue:text}`gspo_collateral`
# are inside GRPO's token range: they lose their gradient because of their neighbours. In
# training (§4.5), GSPO with the matched range let the tokens drift further — its mean $|r-1|$ is
# {glue:text}`gspo_dev_m` times GRPO's (paired ratio over seeds) — and ended below GRPO. A
# per-response trust region suits long responses whose many tokens each move a little; it fits
# badly where a few tokens decide the outcome, as in our short answers. GSPO-token (§4.3) refines
# the *advantage* per token, not the trust region: its clip is still per response.

# %% tags=["nbval-ignore-output"]
moe_table = summary_table(moe)
moe_table.insert(1, "routing decisions changed per update",
                 [iv(per_seed(r, "routing_change_frac"), 4, (0, 1)) if per_seed(r, "routing_change_frac").notna().all()
                  else "— (no second update)" for r in moe.values()])
book.glue("gspo_moe_table", moe_table)
route_all = pd.concat([per_seed(r, "routing_change_frac") for r in moe.values()]).dropna()
book.glue("gspo_route", iv(route_all, 4, (0, 1)))
book.glue("gspo_route_pct", f"{route_all.mean():.1%}")
acc_m = {n: r.final() for n, r in moe.items()}
base_acc_moe = float(moe["GRPO"].base().mean())
book.glue("gspo_moe_base", f"{base_acc_moe:.3f}")
for key, name in (("grpo", "GRPO"), ("rr", GRPO_RR.name), ("gspo", "GSPO"), ("on", GRPO_ON.name)):
    book.glue(f"gspo_moe_acc_{key}", iv(acc_m[name], bounds=(0, 1)))
d_rr = stats.paired_difference(acc_m[GRPO_RR.name], acc_m["GRPO"])
d_gs = stats.paired_difference(acc_m["GSPO"], acc_m["GRPO"])
book.glue("gspo_moe_d_rr", verdict(d_rr))
book.glue("gspo_moe_d_gspo", verdict(d_gs))
# below the base policy: a run whose final accuracy is more than two binomial standard errors under it
se_moe = stats.binomial_se(base_acc_moe, len(task.test_set()))
fell = {n: int((a < base_acc_moe - 2 * se_moe).sum()) for n, a in acc_m.items()}
book.glue("gspo_moe_fell", "; ".join(f"{n}: {k} of {len(SEEDS)}" for n, k in fell.items()))
print("seeds ending more than 2 binomial SE below the MoE base:", fell)
rmax = {n: r.history[r.history.step > 0].groupby("seed")["ratio_max"].max() for n, r in moe.items()}
book.glue("gspo_moe_rmax_grpo", f"{rmax['GRPO'].median():.1f}")
book.glue("gspo_moe_rmax_rr", f"{rmax[GRPO_RR.name].median():.1f}")
dev_rr = stats.paired_ratio(per_seed(moe[GRPO_RR.name], "token_ratio_abs_dev"), per_seed(moe["GRPO"], "token_ratio_abs_dev"))
book.glue("gspo_moe_dev_rr", stats.format_interval(dev_rr, 2))
fell_txt = "; ".join(f"{n} {k} of {len(SEEDS)}" for n, k in fell.items())
if fell[GRPO_ON.name] >= 3 and min(fell.values()) >= 3:
    reading = (f"RL lowered the MoE policy's greedy accuracy below its base {base_acc_moe:.3f} in "
               f"{'every seed' if min(fell.values()) == len(SEEDS) else 'most seeds'} of every "
               f"setting (seeds more than two binomial standard errors below it: {fell_txt}), including the control "
               "with one update per rollout, whose ratios are exactly 1 and whose routing is never stale. What goes "
               "wrong on this policy is therefore not what Routing Replay or GSPO address.")
else:
    reading = (f"Final greedy accuracy (base {base_acc_moe:.3f}): GRPO {iv(acc_m['GRPO'], bounds=(0, 1))}, with "
               f"replay {iv(acc_m[GRPO_RR.name], bounds=(0, 1))}, GSPO {iv(acc_m['GSPO'], bounds=(0, 1))}, one "
               f"update per rollout {iv(acc_m[GRPO_ON.name], bounds=(0, 1))} (seeds more than two binomial standard "
               f"errors below the base: {fell_txt}).")
reading += (f" Paired over seeds, Routing Replay − GRPO = {verdict(d_rr)} and GSPO − GRPO = {verdict(d_gs)}. "
            + ("Replay changes the token ratios" if dev_rr.excludes(1.0) else
               "Replay leaves the token ratios as they were, within the seed spread")
            + f": it multiplies their mean |r − 1| by {stats.format_interval(dev_rr, 2)} (paired ratio), and the "
            f"largest token ratio of a run (median over seeds) is {rmax['GRPO'].median():.1f} without it and "
            f"{rmax[GRPO_RR.name].median():.1f} with it. With three layers and {route_all.mean():.1%} of the routing "
            "decisions moving per update, the experts a token sees barely change between π_old and π_θ, so there is little "
            "for Routing Replay to fix; the paper's finding that GRPO needs it on a 48-layer MoE model is not "
            "reproduced at this scale, neither is it contradicted.")
book.glue("gspo_moe_reading", reading)
book.glue("gspo_moe_takeaway",
          " On our MoE policy RL lowered greedy accuracy in every setting, the on-policy control included, so these "
          "runs say nothing for or against Routing Replay." if min(fell.values()) >= 3 else "")
assert (moe_hist.loc[moe_hist.step > 0, "routing_change_frac"].dropna() >= 0).all()
assert route_all.mean() > 0  # one update does move some routing decisions
assert dense_hist["routing_change_frac"].isna().all()  # not defined for the dense policy
print(f"routing decisions changed by one update: {iv(route_all, 4, (0, 1))}; "
      f"median over seeds of the largest token ratio: GRPO {rmax['GRPO'].median():.1f}, "
      f"with replay {rmax[GRPO_RR.name].median():.1f}")
moe_table

# %% [markdown]
# ```{glue:figure} fig_gspo_moe
# :name: fig-gspo-moe
#
# The same comparison on the Mixture-of-Experts policy, with GRPO also run with Routing Replay;
# mean with 95% t interval over five seeds. From the left: greedy test accuracy; the fraction of
# routing decisions (a completion token's top-2 experts in one layer) that the rollout's first
# optimiser step changed; the mean $|r_{i,t}-1|$ over tokens (log scale); the fraction of tokens
# clipped (log scale).
# ```
#
# ```{glue:} gspo_moe_table
# ```
#
# *As the dense table, with the per-seed mean fraction of routing decisions changed by one update.*
#
# **What we see.** One update changes {glue:text}`gspo_route` of the routing decisions (mean
# [95% interval] over the seeds of the three runs with several updates per rollout): about
# {glue:text}`gspo_route_pct`, against the paper's 10% in a 48-layer model (the paper counts
# activated experts that change, we count top-2 sets that change; a changed set has one or two
# new experts, so the two measures differ by at most a factor of two). {glue:text}`gspo_moe_reading`
#
# ## 4.8 At scale
#
# What GSPO reports {cite:p}`zheng2025gspo`, beside this chapter:

# %% tags=["hide-input", "nbval-ignore-output"]
at_scale = pd.DataFrame([
    {"quantity": "model and data", "paper": "cold-start fine-tune of Qwen3-30B-A3B-Base (MoE, 48 layers); "
                                            "maths and code RL",
     "this chapter": f"{sum(p.numel() for p in policy.parameters()):,}-parameter dense and "
                     f"{sum(p.numel() for p in moe_policy.parameters()):,}-parameter MoE policies, 2-4 term sums"},
    {"quantity": "minibatches per rollout", "paper": "4", "this chapter": str(UPDATES)},
    {"quantity": "clip range", "paper": "GSPO 3e-4 / 4e-4; GRPO baseline 0.2 / 0.27 (tuned)",
     "this chapter": f"GSPO 3e-4 / 4e-4 and ±{EPS_MATCH:g} (matched); GRPO 0.2 / 0.27"},
    {"quantity": "tokens clipped, GSPO / GRPO", "paper": "about 100x (Fig. 2; no numbers in the text)",
     "this chapter": f"{stats.format_interval(clip_ratio, 0)}x (paper's range, dense policy)"},
    {"quantity": "routing decisions changed per update", "paper": "about 10% (§5.3)",
     "this chapter": iv(route_all, 4, (0, 1))},
    {"quantity": "GRPO on the MoE model", "paper": "does not converge without Routing Replay (Fig. 3)",
     "this chapter": f"final accuracy {iv(acc_m['GRPO'], bounds=(0, 1))}, with replay "
                     f"{iv(acc_m[GRPO_RR.name], bounds=(0, 1))}"},
    {"quantity": "results", "paper": "training curves only (Fig. 1: AIME'24, LiveCodeBench, CodeForces); "
                                     "no table of scores",
     "this chapter": f"{STEPS} steps, five seeds, greedy accuracy on {len(task.test_set())} questions"},
]).set_index("quantity")
from IPython.display import display

with pd.option_context("display.max_colwidth", None):  # show whole cells, not "..."
    display(at_scale)

# %% [markdown]
# The paper's other observations: GSPO tolerates the precision mismatch between the inference
# engine and the trainer well enough that the engine's log-likelihoods might be used directly
# (§5.4; chapter 5 measures that mismatch), and its gains contributed to the later Qwen3 models.
#
# **Other implementations.** TRL 1.16.0 (the version {ref}`the scale-out page <sec-scale-out>` pins)
# computes the sequence ratio with `importance_sampling_level="sequence"` (exp of the masked mean
# log-ratio); it has no GSPO-token: `GRPOTrainer` accepts only `"token"` and `"sequence"` there, and
# the experimental GSPO-token trainer that TRL's main branch once carried is not in that release.
# TRL also warns that a sequence-level ratio combined with `loss_type` `dapo`, `bnpo`, `dr_grpo` or
# `cispo` "effectively weight[s] each sequence by its completion length". verl's `gspo` loss is the
# GSPO-token form, with the log-ratio clamped before the exponential, and verl 0.9.1 aggregates it
# with its default `loss_agg_mode: token-mean`, which its own source notes differs from the paper:
# that is the common bug below, shipped as a default (set `seq-mean-token-mean` to get Eq. 5).
# OpenRLHF forces a per-sample mean aggregation for it. The bug: broadcast the $[B]$ sequence loss
# against the token mask and take a token mean, which weights each response by its length;
# `grpo_lab` takes the mean over a row's tokens first (`seq_mean_token_mean`), which is Eq. 5
# exactly (§4.2).

# %% [markdown]
# **GSM8K on a GPU.** With `PROFILE = "gpu"` in the parameters cell, the next cell trains GRPO and
# GSPO on the dense hub model (the Mixture-of-Experts experiment of §4.6 stays on the toy model: a
# hub MoE policy of useful size does not fit one Colab GPU) on GSM8K from the hub instruct model
# named by `experiments.GPU_MODEL`, with the `gpu` profile (`experiments.gpu_profile`: prompts in
# the model's chat template, a 512-token budget, 16 questions × 8 responses per step, bfloat16
# autocast on Ampere or newer GPUs and float16 with a gradient scaler on older ones), `GPU_SEEDS`
# seeds each, and writes `data/results/gpu/04_gspo.json` with its provenance. On every machine it
# then shows that file when it is present, after asserting what any GPU run must show
# (`experiments.check_gpu_results`: CUDA, every seed to its last step, accuracies in range, finite
# gradients, a base model that solves more than 10% of the problems); the toy experiments above run
# the CPU profile on every machine, so their assertions hold on a GPU too. Without the file it
# prints what the run would train and its expected time.

# %%
GPU_ALGOS = [GRPO, GSPO]
if PROFILE == "gpu":
    experiments.run_chapter_gpu("04_gspo", GPU_ALGOS, seeds=GPU_SEEDS, steps=GPU_STEPS, n_jobs=GPU_N_JOBS)
gpu_summary = book.show_gpu_results("04_gspo", GPU_ALGOS, baseline="GRPO", seeds=GPU_SEEDS, steps=GPU_STEPS)

# %% [markdown]
# ## 4.9 Takeaways
#
# * GSPO's ratio is the geometric mean of the token ratios (Eq. 7), the $\olen{i}$-th root of the
#   response's likelihood ratio; the raw ratio's log spreads with length, the root's contracts.
# * One ratio and one clip per response; GSPO-token is the same objective when all tokens share the
#   advantage (asserted in values and gradients).
# * The clip range belongs to the setting: it shrinks like $1/\sqrt{\olen{i}}$ with response length
#   and with the per-update drift. The paper's $3\times10^{-4}$ presupposes long responses and a
#   small drift; on our short ones it removed {glue:text}`gspo_offpolicy_removed` of the off-policy
#   responses, and a range matched to GRPO's clip share is as wide as GRPO's.
# * A sequence range is not a token trust region: it lets a decisive token of a short response
#   move far while the response stays inside ({glue:text}`gspo_let_through` of the tokens GRPO
#   would stop, §4.7), and it drops whole responses.
# * Routing Replay is a trainer option; at our scale one update moves about
#   {glue:text}`gspo_route_pct` of the routing decisions, far from the paper's 10%.{glue:text}`gspo_moe_takeaway`
#
# ## Exercises
#
# 1. Show that if the token log-ratios of a response are independent with mean 0 and variance
#    $\sigma^2$, then $\Var[\log w_i]=\olen{i}\sigma^2$ and $\Var[\log s_i]=\sigma^2/\olen{i}$. For what
#    length does a clip range of $4\times10^{-4}$ sit at one standard deviation of $\log s_i$ when
#    $\sigma^2=$ {glue:text}`gspo_sigma2`?
# 2. Show that the GSPO-token loss with $\Ahat_{i,t}=\Ahat_i$ has the same gradient as GSPO's (Eq. 10),
#    and check it numerically by giving `policy_loss` a $[B, T]$ advantage that repeats each $\Ahat_i$.
# 3. In a response of $n$ tokens all with ratio 1 except one, how far can that token's ratio move
#    before $s_i$ leaves $[1-\varepsilon, 1+\varepsilon]$? Evaluate for $n=5$, $\varepsilon=0.2$, and
#    for $n=1000$, $\varepsilon=4\times10^{-4}$.

# %%
# exercise checks: the independence model (1), GSPO-token with a repeated [B, T] advantage (2),
# the single-token bound of exercise 3
n_tok = 1 / (GSPO.eps_high ** 2 / sigma2)  # sigma / sqrt(n) = 4e-4  =>  n = sigma^2 / 4e-4^2
print(f"1. a range of 4e-4 is one standard deviation of log s_i at about {n_tok:,.0f} tokens")
lp_x = lp_g.detach().clone().requires_grad_()
g_rep = torch.autograd.grad(policy_loss(lp_x, old_g, adv_g[:, None].expand(G, T).clone(), mg, GSPO_TOKEN).loss,
                            lp_x)[0]
assert torch.allclose(g_rep, grad_gspo, rtol=0, atol=1e-16)
for n, eps in ((5, 0.2), (1000, 4e-4)):
    print(f"3. n = {n}, eps = {eps:g}: one token's ratio can reach {math.exp(n * math.log1p(eps)):.3g} "
          f"(or fall to {math.exp(n * math.log1p(-eps)):.3g})")
print("exercise checks passed")

# %% tags=["nbval-ignore-output", "remove-cell"]
book.glue("gspo_runtime", f"{(time.perf_counter() - CHAPTER_START) / 60:.1f} minutes")
