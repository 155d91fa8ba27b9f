"""A memory model of one training step: the peak bytes of each phase, predicted from a model config.

:func:`predict_memory` takes a ``transformers`` config of a dense decoder (Qwen2 / Llama layout;
a ``PretrainedConfig`` or its dict) and the run's shapes (:class:`RunShape`) and returns a
:class:`MemoryEstimate`: each phase's bytes, and the peak = the persistent state (weights,
gradients, AdamW state, KL reference copy, critic) plus the largest transient phase (rollout,
evaluation, a training micro-batch's forward and backward, a no-grad scoring micro-batch).
:func:`fit_batch_sizes` picks the largest micro-batch and evaluation batch that fit a card
(:func:`usable_memory`), before any weight is loaded.

Assumptions, one line each (each phase function says more):

* master weights, gradients and AdamW's moments are float32 (16 bytes per trainable parameter),
  gradients held through the whole step (an overestimate outside the update);
* under autocast, one low-precision copy of every linear weight per policy forward (autocast's
  cast cache, kept by the autograd graph until the backward);
* activations counted tensor by tensor from HF's eager code with ``sdpa`` attention
  (:func:`layer_activation_bytes`), vocabulary-sized buffers as :func:`logprob_bytes` lists;
* the rollout keeps no ``[B, T, V]`` logits, evaluation no log-probs;
* not counted: the CUDA context and allocator fragmentation (a margin in :func:`usable_memory`),
  the tokenizer, the data, Python.

Checked against CPU measurements at scaled-down shapes by ``benchmarks/memory_model.py`` and
``tests/experiments/test_memory_model.py``. ``python -m grpo_lab.experiments.memory_model`` prints the GPU
profile's phases on Qwen2.5-0.5B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["ModelDims", "RunShape", "MemoryEstimate", "PERSISTENT", "TRANSIENT", "QWEN25_05B_CONFIG",
           "PROJECTIONS", "layer_activation_bytes", "logprob_bytes", "predict_memory", "usable_memory",
           "fit_batch_sizes"]

#: Phases held through the whole step (their bytes add up).
PERSISTENT = ("weights", "gradients", "adam", "reference", "critic")
#: Phases that come one after the other (the step's peak adds the largest to the persistent ones).
TRANSIENT = ("rollout", "evaluation", "train_micro", "score_micro", "optimizer_step")

#: The architecture fields of ``Qwen/Qwen2.5-0.5B-Instruct``'s ``config.json`` (the GPU profile's
#: model): 494,032,768 parameters with the tied embedding. For tables and defaults; no weights.
QWEN25_05B_CONFIG = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                     "tie_word_embeddings": True}

_LOW = {"bfloat16": 2, "float16": 2, "float32": 4}
#: The linear projections of a decoder layer that LoRA can adapt (``RunShape.lora_targets``).
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelDims:
    """The sizes of a dense decoder that memory depends on, read from a ``transformers`` config.

    Attributes:
        hidden: ``hidden_size`` H. layers: ``num_hidden_layers`` L. heads: ``num_attention_heads``.
        kv_heads: ``num_key_value_heads`` (default ``heads``). head_dim: ``head_dim`` (default H / heads).
        intermediate: ``intermediate_size`` I of the gated MLP. vocab: ``vocab_size`` V.
        tied: ``tie_word_embeddings`` (the lm_head is the embedding matrix).
        qkv_bias: q/k/v projections have a bias (Qwen2 always; Llama when ``attention_bias``).
    """

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool

    @classmethod
    def from_config(cls, config: Any) -> "ModelDims":
        """From a ``PretrainedConfig`` or a dict with its fields (a config.json).

        Raises:
            ValueError: a required field (hidden_size, num_hidden_layers, num_attention_heads,
                intermediate_size, vocab_size) is missing or not a positive int, naming it;
                ``num_key_value_heads`` that does not divide ``num_attention_heads``; a
                Mixture-of-Experts config (``num_experts`` / ``num_local_experts``), which this
                dense model does not describe.
        """
        get = config.get if isinstance(config, Mapping) else (lambda k, d=None: getattr(config, k, d))
        if get("num_experts") or get("num_local_experts"):
            raise ValueError("ModelDims: a Mixture-of-Experts config; the memory model covers dense decoders only")
        need = {}
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
            v = get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ModelDims: the config's {key} must be a positive int, got {v!r}")
            need[key] = v
        heads = need["num_attention_heads"]
        kv = get("num_key_value_heads") or heads
        if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or heads % kv:
            raise ValueError(f"ModelDims: num_key_value_heads must be a positive int dividing num_attention_heads "
                             f"({heads}), got {kv!r}")
        head_dim = get("head_dim") or need["hidden_size"] // heads
        bias = get("model_type") == "qwen2" or bool(get("attention_bias", False))
        return cls(need["hidden_size"], need["num_hidden_layers"], heads, int(kv), int(head_dim),
                   need["intermediate_size"], need["vocab_size"], bool(get("tie_word_embeddings", False)), bias)

    def layer_params(self) -> dict[str, int]:
        """Parameters of one decoder layer by module: ``q_proj``, ``k_proj``, ``v_proj`` (weights
        and, with ``qkv_bias``, biases), ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj`` (no
        biases) and ``norms`` (two RMSNorm weights of H)."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        b = 1 if self.qkv_bias else 0
        return {"q_proj": h * q + b * q, "k_proj": h * kv + b * kv, "v_proj": h * kv + b * kv, "o_proj": q * h,
                "gate_proj": h * i, "up_proj": h * i, "down_proj": i * h, "norms": 2 * h}

    def params(self) -> int:
        """All parameters: embedding V·H, L layers (:meth:`layer_params`), the final norm H and,
        untied, the lm_head V·H (a tied lm_head is the embedding, counted once)."""
        return self.backbone_params() + (0 if self.tied else self.vocab * self.hidden)

    def backbone_params(self) -> int:
        """Parameters of the backbone (``model.base_model``: embedding, layers, final norm), which a
        critic built by :meth:`grpo_lab.policy.models.CriticModel.from_policy` copies."""
        return self.vocab * self.hidden + self.layers * sum(self.layer_params().values()) + self.hidden

    def linear_params(self) -> int:
        """Parameters of the ``nn.Linear`` layers (the weights autocast casts): every projection of
        every layer and the lm_head (V·H, also when tied to the embedding)."""
        per = sum(v for k, v in self.layer_params().items() if k != "norms")
        return self.layers * per + self.vocab * self.hidden

    def lora_params(self, rank: int, targets: tuple = PROJECTIONS) -> int:
        """Adapter parameters of LoRA of rank ``rank`` on the named projections of every layer:
        ``rank·(in + out)`` per adapted ``nn.Linear`` (the A and B matrices; no bias).

        Raises:
            ValueError: ``rank`` not a positive int, or a target that is not a projection name.
        """
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"lora_params: rank must be a positive int, got {rank!r}")
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                  "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        bad = [t for t in targets if t not in shapes]
        if bad:
            raise ValueError(f"lora_params: unknown target modules {bad}; known: {sorted(shapes)}")
        return self.layers * sum(rank * sum(shapes[t]) for t in targets)


@dataclass(frozen=True)
class RunShape:
    """The shapes and settings of a run that memory depends on.

    Attributes:
        rows: completions per rollout (prompts per step × G), all generated at once.
        prompt_len: prompt tokens per row after left padding (the longest prompt of the batch).
        max_new_tokens: the generation budget T; rows run to it (the worst case).
        micro_batch_size: rows per training forward/backward and per no-grad scoring forward.
        eval_batch_size: rows per greedy evaluation batch.
        eval_prompt_len: prompt tokens of an evaluation batch (default ``prompt_len``).
        autocast: ``"bfloat16"``, ``"float16"`` or ``"float32"`` (none): the forwards', KV cache's
            and logits' dtype.
        kl_reference: a float32 frozen copy of the policy is kept (a KL term, without LoRA).
        critic: a value model copied from the policy's backbone (``value_init="policy"``).
        lora_rank: 0 = full fine-tuning; else LoRA of this rank on ``lora_targets`` (frozen base, no
            reference copy).
        lora_targets: the adapted projections.
        gradient_checkpointing: HF non-reentrant checkpointing: each layer keeps only its input.
        logprob_chunk: the log-prob and entropy calls' ``chunk_size`` (rows of ``[·, V]``); ``"auto"``:
            :func:`grpo_lab.policy.rollout.logprob_chunk_rows`; ``None``: one block.
        entropy: the training forward also computes the entropy (the trainer does).
        sample_buffers: float32 ``[rows, V]`` buffers alive at once in a sampled decoding step.
        greedy_buffers: the same for a greedy evaluation step.
    """

    rows: int
    prompt_len: int
    max_new_tokens: int
    micro_batch_size: int
    eval_batch_size: int = 256
    eval_prompt_len: int | None = None
    autocast: str = "bfloat16"
    kl_reference: bool = False
    critic: bool = False
    lora_rank: int = 0
    lora_targets: tuple = PROJECTIONS
    gradient_checkpointing: bool = False
    logprob_chunk: int | None | str = "auto"
    entropy: bool = True
    sample_buffers: int = 5
    greedy_buffers: int = 3

    def __post_init__(self):
        for name in ("rows", "prompt_len", "max_new_tokens", "micro_batch_size", "eval_batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"RunShape: {name} must be a positive int, got {v!r}")
        if self.autocast not in _LOW:
            raise ValueError(f"RunShape: autocast must be one of {sorted(_LOW)}, got {self.autocast!r}")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ValueError(f"RunShape: lora_rank must be an int >= 0 (0: no LoRA), got {self.lora_rank!r}")
        chunk = self.logprob_chunk
        if chunk not in (None, "auto") and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise ValueError(f"RunShape: logprob_chunk must be 'auto', None or a positive int, got {chunk!r}")


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted bytes per phase of a training step.

    Attributes:
        phases: ``{phase: bytes}`` for every name of :data:`PERSISTENT` and :data:`TRANSIENT`.
        params: parameters of the policy; trainable: those that get gradients and AdamW state.
        notes: per phase, the terms that make it up (``{phase: {term: bytes}}``).
    """

    phases: dict
    params: int
    trainable: int
    notes: dict = field(default_factory=dict)

    @property
    def persistent(self) -> int:
        """The sum of the :data:`PERSISTENT` phases (bytes held through the whole step)."""
        return sum(self.phases[k] for k in PERSISTENT)

    @property
    def peak_phase(self) -> str:
        """The transient phase with the most bytes."""
        return max(TRANSIENT, key=lambda k: self.phases[k])

    @property
    def peak(self) -> int:
        """:attr:`persistent` plus the largest transient phase (the step's peak, in bytes)."""
        return self.persistent + self.phases[self.peak_phase]

    def table(self) -> str:
        """A Markdown table of the phases in GiB, the peak last."""
        rows = [f"| {k} | {'held' if k in PERSISTENT else 'transient'} | {v / 2**30:.2f} |" for k, v in self.phases.items()]
        return "\n".join(["| phase | kind | GiB |", "|---|---|---|", *rows,
                          f"| **peak** ({self.peak_phase}) | | **{self.peak / 2**30:.2f}** |"])


def layer_activation_bytes(d: ModelDims, autocast: str) -> int:
    """Bytes one decoder layer keeps for the backward, per token, in HF's eager Qwen2/Llama code.

    Per token, with ``f`` = 4 (the float32 residual stream) and ``e`` = the autocast dtype's size
    (4 without autocast):

    * each of the two RMSNorms: its float32 input and normalised input (``x``, ``x·rsqrt``: 2·H·f)
      and its output as the next projections read it (cast to ``e`` under autocast: H·e);
    * attention: q, k and v as SDPA gets them (after RoPE; k and v repeated to all heads by
      ``repeat_kv``), SDPA's output and ``o_proj``'s contiguous input: 5·heads·head_dim·e;
    * MLP: ``gate_proj``'s output (SiLU's input), SiLU's output, ``up_proj``'s output and the
      product (``down_proj``'s input): 4·I·e.
    """
    e, f = _LOW[autocast], 4
    h, q = d.hidden, d.heads * d.head_dim
    return 2 * (2 * h * f + h * e) + 5 * q * e + 4 * d.intermediate * e


def logprob_bytes(rows: int, tokens: int, vocab: int, autocast: str, *, chunk: int | None,
                  entropy: bool, backward: bool) -> dict[str, int]:
    """Vocabulary-sized buffers of :func:`grpo_lab.policy.rollout.policy_logprobs` on ``rows`` rows of
    ``tokens`` completion tokens, in bytes: the logits the model returns (``logits_to_keep = T + 1``,
    in the autocast dtype, kept for the backward) and, on top of them, the peak of the log-prob
    pass. ``n = rows·T·V`` elements in one block (``chunk=None``) or ``chunk·V`` per chunk.

    * forward, :func:`grpo_lab.policy.logprobs.token_logprobs`: one float32 block (the upcast, shifted logits);
    * ``entropy``: :func:`grpo_lab.policy.logprobs.entropy_from_logits` under no-grad holds four float32
      blocks at once (log p, p, p·log p and the ``where`` that zeroes 0·log 0) and a bool one (p > 0);
    * ``backward``: the ``[rows, T, V]`` gradient of the logits (logits' dtype), a float32 block
      when the logits are not float32, then the slice ``logits[:, :-1]``'s backward writes a second
      full-size gradient (``[rows, T+1, V]``).

    Returns:
        ``{"logits": bytes, "forward": bytes, "backward": bytes}`` (``backward`` 0 without it).
    """
    e = _LOW[autocast]
    full = rows * tokens * vocab
    block = full if chunk is None else min(full, chunk * vocab)
    logits = rows * (tokens + 1) * vocab * e
    forward = block * 4 * (1 if not entropy else 4) + (block if entropy else 0)
    back = 0
    if backward:
        back = max(full * e + (block * 4 if e != 4 else 0), full * e + logits)
    return {"logits": logits, "forward": forward, "backward": back}


def _state_phases(d: ModelDims, s: RunShape) -> tuple[dict, int, int]:
    """``({weights, gradients, adam, reference, critic}, params, trainable)`` in bytes: float32
    weights (base + adapters), 4 bytes of gradient and 8 of AdamW moments per trainable parameter,
    a float32 reference copy (KL, no LoRA) and a critic on a copy of the backbone with a scalar head
    (H + 1) at 16 bytes per parameter (weights, gradient, AdamW)."""
    n = d.params()
    adapters = d.lora_params(s.lora_rank, tuple(s.lora_targets)) if s.lora_rank else 0
    trainable = adapters if s.lora_rank else n
    critic = (d.backbone_params() + d.hidden + 1) * 16 if s.critic else 0
    phases = {"weights": (n + adapters) * 4, "gradients": trainable * 4, "adam": trainable * 8,
              "reference": n * 4 if (s.kl_reference and not s.lora_rank) else 0, "critic": critic}
    return phases, n, trainable


def _autocast_copies(d: ModelDims, s: RunShape) -> int:
    """Bytes of autocast's cached low-precision copies of the policy's linear weights (0 without
    autocast; with LoRA only the trainable adapters require grad and are cached, so the frozen base
    weights are cast layer by layer: one layer's worth, counted as the lm_head, the largest)."""
    e = _LOW[s.autocast]
    if e == 4:
        return 0
    if s.lora_rank:
        return (d.lora_params(s.lora_rank, tuple(s.lora_targets)) + d.vocab * d.hidden) * e
    return d.linear_params() * e


def _generation(d: ModelDims, s: RunShape, rows: int, prompt: int, buffers: int) -> dict[str, int]:
    """Terms of one ``generate`` call of ``rows`` rows, ``prompt`` prompt tokens, ``max_new_tokens``:

    * ``kv_cache``: keys and values of every layer for every position, L·rows·(P+T)·kv_heads·head_dim·(4 + e):
      values in the autocast dtype (``e`` bytes, the projection's output), keys in float32 (4 bytes)
      because the rotary embedding multiplies the autocast keys by the float32 cos / sin of a float32
      model (type promotion, outside autocast's op list);
    * ``cache_growth``: HF's ``DynamicCache`` appends by ``torch.cat``: one layer's new keys and
      values exist beside the old ones, rows·(P+T)·kv_heads·head_dim·(4 + e);
    * ``step_buffers``: ``buffers`` float32 ``[rows, V]`` tensors of a decoding step (the last
      position's logits upcast by ``generate``, the temperature-scaled copy, the per-step
      log-softmax of the behaviour log-probs, the softmax probabilities, ...);
    * ``prefill``: the prompt's forward (``logits_to_keep=1``) at its peak instead of the three terms
      above: the prompt's cache plus one MLP's no-grad working set, rows·P·(3·I·e + 4·H·4);
    * ``autocast_copies``: see :func:`_autocast_copies`.
    """
    e = _LOW[s.autocast]
    kv = d.kv_heads * d.head_dim
    total = prompt + s.max_new_tokens
    per_position = kv * (4 + e)  # float32 keys (rotary embedding of a float32 model), values in the autocast dtype
    cache = d.layers * rows * total * per_position
    growth = rows * total * per_position
    step = buffers * rows * d.vocab * 4
    prefill = d.layers * rows * prompt * per_position + rows * prompt * (3 * d.intermediate * e + 4 * d.hidden * 4)
    return {"kv_cache": cache, "cache_growth": growth, "step_buffers": step, "prefill": prefill,
            "autocast_copies": _autocast_copies(d, s)}


def _chunk(s: RunShape, rows: int, vocab: int) -> int | None:
    """The log-prob ``chunk_size`` of ``rows`` rows: ``s.logprob_chunk``, or with ``"auto"`` what
    :func:`grpo_lab.policy.rollout.policy_logprobs` chooses for ``rows × max_new_tokens × vocab`` logits."""
    if s.logprob_chunk != "auto":
        return s.logprob_chunk
    from ..policy.rollout import logprob_chunk_rows

    return logprob_chunk_rows(rows, s.max_new_tokens, vocab)


def _train_micro(d: ModelDims, s: RunShape) -> dict[str, int]:
    """Terms of one training micro-batch (``micro_batch_size`` rows of P + T tokens): the layers'
    saved activations (:func:`layer_activation_bytes` for every layer; with gradient checkpointing
    every layer's float32 input H·4 plus one layer recomputed in the backward), the final norm
    (2·H·4 + H·e per token), the logits and log-prob buffers (:func:`logprob_bytes`, with the
    entropy and the backward) and the autocast copies of the weights (:func:`_autocast_copies`)."""
    e = _LOW[s.autocast]
    b, tokens = s.micro_batch_size, s.prompt_len + s.max_new_tokens
    per_layer = layer_activation_bytes(d, s.autocast)
    if s.gradient_checkpointing:
        acts = b * tokens * (d.layers * d.hidden * 4 + per_layer)
    else:
        acts = b * tokens * d.layers * per_layer
    lp = logprob_bytes(b, s.max_new_tokens, d.vocab, s.autocast, chunk=_chunk(s, b, d.vocab), entropy=s.entropy,
                       backward=True)
    return {"activations": acts, "final_norm": b * tokens * (2 * d.hidden * 4 + d.hidden * e),
            "logits": lp["logits"], "logprob_peak": max(lp["forward"], lp["backward"]),
            "autocast_copies": _autocast_copies(d, s)}


def _score_micro(d: ModelDims, s: RunShape) -> dict[str, int]:
    """Terms of one no-grad π_old / π_ref forward of ``micro_batch_size`` rows: one layer's no-grad
    working set (as the prefill's, :func:`_generation`), the logits and one float32 log-prob block
    (no entropy, no backward), and the autocast copies of the policy's weights (the reference's do
    not require grad and are not cached)."""
    b, tokens = s.micro_batch_size, s.prompt_len + s.max_new_tokens
    lp = logprob_bytes(b, s.max_new_tokens, d.vocab, s.autocast, chunk=_chunk(s, b, d.vocab), entropy=False,
                       backward=False)
    work = b * tokens * (3 * d.intermediate * _LOW[s.autocast] + 4 * d.hidden * 4)
    return {"layer_work": work, "logits": lp["logits"], "logprob_peak": lp["forward"],
            "autocast_copies": _autocast_copies(d, s)}


def _generation_peak(terms: Mapping[str, int]) -> int:
    """The peak of :func:`_generation`'s terms: the larger of the prefill and the last decoding step."""
    last = terms["kv_cache"] + terms["cache_growth"] + terms["step_buffers"]
    return max(terms["prefill"], last) + terms["autocast_copies"]


def predict_memory(config: Any, shape: RunShape) -> MemoryEstimate:
    """Predicted bytes of each phase of one training step of the model ``config`` at ``shape``.

    Args:
        config: a ``transformers`` ``PretrainedConfig`` of a dense decoder, or a dict of its fields
            (:class:`ModelDims` reads them).
        shape: the run's shapes and settings.

    Returns:
        A :class:`MemoryEstimate`: ``phases`` has ``weights``, ``gradients``, ``adam``, ``reference``,
        ``critic`` (held, ``_state_phases``) and ``rollout`` (``rows`` rows), ``evaluation``
        (``eval_batch_size`` rows, greedy), ``train_micro``, ``score_micro``, ``optimizer_step``
        (AdamW's float32 temporary, 4 bytes per trainable parameter) (transient), each in bytes;
        ``notes`` their terms; ``peak`` the step's peak.

    Raises:
        ValueError: as :meth:`ModelDims.from_config`; ``shape`` not a :class:`RunShape`.
    """
    if not isinstance(shape, RunShape):
        raise ValueError(f"predict_memory: shape must be a RunShape, got {type(shape).__name__}")
    d = ModelDims.from_config(config)
    phases, n, trainable = _state_phases(d, shape)
    gen = _generation(d, shape, shape.rows, shape.prompt_len, shape.sample_buffers)
    ev = _generation(d, shape, shape.eval_batch_size, shape.eval_prompt_len or shape.prompt_len, shape.greedy_buffers)
    train, score = _train_micro(d, shape), _score_micro(d, shape)
    # AdamW's foreach step: one float32 temporary per trainable parameter (sqrt of the second moment)
    phases.update(rollout=_generation_peak(gen), evaluation=_generation_peak(ev), train_micro=sum(train.values()),
                  score_micro=sum(score.values()), optimizer_step=4 * trainable)
    return MemoryEstimate(phases, n, trainable,
                          {"rollout": gen, "evaluation": ev, "train_micro": train, "score_micro": score})


def usable_memory(total: int, *, reserve: int = 2**30, fraction: float = 0.9) -> int:
    """Bytes of a card of ``total`` bytes that the model's tensors may fill: ``(total - reserve) ×
    fraction``. ``reserve`` (1 GiB) stands for the CUDA context, cuBLAS / cuDNN workspaces and
    kernels, which ``torch.cuda.max_memory_allocated`` does not count; ``fraction`` (0.9) for the
    caching allocator's fragmentation. A margin chosen, not measured.

    Raises:
        ValueError: ``total`` not a positive int, or no memory left after the reserve.
    """
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(f"usable_memory: total must be a positive int (bytes), got {total!r}")
    if total <= reserve:
        raise ValueError(f"usable_memory: a card of {total / 2**30:.2f} GiB has nothing left after the "
                         f"{reserve / 2**30:.2f} GiB reserve")
    return int((total - reserve) * fraction)


def _fits(config: Any, shape: RunShape, usable: int, phase: str) -> bool:
    """Whether the persistent state plus ``phase`` of ``shape`` fit in ``usable`` bytes."""
    est = predict_memory(config, shape)
    return est.persistent + est.phases[phase] <= usable


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _pick(config: Any, shape: RunShape, usable: int, setting: str, phases: tuple, candidates: tuple) -> int | None:
    """The largest of ``candidates`` for the field ``setting`` of ``shape`` whose ``phases`` all fit."""
    from dataclasses import replace

    for c in sorted(candidates, reverse=True):
        trial = replace(shape, **{setting: c})
        if all(_fits(config, trial, usable, p) for p in phases):
            return c
    return None


def _micro_advice(config: Any, shape: RunShape, usable: int, max_micro: int) -> str:
    """What would make a training micro-batch fit: a smaller ``micro_batch_size``, gradient
    checkpointing (with the micro-batch it allows), or LoRA."""
    from dataclasses import replace

    phases = ("train_micro", "score_micro")
    cands = tuple(2**k for k in range(int(math.log2(max(max_micro, 1))) + 1))
    m = _pick(config, shape, usable, "micro_batch_size", phases, cands)
    if m is not None:
        return f"micro_batch_size={m}"
    if not shape.gradient_checkpointing:
        m = _pick(config, replace(shape, gradient_checkpointing=True), usable, "micro_batch_size", phases, cands)
        if m is not None:
            return f"gradient_checkpointing=True with micro_batch_size={m}"
    return "LoRA (frozen base weights: no gradients or AdamW state for them) or a larger GPU"


def fit_batch_sizes(config: Any, shape: RunShape, total_memory: int, *, max_micro: int | None = None,
                    fixed_micro: bool = False, fixed_eval: bool = False, what: str = "memory model") -> tuple[int, int]:
    """The largest ``micro_batch_size`` and ``eval_batch_size`` for which every phase of ``shape``
    fits a card of ``total_memory`` bytes (:func:`usable_memory` of it), or a ``ValueError`` that
    names the phase that does not fit and the setting that would make it fit.

    Args:
        config: as :func:`predict_memory`. shape: the run (its batch sizes are the ones kept when fixed).
        total_memory: the card's memory in bytes (``torch.cuda.get_device_properties(dev).total_memory``).
        max_micro: the largest micro-batch worth trying (rows per minibatch; default ``shape.rows``);
            candidates are the powers of two up to it.
        fixed_micro, fixed_eval: the user chose ``micro_batch_size`` / ``eval_batch_size``: keep it
            and fail if it does not fit, instead of choosing.
        what: the caller's name, at the start of error messages.

    Returns:
        ``(micro_batch_size, eval_batch_size)``.

    Raises:
        ValueError: the persistent state or the rollout does not fit whatever the batch sizes (use
            LoRA or fewer rows); a (chosen) micro-batch or evaluation batch does not fit, naming
            ``micro_batch_size`` / ``gradient_checkpointing`` / ``eval_batch_size`` values that would.
    """
    usable = usable_memory(total_memory)
    est = predict_memory(config, shape)
    card = f"a {_gib(total_memory)} card ({_gib(usable)} usable)"
    lora = "LoRA (gpu_profile(lora=...), --lora-r), " if not shape.lora_rank else ""
    if est.persistent > usable:
        held = ("the weights, gradients and optimiser state" if not shape.lora_rank else
                "the float32 weights of the frozen base (4 bytes per parameter: the trainer keeps float32 weights) "
                "with the adapters' gradients and optimiser state")
        raise ValueError(f"{what}: {held} alone take {_gib(est.persistent)} on {card}: use {lora}a smaller model "
                         "or a larger GPU")
    if est.persistent + est.phases["rollout"] > usable:
        raise ValueError(f"{what}: the rollout of {shape.rows} rows x {shape.prompt_len}+{shape.max_new_tokens} tokens "
                         f"needs {_gib(est.persistent + est.phases['rollout'])} on {card}: use {lora}fewer rows "
                         "(prompts_per_step x group_size) or a shorter budget (max_new_tokens)")
    max_micro = max_micro or shape.rows
    micro_phases = ("train_micro", "score_micro")
    if fixed_micro:
        micro = shape.micro_batch_size
        if not all(_fits(config, shape, usable, p) for p in micro_phases):
            raise ValueError(f"{what}: phase train_micro with micro_batch_size={micro} needs "
                             f"{_gib(est.persistent + est.phases['train_micro'])} on {card}; it fits with "
                             f"{_micro_advice(config, shape, usable, max_micro)}")
    else:
        cands = tuple(2**k for k in range(int(math.log2(max_micro)) + 1))
        micro = _pick(config, shape, usable, "micro_batch_size", micro_phases, cands)
        if micro is None:
            raise ValueError(f"{what}: phase train_micro does not fit on {card} even with micro_batch_size=1; it fits "
                             f"with {_micro_advice(config, shape, usable, max_micro)}")
    ev = _fit_eval(config, shape, usable, fixed_eval, f"{what}: phase evaluation", card)
    return micro, ev


def _fit_eval(config: Any, shape: RunShape, usable: int, fixed: bool, what: str, card: str) -> int:
    """``eval_batch_size`` for :func:`fit_batch_sizes`: kept when ``fixed`` (ValueError if it does not
    fit, naming the largest that does), else the largest power of two up to it that fits."""
    cands = tuple(2**k for k in range(int(math.log2(shape.eval_batch_size)) + 1))
    best = _pick(config, shape, usable, "eval_batch_size", ("evaluation",), cands)
    if fixed and not _fits(config, shape, usable, "evaluation"):
        fix = f"eval_batch_size={best}" if best else "LoRA or a larger GPU"
        raise ValueError(f"{what} with eval_batch_size={shape.eval_batch_size} does not fit on {card}; it fits with {fix}")
    if best is None:
        raise ValueError(f"{what} does not fit on {card} even with eval_batch_size=1: use LoRA or a larger GPU")
    return shape.eval_batch_size if fixed else best


def main(argv: list | None = None) -> int:
    """``python -m grpo_lab.experiments.memory_model``: the phases of the GPU profile's shapes on Qwen2.5-0.5B
    (:data:`QWEN25_05B_CONFIG`), as a Markdown table: 128 rows, 256 prompt + 512 new tokens,
    micro-batches of 4, evaluation batches of 64 (the profile's defaults), bfloat16 autocast, a KL reference."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--eval-batch", type=int, default=64)
    p.add_argument("--autocast", default="bfloat16", choices=sorted(_LOW))
    p.add_argument("--checkpointing", action="store_true")
    args = p.parse_args(argv)
    shape = RunShape(rows=128, prompt_len=256, max_new_tokens=512, micro_batch_size=args.micro,
                     eval_batch_size=args.eval_batch, autocast=args.autocast, kl_reference=True,
                     gradient_checkpointing=args.checkpointing)
    print(f"Qwen2.5-0.5B, {shape.rows} rows x {shape.prompt_len} prompt + {shape.max_new_tokens} new tokens, "
          f"micro-batches of {shape.micro_batch_size}, evaluation batches of {shape.eval_batch_size}, "
          f"{shape.autocast} autocast, float32 weights, a KL reference copy"
          f"{', gradient checkpointing' if shape.gradient_checkpointing else ''} (predicted, bytes in GiB):\n")
    print(predict_memory(QWEN25_05B_CONFIG, shape).table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
