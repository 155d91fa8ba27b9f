"""The dialogue toy's card (issue 55): does its learned proxy track the gold reward, and can RL hack it?

    python benchmarks/dialogue_probe.py                                 # writes benchmarks/results/dialogue_probe.json
    python benchmarks/dialogue_probe.py --steps 2 --out /tmp/x.json     # a quick look

It reads the proxy's fit on held-out base samples from ``data/checkpoints/dialogue-rm/recipe.json`` (Spearman and
Pearson correlation with gold), then trains GRPO on :class:`grpo_lab.tasks.DialogueTask` at the dialogue scenario's
profile (16 steps, evaluation every 4) at each of the scenario's learning rates on one sweep seed (100) and records,
per evaluation, the greedy test gold mean, the proxy mean, their gap and rank correlation and the gold reward's parts
(Gao et al. 2022, arXiv 2210.10760: over-optimisation shows as the proxy rising while gold first rises, then falls).
It does not run the scenario (``benchmarks/scenarios.py dialogue`` does). One run at a time, one thread.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from grpo_lab.algo.algorithms import GRPO
from grpo_lab.experiments.runs import run_grid
from grpo_lab.lab import scenarios
from grpo_lab.lab.scenarios import _git
from grpo_lab.paths import REPO_ROOT, checkpoint_dir

COLUMNS = ("test_gold_mean", "test_proxy_mean", "test_proxy_gold_gap", "test_proxy_gold_spearman", "test_gold_target",
           "test_gold_distinct", "test_gold_sentence", "test_gold_length", "test_accuracy", "test_length")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: the scenario's)")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "dialogue_probe.json")
    a = ap.parse_args(argv)
    sc = scenarios.SCENARIOS["dialogue"]
    out = {"proxy": json.loads((checkpoint_dir("dialogue-rm") / "recipe.json").read_text()), "runs": {},
           "profile": {"steps": a.steps or sc.profile.steps, "eval_every": sc.profile.config.eval_every,
                       "prompts_per_step": sc.profile.config.prompts_per_step,
                       "group_size": sc.profile.config.group_size, "seed": 100},
           "provenance": {"git_sha": _git("rev-parse", "HEAD"), "date": time.strftime("%Y-%m-%d")}}
    for lr in sc.lrs:
        t0 = time.perf_counter()
        algo = GRPO.replace(name=f"GRPO @ lr={lr:g}")
        h = run_grid([algo], profile=sc.profile, seeds=[100], steps=a.steps, cache=False,
                     overrides={algo.name: {"lr": lr}})[algo.name].history
        ev = h.dropna(subset=["test_gold_mean"]).groupby("step")[list(COLUMNS)].mean()
        train = h[h["step"] > 0]
        out["runs"][f"{lr:g}"] = {"wall_seconds": round(time.perf_counter() - t0, 1),
                                  "step_seconds": round(float(train["step_seconds"].mean()), 2),
                                  "train_proxy_reward": {int(s): round(float(r), 4) for s, r in
                                                         train.groupby("step")["reward"].mean().items()},
                                  "evaluations": {int(s): {c: round(float(v), 4) for c, v in row.items()}
                                                  for s, row in ev.iterrows()}}
        print(f"lr {lr:g}:", {s: (e["test_gold_mean"], e["test_proxy_mean"])
                              for s, e in out["runs"][f"{lr:g}"]["evaluations"].items()})
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
