"""Mixed precision: the autocast dtype a run uses and the loss scaling float16 needs.

:data:`~grpo_lab.training.trainer.PRECISIONS` are the values of ``TrainerConfig.precision``;
:func:`~grpo_lab.training.trainer.resolve_precision` turns ``"auto"`` into a dtype for the device. The mixin
``MixedPrecision`` gives the trainer its autocast context and its (scaled) backward pass.
"""

from __future__ import annotations

import contextlib

import torch

from ..algo.checks import choice

__all__ = ["PRECISIONS", "resolve_precision"]

#: The values of :attr:`TrainerConfig.precision`.
PRECISIONS = ("float32", "bfloat16", "float16", "auto")


def resolve_precision(precision: str, device: str | torch.device) -> str:
    """The autocast dtype name that ``precision`` means on ``device``.

    ``"auto"``: ``"bfloat16"`` on a CUDA device of compute capability 8.0 or more (Ampere and
    later: A100, L4, H100 have bfloat16 tensor cores), ``"float16"`` on an older CUDA device (T4,
    V100: bfloat16 there is emulated and slow, so float16 with loss scaling is the fast choice),
    ``"float32"`` on any other device. Anything else is returned as given.

    Args:
        precision: one of :data:`PRECISIONS`.
        device: the training device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device``).

    Returns:
        ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Raises:
        ValueError: ``precision`` is not one of :data:`PRECISIONS`.
    """
    choice("precision", precision, PRECISIONS)
    if precision != "auto":
        return precision
    dev = torch.device(device)
    if dev.type != "cuda":
        return "float32"
    return "bfloat16" if torch.cuda.get_device_capability(dev) >= (8, 0) else "float16"


class MixedPrecision:
    """The trainer's autocast context and backward pass. Reads ``precision`` (a :func:`resolve_precision`
    result), ``_device_type`` and ``scaler`` (a ``torch.amp.GradScaler``, enabled for float16)."""

    def _autocast(self):
        """The autocast context of :attr:`precision` (a no-op for float32)."""
        if self.precision == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self._device_type, dtype=getattr(torch, self.precision))

    def _backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, through the gradient scaler under float16."""
        (self.scaler.scale(loss) if self.scaler.is_enabled() else loss).backward()
