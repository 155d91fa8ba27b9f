"""The sampling & shaping axis: which generated samples train, and how their rewards are shaped.

The trainer calls these stage functions and never reads an algorithm's switches itself:

* :func:`shape` — the reward a sample trains on, from its task reward (DAPO, arXiv 2503.14476,
  Eq. 13 *Soft Overlong Punishment* when ``algo.overlong_cache_len`` or ``algo.overlong_cache_frac``
  is set (:func:`overlong_cache_tokens`), through
  :func:`grpo_lab.algo.rewards.shape_rewards`);
* :data:`SELECTORS` / :func:`select_groups` — which groups of a rollout are kept (DAPO Eq. 11
  *Dynamic Sampling* keeps groups of mixed accuracy and the trainer samples more until the batch
  is full);
* :func:`loss_mask` — which tokens enter the loss (DAPO §3.4 *Overlong Filtering* drops truncated
  samples);
* :func:`check` — the trainer settings an algorithm's sampling choices need;
* :func:`sampling_metrics` — the columns that describe this axis in the history.

Where the code departs from the paper: DAPO filters groups by accuracy 0 or 1 of the *reward*; we
filter by raw correctness (``task.is_correct``), because a shaped reward (the overlong penalty)
makes a group of equally correct answers look mixed. A new selection rule is one function in
:data:`SELECTORS`, chosen in :func:`selector_name`.
"""

from __future__ import annotations

import math

from typing import Callable

import torch
from torch import Tensor

from . import hparams as _hp
from .rewards import shape_rewards

__all__ = ["SELECTORS", "SELECTOR_INPUTS", "keep_all", "keep_mixed_accuracy", "select_groups", "selector_name", "overlong_cache_tokens", "shape",
           "loss_mask", "check", "sampling_metrics"]


def keep_all(correct: Tensor, group_size: int) -> Tensor:
    """Every group: indices ``[n_groups]`` (long)."""
    return torch.arange(correct.numel() // group_size)


def keep_mixed_accuracy(correct: Tensor, group_size: int) -> Tensor:
    """DAPO Eq. 11: the groups whose raw accuracy is strictly between 0 and 1 (long indices)."""
    acc = correct.float().view(-1, group_size).mean(1)
    return ((acc > 0) & (acc < 1)).nonzero().flatten()


#: group selectors ``(correct [B] bool, group_size) -> kept group indices [k] long``
SELECTORS: dict[str, Callable[[Tensor, int], Tensor]] = {"all": keep_all, "mixed_accuracy": keep_mixed_accuracy}


def selector_name(algo) -> str:
    """The :data:`SELECTORS` entry of ``algo`` (``"mixed_accuracy"`` with DAPO's dynamic sampling)."""
    return "mixed_accuracy" if algo.dynamic_sampling else "all"


#: the inputs a selector may declare (:func:`grpo_lab.algo.hparams.declare`), handed to it as keywords
SELECTOR_INPUTS = ("rewards", "raw_rewards", "lengths")


def select_groups(algo, correct: Tensor, group_size: int, inputs: dict | None = None) -> Tensor:
    """Indices of the groups of one rollout that ``algo`` trains on (long ``[k]``, ascending).

    Args:
        correct: ``[B]`` bool; group_size: G.
        inputs: ``{name: [B] tensor}`` of :data:`SELECTOR_INPUTS` (``rewards`` the training rewards, ``raw_rewards``
            the task's, ``lengths`` real completion tokens); the selector gets those it declares, as keywords.

    Raises:
        ValueError: the selector declares an input outside :data:`SELECTOR_INPUTS` or one ``inputs`` lacks.
    """
    fn = SELECTORS[selector_name(algo)]
    names = _hp.spec(fn).inputs
    bad = [k for k in names if k not in SELECTOR_INPUTS or k not in (inputs or {})]
    if bad:
        raise ValueError(f"selector {selector_name(algo)!r} ({getattr(fn, '__name__', fn)}) declares inputs {bad}; a "
                         f"selector may read {list(SELECTOR_INPUTS)}, given as select_groups(..., inputs=)")
    return fn(correct, group_size, **{k: inputs[k] for k in names})


def overlong_cache_tokens(algo, max_new_tokens: int) -> int | None:
    """DAPO's ``L_cache`` in tokens for a generation budget ``L_max = max_new_tokens`` (Eq. 13, §3.4).

    ``algo.overlong_cache_len`` when set (a fixed count), else
    ``max(1, floor(algo.overlong_cache_frac * L_max + 1/2))`` (the fraction rounded half up:
    0.2 of 32 tokens is 6, of 20 tokens 4, of 20,480 tokens the paper's 4,096), else ``None``
    (the penalty is off).

    Raises:
        ValueError: ``max_new_tokens`` not a positive int, or a fixed ``L_cache`` longer than
            ``L_max / 2`` tokens. Eq. 13 itself only needs ``L_cache <= L_max``, but the penalty
            ramps over the last ``L_cache`` tokens of the budget, so a longer ramp penalises
            ordinary answers (typically a fixed count sized for another budget); DAPO uses
            ``L_max / 5``. The message states the rule with its numbers and the fix, in Python
            (``algo.replace(overlong_cache_len=None, overlong_cache_frac=0.2)``) and on the command
            line (``--set overlong_cache_len=none --set overlong_cache_frac=0.2``).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"overlong_cache_tokens: max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if algo.overlong_cache_len is not None:
        cache = algo.overlong_cache_len
        if 2 * cache > max_new_tokens:
            half = max_new_tokens // 2 if max_new_tokens % 2 == 0 else max_new_tokens / 2
            frac = _tokens_of_fraction(0.2, max_new_tokens)
            raise ValueError(
                f"algo.overlong_cache_len={cache} is too long for max_new_tokens={max_new_tokens}: the soft "
                f"overlong punishment (DAPO Eq. 13) penalises every answer longer than L_max - L_cache = "
                f"{max(max_new_tokens - cache, 0)} tokens, so L_cache must be at most L_max / 2 (= {half} here) "
                f"to leave ordinary answers unpunished (DAPO uses L_max / 5). "
                f"Use a fraction of the budget instead: algo.replace(overlong_cache_len=None, "
                f"overlong_cache_frac=0.2) in Python, or --set overlong_cache_len=none --set "
                f"overlong_cache_frac=0.2 on the command line (L_cache = {frac} token{'s' if frac != 1 else ''} here)"
                + (f", or a fixed overlong_cache_len of at most {max_new_tokens // 2}" if max_new_tokens >= 2 else ""))
        return cache
    if algo.overlong_cache_frac is None:
        return None
    return _tokens_of_fraction(algo.overlong_cache_frac, max_new_tokens)


def _tokens_of_fraction(frac: float, max_new_tokens: int) -> int:
    """``max(1, floor(frac * max_new_tokens + 1/2))``: a fraction of the budget in whole tokens."""
    return max(1, math.floor(frac * max_new_tokens + 0.5))


def shape(algo, rewards: Tensor, lengths: Tensor, max_new_tokens: int) -> Tensor:
    """The training reward ``[B]`` float32: the task reward, plus DAPO's soft overlong penalty
    (Eq. 13, ``L_max = max_new_tokens``, ``L_cache`` = :func:`overlong_cache_tokens`) when set."""
    cache = overlong_cache_tokens(algo, max_new_tokens)
    if cache is None:
        return rewards
    return shape_rewards(rewards, lengths, max_len=max_new_tokens, cache_len=cache)


def loss_mask(algo, completion_mask: Tensor, truncated: Tensor) -> Tensor:
    """The ``[B, T]`` mask of the tokens that enter the loss: the completion mask, without the
    truncated rows when ``algo.overlong_filter`` (DAPO §3.4); the rows still count in their group's
    reward statistics."""
    if not algo.overlong_filter:
        return completion_mask
    return completion_mask * (~truncated).to(completion_mask.dtype)[:, None]


def check(algo, *, group_size: int, max_new_tokens: int) -> None:
    """Raise ``ValueError`` when the trainer settings cannot run ``algo``'s sampling choices."""
    try:
        overlong_cache_tokens(algo, max_new_tokens)
    except ValueError as exc:
        raise ValueError(f"Trainer: {exc}") from None
    if selector_name(algo) != "all" and group_size < 2:
        raise ValueError("Trainer: dynamic sampling needs group_size >= 2 (a group of one is never "
                         "of mixed accuracy)")


def sampling_metrics(raw: Tensor, shaped: Tensor, n_generated: int, n_trained: int, rounds: int,
                     group_size: int, *, n_selected: int | None = None) -> dict:
    """History columns of this axis: ``gen_rounds`` (generation rounds this step),
    ``generated_groups``, ``selected_groups`` (groups the selector kept, before the surplus of the
    last round is dropped; ``n_selected`` samples, default ``n_trained``), ``trained_groups``,
    ``samples_per_trained`` (generated / trained samples; NaN without an update) and
    ``overlong_frac_penalised`` (generated samples whose shaped reward is below the task reward;
    0 when shaping is off)."""
    return {
        "gen_rounds": rounds,
        "generated_groups": n_generated // group_size,
        "selected_groups": (n_trained if n_selected is None else n_selected) // group_size,
        "trained_groups": n_trained // group_size,
        "samples_per_trained": n_generated / n_trained if n_trained else float("nan"),
        "overlong_frac_penalised": float((shaped < raw).float().mean()) if raw.numel() else 0.0,
    }
