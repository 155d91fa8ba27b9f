"""Next-token reasoning on a real English corpus: the task of RPT (Dong et al., arXiv 2506.08007).

* **Corpus** (:func:`split_corpus`): the Python language reference as CPython ships it
  (``pydoc_data.topics``, no download), cut into chunks of whole paragraphs, each assigned by a
  hash of its key (independent of dict order, ``PYTHONHASHSEED`` and machine) to ``pretrain``
  (60%: the base and proxy models), ``rl`` (20%: RPT and the continued-NTP baseline) or ``test``
  (20%: held-out positions).
* **Format** (§3.1): the prompt is ``context_tokens`` tokens then ``<think>``; the completion a
  thinking span, ``</think>``, the prediction, EOS (``'</think> names'``).
  Departure: the prediction is everything after the last ``</think>`` (:func:`parse_prediction`),
  not the last ``\\boxed{}`` (the corpus is full of braces).
* **Reward** (Eq. 3): :func:`grpo_lab.algo.rewards.prefix_match_reward` against the next
  ``reference_tokens`` tokens.
* **Entropy filter** (§3.3): a proxy model's top-16 entropy (:func:`top_k_entropy`); training
  samples positions with at least ``min_entropy``; test positions split into easy / medium / hard
  by :data:`ENTROPY_THRESHOLDS` (:func:`entropy_split`).
* **Data files**, written by ``python -m grpo_lab.lab.pretrain corpus-proxy``:
  ``data/tasks/next_token_train.safetensors`` (the ``rl`` part's token ids and proxy entropies)
  and ``data/tasks/next_token_test.jsonl`` (the held-out positions), tokenised by the
  ``corpus-base`` byte-level BPE (:func:`grpo_lab.policy.models.train_bpe_tokenizer`, trained on
  ``pretrain`` only).
* **A hub model** (chapter 7's GPU run): :func:`build_hub_task_data` writes the same files with the
  model's tokenizer and the model as proxy, read by ``NextTokenTask(tokenizer=<model>, data=<dir>)``;
  ``chat=True`` wraps the context in its chat template with :data:`CHAT_INSTRUCTION` and opens the
  assistant's turn with ``<think>``.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import operator
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch

from ..paths import checkpoint_dir, data_dir, missing_data_hint
from ..algo.rewards import prefix_match_reward
from .base import Problem, load_problems, source_fingerprint

__all__ = ["THINK_OPEN", "THINK_CLOSE", "ENTROPY_THRESHOLDS", "CHAT_INSTRUCTION", "build_hub_task_data", "load_corpus", "corpus_sha256", "split_corpus",
           "token_strings", "char_start_mask", "top_k_entropy", "entropy_split", "next_token_prompt", "parse_prediction",
           "NextTokenTask", "proxy_entropies", "tokenizer_sha256", "SPLIT_FRACTIONS", "corpus_chunks", "build_task_data", "TRAIN_FILE", "TEST_FILE",
           "held_out_ids", "held_out_loss"]

#: The delimiters of the thinking span (special tokens of the corpus tokenizer, kept by ``decode``).
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

#: RPT's difficulty thresholds, from its §4.1 and Table 1. A position belongs to a split when the proxy's
#: top-16 entropy (nats) is at least the split's threshold, so the splits are nested (every hard
#: position is also medium and easy). Our reading of the paper's "easy / medium / hard"; the tiny
#: proxy's entropies are on a different scale from a 1.5B model's (chapter 7 shows both).
ENTROPY_THRESHOLDS: dict[str, float] = {"easy": 0.5, "medium": 1.0, "hard": 1.5}

#: The task's data files, under ``<data_dir>/tasks`` (or ``NextTokenTask.data``).
TRAIN_FILE, TEST_FILE = "next_token_train.safetensors", "next_token_test.jsonl"

#: The user turn of the chat format (``NextTokenTask(chat=True)``) before the context; ours, written
#: for an instruct model that has not seen RPT's format (the paper's R1-Distill model is prompted
#: with the bare text). It asks for the format the reward reads: the prediction right after
#: ``</think>``, byte for byte, a leading space included, and nothing after it (a trailing space, or
#: more than the ``reference_tokens`` tokens of the reference, scores 0).
CHAT_INSTRUCTION = (
    "Predict how the passage below continues. Reason inside <think> ... </think> (as briefly as you like), then, "
    "right after </think>, write the next word (or the next few words) of the passage exactly as they follow its "
    "last character, starting with a space if the continuation starts with one, and stop there: no quotes, no "
    "trailing space or newline, nothing else. For the passage 'The cat sat on the' the answer is "
    "'<think>a place to sit</think> mat'.\n\nPassage:\n")


def load_corpus() -> dict[str, str]:
    """The corpus: ``{topic name: text}`` from CPython's ``pydoc_data.topics``, sorted by name.

    Returns:
        dict of 79 topics (CPython 3.11) of English text; the exact text depends on the CPython
        release (:func:`corpus_sha256` identifies it).
    """
    from pydoc_data.topics import topics

    return {k: topics[k] for k in sorted(topics)}


def corpus_sha256(docs: Mapping[str, str]) -> str:
    """SHA-256 of the corpus (names and texts, in sorted order, UTF-8), hex. Raises nothing."""
    h = hashlib.sha256()
    for name in sorted(docs):
        h.update(name.encode() + b"\0" + docs[name].encode() + b"\0")
    return h.hexdigest()


#: The corpus split (:func:`split_corpus`): pretraining of the base and proxy models, the RL (and
#: continued-NTP) training positions, and the held-out test positions; fractions of the chunks.
SPLIT_FRACTIONS: dict[str, float] = {"test": 0.2, "rl": 0.2, "pretrain": 0.6}


def corpus_chunks(docs: Mapping[str, str], min_chars: int = 2000) -> list[tuple[str, str]]:
    """Cut every topic into chunks of whole paragraphs (ending at a blank line) of at least
    ``min_chars`` characters (a topic's last chunk may be shorter).

    Args:
        docs: ``{topic: text}`` (:func:`load_corpus`).
        min_chars: the shortest chunk, in characters (an int >= 1).

    Returns:
        ``[(key, text)]`` with ``key = "topic#index"``, in topic order; the chunks of a topic join
        back into its text exactly.

    Raises:
        ValueError: ``min_chars`` is not an int >= 1.
    """
    if not isinstance(min_chars, int) or isinstance(min_chars, bool) or min_chars < 1:
        raise ValueError(f"corpus_chunks: min_chars must be an int >= 1, got {min_chars!r}")
    out = []
    for name in sorted(docs):
        text, start, k = docs[name], 0, 0
        while start < len(text):
            cut = text.find("\n\n", start + min_chars)
            end = len(text) if cut < 0 else cut + 2
            out.append((f"{name}#{k}", text[start:end]))
            start, k = end, k + 1
    return out


def split_corpus(docs: Mapping[str, str], fractions: Mapping[str, float] | None = None, *,
                 salt: str = "grpo_lab-rpt", min_chars: int = 2000) -> dict[str, list[tuple[str, str]]]:
    """Split the corpus into chunks (:func:`corpus_chunks`) assigned to ``fractions``' parts.

    A chunk's part is fixed by ``sha256(salt + key)`` read as a number u in [0, 1): the parts take
    consecutive intervals of u in the order of ``fractions`` (default :data:`SPLIT_FRACTIONS`:
    test, rl, pretrain). A function of the chunk's key alone: the same split on every machine and
    under any ``PYTHONHASHSEED``; the chunks themselves follow the text of the CPython release.

    Returns:
        ``{part: [(key, text), ...]}`` in the order of ``fractions``, chunks in corpus order.

    Raises:
        ValueError: fractions that are not positive or do not sum to 1, or a part left empty.
    """
    fractions = dict(SPLIT_FRACTIONS if fractions is None else fractions)
    if not fractions or any(not (isinstance(f, (int, float)) and f > 0) for f in fractions.values()) \
            or abs(sum(fractions.values()) - 1) > 1e-9:
        raise ValueError(f"split_corpus: fractions must be positive and sum to 1, got {fractions!r}")
    edges, acc = [], 0.0
    for part, f in fractions.items():
        acc += f
        edges.append((part, acc))
    out: dict[str, list[tuple[str, str]]] = {part: [] for part in fractions}
    for key, text in corpus_chunks(docs, min_chars):
        u = int(hashlib.sha256((salt + key).encode()).hexdigest()[:16], 16) / 2**64
        out[next((p for p, e in edges if u < e), edges[-1][0])].append((key, text))
    empty = [p for p, chunks in out.items() if not chunks]
    if empty:
        raise ValueError(f"split_corpus: no chunk falls in {empty}; use larger fractions or smaller chunks")
    return out


def token_strings(tokenizer, ids: Sequence[int]) -> list[str]:
    """The text of each token of ``ids``, for :func:`~grpo_lab.algo.rewards.prefix_match_reward`.

    A byte-level token can end inside a multi-byte UTF-8 character (``’`` is three bytes), and
    then has no text of its own; such a token is joined with the tokens after it until the text
    is whole, so the joined string's byte boundaries are exactly the token boundaries that fall
    between characters. Trailing bytes that never complete a character are dropped.

    Returns:
        list of non-empty ``str``, ``"".join(out) == tokenizer.decode(ids)`` (up to a dropped
        incomplete tail).
    """
    out, pending = [], []
    for i in ids:
        pending.append(int(i))
        text = tokenizer.decode(pending, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if text and "\ufffd" not in text:
            out.append(text)
            pending = []
    return out


def char_start_mask(tokenizer) -> np.ndarray:
    """bool ``[vocab]``: whether each token's first byte starts a UTF-8 character (is not a
    continuation byte ``0b10xxxxxx``). A position whose token does not is inside a character: the
    context before it cannot be written as text, so it is never a problem of the task.
    Special tokens count as starting one."""
    byte_of = {c: b for b, c in enumerate(_bytes_to_unicode())}
    special = set(tokenizer.all_special_tokens)
    out = np.ones(len(tokenizer), dtype=bool)
    for tok, i in tokenizer.get_vocab().items():
        if tok in special or not tok:
            continue
        first = byte_of.get(tok[0])
        out[i] = first is None or (first & 0xC0) != 0x80
    return out


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte 0..255 (the
    mapping ``tokenizers``' ``ByteLevel`` pre-tokenizer uses), as a list indexed by byte.

    The table is ``transformers``' own ``bytes_to_unicode`` (in ``transformers.convert_slow_tokenizer``
    from 5.6, the lowest supported version, to 5.24 at least), which returns it as a ``{byte: char}`` dict."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    return [table[b] for b in range(256)]


def top_k_entropy(logits: torch.Tensor, k: int = 16) -> torch.Tensor:
    """Entropy (nats) of the next-token distribution restricted to its ``k`` most likely tokens
    and renormalised: RPT's difficulty measure (§3.3, "the entropy of the top-16 next tokens" of
    a proxy model)::

        p_j = softmax(top_k(logits))_j,     H = -sum_j p_j log p_j  in [0, log k]

    Args:
        logits: ``[..., V]`` float tensor (any float dtype; computed in float32).
        k: ``1 <= k``; ``k > V`` uses all ``V`` tokens.

    Returns:
        float32 ``[...]`` tensor. A 1-token distribution or ties give defined values
        (0 and ``log k``); ``-inf`` logits (masked tokens) contribute 0, and a row of only
        ``-inf`` has entropy 0.

    Raises:
        ValueError: ``k < 1``, a 0-d ``logits`` or an empty last dimension, or NaN / ``+inf`` logits.
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"top_k_entropy: k must be an int >= 1, got {k!r}")
    if logits.dim() == 0:
        raise ValueError("top_k_entropy: logits must have a vocabulary dimension [..., V]")
    x = logits.detach().float()
    if bool(torch.isnan(x).any()) or bool((x == math.inf).any()):
        raise ValueError("top_k_entropy: logits contain NaN or +inf")
    if x.shape[-1] == 0:
        raise ValueError("top_k_entropy: logits have an empty vocabulary dimension")
    top = x.topk(min(k, x.shape[-1]), dim=-1).values
    logp = torch.log_softmax(top, dim=-1)
    p = logp.exp()
    h = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)
    return torch.nan_to_num(h, nan=0.0) + 0.0  # a row of only -inf logits: no distribution, entropy 0


def entropy_split(entropy, thresholds: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """The nested difficulty splits of positions by proxy entropy (RPT Table 1).

    Args:
        entropy: ``[N]`` array-like of entropies in nats (NaN: not in any split).
        thresholds: ``{split name: minimum entropy}``; default :data:`ENTROPY_THRESHOLDS`.

    Returns:
        ``{name: bool [N] mask}`` with ``entropy >= threshold``, in the order of ``thresholds``.

    Raises:
        ValueError: a non-finite or negative threshold, or ``entropy`` not 1-D.
    """
    thresholds = dict(ENTROPY_THRESHOLDS if thresholds is None else thresholds)
    e = np.asarray(entropy, dtype=np.float64)
    if e.ndim != 1:
        raise ValueError(f"entropy_split: entropy must be 1-D, got shape {e.shape}")
    for name, t in thresholds.items():
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t >= 0):
            raise ValueError(f"entropy_split: threshold {name!r} must be a finite number >= 0, got {t!r}")
    with np.errstate(invalid="ignore"):
        return {name: np.nan_to_num(e, nan=-1.0) >= t for name, t in thresholds.items()}


def next_token_prompt(context: str) -> str:
    """The next-token reasoning prompt: the context, then ``<think>`` (RPT §3.1)."""
    return context + THINK_OPEN


def parse_prediction(completion: str) -> str | None:
    """The prediction of a completion: everything after its last ``</think>``, unstripped;
    ``None`` when there is no ``</think>`` (no prediction was made)."""
    if THINK_CLOSE not in completion:
        return None
    return completion.rsplit(THINK_CLOSE, 1)[1]


@lru_cache(maxsize=4)
def _held_out_cached(name: str) -> np.ndarray:
    """:func:`held_out_ids` in the tokenizer :func:`_load_tokenizer` loads for ``name`` (cached: read at
    every evaluation)."""
    return held_out_ids(_load_tokenizer(name))


@lru_cache(maxsize=4)
def _load_tokenizer(name: str):
    """The tokenizer of a shipped checkpoint (a bare name such as ``"corpus-base"``), of a local
    directory, or of a hub id ``"org/name"`` (as :func:`grpo_lab.policy.models.load_policy` loads it)."""
    from ..policy.models import HUB_ID
    from ..policy.models import load_tokenizer as load

    local = Path(name).expanduser()
    if os.sep not in name and "/" not in name and not local.is_dir():
        path = checkpoint_dir(name)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"NextTokenTask: the tokenizer of checkpoint {name!r} was not found at {path} "
                                    f"(python -m grpo_lab.lab.pretrain corpus makes it); {missing_data_hint()}")
        return load(str(path))
    if local.is_dir():
        return load(str(local))
    if HUB_ID.match(name) and not name.startswith((".", "/", "~")):
        return load(name)
    raise FileNotFoundError(f"NextTokenTask: tokenizer {name!r} is neither a shipped checkpoint, an existing directory "
                            "nor a hub id 'org/name'")


@lru_cache(maxsize=4)
def _load_train(path: str):
    from safetensors import safe_open
    from safetensors.torch import load_file

    if not Path(path).is_file():
        raise FileNotFoundError(f"NextTokenTask: the training positions {path} were not found (python -m "
                                f"grpo_lab.lab.pretrain corpus-proxy writes the shipped ones, "
                                f"grpo_lab.tasks.next_token.build_hub_task_data those of a hub model); "
                                f"{missing_data_hint()}")
    d = load_file(path)
    with safe_open(path, "pt") as f:
        meta = dict(f.metadata() or {})
    return d["ids"].numpy(), d["entropy"].numpy(), meta


def tokenizer_sha256(tokenizer) -> str:
    """SHA-256 (hex) of a fast tokenizer's serialised form: identifies the tokenizer that split the
    corpus into the ids of the task's data files. Raises nothing."""
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()


def held_out_ids(tokenizer) -> np.ndarray:
    """int64 ``[N]``: the ``test`` part of :func:`split_corpus` as ``tokenizer`` cuts it, its chunks in
    corpus order, each followed by EOS: the held-out text of the corpus recipes' held-out loss (the
    text the test positions are drawn from, which neither pretraining nor RL sees).

    Args:
        tokenizer: a ``transformers`` tokenizer with an EOS token (the model's own: the ids must be its
            vocabulary's), e.g. ``load_policy(name)[1]``.

    Raises:
        TypeError: ``tokenizer`` is not a callable tokenizer (a name, for instance).
        ValueError: the tokenizer has no EOS token.
    """
    if not callable(tokenizer) or isinstance(tokenizer, (str, os.PathLike)):
        raise TypeError(f"held_out_ids: tokenizer must be a transformers tokenizer (e.g. load_policy(name)[1]), "
                        f"got {type(tokenizer).__name__} {tokenizer!r:.60}")
    if getattr(tokenizer, "eos_token_id", None) is None:
        raise ValueError("held_out_ids: the tokenizer has no EOS token (each chunk of the text ends with one)")
    parts = split_corpus(load_corpus())
    return np.concatenate([tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                           for _, text in parts["test"]]).astype(np.int64)


def _positive_index(name: str, value) -> int:
    """``value`` as an int (Python or numpy integer) >= 1; ValueError naming ``name`` otherwise."""
    try:
        out = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        out = None
    if out is None or out < 1:
        raise ValueError(f"held_out_loss: {name} must be an int >= 1, got {value!r}")
    return out


@torch.no_grad()
def held_out_loss(model, ids: np.ndarray | torch.Tensor, *, width: int = 64, max_logits: int = 2**26) -> float:
    """Mean next-token cross-entropy of ``model`` on the token stream ``ids``, in nats per token: the
    stream cut into ``n = (len(ids) - 1) // width`` windows of ``width`` tokens, each token of a window
    predicted from the window's tokens before it (RPT's Eq. 1, the NTP objective, as a test metric; the
    corpus recipes' held-out loss with ``ids = held_out_ids(tokenizer)``, chapter 7's "held-out loss").

    The windows go through the model in chunks of at most ``max_logits`` logits (windows × ``width`` ×
    vocabulary; at least one window), so a 151,936-token vocabulary needs no ``[n, width, V]`` tensor.
    The logits are upcast to float32 before the loss (a bfloat16 autocast, if active, covers the model
    only). The model's training mode is kept.

    Args:
        model: a ``transformers`` causal LM (its output has ``.logits`` float ``[b, width, V]``).
        ids: int ``[N]``, ``N > width``.
        width: tokens per window (the recipes': 64).
        max_logits: logits per forward (default ``2**26``: 256 MiB in float32).

    Returns:
        The mean over the ``n * width`` predicted tokens (a float; the last ``len(ids) - 1 - n * width``
        tokens are not scored).

    Raises:
        ValueError: ``width`` or ``max_logits`` not an int ``>= 1``; ``ids`` not one-dimensional integers, not
            longer than one window, or outside ``[0, V)`` (ids of another tokenizer than the model's).
    """
    width, max_logits = _positive_index("width", width), _positive_index("max_logits", max_logits)
    arr = np.asarray(ids.cpu() if isinstance(ids, torch.Tensor) else ids)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"held_out_loss: ids must be a 1-D sequence of integer token ids, got {arr.dtype} of shape "
                         f"{arr.shape}")
    n = (len(arr) - 1) // width
    if n < 1:
        raise ValueError(f"held_out_loss: {len(arr)} tokens make no window of width {width} plus its next token")
    vocab = int(model.get_output_embeddings().weight.shape[0])
    if arr.min() < 0 or arr.max() >= vocab:
        raise ValueError(f"held_out_loss: ids range over [{arr.min()}, {arr.max()}], outside the model's vocabulary "
                         f"[0, {vocab}): were they cut by another tokenizer than the model's?")
    device = next(model.parameters()).device
    x = torch.as_tensor(arr[: n * width + 1], dtype=torch.long, device=device)
    inp, tgt = x[:-1].view(n, width), x[1:].view(n, width)
    step = max(1, max_logits // (width * vocab))
    total = 0.0
    for s in range(0, n, step):
        logits = model(input_ids=inp[s:s + step], use_cache=False).logits.float()
        total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[s:s + step].flatten(),
                                                         reduction="sum"))
    return total / (n * width)


@dataclass
class NextTokenTask:
    """Next-token reasoning (arXiv 2506.08007, §3.1) with RPT's prefix-matching reward (§3.2, Eq. 3).

    Each problem is a corpus position ``t``: the prompt is the ``context_tokens`` tokens before it plus
    ``<think>``; a completion earns 1.0 when its prediction (after ``</think>``) matches the next
    tokens up to a token boundary. ``Problem.meta`` holds ``reference_tokens`` (list of str),
    ``entropy`` (the proxy's, nats) and ``position``; ``Problem.answer`` is the reference text. A
    completion cut at the budget is scored like any other (no closing ``\\boxed{}`` to miss).

    Attributes:
        name: ``"next_token"`` (the registry name).
        max_new_tokens: generation budget in tokens (thinking, ``</think>``, prediction and EOS).
        context_tokens: tokens of context before each position (the test set's is fixed at 32).
        reference_tokens: ground-truth tokens kept per problem (the longest prediction that can be right).
        min_entropy: training samples only positions whose proxy top-16 entropy (nats) is at least
            this (RPT §3.3); 0 keeps every position.
        tokenizer: the checkpoint whose tokenizer built the data files (``corpus-base``): a shipped
            checkpoint's name, a local directory or a hub id.
        data: the data files' directory (``None``: ``<data_dir>/tasks``);
            :func:`grpo_lab.tasks.next_token.build_hub_task_data` writes one for a hub model.
        chat: prompts in the tokenizer's chat template (:meth:`format_prompt`); ``False``: RPT's bare
            ``context<think>``.
        eval_held_out_loss: also report ``test_held_out_loss`` (nats per token, :meth:`model_metrics`)
            at every evaluation.

    Raises:
        ValueError: settings out of range (at construction); a ``context_tokens`` or tokenizer the
            data files were not built for (when the data is first read); ``chat=True`` with a
            tokenizer that has no chat template (at the first prompt).
    """

    name: str = "next_token"
    max_new_tokens: int = 8
    context_tokens: int = 32
    reference_tokens: int = 8
    min_entropy: float = 0.0
    tokenizer: str = "corpus-base"
    data: str | None = None
    chat: bool = False
    eval_held_out_loss: bool = False

    def __post_init__(self):
        if not isinstance(self.tokenizer, str) or not self.tokenizer.strip():
            raise ValueError(f"NextTokenTask: tokenizer must be a non-empty str, got {self.tokenizer!r}")
        if self.data is not None:
            if not isinstance(self.data, (str, os.PathLike)) or not str(self.data).strip():
                raise ValueError(f"NextTokenTask: data must be a directory path or None, got {self.data!r}")
            self.data = str(self.data)  # a str, so that the task stays a dataclass of JSON-able settings
        for f in ("chat", "eval_held_out_loss"):
            if not isinstance(getattr(self, f), bool):
                raise ValueError(f"NextTokenTask: {f} must be a bool, got {getattr(self, f)!r}")
        for f in ("max_new_tokens", "context_tokens", "reference_tokens"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"NextTokenTask: {f} must be an int >= 1, got {v!r}")
        if not (isinstance(self.min_entropy, (int, float)) and not isinstance(self.min_entropy, bool)
                and math.isfinite(self.min_entropy) and self.min_entropy >= 0):
            raise ValueError(f"NextTokenTask: min_entropy must be a finite number >= 0, got {self.min_entropy!r}")

    # ----------------------------------------------------------------- data
    def _tok(self):
        return _load_tokenizer(self.tokenizer)

    def data_path(self) -> Path:
        """The directory of the task's data files: ``data``, or ``<data_dir>/tasks``."""
        return Path(self.data).expanduser() if self.data is not None else data_dir() / "tasks"

    def fingerprint(self) -> dict:
        """What a checkpoint records (:func:`grpo_lab.tasks.base.task_fingerprint`): the sha256 of each
        data file (``TRAIN_FILE``, ``TEST_FILE``) in :meth:`data_path` that exists, and the reward,
        :meth:`reward`'s ``module:qualname``. Raises ``OSError`` for a file that cannot be read."""
        files = {name: self.data_path() / name for name in (TRAIN_FILE, TEST_FILE)}
        return {"data": {name: source_fingerprint(path) for name, path in files.items() if path.is_file()}}

    def format_prompt(self, context: str) -> str:
        """The prompt for a context: ``context + "<think>"``; with ``chat``, the tokenizer's chat
        template applied to the user turn ``CHAT_INSTRUCTION + context``, with the assistant's
        generation prompt, then ``<think>`` (the assistant's turn opens the thinking span).

        Raises:
            ValueError: ``chat`` and a tokenizer without a chat template.
        """
        if not self.chat:
            return next_token_prompt(context)
        tok = self._tok()
        if not getattr(tok, "chat_template", None):
            raise ValueError(f"NextTokenTask: chat=True, but the tokenizer {self.tokenizer!r} has no chat template")
        return tok.apply_chat_template([{"role": "user", "content": CHAT_INSTRUCTION + context}], tokenize=False,
                                       add_generation_prompt=True) + THINK_OPEN

    def _train(self):
        ids, ent, meta = _load_train(str(self.data_path() / TRAIN_FILE))
        self._check_data(meta)
        return ids, ent

    def _check_data(self, meta: Mapping[str, str]) -> None:
        """Refuse settings the data files were not built for: another context length (the
        entropies and the eligible positions are those of ``meta["context_tokens"]``-token
        contexts) or another tokenizer than the one that split the corpus."""
        want = meta.get("context_tokens")
        if want is not None and int(want) != self.context_tokens:
            raise ValueError(f"NextTokenTask: context_tokens={self.context_tokens}, but the task's data files were built "
                             f"for {want}-token contexts (their proxy entropies and test prompts); rebuild them with "
                             f"grpo_lab.tasks.next_token.build_task_data(..., context_tokens={self.context_tokens})")
        sha = meta.get("tokenizer_sha256")
        if sha is not None and tokenizer_sha256(self._tok()) != sha:
            fix = ("use 'corpus-base' (or a checkpoint with the same tokenizer)" if self.data is None else
                   f"build the files for this tokenizer's model (grpo_lab.tasks.next_token.build_hub_task_data(model, "
                   f"out)) and point data at them (chapter 7's GPU run: $GRPO_LAB_RPT_DATA, or leave it unset for a "
                   f"directory per model)")
            raise ValueError(f"NextTokenTask: the tokenizer {self.tokenizer!r} is not the one that split the corpus "
                             f"into the task's data files in {self.data_path()} (tokenizer_sha256 differs); {fix}")

    def eligible_positions(self) -> np.ndarray:
        """Training positions (indices into the training token stream) with a full context and a
        proxy entropy of at least ``min_entropy``.

        Raises:
            ValueError: no position qualifies.
        """
        return _eligible_cached(self)

    def problem_at(self, ids: Sequence[int], t: int, entropy: float) -> Problem:
        """The problem for position ``t`` of the token stream ``ids``: the ``context_tokens``
        tokens before it (a leading partial character dropped) and ``<think>``; the reference is
        the next ``reference_tokens`` tokens, cut at the end of the chunk (EOS)."""
        tok = self._tok()
        # a context that starts inside a character decodes with U+FFFD for the orphan bytes: drop them
        context = tok.decode(list(ids[t - self.context_tokens:t]), skip_special_tokens=False,
                             clean_up_tokenization_spaces=False).lstrip("\ufffd")
        n = self.reference_tokens
        while True:  # a first character split over more tokens than the window: widen it (at most 3 more)
            window = [int(i) for i in ids[t:t + n]]
            if tok.eos_token_id in window:  # the reference ends with its chunk
                window = window[:window.index(tok.eos_token_id)]
            ref = token_strings(tok, window)
            if ref or len(window) < n or n >= self.reference_tokens + 3:
                break
            n += 1
        return Problem(self.format_prompt(context), "".join(ref),
                       {"reference_tokens": ref, "entropy": round(float(entropy), 4), "position": int(t)})

    # ----------------------------------------------------------------- protocol
    def sample(self, n: int, rng: np.random.Generator) -> list[Problem]:
        """``n`` training positions drawn uniformly (with replacement) from :meth:`eligible_positions`."""
        ids, ent = self._train()
        pos = self.eligible_positions()
        picks = pos[rng.integers(0, len(pos), size=n)]
        return [self.problem_at(ids, int(t), float(ent[t])) for t in picks]

    def reward(self, completion: str, problem: Problem) -> float:
        """Eq. 3 on the prediction after ``</think>``; 0.0 without one."""
        pred = parse_prediction(completion)
        return 0.0 if pred is None else prefix_match_reward(pred, problem.meta["reference_tokens"])

    def is_correct(self, completion: str, problem: Problem) -> bool:
        """The reward is 1."""
        return self.reward(completion, problem) == 1.0

    def model_metrics(self, model) -> dict[str, float]:
        """Evaluation columns computed from the model itself (the trainer adds them as ``test_<name>``):
        ``held_out_loss``, :func:`~grpo_lab.tasks.next_token.held_out_loss` on
        :func:`~grpo_lab.tasks.next_token.held_out_ids` in this task's tokenizer, when
        ``eval_held_out_loss``; else none."""
        if not self.eval_held_out_loss:
            return {}
        return {"held_out_loss": held_out_loss(model, _held_out_cached(self.tokenizer))}

    def test_metrics(self, frame) -> dict[str, float]:
        """Evaluation columns (the trainer adds them as ``test_<name>``): ``accuracy_<split>`` for
        the nested entropy splits of :data:`grpo_lab.tasks.next_token.ENTROPY_THRESHOLDS`,
        ``accuracy_low`` / ``_mid`` / ``_high`` for the terciles of the test positions' proxy entropy (disjoint), and
        ``prediction_tokens_mean`` (0 for a response without a prediction) and
        ``top_prediction_frac`` (the share of the single most common prediction among the
        responses that made one, NaN if none did: a policy that collapses onto a frequent token
        shows here).

        Args:
            frame: :func:`grpo_lab.policy.rollout.evaluate`'s frame on this task's problems (columns
                ``correct``, ``entropy``, ``completion``).
        """
        ent = frame["entropy"].to_numpy(dtype=float)
        correct = frame["correct"].to_numpy(dtype=float)
        out = {f"accuracy_{k}": float(correct[m].mean()) if m.any() else float("nan")
               for k, m in entropy_split(ent).items()}
        lo, hi = np.quantile(ent, [1 / 3, 2 / 3])
        for name, m in (("low", ent < lo), ("mid", (ent >= lo) & (ent < hi)), ("high", ent >= hi)):
            out[f"accuracy_{name}"] = float(correct[m].mean()) if m.any() else float("nan")
        preds = [parse_prediction(c) for c in frame["completion"]]  # None: no prediction
        tok = self._tok()
        out["prediction_tokens_mean"] = float(np.mean([len(tok(p, add_special_tokens=False)["input_ids"]) if p else 0
                                                       for p in preds]))
        made = [p for p in preds if p is not None]
        counts = collections.Counter(made)
        out["top_prediction_frac"] = float(counts.most_common(1)[0][1] / len(made)) if made else float("nan")
        return out

    def demonstration(self, problem: Problem, rng: np.random.Generator | None = None) -> str:
        """The ground truth in the task's format, an empty thinking span and the next token:
        ``"</think>" + reference_tokens[0]`` (the target of Eq. 1's ``log P(x_t | x_<t)``; used by
        the ``ntp_coef`` ablation, :data:`grpo_lab.algo.algorithms.RPT_HYBRID`). ``rng`` is unused."""
        return THINK_CLOSE + problem.meta["reference_tokens"][0]

    @staticmethod
    def is_reasoning(completion: str) -> bool:
        """Whether the thinking span (before ``</think>``) is non-empty."""
        return THINK_CLOSE in completion and bool(completion.split(THINK_CLOSE, 1)[0].strip())

    def test_set(self) -> list[Problem]:
        """The fixed held-out positions of ``next_token_test.jsonl`` in :meth:`data_path`. The file
        stores the bare prompts (``context<think>``); with ``chat`` each is put in the chat format.

        Raises:
            FileNotFoundError: the file is missing (the message names the command that writes it).
        """
        self._train()  # checks context_tokens and the tokenizer against the data files
        problems = list(_load_test(str(self.data_path() / TEST_FILE)))
        if self.chat:
            problems = [Problem(self.format_prompt(p.prompt[:-len(THINK_OPEN)]), p.answer, p.meta) for p in problems]
        return problems


@lru_cache(maxsize=8)
def _eligible_key(path: str, context_tokens: int, reference_tokens: int, min_entropy: float):
    ids, ent, _ = _load_train(path)
    ok = np.isfinite(ent) & (ent >= min_entropy)
    ok[:context_tokens] = False
    ok[len(ids) - reference_tokens:] = False
    return np.flatnonzero(ok)


def _eligible_cached(task: NextTokenTask) -> np.ndarray:
    task._train()  # checks the settings against the data files
    pos = _eligible_key(str(task.data_path() / TRAIN_FILE), task.context_tokens, task.reference_tokens,
                        float(task.min_entropy))
    if len(pos) == 0:
        raise ValueError(f"NextTokenTask: no training position has proxy entropy >= {task.min_entropy}")
    return pos


@lru_cache(maxsize=4)
def _load_test(path: str) -> tuple[Problem, ...]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"NextTokenTask: the test positions {path} were not found (python -m grpo_lab.lab.pretrain "
                                f"corpus-proxy writes the shipped ones, grpo_lab.tasks.next_token.build_hub_task_data "
                                f"those of a hub model); {missing_data_hint()}")
    return tuple(load_problems(path))


# --------------------------------------------------------------------- building the data
@torch.no_grad()
def proxy_entropies(model, ids: Sequence[int], positions: Sequence[int], *, context_tokens: int, k: int = 16,
                    batch_size: int = 512) -> np.ndarray:
    """The proxy ``model``'s top-``k`` entropy (nats) of the token at each position ``t`` of
    ``ids``, given the ``context_tokens`` tokens before it (exactly the task's prompt context,
    without ``<think>``).

    The contexts go to the model's device in batches of ``batch_size``; the model computes the logits of
    each context's last position only (``logits_to_keep=1``, a transformers ``*ForCausalLM`` keyword).

    Returns:
        float32 ``[len(positions)]`` array.
    """
    ids_t = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    positions = np.asarray(positions, dtype=np.int64)
    out = np.empty(len(positions), dtype=np.float32)
    offs = torch.arange(-context_tokens, 0)
    device = next(model.parameters()).device
    model.eval()
    for s in range(0, len(positions), batch_size):
        p = torch.as_tensor(positions[s:s + batch_size])
        x = ids_t[p[:, None] + offs[None, :]].to(device)
        # only the last position's logits (logits_to_keep=1): the LM head over all context_tokens positions
        # was most of the proxy's time for a small model, and the kept row is bit-identical on CPU
        logits = model(input_ids=x, use_cache=False, logits_to_keep=1).logits[:, -1]
        out[s:s + len(p)] = top_k_entropy(logits, k).cpu().numpy()
    return out


def build_task_data(proxy, tokenizer, out: str | Path, *, context_tokens: int = 32, reference_tokens: int = 8,
                    test_size: int = 600, seed: int = 0, batch_size: int = 512) -> dict:
    """Write the task's data files into ``out`` (normally ``data/tasks``): the ``rl`` part's token
    stream (its chunks in corpus order, each followed by EOS) with the proxy's entropy at every
    position that has a full context within its chunk and starts a character (NaN elsewhere), and
    ``test_size`` positions drawn uniformly (seeded) from the eligible positions of the ``test`` part.

    ``batch_size``: contexts per proxy forward (:func:`proxy_entropies`).

    Returns:
        a summary (token counts, the split, the corpus hash, entropy quantiles).

    Raises:
        NotADirectoryError: ``out`` exists and is not a directory.
    """
    from safetensors.torch import save_file

    if Path(out).exists() and not Path(out).is_dir():
        raise NotADirectoryError(f"build_task_data: out={str(out)!r} exists and is not a directory")

    from .base import save_problems

    docs = load_corpus()
    parts = split_corpus(docs)
    starts = char_start_mask(tokenizer)

    def stream(chunks):
        ids, ok = [], []
        for _, text in chunks:
            d = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += d + [tokenizer.eos_token_id]
            ok += [False] * min(context_tokens, len(d)) + [True] * max(0, len(d) - context_tokens) + [False]
        ids = np.asarray(ids, dtype=np.int64)
        return ids, np.asarray(ok) & starts[ids]  # a position inside a character is no problem

    tr_ids, tr_ok = stream(parts["rl"])
    tr_ok[len(tr_ids) - reference_tokens:] = False
    ent = np.full(len(tr_ids), np.nan, dtype=np.float32)
    pos = np.flatnonzero(tr_ok)
    ent[pos] = proxy_entropies(proxy, tr_ids, pos, context_tokens=context_tokens, batch_size=batch_size)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({"ids": torch.as_tensor(tr_ids.astype(np.int32)), "entropy": torch.as_tensor(ent)},
              str(out / TRAIN_FILE), metadata={"corpus_sha256": corpus_sha256(docs),
                                               "context_tokens": str(context_tokens),
                                               "tokenizer_sha256": tokenizer_sha256(tokenizer)})
    te_ids, te_ok = stream(parts["test"])
    te_ok[len(te_ids) - reference_tokens:] = False
    cand = np.flatnonzero(te_ok)
    rng = np.random.default_rng(seed)
    picks = np.sort(rng.choice(cand, size=min(test_size, len(cand)), replace=False))
    te_ent = proxy_entropies(proxy, te_ids, picks, context_tokens=context_tokens, batch_size=batch_size)
    task = NextTokenTask(context_tokens=context_tokens, reference_tokens=reference_tokens)
    task._tok = lambda: tokenizer  # type: ignore[method-assign]  # build before the checkpoint exists
    problems = [task.problem_at(te_ids, int(t), float(e)) for t, e in zip(picks, te_ent)]
    save_problems(problems, out / TEST_FILE)
    _load_train.cache_clear()
    _load_test.cache_clear()
    _eligible_key.cache_clear()
    q = np.nanquantile(ent, [0.1, 0.25, 0.5, 0.75, 0.9])
    return {"corpus_sha256": corpus_sha256(docs), "split": {p: [k for k, _ in c] for p, c in parts.items()},
            "train_tokens": int(len(tr_ids)), "train_positions": int(len(pos)), "test_positions": len(problems),
            "train_entropy_quantiles": [round(float(v), 4) for v in q]}


def build_hub_task_data(model: str | os.PathLike, out: str | Path, *, device: str = "cpu", context_tokens: int = 32,
                        reference_tokens: int = 8, test_size: int = 600, seed: int = 0, batch_size: int = 32) -> dict:
    """Write the task's data files for a hub model (or a local directory in the hub layout) into
    ``out``: :func:`build_task_data` with the model's own tokenizer, and the model as its own
    entropy proxy (RPT §3.3 uses a smaller model of the same family, R1-Distill-Qwen-1.5B for the
    14B; a 0.5B model has no smaller sibling, and the filter only needs a ranking of positions by
    difficulty). Also writes ``summary.json`` (the model, the summary). Chapter 7's profile reads
    them with ``lab.rpt_gpu_profile(model, data=out)``; by hand,
    ``NextTokenTask(tokenizer=model, data=out, chat=True, max_new_tokens=256, min_entropy=0.5)``
    (the class defaults, 8 tokens and no filter, are the CPU chapter's).

    Args:
        model: a hub id or a local directory, loaded in float32 with :func:`grpo_lab.policy.models.load_policy`.
        out: the directory (created).
        device: where the proxy runs (``"cuda"`` on a GPU: the ``rl`` part is tens of thousands of
            positions of ``context_tokens`` tokens each).
        context_tokens, reference_tokens, test_size, seed: as :func:`build_task_data`.
        batch_size: contexts per proxy forward (its logits are ``batch_size × V`` floats, the last
            position's only: 32 × 151,936 × 4 bytes = 19 MB for Qwen2.5).

    Returns:
        :func:`build_task_data`'s summary, with ``model``.

    Raises:
        FileNotFoundError, OSError, ValueError: as :func:`grpo_lab.policy.models.load_policy`.
    """
    from ..policy.models import load_policy

    proxy, tokenizer = load_policy(model, device=device, dtype=torch.float32)
    summary = build_task_data(proxy, tokenizer, out, context_tokens=context_tokens, reference_tokens=reference_tokens,
                              test_size=test_size, seed=seed, batch_size=batch_size)
    summary = {"model": str(model), "proxy": str(model), **summary}
    (Path(out) / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "split"}, indent=1))
    return summary
