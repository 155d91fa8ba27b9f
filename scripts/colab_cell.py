"""Write every chapter's Colab set-up cell (the first code cell of ``book/_py/*.py``) from ``_config.yml``.

``_config.yml``'s ``repository.url`` is the single place where the repository is configured; the cell's clone
URL is generated from it here. ``python scripts/colab_cell.py`` rewrites the cell in every ``book/_py/*.py``
(then sync the notebooks: ``make sync``); ``--check`` only reports the files whose cell differs (exit 1).
tests/repo/test_colab_cell.py checks every ``.py`` and ``.ipynb`` against :func:`render`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

__all__ = ["ROOT", "repository_url", "render", "colab_cell_of", "rewrite", "main"]

ROOT = Path(__file__).resolve().parents[1]

_TEMPLATE = '''\
# Colab set-up, written by scripts/colab_cell.py from _config.yml's repository.url (edit there, then run it):
# clone the repository (the chapters need its data/ folder) and install the package with the extras the
# chapters need, pinned as CI pins them (scripts/colab_setup.py). $GRPO_LAB_REPO_URL overrides the URL (a fork,
# a local path), $GRPO_LAB_COLAB_ROOT the folder of the clone.
import os
import subprocess
import sys

if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    _root = os.environ.get("GRPO_LAB_COLAB_ROOT", "/content/grpo_lab")
    if not os.path.isdir(_root):
        _url = os.environ.get("GRPO_LAB_REPO_URL", "{url}")
        subprocess.run(["git", "clone", "-q", "--depth", "1", _url, _root], check=True)
    subprocess.run([sys.executable, os.path.join(_root, "scripts", "colab_setup.py"), _root], check=True)
    sys.path.insert(0, _root)
'''

_CELL = re.compile(r'(# %% tags=\["remove-cell"\]\n)(# Colab set-up.*?)(?=\n# %%)', re.S)


def repository_url(config: Path = ROOT / "_config.yml") -> str:
    """``repository.url`` of ``config`` (YAML anchors resolved). Raises ValueError: absent or not a string."""
    url = (yaml.safe_load(config.read_text(encoding="utf-8")).get("repository") or {}).get("url")
    if not isinstance(url, str) or not url:
        raise ValueError(f"{config}: repository.url must be a non-empty string, got {url!r}")
    return url


def render(url: str) -> str:
    """The Colab set-up cell's source (no trailing newline) cloning ``url``."""
    return _TEMPLATE.replace("{url}", url).rstrip("\n")


def colab_cell_of(text: str) -> str | None:
    """The Colab set-up cell's source in a jupytext percent file's ``text`` (``None``: no such cell)."""
    m = _CELL.search(text)
    return m.group(2).rstrip("\n") if m else None


def rewrite(text: str, url: str) -> str:
    """``text`` with its Colab set-up cell replaced by :func:`render` ``(url)``. Raises ValueError: no such cell."""
    if not _CELL.search(text):
        raise ValueError("no '# %% tags=[\"remove-cell\"]' cell starting with '# Colab set-up'")
    return _CELL.sub(lambda m: m.group(1) + render(url) + "\n", text, count=1)


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or with ``--check`` compare) every ``book/_py/*.py``; exit status 1 when ``--check`` finds a
    stale cell."""
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    url, stale = repository_url(), []
    for path in sorted((ROOT / "book" / "_py").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        new = rewrite(text, url)
        if new != text:
            stale.append(path.name)
            if not check:
                path.write_text(new, encoding="utf-8")
    print(("stale: " if check else "rewritten: ") + (", ".join(stale) or "none"))
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
