"""The trainer: :class:`~grpo_lab.training.trainer.Trainer` runs one algorithm's loop (collect, score, select, advantages, update) on a
policy and a task; :class:`~grpo_lab.training.trainer.TrainerConfig` says how it samples and updates. One concern per module:

* :mod:`grpo_lab.training.trainer`: ``Trainer``, the conductor of a step.

* :mod:`grpo_lab.training.config`: ``TrainerConfig``, how a run samples and updates.
* :mod:`grpo_lab.training.adamw`: the AdamW, weight decay on weight matrices only (``build_adamw``).
* :mod:`grpo_lab.training.precision`: the autocast dtype (``resolve_precision``) and float16 loss scaling.
* :mod:`grpo_lab.training.collection`: the *collect* stage: rollout, scoring, selection (``Batch``, ``Scored``).
* :mod:`grpo_lab.training.update`: the *update* stage: π_old / π_ref log-probs, minibatches,
  micro-batches, the optimiser step.
* :mod:`grpo_lab.training.value_model`: the critic: its slot (``ValueModel``), values, pretraining, metrics.
* :mod:`grpo_lab.training.history`: the history rows and test-set evaluation.
* :mod:`grpo_lab.training.learning_signal`: every group tied for several steps in a row, and its warning
  (``NoLearningSignalWarning``).
* :mod:`grpo_lab.training.checkpoints`: save and exact resume.
* :mod:`grpo_lab.training.callbacks`: the callbacks' hooks and the trackers of ``report_to`` (JSONL,
  TensorBoard, wandb).
* :mod:`grpo_lab.training.memory`: the peak memory of a step.
"""

from .callbacks import TRACKERS, TrainerCallback
from .config import TrainerConfig
from .trainer import (MEASURED_COLUMNS, PRECISIONS, Batch, DynamicSamplingShortfallWarning, NoLearningSignalWarning,
                      Scored, Trainer, ValueModel, peak_memory_mb, reset_peak_memory, resolve_precision)

__all__ = ["Trainer", "TrainerConfig", "TrainerCallback", "TRACKERS", "MEASURED_COLUMNS", "PRECISIONS", "Batch",
           "Scored", "ValueModel", "NoLearningSignalWarning", "DynamicSamplingShortfallWarning", "peak_memory_mb",
           "reset_peak_memory", "resolve_precision"]
