"""Taking a directory in as a guard point and giving it back: `adopt` moves what the
path holds to the backing directory, `initial_protection` encrypts it there in place,
`release` puts the backing directory back at the path once unprotected and deleted."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path

from agents.cryptfile import KeyVersion, encrypt_file
from agents.errors import AgentError
from agents.guardpoint.protect import plan
from agents.guardpoint.shield import mounts_at


class ProtectionRefused(AgentError):
    """The directory cannot be protected as it is; the message says what to do."""


def initial_protection(mount: str, backing: str, key: KeyVersion, *, chunk_size: int,
                       progress: Callable[[int, int], None] | None = None) -> int:
    """Make `mount` ready to be mounted over, protecting the plaintext it already holds.

    A non-empty protected directory is moved to the backing path (one rename, on the same
    file system) and an empty one put in its place, then every plaintext file in the
    backing directory is encrypted in place (agents.guardpoint.protect: write-new, fsync,
    rename). Each step can be interrupted and is simply run again at the next start:
    files already encrypted are skipped. Nothing is ever deleted. Returns the number of
    files encrypted."""
    adopt(mount, backing)
    todo = plan(Path(backing), key.key_id, protect=True)
    for done, path in enumerate(todo.files, start=1):
        encrypt_file(path, path, key, chunk_size=chunk_size)
        if progress is not None:
            progress(done, len(todo.files))
    return len(todo.files)


def adopt(mount: str, backing: str) -> None:
    """Move what `mount` holds to the backing directory (one rename on the same file
    system) and leave an empty directory with its owner and mode in its place; make the
    backing directory the agent's alone. Nothing is encrypted here."""
    os.makedirs(mount, exist_ok=True)
    os.makedirs(os.path.dirname(backing), exist_ok=True)
    if os.listdir(mount):
        if os.path.exists(backing) and os.listdir(backing):
            raise ProtectionRefused(f"both {mount} and its backing directory {backing} hold files: move the "
                                    f"files of {mount} out, or empty {backing}, then the agent mounts it")
        if os.stat(mount).st_dev != os.stat(os.path.dirname(backing) or "/").st_dev:
            raise ProtectionRefused(f"{mount} holds files and {backing} is on another file system: encrypt them "
                                    f"into it with `kms-agent encrypt`, or choose a backing_path beside {mount}")
        st = os.stat(mount)
        if os.path.exists(backing):
            os.rmdir(backing)  # empty, checked above
        os.rename(mount, backing)
        os.mkdir(mount, stat.S_IMODE(st.st_mode))
        os.chown(mount, st.st_uid, st.st_gid)
        _fsync_dirs(os.path.dirname(mount), os.path.dirname(backing))
    os.makedirs(backing, mode=0o700, exist_ok=True)
    os.chmod(backing, 0o700)  # ciphertext and names: the agent's alone


def release(mount: str, backing: str, key_id: uuid.UUID) -> bool:
    """The reverse of adopt() once a guard point is unprotected and deleted: when no file
    of its key is left encrypted and the (unmounted) path is an empty directory, the
    backing directory takes the path's place, with the path's owner and mode. Returns
    False, changing nothing, when any condition fails."""
    # From the mount table: os.path.ismount cannot stat a mount whose process died.
    if mounts_at(mount) or not os.path.isdir(backing) or plan(Path(backing), key_id, protect=False).files:
        return False
    if os.path.exists(mount):
        if not os.path.isdir(mount) or os.listdir(mount):
            return False
        if os.stat(mount).st_dev != os.stat(backing).st_dev:
            return False
        st = os.stat(mount)
        os.chmod(backing, stat.S_IMODE(st.st_mode))
        os.chown(backing, st.st_uid, st.st_gid)
        os.rmdir(mount)
    os.rename(backing, mount)
    _fsync_dirs(os.path.dirname(mount), os.path.dirname(backing))
    return True


def _fsync_dirs(*dirs: str) -> None:
    for d in set(dirs):  # a rename, durably
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
