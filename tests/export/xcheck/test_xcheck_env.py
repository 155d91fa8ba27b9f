"""`make xcheck` runs in an environment of its own and leaves .venv as it was (marker ``xcheck``; ``make xcheck``).

The Makefile records ``pip freeze --all`` of .venv (``$GRPO_LAB_XCHECK_BASE``) in ``$GRPO_LAB_XCHECK_FREEZE`` before
scripts/xcheck_env.sh builds .venv-xcheck; these tests, run by .venv-xcheck's interpreter after it, check that .venv's
packages are the same, its ANTLR runtime still the GSM8K scorer's, and this environment's the one omegaconf needs.
"""

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import _xcheck_common as X
from grpo_lab.tasks.gsm8k import SCORER_ANTLR_VERSION

pytestmark = pytest.mark.xcheck

BASE = os.environ.get("GRPO_LAB_XCHECK_BASE")
FREEZE = os.environ.get("GRPO_LAB_XCHECK_FREEZE")
if not (BASE and FREEZE):
    X.unavailable("run by make xcheck, which sets $GRPO_LAB_XCHECK_BASE and $GRPO_LAB_XCHECK_FREEZE")


def _base_python() -> Path:
    return Path(BASE) / "bin" / "python"


def test_runs_outside_the_base_environment():
    assert Path(sys.prefix).resolve() != Path(BASE).resolve(), f"xcheck runs in {sys.prefix}, the base environment"


def test_the_base_environments_packages_did_not_change():
    after = subprocess.run([str(_base_python()), "-m", "pip", "freeze", "--all"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    before = Path(FREEZE).read_text().splitlines()
    changed = sorted(set(before) ^ set(after))
    assert not changed, f"make xcheck changed {BASE}'s packages: {changed}"


def test_each_environment_has_its_antlr_runtime():
    base = subprocess.run([str(_base_python()), "-c", "from importlib import metadata; "
                           "print(metadata.version('antlr4-python3-runtime'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert base == SCORER_ANTLR_VERSION  # the GSM8K scorer's tables were checked with it
    assert metadata.version("antlr4-python3-runtime").startswith("4.9.")  # omegaconf 2.3's (verl's config)
