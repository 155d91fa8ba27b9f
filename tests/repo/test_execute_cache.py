"""scripts/execute_cache.py (`make book` executes the chapters with it, two at a time, into the jupyter-cache
the build reads): what it stores, what it skips, and how it reports a cell error and a dead kernel without
losing the other notebooks' work."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "execute_cache.py"


def _notebook(path: Path, source: str) -> str:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return str(path)


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_execute_cache_stores_what_ran_and_names_what_failed(tmp_path):
    from jupyter_cache import get_cache

    ok = _notebook(tmp_path / "ok.ipynb", "import os\nprint(os.environ.get('GRPO_LAB_CHAPTERS_AT_ONCE'))")
    bad = _notebook(tmp_path / "bad.ipynb", "1 / 0")
    dies = _notebook(tmp_path / "dies.ipynb", "import os\nos._exit(1)")  # the kernel dies: not a cell error
    cache = tmp_path / "cache"
    first = _run("--jobs", 2, "--cache", cache, ok, bad, dies)
    assert first.returncode == 1, first.stderr
    assert f"{ok}: executed in" in first.stdout and "up to 2 at a time" in first.stdout
    assert f"{bad}: FAILED" in first.stdout and f"{dies}: FAILED" in first.stdout
    assert "ZeroDivisionError" in first.stderr and "DeadKernelError" in first.stderr
    assert "\x1b[" not in first.stderr  # no terminal colour codes in the report
    assert first.stderr.rstrip().endswith("(not cached; the others are)")
    records = get_cache(str(cache)).list_cache_records()
    assert [Path(r.uri).name for r in records] == ["ok.ipynb"]
    stored = get_cache(str(cache)).get_cache_bundle(records[0].pk).nb
    assert stored.cells[0].outputs[0]["text"].strip() == "2"  # the kernel was told two ran at a time
    # a second call skips the cached notebook and runs only what is left
    second = _run("--jobs", 2, "--cache", cache, ok, bad)
    assert f"{ok}: in the cache" in second.stdout and f"{bad}: FAILED" in second.stdout


@pytest.mark.parametrize("args, message", [
    (["--jobs", "0", "book/scale_out.ipynb"], "--jobs must be >= 1, got 0"),
    (["book/no_such.ipynb"], "book/no_such.ipynb is not a readable notebook (FileNotFoundError"),
    (["book"], "book is not a readable notebook"),
    (["--config", "no_such.yml", "book/scale_out.ipynb"], "--config no_such.yml: no such file"),
])
def test_execute_cache_refuses_bad_arguments_before_any_work(tmp_path, args, message):
    out = _run("--cache", tmp_path / "cache", *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "cache").exists()
