"""Routing drift of finer-grained MoEs: can the toy reach GSPO's regime for Routing Replay?

    python benchmarks/moe_granularity.py                       # pretrain the variants, probe, write JSON
    python benchmarks/moe_granularity.py --checkpoints DIR     # reuse variants pretrained earlier in DIR

GSPO (arXiv 2507.18071, §5.3) reports that after each gradient update about 10% of the experts a
48-layer Qwen3-30B-A3B (128 experts, 8 active) activates for the same rollout change. Chapter 4's
MoE (``arithmetic-moe-base``: 8 experts, 2 active) changes about 1% over a whole rollout's updates.
This script asks whether more, narrower experts with more of them active (the same expert
parameters, transformers' grouped_mm needs widths that are a multiple of 4) raise that share. Each
variant is pretrained with ``arithmetic-moe``'s recipe, changing only the experts (one thread), and
probed as chapter 4 probes its MoE (§4.6): per seed, RL steps (GRPO without KL) past the
learning-rate warm-up, then one more rollout and the trainer's update of it, recording every
completion token's experts in every layer under π_old and after the update. Two measures:

* ``sets_changed``: the share of (layer, token) top-k sets with any member changed (chapter 4's);
* ``experts_changed``: the share of activated experts no longer chosen, the paper's measure. A set
  of k experts with one member swapped counts 1 in the first and 1/k in the second, so the first
  grows with k by construction.

Both designs of chapter 4: 4 minibatches at the profile's learning rate, and 16 at 1e-4. Five seeds,
mean and 95% t interval over seeds. Writes ``benchmarks/results/moe_granularity.json``.

What it found (2026-12-07, minibatches of whole prompt groups; see the results file): with 16 or 32
experts the set-level share rises 3.1-4.1x, the expert-level share at most 1.9x, and stays 3.7-7x
below the paper's 10% per update even over a whole rollout; the 16-expert variant is a better base
policy (0.495 greedy against 0.242). Pretrained again from the recipe, the two variants have the
same weights (SHA-256) as in the earlier run. A checkpoint already in ``--checkpoints`` is reused
after its expert settings are checked; pretraining both and probing took 18 minutes of CPU time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from grpo_lab import experiments, lab
from grpo_lab.experiments import stats
from grpo_lab.algo.algorithms import GRPO
from grpo_lab.policy.models import load_policy
from grpo_lab.paths import checkpoint_dir
from grpo_lab.lab.pretrain import RECIPES, pretrain, sha256_file
from grpo_lab.tasks import get_task
from grpo_lab.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "moe_granularity.json"
#: name -> the expert settings that differ from ``arithmetic-moe`` (8 experts of width 36, top 2)
VARIANTS = {"moe16x4": {"num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 20},
            "moe32x8": {"num_experts": 32, "num_experts_per_tok": 8, "moe_intermediate_size": 12}}
DESIGNS = ((4, 3e-4), (16, 1e-4))  # chapter 4's two designs: (minibatches per rollout, learning rate)
GRPO_NOKL = GRPO.replace(name="GRPO", kl=None, beta=0.0, eps_high=0.27)  # chapter 4's baseline


def _checkpoint(name: str, directory: Path) -> tuple[str, dict | None]:
    """The variant's checkpoint directory, pretrained there unless it exists; its pretraining record."""
    out = directory / name
    if (out / "config.json").exists():
        config = json.loads((out / "config.json").read_text())
        saved = {**config, "num_experts": config.get("num_experts", config.get("num_local_experts"))}
        if any(saved.get(k) != v for k, v in VARIANTS[name].items()):
            raise ValueError(f"{out} is not {name}: its config has other expert settings than {VARIANTS[name]}")
    else:
        base = RECIPES["arithmetic-moe"]
        recipe = dataclasses.replace(base, model=dataclasses.replace(base.model, **VARIANTS[name]), threads=1)
        pretrain(recipe, out, progress=False, name=name)
    record = json.loads((out / "recipe.json").read_text()) if (out / "recipe.json").exists() else None
    return str(out), record


def _probe(base: str, seed: int, minibatches: int, lr: float) -> tuple[float, float]:
    """(sets_changed, experts_changed) over one rollout's updates of ``base``, as chapter 4's probe."""
    prof = experiments.get_profile("cpu")
    task = get_task(prof.task, **dict(prof.task_kwargs))
    pol, tok = load_policy(base)
    cfg = dataclasses.replace(prof.config, seed=seed, minibatches=minibatches, lr=lr, eval_every=0,
                              progress=False, threads=1)
    tr = Trainer(pol, tok, task, GRPO_NOKL, cfg)
    tr.train(-(-cfg.warmup // minibatches))  # past the warm-up: the probed updates run at the full rate
    b, _, (rec_old, _), (rec_new, _) = lab.routing_update(tr)
    ro = b.rollout
    P, T = ro.prompt_ids.shape[1], ro.completion_ids.shape[1]
    mask = b.loss_mask[:, :T].bool()
    old = rec_old.indices[:, :, P - 1:P - 1 + T]  # [layers, B, T, k]: position P - 1 + t predicts token t
    new = rec_new.indices[:, :, P - 1:P - 1 + T]
    sets = (old.sort(-1).values != new.sort(-1).values).any(-1)
    gone = ~(old.unsqueeze(-1) == new.unsqueeze(-2)).any(-1)  # [layers, B, T, k]: an old expert not chosen now
    return float(sets[:, mask].double().mean()), float(gone.double().mean(-1)[:, mask].mean())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoints", type=Path, default=ROOT / "_build" / "moe_granularity",
                    help="where the variants are pretrained (or found, when already there)")
    ap.add_argument("--seeds", type=int, default=5)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    pretrained_now = [n for n in VARIANTS if not (a.checkpoints / n / "config.json").exists()]
    shipped = checkpoint_dir("arithmetic-moe-base")
    models = {"arithmetic-moe-base": (str(shipped), json.loads((shipped / "recipe.json").read_text())),
              **{n: _checkpoint(n, a.checkpoints) for n in VARIANTS}}
    rows = []
    for name, (base, record) in models.items():
        for minibatches, lr in DESIGNS:
            per_seed = np.array([_probe(base, s, minibatches, lr) for s in range(a.seeds)])
            rows.append({"model": name, "experts": VARIANTS.get(name, {"num_experts": 8, "num_experts_per_tok": 2,
                                                                        "moe_intermediate_size": 36}),
                         "base_greedy_accuracy": (record or {}).get("metrics", {}).get("greedy_accuracy"),
                         "weights_sha256": sha256_file(Path(base) / "model.safetensors") if record else None,
                         "minibatches": minibatches, "lr": lr, "seeds": list(range(a.seeds)),
                         **{k: {"per_seed": per_seed[:, i].round(4).tolist(),
                                "mean_ci95": stats.format_interval(stats.t_interval(per_seed[:, i], bounds=(0, 1)), 4)}
                            for i, k in enumerate(("sets_changed", "experts_changed"))}})
            print(rows[-1]["model"], minibatches, lr, rows[-1]["sets_changed"]["mean_ci95"],
                  rows[-1]["experts_changed"]["mean_ci95"], flush=True)
    whole = experiments.provenance(GRPO_NOKL, experiments.get_profile("cpu"), 0, list(range(a.seeds)),
                                   time.perf_counter() - t0)
    # the code and machine only: the models, designs and seeds probed are in the rows
    prov = {k: whole[k] for k in ("git_sha", "grpo_lab", "torch", "transformers", "python", "device_name", "date",
                                  "wall_seconds")}
    OUT.write_text(json.dumps({"paper": "GSPO §5.3: about 10% of activated experts change per update",
                               "checkpoints": str(a.checkpoints), "pretrained_now": pretrained_now,
                               "rows": rows, "provenance": prov}, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
