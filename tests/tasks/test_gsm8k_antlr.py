"""The scorer's ANTLR runtime check (grpo_lab.tasks.gsm8k.check_antlr_runtime): its pin is requirements/ci.txt's, and
another installed runtime is named once per process in a ScorerVersionWarning."""

import re
import warnings
from importlib import metadata
from pathlib import Path

import pytest

from grpo_lab.tasks import gsm8k

ROOT = Path(__file__).resolve().parents[2]


def test_the_pin_is_the_one_ci_installs():
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements" / "ci.txt").read_text(), re.M))
    assert pins["antlr4-python3-runtime"] == gsm8k.SCORER_ANTLR_VERSION


def _version_is(monkeypatch, version):
    real = metadata.version

    def fake(name):
        if name == "antlr4-python3-runtime":
            if version is None:
                raise metadata.PackageNotFoundError(name)
            return version
        return real(name)

    monkeypatch.setattr(gsm8k.metadata, "version", fake)
    gsm8k.check_antlr_runtime.cache_clear()


def test_another_runtime_warns_once_naming_both(monkeypatch):
    _version_is(monkeypatch, "4.9.3")
    try:
        with pytest.warns(gsm8k.ScorerVersionWarning, match=r"4\.9\.3 is installed.*checked with 4\.13\.2"):
            assert gsm8k.check_antlr_runtime() == "4.9.3"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert gsm8k.check_antlr_runtime() == "4.9.3"  # once per process
    finally:
        gsm8k.check_antlr_runtime.cache_clear()


@pytest.mark.parametrize("version", [gsm8k.SCORER_ANTLR_VERSION, None])
def test_the_pinned_runtime_or_none_is_silent(monkeypatch, version):
    _version_is(monkeypatch, version)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert gsm8k.check_antlr_runtime() == version
    finally:
        gsm8k.check_antlr_runtime.cache_clear()
