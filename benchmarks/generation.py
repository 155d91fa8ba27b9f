"""Generation on the CPU profile's shapes: transformers' dynamic KV cache (the default), its static
cache, and the static cache with the decode step compiled by ``torch.compile`` (inductor).

    python benchmarks/generation.py                 # table on stdout, JSON to benchmarks/results/
    python benchmarks/generation.py --reps 4 --no-compile

Two shapes, both from the shipped ``arithmetic-base`` checkpoint with one torch thread (the CPU
profile's setting): a training rollout (16 questions × G = 8, sampled, ≤ 32 new tokens) and the
greedy evaluation of the 198-question test set. Every variant calls ``model.generate`` with the
settings :func:`grpo_lab.policy.rollout.generate` uses (``output_logits=True``, the same stop id), and the
variants run interleaved (one call each per repetition, rotating the order), so that a slow
moment of the machine hits all of them. The first ``--warmup`` repetitions are not counted; the
compiled variant's first call (the compilation) is reported separately.

What it decided: ``grpo_lab.policy.rollout.generate`` keeps the dynamic cache (see its docstring).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> None:
    from transformers import CompileConfig, GenerationConfig

    from grpo_lab.experiments import processor_name
    from grpo_lab.policy.models import load_policy
    from grpo_lab.paths import checkpoint_dir
    from grpo_lab.tasks import get_task

    ap = argparse.ArgumentParser(description="Generation time on the CPU profile's shapes: dynamic vs static KV "
                                             "cache vs static cache with a compiled decode step.")
    ap.add_argument("--reps", type=int, default=12, help="timed calls per variant and shape (default 12)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds before them (default 2)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, the CPU profile's)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled variant (about 35 s to compile)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "generation_cpu.json"))
    a = ap.parse_args(argv)
    if a.reps < 1 or a.warmup < 0 or a.threads < 1:
        ap.error("--reps must be >= 1, --warmup >= 0, --threads >= 1")
    torch.set_num_threads(a.threads)
    policy, tok = load_policy(checkpoint_dir("arithmetic-base"))
    policy.eval()
    policy.generation_config = GenerationConfig()
    tok.padding_side = "left"
    task = get_task("arithmetic")
    train = [p for p in task.sample(16, np.random.default_rng(0)) for _ in range(8)]
    shapes = {"rollout 16x8 sampled": ([p.prompt for p in train], False),
              "eval 198 greedy": ([p.prompt for p in task.test_set()], True)}
    compiled = CompileConfig(mode="default")
    compiled._compile_all_devices = True  # transformers compiles only on GPUs unless told
    variants = {"dynamic (default)": dict(cache_implementation=None, disable_compile=True),
                "static": dict(cache_implementation="static", disable_compile=True)}
    if not a.no_compile:
        variants["static + compiled decode"] = dict(cache_implementation="static", compile_config=compiled)

    def call(prompts, greedy, kw):
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        sampling = {} if greedy else dict(temperature=1.0, top_p=1.0, top_k=0)
        cfg = GenerationConfig(do_sample=not greedy, max_new_tokens=32, pad_token_id=tok.pad_token_id,
                               eos_token_id=[tok.eos_token_id], return_dict_in_generate=True, output_logits=True,
                               **kw, **sampling)
        t = time.perf_counter()
        with torch.no_grad():
            policy.generate(**enc, generation_config=cfg)
        return time.perf_counter() - t

    results = {}
    for shape, (prompts, greedy) in shapes.items():
        first = {name: call(prompts, greedy, kw) for name, kw in variants.items()}
        times = {name: [] for name in variants}
        names = list(variants)
        for r in range(a.warmup + a.reps):
            for name in names[r % len(names):] + names[:r % len(names)]:
                t = call(prompts, greedy, variants[name])
                if r >= a.warmup:
                    times[name].append(t)
        results[shape] = {name: {"median_ms": 1000 * statistics.median(ts), "min_ms": 1000 * min(ts),
                                 "max_ms": 1000 * max(ts), "first_call_s": first[name], "times_s": ts}
                          for name, ts in times.items()}
    print(f"| shape | {' | '.join(variants)} |")
    print("|---|" + "---|" * len(variants))
    for shape, res in results.items():
        print(f"| {shape} | " + " | ".join(f"{res[n]['median_ms']:.0f} ms" for n in variants) + " |")
    if not a.no_compile:
        print(f"compilation (first call of the compiled variant): "
              f"{results['rollout 16x8 sampled']['static + compiled decode']['first_call_s']:.1f} s")
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__, "threads": a.threads,
           "processor": processor_name(), "reps": a.reps, "warmup": a.warmup,
           "date": time.strftime("%Y-%m-%d"), "results": results}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
