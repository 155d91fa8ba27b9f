"""LoRA policies with `peft` (an optional dependency: ``pip install grpo_lab[lora]``).

A LoRA policy is a ``peft.PeftModel``: the base model's weights frozen, and small trainable low-rank
adapters on the modules named (Hu et al. 2021, arXiv 2106.09685). Build one from Python with
:meth:`LoraSpec.apply` (or ``peft.get_peft_model`` yourself) and pass it to
:class:`grpo_lab.training.trainer.Trainer` as the policy; from the command line with ``--lora-r 8 --lora-alpha 16
--lora-targets q_proj v_proj``; in a :class:`grpo_lab.experiments.Profile` with ``lora=dict(r=8,
alpha=16, target_modules=("q_proj", "v_proj"))``.

What the trainer does with one:

* **the KL reference** is the same model with its adapters disabled (:class:`AdapterDisabled`,
  ``PeftModel.disable_adapter()``): the base policy, as TRL does, with no second copy of the weights;
* **checkpoints** (:meth:`~grpo_lab.training.trainer.Trainer.save`) hold the adapters only (``policy/`` as
  ``peft`` writes it) and ``policy/grpo_lab_base.json``, which names the base (:func:`base_record`);
  :meth:`~grpo_lab.training.trainer.Trainer.resume` loads that base again (:func:`load_adapter_policy`) and
  continues bit for bit;
* the low-precision sampler (``TrainerConfig.rollout_dtype``, :func:`grpo_lab.policy.models.inference_copy`)
  and a critic built from the policy (``value_init="policy"``,
  :meth:`grpo_lab.policy.models.CriticModel.from_policy`) use a copy with the adapters merged.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from .models import load_tokenizer, _missing_tokenizer_files, is_peft_model, load_policy
from ..paths import checkpoint_dir
from ..algo.checks import is_int

__all__ = ["LoraSpec", "DEFAULT_TARGETS", "AdapterDisabled", "require_peft", "base_record", "BASE_FILE", "adapter_checkpoint_missing",
           "load_adapter_policy", "BaseModelNotFound"]

#: The file of a LoRA checkpoint's ``policy/`` directory that names the base model (:func:`base_record`).
BASE_FILE = "grpo_lab_base.json"
#: The files ``peft`` writes for the adapters (``save_pretrained`` with safetensors).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


class BaseModelNotFound(FileNotFoundError):
    """The base model a LoRA checkpoint names cannot be loaded on this machine (:func:`load_adapter_policy`)."""


def require_peft(what: str):
    """The ``peft`` module; ``ImportError`` naming ``what`` needed it and how to install it."""
    try:
        import peft
    except ImportError:
        raise ImportError(f"{what} needs peft, which is not installed: pip install 'grpo_lab[lora]' "
                          "(or pip install peft)") from None
    return peft


#: :class:`LoraSpec`'s default ``target_modules``: the attention's query and value projections.
DEFAULT_TARGETS = ("q_proj", "v_proj")


@dataclass(frozen=True)
class LoraSpec:
    """The LoRA adapters to put on a policy: ``peft.LoraConfig(r, lora_alpha=alpha, target_modules,
    lora_dropout=dropout)``.

    Attributes:
        r: the rank (int ≥ 1).
        alpha: the scaling numerator (> 0): the update is ``(alpha / r) · B A``; default ``2 r``.
        target_modules: the names of the linear modules that get adapters (every module whose name ends
            with one), at least one, each of which must match a module of the model
            (:meth:`apply` refuses a name that matches none); a list is stored as a tuple. Default
            :data:`DEFAULT_TARGETS`, the attention's query and value projections (the LoRA paper's
            choice, arXiv 2106.09685, §7.1).
        dropout: LoRA's dropout on the adapters' input: must be 0. The trainer switches every dropout of
            the policy off (:func:`grpo_lab.training.dropout.disable_dropout`): its ratio compares one
            function of the weights at two points (see :mod:`grpo_lab.training.trainer`), so a LoRA dropout
            would be zeroed anyway; it is refused rather than silently dropped.

    Raises:
        ValueError: a value out of range or of the wrong type (the message names the field).
    """

    r: int
    alpha: float | None = None
    target_modules: tuple[str, ...] = DEFAULT_TARGETS
    dropout: float = 0.0

    def __post_init__(self):
        if self.alpha is None and is_int(self.r):
            object.__setattr__(self, "alpha", 2 * self.r)
        targets = self.target_modules
        if isinstance(targets, str) or not all(isinstance(t, str) and t.strip() for t in (targets or ())) or not targets:
            raise ValueError(f"LoraSpec: target_modules must be module names such as ('q_proj', 'v_proj'), "
                             f"got {targets!r}")
        object.__setattr__(self, "target_modules", tuple(targets))
        if not is_int(self.r) or self.r < 1:
            raise ValueError(f"LoraSpec: r (the rank) must be an int >= 1, got {self.r!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0 \
                or not math.isfinite(self.alpha):
            raise ValueError(f"LoraSpec: alpha must be a number > 0, got {self.alpha!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or self.dropout != 0:
            raise ValueError(f"LoraSpec: dropout must be 0, got {self.dropout!r}: the trainer switches every dropout "
                             "of the policy off, so that the ratio pi_theta / pi_old compares one deterministic "
                             "function (grpo_lab.training.dropout.disable_dropout)")

    @classmethod
    def from_value(cls, value: "LoraSpec | Mapping[str, Any] | None") -> "LoraSpec | None":
        """``value`` as a :class:`LoraSpec`: ``None`` stays ``None`` (no LoRA); a mapping with the keys
        ``r`` and optionally ``alpha``, ``target_modules``, ``dropout`` (the defaults of the class).

        Raises:
            TypeError: neither ``None``, a :class:`LoraSpec` nor a mapping.
            ValueError: a missing or unknown key (named), or a bad value.
        """
        if value is None or isinstance(value, LoraSpec):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"lora must be None, a LoraSpec or a dict such as dict(r=8, alpha=16, "
                            f"target_modules=('q_proj', 'v_proj')), got {value!r}")
        known, need = {"r", "alpha", "target_modules", "dropout"}, {"r"}
        if set(value) - known or need - set(value):
            raise ValueError(f"lora: unknown keys {sorted(set(value) - known)}, missing keys {sorted(need - set(value))}; "
                             f"expected r and optionally alpha, target_modules, dropout")
        return cls(**value)

    def to_dict(self) -> dict:
        """``{"r", "alpha", "target_modules" (a list), "dropout"}``: JSON-able, for provenance and hashes."""
        d = asdict(self)
        d["target_modules"] = list(self.target_modules)
        return d

    def apply(self, model, *, seed: int = 0):
        """``peft.get_peft_model(model, LoraConfig(...))``: ``model`` with adapters on the target modules,
        its own weights frozen. The adapters' ``A`` matrices are drawn with the torch seed ``seed``
        (the global torch random state is restored afterwards); ``B`` starts at 0, so the returned
        policy computes exactly ``model``'s function. ``model`` is modified in place (peft wraps it).

        Raises:
            ImportError: peft is not installed.
            ValueError: a name of ``target_modules`` matches no module of ``model`` (named, with the
                model's linear layers), or none does (peft's message, with the names).
        """
        peft = require_peft("LoRA (LoraSpec.apply)")
        config = peft.LoraConfig(r=int(self.r), lora_alpha=self.alpha, target_modules=list(self.target_modules),
                                 lora_dropout=float(self.dropout), task_type="CAUSAL_LM")
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        names = [n for n, _ in model.named_modules()]
        unmatched = [t for t in self.target_modules if not any(n == t or n.endswith("." + t) for n in names)]
        if unmatched and len(unmatched) < len(self.target_modules):  # none matching: peft's own message below
            raise ValueError(f"LoraSpec: target_modules {unmatched} match no module of the model "
                             f"({type(model).__name__}); its linear layers end with "
                             f"{sorted({n.rsplit('.', 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})}")
        try:
            with warnings.catch_warnings():  # peft reads transformers' renamed property: not the user's to fix
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated",
                                        category=FutureWarning)
                return peft.get_peft_model(model, config)
        except ValueError as exc:
            raise ValueError(f"LoraSpec: target_modules={list(self.target_modules)} do not fit the model "
                             f"({type(model).__name__}): {exc}") from None
        finally:
            torch.random.set_rng_state(state)


class AdapterDisabled(torch.nn.Module):
    """The base policy of a LoRA policy: calling it calls ``policy`` inside
    ``policy.disable_adapter()``, so it computes the frozen base model's function with the base's
    own weights (no copy). The trainer's default KL reference for a ``peft.PeftModel``.

    ``policy`` is held but not registered as a submodule: this module has no parameters, and
    ``.to``, ``.eval``, ``.requires_grad_`` and ``state_dict`` on it do not reach the policy.

    Args:
        policy: a ``peft.PeftModel``.

    Raises:
        TypeError: ``policy`` is not a ``peft.PeftModel``.
    """

    def __init__(self, policy):
        if not is_peft_model(policy):
            raise TypeError(f"AdapterDisabled: the policy must be a peft.PeftModel, got {type(policy).__name__}")
        super().__init__()
        object.__setattr__(self, "policy", policy)  # not a submodule (see the class docstring)

    def forward(self, *args, **kwargs):
        """``policy(*args, **kwargs)`` with the adapters disabled (the same outputs, logits ``[B, L, V]``)."""
        with self.policy.disable_adapter():
            return self.policy(*args, **kwargs)


def base_record(policy) -> dict:
    """What a LoRA checkpoint records about ``policy``'s base, to load it again on resume: the
    fields of ``model.grpo_lab_source`` (set by :func:`grpo_lab.policy.models.load_policy`: ``checkpoint``
    the shipped checkpoint's name or ``None``, ``path_or_hub_id``, ``revision``, ``dtype``), else
    peft's ``base_model_name_or_path``; plus ``parameters``, the base's parameter count, checked
    on resume.

    Raises:
        ValueError: a base parameter is trainable (it would not be saved with the adapters), or
            the base's origin is unknown (a model built in memory), with what to do instead.
    """
    base = policy.get_base_model()
    loose = [n for n, p in policy.named_parameters() if p.requires_grad and "lora_" not in n and "modules_to_save" not in n]
    if loose:
        raise ValueError(f"Trainer.save: the LoRA policy trains base parameters ({', '.join(loose[:3])}"
                         f"{', ...' if len(loose) > 3 else ''}), which a LoRA checkpoint does not hold; freeze them "
                         "or list their modules in LoraConfig(modules_to_save=...)")
    record = dict(getattr(base, "grpo_lab_source", None) or {})
    if not record:
        name = policy.peft_config[policy.active_adapter].base_model_name_or_path
        if not name:
            raise ValueError("Trainer.save: the LoRA policy's base model was not loaded from a checkpoint (it has no "
                             "name_or_path), so a resume could not load it again; save the base first "
                             "(base.save_pretrained(DIR), with its tokenizer) and build the LoRA policy on "
                             "load_policy(DIR)")
        record = {"checkpoint": None, "path_or_hub_id": str(name), "revision": None,
                  "dtype": str(base.dtype).removeprefix("torch.")}
    record["parameters"] = sum(p.numel() for n, p in policy.named_parameters()
                               if "lora_" not in n and "modules_to_save" not in n)
    return record


def adapter_checkpoint_missing(directory: Path) -> list[str]:
    """The files a LoRA ``policy/`` directory of a trainer checkpoint lacks (names relative to its
    parent, e.g. ``policy/adapter_config.json``; ``[]`` when complete). Reads nothing but the directory."""
    names = [*ADAPTER_FILES, BASE_FILE]
    missing = [f"{directory.name}/{n}" for n in names if not (directory / n).is_file()]
    return missing + [f"{directory.name}/{n}" for n in _missing_tokenizer_files(directory)]


def load_adapter_policy(directory: Path, *, device: str | torch.device | None = None, progress: bool | None = None):
    """The LoRA policy saved in a trainer checkpoint's ``policy/`` directory, with its tokenizer: the base
    named by ``grpo_lab_base.json`` (by its shipped checkpoint name when this machine has it, else
    its directory or hub id, in the recorded dtype) and the adapters loaded onto it, trainable.
    Returns ``(peft.PeftModel, tokenizer)``.

    Raises:
        ImportError: peft is not installed.
        BaseModelNotFound: (a ``FileNotFoundError``) the base cannot be loaded here (the message names it:
            the shipped checkpoint's name and the directory or hub id recorded).
        ValueError: ``grpo_lab_base.json`` is corrupt, or the base found has another parameter count than
            the one the adapters were trained on.
    """
    peft = require_peft(f"resuming the LoRA checkpoint {directory.parent}")
    try:
        record = json.loads((directory / BASE_FILE).read_text())
        name, where = record.get("checkpoint"), str(record["path_or_hub_id"])
        dtype = getattr(torch, str(record.get("dtype") or "float32"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"Trainer.resume: {directory / BASE_FILE} cannot be read ({type(exc).__name__}: {exc}); "
                         "the checkpoint is corrupt") from None
    source = name if name and checkpoint_dir(str(name)).is_dir() else where
    try:
        base, _ = load_policy(source, device=device, dtype=dtype, revision=record.get("revision"), progress=progress)
    except (OSError, ValueError) as exc:
        shown = f"the shipped checkpoint {name!r} or " if name else ""
        raise BaseModelNotFound(
            f"Trainer.resume: the LoRA adapters in {directory} sit on the base model {shown}{where!r}, which cannot "
            f"be loaded here ({' '.join(str(exc).split())[:300]}); make it available (GRPO_LAB_DATA for the shipped "
            "checkpoints, the hub cache, or that directory) and resume again") from None
    count = sum(p.numel() for p in base.parameters())
    if record.get("parameters") is not None and count != record["parameters"]:
        raise ValueError(f"Trainer.resume: the base model found at {source!r} has {count:,} parameters, but the "
                         f"adapters in {directory} were trained on one with {record['parameters']:,}")
    with warnings.catch_warnings():  # peft reads transformers' renamed property: not the user's to fix
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        policy = peft.PeftModel.from_pretrained(base, str(directory), is_trainable=True)
    tokenizer = load_tokenizer(str(directory))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return policy, tokenizer
