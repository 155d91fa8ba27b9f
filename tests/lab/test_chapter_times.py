"""scripts/chapter_times.py: its table in benchmarks/README.md is the committed results file's, and --write
rewrites only the block between the markers."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "chapter_times.py"


@pytest.fixture
def chapter_times():
    spec = importlib.util.spec_from_file_location("chapter_times_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _block(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


def test_benchmarks_readme_shows_the_committed_times(chapter_times, capsys):
    chapter_times.main([])  # prints the table from benchmarks/results/chapter_times.json
    printed = capsys.readouterr().out
    committed = _block(chapter_times.TABLES.read_text(), chapter_times.START, chapter_times.END)
    assert chapter_times.TABLES == SCRIPT.parents[1] / "benchmarks" / "README.md"
    assert committed.strip() == printed.strip(), "run `python scripts/chapter_times.py --write`"


def test_write_replaces_only_the_block(chapter_times, tmp_path, monkeypatch, capsys):
    start, end = chapter_times.START, chapter_times.END
    target = tmp_path / "README.md"
    target.write_text(f"intro\n{start}\nstale table\n{end}\noutro\n")
    monkeypatch.setattr(chapter_times, "TABLES", target)
    chapter_times.main(["--write"])
    text = target.read_text()
    assert text.startswith(f"intro\n{start}\n| chapter |") and text.endswith(f"{end}\noutro\n")
    assert "stale table" not in text and "`01_grpo`" in text
    target.write_text("no markers\n")
    with pytest.raises(SystemExit, match="chapter-times:start"):
        chapter_times.main(["--write"])
