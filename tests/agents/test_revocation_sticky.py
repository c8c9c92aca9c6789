"""Revocation is sticky on the host: once the key server has said no to a volume, to its
key or to the host itself, the agent forgets what an offline open would use, remembers
the refusal on disk, and no offline path opens the volume (or starts a guard point)
again. Every offline use and refusal reaches the audit log with its volume.

Real parts, as in test_volume_cli.py: the key server's agent port over mutual TLS,
cryptsetup, the userspace data plane on FUSE and loop devices. "Offline" is the same
agent pointed at an address where nothing listens (the server's refusals were seen
before, over the real port)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.cli import Exit
from keyserver.services import Services
from tests.agents.test_agent_port import enroll_host, group_key
from tests.agents.test_cli import kms_agent, write_config
from tests.agents.test_volume_cli import Agent
from tests.agents.test_volume_cli import pytestmark as volume_marks

pytestmark = volume_marks

DEAD = "https://127.0.0.1:9"  # nothing listens there: every call is "unreachable"


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], base_url: str,
          agent_url: str, admin: httpx.Client) -> Iterator[Agent]:
    a = Agent(tmp_path, monkeypatch, capsys, base_url, agent_url, admin)
    yield a
    for state in (a.run_dir / "volumes").glob("*.json"):  # what a failed test left open
        Offline(a)("volume", "close", state.stem)


class Offline:
    """The same host's agent, with the key server unreachable."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.config = write_config(agent.tmp / "offline.toml", DEAD, agent.state, agent.tmp / "ca.pem",
                                   run_dir=f'"{agent.run_dir}"', request_timeout_seconds=2)

    def __call__(self, *args: str) -> tuple[int, str, str]:
        return kms_agent(self.agent._mp, self.agent._capsys, self.config, *args)


def _volume(admin: httpx.Client, image: Path) -> dict[str, Any]:
    (vol,) = [v for v in admin.get("/api/v1/volumes").json() if v["path"] == str(image)]
    return dict(vol)


def _with_grace(agent: Agent, admin: httpx.Client, name: str, image: Path, key: str) -> tuple[dict[str, Any], Path]:
    """A volume with an hour's offline grace, opened once online (so its passphrase is
    kept) and closed again."""
    agent.ok("create", name, str(image), "--key", key, "--size", "40M", "--yes")
    vol = _volume(admin, image)
    assert admin.put(f"/api/v1/volumes/{vol['id']}/policy", json={"grace_seconds": 3600}).status_code == 200
    agent.ok("open", name, "--userspace")
    agent.ok("close", name)
    kept = agent.state / "volume-grace" / f"{vol['id']}.json"
    assert kept.exists()
    return vol, kept


def _spooled(agent: Agent) -> list[dict[str, Any]]:
    return [json.loads(line) for p in sorted((agent.state / "spool").glob("*.jsonl"))
            for line in p.read_text().splitlines() if line.strip()]


def _audit(services: Services, admin: httpx.Client, volume_id: str) -> list[dict[str, Any]]:
    services.audit.flush()
    r = admin.get("/api/v1/audit/events", params={"object_id": volume_id, "limit": 100})
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


def test_a_revoked_volume_never_opens_offline_again(agent: Agent, admin: httpx.Client, tmp_path: Path,
                                                    services: Services) -> None:
    key = group_key(admin, agent.group)
    vol, kept = _with_grace(agent, admin, "revoked", tmp_path / "revoked.img", key["name"])
    offline = Offline(agent)
    assert admin.post(f"/api/v1/volumes/{vol['id']}/revoke").status_code == 200

    code, _, err = agent("open", "revoked", "--userspace")
    assert code == Exit.KEY and "volume_revoked" in err
    assert not kept.exists(), "the kept passphrase outlived the revocation"
    assert (agent.state / "revoked" / "volumes" / f"{vol['id']}.json").exists()  # the tombstone

    code, _, err = offline("volume", "open", "revoked", "--userspace")
    assert code == Exit.KEY, err
    assert "volume_revoked" in err and "does not open offline" in err
    assert not (agent.run_dir / "volumes" / "revoked.json").exists() and not kept.exists()
    refused = [e for e in _spooled(agent) if e["event"] == "volume.open_failed"]
    assert refused and refused[-1]["reason"] == "revoked" and refused[-1]["volume_id"] == vol["id"]
    assert refused[-1]["name"] == "revoked"

    # Seen by listing alone: `volume status` shows the volume revoked, and that is enough.
    vol2, kept2 = _with_grace(agent, admin, "listed", tmp_path / "listed.img", key["name"])
    assert admin.post(f"/api/v1/volumes/{vol2['id']}/revoke").status_code == 200
    agent.ok("status")
    assert not kept2.exists()
    code, _, err = offline("volume", "open", "listed", "--userspace")
    assert code == Exit.KEY and "does not open offline" in err

    # Both refusals reach the audit log as records of their volume once the spool ships.
    agent.ok("status")
    records = _audit(services, admin, vol["id"])
    failed = [r for r in records if r["action"] == "agent.volume.open_failed"]
    assert failed and failed[0]["object_type"] == "volume" and failed[0]["details"]["reason"] == "revoked"
    assert failed[0]["details"]["name"] == "revoked"


def test_a_destroyed_key_never_opens_its_volume_offline(agent: Agent, admin: httpx.Client, tmp_path: Path) -> None:
    key = group_key(admin, agent.group)
    _, kept = _with_grace(agent, admin, "shred", tmp_path / "shred.img", key["name"])
    assert admin.post(f"/api/v1/keys/{key['name']}/revoke", json={"reason": "key-compromise"}).status_code == 200
    assert admin.post(f"/api/v1/keys/{key['name']}/destroy", json={"shred": True}).status_code == 200
    code, _, err = agent("open", "shred", "--userspace")
    assert code == Exit.KEY and "destroyed" in err.lower()
    assert not kept.exists()
    code, _, err = Offline(agent)("volume", "open", "shred", "--userspace")
    assert code == Exit.KEY and "does not open offline" in err
    assert not (agent.run_dir / "volumes" / "shred.json").exists()


def test_a_compromised_key_never_opens_its_volume_offline(agent: Agent, admin: httpx.Client,
                                                          tmp_path: Path) -> None:
    key = group_key(admin, agent.group)
    _, kept = _with_grace(agent, admin, "leaked", tmp_path / "leaked.img", key["name"])
    assert admin.post(f"/api/v1/keys/{key['name']}/revoke", json={"reason": "key-compromise"}).status_code == 200
    code, _, err = agent("open", "leaked", "--userspace")
    assert code == Exit.KEY and "compromised" in err.lower()
    assert not kept.exists()
    code, _, err = Offline(agent)("volume", "open", "leaked", "--userspace")
    assert code == Exit.KEY and "does not open offline" in err


def test_a_revoked_host_opens_nothing_offline_until_enrolled_again(agent: Agent, admin: httpx.Client,
                                                                   tmp_path: Path) -> None:
    key = group_key(admin, agent.group)
    vol, kept = _with_grace(agent, admin, "hostvol", tmp_path / "hostvol.img", key["name"])
    gp = admin.post("/api/v1/guard-points", json={
        "host_id": vol["host_id"], "path": str(tmp_path / "gp"), "backing_path": str(tmp_path / "gp-b"),
        "key": key["name"], "default_effect": "permit"})
    assert gp.status_code == 201, gp.text
    assert admin.post(f"/api/v1/hosts/{vol['host_id']}/revoke").status_code == 200
    code, _, err = agent("open", "hostvol", "--userspace")
    assert code == Exit.NOT_ENROLLED and "re-enroll" in err
    assert not kept.exists()
    assert (agent.state / "revoked" / "host.json").exists()

    offline = Offline(agent)
    code, _, err = offline("volume", "open", "hostvol", "--userspace")
    assert code == Exit.NOT_ENROLLED and "host_revoked" in err and "kms-agent enroll" in err
    assert not (agent.run_dir / "volumes" / "hostvol.json").exists()
    tab = tmp_path / "volumes.tab"
    tab.write_text("hostvol - userspace\n")
    code, _, err = offline("volume", "open-all", "--tab", str(tab), "--wait", "1")
    assert code == Exit.NOT_ENROLLED and "kms-agent enroll" in err
    refused = [e for e in _spooled(agent) if e["event"] == "volume.open_failed"]
    assert refused[-1]["reason"] == "revoked" and refused[-1]["revocation"] == "host_revoked"
    assert refused[-1]["volume_id"] == vol["id"]
    code, _, err = offline("status")
    assert code == Exit.NOT_ENROLLED and "host_revoked" in err and "kms-agent enroll" in err

    # The daemon serves none of its guard points: it refuses to start, with the server
    # away (it would otherwise wait for the server, beating; the timeout only stops a hang).
    daemon = subprocess.run([sys.executable, "-c", "from agents.cli import main; main()", "--config",
                             str(offline.config), "run"], capture_output=True, text=True, timeout=120, check=False)
    said = " ".join(daemon.stderr.split())
    assert daemon.returncode == Exit.NOT_ENROLLED, said
    assert "host_revoked" in said and "kms-agent enroll" in said
    assert not (tmp_path / "gp").is_mount()

    # Enrolling again (a new certificate) clears it.
    token = admin.post("/api/v1/enrollment-tokens", json={"host_group": agent.group}).json()["secret"]
    code, _, err = kms_agent(agent._mp, agent._capsys, agent.config, "enroll", "--token", token)
    assert code == Exit.OK, err
    assert not (agent.state / "revoked" / "host.json").exists()
    agent.ok("status")


def test_an_offline_open_within_grace_is_audited_with_its_volume(agent: Agent, admin: httpx.Client,
                                                                 tmp_path: Path, services: Services) -> None:
    key = group_key(admin, agent.group)
    vol, kept = _with_grace(agent, admin, "graced", tmp_path / "graced.img", key["name"])
    offline = Offline(agent)
    code, _, err = offline("volume", "open", "graced", "--userspace")
    assert code == Exit.OK, err
    assert offline("volume", "close", "graced")[0] == Exit.OK
    (spooled,) = [e for e in _spooled(agent) if e["event"] == "volume.open_offline"]
    assert spooled["volume_id"] == vol["id"] and spooled["name"] == "graced"

    agent.ok("status")  # online again: the spool ships
    (record,) = [r for r in _audit(services, admin, vol["id"]) if r["action"] == "agent.volume.open_offline"]
    assert record["object_type"] == "volume" and record["object_id"] == vol["id"]
    assert record["details"]["name"] == "graced" and record["actor"].startswith("host:")
    assert kept.exists()


def test_a_running_daemon_stops_when_another_process_saw_the_revocation(tmp_path: Path, base_url: str,
                                                                         agent_url: str, admin: httpx.Client) -> None:
    """The daemon cannot reach the server, so it would keep its guard points up on cached
    keys; another process of the host (a volume command, a guard point) hears that the
    host is revoked, and the daemon stands down at its next turn, without the server."""
    from agents.daemon import AgentDaemon
    from agents.keyclient.client import HostRevoked, ServerClient, ServerKeyring
    from agents.keyclient.revocation import RevocationLedger
    from agents.keyclient.spool import EventSpool

    host = enroll_host(tmp_path, base_url, agent_url, admin, name="daemon")
    away = ServerClient.for_host(DEAD, host.identity, timeout=2)
    keyring = ServerKeyring(away, ttl_seconds=300, max_entries=8)
    daemon = AgentDaemon(away, keyring, EventSpool(tmp_path / "spool"),
                         revocations=RevocationLedger(host.identity.state_dir))
    assert admin.post(f"/api/v1/hosts/{host.id}/revoke").status_code == 200
    with pytest.raises(HostRevoked):
        host.client.volumes()
    assert daemon.run(threading.Event()) == Exit.NOT_ENROLLED and daemon.revoked
