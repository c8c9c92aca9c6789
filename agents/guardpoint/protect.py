"""Initial protection of a directory that already holds plaintext, and its reverse.

Each regular file is transformed on its own with write-new + fsync + rename, so the
work can be interrupted at any moment and simply run again: files already in the wanted
state are recognised and skipped, and temporary files of an interrupted run are
removed. Symbolic links, directories and special files are left as they are.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agents.cryptfile import FormatError, Keyring, KeyVersion, decrypt_file, encrypt_file, read_header
from agents.cryptfile.transform import TMP_PREFIX


@dataclass
class Plan:
    files: list[Path]
    bytes: int
    skipped: int


def _regular_files(root: Path) -> Iterator[Path]:
    for dirpath, _, names in os.walk(root):
        for name in sorted(names):
            p = Path(dirpath) / name
            if name.startswith(TMP_PREFIX):
                p.unlink(missing_ok=True)  # left by an interrupted run
                continue
            if p.is_file() and not p.is_symlink():
                yield p


def encrypted_under(path: Path, key_id: uuid.UUID) -> bool:
    """True when `path` is a v1 file of this guard point's key (any version). A
    plaintext file that merely starts with the magic fails the header checks."""
    try:
        return read_header(str(path)).key_id == key_id
    except FormatError:
        return False


def plan(root: Path, key_id: uuid.UUID, *, protect: bool) -> Plan:
    todo, skipped, total = [], 0, 0
    for p in _regular_files(root):
        if encrypted_under(p, key_id) == protect:
            skipped += 1
            continue
        todo.append(p)
        total += p.stat().st_size
    return Plan(todo, total, skipped)


def protect(root: Path, key: KeyVersion, *, chunk_size: int = 4096,
            progress: Callable[[int], None] | None = None) -> Plan:
    """Encrypt every plaintext file under `root` in place (resumable)."""
    work = plan(root, key.key_id, protect=True)
    for p in work.files:
        encrypt_file(p, p, key, chunk_size=chunk_size, progress=progress)
    return work


def unprotect(root: Path, key_id: uuid.UUID, keyring: Keyring, *,
              progress: Callable[[int], None] | None = None) -> Plan:
    """Decrypt every file of `key_id` under `root` in place (resumable)."""
    work = plan(root, key_id, protect=False)
    for p in work.files:
        decrypt_file(p, p, keyring, progress=progress)
    return work
