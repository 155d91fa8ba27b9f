"""Fitting the GPU profile to the card: the micro-batch and evaluation batch sizes that the memory
model (:mod:`grpo_lab.experiments.memory_model`) lets fit, decided from the model's config before any weight
is loaded.

:func:`fit_gpu_config` is called by :func:`~grpo_lab.experiments.gpu_profile`; :func:`check_algorithms_fit`
by :func:`~grpo_lab.lab.run_chapter_gpu` for each algorithm (a KL reference copy, a critic).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Collection

from ..policy.lora import LoraSpec
from .memory_model import PROJECTIONS, RunShape, fit_batch_sizes

__all__ = ["ASSUMED_PROMPT_TOKENS", "fit_gpu_config", "check_algorithms_fit"]

#: Prompt tokens per row assumed by the fit (a chat-templated GSM8K question is about 100-200
#: tokens; the longest of a batch of 16, left-padded, well under 256).
ASSUMED_PROMPT_TOKENS = 256


def _shape(config, max_new_tokens: int, *, kl_reference: bool, critic: bool, lora=None) -> RunShape:
    """The :class:`~grpo_lab.experiments.memory_model.RunShape` of a ``TrainerConfig`` (autocast ``"auto"`` and
    float16/bfloat16: 2 bytes; gradient checkpointing read from the config; ``lora`` a
    :class:`grpo_lab.policy.lora.LoraSpec` or ``None``: its rank and those of its target modules the memory
    model knows, the projections of a decoder layer)."""
    rows = config.prompts_per_step * config.group_size
    autocast = "float32" if config.precision == "float32" else "bfloat16"
    adapters = {}
    if lora is not None:
        known = [t for t in lora.target_modules if t in PROJECTIONS]
        adapters = dict(lora_rank=int(lora.r), lora_targets=tuple(known or PROJECTIONS))
    return RunShape(rows=rows, prompt_len=ASSUMED_PROMPT_TOKENS, max_new_tokens=int(config.max_new_tokens or max_new_tokens),
                    micro_batch_size=int(config.micro_batch_size or rows),
                    eval_batch_size=int(getattr(config, "eval_batch_size", None) or 256), autocast=autocast,
                    kl_reference=kl_reference, critic=critic,
                    gradient_checkpointing=bool(getattr(config, "gradient_checkpointing", False)), **adapters)


def _card_memory(config, total_memory: int | None) -> int | None:
    """``total_memory``, or the CUDA device's when the config's device is CUDA and CUDA is available."""
    if total_memory is not None:
        return int(total_memory)
    import torch

    dev = str(config.device)
    if not dev.startswith("cuda") or not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(torch.device(dev)).total_memory)


def _model_config(model: str | os.PathLike):
    """The model's ``transformers`` config (config.json only, no weights), or ``None`` when it cannot
    be read (offline and not cached: loading the weights reports that, with its own message)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(model))
    except (OSError, ValueError):
        return None


def _fit_skipped(hf, model, what: str) -> bool:
    """True (with a ``RuntimeWarning`` saying why) when the memory model cannot judge ``model``: its
    ``config.json`` could not be read (offline and not cached, a wrong path) or it is a
    Mixture-of-Experts model (the memory model covers dense decoders)."""
    import warnings

    why = ("its config.json could not be read (offline and not cached, or a wrong path)" if hf is None else
           "it is a Mixture-of-Experts model, which the memory model does not cover" if
           getattr(hf, "num_experts", None) or getattr(hf, "num_local_experts", None) else None)
    if why is None:
        return False
    warnings.warn(f"{what}: the batch sizes were not fitted to the GPU's memory for {model}: {why}; the defaults "
                  "(or your settings) are used as they are", RuntimeWarning, stacklevel=4)
    return True


def fit_gpu_config(model: str | os.PathLike, config, *, max_new_tokens: int, explicit: Collection[str] = (),
                   total_memory: int | None = None, kl_reference: bool = True, critic: bool = False, lora=None):
    """``config`` with the largest ``micro_batch_size`` (and ``eval_batch_size``) that the memory model
    lets fit the card, from ``model``'s config alone; with ``gradient_checkpointing`` switched on when
    the step fits only with it (and the user did not set it).

    Args:
        model: hub id or local directory; only its ``config.json`` is read.
        config: the profile's ``TrainerConfig``.
        max_new_tokens: the task's generation budget (when the config sets none).
        explicit: fields the user chose (keyword arguments, ``$GRPO_LAB_GPU_CONFIG``): kept, and a
            ``ValueError`` if they do not fit.
        total_memory: the card's bytes (a test injects a fake card); default the CUDA device's.
        kl_reference, critic: assume a float32 reference copy / a critic (the profile does not know
            the algorithm: by default a KL reference, the larger common case; none with LoRA, whose
            reference is the base with the adapters off).
        lora: the profile's :class:`grpo_lab.policy.lora.LoraSpec` or ``None``.

    Returns:
        The config, unchanged when there is no card to fit (not CUDA, CUDA not available, no
        ``total_memory``), or, with a ``RuntimeWarning``, when the model's config cannot be read or
        describes a Mixture-of-Experts model.

    Raises:
        ValueError: a phase does not fit: its name, and the setting that would make it fit
            (:func:`grpo_lab.experiments.memory_model.fit_batch_sizes`).
    """
    total = _card_memory(config, total_memory)
    hf = _model_config(model) if total is not None else None
    if total is None or _fit_skipped(hf, model, "gpu_profile"):
        return config
    max_micro = max(1, config.prompts_per_step * config.group_size // max(1, config.minibatches))
    fixed = dict(fixed_micro="micro_batch_size" in explicit, fixed_eval="eval_batch_size" in explicit,
                 what=f"gpu_profile ({model})")
    may_checkpoint = not config.gradient_checkpointing and "gradient_checkpointing" not in explicit
    try:
        shape = _shape(config, max_new_tokens, kl_reference=kl_reference, critic=critic, lora=lora)
        micro, ev = fit_batch_sizes(hf, shape, total, max_micro=max_micro, **fixed)
    except ValueError:
        if not may_checkpoint:
            raise
        config = replace(config, gradient_checkpointing=True)  # fits only with it, or raises naming what would
        shape = _shape(config, max_new_tokens, kl_reference=kl_reference, critic=critic, lora=lora)
        micro, ev = fit_batch_sizes(hf, shape, total, max_micro=max_micro, **fixed)
    return replace(config, micro_batch_size=micro, eval_batch_size=ev)


def check_algorithms_fit(profile, algos, *, total_memory: int | None = None) -> None:
    """Raise before any training when one of ``algos`` does not fit the card at ``profile``'s
    batch sizes (its KL reference copy, its critic for a value baseline).

    Raises:
        ValueError: naming the algorithm, the phase and the setting that would make it fit.
    """
    from ..algo.advantages import VALUE_BASELINE_ESTIMATORS

    cfg = profile.config
    total = _card_memory(cfg, total_memory)
    hf = _model_config(profile.base) if total is not None else None
    if hf is None or getattr(hf, "num_experts", None) or getattr(hf, "num_local_experts", None):
        return  # not fitted: gpu_profile warned when it built the profile
    budget = int(dict(profile.task_kwargs).get("max_new_tokens") or 512)
    for algo in algos:
        critic = algo.advantage in VALUE_BASELINE_ESTIMATORS and getattr(cfg, "value_init", "policy") == "policy"
        shape = _shape(cfg, budget, kl_reference=algo.uses_kl, critic=critic, lora=LoraSpec.from_value(profile.lora))
        fit_batch_sizes(hf, shape, total, max_micro=shape.rows, fixed_micro=True, fixed_eval=True,
                        what=f"{algo.name} on the gpu profile ({profile.base})")
