"""Run a grpo_lab algorithm on TRL or verl with the same objective, and read their configs back.

One package, one room per job:

* :mod:`grpo_lab.export.translation` — the loss: :func:`translate`, :func:`to_trl`, :func:`to_verl`,
  :func:`trl_reward_funcs`, :func:`mapping_table`, :func:`support_table` (what TRL 1.16.0 and verl 0.9.1
  compute, axis by axis, and where each differs from the paper; its docstring is the reference);
* :mod:`grpo_lab.export.optimisation` — the budget (sizes, optimiser, schedule) read from a ``TrainerConfig``:
  :func:`budget_from_config`;
* :mod:`grpo_lab.export.jobs` — a runnable job: :func:`~grpo_lab.export.jobs.trl_job` (script, dataset,
  reward adapter) and :func:`~grpo_lab.export.jobs.verl_job` (parquet data, ``custom_reward_function`` file,
  Hydra overrides, command line); the text of the files they write is in :mod:`grpo_lab.export.job_scripts`.

Everything public is importable from ``grpo_lab.export`` itself.
"""

from __future__ import annotations

from .jobs import DEFAULT_STEPS, trl_job, verl_job
from .optimisation import budget_from_config
from .translation import (BUDGET_KEYS, TARGETS, TRL_ADV_EPS, TRL_VERSION, VERL_ADV_EPS, VERL_DUAL_CLIP_OFF,
                          VERL_VERSION, ApproximateExportWarning, ExportError, Issue, Translation, mapping_table,
                          support_table, to_trl, to_verl, translate, trl_reward_funcs)

__all__ = [
    "TRL_VERSION",
    "VERL_VERSION",
    "TARGETS",
    "TRL_ADV_EPS",
    "VERL_ADV_EPS",
    "VERL_DUAL_CLIP_OFF",
    "BUDGET_KEYS",
    "ExportError",
    "ApproximateExportWarning",
    "Issue",
    "Translation",
    "translate",
    "to_trl",
    "to_verl",
    "trl_reward_funcs",
    "mapping_table",
    "support_table",
    "budget_from_config",
    "DEFAULT_STEPS",
    "trl_job",
    "verl_job",
]
