"""Advantages: GRPO z-scores, Dr.GRPO centring and RLOO over groups; GAE over a critic's values.

The advantage axis of an :class:`~grpo_lab.algo.algorithms.Algorithm` is the registry
:data:`ADVANTAGE_ESTIMATORS`, ``(batch: AdvantageBatch, *, hyper-parameters) -> [B] or [B, T]`` float32;
:class:`AdvantageBatch` carries rewards, group ids, the token mask and a critic's values. The sequences of
one group are contiguous (``rewards.view(-1, G)`` puts one group per row). Group estimators return one
advantage per sequence, broadcast over its tokens (DeepSeekMath §4.1.2, outcome supervision); GAE
(:func:`gae`, PPO, VAPO) returns one per token from the outcome reward at the last real token.

Conventions: statistics in float64, returned as float32 on the rewards' device; a group whose rewards are
equal up to rounding (:func:`tied_groups`) gets exactly 0; ``group_size == 1`` gives 0 in
:func:`group_advantages` and raises in :func:`rloo_advantages`; NaN / inf rewards raise ``ValueError``.

Departure: DeepSeekMath §4.1.2 does not say which std; we use the unbiased (``G - 1``) one, as TRL and verl.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional, Sequence, Union

import torch
from torch import Tensor

from . import checks as _v

__all__ = ["group_advantages", "rloo_advantages", "tied_groups", "SCALES",
           "TIE_ULPS", "AdvantageBatch", "ADVANTAGE_ESTIMATORS", "GROUP_BASELINE_ESTIMATORS",
           "VALUE_BASELINE_ESTIMATORS", "gae_advantages",
           "outcome_token_rewards", "gae", "length_adaptive_lam", "explained_variance"]

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
    r = _real_vector(rewards, "rewards", allow_bool=True)
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


def _real_vector(x, name: str, *, allow_bool: bool = False) -> Tensor:
    """``x`` (a tensor or a sequence of numbers) as a detached 1-D float64 tensor; ``ValueError`` naming
    ``name`` when it is not 1-D or not real (bool only with ``allow_bool``)."""
    if not isinstance(x, Tensor):
        try:
            x = torch.as_tensor(x, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{name} must be a 1-D tensor of numbers: {exc}") from None
    if x.dim() != 1:
        raise ValueError(f"{name} must be 1-D with shape [B], got shape {tuple(x.shape)}")
    if x.is_complex() or (x.dtype == torch.bool and not allow_bool):
        raise ValueError(f"{name} must be real numbers, got dtype {x.dtype}")
    return x.detach().to(torch.float64)


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

    * ``scale="group"`` — GRPO, DeepSeekMath §4.1.2: ``(r_i - mean_g) / (std_g + eps)``, unbiased std;
    * ``scale="batch"`` — ``(r_i - mean_g) / (std_batch + eps)`` (TRL's ``scale_rewards="batch"``);
    * ``scale="none"`` — Dr.GRPO §3.2, DeepSeek-V3.2 Eq. 5: ``r_i - mean_g``.

    A tied group (:func:`tied_groups`) and ``group_size == 1`` give exactly 0.

    Args:
        rewards: ``[B]`` scalar rewards (any real dtype, or a list), groups contiguous.
        group_size: ``G >= 1`` dividing ``B``.
        scale: ``"group"`` | ``"batch"`` | ``"none"``.
        eps: ``>= 0`` added to the std (TRL's 1e-4); unused for ``"none"``.

    Returns:
        ``[B]`` float32 advantages on the device of ``rewards``, detached.

    Raises:
        ValueError: rewards not 1-D or NaN / inf; ``group_size`` not an int ``>= 1`` or not dividing ``B``;
            unknown ``scale``; ``eps`` negative or not finite.
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
        correct: ``[B]`` bool (the task's verdict, whatever the reward) or None: filled by the trainer only
            for an estimator that declares the input ``"correct"`` (:func:`grpo_lab.algo.hparams.declare`).
        raw_rewards: ``[B]`` float, the task's rewards before shaping (``rewards`` are the training rewards), or
            None: filled by the trainer only for an estimator that declares ``"raw_rewards"``.

    Build it with :meth:`from_groups`. ``group_size`` (G) and ``lengths`` are properties.
    """

    rewards: Tensor
    group_ids: Tensor
    mask: Optional[Tensor] = None
    values: Optional[Tensor] = None
    correct: Optional[Tensor] = None
    raw_rewards: Optional[Tensor] = None

    @property
    def lengths(self) -> Tensor:
        """``[B]`` int64 real tokens per response (the mask's row sums). Raises ``ValueError`` without a mask."""
        if self.mask is None:
            raise ValueError("AdvantageBatch.lengths needs the mask (AdvantageBatch.from_groups(..., mask=))")
        return (self.mask != 0).sum(dim=-1)

    @classmethod
    def from_groups(cls, rewards: RewardsLike, group_size: int, *, mask: Optional[Tensor] = None,
                    values: Optional[Tensor] = None, correct: Optional[Tensor] = None,
                    raw_rewards: Optional[Tensor] = None) -> "AdvantageBatch":
        """The batch of ``B / group_size`` contiguous groups of ``group_size`` responses each.

        Raises:
            ValueError: as :func:`group_advantages` (bad ``group_size``, ``B % group_size != 0``,
                non-finite rewards), ``mask`` / ``values`` not ``[B, T]`` (the same shape), or ``correct`` /
                ``raw_rewards`` not a ``[B]`` tensor.
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
        if correct is not None:
            if not isinstance(correct, Tensor) or tuple(correct.shape) != (b,):
                got = tuple(correct.shape) if isinstance(correct, Tensor) else type(correct).__name__
                raise ValueError(f"correct must be a [B] tensor with B={b}, got {got}")
            correct = correct != 0
        if raw_rewards is not None and (not isinstance(raw_rewards, Tensor) or tuple(raw_rewards.shape) != (b,)):
            got = tuple(raw_rewards.shape) if isinstance(raw_rewards, Tensor) else type(raw_rewards).__name__
            raise ValueError(f"raw_rewards must be a [B] tensor with B={b}, got {got}")
        ids = torch.arange(rg.shape[0], device=r.device).repeat_interleave(int(group_size))
        return cls(rewards, ids, mask, values, correct, raw_rewards)

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


def group_zscore(batch: AdvantageBatch, *, adv_eps: float = 1e-4) -> Tensor:
    """``"group"``: ``(r - mean_g) / (std_g + adv_eps)``, GRPO (DeepSeekMath §4.1.2)."""
    return group_advantages(batch.rewards, batch.group_size, scale="group", eps=adv_eps)


def group_mean_baseline(batch: AdvantageBatch) -> Tensor:
    """``"group_mean"``: ``r - mean_g``, Dr.GRPO §3.2 and DeepSeek-V3.2 Eq. 5."""
    return group_advantages(batch.rewards, batch.group_size, scale="none")


def batch_std(batch: AdvantageBatch, *, adv_eps: float = 1e-4) -> Tensor:
    """``"batch"``: ``(r - mean_g) / (std_batch + adv_eps)``, the group mean over the batch's std."""
    return group_advantages(batch.rewards, batch.group_size, scale="batch", eps=adv_eps)


def rloo(batch: AdvantageBatch) -> Tensor:
    """``"rloo"``: ``r_i`` minus the mean of the other ``G - 1`` rewards of its group."""
    if len(batch.rewards) == 0:  # no groups, hence no group size to check
        return batch.rewards.detach().to(torch.float32)
    return rloo_advantages(batch.rewards, batch.group_size)


#: advantage estimator -> ``(batch: AdvantageBatch, *, hyper-parameters) -> [B] or [B, T]`` float32.
ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Tensor]] = {
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


# ------------------------------------------------------------------------------------------------
# value-based advantages: GAE over tokens (PPO, VAPO)
# ------------------------------------------------------------------------------------------------
def _mask_for(mask, b: int, name_b: str = "rewards") -> Tensor:
    """A ``[B, T]`` mask (bool or 0/1) whose ``B`` matches ``name_b``'s, as a bool tensor."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dim() != 2 or mask.shape[0] != b:
        raise ValueError(f"shape mismatch: mask must have shape [B, T] with B={b} (the length of {name_b}), "
                         f"got {tuple(mask.shape)}")
    return _v.mask_bool(mask, mask.shape)


def outcome_token_rewards(rewards: RewardsLike, mask: Tensor) -> Tensor:
    """Per-token rewards ``[B, T]`` of outcome supervision: each sequence's reward on its last real token.

    An outcome reward scores the whole response; as a per-token reward for :func:`gae` it is
    received when the response ends, i.e. at the last real token (the last ``t`` with
    ``mask[i, t] != 0``; holes in the mask are allowed), and every other token gets 0. With
    ``gamma = 1`` and ``lam = 1`` GAE then gives every token the advantage ``R_i - V(s_t)``
    (DeepSeekMath, arXiv 2402.03300, §4.1.2 "outcome supervision"; PPO-style RLHF as in VAPO,
    arXiv 2504.05118, §2). A row with no real token gets no reward (all zeros): there is no token
    to receive it.

    Args:
        rewards: ``[B]`` scalar rewards (a tensor of any real dtype, or a list of numbers).
        mask: ``[B, T]`` bool or 0/1, 1 = real token.

    Returns:
        ``[B, T]`` float32 tensor on the device of ``rewards`` (rewards computed in float64, so the
        float32 value is the reward rounded once), zero except at each row's last real token.

    Raises:
        ValueError: ``rewards`` not 1-D or not finite; ``mask`` not a ``[B, T]`` tensor with the
            same ``B``, or not 0/1.
    """
    r = _grouped(rewards, 1)[0]
    m = _mask_for(mask, r.shape[0]).to(r.device)
    b, t = m.shape
    out = torch.zeros(b, t, dtype=torch.float64, device=r.device)
    if b == 0 or t == 0:
        return out.to(torch.float32)
    pos = torch.arange(t, device=r.device).expand(b, t)
    last = torch.where(m, pos, torch.full_like(pos, -1)).amax(dim=1)  # [B], -1 for an empty row
    rows = (last >= 0).nonzero().flatten()
    out[rows, last[rows]] = r[rows]
    return out.to(torch.float32)


def _lam_rows(lam, b: int, device: torch.device) -> Tensor:
    """``lam`` (a number or a ``[B]`` / 0-d tensor, each in [0, 1]) as a ``[B]`` float64 tensor."""
    if isinstance(lam, Tensor):
        if lam.is_complex() or lam.dtype == torch.bool:
            raise ValueError(f"lam must be a real number or a [B] tensor of reals, got dtype {lam.dtype}")
        if lam.dim() not in (0, 1) or (lam.dim() == 1 and lam.shape[0] != b):
            raise ValueError(f"lam must be a number or a [B] tensor with B={b}, got shape {tuple(lam.shape)}")
        lr = lam.detach().to(device=device, dtype=torch.float64).expand(b)
        if lr.numel() and not bool((torch.isfinite(lr) & (lr >= 0) & (lr <= 1)).all()):
            bad = (~(torch.isfinite(lr) & (lr >= 0) & (lr <= 1))).nonzero().flatten()[:5].tolist()
            raise ValueError(f"lam must lie in [0, 1] (finite); got values outside it at rows {bad}")
        return lr
    lf = _v.real_number("lam", lam, minimum=0.0)
    if lf > 1:
        raise ValueError(f"lam must be in [0, 1], got {lam!r}")
    return torch.full((b,), lf, dtype=torch.float64, device=device)


def gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    *,
    gamma: float = 1.0,
    lam: Union[float, Tensor] = 0.95,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over the tokens of each response, and the value targets.

    GAE (arXiv 1506.02438) Eq. 16: ``delta_t = r_t + gamma V(s_{t+1}) - V(s_t)``,
    ``A_t = sum_{l >= 0} (gamma lam)^l delta_{t+l}`` (PPO Eqs. 11-12's recursion); targets ``R_t = A_t + V(s_t)``,
    the Monte-Carlo returns at ``lam = 1`` (VAPO §4.1's critic target). The real positions of a row are the
    episode's steps in order: masked positions are skipped, never bootstrapped from, and the value after the
    last real token is 0 (terminal, truncated responses included).

    Args:
        rewards: ``[B, T]`` float per-token rewards (:func:`outcome_token_rewards`); 0 at masked positions.
        values: ``[B, T]`` float ``V(s_t)``, the value before token ``t``; ignored at masked positions.
        mask: ``[B, T]`` bool or 0/1, 1 = real token.
        gamma: discount in ``[0, 1]``.
        lam: in ``[0, 1]``: a number, or a ``[B]`` tensor per sequence (:func:`length_adaptive_lam`).

    Returns:
        ``(advantages [B, T], returns [B, T])``, float32 on the device of ``values``, detached, 0 at masked
        positions (computed in float64).

    Raises:
        ValueError: ``rewards`` / ``values`` not floating ``[B, T]`` tensors of one shape; mask not of that
            shape or not 0/1; ``gamma`` or ``lam`` outside ``[0, 1]`` (``lam`` a tensor not ``[B]``); NaN / inf
            at a real token; a non-zero reward at a masked position.
    """
    shape = _v.bt_tensor(values, "values").shape
    _v.bt_tensor(rewards, "rewards", shape)
    m = _v.mask_bool(mask, shape).to(values.device)
    g = _v.real_number("gamma", gamma, minimum=0.0)
    if g > 1:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    b, t = shape
    f64 = torch.float64
    lam_b = _lam_rows(lam, b, values.device)
    r_all = rewards.detach().to(device=values.device, dtype=f64)
    v_all = values.detach().to(f64)
    zero = torch.zeros((), dtype=f64, device=values.device)
    ok = torch.stack([
        torch.where(m, torch.isfinite(r_all), True).all(),
        torch.where(m, torch.isfinite(v_all), True).all(),
        (m | (r_all == 0)).all(),
    ]).tolist()
    if not ok[0]:
        raise ValueError("rewards must be finite at real (mask=1) tokens; got NaN/inf")
    if not ok[1]:
        raise ValueError("values must be finite at real (mask=1) tokens; got NaN/inf")
    if not ok[2]:
        i, j = (~m & (r_all != 0)).nonzero()[0].tolist()
        raise ValueError(
            f"rewards[{i}, {j}] = {float(r_all[i, j]):.6g} is non-zero at a masked (mask=0) position: it would "
            "be silently lost; put each reward on a real token (e.g. with outcome_token_rewards)")
    r = torch.where(m, r_all, zero)
    v = torch.where(m, v_all, zero)  # NaN / inf at padding vanish here
    adv = torch.zeros_like(v)
    next_v = torch.zeros(b, dtype=f64, device=values.device)  # V of the next real step (0 after the last)
    next_a = torch.zeros_like(next_v)  # A of the next real step
    discount = g * lam_b
    for k in range(t - 1, -1, -1):
        mk = m[:, k]
        a_k = r[:, k] + g * next_v - v[:, k] + discount * next_a
        adv[:, k] = torch.where(mk, a_k, zero)
        next_v = torch.where(mk, v[:, k], next_v)  # a masked position carries the next real step over
        next_a = torch.where(mk, a_k, next_a)
    returns = torch.where(m, adv + v, zero)
    return adv.to(torch.float32), returns.to(torch.float32)


#: The largest float32 below 1: :func:`length_adaptive_lam` never returns 1.
_LAM_MAX = float(torch.nextafter(torch.tensor(1.0), torch.tensor(0.0)))


def length_adaptive_lam(lengths: Union[Tensor, Sequence[float]], alpha: float = 0.05) -> Tensor:
    """VAPO's length-adaptive GAE lambda for the policy, ``lam = 1 - 1 / (alpha l)``, clamped to [0, 1).

    VAPO (arXiv 2504.05118) §4.2, Eqs. 4-5: ``1 / (1 - lam) = alpha l``, ``alpha = 0.05`` in §5.1.
    Departure: Eq. 5 is meaningful only for ``alpha l > 1``; below (and for ``l = 0``) we return 0 (one-step
    TD), and values that would round to 1.0 in float32 are returned as the largest float32 below 1.

    Args:
        lengths: ``[B]`` response lengths ``l >= 0`` in tokens (tensor of any real dtype, or a list).
        alpha: finite ``> 0`` (a number or a 1-element tensor).

    Returns:
        ``[B]`` float32 lambdas in ``[0, 1)``, on the device of ``lengths`` (computed in float64).

    Raises:
        ValueError: ``lengths`` not 1-D, not real, negative, NaN or inf; ``alpha`` not finite or ``<= 0``.
    """
    a = _v.positive_number("alpha", alpha)
    ln = _real_vector(lengths, "lengths")
    if ln.numel() and not bool((torch.isfinite(ln) & (ln >= 0)).all()):
        bad = (~(torch.isfinite(ln) & (ln >= 0))).nonzero().flatten()[:5].tolist()
        raise ValueError(f"lengths must be finite and >= 0; got bad values at positions {bad}")
    al = a * ln
    lam = torch.where(al > 1, 1.0 - 1.0 / al.clamp(min=1.0), torch.zeros_like(al))
    return lam.clamp(max=_LAM_MAX).to(torch.float32)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """How much of the returns' variance the value model explains: ``1 - Var(R - V) / Var(R)``.

    The usual diagnostic of a critic (OpenAI baselines' ``explained_variance``; VAPO, arXiv
    2504.05118, §4.1 trains the value model "until the value loss and explained variance are good"),
    over the real tokens only, with population variances (divide by ``n``) in float64. 1 is a
    perfect prediction, 0 is no better than predicting the mean return, and it is negative (without
    bound) when the prediction is worse than that.

    Defined, never NaN: with fewer than 2 real tokens, or when all returns at real tokens are equal
    (``Var(R) = 0``: nothing to explain), it is 0.0.

    Args:
        values: ``[B, T]`` float value predictions ``V``. returns: ``[B, T]`` float targets ``R``
            (e.g. the returns of :func:`gae`). Masked positions may hold anything, even NaN.
        mask: ``[B, T]`` bool or 0/1, 1 = real token.

    Returns:
        A python float.

    Raises:
        ValueError: shapes differ or are not ``[B, T]``; inputs not floating; mask not 0/1; NaN /
            inf in ``values`` or ``returns`` at a real token.
    """
    shape = _v.bt_tensor(values, "values").shape
    _v.bt_tensor(returns, "returns", shape)
    m = _v.mask_bool(mask, shape).to(values.device)
    v = values.detach().to(torch.float64)[m]
    y = returns.detach().to(device=values.device, dtype=torch.float64)[m]
    if not bool(torch.isfinite(v).all() & torch.isfinite(y).all()):
        raise ValueError("values and returns must be finite at real (mask=1) tokens; got NaN/inf")
    if y.numel() < 2 or bool(y.max() == y.min()):
        return 0.0
    var_y = y.var(correction=0)
    if not bool(var_y > 0):  # returns that differ by less than sqrt(min subnormal): Var(R) underflows to 0
        return 0.0
    return float(1.0 - (y - v).var(correction=0) / var_y)


def gae_advantages(batch: AdvantageBatch, *, gamma: float = 1.0, lam: float = 0.95,
                   lam_alpha: Optional[float] = None) -> Tensor:
    """``"gae"``: per-token GAE advantages ``[B, T]`` from a critic's values (PPO, VAPO).

    Each sequence's reward is received at its last real token (:func:`outcome_token_rewards`), and
    :func:`gae` runs with ``gamma`` and the policy's lambda: ``lam``, or with ``lam_alpha`` set
    VAPO's length-adaptive ``1 - 1/(alpha l)`` per sequence of ``l`` real tokens (arXiv 2504.05118,
    Eq. 5; :func:`length_adaptive_lam`). Needs ``batch.values`` and ``batch.mask``; the trainer
    supplies them when it has a value model. The three hyper-parameters are the ``Algorithm``
    fields of the same names.

    Raises:
        ValueError: the batch has no values or no mask (the message says how to get a critic).
    """
    if batch.values is None or batch.mask is None:
        raise ValueError("advantage estimator 'gae' needs per-token values and a mask (AdvantageBatch.from_groups"
                         "(..., mask=, values=)); the Trainer computes values with its value model, which it builds "
                         "for 'gae' (TrainerConfig.value_init)")
    mask = batch.mask
    if lam_alpha is not None:
        lam = length_adaptive_lam((mask != 0).sum(-1), lam_alpha)
    rewards = outcome_token_rewards(batch.rewards, mask)
    return gae(rewards, batch.values, mask, gamma=gamma, lam=lam)[0]


ADVANTAGE_ESTIMATORS["gae"] = gae_advantages

#: The :data:`ADVANTAGE_ESTIMATORS` whose baseline is a learned value model: the trainer builds a
#: critic for them (:class:`grpo_lab.policy.models.CriticModel`, ``TrainerConfig.value_init``) when none is
#: passed, and hands its per-token values to the estimator. A new value-based estimator adds its
#: name here when it is registered.
VALUE_BASELINE_ESTIMATORS: set[str] = {"gae"}
