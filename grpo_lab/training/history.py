"""The history rows: one per step (:func:`history_row`: rewards, lengths, the update's metrics, timings,
memory) and the test-set evaluations that join them (:func:`evaluation_row`). :data:`HISTORY_COLUMNS` describes
every column; :data:`MEASURED_COLUMNS` names those that measure the machine rather than the run.
"""

from __future__ import annotations

import functools
import math
import numbers
import time
import warnings

import numpy as np
import pandas as pd
import torch

from ..algo import selection
from ..algo import advantages as _adv
from ..algo.advantages import tied_groups
from ..algo.metrics import reduce_updates
from ..algo.objectives import METRIC_KEYS
from ..policy.episodes import generate_episodes
from ..policy.rollout import evaluate
from ..tasks import is_multi_turn
from .callbacks import samples_table
from .collection import Batch
from .config import TrainerConfig
from .memory import peak_memory_mb
from .precision import Precision
from .update import UpdateResult
from .value_model import value_metrics

__all__ = ["HISTORY_COLUMNS", "MEASURED_COLUMNS", "history_row", "evaluation_row", "evaluate_frame",
           "sample_metrics", "completions_table", "turn_metrics", "episode_sampler"]

#: The history columns that measure the machine rather than the run, namely wall times, throughput and
#: memory. They differ between two runs that are otherwise bit-identical (a resumed run, a run in another
#: process), so drop them before comparing histories.
MEASURED_COLUMNS = ("tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "peak_mem_mb")

#: Every column a history row may hold, ``{name: description}``. The step's sample columns (reward, accuracy,
#: lengths, reasoning_frac, tied_group_frac, truncation_rate, tokens_per_s, gen_seconds) cover every sample
#: generated in the step (all dynamic-sampling rounds, before filtering); the loss, ratio, clip, KL, entropy and
#: gradient columns cover the tokens of the update batch that enter the loss, each reduced over the step's optimiser
#: steps as the metric says (:mod:`grpo_lab.algo.metrics`). A step that made no update
#: (dynamic sampling kept no group) has NaN update columns. ``test_<name>`` / ``test_sampled_<name>`` columns of
#: the task's optional ``test_metrics(frame)`` and ``model_metrics(model)`` are not listed.
HISTORY_COLUMNS = {
    "step": "updates made (0: the base policy's evaluation)",
    "reward": "mean shaped reward (task reward + overlong penalty), every sample generated",
    "accuracy": "mean raw correctness (task.is_correct), every sample generated",
    "length": "mean completion length, tokens incl. EOS",
    "length_correct": "mean length of correct samples (NaN when none)",
    "length_incorrect": "mean length of incorrect samples (NaN when none)",
    "entropy": "policy entropy, nats/token, over the first epoch's loss tokens",
    "grad_norm": "policy gradient norm before clipping, mean over the step's optimiser steps",
    "zero_adv_group_frac": "fraction of groups whose advantages are all 0 (no policy-gradient signal): for the "
                           "group-baseline estimators (group, group_mean, batch, rloo) the tied groups of all "
                           "generated rows (tied_group_frac; their advantages are exactly 0), for any other "
                           "(gae, a registered one) the trained groups whose advantages are all 0 at real tokens",
    "tied_group_frac": "fraction of groups whose rewards are all equal (grpo_lab.algo.advantages.tied_groups), all "
                       "generated rows, every estimator (a value baseline such as gae still has a signal there)",
    "truncation_rate": "fraction of samples cut at the generation budget",
    "reasoning_frac": "fraction of samples the task calls reasoning (tasks with is_reasoning)",
    "turns_mean": "multi-turn tasks: model turns per episode, mean over every episode generated",
    "tool_calls_mean": "multi-turn tasks: environment steps (tool calls) per episode, mean",
    "observation_token_frac": "multi-turn tasks: observation tokens / (model + observation tokens), every episode",
    "tokens_per_s": "generated tokens / step wall time (measured)",
    "gen_seconds": "wall time of generation (measured)",
    "step_seconds": "wall time of the step, evaluation excluded (measured)",
    "peak_mem_mb": "peak CUDA allocation, or on Linux CPUs the peak resident set, of the step, MiB (measured)",
    "amp_skipped_steps": "float16: optimiser steps skipped for overflow so far",
    "amp_scale": "float16: the gradient scaler's scale",
    "lr": "the policy's learning rate in the step's last optimiser update (NaN without one)",
    "routing_change_frac": "MoE: fraction of routing decisions the rollout's first optimiser step changed "
                           "(GSPO arXiv 2507.18071 §5.3); NaN for dense policies or a single update",
    "loss": "the policy loss (grpo_lab.algo.objectives.policy_loss)",
    "pg_loss": "policy-gradient part of the loss",
    "kl": "KL term (NaN without one)",
    "clip_frac_low": "fraction of loss tokens clipped below", "clip_frac_high": "fraction clipped above",
    "clip_frac": "fraction of loss tokens clipped",
    "ratio_mean": "importance ratio π_θ/π_old, mean", "ratio_min": "its minimum", "ratio_max": "its maximum",
    "ratio_q05": "its 5% quantile", "ratio_q50": "its median", "ratio_q95": "its 95% quantile",
    "grad_token_frac": "fraction of loss tokens with a gradient",
    "adv_abs_mean": "mean |advantage| over loss tokens",
    "num_tokens": "loss tokens of the update (a normaliser of the loss), mean over the step's optimiser steps; "
                  "not TRL's num_tokens, which counts every prompt and completion token seen so far: that is the "
                  "running sum of input_tokens (logged as num_tokens under metric_names='trl')",
    "input_tokens": "prompt + completion tokens (padding excluded) of every sample generated in the step",
    "reward_std": "std of the shaped reward (Bessel-corrected, TRL's nanstd), every sample generated (NaN for one)",
    "reward_min": "smallest shaped reward, every sample generated", "reward_max": "largest shaped reward",
    "length_min": "shortest completion, tokens incl. EOS", "length_max": "longest completion",
    "length_terminated_mean": "mean length of the samples that ended with EOS (NaN when none did; TRL logs 0)",
    "length_terminated_min": "shortest of those", "length_terminated_max": "longest of those",
    "num_sequences": "sequences with a loss token (a normaliser of the loss)",
    "offpolicy_masked_frac": "fraction of sequences DeepSeek-V3.2's off-policy mask drops",
    "clip_high_prob_mean": "mean π_old probability of tokens clipped above",
    "clip_high_prob_max": "largest π_old probability of a token clipped above",
    "token_prob_mean": "mean π_θ probability of loss tokens",
    "seq_clip_frac": "fraction of sequences clipped (sequence-level ratios, GSPO)",
    "seq_ratio_mean": "sequence-level ratio, mean", "seq_ratio_min": "its minimum", "seq_ratio_max": "its maximum",
    "seq_ratio_abs_dev": "mean |sequence ratio - 1|", "token_ratio_abs_dev": "mean |token ratio - 1|",
    "value_loss": "critic loss, summed over micro-batches (NaN without a critic)",
    "ntp_loss": "next-token-prediction loss (Algorithm.ntp_coef > 0)",
    "nll_loss": "VAPO's positive-example LM loss (Eqs. 9-10), unweighted (Algorithm.nll_coef > 0)",
    "adv_mean": "advantage mean over loss tokens", "adv_std": "advantage std (population)",
    "adv_min": "advantage minimum", "adv_max": "advantage maximum",
    "explained_variance": "of the critic's targets by its values, before the update (NaN without a critic)",
    "explained_variance_mc": "of the Monte-Carlo returns by the critic's values (comparable across critics)",
    "value_mean": "mean critic value over loss tokens", "return_mean": "mean critic target over loss tokens",
    "gen_rounds": "dynamic-sampling rounds drawn", "generated_groups": "groups generated",
    "selected_groups": "groups the selector kept", "trained_groups": "groups trained on",
    "samples_per_trained": "samples generated per sample trained",
    "overlong_frac_penalised": "fraction of samples given DAPO's overlong penalty",
    "test_accuracy": "greedy test accuracy after `step` updates (NaN on steps without evaluation)",
    "test_length": "greedy test mean length", "test_reasoning_frac": "greedy test reasoning fraction",
    "test_accuracy_sampled": "sampled test accuracy (TrainerConfig.eval_sampled)",
    "eval_seconds": "wall time of the evaluation, not in step_seconds (measured)",
}


#: the package's group-baseline estimators, whose zero-advantage groups are exactly the tied groups of all generated
#: rows (a group baseline gives a tied group advantage exactly 0); any other estimator (``gae``: a value baseline
#: gives a tied group a signal) is counted from the advantages it computed
_TIED_RULE = {k: _adv.ADVANTAGE_ESTIMATORS[k] for k in ("group", "group_mean", "batch", "rloo")}


def tied_group_frac(shaped: torch.Tensor, G: int) -> float:
    """``tied_group_frac``: the fraction of tied groups (:func:`grpo_lab.algo.advantages.tied_groups`) among all rows
    generated this step, from the training rewards ``shaped`` (``[B]``, ``B`` a multiple of ``G``); every estimator."""
    return float(tied_groups(shaped, G).float().mean())


def zero_advantage_group_frac(batch: Batch, algo, shaped: torch.Tensor, G: int) -> float:
    """``zero_adv_group_frac``: for the package's group-baseline estimators (``group``, ``group_mean``, ``batch``,
    ``rloo``) :func:`tied_group_frac` (a tied group's advantages are exactly 0); for any other estimator (``gae``,
    a registered one), the fraction of the trained groups whose advantages, as computed, are all 0 (over each row's
    loss tokens for ``[B, T]`` advantages); NaN when nothing was trained."""
    if _TIED_RULE.get(algo.advantage) is _adv.ADVANTAGE_ESTIMATORS.get(algo.advantage):
        return tied_group_frac(shaped, G)
    adv = batch.advantages
    if adv is None or adv.shape[0] == 0:
        return float("nan")
    if adv.dim() == 2:
        zero = ((adv.cpu() == 0) | (batch.loss_mask.cpu() == 0)).all(dim=-1)
    else:
        zero = adv.cpu() == 0
    return float(zero.view(-1, G).all(dim=-1).float().mean())


def history_row(batch: Batch, update: UpdateResult | None, *, config: TrainerConfig, algo, task, amp: Precision,
                lr: float, seconds: float) -> dict:
    """The history row of one step (:data:`HISTORY_COLUMNS`) from its ``batch``, its ``update`` (``None`` when
    the step made none), the policy's current learning rate ``lr`` and the step's wall time ``seconds``."""
    G, gen = config.group_size, batch.generated
    updates, grad_norms, entropies = (update.metrics, update.grad_norms, update.entropies) if update else ([], [], [])
    raw, shaped = torch.cat([s.raw for s in gen]), torch.cat([s.rewards for s in gen])
    correct = torch.cat([s.correct for s in gen])
    lengths = torch.cat([s.rollout.lengths.float().cpu() for s in gen])
    n_tok = sum(n for _, n in entropies)
    applied = [g for g in grad_norms if math.isfinite(g)]  # float16: skipped (overflowed) steps have none
    row = {
        "reward": float(shaped.mean()),
        "accuracy": float(correct.float().mean()),
        "length": float(lengths.mean()),
        "length_correct": float(lengths[correct].mean()) if correct.any() else float("nan"),
        "length_incorrect": float(lengths[~correct].mean()) if (~correct).any() else float("nan"),
        "entropy": sum(e for e, _ in entropies) / max(n_tok, 1.0) if entropies else float("nan"),
        "grad_norm": float(np.mean(applied)) if applied else float("nan"),
        "zero_adv_group_frac": zero_advantage_group_frac(batch, algo, shaped, G),
        "tied_group_frac": tied_group_frac(shaped, G),
        "truncation_rate": float(torch.cat([s.rollout.truncated.cpu() for s in gen]).float().mean()),
        "tokens_per_s": sum(float(s.rollout.completion_mask.sum()) for s in gen) / seconds,
        "gen_seconds": sum(s.rollout.gen_seconds for s in gen),
        "step_seconds": seconds,
    }
    row.update(turn_metrics(gen))
    if hasattr(task, "is_reasoning"):
        row["reasoning_frac"] = float(np.mean([task.is_reasoning(t) for s in gen for t in s.rollout.texts]))
    row.update(value_metrics(batch, algo.gamma))
    row["peak_mem_mb"] = peak_memory_mb(config.device)
    if amp.scaler.is_enabled():
        row["amp_skipped_steps"] = amp.skipped_steps
        row["amp_scale"] = float(amp.scaler.get_scale())
    row.update(reduce_updates(updates))
    row["lr"] = float(lr) if updates else float("nan")  # the step's last optimiser update's (lr_schedule)
    row.setdefault("routing_change_frac", float("nan"))  # dense policy, or no second update on the rollout
    if not updates:  # no update this step: the loss metrics exist and are NaN (even if no step ever updated)
        row.update({k: float("nan") for k in METRIC_KEYS if k not in row})
    n_trained = len(batch.rollout) if batch.rollout is not None else 0
    row.update(selection.sampling_metrics(raw, shaped, len(lengths), n_trained, len(gen), G,
                                         n_selected=batch.selected_groups * G))
    for k, v in sample_metrics(gen).items():
        if k in row:  # a name a reward function logged (log_metric) never replaces a column
            warnings.warn(f"log_metric({k!r}, ...): {k!r} is a history column of its own; the logged value is "
                          "dropped (log it under another name)", RuntimeWarning, stacklevel=2)
        else:
            row[k] = v
    return row


def turn_metrics(gen: list) -> dict:
    """Multi-turn episodes' columns (``gen``: a step's :class:`~grpo_lab.training.trainer.Scored` rounds, from
    :func:`grpo_lab.policy.episodes.generate_episodes`): ``turns_mean`` (model turns per episode),
    ``tool_calls_mean`` (environment steps per episode), ``observation_token_frac`` (observation tokens over all
    completion tokens, model and observation); ``{}`` for single-turn rollouts."""
    if not gen or "turns" not in gen[0].rollout.extras:
        return {}
    cat = {k: torch.cat([s.rollout.extras[k].float().cpu() for s in gen]) for k in ("turns", "tool_calls",
                                                                                  "observation_tokens")}
    model = sum(float(s.rollout.completion_mask.ne(0).sum()) for s in gen)
    obs = float(cat["observation_tokens"].sum())
    return {"turns_mean": float(cat["turns"].mean()), "tool_calls_mean": float(cat["tool_calls"].mean()),
            "observation_token_frac": obs / (obs + model) if obs + model else float("nan")}


def _nanstd(x: torch.Tensor) -> float:
    """Bessel-corrected std of the non-NaN entries of ``x`` (TRL's ``nanstd``); NaN for fewer than two."""
    x = x[~torch.isnan(x)].double()
    return float(x.std()) if x.numel() > 1 else float("nan")


def sample_metrics(gen: list) -> dict:
    """The columns a TRL / verl user reads that describe the samples generated in a step (``gen``: its
    :class:`~grpo_lab.training.trainer.Scored` rounds): ``reward_std``, ``reward_min`` / ``max``, ``length_min`` /
    ``max``, ``length_terminated_*``, ``input_tokens``; per reward function (a task with ``function_rewards``)
    ``rewards/<name>/mean`` and ``/std`` of its unweighted values over the samples it applied to (TRL's
    ``nanmean`` / ``nanstd``; NaN where it applied to none); and the mean of each value a reward function gave
    ``log_metric`` (its own name)."""
    shaped = torch.cat([s.rewards for s in gen]).float()
    lengths = torch.cat([s.rollout.lengths.float().cpu() for s in gen])
    ended = lengths[~torch.cat([s.rollout.truncated.cpu() for s in gen])]
    nan = float("nan")
    out = {"reward_std": _nanstd(shaped), "reward_min": float(shaped.min()), "reward_max": float(shaped.max()),
           "length_min": float(lengths.min()), "length_max": float(lengths.max()),
           "length_terminated_mean": float(ended.mean()) if len(ended) else nan,
           "length_terminated_min": float(ended.min()) if len(ended) else nan,
           "length_terminated_max": float(ended.max()) if len(ended) else nan,
           "input_tokens": float(sum(float(s.rollout.prompt_mask.ne(0).sum()) for s in gen)
                                 + sum(float(s.rollout.completion_mask.ne(0).sum()) for s in gen))}
    for name in (gen[0].functions if gen else {}):
        col = torch.cat([s.functions[name] for s in gen])
        got = col[~torch.isnan(col)]
        out[f"rewards/{name}/mean"] = float(got.double().mean()) if len(got) else nan
        out[f"rewards/{name}/std"] = _nanstd(col)
    logged: dict[str, list] = {}
    for s in gen:
        for k, v in s.logs.get("metrics", {}).items():
            logged.setdefault(k, []).append(v)
    for k, v in logged.items():
        if k in out:  # a logged name never replaces a built-in column (history_row checks the others)
            warnings.warn(f"log_metric({k!r}, ...): {k!r} is a history column of its own; the logged value is "
                          "dropped (log it under another name)", RuntimeWarning, stacklevel=2)
        else:
            out[k] = float(np.mean(v))
    return out


def completions_table(batch: Batch, step: int) -> pd.DataFrame:
    """The table of the step's trained completions (TRL's ``log_completions``): one row per trained sample, columns
    ``step``, ``prompt``, ``completion``, ``reward`` (the training reward), one per reward function (its unweighted
    value, NaN where it returned ``None``), the columns reward functions gave ``log_extra``, and ``advantage`` (the
    sample's advantage; a per-token advantage is averaged over its loss tokens). Empty when nothing was trained."""
    ro = batch.rollout
    if ro is None:
        return pd.DataFrame(columns=["step", "prompt", "completion", "reward", "advantage"])
    table = {"step": [step] * len(ro), "prompt": [p.prompt for p in ro.problems], "completion": list(ro.texts),
             "reward": batch.rewards.tolist()}
    table.update({k: list(v) for k, v in (batch.columns or {}).items() if len(v) == len(ro)})
    adv = batch.advantages
    if adv is not None and adv.dim() == 2:
        m = batch.loss_mask.to(adv.device)
        adv = (adv * m).sum(-1) / m.sum(-1).clamp(min=1)
    table["advantage"] = adv.float().cpu().tolist() if adv is not None else [float("nan")] * len(ro)
    return pd.DataFrame(table)


def evaluate_frame(policy, tokenizer, task, config: TrainerConfig, amp: Precision, max_new_tokens: int, *,
                   greedy: bool) -> tuple[dict, pd.DataFrame]:
    """Test-set summary and per-problem frame of :func:`grpo_lab.policy.rollout.evaluate` for ``policy`` now,
    under ``amp``'s autocast; the torch RNG state is restored afterwards (a sampled evaluation advances no
    training RNG)."""
    state = torch.random.get_rng_state()
    try:
        with amp.autocast():
            return evaluate(policy, tokenizer, task, greedy=greedy, temperature=config.temperature,
                            max_new_tokens=max_new_tokens, batch_size=config.eval_batch_size,
                            sampler=episode_sampler(task))
    finally:
        torch.random.set_rng_state(state)


def episode_sampler(task):
    """For a multi-turn task (:func:`grpo_lab.tasks.is_multi_turn`) a sampler with
    :func:`grpo_lab.policy.rollout.generate`'s signature that runs its episodes
    (:func:`grpo_lab.policy.episodes.generate_episodes`, ``task`` bound); ``None`` (plain ``generate``) otherwise."""
    if not is_multi_turn(task):
        return None
    return functools.partial(_task_episodes, task)


def _task_episodes(task, model, tokenizer, problems, **kw):
    """:func:`grpo_lab.policy.episodes.generate_episodes` with the task in ``generate``'s argument order."""
    return generate_episodes(model, tokenizer, task, problems, **kw)


def evaluation_row(policy, tokenizer, task, config: TrainerConfig, amp: Precision, max_new_tokens: int,
                   step: int) -> tuple[dict, pd.DataFrame]:
    """The evaluation columns after ``step`` updates (``step``, ``test_*``, ``eval_seconds``) and the samples
    table of the greedy evaluation (:func:`~grpo_lab.training.callbacks.samples_table`), which ``Trainer.train``
    hands to the callbacks' ``on_evaluate``."""
    t0 = time.perf_counter()
    row = {"step": step}
    s, frame = evaluate_frame(policy, tokenizer, task, config, amp, max_new_tokens, greedy=True)
    row["test_accuracy"] = s["accuracy"]
    row["test_length"] = s["mean_length"]
    if "reasoning_frac" in s:
        row["test_reasoning_frac"] = s["reasoning_frac"]
    extra = getattr(task, "test_metrics", None)
    if callable(extra):  # optional task member: more columns from the per-problem frame
        row.update({f"test_{k}": float(v) for k, v in extra(frame).items()})
    row.update(_model_metrics(task, policy, amp, row))
    if config.eval_sampled:
        s2, frame2 = evaluate_frame(policy, tokenizer, task, config, amp, max_new_tokens, greedy=False)
        row["test_accuracy_sampled"] = s2["accuracy"]
        if callable(extra):
            row.update({f"test_sampled_{k}": float(v) for k, v in extra(frame2).items()})
    row["eval_seconds"] = time.perf_counter() - t0
    return row, samples_table(frame)


def _model_metrics(task, policy, amp: Precision, row: dict) -> dict:
    """The task's optional ``model_metrics(model)`` as ``test_<name>`` columns (none without it), computed
    in eval mode without grad under ``amp``'s autocast, the torch RNG state restored.

    Raises:
        TypeError: it returned something other than a dict of ``str`` names to real numbers (the entry named).
        ValueError: a name whose column the evaluation already fills (``row``'s, or the sampled evaluation's
            ``test_accuracy_sampled`` / ``test_sampled_*``).
    """
    metrics = getattr(task, "model_metrics", None)
    if not callable(metrics):
        return {}
    state, was_training = torch.random.get_rng_state(), policy.training
    policy.eval()
    try:
        with torch.no_grad(), amp.autocast():
            got = metrics(policy)
    finally:
        policy.train(was_training)
        torch.random.set_rng_state(state)
    where = f"{type(task).__name__}.model_metrics"
    if not isinstance(got, dict):
        raise TypeError(f"{where} must return a dict of names to numbers, got {type(got).__name__}")
    out = {}
    for k, v in got.items():
        if not isinstance(k, str) or not isinstance(v, numbers.Real) or isinstance(v, bool):
            raise TypeError(f"{where}: each entry must be a str name and a real number, got "
                            f"{k!r}: {v!r:.60}")
        col = f"test_{k}"
        if col in row or col == "test_accuracy_sampled" or k.startswith("sampled_"):
            raise ValueError(f"{where}: the name {k!r} would replace the evaluation's column {col}; rename it")
        out[col] = float(v)
    return out
