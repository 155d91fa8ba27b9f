"""The first RL steps of the ``"colab"`` (T4) and ``"gpu"`` profiles, measured, beside the memory model.

For each profile and each autocast precision (``float16``, the T4's, through ``torch.amp.GradScaler``; and
``bfloat16``, skipped where the device lacks it) this trains GRPO for ``--steps`` steps with
:func:`grpo_lab.experiments.run` (no evaluation) and records per step: the step's wall time
(``step_seconds``), generation tokens per second (generated tokens / ``gen_seconds``), the step's peak memory
(``peak_mem_mb``: ``torch.cuda.max_memory_allocated`` on CUDA) beside the memory model's predicted phases and
peak (:func:`grpo_lab.experiments.memory_model.predict_memory` at the profile's shapes, Qwen2.5-0.5B's config
when the model's config cannot be read), and the scaler's skipped steps and scale. The results file
(``benchmarks/results/gpu_first_steps.json`` by default) carries provenance: git commit, device, torch and
transformers versions, date.

``--write-table`` rewrites the ``gpu-first-steps`` table of ``benchmarks/README.md`` from that file; without
the file the table says the numbers are predicted, not measured.

Usage::

    python benchmarks/gpu_first_steps.py --device cuda --out benchmarks/results/gpu_first_steps.json
    python benchmarks/gpu_first_steps.py --write-table
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import re
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "gpu_first_steps.json"
README = ROOT / "benchmarks" / "README.md"
PROFILES = ("colab", "gpu")
PRECISIONS = ("float16", "bfloat16")


def _profile(name: str, device: str, precision: str, model: str | None, source: str | None):
    """The profile ``name`` on ``device`` in ``precision``, no evaluation (a fit to the device on CUDA)."""
    from grpo_lab import experiments

    build = experiments.colab_profile if name == "colab" else experiments.gpu_profile
    extra = {k: v for k, v in (("model", model), ("source", source)) if v}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an unreadable config.json: no fit, said in the file
        return build(device=device, precision=precision, eval_every=0, **extra)


def predicted(prof) -> dict:
    """The memory model's phases and peak (MiB) at ``prof``'s shapes (GRPO's KL reference unless LoRA)."""
    from grpo_lab.experiments.memory_fit import _model_config, _shape
    from grpo_lab.experiments.memory_model import QWEN25_05B_CONFIG, predict_memory

    hf = _model_config(prof.base)
    config = hf if hf is not None else QWEN25_05B_CONFIG
    budget = int(dict(prof.task_kwargs).get("max_new_tokens") or 512)
    shape = _shape(prof.config, budget, kl_reference=prof.lora is None, critic=False, lora=prof.lora)
    est = predict_memory(config, shape)
    mib = {k: round(v / 2**20, 1) for k, v in est.phases.items()}
    return {"phases_mib": mib, "peak_mib": round(est.peak / 2**20, 1), "config": "model" if hf else "Qwen2.5-0.5B"}


def measure(name: str, precision: str, *, device: str, steps: int, model: str | None = None,
            source: str | None = None) -> dict:
    """One profile in one precision: ``steps`` GRPO steps, the measured columns of each, the prediction."""
    from grpo_lab import experiments

    prof = _profile(name, device, precision, model, source)
    t0 = time.perf_counter()
    hist = experiments.run("GRPO", profile=prof, seeds=[0], steps=steps, cache=False, progress=False).history
    rows = hist[hist["step"] > 0]
    per_step = []
    for _, r in rows.iterrows():
        gen_tok_s = r["tokens_per_s"] * r["step_seconds"] / r["gen_seconds"] if r["gen_seconds"] > 0 else math.nan
        per_step.append({"step": int(r["step"]), "step_seconds": round(float(r["step_seconds"]), 3),
                         "gen_seconds": round(float(r["gen_seconds"]), 3),
                         "generation_tokens_per_s": round(float(gen_tok_s), 1),
                         "peak_mem_mib": round(float(r["peak_mem_mb"]), 1),
                         "amp_skipped_steps": int(r.get("amp_skipped_steps", 0) or 0),
                         "amp_scale": float(r["amp_scale"]) if "amp_scale" in r and r["amp_scale"] == r["amp_scale"]
                         else None})
    return {"profile": name, "precision": precision, "base": prof.base, "lora": prof.lora is not None,
            "micro_batch_size": prof.config.micro_batch_size, "rows": prof.config.prompts_per_step * prof.config.group_size,
            "max_new_tokens": dict(prof.task_kwargs).get("max_new_tokens"), "wall_seconds": round(time.perf_counter() - t0, 1),
            "steps": per_step, "predicted": predicted(prof)}


def _provenance(device: str) -> dict:
    import subprocess

    import torch
    import transformers

    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    return {"git_sha": sha or None, "device": device, "device_name": name, "torch": torch.__version__,
            "transformers": transformers.__version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "dry_run": name == "cpu"}


def _supports(precision: str, device: str) -> bool:
    import torch

    if precision == "bfloat16" and device.startswith("cuda"):
        return torch.cuda.is_bf16_supported()
    return True


def table(results: dict | None) -> str:
    """The README's ``gpu-first-steps`` table: measured rows from ``results``, or one line saying there are none."""
    if not results:
        return ("No GPU has run `scripts/gpu_check.sh` yet: every GPU time and memory figure on this page is predicted, "
                "not measured.")
    p = results["provenance"]
    head = (f"Measured on {p['device_name']} ({p['date'][:10]}, commit {str(p['git_sha'])[:10]}, torch {p['torch']}, "
            f"transformers {p['transformers']}){' — a CPU dry run, not a GPU measurement' if p.get('dry_run') else ''}:\n\n"
            "| profile | precision | s / step | generation tok/s | peak MiB (measured) | peak MiB (predicted) | skipped steps |\n"
            "|---|---|---|---|---|---|---|\n")
    lines = []
    for r in results["runs"]:
        s = r["steps"]
        mean = lambda k: sum(x[k] for x in s) / len(s)  # noqa: E731
        lines.append(f"| `{r['profile']}` | {r['precision']} | {mean('step_seconds'):.1f} | "
                     f"{mean('generation_tokens_per_s'):.0f} | {max(x['peak_mem_mib'] for x in s):.0f} | "
                     f"{r['predicted']['peak_mib']:.0f} | {s[-1]['amp_skipped_steps']} |")
    return head + "\n".join(lines)


def write_table(results_path: Path = RESULTS, readme: Path = README) -> None:
    """Rewrite the ``gpu-first-steps`` block of ``readme`` from ``results_path`` (absent: "predicted, not measured")."""
    results = json.loads(results_path.read_text()) if results_path.is_file() else None
    text = readme.read_text(encoding="utf-8")
    block = f"<!-- gpu-first-steps:start -->\n{table(results)}\n<!-- gpu-first-steps:end -->"
    new, n = re.subn(r"<!-- gpu-first-steps:start -->.*?<!-- gpu-first-steps:end -->", lambda m: block, text, flags=re.S)
    if n != 1:
        raise ValueError(f"{readme}: no gpu-first-steps block")
    readme.write_text(new, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--model", default=None, help="a hub id or directory instead of the profiles' model")
    ap.add_argument("--source", default=None, help="GSM8K's source instead of the hub ('fixture': the shipped one)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--write-table", action="store_true", help="only rewrite benchmarks/README.md's table")
    a = ap.parse_args(argv)
    if a.write_table:
        write_table(a.out)
        return 0
    runs = []
    for name in a.profiles.split(","):
        for precision in a.precisions.split(","):
            if not _supports(precision, a.device):
                print(f"{name} {precision}: not supported on this device, skipped", flush=True)
                continue
            r = measure(name, precision, device=a.device, steps=a.steps, model=a.model, source=a.source)
            runs.append(r)
            a.out.parent.mkdir(parents=True, exist_ok=True)  # written after each: a timeout keeps what finished
            a.out.write_text(json.dumps({"provenance": _provenance(a.device), "runs": runs}, indent=1) + "\n")
            print(table({"provenance": _provenance(a.device), "runs": [r]}).splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
