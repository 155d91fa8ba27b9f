"""Peak memory and time of per-token log-probs: naive vs fused vs chunked, forward + backward.

Two sources of log-probs are measured at B=8, T=512, V=32000 by default:

* ``hidden``: from final hidden states ``[B, T, H]`` and an lm_head ``[V, H]`` (H=256):
  naive = ``log_softmax((h @ W^T).float() / tau).gather(ids)`` vs
  :func:`grpo_lab.logprobs.token_logprobs_from_hidden` (chunked, logits recomputed in backward).
* ``logits``: from given logits ``[B, T, V]`` (which require grad):
  naive = ``log_softmax(logits.float() / tau).gather(ids)`` vs
  :func:`grpo_lab.logprobs.token_logprobs` with ``chunk_size=None`` (fused) and with chunks.

Every case runs twice, each time in a fresh subprocess: once to measure memory (one forward +
backward) and once to measure time (median of ``--repeats`` runs after a first, untimed one, with
the default allocator settings). Peak memory is the *extra* memory of forward + backward on top
of the inputs:

* CPU: peak resident set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, a high-water mark)
  minus its value after the inputs were allocated and a tiny warm-up (same code path at a small
  size, to load kernels and thread pools) was run. The worker runs with glibc's
  ``MALLOC_MMAP_THRESHOLD_`` fixed at 128 KiB: every tensor buffer is then ``mmap``-ed and given
  back to the OS when freed, so RSS follows live tensor memory (with glibc's default *dynamic*
  threshold, freed buffers below 32 MiB -- e.g. chunks of 256 x 32000 floats -- stay in the heap
  and the peak RSS overstates the live memory of the small-chunk paths).
* CUDA: ``torch.cuda.max_memory_allocated()`` minus ``torch.cuda.memory_allocated()`` after the
  inputs were allocated (``reset_peak_memory_stats`` in between).

The gradients of the inputs are part of the measured memory (for the ``logits`` source the
``[B, T, V]`` gradient of the logits is unavoidable; it is reported in the table header as the
size of one ``[B, T, V]`` tensor in the logits' dtype).

Usage::

    python benchmarks/logprobs_memory.py                  # default sizes, table on stdout
    python benchmarks/logprobs_memory.py --out results.json --repeats 5
    python benchmarks/logprobs_memory.py --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = [
    ("hidden", "naive", None),
    ("hidden", "chunked", 1024),
    ("hidden", "chunked", 256),
    ("logits", "naive", None),
    ("logits", "fused", None),
    ("logits", "chunked", 1024),
    ("logits", "chunked", 256),
]


def _rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024.0 if sys.platform != "darwin" else r / 2**20


def _worker(args) -> dict:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from grpo_lab.logprobs import token_logprobs, token_logprobs_from_hidden

    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    tau = args.temperature
    torch.manual_seed(0)

    def make_inputs(b, t, v, h):
        ids = torch.randint(0, v, (b, t), device=dev)
        up = torch.randn(b, t, device=dev)  # random upstream gradient
        # in-place scaling: no transient copy may raise the memory high-water mark before the
        # baseline is taken
        if args.source == "hidden":
            hid = torch.randn(b, t, h, device=dev, dtype=dtype).mul_(0.5).requires_grad_()
            w = torch.randn(v, h, device=dev, dtype=dtype).mul_(h**-0.5).requires_grad_()
            return (hid, w), ids, up
        logits = torch.randn(b, t, v, device=dev, dtype=dtype).mul_(2.0).requires_grad_()
        return (logits,), ids, up

    def run(inputs, ids, up):
        if args.source == "hidden":
            hid, w = inputs
            if args.path == "naive":
                lp = torch.log_softmax(torch.nn.functional.linear(hid, w).float() / tau, -1)
                lp = lp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
            else:
                lp = token_logprobs_from_hidden(hid, w, ids, temperature=tau, chunk_size=args.chunk)
        else:
            (logits,) = inputs
            if args.path == "naive":
                lp = torch.log_softmax(logits.float() / tau, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
            else:
                lp = token_logprobs(logits, ids, temperature=tau, chunk_size=args.chunk)
        (lp * up).sum().backward()
        for x in inputs:
            x.grad = None
        return lp

    # warm-up at a small size (kernels, thread pools, allocator) so that it is not counted
    small = make_inputs(2, 8, 64, 16)
    run(*small)
    del small

    inputs, ids, up = make_inputs(args.B, args.T, args.V, args.H)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = _rss_mb()

    times = []
    for _ in range(args.repeats if args.mode == "time" else 1):
        t0 = time.perf_counter()
        run(inputs, ids, up)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)

    if dev.type == "cuda":
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        peak = _rss_mb() - base
    return {
        "source": args.source,
        "path": args.path,
        "chunk_size": args.chunk,
        "mode": args.mode,
        "peak_extra_mib": round(peak, 1),
        "time_s_median": round(statistics.median(times[1:] if len(times) > 1 else times), 4),
        "time_s_all": [round(t, 4) for t in times],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--T", type=int, default=512)
    p.add_argument("--V", type=int, default=32000)
    p.add_argument("--H", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per case (median excludes the first)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    # internal: run one case
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--source", default=None, help=argparse.SUPPRESS)
    p.add_argument("--path", default=None, help=argparse.SUPPRESS)
    p.add_argument("--chunk", type=lambda s: None if s == "None" else int(s), default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="memory", choices=["memory", "time"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        print(json.dumps(_worker(args)))
        return 0

    import torch  # only for the header / environment

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA requested but not available", file=sys.stderr)
        return 2
    elem = torch.finfo(getattr(torch, args.dtype)).bits // 8
    btv_mib = args.B * args.T * args.V * elem / 2**20
    btv_f32_mib = args.B * args.T * args.V * 4 / 2**20
    common = [
        f"--B={args.B}", f"--T={args.T}", f"--V={args.V}", f"--H={args.H}",
        f"--temperature={args.temperature}", f"--dtype={args.dtype}", f"--device={args.device}",
        f"--repeats={args.repeats}",
    ]
    results = []
    for source, path, chunk in CASES:
        row = {"source": source, "path": path, "chunk_size": chunk}
        for mode in ("memory", "time"):
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", f"--source={source}", f"--path={path}",
                   f"--chunk={chunk}", f"--mode={mode}", *common]
            env = dict(os.environ)
            if mode == "memory":
                env["MALLOC_MMAP_THRESHOLD_"] = "131072"
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                row["error"] = proc.stderr[-500:]
                break
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            if mode == "memory":
                row["peak_extra_mib"] = res["peak_extra_mib"]
            else:
                row["time_s_median"] = res["time_s_median"]
                row["time_s_all"] = res["time_s_all"]
        results.append(row)

    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    print(
        f"per-token log-probs, forward+backward, B={args.B} T={args.T} V={args.V} H={args.H} "
        f"dtype={args.dtype} device={args.device} ({device_name}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads)"
    )
    print(f"one [B,T,V] tensor: {btv_mib:.0f} MiB in {args.dtype}, {btv_f32_mib:.0f} MiB in float32")
    method = "cuda max_memory_allocated" if args.device.startswith("cuda") else "peak RSS (ru_maxrss)"
    print(f"peak = extra memory over the inputs, {method}; time = median of {max(args.repeats - 1, 1)} runs "
          "(separate process, default allocator)")
    print()
    header = f"| {'source':<7}| {'path':<8}| {'chunk':>6} | {'peak MiB':>9} | {'x [B,T,V] f32':>13} | {'time s':>7} |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for r in results:
        if "error" in r:
            print(f"| {r['source']:<7}| {r['path']:<8}| {str(r['chunk_size']):>6} | {'error':>9} | {'':>13} | {'':>7} |")
            continue
        ratio = r["peak_extra_mib"] / btv_f32_mib
        print(
            f"| {r['source']:<7}| {r['path']:<8}| {str(r['chunk_size'] or '-'):>6} | {r['peak_extra_mib']:>9.0f} "
            f"| {ratio:>13.2f} | {r['time_s_median']:>7.3f} |"
        )
    if args.out is not None:
        payload = {
            "config": {k: getattr(args, k) for k in ("B", "T", "V", "H", "temperature", "dtype", "device", "repeats")},
            "btv_mib": btv_mib,
            "btv_float32_mib": btv_f32_mib,
            "memory_method": method + ("" if args.device.startswith("cuda") else ", MALLOC_MMAP_THRESHOLD_=131072"),
            "device_name": device_name,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "results": results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {args.out}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
