"""Where the package's data lives (the base checkpoints and the task test sets), and how files are written
whole (:func:`write_text_atomically`).

Three places, first match wins (:func:`data_dir`):

1. ``$GRPO_LAB_DATA``, if set: a directory holding ``checkpoints/`` and ``tasks/`` (for example the
   ``data/`` folder of a clone, or a copy of it);
2. a source checkout's ``<repo>/data`` when the package is imported from the repository (an editable
   install, ``make``, the book): ``grpo_lab/`` has ``pyproject.toml`` next to it. ``make pretrain``
   writes the checkpoints there;
3. the copy shipped inside an installed package (``pip install .`` or a wheel):
   ``<site-packages>/grpo_lab/_data``, the same checkpoints and task sets (about 4 MB).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV_VAR", "REPO_ROOT", "PACKAGE_DATA", "data_dir", "data_source", "checkpoint_dir",
           "shipped_checkpoints", "missing_data_hint", "write_text_atomically"]

#: The environment variable that overrides the data directory.
ENV_VAR = "GRPO_LAB_DATA"

#: The directory above the package — the repository root in a source checkout, ``site-packages``
#: in an installed one.
REPO_ROOT = Path(__file__).resolve().parents[1]

#: Where a wheel (non-editable install) carries the data — ``data/checkpoints`` and ``data/tasks``
#: are packaged as ``grpo_lab/_data`` (``[tool.setuptools]`` in ``pyproject.toml``).
PACKAGE_DATA = Path(__file__).resolve().parent / "_data"


def data_source() -> tuple[Path, str]:
    """The data directory and the rule that chose it.

    Returns:
        ``(path, rule)`` with ``rule`` one of ``"$GRPO_LAB_DATA"``, ``"source checkout"``,
        ``"installed package"``, or ``"none found"`` (no rule applies: an installed package built
        without its data; ``path`` is then :data:`PACKAGE_DATA`, which does not exist). Raises nothing.
    """
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser(), f"${ENV_VAR}"
    if (REPO_ROOT / "pyproject.toml").is_file():
        return REPO_ROOT / "data", "source checkout"
    if PACKAGE_DATA.is_dir():
        return PACKAGE_DATA, "installed package"
    return PACKAGE_DATA, "none found"


def data_dir() -> Path:
    """The data directory (see the module docstring for the order of the three rules).

    Returns:
        ``Path``: ``$GRPO_LAB_DATA`` if set, else ``<repo>/data`` in a source checkout, else the
        package's ``_data``. It need not exist (``make pretrain`` creates it); lookups that need a
        file say so with :func:`missing_data_hint`. Raises nothing.
    """
    return data_source()[0]


def checkpoint_dir(name: str) -> Path:
    """``<data_dir>/checkpoints/<name>`` (e.g. ``arithmetic-base``); it need not exist. Raises nothing."""
    return data_dir() / "checkpoints" / name


def shipped_checkpoints() -> list[str]:
    """Sorted names of the checkpoints in ``<data_dir>/checkpoints`` (directories with a
    ``config.json``); empty when there are none. Raises nothing."""
    root = data_dir() / "checkpoints"
    try:
        return sorted(p.name for p in root.iterdir() if (p / "config.json").is_file())
    except OSError:
        return []


def missing_data_hint() -> str:
    """One sentence for errors about data that was not found: where grpo_lab looked, why there,
    and that ``GRPO_LAB_DATA`` must name the directory holding ``checkpoints/`` and ``tasks/``.
    Raises nothing."""
    path, rule = data_source()
    where = f"{path} ({rule})" if rule != "none found" else \
        f"{path}, which does not exist (this install carries no data and is not a source checkout)"
    return (f"grpo_lab looked for its data in {where}; set {ENV_VAR} to the directory that holds "
            f"checkpoints/ and tasks/ (the data/ folder of a clone of the grpo_lab repository)")


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a sibling temporary file renamed over it (``os.replace``).

    A process killed mid-write (a SIGKILL, a lost machine) leaves the previous file whole, or no file,
    never a truncated one; a reader sees the old text or the new. The parent directory is created.

    Args:
        path: the file to write.
        text: its whole new content (UTF-8).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: the directory cannot be created or the file written (the temporary file is removed).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
