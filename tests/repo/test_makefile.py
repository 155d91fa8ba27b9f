"""The Makefile refuses a Python it does not support, and ``make test`` says loudly when Chromium is missing
(issue 58: it fell back to any ``python3``, and the render test skipped silently).

Each test runs the repository's Makefile with ``make -f`` from a scratch directory holding stand-ins for
``requirements/ci.txt`` and ``pyproject.toml``, so nothing is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="no make on PATH")


def _scratch(tmp_path: Path) -> Path:
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "ci.txt").write_text("")
    (tmp_path / "pyproject.toml").write_text("")
    return tmp_path


def _make(tmp_path: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=path if path is not None else os.environ["PATH"])
    return subprocess.run([MAKE, "-f", str(ROOT / "Makefile"), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("version", ["3.9", "3.12"])
def test_install_refuses_another_python(tmp_path, version):
    _scratch(tmp_path)
    fake = tmp_path / "python-fake"
    fake.write_text(f"#!/bin/sh\necho {version}\n")  # answers the Makefile's version question
    fake.chmod(0o755)
    p = _make(tmp_path, "install", f"PYTHON={fake}")
    assert p.returncode != 0
    assert f"grpo_lab needs Python 3.11 (requirements/ci.txt pins its packages for it); found Python {version} at " \
           f"{fake}" in p.stderr, p.stderr
    assert not (tmp_path / ".venv").exists()  # refused before a venv was made


def test_install_without_python311_says_so(tmp_path):
    _scratch(tmp_path)
    p = _make(tmp_path, "install", "PYTHON=")
    assert p.returncode != 0 and "found no python3.11 on PATH" in p.stderr, p.stderr


def test_make_test_reports_a_missing_chromium_loudly(tmp_path):
    # a PATH with the tools the recipe needs and neither chromium, chromedriver nor apt-get
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sh", "id"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    p = _make(tmp_path, "chromium", path=str(bin_dir))
    assert p.returncode == 0
    assert "chromium and/or chromedriver are not on PATH" in p.stderr and "will be SKIPPED" in p.stderr, p.stderr
    assert "apt-get install chromium chromium-driver" in p.stderr


def test_make_test_runs_the_chromium_check_first():
    text = (ROOT / "Makefile").read_text()
    assert "\ntest: install chromium unit " in text
    assert "-rs" in next(line for line in text.splitlines() if "pytest tests" in line)  # skip reasons listed
