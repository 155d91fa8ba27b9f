"""Argument checks shared by the math modules, each raising ``ValueError`` with the argument's name.

One helper per kind of argument (a positive int, a finite real, a ``[B, T]`` float tensor, a 0/1
mask, a choice from a registry), so that every public function rejects bad input with the same
wording. The checks on tensors never look at values except where the name says so
(:func:`mask_bool` checks 0/1 values); checks on values at real tokens, such as finiteness, are
done by the caller in one batched reduction, so that they cost one device-to-host transfer.

A math module: it imports torch only.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Optional

import torch
from torch import Tensor

__all__ = [
    "is_int",
    "positive_int",
    "non_negative_int",
    "real_number",
    "positive_number",
    "flag",
    "choice",
    "float_tensor",
    "bt_tensor",
    "mask_bool",
    "compute_dtype",
]


def is_int(value: Any) -> bool:
    """True for an integer (python or numpy), False for ``bool`` and everything else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_int(name: str, value: Any, *, allow_none: bool = False) -> Optional[int]:
    """``value`` as a python int ``>= 1`` (``None`` passes when ``allow_none``).

    Raises:
        ValueError: ``value`` is a bool, not an integer, or ``< 1``.
    """
    if value is None and allow_none:
        return None
    if not is_int(value) or value < 1:
        kind = "a positive int or None" if allow_none else "a positive int"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return int(value)


def non_negative_int(name: str, value: Any) -> int:
    """``value`` as a python int ``>= 0``.

    Raises:
        ValueError: ``value`` is a bool, not an integer, or negative.
    """
    if not is_int(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return int(value)


def real_number(name: str, value: Any, *, minimum: Optional[float] = None) -> float:
    """``value`` as a finite python float, ``>= minimum`` when given.

    Raises:
        ValueError: a bool, a non-real, NaN / inf, or a value below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}, got {value!r}")
    return v


def positive_number(name: str, value: Any) -> float:
    """A finite number ``> 0`` given as a python real or a 1-element tensor, as a python float.

    Raises:
        ValueError: a bool, a non-number, a tensor of more than one element, NaN / inf or ``<= 0``.
    """
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        v = float(value.detach().reshape(()))
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        v = float(value)
    else:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return v


def flag(name: str, value: Any) -> bool:
    """``value`` itself if it is ``True`` or ``False`` (not 0 / 1, not a string)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def choice(name: str, value: Any, allowed: Iterable, *, extra: tuple = ()) -> Any:
    """``value`` if it is a key of ``allowed`` (a registry dict or a tuple) or one of ``extra``.

    Raises:
        ValueError: ``unknown {name} {value!r}; expected one of (...)``.
    """
    names = tuple(extra) + tuple(allowed)
    try:
        ok = value in names
    except TypeError:  # an unhashable / uncomparable value is not a choice
        ok = False
    if not ok:
        raise ValueError(f"unknown {name} {value!r}; expected one of {names}")
    return value


def float_tensor(x: Any, name: str) -> Tensor:
    """``x`` if it is a floating-point tensor."""
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def bt_tensor(x: Any, name: str, shape: Optional[torch.Size] = None) -> Tensor:
    """``x`` if it is a floating-point ``[B, T]`` tensor (of exactly ``shape`` when given)."""
    x = float_tensor(x, name)
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape [B, T], got {tuple(x.shape)}")
    if shape is not None and x.shape != shape:
        raise ValueError(f"shape mismatch: {name} has shape {tuple(x.shape)}, expected {tuple(shape)}")
    return x


def mask_bool(mask: Any, shape: torch.Size) -> Tensor:
    """A ``[B, T]`` mask (bool, or numbers that are all 0 or 1; 1 = real token) as a bool tensor."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.shape != shape:
        raise ValueError(f"shape mismatch: mask has shape {tuple(mask.shape)}, expected {tuple(shape)}")
    if mask.dtype == torch.bool:
        return mask
    if mask.numel() > 0 and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must contain only 0 and 1 (1 = real token); got other values")
    return mask != 0


def compute_dtype(*tensors: Optional[Tensor]) -> torch.dtype:
    """float64 if any tensor is float64, else float32 (bfloat16 / float16 / float32 compute in float32)."""
    for t in tensors:
        if t is not None and t.dtype == torch.float64:
            return torch.float64
    return torch.float32
