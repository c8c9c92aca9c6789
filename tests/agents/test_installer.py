"""A new host as an operator would bring it in: the installer one-liner against a running
keyserver (into a temporary prefix instead of /opt), enrollment, key delivery, encrypt and
decrypt, rotation on the server then rewrap, tampering, and revocation — all through the
installed `kms-agent`, a separate process with its own Python environment.

The installer's venv gets the agent's dependencies from the package index (pip's cache
makes later runs quick)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import uuid
import zipfile
from io import BytesIO
from pathlib import Path

import httpx
import pytest

from agents.cryptfile import read_header
from keyserver.runtime.agentdist import build_wheel
from keyserver.services import Services
from tests import https
from tests.conftest import unique


def test_the_agent_wheel_is_complete_and_reproducible() -> None:
    wheel = build_wheel()
    assert wheel.data == build_wheel().data  # every worker serves the same bytes
    names = zipfile.ZipFile(BytesIO(wheel.data)).namelist()
    assert "agents/cli.py" in names and "agents/cryptfile/file.py" in names
    dist = f"strongroom_agent-{wheel.version}.dist-info"
    entry = zipfile.ZipFile(BytesIO(wheel.data)).read(f"{dist}/entry_points.txt").decode()
    assert "kms-agent = agents.cli:main" in entry
    assert not any("__pycache__" in n or n.startswith(("keyserver/", "hsm/")) for n in names)
    # The compiled format engine and both data planes as built on this server
    # (tests/agents/conftest.py builds them); the daemons install executable.
    assert "agents/dataplane/build/libsrcf.so" in names
    for plane in ("fuse/strongroom-fuse", "volume/strongroom-volume"):
        daemon = zipfile.ZipFile(BytesIO(wheel.data)).getinfo(f"agents/dataplane/{plane}")
        assert (daemon.external_attr >> 16) & 0o111


def test_downloads_and_installer_are_served(base_url: str, agent_url: str) -> None:
    wheel = build_wheel()
    ca = https.get(f"{base_url}/ca.pem")
    assert ca.status_code == 200 and ca.text.startswith("-----BEGIN CERTIFICATE-----")
    r = https.get(f"{base_url}/downloads/{wheel.filename}")
    assert r.status_code == 200 and r.content == wheel.data and r.headers["x-checksum-sha256"] == wheel.sha256
    missing = https.get(f"{base_url}/downloads/other-1.0.whl")
    assert missing.status_code == 404 and wheel.filename in missing.json()["detail"]
    script = https.get(f"{base_url}/install.sh").text
    assert f"SERVER_URL='{agent_url}'" in script and wheel.sha256 in script and "@" + "CA_PEM@" not in script


def test_the_installer_refuses_without_a_token(tmp_path: Path, base_url: str) -> None:
    script = tmp_path / "install.sh"
    script.write_text(https.get(f"{base_url}/install.sh").text)
    r = subprocess.run(["sh", str(script), "--prefix", str(tmp_path / "p")], capture_output=True, text=True,
                       env={**os.environ, "STRONGROOM_ENROLL_TOKEN": ""}, check=False)
    assert r.returncode == 1 and "enrollment token is required" in r.stderr
    r = subprocess.run(["sh", str(script), "--token", "x", "--bogus"], capture_output=True, text=True, check=False)
    assert r.returncode == 1 and "unknown option '--bogus'" in r.stderr


@pytest.mark.slow
def test_a_new_host_from_installer_to_revocation(tmp_path: Path, base_url: str, agent_url: str,
                                                 admin: httpx.Client, services: Services) -> None:
    group = unique("e2e")
    key = admin.post("/api/v1/keys", json={"name": unique("e2e"), "tags": {"host-group": group}}).json()
    secret = admin.post("/api/v1/enrollment-tokens", json={"host_group": group}).json()["secret"]
    info = admin.get("/api/v1/enrollment-info").json()
    assert info["install_command"] == f"curl -fsS --cacert ca.pem {agent_url}/install.sh | sudo sh -s -- --token TOKEN"
    ca = tmp_path / "ca.pem"
    ca.write_text(info["ca_pem"])
    openssl = subprocess.run(["openssl", "x509", "-in", str(ca), "-noout", "-fingerprint", "-sha256"],
                             capture_output=True, text=True, check=True).stdout
    assert openssl.strip().endswith("=" + info["ca_fingerprint_sha256"])  # what the operator compares
    prefix = tmp_path / "agent"

    # The one-liner, as the console shows it (no sudo: a prefix this user owns).
    one_liner = info["install_command"].replace("sudo ", "").replace("ca.pem", str(ca)).replace("TOKEN", secret)
    r = subprocess.run(f"{one_liner} --prefix {prefix} --no-systemd --hostname e2e.example.com", shell=True,  # noqa: S602 - the one-liner is a shell pipeline
                       capture_output=True, text=True, timeout=240, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "enrolled as host" in r.stdout and "kms-agent --config" in r.stdout
    state = prefix / "state"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700 and stat.S_IMODE((state / "host.key").stat().st_mode) == 0o600

    config = prefix / "etc" / "agent.toml"

    def agent(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(prefix / "bin" / "kms-agent"), "--config", str(config), *args],
                              capture_output=True, text=True, timeout=120, check=False)

    st = agent("status", "--json")
    assert st.returncode == 0, st.stderr
    report = json.loads(st.stdout)
    assert report["host_group"] == group and report["state"] == "active"
    assert report["format_engine"].startswith("native ("), report["format_engine"]  # the wheel's library loads
    assert [k["name"] for k in report["keys"]] == [key["name"]]

    # Encrypt a directory in place, then decrypt it back.
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    originals = {data / "a.txt": b"hello " * 1000, data / "sub" / "b.bin": os.urandom(1 << 20) + b"tail",
                 data / "empty": b""}
    for p, content in originals.items():
        p.write_bytes(content)
    enc = agent("encrypt", str(data), "--key", key["name"])
    assert enc.returncode == 0, enc.stderr
    assert "3 file(s) done" in enc.stdout
    for p in originals:
        h = read_header(str(p))
        assert h.key_id == uuid.UUID(key["id"]) and h.key_version == 1
    assert agent("encrypt", str(data), "--key", key["name"]).stdout.strip().endswith("already in the wanted state")

    # Rotate on the server, then rewrap: headers move to version 2, data is untouched.
    assert admin.post(f"/api/v1/keys/{key['name']}/rotate").status_code == 200
    body_before = (data / "sub" / "b.bin").read_bytes()[200:]
    rw = agent("rewrap", str(data))
    assert rw.returncode == 0, rw.stderr
    assert {read_header(str(p)).key_version for p in originals} == {2}
    assert (data / "sub" / "b.bin").read_bytes()[-1000:] == body_before[-1000:]

    # Tampering is named, and leaves the file as it was.
    victim = data / "a.txt"
    spoiled = bytearray(victim.read_bytes())
    spoiled[-5] ^= 1
    victim.write_bytes(spoiled)
    bad = agent("decrypt", str(victim), "-o", str(tmp_path / "out"))
    assert bad.returncode == 3 and "integrity" in bad.stderr and "a.txt" in bad.stderr
    assert victim.read_bytes() == spoiled and not (tmp_path / "out").exists()
    spoiled[-5] ^= 1
    victim.write_bytes(spoiled)

    dec = agent("decrypt", str(data))
    assert dec.returncode == 0, dec.stderr
    for p, content in originals.items():
        assert p.read_bytes() == content

    # Everything the host did is in the audit log under its name.
    services.audit.flush()
    events = admin.get("/api/v1/audit/events", params={"actor": "host:e2e.example.com", "limit": 200}).json()["items"]
    actions = {e["action"] for e in events}
    assert {"key.deliver", "agent.file.encrypt", "agent.file.rewrap", "agent.file.decrypt"} <= actions

    # Revoke the host: its next call is refused, with what to do.
    host_id = report["host_id"]
    assert admin.post(f"/api/v1/hosts/{host_id}/revoke").status_code == 200
    refused = agent("status")
    assert refused.returncode == 6 and "re-enroll" in refused.stderr
    refused = agent("encrypt", str(data), "--key", key["name"])
    assert refused.returncode == 6
    shutil.rmtree(prefix)
