"""The *collect* stage: sample a rollout, score it, select the groups to train on.

:class:`~grpo_lab.training.trainer.Trainer`'s :meth:`~grpo_lab.training.trainer.Trainer.rollout` (generation, in a
low-precision copy of the weights when ``TrainerConfig.rollout_dtype`` asks),
:meth:`~grpo_lab.training.trainer.Trainer.score` (the task's rewards and the algorithm's reward shaping),
:meth:`~grpo_lab.training.trainer.Trainer.collect` (rounds of generation until enough groups are selected:
DAPO's dynamic sampling) and :meth:`~grpo_lab.training.trainer.Trainer.round_size` (the size of the next
round) live here, in the mixin ``Collection``, with what the stage hands on:
:class:`~grpo_lab.training.trainer.Scored` and :class:`~grpo_lab.training.trainer.Batch`.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ..algo import selection
from ..policy.models import inference_copy
from ..policy.rollout import Rollout, generate
from ..tasks import Problem, correctness
from .learning_signal import DynamicSamplingShortfallWarning

__all__ = ["Scored", "Batch"]


@dataclass
class Scored:
    """One generated rollout with its rewards (the *collect* stage's unit).

    Attributes:
        rollout: the :class:`~grpo_lab.policy.rollout.Rollout`.
        raw: ``[B]`` float32 task rewards.
        correct: ``[B]`` bool raw correctness (``task.is_correct``).
        rewards: ``[B]`` float32 training rewards (``raw`` shaped by :func:`grpo_lab.algo.selection.shape`).
    """

    rollout: Rollout
    raw: torch.Tensor
    correct: torch.Tensor
    rewards: torch.Tensor


@dataclass
class Batch:
    """What one step trains on (the output of :meth:`Trainer.collect`).

    Attributes:
        generated: every rollout generated this step, scored (for the metrics).
        rollout: the rows kept for the update (groups contiguous), or ``None`` when none was kept.
        rewards: ``[B]`` float32 training rewards of those rows.
        loss_mask: ``[B, T]`` float32, the tokens that enter the loss.
        correct: ``[B]`` bool raw correctness of those rows (``task.is_correct``).
        values: ``[B, T]`` float32 value estimates when the trainer has a value model, else ``None``.
        advantages: ``[B]`` or ``[B, T]`` float32, filled by the *advantages* stage.
        returns: ``[B, T]`` float32 critic targets, filled by the *advantages* stage when there are
            values (:meth:`grpo_lab.algo.algorithms.Algorithm.value_targets`).
        selected_groups: groups the selector kept over all rounds, before the surplus of the
            last round was dropped (the numerator of the running keep rate, :meth:`Trainer.round_size`).
    """

    generated: list[Scored]
    rollout: Rollout | None = None
    rewards: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    correct: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    selected_groups: int = 0


# documented and pickled under their public import path
Scored.__module__ = Batch.__module__ = "grpo_lab.training.trainer"


class Collection:
    """The *collect* stage of :class:`grpo_lab.training.trainer.Trainer`. Reads ``config``, ``task``, ``algo``,
    ``policy``, ``tokenizer``, ``rng``, ``max_new_tokens``, ``rows``, ``step`` and ``value_model``;
    calls ``_autocast`` and ``_values``."""

    def rollout(self, n_prompts: int | None = None) -> Rollout:
        """Sample one rollout (``n_prompts`` questions, default ``prompts_per_step``, × G responses)
        with the current policy.

        Raises:
            TypeError: ``task.sample(n, rng)`` did not return a list of exactly ``n``
                :class:`grpo_lab.tasks.Problem` with non-empty ``str`` prompts (the task protocol,
                :class:`grpo_lab.tasks.base.Task`); the message names the task and what it returned.
        """
        c = self.config
        n = c.prompts_per_step if n_prompts is None else n_prompts
        problems = self.task.sample(n, self.rng)
        _check_sampled(self.task, problems, n)
        sampler = self.policy
        if c.rollout_dtype != "float32":  # an "inference engine": a low-precision copy of the current weights
            sampler = inference_copy(self.policy, c.rollout_dtype, fp32_lm_head=c.rollout_fp32_lm_head)
        with self._autocast():
            return generate(sampler, self.tokenizer, problems, group_size=c.group_size,
                            max_new_tokens=self.max_new_tokens, temperature=c.temperature)

    def score(self, ro: Rollout) -> Scored:
        """Task rewards and correctness of a rollout, and the training reward (:func:`grpo_lab.algo.selection.shape`).

        The rewards come from the task's optional batched ``rewards(texts, problems)``, called once
        for the rollout, when it has one; otherwise from ``reward(text, problem)``, once per response.
        Correctness likewise comes from the optional batched ``correct(texts, problems)``, called once
        after the rewards on the same lists, else from ``is_correct`` once per response
        (:func:`grpo_lab.tasks.correctness`).

        Raises:
            TypeError: the task returned a reward that is not a real number (e.g. ``None`` or a
                string), or ``rewards`` / ``correct`` returned a list of the wrong length or of the
                wrong kind; the message names the sample index, its problem and its text.
            ValueError: a NaN or infinite reward (same details).
        """
        if hasattr(self.task, "rewards"):  # the optional batched reward: one call per round
            raw = torch.tensor(_check_rewards(self.task.rewards(list(ro.texts), list(ro.problems)), ro),
                               dtype=torch.float32)
        else:
            raw = torch.tensor([_check_reward(self.task.reward(t, p), i, t, p)
                                for i, (t, p) in enumerate(zip(ro.texts, ro.problems))], dtype=torch.float32)
        correct = torch.tensor(correctness(self.task, ro.texts, ro.problems))  # batched `correct` when offered
        shaped = selection.shape(self.algo, raw, ro.lengths.cpu(), self.max_new_tokens)
        return Scored(ro, raw, correct, shaped)

    def collect(self) -> Batch:
        """Generate, score and select this step's training rows.

        Rounds of generation are drawn until ``prompts_per_step`` groups were selected
        (:func:`grpo_lab.algo.selection.select_groups`; extras of the last round are dropped) or
        ``max_gen_rounds`` rounds were drawn. Keeping every group (the default selector) takes one
        rollout of ``prompts_per_step`` questions; DAPO's dynamic sampling (Eq. 11) may take
        several, sized by :meth:`round_size`.

        Raises:
            RuntimeError: too few groups after ``max_gen_rounds`` with ``on_gen_rounds_exhausted="error"``.
        """
        c, G = self.config, self.config.group_size
        batch, parts, n_kept = Batch(generated=[]), [], 0
        while n_kept < c.prompts_per_step and len(batch.generated) < c.max_gen_rounds:
            n_prompts = self.round_size(c.prompts_per_step - n_kept, batch) if batch.generated else c.prompts_per_step
            s = self.score(self.rollout(n_prompts))
            batch.generated.append(s)
            selected = selection.select_groups(self.algo, s.correct, G)
            batch.selected_groups += len(selected)
            groups = selected[: c.prompts_per_step - n_kept]
            if len(groups) * G == len(s.rollout):
                parts.append((s.rollout, s.rewards, s.correct))
            elif len(groups):
                rows = (groups[:, None] * G + torch.arange(G)).flatten()
                parts.append((s.rollout.select(rows), s.rewards[rows], s.correct[rows]))
            n_kept += len(groups)
        if n_kept < c.prompts_per_step:
            self._short_of_groups(n_kept)
        if parts:
            batch.rollout = _concat_rollouts([p[0] for p in parts], self.tokenizer.pad_token_id)
            batch.rewards = torch.cat([p[1] for p in parts])
            batch.correct = torch.cat([p[2] for p in parts])
            batch.loss_mask = selection.loss_mask(self.algo, batch.rollout.completion_mask, batch.rollout.truncated)
            if self.value_model is not None:
                batch.values = self._values(batch.rollout)
        return batch

    def round_size(self, missing: int, batch: Batch) -> int:
        """Questions to sample in the next dynamic-sampling round when ``missing`` groups are still
        needed: ``prompts_per_step`` with ``TrainerConfig.topup=False``; otherwise
        ``min(prompts_per_step, ceil(missing / keep_rate))``, where ``keep_rate`` is the fraction of
        generated groups selected over the run so far (earlier steps' ``selected_groups`` /
        ``generated_groups`` history columns plus this step's rounds); ``prompts_per_step`` while
        no group has been selected yet. Deterministic given the history, so resume stays exact."""
        c = self.config
        if not c.topup:
            return c.prompts_per_step
        G = c.group_size
        generated = sum(len(s.rollout) for s in batch.generated) // G
        selected = batch.selected_groups
        for r in self.rows:
            if "generated_groups" in r and "selected_groups" in r:
                generated += int(r["generated_groups"])
                selected += int(r["selected_groups"])
        if selected == 0:
            return c.prompts_per_step
        return max(1, min(c.prompts_per_step, -(-missing * generated // selected)))  # integer ceil

    def _short_of_groups(self, n_kept: int) -> None:
        c = self.config
        msg = (f"dynamic sampling: only {n_kept} of prompts_per_step={c.prompts_per_step} groups had mixed "
               f"accuracy (0 < acc < 1) after max_gen_rounds={c.max_gen_rounds} rounds at step {self.step + 1}")
        if c.on_gen_rounds_exhausted == "error":
            raise RuntimeError(msg + "; raise TrainerConfig.max_gen_rounds or set on_gen_rounds_exhausted='warn'")
        warnings.warn(msg + ("; training on those groups" if n_kept else "; skipping this step's update")
                      + " (TrainerConfig.max_gen_rounds bounds the extra generation)", DynamicSamplingShortfallWarning,
                      stacklevel=4)


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


def _concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """One :class:`Rollout` from several (the kept groups of several dynamic-sampling rounds).

    Rollouts of different prompt / completion widths are padded to the widest: prompts on the
    **left** (pad id, mask 0), completions, masks and behaviour log-probs on the **right** (pad
    id, 0, 0), keeping the layout of :func:`grpo_lab.policy.rollout.generate`; position ids derive from
    the masks, so the extra padding changes no real token's position. Rows stay in order, so
    groups stay contiguous. Per-row ``extras`` tensors are concatenated when every part has them.

    Raises:
        ValueError: no parts, or parts with different ``group_size`` / ``temperature``.
    """
    if not parts:
        raise ValueError("_concat_rollouts: no rollouts given")
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if any(r.group_size != first.group_size or r.temperature != first.temperature for r in parts):
        raise ValueError("_concat_rollouts: rollouts differ in group_size or temperature")
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
        gen_seconds=sum(r.gen_seconds for r in parts), extras=extras,
    )
