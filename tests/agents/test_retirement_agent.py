"""The agent's side of retiring a key version (decision 0024), on real parts: the key
server in-process over its agent port (mutual TLS), FUSE guard points served by
`strongroom-fuse`, LUKS2 volumes with stock cryptsetup and the userspace volume data
plane; the retirement started and cancelled through the server's REST routes.

A guard point counts its files per header version at every walk (start-up, rotation, a
version newly retiring) and the heartbeat carries the count to the server's inventory;
a volume sealed under a retiring version is re-sealed by the daemon on its own, and
still opens with its data.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.config import AgentConfig
from agents.cryptfile import read_header
from agents.daemon import AgentDaemon
from agents.guardpoint.manager import GuardPointManager
from agents.guardpoint.shield import serving, unshield_all
from agents.keyclient.client import ServerClient, ServerKeyring
from agents.keyclient.identity import HostIdentity
from agents.keyclient.spool import EventSpool
from agents.volume import luks
from agents.volume.instance import RunDir
from agents.volume.manager import DAEMON, VolumeManager
from keyserver.services import Services
from keyserver.store.models import Host as HostRow
from tests.agents.test_agent_port import Host, enroll_host, group_key
from tests.agents.test_cli import write_config
from tests.agents.test_guardpoint_daemon import eventually
from tests.conftest import unique

pytestmark = pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="needs /dev/fuse for FUSE")


def _retire(admin: httpx.Client, key: str, version: int) -> dict[str, Any]:
    r = admin.post(f"/api/v1/keys/{key}/versions/{version}/retire", json={"reason": "test: the agent's side"})
    assert r.status_code == 201, r.text
    return dict(r.json())


def _finish(admin: httpx.Client, key: str, version: int) -> None:
    """The shared server: a retirement this test started is not left running."""
    inv = admin.get(f"/api/v1/keys/{key}/versions/{version}/inventory").json()
    if (inv.get("retirement") or {}).get("state") == "running":
        assert admin.delete(f"/api/v1/keys/{key}/versions/{version}/retire").status_code == 200


def _holders(admin: httpx.Client, key: str, version: int, kind: str) -> list[dict[str, Any]]:
    r = admin.get(f"/api/v1/keys/{key}/versions/{version}/inventory")
    assert r.status_code == 200, r.text
    return [h for h in r.json()["holders"] if h["kind"] == kind]


@pytest.fixture
def gp_agent(tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client,
             services: Services) -> Iterator[tuple[Host, AgentDaemon, GuardPointManager]]:
    host = enroll_host(tmp_path, base_url, agent_url, admin, name="gpret")
    config_path = write_config(tmp_path / "agent.toml", agent_url, host.identity.state_dir, tmp_path / "ca.pem")
    config = AgentConfig.load(config_path)
    manager = GuardPointManager(config, config_path)
    daemon = AgentDaemon(host.client, ServerKeyring(host.client, ttl_seconds=300, max_entries=64),
                         EventSpool(config.spool_dir), guard_points=manager)
    try:
        yield host, daemon, manager
    finally:
        manager.stop_all()
        unshield_all(config.state_dir)


def test_a_guard_point_reports_its_files_per_version_through_rotation_and_retirement(
        tmp_path: Path, gp_agent: tuple[Host, AgentDaemon, GuardPointManager], admin: httpx.Client,
        services: Services) -> None:
    host, daemon, _ = gp_agent

    def reported() -> dict[str, Any]:
        """The guard point's report in the last heartbeat, as the server stored it."""
        daemon.beat()
        with services.db() as s:
            row = s.get(HostRow, uuid.UUID(host.id))
            assert row is not None
            (gp_report,) = row.guard_points
        return dict(gp_report)

    key = group_key(admin, host.group)
    mnt, backing = tmp_path / "data", tmp_path / "data-backing"
    mnt.mkdir()
    for i in range(4):  # files already there: protected under v1 when the guard point starts
        (mnt / f"f{i}.txt").write_text(f"file {i}\n" * 100)
    admin.post("/api/v1/guard-points", json={"host_id": host.id, "path": str(mnt), "backing_path": str(backing),
                                             "key": key["name"], "default_effect": "permit"}).raise_for_status()
    daemon.beat()
    eventually(lambda: serving(str(mnt)), "the mount")
    # The walk at start-up: every file under v1.
    first = eventually(lambda: (r := reported()).get("versions") == {"1": 4} and r, "the start-up count")
    assert datetime.fromisoformat(first["scanned_at"]).tzinfo is not None
    (mnt / "later.txt").write_text("written through the mount under v1\n")
    os.link(mnt / "f0.txt", mnt / "f0-second-name.txt")  # one file, two names: counted once
    assert read_header(str(backing / "later.txt")).key_version == 1

    # Rotation: the walk re-wraps every header to v2 and counts them there.
    assert admin.post(f"/api/v1/keys/{key['name']}/rotate").status_code == 200
    after = eventually(lambda: (r := reported()).get("versions") == {"2": 5} and r, "the count after rotation")
    assert after["scanned_at"] > first["scanned_at"]
    assert {read_header(str(p)).key_version for p in backing.iterdir()} == {2}
    assert (mnt / "f0-second-name.txt").read_text() == "file 0\n" * 100

    # v1 retiring: the agent walks again, so its count is newer than the retirement's
    # start and the inventory finds the guard point clear. A file whose header it cannot
    # read is counted apart (`unreadable`), never as moved: the inventory shows it, and
    # it blocks nothing, since no version of the key decrypts it.
    (backing / "damaged").write_bytes(b"not a header" * 20)
    retirement = _retire(admin, key["name"], 1)
    try:
        started = datetime.fromisoformat(retirement["requested_at"])
        recount = eventually(lambda: datetime.fromisoformat((r := reported()).get("scanned_at") or "1970-01-01T00:00"
                                                            "+00:00") > started and r, "a walk after the start")
        assert recount["versions"] == {"2": 5} and recount["unreadable"] == 1, recount
        assert "readable header" not in recount["detail"]
        (gp_holder,) = _holders(admin, key["name"], 1, "guard_point")
        assert (gp_holder["state"], gp_holder["count"], gp_holder["unreadable"]) == ("clear", 0, 1), gp_holder
        (gp_v2,) = _holders(admin, key["name"], 2, "guard_point")
        assert gp_v2["count"] == 5 and gp_v2["unreadable"] == 1
    finally:
        _finish(admin, key["name"], 1)


def test_counts_go_only_to_a_server_that_takes_them(
        tmp_path: Path, gp_agent: tuple[Host, AgentDaemon, GuardPointManager], admin: httpx.Client) -> None:
    """A server whose key list has no `retiring_versions` (one from before retirement)
    refuses fields it does not know in a heartbeat: the agent sends it no counts."""
    host, daemon, manager = gp_agent
    key = group_key(admin, host.group)
    mnt = tmp_path / "p"
    admin.post("/api/v1/guard-points", json={"host_id": host.id, "path": str(mnt),
                                             "backing_path": str(tmp_path / "pb"), "key": key["name"],
                                             "default_effect": "permit"}).raise_for_status()
    daemon.beat()
    eventually(lambda: serving(str(mnt)), "the mount")
    (counted,) = eventually(lambda: manager.reports()[0].get("versions") is not None and manager.reports(),
                            "the count")
    assert counted["versions"] == {} and counted["scanned_at"] and counted["unreadable"] == 0
    definitions = host.client.guard_points()
    old_server_keys = [{f: v for f, v in k.items() if f != "retiring_versions"} for k in host.client.list_keys()]
    manager.apply(definitions, {k["key_id"]: k["active_version"] for k in old_server_keys}, None)
    (without,) = manager.reports()
    assert "versions" not in without and "scanned_at" not in without and "unreadable" not in without


def test_a_guard_point_with_encryption_off_counts_its_files_as_stored(
        tmp_path: Path, gp_agent: tuple[Host, AgentDaemon, GuardPointManager], admin: httpx.Client,
        services: Services) -> None:
    """Mode off serves the backing files as stored: they are counted as they are (not
    re-wrapped), so a version they are under stays in use; files in clear are the mode's
    own and not reported unreadable."""
    host, daemon, _ = gp_agent
    key = group_key(admin, host.group)
    mnt, backing = tmp_path / "off", tmp_path / "off-backing"
    mnt.mkdir()
    (mnt / "a.txt").write_text("under v1")
    (mnt / "b.txt").write_text("under v1 too")
    body = {"host_id": host.id, "path": str(mnt), "backing_path": str(backing), "key": key["name"],
            "default_effect": "permit"}
    gp = admin.post("/api/v1/guard-points", json=body).json()

    def reported() -> dict[str, Any]:
        daemon.beat()
        with services.db() as s:
            row = s.get(HostRow, uuid.UUID(host.id))
            assert row is not None
            (gp_report,) = row.guard_points
        return dict(gp_report)

    daemon.beat()
    eventually(lambda: reported().get("versions") == {"1": 2}, "the count while mounted")
    assert admin.put(f"/api/v1/guard-points/{gp['id']}", json={**body, "mode": "off"}).status_code == 200
    eventually(lambda: (r := reported())["state"] == "off" and r["revision"] == 2, "the raw view")
    (mnt / "clear.txt").write_text("written in clear while off")
    assert admin.post(f"/api/v1/keys/{key['name']}/rotate").status_code == 200
    retirement = _retire(admin, key["name"], 1)
    try:
        started = datetime.fromisoformat(retirement["requested_at"])
        off = eventually(lambda: (r := reported())["state"] == "off" and r.get("scanned_at")
                         and datetime.fromisoformat(r["scanned_at"]) > started and r, "the count while off")
        assert off["versions"] == {"1": 2} and off["unreadable"] == 0
        assert read_header(str(backing / "a.txt")).key_version == 1  # as stored: not re-wrapped
        (holder,) = _holders(admin, key["name"], 1, "guard_point")
        assert holder["state"] == "in_use" and holder["count"] == 2
    finally:
        _finish(admin, key["name"], 1)


# --- volumes ------------------------------------------------------------------------------


def _sh(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="loop devices and mounts need root")
@pytest.mark.skipif(not os.path.exists("/dev/loop-control"), reason="needs loop devices (/dev/loop-control)")
@pytest.mark.skipif(shutil.which("cryptsetup") is None, reason="needs cryptsetup (Debian: cryptsetup-bin)")
@pytest.mark.parametrize("while_open", [False, True], ids=["closed", "open-and-mounted"])
def test_the_daemon_reseals_a_volume_off_a_retiring_version(
        while_open: bool, tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client,
        services: Services, caplog: pytest.LogCaptureFixture) -> None:
    """`kms-agent volume rotate`, done by the daemon once the sealing version is retiring:
    for a closed volume, and for one open and mounted (a keyslot change, which rotate
    does on an open volume too: the data plane keeps the volume key it holds)."""
    if not DAEMON.exists():
        pytest.fail(f"{DAEMON} is not built: scripts/test builds it (native_need)")
    host = enroll_host(tmp_path, base_url, agent_url, admin, name="volret")
    config = AgentConfig.load(write_config(tmp_path / "agent.toml", agent_url, host.identity.state_dir,
                                           tmp_path / "ca.pem", run_dir=f'"{tmp_path / "run"}"'))
    client = ServerClient.for_host(agent_url, HostIdentity.load_or_create(host.identity.state_dir))
    volumes = VolumeManager(client, config)
    spool = EventSpool(config.spool_dir)
    daemon = AgentDaemon(client, ServerKeyring(client, ttl_seconds=60, max_entries=8), spool, volumes=volumes)
    key = group_key(admin, host.group)
    image, mnt = tmp_path / "ret.img", tmp_path / "m"
    name = unique("ret")
    volumes.create(name=name, path=image, key=key["name"], size=48 << 20)
    opened = volumes.open(name, userspace=True)
    assert _sh("mkfs.ext4", "-q", opened.device).returncode == 0
    volumes.close(name)
    volumes.open(name, mountpoint=mnt, userspace=True)
    payload = os.urandom(2 << 20)
    (mnt / "data").write_bytes(payload)
    os.sync()
    retiring = False
    try:
        if not while_open:
            volumes.close(name)
        before = image.read_bytes()[16 << 20:]
        assert admin.post(f"/api/v1/keys/{key['name']}/rotate").status_code == 200
        daemon.beat()  # rotated, nothing retiring: left as it is
        assert luks.token(image)[1]["key_version"] == 1  # type: ignore[index]
        (vol_holder,) = _holders(admin, key["name"], 1, "volume")
        assert vol_holder["state"] == "in_use"

        _retire(admin, key["name"], 1)
        retiring = True
        # A `volume rekey` running here holds the volume's header: not touched, said in
        # the log, tried again at the next beat.
        with RunDir(tmp_path / "run").rekey_held(name), caplog.at_level(logging.WARNING, "strongroom.agent"):
            daemon.beat()
        assert luks.token(image)[1]["key_version"] == 1  # type: ignore[index]
        assert f"volume {name}: re-sealing it off a retiring key version failed" in caplog.text
        assert "already running" in caplog.text
        daemon.beat()
        meta = luks.metadata(image)
        (tok,) = [t for t in meta["tokens"].values() if t["type"] == "strongroom"]
        assert tok["key_version"] == 2 and list(meta["keyslots"]) == tok["keyslots"]  # the v1 keyslot gone
        (vol,) = [v for v in admin.get("/api/v1/volumes").json() if v["path"] == str(image)]
        assert vol["key_version"] == 2 and vol["state"] == ("open" if while_open else "closed")
        if not while_open:
            assert image.read_bytes()[16 << 20:] == before  # no data rewritten
        (vol_holder,) = _holders(admin, key["name"], 1, "volume")
        assert vol_holder["state"] == "clear"

        daemon.beat()  # once: nothing more to do, nothing more said
        assert spool.pending() == 0
        services.audit.flush()
        items = admin.get("/api/v1/audit/events", params={"object_id": vol["id"], "limit": 50}).json()["items"]
        resealed = [e for e in items if e["action"] == "agent.volume.resealed_for_retirement"]
        assert len(resealed) == 1, [e["action"] for e in items]
        assert resealed[0]["details"]["from_version"] == 1 and resealed[0]["details"]["to_version"] == 2

        # Still the same data, opened through the new keyslot.
        if while_open:
            assert (mnt / "data").read_bytes() == payload
            volumes.close(name)
        volumes.open(name, mountpoint=mnt, userspace=True)
        assert (mnt / "data").read_bytes() == payload
    finally:
        if retiring:
            _finish(admin, key["name"], 1)
        volumes.close(name)
