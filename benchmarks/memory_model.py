"""The memory model (grpo_lab.experiments.memory_model) against measurement, phase by phase.

Each case builds a randomly initialised Qwen2 model from a config (no download) in a fresh
subprocess, does one phase of a training step with plain HF / torch calls, and reports the memory
that phase added over what was held before it:

* ``state``: the model (float32) and AdamW after one optimiser step (weights + gradients + AdamW
  moments), read as the current memory after minus before; ``optimizer_step``: the peak of a second
  ``opt.step()`` over the memory before it;
* ``train`` / ``train_ckpt`` / ``train_bf16``: one micro-batch's forward and backward in train mode
  (dropout 0, ``use_cache=False``, ``logits_to_keep = T + 1``), the log-probs by
  :func:`grpo_lab.policy.logprobs.token_logprobs` and the entropy by :func:`grpo_lab.policy.logprobs.entropy_from_logits`
  under no-grad, as :func:`grpo_lab.policy.rollout.policy_logprobs` calls them; ``_ckpt`` with HF gradient
  checkpointing (``use_reentrant=False``), ``_bf16`` under bfloat16 autocast;
* ``score``: the same forward under no-grad, log-probs only (π_old / π_ref scoring);
* ``rollout``: grpo_lab's sampling path (``rollout._generate_with`` and its per-step behaviour
  log-prob recorder, as :func:`grpo_lab.policy.rollout.generate` runs it) on ``rows`` rows to the budget (no
  EOS can stop them); ``evaluation``: greedy, without the recorder (as :func:`grpo_lab.policy.rollout.evaluate`).

Memory: on CPU the peak resident set (``VmHWM`` after writing ``5`` to ``/proc/self/clear_refs``,
as :mod:`grpo_lab.training.memory` does) minus the resident set before the phase, with glibc's
``MALLOC_MMAP_THRESHOLD_=131072`` so that freed tensors go back to the OS; on CUDA
``torch.cuda.max_memory_allocated`` minus ``torch.cuda.memory_allocated`` before the phase.

Usage::

    python benchmarks/memory_model.py                       # CPU, tiny config, table on stdout
    python benchmarks/memory_model.py --out benchmarks/results/memory_model.json
    python benchmarks/memory_model.py --device cuda --scale gpu --out runs/memory_model_cuda.json
    python benchmarks/memory_model.py --fit-table           # benchmarks/README.md's GPU fit table (predicted)
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: The CPU cases' model: a random Qwen2 with a 32k vocabulary, 8 layers of width 256 (16.1M parameters).
CPU_CONFIG = {"model_type": "qwen2", "hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 8,
              "num_key_value_heads": 4, "intermediate_size": 1024, "vocab_size": 32000, "tie_word_embeddings": True}

#: Shapes per scale: ``cpu`` (each phase hundreds of MiB, seconds on one thread), ``test`` and ``gpu`` (the
#: GPU profile's: 128 rows x 512 tokens, micro-batches of 4, evaluation batches of 256, bfloat16).
SCALES = {
    "cpu": {"rows": 64, "eval_rows": 128, "prompt": 32, "gen_tokens": 224, "train_tokens": 480, "micro": 2,
            "autocast": "float32"},
    # for tests/experiments/test_memory_model.py: a short generation (32 steps) after a long prompt
    "test": {"rows": 64, "eval_rows": 64, "prompt": 160, "gen_tokens": 32, "train_tokens": 480, "micro": 2,
             "autocast": "float32"},
    "gpu": {"rows": 128, "eval_rows": 256, "prompt": 256, "gen_tokens": 512, "train_tokens": 512, "micro": 4,
            "autocast": "bfloat16"},
}
CASES = ("state", "train", "train_ckpt", "train_bf16", "score", "rollout", "evaluation")


def run_shape(case: str, scale: dict):
    """The :class:`grpo_lab.experiments.memory_model.RunShape` of ``case`` at ``scale``."""
    from grpo_lab.experiments.memory_model import RunShape

    gen = case in ("rollout", "evaluation")
    autocast = "bfloat16" if case == "train_bf16" else scale["autocast"]
    return RunShape(rows=scale["rows"], prompt_len=scale["prompt"],
                    max_new_tokens=scale["gen_tokens"] if gen else scale["train_tokens"],
                    micro_batch_size=scale["micro"], eval_batch_size=scale["eval_rows"], autocast=autocast,
                    gradient_checkpointing=case == "train_ckpt")


def predicted(case: str, config: dict, scale: dict) -> dict:
    """``{phase: bytes}`` the memory model predicts for what ``case`` measures."""
    from grpo_lab.experiments.memory_model import predict_memory

    est = predict_memory(config, run_shape(case, scale))
    p = est.phases
    if case == "state":
        return {"state": p["weights"] + p["gradients"] + p["adam"], "optimizer_step": p["optimizer_step"]}
    key = {"score": "score_micro", "rollout": "rollout", "evaluation": "evaluation"}.get(case, "train_micro")
    return {case: p[key]}


# ------------------------------------------------------------------------------------------------
# the worker (one case in a fresh process)
# ------------------------------------------------------------------------------------------------
class _Mem:
    """Current and peak memory of this process (CPU: RSS) or of the CUDA allocator, in bytes."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def _status(self, field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise OSError(f"{field} not in /proc/self/status")

    def now(self) -> int:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        return self._status("VmRSS")

    def reset(self) -> int:
        """Start a peak window; returns the current memory."""
        import gc

        import torch

        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        return self.now()

    def peak(self) -> int:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        return self._status("VmHWM")


def _model(config: dict, device, checkpointing: bool = False):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config)
    hf = AutoConfig.for_model(cfg.pop("model_type"), **cfg, attention_dropout=0.0)
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(hf, dtype=torch.float32, attn_implementation="sdpa")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _inputs(rows: int, prompt: int, new: int, vocab: int, device):
    """Left-padded ids (row 0 has 4 padding positions), mask and position ids of ``rows`` rows."""
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (rows, prompt + new), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def _forward_logp(model, ids, mask, pos, new: int, *, entropy: bool):
    """policy_logprobs' calls: the forward keeping T + 1 logits, log-probs (and entropy under no-grad), chunked
    as it chunks them by default (:func:`grpo_lab.policy.rollout.logprob_chunk_rows`)."""
    import torch

    from grpo_lab.policy.logprobs import entropy_from_logits, token_logprobs
    from grpo_lab.policy.rollout import logprob_chunk_rows

    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=new + 1, use_cache=False)
    logits = out.logits[:, :-1]
    chunk = logprob_chunk_rows(*logits.shape)  # what policy_logprobs passes by default
    logp = token_logprobs(logits, ids[:, -new:], chunk_size=chunk)
    if entropy:
        with torch.no_grad():
            entropy_from_logits(logits.detach(), chunk_size=chunk)
    return logp


def _autocast(device, name: str):
    import contextlib

    import torch

    if name == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, name))


def _case_state(config, scale, device, mem) -> dict:
    import torch

    def one_step(model):
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        ids, mask, pos = _inputs(1, 4, 4, model.config.vocab_size, device)
        _forward_logp(model, ids, mask, pos, 4, entropy=False).sum().backward()
        opt.step()
        return opt

    # warm-up on a one-layer model of width 64: imports, thread pools, autograd and AdamW code paths
    one_step(_model({**config, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 64,
                     "head_dim": 64 // config["num_attention_heads"]}, device))
    base = mem.reset()
    model = _model(config, device)
    opt = one_step(model)
    held = mem.reset() - base
    opt.step()
    return {"state": held, "optimizer_step": mem.peak() - (held + base)}


def _case_train(case, config, scale, device, mem) -> dict:
    import torch

    shape = run_shape(case, scale)
    model = _model(config, device, checkpointing=shape.gradient_checkpointing)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    with _autocast(device, shape.autocast):  # warm-up at a tiny shape: gradients, AdamW state, kernels
        lp = _forward_logp(model, *_inputs(1, 4, 4, config["vocab_size"], device), 4, entropy=True)
    lp.sum().backward()
    opt.step()
    ids, mask, pos = _inputs(shape.micro_batch_size, shape.prompt_len, shape.max_new_tokens, config["vocab_size"], device)
    base = mem.reset()
    if case == "score":
        with torch.no_grad(), _autocast(device, shape.autocast):
            _forward_logp(model, ids, mask, pos, shape.max_new_tokens, entropy=False)
    else:
        with _autocast(device, shape.autocast):
            lp = _forward_logp(model, ids, mask, pos, shape.max_new_tokens, entropy=True)
        lp.sum().backward()
        del lp
    return {case: mem.peak() - base}


def _case_generate(case, config, scale, device, mem) -> dict:
    """``rollout``: grpo_lab's sampling path (:func:`grpo_lab.policy.rollout._generate_with` with its per-step
    behaviour log-prob recorder, what :func:`grpo_lab.policy.rollout.generate` runs after tokenising);
    ``evaluation``: the same greedy, without the recorder (what :func:`grpo_lab.policy.rollout.evaluate` runs)."""
    import torch
    from transformers import GenerationConfig

    from grpo_lab.policy.rollout import _BehaviourLogprobs, _generate_with

    shape = run_shape(case, scale)
    greedy = case == "evaluation"
    rows = shape.eval_batch_size if greedy else shape.rows
    model = _model(config, device)
    model.eval()
    model.generation_config = GenerationConfig()
    gc = GenerationConfig(do_sample=not greedy, max_new_tokens=shape.max_new_tokens, eos_token_id=None, pad_token_id=0,
                          return_dict_in_generate=True, disable_compile=True,
                          **({} if greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}))
    small = _inputs(2, 4, 0, config["vocab_size"], device)
    with torch.no_grad(), _autocast(device, shape.autocast):  # warm-up
        _generate_with(model, small[0], small[1], GenerationConfig(**{**gc.to_dict(), "max_new_tokens": 2}),
                       None if greedy else _BehaviourLogprobs(4, 1.0))
    ids, mask, _ = _inputs(rows, shape.prompt_len, 0, config["vocab_size"], device)
    recorder = None if greedy else _BehaviourLogprobs(shape.prompt_len, 1.0)
    base = mem.reset()
    with torch.no_grad(), _autocast(device, shape.autocast):
        out, _ = _generate_with(model, ids, mask, gc, recorder)
        if recorder is not None:
            recorder.finish(out.sequences[:, shape.prompt_len:])
    assert out.sequences.shape[1] == shape.prompt_len + shape.max_new_tokens, out.sequences.shape
    return {case: mem.peak() - base}


def _worker(case: str, scale_name: str, device_name: str) -> dict:
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    device = torch.device(device_name)
    config = _config(scale_name)
    scale, mem = SCALES[scale_name], _Mem(device)
    t0 = time.perf_counter()
    if case == "state":
        res = _case_state(config, scale, device, mem)
    elif case in ("rollout", "evaluation"):
        res = _case_generate(case, config, scale, device, mem)
    else:
        res = _case_train(case, config, scale, device, mem)
    return {"measured": res, "seconds": round(time.perf_counter() - t0, 1)}


def _config(scale_name: str) -> dict:
    from grpo_lab.experiments.memory_model import QWEN25_05B_CONFIG

    return dict(QWEN25_05B_CONFIG) if scale_name == "gpu" else dict(CPU_CONFIG)


# ------------------------------------------------------------------------------------------------
# the driver
# ------------------------------------------------------------------------------------------------
def measure(case: str, scale_name: str = "cpu", device: str = "cpu", timeout: float = 600) -> dict:
    """Run ``case`` in a fresh subprocess; ``{"measured": {phase: bytes}, "predicted": {...}, "seconds": s}``.

    Raises:
        RuntimeError: the subprocess failed (its stderr's tail in the message).
    """
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", case, "--scale", scale_name, "--device", device]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=str(ROOT))
    if proc.returncode != 0:
        raise RuntimeError(f"memory_model benchmark case {case!r} failed:\n{proc.stderr[-2000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["predicted"] = predicted(case, _config(scale_name), SCALES[scale_name])
    return res


def _provenance(args, device_name: str) -> dict:
    import torch
    import transformers

    def git(*a):
        try:
            return subprocess.run(["git", *a], capture_output=True, text=True, cwd=str(ROOT)).stdout.strip()
        except OSError:
            return None

    return {"benchmark": "memory_model", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "transformers": transformers.__version__,
                         "grpo_lab_git": {"sha": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}},
            "device": args.device, "device_name": device_name, "processor": platform.processor(),
            "threads": int(os.environ.get("OMP_NUM_THREADS", "1")),
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "HF_HUB_OFFLINE")},
            "memory_method": ("torch.cuda.max_memory_allocated - memory_allocated before the phase" if args.device != "cpu"
                              else "peak RSS (VmHWM reset via /proc/self/clear_refs) - RSS before the phase, "
                                   "MALLOC_MMAP_THRESHOLD_=131072"),
            "scale": args.scale, "shapes": SCALES[args.scale], "config": _config(args.scale), "argv": sys.argv[1:]}


def _table(rows: list) -> str:
    out = ["| case | phase | measured MiB | predicted MiB | predicted / measured |", "|---|---|---|---|---|"]
    for r in rows:
        for phase, m in r["measured"].items():
            p = r["predicted"][phase]
            out.append(f"| {r['case']} | {phase} | {m / 2**20:.0f} | {p / 2**20:.0f} | {p / max(m, 1):.2f} |")
    return "\n".join(out)


#: Card sizes for the GPU fit table, in bytes: about what ``torch.cuda.get_device_properties().total_memory``
#: reports for a 16 GB T4, a 24 GB L4 and an 80 GB A100 / H100 (a little under the nominal size).
CARDS = {"T4 (16 GB, float16)": (int(14.75 * 2**30), "float16"), "L4 (24 GB)": (int(22.0 * 2**30), "bfloat16"),
         "A100 / H100 (80 GB)": (int(79.0 * 2**30), "bfloat16")}


def chapter_runs() -> dict:
    """``{chapter: (algorithm names, kl_reference, critic, max_new_tokens, rows per minibatch)}`` of the
    chapters' GPU cells: ``GPU_ALGOS`` read from the twins in ``book/_py`` (presets, or presets changed by
    ``.replace`` in the twin), the algorithms' KL term and value baseline, the twin's ``GPU_MINIBATCHES``
    (else the GPU profile's 2), chapter 7's 256-token budget and single minibatch (rpt_gpu_profile)."""
    import ast

    from grpo_lab.algo import algorithms
    from grpo_lab.algo.advantages import VALUE_BASELINE_ESTIMATORS

    out = {}
    for twin in sorted((ROOT / "book" / "_py").glob("0*.py")):
        assigns = {node.targets[0].id: node.value for node in ast.parse(twin.read_text()).body
                   if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
        if "GPU_ALGOS" not in assigns:
            continue
        algos = [_twin_algorithm(e.id, assigns, algorithms) for e in assigns["GPU_ALGOS"].elts]
        names = [_shown_name(e.id, assigns) for e in assigns["GPU_ALGOS"].elts]
        rpt = twin.stem == "07_rpt"
        minibatches = _twin_int(assigns["GPU_MINIBATCHES"], assigns) if "GPU_MINIBATCHES" in assigns else 2
        out[twin.stem] = (names, any(a.uses_kl for a in algos),
                          any(a.advantage in VALUE_BASELINE_ESTIMATORS for a in algos), 256 if rpt else 512,
                          128 if rpt else 128 // minibatches)
    return out


def _twin_algorithm(name: str, assigns: dict, algorithms):
    """A ``GPU_ALGOS`` entry of a twin: a preset, or ``NAME = PRESET.replace(key=literal, ...)`` defined in the twin
    (chapter 4's GRPO without KL); the literals read with ``ast.literal_eval``, nothing executed."""
    if hasattr(algorithms, name):
        return getattr(algorithms, name)
    call = assigns[name]
    base = _twin_algorithm(call.func.value.id, assigns, algorithms)
    return base.replace(**{k.arg: ast.literal_eval(k.value) for k in call.keywords})


def _shown_name(name: str, assigns: dict) -> str:
    """How the GPU fit table names a ``GPU_ALGOS`` entry: a preset by its name; a twin's ``PRESET.replace(...)`` as
    the preset with its changed fields (``GRPO (kl=None, beta=0.0, eps_high=0.27)``), not the twin's
    chapter-local variable."""
    if name not in assigns:
        from grpo_lab.algo import algorithms

        return getattr(algorithms, name).name
    call = assigns[name]
    changed = ", ".join(f"{k.arg}={ast.literal_eval(k.value)!r}".replace("'", "") for k in call.keywords if k.arg != "name")
    return f"{_shown_name(call.func.value.id, assigns)} ({changed})"


def _twin_int(node, assigns: dict) -> int:
    """An int a twin assigns, directly or through another module-level name (``GPU_MINIBATCHES = UPDATES``)."""
    return _twin_int(assigns[node.id], assigns) if isinstance(node, ast.Name) else int(ast.literal_eval(node))


def _fit_cell(total: int, autocast: str, kl: bool, critic: bool, new: int, max_micro: int) -> str:
    from grpo_lab.experiments.memory_model import QWEN25_05B_CONFIG, RunShape, fit_batch_sizes

    for ckpt in (False, True):
        shape = RunShape(rows=128, prompt_len=256, max_new_tokens=new, micro_batch_size=1, eval_batch_size=64,
                         autocast=autocast, kl_reference=kl, critic=critic, gradient_checkpointing=ckpt)
        try:
            micro, ev = fit_batch_sizes(QWEN25_05B_CONFIG, shape, total, max_micro=max_micro)
        except ValueError as exc:
            err = str(exc)
            continue
        return f"micro {micro}{' + checkpointing' if ckpt else ''}, eval {ev}"
    phase = "state" if "optimiser state alone" in err else err.split("phase ")[1].split(" ")[0] if "phase " in err else "rollout"
    return f"does not fit ({phase})"


def fit_table() -> str:
    """The GPU fit table of benchmarks/README.md: per chapter and card, the micro-batch and evaluation batch the
    memory model lets fit (Qwen2.5-0.5B, 128 rows, prompts of 256 tokens, evaluation batches up to the
    profile's 64; a micro-batch at most a minibatch), predicted, not measured."""
    head = "| chapter | algorithms | minibatches per rollout | " + " | ".join(CARDS) + " |"
    rows = [head, "|" + "---|" * (3 + len(CARDS))]
    for ch, (names, kl, critic, new, max_micro) in chapter_runs().items():
        cells = [_fit_cell(total, ac, kl, critic, new, max_micro) for total, ac in CARDS.values()]
        rows.append(f"| `{ch}` | {', '.join(names)} | {128 // max_micro} of {max_micro} rows | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", default=None, help=f"comma-separated, default all of {','.join(CASES)}")
    p.add_argument("--scale", default="cpu", choices=sorted(SCALES))
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--fit-table", action="store_true", help="print the GPU fit table (benchmarks/README.md) and exit")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker, args.scale, args.device)))
        return 0
    if args.fit_table:
        print(fit_table())
        return 0
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA requested but not available", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    rows, failed = [], []
    for case in (args.cases.split(",") if args.cases else CASES):
        try:
            rows.append({"case": case, **measure(case, args.scale, args.device)})
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            failed.append({"case": case, "error": str(exc)[-1500:]})
            print(exc, file=sys.stderr)
        print(f"done: {case}", file=sys.stderr, flush=True)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            payload = {**_provenance(args, device_name), "complete": False, "results": rows, "failed": failed}
            args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"memory model vs measurement, scale {args.scale} on {args.device} ({device_name})")
    print(_table(rows))
    if args.out is not None:
        payload = {**_provenance(args, device_name), "complete": not failed, "results": rows, "failed": failed}
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
