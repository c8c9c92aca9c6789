"""A free TCP port for a server that a rig or a test starts: the one way the tree picks one.

The usual trick, binding port 0 and closing the socket, hands the port to whoever asks
next: a server that binds it a second later (a `keyserver serve` child takes about two)
can find it taken by an outgoing connection, whose ports come from the same ephemeral
range, or by a second process that made the same trick in the same moment. One test at
a time that is rare; eight pytest workers and two stores at once make it a flake a run.

With `STRONGROOM_PORT_POOL` naming a file (tests/conftest.py sets it for the whole suite),
every process of the run takes ports in turn from one counter kept in that file under an
exclusive lock, in a range below the kernel's ephemeral one (so no outgoing connection is
given them), each probed on every address asked for before it is handed out. A port comes
round again only after the whole range has been handed out. Without it: port 0, as before.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterable
from pathlib import Path

POOL_ENV = "STRONGROOM_PORT_POOL"
# Below Linux's default ephemeral range (32768-60999) and above the well-known servers a
# test machine runs (PostgreSQL 5432, the README's 8800, HAProxy's stats ...).
FIRST, LAST = 12000, 32000


def _bindable(port: int, addresses: Iterable[str]) -> bool:
    for addr in addresses:
        with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as s:
            try:
                s.bind((addr, port))
            except OSError:
                return False
    return True


def free_port(*addresses: str) -> int:
    """A port free on every address given (127.0.0.1 when none)."""
    addrs = addresses or ("127.0.0.1",)
    pool = os.environ.get(POOL_ENV)
    if not pool:
        while True:
            with socket.socket() as s:
                s.bind((addrs[0], 0))
                port = int(s.getsockname()[1])
            if _bindable(port, addrs[1:]):
                return port
    path = Path(pool)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read().strip()
        port = int(text) if text.isdigit() and FIRST <= int(text) <= LAST else FIRST
        for _ in range(LAST - FIRST + 1):
            candidate = port
            port = FIRST if port >= LAST else port + 1
            if _bindable(candidate, addrs):
                f.seek(0)
                f.truncate()
                f.write(str(port))
                f.flush()
                return candidate
    raise RuntimeError(f"no free port in {FIRST}-{LAST} on {', '.join(addrs)}")
