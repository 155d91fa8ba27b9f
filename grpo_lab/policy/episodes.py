"""Multi-turn rollouts: the model acts, an environment answers, the model acts again.

:func:`generate_episodes` alternates model turns (sampled with :func:`grpo_lab.policy.rollout.generate`'s
machinery, batched over the episodes still running: left padding, position ids from the attention mask, the stop
ids, behaviour log-probs of exactly the sampled tokens, the top-p / top-k kept sets) and environment turns (the
task's ``environment()``, :mod:`grpo_lab.tasks.environment`). The rollout keeps the exact ids the model sampled
and the ids of every observation (``tokenizer(observation, add_special_tokens=False)``) side by side in the
completion: nothing is re-tokenised, so π_θ, π_old and π_ref are later scored on the ids the sampler saw (no
drift where a BPE merge would cross a turn boundary). ``Rollout.completion_mask`` marks the model's tokens (the
loss mask), ``Rollout.observation_mask`` the environment's; every forward pass attends over both.

Each model turn re-encodes its whole context (no KV cache kept across turns): the sampling distribution is that
of a full forward over ``prompt + episode so far``, the one the trainer recomputes. This module takes the task
duck-typed (the policy layer does not import :mod:`grpo_lab.tasks`).
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .rollout import (Rollout, _BehaviourLogprobs, _cut_at_stop, _generate_with, _generation_config, _trim_kept,
                      prepared_prompts, stop_token_ids)

__all__ = ["generate_episodes", "stop_string_end"]


@dataclass
class _Episode:
    """One episode's state: its completion ids so far and, per id, whether the model sampled it."""

    env: object
    stop_strings: tuple
    max_turns: int
    ids: list = field(default_factory=list)         # int: model and observation ids, in order
    model: list = field(default_factory=list)       # bool per id: True = sampled by the model
    logp: list = field(default_factory=list)        # float per id: behaviour log-prob (0.0 at observations)
    kept: list = field(default_factory=list)        # per id: int32 [K] kept set, or None (observations)
    turns: int = 0
    calls: int = 0
    turn_reward: float = 0.0
    observation_tokens: int = 0
    eos: bool = False
    truncated: bool = False
    turn_limit: bool = False
    done: bool = False


def stop_string_end(tokenizer, ids: Sequence[int], stop_strings: Sequence[str]) -> int | None:
    """The number of tokens of ``ids`` up to and including the token at which the first stop string is complete,
    or ``None`` when none occurs.

    The test at token ``k`` decodes the last ``w`` tokens ``ids[k-w:k]`` (``w`` = the longest stop string's
    length in characters + 4, so a string split over several tokens, or a character over several byte tokens,
    is seen) and asks whether a stop string occurs in that text; the first ``k`` that passes is returned. The
    same test stops rows inside ``generate``, so the two agree. Raises nothing.
    """
    if not stop_strings:
        return None
    w = max(len(s) for s in stop_strings) + 4
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(list(ids[max(0, k - w):k]), skip_special_tokens=False)
        if any(s in text for s in stop_strings):
            return k
    return None


class _StopStrings:
    """A stopping criterion for ``generate``: stops a row once its new tokens contain one of its episode's stop
    strings (:func:`stop_string_end`'s test on the newest token). bool ``[b]``."""

    def __init__(self, tokenizer, prompt_len: int, stop_strings: list):
        self.tokenizer, self.prompt_len, self.stop_strings = tokenizer, prompt_len, stop_strings
        self.hit: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        if self.hit is None:
            self.hit = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        new = input_ids[:, self.prompt_len:].tolist()
        for j, row in enumerate(new):
            stops = self.stop_strings[j]
            if not self.hit[j] and stops:
                w = max(len(s) for s in stops) + 4
                text = self.tokenizer.decode(row[-w:], skip_special_tokens=False)
                self.hit[j] = any(s in text for s in stops)
        return self.hit.to(input_ids.device)


@torch.no_grad()
def generate_episodes(model, tokenizer, task, problems: Sequence, *, group_size: int = 1, max_new_tokens: int = 48,
                      temperature: float = 1.0, greedy: bool = False, top_p: float = 1.0, top_k: int = 0,
                      cache_implementation: str | None = None, with_logprobs: bool = True) -> Rollout:
    """Sample ``group_size`` multi-turn episodes per problem: model turns batched over the running episodes,
    environment turns from a fresh ``task.environment()`` per episode (reset on its problem).

    A model turn ends at EOS (the episode ends, no ``step``), at the first of the environment's ``stop_strings``
    (:func:`stop_string_end`; the action's text goes to ``env.step``), or at the budget. ``step`` returns a
    ``StepResult``: with ``done=False`` the observation's ids are appended and the model samples the next turn;
    with ``done=True`` the observation (may be ``""``) is appended and the episode ends. At the environment's
    ``max_turns``-th model turn ``step`` is still called (its reward counts) but a ``done=False`` observation is
    not appended (no turn would read it) and ``extras["turn_limit"]`` is set. ``max_new_tokens`` is the whole
    episode's budget, model and observation tokens: reaching it in a model turn, in an observation (cut there),
    or with ``done=False`` and no room left sets ``truncated``.

    Args:
        model, tokenizer: as :func:`grpo_lab.policy.rollout.generate`.
        group_size, max_new_tokens, temperature, greedy, top_p, top_k, cache_implementation, with_logprobs: as
            :func:`grpo_lab.policy.rollout.generate` (``max_new_tokens``: the whole episode's budget).
        task: has ``environment()`` returning an object with ``stop_strings`` (tuple of str), ``max_turns``
            (int ≥ 1), ``reset(problem)`` and ``step(action) -> StepResult`` (:mod:`grpo_lab.tasks.environment`).
        problems: ``n`` problems (``prompt``); the result has ``n * group_size`` rows, groups contiguous.

    Returns:
        Rollout with ``B = n * group_size`` rows and ``T ≤ max_new_tokens`` completion columns: ``completion_mask``
        float32 1 at the model's tokens, ``observation_mask`` bool at the environment's, ``behaviour_logp`` 0 at
        both observations and padding, ``truncated`` as above, ``texts`` the decoded episode after the prompt
        (model turns and observations in order, a final EOS left out), ``kept_ids`` ``-1`` at observations, and
        ``extras`` per row: ``turns`` (model turns), ``tool_calls`` (``step`` calls), ``observation_tokens``
        (long ``[B]``), ``turn_rewards`` (float32 ``[B]``, the summed ``StepResult.reward``), ``turn_limit``
        (bool ``[B]``).

    Raises:
        ValueError: as :func:`grpo_lab.policy.rollout.generate`; an environment's ``max_turns`` not an int ≥ 1.
        TypeError: ``task`` has no ``environment()``; ``stop_strings`` not a tuple / list of non-empty str;
            ``step`` returned something without a str ``observation``, a bool ``done`` and a finite real ``reward``.
    """
    rows, enc, top_p, top_k = prepared_prompts(model, tokenizer, problems, group_size=group_size,
                                               max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy,
                                               top_p=top_p, top_k=top_k)
    device = next(model.parameters()).device
    episodes = [_new_episode(task, p) for p in rows]
    prompts = [ids[m == 1].tolist() for ids, m in zip(enc["input_ids"], enc["attention_mask"])]
    temp = 1.0 if greedy else float(temperature)
    truncating = not greedy and (top_p < 1.0 or top_k > 0)
    settings = dict(temperature=temp, greedy=greedy, top_p=top_p, top_k=top_k, truncating=truncating,
                    with_logprobs=with_logprobs, cache_implementation=cache_implementation)
    t0 = time.perf_counter()
    while any(not e.done for e in episodes):
        active = [i for i, e in enumerate(episodes) if not e.done]
        _model_turn(model, tokenizer, [prompts[i] for i in active], [episodes[i] for i in active], max_new_tokens,
                    device, settings)
        for i in active:
            if not episodes[i].done:
                _environment_turn(tokenizer, episodes[i], max_new_tokens)
    return _to_rollout(tokenizer, enc, episodes, rows, group_size, temp, time.perf_counter() - t0, device,
                       truncating)


def _new_episode(task, problem) -> _Episode:
    """A fresh environment from ``task.environment()``, checked and reset on ``problem``, in an empty episode."""
    make = getattr(task, "environment", None)
    if not callable(make):
        raise TypeError(f"generate_episodes: task {type(task).__name__} has no environment() method; a multi-turn "
                        "task returns a fresh grpo_lab.tasks.Environment per episode")
    env = make()
    stops = getattr(env, "stop_strings", None)
    if not isinstance(stops, (tuple, list)) or not all(isinstance(s, str) and s for s in stops):
        raise TypeError(f"generate_episodes: {type(env).__name__}.stop_strings must be a tuple of non-empty str, "
                        f"got {stops!r}")
    turns = getattr(env, "max_turns", None)
    if not isinstance(turns, int) or isinstance(turns, bool) or turns < 1:
        raise ValueError(f"generate_episodes: {type(env).__name__}.max_turns must be an int >= 1, got {turns!r}")
    env.reset(problem)
    return _Episode(env=env, stop_strings=tuple(stops), max_turns=turns)


def _model_turn(model, tokenizer, prompts: list, eps: list, budget: int, device, s: dict) -> None:
    """One model turn of the episodes ``eps`` (their prompt ids ``prompts``), batched: contexts left-padded,
    ``generate`` with the behaviour recorder and the stop-string criterion, each row cut at EOS, at its first
    stop string or at its remaining budget; the turn's ids, log-probs and kept sets appended to its episode."""
    contexts = [p + e.ids for p, e in zip(prompts, eps)]
    width = max(len(c) for c in contexts)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts], device=device)
    attn = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts], device=device)
    room = [budget - len(e.ids) for e in eps]
    stops = stop_token_ids(model, tokenizer)
    config = _generation_config(model, tokenizer, stops, max_new_tokens=max(room), temperature=s["temperature"],
                                greedy=s["greedy"], top_p=s["top_p"], top_k=s["top_k"],
                                cache_implementation=s["cache_implementation"])
    recorder = _BehaviourLogprobs(width, s["temperature"], *((s["top_p"], s["top_k"]) if s["truncating"] else ())) \
        if s["with_logprobs"] or s["truncating"] else None
    stopper = _StopStrings(tokenizer, width, [e.stop_strings for e in eps])
    out, _ = _generate_with(model, input_ids, attn, config, recorder, criteria=(stopper,))
    raw = out.sequences[:, width:]
    blogp = recorder.finish(raw) if s["with_logprobs"] else torch.zeros(raw.shape, device=raw.device)
    _, _, end, has_eos = _cut_at_stop(raw, stops, pad)
    kept = recorder.kept_ids(raw.shape[1]) if recorder is not None else None
    for j, e in enumerate(eps):
        n = min(int(end[j]) + 1 if bool(has_eos[j]) else raw.shape[1], room[j])
        ids = raw[j, :n].tolist()
        k = stop_string_end(tokenizer, ids[:-1] if bool(has_eos[j]) and n == int(end[j]) + 1 else ids,
                            e.stop_strings)
        e.eos = k is None and bool(has_eos[j]) and n == int(end[j]) + 1
        n = k if k is not None else n
        e.ids += raw[j, :n].tolist()
        e.model += [True] * n
        e.logp += blogp[j, :n].float().tolist()
        e.kept += [None] * n if kept is None else [kr[kr >= 0] for kr in kept[j, :n]]
        e.turns += 1
        e.truncated = k is None and not e.eos  # the budget ran out inside this turn
        e.done = e.eos or e.truncated


def _checked_step(env, action: str):
    """``env.step(action)``, checked: a ``TypeError`` naming the environment unless the result has a str
    ``observation``, a bool ``done`` and a finite real ``reward``."""
    res = env.step(action)
    obs, done, reward = (getattr(res, k, None) for k in ("observation", "done", "reward"))
    if not isinstance(obs, str) or not isinstance(done, bool) or not isinstance(reward, numbers.Real) \
            or isinstance(reward, bool) or not math.isfinite(float(reward)):
        raise TypeError(f"generate_episodes: {type(env).__name__}.step must return a StepResult(observation: str, "
                        f"done: bool, reward: finite float), got {res!r:.200}")
    return res


def _environment_turn(tokenizer, e: _Episode, budget: int) -> None:
    """The environment's answer to the model turn that just ended at a stop string: ``step`` on the turn's text,
    its reward added, its observation's ids appended (cut at the budget: truncated), the episode ended when the
    environment says so, at the turn limit, or when no room is left for another model turn (truncated)."""
    start = len(e.model)
    while start > 0 and e.model[start - 1]:  # the turn's tokens: the trailing run of model tokens
        start -= 1
    action = tokenizer.decode(e.ids[start:], skip_special_tokens=False)
    res = _checked_step(e.env, action)
    e.calls += 1
    e.turn_reward += float(res.reward)
    if e.turns >= e.max_turns and not res.done:
        e.turn_limit = e.done = True
        return
    obs = tokenizer(res.observation, add_special_tokens=False)["input_ids"] if res.observation else []
    room = budget - len(e.ids)
    cut = obs[:room]
    e.ids += cut
    e.model += [False] * len(cut)
    e.logp += [0.0] * len(cut)
    e.kept += [None] * len(cut)
    e.observation_tokens += len(cut)
    e.truncated = len(obs) > room or (not res.done and len(e.ids) >= budget)
    e.done = bool(res.done) or e.truncated


def _to_rollout(tokenizer, enc, eps: list, rows: list, group_size: int, temp: float, seconds: float, device,
                truncating: bool) -> Rollout:
    """The :class:`~grpo_lab.policy.rollout.Rollout` of finished episodes ``eps`` (completions right-padded)."""
    B, T = len(eps), max(1, max(len(e.ids) for e in eps))
    pad = tokenizer.pad_token_id
    comp = torch.full((B, T), pad, dtype=torch.long)
    model = torch.zeros(B, T, dtype=torch.bool)
    obs = torch.zeros(B, T, dtype=torch.bool)
    logp = torch.zeros(B, T)
    for i, e in enumerate(eps):
        n = len(e.ids)
        comp[i, :n] = torch.tensor(e.ids, dtype=torch.long)
        model[i, :n] = torch.tensor(e.model, dtype=torch.bool)
        obs[i, :n] = ~model[i, :n]
        logp[i, :n] = torch.tensor(e.logp, dtype=torch.float32)
    texts = [tokenizer.decode(e.ids[:-1] if e.eos else e.ids, skip_special_tokens=False) for e in eps]
    extras = {"turns": torch.tensor([e.turns for e in eps]), "tool_calls": torch.tensor([e.calls for e in eps]),
              "observation_tokens": torch.tensor([e.observation_tokens for e in eps]),
              "turn_rewards": torch.tensor([e.turn_reward for e in eps], dtype=torch.float32),
              "turn_limit": torch.tensor([e.turn_limit for e in eps])}
    return Rollout(
        prompt_ids=enc["input_ids"].to(device), prompt_mask=enc["attention_mask"].long().to(device),
        completion_ids=comp.to(device), completion_mask=model.float().to(device), behaviour_logp=logp.to(device),
        truncated=torch.tensor([e.truncated for e in eps], device=device), texts=texts, problems=rows, group_size=group_size,
        temperature=temp, gen_seconds=seconds, extras=extras,
        kept_ids=_episode_kept(eps, T).to(device) if truncating else None, observation_mask=obs.to(device))


def _episode_kept(eps: list, T: int) -> torch.Tensor:
    """int32 ``[B, T, K]``: each model token's kept set, ``-1`` at observations, padding and beyond a set's size."""
    K = max([len(k) for e in eps for k in e.kept if k is not None] or [1])
    kept = torch.full((len(eps), T, K), -1, dtype=torch.int32)
    for i, e in enumerate(eps):
        for t, k in enumerate(e.kept):
            if k is not None:
                kept[i, t, :len(k)] = k.to(torch.int32).cpu()
    return _trim_kept(kept)
