"""The trainer: :class:`~grpo_lab.training.trainer.Trainer` runs one algorithm's loop on a policy and a task; :class:`~grpo_lab.training.trainer.TrainerConfig` says how
it samples and updates. A step is collect → advantages → plan → optimiser steps → history row, one module
per concern:

* :mod:`grpo_lab.training.trainer`: ``Trainer``, which owns the models, optimisers, RNGs and history and runs
  the step.
* :mod:`grpo_lab.training.config`: ``TrainerConfig``, how a run samples and updates.
* :mod:`grpo_lab.training.collection`: *collect*: sample a rollout, score it, select groups (``Batch``, ``Scored``).
* :mod:`grpo_lab.training.update`: *advantages*, *plan* (π_old / π_ref in the update's layout) and the
  *optimiser steps* (minibatches, micro-batches, the loss, clipping, the learning-rate schedule).
* :mod:`grpo_lab.training.history`: the history row of a step, its evaluation, and what each column means
  (``HISTORY_COLUMNS``, ``MEASURED_COLUMNS``).
* :mod:`grpo_lab.training.value_model`: the critic: its protocol (``ValueModel``), values, pretraining, metrics.
* :mod:`grpo_lab.training.precision`: the autocast dtype (``resolve_precision``) and float16 loss scaling.
* :mod:`grpo_lab.training.adamw`: AdamW with weight decay on weight matrices only.
* :mod:`grpo_lab.training.dropout`: dropout and router jitter switched off, train mode kept.
* :mod:`grpo_lab.training.lr_schedule`: the policy's learning-rate schedule.
* :mod:`grpo_lab.training.learning_signal`: the warning when every group stays tied (``NoLearningSignalWarning``).
* :mod:`grpo_lab.training.checkpoints`: save and exact resume.
* :mod:`grpo_lab.training.callbacks`: the callbacks' hooks and the trackers of ``report_to`` (JSONL,
  TensorBoard, wandb).
* :mod:`grpo_lab.training.memory`: the peak memory of a step.
"""

from .callbacks import TRACKERS, TrainerCallback
from .config import TrainerConfig
from .trainer import (HISTORY_COLUMNS, MEASURED_COLUMNS, PRECISIONS, Batch, DynamicSamplingShortfallWarning,
                      NoLearningSignalWarning, Scored, Trainer, ValueModel, peak_memory_mb, reset_peak_memory,
                      resolve_precision)

__all__ = ["Trainer", "TrainerConfig", "TrainerCallback", "TRACKERS", "HISTORY_COLUMNS", "MEASURED_COLUMNS",
           "PRECISIONS", "Batch", "Scored", "ValueModel", "NoLearningSignalWarning", "DynamicSamplingShortfallWarning", "peak_memory_mb",
           "reset_peak_memory", "resolve_precision"]
