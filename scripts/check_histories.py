"""Bit-identity check of the book's experiment histories, over all chapters.

Runs the training experiments of chapters 1-7 as the chapters configure them (their jupytext twins
``book/_py/0N_*.py``: the same algorithms, profiles, tasks, steps, overrides and seeds 0-4, CPU
profile, without the run cache) and either writes their histories (``--write FILE``) or compares
them with a file written earlier (``--compare FILE``), column by column and bit for bit (NaN equals
NaN). Wall-clock columns (``tokens_per_s``, ``gen_seconds``, ``step_seconds``, ``eval_seconds``,
``seconds``) and ``peak_mem_mb`` are dropped first: they are the only ones allowed to differ. Used
to show that a refactor changed no number; see book/guide/reproducibility.md.

What each chapter contributes (everything its ``experiments.run`` / ``run_grid`` /
``map_workers`` calls train, with the chapter's own settings; no setting is left out):

* ``01_grpo``: GRPO, 30 steps (§1.6); the μ grid μ = 1, 4, 8 at 10 steps with the chapter's
  per-setting minibatches / epochs / warm-up (§1.7; μ = 2 is §1.6's run, reused there).
* ``02_dapo``: the six cumulative DAPO settings, 12 steps, budget 20 tokens, evaluation every 6
  steps; the matched-generation naive-GRPO control (questions per step from DAPO's history).
* ``03_dr_grpo``: GRPO (β = 0), Dr.GRPO and DeepSeek-V3.2 (β 0.01, δ 0.02, ε 0.2) on the filler
  profile (``arithmetic-filler-base``, budget 64, 20 steps, evaluation every 10).
* ``04_gspo``: §4.1's probe (one rollout of 64 questions, four GRPO updates at the full rate, no warm-up)
  that sizes the matched range, then the dense grid GRPO / GSPO / GSPO (matched range) (four minibatches),
  the MoE grid (GRPO, GRPO + Routing Replay) on ``arithmetic-moe-base`` and GRPO on the dense policy, both at
  16 minibatches and learning rate 1e-4, 10 steps, evaluation every 5; and the MoE on-policy control (GRPO
  with one update per rollout of one question: 160 steps, evaluation every 80).
* ``05_cispo``: DAPO / CISPO / CISPO with Eq. 7's mask / CISPO with the cap of 5.0, 6 steps at 16 minibatches per rollout,
  learning rate 1e-4, evaluation every 2 (§5.5; §5.4's thirty-seed rare-token runs are by hand on a
  ``Trainer``, not covered).
* ``06_vapo``: §6.7's value pretraining (16 steps, ``policy`` and ``scratch`` critics; the
  ``policy`` one is saved to a temporary directory and loaded by the grid), then the six ablation
  rows whose precondition holds, the critic's control (VAPO with group advantages), GRPO and DAPO,
  8 steps, 8 questions per step, evaluation every 4.
* ``07_rpt``: RPT and the RPT hybrid on the next-token task (``corpus-base``, 16 steps), RPT with
  dynamic sampling (8 steps), and the continued-NTP baseline at matched compute (its summaries and both evaluation frames).

Not covered: experiments a chapter runs by hand on a ``Trainer`` for a figure (chapter 3's drift
recording, chapter 5's sixteen updates on one batch and its bfloat16 rollout, chapter 6's
dry-run subprocess) and every GPU run. Chapter 4's probe only sizes the matched range (it changes
the history if its numbers change).

Seeds: every run of a grid starts from the same base weights and is seeded by its own seed alone,
so ``--seeds 0 1`` reproduces exactly the seed-0 and seed-1 rows of the chapters' five-seed runs
(a faithful subset, at 2/5 of the cost), with two exceptions computed from the seeds run: chapter
2's matched-generation control (its questions per step come from DAPO's mean over seeds) and
chapter 7's continued-NTP step count (from RPT's mean compute over seeds). A file records its
seeds; ``--compare`` needs the same ``--seeds``.

Cost, measured at c94ed8c with ``--seeds 0 1 --n-jobs 2`` on a 2-core machine (CPU seconds of all
processes, from ``/proc``): chapters 1-7 took 168, 173, 195, 189, 189, 214 and about 90, about
1220 in all, so about 10-11 minutes of wall time on two idle cores (1824 s on cores shared with
other jobs). All five seeds cost about 2.7 times as much (chapter 1: 450 CPU seconds), about
25-28 minutes on two idle cores: over a 20-minute budget, hence ``--seeds 0 1`` for routine
checks and the default five for a final one. The script prints each chapter's wall time.

    python scripts/check_histories.py --write /tmp/before.pkl     # on the old code
    python scripts/check_histories.py --compare /tmp/before.pkl   # on the new code; exit 1 on any difference
    python scripts/check_histories.py --compare /tmp/before.pkl --chapters 01_grpo 04_gspo
    python scripts/check_histories.py --write /tmp/before2.pkl --seeds 0 1   # the 2-seed subset
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from grpo_lab import experiments, lab
from grpo_lab.training import NoLearningSignalWarning

TIMING = ("tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "seconds", "peak_mem_mb")
SEEDS = (0, 1, 2, 3, 4)


def _frames(grid) -> list[pd.DataFrame]:
    """The histories of a ``{name: RunResult}`` grid (or one ``RunResult``), in order."""
    results = grid.values() if isinstance(grid, dict) else [grid]
    return [r.history for r in results]


def chapter_01(n_jobs: int, seeds: tuple[int, ...]) -> list[pd.DataFrame]:
    """§1.6's GRPO run (30 steps) and §1.7's μ grid (μ = 1, 4, 8; 10 steps)."""
    from grpo_lab.algo.algorithms import GRPO

    profile = experiments.get_profile("cpu")
    result = experiments.run("GRPO", profile="cpu", seeds=seeds, steps=30, n_jobs=n_jobs, cache=False)
    mus, steps_mu = (1, 2, 4, 8), 10
    warm_rollouts = profile.config.warmup / (profile.config.minibatches * profile.config.epochs)
    reused = profile.config.minibatches in mus and profile.config.epochs == 1
    todo = [mu for mu in mus if not (reused and mu == profile.config.minibatches)]
    mu_grid = experiments.run_grid(
        [GRPO.replace(name=f"mu={mu}") for mu in todo], profile="cpu", seeds=seeds, steps=steps_mu, n_jobs=n_jobs,
        cache=False,
        overrides={f"mu={mu}": {"minibatches": mu, "epochs": 1, "warmup": round(warm_rollouts * mu)} for mu in todo})
    return _frames(result) + _frames(mu_grid)


def chapter_02(n_jobs: int, seeds: tuple[int, ...]) -> list[pd.DataFrame]:
    """§2.5's six cumulative settings and the matched-generation control (12 steps, budget 20)."""
    from grpo_lab.algo.algorithms import DAPO, GRPO

    steps, budget, eval_every = 12, 20, 6
    naive = GRPO.replace(name="naive GRPO", kl=None, beta=0.0)
    frac = DAPO.overlong_cache_frac
    settings = [
        naive,
        naive.replace(name="+ overlong filtering", overlong_filter=True),
        naive.replace(name="+ clip-higher", overlong_filter=True, eps_high=0.28),
        naive.replace(name="+ soft overlong punishment", overlong_filter=True, eps_high=0.28, overlong_cache_frac=frac),
        naive.replace(name="+ token-level loss", overlong_filter=True, eps_high=0.28, overlong_cache_frac=frac,
                      aggregation="group_token_mean"),
        DAPO.replace(name="+ dynamic sampling (DAPO)"),
    ]
    grid = experiments.run_grid(settings, profile="cpu", seeds=seeds, steps=steps, n_jobs=n_jobs, cache=False,
                                max_new_tokens=budget, eval_every=eval_every)
    dapo_gen = float(grid["+ dynamic sampling (DAPO)"].history["samples_per_trained"].mean())
    matched_p = int(round(experiments.get_profile("cpu").config.prompts_per_step * dapo_gen))
    control = experiments.run(naive.replace(name="naive GRPO, matched generation"), profile="cpu", seeds=seeds,
                              steps=steps, n_jobs=n_jobs, cache=False, max_new_tokens=budget,
                              prompts_per_step=matched_p, eval_every=eval_every)
    return _frames(grid) + _frames(control)


def chapter_03(n_jobs: int, seeds: tuple[int, ...]) -> list[pd.DataFrame]:
    """§3.4's grid on the filler profile: GRPO (β = 0), Dr.GRPO, DeepSeek-V3.2."""
    from grpo_lab.algo.algorithms import DR_GRPO, GRPO, deepseek_v32

    base = experiments.get_profile("cpu")
    profile = dataclasses.replace(base, name=f"{base.name}-filler", base="arithmetic-filler-base",
                                  task_kwargs=(("filler", "."), ("max_new_tokens", 64)),
                                  config=dataclasses.replace(base.config, eval_every=10), steps=20)
    v32 = deepseek_v32(beta=0.01, delta=0.02, eps=0.2)
    settings = [GRPO.replace(name="GRPO (beta=0)", kl=None, beta=0.0), DR_GRPO.replace(name="Dr.GRPO"),
                v32.replace(name="DeepSeek-V3.2")]
    return _frames(experiments.run_grid(settings, profile=profile, seeds=seeds, n_jobs=n_jobs, cache=False))


def _gspo_matched_range(prof, grpo_nokl, updates: int) -> float:
    """§4.1/§4.4's probe: the sequence range that leaves as many responses outside as GRPO's range
    leaves tokens, to one significant digit (the chapter's ``EPS_MATCH``)."""
    full_rate = dataclasses.replace(prof, config=dataclasses.replace(prof.config, warmup=0))  # no warm-up
    probe = lab.update_probe(0, algo=grpo_nokl, profile=full_rate, prompts_per_step=64, minibatches=updates)
    log_r, mask = probe["log_ratio"], probe["mask"]
    lengths = mask.sum(1)
    rows = lengths > 0
    r_tok = log_r[mask].exp()
    s_seq = (log_r.sum(1)[rows] / lengths[rows]).exp()
    out_tok = float(((r_tok < 1 - grpo_nokl.eps_low) | (r_tok > 1 + grpo_nokl.eps_high)).double().mean())
    eps_match = float(np.quantile((s_seq - 1).abs().numpy(), 1 - out_tok))
    return float(f"{eps_match:.1g}")


def chapter_04(n_jobs: int, seeds: tuple[int, ...]) -> list[pd.DataFrame]:
    """§4.5's dense grid and §4.6's MoE grid (Routing Replay), with the probe's matched range."""
    from grpo_lab.algo.algorithms import GRPO, GSPO

    prof = experiments.get_profile("cpu")
    updates, steps, eval_every = 4, 10, 5
    grpo_nokl = GRPO.replace(name="GRPO", kl=None, beta=0.0, eps_high=0.27)
    eps_match = _gspo_matched_range(prof, grpo_nokl, updates)
    print(f"04_gspo: matched range {eps_match:g}", flush=True)
    gspo_matched = GSPO.replace(name="GSPO (matched range)", eps_low=eps_match, eps_high=eps_match)
    dense = experiments.run_grid([grpo_nokl, GSPO, gspo_matched], profile="cpu", seeds=seeds, n_jobs=n_jobs,
                                 steps=steps, cache=False, minibatches=updates, eval_every=eval_every)
    moe_prof = dataclasses.replace(prof, name=f"{prof.name}-moe", base="arithmetic-moe-base")
    grpo_rr = grpo_nokl.replace(name="GRPO + routing replay")
    grpo_on = grpo_nokl.replace(name="GRPO, one update per rollout")
    moe_mb, moe_lr = 16, 1e-4
    moe = experiments.run_grid([grpo_nokl, grpo_rr], profile=moe_prof, seeds=seeds, n_jobs=n_jobs,
                               steps=steps, cache=False, minibatches=moe_mb, lr=moe_lr, eval_every=eval_every,
                               overrides={grpo_rr.name: {"routing_replay": True}})
    with warnings.catch_warnings():  # one question per rollout: tied rollouts in a row are expected
        warnings.simplefilter("ignore", NoLearningSignalWarning)
        moe |= experiments.run_grid([grpo_on], profile=moe_prof, seeds=seeds, n_jobs=n_jobs, steps=steps * moe_mb,
                                    cache=False, prompts_per_step=moe_prof.config.prompts_per_step // moe_mb,
                                    minibatches=1, lr=moe_lr, eval_every=eval_every * moe_mb)
    dense16 = experiments.run_grid([grpo_nokl], profile="cpu", seeds=seeds, n_jobs=n_jobs, steps=steps, cache=False,
                                   minibatches=moe_mb, lr=moe_lr, eval_every=eval_every)
    return (_frames(dense) + [h.assign(algo="MoE: " + h["algo"]) for h in _frames(moe)]
            + [h.assign(algo="dense, 16 minibatches: " + h["algo"]) for h in _frames(dense16)])


def chapter_05(n_jobs: int, seeds: tuple[int, ...]) -> list[pd.DataFrame]:
    """§5.5's DAPO / CISPO / CISPO + Eq. 7's mask / CISPO cap 5 grid: 6 steps at 16 minibatches (the paper's 16
    off-policy rounds), whole minibatches, learning rate 1e-4, evaluation every 2."""
    from grpo_lab.algo.algorithms import CISPO, DAPO

    cispo_mask = CISPO.replace(name="CISPO + mask", mask_eps_low=DAPO.eps_low, mask_eps_high=DAPO.eps_high)
    cispo_5 = CISPO.replace(name="CISPO cap 5", eps_high=4.0)
    grid = experiments.run_grid([DAPO, CISPO, cispo_mask, cispo_5], profile="cpu", seeds=seeds, n_jobs=n_jobs, steps=6,
                                cache=False, minibatches=16, micro_batch_size=None, lr=1e-4, eval_every=2)
    return _frames(grid)


def _vapo_value_pretraining(vapo_ours, value_lr: float, critic_dir: Path) -> list[pd.DataFrame]:
    """§6.7: 16 value-pretraining steps (seed 0) per critic design; saves the ``policy`` critic."""
    from grpo_lab.policy.models import load_policy
    from grpo_lab.tasks import get_task
    from grpo_lab.training.trainer import Trainer

    profile = experiments.get_profile("cpu")
    task = get_task(profile.task)
    frames, critics = [], {}
    for init in ("policy", "scratch"):
        pol, tok = load_policy(profile.base)
        cfg = dataclasses.replace(profile.config, seed=0, value_init=init, value_lr=value_lr, eval_every=0,
                                  progress=False)
        tr = Trainer(pol, tok, task, vapo_ours, cfg)
        h = tr.pretrain_value(16)
        critics[init] = tr
        frames.append(h.assign(algo=f"value pretraining ({init})", seed=0, step=h["value_step"]))
    critics["policy"].value_model.save(critic_dir)
    return frames


def chapter_06(n_jobs: int, seeds: tuple[int, ...]) -> list[pd.DataFrame]:
    """§6.7's value pretraining and §6.9's ablation grid (the six rows whose precondition holds, the
    critic's control, GRPO, DAPO; 8 steps)."""
    from grpo_lab.algo.algorithms import DAPO, GRPO, PPO, VAPO

    profile = experiments.get_profile("cpu")
    vapo_ours = VAPO.replace(lam_alpha=4.0)
    value_lr = 2 * profile.config.lr
    critic_dir = Path(tempfile.gettempdir()) / "check_histories_06_vapo_critic"  # a fixed path, as the chapter's
    try:
        frames = _vapo_value_pretraining(vapo_ours, value_lr, critic_dir)
        p, g = 8, profile.config.group_size
        no_groups = {"prompts_per_step": p * g, "group_size": 1}
        ablation = [
            PPO,
            vapo_ours.replace(name="w/o value pretraining"),
            vapo_ours.replace(name="w/o clip-higher", eps_high=0.2),
            vapo_ours.replace(name="w/o positive-example LM loss", nll_coef=0.0),
            vapo_ours.replace(name="w/o group sampling"),
            vapo_ours,
        ]  # the chapter's regime check drops the length-adaptive GAE, decoupled GAE and token-level loss rows
        control = vapo_ours.replace(name="VAPO with group advantages", advantage="group")  # the critic's control
        overrides = {"PPO": {**no_groups, "value_init": "policy"}, "w/o value pretraining": {"value_init": "policy"},
                     "w/o group sampling": no_groups, "GRPO": {"value_init": "policy"},
                     "DAPO": {"value_init": "policy"}, control.name: {"value_init": "policy"}}
        grid = experiments.run_grid([*ablation, control, GRPO, DAPO], profile="cpu", seeds=seeds, steps=8, n_jobs=n_jobs,
                                    cache=False, eval_every=4, value_init=str(critic_dir), value_lr=value_lr,
                                    prompts_per_step=p, overrides=overrides)
        return frames + _frames(grid)
    finally:
        shutil.rmtree(critic_dir, ignore_errors=True)


def _ntp_frames(runs: list[dict]) -> list[pd.DataFrame]:
    """Chapter 7's continued-NTP results as history-like tables: one summary row per seed, and the
    greedy and sampled evaluation frames (one row per test position)."""
    frames = []
    for x in runs:
        row = {"algo": "continued NTP", "seed": x["seed"], "step": x["steps"], "tokens": x["tokens"],
               "loss_last": x["loss_last"]}
        for kind in ("summary", "sampled_summary"):
            row.update({f"{kind}_{k}": v for k, v in x[kind].items() if np.isscalar(v)})
        frames.append(pd.DataFrame([row]))
        for kind in ("frame", "sampled_frame"):
            f = x[kind].reset_index(drop=True)
            frames.append(f.assign(algo=f"continued NTP, {kind}", seed=x["seed"], step=x["steps"],
                                   position=np.arange(len(f))))
    return frames


def chapter_07(n_jobs: int, seeds: tuple[int, ...]) -> list[pd.DataFrame]:
    """§7.5: RPT and the RPT hybrid (16 steps), RPT + dynamic sampling (8 steps), continued NTP at
    matched compute."""
    from grpo_lab.algo.algorithms import RPT, RPT_HYBRID, RPT_SAMPLING
    from grpo_lab.policy.models import load_policy
    from grpo_lab.paths import checkpoint_dir
    from grpo_lab.lab.pretrain import RECIPES, continued_ntp_run
    from grpo_lab.tasks import NextTokenTask
    from grpo_lab.tasks.next_token import ENTROPY_THRESHOLDS

    steps, p = 16, 8
    _, tok = load_policy(checkpoint_dir("corpus-base"))
    test = NextTokenTask().test_set()
    base = experiments.get_profile("cpu")
    lr = base.config.lr
    profile = dataclasses.replace(
        base, name="rpt-cpu", base="corpus-base", task="next_token", steps=steps,
        task_kwargs={"min_entropy": ENTROPY_THRESHOLDS["easy"]},
        config=dataclasses.replace(base.config, **RPT_SAMPLING, prompts_per_step=p, minibatches=1, epochs=1,
                                   micro_batch_size=None, lr=lr, warmup=2, eval_every=4, eval_sampled=True))
    rpt_ds = RPT.replace(name="RPT + dynamic sampling", dynamic_sampling=True)
    grid = {}  # one run per setting, as the chapter (which saves each policy for its held-out loss)
    for algo, kw in ((RPT, {}), (rpt_ds, {"steps": 8, "eval_every": 8}), (RPT_HYBRID, {"eval_every": steps})):
        grid[algo.name] = experiments.run(algo, profile=profile, seeds=seeds, n_jobs=n_jobs, cache=False, **kw)
    hist = grid["RPT"].history
    prompt_tokens = float(np.mean([len(tok(q.prompt, add_special_tokens=False)["input_ids"]) for q in test]))
    train_hist = hist[hist["step"] > 0].copy()
    train_hist["units"] = 4 * p * RPT_SAMPLING["group_size"] * (prompt_tokens + train_hist["length"])
    rpt_units = float(train_hist.groupby("seed")["units"].sum().mean())
    r = RECIPES["corpus"]
    ntp_batch_tokens = 32 * (r.p_format * (32 + 2 + (1 * 0.5 + 2 * 0.3 + 3 * 0.2) + 1) + (1 - r.p_format) * r.seq_len)
    ntp_steps = max(1, round(rpt_units / (3 * ntp_batch_tokens)))
    print(f"07_rpt: continued NTP for {ntp_steps} steps", flush=True)
    ntp_runs = experiments.map_workers(functools.partial(continued_ntp_run, steps=ntp_steps, lr=lr, threads=1),
                                       seeds, n_jobs=n_jobs)
    return _frames(grid) + _ntp_frames(ntp_runs)


CHAPTERS = {"01_grpo": chapter_01, "02_dapo": chapter_02, "03_dr_grpo": chapter_03, "04_gspo": chapter_04,
            "05_cispo": chapter_05, "06_vapo": chapter_06, "07_rpt": chapter_07}


def run_all(n_jobs: int, chapters=tuple(CHAPTERS), seeds=SEEDS, write: str | None = None) -> pd.DataFrame:
    """The histories of ``chapters``, timing columns dropped, one long table with a ``chapter`` column
    (``attrs["seeds"]``: the seeds). With ``write``, the table so far is pickled there after each chapter."""
    random.seed(0)  # as book.setup_notebook(seed=0): the chapters' ad-hoc tensors
    np.random.seed(0)
    torch.manual_seed(0)
    frames = []
    for chapter in chapters:
        t0 = time.perf_counter()
        for h in CHAPTERS[chapter](n_jobs, tuple(seeds)):
            h = h.drop(columns=[c for c in TIMING if c in h.columns])
            h.insert(0, "chapter", chapter)
            frames.append(h)
        hist = pd.concat(frames, ignore_index=True)
        hist.attrs["seeds"] = list(seeds)
        if write:
            hist.to_pickle(write)
        print(f"{chapter}: {time.perf_counter() - t0:.0f} s", flush=True)
    return hist


def _where(df: pd.DataFrame, i: int) -> str:
    row = df.iloc[i]
    return ", ".join(f"{k} {row[k]}" for k in ("chapter", "algo", "seed", "step") if k in df.columns)


def compare(new: pd.DataFrame, old: pd.DataFrame) -> list[str]:
    """Every difference between two history tables, as readable lines (empty: bit-identical).

    Float columns are compared as float64, NaN equal to NaN; other columns with ``==``, missing
    values (None/NaN) equal to each other. Dtypes are not compared: a column's dtype depends on
    which chapters were concatenated (an integer column with gaps becomes float).
    """
    problems = []
    if sorted(new.columns) != sorted(old.columns):
        problems.append(f"columns differ: only new {sorted(set(new.columns) - set(old.columns))}, "
                        f"only old {sorted(set(old.columns) - set(new.columns))}")
    if len(new) != len(old):
        return problems + [f"row count {len(new)} != {len(old)}"]
    for col in sorted(set(new.columns) & set(old.columns)):
        a, b = new[col].to_numpy(), old[col].to_numpy()
        if a.dtype.kind in "fiub" and b.dtype.kind in "fiub" and "f" in (a.dtype.kind + b.dtype.kind):
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
        elif a.dtype.kind in "iub" and b.dtype.kind in "iub":
            same = a == b
        else:  # objects (strings, None, NaN)
            same = np.array([x == y or (pd.isna(x) and pd.isna(y)) if np.isscalar(x) or x is None else
                             bool(np.all(x == y)) for x, y in zip(a, b)], dtype=bool)
        if not same.all():
            i = int(np.flatnonzero(~same)[0])
            problems.append(f"{col}: {int((~same).sum())} rows differ, first at row {i} "
                            f"({_where(new, i)}): {a[i]!r} vs {b[i]!r}")
    return problems


def compare_files(new: pd.DataFrame, old: pd.DataFrame, chapters) -> list[str]:
    """:func:`compare` of a run of ``chapters`` with the same chapters' rows of a stored table
    (columns that are all missing in either dropped first: other chapters' columns)."""
    missing = sorted(set(chapters) - set(old["chapter"]))
    old = old[old["chapter"].isin(chapters)].dropna(axis=1, how="all").reset_index(drop=True)
    problems = [f"chapters not in the stored file: {missing}"] if missing else []
    return problems + compare(new.dropna(axis=1, how="all"), old)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", metavar="FILE", help="run the experiments and store the histories (pickle)")
    g.add_argument("--compare", metavar="FILE", help="run the experiments and compare with FILE")
    p.add_argument("--chapters", nargs="+", choices=list(CHAPTERS), default=list(CHAPTERS),
                   help="chapters to run (default: all); --compare compares only these chapters' rows of FILE")
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS),
                   help="seeds of every run (default: the chapters' 0-4; must match the file compared with)")
    p.add_argument("--n-jobs", "--jobs", type=int, default=2, help="worker processes (results do not depend on it)")
    args = p.parse_args(argv)
    chapters = tuple(c for c in CHAPTERS if c in args.chapters)  # the file's order, whatever the command line's
    old = pd.read_pickle(args.compare) if args.compare else None  # checked before hours of training
    if old is not None and old.attrs.get("seeds", list(SEEDS)) != list(args.seeds):
        print(f"{args.compare} holds seeds {old.attrs.get('seeds', list(SEEDS))}: pass them with --seeds")
        return 2
    t0 = time.perf_counter()
    hist = run_all(args.n_jobs, chapters, tuple(args.seeds), write=args.write)
    print(f"all {len(chapters)} chapters: {time.perf_counter() - t0:.0f} s", flush=True)
    if args.write:
        print(f"wrote {len(hist)} rows x {hist.shape[1]} columns to {args.write}")
        return 0
    problems = compare_files(hist, old, chapters)
    for line in problems:
        print("DIFF", line)
    print(f"{len(hist)} rows x {hist.shape[1]} columns: " + ("bit-identical" if not problems else "DIFFERENT"))
    return 1 if problems else 0

if __name__ == "__main__":
    sys.exit(main())
