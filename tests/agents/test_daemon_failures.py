"""A heartbeat that fails for any reason but the host's revocation does not stop the
agent daemon (which would end revocation, re-keying and event shipping on the host): the
failure is logged once with what to do, shown by `kms-agent status`, beaten again after a
bounded backoff, and cleared when a beat succeeds. A revocation still ends it (6) and
drops its keys, whatever the state directory can take.

The faults are real: the spool or state directory made immutable (chattr +i, we are
root) under the real `kms-agent run` against the real key server."""

from __future__ import annotations

import errno
import json
import logging
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from agents.cryptfile.keys import KeyVersion
from agents.daemon import STATUS_FILE, AgentDaemon
from agents.errors import Exit
from agents.guardpoint.records import read_json
from agents.keyclient.cache import KeyCache, ServerUnreachable
from agents.keyclient.client import HostRevoked, ServerClient, ServerKeyring, ServerRefused
from agents.keyclient.spool import EventSpool
from keyserver.services import Services
from tests.agents.test_agent_port import enroll_host
from tests.agents.test_cli import kms_agent, write_config
from tests.conftest import unique


def _chattr(flag: str, path: Path) -> None:
    r = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"chattr {flag} {path}: {r.stderr.strip()} (needs root and a file system with attributes)")


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    """The directory refuses every change (EPERM), even to root, until let go."""
    _chattr("+i", path)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False)


class Scripted(AgentDaemon):
    """The daemon's own loop, with each beat's outcome given: the unit under test is `run`."""

    def __init__(self, tmp: Path, outcomes: list[BaseException | None], stop: threading.Event) -> None:
        keyring = ServerKeyring(cast(ServerClient, None), ttl_seconds=60, max_entries=8)
        keyring.cache = KeyCache(lambda kid, v: KeyVersion(kid, v, bytes(32)), ttl_seconds=60, max_entries=8)
        super().__init__(cast(ServerClient, None), keyring, EventSpool(tmp / "spool"), status_file=tmp / STATUS_FILE)
        self.outcomes, self.stop = outcomes, stop
        self.interval = 0.01
        self.pauses: list[tuple[float, dict[str, Any] | None]] = []

    def beat(self) -> dict[str, Any]:
        outcome = self.outcomes.pop(0)
        if not self.outcomes:
            self.stop.set()
        if outcome is not None:  # a HostRevoked as from a call after the heartbeat: keys not dropped yet
            raise outcome
        return {}

    def _pause(self, stop: threading.Event, seconds: float) -> None:
        self.pauses.append((seconds, read_json(cast(Path, self._status_file))))
        super()._pause(stop, seconds)


def test_a_failed_beat_does_not_end_the_loop(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="strongroom.agent")
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "spool" / "x.jsonl"))
    refused = ServerRefused(422, "validation_error", "guard_points.0.state: not a state")
    stop = threading.Event()
    daemon = Scripted(tmp_path, [full, full, full, full, full, refused, refused, KeyError("server_time"), None,
                                 ServerUnreachable("https://ks:8443: connection refused"), None], stop)
    assert daemon.run(stop) == Exit.OK and daemon.outcomes == []

    waits = [w for w, _ in daemon.pauses]
    # Doubled per failure in a row, bounded at 4 intervals; the interval again once a beat succeeds;
    # an unreachable server is beaten at the interval (the key cache carries the host meanwhile).
    assert waits == pytest.approx([0.01, 0.02, 0.04, 0.04, 0.04, 0.04, 0.04, 0.04, 0.01, 0.01, 0.01])
    statuses = [s for _, s in daemon.pauses]
    assert all(s is not None and s["running"] for s in statuses)
    first = cast(dict[str, Any], statuses[0])["error"]
    assert "No space left on device (ENOSPC): free space on that file system" in first["message"]
    assert first["failed_beats"] == 1 and first["since"]
    fifth = cast(dict[str, Any], statuses[4])["error"]
    assert fifth["failed_beats"] == 5 and fifth["since"] == first["since"]
    assert "the key server refused" in cast(dict[str, Any], statuses[5])["error"]["message"]
    assert cast(dict[str, Any], statuses[8])["error"] is None and cast(dict[str, Any], statuses[8])["last_ok_at"]
    final = read_json(tmp_path / STATUS_FILE)
    assert final is not None and final["running"] is False and final["error"] is None

    def logged(level: int, text: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.levelno == level and text in r.getMessage()]

    # Each distinct failure once at ERROR (five ENOSPC beats: one line); its traceback at DEBUG,
    # except the unexpected one, whose traceback is an error once.
    assert len(logged(logging.ERROR, "heartbeat failed")) == 3
    assert len(logged(logging.ERROR, "No space left")) == 1
    assert len(logged(logging.DEBUG, "failed again")) == 5
    assert [r.exc_info[0] for r in logged(logging.ERROR, "traceback") if r.exc_info] == [KeyError]
    assert len(logged(logging.INFO, "heartbeats succeed again")) == 1
    assert len(logged(logging.WARNING, "key server unreachable")) == 1
    assert len(logged(logging.INFO, "the key server answers again")) == 1


def test_a_revocation_still_ends_the_loop_and_drops_the_keys(tmp_path: Path) -> None:
    stop = threading.Event()
    daemon = Scripted(tmp_path, [OSError(errno.EROFS, "Read-only file system"),
                                 HostRevoked(403, "host_revoked", "revoked by an operator"), None], stop)
    daemon._keyring.cache.get(uuid.uuid4(), 1)
    assert len(daemon._keyring.cache) == 1
    assert daemon.run(stop) == Exit.NOT_ENROLLED
    assert daemon.revoked and len(daemon._keyring.cache) == 0 and not stop.is_set()
    # Neither an interrupt nor an exit is a failed beat: they end the daemon.
    for ending in (KeyboardInterrupt(), SystemExit(3)):
        stop = threading.Event()
        daemon = Scripted(tmp_path, [ending, None], stop)
        with pytest.raises(type(ending)):
            daemon.run(stop)
        final = read_json(tmp_path / STATUS_FILE)
        assert final is not None and final["running"] is False


def _wait(check: Callable[[], Any], what: str, proc: subprocess.Popen[str] | None = None,
          timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        assert proc is None or proc.poll() is None, f"the daemon ended ({proc.returncode}) waiting for {what}"
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_the_daemon_outlives_an_unwritable_spool_and_ships_once_it_is_repaired(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], base_url: str,
        agent_url: str, admin: httpx.Client, services: Services) -> None:
    host = enroll_host(tmp_path, base_url, agent_url, admin, name="spoolfault")
    state = host.identity.state_dir
    config = write_config(tmp_path / "agent.toml", agent_url, state, tmp_path / "ca.pem")
    marker = unique("spooled")
    spool = EventSpool(state / "spool")
    paths = [f"/srv/{marker}/a", f"/srv/{marker}/b"]
    for p in paths:
        spool.append({"event": "file.encrypt", "path": p})

    def audited() -> list[str]:
        services.audit.flush()
        found = []
        for p in paths:
            items = admin.get("/api/v1/audit/events", params={"object_id": p, "limit": 10}).json()["items"]
            found += [e["object_id"] for e in items if e["action"] == "agent.file.encrypt"]
        return sorted(found)

    def daemon_state() -> dict[str, Any]:
        return read_json(state / STATUS_FILE) or {}

    services.hosts.heartbeat_seconds = 1  # backoff bounded at 4 s
    log = tmp_path / "daemon.log"
    proc: subprocess.Popen[str] | None = None
    try:
        with immutable(state / "spool"), log.open("w") as stderr:
            proc = subprocess.Popen([sys.executable, "-c", "from agents.cli import main; main()", "--config",
                                     str(config), "run"], stderr=stderr, text=True)
            failing = _wait(lambda: (daemon_state().get("error") or {}).get("failed_beats", 0) >= 3 and
                            daemon_state()["error"], "three failed beats", proc)
            assert str(state / "spool") in failing["message"] and "chattr -i" in failing["message"]
            seen = admin.get(f"/api/v1/hosts/{host.id}").json()
            assert seen["online"] and seen["last_heartbeat_at"]  # the heartbeats themselves reach the server
            # `kms-agent status` says so, from the daemon's record.
            code, out, err = kms_agent(monkeypatch, capsys, config, "status", "--json")
            assert code == Exit.OK, err
            shown = json.loads(out)["daemon"]
            assert shown["running"] and shown["error"]["since"] == failing["since"]
            assert shown["error"]["message"] == failing["message"]
            assert json.loads(out)["pending_events"] == 2
            code, out, _ = kms_agent(monkeypatch, capsys, config, "status")
            assert code == Exit.OK and "heartbeats failing since" in " ".join(out.split())
            # Nothing shipped meanwhile: it could not have been deleted from the spool.
            assert audited() == []
        _wait(lambda: daemon_state().get("error") is None and daemon_state().get("last_ok_at"), "a good beat", proc)
        assert spool.pending() == 0
        assert audited() == sorted(paths)  # shipped once, not once per failed beat
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == Exit.OK
    finally:
        services.hosts.heartbeat_seconds = 30
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    lines = log.read_text().splitlines()
    failed = [ln for ln in lines if "heartbeat failed" in ln]
    assert len(failed) == 1 and "Operation not permitted (EPERM)" in failed[0], lines
    assert len([ln for ln in lines if "heartbeats succeed again" in ln]) == 1, lines
    assert not [ln for ln in lines if ln.startswith("Traceback")], lines
    assert read_json(state / STATUS_FILE) == {**daemon_state(), "running": False}


def test_a_revocation_reaches_the_daemon_whatever_the_state_directory_can_take(
        tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client) -> None:
    """The client remembers a revocation on disk; when the state directory cannot take
    the record, the refusal still reaches the daemon, which drops its keys and ends."""
    host = enroll_host(tmp_path, base_url, agent_url, admin, name="rofault")
    key = admin.post("/api/v1/keys", json={"name": unique("rf"), "tags": {"host-group": host.group}}).json()
    keyring = ServerKeyring(host.client, ttl_seconds=300, max_entries=8)
    keyring.get(uuid.UUID(key["id"]), 1)
    daemon = AgentDaemon(host.client, keyring, EventSpool(host.identity.state_dir / "spool"),
                         status_file=host.identity.state_dir / STATUS_FILE)
    assert admin.post(f"/api/v1/hosts/{host.id}/revoke").status_code == 200
    with immutable(host.identity.state_dir):
        stop = threading.Event()
        assert daemon.run(stop) == Exit.NOT_ENROLLED
    assert daemon.revoked and len(keyring.cache) == 0
    assert not (host.identity.state_dir / "revoked" / "host.json").exists()
