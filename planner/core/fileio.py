"""Atomic file writes: a temp file in the same folder, fsync, then rename.

An interrupted run (Ctrl-C, a crash) leaves either the old file or the new one, never a
half-written one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "atomic_write_text"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``.

    The caller writes the temporary path however it likes (``DataFrame.to_csv``,
    ``Figure.savefig``). On any exception, including ``KeyboardInterrupt``, the temporary
    file is removed and ``path`` is left as it was.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".tmp" + target.suffix, dir=target.parent
    )
    os.close(handle)
    temp_path = Path(temp_name)
    try:
        yield temp_path
        with open(temp_path, "rb") as written:
            os.fsync(written.fileno())
        # mkstemp makes the file private (0600); give it the mode a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temp_path, 0o666 & ~umask)
        os.replace(temp_path, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp_path.unlink()
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    with atomic_path(path) as temp_path:
        temp_path.write_text(text, encoding="utf-8")
