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

