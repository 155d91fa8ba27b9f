"""Profiles, multi-seed runs and results files with provenance.

A *profile* fixes an experiment's scale: ``cpu`` is what the book executes in CI (the tiny
arithmetic policy); ``gpu`` (:func:`gpu_profile`) trains :data:`GPU_MODEL` on GSM8K on one CUDA
GPU. :func:`run` trains one algorithm for several seeds and returns a long DataFrame (one row per
seed × step) plus provenance; :func:`save_results` / :func:`load_results` write and read
``data/results/<profile>/*.json``. From the command line::

    python -m grpo_lab GRPO --profile gpu --seeds 0 1 2 3 4 --out runs/grpo_gpu.json

Run cache (:mod:`~grpo_lab.experiments.run_cache`): each (algorithm, profile, steps, seed) run is
stored under ``_build/run_cache/`` and loaded when an identical run is asked for again. The key
covers the algorithm (not its display name), the profile and trainer configuration, steps, seed and
:func:`run_fingerprint` (the package's source, the base checkpoint, the task files, library
versions, processor, thread count), so any code change invalidates it. Never loaded from the
cache: runs using code from outside the package, hub checkpoints, and runs with an ``output_dir``
(they must write their files). ``GRPO_LAB_RUN_CACHE`` moves it or turns it off (``off``); an
installed package caches only when it is set. ``provenance["run_cache"]`` and
``provenance["cached_seeds"]`` say what the cache supplied.

Modules: :mod:`~grpo_lab.experiments.profiles` (profiles, the GPU profile),
:mod:`~grpo_lab.experiments.runs` (:func:`run`, :func:`run_grid`, :func:`run_tally`),
:mod:`~grpo_lab.experiments.results` (:class:`RunResult`, provenance, results files, summaries),
:mod:`~grpo_lab.experiments.run_cache`, :mod:`~grpo_lab.experiments.run_dirs` (each seed's
directory, checkpoints, resuming), :mod:`~grpo_lab.experiments.workers` (the worker pool),
:mod:`~grpo_lab.experiments.config_files` (YAML run files), :mod:`~grpo_lab.experiments.memory_fit`,
:mod:`~grpo_lab.experiments.memory_model`, :mod:`~grpo_lab.experiments.evaluation` (pass@k),
:mod:`~grpo_lab.experiments.stats`, :mod:`~grpo_lab.experiments.plotting`. A chapter's GPU runs
live in :mod:`grpo_lab.lab`. Every public name of the run machinery is imported from here.
"""

from __future__ import annotations

from . import profiles as _profiles
from .profiles import Profile, colab_minutes, colab_profile, expected_gpu_minutes, get_profile, gpu_profile
from .results import (RunResult, config_hash, load_results, processor_name, provenance, save_results, summarize_runs)
from .run_cache import run_cache_dir, run_fingerprint
from .runs import run, run_grid, run_tally
from .workers import map_workers, shutdown_workers

__all__ = ["Profile", "PROFILES", "GPU_MODEL", "GPU_GSM8K_SOURCE", "GPU_TEST_SIZE", "gpu_profile", "GPU_SPEEDS",
           "expected_gpu_minutes", "summarize_runs", "get_profile", "run", "run_grid", "run_tally", "RunResult",
           "save_results", "load_results", "shutdown_workers", "map_workers", "provenance", "config_hash",
           "run_cache_dir", "run_fingerprint", "processor_name", "colab_profile", "colab_minutes", "COLAB_SEEDS",
           "COLAB_T4_MEMORY", "COLAB_SETUP_MINUTES"]

# The constants are the objects of the modules that use them, bound again here so that these
# doc-comments are the ones the API reference shows.

#: The experiment scales by name, ``"cpu"`` (what the book executes, minutes on two CPU cores) and
#: ``"gpu"`` (one GPU, larger batches and longer runs); :func:`get_profile` looks one up.
PROFILES = _profiles.PROFILES

#: The hub instruct model the ``"gpu"`` profile trains: the one place it is named.
#: ``$GRPO_LAB_GPU_MODEL`` replaces it (a hub id, or a local directory in the hub layout) whenever
#: :func:`gpu_profile` is called without ``model``.
GPU_MODEL = _profiles.GPU_MODEL

#: Where the ``"gpu"`` profile reads GSM8K: ``"hub"`` (``openai/gsm8k`` through ``datasets``).
#: ``$GRPO_LAB_GSM8K_SOURCE`` replaces it (``"fixture"``, or a directory / .jsonl / .parquet file, as
#: :class:`grpo_lab.tasks.gsm8k.GSM8KTask` ``source`` takes).
GPU_GSM8K_SOURCE = _profiles.GPU_GSM8K_SOURCE

#: Test problems of the ``"gpu"`` profile (the first 500 of GSM8K's 1319-problem test split: a
#: binomial standard error of at most 0.022 per evaluation); a non-hub source uses its whole test split.
GPU_TEST_SIZE = _profiles.GPU_TEST_SIZE

#: Assumed speeds of two GPU classes for the ``"gpu"`` profile's 0.5B-parameter model: the basis of
#: :func:`expected_gpu_minutes`. They are assumptions, not measurements (``scripts/gpu_check.sh``
#: prints the seconds per step it measures):
#:
#: * ``decode_step_s``: seconds per generated position of one batched ``transformers.generate`` call
#:   (batch of at most 256): at this model size a decoding step costs the kernel launches of 24
#:   layers more than arithmetic, so it hardly depends on the batch;
#: * ``train_tokens_per_s``: prompt + completion tokens per second through one forward and backward
#:   pass plus the two no-grad forwards (π_old, π_ref): about 10 N FLOPs per token at N = 0.5e9,
#:   at 20 TFLOP/s (T4, float16 tensor cores) and 300 TFLOP/s (H100, bfloat16, about 30% of peak).
GPU_SPEEDS = _profiles.GPU_SPEEDS

#: Seeds of the ``"colab"`` profile (:func:`colab_profile`): one, so a chapter's GPU cell on Colab is a look,
#: not a claim (the book's claims use five).
COLAB_SEEDS = _profiles.COLAB_SEEDS

#: Bytes of Colab's free T4 as ``torch.cuda.get_device_properties(0).total_memory`` reports them (assumed, not
#: measured: a 16 GB card less what the driver keeps); :func:`colab_profile` fits its batch sizes to it.
COLAB_T4_MEMORY = _profiles.COLAB_T4_MEMORY

#: The minutes a Colab session spends before training (the set-up cell's install, the model and GSM8K downloads,
#: the loading; assumed, never measured); :func:`colab_minutes` adds them.
COLAB_SETUP_MINUTES = _profiles.COLAB_SETUP_MINUTES
