"""Deterministic supervised pretraining of the tiny base policies shipped in ``data/checkpoints``.

    python -m grpo_lab.lab.pretrain arithmetic            # → data/checkpoints/arithmetic-base/
    python -m grpo_lab.lab.pretrain arithmetic-filler     # → data/checkpoints/arithmetic-filler-base/
    python -m grpo_lab.lab.pretrain arithmetic-long       # → data/checkpoints/arithmetic-long-base/
    python -m grpo_lab.lab.pretrain arithmetic-moe        # → data/checkpoints/arithmetic-moe-base/
    python -m grpo_lab.lab.pretrain corpus-proxy          # → data/checkpoints/corpus-proxy-base/ + data/tasks/next_token_*
    python -m grpo_lab.lab.pretrain corpus                # → data/checkpoints/corpus-base/ (chapter 7, RPT)
    python -m grpo_lab.lab.pretrain reverse               # → data/checkpoints/reverse-base/ (the README's own task)
    python -m grpo_lab.lab.pretrain calculator            # → data/checkpoints/calculator-base/ (issue 56's tool task)
    python -m grpo_lab.lab.pretrain long-chain            # → data/checkpoints/long-chain-base/ (issue 55's long chains)
    python -m grpo_lab.lab.pretrain arithmetic --out DIR  # anywhere else

A recipe (model size, data mixture, optimiser, steps, seed) is a frozen dataclass; the checkpoint
directory holds the ``transformers`` model (safetensors), the tokenizer and ``recipe.json`` (the
recipe, the test accuracy reached, the software versions), which a test checks against the
committed checkpoint. Pretraining is plain next-token cross-entropy on the response.

The recipes, one line each:

* ``arithmetic``: a mixture of direct and reasoning demonstrations, so the base mostly answers
  directly and RL has room to act (:class:`~grpo_lab.tasks.ArithmeticTask`);
* ``arithmetic-filler``: the filler variant (``filler="."``): half the demonstrations end in 1-12
  dots, so length is free of correctness (chapter 3's length-bias experiment);
* ``arithmetic-long``: ``arithmetic-filler`` with 1-320 dots, a 512-position context and a
  360-token budget: VAPO's long-response regime (``benchmarks/vapo_long.py``);
* ``arithmetic-moe``: ``arithmetic``'s recipe on a Qwen3-MoE-style model (8 experts, top-2, with
  transformers' load-balancing loss) for GSPO's routing replay (arXiv 2507.18071, §5.3;
  :mod:`grpo_lab.policy.moe`);
* ``corpus`` / ``corpus-proxy`` (chapter 7, RPT): a 1,024-token byte-level BPE and a language model
  of the Python language reference (:mod:`grpo_lab.tasks.next_token`) on 64-token windows, a share
  ``p_format`` written in the next-token reasoning format (so the base answers in it, as RPT's
  R1-Distill base did); ``corpus-proxy`` is the smaller entropy proxy (§3.3) and writes the
  task's data files;
* ``calculator``: episodes of :class:`~grpo_lab.tasks.CalculatorTask` (``a*b+c=``), a share ``p_tool``
  calling the calculator ``calc(a*b)`` with the observation ``=<product>\\n`` in the text (half of those
  calling it again for the addition), the rest answering directly; an alphabet with parentheses;
* ``long-chain``: ``arithmetic-base`` fine-tuned on :class:`~grpo_lab.tasks.LongChainTask` (sums of 3-14
  one-digit terms) with careful (one addition per step), hasty (two or three) and direct demonstrations,
  a 256-position context and a 180-token budget that cuts the careful chains of 14-term sums; its card is
  :func:`grpo_lab.lab.long_chain_card.long_chain_card`;
* ``reverse``: the warm start for ``book/examples/reverse_task.py`` (the page "Use it on your own
  problem"; needs a source checkout), stopped early so that RL has room to act.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from ..policy.models import TinyConfig, build_char_tokenizer, count_parameters, tiny_policy
from ..paths import REPO_ROOT, checkpoint_dir
from ..tasks.arithmetic import ArithmeticTask
from ..tasks.calculator import CALC_ALPHABET, CalculatorTask
from ..tasks.long_chain import LongChainTask

__all__ = ["PretrainRecipe", "RECIPES", "REVERSE_TASK_FILE", "reverse_example", "pretrain", "continue_ntp", "continued_ntp_run", "main"]


#: The example task the ``reverse`` recipe trains on (a source checkout's ``book/examples/reverse_task.py``).
REVERSE_TASK_FILE = REPO_ROOT / "book" / "examples" / "reverse_task.py"

#: Supervised steps of the ``reverse`` recipe (the own-task page's ``WARM_STEPS``): stopped early, so that
#: the base policy is right only part of the time.
REVERSE_STEPS = 50

#: Supervised steps of the ``calculator`` recipe.
CALCULATOR_STEPS = 1500


@dataclass(frozen=True)
class PretrainRecipe:
    """Everything that determines a base checkpoint.

    Besides the model, the data mixture (``p_reason``, term counts, digits) and the optimiser
    (AdamW, linear warm-up then cosine decay to ``min_lr_frac * lr``, global-norm clipping):

    * ``filler``, ``p_filler``, ``max_filler``, ``filler_position``: the filler variant of the
      task (:class:`~grpo_lab.tasks.ArithmeticTask`); ``""`` / 0 is the plain task;
    * ``max_new_tokens``: the task's generation budget (tokens), used to evaluate the checkpoint;
    * ``init``: ``""`` (train from the seeded random initialisation) or the name of a checkpoint
      under ``data/checkpoints`` with the same architecture and alphabet to fine-tune;
    * ``vocab_size``, ``seq_len``, ``p_format`` (``task="corpus"`` only): the byte-level BPE
      vocabulary, the length of the plain training windows in tokens, and the share of windows
      written in the next-token-reasoning format (context, ``<think></think>``, 1-3 tokens, EOS);
    * ``p_careful``, ``p_hasty`` (``task="long_chain"`` only): the shares of careful and hasty demonstrations
      (:class:`~grpo_lab.tasks.LongChainTask`; the rest direct; ``p_reason`` is not used);
    * ``p_tool``, ``p_second`` (``task="calculator"`` only): the share of demonstrations that call the
      calculator, and of those the share that call it twice (:class:`~grpo_lab.tasks.CalculatorTask`);
    * ``task="reverse"``: the own-task page's GPT-2 and warm start from ``book/examples/reverse_task.py``
      (:data:`REVERSE_TASK_FILE`); only ``steps``, ``batch_size``, ``lr`` (constant), ``seed`` and ``threads``
      are used and recorded.
    """

    task: str = "arithmetic"
    model: TinyConfig = field(default_factory=lambda: TinyConfig(hidden_size=96, intermediate_size=288,
                                                                 num_hidden_layers=3))
    p_reason: float = 0.3
    min_terms: int = 2
    max_terms: int = 4
    digits: int = 2
    steps: int = 1500
    batch_size: int = 128
    lr: float = 3e-3
    warmup: int = 100
    min_lr_frac: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 2
    filler: str = ""
    p_filler: float = 0.0
    max_filler: int = 0
    filler_position: str = "end"
    max_new_tokens: int = 32
    init: str = ""
    vocab_size: int = 1024
    seq_len: int = 64
    p_format: float = 0.5
    p_tool: float = 0.4
    p_second: float = 0.5
    p_careful: float = 0.5
    p_hasty: float = 0.3

    def to_dict(self) -> dict:
        """The recipe as a JSON-able dict, ``model`` expanded. The fields added after the first
        shipped checkpoint are recorded only when used: the filler fields (``filler`` …
        ``max_new_tokens``) when ``filler`` is set, ``init`` when set; so the ``recipe.json`` of
        checkpoints made before they existed still equals this dict."""
        d = asdict(self)
        d["model"] = self.model.to_dict()
        if not self.filler:  # the filler fields go together
            for k in ("filler", "p_filler", "max_filler", "filler_position", "max_new_tokens"):
                d.pop(k)
        if not self.init:
            d.pop("init")
        if self.task != "corpus":  # the corpus fields (added with chapter 7)
            for k in ("vocab_size", "seq_len", "p_format"):
                d.pop(k)
        if self.task != "calculator":  # the calculator fields (added with issue 56)
            for k in ("p_tool", "p_second"):
                d.pop(k)
        if self.task != "long_chain":  # the long-chain fields (added with issue 55)
            for k in ("p_careful", "p_hasty"):
                d.pop(k)
        else:
            d.pop("p_reason")
            d["max_new_tokens"] = self.max_new_tokens
        if self.task == "reverse":  # the own-task page's warm start: a constant lr, AdamW's defaults otherwise
            return {k: d[k] for k in ("task", "steps", "batch_size", "lr", "seed", "threads")}
        if self.task not in ("arithmetic", "long_chain"):
            for k in ("p_reason", "min_terms", "max_terms", "digits"):
                d.pop(k)
        return d


#: The ``long-chain`` recipe (:data:`RECIPES`), kept apart so that a twin on another model is one ``replace``.
_LONG_CHAIN = PretrainRecipe(task="long_chain", model=TinyConfig(hidden_size=96, intermediate_size=288, num_hidden_layers=3,
                                                                max_position_embeddings=256),
                             min_terms=3, max_terms=14, digits=1, max_new_tokens=180, p_careful=0.6, p_hasty=0.25,
                             init="arithmetic-base", steps=900, batch_size=64, lr=2e-3, warmup=30, threads=1)


#: The recipe of each shipped base checkpoint, by name — ``python -m grpo_lab.lab.pretrain NAME``
#: writes ``data/checkpoints/NAME-base``. ``arithmetic-filler`` fine-tunes ``arithmetic-base``
#: (``init``; it must exist) for 300 steps on demonstrations that end with a run of 1-12 dots
#: half of the time (mean 3.25 dots per demonstration), so it keeps that checkpoint's arithmetic
#: and learns to pad; its task's generation budget is 64 tokens, so that a padded reasoning
#: answer (at most 25 + 12 characters and EOS) fits with room for the length to grow under RL.
#: ``arithmetic-long`` is the same on runs of 1-320 dots in three quarters of the demonstrations, with a
#: 512-position context and a 360-token budget (VAPO's long responses, ``benchmarks/vapo_long.py``).
#: ``arithmetic-moe`` is ``arithmetic`` with a Qwen3-MoE-style model (8 experts of width 36, top 2,
#: about the dense model's parameter count: 339,888 against 338,016). ``calculator`` trains the dense model from
#: scratch on :class:`~grpo_lab.tasks.CalculatorTask` episodes (an alphabet with ``(`` ``)``), batches of 64, one
#: thread (two threads spin against each other on two shared cores). ``long-chain`` fine-tunes ``arithmetic-base``
#: on :class:`~grpo_lab.tasks.LongChainTask` demonstrations (60% careful, 25% hasty, the rest direct) in a
#: 256-position context; its budget, 180 tokens, cuts the careful chain of a 14-term sum (196-199 tokens). A
#: Mixture-of-Experts twin is one more line: ``replace(_LONG_CHAIN, model=<arithmetic-moe's model with
#: max_position_embeddings=256>, init="arithmetic-moe-base")``.
RECIPES = {
    "arithmetic": PretrainRecipe(),
    "arithmetic-filler": PretrainRecipe(filler=".", p_filler=0.5, max_filler=12, filler_position="end",
                                        max_new_tokens=64, init="arithmetic-base", steps=300, lr=1e-3,
                                        warmup=20),
    "arithmetic-long": PretrainRecipe(model=TinyConfig(hidden_size=96, intermediate_size=288, num_hidden_layers=3,
                                                       max_position_embeddings=512),
                                      filler=".", p_filler=0.75, max_filler=320, filler_position="end",
                                      max_new_tokens=360, init="arithmetic-base", steps=300, lr=1e-3, warmup=20),
    "arithmetic-moe": PretrainRecipe(model=TinyConfig(arch="qwen3_moe", hidden_size=96, intermediate_size=288,
                                                      num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
                                                      moe_intermediate_size=36)),
    "corpus": PretrainRecipe(task="corpus", model=TinyConfig(hidden_size=96, intermediate_size=288,
                                                             num_hidden_layers=3), steps=800, batch_size=32,
                             lr=3e-3, warmup=50, max_new_tokens=8),
    "corpus-proxy": PretrainRecipe(task="corpus", model=TinyConfig(hidden_size=64, intermediate_size=192,
                                                                   num_hidden_layers=2, num_attention_heads=2,
                                                                   num_key_value_heads=1),
                                   steps=600, batch_size=32, lr=3e-3, warmup=50, max_new_tokens=8),
    "reverse": PretrainRecipe(task="reverse", steps=REVERSE_STEPS, batch_size=64, lr=3e-3, threads=1),
    "calculator": PretrainRecipe(task="calculator", steps=CALCULATOR_STEPS, batch_size=64, threads=1),
    "long-chain": _LONG_CHAIN,
}


def make_task(recipe: PretrainRecipe) -> ArithmeticTask | CalculatorTask | LongChainTask:
    """The task whose demonstrations ``recipe`` trains on (and whose test set evaluates it).

    Raises:
        ValueError: ``recipe.task`` is not ``"arithmetic"``, ``"calculator"`` or ``"long_chain"``, or invalid task
            settings (as :class:`~grpo_lab.tasks.ArithmeticTask`, :class:`~grpo_lab.tasks.CalculatorTask`,
            :class:`~grpo_lab.tasks.LongChainTask`).
    """
    if recipe.task == "calculator":
        return CalculatorTask(p_tool=recipe.p_tool, p_second=recipe.p_second)
    if recipe.task == "long_chain":
        return LongChainTask(min_terms=recipe.min_terms, max_terms=recipe.max_terms, digits=recipe.digits,
                             max_new_tokens=recipe.max_new_tokens, p_careful=recipe.p_careful, p_hasty=recipe.p_hasty)
    if recipe.task != "arithmetic":
        raise ValueError(f"pretrain: make_task: no arithmetic task for task {recipe.task!r}")
    return ArithmeticTask(min_terms=recipe.min_terms, max_terms=recipe.max_terms, digits=recipe.digits,
                          p_reason=recipe.p_reason, max_new_tokens=recipe.max_new_tokens, filler=recipe.filler,
                          p_filler=recipe.p_filler, max_filler=recipe.max_filler,
                          filler_position=recipe.filler_position)


def reverse_example():
    """The example module ``book/examples/reverse_task.py`` (:data:`REVERSE_TASK_FILE`: ``ReverseTask``,
    ``build_policy``, ``warm_start``), imported under the module name ``reverse_task`` as ``--import``
    imports it (importing it registers the task ``"reverse"``); the module already imported under that
    name is reused.

    Raises:
        FileNotFoundError: the file is not there (an installed package without the repository's ``book/``).
    """
    import importlib.util
    import sys

    module = sys.modules.get("reverse_task")
    if module is None:
        if not REVERSE_TASK_FILE.is_file():
            raise FileNotFoundError(f"pretrain reverse: the example task {REVERSE_TASK_FILE} is not there; the reverse "
                                    "recipe runs in a source checkout of grpo_lab (it reads book/examples/)")
        spec = importlib.util.spec_from_file_location("reverse_task", REVERSE_TASK_FILE)
        module = importlib.util.module_from_spec(spec)
        sys.modules["reverse_task"] = module
        spec.loader.exec_module(module)
    return module


def _batch(task: ArithmeticTask, tokenizer, rng: np.random.Generator, n: int):
    """A right-padded SFT batch: prompt + response + EOS; loss only on response and EOS."""
    problems = task.sample(n, rng)
    ids, labels = [], []
    for p in problems:
        prompt = tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
        resp = tokenizer(task.demonstration(p, rng), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids.append(prompt + resp)
        labels.append([-100] * len(prompt) + resp)
    L = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([x + [pad] * (L - len(x)) for x in ids])
    attn = torch.tensor([[1] * len(x) + [0] * (L - len(x)) for x in ids])
    lab = torch.tensor([y + [-100] * (L - len(y)) for y in labels])
    return input_ids, attn, lab


class _Corpus:
    """Training windows of the corpus recipes: the tokenizer, the token stream of the ``pretrain``
    part (``train``) and of the ``test`` part (``held``), and seeded batches of ``train`` (plain
    windows and next-token-reasoning format windows)."""

    def __init__(self, recipe: PretrainRecipe, tokenizer=None, part: str = "pretrain"):
        from ..policy.models import train_bpe_tokenizer
        from ..tasks import next_token as nt

        self.docs = nt.load_corpus()
        self.parts = nt.split_corpus(self.docs)
        self.tokenizer = tokenizer if tokenizer is not None else train_bpe_tokenizer(
            [text for _, text in self.parts["pretrain"]], recipe.vocab_size,
            extra_special=(nt.THINK_OPEN, nt.THINK_CLOSE))
        tok = self.tokenizer
        self.think = [tok.convert_tokens_to_ids(nt.THINK_OPEN), tok.convert_tokens_to_ids(nt.THINK_CLOSE)]
        self.train = self.stream(part)
        self.held = self.stream("test")
        self.recipe = recipe

    def stream(self, part: str) -> np.ndarray:
        """The token ids of a part of the split, its chunks in order, each followed by EOS."""
        tok = self.tokenizer
        return np.concatenate([tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                               for _, text in self.parts[part]]).astype(np.int64)

    def batch(self, rng: np.random.Generator, n: int):
        r, L, ctx = self.recipe, self.recipe.seq_len, 32
        rows = []
        for _ in range(n):
            if rng.random() < r.p_format:  # context, <think></think>, the next 1-3 tokens, EOS
                k = int(rng.choice([1, 2, 3], p=[0.5, 0.3, 0.2]))
                t = int(rng.integers(ctx, len(self.train) - k))
                rows.append(list(self.train[t - ctx:t]) + self.think + list(self.train[t:t + k])
                            + [self.tokenizer.eos_token_id])
            else:
                s = int(rng.integers(0, len(self.train) - L))
                rows.append(list(self.train[s:s + L]))
        width = max(len(x) for x in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([x + [pad] * (width - len(x)) for x in rows])
        attn = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in rows])
        labels = torch.where(attn.bool(), ids, torch.full_like(ids, -100))
        return ids, attn, labels

    def held_out_loss(self, model, width: int = 64) -> float:
        """Mean next-token cross-entropy (nats) over the held-out topics, in windows of ``width``
        (:func:`grpo_lab.tasks.next_token.held_out_loss` on ``held``)."""
        from ..tasks.next_token import held_out_loss

        return held_out_loss(model, self.held, width=width)


def continue_ntp(policy, tokenizer, *, steps: int, part: str = "rl", batch_size: int = 32, lr: float = 3e-4,
                 seed: int = 0, recipe: str = "corpus", progress: bool = False, p_format: float | None = None,
                 precision: str = "float32") -> dict[str, list]:
    """Continue training a corpus model by next-token prediction, in place: chapter 7's *continued
    NTP* baseline (RPT's Eq. 1 on the text RPT trains on).

    The batches are the ``recipe``'s pretraining batches (``seq_len``-token windows of ``part``, a
    share ``p_format`` in the next-token-reasoning format) from ``numpy.random.default_rng(seed)``;
    AdamW with the recipe's betas, weight decay and ``grad_clip`` at a constant ``lr``. The policy is
    left in eval mode.

    Args:
        policy, tokenizer: a causal LM on the corpus tokenizer (``load_policy("corpus-base")``) and its tokenizer.
        steps: optimiser steps (``>= 0``).
        part: ``"rl"`` (default: the text RPT trains on), ``"pretrain"`` or ``"test"``.
        p_format: the share of format windows (``None``: the recipe's; ``0``: plain text, for a hub model).
        precision: autocast dtype as ``TrainerConfig.precision`` (``"float16"`` with a gradient scaler); the
            weights stay float32.

    Returns:
        ``{"loss": [...], "tokens": [...]}``: per step, the loss (nats per token) and the real tokens.

    Raises:
        ValueError: ``steps < 0``, ``batch_size < 1``, an unknown ``part`` or ``recipe``, or a non-corpus recipe.

    Warns:
        RuntimeWarning: this CPython's corpus differs from the one the task's data files were built
            from (``part`` is re-split from this one).
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"continue_ntp: steps must be an int >= 0, got {steps!r}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"continue_ntp: batch_size must be an int >= 1, got {batch_size!r}")
    r = RECIPES.get(recipe)
    if r is None or r.task != "corpus":
        raise ValueError(f"continue_ntp: recipe must name a corpus recipe ('corpus', 'corpus-proxy'), got {recipe!r}")
    from ..tasks.next_token import SPLIT_FRACTIONS

    if not isinstance(part, str) or part not in SPLIT_FRACTIONS:
        raise ValueError(f"continue_ntp: unknown part {part!r}; expected one of {list(SPLIT_FRACTIONS)}")
    if p_format is not None:
        if not (isinstance(p_format, (int, float)) and not isinstance(p_format, bool) and 0 <= p_format <= 1):
            raise ValueError(f"continue_ntp: p_format must be a number in [0, 1] or None, got {p_format!r}")
        r = replace(r, p_format=float(p_format))
    from ..training.trainer import resolve_precision

    dtype = resolve_precision(precision, policy.device)
    corpus = _Corpus(r, tokenizer=tokenizer, part=part)
    _warn_if_other_corpus(corpus.docs)
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=r.weight_decay, betas=(0.9, 0.98))
    scaler = torch.amp.GradScaler(policy.device.type, enabled=dtype == "float16")
    policy.train()
    out = {"loss": [], "tokens": []}
    for _ in range(steps):
        input_ids, attn, labels = corpus.batch(rng, batch_size)
        input_ids, attn, labels = (x.to(policy.device) for x in (input_ids, attn, labels))
        with _autocast(policy.device, dtype):
            loss = policy(input_ids=input_ids, attention_mask=attn, labels=labels, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(policy.parameters(), r.grad_clip)
        scaler.step(opt)  # skipped when float16 gradients overflowed
        scaler.update()
        out["loss"].append(float(loss.detach()))
        out["tokens"].append(int(attn.sum()))
    policy.eval()
    return out


def _autocast(device: torch.device, dtype: str):
    """``torch.autocast`` in ``dtype`` on ``device``'s type; a no-op for float32."""
    import contextlib

    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, dtype))


def _warn_if_other_corpus(docs) -> None:
    """A ``RuntimeWarning`` when ``docs`` is not the corpus the task's data files record."""
    import warnings

    from safetensors import safe_open

    from ..paths import data_dir
    from ..tasks.next_token import TRAIN_FILE, corpus_sha256

    path = data_dir() / "tasks" / TRAIN_FILE
    if not path.is_file():
        return
    with safe_open(str(path), "pt") as f:
        recorded = (f.metadata() or {}).get("corpus_sha256")
    if recorded and recorded != corpus_sha256(docs):
        warnings.warn("continue_ntp: this CPython's pydoc_data.topics differs from the corpus the next-token task's "
                      f"data files were built from (sha256 {recorded[:12]}...); the text trained on is re-split from "
                      "this one, so it is not exactly the text of the committed positions", RuntimeWarning, stacklevel=3)


def continued_ntp_run(seed: int, *, steps: int, base: str = "corpus-base", lr: float = 3e-4,
                      temperature: float = 0.8, batch_size: int = 32, threads: int | None = 1,
                      task_kwargs: dict | None = None, device: str = "cpu", precision: str = "float32",
                      p_format: float | None = None) -> dict:
    """One seed of chapter 7's continued-NTP baseline, in a fresh process or this one: load ``base``,
    :func:`continue_ntp` for ``steps`` steps on the ``rl`` part, then evaluate on the
    :class:`~grpo_lab.tasks.NextTokenTask` test positions, greedy and sampled (one sample at
    ``temperature``, torch seeded with ``seed``).

    Args:
        seed: seeds the NTP batches and the sampled evaluation.
        steps, lr, batch_size, precision, p_format: as :func:`continue_ntp` (the evaluation runs
            under the same autocast).
        base: checkpoint name or directory.
        temperature: of the sampled evaluation (RPT's 0.8).
        threads: ``torch.set_num_threads`` for this process (``None``: unchanged).
        task_kwargs: the evaluation's :class:`~grpo_lab.tasks.NextTokenTask` settings (default: the
            shipped task).
        device: where the model (float32) trains and is evaluated.

    Returns:
        ``{"seed", "steps", "tokens" (real tokens trained on), "loss_last" (mean loss of the last 10
        steps), "held_out_loss" (:func:`~grpo_lab.tasks.next_token.held_out_loss`, nats per token),
        "frame", "sampled_frame" (one row per test position), "summary", "sampled_summary"
        (:func:`grpo_lab.policy.rollout.evaluate`'s)}``.
    """
    from ..policy.models import load_policy
    from ..policy.rollout import evaluate as evaluate_policy
    from ..tasks.next_token import NextTokenTask, held_out_ids, held_out_loss

    from ..training.trainer import resolve_precision

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    policy, tokenizer = load_policy(checkpoint_dir(base) if checkpoint_dir(base).exists() else base, device=device,
                                    dtype=torch.float32)
    log = continue_ntp(policy, tokenizer, steps=steps, seed=seed, lr=lr, batch_size=batch_size, precision=precision,
                       p_format=p_format)
    task = NextTokenTask(**dict(task_kwargs or {}))
    with _autocast(policy.device, resolve_precision(precision, policy.device)):
        summary, frame = evaluate_policy(policy, tokenizer, task, greedy=True)
        torch.manual_seed(seed)
        sampled_summary, sampled = evaluate_policy(policy, tokenizer, task, greedy=False, temperature=temperature)
        held = held_out_loss(policy, held_out_ids(tokenizer))  # the text in the model's own tokens
    return {"seed": seed, "steps": steps, "tokens": int(sum(log["tokens"])),
            "loss_last": float(np.mean(log["loss"][-10:])) if log["loss"] else float("nan"), "held_out_loss": held,
            "frame": frame, "sampled_frame": sampled, "summary": summary, "sampled_summary": sampled_summary}


def _evaluate_corpus(model, corpus: _Corpus, name: str, out: Path, default_out: Path) -> dict:
    """Metrics of a corpus checkpoint: held-out loss; for ``corpus-proxy`` written to the default
    place, the task's data files; for ``corpus``, greedy next-token-reasoning accuracy on the test set."""
    from ..tasks import next_token as nt

    metrics = {"held_out_loss": round(corpus.held_out_loss(model), 4)}
    if name == "corpus-proxy" and out.resolve() == default_out.resolve():
        from ..paths import data_dir

        summary = nt.build_task_data(model, corpus.tokenizer, data_dir() / "tasks")
        metrics.update({k: summary[k] for k in ("train_tokens", "train_positions", "test_positions",
                                                "train_entropy_quantiles")})
    if name == "corpus":
        from ..policy.rollout import evaluate as evaluate_policy

        task = nt.NextTokenTask()
        task._tok = lambda: corpus.tokenizer  # type: ignore[method-assign]  # before the checkpoint is saved
        summary, frame = evaluate_policy(model, corpus.tokenizer, task, greedy=True)
        metrics["greedy_accuracy"] = round(summary["accuracy"], 4)
        metrics["greedy_mean_length"] = round(summary["mean_length"], 3)
        splits = nt.entropy_split(frame["entropy"].to_numpy())
        metrics["greedy_accuracy_by_split"] = {k: round(float(frame["correct"][m].mean()), 4)
                                               for k, m in splits.items() if m.any()}
    return metrics


def _lr_at(step: int, r: PretrainRecipe) -> float:
    if step < r.warmup:
        return r.lr * (step + 1) / r.warmup
    prog = (step - r.warmup) / max(1, r.steps - r.warmup)
    return r.lr * (r.min_lr_frac + (1 - r.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * prog)))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def evaluate_base(model, tokenizer, task) -> dict:
    """Greedy and sampled (T=1, 4 samples) test accuracy, lengths and reasoning rate, by term count."""
    from ..policy.rollout import evaluate

    torch.manual_seed(0)
    g, gframe = evaluate(model, tokenizer, task, greedy=True)
    s, sframe = evaluate(model, tokenizer, task, greedy=False, n_samples=4, temperature=1.0)
    by_terms = gframe.groupby("n_terms")["correct"].mean().round(4)
    s_by_terms = sframe.groupby("n_terms")["correct"].mean().round(4)
    extra = {}
    if getattr(task, "filler", ""):
        fill = sframe["completion"].map(task.filler_length)
        extra = {"sampled_filler_frac": round(float((fill > 0).mean()), 4),
                 "sampled_mean_filler": round(float(fill.mean()), 3),
                 "sampled_truncation_rate": round(float(sframe["truncated"].mean()), 4)}
    return {
        "greedy_accuracy": round(g["accuracy"], 4),
        "greedy_mean_length": round(g["mean_length"], 3),
        "greedy_reasoning_frac": round(g["reasoning_frac"], 4),
        "greedy_accuracy_by_terms": {int(k): float(v) for k, v in by_terms.items()},
        "sampled_accuracy": round(s["accuracy"], 4),
        "sampled_mean_length": round(s["mean_length"], 3),
        "sampled_reasoning_frac": round(s["reasoning_frac"], 4),
        "sampled_accuracy_by_terms": {int(k): float(v) for k, v in s_by_terms.items()},
        "sampled_length_sd": round(float(sframe["length"].std()), 3),
        **extra,
    }


def evaluate_reverse(model, tokenizer, task) -> dict:
    """Greedy and sampled (T=1, 4 samples) test accuracy and mean length (tokens) of a ``reverse``
    checkpoint on ``task``'s test set, greedy accuracy by word length (letters)."""
    from ..policy.rollout import evaluate

    torch.manual_seed(0)
    g, gframe = evaluate(model, tokenizer, task, greedy=True)
    s, _ = evaluate(model, tokenizer, task, greedy=False, n_samples=4, temperature=1.0)
    by_len = gframe.groupby(gframe["prompt"].str.len() - 1)["correct"].mean().round(4)
    return {"greedy_accuracy": round(g["accuracy"], 4), "greedy_mean_length": round(g["mean_length"], 3),
            "greedy_accuracy_by_length": {int(k): float(v) for k, v in by_len.items()},
            "sampled_accuracy": round(s["accuracy"], 4), "sampled_mean_length": round(s["mean_length"], 3)}


def pretrain(recipe: PretrainRecipe, out: str | Path | None = None, *, progress: bool = True,
             evaluate: bool = True, name: str | None = None) -> dict:
    """Train the base policy of ``recipe`` and save it (model, tokenizer, ``recipe.json``).

    Deterministic on a given machine and software stack: fixed seeds, fixed thread count,
    data drawn from a seeded ``numpy`` generator.

    Args:
        recipe: what to train.
        out: output directory (default ``data/checkpoints/<name>-base``; only then is the task's
            fixed test set written to ``data/tasks/`` too).
        progress: tqdm bar.
        evaluate: measure test accuracy after training (``metrics`` in the record; skipping it is
            only useful for quick tests).
        name: the checkpoint's name (a key of :data:`RECIPES`; default ``recipe.task``).

    Returns:
        The record written to ``recipe.json``.

    Raises:
        ValueError: an invalid recipe (as ``make_task``) or an empty ``name``.
    """
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ValueError(f"pretrain: name must be a non-empty string, got {name!r}")
    default_out = checkpoint_dir(f"{name or recipe.task}-base")
    out = Path(out) if out is not None else default_out
    if recipe.task == "reverse":
        return _pretrain_reverse(recipe, out, evaluate=evaluate)
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    rng = np.random.default_rng(recipe.seed)
    corpus = _Corpus(recipe) if recipe.task == "corpus" else None
    task = make_task(recipe) if corpus is None else None
    tokenizer = (corpus.tokenizer if corpus is not None else build_char_tokenizer(CALC_ALPHABET)
                 if recipe.task == "calculator" else build_char_tokenizer())
    model = tiny_policy(tokenizer, recipe.model, seed=recipe.seed)
    if recipe.init:  # fine-tune a shipped checkpoint of the same architecture and alphabet
        _load_init(model, tokenizer, recipe.init)
    losses, train_seconds = _train(model, recipe, task, tokenizer, corpus, rng,
                                   progress=progress, label=name or recipe.task)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if corpus is not None:
        metrics = _evaluate_corpus(model, corpus, name or recipe.task, out, default_out) if evaluate else None
    elif recipe.task == "calculator":
        metrics = _tool_card(model, tokenizer, task) if evaluate else None
    elif recipe.task == "long_chain":
        metrics = _long_chain_card(model, tokenizer, task) if evaluate else None
    else:
        metrics = evaluate_base(model, tokenizer, task) if evaluate else None
    if task is not None and out.resolve() == default_out.resolve():
        task.write_test_set()  # the fixed test set ships next to the base checkpoint
    record = _record(recipe, model, losses, metrics, train_seconds, out, corpus)
    (out / "recipe.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def _tool_card(model, tokenizer, task) -> dict:
    """The calculator checkpoint's card (:func:`grpo_lab.lab.tool_card.tool_card`)."""
    from .tool_card import tool_card

    return tool_card(model, tokenizer, task)


def _long_chain_card(model, tokenizer, task) -> dict:
    """The long-chain checkpoint's card (:func:`grpo_lab.lab.long_chain_card.long_chain_card`)."""
    from .long_chain_card import long_chain_card

    return long_chain_card(model, tokenizer, task)


def _pretrain_reverse(recipe: PretrainRecipe, out: Path, *, evaluate: bool) -> dict:
    """The ``reverse`` recipe: the own-task page's GPT-2 and warm start (``build_policy``, ``warm_start`` of
    :func:`reverse_example`) with the recipe's seed, steps, batch size and learning rate, saved to ``out``
    with its ``recipe.json`` (the model's config in ``model_config``)."""
    example = reverse_example()
    torch.set_num_threads(recipe.threads)
    model, tokenizer = example.build_policy(seed=recipe.seed)
    t0 = time.perf_counter()
    model.train()
    losses = example.warm_start(model, tokenizer, example.ReverseTask(), steps=recipe.steps,
                                batch_size=recipe.batch_size, lr=recipe.lr, seed=recipe.seed)
    train_seconds = time.perf_counter() - t0
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    metrics = evaluate_reverse(model, tokenizer, example.ReverseTask()) if evaluate else None
    record = _record(recipe, model, losses[-10:], metrics, train_seconds, out, None)
    record.pop("final_loss_mean_last100")
    record["final_loss_mean_last10"] = round(float(np.mean(losses[-10:])), 4)
    record["model_config"] = {k: getattr(model.config, k) for k in ("model_type", "vocab_size", "n_positions",
                                                                    "n_embd", "n_layer", "n_head")}
    record["source"] = "book/examples/reverse_task.py: build_policy, warm_start (the own-task page's warm start)"
    (out / "recipe.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def _load_init(model, tokenizer, init: str) -> None:
    """Load the shipped checkpoint ``init`` (same architecture and alphabet) into ``model``, or raise ValueError."""
    from ..policy.models import load_policy

    init_dir = checkpoint_dir(init)
    if not (init_dir / "model.safetensors").is_file():
        raise ValueError(f"pretrain: init checkpoint {init!r} not found at {init_dir}; make it first "
                         f"(python -m grpo_lab.lab.pretrain {init.removesuffix('-base')})")
    start, init_tok = load_policy(init_dir)
    if init_tok.get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"pretrain: init checkpoint {init!r} has another alphabet")
    try:
        model.load_state_dict(start.state_dict())
    except RuntimeError as exc:
        raise ValueError(f"pretrain: init checkpoint {init!r} does not match recipe.model ({exc})") from None
    del start


def _train(model, recipe: PretrainRecipe, task, tokenizer, corpus, rng, *, progress: bool,
           label: str) -> tuple[list, float]:
    """``recipe.steps`` AdamW steps of next-token loss on the task's (or the corpus's) batches drawn from ``rng``.

    Returns the loss of every step (floats) and the seconds the loop took.
    """
    moe_kwargs = {"output_router_logits": True} if recipe.model.is_moe else {}
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay, betas=(0.9, 0.98))
    t0 = time.perf_counter()
    losses = []
    it = range(recipe.steps)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc=f"pretrain {label}", mininterval=2.0)
    for step in it:
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, recipe)
        input_ids, attn, labels = (_batch(task, tokenizer, rng, recipe.batch_size) if corpus is None
                                   else corpus.batch(rng, recipe.batch_size))
        # a MoE model's loss includes its load-balancing term (router_aux_loss_coef of its config)
        loss = model(input_ids=input_ids, attention_mask=attn, labels=labels, use_cache=False, **moe_kwargs).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
        if progress and step % 100 == 0:
            it.set_postfix(loss=f"{np.mean(losses[-100:]):.3f}")
    return losses, time.perf_counter() - t0


def _record(recipe: PretrainRecipe, model, losses: list, metrics, train_seconds: float, out: Path, corpus) -> dict:
    """What ``recipe.json`` holds: the recipe, sizes, final loss, metrics, versions and checksums."""
    import transformers

    record = {
        "recipe": recipe.to_dict(),
        "parameters": count_parameters(model),
        "final_loss_mean_last100": round(float(np.mean(losses[-100:])), 4),
        "metrics": metrics,
        "train_seconds": round(train_seconds, 1),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "model_sha256": sha256_file(out / "model.safetensors"),
    }
    if corpus is not None:
        from ..tasks.next_token import corpus_sha256

        record["corpus"] = {"source": "pydoc_data.topics", "sha256": corpus_sha256(corpus.docs),
                            "split": {p: [k for k, _ in c] for p, c in corpus.parts.items()},
                            "pretrain_tokens": int(len(corpus.train)), "test_tokens": int(len(corpus.held))}
        record["tokenizer_sha256"] = sha256_file(out / "tokenizer.json")
    return record


def main(argv=None) -> None:
    """Command line ``python -m grpo_lab.lab.pretrain TASK [--out DIR] [--steps N] [--quiet]`` (see :data:`RECIPES`)."""
    ap = argparse.ArgumentParser(prog="python -m grpo_lab.lab.pretrain",
        description=__doc__.splitlines()[0].replace("``", ""),
        epilog="corpus-proxy also writes the next-token task's data files (data/tasks/next_token_*) when --out is not "
               "given; build it before corpus, whose evaluation reads them.")
    ap.add_argument("task", choices=sorted(RECIPES), metavar="NAME",
                    help="the recipe: " + ", ".join(sorted(RECIPES)) + " (writes data/checkpoints/NAME-base)")
    ap.add_argument("--out", default=None, help="output directory (default data/checkpoints/NAME-base)")
    ap.add_argument("--steps", type=int, default=None, help="override the recipe's steps (for quick tests)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    recipe = RECIPES[a.task]
    if a.steps is not None:
        from dataclasses import replace
        recipe = replace(recipe, steps=a.steps)
    rec = pretrain(recipe, a.out, progress=not a.quiet, name=a.task)
    print(json.dumps({k: rec[k] for k in ("parameters", "final_loss_mean_last100", "final_loss_mean_last10", "metrics",
                                         "train_seconds") if k in rec}, indent=2))


if __name__ == "__main__":
    main()
