"""Mixed precision: the autocast dtype a run uses and the loss scaling float16 needs.

:data:`~grpo_lab.training.precision.PRECISIONS` are the values of ``TrainerConfig.precision``; :func:`~grpo_lab.training.trainer.resolve_precision` turns ``"auto"``
into a dtype for the device; :class:`Precision` is the autocast context and the (scaled) backward pass every
forward and backward of the trainer goes through.
"""

from __future__ import annotations

import contextlib

import torch

from ..algo.checks import choice

__all__ = ["PRECISIONS", "resolve_precision", "Precision"]

#: The values of :attr:`~grpo_lab.training.trainer.TrainerConfig.precision`.
PRECISIONS = ("float32", "bfloat16", "float16", "auto")


def resolve_precision(precision: str, device: str | torch.device) -> str:
    """The autocast dtype name that ``precision`` means on ``device``.

    ``"auto"``: ``"bfloat16"`` on a CUDA device of compute capability 8.0 or more (Ampere and
    later: A100, L4, H100 have bfloat16 tensor cores), ``"float16"`` on an older CUDA device (T4,
    V100: bfloat16 there is emulated and slow, so float16 with loss scaling is the fast choice),
    ``"float32"`` on any other device. Anything else is returned as given.

    Args:
        precision: one of :data:`~grpo_lab.training.precision.PRECISIONS`.
        device: the training device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device``).

    Returns:
        ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Raises:
        ValueError: ``precision`` is not one of :data:`~grpo_lab.training.precision.PRECISIONS`.
    """
    choice("precision", precision, PRECISIONS)
    if precision != "auto":
        return precision
    dev = torch.device(device)
    if dev.type != "cuda":
        return "float32"
    return "bfloat16" if torch.cuda.get_device_capability(dev) >= (8, 0) else "float16"


class Precision:
    """The autocast context and the backward pass of one run.

    Args:
        precision: the autocast dtype name, ``"float32"``, ``"bfloat16"`` or ``"float16"`` (a
            :func:`~grpo_lab.training.trainer.resolve_precision` result; float32 autocasts nothing).
        device: the training device.

    Attributes:
        dtype: ``precision``.
        device_type: ``"cpu"``, ``"cuda"``, ...
        scaler: a ``torch.amp.GradScaler``, enabled for float16 only.
        skipped_steps: optimiser steps skipped because float16 gradients overflowed.
    """

    def __init__(self, precision: str, device: str | torch.device):
        self.dtype = precision
        self.device_type = torch.device(device).type
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=precision == "float16")
        self.skipped_steps = 0

    def autocast(self):
        """The autocast context of :attr:`dtype` (a no-op for float32)."""
        if self.dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=getattr(torch, self.dtype))

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, through the gradient scaler under float16."""
        (self.scaler.scale(loss) if self.scaler.is_enabled() else loss).backward()
