"""Tiny policies and a character tokenizer, built from transformers configs.

Everything here is a thin layer over `transformers`: the tokenizer is a real
``PreTrainedTokenizerFast`` (so ``save_pretrained`` / ``from_pretrained`` / ``apply`` padding
work as for any hub model), and the policies are stock ``Qwen2ForCausalLM`` /
``LlamaForCausalLM`` models with a few hundred thousand parameters. ``load_policy`` loads
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

from .paths import checkpoint_dir

__all__ = [
    "CHARS",
    "build_char_tokenizer",
    "TinyConfig",
    "tiny_policy",
    "load_policy",
    "count_parameters",
]

#: Characters of the CPU tasks' alphabet. Order is part of the checkpoint format: do not reorder.
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


@dataclass(frozen=True)
class TinyConfig:
    """Size of a tiny policy. Defaults give a ~0.8M-parameter 4-layer Qwen2-style model."""

    arch: str = "qwen2"  # "qwen2" | "llama"
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 128
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def tiny_policy(tokenizer, config: TinyConfig | None = None, *, seed: int = 0):
    """A randomly initialised tiny causal LM from a transformers config.

    Args:
        tokenizer: gives ``vocab_size`` and the pad/bos/eos ids written into the config.
        config: sizes; default ``TinyConfig()``.
        seed: torch seed for the initialisation (the global RNG is restored afterwards).

    Returns:
        ``Qwen2ForCausalLM`` or ``LlamaForCausalLM`` in float32, eval mode off (train mode).

    Raises:
        ValueError: unknown ``config.arch``.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

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
    else:
        raise ValueError(f"tiny_policy: unknown arch {config.arch!r}; expected 'qwen2' or 'llama'")
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


def count_parameters(model) -> int:
    """Number of distinct trainable parameters (tied weights counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def _load_tokenizer(source: str, **kwargs):
    """``AutoTokenizer``, except for our character tokenizer: a checkpoint whose tokenizer config
    names the generic fast class is loaded as exactly that class (``AutoTokenizer`` would pick the
    model type's tokenizer class, e.g. ``Qwen2Tokenizer``, whose pre-tokenizer drops spaces)."""
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg = Path(source) / "tokenizer_config.json"
    if cfg.is_file():
        cls = json.loads(cfg.read_text()).get("tokenizer_class")
        if cls in ("PreTrainedTokenizerFast", "TokenizersBackend"):
            return PreTrainedTokenizerFast.from_pretrained(source, **kwargs)
    return AutoTokenizer.from_pretrained(source, **kwargs)


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


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
    """Load ``(model, tokenizer)`` from a local directory or a Hugging Face hub id.

    The same call loads the tiny checkpoints shipped in ``data/checkpoints/`` on CPU and a hub
    model (e.g. ``"Qwen/Qwen2.5-0.5B-Instruct"``) on Colab. Weights are read from safetensors
    only (``use_safetensors=True``); no remote code is ever executed
    (``trust_remote_code=False``). The tokenizer's padding side is set to left for generation
    and a missing pad token falls back to the EOS token.

    Args:
        path_or_hub_id: an existing directory with ``config.json``, the name of a checkpoint
            shipped in ``data/checkpoints`` (``"arithmetic-base"``, see
            :func:`grpo_lab.paths.checkpoint_dir`), or a hub id ``"org/name"``.
        device: where to put the model (default CPU).
        dtype: parameter dtype (default: the checkpoint's, float32 for the tiny models).
        revision: hub revision (branch, tag or commit); ignored for local directories.
        progress: show transformers' progress bars while loading (``Loading weights``, hub
            downloads). ``None``: only in an interactive terminal or notebook outside CI, and
            only if transformers' bars are enabled (``transformers.logging.disable_progress_bar()``
            keeps them off). transformers' global setting is restored afterwards.

    Returns:
        ``(model, tokenizer)``: a ``transformers`` causal LM in eval mode and its tokenizer.

    Raises:
        FileNotFoundError: a local path that does not exist or has no ``config.json``.
        ValueError: a string that is neither an existing path nor a well-formed hub id, or a
            CUDA device without CUDA.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if device is not None and str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"load_policy: device {device!r} requested but CUDA is not available")
    p = Path(path_or_hub_id)
    if not p.exists() and checkpoint_dir(str(path_or_hub_id)).is_dir() and os.sep not in str(path_or_hub_id):
        p = checkpoint_dir(str(path_or_hub_id))  # a shipped checkpoint by name, e.g. "arithmetic-base"
    looks_local = p.exists() or str(path_or_hub_id).startswith((".", "/", "~")) or os.sep in str(p.parent)
    if p.exists():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"load_policy: {p} has no config.json (not a transformers checkpoint)")
        source, kwargs = str(p), {}
    elif _HUB_ID.match(str(path_or_hub_id)) and not looks_local:
        source, kwargs = str(path_or_hub_id), ({"revision": revision} if revision else {})
    elif looks_local or _HUB_ID.match(str(path_or_hub_id)):
        raise FileNotFoundError(f"load_policy: local checkpoint {str(path_or_hub_id)!r} does not exist")
    else:
        raise ValueError(
            f"load_policy: {str(path_or_hub_id)!r} is neither an existing directory nor a hub id of the form 'org/name'")
    model_kwargs = dict(use_safetensors=True, trust_remote_code=False, **kwargs)
    if dtype is not None:
        model_kwargs["dtype"] = dtype
    with _progress_bars(progress):
        tokenizer = _load_tokenizer(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, **model_kwargs)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.to(device or "cpu")
    model.eval()
    return model, tokenizer
