"""Writing files so that a reader never sees half of one: :func:`write_text_atomically`."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_text_atomically"]


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
