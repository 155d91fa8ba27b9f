"""Per-chapter execution times, as benchmarks/README.md's table: each chapter from its own empty run cache.

    python scripts/chapter_times.py --measure            # execute every chapter, write the results file
    python scripts/chapter_times.py --measure 05_cispo  # one chapter (merged into the results file)
    python scripts/chapter_times.py --measure --in-place 06_vapo  # also its committed outputs, in one run
    python scripts/chapter_times.py                      # print the table from the results file
    python scripts/chapter_times.py --write              # also rewrite the table in benchmarks/README.md
    python scripts/chapter_times.py --make-book          # the table of the last `make book` instead

The budget (DEVELOPERS: each chapter at most 4 minutes on 2 cores) is a chapter's time *from an
empty run cache*. `--measure` executes each chapter in a fresh kernel (`python -m grpo_lab.lab.book
execute`, into a temporary copy: the committed notebooks are not touched) with
`$GRPO_LAB_RUN_CACHE` pointing at a new empty directory, one chapter after another, and records the
wall time with the commit, date and processor in `benchmarks/results/chapter_times.json`. Run it
on an otherwise idle machine: this machine's speed varies by up to about 50% over an hour.

`--make-book` reads jupyter-cache's records of the last `make book` (`_build/.jupyter_cache`)
instead: chapters there share one run cache, so a chapter whose runs an earlier one trained is
faster than from an empty cache; time a `make clean book` for it.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- chapter-times:start -->", "<!-- chapter-times:end -->"
#: the file whose table --write rewrites (between START and END)
TABLES = ROOT / "benchmarks" / "README.md"
BUDGET_S = 240  # DEVELOPERS: each chapter <= 4 min on 2 cores from an empty run cache
RESULTS = ROOT / "benchmarks" / "results" / "chapter_times.json"
CHAPTERS = ("01_grpo", "02_dapo", "03_dr_grpo", "04_gspo", "05_cispo", "06_vapo", "07_rpt", "08_choosing", "own_task",
            "scale_out")


def make_book_records(cache_dir: Path) -> dict[str, float]:
    """``{notebook stem: execution seconds}`` of the newest cached execution of each chapter."""
    from jupyter_cache import get_cache

    if not (cache_dir / "global.db").exists():
        raise SystemExit(f"no jupyter-cache at {cache_dir}: run `make book` first")
    newest: dict[str, tuple] = {}
    for r in get_cache(cache_dir).list_cache_records():
        stem = Path(r.uri).stem
        seconds = (r.data or {}).get("execution_seconds")
        if seconds is not None and (stem not in newest or r.created > newest[stem][0]):
            newest[stem] = (r.created, float(seconds))
    if not newest:
        raise SystemExit(f"the jupyter-cache at {cache_dir} has no executed chapter: run `make clean book` first")
    return {k: v for k, (_, v) in sorted(newest.items())}


def measure(chapters: list[str], in_place: bool = False) -> dict:
    """Execute each chapter from its own empty run cache; merge the times into :data:`RESULTS`.
    ``in_place``: execute the committed notebook itself (its outputs are then this run's), not a copy."""
    import os

    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    # code not yet committed (the package, the chapters' twins, the scripts) is marked: "abc1234+"
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "grpo_lab", "book/_py", "scripts"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    sha += "+" if dirty else ""
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"chapters": {}}
    for stem in chapters:
        with tempfile.TemporaryDirectory(prefix=f"chapter-times-{stem}-") as tmp:
            env = {**os.environ, "GRPO_LAB_RUN_CACHE": str(Path(tmp) / "run_cache")}
            t0 = time.perf_counter()
            out = [] if in_place else ["--out", str(Path(tmp) / f"{stem}.ipynb")]
            subprocess.run([sys.executable, "-m", "grpo_lab.lab.book", "execute", f"book/{stem}.ipynb", *out], cwd=ROOT,
                           env=env, check=True)
            seconds = time.perf_counter() - t0
        old["chapters"][stem] = {"seconds": round(seconds, 1), "commit": sha, "date": time.strftime("%Y-%m-%d %H:%M"),
                                 "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
        print(f"{stem}: {seconds:.0f} s", flush=True)
        RESULTS.write_text(json.dumps(old, indent=1) + "\n")
    return old


def scale(stem: str) -> str:
    """The seeds of a chapter, read from its twin's ``SEEDS = (...)`` line."""
    twin = ROOT / "book" / "_py" / f"{stem}.py"
    m = re.search(r"^SEEDS = \(([^)]*)\)", twin.read_text(), re.M) if twin.exists() else None
    return f"{len([s for s in m.group(1).split(',') if s.strip()])} seeds" if m else ""


def table(times: dict[str, float], notes: dict[str, str] | None = None, head: str = "from an empty run cache") -> str:
    """The table of benchmarks/README.md: one row per chapter (seeds, seconds, over-budget flag, ``notes``), and the sum."""
    lines = [f"| chapter | seeds per setting | {head} |", "|---|---|---|"]
    for stem, sec in times.items():
        flag = " (over the 4-min budget)" if sec > BUDGET_S else ""
        note = f" ({notes[stem]})" if notes and notes.get(stem) else ""
        lines.append(f"| `{stem}` | {scale(stem)} | {sec:.0f} s{flag}{note} |")
    lines.append(f"| all chapters, one after another | | {sum(times.values()) / 60:.1f} min |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chapters", nargs="*", help=f"chapters to --measure (default all: {' '.join(CHAPTERS)})")
    ap.add_argument("--measure", action="store_true", help="execute the chapters, each from an empty run cache")
    ap.add_argument("--in-place", action="store_true",
                    help="with --measure: execute the committed notebooks themselves (their outputs replaced)")
    ap.add_argument("--make-book", action="store_true", help="the last `make book`'s times (jupyter-cache) instead")
    ap.add_argument("--cache", default=str(ROOT / "_build" / ".jupyter_cache"),
                    help="the jupyter-cache directory `make book` wrote (default _build/.jupyter_cache)")
    ap.add_argument("--write", action="store_true", help="rewrite the table in benchmarks/README.md")
    a = ap.parse_args(argv)
    unknown = sorted(set(a.chapters) - set(CHAPTERS))
    if unknown:
        ap.error(f"unknown chapter(s) {unknown}; known: {list(CHAPTERS)}")
    if a.make_book:
        text = table(make_book_records(Path(a.cache)), head="in the last `make book`")
    else:
        data = measure(list(a.chapters) or list(CHAPTERS), a.in_place) if a.measure else json.loads(RESULTS.read_text())
        rows = {k: data["chapters"][k] for k in CHAPTERS if k in data["chapters"]}
        text = table({k: v["seconds"] for k, v in rows.items()},
                     {k: "; ".join(filter(None, (f"{v['date'][:10]}, {v['commit']}", v.get("note")))) for k, v in rows.items()})
    print(text)
    if a.write:
        s = TABLES.read_text()
        if START not in s or END not in s:
            sys.exit(f"{TABLES} has no {START} ... {END} block")
        head, rest = s.split(START, 1)
        TABLES.write_text(head + START + "\n" + text + "\n" + END + rest.split(END, 1)[1])


if __name__ == "__main__":
    main()
