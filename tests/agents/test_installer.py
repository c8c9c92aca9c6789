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

from agents.config import AgentConfig
from agents.cryptfile import read_header
from keyserver.runtime.agentdist import build_wheel
from keyserver.runtime.agentport import install_command, loopback_warning
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


def _fake_bin(directory: Path, **scripts: str) -> Path:
    """A directory of stand-in commands (name -> shell script body) to put on PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        path = directory / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return directory


def _only(directory: Path, *tools: str) -> str:
    """A PATH of `directory` and nothing else: these real tools linked into it."""
    for tool in tools:
        real = shutil.which(tool)
        assert real is not None, f"{tool} is needed by this test"
        (directory / tool).symlink_to(real)
    return str(directory)


def test_the_one_liner_needs_no_sudo_and_names_a_loopback_address() -> None:
    # A root-only host has no sudo: the one-liner runs the installer with `sh`, which asks
    # for sudo itself when it needs root.
    assert install_command("https://keys.example.com:8443") == (
        "curl -fsS --cacert ca.pem https://keys.example.com:8443/install.sh | sh -s -- --token TOKEN")
    assert loopback_warning("https://keys.example.com:8443") is None
    assert loopback_warning("https://10.0.4.2:8443") is None
    for url in ("https://127.0.0.1:8443", "https://127.0.1.1:8443", "https://[::1]:8443", "https://localhost:8443",
                "https://db.localhost:8443"):
        warning = loopback_warning(url)
        assert warning is not None and url in warning, url
        assert "STRONGROOM_AGENT_PUBLIC_URL" in warning and "STRONGROOM_AGENT_HOST=0.0.0.0" in warning


def test_enrollment_info_warns_when_hosts_would_be_sent_to_loopback(admin: httpx.Client, agent_url: str) -> None:
    info = admin.get("/api/v1/enrollment-info").json()
    assert info["install_command"] == install_command(agent_url)
    assert agent_url.startswith("https://127.0.0.1:")  # the test server's agent port, as by default
    assert info["install_command_warning"] == loopback_warning(agent_url)
    assert "STRONGROOM_AGENT_PUBLIC_URL" in info["install_command_warning"]


def test_the_installer_refuses_to_enroll_as_localhost(tmp_path: Path, base_url: str) -> None:
    script = tmp_path / "install.sh"
    script.write_text(https.get(f"{base_url}/install.sh").text)
    fake = _fake_bin(tmp_path / "bin", hostname='echo localhost', uname='echo localhost')
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    r = subprocess.run(["sh", str(script), "--token", "x", "--prefix", str(tmp_path / "p")], env=env,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 1 and "this host's name is 'localhost'" in r.stderr and "--hostname NAME" in r.stderr
    r = subprocess.run(["sh", str(script), "--token", "x", "--hostname", "localhost"], env=env,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 1 and "--hostname NAME" in r.stderr
    assert not (tmp_path / "p").exists(), "refused before anything was written"


def test_without_root_the_installer_runs_itself_through_sudo_or_says_what_to_do(tmp_path: Path, base_url: str,
                                                                                 agent_url: str) -> None:
    served = https.get(f"{base_url}/install.sh").text
    script = tmp_path / "install.sh"
    script.write_text(served)
    # Not root (whoever runs this test: `id` says so), and a directory no one may create.
    fake = _fake_bin(tmp_path / "bin", id='[ "$1" = -un ] && echo alice || echo 1000')
    args = ["/bin/sh", str(script), "--token", "sre_x", "--hostname", "db7.example.com", "--prefix", "/proc/strongroom",
            "--no-systemd"]
    r = subprocess.run(args, env={"PATH": _only(fake, "curl", "mkdir", "mktemp", "rm", "cat")}, capture_output=True,
                       text=True, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "root is needed (/proc/strongroom" in r.stderr and "run the installer as root, or install sudo" in r.stderr

    # With sudo, the same installer, fetched again over the pinned connection, runs as root
    # with every choice spelled out.
    record = tmp_path / "sudo-args"
    _fake_bin(fake, sudo=f'printf "%s\\n" "$@" > {record}; cat > {record}.stdin; exit 7')
    r = subprocess.run(args, env={"PATH": str(fake)}, capture_output=True, text=True, check=False)
    assert r.returncode == 7, r.stdout + r.stderr  # sudo's own status
    assert "running again through sudo: /proc/strongroom" in r.stdout
    assert record.read_text().split("\n")[:-1] == [
        "sh", "-s", "--", "--token", "sre_x", "--hostname", "db7.example.com", "--prefix", "/proc/strongroom",
        "--config-dir", "/proc/strongroom/etc", "--state-dir", "/proc/strongroom/state",
        "--run-dir", "/proc/strongroom/run", "--python", "python3", "--no-systemd"]
    assert Path(f"{record}.stdin").read_text() == served
    assert f"SERVER_URL='{agent_url}'" in served


def test_the_installer_takes_dependencies_from_the_wheels_it_is_given(tmp_path: Path, base_url: str) -> None:
    # Offline: pip is pointed at a directory instead of an index; one without the
    # dependencies is named in the refusal, with the other ways to get them.
    script = tmp_path / "install.sh"
    script.write_text(https.get(f"{base_url}/install.sh").text)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    r = subprocess.run(["sh", str(script), "--token", "x", "--hostname", "db7.example.com", "--prefix",
                        str(tmp_path / "p"), "--no-systemd", "--wheels", str(wheels)],
                       capture_output=True, text=True, timeout=240, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"from the wheels in {wheels}" in r.stderr and "--index-url URL (a mirror)" in r.stderr
    assert "No matching distribution" in r.stderr or "no matching distribution" in r.stderr.lower()
    r = subprocess.run(["sh", str(script), "--token", "x", "--wheels", str(tmp_path / "none")],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 1 and f"--wheels {tmp_path / 'none'}: no such directory" in r.stderr


@pytest.mark.slow
def test_a_new_host_from_installer_to_revocation(tmp_path: Path, base_url: str, agent_url: str,
                                                 admin: httpx.Client, services: Services) -> None:
    group = unique("e2e")
    key = admin.post("/api/v1/keys", json={"name": unique("e2e"), "tags": {"host-group": group}}).json()
    secret = admin.post("/api/v1/enrollment-tokens", json={"host_group": group}).json()["secret"]
    info = admin.get("/api/v1/enrollment-info").json()
    assert info["install_command"] == f"curl -fsS --cacert ca.pem {agent_url}/install.sh | sh -s -- --token TOKEN"
    ca = tmp_path / "ca.pem"
    ca.write_text(info["ca_pem"])
    openssl = subprocess.run(["openssl", "x509", "-in", str(ca), "-noout", "-fingerprint", "-sha256"],
                             capture_output=True, text=True, check=True).stdout
    assert openssl.strip().endswith("=" + info["ca_fingerprint_sha256"])  # what the operator compares
    prefix = tmp_path / "agent"

    # The one-liner, as the console shows it, into a prefix this user owns: sudo is never
    # called (a root-only host has none), and the host is named by its FQDN.
    one_liner = info["install_command"].replace("ca.pem", str(ca)).replace("TOKEN", secret)
    fake = _fake_bin(tmp_path / "bin", sudo='echo "sudo: command not found" >&2; exit 127',
                     hostname='[ "$1" = -f ] && echo e2e.example.com || echo e2e')
    r = subprocess.run(f"{one_liner} --prefix {prefix} --no-systemd", shell=True,  # noqa: S602 - the one-liner is a shell pipeline
                       env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"},
                       capture_output=True, text=True, timeout=240, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sudo" not in r.stdout + r.stderr
    assert "enrolled as host" in r.stdout and "kms-agent --config" in r.stdout
    state = prefix / "state"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700 and stat.S_IMODE((state / "host.key").stat().st_mode) == 0o600

    config = prefix / "etc" / "agent.toml"
    # Nothing host-wide under a prefix: open volumes' run directory goes there too.
    assert AgentConfig.load(config).run_dir == prefix / "run"

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
