"""Run a grpo_lab algorithm on TRL or verl with the same objective, and read their configs back.

One package, one room per job:

* :mod:`grpo_lab.export.translation` — the loss: :func:`~grpo_lab.export.translation.translate`, :func:`~grpo_lab.export.translation.to_trl`, :func:`~grpo_lab.export.translation.to_verl`,
  :func:`~grpo_lab.export.translation.trl_reward_funcs`, :func:`~grpo_lab.export.translation.mapping_table`, :func:`~grpo_lab.export.translation.support_table` (what TRL 1.16.0 and verl 0.9.1
  compute, axis by axis, and where each differs from the paper; its docstring is the reference);
* :mod:`grpo_lab.export.optimisation` — the budget (sizes, optimiser, schedule, precision) read from a
  ``TrainerConfig``: :func:`~grpo_lab.export.optimisation.budget_from_config`; the optimiser / schedule / precision settings of each target
  (:func:`~grpo_lab.export.optimisation.horizon`, :func:`~grpo_lab.export.optimisation.precision_resolution`, :data:`~grpo_lab.export.optimisation.EXPORT_PRECISIONS`);
* :mod:`grpo_lab.export.versions` — the verified releases (:data:`~grpo_lab.export.versions.TRL_VERSION`, :data:`~grpo_lab.export.versions.VERL_VERSION`) and
  :class:`~grpo_lab.export.versions.LibraryVersionWarning` when another is installed (:func:`~grpo_lab.export.versions.installed_version`, :func:`~grpo_lab.export.versions.check_installed`);
* :mod:`grpo_lab.export.lint` — the way back: :func:`~grpo_lab.export.lint.from_trl`, :func:`~grpo_lab.export.lint.from_verl`, :func:`~grpo_lab.export.lint.check_config` read a
  TRL / verl configuration as the grpo_lab Algorithm it computes, the paper it is nearest to and its
  departures (a :class:`~grpo_lab.export.lint.Reading`; ``python -m grpo_lab check-config FILE``).
* :mod:`grpo_lab.export.jobs` — a runnable job: :func:`~grpo_lab.export.jobs.trl_job` (script, dataset,
  reward adapter) and :func:`~grpo_lab.export.jobs.verl_job` (parquet data, ``custom_reward_function`` file,
  Hydra overrides, command line); the text of the files they write is in :mod:`grpo_lab.export.job_scripts`.
* :mod:`grpo_lab.export.vocabulary` — the field's names: :func:`~grpo_lab.export.vocabulary.explain` says which
  grpo_lab field and value a TRL ``GRPOConfig`` or verl option means (``num_generations`` is ``group_size``),
  derived from the translation's tables (what ``--set`` and config files say when given a TRL / verl name).

Everything public is importable from ``grpo_lab.export`` itself.
"""

from __future__ import annotations

from .jobs import DEFAULT_STEPS, JobCaveatWarning, trl_job, verl_job
from .lint import Reading, check_config, from_trl, from_verl
from .optimisation import EXPORT_PRECISIONS, budget_from_config, horizon, precision_resolution
from .translation import (BUDGET_KEYS, TARGETS, TRL_ADV_EPS, TRL_VERSION, VERL_ADV_EPS, VERL_DUAL_CLIP_OFF, VERL_VERSION, ApproximateExportWarning, ExportError, Issue, Translation, mapping_table, support_table, to_trl, to_verl, translate, trl_reward_funcs)
from .versions import LibraryVersionWarning, check_installed, installed_version
from .vocabulary import explain

from . import translation as _translation

#: the translation's public names, then the other rooms'
__all__ = [*_translation.__all__, "budget_from_config", "horizon", "precision_resolution", "EXPORT_PRECISIONS",
           "LibraryVersionWarning", "installed_version", "check_installed", "Reading", "from_trl", "from_verl",
           "check_config", "DEFAULT_STEPS", "trl_job", "verl_job", "explain", "JobCaveatWarning"]
