"""The Colab set-up cell: its clone URL is _config.yml's, it installs the extras the chapters need pinned as CI
pins them, and it works in a simulated Colab kernel (a fresh virtual environment on CPU).

The simulation (``test_colab_cell_in_a_fresh_venv``, marked slow, about 1-2 min): a fresh ``python -m venv`` of
the interpreter the tests run under (CI's 3.11; Colab's is 3.12, whose torch wheel this machine's registries do
not serve); Colab's preinstalled compiled packages (scripts/colab_setup.COLAB_KEEPS: torch, numpy, pandas, ...)
stood in by CI's copies (a ``.pth`` naming a folder of links to them, with their dependencies); a stub
``google.colab`` module; a clone of this repository's HEAD from a local path through ``$GRPO_LAB_REPO_URL``
into ``$GRPO_LAB_COLAB_ROOT``. Then the chapter's cells up to its first import cell run, and a GSM8K scoring
(math-verify) and dataset load (datasets) that the old cell's install did not provide.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import colab_cell  # noqa: E402
import colab_setup  # noqa: E402


def _ipynb_first_code(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "".join(next(c for c in cells if c["cell_type"] == "code")["source"]).rstrip("\n")


@pytest.mark.parametrize("path", sorted((ROOT / "book" / "_py").glob("*.py")) + sorted((ROOT / "book").glob("*.ipynb")),
                         ids=lambda p: p.name)
def test_colab_cell_clones_the_configured_repository(path: Path):
    url = colab_cell.repository_url()
    source = colab_cell.colab_cell_of(path.read_text(encoding="utf-8")) if path.suffix == ".py" \
        else _ipynb_first_code(path)
    assert source is not None, f"{path.name}: no Colab set-up cell"
    urls = re.findall(r"""["'](https?://[^"']+|git@[^"']+)["']""", source)
    assert urls == [url], f"{path.name}: the Colab cell clones {urls}, _config.yml's repository.url is {url!r}"
    assert source == colab_cell.render(url), (f"{path.name}: the Colab cell is not scripts/colab_cell.py's; run "
                                              "`python scripts/colab_cell.py` (then sync the notebooks)")


def test_colab_constraints_pin_the_extras_and_keep_colabs_compiled_packages():
    text = "# a comment\ntorch==2.13.0\nmath-verify==0.9.0\nNumPy==2.4.6\ndatasets==5.2.0  # why\npandas==3.1.1\n\n"
    assert colab_setup.colab_constraints(text) == "math-verify==0.9.0\ndatasets==5.2.0\n"
    pins = colab_setup.colab_constraints((ROOT / "requirements" / "ci.txt").read_text(encoding="utf-8"))
    names = {colab_setup._name(ln) for ln in pins.splitlines()}
    assert {"math-verify", "datasets", "peft", "transformers"} <= names
    assert not names & colab_setup.COLAB_KEEPS


def _closure(names) -> set[str]:
    """The installed distributions ``names`` need (their requirements, transitively, markers ignored)."""
    seen, todo = set(), [n for n in names]
    while todo:
        n = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if n in seen:
            continue
        try:
            dist = md.distribution(n)
        except md.PackageNotFoundError:
            continue
        seen.add(n)
        for req in dist.requires or ():
            if "extra ==" not in req:
                todo.append(re.split(r"[<>=!~;\[ (]", req, 1)[0])
    return seen


def _preinstall(target: Path, names) -> None:
    """Links to the installed files of ``names`` (top-level entries and dist-info) in ``target``."""
    target.mkdir()
    for n in _closure(names):
        dist = md.distribution(n)
        tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in tops:
            src = Path(dist.locate_file(top))
            if src.exists() and not (target / top).exists() and top != "__pycache__" and not top.endswith(".pth"):
                (target / top).symlink_to(src)


_KERNEL = r'''
import os, sys, json
sys.path.insert(0, os.environ["COLAB_STUB"])
import google.colab  # the stub: Colab's kernel has imported it before the first cell
cells = json.loads(sys.argv[1])
for i, src in enumerate(cells):
    exec(compile(src, f"<cell {i}>", "exec"), globals())
import grpo_lab, math_verify, datasets, peft
assert grpo_lab.__file__.startswith(os.environ["GRPO_LAB_COLAB_ROOT"]), grpo_lab.__file__
from grpo_lab.tasks import gsm8k
row = gsm8k.load_fixture()[0]
gold = gsm8k.split_gold(row["answer"])[1]
assert gsm8k.score(f"So the answer is \\boxed{{{gold}}}.", gold) == 1.0
assert gsm8k.score("The answer is \\boxed{-12345}.", gold) == 0.0
print("COLAB-OK", sys.version.split()[0], grpo_lab.__file__, math_verify.__name__, datasets.__version__)
'''


@pytest.mark.slow
def test_colab_cell_in_a_fresh_venv(tmp_path: Path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    venv = tmp_path / "venv"
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    keep = [n for n in colab_setup.COLAB_KEEPS if _closure([n])]
    _preinstall(tmp_path / "colab-dist-packages", keep)
    (site / "colab_preinstalled.pth").write_text(str(tmp_path / "colab-dist-packages") + "\n")
    text = (ROOT / "book" / "_py" / "01_grpo.py").read_text(encoding="utf-8")
    cells = [c.split("\n", 1)[1] for c in re.split(r"^(?=# %%)", text, flags=re.M)[1:]
             if not c.startswith("# %% [markdown]")][:2]  # the Colab cell and the parameters cell
    stub = tmp_path / "stub" / "google" / "colab"
    stub.mkdir(parents=True)
    (stub.parent / "__init__.py").write_text("")
    (stub / "__init__.py").write_text('"""A stand-in for Colab\'s google.colab (only its presence matters)."""\n')
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))},
           "GRPO_LAB_REPO_URL": str(ROOT), "GRPO_LAB_COLAB_ROOT": str(tmp_path / "content" / "grpo_lab"),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "COLAB_STUB": str(tmp_path / "stub")}
    out = subprocess.run([str(py), "-c", _KERNEL, json.dumps(cells)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=170)
    assert out.returncode == 0 and "COLAB-OK" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
