"""Peak memory of rollout and evaluation generation at Qwen2.5's vocabulary size (issue 31).

A random one-layer Qwen2 (hidden size 16, V = 151,936 by default) generates ``B`` rows of ``T`` new
tokens each; its EOS logit is set to ``-inf`` in place (a forward hook on the output head) so that no
row stops early and every call runs the full budget. Each measurement runs in a fresh subprocess:

* ``hf_sample``: plain ``transformers`` ``generate``, sampling at temperature 1, returning the ids only
  (the floor any rollout has to pay: KV cache, one step's logits and the sampler's copies of them);
* ``grpo_sample``: :func:`grpo_lab.policy.rollout.generate` (sampling at temperature 1, behaviour log-probs
  recorded step by step);
* ``grpo_eval``: :func:`grpo_lab.policy.rollout.evaluate` (greedy, ``batch_size=B``, no log-probs);
* ``grpo_greedy``: :func:`grpo_lab.policy.rollout.generate` with ``greedy=True`` (log-probs recorded at
  temperature 1; what ``tests/policy/test_rollout_memory.py`` measures, as it runs several times faster than
  sampling over 151,936 tokens on a CPU);
* ``hf_greedy``: plain ``transformers`` greedy ``generate``;
* ``former_sample`` (reference, reimplemented here, not grpo_lab code): what ``grpo_lab.policy.rollout.generate``
  did before issue 31: ``generate(output_logits=True)``, every step's float32 logits stacked into one
  ``[B, T, V]`` tensor, :func:`grpo_lab.policy.logprobs.token_logprobs` of the sampled tokens. It needs about
  ``B·T·V·4`` bytes, so it is run only at the shapes ``--former`` names.

Peak memory is the increase of the peak resident set size over the resident set size after the model is
loaded and one small warm-up call of the same path has run (kernels, thread pools): the high-water mark
is reset to the current RSS by writing ``5`` to ``/proc/self/clear_refs`` and read back from ``VmHWM``
in ``/proc/self/status`` (Linux only). The worker runs with one thread and glibc's
``MALLOC_MMAP_THRESHOLD_`` fixed at 128 KiB, so that freed tensor buffers go back to the OS and RSS
follows live tensor memory (as in ``benchmarks/logprobs_memory.py``).

Usage::

    python benchmarks/rollout_memory.py                       # B×T = 16×64, 32×128; table on stdout
    python benchmarks/rollout_memory.py --shapes 16x64 --former 16x64 --out benchmarks/results/rollout_memory.json
    python benchmarks/rollout_memory.py --worker --case grpo_sample --B 16 --T 64   # one measurement, JSON

Target (issue 31): ``grpo_sample`` ≤ 1.3 × ``hf_sample`` and ``grpo_eval`` (and ``grpo_greedy``) ≤ 1.3 ×
``hf_greedy`` at every shape.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ("hf_sample", "grpo_sample", "grpo_eval", "grpo_greedy", "hf_greedy", "former_sample")
TARGET = 1.3


def _status_mib(field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process from ``/proc/self/status``, in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    raise OSError(f"{field} not in /proc/self/status")


def _build(V: int, H: int):
    """(model, tokenizer): a random one-layer Qwen2 of vocabulary ``V`` whose EOS (id of the character
    tokenizer's EOS) can never be drawn, and the character tokenizer (ids past its 52 decode to nothing)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_lab.policy.models import build_char_tokenizer

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    model = Qwen2ForCausalLM(cfg).eval()
    eos = tok.eos_token_id

    def no_eos(module, inputs, out):  # in place: no copy of the logits
        out[..., eos] = float("-inf")

    model.lm_head.register_forward_hook(no_eos)
    return model, tok


def _run(case: str, model, tok, B: int, T: int):
    """One call of ``case`` on ``B`` prompts with a budget of ``T`` new tokens; returns the new tokens' count."""
    import torch

    from grpo_lab.policy.logprobs import token_logprobs
    from grpo_lab.policy.rollout import evaluate, generate
    from grpo_lab.tasks import ArithmeticTask, Problem

    problems = [Problem(f"{i % 10}+{i % 7}=", str(i % 10 + i % 7)) for i in range(B)]
    if case in ("grpo_sample", "grpo_greedy"):
        ro = generate(model, tok, problems, max_new_tokens=T, temperature=1.0, greedy=case == "grpo_greedy")
        return int(ro.completion_mask.sum())
    if case == "grpo_eval":
        summary, _ = evaluate(model, tok, ArithmeticTask(test_size=1), problems, batch_size=B, max_new_tokens=T)
        return int(round(summary["mean_length"] * B))
    tok.padding_side = "left"
    enc = tok([p.prompt for p in problems], return_tensors="pt", padding=True, add_special_tokens=False)
    kw = dict(max_new_tokens=T, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, disable_compile=True)
    with torch.no_grad():
        if case == "former_sample":
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, output_logits=True,
                                 return_dict_in_generate=True, **kw)
            comp = out.sequences[:, enc["input_ids"].shape[1]:]
            token_logprobs(torch.stack(out.logits, dim=1).float(), comp, temperature=1.0)
            return comp.numel()
        sample = dict(temperature=1.0, top_p=1.0, top_k=0) if case == "hf_sample" else {}
        out = model.generate(**enc, do_sample=case == "hf_sample", **sample, **kw)
        return out[:, enc["input_ids"].shape[1]:].numel()


def _worker(a) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(1)
    model, tok = _build(a.V, a.H)
    _run(a.case, model, tok, 2, 2)  # warm-up: kernels, thread pools, the processors' code paths
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := current RSS
    base = _status_mib("VmRSS")
    tokens = _run(a.case, model, tok, a.B, a.T)
    peak = _status_mib("VmHWM") - base
    return {"case": a.case, "B": a.B, "T": a.T, "V": a.V, "peak_extra_mib": round(peak, 1), "new_tokens": tokens}


def measure(case: str, B: int, T: int, V: int = 151_936, H: int = 16, timeout: float = 600) -> dict:
    """One measurement in a fresh subprocess (``MALLOC_MMAP_THRESHOLD_=131072``, one thread).

    Returns:
        dict with ``case``, ``B``, ``T``, ``V``, ``peak_extra_mib`` (MiB, float) and ``new_tokens`` (tokens
        generated in the measured call: ``B·T`` when no row stopped).

    Raises:
        ValueError: unknown ``case``. RuntimeError: the worker failed (its stderr's tail in the message).
    """
    if case not in CASES:
        raise ValueError(f"rollout_memory: unknown case {case!r}; known: {', '.join(CASES)}")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", f"--case={case}", f"--B={B}", f"--T={T}",
           f"--V={V}", f"--H={H}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=str(ROOT))
    if proc.returncode != 0:
        raise RuntimeError(f"rollout_memory worker {case} B={B} T={T} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _provenance(args) -> dict:
    import torch
    import transformers

    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "grpo_lab", "benchmarks"],
                                    capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = None, None
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "cpu")
    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "git_commit": commit, "git_dirty": dirty, "processor": cpu, "threads": 1,
            "date": datetime.date.today().isoformat(), "V": args.V, "H": args.H, "layers": 1,
            "memory_method": "peak RSS increase: VmHWM after the call minus VmRSS after loading the model and a "
                             "B=2, T=2 warm-up of the same path (high-water mark reset through /proc/self/clear_refs); "
                             "MALLOC_MMAP_THRESHOLD_=131072, one process per measurement"}


def _table(results: list[dict]) -> str:
    """The Markdown table of benchmarks/README.md: one row per shape, MiB, and the two ratios the target is about."""
    by = {}
    for r in results:
        by.setdefault((r["B"], r["T"]), {})[r["case"]] = r["peak_extra_mib"]
    lines = ["| B × T | HF sample MiB | grpo_lab rollout MiB | ratio | HF greedy MiB | grpo_lab evaluate MiB | ratio "
             "| grpo_lab greedy + log-probs MiB | former rollout MiB | B·T·V·4 MiB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (B, T), c in sorted(by.items()):
        V = next(r["V"] for r in results if (r["B"], r["T"]) == (B, T))
        former = f"{c['former_sample']:,.0f}" if "former_sample" in c else "not run"
        lines.append(f"| {B} × {T} | {c['hf_sample']:,.0f} | {c['grpo_sample']:,.0f} | "
                     f"{c['grpo_sample'] / c['hf_sample']:.2f} | {c['hf_greedy']:,.0f} | {c['grpo_eval']:,.0f} | "
                     f"{c['grpo_eval'] / c['hf_greedy']:.2f} | {c['grpo_greedy']:,.0f} | {former} | "
                     f"{B * T * V * 4 / 2**20:,.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="16x64,32x128", help="comma-separated BxT shapes")
    p.add_argument("--former", default="16x64", help="shapes at which to run the former path too ('' for none)")
    p.add_argument("--V", type=int, default=151_936)
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    p.add_argument("--B", type=int, default=16, help=argparse.SUPPRESS)
    p.add_argument("--T", type=int, default=64, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        print(json.dumps(_worker(a)))
        return 0
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",") if s]
    former = {tuple(int(x) for x in s.split("x")) for s in a.former.split(",") if s}
    results = []
    for B, T in shapes:
        for case in CASES:
            if case == "former_sample" and (B, T) not in former:
                continue
            results.append(measure(case, B, T, a.V, a.H))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    table = _table(results)
    print(table)
    met = all(r1["peak_extra_mib"] <= TARGET * r0["peak_extra_mib"] for r1 in results for r0 in results
              if (r1["B"], r1["T"]) == (r0["B"], r0["T"])
              and (r1["case"], r0["case"]) in {("grpo_sample", "hf_sample"), ("grpo_eval", "hf_greedy"),
                                               ("grpo_greedy", "hf_greedy")})
    print(f"target (grpo_lab ≤ {TARGET} × HF generate at every shape): {'met' if met else 'NOT met'}")
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({**_provenance(a), "target_ratio": TARGET, "target_met": met,
                                     "results": results, "table": table}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
