"""Every story the README tells a user, end to end, on the two-command start: `keyserver
serve` as `scripts/start` runs it (the embedded default: SQLite + SoftHSM2 under a fresh
data directory, HTTPS from the internal CA), driven only from outside, as a person would:
HTTPS with the data directory's ca.pem, the console's installer one-liner piped to `sh`,
the installed `kms-agent` and its daemon, a scoped API token rotating a key, and the
audit log showing and verifying all of it. A failure at any step fails the suite."""

from __future__ import annotations

import json
import signal
import ssl
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agents.config import AgentConfig
from agents.cryptfile import read_header
from agents.guardpoint.shield import serving, shielded, unshield_all
from tests.serve import Server, eventually

HOSTNAME = "story-db1.example.com"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with Server(tmp_path / "data", STRONGROOM_AGENT_HEARTBEAT_SECONDS="5") as s:
        yield s


def _openssl_fingerprint(pem: Path) -> str:
    out = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", str(pem)],
                         capture_output=True, text=True, check=True).stdout
    return out.strip().split("=", 1)[1]


@pytest.mark.slow
def test_the_readme_stories_on_the_default_start(server: Server, tmp_path: Path) -> None:
    data, tls = server.data, server.tls()
    assert isinstance(tls, ssl.SSLContext)

    # --- first start: HTTPS, the CA's fingerprint exactly as openssl prints it, and the
    # one-time password handed over outside the log stream.
    fingerprint = _openssl_fingerprint(data / "ca.pem")
    # Printed whole on one line, on the banner and on the agent port's line.
    assert server.output.count(f"CA SHA-256 fingerprint {fingerprint}\n") == 2, server.output
    assert f"Strongroom key server at {server.url}" in server.output
    secret_file = data / "first-run-admin-password"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    username, password = secret_file.read_text().split()
    assert username == "admin" and password not in server.output
    assert (data / "strongroom.db").exists(), "the embedded default is the SQLite store"

    # --- sign in, choose a password, as the console asks at once.
    web = httpx.Client(base_url=server.url, verify=tls, timeout=30)
    r = web.post("/api/v1/auth/login", json={"username": username, "password": password})
    assert r.status_code == 200 and r.json()["user"]["must_change_password"], r.text
    assert "secure" in r.headers["set-cookie"].lower(), "session cookies are Secure over HTTPS"
    web.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    mine = f"my own passphrase {uuid.uuid4().hex}"
    changed = web.post("/api/v1/auth/password", json={"current_password": password, "new_password": mine})
    assert changed.status_code == 200, changed.text
    web.headers["X-CSRF-Token"] = changed.json()["csrf_token"]  # a new session replaces the old one
    wrong = web.post("/api/v1/auth/password", json={"current_password": "not it at all",
                                                     "new_password": "another passphrase 123"})
    assert wrong.status_code == 403 and wrong.json()["code"] == "wrong_password"

    # --- a key, and a host enrolled with the console's one-liner.
    key = web.post("/api/v1/keys", json={"name": "payments-db", "description": "orders database"}).json()
    token = web.post("/api/v1/enrollment-tokens", json={"host_group": "storage"}).json()["secret"]
    info = web.get("/api/v1/enrollment-info").json()
    assert info["ca_fingerprint_sha256"] == fingerprint
    # The default agent port is 127.0.0.1: the console and the start-up lines say what to set.
    assert "STRONGROOM_AGENT_PUBLIC_URL" in info["install_command_warning"]
    assert f"  note: {info['agent_url']} is this machine's loopback address" in server.output, server.output
    assert f"enroll a host: {info['install_command']}\n" in server.output
    ca = tmp_path / "ca.pem"
    ca.write_text(info["ca_pem"])
    prefix = tmp_path / "agent"
    one_liner = info["install_command"].replace("ca.pem", str(ca)).replace("TOKEN", token)
    r = subprocess.run(f"{one_liner} --prefix {prefix} --no-systemd --hostname {HOSTNAME}", shell=True,  # noqa: S602 - the one-liner is a shell pipeline
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    config = prefix / "etc" / "agent.toml"
    kms_agent = [str(prefix / "bin" / "kms-agent"), "--config", str(config)]
    status = subprocess.run([*kms_agent, "status", "--json"], capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    host = json.loads(status.stdout)
    assert host["state"] == "active" and host["host_group"] == "storage"

    # --- the daemon mounts the guard point the API defines; files are encrypted below it.
    daemon = subprocess.Popen([*kms_agent, "run"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    mnt, backing = tmp_path / "protected", tmp_path / "backing"
    try:
        gp = web.post("/api/v1/guard-points", json={
            "host_id": host["host_id"], "path": str(mnt), "backing_path": str(backing), "key": key["name"],
            "rules": [], "default_effect": "permit"})
        assert gp.status_code == 201, gp.text
        eventually(lambda: serving(str(mnt)), "the guard point's mount")
        (mnt / "orders.csv").write_text("id,amount\n1,100\n")
        stored = backing / "orders.csv"
        assert read_header(str(stored)).key_version == 1 and b"amount" not in stored.read_bytes()

        # --- rotation from a script, with a scoped API token (the README's one line).
        bot = web.post("/api/v1/tokens", json={"name": "rotation-bot", "scopes": ["keys:read", "keys:rotate"]})
        assert bot.status_code == 201, bot.text
        headers = {"Authorization": f"Bearer {bot.json()['secret']}"}
        rotated = httpx.post(f"{server.url}/api/v1/keys/payments-db/rotate", headers=headers, verify=tls)
        assert rotated.status_code == 200 and rotated.json()["current_version"] == 2, rotated.text
        beyond = httpx.post(f"{server.url}/api/v1/keys", json={"name": "not-allowed"}, headers=headers, verify=tls)
        assert beyond.status_code == 403  # the scopes narrow the token to what it was made for
        # The daemon re-wraps the file's header in the background; the data stays readable.
        eventually(lambda: read_header(str(stored)).key_version == 2, "the re-wrap after rotation")
        assert (mnt / "orders.csv").read_text() == "id,amount\n1,100\n"
        assert web.get(f"/api/v1/hosts/{host['host_id']}").json()["online"]
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(10)
    # Stopping the daemon unmounts its guard points down to their shields: empty and
    # read-only, never the directory underneath (docs/guardpoints.md, "When something dies").
    assert not serving(str(mnt)) and shielded(str(mnt)), "stopping the daemon leaves its guard points closed"
    unshield_all(AgentConfig.load(config).state_dir)  # the test's path, let go

    # --- the audit log shows all of it, and its chain verifies (API and CLI).
    wanted = {"user.change_password", "key.create", "host.enroll", "guard_point.create", "key.rotate",
              "key.deliver", "agent.guardpoint.mounted", "agent.guardpoint.rewrapped", "agent.guardpoint.unmounted"}

    def recorded() -> set[str]:
        items = web.get("/api/v1/audit/events", params={"limit": 500}).json()["items"]
        return {e["action"] for e in items}

    eventually(lambda: wanted <= recorded(), f"audit records {sorted(wanted - recorded())}")
    events = web.get("/api/v1/audit/events", params={"limit": 500}).json()["items"]
    denied = [e for e in events if e["action"] == "user.change_password" and e["outcome"] == "denied"]
    assert len(denied) == 1, "the refused password change is on record"
    refused = [e for e in events if e["action"] == "key.create" and e["outcome"] == "denied"]
    assert refused and refused[0]["details"]["missing_permission"] == "keys:create"
    verified = web.post("/api/v1/audit/verify")
    assert verified.status_code == 200 and verified.json()["ok"], verified.text
    cli = subprocess.run([server.cli, "verify-audit"], env=server.env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "intact" in cli.stderr, cli.stderr
