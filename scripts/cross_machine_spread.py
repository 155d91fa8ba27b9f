"""How much do the book's CPU experiments change from one processor to another?

The CPU profile is seeded and single-threaded, so re-executing a chapter on the *same* machine
(same processor model / instruction set, same library versions) reproduces every number bit for
bit. Another processor may make the math libraries pick other kernels (MKL's sgemm, oneDNN, ATen's
vectorised loops), which sum in another order; the float32 rounding then differs in the last bit,
and over a few RL steps (sampling is discrete) the trajectory drifts apart. This script emulates
"another processor" on one machine with the libraries' dispatch switches and measures both parts:

``probe``
    A short GRPO run (seed 0, ``--steps`` steps, default 10) in a fresh process under each setting
    of :data:`SETTINGS`; each history is compared bit for bit (timing columns dropped) with the
    run under the machine's default kernels. Tells which switch changes the trajectory.

``spread``
    The chapter-1 experiment (GRPO, CPU profile, seeds 0 1 2, 40 steps) under the default kernels
    and under ``--setting`` (default ``AVX2 processor``: MKL, oneDNN and ATen limited to AVX2, the
    kernels of a processor without AVX-512); prints the final greedy test accuracy per seed, the per-seed
    differences and the seed-to-seed standard deviation.

    python scripts/cross_machine_spread.py probe            # ~10 short runs, a few minutes
    python scripts/cross_machine_spread.py spread           # 2 x 3 seeds x 40 steps, ~3-6 minutes

Each run happens in its own process (``_worker``), because the switches are read when the
libraries load. Results are bit-identical run to run on one machine, so one run per setting is
enough.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

TIMING = ("tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "peak_mem_mb")

#: name -> (environment variables, TrainerConfig overrides). "default" is the reference.
SETTINGS: dict[str, tuple[dict[str, str], dict]] = {
    "default": ({}, {}),
    "ATEN_CPU_CAPABILITY=default": ({"ATEN_CPU_CAPABILITY": "default"}, {}),
    "ATEN_CPU_CAPABILITY=avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, {}),
    "MKL_ENABLE_INSTRUCTIONS=AVX2": ({"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, {}),
    "MKL_ENABLE_INSTRUCTIONS=AVX512": ({"MKL_ENABLE_INSTRUCTIONS": "AVX512"}, {}),
    "MKL_CBWR=COMPATIBLE": ({"MKL_CBWR": "COMPATIBLE"}, {}),
    "MKL_CBWR=AVX2": ({"MKL_CBWR": "AVX2"}, {}),
    "DNNL_MAX_CPU_ISA=AVX2": ({"DNNL_MAX_CPU_ISA": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, {}),
    "threads=2": ({}, {"threads": 2}),
    # all three libraries limited to AVX2: what a processor without AVX-512 (e.g. an AMD EPYC) gets
    "AVX2 processor": ({"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                        "DNNL_MAX_CPU_ISA": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, {}),
}

#: Columns fixed by the sampled (or greedy) tokens alone: equal as long as the trajectory is.
#: The others (entropy, kl, loss, grad_norm, clip fractions) are float reductions whose last bits
#: follow the kernels even while every sampled token is the same.
SAMPLED = ("reward", "accuracy", "length", "length_correct", "length_incorrect", "zero_adv_group_frac",
           "truncation_rate", "reasoning_frac", "samples_per_trained", "test_accuracy", "test_length",
           "test_reasoning_frac", "test_accuracy_sampled")


def _worker(out: str, steps: int, seeds: list[int], overrides: dict) -> None:
    """Train GRPO (CPU profile) and pickle the history without its wall-clock columns."""
    import torch

    from grpo_lab import experiments

    r = experiments.run("GRPO", profile="cpu", seeds=tuple(seeds), steps=steps, progress=False, cache=False,
                        **overrides)
    h = r.history.drop(columns=[c for c in TIMING if c in r.history.columns])
    h.attrs["info"] = {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
                       "threads": r.provenance["threads"]}
    h.to_pickle(out)


def run_setting(name: str, steps: int, seeds: list[int]) -> pd.DataFrame:
    """Run :func:`_worker` in a fresh process under setting ``name``; return its history."""
    env_vars, overrides = SETTINGS[name]
    env = {**os.environ, **env_vars}
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "h.pkl")
        cmd = [sys.executable, __file__, "_worker", "--out", out, "--steps", str(steps),
               "--seeds", *map(str, seeds), "--overrides", json.dumps(overrides)]
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True)
        h = pd.read_pickle(out)
    print(f"  [{name}] {len(seeds)} seed(s) x {steps} steps in {time.perf_counter() - t0:.0f} s "
          f"(ATen capability {h.attrs['info']['cpu_capability']})", flush=True)
    return h


def first_difference(a: pd.DataFrame, b: pd.DataFrame, columns=None) -> tuple[int, str] | None:
    """None if ``columns`` (default all) are bit-identical (NaN == NaN), else (first step, description)."""
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return (-1, "different shape")
    first = None
    for col in (a.columns if columns is None else [c for c in columns if c in a.columns]):
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if x.dtype.kind == "f":
            same = (x == y) | (np.isnan(x) & np.isnan(y))
        else:
            same = x == y
        if not same.all():
            i = int(np.flatnonzero(~same)[0])
            step = int(a["step"].iloc[i])
            if first is None or step < first[0]:
                first = (step, col, x[i], y[i])
    if first is None:
        return None
    step, col, x, y = first
    return step, f"{col}: {float(x)!r} vs {float(y)!r}"


def verdict(h: pd.DataFrame, ref: pd.DataFrame) -> str:
    """How history ``h`` differs from ``ref``: not at all, in float metrics only, or in the tokens."""
    any_diff = first_difference(h, ref)
    if any_diff is None:
        return "bit-identical to default"
    text = f"float metrics differ from step {any_diff[0]} ({any_diff[1]})"
    tok_diff = first_difference(h, ref, SAMPLED)
    if tok_diff is None:
        return text + f"; sampled tokens identical through step {int(h['step'].max())}"
    fa, fr = final_accuracy(h).iloc[0], final_accuracy(ref).iloc[0]
    return text + f"; TRAJECTORY differs from step {tok_diff[0]} ({tok_diff[1]}); final test acc {fa:.3f} vs {fr:.3f}"


def probe(steps: int, names: list[str], save_dir: str | None) -> None:
    print(f"probe: GRPO, seed 0, {steps} steps; each setting in a fresh process", flush=True)
    runs = {"default": run_setting("default", steps, [0])}
    for name in names:
        if name != "default":
            runs[name] = run_setting(name, steps, [0])
    if save_dir:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        pd.to_pickle(runs, Path(save_dir) / f"probe_{steps}steps.pkl")
    print("\nsetting vs default kernels:")
    for name, h in runs.items():
        if name != "default":
            print(f"  {name:32s} {verdict(h, runs['default'])}")


def final_accuracy(h: pd.DataFrame) -> pd.Series:
    h = h.dropna(subset=["test_accuracy"])
    return h.sort_values("step").groupby("seed")["test_accuracy"].last()


def spread(setting: str, steps: int, seeds: list[int], save_dir: str | None) -> None:
    print(f"spread: GRPO, CPU profile, seeds {seeds}, {steps} steps: default vs {setting}", flush=True)
    ha, hb = run_setting("default", steps, seeds), run_setting(setting, steps, seeds)
    if save_dir:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        pd.to_pickle({"default": ha, setting: hb}, Path(save_dir) / f"spread_{steps}steps.pkl")
    for seed in seeds:
        d = first_difference(hb[hb.seed == seed].reset_index(drop=True), ha[ha.seed == seed].reset_index(drop=True),
                             SAMPLED)
        print(f"  seed {seed}: sampled tokens " + ("identical" if d is None else f"differ from step {d[0]}"))
    a, b = final_accuracy(ha), final_accuracy(hb)
    d = b - a
    table = pd.DataFrame({"default": a, setting: b, "difference": d})
    print("\nfinal greedy test accuracy per seed")
    print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    print(f"\nmean ± sd over seeds: default {a.mean():.3f} ± {a.std():.3f}, {setting} {b.mean():.3f} ± {b.std():.3f}")
    print(f"per-seed |difference|: mean {d.abs().mean():.3f}, max {d.abs().max():.3f}; "
          f"difference of the means {d.mean():+.3f}")
    print(f"seed-to-seed sd (mean of the two settings): {(a.std() + b.std()) / 2:.3f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("probe", help="which switch changes a short GRPO trajectory")
    pp.add_argument("--steps", type=int, default=10)
    pp.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    pp.add_argument("--save-dir", help="also pickle the histories here")
    ps = sub.add_parser("spread", help="chapter-1 experiment under default vs another setting")
    ps.add_argument("--setting", default="AVX2 processor", choices=list(SETTINGS))
    ps.add_argument("--save-dir", help="also pickle the histories here")
    ps.add_argument("--steps", type=int, default=40)
    ps.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    pw = sub.add_parser("_worker")
    pw.add_argument("--out", required=True)
    pw.add_argument("--steps", type=int, required=True)
    pw.add_argument("--seeds", type=int, nargs="+", required=True)
    pw.add_argument("--overrides", default="{}")
    args = p.parse_args(argv)
    if args.cmd == "_worker":
        _worker(args.out, args.steps, args.seeds, json.loads(args.overrides))
    elif args.cmd == "probe":
        probe(args.steps, args.settings, args.save_dir)
    else:
        spread(args.setting, args.steps, args.seeds, args.save_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
