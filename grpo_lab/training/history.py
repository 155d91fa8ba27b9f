"""The history rows: one per step (rewards, lengths, the update's metrics, timings, memory) and the
test-set evaluations that join them.

The mixin ``History`` gives :class:`~grpo_lab.training.trainer.Trainer` its
:attr:`~grpo_lab.training.trainer.Trainer.history`, :meth:`~grpo_lab.training.trainer.Trainer.evaluate` and the rows
:meth:`~grpo_lab.training.trainer.Trainer.train` appends (:data:`~grpo_lab.training.trainer.MEASURED_COLUMNS` names the
columns that measure the machine rather than the run).
"""

from __future__ import annotations

import math
import numbers
import time

import numpy as np
import pandas as pd
import torch

from ..algo import selection
from ..algo.advantages import tied_groups
from ..algo.metrics import reduce_updates
from ..algo.objectives import METRIC_KEYS
from ..policy.rollout import evaluate
from .callbacks import samples_table
from .collection import Batch
from .memory import peak_memory_mb
from .value_model import value_metrics

__all__: list[str] = []


class History:
    """The history of :class:`grpo_lab.training.trainer.Trainer`: its rows, evaluations and the row of a step.
    Reads ``config``, ``task``, ``algo``, ``policy``, ``tokenizer``, ``max_new_tokens``, ``rows``,
    ``step``, ``scaler`` and ``amp_skipped_steps``; calls ``_autocast``."""

    @property
    def history(self) -> pd.DataFrame:
        """One row per step (see :meth:`train`)."""
        return pd.DataFrame(self.rows)

    def evaluate(self, *, greedy: bool = True) -> dict:
        """Test-set accuracy now (does not advance any training RNG: the torch RNG state is
        saved and restored around sampled evaluation)."""
        return self._evaluate_frame(greedy=greedy)[0]

    def _evaluate_frame(self, *, greedy: bool) -> tuple[dict, pd.DataFrame]:
        """:meth:`evaluate`, with the per-problem frame of :func:`grpo_lab.policy.rollout.evaluate`."""
        state = torch.random.get_rng_state()
        try:
            with self._autocast():
                return evaluate(self.policy, self.tokenizer, self.task, greedy=greedy,
                                temperature=self.config.temperature, max_new_tokens=self.max_new_tokens,
                                batch_size=self.config.eval_batch_size)
        finally:
            torch.random.set_rng_state(state)

    def _model_metrics(self, row: dict) -> dict:
        """The task's optional ``model_metrics(model)`` as ``test_<name>`` columns (none without it), computed
        in eval mode without grad under the run's autocast, the torch RNG state restored.

        Raises:
            TypeError: it returned something other than a dict of ``str`` names to real numbers (the entry named).
            ValueError: a name whose column the evaluation already fills (``row``'s, or the sampled evaluation's
                ``test_accuracy_sampled`` / ``test_sampled_*``).
        """
        metrics = getattr(self.task, "model_metrics", None)
        if not callable(metrics):
            return {}
        state, was_training = torch.random.get_rng_state(), self.policy.training
        self.policy.eval()
        try:
            with torch.no_grad(), self._autocast():
                got = metrics(self.policy)
        finally:
            self.policy.train(was_training)
            torch.random.set_rng_state(state)
        where = f"{type(self.task).__name__}.model_metrics"
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

    def _eval_row(self) -> dict:
        """The ``test_*`` columns of an evaluation now, with ``step`` and ``eval_seconds``."""
        return self._evaluation()[0]

    def _evaluation(self) -> tuple[dict, pd.DataFrame]:
        """:meth:`_eval_row` and the samples table of that evaluation
        (:func:`~grpo_lab.training.callbacks.samples_table` of the greedy evaluation's frame), which
        :meth:`train` hands to the callbacks' ``on_evaluate``."""
        t0 = time.perf_counter()
        row = {"step": self.step}
        s, frame = self._evaluate_frame(greedy=True)
        row["test_accuracy"] = s["accuracy"]
        row["test_length"] = s["mean_length"]
        if "reasoning_frac" in s:
            row["test_reasoning_frac"] = s["reasoning_frac"]
        extra = getattr(self.task, "test_metrics", None)
        if callable(extra):  # optional task member: more columns from the per-problem frame
            row.update({f"test_{k}": float(v) for k, v in extra(frame).items()})
        row.update(self._model_metrics(row))
        if self.config.eval_sampled:
            s2, frame2 = self._evaluate_frame(greedy=False)
            row["test_accuracy_sampled"] = s2["accuracy"]
            if callable(extra):
                row.update({f"test_sampled_{k}": float(v) for k, v in extra(frame2).items()})
        row["eval_seconds"] = time.perf_counter() - t0
        return row, samples_table(frame)

    def _row(self, batch: Batch, updates: list[dict], grad_norms: list, entropies: list, seconds: float) -> dict:
        """The history row of one step (see :meth:`train` for the columns)."""
        G, gen = self.config.group_size, batch.generated
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
            "zero_adv_group_frac": float(tied_groups(shaped, G).float().mean()),
            "truncation_rate": float(torch.cat([s.rollout.truncated.cpu() for s in gen]).float().mean()),
            "tokens_per_s": sum(float(s.rollout.completion_mask.sum()) for s in gen) / seconds,
            "gen_seconds": sum(s.rollout.gen_seconds for s in gen),
            "step_seconds": seconds,
        }
        if hasattr(self.task, "is_reasoning"):
            row["reasoning_frac"] = float(np.mean([self.task.is_reasoning(t) for s in gen for t in s.rollout.texts]))
        row.update(value_metrics(batch, self.algo.gamma))
        row["peak_mem_mb"] = peak_memory_mb(self.config.device)
        if self.scaler.is_enabled():
            row["amp_skipped_steps"] = self.amp_skipped_steps
            row["amp_scale"] = float(self.scaler.get_scale())
        row.update(reduce_updates(updates))
        # the learning rate of the step's last optimiser update (TrainerConfig.lr_schedule), NaN without one
        row["lr"] = float(self.optimizer.param_groups[0]["lr"]) if updates else float("nan")
        row.setdefault("routing_change_frac", float("nan"))  # dense policy, or no second update on the rollout
        if not updates:  # no update this step: the loss metrics exist and are NaN (even if no step ever updated)
            row.update({k: float("nan") for k in METRIC_KEYS if k not in row})
        n_trained = len(batch.rollout) if batch.rollout is not None else 0
        row.update(selection.sampling_metrics(raw, shaped, len(lengths), n_trained, len(gen), G,
                                             n_selected=batch.selected_groups * G))
        return row
