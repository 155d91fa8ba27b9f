"""Chapter 7 on a hub model: RPT's next-token reasoning against continued next-token prediction
at matched compute.

:func:`~grpo_lab.lab.rpt_gpu_profile` is the profile (the GPU profile's model, the
next-token task in its chat template, data files in :func:`~grpo_lab.lab.rpt_data_dir`),
:func:`~grpo_lab.lab.run_rpt_gpu` the run (written to ``07_rpt.json``), and
:func:`~grpo_lab.lab.rl_compute_units` the compute that matches them.
:func:`~grpo_lab.lab.chapter_gpu_profile` picks a chapter's ``"gpu"`` profile. Documented
under :mod:`grpo_lab.experiments`.
"""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ..algo.algorithms import Algorithm
from ..tasks import get_task
from ..algo.checks import positive_int
from .gpu_runs import _gpu_results_path, _save_chapter, results_dir, run_chapter_gpu
from ..experiments.profiles import Profile, gpu_profile
from ..experiments.results import RunResult
from ..experiments.runs import _check_seeds, _unloadable

__all__ = ["RPT_GPU_TEST_SIZE", "rpt_data_dir", "rpt_gpu_profile", "chapter_gpu_profile", "rl_compute_units",
           "run_rpt_gpu"]


# RPT_GPU_TEST_SIZE: documented where it is exported, in grpo_lab/lab/__init__.py.
RPT_GPU_TEST_SIZE = 500

#: The name :func:`run_rpt_gpu` stores its continued next-token-prediction baseline under.
NTP_BASELINE = "continued NTP"


def _rpt_test_size() -> int:
    """The held-out positions :func:`run_rpt_gpu` builds the task's data files with:
    ``$GRPO_LAB_RPT_TEST_SIZE`` if set (``scripts/gpu_dryrun.sh`` sets 16: its dry run checks the code
    path, and 500 positions made evaluation most of chapter 7's dry-run time), else :data:`~grpo_lab.lab.RPT_GPU_TEST_SIZE`.

    Raises:
        ValueError: the variable is set to something other than a positive integer.
    """
    value = os.environ.get("GRPO_LAB_RPT_TEST_SIZE", "").strip()
    if not value:
        return RPT_GPU_TEST_SIZE
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"run_rpt_gpu: $GRPO_LAB_RPT_TEST_SIZE must be a positive integer (the held-out positions; "
                         f"unset: {RPT_GPU_TEST_SIZE}), got {value!r}")
    return int(value)


def rpt_data_dir(model: str | os.PathLike) -> Path:
    """Where :func:`run_rpt_gpu` keeps the next-token task's data files for ``model`` (built by
    :func:`grpo_lab.tasks.next_token.build_hub_task_data`): ``$GRPO_LAB_RPT_DATA`` if set, else
    ``<results_dir()>/next_token/<model as a file name>`` (so the data travels with the results
    that were measured on it)."""
    env = os.environ.get("GRPO_LAB_RPT_DATA")
    if env:
        return Path(env).expanduser()
    local = Path(model).expanduser()
    name = str(local.resolve()) if local.exists() else str(model)  # ./m, m/ and /abs/m: one directory
    slug = re.sub(r"[^A-Za-z0-9._-]+", "--", name.strip("/\\")).lstrip(".-") or "model"
    return results_dir() / "next_token" / slug[-100:]


def _same_model(a, b) -> bool:
    """Whether two model names (hub ids or local directories) name the same model: equal, or paths
    to the same existing directory (``m/``, ``./m`` and the absolute path)."""
    if a is None or b is None:
        return False
    if str(a) == str(b):
        return True
    pa, pb = Path(str(a)).expanduser(), Path(str(b)).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def rpt_gpu_profile(model: str | os.PathLike | None = None, *, data: str | os.PathLike | None = None,
                    steps: int = 60, environ: Mapping[str, str] | None = None, **config: Any) -> Profile:
    """Chapter 7's ``"gpu"`` profile: RPT's next-token reasoning with a hub instruct model.

    The model, device, precision and ``$GRPO_LAB_GPU_*`` variables are those of :func:`~grpo_lab.experiments.gpu_profile`
    (one place names the model); the task is :class:`grpo_lab.tasks.NextTokenTask` on the model's
    own tokenizer, in its chat template (``chat=True``), reading the data files of ``data``
    (default :func:`rpt_data_dir`), with a 256-token budget for the thinking span and the
    prediction, and the positions of proxy entropy >= 0.5 nats (the ``easy`` threshold, as the
    chapter's CPU run). The trainer settings are RPT's where the paper gives them
    (:data:`grpo_lab.algo.algorithms.RPT_SAMPLING`: G = 8 at temperature 0.8; lr 1e-6) at the GPU
    profile's scale: 16 positions × 8 per step, one update per rollout, greedy and sampled test
    accuracy every 10 steps on :data:`~grpo_lab.lab.RPT_GPU_TEST_SIZE` positions.

    Args:
        model, environ: as :func:`~grpo_lab.experiments.gpu_profile`.
        data: the data directory (``None``: :func:`rpt_data_dir` of the model).
        steps: RL steps per seed.
        **config: :class:`~grpo_lab.training.trainer.TrainerConfig` fields that replace these defaults
            (``$GRPO_LAB_GPU_CONFIG`` replaces them too, and these replace it, as in :func:`~grpo_lab.experiments.gpu_profile`).

    Returns:
        A :class:`~grpo_lab.experiments.Profile` named ``"gpu"`` with ``task="next_token"``.

    Raises:
        ValueError: as :func:`~grpo_lab.experiments.gpu_profile`.
    """
    from ..algo.algorithms import RPT_SAMPLING

    defaults = dict(RPT_SAMPLING, prompts_per_step=16, lr=1e-6, warmup=5, minibatches=1, epochs=1, eval_every=10,
                    eval_sampled=True)
    prof = gpu_profile(model, steps=steps, environ=environ, _defaults=defaults, **config)
    task_kwargs = {"tokenizer": prof.base, "data": str(data if data is not None else rpt_data_dir(prof.base)),
                   "chat": True, "max_new_tokens": 256, "min_entropy": 0.5, "eval_held_out_loss": True}
    return replace(prof, task="next_token", task_kwargs=task_kwargs)


def chapter_gpu_profile(chapter: str) -> Profile:
    """The ``"gpu"`` profile a chapter's hub-model cell trains: :func:`rpt_gpu_profile` for
    ``"07_rpt"``, :func:`~grpo_lab.experiments.gpu_profile` (GSM8K) for the others."""
    return rpt_gpu_profile() if chapter == "07_rpt" else gpu_profile()


def rl_compute_units(history: pd.DataFrame, prompt_tokens: float, prompts_per_step: int, group_size: int) -> pd.Series:
    """Training compute of RL steps, per seed, in token-forward units (a forward over one token, 2N
    FLOPs for N parameters), as chapter 7 counts it: generating a token costs 1, training on it 3 more
    (forward and backward); next-token prediction costs 3 a token.

    Per step: ``(generated_groups * G + 3 * trained_groups * G) * (prompt_tokens + length)``, from the
    history's ``generated_groups`` / ``trained_groups`` (:func:`grpo_lab.algo.selection.sampling_metrics`),
    so dynamic sampling's refills are charged; without them, ``4 * P * G * (prompt_tokens + length)``
    (no dynamic sampling). ``length`` is the step's mean over every generated sequence.

    Args:
        history: rows of RL steps (``step > 0``; others ignored) with ``seed``, ``length`` (mean
            completion tokens) and optionally both ``generated_groups`` and ``trained_groups`` (NaN: ``P``).
        prompt_tokens: mean prompt length in tokens.
        prompts_per_step, group_size: P and G.

    Returns:
        units (float) summed over each seed's steps, indexed by seed, named ``"rl_units"``.

    Raises:
        ValueError: ``history`` lacks ``step``, ``seed`` or ``length``, or has only one of
            ``generated_groups`` and ``trained_groups``; ``prompts_per_step`` or ``group_size`` is not
            a positive int.
    """
    missing = [c for c in ("step", "seed", "length") if c not in history.columns]
    if missing:
        raise ValueError(f"rl_compute_units: the history lacks the column(s) {missing}")
    P = positive_int("rl_compute_units: prompts_per_step", prompts_per_step)
    G = positive_int("rl_compute_units: group_size", group_size)
    counts = [c for c in ("generated_groups", "trained_groups") if c in history.columns]
    if len(counts) == 1:
        raise ValueError(f"rl_compute_units: the history has {counts[0]!r} without "
                         f"{({'generated_groups', 'trained_groups'} - set(counts)).pop()!r}; both or neither")
    h = history[history["step"] > 0]
    tokens = prompt_tokens + h["length"]
    if counts:
        generated = h["generated_groups"].astype(float).fillna(P)
        trained = h["trained_groups"].astype(float).fillna(P)
        units = (generated * G + 3 * trained * G) * tokens
    else:
        units = 4 * P * G * tokens
    return units.groupby(h["seed"]).sum().rename("rl_units")


def run_rpt_gpu(*, seeds: Sequence[int] = (0, 1, 2, 3, 4), steps: int | None = None, profile: Profile | None = None,
                n_jobs: int = 1, ntp_batch_size: int = 16, out: str | Path | None = None,
                algorithm: Algorithm | None = None) -> dict[str, RunResult]:
    """Chapter 7 on a hub model: RPT, and continued next-token prediction on the same text at the same
    compute, per seed; written to ``07_rpt.json`` with provenance (:func:`run_chapter_gpu`).

    1. The task's data files are built if :func:`rpt_data_dir` lacks them
       (:func:`grpo_lab.tasks.next_token.build_hub_task_data`, the model as its own entropy proxy,
       :data:`~grpo_lab.lab.RPT_GPU_TEST_SIZE` or ``$GRPO_LAB_RPT_TEST_SIZE`` test positions).
    2. ``algorithm`` (default: ``RPT`` with dynamic sampling, as the paper trains from its step 500)
       is trained on :func:`rpt_gpu_profile` (or ``profile``) for every seed.
    3. Per seed, the base is trained by plain next-token prediction
       (:func:`grpo_lab.lab.pretrain.continued_ntp_run`, ``p_format=0``, the ``rl`` part) for the steps
       whose compute equals that RL run's (:func:`rl_compute_units`), evaluated on the same test
       positions and stored as the algorithm ``"continued NTP"`` (its step-0 row the RL run's base
       evaluation; provenance marked ``baseline``).

    Args:
        seeds, steps, n_jobs, out: as :func:`run_chapter_gpu`.
        profile: default :func:`rpt_gpu_profile` ().
        ntp_batch_size: windows per next-token-prediction step.
        algorithm: the :class:`~grpo_lab.algo.algorithms.Algorithm` to train (``None``: RPT with dynamic sampling).

    Returns:
        ``{algorithm.name: RunResult, "continued NTP": RunResult}``.

    Raises:
        TypeError: ``algorithm`` is not an :class:`~grpo_lab.algo.algorithms.Algorithm` (a name included).
        ValueError: as :func:`run_chapter_gpu`; a profile whose task is not ``"next_token"``; an
            algorithm named ``"continued NTP"``; a ``$GRPO_LAB_RPT_TEST_SIZE`` that is not a positive integer.
    """
    algo = _rpt_algorithm(algorithm)
    prof, seeds = _rpt_arguments(profile, seeds, ntp_batch_size)
    test_size = _rpt_test_size()
    path = _gpu_results_path("07_rpt", out, steps, n_jobs)
    task_data = _rpt_task_data(prof, test_size)
    t0 = time.perf_counter()
    grid = run_chapter_gpu("07_rpt", [algo], seeds=seeds, steps=steps, profile=prof, n_jobs=n_jobs, out=path,
                           finish=False)
    rl = grid[algo.name]
    task = get_task("next_token", **dict(prof.task_kwargs))
    prompt_tokens = _mean_prompt_tokens(task)
    units = rl_compute_units(rl.history, prompt_tokens, prof.config.prompts_per_step, prof.config.group_size)
    rows, ntp_steps, t1 = [], {}, time.perf_counter()
    for seed in seeds:
        ntp_steps[seed], seed_rows = _continued_ntp_seed(seed, prof, task, rl.history, float(units.loc[seed]),
                                                         ntp_batch_size)
        rows.extend(seed_rows)
        grid[NTP_BASELINE] = RunResult(pd.DataFrame(rows), _continued_ntp_provenance(
            prof, ntp_batch_size, ntp_steps, units, prompt_tokens, time.perf_counter() - t1, algo.name))
        _save_chapter(path, "07_rpt", prof, grid, seeds, time.perf_counter() - t0, seed == seeds[-1],
                      extra={"task_data": task_data})
    return grid


def _rpt_algorithm(algorithm: Any) -> Algorithm:
    """:func:`run_rpt_gpu`'s algorithm: ``None`` is the ``RPT`` preset with dynamic sampling
    (``"RPT + dynamic sampling"``, the chapter's ``RPT_DS``), an :class:`Algorithm` itself.

    Raises:
        TypeError: anything else (a preset's name too: pass the preset).
        ValueError: an algorithm named as the baseline, ``"continued NTP"``.
    """
    from ..algo.algorithms import RPT

    if algorithm is None:
        return RPT.replace(name="RPT + dynamic sampling", dynamic_sampling=True)
    if not isinstance(algorithm, Algorithm):
        hint = " (a preset's name: pass the preset, e.g. grpo_lab.algo.algorithms.RPT)" if isinstance(algorithm, str) else ""
        raise TypeError(f"run_rpt_gpu: algorithm must be a grpo_lab.algo.algorithms.Algorithm or None (RPT with dynamic "
                        f"sampling), got {type(algorithm).__name__} {algorithm!r:.80}{hint}")
    if algorithm.name == NTP_BASELINE:
        raise ValueError(f"run_rpt_gpu: the algorithm's name {NTP_BASELINE!r} is the baseline's; rename it "
                         f"(algorithm.replace(name=...))")
    return algorithm


def _rpt_arguments(profile: Profile | None, seeds: Sequence[int], ntp_batch_size: int) -> tuple[Profile, list[int]]:
    """:func:`run_rpt_gpu`'s profile (default :func:`rpt_gpu_profile`) and seeds, checked before any work.

    Raises:
        ValueError: a profile whose task is not ``"next_token"``, ``ntp_batch_size < 1``, bad seeds.
    """
    prof = profile if profile is not None else rpt_gpu_profile()
    if prof.task != "next_token":
        raise ValueError(f"run_rpt_gpu: the profile's task must be 'next_token' (lab.rpt_gpu_profile), got "
                         f"{prof.task!r}")
    positive_int("run_rpt_gpu: ntp_batch_size", ntp_batch_size)
    try:
        seeds = _check_seeds(seeds)
    except ValueError as exc:
        raise ValueError(f"run_rpt_gpu: {exc}") from None
    return prof, seeds


def _rpt_task_data(prof: Profile, test_size: int = RPT_GPU_TEST_SIZE) -> dict | None:
    """The next-token task's data files for ``prof``, built with ``test_size`` held-out positions if its
    data directory lacks them (:func:`grpo_lab.tasks.next_token.build_hub_task_data`); returns their
    ``summary.json`` (how they were built: model, proxy, token counts, entropies), ``None`` when there is
    none. Warns when they hold another number of test positions than ``test_size`` (built by hand, or for
    another ``$GRPO_LAB_RPT_TEST_SIZE``).

    Raises:
        ValueError: the data directory is a file, or its files were built for another model.
        OSError: the model cannot be loaded (named as :func:`~grpo_lab.experiments.run` names it), or the files cannot be written.
    """
    from ..tasks.next_token import TEST_FILE, TRAIN_FILE, build_hub_task_data

    data = Path(dict(prof.task_kwargs)["data"])
    where = "$GRPO_LAB_RPT_DATA" if os.environ.get("GRPO_LAB_RPT_DATA") else "the profile's data"
    if data.exists() and not data.is_dir():
        raise ValueError(f"run_rpt_gpu: the task's data directory {data} ({where}) is a file")
    summary = data / "summary.json"  # how the data files were built (model, proxy, token counts, entropies)
    if not ((data / TRAIN_FILE).is_file() and (data / TEST_FILE).is_file()):
        try:
            build_hub_task_data(prof.base, data, device=prof.config.device, test_size=test_size)
        except (FileExistsError, NotADirectoryError, PermissionError):
            raise  # writing the data files failed, not loading the model: the error names the path
        except OSError as exc:
            raise _unloadable(prof, exc) from exc
    task_data = json.loads(summary.read_text()) if summary.is_file() else None
    if task_data is not None and not _same_model(task_data.get("model"), prof.base):
        fix = ("unset $GRPO_LAB_RPT_DATA (a directory per model) or point it at an empty directory"
               if os.environ.get("GRPO_LAB_RPT_DATA") else
               f"set $GRPO_LAB_RPT_DATA to an empty directory, or delete {data} to rebuild it")
        raise ValueError(f"run_rpt_gpu: the task's data files in {data} were built for {task_data.get('model')!r}, not "
                         f"for the profile's model {prof.base!r}: {fix}")
    if task_data is not None and task_data.get("test_positions") != test_size:
        warnings.warn(f"run_rpt_gpu: the task's data files in {data} hold {task_data.get('test_positions')} test "
                      f"positions, not {test_size} (they were built by hand, or for another $GRPO_LAB_RPT_TEST_SIZE); "
                      "the results file records it",
                      RuntimeWarning, stacklevel=3)
    return task_data


def _mean_prompt_tokens(task: Any) -> float:
    """Mean length in tokens of the test prompts of a next-token ``task``, counted with the tokenizer
    its data files were cut with (the model's)."""
    tok = task._tok()
    return float(np.mean([len(tok(p.prompt, add_special_tokens=False)["input_ids"]) for p in task.test_set()]))


def _continued_ntp_seed(seed: int, prof: Profile, task: Any, rpt_history: pd.DataFrame, rl_units: float,
                        batch_size: int) -> tuple[int, list[dict]]:
    """One seed of :func:`run_rpt_gpu`'s baseline: the base model trained by continued next-token
    prediction for the steps whose compute (3 units a token) equals ``rl_units``, then evaluated.

    Returns:
        ``(steps, rows)``: the NTP steps taken, and two rows of the ``"continued NTP"`` history: step 0
        (the RL run's base evaluation of ``seed``, from ``rpt_history``: the same model) and the RL run's
        last step (the evaluation after training, greedy and sampled).
    """
    from .pretrain import RECIPES, continued_ntp_run

    kw = dict(prof.task_kwargs)
    n = max(1, round(rl_units / (3 * batch_size * RECIPES["corpus"].seq_len)))
    x = continued_ntp_run(seed, steps=n, base=prof.base, lr=prof.config.lr, temperature=prof.config.temperature,
                          batch_size=batch_size, threads=None, device=prof.config.device,
                          task_kwargs={**kw, "max_new_tokens": prof.config.max_new_tokens or kw["max_new_tokens"]},
                          precision=prof.config.precision, p_format=0.0)
    base_row = rpt_history[(rpt_history["seed"] == seed) & (rpt_history["step"] == 0)].iloc[0]
    first = {"step": 0, "seed": seed, "algo": NTP_BASELINE,
             **{k: base_row[k] for k in base_row.index if k.startswith("test_")}}
    final = {"step": int(rpt_history["step"].max()), "seed": seed, "algo": NTP_BASELINE, "ntp_steps": n,
             "ntp_tokens": x["tokens"], "ntp_loss_last": x["loss_last"], "test_held_out_loss": x["held_out_loss"],
             "test_accuracy": float(x["frame"]["correct"].mean()),
             "test_length": float(x["summary"]["mean_length"]),
             "test_accuracy_sampled": float(x["sampled_frame"]["correct"].mean())}
    if "reasoning_frac" in x["summary"]:
        final["test_reasoning_frac"] = float(x["summary"]["reasoning_frac"])
    final.update({f"test_{k}": v for k, v in task.test_metrics(x["frame"]).items()})
    final.update({f"test_sampled_{k}": v for k, v in task.test_metrics(x["sampled_frame"]).items()})
    return n, [first, final]


def _continued_ntp_provenance(prof: Profile, batch_size: int, ntp_steps: Mapping[int, int], units: pd.Series,
                              prompt_tokens: float, wall: float, matched: str) -> dict:
    """The provenance of :func:`run_rpt_gpu`'s ``"continued NTP"`` baseline over the seeds of ``ntp_steps``
    so far (marked ``baseline``: :func:`check_gpu_results` holds it to the facts on seeds and test accuracies),
    matched to the RL run named ``matched``: ``rl_units`` are that run's units per seed (:func:`rl_compute_units`)."""
    from .pretrain import RECIPES

    return {"baseline": True, "matched_to": matched,
            "what": f"continued next-token prediction at the compute of the {matched} run of the same seed",
            "config": {"lr": prof.config.lr, "batch_size": batch_size, "window_tokens": RECIPES["corpus"].seq_len,
                       "p_format": 0.0, "precision": prof.config.precision, "minibatches": 1, "epochs": 1,
                       "warmup": 0,
                       "optimizer": f"AdamW, betas (0.9, 0.98), weight decay {RECIPES['corpus'].weight_decay}, "
                                    f"global-norm clip {RECIPES['corpus'].grad_clip} (grpo_lab.lab.pretrain.continue_ntp)"},
            "ntp_steps": {str(k): v for k, v in ntp_steps.items()},
            "rl_units": {str(k): float(units.loc[k]) for k in ntp_steps},
            "rl_units_formula": "sum over RL steps of (generated_groups * G + 3 * trained_groups * G) * "
                                "(prompt_tokens_mean + length): a unit is one token forward; one per generated "
                                "token (dynamic sampling's refills included), three per trained token; "
                                "NTP costs 3 units per token (lab.rl_compute_units)",
            "prompt_tokens_mean": round(prompt_tokens, 2), "seeds": list(ntp_steps), "wall_seconds": round(wall, 1)}
