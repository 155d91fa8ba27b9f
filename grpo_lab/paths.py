"""Where the repository's data lives (checkpoints, task sets, GPU results).

``GRPO_LAB_DATA`` overrides the default ``<repo>/data`` (useful when the package is installed
without the repository, e.g. on Colab after cloning elsewhere).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """The data directory: ``$GRPO_LAB_DATA`` if set, else ``<repo>/data``."""
    return Path(os.environ.get("GRPO_LAB_DATA", REPO_ROOT / "data"))


def checkpoint_dir(name: str) -> Path:
    """``data/checkpoints/<name>`` (e.g. ``arithmetic-base``)."""
    return data_dir() / "checkpoints" / name
