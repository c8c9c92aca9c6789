"""`kms-agent`'s documented exit statuses and messages, in process against the real agent
port (the installer test runs the installed command end to end)."""

from __future__ import annotations

import sys
import tomllib
import uuid
from pathlib import Path

import httpx
import pytest

from agents.cli import Exit, main
from agents.cryptfile import read_header
from tests.agents.test_agent_port import enroll_host, group_key
from tests.conftest import unique


def kms_agent(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], config: Path,
              *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["kms-agent", "--config", str(config), *args])
    with pytest.raises(SystemExit) as exc:
        main()
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, " ".join(err.split())


def write_config(path: Path, server_url: str, state: Path, ca: Path, **extra: object) -> Path:
    lines = [f'server_url = "{server_url}"', f'ca_file = "{ca}"', f'state_dir = "{state}"',
             *(f"{k} = {v}" for k, v in extra.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def enrolled(tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client) -> tuple[Path, str]:
    """An enrolled host's configuration, and its group."""
    host = enroll_host(tmp_path, base_url, agent_url, admin, name="cli")
    return write_config(tmp_path / "agent.toml", agent_url, host.identity.state_dir, tmp_path / "ca.pem"), host.group


def test_encrypt_decrypt_and_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str], admin: httpx.Client,
                                      enrolled: tuple[Path, str]) -> None:
    config, group = enrolled
    key = group_key(admin, group)
    f = tmp_path / "report.csv"
    f.write_bytes(b"a,b\n" * 5000)
    code, out, _ = kms_agent(monkeypatch, capsys, config, "encrypt", str(f), "--key", key["name"])
    assert code == Exit.OK and "1 file(s) done" in out
    assert read_header(str(f)).key_id == uuid.UUID(key["id"])
    # Another group's key: refused, named, exit 4.
    other = admin.post("/api/v1/keys", json={"name": unique("other")}).json()
    g = tmp_path / "g.txt"
    g.write_text("x")
    code, _, err = kms_agent(monkeypatch, capsys, config, "encrypt", str(g), "--key", other["name"])
    assert code == Exit.KEY and group in err and g.read_text() == "x"
    # Missing file: exit 7 before any work.
    code, _, err = kms_agent(monkeypatch, capsys, config, "decrypt", str(tmp_path / "nope"))
    assert code == Exit.FILE and "no such file" in err
    # --output with a directory is a usage error.
    code, _, err = kms_agent(monkeypatch, capsys, config, "decrypt", str(tmp_path), "-o", str(tmp_path / "x"))
    assert code == Exit.USAGE and "exactly one input file" in err
    code, _, _ = kms_agent(monkeypatch, capsys, config, "decrypt", str(f), "-o", str(tmp_path / "plain.csv"))
    assert code == Exit.OK and (tmp_path / "plain.csv").read_bytes() == b"a,b\n" * 5000
    # A destroyed key: the file cannot be decrypted, and the message says why.
    assert admin.post(f"/api/v1/keys/{key['name']}/revoke", json={"reason": "superseded"}).status_code == 200
    assert admin.post(f"/api/v1/keys/{key['name']}/destroy", json={}).status_code == 200
    code, _, err = kms_agent(monkeypatch, capsys, config, "decrypt", str(f))
    assert code == Exit.KEY and "destroyed" in err and read_header(str(f)).key_id == uuid.UUID(key["id"])


def test_unusable_setups_say_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str], agent_url: str,
                                        enrolled: tuple[Path, str]) -> None:
    code, _, err = kms_agent(monkeypatch, capsys, tmp_path / "missing.toml", "status")
    assert code == Exit.USAGE and "no agent configuration" in err
    bad = tmp_path / "bad.toml"
    bad.write_text('server_url = "http://plain"\nca_file = "x"\nstate_dir = "y"\n')
    code, _, err = kms_agent(monkeypatch, capsys, bad, "status")
    assert code == Exit.USAGE and "https://" in err
    fresh = write_config(tmp_path / "fresh.toml", agent_url, tmp_path / "fresh-state", tmp_path / "ca.pem")
    code, _, err = kms_agent(monkeypatch, capsys, fresh, "status")
    assert code == Exit.NOT_ENROLLED and "kms-agent enroll --token" in err
    code, _, err = kms_agent(monkeypatch, capsys, fresh, "enroll", "--token", "sre_nope_nope")
    assert code == Exit.NOT_ENROLLED and "ask an operator" in err
    config, _ = enrolled
    state = Path(tomllib.loads(config.read_text())["state_dir"])
    down = write_config(tmp_path / "down.toml", "https://127.0.0.1:9", state, tmp_path / "ca.pem",
                        request_timeout_seconds=2)
    code, _, err = kms_agent(monkeypatch, capsys, down, "status")
    assert code == Exit.UNREACHABLE and "unreachable" in err


def test_the_daemon_beats_stops_on_sigterm_and_on_revocation(tmp_path: Path, admin: httpx.Client,
                                                              enrolled: tuple[Path, str], services: object) -> None:
    """`kms-agent run` as a process: it heartbeats (the host shows online), stops with 0
    on SIGTERM, and exits with status 6 once the host is revoked."""
    import signal
    import subprocess
    import time

    from keyserver.core.hosts import HostService

    config, group = enrolled
    hosts: HostService = services.hosts  # type: ignore[attr-defined]
    hosts.heartbeat_seconds = 5  # the server tells the agent how often to beat

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", "from agents.cli import main; main()", "--config",
                                 str(config), "run"], stderr=subprocess.PIPE, text=True)

    def wait_online(proc: subprocess.Popen[str], since: str | None) -> str:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the daemon did not heartbeat"
            time.sleep(0.2)
            # By group too: earlier tests enrolled (and left) other hosts of the same name.
            host = next((h for h in admin.get("/api/v1/hosts", params={"group": group}).json()["items"]
                         if h["hostname"] == "cli.example.com" and h["host_group"] == group), None)
            if host and host["online"] and host["last_heartbeat_at"] != since:
                return str(host["id"])

    procs: list[subprocess.Popen[str]] = []
    try:
        procs.append(start())
        host_id = wait_online(procs[0], None)
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(timeout=60) == Exit.OK
        seen = admin.get(f"/api/v1/hosts/{host_id}").json()["last_heartbeat_at"]
        procs.append(start())
        wait_online(procs[1], seen)
        assert admin.post(f"/api/v1/hosts/{host_id}/revoke").status_code == 200
        assert procs[1].wait(timeout=60) == Exit.NOT_ENROLLED
        assert "revoked" in (procs[1].stderr.read() if procs[1].stderr else "")
    finally:
        hosts.heartbeat_seconds = 30
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
