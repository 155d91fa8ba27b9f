"""Peak memory of a training step: on CUDA the allocator's peak, on CPU the process's peak resident set."""

from __future__ import annotations

import sys

import torch

__all__ = ["reset_peak_memory", "peak_memory_mb"]


def reset_peak_memory(device: str | torch.device) -> None:
    """Start a new window for :func:`peak_memory_mb`: on CUDA ``torch.cuda.reset_peak_memory_stats``;
    on Linux the process's peak resident set size (``VmHWM``) is reset to its current size by
    writing ``5`` to ``/proc/self/clear_refs``; elsewhere (or if that file is not writable) nothing
    can be reset and the peak covers the process's life."""
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_memory_mb(device: str | torch.device) -> float:
    """Peak memory in MiB since the last :func:`reset_peak_memory` (the trainer resets it at the
    start of every step, so the history's ``peak_mem_mb`` is that step's peak).

    * CUDA: the most memory torch allocated on the device (``torch.cuda.max_memory_allocated``):
      tensors only, not the caching allocator's reserve or the CUDA context.
    * CPU on Linux: the process's peak resident set size (``VmHWM`` of ``/proc/self/status``):
      everything the process holds (the interpreter, torch, every model in memory, the
      allocator's caches), so compare algorithms in fresh processes of the same kind.
    * Other systems: the peak resident set size since the process started (``ru_maxrss``).
    """
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10  # kB
    except (OSError, ValueError, IndexError):
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux
