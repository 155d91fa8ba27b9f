"""Outcome-reward advantages for group-sampled RL: GRPO z-scores, Dr.GRPO centring, RLOO.

For every prompt the policy samples a *group* of ``G`` completions; the sequences of one group are
contiguous in the batch (``[g0 s0, g0 s1, ..., g0 s(G-1), g1 s0, ...]``), so ``rewards.view(-1, G)``
puts one group per row. Each function returns one scalar advantage per sequence, which the
objectives broadcast over its tokens (DeepSeekMath §4.1.2 "outcome supervision").

Conventions (callers rely on them):

* Statistics are computed in float64 and returned as float32, on the device of ``rewards``.
* A group whose rewards are all equal gets advantage **exactly 0** (not "almost 0" from
  floating-point rounding of its mean), whatever the scaling.
* ``group_size == 1`` (a lone sample has no baseline to compare to) gives advantage 0 in
  :func:`group_advantages`; :func:`rloo_advantages` raises instead (a leave-one-out baseline
  needs at least one other sample).
* NaN / inf rewards raise ``ValueError``: a silent NaN would poison every gradient of the batch.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence, Union

import torch
from torch import Tensor

__all__ = ["group_advantages", "rloo_advantages", "group_stats", "GroupStats", "SCALES"]

SCALES = ("group", "batch", "none")

RewardsLike = Union[Tensor, Sequence[float]]


def _grouped(rewards: RewardsLike, group_size: int) -> tuple[Tensor, Tensor]:
    """Validate and return ``(r [B] float64, r.view(-1, G))``."""
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ValueError(f"group_size must be an int, got {group_size!r}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if not isinstance(rewards, Tensor):
        try:
            rewards = torch.as_tensor(rewards, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"rewards must be a 1-D tensor of numbers: {exc}") from None
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D with shape [B], got shape {tuple(rewards.shape)}")
    if rewards.is_complex():
        raise ValueError("rewards must be real numbers, got a complex tensor")
    r = rewards.detach().to(torch.float64)
    b = r.shape[0]
    if b % group_size != 0:
        raise ValueError(
            f"group_size={group_size} does not divide the batch size B={b}; sequences of a group "
            "must be contiguous and every group complete"
        )
    if b > 0 and not bool(torch.isfinite(r).all()):
        bad = (~torch.isfinite(r)).nonzero().flatten()[:5].tolist()
        raise ValueError(f"rewards must be finite; got NaN/inf at positions {bad}")
    return r, r.view(-1, group_size)


def group_advantages(
    rewards: RewardsLike,
    group_size: int,
    *,
    scale: str = "group",
    eps: float = 1e-4,
) -> Tensor:
    """Group-relative advantages: reward minus its group mean, optionally divided by a std.

    * ``scale="group"`` — GRPO, DeepSeekMath (arXiv 2402.03300) §4.1.2:
      ``A_i = (r_i - mean_g) / (std_g + eps)`` with the **unbiased** (Bessel, ``G - 1``) standard
      deviation of the group (as TRL and verl compute it).
    * ``scale="batch"`` — group mean, batch std: ``A_i = (r_i - mean_g) / (std_batch + eps)``, with
      ``std_batch`` the unbiased std of all ``B`` rewards of the batch (the "batch" option of TRL's
      ``scale_rewards``; removes the per-question difficulty weighting of the group std).
    * ``scale="none"`` — Dr.GRPO (arXiv 2503.20783) §3.2: ``A_i = r_i - mean_g`` (also the
      advantage of DeepSeek-V3.2, arXiv 2512.02556, Eq. 5).

    Exactly 0 for every member of a group whose rewards are all equal (such groups carry no
    learning signal; see :func:`group_stats`). ``group_size == 1``: the unbiased std of one sample
    is undefined and a lone sample has no baseline to compare to, so its advantage is defined as
    0 (for every ``scale``). A batch std of a single reward is treated as 0 likewise.

    Args:
        rewards: ``[B]`` scalar rewards (any real dtype, or a list), groups contiguous.
        group_size: ``G >= 1`` dividing ``B``.
        scale: ``"group"`` | ``"batch"`` | ``"none"``.
        eps: ``>= 0`` added to the std in the denominator (TRL's 1e-4 by default); unused for
            ``"none"``.

    Returns:
        ``[B]`` float32 advantages (reward units divided by reward std units for the scaled modes,
        reward units for ``"none"``), on the device of ``rewards``; detached from any graph.

    Raises:
        ValueError: rewards not 1-D or containing NaN / inf; ``group_size < 1`` or not an int;
            ``B % group_size != 0``; unknown ``scale``; ``eps`` negative or not finite.
    """
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; expected one of {SCALES}")
    try:
        eps_f = float(eps)
    except (TypeError, ValueError):
        raise ValueError(f"eps must be a number, got {eps!r}") from None
    if not math.isfinite(eps_f) or eps_f < 0:
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    r, rg = _grouped(rewards, group_size)
    if r.numel() == 0:
        return r.to(torch.float32)
    all_equal = (rg.amax(dim=1) == rg.amin(dim=1)).unsqueeze(1)  # [n_groups, 1]
    centred = rg - rg.mean(dim=1, keepdim=True)
    if scale == "none" or group_size == 1:
        adv = centred
    elif scale == "group":
        std = rg.std(dim=1, correction=1, keepdim=True)
        adv = centred / (std + eps_f)
    else:  # batch
        std_b = r.std(correction=1) if r.numel() > 1 else r.new_zeros(())
        adv = centred / (std_b + eps_f)
    adv = torch.where(all_equal, torch.zeros_like(adv), adv)
    # eps == 0 with a non-constant group cannot divide by 0 (std > 0); batch std > 0 likewise
    # whenever some group is non-constant. Anything else was zeroed above.
    return adv.reshape(-1).to(torch.float32)


def rloo_advantages(rewards: RewardsLike, group_size: int) -> Tensor:
    """REINFORCE leave-one-out advantages: each reward minus the mean of the *other* G-1 rewards.

    ``A_i = r_i - (1 / (G - 1)) * sum_{j != i} r_j = G / (G - 1) * (r_i - mean_g)``
    (Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline for free"; used for LLMs by
    Ahmadian et al. 2024, arXiv 2402.14740). The second form is the identity of Dr.GRPO
    (arXiv 2503.20783) App. A, Eqs. 4-6: its centred advantage equals RLOO up to ``G / (G - 1)``.
    All-equal groups give exactly 0.

    Args:
        rewards: ``[B]`` scalar rewards, groups contiguous.
        group_size: ``G >= 2`` dividing ``B``.

    Returns:
        ``[B]`` float32 advantages in reward units, on the device of ``rewards``.

    Raises:
        ValueError: ``group_size < 2`` (no other sample to form a baseline); rewards not 1-D or
            NaN / inf; ``B % group_size != 0``.
    """
    if isinstance(group_size, int) and not isinstance(group_size, bool) and group_size == 1:
        raise ValueError(
            "rloo_advantages needs group_size >= 2: a group of one has no other sample "
            "for the leave-one-out baseline"
        )
    r, rg = _grouped(rewards, group_size)
    if r.numel() == 0:
        return r.to(torch.float32)
    g = rg.shape[1]
    others_mean = (rg.sum(dim=1, keepdim=True) - rg) / (g - 1)
    adv = rg - others_mean
    all_equal = (rg.amax(dim=1) == rg.amin(dim=1)).unsqueeze(1)
    adv = torch.where(all_equal, torch.zeros_like(adv), adv)
    return adv.reshape(-1).to(torch.float32)


class GroupStats(NamedTuple):
    """Per-group reward statistics returned by :func:`group_stats`.

    Attributes:
        mean: ``[n_groups]`` float32 group mean reward.
        std: ``[n_groups]`` float32 unbiased group std (0 for ``G == 1``).
        all_equal: ``[n_groups]`` bool, True where every reward of the group is the same.
        zero_adv_frac: python float in [0, 1], fraction of groups with all-equal rewards (their
            advantages are 0 under every estimator, so they give no policy gradient); 0.0 for an
            empty batch.
        num_groups: python int.
    """

    mean: Tensor
    std: Tensor
    all_equal: Tensor
    zero_adv_frac: float
    num_groups: int


def group_stats(rewards: RewardsLike, group_size: int) -> GroupStats:
    """Per-group mean / unbiased std of the rewards and the zero-advantage group fraction.

    The trainer logs ``zero_adv_frac`` as "zero-advantage group fraction" — DAPO (arXiv
    2503.14476) §3.2 motivates dynamic sampling by these groups (accuracy 0 or 1), which carry no
    gradient. A group of one always counts as zero-advantage.

    Args:
        rewards: ``[B]`` rewards, groups contiguous. group_size: ``G >= 1`` dividing ``B``.

    Returns:
        :class:`GroupStats`.

    Raises:
        ValueError: as :func:`group_advantages` (non-finite reward, bad group_size, B % G != 0).
    """
    r, rg = _grouped(rewards, group_size)
    n = rg.shape[0]
    if n == 0:
        empty = r.new_zeros(0, dtype=torch.float32)
        return GroupStats(empty, empty.clone(), torch.zeros(0, dtype=torch.bool, device=r.device), 0.0, 0)
    all_equal = rg.amax(dim=1) == rg.amin(dim=1)
    std = rg.std(dim=1, correction=1) if group_size > 1 else torch.zeros(n, dtype=r.dtype, device=r.device)
    std = torch.where(all_equal, torch.zeros_like(std), std)
    return GroupStats(
        mean=rg.mean(dim=1).to(torch.float32),
        std=std.to(torch.float32),
        all_equal=all_equal,
        zero_adv_frac=float(all_equal.to(torch.float64).mean()),
        num_groups=n,
    )
