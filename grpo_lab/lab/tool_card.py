"""The card of a tool-using base checkpoint (issue 56): how its episodes go on a multi-turn task's test set.

:func:`tool_card` samples episodes (the model's turns, the environment's observations) and reports, greedy and
sampled: accuracy, with and without a tool call; calls and model turns per episode; the share of an episode's
tokens that are observations; the truncation rate. :func:`episode_stats` computes them from a rollout in the
shape of ``grpo_lab.policy.episodes.generate_episodes``'s (``texts``, ``completion_mask``, ``observation_mask``,
``truncated``, ``problems``).
"""

from __future__ import annotations

import numpy as np
import torch

from ..policy.episodes import generate_episodes

__all__ = ["tool_card", "episode_stats"]


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
        episodes = generate_episodes(model, tokenizer, task, problems, group_size=group,
                                     max_new_tokens=task.max_new_tokens, temperature=temp or 1.0,
                                     greedy=temp is None, with_logprobs=False)
        out.update({f"{label}_{k}": v for k, v in episode_stats(episodes, task).items()})
    out["sampled_temperature"] = temperature
    return out
