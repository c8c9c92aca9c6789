"""Issue 29's whole story on real parts: a key version protecting data in every kind of
holder — data keys an application holds, a FUSE guard point, a LUKS2 volume, a KMIP
client's ciphertext — is rotated away from and retired while readers and writers run
(none of them fails), the signed zero-use statement is checked by the offline verifier
alone, the version is destroyed, and then what was saved from before the retirement no
longer decrypts while everything current still does."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from kmip.pie.exceptions import KmipOperationFailure
from sqlalchemy import select

from agents.config import AgentConfig
from agents.cryptfile import read_header
from agents.daemon import AgentDaemon
from agents.guardpoint.manager import GuardPointManager
from agents.guardpoint.shield import serving, unshield_all
from agents.keyclient.client import ServerClient, ServerKeyring
from agents.keyclient.identity import HostIdentity
from agents.keyclient.spool import EventSpool
from agents.volume import luks
from agents.volume.manager import DAEMON, VolumeManager
from keyserver.kmip.server import build_listener
from keyserver.services import Services
from keyserver.store.models import KeyVersion, ManagedKey
from tests.agents.test_agent_port import enroll_host, group_key
from tests.agents.test_cli import write_config
from tests.agents.test_guardpoint_daemon import eventually
from tests.kmip.conftest import issue_client, make_client

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="needs /dev/fuse for FUSE"),
    pytest.mark.skipif(os.geteuid() != 0, reason="loop devices and mounts need root"),
    pytest.mark.skipif(not os.path.exists("/dev/loop-control"), reason="needs loop devices (/dev/loop-control)"),
    pytest.mark.skipif(shutil.which("cryptsetup") is None, reason="needs cryptsetup (Debian: cryptsetup-bin)"),
]


class Readers:
    """Threads reading (and one writing) through every holder while the retirement runs;
    every failure is kept, with what failed."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.reads = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def run(self, name: str, step: Callable[[], None]) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    step()
                    self.reads += 1
                except Exception as exc:
                    self.errors.append(f"{name}: {exc!r}")
                self._stop.wait(0.02)

        t = threading.Thread(target=loop, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


def _inventory(admin: httpx.Client, key: str, version: int) -> dict[str, Any]:
    r = admin.get(f"/api/v1/keys/{key}/versions/{version}/inventory")
    assert r.status_code == 200, r.text
    return dict(r.json())


def _holder(inv: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [h for h in inv["holders"] if h["kind"] == kind]


def _export(admin: httpx.Client, directory: Path) -> tuple[Path, Path, Path]:
    """What an auditor takes away: the log, the checkpoints and the public key."""
    log = directory / "audit.jsonl"
    with admin.stream("GET", "/api/v1/audit/export", params={"format": "jsonl"}) as r:
        assert r.status_code == 200
        log.write_bytes(b"".join(r.iter_bytes()))
    checkpoints: list[dict[str, Any]] = []
    while True:
        r = admin.get("/api/v1/audit/checkpoints", params={"after": checkpoints[-1]["checkpoint"] if checkpoints
                                                         else 0})
        assert r.status_code == 200, r.text
        if not r.json():
            break
        checkpoints += r.json()
    cps = directory / "checkpoints.json"
    cps.write_text(json.dumps(checkpoints))
    pem = directory / "audit-public.pem"
    pem.write_text(admin.get("/api/v1/audit/status").json()["public_key_pem"])
    return log, cps, pem


def test_retire_v1_from_every_holder_with_readers_running_prove_it_and_destroy_it(
        tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client, services: Services) -> None:
    if not DAEMON.exists():
        pytest.fail(f"{DAEMON} is not built: scripts/test builds it (native_need)")
    host = enroll_host(tmp_path, base_url, agent_url, admin, name="retire-e2e")
    config_path = write_config(tmp_path / "agent.toml", agent_url, host.identity.state_dir, tmp_path / "ca.pem",
                               run_dir=f'"{tmp_path / "run"}"')
    config = AgentConfig.load(config_path)
    client = ServerClient.for_host(agent_url, HostIdentity.load_or_create(host.identity.state_dir))
    guard_points = GuardPointManager(config, config_path)
    volumes = VolumeManager(client, config)
    daemon = AgentDaemon(client, ServerKeyring(client, ttl_seconds=300, max_entries=64),
                         EventSpool(config.spool_dir), guard_points=guard_points, volumes=volumes)
    key = group_key(admin, host.group)
    name = key["name"]
    listener = build_listener(services, port=0)
    listener.start()
    (tmp_path / "kmip").mkdir()
    kmip_files = issue_client(services, tmp_path / "kmip", "kmip-client")
    assert admin.patch(f"/api/v1/keys/{name}", json={"kmip_group": kmip_files.group}).status_code == 200
    kmip = make_client(kmip_files, listener.port)
    kmip.open()
    volume = f"vol-{uuid.uuid4().hex[:6]}"
    mnt, backing, image, vol_mnt = tmp_path / "gp", tmp_path / "gp-backing", tmp_path / "v.img", tmp_path / "vm"
    readers = Readers()
    try:
        # --- data under v1 in every kind of holder ------------------------------------------
        data_keys = [admin.post(f"/api/v1/keys/{name}/generate-data-key", json={}).json() for _ in range(3)]
        assert {d["key_version"] for d in data_keys} == {1}
        admin.post("/api/v1/guard-points", json={"host_id": host.id, "path": str(mnt),
                                                 "backing_path": str(backing), "key": name,
                                                 "default_effect": "permit"}).raise_for_status()
        daemon.beat()
        eventually(lambda: serving(str(mnt)), "the guard point's mount")
        files = {f"f{i}.txt": (f"record {i}\n" * 500).encode() for i in range(5)}
        for f, content in files.items():
            (mnt / f).write_bytes(content)
        assert {read_header(str(backing / f)).key_version for f in files} == {1}
        volumes.create(name=volume, path=image, key=name, size=48 << 20)
        opened = volumes.open(volume, userspace=True)
        assert subprocess.run(["mkfs.ext4", "-q", opened.device], check=False).returncode == 0
        volumes.close(volume)
        volumes.open(volume, mountpoint=vol_mnt, userspace=True)
        payload = os.urandom(1 << 20)
        (vol_mnt / "table.dat").write_bytes(payload)
        os.sync()
        def version_uids() -> dict[int, str]:
            """Each version's KMIP Unique Identifier (a KMIP key object is one version)."""
            with services.db() as s:
                return {v: str(i) for v, i in s.execute(select(KeyVersion.version, KeyVersion.id).join(ManagedKey)
                                                        .where(ManagedKey.name == name)).all()}

        uids = version_uids()
        kmip_ct, kmip_iv = kmip.encrypt(b"kmip client's record", uid=uids[1])

        # What an attacker (or a forgotten backup) keeps from before the retirement.
        old_file = (backing / "f0.txt").read_bytes()
        old_token = luks.token(image)
        assert old_token is not None and old_token[1]["key_version"] == 1
        old_volume_blob = base64.b64decode(old_token[1]["blob"])

        # --- rotate; readers and a writer run through everything from here on ----------------
        assert admin.post(f"/api/v1/keys/{name}/rotate").status_code == 200
        uids = version_uids()
        current_blobs = list(data_keys)
        lock = threading.Lock()

        def read_data_keys() -> None:
            with lock:
                blobs = list(current_blobs)
            for d in blobs:
                r = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": d["ciphertext_blob"]})
                assert r.status_code == 200, r.text
                assert r.json()["plaintext"] == data_keys[blobs.index(d)]["plaintext"]

        def read_files() -> None:
            for f, content in files.items():
                assert (mnt / f).read_bytes() == content

        counter = [0]

        def write_file() -> None:
            counter[0] += 1
            (mnt / "log.txt").write_bytes(f"entry {counter[0]}\n".encode() * 50)
            assert (mnt / "log.txt").read_bytes() == f"entry {counter[0]}\n".encode() * 50

        def read_volume() -> None:
            with open(vol_mnt / "table.dat", "rb") as fh:
                assert fh.read(65536) == payload[:65536]

        readers.run("data keys", read_data_keys)
        readers.run("guard point", read_files)
        readers.run("guard point writer", write_file)
        readers.run("volume", read_volume)

        inv = _inventory(admin, name, 1)
        assert inv["in_use"] and inv["kinds"]["data_keys"] == 3 and inv["kinds"]["volumes"] == 1, inv
        assert _holder(inv, "kmip_client"), inv

        # --- retire v1 ----------------------------------------------------------------------
        r = admin.post(f"/api/v1/keys/{name}/versions/1/retire", json={"reason": "annual key retirement"})
        assert r.status_code == 201, r.text
        # The application re-encrypts its blobs; the KMIP client re-encrypts its record
        # under v2 and is excluded by an operator, with the reason.
        for i, d in enumerate(list(current_blobs)):
            r = admin.post("/api/v1/datakeys/reencrypt", json={"ciphertext_blob": d["ciphertext_blob"]})
            assert r.status_code == 200 and r.json()["key_version"] == 2, r.text
            with lock:
                current_blobs[i] = {**r.json(), "plaintext": d["plaintext"]}
        kmip_plain = kmip.decrypt(kmip_ct, uid=uids[1], iv_counter_nonce=kmip_iv)
        kmip_ct2, kmip_iv2 = kmip.encrypt(kmip_plain, uid=uids[2])
        for holder in _holder(_inventory(admin, name, 1), "kmip_client"):
            r = admin.post(f"/api/v1/keys/{name}/versions/1/retire/exclusions",
                           json={"kind": "kmip_client", "holder": holder["holder"],
                                 "reason": "its records were re-encrypted under version 2"})
            assert r.status_code in (200, 201), r.text

        def complete() -> dict[str, Any] | None:
            daemon.beat()  # the agent walks its guard point and reseals its volume
            services.audit.flush()
            found = _inventory(admin, name, 1)
            return found if (found["retirement"] or {}).get("state") == "complete" else None

        done = eventually(complete, "the retirement to complete", timeout=120)
        readers.stop()
        assert readers.errors == [] and readers.reads > 20, (readers.errors[:5], readers.reads)
        assert not done["in_use"]
        assert {read_header(str(backing / f)).key_version for f in files} == {2}
        assert luks.token(image)[1]["key_version"] == 2  # type: ignore[index]

        # --- the statement, checked offline --------------------------------------------------
        services.audit.flush()
        statement_seq = done["retirement"]["statement_seq"]
        record = admin.get(f"/api/v1/audit/events/{statement_seq}").json()
        assert record["action"] == "key.version_retired" and record["details"]["version"] == 1
        statement = record["details"]["statement"]
        assert all(v == 0 for v in statement["counts"].values()), statement
        assert statement["initial"]["data_keys"] == 3 and statement["initial"]["volumes"] == 1, statement
        assert [e["kind"] for e in statement["excluded"]] == ["kmip_client"] * len(statement["excluded"])
        log, cps, pem = _export(admin, tmp_path)
        verified = subprocess.run([sys.executable, str(ROOT / "tools" / "verify_audit_offline.py"),
                                   "--export", str(log), "--checkpoints", str(cps), "--public-key", str(pem)],
                                  capture_output=True, text=True, check=False)
        assert verified.returncode == 0, verified.stdout + verified.stderr

        # --- destroy v1 (no shredding needed: nothing is left under it) ---------------------
        r = admin.post(f"/api/v1/keys/{name}/destroy", json={"version": 1})
        assert r.status_code == 200, r.text

        # What was saved from before no longer decrypts ...
        for d in data_keys:
            r = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": d["ciphertext_blob"]})
            assert r.status_code in (409, 410), r.text
        with pytest.raises(KmipOperationFailure):
            kmip.decrypt(kmip_ct, uid=uids[1], iv_counter_nonce=kmip_iv)
        with pytest.raises(Exception, match="destroyed"):
            client.unseal_volume(old_token[1]["volume_id"], old_volume_blob)
        # A v1 file put back where the agent serves: once the host has heard of the
        # destruction (its next beat), the data plane no longer holds v1 either.
        daemon.beat()
        (backing / "old-copy.txt").write_bytes(old_file)

        def unreadable() -> bool:
            try:
                (mnt / "old-copy.txt").read_bytes()
            except OSError:
                return True
            daemon.beat()
            return False

        eventually(unreadable, "the host to forget the destroyed version", timeout=30)
        daemon.beat()
        services.audit.flush()
        dropped = admin.get("/api/v1/audit/events", params={"action": "agent.guardpoint.key_dropped",
                                                            "limit": 10}).json()["items"]
        assert [e["details"]["key_version"] for e in dropped] == [1], dropped
        # ... and everything current does.
        for d in current_blobs:
            r = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": d["ciphertext_blob"]})
            assert r.status_code == 200 and r.json()["plaintext"] == d["plaintext"], r.text
        assert kmip.decrypt(kmip_ct2, uid=uids[2], iv_counter_nonce=kmip_iv2) == b"kmip client's record"
        for f, content in files.items():
            assert (mnt / f).read_bytes() == content
        volumes.close(volume)
        volumes.open(volume, mountpoint=vol_mnt, userspace=True)
        assert (vol_mnt / "table.dat").read_bytes() == payload
    finally:
        readers.stop()
        kmip.close()
        listener.stop()
        volumes.close(volume)
        guard_points.stop_all()
        unshield_all(config.state_dir)
