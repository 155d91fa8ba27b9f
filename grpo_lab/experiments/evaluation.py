"""Evaluation as the field reports it: pass@k, mean@k and maj@k from ``n`` samples per problem.

A test accuracy measured from one greedy answer per problem (:func:`grpo_lab.policy.rollout.evaluate`,
the trainer's ``test_accuracy``) is one number; papers report what ``n`` sampled answers per
problem give (``n >= k``):

* **pass@k**: the probability that at least one of ``k`` samples is correct, estimated without
  bias from ``c`` correct answers out of ``n`` samples by ``1 - C(n-c, k) / C(n, k)`` (Chen et al.
  2021, "Evaluating Large Language Models Trained on Code", arXiv 2107.03374, Eq. 1), rather than by
  ``1 - (1 - c/n)^k``, which is biased low (:func:`pass_at_k`);
* **mean@k** (also "avg@k"): the accuracy of one sample, averaged over ``k`` samples; its unbiased
  estimate from ``n`` samples is ``c / n`` for every ``k <= n`` (:func:`mean_at_k`);
* **maj@k** (self-consistency, Wang et al. 2022, arXiv 2203.11171): whether the answer most of
  ``k`` samples agree on is correct (:func:`maj_at_k`); it needs the final answer of each
  completion, which a task offers through its optional member ``extract_answer(completion) ->
  str | None`` (:class:`grpo_lab.tasks.Task`) or :func:`evaluate_at_k`'s ``extract`` argument, and
  votes on parsed answers through the task's optional ``answers_equivalent(a, b) -> bool``.

Each is a per-problem value averaged over the test set. :func:`evaluate_at_k` samples the ``n``
completions (with :func:`grpo_lab.policy.rollout.evaluate`) and reports the three, with the test set's
binomial standard error ``sqrt(p (1 - p) / P)`` over its ``P`` problems and Wilson intervals
(:func:`grpo_lab.experiments.stats.wilson_interval`) where the value is a count.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

import numpy as np

from .stats import binomial_se, wilson_interval
from ..algo.checks import is_int, positive_int, positive_number

__all__ = ["pass_at_k", "mean_at_k", "maj_at_k", "evaluate_at_k"]


def _counts(n, c, k, who: str) -> tuple[np.ndarray, np.ndarray, int]:
    """``n`` and ``c`` as int64 arrays of one shape and ``k`` as an int, checked (see :func:`pass_at_k`)."""
    if not is_int(k) or k < 1:
        raise ValueError(f"{who}: k must be an int >= 1, got {k!r}")
    arrays = []
    for name, value in (("n", n), ("c", c)):
        a = np.asarray(value)
        if a.dtype == bool or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
            raise ValueError(f"{who}: {name} must be integers (counts), got dtype {a.dtype} ({value!r:.60})")
        arrays.append(a.astype(np.int64))
    try:
        n_arr, c_arr = np.broadcast_arrays(*arrays)
    except ValueError:
        raise ValueError(f"{who}: n and c must have the same shape (one count per problem), got shapes "
                         f"{arrays[0].shape} and {arrays[1].shape}") from None
    if (c_arr < 0).any() or (n_arr < 0).any():
        raise ValueError(f"{who}: n and c must be >= 0")
    if (c_arr > n_arr).any():
        i = int(np.argmax((c_arr > n_arr).ravel()))
        raise ValueError(f"{who}: c must be <= n (correct samples out of n), got c={c_arr.ravel()[i]} > "
                         f"n={n_arr.ravel()[i]} at position {i}")
    if (n_arr < k).any():
        raise ValueError(f"{who}: k={k} exceeds the samples of a problem (n={int(n_arr.min())}); pass@k and "
                         "mean@k need n >= k samples per problem")
    return n_arr, c_arr, int(k)


def _out(values: np.ndarray, n, c) -> float | np.ndarray:
    """A python float when both counts were scalars, else the array."""
    return float(values) if np.ndim(n) == 0 and np.ndim(c) == 0 else values


def pass_at_k(n, c, k: int) -> float | np.ndarray:
    """The unbiased estimate of pass@k from ``c`` correct of ``n`` samples (Chen et al. 2021,
    arXiv 2107.03374, Eq. 1): ``1 - C(n-c, k) / C(n, k)``.

    Computed as the paper's stable product ``prod_{i=n-c+1}^{n} (1 - k / i)``, one cumulative product
    per distinct ``n``; exactly 1 when ``n - c < k``; ``c / n`` for ``k = 1`` (equal to
    :func:`mean_at_k` to the last bit).

    >>> pass_at_k(10, 3, 1), round(pass_at_k(10, 3, 2), 6), pass_at_k(10, 0, 5), pass_at_k(4, 1, 4)
    (0.3, 0.533333, 0.0, 1.0)

    Args:
        n: samples per problem, an int or an integer array (one per problem).
        c: correct samples per problem, same shape as ``n`` (or broadcastable to it).
        k: the ``k`` of pass@k, an int with ``1 <= k <= n`` for every problem.

    Returns:
        ``float`` for scalar ``n`` and ``c``, else a float64 array of the broadcast shape.

    Raises:
        ValueError: ``k`` not an int ``>= 1``; ``n`` or ``c`` not integers, negative, of
            different shapes; ``c > n``; ``k > n`` for some problem.
    """
    n_arr, c_arr, k = _counts(n, c, k, "pass_at_k")
    if k == 1:
        return _out(c_arr / n_arr, n, c)
    out = np.empty(n_arr.shape, dtype=np.float64)
    for m in np.unique(n_arr):
        # kept[j] = C(m-j, k) / C(m, k) = prod_{i=m-j+1}^{m} (1 - k/i), for j = 0 .. m correct samples
        kept = np.concatenate([[1.0], np.cumprod(1.0 - k / np.arange(m, 0, -1, dtype=np.float64))])
        where = n_arr == m
        out[where] = 1.0 - kept[c_arr[where]]
    out = np.where(n_arr - c_arr < k, 1.0, out)  # the exact 1 (the product can end in -0.0 and round)
    return _out(out, n, c)


def mean_at_k(n, c, k: int) -> float | np.ndarray:
    """The unbiased estimate of mean@k, the accuracy of one sample averaged over ``k`` samples:
    ``c / n`` for every ``k <= n`` (every sample is correct with probability estimated by ``c/n``;
    ``k`` only fixes how many samples the reported number stands for).

    >>> mean_at_k(10, 3, 4)
    0.3

    Args:
        n, c, k: as :func:`pass_at_k` (``n >= 1``).

    Returns:
        ``float`` for scalar ``n`` and ``c``, else a float64 array.

    Raises:
        ValueError: as :func:`pass_at_k`.
    """
    n_arr, c_arr, _ = _counts(n, c, k, "mean_at_k")
    return _out(c_arr / n_arr, n, c)


def _majority_correct(answers: Sequence, correct: Sequence, k: int, equivalent) -> float:
    """maj@k of one problem: the first ``k`` samples vote (see :func:`maj_at_k`)."""
    groups: list[list[int]] = []  # sample indices, each group led by the first sample that gave its answer
    for i, a in enumerate(answers[:k]):
        if a is None:
            continue
        home = next((g for g in groups if answers[g[0]] == a or (equivalent is not None
                                                                 and equivalent(answers[g[0]], a))), None)
        if home is None:
            groups.append([i])
        else:
            home.append(i)
    if not groups:
        return 0.0
    top = max(len(g) for g in groups)
    winner = next(g for g in groups if len(g) == top)  # groups are in order of their first sample: a tie goes to it
    return 1.0 if correct[winner[0]] else 0.0


def maj_at_k(answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]], k: int, *,
             equivalent: Callable[[str, str], bool] | None = None) -> np.ndarray:
    """maj@k per problem (self-consistency, Wang et al. 2022, arXiv 2203.11171; DeepSeekMath's Maj@64,
    arXiv 2402.03300): 1.0 when the answer the most of ``k`` samples give is correct, else 0.0.

    The voters are the problem's first ``k`` samples in drawing order. Answers are grouped by
    ``equivalent`` (a task's ``answers_equivalent``: ``"18"``, ``"$18"`` and ``"18.0"`` one parsed
    answer; ``None``: string equality): each answer joins the first group whose first answer equals it or
    is ``equivalent`` to it (``equivalent(first, answer)``), else opens a group. A ``None`` answer does
    not vote (no votes: 0.0). The largest group wins; a tie goes to the group whose first answer was drawn
    first (lm-evaluation-harness's ``majority_vote`` filter, a ``Counter.most_common`` over extracted
    strings, breaks ties the same way). The winner is correct when the sample that first gave it is.

    >>> answers = [["7", "8", "8", None], ["3", "4", None, None]]
    >>> correct = [[False, True, True, False], [False, True, False, False]]
    >>> maj_at_k(answers, correct, 4).tolist(), maj_at_k(answers, correct, 1).tolist()
    ([1.0, 0.0], [0.0, 0.0])
    >>> same = lambda a, b: float(a.lstrip("$")) == float(b.lstrip("$"))
    >>> maj_at_k([["18", "$18", "18.0", "20", "20"]], [[True, True, True, False, False]], 5, equivalent=same).tolist()
    [1.0]

    Args:
        answers: per problem, the extracted answer of each of its ``n >= k`` samples (``str`` or
            ``None``), in sampling order.
        correct: per problem, whether each sample is correct; the same shape as ``answers``.
        k: voters per problem, an int ``>= 1``.
        equivalent: ``equivalent(a, b) -> bool`` on two answers (``str``); ``None``: string equality.

    Returns:
        float64 array, one 0.0 / 1.0 per problem.

    Raises:
        ValueError: ``k`` not an int ``>= 1``; ``answers`` and ``correct`` of different lengths;
            a problem with fewer than ``k`` samples, or with ``answers`` and ``correct`` of
            different lengths; an answer that is neither ``str`` nor ``None``; ``equivalent`` not callable.
    """
    if equivalent is not None and not callable(equivalent):
        raise ValueError(f"maj_at_k: equivalent must be a callable equivalent(a, b) -> bool, got "
                         f"{type(equivalent).__name__} {equivalent!r:.60}")
    if not is_int(k) or k < 1:
        raise ValueError(f"maj_at_k: k must be an int >= 1, got {k!r}")
    if len(answers) != len(correct):
        raise ValueError(f"maj_at_k: answers has {len(answers)} problems but correct has {len(correct)}")
    out = np.empty(len(answers), dtype=np.float64)
    for i, (ans, ok) in enumerate(zip(answers, correct)):
        if len(ans) != len(ok) or len(ans) < k:
            raise ValueError(f"maj_at_k: problem {i} has {len(ans)} answers and {len(ok)} correctness flags; "
                             f"both must be the same number n >= k={k}")
        bad = next((a for a in ans if a is not None and not isinstance(a, str)), None)
        if bad is not None:
            raise ValueError(f"maj_at_k: answers must be str or None, got {type(bad).__name__} {bad!r:.60} "
                             f"in problem {i}")
        out[i] = _majority_correct(list(ans), list(ok), k, equivalent)
    return out


# ------------------------------------------------------------------------------ evaluate_at_k
def _extractor(task, extract) -> Callable[[str], str | None] | None:
    """The answer extractor: ``extract``, else the task's optional ``extract_answer``, else ``None``."""
    if extract is None:
        extract = getattr(task, "extract_answer", None)
        if extract is None:
            return None
    if not callable(extract):
        raise ValueError(f"evaluate_at_k: extract must be a callable extract(completion) -> str | None, got "
                         f"{type(extract).__name__} {extract!r:.60}")
    return extract


def _sample_responses(policy, tokenizer, task, problems, *, n, temperature, max_new_tokens, batch_size, seed):
    """The per-response frame of :func:`grpo_lab.policy.rollout.evaluate` (``n`` samples per problem), drawn
    in eval mode from ``torch.manual_seed(seed)`` inside a forked RNG (the caller's RNG state and
    the policy's mode are left as they were)."""
    import torch

    from ..policy.rollout import evaluate

    device = next(policy.parameters()).device
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    was_training = policy.training
    try:
        policy.eval()
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            _, frame = evaluate(policy, tokenizer, task, problems, greedy=False, n_samples=n,
                                temperature=temperature, batch_size=batch_size, max_new_tokens=max_new_tokens)
    finally:
        policy.train(was_training)
    n_problems = len(frame) // n
    frame.insert(0, "problem", np.repeat(np.arange(n_problems), n))
    frame.insert(1, "sample", np.tile(np.arange(n), n_problems))
    return frame


def _per_problem(responses, *, n: int, ks: Sequence[int], voting: bool, equivalent=None):
    """One row per problem: its fields, ``n``, ``c``, mean length and truncation, and the metrics at each k."""
    per_sample = {"sample", "completion", "correct", "length", "truncated", "reasoning", "extracted"}
    groups = responses.groupby("problem", sort=True)
    table = groups[[col for col in responses.columns if col not in per_sample and col != "problem"]].first()
    table["n"] = n
    table["c"] = groups["correct"].sum().astype(np.int64)
    table["mean_length"] = groups["length"].mean()
    table["truncation_rate"] = groups["truncated"].mean()
    # pandas may turn a None of the object column into NaN when it groups it: None again (no vote)
    answers = ([[a if isinstance(a, str) else None for a in votes] for votes in groups["extracted"].agg(list)]
               if voting else None)
    correct = groups["correct"].agg(list).tolist()
    for k in ks:
        table[f"pass@{k}"] = pass_at_k(table["n"].to_numpy(), table["c"].to_numpy(), k)
        table[f"mean@{k}"] = mean_at_k(table["n"].to_numpy(), table["c"].to_numpy(), k)
        if voting:
            table[f"maj@{k}"] = maj_at_k(answers, correct, k, equivalent=equivalent)
    return table


def _summary(table, responses, *, ks: Sequence[int], voting: bool, level: float):
    """The summary frame of :func:`evaluate_at_k`."""
    import pandas as pd

    n_problems, rows = len(table), []
    for k in ks:
        for metric in ("pass", "mean", "maj") if voting else ("pass", "mean"):
            values = table[f"{metric}@{k}"].to_numpy()
            value = float(values.mean())
            row = {"metric": f"{metric}@{k}", "k": k, "value": value, "se": binomial_se(value, n_problems),
                   "lo": np.nan, "hi": np.nan, "successes": np.nan, "trials": n_problems}
            if np.isin(values, (0.0, 1.0)).all():  # a count of problems: its Wilson interval
                iv = wilson_interval(int(values.sum()), n_problems, level)
                row.update(lo=iv.lo, hi=iv.hi, successes=int(values.sum()))
            rows.append(row)
    correct, total = int(responses["correct"].sum()), len(responses)
    iv = wilson_interval(correct, total, level)
    rows.append({"metric": "sample_accuracy", "k": 1, "value": correct / total,
                 "se": binomial_se(correct / total, n_problems), "lo": iv.lo, "hi": iv.hi,
                 "successes": correct, "trials": total})
    return pd.DataFrame(rows).set_index("metric")


def evaluate_at_k(policy, tokenizer, task, *, n: int, ks: Sequence[int] = (1,), temperature: float = 1.0,
                  max_new_tokens: int | None = None, batch_size: int | None = None, seed: int = 0,
                  problems=None, extract: Callable[[str], str | None] | None = None, level: float = 0.95,
                  equivalent: Callable[[str, str], bool] | None = None):
    """pass@k, mean@k and maj@k of ``policy`` on a task's test set from ``n`` samples per problem.

    The ``n`` completions of each problem are sampled by :func:`grpo_lab.policy.rollout.evaluate` (eval mode)
    after ``torch.manual_seed(seed)`` inside ``torch.random.fork_rng`` (same arguments, same samples; the
    caller's random state untouched) and scored with ``task.is_correct``; each problem's ``c`` of ``n`` give
    :func:`pass_at_k` and :func:`mean_at_k`, the ``extract``-ed answers :func:`maj_at_k`.

    Args:
        policy, tokenizer: a ``transformers`` causal LM and its tokenizer.
        task, problems: a :class:`grpo_lab.tasks.Task`; the problems (default: ``task.test_set()``).
        n, ks: samples per problem (int ``>= 1``); the ``k`` values to report (ints in ``[1, n]``).
        temperature, max_new_tokens, seed: sampling temperature (``> 0``); budget (default: the task's); torch seed.
        batch_size: problems per ``generate`` call; default ``max(1, 256 // n)``.
        extract: ``extract(completion) -> str | None`` for maj@k (default: the task's ``extract_answer``, if any).
        equivalent: ``equivalent(a, b) -> bool``, how maj@k groups answers (:func:`maj_at_k`; default: the
            task's ``answers_equivalent``, if any, else string equality).
        level: confidence level of the Wilson intervals.

    Returns:
        ``(summary, per_problem, responses)`` DataFrames. ``summary`` by ``metric`` (``"pass@k"``, ``"mean@k"``,
        ``"maj@k"`` per k, ``"sample_accuracy"`` over all ``P * n`` responses): ``k``, ``value`` (mean over the
        ``P`` problems), ``se`` (``sqrt(value (1 - value) / P)``, an upper bound unless values are 0/1), ``lo``,
        ``hi`` (Wilson, for 0/1 values, else NaN), ``successes``, ``trials``. ``per_problem``: ``prompt``,
        ``answer``, scalar ``meta``, ``n``, ``c``, ``mean_length``, ``truncation_rate``, a column per metric and k.
        ``responses``: ``evaluate``'s frame with ``problem`` and ``sample`` first (and ``extracted``).

    Raises:
        ValueError: ``n``, ``batch_size`` or ``seed`` not an int of its range, ``ks`` empty or with
            a ``k`` outside ``[1, n]``, ``temperature <= 0``, ``level`` outside (0, 1), ``extract``
            or ``equivalent`` not callable; what :func:`grpo_lab.policy.rollout.evaluate` raises (no problems).
    """
    n = positive_int("evaluate_at_k: n", n)
    ks = tuple(ks)
    if not ks or any(not is_int(k) or not 1 <= k <= n for k in ks):
        raise ValueError(f"evaluate_at_k: ks must be a non-empty sequence of ints in [1, n={n}], got {ks!r}")
    positive_number("evaluate_at_k: temperature", temperature)
    if not 0 < level < 1:
        raise ValueError(f"evaluate_at_k: level must be in (0, 1), got {level!r}")
    if not is_int(seed) or seed < 0:
        raise ValueError(f"evaluate_at_k: seed must be an int >= 0, got {seed!r}")
    batch_size = positive_int("evaluate_at_k: batch_size", batch_size if batch_size is not None else max(1, 256 // n))
    extract = _extractor(task, extract)
    if equivalent is not None and not callable(equivalent):
        raise ValueError(f"evaluate_at_k: equivalent must be a callable equivalent(a, b) -> bool, got "
                         f"{type(equivalent).__name__} {equivalent!r:.60}")
    responses = _sample_responses(policy, tokenizer, task, problems, n=n, temperature=temperature,
                                  max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed)
    if extract is not None:
        responses["extracted"] = [extract(text) for text in responses["completion"]]
    equivalent = getattr(task, "answers_equivalent", None) if equivalent is None else equivalent
    table = _per_problem(responses, n=n, ks=ks, voting=extract is not None, equivalent=equivalent)
    return _summary(table, responses, ks=ks, voting=extract is not None, level=level), table, responses
