"""The card of a tool-using base checkpoint (issue 56): how its episodes go on a multi-turn task's test set.

:func:`tool_card` samples episodes (the model's turns, the environment's observations) and reports, greedy and
sampled: accuracy, with and without a tool call; calls and model turns per episode; the share of an episode's
tokens that are observations; the truncation rate. :func:`episode_stats` computes them from a rollout in the
shape of ``grpo_lab.policy.episodes.generate_episodes``'s (``texts``, ``completion_mask``, ``observation_mask``,
``truncated``, ``problems``).

STAND-IN: until ``grpo_lab.policy.episodes.generate_episodes`` is merged, :func:`tool_card` samples with
``_standin_episodes``, a minimal private episode loop written to the same contract
(:mod:`grpo_lab.tasks.environment`); the integrator replaces that call by ``generate_episodes`` and deletes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["tool_card", "episode_stats"]


@dataclass
class _Episodes:
    """The fields of a multi-turn ``Rollout`` that the card reads (the stand-in's output)."""

    texts: list
    completion_mask: torch.Tensor   # float32 [B, T]: the tokens the model sampled
    observation_mask: torch.Tensor  # bool [B, T]: the tokens the environment inserted
    truncated: torch.Tensor         # bool [B]
    problems: list


def _turns(model_mask: torch.Tensor) -> torch.Tensor:
    """long ``[B]``: maximal runs of model tokens in each row (a model turn holds at least one token)."""
    m = model_mask.bool().long()
    starts = m[:, 1:] > m[:, :-1]
    return m[:, 0] + starts.long().sum(-1)


def episode_stats(rollout, task) -> dict:
    """Episode statistics of ``rollout`` (``texts``, ``completion_mask`` [B, T], ``observation_mask`` [B, T],
    ``truncated`` [B], ``problems``) on ``task`` (``is_correct``; calls counted by ``task.n_calls``).

    Returns:
        ``{"accuracy", "accuracy_with_call", "accuracy_without_call" (None when no episode is in the group),
        "tool_use_frac" (episodes with a call), "calls_per_episode", "turns_per_episode" (model turns),
        "observation_token_share" (observation tokens / all completion tokens, pooled), "mean_model_tokens",
        "truncation_rate", "episodes"}``, floats rounded to 4 places.
    """
    correct = np.array([task.is_correct(t, p) for t, p in zip(rollout.texts, rollout.problems)], dtype=bool)
    calls = np.array([task.n_calls(t) for t in rollout.texts])
    model = rollout.completion_mask.bool()
    obs = rollout.observation_mask.bool()
    n_model, n_obs = int(model.sum()), int(obs.sum())

    def mean(x):
        return round(float(np.mean(x)), 4) if len(x) else None

    return {"accuracy": mean(correct), "accuracy_with_call": mean(correct[calls > 0]),
            "accuracy_without_call": mean(correct[calls == 0]), "tool_use_frac": mean(calls > 0),
            "calls_per_episode": mean(calls), "turns_per_episode": mean(_turns(model).numpy()),
            "observation_token_share": round(n_obs / max(1, n_model + n_obs), 4),
            "mean_model_tokens": round(n_model / len(correct), 3),
            "truncation_rate": mean(rollout.truncated.numpy()), "episodes": int(len(correct))}


def tool_card(model, tokenizer, task, problems=None, *, n_samples: int = 4, temperature: float = 1.0,
              seed: int = 0) -> dict:
    """The card of a tool-using checkpoint: :func:`episode_stats` of greedy episodes (``greedy_*``) and of
    ``n_samples`` sampled episodes per problem at ``temperature`` (``sampled_*``) on ``problems`` (default
    ``task.test_set()``), torch seeded with ``seed`` first; the budget is ``task.max_new_tokens``.

    Raises:
        ValueError: ``n_samples < 1`` or ``temperature <= 0``.
    """
    if n_samples < 1 or temperature <= 0:
        raise ValueError(f"tool_card: need n_samples >= 1 and temperature > 0, got {n_samples}, {temperature}")
    problems = list(task.test_set() if problems is None else problems)
    torch.manual_seed(seed)
    out = {}
    for label, group, temp in (("greedy", 1, None), ("sampled", n_samples, temperature)):
        # STAND-IN: generate_episodes(model, tokenizer, task, problems, group_size=group,
        #     max_new_tokens=task.max_new_tokens, temperature=temp or 1.0, greedy=temp is None) after the merge
        episodes = _standin_episodes(model, tokenizer, task, problems, group_size=group,
                                     max_new_tokens=task.max_new_tokens, temperature=temp)
        out.update({f"{label}_{k}": v for k, v in episode_stats(episodes, task).items()})
    out["sampled_temperature"] = temperature
    return out


@torch.no_grad()
def _standin_episodes(model, tokenizer, task, problems, *, group_size: int, max_new_tokens: int,
                      temperature: float | None) -> _Episodes:
    """STAND-IN for ``generate_episodes`` (to be replaced after the merge): episodes per the environment contract,
    all rows advanced one token per forward pass (no KV cache; ``temperature=None`` is greedy). A turn ends at
    EOS (the episode ends) or when the decoded turn ends with a stop string: ``env.step(turn)``, the observation's
    ids appended, and the episode ends on ``done`` or after ``env.max_turns`` turns. The budget counts model and
    observation tokens; reaching it (an observation cut included) marks the row truncated."""
    rows = [p for p in problems for _ in range(group_size)]
    envs = [task.environment() for _ in rows]
    for env, p in zip(envs, rows):
        env.reset(p)
    prompts = [tokenizer(p.prompt, add_special_tokens=False)["input_ids"] for p in rows]
    comp = [[] for _ in rows]
    is_obs = [[] for _ in rows]
    turn_start = [0] * len(rows)
    turns = [0] * len(rows)
    live, truncated = list(range(len(rows))), [False] * len(rows)
    eos = tokenizer.eos_token_id
    while live:
        nxt = _next_tokens(model, [prompts[i] + comp[i] for i in live], tokenizer.pad_token_id, temperature)
        still = []
        for i, tok in zip(live, nxt):
            comp[i].append(tok)
            is_obs[i].append(False)
            if tok == eos:
                continue
            if len(comp[i]) >= max_new_tokens:
                truncated[i] = True
                continue
            turn = tokenizer.decode(comp[i][turn_start[i]:])
            if any(turn.endswith(s) for s in envs[i].stop_strings):
                turns[i] += 1
                step = envs[i].step(turn)
                ids = tokenizer(step.observation, add_special_tokens=False)["input_ids"]
                room = max_new_tokens - len(comp[i])
                comp[i] += ids[:room]
                is_obs[i] += [True] * len(ids[:room])
                turn_start[i] = len(comp[i])
                if len(ids) >= room:
                    truncated[i] = True
                if step.done or turns[i] >= envs[i].max_turns or truncated[i]:
                    continue
            still.append(i)
        live = still
    return _pack(tokenizer, comp, is_obs, truncated, rows)


def _next_tokens(model, seqs: list, pad: int, temperature: float | None) -> list:
    """One next token per sequence (left-padded batch; greedy when ``temperature`` is None)."""
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])
    attn = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits[:, -1].float()
    if temperature is None:
        return logits.argmax(-1).tolist()
    return torch.multinomial(torch.softmax(logits / temperature, -1), 1).squeeze(-1).tolist()


def _pack(tokenizer, comp: list, is_obs: list, truncated: list, rows: list) -> _Episodes:
    """Right-padded masks and the episode texts (up to, not including, EOS)."""
    width = max(len(c) for c in comp)
    eos = tokenizer.eos_token_id
    obs = torch.zeros(len(comp), width, dtype=torch.bool)
    model = torch.zeros(len(comp), width)
    texts = []
    for r, (c, o) in enumerate(zip(comp, is_obs)):
        obs[r, :len(o)] = torch.tensor(o, dtype=torch.bool)
        model[r, :len(o)] = (~torch.tensor(o, dtype=torch.bool)).float()
        texts.append(tokenizer.decode([t for t in c if t != eos]))
    return _Episodes(texts, model, obs, torch.tensor(truncated), rows)
