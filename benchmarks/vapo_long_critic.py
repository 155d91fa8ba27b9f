"""Can VAPO's critic keep pace on the long task? Two levers, measured against the main run.

    python benchmarks/vapo_long_critic.py        # 5 seeds, writes benchmarks/results/vapo_long_critic.json
    python benchmarks/vapo_long_critic.py --seeds 1 --steps 2 --pretrain-steps 2 --out /tmp/x.json  # a quick look

The first version of ``benchmarks/vapo_long.py`` (policy lr 3e-4, critic 6e-4, 16 pretraining steps)
found that VAPO's critic explains 0.30 of the return variance at the first RL step and 0.03 at the
sixteenth: it does not keep pace with the policy, so the comparisons that need a critic (decoupled
GAE, VAPO against group advantages) were not in the paper's regime. The first row below repeats that
run's settings (bit for bit until minibatches began to hold whole prompt groups, which changed every
split: now 0.30 -> 0.07); ``vapo_long.py`` now trains at the third row's rates.
This script tries two levers, on the same task, base policy, seeds and 16 steps, with the critic
learning rate VAPO §5.1 prescribes relative to the policy's where the lever keeps it:

* **the paper's 50 steps of value pretraining** (VAPO §4.1, "until the value loss and explained
  variance are good"), at the first run's rates (policy 3e-4, critic 6e-4: twice);
* the same critic with **a policy that moves more slowly**: policy learning rate 1e-4, the critic's
  kept at 6e-4 (six times). In VAPO §5.1 the policy's rate is 1e-6 for thousands of steps; ours
  must move a tiny model in 16, and the main run's 3e-4 may simply outrun any critic.

The first row repeats the main run's VAPO (16 pretraining steps), so that every setting shares its
seeds and the differences are paired. The rule for "keeps pace" is chapter 6's: the explained
variance (against Monte-Carlo returns, on each step's fresh batch before the critic is fitted to it)
at the last step is at least half of that at the first. The file also keeps the explained variance
and the mean response length at every step, per seed, because the critic can lose pace when the
responses' length drifts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vapo_long import BASE, EVAL_EVERY, ROOT, STEPS, long_profile  # noqa: E402

from grpo_lab import experiments, lab
from grpo_lab.experiments import stats  # noqa: E402
from grpo_lab.algo.algorithms import VAPO  # noqa: E402
from grpo_lab.paths import checkpoint_dir  # noqa: E402
from grpo_lab.lab.pretrain import sha256_file  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "vapo_long_critic.json"
PAPER_PRETRAIN_STEPS = 50  # VAPO §4.1
SLOW_POLICY_LR = 1e-4
#: setting -> (value-pretraining steps, policy lr or None for the profile's); the critic's lr is always 2 x 3e-4
SETTINGS = {
    "VAPO (critic pretrained 16 steps)": (16, None),  # the first long run's pretraining (vapo_long.py then)
    "VAPO, critic pretrained 50 steps": (PAPER_PRETRAIN_STEPS, None),
    "VAPO, critic pretrained 50 steps, policy lr 1e-4": (PAPER_PRETRAIN_STEPS, SLOW_POLICY_LR),
}


def _per_step(hist, column: str) -> dict:
    """``{seed: [value at step 1, 2, ...]}`` of ``column`` (the mean over a step's rows), 4 decimals."""
    h = hist.dropna(subset=[column]).groupby(["seed", "step"])[column].mean().unstack()
    return {int(s): h.loc[s].round(4).tolist() for s in h.index}


def _row(name: str, res, ref) -> dict:
    """One setting: final accuracy, its paired difference from the first row, and the critic's pace."""
    final = res.final()
    ev = _per_step(res.history, "explained_variance_mc")
    first, last = [v[0] for v in ev.values()], [v[-1] for v in ev.values()]
    row = {"setting": name, "final_accuracy_per_seed": final.round(4).tolist(),
           "final_accuracy": stats.format_interval(stats.t_interval(final, bounds=(0, 1))),
           "explained_variance_per_step": ev, "length_per_step": _per_step(res.history, "length"),
           "explained_variance_first_last": [stats.format_interval(stats.t_interval(first), 2),
                                             stats.format_interval(stats.t_interval(last), 2)],
           "keeps_pace": bool(np.mean(last) >= 0.5 * np.mean(first))}
    if res is not ref and len(final) >= 2:
        d = stats.paired_difference(final, ref.final())
        row.update(minus_first=stats.format_interval(d), minus_first_excludes_0=bool(d.excludes(0.0)))
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--pretrain-steps", type=int, default=None, help="override both pretraining lengths (a quick look)")
    ap.add_argument("--n-jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    prof = long_profile(a.steps, lr=experiments.get_profile("cpu").config.lr)  # the CPU profile's 3e-4
    value_lr = 2 * prof.config.lr  # VAPO §5.1: twice the actor's (the first run's critic rate, kept in every row)
    critics, warm = {}, {}
    for n in sorted({a.pretrain_steps or n for n, _ in SETTINGS.values()}):
        critics[n] = str(ROOT / "_build" / f"vapo_long_critic_{n}")  # the run cache hashes its weights
        h = lab.pretrain_critic((0, "policy", critics[n]), algo=VAPO, profile=prof, steps=n, value_lr=value_lr)
        warm[n] = {"explained_variance_per_step": h["explained_variance"].round(4).tolist(),
                   "explained_variance_last4": float(h["explained_variance"].tail(4).mean())}
    algos, overrides = [], {}
    for name, (n, lr) in SETTINGS.items():
        algos.append(VAPO.replace(name=name))
        overrides[name] = {"value_init": critics[a.pretrain_steps or n], **({"lr": lr} if lr else {})}
    seeds = list(range(a.seeds))
    grid = experiments.run_grid(algos, profile=prof, seeds=seeds, steps=a.steps, n_jobs=a.n_jobs,
                                eval_every=min(EVAL_EVERY, a.steps), value_lr=value_lr, overrides=overrides)
    ref = grid[algos[0].name]
    rows = [_row(n, grid[n], ref) for n in SETTINGS]
    for r in rows:
        print(r["setting"], r["final_accuracy"], r["explained_variance_first_last"], r.get("minus_first", ""), flush=True)
    run_seconds = sum(float(g.history[c].sum()) for g in grid.values() for c in ("step_seconds", "eval_seconds")
                      if c in g.history)
    whole = experiments.provenance(VAPO, prof, a.steps, seeds, time.perf_counter() - t0)
    a.out.write_text(json.dumps({
        "question": "does VAPO's critic keep pace on the long task with 50 pretraining steps, or a slower policy?",
        "rule": "keeps pace: mean explained variance at the last step >= half that at the first (chapter 6)",
        "base": BASE, "base_weights_sha256": sha256_file(checkpoint_dir(BASE) / "model.safetensors"),
        "seeds": seeds, "steps": a.steps, "value_lr": value_lr, "policy_lr": prof.config.lr,
        "pretraining": {str(k): v for k, v in warm.items()}, "rows": rows, "run_seconds_sum": round(run_seconds, 1),
        "runs_from_cache": sum(len(g.provenance.get("cached_seeds", [])) for g in grid.values()),
        "provenance": {k: whole[k] for k in ("git_sha", "grpo_lab", "torch", "transformers", "python", "device_name",
                                             "date", "wall_seconds")}}, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
