"""A run without a learning signal: every group tied for several steps in a row, and the warning that says so.

With a group baseline (:data:`grpo_lab.algo.advantages.GROUP_BASELINE_ESTIMATORS`: GRPO's
:math:`(R_i - \\mathrm{mean})/\\mathrm{std}`, Dr. GRPO's :math:`R_i - \\mathrm{mean}`, RLOO, ...) a group whose
:math:`G` responses all score alike gets advantage 0 for every response (DeepSeekMath §4.1.2), and a step
whose groups are *all* tied (history column ``zero_adv_group_frac == 1``, which for these estimators counts the
tied groups, ``tied_group_frac``) has no policy-gradient signal at all. One such step happens by chance;
:data:`~grpo_lab.training.learning_signal.NO_SIGNAL_STEPS` in a row
mean the base policy never (or always) solves the prompts, as RL from ``arithmetic-base`` on another task.
:class:`~grpo_lab.training.trainer.Trainer` then warns once per run with :class:`NoLearningSignalWarning` (:func:`no_signal_warning`), and
:func:`grpo_lab.experiments.run` once per call over its seeds, also for seeds trained in worker
processes (their histories come back to the caller). The warning changes no number. A value baseline
(``gae``: PPO, VAPO) is not warned about: a tied group still has a signal there, and its
``zero_adv_group_frac`` counts the groups whose advantages are all 0.

Dynamic sampling (DAPO Eq. 11) that finds fewer than ``prompts_per_step`` mixed groups within
``max_gen_rounds`` rounds trains on those it found: the trainer warns at each such step with
:class:`DynamicSamplingShortfallWarning`; :func:`grpo_lab.experiments.run` silences those in its seeds
and warns once over them instead (:func:`shortfall_steps`, :func:`shortfall_warning`), from the
history's ``trained_groups`` column.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

__all__ = ["NoLearningSignalWarning", "NO_SIGNAL_STEPS", "no_signal_step", "no_signal_warning",
           "DynamicSamplingShortfallWarning", "shortfall_steps", "shortfall_warning"]

#: How many steps in a row must have every group tied before the warning (5). Over the 341 runs without a
#: value model in the book's run cache (2026-12-02) the longest such streak is 2 steps (in four 16-step runs
#: at a sampled accuracy of a few percent), so 5 leaves a margin over chance streaks; RL from a policy that
#: never solves the task (every step tied) is told at step 5, an eighth of the CPU profile's 40 steps.
NO_SIGNAL_STEPS = 5


class NoLearningSignalWarning(RuntimeWarning):
    """Every group of :data:`~grpo_lab.training.learning_signal.NO_SIGNAL_STEPS` steps in a row was tied:
    every advantage was 0, the policy gradient empty. Filter it like any warning
    (``warnings.simplefilter("ignore", NoLearningSignalWarning)``)."""


def no_signal_step(rows: Iterable[Mapping], steps: int = NO_SIGNAL_STEPS) -> int | None:
    """The first step that ends ``steps`` steps in a row with every group tied, or ``None``.

    Args:
        rows: history rows in step order (dicts with ``zero_adv_group_frac``, the fraction of the step's
            groups whose advantages are all 0, the tied groups for a group baseline; rows without it, such as
            step 0's evaluation, are skipped).
        steps: how many steps in a row (>= 1).

    Returns:
        The ``step`` value of the row that completes the streak (its position when rows carry no
        ``step``), or ``None`` when no streak is that long.
    """
    streak = 0
    for i, row in enumerate(rows):
        frac = row.get("zero_adv_group_frac")
        if frac is None or frac != frac:  # no training step (step 0's evaluation) or NaN
            continue
        streak = streak + 1 if frac >= 1.0 else 0
        if streak >= steps:
            return int(row.get("step", i))
    return None


def no_signal_warning(algo_name: str, group_size: int, at_step: int,
                      seeds: Sequence[int] | None = None, base_accuracy: float | None = None) -> str:
    """The message of :class:`NoLearningSignalWarning`: what happened, the cause and the fixes.

    Args:
        algo_name: the algorithm's name (``"GRPO"``).
        group_size: responses per prompt (``TrainerConfig.group_size``, G).
        at_step: the step that completed :data:`~grpo_lab.training.learning_signal.NO_SIGNAL_STEPS` tied steps in a row.
        seeds: the seeds concerned (``None``: one run, no seed named).
        base_accuracy: the base policy's greedy test accuracy (step 0), when known.
    """
    who = algo_name if seeds is None else f"{algo_name} (seed{'s' if len(seeds) > 1 else ''} " \
        f"{', '.join(map(str, seeds))})"
    base = "" if base_accuracy is None or base_accuracy != base_accuracy else \
        f" (greedy test accuracy at step 0: {base_accuracy:.3f})"
    return (f"{who}: no learning signal: in each of {NO_SIGNAL_STEPS} steps in a row (up to step {at_step}) all "
            f"{group_size} responses of every prompt got the same reward (or the estimator gave them all advantage 0), "
            f"so every advantage is 0 and the policy "
            f"gradient is empty (history column zero_adv_group_frac = 1). The base policy never (or always) solves "
            f"these prompts{base}: start from a model that sometimes solves them (a supervised warm start; for the README's "
            "reverse task: --model reverse-base, made by python -m grpo_lab.lab.pretrain reverse), raise "
            "group_size or temperature, or use DAPO's dynamic sampling (dynamic_sampling=True), which resamples "
            "tied groups")


class DynamicSamplingShortfallWarning(RuntimeWarning):
    """Dynamic sampling (DAPO Eq. 11) found fewer than ``prompts_per_step`` groups with mixed accuracy
    within ``max_gen_rounds`` generation rounds, so a step trained on fewer groups (or skipped its update).
    A ``RuntimeWarning``, so filters written for the earlier plain ``RuntimeWarning`` still match."""


def shortfall_steps(rows: Iterable[Mapping], prompts_per_step: int) -> int:
    """How many training steps of a history trained on fewer than ``prompts_per_step`` groups.

    Args:
        rows: history rows (dicts); rows without ``trained_groups`` (step 0's evaluation, a run without the
            sampling columns) are skipped, as is a NaN.
        prompts_per_step: the groups a step asks for (``TrainerConfig.prompts_per_step``).
    """
    return sum(1 for r in rows if r.get("trained_groups") is not None and r["trained_groups"] == r["trained_groups"]
               and int(r["trained_groups"]) < prompts_per_step)


def shortfall_warning(algo_name: str, short: Mapping[int, int], steps: int, prompts_per_step: int,
                      max_gen_rounds: int) -> str:
    """The text of :class:`DynamicSamplingShortfallWarning` for a run: ``short`` maps each seed with a
    shortfall to its number of short steps (of ``steps`` per seed)."""
    seeds = ", ".join(str(s) for s in sorted(short))
    counts = ", ".join(f"{short[s]}" for s in sorted(short))
    return (f"{algo_name} (seed{'s' if len(short) > 1 else ''} {seeds}): dynamic sampling found fewer than "
            f"prompts_per_step={prompts_per_step} groups with mixed accuracy within max_gen_rounds={max_gen_rounds} "
            f"rounds at {counts} of {steps} steps, and trained on the groups it found (history column "
            "trained_groups); raise max_gen_rounds, or the group size or temperature, if every step should be full")
