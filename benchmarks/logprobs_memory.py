"""Peak memory and time of per-token log-probs: naive vs fused vs chunked (vs compiled), fwd + bwd.

Two sources of log-probs are measured at B=8, T=512, V=32000 by default:

* ``hidden``: from final hidden states ``[B, T, H]`` and an lm_head ``[V, H]`` (H=256):
  naive = ``log_softmax((h @ W^T).float() / tau).gather(ids)`` vs
  :func:`grpo_lab.policy.logprobs.token_logprobs_from_hidden` (chunked, logits recomputed in backward)
  and the same with ``compile=True`` (path ``compiled``: the per-chunk softmax work in
  ``torch.compile``-generated fused kernels).
* ``logits``: from given logits ``[B, T, V]`` (which require grad):
  naive = ``log_softmax(logits.float() / tau).gather(ids)`` vs
  :func:`grpo_lab.policy.logprobs.token_logprobs` with ``chunk_size=None`` (fused) and with chunks.

Every case runs twice, each time in a fresh subprocess: once to measure memory (one forward +
backward) and once to measure time (median of ``--repeats`` runs after a first, untimed one, with
the default allocator settings). Before either, the worker runs an unmeasured warm-up after
allocating the inputs, to load kernels and thread pools and size the matmul workspaces: for the
``hidden`` source the same code path on one chunk of rows (1024 for ``naive``) of the real
inputs, so that the ``compiled`` path compiles (and, on a GPU, tunes) exactly the kernels the
measured runs use (the row dimension is dynamic); for the ``logits`` source the same code path at
a tiny size. The warm-up's wall time, compilation included, is reported as ``compile_s``;
``recompiles`` counts graphs compiled during the measured runs (0 expected). Peak memory is the
*extra* memory of forward + backward on top of the inputs:

* CPU: peak resident set size minus the resident set size after the inputs were allocated and
  the warm-up was run. On Linux the high-water mark is first reset to the current RSS (``5``
  written to ``/proc/self/clear_refs``) and the peak read from ``VmHWM`` in
  ``/proc/self/status``, so that a warm-up's transient memory (the compiler's: tens of MiB)
  cannot hide part of the measured peak; elsewhere ``resource.getrusage(RUSAGE_SELF).ru_maxrss``
  (a high-water mark that cannot be reset) is read before and after. The worker runs with glibc's
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
    python benchmarks/logprobs_memory.py --B 4 --T 256 --cases hidden:naive,hidden:chunked:1024,hidden:compiled:1024

``--out`` is rewritten after every case (``"complete": false`` until the last one), so a run
stopped by a time limit keeps the cases it finished.
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
    ("hidden", "compiled", 1024),
    ("hidden", "compiled", 256),
    ("logits", "naive", None),
    ("logits", "fused", None),
    ("logits", "chunked", 1024),
    ("logits", "chunked", 256),
]


def _rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024.0 if sys.platform != "darwin" else r / 2**20


def _proc_status_mb(field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process from ``/proc/self/status``, in MiB (Linux only)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0  # kB
    raise OSError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Reset this process's RSS high-water mark to its current RSS (Linux >= 4.0); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _proc_status_mb("VmHWM")
        return True
    except OSError:
        return False


def _parse_cases(spec: str | None) -> list:
    """``source:path[:chunk]`` items, comma-separated (``None``: all of ``CASES``)."""
    if not spec:
        return list(CASES)
    cases = []
    for item in spec.split(","):
        parts = item.strip().split(":")
        if len(parts) not in (2, 3) or parts[0] not in ("hidden", "logits"):
            raise SystemExit(f"bad case {item!r}; expected source:path[:chunk], e.g. hidden:compiled:1024")
        chunk = int(parts[2]) if len(parts) == 3 and parts[2] not in ("", "-", "None") else None
        case = (parts[0], parts[1], chunk)
        known = {(s, p) for s, p, _ in CASES}
        if (case[0], case[1]) not in known:
            raise SystemExit(f"unknown case {item!r}; known source:path pairs: {sorted(known)}")
        if case[1] in ("chunked", "compiled") and chunk is None:
            raise SystemExit(f"case {item!r} needs a chunk size")
        cases.append(case)
    return cases


def _worker(args) -> dict:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from grpo_lab.policy.logprobs import token_logprobs, token_logprobs_from_hidden

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
                lp = token_logprobs_from_hidden(
                    hid, w, ids, temperature=tau, chunk_size=args.chunk, compile=args.path == "compiled"
                )
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

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    inputs, ids, up = make_inputs(args.B, args.T, args.V, args.H)
    # warm-up (kernels, thread pools, allocator, matmul workspaces; for 'compiled' the compilation)
    # so that it is not counted. Source 'hidden', every path alike: one chunk of rows (1024 for the
    # naive path) with the real weight (detached, so the warm-up's backward allocates no [V, H]
    # gradient), i.e. the dtype, V, H and chunk length of the measured runs (inductor compiles for
    # these and tunes its GPU kernels on the first call's sizes).
    sync()
    t0 = time.perf_counter()
    if args.source == "hidden":
        n = min(args.chunk or 1024, args.B * args.T)
        hid_w = inputs[0].detach().reshape(1, -1, args.H)[:, :n].clone().requires_grad_()
        run((hid_w, inputs[1].detach()), ids.reshape(1, -1)[:, :n], up.reshape(1, -1)[:, :n])
        del hid_w
    else:
        run(*make_inputs(2, 8, 64, 16))
    sync()
    warmup_s = time.perf_counter() - t0
    graphs = (lambda: torch._dynamo.utils.counters["stats"]["unique_graphs"]) if args.path == "compiled" else None
    graphs0 = graphs() if graphs else 0

    hwm = False
    if dev.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        hwm = sys.platform.startswith("linux") and _reset_peak_rss()
        base = _proc_status_mb("VmRSS") if hwm else _rss_mb()

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
        peak = (_proc_status_mb("VmHWM") if hwm else _rss_mb()) - base
    res = {
        "source": args.source,
        "path": args.path,
        "chunk_size": args.chunk,
        "mode": args.mode,
        "peak_extra_mib": round(peak, 1),
        "time_s_median": round(statistics.median(times[1:] if len(times) > 1 else times), 4),
        "time_s_all": [round(t, 4) for t in times],
        "memory_method": "VmHWM" if hwm else ("cuda" if dev.type == "cuda" else "ru_maxrss"),
    }
    if graphs is not None:
        res["compile_s"] = round(warmup_s, 2)
        res["recompiles"] = graphs() - graphs0
    return res


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
    p.add_argument("--cases", default=None,
                   help="comma-separated source:path[:chunk] items to run (default: all), e.g. "
                        "hidden:naive,hidden:chunked:1024,hidden:compiled:1024,logits:fused")
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
    cases = _parse_cases(args.cases)
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    results = []
    mem_methods = set()

    def memory_method() -> str:
        if args.device.startswith("cuda"):
            return "cuda max_memory_allocated"
        if mem_methods == {"VmHWM"}:
            return "peak RSS (VmHWM, high-water mark reset to the current RSS after the warm-up)"
        return "peak RSS (ru_maxrss)"

    def write_json(complete: bool) -> None:
        # rewritten after every case: a run stopped by a time limit still leaves its finished cases
        if args.out is None:
            return
        payload = {
            "config": {k: getattr(args, k) for k in ("B", "T", "V", "H", "temperature", "dtype", "device", "repeats")},
            "btv_mib": btv_mib,
            "btv_float32_mib": btv_f32_mib,
            "memory_method": memory_method()
            + ("" if args.device.startswith("cuda") else ", MALLOC_MMAP_THRESHOLD_=131072"),
            "device_name": device_name,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "complete": complete,
            "results": results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=2) + "\n")

    for source, path, chunk in cases:
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
                mem_methods.add(res["memory_method"])
            else:
                row["time_s_median"] = res["time_s_median"]
                row["time_s_all"] = res["time_s_all"]
                if "compile_s" in res:
                    row["compile_s"] = res["compile_s"]
                    row["recompiles"] = res["recompiles"]
        results.append(row)
        write_json(complete=False)
        print(f"done: {source} {path} {chunk or '-'}", {k: v for k, v in row.items() if k in
              ("peak_extra_mib", "time_s_median", "compile_s", "recompiles", "error")}, file=sys.stderr, flush=True)

    print(
        f"per-token log-probs, forward+backward, B={args.B} T={args.T} V={args.V} H={args.H} "
        f"dtype={args.dtype} device={args.device} ({device_name}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads)"
    )
    print(f"one [B,T,V] tensor: {btv_mib:.0f} MiB in {args.dtype}, {btv_f32_mib:.0f} MiB in float32")
    method = memory_method()
    print(f"peak = extra memory over the inputs, {method}; time = median of {max(args.repeats - 1, 1)} runs "
          "(separate process, default allocator)")
    print()
    header = (f"| {'source':<7}| {'path':<8}| {'chunk':>6} | {'peak MiB':>9} | {'x [B,T,V] f32':>13} | {'time s':>7} "
              f"| {'compile s':>9} |")
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for r in results:
        if "error" in r:
            print(f"| {r['source']:<7}| {r['path']:<8}| {str(r['chunk_size']):>6} | {'error':>9} | {'':>13} | {'':>7} "
                  f"| {'':>9} |")
            continue
        ratio = r["peak_extra_mib"] / btv_f32_mib
        comp = "-" if "compile_s" not in r else f"{r['compile_s']:.1f}" + ("" if not r["recompiles"] else "*")
        print(
            f"| {r['source']:<7}| {r['path']:<8}| {str(r['chunk_size'] or '-'):>6} | {r['peak_extra_mib']:>9.0f} "
            f"| {ratio:>13.2f} | {r['time_s_median']:>7.3f} | {comp:>9} |"
        )
    if any(r.get("recompiles") for r in results):
        print("* recompiled during the measured runs: the time includes compilation")
    if args.out is not None:
        write_json(complete=True)
        print(f"\nwrote {args.out}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
