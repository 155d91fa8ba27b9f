"""The card of the long chain-of-thought base checkpoint (issue 55): how long its chains are and whether length pays.

:func:`~grpo_lab.lab.long_chain_card.long_chain_card` samples a group of responses per test problem and the greedy response, and reports
:func:`~grpo_lab.lab.long_chain_card.chain_stats` of the sampled ones (the regime a GRPO-style run starts from): the length distribution, the
point-biserial correlation of length with correctness (pooled, and within each term count, where problem size
no longer drives both), accuracy and share by thoroughness (:func:`~grpo_lab.tasks.long_chain.thoroughness`),
the truncation rate, the share of tied groups (all responses right or all wrong: zero GRPO advantage) and the
mean token entropy.
"""

from __future__ import annotations

import numpy as np
import torch

from ..policy.rollout import generate, policy_logprobs
from ..tasks.long_chain import THOROUGHNESS

__all__ = ["long_chain_card", "chain_stats", "point_biserial"]

_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def point_biserial(length, correct) -> float | None:
    """Pearson correlation of a length with a 0/1 outcome (the point-biserial correlation), or ``None`` when
    either is constant (it is undefined there, never NaN).

    Args:
        length: ``[N]`` numbers (tokens); correct: ``[N]`` bools or 0/1.

    Raises:
        ValueError: the two differ in length or are empty.
    """
    x, y = np.asarray(length, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.size == 0:
        raise ValueError(f"point_biserial: need two non-empty 1-d arrays of one length, got {x.shape} and {y.shape}")
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def _r4(v):
    return None if v is None else round(float(v), 4)


def chain_stats(frame, group_size: int) -> dict:
    """Statistics of sampled responses, ``group_size`` per problem.

    Args:
        frame: a pandas DataFrame, one row per response, with columns ``prompt`` (the group key), ``n_terms``,
            ``correct`` (bool), ``length`` (tokens, EOS included), ``truncated`` (bool), ``thoroughness`` (a
            label of :data:`~grpo_lab.tasks.long_chain.THOROUGHNESS`).
        group_size: responses per prompt (for the tied-group share).

    Returns:
        ``{"accuracy", "length_mean", "length_sd", "length_quantiles" {q: tokens}, "length_mean_by_terms",
        "accuracy_by_terms", "truncation_rate", "truncation_rate_by_terms", "length_correct_corr" (pooled),
        "length_correct_corr_within_terms" (mean over term counts where it is defined), "share_by_thoroughness",
        "accuracy_by_thoroughness" (None where no response has the label), "mean_length_by_thoroughness",
        "tied_group_frac", "all_correct_group_frac", "all_wrong_group_frac", "responses"}``, rounded to 4 places.

    Raises:
        ValueError: a group whose size is not ``group_size``, or an empty frame.
    """
    if len(frame) == 0:
        raise ValueError("chain_stats: no responses")
    sizes = frame.groupby("prompt").size()
    if (sizes != group_size).any():
        raise ValueError(f"chain_stats: every prompt needs {group_size} responses, got sizes {sorted(set(sizes))}")
    correct, length = frame["correct"].astype(bool), frame["length"].astype(float)
    by_terms = frame.groupby("n_terms")
    within = [point_biserial(g["length"], g["correct"]) for _, g in by_terms]
    within = [c for c in within if c is not None]
    group_acc = frame.groupby("prompt")["correct"].mean()
    labels = frame["thoroughness"]
    out = {
        "accuracy": _r4(correct.mean()), "length_mean": _r4(length.mean()), "length_sd": _r4(length.std(ddof=1)),
        "length_quantiles": {str(q): _r4(length.quantile(q)) for q in _QUANTILES},
        "length_mean_by_terms": {int(k): _r4(v) for k, v in by_terms["length"].mean().items()},
        "accuracy_by_terms": {int(k): _r4(v) for k, v in by_terms["correct"].mean().items()},
        "truncation_rate": _r4(frame["truncated"].mean()),
        "truncation_rate_by_terms": {int(k): _r4(v) for k, v in by_terms["truncated"].mean().items()},
        "length_correct_corr": _r4(point_biserial(length, correct)),
        "length_correct_corr_within_terms": _r4(np.mean(within)) if within else None,
        "share_by_thoroughness": {t: _r4((labels == t).mean()) for t in THOROUGHNESS},
        "accuracy_by_thoroughness": {t: _r4(correct[labels == t].mean()) if (labels == t).any() else None
                                     for t in THOROUGHNESS},
        "mean_length_by_thoroughness": {t: _r4(length[labels == t].mean()) if (labels == t).any() else None
                                        for t in THOROUGHNESS},
        "tied_group_frac": _r4(((group_acc == 0) | (group_acc == 1)).mean()),
        "all_correct_group_frac": _r4((group_acc == 1).mean()), "all_wrong_group_frac": _r4((group_acc == 0).mean()),
        "responses": int(len(frame)),
    }
    return out


def _sample_frame(model, tokenizer, task, problems, *, group_size: int, temperature: float, greedy: bool,
                  batch_problems: int):
    """Rows (as :func:`~grpo_lab.lab.long_chain_card.chain_stats` reads them) of ``group_size`` responses per problem, and the summed token
    entropy (nats) and token count of the sampled tokens."""
    import pandas as pd

    rows, ent_sum, n_tok = [], 0.0, 0
    for start in range(0, len(problems), batch_problems):
        chunk = problems[start:start + batch_problems]
        ro = generate(model, tokenizer, chunk, group_size=group_size, max_new_tokens=task.max_new_tokens,
                      temperature=temperature, greedy=greedy, with_logprobs=False)
        if not greedy:
            with torch.no_grad():
                _, ent = policy_logprobs(model, ro, with_entropy=True)
            ent_sum += float(ent.sum())
            n_tok += int(ro.completion_mask.sum())
        for i, (p, text) in enumerate(zip(ro.problems, ro.texts)):
            rows.append({"prompt": p.prompt, "n_terms": p.meta["n_terms"], "completion": text,
                         "correct": bool(task.is_correct(text, p)), "length": int(ro.lengths[i]),
                         "truncated": bool(ro.truncated[i]), "thoroughness": task.thoroughness(text, p)})
    return pd.DataFrame(rows), ent_sum, n_tok


def long_chain_card(model, tokenizer, task, problems=None, *, n_samples: int = 8, temperature: float = 1.0,
                    seed: int = 0, batch_problems: int = 64) -> dict:
    """The card of a :class:`~grpo_lab.tasks.LongChainTask` checkpoint on ``problems`` (default the test set).

    Torch is seeded with ``seed``; ``n_samples`` responses per problem are sampled at ``temperature`` with the
    task's budget (``task.max_new_tokens``), ``batch_problems`` problems per ``generate`` call.

    Returns:
        :func:`~grpo_lab.lab.long_chain_card.chain_stats` of the sampled responses with keys prefixed ``sampled_``, plus ``sampled_entropy``
        (mean entropy of the policy at ``temperature`` over the sampled tokens, nats per token, EOS included),
        ``greedy_accuracy``, ``greedy_mean_length``, ``greedy_truncation_rate``, ``greedy_accuracy_by_terms``,
        ``greedy_share_by_thoroughness``, ``group_size``, ``temperature``, ``max_new_tokens``, ``problems``.

    Raises:
        ValueError: ``n_samples < 2`` (a group needs two responses) or ``temperature <= 0``.
    """
    if n_samples < 2 or temperature <= 0:
        raise ValueError(f"long_chain_card: need n_samples >= 2 and temperature > 0, got {n_samples}, {temperature}")
    problems = list(task.test_set() if problems is None else problems)
    torch.manual_seed(seed)
    sampled, ent_sum, n_tok = _sample_frame(model, tokenizer, task, problems, group_size=n_samples,
                                            temperature=temperature, greedy=False, batch_problems=batch_problems)
    greedy, _, _ = _sample_frame(model, tokenizer, task, problems, group_size=1, temperature=1.0, greedy=True,
                                 batch_problems=batch_problems)
    out = {f"sampled_{k}": v for k, v in chain_stats(sampled, n_samples).items()}
    out["sampled_entropy"] = _r4(ent_sum / max(1, n_tok))
    g = chain_stats(greedy, 1)
    out.update({"greedy_accuracy": g["accuracy"], "greedy_mean_length": g["length_mean"],
                "greedy_truncation_rate": g["truncation_rate"], "greedy_accuracy_by_terms": g["accuracy_by_terms"],
                "greedy_share_by_thoroughness": g["share_by_thoroughness"], "group_size": n_samples,
                "temperature": temperature, "max_new_tokens": task.max_new_tokens, "problems": len(problems)})
    return out
