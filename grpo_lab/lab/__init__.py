"""The book's bench: code that exists for a chapter of the book, not the library's API.

Anything here may change with the book, without notice. Nothing outside ``grpo_lab.lab`` imports it
(``tests/repo/test_house_rules.py`` enforces the order of the wings).

* :mod:`~grpo_lab.lab.book`: notebook plumbing (set-up, glue, run times, ``python -m grpo_lab.lab.book execute``);
* :mod:`~grpo_lab.lab.pretrain`: the shipped base checkpoints (``make pretrain``) and chapter 7's
  continued next-token baseline;
* :mod:`~grpo_lab.lab.probes`: one-off measurements per seed for chapters 4-6;
* :mod:`~grpo_lab.lab.gpu_runs`: a chapter's GSM8K comparison on the ``gpu`` profile and its checks;
* :mod:`~grpo_lab.lab.rpt_gpu`: chapter 7 on a hub model;
* :mod:`~grpo_lab.lab.decision_tree`, :mod:`~grpo_lab.lab.variant_records` and :mod:`~grpo_lab.lab.choosing_tables`:
  chapter 8's tree, records and tables;
* :mod:`~grpo_lab.lab.regime`: the regime rules; :mod:`~grpo_lab.lab.scenarios`: the scenario benchmarks that
  test the tree branch by branch.
"""

from .gpu_runs import (announce_gpu_runs, check_gpu_results, check_results_location, load_chapter_gpu, results_dir,
                       run_chapter_gpu)
from .probes import pretrain_critic, routing_update, sampler_routing, update_probe
from . import rpt_gpu as _rpt_gpu
from .rpt_gpu import chapter_gpu_profile, rl_compute_units, rpt_data_dir, rpt_gpu_profile, run_rpt_gpu

__all__ = ["results_dir", "run_chapter_gpu", "load_chapter_gpu", "check_gpu_results", "pretrain_critic",
           "routing_update", "sampler_routing", "update_probe", "RPT_GPU_TEST_SIZE", "rpt_data_dir", "rpt_gpu_profile",
           "chapter_gpu_profile", "rl_compute_units", "run_rpt_gpu", "check_results_location", "announce_gpu_runs"]

#: Held-out positions of chapter 7's hub-model run (:func:`rpt_gpu_profile`): a binomial standard
#: error of at most 0.022 per evaluation. ``$GRPO_LAB_RPT_TEST_SIZE`` replaces it when
#: :func:`run_rpt_gpu` builds the data files (``scripts/gpu_dryrun.sh`` sets 16: a dry run checks the
#: code path, not the accuracy).
RPT_GPU_TEST_SIZE = _rpt_gpu.RPT_GPU_TEST_SIZE
