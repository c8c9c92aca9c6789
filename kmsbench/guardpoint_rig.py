"""The arms a guard-point benchmark measures side by side (docs/benchmarks.md): a guard
point (with or without transport options), gocryptfs, and what every suite shares:
its working directory, the page cache dropped, progress steps, the median and spread.
Needs root (FUSE, drop_caches)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.cryptfile import KeyVersion

BLOCK = 1 << 20


def _serve(backing: str, mnt: str, key: KeyVersion) -> None:
    """The guard point: the native data plane (strongroom-fuse) and its control plane,
    in a process of their own, as the agent runs them."""
    from agents.guardpoint.dataplane import serve

    serve(backing, mnt, [key], key, allow_other=True, journal=backing + ".journal")


def wait_mounted(path: Path, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not os.path.ismount(path):
        if not alive() or time.monotonic() > deadline:
            raise SystemExit(f"could not mount {path}")
        time.sleep(0.05)


@contextmanager
def guard_point(base: Path, *, name: str = "gp", transport: Transport | None = None,
                log: Path | None = None) -> Iterator[Path]:
    """A guard point at base/NAME over base/NAME-backing; with `transport`, started with
    those options and the daemon's stderr written to `log` (issue 26's arms)."""
    backing, mnt = base / f"{name}-backing", base / name
    backing.mkdir()
    mnt.mkdir()
    key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
    target: Callable[..., None] = _serve
    args: tuple[Any, ...] = (str(backing), str(mnt), key)
    if transport is not None:
        target, args = _serve_transport, (*args, transport, str(log or base / f"{name}.stderr"))
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args)
    proc.start()
    try:
        wait_mounted(mnt, proc.is_alive)
        yield mnt
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)
        proc.join(10)
        if proc.is_alive():  # busy or wedged: detach it lazily rather than leave a server behind
            subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)
            proc.terminate()
            proc.join(10)


@contextmanager
def gocryptfs(base: Path) -> Iterator[Path]:
    cipher, mnt, pw = base / "gc-backing", base / "gc", base / "gc-pass"
    cipher.mkdir()
    mnt.mkdir()
    pw.write_text(uuid.uuid4().hex)
    # Its daemon keeps inherited pipes open (no capture_output) and, without syslog, warns
    # on stderr about it: neither belongs in a benchmark's output.
    subprocess.run(["gocryptfs", "-init", "-q", "-passfile", str(pw), str(cipher)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(["gocryptfs", "-q", "-passfile", str(pw), str(cipher), str(mnt)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield mnt
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


Step = Callable[[str], None]


def no_step(_: str) -> None:
    pass


def bench_dir(base: Path | None) -> tuple[Path, bool]:
    """The directory to work in: `base` when the caller owns one (kms-bench's workdir),
    else a fresh one on BENCH_DIR's file system (a real disk, not tmpfs), removed after."""
    if base is not None:
        return base, False
    return Path(tempfile.mkdtemp(prefix="gp-bench-", dir=os.environ.get("BENCH_DIR"))), True


@contextmanager
def nothing() -> Iterator[None]:
    yield None



def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"



# --- transport options (issue 26) ---------------------------------------------------------
DAEMON_THREADS = 16  # DataPlane's default, given to both FUSE arms alike


@dataclass(frozen=True)
class Transport:
    """What the FUSE arms ask the kernel for; what they got is the daemon's INIT line."""

    io_uring: bool = False
    writeback_cache: bool = True

    @property
    def label(self) -> str:
        return "uring" if self.io_uring else "dev"

    def daemon_args(self) -> list[str]:
        # Only what differs from the daemon's defaults: a daemon without the options still runs.
        return [*(["--io-uring"] if self.io_uring else []),
                *([] if self.writeback_cache else ["--writeback-cache", "off"])]

    def asked(self) -> str:
        return (f"{'FUSE over io_uring' if self.io_uring else '/dev/fuse'}, writeback cache "
                f"{'on' if self.writeback_cache else 'off'}")


def _serve_transport(backing: str, mnt: str, key: KeyVersion, transport: Transport, log_path: str) -> None:
    """`_serve` with transport options; DataPlane logs the daemon's stderr (its INIT line
    among it), which goes to `log_path` for the parent to read."""
    from agents.cryptfile import StaticKeyring
    from agents.guardpoint.dataplane import DataPlane, recover_journal
    from agents.guardpoint.policy import PERMIT_ALL

    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("strongroom.agent.dataplane")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # the transport line is logged at INFO
    journal = backing + ".journal"
    recover_journal(backing, journal, StaticKeyring([key]))
    plane = DataPlane(backing, mnt, journal=journal, allow_other=True, threads=DAEMON_THREADS,
                      io_uring=transport.io_uring, writeback_cache=transport.writeback_cache)

    def configure(p: DataPlane) -> None:
        p.set_key(key)
        p.set_active(key)
        p.set_policy(PERMIT_ALL)

    plane.start(configure=configure)
    plane.wait()


