"""Group sampling with ``transformers`` ``generate`` and the policy forward pass used in training.

A :class:`Rollout` holds everything the objective needs about one batch of generated
responses: prompt and completion ids, the completion mask (1 up to and including the first stop
token), the behaviour log-probs recorded at sampling time, and truncation flags. Sequences of
one group are contiguous: ``[q0 s0, q0 s1, …, q0 s{G-1}, q1 s0, …]``, the layout every function
of :mod:`grpo_lab.algo.advantages` and :mod:`grpo_lab.algo.objectives` assumes.

Padding: prompts are **left**-padded (so that generation starts at the same column for every
row), completions are **right**-padded. Position ids are ``cumsum(attention_mask) - 1``, the
same rule ``generate`` uses, so the training forward pass reproduces the sampling
distribution exactly (tested).

Stop tokens: the tokenizer's EOS and every id the model's ``generation_config.eos_token_id``
declares (chat models declare several, e.g. ``<|endoftext|>`` and ``<|im_end|>``); "EOS" below
means any of them.

Where this departs from the papers' setting: they sample with an inference engine (vLLM) whose
log-probs can differ from the trainer's (the training/inference mismatch DeepSeek-V3.2 and
MiniMax-M1 discuss); here ``generate`` and the training forward run the same model in the same
precision, so behaviour and recomputed log-probs agree up to kernel rounding. Sampling uses only
the settings passed here: processors a checkpoint's ``generation_config`` carries (repetition
penalty, ...) are switched off with a warning, because the behaviour log-probs must describe the
distribution actually sampled from.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from .logprobs import check_truncation, entropy_from_logits, restrict_to_kept, sampling_kept_ids, token_logprobs
from ..tasks.base import Problem, correctness
from ..algo.checks import positive_int

__all__ = ["Rollout", "generate", "prepared_prompts", "stop_token_ids", "policy_logprobs", "evaluate", "position_ids_from_mask",
           "position_limit", "logprob_chunk_rows", "AUTO_CHUNK_ELEMENTS"]


@dataclass
class Rollout:
    """One batch of sampled responses (``B = n_prompts * group_size`` rows).

    Attributes:
        prompt_ids: long ``[B, P]``, left-padded with the pad id.
        prompt_mask: long ``[B, P]``, 1 on real prompt tokens.
        completion_ids: long ``[B, T]``, right-padded with the pad id after the first EOS.
        completion_mask: float32 ``[B, T]``, 1 on generated tokens up to and including the first EOS.
        behaviour_logp: float32 ``[B, T]``, log π_behaviour(token) at sampling time (natural
            log, temperature applied; under top-p / top-k, of the truncated, renormalised distribution
            actually sampled from), 0 on padding.
        truncated: bool ``[B]``, True when no EOS was produced within ``max_new_tokens``.
        texts: decoded completions up to, not including, the first EOS (other special tokens
            kept verbatim so that a stray ``<pad>`` makes an answer malformed instead of
            silently disappearing).
        problems: the problem of each row (repeated ``group_size`` times).
        group_size: G.
        temperature: sampling temperature the behaviour log-probs were computed at.
        gen_seconds: wall time of the ``generate`` call.
        kept_ids: ``None`` when the sampler truncated nothing (top_p = 1, top_k = 0, or greedy); else the
            kept set of each position (:func:`grpo_lab.policy.logprobs.sampling_kept_ids`): int32 ``[B, T, K]``
            token ids, ``K`` the batch's largest kept set (≤ top_k when top-k is on; up to V under top-p
            alone), padded with ``-1`` (all ``-1`` on completion padding): ``4·B·T·K`` bytes, e.g. 128 MiB at
            B = 256, T = 1024, top_k = 128. DeepSeek-V3.2's Keep Sampling Mask applies it to π_θ and π_old
            (:func:`policy_logprobs`'s ``keep_mask``).
        observation_mask: ``None`` for single-turn rollouts; else bool ``[B, T]``, True at the completion positions
            an environment inserted (observation / tool tokens of a multi-turn episode,
            :func:`grpo_lab.policy.episodes.generate_episodes`). ``completion_mask`` keeps meaning *the tokens the
            model sampled* (the loss mask), so token counts, lengths and normalisers exclude observations; every
            forward pass attends over :meth:`attended_mask` (both).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    behaviour_logp: torch.Tensor
    truncated: torch.Tensor
    texts: list[str]
    problems: list[Problem]
    group_size: int
    temperature: float = 1.0
    gen_seconds: float = 0.0
    extras: dict = field(default_factory=dict)
    kept_ids: torch.Tensor | None = None
    observation_mask: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        """long ``[B]``: number of completion tokens the model sampled (EOS included; observations excluded)."""
        return self.completion_mask.sum(-1).long()

    def attended_mask(self) -> torch.Tensor:
        """``[B, T]`` of ``completion_mask``'s dtype: 1 on every completion token a forward pass attends over, the
        model's and (multi-turn) the environment's; ``completion_mask`` itself when there is no
        ``observation_mask``."""
        if self.observation_mask is None:
            return self.completion_mask
        return (self.completion_mask.bool() | self.observation_mask.bool()).to(self.completion_mask.dtype)

    def attention_mask(self) -> torch.Tensor:
        """long ``[B, P + T]``: the forward pass's attention mask over ``prompt + completion`` (prompt mask, then
        :meth:`attended_mask`)."""
        return torch.cat([self.prompt_mask, self.attended_mask().long()], dim=1)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def select(self, idx: Sequence[int] | torch.Tensor) -> "Rollout":
        """The rows ``idx`` (a minibatch or the kept groups of dynamic sampling), trimmed to the
        longest kept completion and the longest kept prompt (left-padding columns that no kept row
        uses are dropped; position ids derive from the masks, so no real token moves)."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        cm = self.completion_mask[idx]
        om = None if self.observation_mask is None else self.observation_mask[idx]
        t = int(cm.sum(-1).max().item()) if len(idx) else 0
        if om is not None and len(idx):  # the last attended column (observations may follow the last model token)
            real = (cm != 0) | om
            t = int((real.long() * torch.arange(1, real.shape[1] + 1, device=real.device)).max().item())
        t = max(t, 1)
        pm = self.prompt_mask[idx]
        used = pm.sum(0) > 0
        p0 = int(used.long().argmax().item()) if bool(used.any()) else 0
        return Rollout(
            prompt_ids=self.prompt_ids[idx, p0:], prompt_mask=pm[:, p0:],
            completion_ids=self.completion_ids[idx, :t], completion_mask=cm[:, :t],
            behaviour_logp=self.behaviour_logp[idx, :t], truncated=self.truncated[idx],
            texts=[self.texts[i] for i in idx.tolist()], problems=[self.problems[i] for i in idx.tolist()],
            group_size=self.group_size, temperature=self.temperature, gen_seconds=self.gen_seconds,
            extras={k: (v[idx] if torch.is_tensor(v) and v.shape[:1] == self.truncated.shape else v)
                    for k, v in self.extras.items()},
            kept_ids=None if self.kept_ids is None else _trim_kept(self.kept_ids[idx, :t]),
            observation_mask=None if om is None else om[:, :t],
        )

    def token_counts(self) -> torch.Tensor:
        """long ``[B]``: real tokens of each row, prompt and completion, observations included (the forward
        pass's work)."""
        return self.prompt_mask.sum(-1).long() + (self.attended_mask() != 0).sum(-1).long()


def _trim_kept(kept: torch.Tensor) -> torch.Tensor:
    """int32 ``[b, t, K]`` kept ids trimmed to the largest kept set they hold (at least one column)."""
    k = int((kept >= 0).sum(-1).max()) if kept.numel() else 1
    return kept[..., :max(k, 1)]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """long ``[B, L]``: ``cumsum(mask) - 1`` on real tokens, 1 on left padding (``generate``'s rule)."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.masked_fill(attention_mask == 0, 1)


#: Entries of a checkpoint's ``generation_config`` that change neither the sampling distribution
#: nor where a completion stops (or that ``generate`` sets itself): not worth a note when dropped.
_NOT_SAMPLING = {"transformers_version", "_from_model_config", "max_length", "max_new_tokens", "bos_token_id",
                 "pad_token_id", "eos_token_id", "use_cache", "cache_implementation", "output_attentions",
                 "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate"}


def stop_token_ids(model, tokenizer) -> list[int]:
    """Every token id that ends a completion: the tokenizer's EOS, then each id of the model's
    ``generation_config.eos_token_id`` (an int or a list), without repeats.

    Returns:
        list of int token ids (empty when neither declares an EOS). Raises nothing.
    """
    declared = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    declared = [] if declared is None else [declared] if isinstance(declared, int) else list(declared)
    return list(dict.fromkeys(int(i) for i in [tokenizer.eos_token_id, *declared] if i is not None))


#: Config entries of a model whose rotary position embedding (RoPE) is computed for any position:
#: ``max_position_embeddings`` is then the trained length, not a hard limit.
_ROTARY_KEYS = ("rope_parameters", "rope_theta", "rope_scaling")


def _limit_name(config) -> str:
    """``"n_positions"`` or ``"max_position_embeddings"``: the config entry that holds the limit."""
    return "n_positions" if isinstance(getattr(config, "n_positions", None), int) else "max_position_embeddings"


def position_limit(model) -> int | None:
    """The most positions (prompt + completion tokens) ``model`` can embed, or ``None`` when it has
    no hard limit.

    Models with absolute position embeddings, a table of learned (GPT-2, OPT) or fixed vectors
    with one row per position, cannot embed a position past ``config.n_positions`` /
    ``config.max_position_embeddings``: ``torch.embedding`` raises ``IndexError: index out of range
    in self`` in the middle of ``generate``. For those, the limit is returned. Models with rotary
    position embeddings (RoPE: Llama, Qwen, the tiny policies of :mod:`grpo_lab.policy.models`; recognised
    by a ``rope_parameters``, ``rope_theta`` or ``rope_scaling`` entry in their config) compute the
    rotation for any position: their ``max_position_embeddings`` is the length they were trained
    on, beyond which quality degrades but nothing fails (transformers logs a warning when generation
    passes it), so they get ``None`` and keep working as before. A model whose config declares
    neither limit also gets ``None``.

    Args:
        model: a ``transformers`` model (anything with a ``config``).

    Returns:
        ``int`` (positions) or ``None``. Raises nothing.
    """
    config = getattr(model, "config", None)
    if config is None or any(getattr(config, k, None) for k in _ROTARY_KEYS):
        return None
    limit = getattr(config, _limit_name(config), None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


def _ignored_settings(checkpoint_config, config, applied: dict | None = None) -> list[str]:
    """``name=value`` for each setting of the checkpoint's generation config that differs from
    what the call ``config`` uses (``None`` entries of ``config`` take transformers' defaults), or from
    ``applied`` (settings this module applies itself: top_p, top_k)."""
    from transformers import GenerationConfig

    used = GenerationConfig().to_dict()
    defaults = getattr(GenerationConfig, "_get_default_generation_params", dict)()  # transformers >= 5
    used.update({k: v for k, v in defaults.items() if used.get(k) is None})
    used.update({k: v for k, v in config.to_dict().items() if v is not None})
    used.update(applied or {})
    return [f"{k}={v!r}" for k, v in sorted(checkpoint_config.to_diff_dict().items())
            if k not in _NOT_SAMPLING and used.get(k) != v]


@torch.no_grad()
def generate(model, tokenizer, problems: Sequence[Problem], *, group_size: int = 1,
             max_new_tokens: int = 48, temperature: float = 1.0, greedy: bool = False,
             top_p: float = 1.0, top_k: int = 0, cache_implementation: str | None = None,
             with_logprobs: bool = True) -> Rollout:
    """Sample ``group_size`` responses per problem with ``model.generate``.

    Behaviour log-probs are ``log softmax(logits / temperature)`` of the sampled tokens from each step's raw
    float32 logits (greedy: temperature 1); under top-p / top-k, of the truncated distribution sampled from
    (``-inf`` outside the kept set of :func:`grpo_lab.policy.logprobs.sampling_kept_ids`, which this function
    applies itself, transformers' own warpers left off), and the kept sets go into ``Rollout.kept_ids``. They
    are recorded step by step with :func:`grpo_lab.policy.logprobs.token_logprobs`'s arithmetic (no ``[B, V]``
    tensor outlives its step). Only a generation config built here is used: a checkpoint's ``generation_config``
    settings that reshape the distribution (``repetition_penalty``, its own ``temperature``, ...) are dropped
    with a ``UserWarning`` naming them; its stop ids are kept (:func:`stop_token_ids`). transformers' automatic
    ``torch.compile`` of the decode step is off.

    Args:
        model, tokenizer: a ``transformers`` causal LM; its tokenizer (pad and EOS set; padding forced left).
        problems: ``n`` problems; the result has ``n * group_size`` rows, groups contiguous.
        group_size, max_new_tokens: responses per problem (G ≥ 1); generation budget in tokens.
        temperature, greedy: sampling temperature ``> 0``; argmax decoding of the raw policy (temperature ignored).
        top_p, top_k: nucleus and top-k truncation of the sampler (1.0 and 0: none; ignored when greedy).
        cache_implementation: ``None`` (transformers' dynamic cache) or a ``GenerationConfig.cache_implementation``.
        with_logprobs: ``False`` (as :func:`evaluate`) leaves the rollout's ``behaviour_logp`` all zeros.

    Returns:
        Rollout with ``B = n * group_size`` rows and ``T ≤ max_new_tokens`` completion columns.

    Raises:
        ValueError: empty ``problems``, ``group_size < 1``, ``temperature <= 0``,
            ``max_new_tokens < 1``, ``top_p`` outside (0, 1], ``top_k`` not an int ``>= 0``, an empty prompt,
            or a longest prompt plus ``max_new_tokens`` beyond the model's hard position limit
            (:func:`position_limit`, e.g. GPT-2's ``n_positions``) or beyond the ``max_position_embeddings``
            a rotary (RoPE) model without a declared context extension was trained on.
    """
    rows, enc, top_p, top_k = prepared_prompts(model, tokenizer, problems, group_size=group_size,
                                               max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy,
                                               top_p=top_p, top_k=top_k)
    device = next(model.parameters()).device
    input_ids, attn = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    stops = stop_token_ids(model, tokenizer)
    config = _generation_config(model, tokenizer, stops, max_new_tokens=max_new_tokens, temperature=temperature,
                                greedy=greedy, top_p=top_p, top_k=top_k, cache_implementation=cache_implementation)
    temp = 1.0 if greedy else float(temperature)
    truncating = not greedy and (top_p < 1.0 or top_k > 0)
    recorder = _BehaviourLogprobs(input_ids.shape[1], temp, *((top_p, top_k) if truncating else ())) \
        if with_logprobs or truncating else None
    out, gen_seconds = _generate_with(model, input_ids, attn, config, recorder)
    raw = out.sequences[:, input_ids.shape[1]:]
    blogp = recorder.finish(raw) if with_logprobs else torch.zeros(raw.shape, device=raw.device)
    comp, mask, end, has_stop = _cut_at_stop(raw, stops, tokenizer.pad_token_id)
    kept = recorder.kept_ids(raw.shape[1]) if recorder is not None else None
    if kept is None:
        blogp = blogp * mask
    else:  # the pad ids generate writes after a stop may lie outside the kept set (log-prob -inf)
        blogp = torch.where(mask == 1, blogp, 0.0)
        kept = _trim_kept(kept.masked_fill(mask[..., None] == 0, -1))
    texts = [tokenizer.decode(ids[:n], skip_special_tokens=False) for ids, n in zip(comp.tolist(), end.tolist())]
    return Rollout(
        prompt_ids=input_ids, prompt_mask=attn.long(), completion_ids=comp, completion_mask=mask,
        behaviour_logp=blogp, truncated=~has_stop, texts=texts, problems=rows, group_size=group_size,
        temperature=temp, gen_seconds=gen_seconds, kept_ids=kept,
    )


def prepared_prompts(model, tokenizer, problems: Sequence[Problem], *, group_size: int, max_new_tokens: int,
                     temperature: float, greedy: bool, top_p: float, top_k: int) -> tuple:
    """What :func:`generate` and :func:`grpo_lab.policy.episodes.generate_episodes` check and encode before sampling:
    ``(rows, enc, top_p, top_k)``: each problem repeated ``group_size`` times, their prompts left-padded
    (``add_special_tokens=False``; ``enc`` the tokenizer's ``input_ids`` / ``attention_mask``, ``[B, P]`` long, on the
    CPU) and the checked truncation settings.

    Raises:
        ValueError: as :func:`generate` (its arguments, an empty prompt, a prompt past the model's positions).
    """
    _check_generate_args(problems, group_size=group_size, max_new_tokens=max_new_tokens, temperature=temperature,
                         greedy=greedy)
    top_p, top_k = check_truncation(top_p, top_k)
    rows = [p for p in problems for _ in range(group_size)]
    tokenizer.padding_side = "left"
    enc = tokenizer([p.prompt for p in rows], return_tensors="pt", padding=True, add_special_tokens=False)
    _check_position_limit(model, enc["attention_mask"], max_new_tokens)
    return rows, enc, top_p, top_k


def _check_generate_args(problems: Sequence[Problem], *, group_size: int, max_new_tokens: int, temperature: float,
                         greedy: bool) -> None:
    """:func:`generate`'s argument checks (ValueError, messages starting ``generate:``)."""
    if len(problems) == 0:
        raise ValueError("generate: no problems given")
    positive_int("generate: group_size", group_size)
    if not greedy and temperature <= 0:
        raise ValueError(f"generate: temperature must be > 0, got {temperature}")
    positive_int("generate: max_new_tokens", max_new_tokens)
    if any(len(p.prompt) == 0 for p in problems):
        raise ValueError("generate: empty prompt")


def _check_position_limit(model, prompt_mask: torch.Tensor, max_new_tokens: int) -> None:
    """ValueError when the longest prompt plus ``max_new_tokens`` passes the model's hard position limit, or
    the length a rotary model without a context extension was trained on (:func:`_trained_length`)."""
    limit, trained = position_limit(model), _trained_length(model)
    if limit is None and trained is None:
        return
    longest = int(prompt_mask.sum(-1).max())
    if longest + max_new_tokens <= (limit or trained):
        return
    head = (f"generate: the longest prompt ({longest} tokens) plus max_new_tokens={max_new_tokens} is "
            f"{longest + max_new_tokens} positions, more than the model's limit of {limit or trained} ")
    fix = ("Lower max_new_tokens (TrainerConfig.max_new_tokens or the task's), shorten the prompts, or use a model "
           "with more positions")
    if limit is not None:
        raise ValueError(head + f"({type(model).__name__}: config.{_limit_name(model.config)}={limit}; its position "
                         f"embedding has no entry beyond that). " + fix)
    raise ValueError(head + f"({type(model).__name__}: config.max_position_embeddings={trained}, the length its "
                     "rotary position embedding was trained on; past it the outputs degrade without an error). " + fix
                     + " (or raise model.config.max_position_embeddings if the model was trained on more)")


def _trained_length(model) -> int | None:
    """``config.max_position_embeddings`` of a rotary (RoPE) model whose rotary embedding is the plain one
    (``rope_type`` ``"default"``): the length it was trained on. ``None`` for any other model, and for a
    declared context extension (``rope_type`` ``"linear"``, ``"dynamic"``, ``"yarn"``, ``"llama3"``, ...), whose
    usable length the config states in several ways."""
    config = getattr(model, "config", None)
    if config is None or not any(getattr(config, k, None) for k in _ROTARY_KEYS):
        return None
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope = rope if isinstance(rope, dict) else {}
    per_layer_type = bool(rope) and all(isinstance(v, dict) for v in rope.values())  # e.g. Gemma 3's
    if {p.get("rope_type", p.get("type")) for p in (rope.values() if per_layer_type else [rope])} - {None, "default"}:
        return None
    n = getattr(config, "max_position_embeddings", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def _generation_config(model, tokenizer, stops: list, *, max_new_tokens: int, temperature: float, greedy: bool,
                       top_p: float, top_k: int, cache_implementation: str | None):
    """The ``GenerationConfig`` of one :func:`generate` call; warns (attributed to ``generate``'s caller)
    about the checkpoint's generation settings it leaves out."""
    from transformers import GenerationConfig

    # top-p / top-k are applied by _BehaviourLogprobs (the kept set it records is the one sampled from)
    sampling = {} if greedy else dict(temperature=float(temperature), top_p=1.0, top_k=0)
    config = GenerationConfig(do_sample=not greedy, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                              eos_token_id=stops or None, return_dict_in_generate=True,
                              cache_implementation=cache_implementation, disable_compile=True, **sampling)
    ignored = _ignored_settings(model.generation_config, config, {} if greedy else dict(top_p=top_p, top_k=top_k))
    if ignored:
        warnings.warn("generate: neutralised settings of the checkpoint's generation_config, so that the "
                      "behaviour log-probs describe the distribution sampled from: " + ", ".join(ignored),
                      stacklevel=3)  # as stacklevel=2 from generate itself
    return config


def _generate_with(model, input_ids: torch.Tensor, attn: torch.Tensor, config, recorder=None,
                   criteria: tuple = ()) -> tuple:
    """``model.generate`` in eval mode under ``config`` alone (plus the hooks of ``recorder``, a
    :class:`_BehaviourLogprobs`, when given, and the stopping ``criteria``); the output and its wall seconds. The model's training mode
    and generation config are restored afterwards, also on error."""
    from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

    checkpoint_config = model.generation_config
    was_training = model.training
    model.eval()
    # transformers fills every unset field of `config` from `model.generation_config`: give it an
    # empty one for the call, so that no processor of the checkpoint (present or future) acts.
    model.generation_config = GenerationConfig()
    t0 = time.perf_counter()
    try:
        hooks = dict(logits_processor=LogitsProcessorList([recorder.processor]),
                     stopping_criteria=StoppingCriteriaList([recorder.criterion])) if recorder is not None else {}
        if criteria:
            hooks["stopping_criteria"] = StoppingCriteriaList([*hooks.get("stopping_criteria", []), *criteria])
        out = model.generate(input_ids=input_ids, attention_mask=attn, generation_config=config, **hooks)
    finally:
        model.generation_config = checkpoint_config
        model.train(was_training)
    return out, time.perf_counter() - t0


def _cut_at_stop(comp: torch.Tensor, stops: list, pad_token_id: int) -> tuple:
    """Completions ``comp`` (long ``[B, T]``, ``generate``'s new tokens) cut after their first stop token.

    Returns ``comp`` (padded with ``pad_token_id`` after the stop), ``mask`` float ``[B, T]``, ``end`` (the
    stop's index, ``T`` when truncated) and ``has_stop`` bool ``[B]``.
    """
    T = comp.shape[1]
    is_stop = torch.isin(comp, torch.tensor(stops, device=comp.device))
    has_stop = is_stop.any(-1)
    end = torch.where(has_stop, is_stop.float().argmax(-1), T)  # first stop token, T when truncated
    mask = (torch.arange(T, device=comp.device)[None, :] <= end[:, None]).float()
    comp = comp.masked_fill(mask == 0, pad_token_id)
    return comp, mask, end, has_stop


#: Up to this many logits (rows × vocabulary) a decoding step's behaviour log-probs are computed in one block
#: (16 MiB in float32; the CPU profile's 128 × 52): beyond it, in chunks of ``ceil(B / 8)`` rows (Qwen2.5's
#: 151,936-token vocabulary). Each row's value is the same either way (tests/policy/test_rollout_logprobs.py).
_ONE_BLOCK_LOGITS = 2**22


class _BehaviourLogprobs:
    """Records ``log softmax(logits / temperature)`` of each token ``generate`` picks, step by step, through
    two hooks of ``transformers``' decoding loop (``GenerationMixin._sample``, transformers 5.24), neither of
    which changes what is generated, except that under ``top_p`` / ``top_k`` the processor truncates the logits
    itself (``-inf`` outside :func:`~grpo_lab.policy.logprobs.sampling_kept_ids`; transformers' warpers are off),
    records the kept set and the log-prob of the truncated distribution.

    * :attr:`processor` (a logits processor) receives each step's ids so far (long ``[B, P + k]`` at step
      ``k``) and logits (float32 ``[B, V]``, ``generate``'s fresh float32 copy of the model's, upcast
      from a low-precision model) and keeps a reference to the logits. Processors passed by the caller run
      after ``generate``'s own non-sampling processors (none under :func:`_generation_config`'s settings)
      and before the temperature / top-k / top-p warpers, so these are the raw logits, the tensors
      ``output_logits=True`` would return. The warpers return new tensors rather than writing into
      these (transformers 5.24; ``tests/policy/test_rollout_logprobs.py`` would catch a change).
    * :attr:`criterion` (a stopping criterion that never stops a row) runs in the same step after the
      drawn token was appended (``input_ids[:, -1]``): it computes that token's log-prob with
      :func:`grpo_lab.policy.logprobs.token_logprobs` (the arithmetic of the former ``[B, T, V]`` computation,
      row by row: in one block up to :data:`_ONE_BLOCK_LOGITS` logits, over chunks of ``ceil(B / 8)`` rows
      above) and drops the logits.

    So no ``[B, V]`` tensor of this class outlives its step (none is alive during the next forward pass),
    the temporaries are at most :data:`_ONE_BLOCK_LOGITS` logits or ``ceil(B / 8)`` rows, and what is kept across steps is the log-probs so
    far, float32 ``[B]`` per step. Rows that have already stopped still get logits (and then the pad
    token), as before: they are masked afterwards. Under top-p / top-k each step also sorts its ``[B, V]``
    logits (a few float32 / int64 ``[B, V]`` temporaries) and keeps its kept set, int32 ``[B, K_step]``.
    """

    def __init__(self, prompt_len: int, temperature: float, top_p: float = 1.0, top_k: int = 0):
        self.prompt_len, self.temperature = int(prompt_len), float(temperature)
        self.top_p, self.top_k = top_p, top_k
        self.logp: list[torch.Tensor] = []  # float32 [B] per step
        self.kept: list[torch.Tensor] = []  # int32 [B, K_step] per step, under top-p / top-k
        self.pending: torch.Tensor | None = None  # float32 [B, V]: this step's logits, until its token is known
        self.processor, self.criterion = _SeeLogits(self), _PickToken(self)

    def _check_step(self, input_ids: torch.Tensor, drawn: bool) -> None:
        """RuntimeError unless ``input_ids`` are those of the step the hooks expect (logits seen or token drawn)."""
        want = len(self.logp) + drawn
        if input_ids.shape[1] - self.prompt_len != want or (self.pending is None) == drawn:
            raise RuntimeError(f"generate: the behaviour log-prob recorder expected the ids of decoding step {want} "
                               f"({self.prompt_len} prompt columns + {want}) {'after' if drawn else 'before'} "
                               f"drawing, got {input_ids.shape[1]} columns (an unsupported transformers version?)")

    def see(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Keep ``scores`` (float32 ``[B, V]``) until the token drawn from them is known; returns them unchanged,
        or under top-p / top-k a copy with ``-inf`` outside the kept set (recorded), which ``generate`` samples from."""
        self._check_step(input_ids, drawn=False)
        kept = sampling_kept_ids(scores, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        if kept is not None:
            scores = restrict_to_kept(scores, kept)
            self.kept.append(kept)
        self.pending = scores
        return scores

    def pick(self, input_ids: torch.Tensor) -> None:
        """Record the log-prob of ``input_ids[:, -1]`` (long ``[B]``) under the kept logits, then drop them."""
        self._check_step(input_ids, drawn=True)
        B, V = self.pending.shape
        # all rows in one block while it is small (the same bits as row chunks: every operation is per row);
        # ceil(B / 8) rows at a time for a large vocabulary
        chunk = None if B * V <= _ONE_BLOCK_LOGITS else -(-B // 8)
        lp = token_logprobs(self.pending[None], input_ids[None, :, -1], temperature=self.temperature, chunk_size=chunk)
        self.logp.append(lp[0])
        self.pending = None

    def finish(self, comp: torch.Tensor) -> torch.Tensor:
        """float32 ``[B, T]``: the log-prob of each token of ``comp`` (long ``[B, T]``, the new tokens
        ``generate`` returned). Steps ``generate`` ran and then undid (its deferred stop check) are
        dropped. Raises RuntimeError when fewer steps were recorded than ``comp`` has tokens."""
        T = comp.shape[1]
        if len(self.logp) < T:
            raise RuntimeError(f"generate: {len(self.logp)} decoding steps recorded for {T} new tokens")
        return torch.stack(self.logp[:T], dim=1) if T else torch.zeros(comp.shape, device=comp.device)

    def kept_ids(self, T: int) -> torch.Tensor | None:
        """int32 ``[B, T, K]``: the kept sets of the first ``T`` steps, padded with ``-1`` to the largest
        (``None`` without truncation, or ``T = 0``)."""
        if not self.kept or T == 0:
            return None
        K = max(k.shape[1] for k in self.kept[:T])
        return torch.stack([torch.nn.functional.pad(k, (0, K - k.shape[1]), value=-1) for k in self.kept[:T]], 1)


class _SeeLogits:
    """The logits-processor hook of :class:`_BehaviourLogprobs` (``transformers`` calls it with ids and scores)."""

    def __init__(self, recorder: _BehaviourLogprobs):
        self.recorder = recorder

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return self.recorder.see(input_ids, scores)


class _PickToken:
    """The stopping-criterion hook of :class:`_BehaviourLogprobs`: records, and stops no row (bool ``[B]``, False)."""

    def __init__(self, recorder: _BehaviourLogprobs):
        self.recorder = recorder

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        self.recorder.pick(input_ids)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


#: Above this many logits (rows × tokens × vocabulary) :func:`policy_logprobs` computes the log-probs and
#: entropies in chunks (:func:`logprob_chunk_rows`): 2**24 float32 elements are 64 MiB per block.
AUTO_CHUNK_ELEMENTS = 2**24


def logprob_chunk_rows(rows: int, tokens: int, vocab: int) -> int | None:
    """The ``chunk_size`` :func:`policy_logprobs` uses by default: ``None`` (one pass) when
    ``rows · tokens · vocab`` is at most :data:`AUTO_CHUNK_ELEMENTS`, else ``AUTO_CHUNK_ELEMENTS // vocab``
    rows (at least 1), so that each float32 block of :func:`grpo_lab.policy.logprobs.token_logprobs` /
    :func:`~grpo_lab.policy.logprobs.entropy_from_logits` is at most 64 MiB. The entropy pass holds four such
    blocks: at 4 rows × 512 tokens of a 151,936-token vocabulary, 4.6 GiB in one pass, 256 MiB chunked.
    Small vocabularies (every CPU chapter) stay in one pass. Raises nothing."""
    if rows * tokens * vocab <= AUTO_CHUNK_ELEMENTS:
        return None
    return max(1, AUTO_CHUNK_ELEMENTS // max(1, vocab))


def policy_logprobs(model, rollout: Rollout, *, temperature: float | None = None,
                    with_entropy: bool = False, chunk_size: int | None | str = "auto", keep_mask: bool = False):
    """Per-token log-probs (and optionally entropy) of the rollout's completions under ``model``.

    Runs one forward pass over ``prompt + completion`` with the same attention mask and
    position ids as generation (:meth:`Rollout.attention_mask`: observation tokens of a multi-turn episode
    attended, their log-probs 0 like padding's), keeping only the logits that predict completion tokens
    (``logits_to_keep``), then :func:`grpo_lab.policy.logprobs.token_logprobs` at the sampling
    temperature.

    Args:
        chunk_size: rows per block of the log-prob and entropy passes (:func:`grpo_lab.policy.logprobs.token_logprobs`);
            ``None``: one pass; ``"auto"`` (default): :func:`logprob_chunk_rows` of the logits' shape.
        keep_mask: DeepSeek-V3.2's Keep Sampling Mask (arXiv 2512.02556, §3.1): the log-probs of the softmax over
            each position's kept set ``rollout.kept_ids`` only (:func:`grpo_lab.policy.logprobs.restrict_to_kept`:
            one bool ``[B, T, V]`` mask and one masked copy of the logits, for these rows only); no effect when the
            rollout has no kept sets. The entropy stays that of the whole distribution.

    Returns:
        ``logp`` float32 ``[B, T]`` (0 on padding), and ``entropy`` float32 ``[B, T]`` (nats,
        detached) when ``with_entropy``.
    """
    temperature = rollout.temperature if temperature is None else temperature
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    attn = rollout.attention_mask()  # model and observation tokens: the context the sampler saw
    pos = position_ids_from_mask(attn)
    T = rollout.completion_ids.shape[1]
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=T + 1, use_cache=False)
    logits = out.logits[:, :-1]  # position P-1+t predicts completion token t
    if chunk_size == "auto":
        chunk_size = logprob_chunk_rows(*logits.shape)
    scored = restrict_to_kept(logits, rollout.kept_ids) if keep_mask else logits
    logp = token_logprobs(scored, rollout.completion_ids, temperature=temperature, chunk_size=chunk_size)
    logp = logp * rollout.completion_mask
    if with_entropy:
        with torch.no_grad():
            ent = entropy_from_logits(logits.detach(), temperature=temperature, chunk_size=chunk_size)
        return logp, ent * rollout.completion_mask
    return logp


@torch.no_grad()
def evaluate(model, tokenizer, task, problems: Sequence[Problem] | None = None, *, greedy: bool = True,
             n_samples: int = 1, temperature: float = 1.0, batch_size: int = 256,
             max_new_tokens: int | None = None, sampler=None):
    """Accuracy of ``model`` on ``problems`` (default: the task's fixed test set).

    Generation runs ``batch_size`` problems (times ``n_samples`` when sampling) at a time, without
    behaviour log-probs (:func:`generate`'s ``with_logprobs=False``).

    Args:
        greedy, n_samples, temperature: argmax decoding, or ``n_samples`` samples per problem at
            ``temperature``.
        batch_size: problems per ``generate`` call (positive int; the trainer passes
            ``TrainerConfig.eval_batch_size``).
        max_new_tokens: generation budget (default: the task's).
        sampler: ``None`` (:func:`generate`) or a function with :func:`generate`'s signature returning a
            :class:`Rollout`, e.g. multi-turn episodes (:func:`grpo_lab.policy.episodes.generate_episodes` with its
            task bound).

    Returns:
        ``(summary, frame)``: ``summary`` a dict with ``accuracy``, ``mean_length`` (tokens, EOS
        included), ``truncation_rate`` and, when the task defines ``is_reasoning``,
        ``reasoning_frac``; ``frame`` a pandas DataFrame with one row per response (prompt, answer,
        completion, correct, length, and the problem's ``meta`` fields).

    Raises:
        TypeError: the task's batched ``correct`` returned a list of the wrong length or kind
            (:func:`grpo_lab.tasks.correctness`).
        ValueError: no problems to evaluate (``task.test_set()`` returned an empty list, named, or
            ``problems`` is empty); a ``batch_size`` that is not a positive int.
    """
    import pandas as pd

    positive_int("evaluate: batch_size", batch_size)
    if problems is None:
        problems = list(task.test_set())
        if not problems:
            raise ValueError(f"evaluate: task {getattr(task, 'name', '?')!r} ({type(task).__name__}): test_set() "
                             "returned no problems, so there is no test accuracy to measure; the task protocol "
                             "(grpo_lab.tasks.Task) needs a non-empty list of grpo_lab.tasks.Problem (or train "
                             "with TrainerConfig(eval_every=0), which never evaluates)")
    problems = list(problems)
    if not problems:
        raise ValueError("evaluate: no problems given (an empty list); the accuracy of no problems is undefined")
    max_new_tokens = max_new_tokens or task.max_new_tokens
    rows = []
    for start in range(0, len(problems), batch_size):
        chunk = problems[start:start + batch_size]
        ro = (sampler or generate)(model, tokenizer, chunk, group_size=1 if greedy else n_samples,
                      max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy, with_logprobs=False)
        lens = ro.lengths.tolist()
        correct = correctness(task, ro.texts, ro.problems)  # the task's batched `correct` once, when offered
        for i, (p, text) in enumerate(zip(ro.problems, ro.texts)):
            row = {"prompt": p.prompt, "answer": p.answer, "completion": text,
                   "correct": correct[i], "length": lens[i],
                   "truncated": bool(ro.truncated[i])}
            row.update({k: v for k, v in p.meta.items() if np.isscalar(v)})
            if hasattr(task, "is_reasoning"):
                row["reasoning"] = bool(task.is_reasoning(text))
            rows.append(row)
    frame = pd.DataFrame(rows)
    summary = {"accuracy": float(frame["correct"].mean()), "mean_length": float(frame["length"].mean()),
               "truncation_rate": float(frame["truncated"].mean())}
    if "reasoning" in frame:
        summary["reasoning_frac"] = float(frame["reasoning"].mean())
    return summary, frame
