"""The book's regime rules: one threshold and one statistic per mechanism, used by every chapter.

A chapter may say "not tested in the paper's regime" only by a rule written here, fixed before its runs.
The intro (``book/intro.md``, "Regime rules") states them for the reader; ``tests/lab/test_regime.py``
checks that the intro's numbers are these.

**A clip acts** (PPO's, DAPO's clip-higher, CISPO's cap, GSPO's sequence clip, or any other trust region):

* statistic: per seed, the mean over the **second half** of the run's updates (RL steps ``> steps / 2``;
  for a probe of ``n`` optimiser steps, steps ``> n / 2``) of the share of loss tokens whose gradient the
  clip removes (a history column such as ``clip_frac``, ``clip_frac_high`` or ``zero_grad_frac``); then the
  mean over seeds, with its 95% t-interval beside it;
* threshold: the mean is at least :data:`CLIP_ACTS` = 0.5%.

**A cap on the sampler–learner weight acts** (TIS's truncation, MIS's mask of π_old / π_sampler): the same
statistic and threshold over the share of loss tokens whose weight the cap changes (truncates or masks); it is
the same mechanism, a bound on a per-token weight. Before any training, the share of tokens whose weight passes
the cap on the first rollout says whether a toy can reach the regime at all.

Why the second half: each rollout's first minibatch is on-policy and the first updates sit in the
learning-rate warm-up, where a clip cannot bind; the second half is where the off-policy drift the clip
answers has built up. Why 0.5%: a clip binding on under 1% of the tokens can decide an outcome (chapter 8's
control), so a 1% threshold would call such a clip idle.

Earlier editions used other thresholds and windows per chapter; a chapter whose verdict moved under this rule
shows the old verdict beside the new one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..experiments import stats

__all__ = ["CLIP_ACTS", "late_mean", "clip_acts"]

#: The share of loss tokens (per seed, averaged over the second half of the updates) above which a clip acts.
CLIP_ACTS = 0.005


def late_mean(history: pd.DataFrame, column: str) -> pd.Series:
    """Per seed, the mean of ``column`` over the second half of the run's training steps (step > last / 2).

    Args:
        history: a run's history (columns ``seed``, ``step`` and ``column``; rows with ``column`` NaN, such as
            evaluation rows, are ignored); steps count from 1.
        column: a per-step share in [0, 1], e.g. ``"clip_frac"``.

    Returns:
        float64 Series indexed by seed.

    Raises:
        KeyError: ``column`` or ``seed`` / ``step`` missing; ValueError: no training row.
    """
    for col in ("seed", "step", column):
        if col not in history.columns:
            raise KeyError(f"late_mean: the history has no column {col!r}")
    rows = history.dropna(subset=[column])
    rows = rows[rows["step"] > 0]
    if rows.empty:
        raise ValueError(f"late_mean: no training row with {column!r}")
    per_step = rows.groupby(["seed", "step"])[column].mean()
    last = per_step.index.get_level_values("step").max()
    late = per_step[per_step.index.get_level_values("step") > last / 2]
    return late.groupby(level="seed").mean().astype(np.float64)


def clip_acts(per_seed) -> tuple[bool, stats.Interval]:
    """The "a clip acts" rule on per-seed shares (:func:`late_mean`): ``(mean >= CLIP_ACTS, 95% t-interval)``.

    Raises ``ValueError`` (from :func:`grpo_lab.experiments.stats.t_interval`) on no seed or a NaN share."""
    iv = stats.t_interval(list(per_seed))
    return bool(iv.mean >= CLIP_ACTS), iv
