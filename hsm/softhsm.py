"""Pointing SoftHSM2 at a token directory of our own.

SoftHSM2 finds its tokens through the file named by SOFTHSM2_CONF, read once, in
C_Initialize. So the environment must be right before the module is initialised, and
one process can only ever serve one token directory (`hsm.module` enforces that).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Final

CONF_NAME: Final = "softhsm2.conf"
ENV_VAR: Final = "SOFTHSM2_CONF"


def render_conf(token_dir: Path) -> str:
    # reset_on_fork: a child process must not drive the parent's sessions through a
    # copied library state; with it, SoftHSM2 starts afresh after fork and the child
    # opens its own backend (hsm.module re-initialises on the first open after a fork).
    return (
        "# Written by strongroom hsm; regenerated on every start.\n"
        f"directories.tokendir = {token_dir}\n"
        "objectstore.backend = file\n"
        "log.level = ERROR\n"
        "slots.removable = false\n"
        "slots.mechanisms = ALL\n"
        "library.reset_on_fork = true\n"
    )


def prepare_token_dir(token_dir: Path) -> Path:
    """Create the token directory (0700) with its softhsm2.conf inside; return the conf path.

    The conf lives inside the directory it describes so that a data directory is
    self-contained; SoftHSM2 only treats subdirectories of the token dir as tokens, so
    the file does not confuse it.
    """
    token_dir = token_dir.expanduser().resolve()
    token_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # mkdir's mode is masked by umask and ignored for an existing directory.
    os.chmod(token_dir, 0o700)
    conf = token_dir / CONF_NAME
    wanted = render_conf(token_dir)
    try:
        current = conf.read_text(encoding="utf-8")
    except FileNotFoundError:
        current = None
    if current != wanted:
        # Atomic replace: another process may be starting against the same directory.
        fd, tmp = tempfile.mkstemp(prefix=".softhsm2.conf.", dir=token_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(wanted)
            os.chmod(tmp, 0o600)
            os.replace(tmp, conf)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return conf



# hsm.pkcs11.bootstrap serialises token creation on this file inside the token directory.
BOOTSTRAP_LOCK: Final = ".strongroom-bootstrap.lock"


def token_dir_from_conf(conf: Path) -> Path | None:
    """The token directory a softhsm2.conf names (`directories.tokendir`), if any."""
    try:
        text = conf.read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == "directories.tokendir":
            return Path(value.strip())
    return None


def _state(token_dir: Path) -> dict[str, tuple[int, int]]:
    """Every file under the token directory with its size and modification time."""
    out = {}
    for path in sorted(token_dir.rglob("*")):
        if path.is_file():
            st = path.stat()
            out[str(path.relative_to(token_dir))] = (st.st_size, st.st_mtime_ns)
    return out


def _skipped(relative: str) -> bool:
    # The conf names its own directory (regenerated wherever the copy lands); lock files
    # are empty and made on demand.
    return relative == CONF_NAME or relative.endswith(".lock")


def copy_token_dir(token_dir: Path, dest: Path, *, attempts: int = 5) -> list[str]:
    """Copy SoftHSM2's file store (every token under `token_dir`) into `dest`, consistent
    while a server uses it; returns the copied files, relative to `dest`.

    SoftHSM2 keeps one file per object, rewritten in place under a POSIX lock on the
    object's `.lock` file, plus `token.object` and `generation` per token. Each file is
    read under a shared lock on its `.lock` (as SoftHSM2's own readers do) so no write is
    seen half done, and the bootstrap lock is held so no token is being created. A
    server can still create or destroy an object between two files (a KEK rotation or
    retirement): the tree's sizes and modification times are compared before and after,
    and the copy is taken again if anything moved."""
    import fcntl
    import shutil

    token_dir = token_dir.expanduser().resolve()
    if not token_dir.is_dir():
        raise FileNotFoundError(f"SoftHSM2 token directory {token_dir} does not exist")
    with open(token_dir / BOOTSTRAP_LOCK, "a+b") as bootstrap:
        fcntl.flock(bootstrap, fcntl.LOCK_EX)
        try:
            for _ in range(attempts):
                before = _state(token_dir)
                if dest.exists():
                    shutil.rmtree(dest)
                dest.mkdir(mode=0o700, parents=True)
                copied = []
                for relative in before:
                    if _skipped(relative):
                        continue
                    src, out = token_dir / relative, dest / relative
                    out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    lock_path = src.with_suffix(".lock")
                    lock = open(lock_path, "rb") if lock_path.exists() else None  # noqa: SIM115 - held while copying
                    try:
                        if lock is not None:
                            fcntl.lockf(lock, fcntl.LOCK_SH)
                        shutil.copyfile(src, out)
                    except FileNotFoundError:
                        break  # destroyed meanwhile: the states differ, copy again
                    finally:
                        if lock is not None:
                            lock.close()  # releases the lock
                    os.chmod(out, 0o600)
                    copied.append(relative)
                if _state(token_dir) == before:
                    return copied
        finally:
            fcntl.flock(bootstrap, fcntl.LOCK_UN)
    raise RuntimeError(f"the token directory {token_dir} kept changing while it was copied ({attempts} tries): "
                       "wait until no KEK rotation or retirement runs, then back up again")
