"""Execute the book's chapters into the jupyter-cache that `make book`'s build reads, several at a time.

    python scripts/execute_cache.py book/*.ipynb               # what `make book` runs before jupyter-book
    python scripts/execute_cache.py --jobs 2 book/*.ipynb      # two chapters at a time (`BOOK_JOBS=2 make book`)

Jupyter Book (myst-nb's "cache" mode) executes the chapters one after another, and one chapter leaves
part of the two cores idle (its kernel's own cells run on one core while the worker processes wait:
chapter 3 used 1.8 cores on average, chapter 7 1.6). This script executes them beforehand, ``--jobs``
at a time, longest first (the times of ``benchmarks/results/chapter_times.json``), each in a fresh kernel
started in ``book/`` exactly as myst-nb starts it (``jupyter_cache``'s ``single_nb_execution``, the
configuration's timeout and no errors allowed), and stores each executed notebook in the cache under the
hash myst-nb looks up (its code cells and kernelspec), so the build that follows renders them without
executing anything. A chapter already in the cache is skipped. One that fails (an error in a cell, a
timeout, a kernel that dies or cannot start) is not stored; the others are, and the script then names the
failed ones with the end of each error and exits with status 1, so `make book` stops before the build.
A path that is not a readable notebook is refused before anything runs (status 2).

Whether two at a time is faster depends on the machine's state: each chapter already trains two
seeds at a time in worker processes, so two chapters put four workers (and two kernels) on two
cores. On 2026-12-03 one afternoon's pair of chapters 3 and 6 took 7% less than one after the
other; that evening a whole `make clean book` took 16.6 min two at a time against 14.0 min one at a
time. `make book` therefore runs them one at a time (``--jobs 1``, the default here too).

With ``--jobs`` above 1 the chapters share the cores, so each one's own clock runs slower: the kernels get
``GRPO_LAB_CHAPTERS_AT_ONCE`` (the number of chapters executed together, at most), and
:func:`grpo_lab.lab.book.run_time` and :func:`grpo_lab.lab.book.cache_note` say so beside every time they state.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _execute(path: str, timeout: int, at_once: int) -> tuple[str, str | None, float, str | None]:
    """Execute one notebook in a fresh kernel started in its folder; (path, executed notebook as JSON or
    None, seconds, error text or None)."""
    from jupyter_cache.executors.utils import single_nb_execution

    if at_once > 1:
        os.environ["GRPO_LAB_CHAPTERS_AT_ONCE"] = str(at_once)
    t0 = time.perf_counter()
    try:
        nb = nbformat.read(path, as_version=4)
        result = single_nb_execution(nb, cwd=str(Path(path).resolve().parent), timeout=timeout,
                                     allow_errors=False, meta_override=True)
    except Exception as exc:  # a kernel that died or cannot start, a notebook that cannot be read: this one only
        return path, None, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"
    if result.err is not None:
        return path, None, result.time, result.exc_string or repr(result.err)
    return path, nbformat.writes(result.nb), result.time, None


def _tail(text: str, lines: int = 15) -> str:
    """The last ``lines`` lines of an error text, without terminal colour codes."""
    return "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", text).rstrip().splitlines()[-lines:])


def _longest_first(paths: list[str]) -> list[str]:
    """``paths`` ordered by their last measured time (``benchmarks/results/chapter_times.json``), longest first;
    chapters without a time last."""
    times_file = ROOT / "benchmarks" / "results" / "chapter_times.json"
    times = {}
    if times_file.is_file():
        for stem, rec in json.loads(times_file.read_text()).get("chapters", {}).items():
            times[stem] = float(rec["seconds"]) if isinstance(rec, dict) else float(rec)
    return sorted(paths, key=lambda p: -times.get(Path(p).stem, 0.0))


def _check_inputs(ap: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    """Refuse (status 2, via ``ap.error``) a ``--jobs`` below 1, a path that is not a readable notebook, a
    missing ``--config``; return the configuration's per-cell timeout in seconds."""
    if a.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {a.jobs}")
    for path in a.notebooks:
        try:
            nbformat.read(path, as_version=4)
        except Exception as exc:  # missing, a folder, not JSON, not a notebook
            ap.error(f"{path} is not a readable notebook ({type(exc).__name__}: {exc})")
    if not Path(a.config).is_file():
        ap.error(f"--config {a.config}: no such file")
    return int((yaml.safe_load(Path(a.config).read_text()).get("execute") or {}).get("timeout", 600))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--jobs", type=int, default=1, help="chapters executed at the same time (default 1)")
    ap.add_argument("--cache", default=str(ROOT / "_build" / ".jupyter_cache"),
                    help="the jupyter-cache directory (default _build/.jupyter_cache, Jupyter Book's)")
    ap.add_argument("--config", default=str(ROOT / "_config.yml"), help="the book's configuration (its timeout)")
    a = ap.parse_args(argv)
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    timeout = _check_inputs(ap, a)
    cache = get_cache(a.cache)
    todo = []
    for path in _longest_first(a.notebooks):
        try:
            cache.match_cache_notebook(nbformat.read(path, as_version=4))
            print(f"{path}: in the cache", flush=True)
        except KeyError:
            todo.append(path)
    at_once = min(a.jobs, len(todo))
    failed, t0 = [], time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, at_once)) as pool:
        futures = {pool.submit(_execute, p, timeout, at_once): p for p in todo}
        for fut in as_completed(futures):
            try:
                path, text, seconds, err = fut.result()
            except Exception as exc:  # the executing process itself died
                path, text, seconds, err = futures[fut], None, float("nan"), f"{type(exc).__name__}: {exc}"
            if err is not None:
                failed.append((path, err))
                print(f"{path}: FAILED after {seconds:.0f} s", flush=True)
                continue
            cache.cache_notebook_bundle(CacheBundleIn(nbformat.reads(text, as_version=4), str(Path(path).resolve()),
                                                      data={"execution_seconds": seconds}),
                                        check_validity=False, overwrite=True)
            print(f"{path}: executed in {seconds:.0f} s (up to {at_once} at a time)", flush=True)
    if todo:
        print(f"executed {len(todo) - len(failed)} of {len(todo)} notebooks in "
              f"{(time.perf_counter() - t0) / 60:.1f} min, {at_once} at a time", flush=True)
    for path, err in failed:
        print(f"\n{path} FAILED; the end of its error:\n{_tail(err)}", file=sys.stderr)
    if failed:
        print(f"\nfailed: {', '.join(p for p, _ in failed)} (not cached; the others are)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
