"""Per-chapter execution times of the last `make book`, as the README's table.

    python scripts/chapter_times.py            # print the table
    python scripts/chapter_times.py --readme   # also rewrite the table in README.md

`make book` executes each chapter through jupyter-cache, which records the wall time of every
execution in `_build/.jupyter_cache`. This script reads those records (the newest one per
chapter) and prints one row per chapter with its time and the experiment scale it ran (seeds,
settings, steps, read from the chapter's twin in `book/_py/`). With `--readme` it replaces the
block between `<!-- chapter-times:start -->` and `<!-- chapter-times:end -->` in README.md.

A chapter whose runs were loaded from the run cache (`_build/run_cache`, see
`grpo_lab.experiments`) executes in seconds: time a `make clean book` for the table.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- chapter-times:start -->", "<!-- chapter-times:end -->"
BUDGET_S = 240  # DEVELOPERS: each chapter <= 4 min on 2 cores from an empty run cache


def records(cache_dir: Path) -> dict[str, float]:
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


def scale(stem: str) -> str:
    """The seeds of a chapter, read from its twin's ``SEEDS = (...)`` line."""
    twin = ROOT / "book" / "_py" / f"{stem}.py"
    m = re.search(r"^SEEDS = \(([^)]*)\)", twin.read_text(), re.M) if twin.exists() else None
    return f"{len([s for s in m.group(1).split(',') if s.strip()])} seeds" if m else ""


def table(times: dict[str, float]) -> str:
    lines = ["| chapter | seeds per setting | execution time |", "|---|---|---|"]
    for stem, sec in times.items():
        flag = " (over the 4-min budget)" if sec > BUDGET_S else ""
        lines.append(f"| `{stem}` | {scale(stem)} | {sec:.0f} s{flag} |")
    lines.append(f"| all chapters | | {sum(times.values()) / 60:.1f} min |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=str(ROOT / "_build" / ".jupyter_cache"),
                    help="the jupyter-cache directory `make book` wrote (default _build/.jupyter_cache)")
    ap.add_argument("--readme", action="store_true", help="rewrite the table in README.md")
    a = ap.parse_args(argv)
    text = table(records(Path(a.cache)))
    print(text)
    if a.readme:
        readme = ROOT / "README.md"
        s = readme.read_text()
        if START not in s or END not in s:
            sys.exit(f"README.md has no {START} ... {END} block")
        head, rest = s.split(START, 1)
        readme.write_text(head + START + "\n" + text + "\n" + END + rest.split(END, 1)[1])


if __name__ == "__main__":
    main()
