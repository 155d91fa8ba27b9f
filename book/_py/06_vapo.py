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
# (sec-vapo)=
# # VAPO: the value model returns
#
# **The problem.** GRPO's advantage is one number per response: every token of a wrong answer is
# pushed down alike, the correct first steps and the slip that made it wrong. A value model
# $V(s_t)$, which predicts the reward from the text so far, can do better: its advantage at token
# $t$ says how much the outcome beat the prediction made just before it. PPO has such a critic;
# GRPO dropped it to save a second model, and in long chain-of-thought RL PPO had collapsed anyway:
# VAPO's *vanilla PPO* scores 5 on AIME 2024, where DAPO scores 50 {cite:p}`yue2025vapo`. VAPO
# blames a critic that starts biased, lengths that differ by orders of magnitude and a reward that
# arrives only at the end; its seven changes to PPO reach 60.4. Whether its critic helps at our
# scale, and what reproduced, is answered first in §6.9.
#
# **Which axes it moves:** the advantage (`advantage="gae"`: a critic, separate lambdas for policy
# and critic) and one loss term (the positive-example NLL, `nll_coef`), on top of DAPO's
# clip-higher and token-level loss; value pretraining and group sampling are trainer settings.
#
# **Prerequisites:** {ref}`sec-grpo` and {ref}`sec-dapo`. **Run time:** {glue:text}`vapo_runtime` on
# two CPU cores. With `PROFILE = "gpu"` it also trains DAPO and VAPO on GSM8K (§6.11: hours, and a
# GPU with more than 16 GB).

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
PROFILE = "cpu"  # "gpu": also train §6.11's GSM8K comparison on a hub instruct model (CUDA)
GPU_SEEDS = (0, 1, 2, 3, 4)  # the GSM8K runs (PROFILE = "gpu" only)
GPU_STEPS = None  # None: the gpu profile's 60 steps
GPU_N_JOBS = 1  # GSM8K runs at a time, processes sharing the GPU
SEEDS = (0, 1, 2, 3, 4)
N_JOBS = 2  # worker processes; results do not depend on it

# %% tags=["hide-input"]
import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import matplotlib.pyplot as plt
from IPython.display import display

from grpo_lab.lab import book, regime
from grpo_lab import experiments, lab
from grpo_lab.experiments import plotting, stats
from grpo_lab.algo.advantages import (VALUE_BASELINE_ESTIMATORS, AdvantageBatch, explained_variance, gae, group_advantages,
                                 length_adaptive_lam, outcome_token_rewards)
from grpo_lab.algo.algorithms import DAPO, GRPO, PPO, VAPO
from grpo_lab.policy.models import CriticModel, count_parameters, load_policy
from grpo_lab.algo.objectives import policy_loss, positive_nll_loss, value_loss
from grpo_lab.paths import REPO_ROOT, checkpoint_dir
from grpo_lab.lab.pretrain import RECIPES, sha256_file
from grpo_lab.tasks import get_task
from grpo_lab.tasks.arithmetic import reasoning_response
from grpo_lab.training.trainer import Trainer

book.setup_notebook(seed=0, profile=PROFILE)
CHAPTER_START = time.perf_counter()
profile = experiments.get_profile("cpu")  # on every machine: the GSM8K runs are §6.11's

# %% [markdown]
# ## 6.1 GAE: an average of k-step advantage estimates
#
# A response is a sequence of states $s_t$ (the prompt and the first $t$ tokens) and actions
# $a_t$ (token $t$). With a critic $V$, the *TD residual* of token $t$ is the reward it earned plus
# the value of where it led, minus the value of where it started {cite:p}`schulman2016gae`:
#
# $$
# \delta_t = r_t + \gamma V(s_{t+1}) - V(s_t) .
# $$ (eq-vapo-td)
#
# Summing $k$ residuals telescopes the values in between away, and leaves $k$ real rewards and one
# bootstrapped value (GAE §3):
#
# $$
# \hat A^{(k)}_t=\sum_{l=0}^{k-1}\gamma^l\delta_{t+l}
# = -V(s_t)+r_t+\gamma r_{t+1}+\dots+\gamma^{k-1}r_{t+k-1}+\gamma^kV(s_{t+k}) .
# $$ (eq-vapo-kstep)
#
# Small $k$ leans on the critic (low variance, biased when $V$ is wrong), large $k$ on the sampled
# rewards (unbiased, high variance). GAE averages them with geometric weights (GAE Eq. 16):
#
# $$
# \hat A^{\mathrm{GAE}(\gamma,\lambda)}_t=(1-\lambda)\left(\hat A^{(1)}_t+\lambda\hat A^{(2)}_t+\lambda^2\hat A^{(3)}_t+\dots\right)
# =\sum_{l\ge 0}(\gamma\lambda)^l\,\delta_{t+l} .
# $$ (eq-vapo-gae)
#
# The second form counts how often $\delta_{t+l}$ appears: in every $\hat A^{(k)}$ with $k>l$, with
# factor $\gamma^l$, so its weight is $\gamma^l(1-\lambda)(\lambda^l+\lambda^{l+1}+\dots)=(\gamma\lambda)^l$.
# Read backwards it is the one-line recursion every implementation computes (PPO
# {cite:p}`schulman2017ppo` Eqs. 11–12):
#
# $$
# \hat A_t=\delta_t+\gamma\lambda\,\hat A_{t+1},\qquad \hat A_{L}=0 ,
# $$ (eq-vapo-recursion)
#
# for a response of $L$ tokens, $t=0,\dots,L-1$. After the last token nothing remains:
# $V(s_L)=0$. Two special cases bracket the family:
#
# * $\lambda=0$: $\hat A_t=\delta_t$, one step of bootstrapping, biased unless $V$ is exact;
# * $\lambda=1$: $\hat A_t=\sum_l\gamma^l r_{t+l}-V(s_t)$, the Monte-Carlo return minus a baseline,
#   unbiased for any $V$.
#
# The cell computes {eq}`eq-vapo-gae` from its first form in float64, on rows of different lengths
# (on a finite response the average is $\sum_{k<n}(1-\lambda)\lambda^{k-1}\hat A^{(k)}_t+\lambda^{n-1}\hat A^{(n)}_t$,
# $n=L-t$), and asserts `gae`, which uses the recursion, against it and both special cases.

# %%
g = torch.Generator().manual_seed(0)
B, T = 3, 7
lengths_ex = torch.tensor([7, 4, 1])
mask_ex = (torch.arange(T)[None, :] < lengths_ex[:, None]).double()
V_ex = torch.rand(B, T, generator=g, dtype=torch.float64) * mask_ex
r_ex = torch.randn(B, T, generator=g, dtype=torch.float64) * mask_ex  # dense rewards, to test the general case
gamma_ex, lam_ex = 0.9, 0.7


def k_step(i, t, k):
    """Eq. (eq-vapo-kstep) for row i: k real rewards, then the bootstrapped value (0 after the end)."""
    L = int(lengths_ex[i])
    ret = sum(gamma_ex ** l * float(r_ex[i, t + l]) for l in range(k))
    boot = float(V_ex[i, t + k]) if t + k < L else 0.0
    return -float(V_ex[i, t]) + ret + gamma_ex ** k * boot


def gae_by_averaging(lam):
    out = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        L = int(lengths_ex[i])
        for t in range(L):
            n = L - t
            out[i, t] = sum((1 - lam) * lam ** (k - 1) * k_step(i, t, k) for k in range(1, n)) \
                + lam ** (n - 1) * k_step(i, t, n)
    return out


adv_pkg, ret_pkg = gae(r_ex, V_ex, mask_ex, gamma=gamma_ex, lam=lam_ex)
assert torch.allclose(adv_pkg.double(), gae_by_averaging(lam_ex), atol=1e-6)
delta = torch.zeros(B, T, dtype=torch.float64)  # lambda = 0: the TD residual itself
for i in range(B):
    for t in range(int(lengths_ex[i])):
        delta[i, t] = k_step(i, t, 1)
assert torch.allclose(gae(r_ex, V_ex, mask_ex, gamma=gamma_ex, lam=0.0)[0].double(), delta, atol=1e-6)
mc = torch.zeros(B, T, dtype=torch.float64)  # lambda = 1: discounted return minus V
for i in range(B):
    L = int(lengths_ex[i])
    for t in range(L):
        mc[i, t] = sum(gamma_ex ** l * float(r_ex[i, t + l]) for l in range(L - t)) - float(V_ex[i, t])
assert torch.allclose(gae(r_ex, V_ex, mask_ex, gamma=gamma_ex, lam=1.0)[0].double(), mc, atol=1e-6)
assert torch.allclose(ret_pkg.double(), (adv_pkg.double() + V_ex) * mask_ex, atol=1e-6)  # returns = A + V
print("GAE: k-step average (Eq. 16, first form) = recursion; lambda = 0 -> delta_t; lambda = 1 -> return - V")

# %% [markdown]
# ## 6.2 One reward at the end: how far does it reach?
#
# An LLM response earns one reward $R$, at its last token, and no discount is wanted ($\gamma=1$:
# VAPO §5.1). Put $r_{L-1}=R$, all other $r_t=0$, into {eq}`eq-vapo-gae` and collect terms
# (with $n=L-t$ tokens left):
#
# $$
# \hat A_t=\underbrace{\lambda^{\,n-1}R+(1-\lambda)\sum_{l=1}^{n-1}\lambda^{\,l-1}V(s_{t+l})}_{\text{the target of token }t}\;-\;V(s_t) .
# $$ (eq-vapo-outcome)
#
# The weights of the target sum to one: it is a convex mix of the real reward and the critic's own
# predictions further along the response, and the reward's share is $\lambda^{n-1}$. With PPO's
# usual $\lambda=0.95$ that share falls fast: 100 tokens before the end it is
# {glue:text}`vapo_reach_100` (the paper's example, $0.95^{100}\approx0.006$), so the first token
# of a long response is judged almost entirely by the critic. If the critic is biased, so is the
# advantage. The cell checks {eq}`eq-vapo-outcome` against `gae` for a random critic.

# %%
L100 = 100
V100 = torch.rand(1, L100, generator=g, dtype=torch.float64)
R100 = 1.0
mask100 = torch.ones(1, L100)
A100, _ = gae(outcome_token_rewards(torch.tensor([R100]), mask100), V100, mask100, gamma=1.0, lam=0.95)
lam = 0.95
target0 = lam ** (L100 - 1) * R100 + (1 - lam) * sum(lam ** (l - 1) * float(V100[0, l]) for l in range(1, L100))
assert abs(float(A100[0, 0]) - (target0 - float(V100[0, 0]))) < 1e-5  # Eq. (eq-vapo-outcome), t = 0
print(f"share of the reward in the first token's target, 100 tokens: 0.95^99 = {0.95 ** 99:.4f}; "
      f"0.95^100 = {0.95 ** 100:.4f}")
book.glue("vapo_reach_100", f"{0.95 ** 99:.4f}")

# %% [markdown]
# ## 6.3 Decoupled GAE: the critic wants $\lambda=1$
#
# The critic is trained to predict the *returns* $\hat R_t=\hat A_t+V(s_t)$, which by
# {eq}`eq-vapo-outcome` are exactly the target under the brace. For $\lambda<1$ that target is
# mostly the critic's own later predictions: the critic regresses on itself, a bias at
# initialisation is copied backwards along the response instead of being corrected, and the
# reward's information arrives at the early tokens only through $\lambda^{n-1}$. At $\lambda=1$
# the target is $R$ itself, whatever the critic says: unbiased. VAPO (§4.1, taken from VC-PPO)
# therefore *decouples* the two: the critic's targets use $\lambda_{critic}=1$, the policy's
# advantages a smaller $\lambda_{policy}$, for lower variance. In `grpo_lab` the critic's lambda
# is `critic_lam` (`None`: the policy's own), and the targets come from
# `Algorithm.value_targets`. The cell checks both claims on a batch with a random critic.

# %%
mask_b = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.float32)
R_b = torch.tensor([1.0, 0.0])
for trial in range(3):
    V_b = torch.rand(2, 5, generator=g) * mask_b
    view = AdvantageBatch.from_groups(R_b, 1, mask=mask_b, values=V_b)
    t_vapo, t_ppo = VAPO.value_targets(view), PPO.value_targets(view)
    assert torch.equal(t_vapo, R_b[:, None] * mask_b)  # lambda_critic = 1: the reward, for any critic
    if trial == 0:
        t_ppo_first = t_ppo
assert not torch.allclose(t_ppo, t_ppo_first)  # lambda = 0.95: the target moves with the critic
print("VAPO critic targets = R on every real token, whatever V; PPO's (lambda = 0.95) depend on V")

# %% [markdown]
# ## 6.4 Length-adaptive $\lambda$
#
# Responses in long chain-of-thought RL range from a few hundred to tens of thousands of tokens,
# and one $\lambda$ cannot suit them all. VAPO's Eqs. (4)–(5) make the *sum of the GAE weights*,
# $\sum_t\lambda^t=1/(1-\lambda)$, which measures how many tokens ahead an advantage looks,
# proportional to the response length $l$:
#
# $$
# \sum_{t=0}^{\infty}\lambda_{policy}^{\,t}\approx\frac{1}{1-\lambda_{policy}}=\alpha\,l
# \quad\Longrightarrow\quad
# \lambda_{policy}=1-\frac{1}{\alpha\,l},\qquad \alpha=0.05 .
# $$ (eq-vapo-lam)
#
# It keeps the horizon at a fixed *fraction* $\alpha$ of the response; it does not carry the reward
# to the first token. The reward's share there, $\lambda^{l-1}=(1-1/(\alpha l))^{l-1}$, tends to
# $e^{-1/\alpha}=e^{-20}$ as $l$ grows. At $l=100$ the formula gives
# $\lambda=${glue:text}`vapo_lam_100`, *lower* than 0.95; it reaches 0.95 at
# {glue:text}`vapo_l_095` tokens. A fixed $\lambda=0.95$ looks 20 tokens ahead in a 20,000-token
# response (0.1% of it); the adaptive one looks 1,000 tokens ahead (5%).
#
# **At our scale.** The formula gives $\lambda\le 0$ whenever $\alpha l\le 1$, clamped to 0 (pure
# TD) by `length_adaptive_lam`: with $\alpha=0.05$ that is every response of at most 20 tokens,
# {glue:text}`vapo_frac_le20` of the base policy's (median {glue:text}`vapo_median_len` tokens,
# budget {glue:text}`vapo_max_len`). We keep the formula with $\alpha=${glue:text}`vapo_alpha`:
# $\lambda=0.95$ at our median length, as the paper's $\alpha$ reaches 0.95 at 400 tokens, near the
# short end of its responses.

# %%
ALPHA = 4.0  # our alpha: lambda = 1 - 1/(4 l) = 0.95 at l = 5 tokens
VAPO_OURS = VAPO.replace(lam_alpha=ALPHA)
lens_paper = torch.tensor([20, 100, 400, 1000, 4000, 20000])
lens_ours = torch.tensor([2, 5, 10, 20, 32])
lam_tab = pd.concat([
    pd.DataFrame({"scale": "paper (alpha = 0.05)", "length l": lens_paper.tolist(),
                  "lambda_policy": length_adaptive_lam(lens_paper, 0.05).tolist()}),
    pd.DataFrame({"scale": f"ours (alpha = {ALPHA:g})", "length l": lens_ours.tolist(),
                  "lambda_policy": length_adaptive_lam(lens_ours, ALPHA).tolist()}),
    pd.DataFrame({"scale": "paper's alpha at our lengths", "length l": lens_ours.tolist(),
                  "lambda_policy": length_adaptive_lam(lens_ours, 0.05).tolist()}),
])
lam_tab["horizon 1/(1 - lambda), tokens"] = 1 / (1 - lam_tab["lambda_policy"])
share = lam_tab["lambda_policy"] ** (lam_tab["length l"] - 1)  # 0 for lambda = 0 (pure TD) when l > 1: -inf
with np.errstate(divide="ignore"):
    lam_tab["reward share at token 0, log10 lambda^(l-1)"] = np.log10(share).round(1)
assert abs(float(length_adaptive_lam(torch.tensor([100]), 0.05)) - 0.8) < 1e-6  # 1 - 1/5, by hand
assert abs(float(length_adaptive_lam(torch.tensor([400]), 0.05)) - 0.95) < 1e-6
assert abs(float(length_adaptive_lam(torch.tensor([5]), ALPHA)) - 0.95) < 1e-6
assert (length_adaptive_lam(lens_ours[lens_ours <= 20], 0.05) == 0).all()  # clamped: pure TD
book.glue("vapo_lam_100", "0.80")
book.glue("vapo_l_095", "400")
book.glue("vapo_alpha", f"{ALPHA:g}")
with pd.option_context("display.float_format", lambda v: f"{v:.3g}"):
    display(lam_tab.set_index(["scale", "length l"]))

# %% [markdown]
# The last column is $\log_{10}$ of the reward's share in the first token's target ($-\infty$: pure
# TD). At our lengths the paper's two properties cannot both hold: its fraction, $\alpha=0.05$,
# gives pure TD to nearly every response; its $\lambda$ range, our $\alpha=4$, makes the horizon
# four times the response, so the reward reaches every token with a share near
# $e^{-1/4}\approx0.78$ instead of $e^{-20}$. The experiments use $\alpha=4$: claims about the
# length-adaptive $\lambda$ are about this regime, not the paper's.

# %% [markdown]
# ## 6.5 The other changes: clip-higher, token-level loss, positive examples, groups
#
# Two of VAPO's changes are DAPO's ({ref}`sec-dapo`): *clip-higher*, $\epslow=0.2$ and
# $\epshigh=0.28$ (Eq. 8), and the *token-level loss* (Eqs. 6–7), which divides the batch's token sum
# by its token count $\sum_i\olen{i}$ instead of averaging per-response means, so that long
# responses weigh by their tokens. Eq. 7 writes that count per group, $\sum_{i=1}^{G}\olen{i}$, as
# DAPO's Eq. 12 (`"group_token_mean"` in {ref}`sec-dapo`); the `VAPO` preset uses the batch-wide
# `"token_mean"`, as verl's and TRL's token-mean losses do. Within a group the two weigh tokens
# alike; they differ only in how groups weigh each other, by their token counts or equally.
# `VAPO.replace(aggregation="group_token_mean")` gives Eq. 7 literally. A third is *group
# sampling*: 512 prompts × 16 samples instead of PPO's 8,192 × 1, for "richer contrastive signals"
# (with a critic the group is not a baseline, so a group of one still learns).
#
# The fourth is new, a *positive-example language-modelling loss*: the negative log-likelihood of
# the batch's correct responses $\mathcal T$, averaged over their tokens, and added with weight
# $\mu=0.1$ (Eqs. 9–10):
#
# $$
# \mathcal L_{\mathrm{NLL}}(\theta)=-\frac{1}{\sum_{o_i\in\mathcal T}\olen{i}}\sum_{o_i\in\mathcal T}
# \sum_{t=1}^{\olen{i}}\log\pitheta(a_t\given s_t),\qquad
# \mathcal L(\theta)=\mathcal L_{\mathrm{PPO}}(\theta)+\mu\,\mathcal L_{\mathrm{NLL}}(\theta) .
# $$ (eq-vapo-nll)
#
# It imitates the policy's own successes, whatever the critic thinks of them. The cell evaluates
# {eq}`eq-vapo-nll` by hand and asserts `positive_nll_loss` and VAPO's total `policy_loss`:
# incorrect responses add nothing.

# %%
logp_n = torch.log(torch.tensor([[0.5, 0.25, 0.8], [0.1, 0.9, 0.3], [0.6, 0.7, 0.2]], dtype=torch.float64))
logp_n.requires_grad_()
mask_n = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
correct_n = torch.tensor([True, False, True])
nll_hand = -(math.log(0.5) + math.log(0.25) + math.log(0.6)) / 3  # rows 0 and 2: three real tokens
assert abs(float(positive_nll_loss(logp_n, mask_n, correct_n).detach()) - nll_hand) < 1e-12
adv_n = torch.tensor([0.5, -0.5, 0.5], dtype=torch.float64)

with_nll = policy_loss(logp_n, logp_n.detach(), adv_n, mask_n, VAPO_OURS, correct=correct_n)
without = policy_loss(logp_n, logp_n.detach(), adv_n, mask_n, VAPO_OURS.replace(nll_coef=0.0), correct=correct_n)
assert abs(float((with_nll.loss - without.loss).detach()) - VAPO.nll_coef * nll_hand) < 1e-12
(g_nll,) = torch.autograd.grad(with_nll.loss - without.loss, logp_n)
assert (g_nll[1] == 0).all()  # the incorrect response gets no gradient from the NLL term
print(f"L_NLL = {nll_hand:.4f} (by hand) = positive_nll_loss; mu * L_NLL is the whole difference in VAPO's loss")

# %% [markdown]
# ## 6.6 Equation ↔ code
#
# GAE, {eq}`eq-vapo-gae` by the recursion {eq}`eq-vapo-recursion`, verbatim from
# `grpo_lab/algo/advantages.py`, with the length-adaptive $\lambda$ of {eq}`eq-vapo-lam`:
#
# ```{literalinclude} ../grpo_lab/algo/advantages.py
# :pyobject: gae
# ```
#
# ```{literalinclude} ../grpo_lab/algo/advantages.py
# :pyobject: length_adaptive_lam
# ```
#
# The advantage estimator that the `PPO` and `VAPO` presets name (`advantage="gae"`): the outcome
# reward at the last real token, and the policy's $\lambda$:
#
# ```{literalinclude} ../grpo_lab/algo/advantages.py
# :pyobject: gae_advantages
# ```
#
# The critic's targets, decoupled when `critic_lam` is set (§6.3), and its loss: PPO's squared
# error {cite:p}`schulman2017ppo` (Eq. 9's $L^{VF}$), clipped around the values at sampling time as
# in common PPO implementations (the `PPO` and `VAPO` presets clip at 0.2; the VAPO paper reports
# no value clip):
#
# ```{literalinclude} ../grpo_lab/algo/algorithms.py
# :pyobject: Algorithm.value_targets
# ```
#
# ```{literalinclude} ../grpo_lab/algo/objectives.py
# :pyobject: value_loss
# ```
#
# ```{literalinclude} ../grpo_lab/algo/objectives.py
# :pyobject: positive_nll_loss
# ```
#
# The two presets differ from each other in exactly VAPO's loss-side changes:

# %%
diff = {k: (str(PPO.describe()[k]), str(VAPO.describe()[k])) for k in PPO.describe()
        if PPO.describe()[k] != VAPO.describe()[k]}
display(pd.DataFrame(diff, index=["PPO", "VAPO"]).T.rename_axis("field"))
assert set(diff) == {"name", "critic_lam", "lam_alpha", "eps_high", "aggregation", "nll_coef"}
vl = value_loss(torch.tensor([[0.9, 0.1]]), torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 1.0]]),
                torch.ones(1, 2), clip_eps=0.2)
# by hand: token 0 moved 0.4 > 0.2, clipped value 0.7, errors 0.01 (unclipped) vs 0.09 (clipped): max 0.09;
# token 1 moved -0.4, clipped value 0.3, errors 0.81 vs 0.49: max 0.81; loss = 0.5 * (0.09 + 0.81) / 2
assert abs(float(vl) - 0.5 * (0.09 + 0.81) / 2) < 1e-6
print("value loss, clipped at 0.2: max of the clipped and unclipped squared errors, per token (asserted)")

# %% [markdown]
# ## 6.7 Value pretraining, and which critic
#
# PPO's critic was initialised from the reward model, and VAPO (§4.1, after VC-PPO) traces vanilla
# PPO's early collapse to it. A reward model scores a *finished* response at its <EOS> token; at
# earlier, incomplete contexts it gives *lower* scores. So the initial values are biased *low*, and
# GAE's backward recursion turns that into a *positive* advantage bias at every token. The direction follows from {eq}`eq-vapo-recursion`: lowering every value by $b$ leaves
# each intermediate $\delta_t=V(s_{t+1})-V(s_t)$ unchanged and raises only the last one,
# $R-V(s_{L-1})$, by $b$, so the advantage of token $t$ rises by $\lambda^{n-1}b>0$ ($n=L-t$
# tokens left); the cell below asserts it. VAPO's fix is to *pretrain* the critic before any policy
# update: sample from the fixed initial policy, fit the critic to the Monte-Carlo returns (the
# $\lambda=1$ targets of §6.3) until the value loss and the explained variance are good, save it and
# reuse it (50 steps in the paper).
#
# We have no reward model. An untrained critic here is a scalar head that starts at zero: $V=0$,
# too low by the success rate ({glue:text}`vapo_base_acc` for the base policy), the paper's
# direction. `Trainer.pretrain_value` does VAPO's procedure: each step collects a batch from the
# frozen policy, scores the critic on it *before* fitting (explained variance on unseen samples),
# then fits it.

# %%
b_low = 0.3  # values biased low by b at every token (the reward-model initialisation of VAPO §4.1)
n_left = (lengths_ex[:, None] - torch.arange(T)[None, :]).clamp(min=1).double()  # tokens left, n = L - t
r_end = outcome_token_rewards(torch.tensor([1.0, 0.0, 1.0]), mask_ex).double()
for lam_b in (0.0, 0.7, 0.95, 1.0):
    bias = gae(r_end, (V_ex - b_low) * mask_ex, mask_ex, lam=lam_b)[0] - gae(r_end, V_ex, mask_ex, lam=lam_b)[0]
    assert torch.allclose(bias.double(), b_low * lam_b ** (n_left - 1) * mask_ex, atol=1e-6)  # lambda^(n-1) b
    assert (bias[mask_ex.bool()] >= 0).all() and bias[mask_ex.bool()].sum() > 0  # positive, never negative
print("values biased low by b -> every token's GAE advantage rises by lambda^(n-1) b >= 0 (asserted for "
      "lambda = 0, 0.7, 0.95, 1)")

# %% [markdown]
# **Which critic.** Two designs, with the same pretraining ({glue:text}`vapo_pretrain_steps` steps
# of {glue:text}`vapo_rows` responses, critic learning rate {glue:text}`vapo_value_lr`, twice the
# policy's as in VAPO §5.1), over {glue:text}`vapo_critic_seeds` seeds: a copy of the policy's
# backbone with a new scalar head (`value_init="policy"`), and a separate random transformer with
# {glue:text}`vapo_scratch_frac` times the policy's parameters (`"scratch"`). Seed 0's copy is
# saved: it is the critic of §6.8 and every run of §6.9 starts from it.

# %% tags=["nbval-ignore-output"]
PRETRAIN_STEPS = 16
VALUE_LR = 2 * profile.config.lr  # VAPO §5.1: critic lr 2e-6 against the actor's 1e-6
task = get_task(profile.task)
critic_dir = Path(tempfile.gettempdir()) / "grpo_lab_06_vapo_critic"
CRITIC_NAMES = {"policy": "copy of the policy's backbone", "scratch": "separate, random init"}
# both designs for every seed (about 20 s per seed and design, two at a time)
jobs = [(seed, init, str(critic_dir) if (seed, init) == (0, "policy") else None) for seed in SEEDS
        for init in ("policy", "scratch")]
warm_all = pd.concat(experiments.map_workers(
    functools.partial(lab.pretrain_critic, algo=VAPO_OURS, profile=profile, steps=PRETRAIN_STEPS,
                      value_lr=VALUE_LR), jobs, n_jobs=N_JOBS), ignore_index=True)
warm_all["critic"] = warm_all["init"].map(CRITIC_NAMES)
warm = warm_all[warm_all.seed == 0]
n_policy = int(warm_all["policy_parameters"].iloc[0])
n_value = {init: int(warm_all.loc[warm_all.init == init, "value_parameters"].iloc[0]) for init in CRITIC_NAMES}
# per seed and design: the mean of the last four steps (explained variance on batches the critic has not seen)
last4 = warm_all[warm_all.value_step > PRETRAIN_STEPS - 4].groupby(["init", "seed"]).agg(
    explained_variance=("explained_variance", "mean"), value_loss=("value_loss", "mean"),
    seconds=("seconds", "mean"))
ev_seed = {init: last4.loc[init, "explained_variance"] for init in ("policy", "scratch")}
summary = pd.DataFrame({
    init: {"explained variance, last 4 steps": stats.format_interval(stats.t_interval(ev_seed[init].to_numpy()), 3),
           "value loss, last 4 steps": stats.format_interval(stats.t_interval(last4.loc[init, "value_loss"].to_numpy()), 3),
           "seconds per step (seed 0)": f"{warm[warm.init == init]['seconds'].mean():.2f}",
           "parameters": f"{n_value[init]:,}",
           "parameters / policy's": f"{n_value[init] / n_policy:.2f}"}
    for init in ("policy", "scratch")}).T
summary.index.name = f"critic (mean [95% t] over {len(SEEDS)} seeds)"
display(summary)

# %% tags=["hide-input", "nbval-ignore-output"]
fig, axes = plt.subplots(1, 2, figsize=(8.4, 2.9))
for init, color in (("policy", plotting.algo_color("VAPO")), ("scratch", plotting.algo_color("base"))):
    w = warm[warm.init == init]
    for ax, col in zip(axes, ("explained_variance", "value_loss")):
        ax.plot(w.value_step, w[col], color=color, marker=".", label=w.critic.iloc[0])
axes[0].set_ylabel("explained variance (fresh batch)")
axes[1].set_ylabel("value loss, $\\frac{1}{2}(V-R)^2$ per token")
for ax in axes:
    ax.set_xlabel("pretraining step (policy frozen)")
axes[0].axhline(0, color="k", lw=0.5)
fig.tight_layout()
plotting.legend_below(fig, [axes[0]])
book.glue("fig_vapo_pretrain", fig)

# %%
ev_diff = stats.paired_difference(ev_seed["policy"], ev_seed["scratch"])
ev0 = float(ev_seed["policy"].loc[0])
# the backbone copy learns, the scratch one barely: paired over the seeds, the difference's interval is above 0.1
assert ev_diff.n == len(SEEDS) and ev_diff.lo > 0.1
assert ev0 > 0.1  # seed 0's copy, the critic of 6.8 and 6.9
first_loss = warm_all[warm_all.value_step == 1].groupby(["init", "seed"])["value_loss"].mean()
assert (last4.loc["policy", "value_loss"] < first_loss.loc["policy"]).all()  # every seed's copy fits
book.glue("vapo_ev_policy", stats.format_interval(stats.t_interval(ev_seed["policy"].to_numpy()), 2))
book.glue("vapo_ev_scratch", stats.format_interval(stats.t_interval(ev_seed["scratch"].to_numpy()), 2))
book.glue("vapo_ev_diff", stats.format_interval(ev_diff, 2))
book.glue("vapo_ev_seed0", f"{ev0:.2f}")
book.glue("vapo_critic_seeds", len(SEEDS))
book.glue("vapo_pretrain_steps", PRETRAIN_STEPS)
book.glue("vapo_rows", profile.config.prompts_per_step * profile.config.group_size)
book.glue("vapo_value_lr", f"{VALUE_LR:g}")
book.glue("vapo_scratch_frac", f"{n_value['scratch'] / n_policy:.2f}")
print(f"explained variance over the last 4 pretraining steps, {len(SEEDS)} seeds: policy copy "
      f"{stats.format_interval(stats.t_interval(ev_seed['policy'].to_numpy()), 2)}, scratch "
      f"{stats.format_interval(stats.t_interval(ev_seed['scratch'].to_numpy()), 2)}; copy - scratch, paired "
      f"over seeds: {stats.format_interval(ev_diff, 2)}; seed 0's copy (used below) {ev0:.2f}")

# %% [markdown]
# ```{glue:figure} fig_vapo_pretrain
# :name: fig-vapo-pretrain
#
# Value pretraining on Monte-Carlo returns of the frozen base policy (seed 0). Left: explained
# variance $1-\Var(R-V)/\Var(R)$ over each step's fresh batch, before the critic is fitted to it
# (0: no better than a constant). Right: the value loss. The copy of the policy's backbone learns to
# predict the outcome from the partial answer; the random transformer only learns the mean.
# ```
#
# The copy of the policy's backbone reaches an explained variance of {glue:text}`vapo_ev_policy`
# (last four steps; mean [95% t] over {glue:text}`vapo_critic_seeds` seeds), the random transformer
# {glue:text}`vapo_ev_scratch`: it fits the mean return and nothing else in this budget (paired,
# the copy explains {glue:text}`vapo_ev_diff` more). Predicting whether a partial answer will be
# right needs the arithmetic the policy already knows, and the copy starts with it. It costs a
# policy-sized forward and backward per token more; the book uses it (`value_init="policy"`, the
# default), as PPO usually does, and VAPO too (its critic starts from a policy-sized reward model).

# %% [markdown]
# ## 6.8 Credit assignment: one wrong answer, token by token
#
# With the pretrained critic, take one batch of the base policy and one *wrong* response from a
# group with both right and wrong answers (so GRPO's advantage is not zero), and compare what each
# estimator tells its tokens.

# %% tags=["nbval-ignore-output"]
# the base policy with seed 0's pretrained critic, on a batch that critic was not pretrained on (seed 100)
probe = Trainer(*load_policy(profile.base), task, VAPO_OURS,
                dataclasses.replace(profile.config, seed=100, value_init=str(critic_dir), progress=False))
batch = probe.collect()
view = AdvantageBatch.from_groups(batch.rewards, probe.config.group_size, mask=batch.loss_mask,
                                  values=batch.values)
lens = batch.loss_mask.sum(-1)
book.glue("vapo_median_len", f"{float(lens.median()):.0f}")
book.glue("vapo_frac_le20", f"{float((lens <= 20).float().mean()):.0%}")
assert abs(float(length_adaptive_lam(lens.median()[None], ALPHA)) - 0.95) < 1e-6  # alpha = 4: 0.95 at the median
book.glue("vapo_max_len", probe.max_new_tokens)
grpo_adv = GRPO.estimate_advantages(view)
wrong = (~batch.correct) & (grpo_adv != 0)
i = int(torch.where(wrong, lens, torch.zeros_like(lens)).argmax())  # the longest such wrong response
L_i = int(lens[i])
rows_a = {
    "GRPO (group z-score)": grpo_adv[i].expand(L_i),
    "GAE, lambda = 1": VAPO_OURS.replace(lam_alpha=None, lam=1.0).estimate_advantages(view)[i, :L_i],
    "GAE, lambda = 0.95": VAPO_OURS.replace(lam_alpha=None, lam=0.95).estimate_advantages(view)[i, :L_i],
    f"GAE, length-adaptive (alpha = {ALPHA:g})": VAPO_OURS.estimate_advantages(view)[i, :L_i],
}
heat = pd.DataFrame({k: v.detach().numpy() for k, v in rows_a.items()}).T
tokens = list(probe.tokenizer.convert_ids_to_tokens(batch.rollout.completion_ids[i, :L_i].tolist()))
values_i = batch.values[i, :L_i].numpy()
reference = reasoning_response(list(batch.rollout.problems[i].meta["terms"]))  # the correct chain of sums
text_i = batch.rollout.texts[i]
first_wrong = next((k for k, (a, b) in enumerate(zip(text_i, reference)) if a != b), min(len(text_i), len(reference)))
print("prompt:", batch.rollout.problems[i].prompt.strip(), "| response:", repr(text_i),
      "| correct reasoning:", repr(reference), "| first wrong character: token", first_wrong)

# %% tags=["hide-input", "nbval-ignore-output"]
fig, (ax_v, ax_h) = plt.subplots(2, 1, figsize=(8.4, 3.8), sharex=True,
                                 gridspec_kw={"height_ratios": [1, 1.6]})
ax_v.plot(range(L_i), values_i, color=plotting.algo_color("VAPO"), marker="o", label="critic $V(s_t)$")
ax_v.axhline(float(batch.rewards[i]), color="k", ls="--", lw=1, label="reward $R$")
ax_v.set_ylabel("value")
lim = float(np.abs(heat.values).max())
im = ax_h.imshow(heat.values, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
ax_h.set_yticks(range(len(heat)), heat.index, fontsize=8)
ax_h.set_xticks(range(L_i), [t.replace("<eos>", "EOS").replace("\n", "\\n") for t in tokens], fontsize=8)
ax_h.set_xlabel("completion token $t$")
ax_h.grid(False)
fig.colorbar(im, ax=ax_h, label="advantage", fraction=0.03)
fig.tight_layout()
plotting.legend_right(ax_v)  # beside the values, above the colour bar
book.glue("fig_vapo_credit", fig)

# %%
flat = heat.iloc[0]
assert flat.nunique() == 1 and flat.iloc[0] < 0  # GRPO: one negative number for every token
lam1 = heat.iloc[1].to_numpy()
assert np.allclose(lam1, float(batch.rewards[i]) - values_i, atol=1e-5)  # lambda = 1: R - V(s_t)
spread = heat.iloc[1:].std(axis=1)
assert (spread > 0).all()  # GAE gives the tokens of one response different advantages
worst = int(np.argmin(heat.iloc[3].to_numpy()))
book.glue("vapo_credit_worst_pos", worst)
book.glue("vapo_credit_first_wrong", first_wrong)
book.glue("vapo_credit_text", f"`{text_i}`")
book.glue("vapo_credit_reference", f"`{reference}`")
if worst == first_wrong:
    verdict = "the critic put the most blame on the very token where the answer went wrong"
else:
    drop = values_i[first_wrong + 1] - values_i[first_wrong] if first_wrong + 1 < L_i else float("nan")
    verdict = (f"the critic did not put the most blame where the answer went wrong (its prediction moved by "
               f"{drop:+.2f} across that token), but on token {worst}")
book.glue("vapo_credit_verdict", verdict)
book.glue("vapo_credit_grpo", f"{float(flat.iloc[0]):.2f}")
print(f"GRPO: {float(flat.iloc[0]):.2f} on every token; length-adaptive GAE: most negative at token {worst} "
      f"({tokens[worst]!r}), range [{heat.iloc[3].min():.2f}, {heat.iloc[3].max():.2f}]")

# %% [markdown]
# ```{glue:figure} fig_vapo_credit
# :name: fig-vapo-credit
#
# One wrong response of the base policy. Top: the pretrained critic's prediction $V(s_t)$ before
# each token, and the reward. Bottom: the advantage each token receives (red negative, blue
# positive). GRPO gives every token the same {glue:text}`vapo_credit_grpo`; GAE at $\lambda=1$
# gives $R-V(s_t)$, most negative where the critic still expected success; smaller $\lambda$ moves
# towards the change of prediction across the token, $V(s_{t+1})-V(s_t)$.
# ```
#
# The response is {glue:text}`vapo_credit_text`; the correct chain of partial sums is
# {glue:text}`vapo_credit_reference`, so the answer first goes wrong at token
# {glue:text}`vapo_credit_first_wrong`. Under the length-adaptive GAE, {glue:text}`vapo_credit_verdict`.
# That is the catch of per-token credit: it is as good as the critic, and one that explains
# {glue:text}`vapo_ev_seed0` of the return variance gives noisy per-token estimates. GRPO's flat
# advantage is wrong about every token in a known way; GAE's is unbiased only at $\lambda=1$ or with
# an exact critic, and otherwise wrong about single tokens in ways that depend on the critic.

# %% [markdown]
# ## 6.9 Experiment: VAPO's ablation at our scale
#
# **Does VAPO's critic help here, and what reproduced?** {glue:text}`vapo_answer`
#
# VAPO's Table 1 removes one change at a time (AIME 2024 avg@32, Qwen2.5-32B). We train its rows,
# {glue:text}`vapo_n_seeds` seeds × {glue:text}`vapo_steps` steps of {glue:text}`vapo_group`
# responses, plus GRPO, DAPO and *VAPO with group advantages*: GRPO's group z-score in place of GAE,
# no critic, so that VAPO minus it is what the critic's credit adds. Every VAPO row starts from the
# critic of §6.7, except *w/o value pretraining* ($V=0$) and vanilla PPO (a fresh critic, one
# $\lambda=0.95$, clip 0.2, the sample-level loss, no NLL term, no groups:
# {glue:text}`vapo_nogroup`, the shape *w/o group sampling* keeps). Each change repairs a failure
# with a precondition; where it fails here, the row is *not tested in the paper's regime*. Rows that
# fail a length precondition on §6.8's batch are not trained.

# %% tags=["nbval-ignore-output"]
view_b = AdvantageBatch.from_groups(batch.rewards, probe.config.group_size, mask=batch.loss_mask,
                                    values=batch.values)  # the base policy's batch of §6.8
real = batch.loss_mask.bool()
len_med, len_min, len_max = float(lens.median()), float(lens.min()), float(lens.max())
H_FIXED = 1 / (1 - 0.95)  # the horizon of a fixed lambda = 0.95: 20 tokens
adv_adaptive = VAPO_OURS.estimate_advantages(view_b)[real].detach().numpy()
adv_fixed = VAPO_OURS.replace(lam_alpha=None).estimate_advantages(view_b)[real].detach().numpy()
corr_lam = float(np.corrcoef(adv_adaptive, adv_fixed)[0, 1])
# its 95% interval: a bootstrap over the batch's groups (a prompt's G responses resampled together, 1000 draws)
n_real = real.sum(-1).numpy()
G_b = probe.config.group_size
token_ix = np.split(np.arange(int(n_real.sum())), np.cumsum(n_real)[:-1])  # each response's real tokens
group_ix = [np.concatenate(token_ix[g * G_b:(g + 1) * G_b]) for g in range(len(token_ix) // G_b)]
boot_rng = np.random.default_rng(0)
corr_boot = []
for _ in range(1000):
    pick = np.concatenate([group_ix[g] for g in boot_rng.integers(0, len(group_ix), len(group_ix))])
    corr_boot.append(np.corrcoef(adv_adaptive[pick], adv_fixed[pick])[0, 1])
corr_lo, corr_hi = (float(q) for q in np.percentile(corr_boot, [2.5, 97.5]))
lam_pol = length_adaptive_lam(lens, ALPHA)
share_first = float((lam_pol ** (lens - 1)).mean())  # the reward's share in token 0's lambda_policy target
t_dec = VAPO_OURS.value_targets(view_b)[real]  # lambda_critic = 1
t_cpl = VAPO_OURS.replace(critic_lam=None).value_targets(view_b)[real]  # the policy's lambda
rel_targets = float((t_cpl - t_dec).norm() / t_dec.norm())
regime_pre = pd.DataFrame([
    {"row": "w/o length-adaptive GAE",
     "precondition": "responses much longer than the fixed lambda's horizon 1/(1 - 0.95) = 20 tokens",
     "paper": "hundreds to tens of thousands of tokens: 20 / length <= 0.05",
     "ours": f"median {len_med:.0f} tokens: 20 / length = {H_FIXED / len_med:.0f}; correlation of the two "
             f"estimators' advantages {corr_lam:.2f} [{corr_lo:.2f}, {corr_hi:.2f}] (95% bootstrap over groups)",
     "in regime": H_FIXED / len_med < 1},
    {"row": "w/o decoupled GAE",
     "precondition": "the reward's share lambda^(n-1) in the critic's lambda < 1 target is small early on",
     "paper": "0.95^100 = 0.006 at 100 tokens; about e^-20 with alpha = 0.05",
     "ours": f"{share_first:.2f} at the first token (batch mean); the two targets differ by "
             f"{rel_targets:.0%} of their norm",
     "in regime": share_first < 0.1},
    {"row": "w/o token-level loss",
     "precondition": "response lengths that differ by orders of magnitude",
     "paper": "a few hundred to tens of thousands of tokens (ratio >= 100)",
     "ours": f"{len_min:.0f} to {len_max:.0f} tokens in the base batch (ratio {len_max / len_min:.1f})",
     "in regime": len_max / len_min >= 100},
]).set_index("row")
# the regime as the text states it: at these lengths none of the three can act
assert not regime_pre["in regime"].any() and corr_lo > 0.9
NOT_RUN = list(regime_pre.index[~regime_pre["in regime"].astype(bool)])
print(f"not trained, their length precondition fails: {NOT_RUN}")

# %% tags=["nbval-ignore-output"]
STEPS = 8
EVAL_EVERY = 4
# 8 questions x 8 responses per step (half the profile's questions, to fit the time budget)
P, G = 8, profile.config.group_size
no_groups = {"prompts_per_step": P * G, "group_size": 1}  # the same number of responses, one per question
ablation = {
    "PPO": PPO,
    "w/o value pretraining": VAPO_OURS.replace(name="w/o value pretraining"),
    "w/o decoupled GAE": VAPO_OURS.replace(name="w/o decoupled GAE", critic_lam=None),
    "w/o length-adaptive GAE": VAPO_OURS.replace(name="w/o length-adaptive GAE", lam_alpha=None),
    "w/o clip-higher": VAPO_OURS.replace(name="w/o clip-higher", eps_high=0.2),
    "w/o token-level loss": VAPO_OURS.replace(name="w/o token-level loss", aggregation="seq_mean_token_mean"),
    "w/o positive-example LM loss": VAPO_OURS.replace(name="w/o positive-example LM loss", nll_coef=0.0),
    "w/o group sampling": VAPO_OURS.replace(name="w/o group sampling"),
    "VAPO": VAPO_OURS,
}
# the control that isolates the critic: the same algorithm with group advantages (no critic)
CRITIC_CONTROL = VAPO_OURS.replace(name="VAPO with group advantages", advantage="group")
PAPER_AIME = {"PPO": 5, "w/o value pretraining": 11, "w/o decoupled GAE": 33, "w/o length-adaptive GAE": 45,
              "w/o clip-higher": 46, "w/o token-level loss": 53, "w/o positive-example LM loss": 54,
              "w/o group sampling": 55, "VAPO": 60, "DAPO": 50}
overrides = {"PPO": {**no_groups, "value_init": "policy"}, "w/o value pretraining": {"value_init": "policy"},
             "w/o group sampling": no_groups,
             # GRPO and DAPO build no critic: no pretrained one to load (and no warning that it is ignored)
             "GRPO": {"value_init": "policy"}, "DAPO": {"value_init": "policy"},
             CRITIC_CONTROL.name: {"value_init": "policy"}}
overrides = {k: v for k, v in overrides.items() if k not in NOT_RUN}
t0 = time.perf_counter()
trained = [a for k, a in ablation.items() if k not in NOT_RUN]  # the rows whose precondition holds
grid = experiments.run_grid([*trained, CRITIC_CONTROL, GRPO, DAPO], profile="cpu", seeds=SEEDS, steps=STEPS,
                            n_jobs=N_JOBS, eval_every=EVAL_EVERY, value_init=str(critic_dir), value_lr=VALUE_LR,
                            prompts_per_step=P, overrides=overrides)
grid_seconds = time.perf_counter() - t0
book.glue("vapo_n_seeds", len(SEEDS))
book.glue("vapo_steps", STEPS)
book.glue("vapo_group", f"{P} questions × {G}")
book.glue("vapo_nogroup", f"{P * G} questions × 1")
print(f"{len(grid)} settings x {len(SEEDS)} seeds x {STEPS} steps in {grid_seconds:.0f} s{book.cache_note(grid)}")

# %% tags=["nbval-ignore-output"]
def per_seed_step(name, col):
    """``col`` of ``name``'s runs as a seed x step table (the training rows only)."""
    return grid[name].history.dropna(subset=[col]).groupby(["seed", "step"])[col].mean().unstack()


fmt = stats.format_interval
ev_vapo = per_seed_step("VAPO", "explained_variance_mc")
ev_first, ev_last = ev_vapo[1], ev_vapo[STEPS]
ev_change = stats.paired_difference(ev_last, ev_first)
book.glue("vapo_ev_first", f"{ev_first.mean():.2f}")  # chapter 8's tree quotes the critic's fall
book.glue("vapo_ev_last", f"{ev_last.mean():.2f}")
ev_fresh = per_seed_step("w/o value pretraining", "explained_variance_mc")[1]  # the fresh critic (V = 0), step 1
ev_head = stats.paired_difference(ev_first, ev_fresh)  # what pretraining gives the critic at the start
# "a clip acts", the book's rule (grpo_lab.lab.regime): per seed over the second half of the updates, >= 0.5%
clip_ok, clip_iv = regime.clip_acts(regime.late_mean(grid["w/o clip-higher"].history, "clip_frac_high"))
clip_all = per_seed_step("w/o clip-higher", "clip_frac_high").mean(axis=1)  # this chapter's earlier statistic
clip_ok_old = bool(clip_all.mean() >= 0.01)  # and its earlier threshold: 1% over all steps
mixed = 1 - per_seed_step("VAPO", "tied_group_frac").mean(axis=1)  # groups holding right and wrong answers
mixed_iv = stats.t_interval(mixed, bounds=(0, 1))
base_acc = float(grid["VAPO"].base().mean())
regime_run = pd.DataFrame([
    {"row": f"VAPO vs {CRITIC_CONTROL.name} (the critic's credit)",
     "precondition": "the critic stays informative: its explained variance of the returns at the last step is at "
                     "least half that at the first",
     "paper": "pretrained 'until value loss and explained variance are good' (50 steps); no value given",
     "ours": f"{fmt(stats.t_interval(ev_first), 2)} at step 1, {fmt(stats.t_interval(ev_last), 2)} at step {STEPS}",
     "in regime": float(ev_last.mean()) >= 0.5 * float(ev_first.mean())},
    {"row": "w/o value pretraining",
     "precondition": "pretraining gives the critic a head start: explained variance at step 1, pretrained minus "
                     "fresh, above 0 (paired interval)",
     "paper": "a critic from a reward model, biased low early in the response (§6.7)",
     "ours": f"{fmt(stats.t_interval(ev_first), 2)} against {fmt(stats.t_interval(ev_fresh), 2)}: "
             f"{fmt(ev_head, 2)}",
     "in regime": ev_head.lo > 0},
    {"row": "w/o clip-higher",
     "precondition": f"the upper clip at 1.2 acts: it removes the gradient of at least {regime.CLIP_ACTS:.1%} of "
                     "the tokens, per seed over the second half of the updates (the book's rule)",
     "paper": "no rate given (DAPO: entropy collapse under a symmetric 0.2)",
     "ours": f"{fmt(clip_iv, 4)} over steps {STEPS // 2 + 1}-{STEPS} (over all steps "
             f"{fmt(stats.t_interval(clip_all), 4)})",
     "in regime": clip_ok},
    {"row": "w/o group sampling",
     "precondition": "VAPO's groups give contrast: at least a tenth of them hold both right and wrong responses",
     "paper": "'richer contrastive signals'; no share given",
     "ours": f"{fmt(mixed_iv, 2)} of VAPO's groups of {G} are mixed",
     "in regime": float(mixed_iv.lo) >= 0.1},  # at least a tenth, fixed beforehand
]).set_index("row")
regime_tab = pd.concat([regime_pre, regime_run])
critic_ok = bool(regime_run.iloc[0]["in regime"])
assert not critic_ok and float(ev_change.hi) < 0  # the critic's explained variance falls during training
# the results table, with each row's regime verdict beside it
order = [*(k for k in ablation if k not in NOT_RUN), CRITIC_CONTROL.name, "GRPO", "DAPO"]
final = {k: grid[k].final() for k in order}  # per seed: greedy test accuracy after the last step
d = {k: stats.paired_difference(final[k], final["VAPO"]) for k in order if k != "VAPO"}
n_cmp = len(d)  # the paired comparisons against VAPO in the table
d_bonf = {k: stats.paired_difference(final[k], final["VAPO"], level=1 - 0.05 / n_cmp) for k in d}
wo = [k for k in ablation if k.startswith("w/o")]
in_reg = {k: bool(regime_tab.loc[k, "in regime"]) if k in regime_tab.index else True for k in wo}
in_reg[CRITIC_CONTROL.name] = critic_ok
n_test = len(task.test_set())
rows = []
for k in [*order, *NOT_RUN]:
    run = k in final
    rows.append({"setting": k, "paper: AIME 2024 avg@32": PAPER_AIME.get(k, "-"),
                 "ours: final test accuracy": fmt(stats.t_interval(final[k], bounds=(0, 1))) if run else "not run",
                 "ours: minus VAPO (paired)": fmt(d[k]) if k in d else "-",
                 "excludes 0": "yes" if k in d and d[k].excludes(0.0) else ("no" if k in d else "-"),
                 f"excludes 0, Bonferroni ({n_cmp})": ("yes" if d_bonf[k].excludes(0.0) else "no") if k in d else "-",
                 "in the paper's regime": ("yes" if in_reg[k] else "no") if k in regime_tab.index or k == CRITIC_CONTROL.name
                 else ("yes: no precondition that can fail" if k in wo else "-")})
table = pd.DataFrame(rows).set_index("setting")
book.glue("vapo_table", table)  # shown below, with its caption
book.glue("vapo_regime_table", regime_tab)
book.glue("vapo_base_acc", f"{base_acc:.0%}")
book.glue("vapo_n_test", n_test)
book.glue("vapo_n_cmp", n_cmp)
book.glue("vapo_train_acc", fmt(stats.t_interval(per_seed_step("VAPO", "accuracy").mean(axis=1), bounds=(0, 1)), 2))
print(f"in the paper's regime: {[k for k, v in in_reg.items() if v]}")

# %% tags=["nbval-ignore-output"]
def names(ks):
    """``*a*``, ``*a* and *b*``, ``*a*, *b* and *c*``; "none" for no row."""
    ks = [f"*{k}*" for k in ks]
    return "none" if not ks else ks[0] if len(ks) == 1 else ", ".join(ks[:-1]) + " and " + ks[-1]


def verb(ks, one, many):
    return one if len(ks) == 1 else many


def cite(k, iv=None):
    """A row's paired difference from VAPO beside the paper's pair of scores."""
    return f"*{k}* {fmt(iv or d[k])}, paper {PAPER_AIME[k]} against {PAPER_AIME['VAPO']}"


untested = [k for k in wo if not in_reg[k]]
tested = [k for k in wo if in_reg[k]]
below = [k for k in tested if d[k].hi < 0]  # the paper's direction: every row of its Table 1 is below VAPO
above = [k for k in tested if d[k].lo > 0]  # against it
level = [k for k in tested if k not in below + above]
parts = []
for ks, (one, many), what in ((below, ("ends", "end"), "below VAPO, the paper's direction"),
                              (above, ("ends", "end"), "above VAPO, against the paper's direction"),
                              (level, ("does", "do"), "not separate from VAPO")):
    if ks:
        parts.append(f"{len(ks)} {verb(ks, one, many)} {what} ({'; '.join(cite(k) for k in ks)})")
rows_sentence = (f"{len(untested)} of the {len(wo)} single-change rows are not tested in the paper's regime "
                 f"({names(untested)}): their differences from VAPO are not verdicts on the changes. Of the "
                 f"{len(tested)} in regime, " + "; ".join(parts) + ".")
survive = [k for k in below + above if d_bonf[k].excludes(0.0)]
lost = [k for k in below + above if k not in survive]
if below + above:
    rows_sentence += (f" Corrected for the {n_cmp} comparisons against VAPO in the table (Bonferroni), "
                      + (f"{names(survive)} still {verb(survive, 'excludes', 'exclude')} zero" if survive else "")
                      + ("; " if survive and lost else "")
                      + (f"{names(lost)} no longer {verb(lost, 'excludes', 'exclude')} zero "
                         f"({'; '.join(f'{d_bonf[k].level:.1%}: {fmt(d_bonf[k])}' for k in lost)})" if lost else "")
                      + ".")
book.glue("vapo_rows_sentence", rows_sentence)
# the clip rule: the book's, with this chapter's earlier rule beside it where its verdict differs
clip_sentence = (f"The upper clip at 1.2 removes the gradient of {fmt(clip_iv, 4)} of the tokens over the second "
                 f"half of the updates without clip-higher, so clip-higher "
                 + ("can act" if clip_ok else "has almost nothing to release")
                 + f" by the book's rule ({regime.CLIP_ACTS:.1%}).")
if clip_ok != clip_ok_old:
    clip_sentence += (f" An earlier edition averaged over all steps and asked for 1%: "
                      f"{fmt(stats.t_interval(clip_all), 4)}, "
                      + ("in regime" if clip_ok_old else "not in the paper's regime") + " by that rule.")
book.glue("vapo_clip_sentence", clip_sentence)
ppo_base = stats.paired_difference(final["PPO"], grid["PPO"].base())
vapo_base = stats.paired_difference(final["VAPO"], grid["VAPO"].base())
critic_gain = stats.paired_difference(final["VAPO"], final[CRITIC_CONTROL.name])
control_base = stats.paired_difference(final[CRITIC_CONTROL.name], grid[CRITIC_CONTROL.name].base())
ppo_sentence = ((f"Vanilla PPO ends below VAPO, the paper's largest gap, reproduced in direction: PPO − VAPO "
                 f"{fmt(d['PPO'])}" + (", and after Bonferroni" if d_bonf["PPO"].excludes(0.0) else
                                        f", though not after Bonferroni ({fmt(d_bonf['PPO'])})"))
                if d["PPO"].hi < 0 else f"Vanilla PPO does not end below VAPO: PPO − VAPO {fmt(d['PPO'])}")
ppo_sentence += (f"; PPO changes by {fmt(ppo_base)} from its starting point in {STEPS} steps, VAPO by "
                 f"{fmt(vapo_base)}.")
book.glue("vapo_ppo_sentence", ppo_sentence)
if critic_ok:
    critic_sentence = ("The critic's precondition holds, so VAPO minus the same algorithm with group advantages "
                       "measures its credit.")
elif critic_gain.excludes(0.0):
    critic_sentence = ("The critic's precondition fails (its explained variance collapses), so this difference "
                       "cannot be credited to per-token credit assignment, whatever its sign.")
else:
    critic_sentence = ("The interval contains zero and the critic's precondition fails (its explained variance "
                       "collapses): VAPO's gain over the base policy is not credited to the critic's per-token "
                       "credit assignment; the same algorithm with group advantages gains as much, within the "
                       "intervals.")
book.glue("vapo_critic_sentence", critic_sentence)
book.glue("vapo_vs_grpo", fmt(stats.paired_difference(final["VAPO"], final["GRPO"])))
book.glue("vapo_vs_dapo", fmt(stats.paired_difference(final["VAPO"], final["DAPO"])))
book.glue("vapo_critic_gain", fmt(critic_gain))
book.glue("vapo_control_gain", fmt(control_base))
book.glue("vapo_gs_questions", f"{P * G * STEPS} questions against {P * STEPS}")
book.glue("vapo_h_ratio", f"{H_FIXED / len_med:.0f}")
book.glue("vapo_corr_lam", f"{corr_lam:.2f} [{corr_lo:.2f}, {corr_hi:.2f}]")
book.glue("vapo_share_first", f"{share_first:.2f}")
# the short task's takeaway, from the same lists as the sentences above
ROW_VERDICTS = ((below, ("ends", "end"), "below VAPO as in the paper"),
                (above, ("ends", "end"), "above VAPO, against the paper"),
                (level, ("does", "do"), "not separate from VAPO"))
short_take = (("On the short task vanilla PPO ends below VAPO" if d["PPO"].hi < 0 else
               "On the short task vanilla PPO does not end below VAPO")
              + ("; VAPO's critic-free control does as well" if not critic_gain.excludes(0.0) else
                 f"; VAPO minus its critic-free control is {fmt(critic_gain)}")
              + "; of the single changes in regime, "
              + "; ".join(f"{names(ks)} {verb(ks, one, many)} {what}" for ks, (one, many), what in ROW_VERDICTS if ks)
              + ".")
book.glue("vapo_takeaway_short", short_take)
print(f"PPO - VAPO {fmt(d['PPO'])}; VAPO - {CRITIC_CONTROL.name} {fmt(critic_gain)}; not in regime: {untested}; "
      f"below VAPO: {below or 'none'}; above: {above or 'none'}; Bonferroni survivors: {survive or 'none'}")

# %% [markdown]
# ```{glue:} vapo_table
# ```
#
# *VAPO's Table 1 beside ours: greedy accuracy on {glue:text}`vapo_n_test` test questions after
# {glue:text}`vapo_steps` steps, mean [95% t] over {glue:text}`vapo_n_seeds` seeds; the paired
# difference from VAPO, at 95% and after Bonferroni over the {glue:text}`vapo_n_cmp` comparisons;
# the regime verdict (dropdown below). The NLL term has no precondition that can fail here: it acts
# on every correct response (training accuracy {glue:text}`vapo_train_acc`).*
#
# **What reproduced, and what did not.** {glue:text}`vapo_ppo_sentence`
# {glue:text}`vapo_rows_sentence` *w/o group sampling* is confounded with prompt diversity: at the same number of responses it trains on eight times as many distinct
# questions ({glue:text}`vapo_gs_questions` over the run), which may be its gain; the paper's
# comparison (8,192 prompts × 1 against 512 × 16) shares the confound. VAPO against GRPO:
# {glue:text}`vapo_vs_grpo`; against DAPO: {glue:text}`vapo_vs_dapo`.
#
# :::{admonition} The preconditions, row by row
# :class: dropdown
#
# ```{glue:} vapo_regime_table
# ```
#
# *Each precondition measured here (§6.8's base batch; the runs: mean [95% interval] over seeds)
# beside the paper's setting.*
#
# The fixed $\lambda=0.95$ looks {glue:text}`vapo_h_ratio` times as far ahead as a median response
# (the two estimators' advantages correlate at {glue:text}`vapo_corr_lam`), and the critic's
# $\lambda<1$ target gives the first token {glue:text}`vapo_share_first` of the reward.
# {glue:text}`vapo_clip_sentence`
# :::

# %% tags=["hide-input", "nbval-ignore-output"]
curves = pd.concat([grid[k].history for k in ("VAPO", "PPO", "GRPO", "DAPO")], ignore_index=True)
curves = curves.dropna(subset=["test_accuracy"])
fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.0))
plotting.band_plot(axes[0], curves, "step", "test_accuracy", band="ci95", bounds=(0, 1), legend=True,
                   title="greedy test accuracy")
ev_curves = pd.concat([grid[k].history for k in ("VAPO", "PPO")], ignore_index=True)
plotting.band_plot(axes[1], ev_curves.dropna(subset=["explained_variance_mc"]), "step", "explained_variance_mc",
                   band="ci95", title="critic: explained variance of MC returns")
axes[0].set_ylabel("accuracy (fraction of test questions)")
axes[1].set_ylabel("explained variance (batch before update)")
axes[1].axhline(0, color="k", lw=0.5)
for ax in axes:
    ax.set_xlabel("RL step")
fig.tight_layout()
book.glue("fig_vapo_curves", fig)
ev_by_step = {k: grid[k].history.groupby("step")["explained_variance_mc"].mean() for k in ("VAPO", "PPO")}
book.glue("vapo_ppo_ev_last", f"{ev_by_step['PPO'].loc[STEPS]:.2f}")

# %% [markdown]
# ```{glue:figure} fig_vapo_curves
# :name: fig-vapo-curves
#
# Left: greedy test accuracy (mean and 95% interval over {glue:text}`vapo_n_seeds` seeds; step 0 is
# the base policy). Right: the critic's explained variance of the Monte-Carlo returns on each step's
# batch before the update: VAPO's pretrained critic falls as the policy moves; PPO's starts at 0.
# ```
#
# **What the critic adds.** VAPO minus its critic-free control is {glue:text}`vapo_critic_gain`; the
# control gains {glue:text}`vapo_control_gain` over the base policy. {glue:text}`vapo_critic_sentence`
# PPO's fresh critic reaches an explained variance of {glue:text}`vapo_ppo_ev_last` by the last
# step. The paper's own gaps are small too: AIME 2024 has 30 questions, so its rows 53, 54 and 55
# differ by a question or two.

# %% [markdown]
# ### The long-response regime: `benchmarks/vapo_long.py`
#
# Length is what this scale lacks, so we built a task with it. `arithmetic-long-base` is the same
# arithmetic, pretrained on demonstrations three quarters of which follow the answer with 1–320
# dots that the reward ignores (budget {glue:text}`vl_budget` tokens): the answer is decided early
# and the reward arrives a hundred or more tokens later, VAPO §4's situation. The benchmark
# pretrains a critic on the base policy ({glue:text}`vl_pretrain_steps` steps, VAPO §4.1) and trains
# VAPO ($\alpha=0.05$), the three length rows and the critic-free control, over
# {glue:text}`vl_n_seeds` shared seeds × {glue:text}`vl_steps` steps of {glue:text}`vl_rows`
# responses. Its runs take longer than this chapter's budget (`benchmarks/README.md`), so the chapter
# reads `benchmarks/results/vapo_long.json` and recomputes every interval from its per-seed values.

# %% tags=["nbval-ignore-output"]
vlc = json.loads((REPO_ROOT / "benchmarks" / "results" / "vapo_long_critic.json").read_text())
assert vlc["base_weights_sha256"] == sha256_file(checkpoint_dir(vlc["base"]) / "model.safetensors")  # the shipped base
vlc_final = {r["setting"]: pd.Series(r["final_accuracy_per_seed"], index=vlc["seeds"]) for r in vlc["rows"]}
vlc_first, vlc_ev50, vlc_slow = (r["setting"] for r in vlc["rows"])  # 16 steps; 50 steps; 50 steps and policy lr 1e-4
assert "policy lr 1e-4" in vlc_slow and "50 steps" in vlc_ev50  # the rates and counts the text types
assert vlc["value_lr"] == 2 * vlc["policy_lr"]  # "twice"
vlc_pace, vlc_rows, vlc_ev_mean = {}, [], {}
for vlc_r in vlc["rows"]:
    k = vlc_r["setting"]
    vlc_steps = pd.DataFrame(vlc_r["explained_variance_per_step"])  # steps x seeds
    vlc_a, vlc_b = stats.t_interval(vlc_steps.iloc[0]), stats.t_interval(vlc_steps.iloc[-1])
    assert [fmt(vlc_a, 2), fmt(vlc_b, 2)] == vlc_r["explained_variance_first_last"]  # recomputed from the per-step values
    vlc_ev_mean[k] = (vlc_a.mean, vlc_b.mean)
    vlc_pace[k] = bool(vlc_b.mean >= 0.5 * vlc_a.mean)  # the rule: the last at least half the first
    assert vlc_pace[k] == vlc_r["keeps_pace"]
    vlc_d = stats.paired_difference(vlc_final[k], vlc_final[vlc_first]) if k != vlc_first else None
    vlc_rows.append({"setting": k, "final test accuracy": fmt(stats.t_interval(vlc_final[k], bounds=(0, 1))),
                     "minus the first row (paired)": fmt(vlc_d) if vlc_d else "-",
                     "explained variance, step 1": fmt(vlc_a, 2), f"step {vlc['steps']}": fmt(vlc_b, 2),
                     "keeps pace": vlc_pace[k]})
vlc_d_slow = stats.paired_difference(vlc_final[vlc_slow], vlc_final[vlc_ev50])  # the rate alone: the same critic
vlc_ev = {r["setting"]: " to ".join(r["explained_variance_first_last"]) for r in vlc["rows"]}


def kept(ok):
    return "keeps pace" if ok else "does not keep pace"


vlc_sentence = (f"VAPO's critic, pretrained 16 steps, explains {vlc_ev[vlc_first]} of the return variance from the "
                f"first step to the last ({kept(vlc_pace[vlc_first])}). Of two levers "
                f"(`benchmarks/vapo_long_critic.py`), the paper's 50 pretraining steps give {vlc_ev[vlc_ev50]} "
                f"({kept(vlc_pace[vlc_ev50])}); a policy three times slower (1e-4, the critic kept at 6e-4) gives "
                f"{vlc_ev[vlc_slow]} ({kept(vlc_pace[vlc_slow])}) and "
                + (f"moves accuracy instead: {fmt(vlc_d_slow)} beside the same critic." if vlc_d_slow.lo > 0 else
                   f"does not separate in accuracy: {fmt(vlc_d_slow)} beside the same critic."))
book.glue("vlc_sentence", vlc_sentence)
book.glue("vlc_table", pd.DataFrame(vlc_rows).set_index("setting"))
book.glue("vlc_lr", f"{vlc['policy_lr']:.0e}")
book.glue("vlc_value_lr", f"{vlc['value_lr']:.0e}")
print(f"benchmarks/results/vapo_long_critic.json: {vlc['provenance']['date']}, commit "
      f"{vlc['provenance']['git_sha'][:7]}; keeps pace: {vlc_pace}; slower policy - same critic {fmt(vlc_d_slow)}")

# %% [markdown]
# **The rates.** At the CPU profile's rates (policy {glue:text}`vlc_lr`, critic
# {glue:text}`vlc_value_lr`), {glue:text}`vlc_sentence` The grid trains at policy 1e-4 and critic
# 6e-4 with 50 pretraining steps; that rate was chosen on VAPO's runs, so the control trains at
# three rates.
#
# :::{admonition} The two levers, in full
# :class: dropdown
#
# ```{glue:} vlc_table
# ```
#
# *VAPO on the long task, the grid's seeds and steps: final greedy accuracy, the paired difference
# from the first row, and the critic's explained variance at the first and last step (mean [95%
# t]); "keeps pace": the last is at least half the first.*
# :::

# %% tags=["nbval-ignore-output"]
vl = json.loads((REPO_ROOT / "benchmarks" / "results" / "vapo_long.json").read_text())
vr = vl["regime"]
assert vl["base_weights_sha256"] == sha256_file(checkpoint_dir(vl["base"]) / "model.safetensors")  # the shipped base
vl_final = {r["setting"]: pd.Series(r["final_accuracy_per_seed"], index=vl["seeds"]) for r in vl["rows"]}
assert vlc["seeds"] == vl["seeds"] and vlc["steps"] == vl["steps"]  # the levers' runs share the grid's seeds and steps
assert np.isclose(vl["value_lr"], 6 * vl["policy_lr"]) and np.isclose(vlc["policy_lr"], 3 * vl["policy_lr"])  # six; three
assert vl["policy_lr"] == 1e-4 and vl["value_lr"] == 6e-4 and vl["value_pretrain_steps"] == 50  # the rates typed above
vl_lam_med = float(length_adaptive_lam(torch.tensor([vr["median_length"]]), VAPO.lam_alpha))
# w/o decoupled GAE the critic's target uses the policy's lambda: the reward's share at the median response's first token
vl_share_med = vl_lam_med ** (vr["median_length"] - 1)
vl_share_answer = 0.95 ** vr["median_tokens_after_answer"]  # the reward is n tokens after the answer's last digit
vl_credit = vr["credit_on_decisive_tokens"]
vl_ev = {r["setting"]: r for r in vl["rows"] if "explained_variance_first_last" in r}
vl_pace = {k: bool(np.mean(r["explained_variance_first_last_per_seed"][1])
                   >= 0.5 * np.mean(r["explained_variance_first_last_per_seed"][0])) for k, r in vl_ev.items()}
vl_len_end = vl_ev["VAPO"]["length_last_step_per_seed"]  # VAPO's sampled responses at the last step, per seed
vl_len_end_med = float(np.median(vl_len_end))
vl_len_ok = vl_len_end_med >= 100
vl_regime = pd.DataFrame([
    {"row": "lengths hold through training",
     "precondition": "the answer stays about 100 or more tokens before the reward (0.95^100 = 0.006)",
     "paper": "long chain-of-thought: 0.95^100 = 0.006 at 100 tokens (§4)",
     "ours": f"VAPO's sampled responses at the last step: {min(vl_len_end):.0f} to {max(vl_len_end):.0f} tokens "
             f"(per-seed means; median {vl_len_end_med:.0f})",
     "in regime": vl_len_ok},
    {"row": "w/o length-adaptive GAE",
     "precondition": "alpha = 0.05 gives a longer horizon than the fixed lambda = 0.95 (lambda_policy > 0.95)",
     "paper": "every response >= 400 tokens: lambda_policy >= 0.95",
     "ours": f"median {vr['median_length']:.0f} tokens: lambda_policy = {vl_lam_med:.2f} there; "
             f"{vr['share_lam_policy_above_095']:.0%} of responses above 0.95 (unreachable: the budget is "
             f"{RECIPES['arithmetic-long'].max_new_tokens} < 400 tokens)",
     "in regime": vr["share_lam_policy_above_095"] >= 0.5},
    {"row": "w/o decoupled GAE",
     "precondition": "the reward's share lambda^(n-1) in the critic's lambda < 1 target (here the policy's lambda) "
                     "is small early on, the critic keeps pace, and lengths hold through training",
     "paper": "0.95^100 = 0.006 at 100 tokens; a critic pretrained until 'good'",
     "ours": f"lambda = {vl_lam_med:.2f} at the median length: share {vl_share_med:.0e} at its first token; "
             f"VAPO's critic keeps pace: {vl_pace['VAPO']}; lengths hold: {vl_len_ok}",
     "in regime": vl_share_med < 0.1 and vl_pace["VAPO"] and vl_len_ok},
    {"row": "w/o token-level loss",
     "precondition": "response lengths that differ by orders of magnitude",
     "paper": "a few hundred to tens of thousands of tokens (ratio >= 100)",
     "ours": f"{vr['min_length']:.0f} to {vr['max_length']:.0f} tokens (ratio {vr['length_ratio']:.0f}; 100 would "
             "need answers of at most 3-4 tokens beside the longest)",
     "in regime": vr["length_ratio"] >= 100},
    {"row": "VAPO with group advantages",
     "precondition": "the reward arrives far after the tokens that decide it, the critic keeps pace, and lengths "
                     "hold through training",
     "paper": "long chain-of-thought: 0.95^100 = 0.006; a critic pretrained until 'good'",
     "ours": f"median {vr['median_tokens_after_answer']:.0f} tokens from the answer's last digit to the end: "
             f"0.95^n = {vl_share_answer:.4f}; VAPO's critic keeps pace: {vl_pace['VAPO']}; lengths hold: {vl_len_ok}",
     "in regime": vl_share_answer <= 0.006 and vl_pace["VAPO"] and vl_len_ok},
    *({"row": f"{k}: critic keeps pace",
       "precondition": "the critic stays informative: explained variance of the returns holds up in training",
       "paper": "pretrained 'until value loss and explained variance are good'; no value given",
       "ours": f"explained variance {r['explained_variance_first_last'][0]} at step 1, "
               f"{r['explained_variance_first_last'][1]} at step {vl['steps']} (the rule: at least half)",
       "in regime": vl_pace[k]}
      for k, r in vl_ev.items()),
]).set_index("row")
book.glue("vl_regime_table", vl_regime)
vl_n_cmp = len(vl["rows"]) - 1  # paired comparisons against VAPO, Bonferroni-corrected as on the short task
vl_rows = []
for r in vl["rows"]:
    k = r["setting"]
    dk = stats.paired_difference(vl_final[k], vl_final["VAPO"]) if k != "VAPO" else None
    dkb = stats.paired_difference(vl_final[k], vl_final["VAPO"], level=1 - 0.05 / vl_n_cmp) if dk else None
    vl_rows.append({"setting": k, "paper: AIME 2024 avg@32": r["paper_aime24"] or "-",
                    "ours: final test accuracy": fmt(stats.t_interval(vl_final[k], bounds=(0, 1))),
                    "ours: minus VAPO (paired)": fmt(dk) if dk else "-",
                    "excludes 0": ("yes" if dk.excludes(0.0) else "no") if dk else "-",
                    f"excludes 0, Bonferroni ({vl_n_cmp})": ("yes" if dkb.excludes(0.0) else "no") if dk else "-",
                    "in the paper's regime": (("yes" if vl_regime.loc[k.split(",")[0], "in regime"] else "no")
                                              if k.split(",")[0] in vl_regime.index else "-"),
                    "response length, last step": r["length_last_step"]})
    if dk:  # the stored interval is the one recomputed here
        assert r["minus_vapo"] == fmt(dk), k
book.glue("vl_table", pd.DataFrame(vl_rows).set_index("setting"))
print(f"benchmarks/results/vapo_long.json: {vl['provenance']['date']}, commit {vl['provenance']['git_sha'][:7]}, "
      f"runs' own seconds summed {vl['run_seconds_sum']:.0f}; in regime: "
      f"{list(vl_regime.index[vl_regime['in regime'].astype(bool)])}")

# %% tags=["nbval-ignore-output"]
def vl_diff(k, ref="VAPO", level=0.95):
    return stats.paired_difference(vl_final[k], vl_final[ref], level=level)


def direction(iv):
    """A single-change row's difference from VAPO against the paper's (every such row is below VAPO there)."""
    side = "the paper's direction" if iv.mean < 0 else "against the paper's direction"
    return f"{fmt(iv)}, {side}, " + ("its interval excluding zero" if iv.excludes(0.0) else "not separated from zero")


vl_base = vl["base_greedy_accuracy"]
vl_rowd = {r["setting"]: r for r in vl["rows"]}
ok = vl_regime["in regime"].astype(bool)
MAIN = ["w/o length-adaptive GAE", "w/o decoupled GAE", "w/o token-level loss", "VAPO with group advantages"]
d_lam, d_dec, d_tok = vl_diff("w/o length-adaptive GAE"), vl_diff("w/o decoupled GAE"), vl_diff("w/o token-level loss")
d_crit = vl_diff("VAPO", "VAPO with group advantages")
d_crit_bonf = vl_diff("VAPO", "VAPO with group advantages", level=1 - 0.05 / vl_n_cmp)
d_vapo_base = stats.t_interval(vl_final["VAPO"] - vl_base)
assert not d_crit.excludes(0.0)  # the text: the earlier edition's difference did not survive the new split
assert VAPO.aggregation == "token_mean"  # the text: VAPO's loss (and its control's) does not depend on the groups
assert vl_share_answer <= 0.006 and vl_share_med < 0.1  # the text: at the start the reward is far from the answer
assert not ok.loc[["w/o length-adaptive GAE", "w/o token-level loss"]].any()  # the text: out of regime by construction
# the control at three policy rates (VAPO at two: 3e-4 in vapo_long_critic.json, 1e-4 here), on VAPO's seeds
ctrl = {lr: "VAPO with group advantages" + (f", policy lr {lr}" if lr != "1e-4" else "") for lr in ("5e-5", "1e-4", "3e-4")}
ctrl_mean = {lr: float(vl_final[k].mean()) for lr, k in ctrl.items()}
ctrl_best = max(ctrl_mean, key=ctrl_mean.get)
d_rate_ctrl = vl_diff(ctrl["1e-4"], ctrl["3e-4"])  # the slower rate without a critic
# "the rate moves accuracy more than the critic": the slower rate's gain, for VAPO and for its control, beside VAPO's
# over the control
rate_more = d_rate_ctrl.lo > 0 and vlc_d_slow.lo > 0 and min(d_rate_ctrl.mean, vlc_d_slow.mean) > abs(d_crit.mean)
vl_ev_f, vl_ev_l = (np.array(v) for v in vl_ev["VAPO"]["explained_variance_first_last_per_seed"])
vl_pace_iv = stats.t_interval(vl_ev_l - 0.5 * vl_ev_f)  # per seed: the last step's minus half the first's
vl_vloss = np.mean(vl_ev["VAPO"]["value_loss_first_last_per_seed"], axis=1)  # the critic's loss, first and last step
assert vl_credit["VAPO"] > 1.5 * vl_credit["VAPO with group advantages"]  # the text: the critic moves credit to the answer
pace_sentence = (("less than half by the means" if not vl_pace["VAPO"] else "at least half by the means")
                 + f", though per seed the last step minus half the first, {fmt(vl_pace_iv, 2)}, "
                 + ("cannot settle the rule at five seeds" if vl_pace_iv.lo < 0 < vl_pace_iv.hi else "settles it")
                 + f"; the critic's training loss went from {vl_vloss[0]:.3f} to {vl_vloss[1]:.3f} (means over seeds)")
out = [k for k in MAIN if not ok[k]]
fails = [why for why, bad in (("VAPO's critic does not keep pace by the rule", not vl_pace["VAPO"]),
                              ("the responses shorten", not vl_len_ok)) if bad]
vl_regime_sentence = (f"Not in the paper's regime here: {names(out)}"
                      + (f" ({' and '.join(fails)})" if fails else "") + "." if out else
                      "Every row's precondition holds.")
bonf = {True: "still after Bonferroni", False: "not after Bonferroni"}
crit_dir = ("ends above" if d_crit.lo > 0 else "ends below" if d_crit.hi < 0 else "does not separate from")
# the Bonferroni interval, said only where the 95% one excludes zero
crit_bonf = f", {bonf[d_crit_bonf.excludes(0.0)]}" if d_crit.excludes(0.0) else ""
vl_crit_sentence = (f"VAPO {crit_dir} the control at the same rate: {fmt(d_crit)} (paired{crit_bonf}). The "
                    f"control does best at {ctrl_best} (5e-5: {fmt(stats.t_interval(vl_final[ctrl['5e-5']], bounds=(0, 1)))}"
                    f"; 3e-4: {fmt(stats.t_interval(vl_final[ctrl['3e-4']], bounds=(0, 1)))}), and 1e-4 against 3e-4 "
                    f"gains it {fmt(d_rate_ctrl)} with no critic at all.")
book.glue("vl_pace_sentence", pace_sentence)
book.glue("vl_regime_sentence", vl_regime_sentence)
book.glue("vl_crit_sentence", vl_crit_sentence)
book.glue("vl_dir_lam", fmt(d_lam))
book.glue("vl_dir_dec", direction(d_dec))
book.glue("vl_dir_tok", direction(d_tok))
book.glue("vl_budget", RECIPES["arithmetic-long"].max_new_tokens)
book.glue("vl_pretrain_steps", vl["value_pretrain_steps"])
book.glue("vl_n_seeds", len(vl["seeds"]))
book.glue("vl_steps", vl["steps"])
book.glue("vl_rows", f"{vl['prompts_per_step']} questions × {vl['group_size']}")
book.glue("vl_base", f"{vl_base:.3f}")
book.glue("vl_se", f"{stats.binomial_se(float(vl_final['VAPO'].mean()), vl['test_questions']):.3f}")
book.glue("vl_med_len", f"{vr['median_length']:.0f}")
book.glue("vl_after", f"{vr['median_tokens_after_answer']:.0f}")
book.glue("vl_share_answer", f"{vl_share_answer:.4f}")
book.glue("vl_len_end", f"{min(vl_len_end):.0f} to {max(vl_len_end):.0f} tokens (per-run means; median "
                        f"{vl_len_end_med:.0f})")
book.glue("vl_lam_med", f"{vl_lam_med:.2f}")
book.glue("vl_ratio", f"{vr['length_ratio']:.0f}")
book.glue("vl_gain", fmt(d_vapo_base))
book.glue("vl_credit_decisive", f"{vr['decisive_token_share']:.1%}")
book.glue("vl_credit_gae", f"{vl_credit['VAPO']:.1%}")
book.glue("vl_credit_group", f"{vl_credit['VAPO with group advantages']:.1%}")
book.glue("vl_ev_pre", f"{vl['value_pretrain_explained_variance_last4']:.2f}")
book.glue("vl_ev_vapo", " to ".join(vl_rowd["VAPO"]["explained_variance_first_last"]))
book.glue("vl_d_crit", fmt(d_crit))
# the chapter's answer (top of 6.9) and the long task's takeaway, from the measurements above
answer = (("Not in a test of the paper's claim. " if not (critic_ok or ok["VAPO with group advantages"]) else "")
          + f"On the short task VAPO's critic loses its explained variance "
          f"({ev_by_step['VAPO'].loc[1]:.2f} at the first step, {ev_by_step['VAPO'].loc[STEPS]:.2f} at the last), "
          f"and VAPO minus the same algorithm without a critic is {fmt(critic_gain)}. With the reward about "
          f"{vr['median_tokens_after_answer']:.0f} tokens after the answer, the critic moves credit towards the "
          f"tokens that decide it ({vl_credit['VAPO']:.1%} of the advantage mass against "
          f"{vl_credit['VAPO with group advantages']:.1%} for group advantages), "
          + ("and" if crit_dir == "ends above" else "yet") + f" VAPO {crit_dir} that control ({fmt(d_crit)}{crit_bonf})."
          + (f" There too {' and '.join(fails)}." if fails else "")
          + (f" The policy's learning rate moved accuracy more: 1e-4 against 3e-4 gains VAPO {fmt(vlc_d_slow)} and "
             f"the control {fmt(d_rate_ctrl)}. " if rate_more else " "))
answer += ((f"What reproduced: vanilla PPO ends below VAPO, the paper's largest gap ({fmt(d['PPO'])}, "
            f"{bonf[d_bonf['PPO'].excludes(0.0)]}). ") if d["PPO"].hi < 0 else
           f"The paper's largest gap does not show: PPO − VAPO {fmt(d['PPO'])}. ")
answer += (("No single change in regime ends below VAPO as in the paper" if not below else
            f"{names(below)} {verb(below, 'ends', 'end')} below VAPO as in the paper")
           + (f"; {names(above)} {verb(above, 'ends', 'end')} above it"
              + ("" if set(above) <= set(survive) else " (not after Bonferroni)") if above else "") + ".")
book.glue("vapo_answer", answer)
take_long = (f"With the reward a hundred and more tokens past the answer, the critic moves credit towards it and "
             f"VAPO {crit_dir} its critic-free control ({fmt(d_crit)}{crit_bonf})"
             + ("; the learning rate mattered more" if rate_more else "")
             + (f". Not tested in the paper's regime: {' and '.join(fails)}." if fails else "."))
book.glue("vapo_takeaway_long", take_long)
print(f"VAPO - base {fmt(d_vapo_base)}; lambda row {fmt(d_lam)}; decoupled {fmt(d_dec)}; token-level {fmt(d_tok)}; "
      f"VAPO - group {fmt(d_crit)} (Bonferroni {fmt(d_crit_bonf)}); keeps pace: {vl_pace}; control best at {ctrl_best}")

# %% [markdown]
# ```{glue:} vl_table
# ```
#
# *VAPO's Table 1 rows on the long task, as the short task's table; the base policy scores
# {glue:text}`vl_base`, one run's binomial standard error is about {glue:text}`vl_se`, and the last
# column is the sampled responses' mean length at the last step. The last three rows are the
# critic-free control at three policy rates.*
#
# **What the long task reaches.** Length, at the start: {glue:text}`vl_after` tokens of dots follow
# the median answer (median response {glue:text}`vl_med_len` tokens), so $\lambda=0.95$ gives the
# tokens that decide it {glue:text}`vl_share_answer` of the reward, below the paper's 0.006. VAPO
# gains {glue:text}`vl_gain` over the base policy; by the last step its responses are
# {glue:text}`vl_len_end`. Two rows are out of regime by construction: $\alpha=0.05$ gives
# $\lambda_{policy}=${glue:text}`vl_lam_med` at our median (0.95 needs 400 tokens, past the
# budget), so *w/o length-adaptive GAE* reverses the paper's comparison ({glue:text}`vl_dir_lam`);
# and lengths differ by a factor of {glue:text}`vl_ratio`, not 100 (*w/o token-level loss*:
# {glue:text}`vl_dir_tok`). The critic,
# pretrained to {glue:text}`vl_ev_pre` explained variance, goes from {glue:text}`vl_ev_vapo` in
# VAPO's runs, {glue:text}`vl_pace_sentence`. {glue:text}`vl_regime_sentence` *w/o decoupled GAE*:
# {glue:text}`vl_dir_dec`.
#
# **The critic's credit.** On one base batch, GAE puts {glue:text}`vl_credit_gae` of its advantages'
# absolute mass on the tokens that decide the answer ({glue:text}`vl_credit_decisive` of the tokens),
# group advantages {glue:text}`vl_credit_group`; most of the critic's mass still sits on dots, whose
# true advantage is zero. {glue:text}`vl_crit_sentence` An earlier edition, whose minibatches cut
# prompt groups at random, found VAPO above this control by 0.068 [0.025, 0.111]; neither
# algorithm's loss depends on how groups are split, so only the split's randomness changed, and the
# difference did not survive it.
#
# :::{admonition} The long task's preconditions, row by row
# :class: dropdown
#
# ```{glue:} vl_regime_table
# ```
#
# *On one base batch with the pretrained critic, and the critic's explained variance at the first
# and last step of the runs (mean [95% t]). Explained variance pools every real token, most of them
# dots whose return the answer already fixes, and falls with the returns' variance as accuracy
# rises.*
# :::

# %% [markdown]
# ## 6.10 What the critic costs
#
# The critic is why GRPO went critic-free {cite:p}`shao2024deepseekmath`: a second network of the
# policy's size to hold, run and train. Time per step comes from the runs above (paired by seed).
# The *training state* is exact: float32 weights, gradients and AdamW's two moments, 16 bytes per
# parameter. The *peak* includes activations and everything else a process holds; on a CPU it is
# measurable only per process, so the cell trains two steps of each algorithm in a fresh process and
# reads its peak resident set size (on a GPU, the history's `peak_mem_mb`).

# %% tags=["nbval-ignore-output"]
PEAK_SCRIPT = """
import resource, sys, dataclasses
from grpo_lab import experiments
from grpo_lab.algo.algorithms import get_algorithm
from grpo_lab.policy.models import load_policy
from grpo_lab.tasks import get_task
from grpo_lab.training.trainer import Trainer
prof = experiments.get_profile(sys.argv[1])
policy, tok = load_policy(prof.base)
algo = get_algorithm("VAPO").replace(lam_alpha=float(sys.argv[3]), advantage=sys.argv[2])
cfg = dataclasses.replace(prof.config, seed=0, eval_every=0, progress=False, prompts_per_step=int(sys.argv[4]))
tr = Trainer(policy, tok, get_task(prof.task), algo, cfg)
rss = [int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:")]
h = tr.train(2)
print(rss[0] if rss else float("nan"), h["peak_mem_mb"].max())
"""


def peak_rss_mib(advantage):
    """A fresh process that builds the trainer of VAPO with ``advantage`` (``"gae"``: VAPO;
    ``"group"``: the control, no critic) and trains two steps; it prints its resident set size
    before training and the largest per-step peak (``peak_mem_mb``), in MiB (Linux)."""
    return subprocess.Popen([sys.executable, "-c", PEAK_SCRIPT, "cpu", advantage, str(ALPHA), str(P)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


CTRL = CRITIC_CONTROL.name
procs = {CTRL: peak_rss_mib("group"), "VAPO": peak_rss_mib("gae")}  # both at once, one core each
peak = {name: [float(v) for v in p.communicate()[0].split()[-2:]] for name, p in procs.items()}
step_s = pd.DataFrame({k: grid[k].history.groupby("seed")["step_seconds"].mean() for k in (CTRL, "VAPO", "DAPO")})
speed = stats.paired_ratio(step_s["VAPO"], step_s[CTRL])
speed_dapo = stats.paired_ratio(step_s["VAPO"], step_s["DAPO"])
n_critic = count_parameters(probe.value_model)
cost = pd.DataFrame({
    "trainable parameters": [n_policy, n_policy + n_critic],
    "training state, MiB (16 B / parameter)": [16 * n_policy / 2**20, 16 * (n_policy + n_critic) / 2**20],
    "RSS before training, MiB": [peak[CTRL][0], peak["VAPO"][0]],
    "peak RSS during a step, MiB": [peak[CTRL][1], peak["VAPO"][1]],
    "seconds per RL step": [stats.format_interval(stats.t_interval(step_s[CTRL]), 2),
                            stats.format_interval(stats.t_interval(step_s["VAPO"]), 2)],
}, index=[CTRL, "VAPO"])
book.glue("vapo_cost_table", cost.round(2))
book.glue("vapo_speed_ratio", stats.format_interval(speed, 2))
book.glue("vapo_speed_ratio_dapo", stats.format_interval(speed_dapo, 2))
book.glue("vapo_state_ratio", f"{(n_policy + n_critic) / n_policy:.2f}")
book.glue("vapo_peak_extra", f"{peak['VAPO'][1] - peak[CTRL][1]:+.0f}")
hv = grid["VAPO"].history.dropna(subset=["gen_seconds"])
book.glue("vapo_gen_share", f"{(hv.gen_seconds / hv.step_seconds).mean():.0%}")
hidden = probe.policy.config.hidden_size
assert n_critic == n_policy + hidden + 1  # the whole backbone (the LM head is tied to it) plus a scalar head
print(f"the critic: x{(n_policy + n_critic) / n_policy:.2f} trainable state, {peak['VAPO'][1] - peak[CTRL][1]:+.0f} MiB "
      f"peak, x{speed.mean:.2f} seconds per step")  # the table itself renders once, from its glue

# %% [markdown]
# ```{glue:} vapo_cost_table
# ```
#
# *VAPO against §6.9's critic-free control, at {glue:text}`vapo_group` responses per step: every
# column is the critic's cost. RSS: a fresh process holding the trainer, before training and at its
# peak during a step (mostly the interpreter and torch). Seconds per step: mean [95% interval] over
# seeds, from §6.9's runs.*
#
# The critic multiplies the trainable state by {glue:text}`vapo_state_ratio`, adds
# {glue:text}`vapo_peak_extra` MiB to the peak, and makes a step {glue:text}`vapo_speed_ratio` times
# as long (paired geometric mean over seeds; against DAPO, which regenerates groups,
# {glue:text}`vapo_speed_ratio_dapo`). Generation, which the critic does not touch, takes
# {glue:text}`vapo_gen_share` of a VAPO step here; at scale the critic's forward and backward over
# every token and its optimiser state on every GPU are what GRPO saved.
#
# :::{admonition} Common misreadings: "R1-Zero reaches 71, with twice the steps"
# :class: warning
#
# A popular summary puts VAPO's 60.4 next to "DeepSeek-R1-Zero at 71.0, with double the training
# steps". The 71.0 is DeepSeek-R1-Zero from the 671B DeepSeek-V3-Base {cite:p}`deepseekai2025r1`;
# no Qwen-32B run in these papers reaches 71. VAPO's comparison is on Qwen2.5-32B: **VAPO 60.4, DAPO
# 50, DeepSeek-R1-Zero-Qwen-32B 47** (Table 1). DAPO reached 50 in 50% of R1-Zero-Qwen-32B's steps
# {cite:p}`yu2025dapo`; VAPO matched it in 60% of DAPO's, reaching 60.4 within 5,000 steps (§5.2).
# :::
#
# ## 6.11 At scale
#
# The paper's setting {cite:p}`yue2025vapo` (§5.1), beside this chapter's:

# %% tags=["hide-input", "nbval-ignore-output"]
at_scale = pd.DataFrame([
    {"quantity": "policy", "paper": "Qwen2.5-32B base", "this chapter": f"{n_policy:,} parameters (arithmetic-base)"},
    {"quantity": "critic", "paper": "initialised from a reward model, 50 warm-up steps",
     "this chapter": f"copy of the policy's backbone, {PRETRAIN_STEPS} pretraining steps"},
    {"quantity": "learning rates (actor / critic)", "paper": "1e-6 / 2e-6",
     "this chapter": f"{profile.config.lr:g} / {VALUE_LR:g}"},
    {"quantity": "prompts x samples per step", "paper": "512 x 16 (PPO: 8,192 x 1), mini-batch 512",
     "this chapter": f"{P} x {G} (PPO: {P * G} x 1), {profile.config.minibatches} minibatches"},
    {"quantity": "lambda_critic / lambda_policy", "paper": "1.0 / 1 - 1/(0.05 l)",
     "this chapter": f"1.0 / 1 - 1/({ALPHA:g} l)"},
    {"quantity": "response length; policy horizon 1/(1 - lambda)",
     "paper": "hundreds to tens of thousands of tokens; 5% of the response",
     "this chapter": f"median {len_med:.0f} tokens (budget {probe.max_new_tokens}); {ALPHA:g} times the response"},
    {"quantity": "critic's explained variance of the returns, first / last step",
     "paper": "pretrained until 'good'; not reported",
     "this chapter": f"{stats.format_interval(stats.t_interval(ev_first), 2)} / "
                     f"{stats.format_interval(stats.t_interval(ev_last), 2)}"},
    {"quantity": "clip eps_low / eps_high, NLL weight mu", "paper": "0.2 / 0.28, 0.1",
     "this chapter": f"{VAPO.eps_low} / {VAPO.eps_high}, {VAPO.nll_coef}"},
    {"quantity": "result", "paper": "AIME 2024 60.4 (avg@32) within 5,000 steps; no crash in several runs",
     "this chapter": f"test accuracy {stats.format_interval(stats.t_interval(final['VAPO'], bounds=(0, 1)))} "
                     f"after {STEPS} steps"},
]).set_index("quantity")
with pd.option_context("display.max_colwidth", None):
    display(at_scale)

# %% [markdown]
# **Other implementations.** verl and OpenRLHF train PPO with GAE and a critic
# (`adv_estimator=gae`, one `lam` for both), with a critic warm-up option in verl; none of the
# anchors implements VAPO's decoupled or length-adaptive $\lambda$ or its positive-example NLL
# term, and `grpo_lab.export` refuses to translate `PPO` and `VAPO` for that reason. TRL's
# `GRPOTrainer` has no critic.

# %% [markdown]
# **GSM8K on a GPU.** With `PROFILE = "gpu"`, the next cell trains DAPO (the paper's comparison),
# VAPO and §6.9's control *VAPO with group advantages* on GSM8K from the hub instruct model
# `experiments.GPU_MODEL` (the `gpu` profile: chat-template prompts, a 512-token budget, 16 questions
# × 8 responses per step), `GPU_SEEDS` seeds each, and writes `data/results/gpu/06_vapo.json`. There
# the responses are a few hundred tokens long ($\alpha = 0.05$ gives
# $\lambda_{\text{policy}} \approx 0.92$ at 250 tokens): the regime this scale lacks. All three run
# 16 minibatches per rollout (the paper's mini-batches of 512 samples), each one whole prompt group,
# so DAPO's token normalisation is its Eq. 12. VAPO's critic needs a GPU with more than 16 GB. On
# every machine the cell shows the results file when present, after `lab.check_gpu_results`.

# %% [markdown]
# The critic's cost at that scale, predicted by the memory model (`grpo_lab.experiments.memory_model`,
# within 25% of measurements) from the model's config: the state held through the step, the critic's
# share, and the micro-batch `fit_batch_sizes` chooses for a 16 GiB and an 80 GiB card (16 × 8 rows,
# {glue:text}`vapo_gpu_prompt` prompt tokens and 512 new ones).

# %%
from grpo_lab.experiments.memory_fit import ASSUMED_PROMPT_TOKENS
from grpo_lab.experiments.memory_model import QWEN25_05B_CONFIG, RunShape, fit_batch_sizes, predict_memory

assert experiments.GPU_MODEL == "Qwen/Qwen2.5-0.5B-Instruct"  # the config the memory model carries
GPU_MINIBATCHES = 16  # VAPO §5.1: 512 prompts x 16 samples, mini-batch 512 samples: 16 updates per rollout (as DAPO §4.1)
gpu_shape = RunShape(rows=16 * 8, prompt_len=ASSUMED_PROMPT_TOKENS, max_new_tokens=512, micro_batch_size=1)
mem_rows = {}
for name, has_critic in (("DAPO", False), ("VAPO", True)):
    shape = dataclasses.replace(gpu_shape, critic=has_critic)
    row = {}
    for card in (16, 80):
        try:  # a micro-batch is at most a minibatch: 128 / 16 = 8 rows
            micro, evb = fit_batch_sizes(QWEN25_05B_CONFIG, shape, card * 2**30,
                                         max_micro=gpu_shape.rows // GPU_MINIBATCHES)
            est = predict_memory(QWEN25_05B_CONFIG, dataclasses.replace(shape, micro_batch_size=micro,
                                                                         eval_batch_size=evb))
            row[f"{card} GiB card: micro-batch, peak GiB"] = f"{micro}, {est.peak / 2**30:.1f}"
        except ValueError:
            row[f"{card} GiB card: micro-batch, peak GiB"] = "does not fit"
    est = predict_memory(QWEN25_05B_CONFIG, shape)
    row["held state, GiB"] = f"{est.persistent / 2**30:.1f}"
    row["of which the critic, GiB"] = f"{est.phases['critic'] / 2**30:.1f}"
    mem_rows[name] = row
mem_tab = pd.DataFrame(mem_rows).T
critic_gib = predict_memory(QWEN25_05B_CONFIG, dataclasses.replace(gpu_shape, critic=True)).phases["critic"] / 2**30
assert 7 < critic_gib < 8  # 16 bytes per parameter of a 0.5B backbone: the "about 8 GB" of the text
assert mem_tab.loc["VAPO", "16 GiB card: micro-batch, peak GiB"] == "does not fit"  # the T4's 16 GB
assert mem_tab.loc["DAPO", "16 GiB card: micro-batch, peak GiB"] != "does not fit"
book.glue("vapo_gpu_prompt", ASSUMED_PROMPT_TOKENS)
display(mem_tab)

# %%
VAPO_GROUP_ADV = VAPO.replace(name="VAPO with group advantages", advantage="group")  # the critic's control, as §6.9's
GPU_ALGOS = [DAPO, VAPO, VAPO_GROUP_ADV]
assert VAPO_GROUP_ADV.advantage not in VALUE_BASELINE_ESTIMATORS and VAPO.advantage in VALUE_BASELINE_ESTIMATORS
gpu_prof = experiments.gpu_profile(minibatches=GPU_MINIBATCHES)  # micro-batches fitted to the card on CUDA
assert gpu_prof.config.minibatches == 16 == gpu_prof.config.prompts_per_step  # one whole group each
if PROFILE == "colab":  # a free Colab T4 (experiments.colab_profile): LoRA, one seed, <= 30 min predicted; 8 minibatches
    # of one group each, 15 steps (3 runs: 27 min predicted)
    GPU_SEEDS, gpu_prof = experiments.COLAB_SEEDS, experiments.colab_profile(minibatches=8)
    GPU_STEPS = GPU_STEPS or 15
if PROFILE in ("gpu", "colab"):
    # VAPO §4.1 and §5.1: value pretraining before the first step (10 steps, fewer if GPU_STEPS is
    # smaller), the critic at twice the actor's learning rate
    gpu_lr = gpu_prof.config.lr
    warm = min(10, GPU_STEPS or 10)
    lab.run_chapter_gpu("06_vapo", GPU_ALGOS, seeds=GPU_SEEDS, steps=GPU_STEPS, n_jobs=GPU_N_JOBS,
                                profile=gpu_prof,
                                overrides={VAPO.name: {"value_warmup_steps": warm, "value_lr": 2 * gpu_lr}})
GPU_PAPER_REGIME = {"VAPO paper (§5.1; Qwen2.5-32B, AIME 2024)": {
    "response length (tokens)": "hundreds to tens of thousands: 20 / length <= 0.05 (§6.9)"}}
gpu_summary = book.show_gpu_results("06_vapo", GPU_ALGOS, baseline="DAPO", seeds=GPU_SEEDS, steps=GPU_STEPS,
                                   generation_factor=1.3, train_factor=2.0, too_small=("T4",), profile=gpu_prof,
                                   paper_regime=GPU_PAPER_REGIME)

# %% [markdown]
# ## 6.12 Takeaways
#
# * With one reward at the end, its share of GAE's target at token $t$ is $\lambda^{n-1}$, tiny
#   hundreds of tokens back; the critic should regress on $\lambda=1$ returns (decoupled GAE).
# * The length-adaptive $\lambda=1-1/(\alpha l)$ fixes the *horizon* at a fraction $\alpha$ of the
#   response; it is 0 for $l\le1/\alpha$: resize $\alpha$ for short answers.
# * A critic copied from the policy learns the value of partial answers; a random one did not.
#   Pretrain it on the frozen policy's returns.
# * {glue:text}`vapo_takeaway_short`
# * {glue:text}`vapo_takeaway_long`
#
# ## Exercises
#
# 1. With $\gamma=1$ and one reward $R$ at the end of an $L$-token response, what advantage does
#    GAE give token $t$ at $\lambda=1$? At $\lambda=0$?
# 2. For which response length does VAPO's formula with $\alpha=0.05$ give $\lambda=0.99$, and what
#    is then the reward's share $\lambda^{l-1}$ at the first token?
#
# :::{admonition} Solutions
# :class: dropdown
#
# 1. $\lambda=1$: $R-V(s_t)$ (the return minus the baseline). $\lambda=0$: $\delta_t$, that is
#    $V(s_{t+1})-V(s_t)$ for $t<L-1$ and $R-V(s_{L-1})$ for the last token.
# 2. $1-1/(0.05\,l)=0.99$ gives $l=2{,}000$ tokens; $0.99^{1999}\approx1.9\times10^{-9}$, about
#    $e^{-20}$ (the cell below checks both).
# :::

# %%
Vx = torch.tensor([[0.2, 0.5, 0.4, 0.9]])
mx = torch.ones(1, 4)
rx = outcome_token_rewards(torch.tensor([1.0]), mx)
assert torch.allclose(gae(rx, Vx, mx, lam=1.0)[0], 1.0 - Vx)
assert torch.allclose(gae(rx, Vx, mx, lam=0.0)[0], torch.tensor([[0.3, -0.1, 0.5, 0.1]]))
assert abs(float(length_adaptive_lam(torch.tensor([2000]), 0.05)) - 0.99) < 1e-6
assert abs(0.99 ** 1999 - 1.9e-9) < 0.1e-9 and abs(math.log(0.99 ** 1999) + 20) < 0.1
print("exercise checks passed")

# %% tags=["nbval-ignore-output", "remove-cell"]
book.glue("vapo_runtime", book.run_time(CHAPTER_START))

# %% [markdown]
# ## References
#
# The papers cited in this chapter are listed in {ref}`sec-references`.
