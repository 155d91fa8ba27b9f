"""An install that keeps its promises: the data found after a non-editable install, a clear error
naming GRPO_LAB_DATA when it is not, and declared lower bounds that were tried
(``scripts/check_min_versions.sh`` installs ``requirements/min.txt`` and runs unit tests on it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import grpo_lab.paths as paths
from grpo_lab.policy.models import load_policy

tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SHIPPED = ["arithmetic-base", "arithmetic-filler-base", "arithmetic-long-base", "arithmetic-moe-base", "calculator-base", "corpus-base",
           "corpus-proxy-base", "dialogue-rm", "long-chain-base", "reverse-base"]


def _floors() -> dict[str, Version]:
    """``{name: lower bound}`` of every runtime dependency in pyproject.toml (each has one ``>=``)."""
    out = {}
    for line in PYPROJECT["project"]["dependencies"]:
        req = Requirement(line)
        lows = [Version(s.version) for s in req.specifier if s.operator == ">="]
        assert len(lows) == 1, f"{line!r}: expected exactly one '>=' lower bound"
        out[req.name.lower()] = lows[0]
    return out


def _pins(path: Path) -> dict[str, Version]:
    """``{name: version}`` of the ``name==version`` lines of a requirements file (comments and
    option lines skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"{path.name}: {line!r} is not an exact pin"
        out[req.name.lower().replace("_", "-")] = Version(spec.version)
    return out


def _installed_layout(monkeypatch, tmp_path, *, with_data: bool) -> Path:
    """Make grpo_lab.paths see the layout of ``pip install .``: the package in site-packages (no
    pyproject.toml next to it), its data copied to ``grpo_lab/_data`` if ``with_data``."""
    site = tmp_path / "site-packages"
    pkg_data = site / "grpo_lab" / "_data"
    if with_data:
        shutil.copytree(ROOT / "data" / "checkpoints" / "arithmetic-base", pkg_data / "checkpoints" / "arithmetic-base")
    else:
        site.mkdir(parents=True)
    monkeypatch.delenv("GRPO_LAB_DATA", raising=False)
    monkeypatch.setattr(paths, "REPO_ROOT", site)
    monkeypatch.setattr(paths, "PACKAGE_DATA", pkg_data)
    return pkg_data


# ------------------------------------------------------------------------------- data lookup rules
def test_installed_layout_reads_the_data_shipped_in_the_package(monkeypatch, tmp_path):
    # found by a fresh user: after `pip install .`, data was looked up in site-packages/data
    pkg_data = _installed_layout(monkeypatch, tmp_path, with_data=True)
    assert paths.data_source() == (pkg_data, "installed package")
    assert paths.checkpoint_dir("arithmetic-base") == pkg_data / "checkpoints" / "arithmetic-base"
    assert paths.shipped_checkpoints() == ["arithmetic-base"]
    model, tok = load_policy("arithmetic-base", progress=False)
    assert Path(model.config.name_or_path) == pkg_data / "checkpoints" / "arithmetic-base"
    assert model.config.model_type == "qwen2" and len(tok) == model.config.vocab_size


def test_source_checkout_and_env_var_take_precedence(monkeypatch, tmp_path):
    # the checkout's data/ (editable installs, the book, `make pretrain`) wins over a packaged copy,
    # and $GRPO_LAB_DATA over both, even when it does not exist yet (pretrain creates it)
    pkg_data = _installed_layout(monkeypatch, tmp_path, with_data=True)
    (paths.REPO_ROOT / "pyproject.toml").write_text("")
    assert paths.data_source() == (paths.REPO_ROOT / "data", "source checkout")
    monkeypatch.setenv("GRPO_LAB_DATA", str(tmp_path / "elsewhere"))
    assert paths.data_source() == (tmp_path / "elsewhere", "$GRPO_LAB_DATA")
    assert paths.checkpoint_dir("x") == tmp_path / "elsewhere" / "checkpoints" / "x"
    assert pkg_data.is_dir()


def test_this_checkout_reads_its_own_data_dir():
    if os.environ.get("GRPO_LAB_DATA"):
        pytest.skip("GRPO_LAB_DATA is set")
    assert paths.data_source() == (ROOT / "data", "source checkout")
    assert paths.shipped_checkpoints() == SHIPPED


def test_missing_checkpoint_error_names_grpo_lab_data(monkeypatch, tmp_path):
    # before: "'arithmetic-base' is neither an existing directory nor a hub id", no word of the data
    monkeypatch.setenv("GRPO_LAB_DATA", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="GRPO_LAB_DATA") as err:
        load_policy("arithmetic-base")
    msg = str(err.value)
    assert str(tmp_path / "empty") in msg and "$GRPO_LAB_DATA" in msg   # where it looked, and why there
    assert "checkpoints/" in msg and "shipped: none found" in msg


def test_missing_data_in_an_installed_layout_says_what_to_set(monkeypatch, tmp_path):
    pkg_data = _installed_layout(monkeypatch, tmp_path, with_data=False)
    assert paths.data_source() == (pkg_data, "none found")
    with pytest.raises(FileNotFoundError, match="set GRPO_LAB_DATA to the directory that holds checkpoints/"):
        load_policy("arithmetic-base")
    _installed_layout(monkeypatch, tmp_path / "b", with_data=True)
    with pytest.raises(FileNotFoundError, match=r"shipped: arithmetic-base\).*GRPO_LAB_DATA"):
        load_policy("arithmetic-bsae")          # a typo lists what there is


def test_other_load_policy_errors_are_unchanged(tmp_path):
    with pytest.raises(ValueError, match="hub id"):
        load_policy("not a hub id!!")           # not a name a checkpoint could have
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_policy("./no/such/checkpoint")


# ------------------------------------------------------------------------------------- the wheel
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel that `pip install .` builds, from a copy of the files it needs (the checkout stays
    clean: setuptools writes build/ and *.egg-info next to pyproject.toml)."""
    build_meta = pytest.importorskip("setuptools.build_meta")
    del build_meta
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "grpo_lab", src / "grpo_lab", ignore=shutil.ignore_patterns("__pycache__"))
    for sub in ("checkpoints", "tasks"):
        shutil.copytree(ROOT / "data" / sub, src / "data" / sub)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_wheel({str(out)!r})"],
                   cwd=src, check=True, capture_output=True, text=True, timeout=300)
    (whl,) = out.glob("grpo_lab-*.whl")
    return whl


def test_wheel_carries_every_module_and_the_shipped_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "grpo_lab").rglob("*.py") if "__pycache__" not in p.parts}
    assert modules and modules <= names, f"modules missing from the wheel: {sorted(modules - names)}"
    data = {f"grpo_lab/_data/{p.relative_to(ROOT / 'data').as_posix()}"
            for sub in ("checkpoints", "tasks") for p in (ROOT / "data" / sub).rglob("*") if p.is_file()}
    assert any(n.endswith("arithmetic-base/model.safetensors") for n in data)
    assert data <= names, f"data missing from the wheel: {sorted(data - names)}"
    assert not any(n.startswith(("tests/", "book/", "data/")) for n in names)


def test_wheel_installed_elsewhere_loads_its_checkpoint(wheel, tmp_path):
    # the wheel unpacked into a fresh directory, imported from an unrelated working directory
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    code = (f"import sys; sys.path.insert(0, {str(site)!r})\n"
            "import grpo_lab, grpo_lab.paths as p\n"
            "from grpo_lab.policy.models import load_policy\n"
            "from grpo_lab.tasks import ArithmeticTask\n"
            f"assert grpo_lab.__file__.startswith({str(site)!r}), grpo_lab.__file__\n"
            "m, t = load_policy('arithmetic-moe-base', progress=False)\n"
            "print(p.data_source()[1], '|', m.config.model_type, '|', p.shipped_checkpoints(), '|',"
            " ArithmeticTask().test_set_path().is_file())\n")
    env = {k: v for k, v in os.environ.items() if k != "GRPO_LAB_DATA"}
    out = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == f"installed package | qwen3_moe | {SHIPPED} | True"


# ------------------------------------------------------------------------------ declared versions
# Each floor below was found by trying (scripts/check_min_versions.sh and one-off venvs, 2026-11-30),
# not read off release notes: the version named is the first that passed.
NEEDED = {
    # issue 15: 4.46.3 and 4.48.3 ignore `logits_to_keep` ("shape mismatch: ids (128, 26) but logits
    # (128, 37)"), 4.50.3 honours it
    "transformers": [("4.50", "logits_to_keep"), ("4.56", "from_pretrained(dtype=)"),
                     # 5.0: the MoE checkpoint's num_local_experts is not read; 5.1-5.5.4: Routing
                     # Replay is not bit for bit (tests/policy/test_moe.py); 5.6.0 passes
                     ("5.6.0", "Qwen3-MoE checkpoint and Routing Replay")],
    "torch": [("2.4", "transformers 5.6 disables torch below 2.4")],
    "tokenizers": [("0.22.1", "transformers 5.6 needs >=0.22; 0.22.0 needs huggingface-hub<1, 5.6 >=1.5")],
    "safetensors": [("0.4.3", "transformers 5.6 needs it")],
}


def test_declared_lower_bounds_are_at_least_what_was_found_to_work():
    floors = _floors()
    for name, needs in NEEDED.items():
        for version, why in needs:
            assert floors[name] >= Version(version), f"{name}>={floors[name]} is too low: {why} needs >={version}"


def test_requires_python_is_the_lowest_version_tried():
    # a guard, not a fix: Python 3.10.13 passed scripts/check_min_versions.sh (PYTHON=python3.10) with
    # requirements/min.txt, and CI runs 3.11; transformers 5.6.0 itself needs >= 3.10
    assert PYPROJECT["project"]["requires-python"] == ">=3.10"


def test_min_txt_pins_exactly_the_declared_lower_bounds():
    # requirements/min.txt is what check_min_versions.sh installs: it must test the declared floors
    floors, pins = _floors(), _pins(ROOT / "requirements" / "min.txt")
    assert pins == floors


def test_ci_pins_satisfy_the_declared_ranges():
    pins = _pins(ROOT / "requirements" / "ci.txt")
    for line in PYPROJECT["project"]["dependencies"]:
        req = Requirement(line)
        assert req.specifier.contains(pins[req.name.lower()]), f"ci.txt pins {req.name}=={pins[req.name.lower()]}"


def test_every_subpackage_is_in_the_explicit_package_list():
    # pyproject lists packages explicitly (data/ is mapped into the wheel as grpo_lab._data): a new
    # subpackage must be added there, or the wheel silently lacks it
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "grpo_lab").rglob("__init__.py")}
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {"grpo_lab._data": "data"}


def test_gitignore_covers_build_outputs():
    lines = (ROOT / ".gitignore").read_text().splitlines()
    assert {"/build/", "/dist/"} <= set(lines)
