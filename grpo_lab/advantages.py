"""Outcome-reward advantages for group-sampled RL: GRPO z-scores, Dr.GRPO centring, RLOO.

The advantage axis of an :class:`~grpo_lab.algorithms.Algorithm` is the registry
:data:`ADVANTAGE_ESTIMATORS`: a dict from a choice's name to a function
``(batch: AdvantageBatch, algo) -> advantages [B] or [B, T]`` (float32). :class:`AdvantageBatch`
carries everything an estimator may need (rewards, group ids, the token mask and, for a value
model, per-token values), so that one signature fits group baselines and value-based ones alike.

For every prompt the policy samples a *group* of ``G`` completions; the sequences of one group are
contiguous in the batch (``[g0 s0, g0 s1, ..., g0 s(G-1), g1 s0, ...]``), so ``rewards.view(-1, G)``
puts one group per row. Each function returns one scalar advantage per sequence, which the
objectives broadcast over its tokens (DeepSeekMath §4.1.2 "outcome supervision").

Conventions (callers rely on them):

* Statistics are computed in float64 and returned as float32, on the device of ``rewards``.
* A group whose rewards are all equal gets advantage **exactly 0** (not "almost 0" from
  floating-point rounding of its mean), whatever the scaling. "Equal" is judged relative to the
  rewards' scale (:func:`tied_groups`): rewards that differ only by rounding, such as
  ``0.1 + 0.2`` and ``0.3``, are a tie, so their advantages are centred and finite even with
  ``eps = 0``.
* ``group_size == 1`` (a lone sample has no baseline to compare to) gives advantage 0 in
  :func:`group_advantages`; :func:`rloo_advantages` raises instead (a leave-one-out baseline
  needs at least one other sample).
* NaN / inf rewards raise ``ValueError``: a silent NaN would poison every gradient of the batch.

Where the code departs from the papers, and why: DeepSeekMath §4.1.2 writes the std without
saying which; we use the unbiased (``G - 1``) one, as TRL and verl do. A group of equal rewards
gets exactly 0 instead of ``0 / (0 + eps)`` rounding noise, and "equal" allows rounding
(:func:`tied_groups`), so that sums of the same reward terms in a different order are a tie.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional, Sequence, Union

import torch
from torch import Tensor

from . import validation as _v

if TYPE_CHECKING:  # algorithms imports this module
    from .algorithms import Algorithm

__all__ = ["group_advantages", "rloo_advantages", "group_stats", "tied_groups", "GroupStats", "SCALES",
           "TIE_ULPS", "AdvantageBatch", "ADVANTAGE_ESTIMATORS", "GROUP_BASELINE_ESTIMATORS"]

#: The ``scale`` choices of :func:`group_advantages` (divide by the group std, the batch std, or not).
SCALES = ("group", "batch", "none")

RewardsLike = Union[Tensor, Sequence[float]]

#: A group is a tie when its reward spread is at most this many units in the last place of its
#: largest ``|reward|`` (in the dtype the rewards were given in); see :func:`tied_groups`.
TIE_ULPS = 8


def _grouped(rewards: RewardsLike, group_size: int) -> tuple[Tensor, Tensor]:
    """Validate and return ``(r [B] float64, r.view(-1, G))``."""
    if not _v.is_int(group_size):
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


def _tie_tolerance(rewards: RewardsLike) -> float:
    """Relative tie tolerance ``TIE_ULPS * eps(dtype)`` for rewards given in ``dtype``; 0 for
    integer rewards (exact) and float64 for python numbers."""
    dtype = rewards.dtype if isinstance(rewards, Tensor) else torch.float64
    if not dtype.is_floating_point:
        return 0.0
    return TIE_ULPS * torch.finfo(dtype).eps


def _ties(rewards: RewardsLike, rg: Tensor) -> Tensor:
    spread = rg.amax(dim=1) - rg.amin(dim=1)
    return spread <= _tie_tolerance(rewards) * rg.abs().amax(dim=1)


def tied_groups(rewards: RewardsLike, group_size: int) -> Tensor:
    """Which groups are ties: all rewards equal up to rounding, relative to the rewards' scale.

    Group ``g`` is a tie iff ``max_g r - min_g r <= TIE_ULPS * eps(dtype) * max_g |r|``, with
    ``eps(dtype)`` the machine epsilon of the dtype the rewards were given in (float64 for python
    numbers; integer rewards must be exactly equal). Exactly equal rewards are always a tie; so
    are ``[0.1 + 0.2, 0.3, 0.3]`` (they differ by one float64 ulp). A real difference, such as
    DAPO's overlong penalty of ``1/L_cache``, is billions of ulps and never a tie. Every
    advantage estimator gives a tied group advantage exactly 0, and ``zero_adv_frac`` counts
    tied groups.

    Args:
        rewards: ``[B]`` rewards (tensor of any real dtype, or a list), groups contiguous.
        group_size: ``G >= 1`` dividing ``B``.

    Returns:
        ``[B // G]`` bool tensor on the device of ``rewards``.

    Raises:
        ValueError: as :func:`group_advantages` (non-finite reward, bad group_size, B % G != 0).
    """
    _, rg = _grouped(rewards, group_size)
    return _ties(rewards, rg)


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

    Exactly 0 for every member of a group whose rewards are all equal up to rounding (such
    groups carry no learning signal; the tie rule is :func:`tied_groups`). ``group_size == 1``: the unbiased std of one sample
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
    all_equal = _ties(rewards, rg).unsqueeze(1)  # [n_groups, 1]
    centred = rg - rg.mean(dim=1, keepdim=True)
    if scale == "none" or group_size == 1:
        adv = centred
    elif scale == "group":
        std = rg.std(dim=1, correction=1, keepdim=True)
        adv = centred / (std + eps_f)
    else:  # batch
        std_b = r.std(correction=1) if r.numel() > 1 else r.new_zeros(())
        adv = centred / (std_b + eps_f)
    # a spread so small that the std is subnormal ([5e-324, 0] with eps=0) overflows the division;
    # |z| <= (G - 1) / sqrt(G) in exact arithmetic, so such a group is a tie at float resolution
    all_equal = all_equal | ~torch.isfinite(adv).all(dim=1, keepdim=True)
    adv = torch.where(all_equal, torch.zeros_like(adv), adv)
    # eps == 0 with a non-tied group cannot divide by 0 (std > 0); batch std > 0 likewise
    # whenever some group is not tied. Anything else was zeroed above.
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
    if _v.is_int(group_size) and group_size == 1:
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
    all_equal = _ties(rewards, rg).unsqueeze(1)
    adv = torch.where(all_equal, torch.zeros_like(adv), adv)
    return adv.reshape(-1).to(torch.float32)


class GroupStats(NamedTuple):
    """Per-group reward statistics returned by :func:`group_stats`.

    Attributes:
        mean: ``[n_groups]`` float32 group mean reward.
        std: ``[n_groups]`` float32 unbiased group std (0 for ``G == 1``).
        all_equal: ``[n_groups]`` bool, True where the group is a tie (:func:`tied_groups`).
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
    all_equal = _ties(rewards, rg)
    std = rg.std(dim=1, correction=1) if group_size > 1 else torch.zeros(n, dtype=r.dtype, device=r.device)
    std = torch.where(all_equal, torch.zeros_like(std), std)
    return GroupStats(
        mean=rg.mean(dim=1).to(torch.float32),
        std=std.to(torch.float32),
        all_equal=all_equal,
        zero_adv_frac=float(all_equal.to(torch.float64).mean()),
        num_groups=n,
    )


# ------------------------------------------------------------------------------------------------
# the advantage axis: one registry of estimators with one signature
# ------------------------------------------------------------------------------------------------
class AdvantageBatch(NamedTuple):
    """What an advantage estimator sees: one batch of sampled responses, groups contiguous.

    Attributes:
        rewards: ``[B]`` scalar rewards (a tensor of any real dtype; the tie rule of
            :func:`tied_groups` depends on it).
        group_ids: ``[B]`` int64 group index of each response; groups contiguous and of equal
            size (``[0, 0, 0, 1, 1, 1, ...]``).
        mask: ``[B, T]`` token mask (1 = real token) or None; for token-level estimators.
        values: ``[B, T]`` value-model predictions or None; for value-based estimators (GAE).

    Build it with :meth:`from_groups`.
    """

    rewards: Tensor
    group_ids: Tensor
    mask: Optional[Tensor] = None
    values: Optional[Tensor] = None

    @classmethod
    def from_groups(cls, rewards: RewardsLike, group_size: int, *, mask: Optional[Tensor] = None,
                    values: Optional[Tensor] = None) -> "AdvantageBatch":
        """The batch of ``B / group_size`` contiguous groups of ``group_size`` responses each.

        Raises:
            ValueError: as :func:`group_advantages` (bad ``group_size``, ``B % group_size != 0``,
                non-finite rewards), or ``mask`` / ``values`` not ``[B, T]`` (the same shape).
        """
        r, rg = _grouped(rewards, group_size)
        if not isinstance(rewards, Tensor):
            rewards = r
        b = r.shape[0]
        for name, x in (("mask", mask), ("values", values)):
            if x is not None and (not isinstance(x, Tensor) or x.dim() != 2 or x.shape[0] != b):
                got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
                raise ValueError(f"{name} must be a [B, T] tensor with B={b}, got {got}")
        if mask is not None and values is not None and mask.shape != values.shape:
            raise ValueError(f"shape mismatch: mask {tuple(mask.shape)} vs values {tuple(values.shape)}")
        ids = torch.arange(rg.shape[0], device=r.device).repeat_interleave(int(group_size))
        return cls(rewards, ids, mask, values)

    @property
    def group_size(self) -> int:
        """``G``, after checking that the groups are contiguous and of equal size (1 when empty).

        Raises:
            ValueError: ``group_ids`` not a ``[B]`` integer tensor, a group split in two, or
                groups of different sizes.
        """
        if not isinstance(self.rewards, Tensor) or self.rewards.dim() != 1:
            raise ValueError("rewards must be a [B] tensor (build the batch with AdvantageBatch.from_groups)")
        ids, b = self.group_ids, self.rewards.shape[0]
        if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.shape[0] != b or ids.is_floating_point():
            raise ValueError(f"group_ids must be a [B] integer tensor with B={b}")
        if b == 0:
            return 1
        runs, sizes = torch.unique_consecutive(ids, return_counts=True)
        if runs.numel() != torch.unique(ids).numel():
            raise ValueError("group_ids: the responses of a group must be contiguous; a group id appears in two runs")
        if bool((sizes != sizes[0]).any()):
            raise ValueError(f"group_ids: every group must have the same size, got sizes {sorted(set(sizes.tolist()))}")
        return int(sizes[0])


def group_zscore(batch: AdvantageBatch, algo: "Algorithm") -> Tensor:
    """``"group"``: ``(r - mean_g) / (std_g + adv_eps)``, GRPO (DeepSeekMath §4.1.2)."""
    return group_advantages(batch.rewards, batch.group_size, scale="group", eps=algo.adv_eps)


def group_mean_baseline(batch: AdvantageBatch, algo: "Algorithm") -> Tensor:
    """``"group_mean"``: ``r - mean_g``, Dr.GRPO §3.2 and DeepSeek-V3.2 Eq. 5."""
    return group_advantages(batch.rewards, batch.group_size, scale="none", eps=algo.adv_eps)


def batch_std(batch: AdvantageBatch, algo: "Algorithm") -> Tensor:
    """``"batch"``: ``(r - mean_g) / (std_batch + adv_eps)``, the group mean over the batch's std."""
    return group_advantages(batch.rewards, batch.group_size, scale="batch", eps=algo.adv_eps)


def rloo(batch: AdvantageBatch, algo: "Algorithm") -> Tensor:
    """``"rloo"``: ``r_i`` minus the mean of the other ``G - 1`` rewards of its group."""
    if len(batch.rewards) == 0:  # no groups, hence no group size to check
        return batch.rewards.detach().to(torch.float32)
    return rloo_advantages(batch.rewards, batch.group_size)


#: advantage estimator -> ``(batch: AdvantageBatch, algo) -> [B] or [B, T]`` float32
ADVANTAGE_ESTIMATORS: dict[str, Callable[[AdvantageBatch, "Algorithm"], Tensor]] = {
    "group": group_zscore,
    "group_mean": group_mean_baseline,
    "batch": batch_std,
    "rloo": rloo,
}

#: The :data:`ADVANTAGE_ESTIMATORS` whose baseline is the other responses of the same group, so that
#: they need ``group_size >= 2``: with ``G = 1`` every advantage of ``"group"``, ``"group_mean"`` and
#: ``"batch"`` is exactly 0 (:func:`group_advantages`) and ``"rloo"`` raises. ``Trainer`` warns when
#: one of them is used with ``group_size=1``. A new estimator with a group baseline adds its name
#: here when it is registered; one that is not listed (a value-model baseline such as GAE works with
#: ``G = 1``) is taken to need no group.
GROUP_BASELINE_ESTIMATORS: set[str] = {"group", "group_mean", "batch", "rloo"}
