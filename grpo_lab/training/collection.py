"""The *collect* stage: sample a rollout (:func:`sample_rollout`), score it (:func:`score_rollout`: the task's
rewards, the algorithm's reward shaping), and draw rounds until enough groups are selected (:func:`~grpo_lab.training.collection.collect`,
DAPO's dynamic sampling, rounds sized by :func:`~grpo_lab.training.collection.round_size`). It hands on a :class:`~grpo_lab.training.trainer.Batch` of
:class:`~grpo_lab.training.trainer.Scored` rollouts.
"""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..algo import selection
from ..algo.algorithms import Algorithm
from ..policy.models import inference_copy
from ..policy.episodes import generate_episodes
from ..policy.rollout import Rollout, generate
from ..tasks import Problem, correctness, is_multi_turn
from ..tasks.dataset_task import RewardTrainerState
from .config import TrainerConfig
from .learning_signal import DynamicSamplingShortfallWarning
from .precision import Precision

__all__ = ["Scored", "Batch", "sample_rollout", "score_rollout", "collect", "round_size", "concat_rollouts",
           "completion_id_lists", "reward_trainer_state"]


@dataclass
class Scored:
    """One generated rollout with its rewards (the *collect* stage's unit).

    Attributes:
        rollout: the :class:`~grpo_lab.policy.rollout.Rollout`.
        raw: ``[B]`` float32 task rewards.
        correct: ``[B]`` bool raw correctness (``task.is_correct``).
        rewards: ``[B]`` float32 training rewards (``raw`` shaped by :func:`grpo_lab.algo.selection.shape`).
        functions: ``{name: [B] float32}`` each reward function's unweighted values (NaN: returned ``None``), for
            a task with ``function_rewards`` (:class:`~grpo_lab.tasks.DatasetTask`); else empty.
        logs: what the reward functions logged (the task's ``reward_logs()``: ``{"metrics": {name: float},
            "extra": {column: list}}``); empty for a task without it.
    """

    rollout: Rollout
    raw: torch.Tensor
    correct: torch.Tensor
    rewards: torch.Tensor
    functions: dict = field(default_factory=dict)
    logs: dict = field(default_factory=dict)


@dataclass
class Batch:
    """What one step trains on (the output of :func:`~grpo_lab.training.collection.collect`).

    Attributes:
        generated: every rollout generated this step, scored (for the metrics).
        rollout: the rows kept for the update (groups contiguous), or ``None`` when none was kept.
        rewards: ``[B]`` float32 training rewards of those rows.
        raw: ``[B]`` float32 task rewards of those rows, before shaping.
        loss_mask: ``[B, T]`` float32, the tokens that enter the loss.
        correct: ``[B]`` bool raw correctness of those rows (``task.is_correct``).
        values: ``[B, T]`` float32 value estimates when the trainer has a value model, else ``None``.
        advantages: ``[B]`` or ``[B, T]`` float32, filled by the *advantages* stage.
        returns: ``[B, T]`` float32 critic targets, filled by the *advantages* stage when there are
            values (:meth:`grpo_lab.algo.algorithms.Algorithm.value_targets`).
        selected_groups: groups the selector kept over all rounds, before the surplus of the
            last round was dropped (the numerator of the running keep rate, :func:`~grpo_lab.training.collection.round_size`).
        columns: per kept row, each reward function's value (``Scored.functions``) and each ``log_extra``
            column of one value per row, as lists (for the completions table); ``{}`` when there are none.
    """

    generated: list[Scored]
    rollout: Rollout | None = None
    rewards: torch.Tensor | None = None
    raw: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    correct: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    selected_groups: int = 0
    columns: dict = field(default_factory=dict)


# documented and pickled under their public import path
Scored.__module__ = Batch.__module__ = "grpo_lab.training.trainer"


def sample_rollout(policy, tokenizer, task, config: TrainerConfig, rng: np.random.Generator, amp: Precision,
                   max_new_tokens: int, n_prompts: int) -> Rollout:
    """One rollout of ``policy``: ``n_prompts`` questions drawn by ``task.sample(n, rng)``, G =
    ``config.group_size`` responses each (:func:`grpo_lab.policy.rollout.generate`, under ``amp``'s autocast; in a
    low-precision copy of the weights when ``config.rollout_dtype`` asks); for a multi-turn task (one with
    ``environment()``, :func:`grpo_lab.tasks.is_multi_turn`) episodes of :func:`grpo_lab.policy.episodes.generate_episodes`
    (``max_new_tokens`` the episode's budget, model and observation tokens).

    Raises:
        TypeError: ``task.sample(n, rng)`` did not return a list of exactly ``n``
            :class:`grpo_lab.tasks.Problem` with non-empty ``str`` prompts (the task protocol,
            :class:`grpo_lab.tasks.base.Task`); the message names the task and what it returned.
    """
    problems = task.sample(n_prompts, rng)
    _check_sampled(task, problems, n_prompts)
    sampler = policy
    if config.rollout_dtype != "float32":  # an "inference engine": a low-precision copy of the current weights
        sampler = inference_copy(policy, config.rollout_dtype, fp32_lm_head=config.rollout_fp32_lm_head)
    kw = dict(group_size=config.group_size, max_new_tokens=max_new_tokens, temperature=config.temperature,
              top_p=config.top_p, top_k=config.top_k)
    with amp.autocast():
        if is_multi_turn(task):  # episodes of model and environment turns (grpo_lab.tasks.environment)
            return generate_episodes(sampler, tokenizer, task, problems, **kw)
        return generate(sampler, tokenizer, problems, **kw)


def score_rollout(task, algo: Algorithm, ro: Rollout, max_new_tokens: int, *, trainer_state=None) -> Scored:
    """Task rewards and correctness of ``ro``, and the training reward (:func:`grpo_lab.algo.selection.shape`).

    Rewards come from the task's optional batched ``rewards(texts, problems)`` (one call), else from
    ``reward(text, problem)`` per response; correctness likewise from ``correct`` or ``is_correct``
    (:func:`grpo_lab.tasks.correctness`). A batched ``rewards`` that takes the keywords ``completion_ids`` /
    ``trainer_state`` gets the sampled ids of each row (EOS included, padding dropped: TRL's
    ``completion_ids``) and ``trainer_state``; the task's optional ``function_rewards`` / ``reward_logs`` fill
    ``Scored.functions`` / ``Scored.logs``. A multi-turn rollout's episode reward is the task's reward plus the
    sum of its per-turn rewards (``ro.extras["turn_rewards"]``), before shaping.

    Raises:
        TypeError: a reward that is not a real number, or ``rewards`` / ``correct`` returned a list of the
            wrong length or kind (the message names the sample index, its problem and its text).
        ValueError: a NaN or infinite reward (same details).
    """
    functions, logs = {}, {}
    if hasattr(task, "rewards"):  # the optional batched reward: one call per round
        kw = _reward_keywords(task.rewards, ro, trainer_state)
        raw = torch.tensor(_check_rewards(task.rewards(list(ro.texts), list(ro.problems), **kw), ro),
                           dtype=torch.float32)
        functions, logs = _function_columns(task, ro)
    else:
        raw = torch.tensor([_check_reward(task.reward(t, p), i, t, p)
                            for i, (t, p) in enumerate(zip(ro.texts, ro.problems))], dtype=torch.float32)
    if "turn_rewards" in ro.extras:  # a multi-turn episode: task reward + the environment's per-turn rewards
        raw = raw + ro.extras["turn_rewards"].to(raw)
    correct = torch.tensor(correctness(task, ro.texts, ro.problems))  # batched `correct` when offered
    shaped = selection.shape(algo, raw, ro.lengths.cpu(), max_new_tokens)
    return Scored(ro, raw, correct, shaped, functions, logs)


def reward_trainer_state(task, config: TrainerConfig, *, step: int, opt_steps: int,
                         end_step: int) -> RewardTrainerState:
    """The ``trainer_state`` the reward functions get while step ``step + 1`` is scored
    (:class:`~grpo_lab.tasks.dataset_task.RewardTrainerState`): ``global_step = opt_steps``, ``max_steps`` the
    optimiser updates at ``end_step`` (× ``epochs`` × ``minibatches``), ``epoch = step · prompts_per_step / rows``
    with ``rows`` the task's ``num_train_rows`` (0.0 for a task without it)."""
    per_step = config.epochs * config.minibatches
    rows = getattr(task, "num_train_rows", None)
    per_row = config.prompts_per_step / rows if isinstance(rows, int) and rows > 0 else 0.0
    return RewardTrainerState(global_step=int(opt_steps), max_steps=int(end_step) * per_step,
                              epoch=step * per_row, num_train_epochs=end_step * per_row, step=int(step))


def completion_id_lists(ro: Rollout) -> list[list[int]]:
    """Each row's sampled completion ids, EOS included, padding dropped (the ids where ``completion_mask`` is
    non-zero): what TRL passes reward functions as ``completion_ids``."""
    ids, mask = ro.completion_ids.cpu(), ro.completion_mask.cpu() != 0
    return [row[m].tolist() for row, m in zip(ids, mask)]


def _reward_keywords(rewards, ro: Rollout, trainer_state) -> dict:
    """The keywords ``completion_ids`` / ``trainer_state`` that a task's batched ``rewards`` takes, filled."""
    try:
        params = inspect.signature(rewards).parameters
    except (TypeError, ValueError):
        return {}
    kw = {}
    if "completion_ids" in params:
        kw["completion_ids"] = completion_id_lists(ro)
    if "trainer_state" in params and trainer_state is not None:
        kw["trainer_state"] = trainer_state
    return kw


def _function_columns(task, ro: Rollout) -> tuple[dict, dict]:
    """The task's last per-function values (``[B]`` float32, NaN for ``None``) and reward logs, when it keeps them
    (the values of :class:`~grpo_lab.tasks.DatasetTask`'s last ``rewards`` call, on this rollout)."""
    cached = getattr(task, "last_function_rewards", None)
    table = cached(list(ro.texts), list(ro.problems)) if callable(cached) else None
    functions = {} if table is None else {
        name: torch.tensor([float("nan") if v is None else v for v in values], dtype=torch.float32)
        for name, values in table.items()}
    logs = task.reward_logs() if callable(getattr(task, "reward_logs", None)) else {}
    return functions, logs


def collect(sample: Callable[[int], Scored], algo: Algorithm, config: TrainerConfig, rows: list[dict], *,
            step: int, pad_id: int, values: Callable[[Rollout], torch.Tensor] | None = None) -> Batch:
    """The *collect* stage: generate, score and select one step's training rows.

    Rounds of ``sample(n_prompts)`` (a scored rollout) are drawn until ``config.prompts_per_step`` groups were
    selected (:func:`grpo_lab.algo.selection.select_groups`; extras of the last round are dropped) or
    ``config.max_gen_rounds`` rounds were drawn. Keeping every group (the default selector) takes one round;
    DAPO's dynamic sampling (Eq. 11) may take several, sized by :func:`~grpo_lab.training.collection.round_size` from the history ``rows``.
    ``values``: the critic's values of the kept rows (``Batch.values``), or ``None`` without a critic.
    ``step``: the steps done (for the shortfall message); ``pad_id``: the tokenizer's pad id.

    Raises:
        RuntimeError: too few groups after ``max_gen_rounds`` with ``on_gen_rounds_exhausted="error"``.
    """
    c, G = config, config.group_size
    batch, parts, n_kept = Batch(generated=[]), [], 0
    while n_kept < c.prompts_per_step and len(batch.generated) < c.max_gen_rounds:
        n_prompts = round_size(c.prompts_per_step - n_kept, batch, c, rows) if batch.generated else c.prompts_per_step
        s = sample(n_prompts)
        batch.generated.append(s)
        selected = selection.select_groups(algo, s.correct, G, inputs={
            "rewards": s.rewards, "raw_rewards": s.raw, "lengths": (s.rollout.completion_mask != 0).sum(-1)})
        batch.selected_groups += len(selected)
        groups = selected[: c.prompts_per_step - n_kept]
        if len(groups) * G == len(s.rollout):
            parts.append((s.rollout, s.rewards, s.correct, s.raw))
            _add_columns(batch.columns, s, range(len(s.rollout)))
        elif len(groups):
            kept = (groups[:, None] * G + torch.arange(G)).flatten()
            parts.append((s.rollout.select(kept), s.rewards[kept], s.correct[kept], s.raw[kept]))
            _add_columns(batch.columns, s, kept.tolist())
        n_kept += len(groups)
    if n_kept < c.prompts_per_step:
        _short_of_groups(n_kept, c, step)
    if parts:
        batch.rollout = concat_rollouts([p[0] for p in parts], pad_id)
        batch.rewards = torch.cat([p[1] for p in parts])
        batch.correct = torch.cat([p[2] for p in parts])
        batch.raw = torch.cat([p[3] for p in parts])
        batch.loss_mask = selection.loss_mask(algo, batch.rollout.completion_mask, batch.rollout.truncated)
        if values is not None:
            batch.values = values(batch.rollout)
    return batch


def _add_columns(columns: dict, s: Scored, rows) -> None:
    """Append the kept ``rows`` of ``s``'s per-function values and per-row ``log_extra`` columns to ``columns``."""
    cols = {k: v.tolist() for k, v in s.functions.items()}
    cols.update({k: v for k, v in s.logs.get("extra", {}).items() if len(v) == len(s.rollout) and k not in cols})
    for k, v in cols.items():
        columns.setdefault(k, []).extend(v[i] for i in rows)


def round_size(missing: int, batch: Batch, config: TrainerConfig, rows: list[dict]) -> int:
    """Questions to sample in the next dynamic-sampling round when ``missing`` groups are still needed:
    ``prompts_per_step`` with ``config.topup=False``; otherwise ``min(prompts_per_step, ceil(missing /
    keep_rate))``, ``keep_rate`` the fraction of generated groups selected over the run so far (the history
    ``rows``' ``selected_groups`` / ``generated_groups`` plus this step's rounds in ``batch``);
    ``prompts_per_step`` while no group has been selected yet. Deterministic given the history (exact resume)."""
    c = config
    if not c.topup:
        return c.prompts_per_step
    generated = sum(len(s.rollout) for s in batch.generated) // c.group_size
    selected = batch.selected_groups
    for r in rows:
        if "generated_groups" in r and "selected_groups" in r:
            generated += int(r["generated_groups"])
            selected += int(r["selected_groups"])
    if selected == 0:
        return c.prompts_per_step
    return max(1, min(c.prompts_per_step, -(-missing * generated // selected)))  # integer ceil


def _short_of_groups(n_kept: int, c: TrainerConfig, step: int) -> None:
    """Dynamic sampling kept fewer than ``prompts_per_step`` groups: ``RuntimeError`` or a warning, as
    ``on_gen_rounds_exhausted`` says."""
    msg = (f"dynamic sampling: only {n_kept} of prompts_per_step={c.prompts_per_step} groups had mixed "
           f"accuracy (0 < acc < 1) after max_gen_rounds={c.max_gen_rounds} rounds at step {step + 1}")
    if c.on_gen_rounds_exhausted == "error":
        raise RuntimeError(msg + "; raise TrainerConfig.max_gen_rounds or set on_gen_rounds_exhausted='warn'")
    warnings.warn(msg + ("; training on those groups" if n_kept else "; skipping this step's update")
                  + " (TrainerConfig.max_gen_rounds bounds the extra generation)", DynamicSamplingShortfallWarning,
                  stacklevel=5)


def _check_sampled(task, problems, n: int) -> None:
    """``TypeError`` unless ``problems``, what ``task.sample(n, rng)`` returned, is a list (or tuple)
    of exactly ``n`` :class:`~grpo_lab.tasks.Problem` with non-empty ``str`` prompts. Cheap: one
    ``isinstance`` per problem, no call into the task."""
    if not isinstance(problems, (list, tuple)):
        wrong = f"a {type(problems).__name__} ({problems!r:.80})"
    elif len(problems) != n:
        wrong = f"{len(problems)} problems"
    else:
        wrong = next((f"a list whose item {i} is {type(p).__name__} {p!r:.80}" if not isinstance(p, Problem)
                      else f"a list whose item {i} has the prompt {p.prompt!r:.80}"
                      for i, p in enumerate(problems)
                      if not isinstance(p, Problem) or not isinstance(p.prompt, str) or not p.prompt), None)
        if wrong is None:
            return
    raise TypeError(f"task {getattr(task, 'name', '?')!r} ({type(task).__name__}): sample({n}, rng) returned {wrong}; "
                    f"the task protocol (grpo_lab.tasks.Task) needs a list of exactly {n} grpo_lab.tasks.Problem "
                    "with a non-empty str prompt each, e.g. [Problem(prompt='2+3=', answer='5'), ...]")


def _check_reward(value, index: int, text: str, problem, method: str = "reward") -> float:
    """A task's reward as a python float; a clear error naming the sample when it is not a real number."""
    if not isinstance(value, numbers.Real):
        if not (torch.is_tensor(value) and value.numel() == 1 and not value.dtype.is_complex):
            raise TypeError(f"task.{method} returned {value!r} ({type(value).__name__}) for sample {index} "
                            f"(prompt {problem.prompt!r}, completion {text!r}); a reward must be a real number")
    r = float(value)
    if not math.isfinite(r):
        raise ValueError(f"task.{method} returned {r} for sample {index} (prompt {problem.prompt!r}, "
                         f"completion {text!r}); a reward must be finite")
    return r


def _check_rewards(values, ro: Rollout) -> list[float]:
    """What a task's batched ``rewards(texts, problems)`` returned for the rollout ``ro``, as python
    floats: ``TypeError`` unless it is a sequence of one real number per response, ``ValueError``
    for a NaN or infinity (both naming the sample)."""
    if torch.is_tensor(values) or isinstance(values, np.ndarray):
        values = values.tolist()
    if not isinstance(values, (list, tuple)) or len(values) != len(ro.texts):
        got = f"{len(values)} values" if isinstance(values, (list, tuple)) else f"{type(values).__name__} {values!r:.60}"
        raise TypeError(f"task.rewards returned {got} for {len(ro.texts)} completions; it must return a list of one "
                        "real number per completion, in order")
    return [_check_reward(v, i, t, p, "rewards") for i, (v, t, p) in enumerate(zip(values, ro.texts, ro.problems))]


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """One :class:`~grpo_lab.policy.rollout.Rollout` from several (the kept groups of several dynamic-sampling rounds).

    Rollouts of different prompt / completion widths are padded to the widest: prompts on the
    **left** (pad id, mask 0), completions, masks and behaviour log-probs on the **right** (pad
    id, 0, 0), keeping the layout of :func:`grpo_lab.policy.rollout.generate`; position ids derive from
    the masks, so the extra padding changes no real token's position; top-p / top-k kept sets (``kept_ids``) are
    padded with ``-1`` in both their token and their kept-set dimension. Rows stay in order, so
    groups stay contiguous. Per-row ``extras`` tensors are concatenated when every part has them.

    Raises:
        ValueError: no parts, or parts with different ``group_size`` / ``temperature``, or with and without kept sets
            or observation masks.
    """
    if not parts:
        raise ValueError("concat_rollouts: no rollouts given")
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if any(r.group_size != first.group_size or r.temperature != first.temperature for r in parts):
        raise ValueError("concat_rollouts: rollouts differ in group_size or temperature")
    if len({r.observation_mask is None for r in parts}) > 1:
        raise ValueError("concat_rollouts: some rollouts are multi-turn (observation_mask) and others are not")
    if len({r.kept_ids is None for r in parts}) > 1:
        raise ValueError("concat_rollouts: some rollouts record top-p / top-k kept sets and others do not")
    P = max(r.prompt_ids.shape[1] for r in parts)
    T = max(r.completion_ids.shape[1] for r in parts)

    def left(x, width, value):
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x, width, value):
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    extras = {}
    for k, v in first.extras.items():
        vs = [r.extras.get(k) for r in parts]
        if all(torch.is_tensor(x) and x.shape[:1] == r.truncated.shape for x, r in zip(vs, parts)):
            try:
                extras[k] = torch.cat(vs)
            except RuntimeError:
                pass
    return Rollout(
        prompt_ids=torch.cat([left(r.prompt_ids, P, pad_id) for r in parts]),
        prompt_mask=torch.cat([left(r.prompt_mask, P, 0) for r in parts]),
        completion_ids=torch.cat([right(r.completion_ids, T, pad_id) for r in parts]),
        completion_mask=torch.cat([right(r.completion_mask, T, 0.0) for r in parts]),
        behaviour_logp=torch.cat([right(r.behaviour_logp, T, 0.0) for r in parts]),
        truncated=torch.cat([r.truncated for r in parts]),
        texts=[t for r in parts for t in r.texts], problems=[p for r in parts for p in r.problems],
        group_size=first.group_size, temperature=first.temperature,
        gen_seconds=sum(r.gen_seconds for r in parts), extras=extras, kept_ids=_concat_kept(parts, T),
        observation_mask=None if first.observation_mask is None else torch.cat(
            [right(r.observation_mask.long(), T, 0) for r in parts]).bool(),
    )


def _concat_kept(parts: list[Rollout], T: int) -> torch.Tensor | None:
    """The parts' int32 ``[b, t, K]`` kept sets side by side, padded with ``-1`` to ``T`` columns and the largest
    ``K``; ``None`` when the parts have none."""
    if parts[0].kept_ids is None:
        return None
    K = max(r.kept_ids.shape[2] for r in parts)
    return torch.cat([torch.nn.functional.pad(r.kept_ids, (0, K - r.kept_ids.shape[2], 0, T - r.kept_ids.shape[1]),
                                              value=-1) for r in parts])
