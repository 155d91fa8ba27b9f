"""Tiny policies and a character tokenizer, built from transformers configs.

Everything here is a thin layer over `transformers`: the tokenizer is a real
``PreTrainedTokenizerFast`` (so ``save_pretrained`` / ``from_pretrained`` / ``apply`` padding
work as for any hub model), and the policies are stock ``Qwen2ForCausalLM`` /
``LlamaForCausalLM`` models, or the Mixture-of-Experts ``Qwen3MoeForCausalLM`` (the family of
Qwen3-30B-A3B, the model GSPO was trained on), with a few hundred thousand parameters. ``load_policy`` loads
either a local directory (the checkpoints shipped in ``data/checkpoints``) or a hub id (Colab),
with the same code.
"""

from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..paths import checkpoint_dir, missing_data_hint, shipped_checkpoints

__all__ = [
    "CHARS",
    "HUB_ID",
    "load_tokenizer",
    "build_char_tokenizer",
    "train_bpe_tokenizer",
    "ARCHS",
    "TinyConfig",
    "tiny_policy",
    "load_policy",
    "count_parameters",
    "FP32LMHead",
    "use_fp32_lm_head",
    "inference_copy",
    "is_peft_model",
    "plain_copy",
    "CriticModel",
    "SCRATCH_VALUE_CONFIG",
    "VALUE_INITS",
]

#: Characters of the CPU tasks' alphabet. Order is part of the checkpoint format; do not reorder.
CHARS = "0123456789+-*=#;.,:? abcdefghijklmnopqrstuvwxyz\n"
PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"


def build_char_tokenizer(chars: str = CHARS):
    """A character-level tokenizer as a real ``transformers.PreTrainedTokenizerFast``.

    Every character of ``chars`` is one token; ``<pad>``=0, ``<bos>``=1, ``<eos>``=2,
    ``<unk>``=3 come first. Padding side is **left** (decoder-only generation needs the
    prompt to end at the same position for every row). ``decode`` joins characters with no
    separator.

    Args:
        chars: the alphabet, each character at most once.

    Returns:
        PreTrainedTokenizerFast with ``pad_token``, ``bos_token``, ``eos_token``, ``unk_token``.

    Raises:
        ValueError: a character repeats in ``chars``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if len(set(chars)) != len(chars):
        raise ValueError("build_char_tokenizer: the alphabet has repeated characters")
    specials = [PAD, BOS, EOS, UNK]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in chars:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    return fast


def train_bpe_tokenizer(texts, vocab_size: int = 1024, *, extra_special: tuple[str, ...] = ()):
    """A byte-level BPE tokenizer trained on ``texts`` with ``tokenizers``, as a
    ``transformers.PreTrainedTokenizerFast``.

    Byte-level: every string encodes (no ``<unk>`` in practice) and ``decode`` restores it
    exactly. ``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<unk>``=3 come first, then
    ``extra_special`` (e.g. ``("<think>", "</think>")``), then the 256 bytes and the merges.
    Special tokens are matched in text before pre-tokenization, and ``decode`` keeps them unless
    asked to skip them. Padding side is left. Training is deterministic for the same texts.

    Args:
        texts: iterable of ``str`` (the training corpus).
        vocab_size: total vocabulary size (specials included), ``> 256 + number of specials``.
        extra_special: further special tokens, in order.

    Raises:
        ValueError: ``vocab_size`` too small for the byte alphabet and the specials.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, BOS, EOS, UNK, *extra_special]
    if not isinstance(vocab_size, int) or vocab_size <= 256 + len(specials):
        raise ValueError(f"train_bpe_tokenizer: vocab_size must exceed 256 bytes + {len(specials)} specials, "
                         f"got {vocab_size!r}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(texts), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS,
                                   unk_token=UNK, additional_special_tokens=list(extra_special),
                                   padding_side="left", clean_up_tokenization_spaces=False)


#: Architectures :func:`tiny_policy` builds; ``"qwen3_moe"`` is the Mixture-of-Experts one.
ARCHS = ("qwen2", "llama", "qwen3_moe")
#: The fields of :class:`TinyConfig` that only a Mixture-of-Experts architecture uses.
MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
              "router_aux_loss_coef")


@dataclass(frozen=True)
class TinyConfig:
    """Size of a tiny policy. Defaults give a ~0.8M-parameter 4-layer Qwen2-style model.

    ``arch="qwen3_moe"`` builds a Qwen3-MoE-style model (``Qwen3MoeForCausalLM``): every
    decoder layer's MLP is a sparse block of ``num_experts`` SwiGLU experts of width
    ``moe_intermediate_size`` (default ``intermediate_size // num_experts``, so the experts hold
    the parameters of the dense MLP; a multiple of 4, checked by :func:`tiny_policy`), of which a
    linear router (``mlp.gate``) picks the top ``num_experts_per_tok`` per token; with
    ``norm_topk_prob`` the chosen experts' softmax probabilities are renormalised to sum to 1 (as
    in Qwen3-30B-A3B's config).
    ``router_aux_loss_coef`` weights the load-balancing loss that pretraining adds
    (transformers' ``output_router_logits=True``); the RL trainer does not use it. Qwen3's
    attention has per-head q/k RMSNorms and no q/k/v bias. The MoE fields are ignored by the
    dense architectures, and recorded (:meth:`to_dict`) only for a MoE one.
    """

    arch: str = "qwen2"  # "qwen2" | "llama" | "qwen3_moe"
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 128
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int | None = None
    norm_topk_prob: bool = True
    router_aux_loss_coef: float = 0.001

    @property
    def is_moe(self) -> bool:
        """Whether ``arch`` is a Mixture-of-Experts architecture."""
        return self.arch.endswith("_moe")

    def to_dict(self) -> dict:
        """The config as a dict; the MoE fields only for a MoE ``arch`` (so a dense config's dict,
        recorded in the shipped checkpoints' ``recipe.json``, is what it was before they existed)."""
        d = asdict(self)
        if not self.is_moe:
            for k in MOE_FIELDS:
                d.pop(k)
        return d


def tiny_policy(tokenizer, config: TinyConfig | None = None, *, seed: int = 0):
    """A randomly initialised tiny causal LM from a transformers config.

    Args:
        tokenizer: gives ``vocab_size`` and the pad/bos/eos ids written into the config.
        config: sizes; default ``TinyConfig()``.
        seed: torch seed for the initialisation (the global RNG is restored afterwards).

    Returns:
        ``Qwen2ForCausalLM``, ``LlamaForCausalLM`` or ``Qwen3MoeForCausalLM`` (``arch``) in
        float32, in train mode.

    Raises:
        ValueError: unknown ``config.arch``; for ``"qwen3_moe"``, ``num_experts < 2``,
            ``num_experts_per_tok`` outside ``[1, num_experts]``, an expert width below 1, or one
            that is not a multiple of 4 (the experts' grouped matmul needs 16-byte float32 rows;
            the message names the nearest multiples). In a 16-bit dtype even 36 fails (72-byte
            rows): :func:`load_policy` and :func:`inference_copy` switch such models to the eager
            experts (``_eager_experts_below_float32``); a bare ``.to(torch.bfloat16)`` does not.
    """
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig,
                              Qwen3MoeForCausalLM)

    config = config or TinyConfig()
    kwargs = dict(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta,
        tie_word_embeddings=config.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if config.arch == "qwen2":
        cfg, cls = Qwen2Config(**kwargs), Qwen2ForCausalLM
    elif config.arch == "llama":
        cfg, cls = LlamaConfig(**kwargs), LlamaForCausalLM
    elif config.arch == "qwen3_moe":
        n, k = config.num_experts, config.num_experts_per_tok
        if not (isinstance(n, int) and n >= 2):
            raise ValueError(f"tiny_policy: num_experts must be an int >= 2 for arch 'qwen3_moe', got {n!r}")
        if not (isinstance(k, int) and 1 <= k <= n):
            raise ValueError(f"tiny_policy: num_experts_per_tok must be an int in [1, num_experts={n}], got {k!r}")
        width = config.moe_intermediate_size
        width = config.intermediate_size // n if width is None else width
        if not (isinstance(width, int) and width >= 1):
            raise ValueError(f"tiny_policy: the expert width (moe_intermediate_size) must be an int >= 1, got {width!r}")
        _check_expert_width(width, config)
        cfg = Qwen3MoeConfig(**kwargs, num_experts=n, num_experts_per_tok=k, moe_intermediate_size=width,
                             norm_topk_prob=bool(config.norm_topk_prob),
                             router_aux_loss_coef=float(config.router_aux_loss_coef))
        cls = Qwen3MoeForCausalLM
    else:
        raise ValueError(f"tiny_policy: unknown arch {config.arch!r}; expected one of {list(ARCHS)}")
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = cls(cfg)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def _check_expert_width(width: int, config: TinyConfig) -> None:
    """Refuse an expert width that is not a multiple of 4 (float32 rows of 16 bytes): transformers
    5.x runs Qwen3-MoE experts through ``torch._grouped_mm``, which fails at the first forward with
    "strides should be multiple of 16 bytes"."""
    if width % 4 == 0:
        return
    where = ("moe_intermediate_size" if config.moe_intermediate_size is not None else
             f"moe_intermediate_size (unset: intermediate_size // num_experts = "
             f"{config.intermediate_size} // {config.num_experts})")
    nearest = [m for m in (width - width % 4, width - width % 4 + 4) if m >= 4]
    raise ValueError(f"tiny_policy: {where} = {width} is not a multiple of 4: transformers runs the Qwen3-MoE "
                     "experts through torch's grouped_mm, whose float32 rows must be a multiple of 16 bytes "
                     "(it fails at the first forward: 'strides should be multiple of 16 bytes'); set "
                     f"moe_intermediate_size to {' or '.join(map(str, nearest))}")


def count_parameters(model) -> int:
    """Number of distinct trainable parameters (tied weights counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def load_tokenizer(source: str, **kwargs):
    """``AutoTokenizer``, except for our character tokenizer: a checkpoint whose tokenizer config
    names the generic fast class is loaded as exactly that class (``AutoTokenizer`` would pick the
    model type's tokenizer class, e.g. ``Qwen2Tokenizer``, whose pre-tokenizer drops spaces).

    Args:
        source: a local directory or a hub id (``org/name``); ``kwargs`` go to ``from_pretrained``.

    Returns:
        the tokenizer, as :func:`load_policy` loads it beside its model.
    """
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg = Path(source) / "tokenizer_config.json"
    if cfg.is_file():
        cls = json.loads(cfg.read_text()).get("tokenizer_class")
        if cls in _FAST_CLASSES:
            return PreTrainedTokenizerFast.from_pretrained(source, **kwargs)
    return AutoTokenizer.from_pretrained(source, **kwargs)


#: Fast tokenizer classes whose whole vocabulary is ``tokenizer.json`` (our character tokenizer).
_FAST_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
#: Files any of which holds (part of) a tokenizer; besides these, any ``tokenizer*``, ``vocab*``,
#: ``*.model``, ``*.spm`` or ``*.tiktoken`` file counts.
_TOKENIZER_NAMES = ("tokenizer.json", "tokenizer_config.json", "merges.txt", "special_tokens_map.json")


def _missing_tokenizer_files(directory: Path) -> list[str]:
    """The tokenizer files a local checkpoint ``directory`` lacks, ``[]`` when it has a tokenizer.

    ``["tokenizer.json"]`` when its ``tokenizer_config.json`` names a generic fast class
    (``PreTrainedTokenizerFast``, whose vocabulary is that file) and the file is absent;
    ``["tokenizer.json", "tokenizer_config.json"]`` (what ``save_pretrained`` writes) when the
    directory holds no tokenizer file at all (none of ``_TOKENIZER_NAMES``, nor a ``tokenizer*``,
    ``vocab*``, ``*.model``, ``*.spm`` or ``*.tiktoken`` file); ``[]`` otherwise, leaving other
    layouts (sentencepiece, BPE vocab + merges, WordPiece) to ``transformers``. Raises nothing.
    """
    import json

    cfg = directory / "tokenizer_config.json"
    if cfg.is_file() and not (directory / "tokenizer.json").is_file():
        try:
            cls = json.loads(cfg.read_text()).get("tokenizer_class")
        except (OSError, ValueError, AttributeError):
            cls = None
        return ["tokenizer.json"] if cls in _FAST_CLASSES else []
    try:
        names = [f.name for f in directory.iterdir() if f.is_file()]
    except OSError:
        return []
    if any(n in _TOKENIZER_NAMES or n.startswith(("tokenizer", "vocab")) or n.endswith((".model", ".spm", ".tiktoken"))
           for n in names):
        return []
    return ["tokenizer.json", "tokenizer_config.json"]


#: A hub id, ``org/name``: what ``from_pretrained`` looks up on the hub rather than on disk.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
#: A shipped checkpoint's name: one path component, as the directories of ``data/checkpoints``.
_CHECKPOINT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def _interactive() -> bool:
    """True in a terminal or a Jupyter kernel, unless ``$CI`` is set (the rule of the trainer's bar,
    plus notebooks, whose ``stderr`` is no tty)."""
    if os.environ.get("CI"):
        return False
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return sys.stderr.isatty() or type(shell).__name__ == "ZMQInteractiveShell"


@contextmanager
def _progress_bars(progress: bool | None):
    """transformers' (and the hub's) progress bars on or off inside the block, as
    :func:`load_policy` documents for ``progress``; the global setting is restored on exit."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    show = (enabled and _interactive()) if progress is None else progress
    if show != enabled:
        (hf_logging.enable_progress_bar if show else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        if show != enabled:
            (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()


def load_policy(path_or_hub_id: str | os.PathLike, *, device: str | torch.device | None = None,
                dtype: torch.dtype | None = None, revision: str | None = None, progress: bool | None = None):
    """Load ``(model, tokenizer)`` from a local directory, a shipped checkpoint or a Hugging Face hub id.

    Weights are read from safetensors only and no remote code runs (``trust_remote_code=False``).
    The tokenizer pads on the left, with the EOS token when it has no pad token.

    Args:
        path_or_hub_id: a directory with ``config.json``; the name of a checkpoint shipped in
            ``data/checkpoints`` (``"arithmetic-base"``, the MoE ``"arithmetic-moe-base"``; found
            through :func:`grpo_lab.paths.data_dir`); or a hub id ``"org/name"``. The architecture
            (dense Qwen2 / Llama or Qwen3-MoE) comes from ``config.json``.
        device: where to put the model (default CPU).
        dtype: parameter dtype (default: the checkpoint's, float32 for the tiny models).
        revision: hub revision (branch, tag or commit); ignored for local directories.
        progress: show transformers' progress bars; ``None``: only in an interactive terminal or
            notebook outside CI, if transformers' bars are enabled (its global setting is restored).

    Returns:
        ``(model, tokenizer)``: a ``transformers`` causal LM in eval mode and its tokenizer;
        ``model.grpo_lab_source`` records the origin (name, directory or hub id, revision, dtype), so
        that a LoRA checkpoint can name its base (:mod:`grpo_lab.policy.lora`).

    Raises:
        FileNotFoundError: a local path that does not exist or lacks ``config.json`` or tokenizer
            files (named); a bare name that is no directory and no shipped checkpoint (the message
            lists the shipped names, where data was looked for, and ``GRPO_LAB_DATA``).
        ValueError: a string that is neither an existing path nor a well-formed hub id, or a CUDA
            device without CUDA.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if device is not None and str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"load_policy: device {device!r} requested but CUDA is not available")
    p = Path(path_or_hub_id)
    if not p.exists() and _CHECKPOINT_NAME.match(str(path_or_hub_id)):
        p = checkpoint_dir(str(path_or_hub_id))  # a shipped checkpoint by name, e.g. "arithmetic-base"
        if not p.is_dir():
            shipped = shipped_checkpoints()
            raise FileNotFoundError(
                f"load_policy: {str(path_or_hub_id)!r} is neither an existing directory nor a shipped checkpoint "
                f"(shipped: {', '.join(shipped) if shipped else 'none found'}); {missing_data_hint()}. "
                "A hub model is named 'org/name'")
    looks_local = p.exists() or str(path_or_hub_id).startswith((".", "/", "~")) or os.sep in str(p.parent)
    if p.exists():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"load_policy: {p} has no config.json (not a transformers checkpoint)")
        lacking = _missing_tokenizer_files(p)
        if lacking:
            raise FileNotFoundError(
                f"load_policy: {p} has a model but no complete tokenizer: it lacks {' and '.join(lacking)}. Save the "
                f"tokenizer next to the weights (tokenizer.save_pretrained({str(p)!r})), or copy those files "
                "from where the model came from")
        source, kwargs = str(p), {}
    elif HUB_ID.match(str(path_or_hub_id)) and not looks_local:
        source, kwargs = str(path_or_hub_id), ({"revision": revision} if revision else {})
    elif looks_local or HUB_ID.match(str(path_or_hub_id)):
        raise FileNotFoundError(f"load_policy: local checkpoint {str(path_or_hub_id)!r} does not exist")
    else:
        raise ValueError(
            f"load_policy: {str(path_or_hub_id)!r} is neither an existing directory nor a hub id of the form 'org/name'")
    model_kwargs = dict(use_safetensors=True, trust_remote_code=False, **kwargs)
    if dtype is not None:
        model_kwargs["dtype"] = dtype
    with _progress_bars(progress):
        tokenizer = load_tokenizer(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, **model_kwargs)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.to(device or "cpu")
    _eager_experts_below_float32(model)
    model.eval()
    model.grpo_lab_source = _source_record(path_or_hub_id, p, source, revision, model)
    return model, tokenizer


def _source_record(given, path: Path, source: str, revision: str | None, model) -> dict:
    """Where :func:`load_policy` found ``model``, kept on it as ``model.grpo_lab_source`` so that a LoRA
    checkpoint can name its base (:mod:`grpo_lab.policy.lora`): ``checkpoint`` the shipped checkpoint's name
    (``"arithmetic-base"``, also when given as its directory, else ``None``), ``path_or_hub_id`` the
    directory (absolute) or hub id, ``revision`` and ``dtype`` (e.g. ``"float32"``). Raises nothing."""
    name = None
    if path.exists() and _CHECKPOINT_NAME.match(path.name) and checkpoint_dir(path.name).is_dir():
        try:
            name = path.name if checkpoint_dir(path.name).resolve() == path.resolve() else None
        except OSError:
            name = None
    local = path.exists()
    return {"checkpoint": name, "path_or_hub_id": str(path.resolve()) if local else str(given),
            "revision": None if local else revision, "dtype": str(model.dtype).removeprefix("torch.")}


def is_peft_model(model) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (a LoRA policy, :mod:`grpo_lab.policy.lora`). Never imports
    ``peft``: a model can only be one if ``peft`` was imported already. Raises nothing."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, getattr(peft, "PeftModel", ()))


def plain_copy(model):
    """A deep copy of ``model`` as a plain ``transformers`` model: for a ``peft.PeftModel``, the copy's
    adapters merged into its weights (``merge_and_unload``: the same function, one set of weights, no
    ``peft`` layer left); any other model is copied as it is. ``model`` is unchanged. Raises nothing
    of its own."""
    import copy

    out = copy.deepcopy(model)
    return out.merge_and_unload() if is_peft_model(out) else out


def _eager_experts_below_float32(model) -> None:
    """Switch a Mixture-of-Experts ``model`` in a 16-bit dtype to transformers' eager expert loop.

    The default ``grouped_mm`` experts need rows whose byte strides are multiples of 16; the tiny
    MoE checkpoint's experts of width 36 give 72-byte bfloat16 rows, and ``grouped_mm`` raises
    ``RuntimeError: strides should be multiple of 16 bytes``. The eager loop computes the same
    function. Float32 models (36 x 4 = 144 bytes) keep the default, so their numerics do not change.
    """
    if model.dtype in (torch.bfloat16, torch.float16) and getattr(model.config, "_experts_implementation", None) \
            and hasattr(model, "set_experts_implementation"):
        from .moe import is_moe

        if is_moe(model):
            model.set_experts_implementation("eager")


class FP32LMHead(torch.nn.Module):
    """An LM head that computes its logits in float32, whatever the dtype of the model body.

    MiniMax-M1 (arXiv 2506.13585, §3.2, Fig. 3) traced a training/inference probability mismatch
    to the LM head's precision and fixed it by computing the head in FP32. This module holds a
    float32 copy of a head's weight (and bias) and returns ``hidden.float() @ weight.T + bias``:
    ``[..., H]`` hidden states of any float dtype -> ``[..., V]`` float32 logits. Its parameters
    train like any other, and stay float32 when the model is cast (``model.to(torch.bfloat16)``
    keeps this head's float32 values; device moves apply as usual).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.weight = torch.nn.Parameter(weight.detach().to(torch.float32).clone())
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().to(torch.float32).clone())

    def _apply(self, fn, recurse=True):
        # ``model.to(torch.bfloat16)`` must not round the head: keep the float32 values, follow devices.
        kept = {n: p.detach().clone() for n, p in self.named_parameters(recurse=False)}
        super()._apply(fn, recurse)
        for n, p in self.named_parameters(recurse=False):
            if p.dtype != torch.float32:
                p.data = kept[n].to(p.device)
        return self

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(hidden.to(torch.float32), self.weight, self.bias)


def use_fp32_lm_head(model, *, source=None):
    """Replace ``model``'s output head by a :class:`FP32LMHead` (in place; returns ``model``).

    The head's float32 weight is copied from ``source``'s head when given (e.g. the float32
    master weights of a bfloat16 inference copy), else from ``model``'s own head, upcast. A head
    tied to the input embeddings is untied: the embeddings keep their dtype.

    Raises:
        ValueError: the model has no ``get_output_embeddings()`` linear head, or ``source``'s head
            has another shape.
    """
    head = model.get_output_embeddings()
    src = head if source is None else source.get_output_embeddings()
    for m, what in ((head, "model"), (src, "source")):
        if not hasattr(m, "weight") or getattr(m, "weight", None) is None or m.weight.dim() != 2:
            raise ValueError(f"use_fp32_lm_head: the {what} has no linear output head (get_output_embeddings())")
    if tuple(src.weight.shape) != tuple(head.weight.shape):
        raise ValueError(f"use_fp32_lm_head: source head {tuple(src.weight.shape)} does not match the model's "
                         f"{tuple(head.weight.shape)}")
    new = FP32LMHead(src.weight, getattr(src, "bias", None)).to(head.weight.device)
    model.set_output_embeddings(new)
    if getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False
    return model


def inference_copy(model, dtype: torch.dtype | str = torch.bfloat16, *, fp32_lm_head: bool = False):
    """A frozen copy of ``model`` in ``dtype``, standing in for an inference engine's weights.

    RL systems sample with an inference engine (vLLM, SGLang) that holds its own copy of the
    weights, usually in bfloat16, while the trainer computes log-probs in higher precision; the
    two disagree token by token (MiniMax-M1, arXiv 2506.13585, §3.2). This copies the weights,
    casts them to ``dtype`` and, with ``fp32_lm_head``, computes the head in float32 from
    ``model``'s own (unrounded) head weights (:func:`use_fp32_lm_head`), the paper's fix. The
    copy is in eval mode with ``requires_grad=False``; ``model`` is unchanged.

    A LoRA policy (a ``peft.PeftModel``, :mod:`grpo_lab.policy.lora`) is copied with its adapters merged into
    the weights (:func:`plain_copy`) before the cast: the copy is a plain ``transformers`` model
    computing the same function, rounded once to ``dtype``, as an engine that serves merged weights.

    Args:
        model: a ``transformers`` causal LM, or a ``peft.PeftModel`` of one.
        dtype: ``torch.bfloat16`` (default), ``torch.float16``, ``torch.float32`` or their names.
        fp32_lm_head: compute the output head in float32.

    Raises:
        ValueError: ``dtype`` is not one of those floating types.
    """
    import copy

    names = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    dt = names.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if dt not in names.values():
        raise ValueError(f"inference_copy: dtype must be one of {sorted(names)}, got {dtype!r}")
    source = plain_copy(model) if is_peft_model(model) else model  # LoRA: merged, as an engine serves it
    out = (copy.deepcopy(source) if source is model or fp32_lm_head else source).to(dt).eval()
    _eager_experts_below_float32(out)
    if fp32_lm_head:
        use_fp32_lm_head(out, source=source)
    for p in out.parameters():
        p.requires_grad_(False)
    return out


# ------------------------------------------------------------------------------------------------
# the critic of PPO-style algorithms (PPO, VAPO)
# ------------------------------------------------------------------------------------------------
#: The "scratch" value model's size (:meth:`CriticModel.scratch`): a 2-layer transformer of width
#: 64, about a tenth of the book's 4-layer policy, randomly initialised.
SCRATCH_VALUE_CONFIG = TinyConfig(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2)
#: What :meth:`CriticModel.build` accepts besides a directory written by :meth:`CriticModel.save`.
VALUE_INITS = ("policy", "scratch")


class CriticModel(torch.nn.Module):
    """A value model V(s): a transformers decoder backbone with a scalar linear head.

    ``values(rollout)`` scores every completion token's *state*: V(s_t) for completion token
    ``t`` is read from the hidden state at the position that predicts token ``t`` (the last
    prompt position for ``t = 0``), i.e. the value of the context before the token is emitted,
    as GAE's ``delta_t = r_t + gamma V(s_{t+1}) - V(s_t)`` needs (:func:`grpo_lab.algo.advantages.gae`).
    It implements the trainer's :class:`grpo_lab.training.trainer.ValueModel` slot.

    Two ways to build one (``TrainerConfig.value_init``), both measured in chapter 6:

    * :meth:`from_policy` (``"policy"``): a copy of the policy's backbone (everything but the LM
      head) plus a new head. It starts from features that already parse the prompt, and costs
      one more policy-sized forward and backward per token (PPO's usual choice; VAPO initialises
      its critic from a reward model of the policy's size);
    * :meth:`scratch` (``"scratch"``): a randomly initialised small transformer
      (:data:`SCRATCH_VALUE_CONFIG`).

    The head starts at zero (weights and bias), so an untrained critic predicts V = 0 everywhere.

    Args:
        backbone: a ``transformers`` base model (e.g. ``Qwen2Model``) returning ``last_hidden_state``.
        hidden_size: its hidden width.
    """

    def __init__(self, backbone, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(int(hidden_size), 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    # ---- construction
    @classmethod
    def from_policy(cls, policy) -> "CriticModel":
        """A critic on a deep copy of ``policy``'s backbone (``policy.base_model``), float32, with a
        zero head. The policy itself is not touched. A LoRA policy (``peft.PeftModel``) gives a full
        critic: the backbone of a copy with the adapters merged (:func:`plain_copy`), every weight
        trainable (the critic is not a LoRA model; it holds its own full set of weights)."""
        import copy

        source = plain_copy(policy) if is_peft_model(policy) else policy
        backbone = (source.base_model if source is not policy else copy.deepcopy(policy.base_model)).float()
        backbone.requires_grad_(True)
        return cls(backbone, source.config.hidden_size)

    @classmethod
    def scratch(cls, tokenizer, config: TinyConfig | None = None, *, seed: int = 0) -> "CriticModel":
        """A critic on a randomly initialised tiny transformer (default :data:`SCRATCH_VALUE_CONFIG`,
        a dense ``arch``), seeded by ``seed``."""
        config = config or SCRATCH_VALUE_CONFIG
        return cls(tiny_policy(tokenizer, config, seed=seed).base_model, config.hidden_size)

    @classmethod
    def build(cls, init: str | os.PathLike, policy, tokenizer, *, seed: int = 0) -> "CriticModel":
        """The critic named by ``init`` (``TrainerConfig.value_init``): ``"policy"`` (:meth:`from_policy`),
        ``"scratch"`` (:meth:`scratch`) or a directory written by :meth:`save` (a pretrained critic,
        e.g. after :meth:`grpo_lab.training.trainer.Trainer.pretrain_value`).

        Raises:
            FileNotFoundError: ``init`` is neither a known name nor a directory with ``critic.json``.
        """
        if init == "policy":
            return cls.from_policy(policy)
        if init == "scratch":
            return cls.scratch(tokenizer, seed=seed)
        if not str(init).strip():
            raise FileNotFoundError(f"CriticModel: value_init must be one of {list(VALUE_INITS)} or the directory of a "
                                    "saved critic, got an empty string")
        return cls.load(Path(init).expanduser())

    # ---- the ValueModel protocol
    def values(self, rollout) -> torch.Tensor:
        """float32 ``[B, T]``: V(s_t) of every completion token the model sampled (0 on padding and on the
        observation tokens of a multi-turn rollout, which the forward attends over); with grad when grad is
        enabled."""
        from .rollout import position_ids_from_mask

        ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
        attn = rollout.attention_mask()  # model and observation tokens (multi-turn): values at model tokens only
        P, T = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
        hidden = self.backbone(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn),
                               use_cache=False).last_hidden_state
        v = self.head(hidden[:, P - 1:P - 1 + T].float()).squeeze(-1)
        return v * rollout.completion_mask

    # ---- persistence
    def save(self, path: str | os.PathLike) -> Path:
        """Write ``critic.json`` (the head width), the backbone's ``config.json`` and
        ``critic.safetensors`` to the directory ``path`` (created). :meth:`load` reads it back."""
        import json

        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.backbone.config.to_json_file(path / "config.json")
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()},
                  path / "critic.safetensors")
        (path / "critic.json").write_text(json.dumps({"hidden_size": self.head.in_features}))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CriticModel":
        """The critic saved at ``path`` by :meth:`save`.

        Raises:
            FileNotFoundError: ``path`` lacks ``critic.json``, ``config.json`` or
                ``critic.safetensors`` (the message names it, and the accepted names).
        """
        import json

        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModel

        path = Path(path).expanduser()
        for name in ("critic.json", "config.json", "critic.safetensors"):
            if not (path / name).is_file():
                hint = (f"; {path} is a trainer checkpoint: its critic is {path / 'critic'}"
                        if (path / "critic" / "critic.json").is_file() else "")
                raise FileNotFoundError(
                    f"CriticModel: value_init={str(path)!r} is neither one of {list(VALUE_INITS)} nor a critic "
                    f"directory written by CriticModel.save ({path / name} is missing){hint}")
        meta = json.loads((path / "critic.json").read_text())
        model = cls(AutoModel.from_config(AutoConfig.from_pretrained(path)), meta["hidden_size"])
        model.load_state_dict(load_file(path / "critic.safetensors"))
        return model
