"""The daemon serving a guard point defined on the server: mount, access rules enforced
and audited, a policy change applied live and reported, a key rotation re-wrapping the
files in the background, removal unmounting it, revocation taking it down."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.config import AgentConfig
from agents.cryptfile import read_header
from agents.daemon import AgentDaemon
from agents.guardpoint.manager import GuardPointManager
from agents.guardpoint.shield import serving, shielded, unshield_all
from agents.keyclient.client import HostRevoked, ServerKeyring
from agents.keyclient.spool import EventSpool
from keyserver.services import Services
from tests.agents.test_agent_port import Host, enroll_host
from tests.conftest import unique

CAT = shutil.which("cat") or "/usr/bin/cat"

pytestmark = pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="needs /dev/fuse for a FUSE mount")


def eventually(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Wait for asynchronous work (a child process, a background re-wrap) to show."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _serves(path: Path) -> bool:
    """The mount above `path` answers and holds it. While a crashed mount is replaced the
    path answers ENOTCONN ("transport endpoint is not connected") for a moment."""
    try:
        return os.path.ismount(path.parent) and path.exists()
    except OSError:
        return False


@pytest.fixture
def agent(tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client) -> Iterator[tuple[Host, AgentDaemon]]:
    host = enroll_host(tmp_path, base_url, agent_url, admin, name="gpd")
    config_path = tmp_path / "agent.toml"
    config_path.write_text(f'server_url = "{agent_url}"\nca_file = "{tmp_path / "ca.pem"}"\n'
                           f'state_dir = "{host.identity.state_dir}"\n')
    config = AgentConfig.load(config_path)
    manager = GuardPointManager(config, config_path)
    keyring = ServerKeyring(host.client, ttl_seconds=300, max_entries=64)
    daemon = AgentDaemon(host.client, keyring, EventSpool(config.spool_dir), guard_points=manager)
    try:
        yield host, daemon
    finally:
        manager.stop_all()  # a stop keeps each path shielded (fail closed); the test's paths are let go
        unshield_all(config.state_dir)


def test_a_server_defined_guard_point_end_to_end(tmp_path: Path, agent: tuple[Host, AgentDaemon],
                                                 admin: httpx.Client, services: Services) -> None:
    host, daemon = agent
    key = admin.post("/api/v1/keys", json={"name": unique("gpd")}).json()
    mnt, backing = tmp_path / "protected", tmp_path / "backing"
    rules = [{"effect": "deny", "executables": [os.path.realpath(CAT)], "access": "read"}]
    gp = admin.post("/api/v1/guard-points", json={
        "host_id": host.id, "path": str(mnt), "backing_path": str(backing), "key": key["name"],
        "rules": rules, "default_effect": "permit"}).json()
    daemon.beat()
    eventually(lambda: serving(str(mnt)), "the mount")

    (mnt / "notes.txt").write_text("the plaintext")
    assert (mnt / "notes.txt").read_text() == "the plaintext"
    stored = backing / "notes.txt"
    assert read_header(str(stored)).key_version == 1 and b"the plaintext" not in stored.read_bytes()
    denied = subprocess.run([CAT, str(mnt / "notes.txt")], capture_output=True, text=True, check=False)
    assert denied.returncode != 0 and "Permission denied" in denied.stderr

    # A policy change applies live, without a remount, and the host reports it.
    r = admin.put(f"/api/v1/guard-points/{gp['id']}", json={
        "host_id": host.id, "path": str(mnt), "backing_path": str(backing), "key": key["name"],
        "rules": rules, "default_effect": "permit", "mode": "learn"})
    assert r.status_code == 200 and r.json()["revision"] == 2
    daemon.beat()

    def applied() -> bool:
        daemon.beat()
        reported = admin.get(f"/api/v1/hosts/{host.id}").json()["guard_points"]
        return bool(reported) and reported[0]["revision"] == 2 and reported[0]["state"] == "mounted"

    eventually(applied, "revision 2 reported")
    allowed = subprocess.run([CAT, str(mnt / "notes.txt")], capture_output=True, text=True, check=False)
    assert allowed.returncode == 0 and allowed.stdout == "the plaintext"

    # Rotation: the file's header moves to version 2 in the background; the data stays readable.
    assert admin.post(f"/api/v1/keys/{key['name']}/rotate").status_code == 200
    daemon.beat()
    eventually(lambda: read_header(str(stored)).key_version == 2, "the background re-wrap")
    assert (mnt / "notes.txt").read_text() == "the plaintext"

    # Re-key: every file re-encrypted under a fresh file key, online (this one while open),
    # with progress reported to the server.
    old_id = read_header(str(stored)).file_id
    with open(mnt / "notes.txt", "r+") as held:
        r = admin.post(f"/api/v1/guard-points/{gp['id']}/rekey")
        assert r.status_code == 202 and r.json()["rekey_generation"] == 1
        daemon.beat()
        eventually(lambda: read_header(str(stored)).file_id != old_id, "the re-key")
        assert held.read() == "the plaintext"
        held.write(" and more")
    assert (mnt / "notes.txt").read_text() == "the plaintext and more"
    assert read_header(str(stored)).key_version == 2

    def rekey_reported() -> bool:
        daemon.beat()
        progress = admin.get(f"/api/v1/hosts/{host.id}").json()["guard_points"][0]["rekey"]
        return bool(progress) and progress == {"generation": 1, "done": 1, "total": 1, "finished": True}

    eventually(rekey_reported, "re-key progress reported")

    # The denial and the learn-mode "would deny" reached the audit log as this host.
    daemon.beat()
    services.audit.flush()
    items = admin.get("/api/v1/audit/events", params={"actor": "host:gpd.example.com", "limit": 200}).json()["items"]
    actions = {e["action"] for e in items}
    assert {"agent.access.denied", "agent.access.would_deny", "agent.guardpoint.mounted",
            "agent.guardpoint.policy_applied", "agent.guardpoint.rewrapped", "agent.guardpoint.rekeyed"} <= actions

    # Removing the guard point unmounts it; the ciphertext stays.
    assert admin.delete(f"/api/v1/guard-points/{gp['id']}").status_code == 204
    daemon.beat()
    eventually(lambda: not os.path.ismount(mnt), "the unmount")
    daemon.beat()
    assert stored.exists() and admin.get(f"/api/v1/hosts/{host.id}").json()["guard_points"] == []


def test_revocation_takes_the_guard_points_down(tmp_path: Path, agent: tuple[Host, AgentDaemon],
                                                admin: httpx.Client) -> None:
    host, daemon = agent
    key = admin.post("/api/v1/keys", json={"name": unique("gpr")}).json()
    mnt = tmp_path / "p"
    admin.post("/api/v1/guard-points", json={"host_id": host.id, "path": str(mnt),
                                             "backing_path": str(tmp_path / "b"), "key": key["name"],
                                             "default_effect": "permit"})
    daemon.beat()
    eventually(lambda: serving(str(mnt)), "the mount")
    assert admin.post(f"/api/v1/hosts/{host.id}/revoke").status_code == 200
    with pytest.raises(HostRevoked):
        daemon.beat()
    # Down to the shield: an empty read-only directory, never the bare one (fails closed).
    assert not serving(str(mnt)) and shielded(str(mnt))
    with pytest.raises(OSError) as refused:
        (mnt / "after-revocation").write_text("nowhere")
    assert refused.value.errno == 30  # EROFS


def test_initial_protection_of_a_directory_that_holds_data(tmp_path: Path, agent: tuple[Host, AgentDaemon],
                                                           admin: httpx.Client) -> None:
    """A directory already in use becomes a guard point: its files move to the backing
    directory, are encrypted in place (resumable), and are served as before."""
    host, daemon = agent
    key = admin.post("/api/v1/keys", json={"name": unique("gpe")}).json()
    mnt, backing = tmp_path / "busy", tmp_path / "busy-backing"
    (mnt / "sub").mkdir(parents=True)
    (mnt / "plain.txt").write_text("already here")
    (mnt / "sub" / "data.bin").write_bytes(b"\x00\x01" * 50000)
    admin.post("/api/v1/guard-points", json={"host_id": host.id, "path": str(mnt), "backing_path": str(backing),
                                             "key": key["name"], "default_effect": "permit"})
    daemon.beat()
    eventually(lambda: serving(str(mnt)), "the mount")
    assert (mnt / "plain.txt").read_text() == "already here"
    assert (mnt / "sub" / "data.bin").read_bytes() == b"\x00\x01" * 50000
    assert read_header(str(backing / "plain.txt")).key_id == uuid.UUID(key["id"])
    assert b"already here" not in (backing / "plain.txt").read_bytes()


def test_protection_refused_when_both_directories_hold_files(tmp_path: Path, agent: tuple[Host, AgentDaemon],
                                                             admin: httpx.Client) -> None:
    host, daemon = agent
    key = admin.post("/api/v1/keys", json={"name": unique("gpe")}).json()
    mnt, backing = tmp_path / "busy", tmp_path / "b"
    mnt.mkdir()
    backing.mkdir()
    (mnt / "plain.txt").write_text("not yet protected")
    (backing / "other").write_text("something else")
    admin.post("/api/v1/guard-points", json={"host_id": host.id, "path": str(mnt), "backing_path": str(backing),
                                             "key": key["name"]})
    daemon.beat()

    def reported_error() -> dict[str, Any] | None:
        daemon.beat()
        gps = admin.get(f"/api/v1/hosts/{host.id}").json()["guard_points"]
        return gps[0] if gps and gps[0]["state"] == "error" else None

    report = eventually(reported_error, "the error report")
    assert "both" in report["detail"] and not os.path.ismount(mnt)
    assert (mnt / "plain.txt").read_text() == "not yet protected"
    assert (backing / "other").read_text() == "something else"


def test_a_killed_mount_process_is_restarted_and_loses_nothing(tmp_path: Path, agent: tuple[Host, AgentDaemon],
                                                               admin: httpx.Client) -> None:
    import signal

    host, daemon = agent
    key = admin.post("/api/v1/keys", json={"name": unique("gpk")}).json()
    mnt = tmp_path / "k"
    admin.post("/api/v1/guard-points", json={"host_id": host.id, "path": str(mnt), "backing_path": str(tmp_path / "kb"),
                                             "key": key["name"], "default_effect": "permit"})
    daemon.beat()
    eventually(lambda: serving(str(mnt)), "the mount")
    with open(mnt / "kept", "wb") as f:
        f.write(b"synced" * 1000)
        os.fsync(f.fileno())
    running = next(iter(daemon._manager._running.values()))  # type: ignore[union-attr]
    assert running.process.pid is not None
    os.kill(running.process.pid, signal.SIGKILL)
    running.process.join(10)
    daemon.beat()  # the manager's watcher has noticed, cleared the dead mount and started a new process
    eventually(lambda: _serves(mnt / "kept"), "the restarted mount")
    assert (mnt / "kept").read_bytes() == b"synced" * 1000


def test_mode_off_then_unprotect_gives_the_directory_back_in_clear(agent: tuple[Host, AgentDaemon], admin: httpx.Client,
                                                                   services: Services,
                                                                   request: pytest.FixtureRequest) -> None:
    """enforce -> off (the raw view: files as stored, new ones in clear) -> enforce (what
    was written in clear is encrypted) -> off + unprotect (decrypted in place, progress
    reported) -> delete (the path gets its files back, in clear, with its own mode)."""
    host, daemon = agent
    key = admin.post("/api/v1/keys", json={"name": unique("gpo")}).json()
    import tempfile

    # Other users must be able to reach the path: pytest's own tmp dirs are 0700.
    base = Path(tempfile.mkdtemp(prefix="gp-off-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    os.chmod(base, 0o755)  # noqa: S103
    mnt, backing = base / "share", base / ".share.strongroom"
    mnt.mkdir(mode=0o755)
    (mnt / "report.txt").write_text("quarterly figures")
    body = {"host_id": host.id, "path": str(mnt), "key": key["name"], "default_effect": "permit"}
    gp = admin.post("/api/v1/guard-points", json=body).json()

    def state(expected: str, revision: int) -> Callable[[], bool]:
        def check() -> bool:
            daemon.beat()
            reported = admin.get(f"/api/v1/hosts/{host.id}").json()["guard_points"]
            return bool(reported) and reported[0]["state"] == expected and reported[0]["revision"] == revision
        return check

    daemon.beat()
    eventually(state("mounted", 1), "the mount")
    assert (mnt / "report.txt").read_text() == "quarterly figures"
    assert stat.S_IMODE(os.stat(backing).st_mode) == 0o700  # ciphertext and names: the agent's alone
    listed = subprocess.run(["runuser", "-u", "nobody", "--", "ls", str(mnt)], capture_output=True, text=True,
                            check=False)
    assert listed.returncode == 0 and listed.stdout.split() == ["report.txt"]  # the root shows the path's mode

    # Encryption off: the files as stored; a new file goes to disk in clear.
    assert admin.put(f"/api/v1/guard-points/{gp['id']}", json={**body, "mode": "off"}).status_code == 200
    eventually(state("off", 2), "the raw view")
    assert (mnt / "report.txt").read_bytes()[:4] == b"SRCF"  # ciphertext, as stored
    (mnt / "draft.txt").write_text("written while off")
    assert (backing / "draft.txt").read_text() == "written while off"

    # Back to enforce: what was written in clear is encrypted before the mount comes up.
    assert admin.put(f"/api/v1/guard-points/{gp['id']}", json={**body, "mode": "enforce"}).status_code == 200
    eventually(state("mounted", 3), "the mount again")
    assert read_header(str(backing / "draft.txt")).key_id == uuid.UUID(key["id"])
    assert (mnt / "draft.txt").read_text() == "written while off"

    # Unprotect: off, then decrypt in place with progress, then delete: the path is plain again.
    assert admin.put(f"/api/v1/guard-points/{gp['id']}", json={**body, "mode": "off"}).status_code == 200
    eventually(state("off", 4), "the raw view again")
    assert admin.post(f"/api/v1/guard-points/{gp['id']}/unprotect").status_code == 202

    def unprotected() -> bool:
        daemon.beat()
        reported = admin.get(f"/api/v1/hosts/{host.id}").json()["guard_points"][0]
        return reported["unprotect"] == {"generation": 1, "done": 2, "total": 2, "finished": True}

    eventually(unprotected, "unprotect progress reported")
    assert (mnt / "report.txt").read_text() == "quarterly figures"  # decrypted in place, seen raw
    assert admin.delete(f"/api/v1/guard-points/{gp['id']}").status_code == 204
    daemon.beat()
    eventually(lambda: not backing.exists(), "the path released")
    assert not os.path.ismount(mnt) and stat.S_IMODE(os.stat(mnt).st_mode) == 0o755
    assert sorted(p.name for p in mnt.iterdir()) == ["draft.txt", "report.txt"]
    assert (mnt / "report.txt").read_text() == "quarterly figures"
    assert (mnt / "draft.txt").read_text() == "written while off"
    services.audit.flush()
    items = admin.get("/api/v1/audit/events", params={"actor": "host:gpd.example.com", "limit": 200}).json()["items"]
    assert {"agent.guardpoint.unprotected", "agent.guardpoint.mounted"} <= {e["action"] for e in items}


def test_stopping_the_daemon_keeps_what_a_restart_resumes_from(tmp_path: Path, agent: tuple[Host, AgentDaemon],
                                                                admin: httpx.Client) -> None:
    """A daemon that stops (SIGTERM, revocation) unmounts but keeps each guard point's
    state files: a re-key or unprotect plan must survive the restart. Only a deletion on
    the server removes them."""
    host, daemon = agent
    key = admin.post("/api/v1/keys", json={"name": unique("gps")}).json()
    mnt = tmp_path / "kept"
    gp = admin.post("/api/v1/guard-points", json={"host_id": host.id, "path": str(mnt),
                                                  "backing_path": str(tmp_path / "kept-b"), "key": key["name"],
                                                  "default_effect": "permit"}).json()
    daemon.beat()
    eventually(lambda: serving(str(mnt)), "the mount")
    state = host.identity.state_dir / "guardpoints"
    (state / f"{gp['id']}.rekey.json").write_text('{"generation": 1, "files": {}}')
    manager = daemon._manager
    assert manager is not None
    manager.stop_all()
    assert not serving(str(mnt)) and shielded(str(mnt))
    assert (state / f"{gp['id']}.json").exists() and (state / f"{gp['id']}.rekey.json").exists()


def test_a_crashed_guard_point_comes_back_at_once_and_the_crash_is_audited(
        tmp_path: Path, agent: tuple[Host, AgentDaemon], admin: httpx.Client, services: Services) -> None:
    host, daemon = agent
    key = admin.post("/api/v1/keys", json={"name": unique("gpc")}).json()
    mnt = tmp_path / "crashy"
    gp = admin.post("/api/v1/guard-points", json={"host_id": host.id, "path": str(mnt),
                                                  "backing_path": str(tmp_path / "crashy-b"), "key": key["name"],
                                                  "default_effect": "permit"}).json()
    daemon.beat()
    eventually(lambda: serving(str(mnt)), "the mount")
    (mnt / "kept.txt").write_text("survives the crash")
    manager = daemon._manager
    assert manager is not None
    victim = manager._running[gp["id"]].process
    os.kill(victim.pid or 0, 9)
    victim.join(10)
    # No heartbeat in between: the manager's watcher restarts it by itself.
    eventually(lambda: manager._running[gp["id"]].process.pid != victim.pid
               and _serves(mnt / "kept.txt"), "the guard point back after a crash")
    assert (mnt / "kept.txt").read_text() == "survives the crash"
    daemon.beat()  # ships the spool
    services.audit.flush()
    events = admin.get("/api/v1/audit/events", params={"action": "agent.guardpoint.serve_failed",
                                                       "limit": 50}).json()["items"]
    mine = [e for e in events if e["details"].get("guard_point") == gp["id"]]
    assert mine and mine[0]["outcome"] == "error" and mine[0]["details"]["exit_code"] == -9


def test_the_data_plane_dying_is_restarted_and_integrity_failures_are_audited(
        tmp_path: Path, agent: tuple[Host, AgentDaemon], admin: httpx.Client, services: Services) -> None:
    """kill -9 of strongroom-fuse itself (not its supervisor): the supervisor exits, the
    manager restarts both at once and audits the crash; a backing file altered behind the
    mount answers EIO and is audited as agent.guardpoint.integrity_error (outcome error)."""
    host, daemon = agent
    key = admin.post("/api/v1/keys", json={"name": unique("gpi")}).json()
    mnt = tmp_path / "fragile"
    backing = tmp_path / "fragile-b"
    gp = admin.post("/api/v1/guard-points", json={"host_id": host.id, "path": str(mnt),
                                                  "backing_path": str(backing), "key": key["name"],
                                                  "default_effect": "permit"}).json()
    daemon.beat()
    eventually(lambda: serving(str(mnt)), "the mount")
    (mnt / "ledger").write_bytes(os.urandom(20_000))
    manager = daemon._manager
    assert manager is not None
    supervisor = manager._running[gp["id"]].process
    children = Path(f"/proc/{supervisor.pid}/task/{supervisor.pid}/children").read_text().split()
    assert len(children) == 1 and Path(f"/proc/{children[0]}/exe").resolve().name == "strongroom-fuse"
    os.kill(int(children[0]), 9)
    eventually(lambda: manager._running[gp["id"]].process.pid != supervisor.pid
               and _serves(mnt / "ledger"), "the guard point back after its data plane died")
    raw = bytearray((backing / "ledger").read_bytes())
    raw[128 + 4124 + 10] ^= 1  # inside chunk 1, behind the (new) mount's back: nothing is cached yet
    (backing / "ledger").write_bytes(bytes(raw))
    with open(mnt / "ledger", "rb") as f:
        assert len(f.read(4096)) == 4096
        with pytest.raises(OSError) as exc:
            f.read(4096)
    assert exc.value.errno == 5
    daemon.beat()  # ships the spool
    services.audit.flush()

    def audited(action: str) -> list[dict[str, Any]]:
        items = admin.get("/api/v1/audit/events", params={"action": action, "limit": 50}).json()["items"]
        return [e for e in items if e["details"].get("guard_point") == gp["id"]]

    crashed = eventually(lambda: audited("agent.guardpoint.serve_failed"), "the crash in the audit log")
    assert crashed[0]["outcome"] == "error"
    bad = eventually(lambda: audited("agent.guardpoint.integrity_error"), "the integrity failure in the audit log")
    assert bad[0]["outcome"] == "error" and bad[0]["object_id"] == str(mnt / "ledger")
