"""The trainer's AdamW: weight decay on the weight matrices only, the field's rule (transformers, TRL, verl's
Megatron engine).

Biases and normalisation weights (LayerNorm, RMSNorm) are not decayed: pulling a norm's gain towards 0
shrinks the whole layer's output and a bias has no scale to regularise. The parameters that are decayed are
exactly those of ``transformers.Trainer.get_decay_parameter_names`` (the rule TRL's ``GRPOTrainer`` inherits:
``nn.LayerNorm`` children and names matching ``bias``, ``layernorm``, ``rmsnorm``, ``norm`` or ``*_norm``
are excluded), which :func:`decay_parameter_names` calls rather than re-types.

With ``weight_decay == 0`` (the default) the optimiser keeps one parameter group in the module's parameter
order, as before, so runs without weight decay keep their numbers bit for bit.
"""

from __future__ import annotations

import torch

__all__ = ["decay_parameter_names", "build_adamw"]


def decay_parameter_names(module: torch.nn.Module) -> list:
    """Names (as ``module.named_parameters()`` gives them) of the parameters weight decay applies to.

    Transformers' own rule, ``transformers.Trainer.get_decay_parameter_names`` (it reads only its
    ``model`` argument, so it is called without building a ``Trainer``): everything except the parameters
    of ``nn.LayerNorm`` modules and those whose lower-cased name matches ``bias``, ``layernorm``,
    ``rmsnorm``, ``(^|.)norm($|.)`` or ``_norm($|.)`` (RMSNorm weights of Llama/Qwen models and of
    :mod:`grpo_lab.policy.models` alike).

    Args:
        module: any ``torch.nn.Module`` (a policy, a critic, a PEFT-wrapped model).

    Returns:
        list of parameter names, in ``named_parameters()`` order.

    Raises:
        TypeError: ``module`` is not a ``torch.nn.Module``.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"decay_parameter_names: expected a torch.nn.Module, got {type(module).__name__}")
    from transformers import Trainer

    decayed = set(Trainer.get_decay_parameter_names(None, module))
    return [name for name, _ in module.named_parameters() if name in decayed]


def build_adamw(module: torch.nn.Module, *, lr: float, weight_decay: float, betas: tuple) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over ``module``'s parameters, weight decay on :func:`decay_parameter_names` only.

    Decoupled weight decay (Loshchilov & Hutter, arXiv 1711.05101): each step multiplies a decayed
    parameter by ``1 - lr * weight_decay``; the others are only moved by Adam's update.

    Args:
        module: the model to optimise (every parameter is handed over, frozen ones included; those without
            gradients are skipped by AdamW).
        lr: learning rate (float > 0; the trainer sets it again before every step).
        weight_decay: decoupled weight decay (float >= 0). 0: one parameter group, as
            ``torch.optim.AdamW(module.parameters(), ...)``. > 0: two groups, the decayed parameters first
            (``weight_decay``) and the biases and norm weights second (``weight_decay = 0``), as transformers'
            ``Trainer.create_optimizer`` builds them.
        betas: Adam's ``(beta1, beta2)``.

    Returns:
        the optimiser.

    Raises:
        TypeError: ``weight_decay > 0`` and ``module`` is not a ``torch.nn.Module`` (its parameter names are needed).
    """
    if not weight_decay:  # anything with .parameters(), as before
        return torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay, betas=tuple(betas))
    decayed = set(decay_parameter_names(module))
    named = list(module.named_parameters())
    groups = [{"params": [p for n, p in named if n in decayed], "weight_decay": weight_decay},
              {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, weight_decay=weight_decay,
                             betas=tuple(betas))
