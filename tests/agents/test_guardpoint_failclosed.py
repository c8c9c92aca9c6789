"""A guard point never fails open (issue 25; docs/decisions/0014-guard-points-fail-closed.md).

The real agent (`kms-agent run`, a process), its supervisors and their data planes serve a
guard point while a writer process creates, writes and fsyncs files in it as fast as it
can, recording each success. Then kill -9, several times over, the data plane, the
supervisor, or the agent itself (restarted as its service manager would). After each
kill the guard point must come back by itself and the writer must succeed again; in
between the writer may only meet errors. At the end, every file the writer was told was
written reads back through the guard point, and the directory underneath the mounts
holds nothing: no byte ever went to disk in plaintext beside the backing store."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.guardpoint.shield import mounts_at, shield, unshield, unshield_all
from keyserver.services import Services
from tests.agents.test_agent_port import Host, enroll_host
from tests.conftest import unique

pytestmark = pytest.mark.skipif(not Path("/dev/fuse").exists() or os.geteuid() != 0,
                                reason="needs /dev/fuse and root: the agent mounts FUSE and the shield")

KILLS = 3  # per victim

# Each attempt uses a new name: an attempt cut by a crash must not be confused with a later one.
WRITER = r"""
import os, sys, time
mnt, log, stop = sys.argv[1:4]
ok, bad = open(log + ".ok", "a", buffering=1), open(log + ".err", "a", buffering=1)
i = 0
while not os.path.exists(stop):
    i += 1
    body = (f"file {i} " * 200).encode()
    try:
        fd = os.open(os.path.join(mnt, f"w{i:07d}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            done = 0
            while done < len(body):
                done += os.write(fd, body[done:])
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        bad.write(f"{i} {exc.errno}\n")
        time.sleep(0.002)  # not a busy loop on a shared machine while the guard point is away
        continue
    ok.write(f"{i}\n")
"""


def _body(i: int) -> bytes:
    return (f"file {i} " * 200).encode()


def eventually(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _planes(mnt: Path) -> list[int]:
    """The strongroom-fuse processes serving `mnt` (its mount point is their last argument)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        if argv and argv[0].endswith(b"strongroom-fuse") and argv[-1] == os.fsencode(mnt):
            out.append(int(entry.name))
    return out


def _served(mnt: Path) -> bool:
    stack = mounts_at(str(mnt))
    if not stack or not stack[-1].fstype.startswith("fuse"):
        return False
    try:
        os.listdir(mnt)
        return True
    except OSError:
        return False


class Rig:
    """An enrolled host running `kms-agent run`, one guard point, one writer."""

    def __init__(self, tmp_path: Path, host: Host, agent_url: str) -> None:
        self.tmp = tmp_path
        self.state_dir, self.host_id = host.identity.state_dir, host.id
        self.config = tmp_path / "agent.toml"
        self.config.write_text(f'server_url = "{agent_url}"\nca_file = "{tmp_path / "ca.pem"}"\n'
                               f'state_dir = "{self.state_dir}"\n')
        self.mnt = tmp_path / "protected"
        self.mnt.mkdir(mode=0o750)
        os.chmod(self.mnt, 0o750)  # noqa: S103 - a mode the umask leaves alone, checked at the end
        self.agents: list[subprocess.Popen[bytes]] = []
        self.writer: subprocess.Popen[bytes] | None = None
        self.log, self.stop = tmp_path / "writer", tmp_path / "writer.stop"

    @property
    def agent(self) -> subprocess.Popen[bytes]:
        return self.agents[-1]

    def start_agent(self) -> None:
        with open(self.tmp / f"agent-{len(self.agents)}.log", "wb") as err:
            self.agents.append(subprocess.Popen(
                [sys.executable, "-c", "from agents.cli import main; main()", "--config", str(self.config), "run"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err))

    def plane(self) -> int | None:
        """The data plane the running agent's supervisor started, once it serves."""
        for pid in _planes(self.mnt):
            supervisor = _ppid(pid)
            if supervisor is not None and _ppid(supervisor) == self.agent.pid and _served(self.mnt):
                return pid
        return None

    def start_writer(self) -> None:
        self.writer = subprocess.Popen([sys.executable, "-c", WRITER, str(self.mnt), str(self.log), str(self.stop)],
                                       cwd=self.tmp, stdin=subprocess.DEVNULL)

    def successes(self) -> list[int]:
        try:
            return [int(line) for line in (self.log.parent / (self.log.name + ".ok")).read_text().split()]
        except FileNotFoundError:
            return []

    def errors(self) -> list[tuple[int, int]]:
        try:
            text = (self.log.parent / (self.log.name + ".err")).read_text()
        except FileNotFoundError:
            return []
        return [(int(a), int(b)) for a, b in (line.split() for line in text.splitlines())]

    def writing(self, at_least: int = 25) -> None:
        """The writer succeeds again: `at_least` more files created, written and fsynced."""
        base = len(self.successes())
        assert self.writer is not None and self.writer.poll() is None
        eventually(lambda: len(self.successes()) >= base + at_least, "the writer succeeding through the guard point")

    def close(self) -> None:
        self.stop.touch()
        if self.writer is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.writer.wait(30)
            if self.writer.poll() is None:
                self.writer.kill()
        for proc in self.agents:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(60)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        # Supervisors and data planes a killed agent left behind (ours: they serve our path).
        for pid in _planes(self.mnt):
            for victim in (_ppid(pid), pid):
                if victim and victim > 1:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(victim, signal.SIGKILL)
        unshield_all(self.state_dir)
        for _ in range(8):  # anything left above a shield the agent no longer records
            if not mounts_at(str(self.mnt)):
                break
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            subprocess.run(["chattr", "-i", str(self.mnt)], capture_output=True, check=False)


@pytest.fixture
def rig(tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client, services: Services) -> Iterator[Rig]:
    host = enroll_host(tmp_path, base_url, agent_url, admin, name="gpfc")
    before = services.hosts.heartbeat_seconds
    services.hosts.heartbeat_seconds = 1  # the server tells the agent how often to beat
    r = Rig(tmp_path, host, agent_url)
    try:
        yield r
    finally:
        r.close()
        services.hosts.heartbeat_seconds = before


def _bare(mnt: Path, peek: Path) -> list[str]:
    """What the directory underneath every mount at `mnt` holds, seen through a
    non-recursive bind mount of its parent (which shows none of the mounts on it)."""
    peek.mkdir(exist_ok=True)
    subprocess.run(["mount", "--bind", str(mnt.parent), str(peek)], check=True, capture_output=True)
    try:
        return sorted(os.listdir(peek / mnt.name))
    finally:
        subprocess.run(["umount", str(peek)], check=True, capture_output=True)


@pytest.mark.parametrize("victim", ["data plane", "supervisor", "agent", "umount"])
def test_kill_9_never_lets_a_write_land_in_plaintext(rig: Rig, victim: str, admin: httpx.Client) -> None:
    key = admin.post("/api/v1/keys", json={"name": unique("gpfc")}).json()
    gp = admin.post("/api/v1/guard-points", json={
        "host_id": rig.host_id, "path": str(rig.mnt), "backing_path": str(rig.tmp / "backing"),
        "key": key["name"], "default_effect": "permit"})
    assert gp.status_code == 201, gp.text
    rig.start_agent()
    eventually(rig.plane, "the guard point served")
    rig.start_writer()
    rig.writing()

    gaps, downtimes = [], []
    for _ in range(KILLS):
        plane = rig.plane()
        assert plane is not None
        supervisor = _ppid(plane)
        assert supervisor is not None
        errors_before, killed_at = len(rig.errors()), time.monotonic()
        if victim == "data plane":
            os.kill(plane, signal.SIGKILL)
        elif victim == "supervisor":
            os.kill(supervisor, signal.SIGKILL)
        elif victim == "agent":
            rig.agent.kill()
            rig.agent.wait()
            rig.start_agent()  # what its service manager does (Restart=always)
        else:  # someone unmounts the guard point under the agent's feet
            subprocess.run(["umount", "-l", str(rig.mnt)], check=True, capture_output=True)
        # Back by itself: a new data plane serving, and the writer succeeding through it.
        eventually(lambda old=plane: rig.plane() not in (None, old),  # type: ignore[misc]
                   f"the guard point back after losing its {victim}")
        downtimes.append(time.monotonic() - killed_at)  # reported, not asserted
        rig.writing()
        gaps.append(len(rig.errors()) - errors_before)
        assert _bare(rig.mnt, rig.tmp / "peek") == [], "a file was written beside the backing store"

    rig.stop.touch()
    assert rig.writer is not None and rig.writer.wait(30) == 0
    written, failed = rig.successes(), rig.errors()
    # The writer met the gap, and only as errors: nothing it was told was written is
    # missing, and nothing of it went anywhere but through the data plane.
    assert sum(gaps), f"the writer never met a gap: errors per kill {gaps}"
    for i in written:
        assert (rig.mnt / f"w{i:07d}").read_bytes() == _body(i), f"file {i} was fsynced and is not intact"
    backing = {p.name for p in (rig.tmp / "backing").iterdir()}
    assert {f"w{i:07d}" for i in written} <= backing
    assert all(b"file " not in (rig.tmp / "backing" / f"w{i:07d}").read_bytes()[:4096] for i in written[:50])
    print(f"{victim}: {len(written)} files written and read back, {len(failed)} refused during "
          f"{KILLS} kills (per kill {gaps}; errnos {sorted({e for _, e in failed})}; back after "
          f"{', '.join(f'{d:.2f}' for d in downtimes)} s)")

    # Deleting the guard point takes every mount away: the directory underneath is empty
    # and has its owner and mode back.
    assert admin.delete(f"/api/v1/guard-points/{gp.json()['id']}").status_code == 204
    # (The directory is unlocked just after its shield goes: wait for both.)
    eventually(lambda: not mounts_at(str(rig.mnt)) and os.stat(rig.mnt).st_mode & 0o7777 == 0o750,
               "every mount gone and the directory's mode back after the deletion")
    assert os.listdir(rig.mnt) == []


def test_without_its_shield_the_bare_directory_refuses_everyone(request: pytest.FixtureRequest) -> None:
    """After a reboot the shield is gone until the agent starts: the directory underneath
    is mode 000 and immutable, so nobody (root included) creates anything in it; the
    agent's next start shields it with the owner and mode it had, and deleting the guard
    point gives them back."""
    base = Path(tempfile.mkdtemp(prefix="gp-shield-", dir="/tmp"))  # reachable by nobody, unlike pytest's
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    os.chmod(base, 0o755)  # noqa: S103
    mnt, record = base / "p", base / "p.shield.json"
    mnt.mkdir()
    os.chmod(mnt, 0o775)  # noqa: S103 - writable by its group: the shield must show it and refuse anyway
    try:
        shield(str(mnt), record)
        with pytest.raises(OSError) as refused:
            (mnt / "x").write_text("plaintext")
        assert refused.value.errno == errno.EROFS and os.stat(mnt).st_mode & 0o7777 == 0o775
        subprocess.run(["umount", str(mnt)], check=True, capture_output=True)  # what a reboot does
        assert not mounts_at(str(mnt)) and os.stat(mnt).st_mode & 0o7777 == 0
        with pytest.raises(OSError) as refused:
            (mnt / "x").write_text("plaintext")
        assert refused.value.errno == errno.EPERM  # immutable: root too (ext4, xfs, btrfs, tmpfs have it)
        nobody = subprocess.run(["runuser", "-u", "nobody", "--", "touch", str(mnt / "y")], capture_output=True,
                                text=True, check=False)
        assert nobody.returncode != 0 and "Permission denied" in nobody.stderr
        assert shield(str(mnt), record).mode == 0o775  # the agent's next start
        assert os.stat(mnt).st_mode & 0o7777 == 0o775 and mounts_at(str(mnt))[-1].shield
    finally:
        assert unshield(str(mnt), record)
    assert not mounts_at(str(mnt)) and os.stat(mnt).st_mode & 0o7777 == 0o775
    (mnt / "x").write_text("a plain directory again")
    assert os.listdir(mnt) == ["x"]


def test_a_crashed_data_plane_is_not_restarted_once_the_host_is_revoked(rig: Rig, admin: httpx.Client) -> None:
    """Another process of the host heard the revocation (its record is on disk); the
    supervisors' crash watcher must not bring a killed data plane back on keys still
    cached — the path stays on its shield and the guard point says why.

    Which of the agent's threads meets the record first is a race, lost either way on a
    loaded machine: the crash watcher (which restarts nothing) or the daemon's loop (which
    stands the host down and exits 6). Both must leave the same refusal in the status."""
    from agents.keyclient.revocation import RevocationLedger

    key = admin.post("/api/v1/keys", json={"name": unique("gpfc")}).json()
    gp = admin.post("/api/v1/guard-points", json={
        "host_id": rig.host_id, "path": str(rig.mnt), "backing_path": str(rig.tmp / "backing"),
        "key": key["name"], "default_effect": "permit"}).json()
    status = rig.state_dir / "guardpoints" / f"{gp['id']}.status.json"

    def said() -> dict[str, Any]:
        with contextlib.suppress(OSError, ValueError):
            return dict(json.loads(status.read_text()))
        return {}

    rig.start_agent()
    plane = eventually(rig.plane, "the guard point served")
    # Served as the agent itself reports it: its supervisor is past starting the data
    # plane, so the kill below is a crash of a running guard point, not of a start.
    eventually(lambda: said().get("state") == "mounted", "the agent reporting the guard point mounted")
    RevocationLedger(rig.state_dir).mark_host(code="host_revoked", detail="seen by a volume command")
    os.kill(plane, signal.SIGKILL)
    try:
        eventually(lambda: "enrolled again" in str(said().get("detail")), "the refusal in the status")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: the status says {said()}; the agent "
                             f"{'runs' if rig.agent.poll() is None else f'exited {rig.agent.poll()}'}") from None
    assert said()["state"] == "error"
    assert rig.plane() is None and mounts_at(str(rig.mnt))[-1].shield
