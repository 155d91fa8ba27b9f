"""Bit-identity check of the book's experiment histories.

Runs the training experiments of chapters 1-3 exactly as the chapters configure them (CPU profile,
seeds 0-4, without the run cache) and either writes their histories (``--write FILE``) or compares them with a file written
earlier (``--compare FILE``), column by column and bit for bit (NaN equals NaN). Wall-clock columns
(``tokens_per_s``, ``gen_seconds``, ``step_seconds``, ``eval_seconds``) and ``peak_mem_mb`` are dropped first: they are the only ones
allowed to differ. Used to show that a refactor changed no number; see README "Reproducibility".

    python scripts/check_histories.py --write /tmp/before.pkl     # on the old code
    python scripts/check_histories.py --compare /tmp/before.pkl   # on the new code; exit 1 on any difference
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import pandas as pd

from grpo_lab import experiments
from grpo_lab.algorithms import DAPO, DR_GRPO, GRPO

TIMING = ("tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "peak_mem_mb")
SEEDS = (0, 1, 2, 3, 4)


def chapter_settings() -> dict[str, tuple[list, int | None]]:
    """``{chapter: (algorithms, steps)}`` as chapters 1-3 set them (steps None = profile default)."""
    naive = GRPO.replace(name="naive GRPO", kl=None, beta=0.0)
    ch2 = [
        naive,
        naive.replace(name="+ overlong filtering", overlong_filter=True),
        naive.replace(name="+ clip-higher", overlong_filter=True, eps_high=0.28),
        naive.replace(name="+ soft overlong punishment", overlong_filter=True, eps_high=0.28, overlong_cache_len=6),
        naive.replace(name="+ token-level loss", overlong_filter=True, eps_high=0.28, overlong_cache_len=6,
                      aggregation="token_mean"),
        DAPO.replace(name="+ dynamic sampling (DAPO)"),
    ]
    ch3 = [GRPO.replace(name="GRPO (beta=0)", kl=None, beta=0.0), DR_GRPO.replace(name="Dr.GRPO"),
           GRPO.replace(name="GRPO (beta=0.04)")]
    return {"01_grpo": ([GRPO], None), "02_dapo": (ch2, 25), "03_dr_grpo": (ch3, None)}


def run_all(n_jobs: int) -> pd.DataFrame:
    frames = []
    for chapter, (algos, steps) in chapter_settings().items():
        t0 = time.perf_counter()
        grid = experiments.run_grid(algos, profile="cpu", seeds=SEEDS, steps=steps, n_jobs=n_jobs, cache=False)
        for r in grid.values():
            h = r.history.drop(columns=[c for c in TIMING if c in r.history.columns])
            h.insert(0, "chapter", chapter)
            frames.append(h)
        print(f"{chapter}: {len(algos)} settings x {len(SEEDS)} seeds in {time.perf_counter() - t0:.0f} s",
              flush=True)
    return pd.concat(frames, ignore_index=True)


def compare(new: pd.DataFrame, old: pd.DataFrame) -> list[str]:
    """Every difference between two history tables, as readable lines (empty: bit-identical)."""
    problems = []
    if sorted(new.columns) != sorted(old.columns):
        problems.append(f"columns differ: only new {sorted(set(new.columns) - set(old.columns))}, "
                        f"only old {sorted(set(old.columns) - set(new.columns))}")
    if len(new) != len(old):
        return problems + [f"row count {len(new)} != {len(old)}"]
    for col in sorted(set(new.columns) & set(old.columns)):
        a, b = new[col].to_numpy(), old[col].to_numpy()
        if a.dtype.kind == "f" or b.dtype.kind == "f":
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
        else:
            same = a == b
        if not same.all():
            i = int(np.flatnonzero(~same)[0])
            problems.append(f"{col}: {int((~same).sum())} rows differ, first at row {i} "
                            f"({new.iloc[i]['chapter']}, {new.iloc[i]['algo']}, seed {new.iloc[i]['seed']}, "
                            f"step {new.iloc[i]['step']}): {a[i]!r} vs {b[i]!r}")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", metavar="FILE", help="run the experiments and store the histories (pickle)")
    g.add_argument("--compare", metavar="FILE", help="run the experiments and compare with FILE")
    p.add_argument("--n-jobs", type=int, default=2, help="worker processes (results do not depend on it)")
    args = p.parse_args(argv)
    hist = run_all(args.n_jobs)
    if args.write:
        hist.to_pickle(args.write)
        print(f"wrote {len(hist)} rows x {hist.shape[1]} columns to {args.write}")
        return 0
    problems = compare(hist, pd.read_pickle(args.compare))
    for line in problems:
        print("DIFF", line)
    print(f"{len(hist)} rows x {hist.shape[1]} columns: " + ("bit-identical" if not problems else "DIFFERENT"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
