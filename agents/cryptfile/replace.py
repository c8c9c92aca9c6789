"""Atomic replacement of a file: the last step of every whole-file operation and of a
re-wrap or re-key of an open file.

A new file is written in the target's directory, fsynced, renamed over the target, and
the directory fsynced: an interruption at any moment leaves either the old file or the
new one, both complete, plus at most a stray `.srtmp-*` file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

TMP_PREFIX = ".srtmp-"


@contextlib.contextmanager
def atomic_replace(target: str | Path, *, mode: int | None = None) -> Iterator[BinaryIO]:
    """Yield a new file in the target's directory; on success it replaces the target
    durably (fsync file, rename, fsync directory); on failure it is removed."""
    target = Path(target)
    tmp = target.with_name(f"{TMP_PREFIX}{os.urandom(6).hex()}-{target.name}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                 0o600 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
        dfd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
