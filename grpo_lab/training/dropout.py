"""Train mode without its randomness: dropout (and router jitter) switched off in a policy's modules and config.

The trainer runs the policy's training forwards in **train mode** (so that Hugging Face gradient
checkpointing, which acts only in train mode, can engage) and has to keep the importance ratio a
ratio of one deterministic function of the weights at two points. With dropout active, even an
on-policy ratio π_θ / π_old is a ratio of two random dropout masks: a checkpoint with attention
dropout 0.1 gave ratios down to 0 and a clip fraction of 0.16 on a purely on-policy step. So every
source of train-mode randomness is set to zero first, as TRL's ``disable_dropout`` does for
``nn.Dropout`` modules; here also the float dropout probabilities that attention modules keep as
plain attributes (Qwen2's ``attention_dropout``, read only in train mode) and Mixture-of-Experts
router jitter (Mixtral's ``router_jitter_noise``), in the modules and in the config, so that a
checkpoint saved by the trainer reloads without them.
"""

from __future__ import annotations

import torch

__all__ = ["disable_dropout", "TRAIN_NOISE_KEYS"]

#: The substrings that mark a config entry or module attribute as a train-mode noise level, namely dropout
#: probabilities (``attention_dropout``, ``hidden_dropout``, GPT-2's ``attn_pdrop``, ...) and router
#: jitter (``router_jitter_noise``, ``jitter_noise``).
TRAIN_NOISE_KEYS = ("dropout", "pdrop", "jitter_noise")


def _is_noise_level(name: str, value) -> bool:
    return (isinstance(value, float) and value > 0 and not isinstance(value, bool)
            and any(k in name for k in TRAIN_NOISE_KEYS))


def disable_dropout(model: torch.nn.Module) -> list[str]:
    """Set every train-mode noise level of ``model`` to 0, in place.

    * every ``torch.nn.Dropout``-family module (``nn.Dropout``, ``Dropout1d/2d/3d``, ``AlphaDropout``, ...):
      ``p = 0``;
    * every positive float attribute of a module whose name contains one of :data:`TRAIN_NOISE_KEYS`
      (Qwen2 / Llama attention's ``attention_dropout``, Mixtral's ``jitter_noise``): ``0.0``;
    * the same entries of ``model.config`` (and of nested configs such as ``text_config``), and a
      ``peft`` model's ``lora_dropout`` in its ``peft_config``, so that modules built later from the
      config and a checkpoint saved from ``model`` carry no dropout.

    After this, ``model.train()`` and ``model.eval()`` compute the same function (for the models of
    ``transformers`` and :mod:`grpo_lab.policy.models`; a custom module with another kind of train-mode
    randomness is not found). Idempotent.

    Args:
        model: a ``torch.nn.Module`` (a ``transformers`` model, a ``peft`` model, anything).

    Returns:
        ``list[str]``: ``"<module>.<attribute>=<old value>"`` and ``"config.<entry>=<old value>"`` for
        each setting changed (empty when there was none), in module order.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"disable_dropout: expected a torch.nn.Module, got {type(model).__name__}")
    changed = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            changed.append(f"{name or type(model).__name__}.p={module.p:g}")
            module.p = 0.0
        for attr, value in list(vars(module).items()):
            if _is_noise_level(attr, value):
                changed.append(f"{name or type(model).__name__}.{attr}={value:g}")
                setattr(module, attr, 0.0)
    for name, config in getattr(model, "peft_config", {}).items():  # a peft model's adapter configs (saved with it)
        if _is_noise_level("lora_dropout", getattr(config, "lora_dropout", None)):
            changed.append(f"peft_config[{name!r}].lora_dropout={config.lora_dropout:g}")
            config.lora_dropout = 0.0
    seen = set()
    for _, module in model.named_modules():
        config = getattr(module, "config", None)
        if config is not None and id(config) not in seen and hasattr(config, "to_dict"):
            seen.add(id(config))
            changed += _disable_config_noise(config, "config")
    return changed


def _disable_config_noise(config, prefix: str) -> list[str]:
    """Zero the train-mode noise entries of a ``PretrainedConfig`` and of its nested configs; what changed."""
    changed = []
    for key, value in list(vars(config).items()):
        if _is_noise_level(key, value):
            changed.append(f"{prefix}.{key}={value:g}")
            setattr(config, key, 0.0)
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):  # a sub-config (text_config, ...)
            changed += _disable_config_noise(value, f"{prefix}.{key}")
    return changed
