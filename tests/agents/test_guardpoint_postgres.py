"""A real database on a guard point: PostgreSQL's whole data directory (WAL included) on
the mount, pgbench against it, the agent killed with SIGKILL in the middle, remounted,
PostgreSQL recovering, and its own integrity checks (amcheck, pg_checksums) clean."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.cryptfile import EncryptedFile, KeyVersion, StaticKeyring

BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)
pytestmark = pytest.mark.skipif(
    BIN is None or not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None or os.geteuid() != 0,
    reason="needs PostgreSQL server binaries, /dev/fuse, fusermount3 and root")


def _serve(backing: str, mnt: str, key: KeyVersion) -> None:
    from agents.guardpoint.dataplane import serve

    serve(backing, mnt, [key], key, allow_other=True, journal=backing + ".journal")


def as_postgres(*cmd: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", "postgres", "--", *cmd], capture_output=True, text=True,
                          check=check, timeout=timeout)


class Rig:
    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="gp-pg-", dir="/tmp"))
        os.chmod(self.base, 0o755)  # noqa: S103 - the postgres user must reach the mount
        self.backing, self.mnt = self.base / "backing", self.base / "mnt"
        self.backing.mkdir()
        self.mnt.mkdir()
        self.key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
        self.proc: multiprocessing.process.BaseProcess | None = None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.pgdata = self.mnt / "pgdata"
        self.run = self.base / "run"  # socket and server log, the postgres user's
        self.run.mkdir()
        shutil.chown(self.run, "postgres", "postgres")

    def mount(self) -> None:
        self.proc = multiprocessing.get_context("spawn").Process(
            target=_serve, args=(str(self.backing), str(self.mnt), self.key))
        self.proc.start()
        deadline = time.monotonic() + 20
        while not os.path.ismount(self.mnt):
            assert self.proc.is_alive() and time.monotonic() < deadline
            time.sleep(0.05)

    def kill_agent(self) -> None:
        assert self.proc is not None and self.proc.pid is not None
        from tests.agents.test_guardpoint import _daemon_pid

        os.kill(_daemon_pid(self.proc), signal.SIGKILL)  # the data plane dies mid-I/O
        os.kill(self.proc.pid, signal.SIGKILL)  # and its control plane with it
        self.proc.join(10)
        subprocess.run(["fusermount3", "-uz", str(self.mnt)], check=False, capture_output=True)

    def kill_postgres(self) -> None:
        """SIGKILL the cluster's postmaster and its backends and wait until they are gone."""
        found = subprocess.run(["pgrep", "-f", f"-D {self.pgdata}"], capture_output=True, text=True).stdout.split()
        pids = set(found)
        for pid in found:
            pids |= set(subprocess.run(["pgrep", "-P", pid], capture_output=True, text=True).stdout.split())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)

    def remove_stale_lock(self) -> None:
        """The killed postmaster can linger as a zombie where PID 1 does not reap orphans
        (as in this sandbox), and PostgreSQL takes a zombie's PID for a live server."""
        for lock in (self.pgdata / "postmaster.pid", self.run / f".s.PGSQL.{self.port}.lock"):
            if not lock.exists():
                continue
            pid = lock.read_text().split()[0]
            status = Path(f"/proc/{pid}/status")
            if not status.exists() or "State:\tZ" in status.read_text():
                lock.unlink()
                if lock.name.endswith(".lock"):
                    (self.run / lock.name.removesuffix(".lock")).unlink(missing_ok=True)

    def pg_ctl(self, action: str, *extra: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = as_postgres(f"{BIN}/pg_ctl", "-D", str(self.pgdata), "-w", "-t", "120", action,
                        "-o", f"-p {self.port} -k {self.run} -c listen_addresses=''", "-l",
                        str(self.run / "pg.log"), *extra, check=False)
        if check and r.returncode != 0:
            log = (self.run / "pg.log").read_text()[-3000:] if (self.run / "pg.log").exists() else ""
            raise AssertionError(f"pg_ctl {action} failed: {r.stdout}{r.stderr}\n--- server log ---\n{log}")
        return r

    def psql(self, sql: str) -> str:
        return as_postgres(f"{BIN}/psql", "-h", str(self.run), "-p", str(self.port), "-d", "postgres",
                           "-Atc", sql).stdout.strip()

    def close(self) -> None:
        self.pg_ctl("stop", "-m", "immediate", check=False)
        subprocess.run(["fusermount3", "-u", str(self.mnt)], check=False, capture_output=True)
        if self.proc is not None:
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()
        subprocess.run(["fusermount3", "-uz", str(self.mnt)], check=False, capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    try:
        yield r
    finally:
        r.close()


def test_postgres_survives_the_agent_being_killed(rig: Rig) -> None:
    rig.mount()
    rig.pgdata.mkdir()
    shutil.chown(rig.pgdata, "postgres", "postgres")
    as_postgres(f"{BIN}/initdb", "-k", "-A", "trust", "-U", "postgres", "-D", str(rig.pgdata))
    rig.pg_ctl("start")
    as_postgres(f"{BIN}/pgbench", "-h", str(rig.run), "-p", str(rig.port), "-i", "-s", "2", "postgres")
    bench = subprocess.Popen(["runuser", "-u", "postgres", "--", f"{BIN}/pgbench", "-h", str(rig.run), "-p",
                              str(rig.port), "-c", "4", "-T", "30", "postgres"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(4)
    rig.kill_agent()  # the agent dies under a running OLTP load
    bench.kill()
    bench.wait(30)
    rig.kill_postgres()  # it PANICs on the dead mount; clear what is left of it, as an operator would
    rig.mount()
    rig.remove_stale_lock()
    # Every file the agent ever wrote still authenticates: nothing was left half-sealed.
    for dirpath, _, names in os.walk(rig.backing):
        for name in names:
            with EncryptedFile.open(os.path.join(dirpath, name), StaticKeyring([rig.key])) as f:
                f.verify()
    rig.pg_ctl("start")  # crash recovery replays the WAL from the guard point
    assert int(rig.psql("select count(*) from pgbench_accounts")) == 200_000
    committed = int(rig.psql("select count(*) from pgbench_history"))
    assert committed > 0
    rig.psql("create extension if not exists amcheck")
    for index in ("pgbench_accounts_pkey", "pgbench_branches_pkey", "pgbench_tellers_pkey"):
        rig.psql(f"select bt_index_check('{index}'::regclass, true)")
    rig.pg_ctl("stop", "-m", "fast")
    checks = as_postgres(f"{BIN}/pg_checksums", "--check", "-D", str(rig.pgdata))
    assert "Bad checksums:  0" in checks.stdout, checks.stdout
