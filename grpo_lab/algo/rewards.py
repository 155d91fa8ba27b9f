"""Reward shaping: terms added to, or combined into, a task's correctness reward.

* DAPO's *Soft Overlong Punishment* (Yu et al., arXiv 2503.14476, §3.4, Eq. 13): a length
  penalty that is 0 for responses of an expected length, falls linearly to -1 across a
  "punishment cache" of ``L_cache`` tokens just below the generation budget ``L_max``, and is -1
  beyond it. It tells the policy *that* a response was too long in proportion to how far it went,
  instead of giving every truncated sample the same wrong-answer reward (the "reward noise" DAPO
  §3.4 blames for unstable training).
* DeepSeekMath-V2's self-verification reward (:func:`self_verification_reward`), which combines
  a proof's score with the score of the generator's own verification of it.
* RPT's prefix-matching reward (Dong et al., arXiv 2506.08007, Eq. 3,
  :func:`prefix_match_reward`): a next-token prediction is right when its bytes are a prefix of the
  ground-truth continuation that ends on a token boundary.

A math module: it imports torch only, no model, tokenizer or trainer code. Lengths are counted
in tokens, including the EOS token when one was produced (the convention of
:attr:`grpo_lab.policy.rollout.Rollout.lengths`).

Where the code departs from the papers, and why: DAPO Eq. 13 writes ``|y|`` without saying
whether the EOS token counts; we count it, so that a response cut at the budget without EOS and
one that ends with EOS exactly at the budget both have length ``L_max`` (penalty -1 either way).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import Sequence, Union

import torch
from torch import Tensor

from . import checks as _v

__all__ = ["overlong_penalty", "shape_rewards", "self_verification_reward", "prefix_match_reward"]

LengthsLike = Union[Tensor, Sequence[int]]


def _lengths(lengths: LengthsLike) -> Tensor:
    if not isinstance(lengths, Tensor):
        try:
            lengths = torch.as_tensor(lengths)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"lengths must be a 1-D tensor of token counts: {exc}") from None
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D with shape [B], got shape {tuple(lengths.shape)}")
    if lengths.dtype == torch.bool or lengths.is_complex():
        raise ValueError(f"lengths must be real token counts, got dtype {lengths.dtype}")
    n = lengths.detach().to(torch.float64)
    if n.numel() and not bool(torch.isfinite(n).all()):
        raise ValueError("lengths must be finite")
    if n.numel() and bool((n < 0).any()):
        bad = (n < 0).nonzero().flatten()[:5].tolist()
        raise ValueError(f"lengths must be >= 0 (token counts); negative at positions {bad}")
    return n


def overlong_penalty(lengths: LengthsLike, *, max_len: int, cache_len: int) -> Tensor:
    """DAPO's Soft Overlong Punishment, Eq. 13 of arXiv 2503.14476 (§3.4), per response.

    With ``L_max = max_len`` (the generation budget) and ``L_cache = cache_len``::

        R_length(y) = 0                                    if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                    = -1                                   if |y| > L_max

    DAPO §4.1: ``L_max = 20,480``, ``L_cache = 4,096``. Added to the correctness reward (:func:`shape_rewards`).

    Args:
        lengths: ``[B]`` response lengths in tokens, EOS included (any real dtype, or a sequence), ``>= 0``.
        max_len: ``L_max``, a positive int (tokens).
        cache_len: ``L_cache``, an int with ``1 <= cache_len <= max_len`` (tokens).

    Returns:
        float32 ``[B]`` in ``[-1, 0]``, on the device of ``lengths`` (computed in float64).

    Raises:
        ValueError: ``max_len`` / ``cache_len`` not positive ints, ``cache_len > max_len``, ``lengths`` not
            1-D, non-finite or negative.
    """
    max_len = _v.positive_int("max_len", max_len)
    cache_len = _v.positive_int("cache_len", cache_len)
    if cache_len > max_len:
        raise ValueError(
            f"cache_len (L_cache={cache_len}) must be <= max_len (L_max={max_len}): the punishment "
            "cache lies inside the generation budget (DAPO Eq. 13)")
    n = _lengths(lengths)
    start = float(max_len - cache_len)  # the expected maximum length L_max - L_cache
    ramp = (start - n) / float(cache_len)
    out = torch.where(n <= start, torch.zeros_like(n), torch.where(n <= max_len, ramp, -torch.ones_like(n)))
    dev = lengths.device if isinstance(lengths, Tensor) else None
    return out.to(torch.float32) if dev is None else out.to(device=dev, dtype=torch.float32)


def shape_rewards(rewards: Tensor, lengths: LengthsLike, *, max_len: int, cache_len: int) -> Tensor:
    """Correctness reward plus DAPO's overlong penalty: ``R(y) + R_length(y)`` (arXiv
    2503.14476, §3.4: Eq. 13 "is added to the original rule-based correctness reward").

    Args:
        rewards: ``[B]`` float rewards (finite).
        lengths: ``[B]`` response lengths in tokens (see :func:`overlong_penalty`).
        max_len, cache_len: ``L_max`` and ``L_cache`` of :func:`overlong_penalty`.

    Returns:
        float32 ``[B]`` on the device of ``rewards``.

    Raises:
        ValueError: ``rewards`` not a 1-D real tensor, non-finite, or of a different length than
            ``lengths``; and everything :func:`overlong_penalty` raises.
    """
    if not isinstance(rewards, Tensor):
        try:
            rewards = torch.as_tensor(rewards, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"rewards must be a 1-D tensor of numbers: {exc}") from None
    if rewards.dim() != 1 or rewards.dtype == torch.bool or rewards.is_complex():
        raise ValueError(f"rewards must be a 1-D real tensor [B], got shape {tuple(rewards.shape)}, "
                         f"dtype {rewards.dtype}")
    pen = overlong_penalty(lengths, max_len=max_len, cache_len=cache_len)
    if pen.shape != rewards.shape:
        raise ValueError(f"shape mismatch: rewards {tuple(rewards.shape)} vs lengths {tuple(pen.shape)}")
    r = rewards.detach().to(torch.float64)
    if r.numel() and not bool(torch.isfinite(r).all()):
        raise ValueError("rewards must be finite")
    return (r + pen.to(device=r.device, dtype=torch.float64)).to(torch.float32)


def _unit_interval(name: str, x) -> Tensor:
    if isinstance(x, bool):
        raise ValueError(f"{name} must be a number or a tensor of numbers in [0, 1], got {x!r}")
    if not isinstance(x, Tensor):
        try:
            x = torch.as_tensor(x, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{name} must be a number or a tensor of numbers in [0, 1]: {exc}") from None
    if x.dtype == torch.bool or x.is_complex():
        raise ValueError(f"{name} must hold real numbers, got dtype {x.dtype}")
    v = x.detach().to(torch.float64)
    if v.numel() and not bool(torch.isfinite(v).all()):
        raise ValueError(f"{name} must be finite (got NaN or inf)")
    if v.numel() and bool(((v < 0) | (v > 1)).any()):
        raise ValueError(f"{name} must lie in [0, 1], got values in [{float(v.min())}, {float(v.max())}]")
    return v


def self_verification_reward(r_format, r_y, r_z, *, alpha: float = 0.76, beta: float = 0.24) -> Tensor:
    """DeepSeekMath-V2's generator reward with self-verification (Eqs. 5-6 of its report)::

        R = R_format(Y, Z) * (alpha * R_Y + beta * R_Z),     R_Z = R_score(s', s) * R_meta(Z)

    ``Y`` is the generated proof and ``Z`` the generator's own analysis of it ending in a score
    ``s'``. ``R_Y`` is the verifier's score of the proof (in {0, 0.5, 1} in the paper), ``R_Z``
    rewards a self-assessment that agrees with the verifier (``R_score = 1 - |s' - s|``, Eq. 2)
    and that the meta-verifier accepts, and ``R_format`` (0 or 1) zeroes the reward of an output
    without the required format. The paper uses ``alpha = 0.76`` and ``beta = 0.24``.

    Note: this reward comes from DeepSeekMath-V2, not from DeepSeek-V3.2's RL recipe; only
    V3.2-Speciale reuses its data and reward method, for proofs.

    Args:
        r_format, r_y, r_z: numbers or tensors (broadcastable) with values in [0, 1].
        alpha, beta: finite weights ``>= 0``.

    Returns:
        float32 tensor of the broadcast shape (0-d for scalar inputs), on the device of the first
        tensor argument (CPU if none).

    Raises:
        ValueError: a value outside [0, 1], NaN / inf, a non-numeric input, shapes that do not
            broadcast, or ``alpha`` / ``beta`` negative or non-finite.
    """
    alpha = _v.real_number("alpha", alpha, minimum=0.0)
    beta = _v.real_number("beta", beta, minimum=0.0)
    dev = next((x.device for x in (r_format, r_y, r_z) if isinstance(x, Tensor)), None)
    f = _unit_interval("r_format", r_format)
    y = _unit_interval("r_y", r_y)
    z = _unit_interval("r_z", r_z)
    try:
        out = f * (alpha * y + beta * z)
    except RuntimeError as exc:
        raise ValueError(f"r_format, r_y and r_z must broadcast to one shape: {exc}") from None
    return out.to(torch.float32) if dev is None else out.to(device=dev, dtype=torch.float32)


def prefix_match_reward(prediction: str, reference_tokens: Sequence[str]) -> float:
    """RPT's prefix-matching reward (Dong et al., arXiv 2506.08007, §3.2, Eq. 3)::

        r = 1  if  bytes(y)[0:l] == bytes(x_{>=t})[0:l]  and  l in L_gt,      r = 0 otherwise,

    ``y`` the prediction, ``l = len(bytes(y)) > 0``, ``x_{>=t}`` the ground-truth continuation and ``L_gt`` its
    token boundaries (cumulative UTF-8 byte lengths): a prediction may span tokens, but not stop inside one
    (tokens ``["The", " cat"]``: ``"The cat"`` 1.0, ``"The c"`` 0.0).

    Args:
        prediction: the predicted continuation (:func:`grpo_lab.tasks.next_token.parse_prediction`).
        reference_tokens: the continuation's tokens as non-empty strings, in order
            (:func:`grpo_lab.tasks.next_token.token_strings`).

    Returns:
        ``1.0`` or ``0.0`` (a Python float).

    Raises:
        TypeError: ``prediction`` not a ``str``; ``reference_tokens`` not a sequence, a single ``str``, or
            holding a non-``str``.
        ValueError: ``reference_tokens`` empty or holding an empty string.
    """
    if not isinstance(prediction, str):
        raise TypeError(f"prefix_match_reward: prediction must be a str, got {type(prediction).__name__}")
    if not isinstance(reference_tokens, Iterable) or isinstance(reference_tokens, (Mapping, Set)):
        raise TypeError(f"prefix_match_reward: reference_tokens must be a sequence (list or tuple) of token strings, "
                        f"got {type(reference_tokens).__name__} (a mapping or a set has no token order)")
    if isinstance(reference_tokens, (str, bytes)):
        raise TypeError("prefix_match_reward: reference_tokens must be a sequence of token strings (such as "
                        f"['The', ' cat']), not one {type(reference_tokens).__name__}: the token boundaries "
                        "are part of the reward")
    tokens = list(reference_tokens)
    if not tokens:
        raise ValueError("prefix_match_reward: reference_tokens is empty; the ground truth needs at least one token")
    bad = [i for i, t in enumerate(tokens) if not isinstance(t, str)]
    if bad:
        raise TypeError(f"prefix_match_reward: reference_tokens must hold str, got {type(tokens[bad[0]]).__name__} "
                        f"at index {bad[0]}")
    empty = [i for i, t in enumerate(tokens) if not t]
    if empty:
        raise ValueError(f"prefix_match_reward: reference_tokens[{empty[0]}] is an empty string; every token has "
                         "at least one byte")
    pred = prediction.encode("utf-8")
    if not pred:
        return 0.0
    boundary, ref = 0, b""
    for tok in tokens:  # walk the boundaries until one reaches the prediction's length
        piece = tok.encode("utf-8")
        ref += piece
        boundary += len(piece)
        if boundary >= len(pred):
            return 1.0 if boundary == len(pred) and ref == pred else 0.0
    return 0.0  # longer than the whole reference: no boundary at l
