"""The two-command start on the embedded default, the CLI, and the compose file."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO
from tests.serve import KEYSERVER, Server, free_port, server_env


def _env(data_dir: Path, port: int) -> dict[str, str]:
    return server_env(data_dir, port)


def test_embedded_default_first_run(tmp_path: Path) -> None:
    """`keyserver serve` on an empty data directory: SQLite + SoftHSM2 token created,
    HTTPS with the internal CA's certificate, the one-time password handed over (not a
    terminal: in a 0600 file, never in the output), sign-in works; a restart keeps
    everything."""
    data = tmp_path / "data"
    with Server(data) as server:
        assert f"Strongroom key server at https://127.0.0.1:{server.port}" in server.output
        username, password = (data / "first-run-admin-password").read_text().split()
        assert password not in server.output and "first-run-admin-password" in server.output
        with server.client() as c:
            r = c.post("/api/v1/auth/login", json={"username": username, "password": password})
            assert r.status_code == 200 and r.json()["user"]["must_change_password"]
            assert "; secure" in r.headers["set-cookie"].lower()
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{server.url}/readyz")  # the system's trust store does not know the CA
        assert (data / "strongroom.db").exists()
        assert (data / "tokens").is_dir()
        assert oct((data / "hsm-pins.json").stat().st_mode & 0o777) == "0o600"
        assert oct((data / "first-run-admin-password").stat().st_mode & 0o777) == "0o600"
    # Second start: no new password, same data.
    port = free_port()
    r = subprocess.run([KEYSERVER, "init"], env=_env(data, port), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "password:" not in r.stderr and "initialized" in r.stderr
    r = subprocess.run([KEYSERVER, "verify-audit"], env=_env(data, port), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "intact" in r.stderr, r.stderr


def test_plain_http_only_when_asked_and_never_in_production(tmp_path: Path) -> None:
    with Server(tmp_path / "data", "--insecure-http") as server:
        assert "PLAIN HTTP" in server.output
        assert httpx.get(f"{server.url}/readyz").status_code == 200
        _, password = (tmp_path / "data" / "first-run-admin-password").read_text().split()
        r = httpx.post(f"{server.url}/api/v1/auth/login", json={"username": "admin", "password": password})
        assert r.status_code == 200 and "secure" not in r.headers["set-cookie"].lower()
    env = {**_env(tmp_path / "prod", free_port()), "STRONGROOM_ENVIRONMENT": "production",
           "STRONGROOM_HSM_USER_PIN": "u" * 20, "STRONGROOM_HSM_SO_PIN": "s" * 20,
           "STRONGROOM_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:1/none"}
    r = subprocess.run([KEYSERVER, "serve", "--insecure-http"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "plain HTTP is refused in production" in r.stderr, r.stderr


def test_cli_create_admin_rotate_kek_and_broken_chain(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = _env(data, free_port())
    r = subprocess.run([KEYSERVER, "create-admin", "second"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "second" in r.stderr, r.stderr
    r = subprocess.run([KEYSERVER, "create-admin", "second"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "exists already" in r.stderr
    r = subprocess.run([KEYSERVER, "rotate-kek"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "KEK rotated" in r.stderr, r.stderr
    old = re.search(r"keyserver retire-kek ([^`\s]+)", " ".join(r.stderr.split())).group(1)  # type: ignore[union-attr]
    new = re.search(r"now (kek-\S+?)\.", r.stderr).group(1)  # type: ignore[union-attr]
    r = subprocess.run([KEYSERVER, "retire-kek", new], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "is the active KEK" in r.stderr, r.stderr
    r = subprocess.run([KEYSERVER, "retire-kek", old], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"KEK {old} retired" in r.stderr, r.stderr
    import sqlite3

    with sqlite3.connect(data / "strongroom.db") as conn:
        conn.execute("UPDATE audit_events SET actor = 'mallory' WHERE seq = 2")
    r = subprocess.run([KEYSERVER, "verify-audit"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "BROKEN at record 2" in r.stderr, r.stderr


def test_production_refuses_missing_secrets(tmp_path: Path) -> None:
    env = _env(tmp_path, free_port())
    env["STRONGROOM_ENVIRONMENT"] = "production"
    r = subprocess.run([KEYSERVER, "init"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "STRONGROOM_HSM_USER_PIN" in r.stderr + r.stdout


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose (Debian package) is not installed; scripts/test installs it")
def test_compose_file_is_valid() -> None:
    env = {**os.environ, "POSTGRES_PASSWORD": "x" * 20, "STRONGROOM_HSM_USER_PIN": "u" * 20,
           "STRONGROOM_HSM_SO_PIN": "s" * 20}
    r = subprocess.run(["docker-compose", "-f", str(REPO / "docker-compose.yml"), "config"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "keyserver" in r.stdout and "postgres" in r.stdout
    import yaml

    services = yaml.safe_load(r.stdout)["services"]
    replicas = sorted(name for name in services if name.startswith("keyserver-"))
    assert replicas == ["keyserver-1", "keyserver-2", "keyserver-3"], sorted(services)
    # Only HAProxy publishes ports; it runs the shipped config, and the replicas share the
    # token and the data directory (the internal CA) through their volumes.
    assert all("ports" not in services[name] for name in replicas)
    lb = services["haproxy"]
    assert {p["published"] for p in lb["ports"]} == {8800, 5696, 8443}, lb["ports"]
    assert any(v.endswith("deploy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro") for v in lb["volumes"])
    for name in replicas:
        assert {v.split(":")[0] for v in services[name]["volumes"]} == {"hsm-tokens", "keyserver-data"}
    missing = {k: v for k, v in env.items() if k != "STRONGROOM_HSM_USER_PIN"}
    r = subprocess.run(["docker-compose", "-f", str(REPO / "docker-compose.yml"), "config"],
                       env=missing, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "STRONGROOM_HSM_USER_PIN" in r.stderr


def _trust(tmp_path: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(tmp_path / "data" / "ca.pem"))


def test_several_workers_on_postgresql(tmp_path: Path) -> None:
    """`STRONGROOM_WORKERS=2`: one SO_REUSEPORT socket per worker for HTTP and for KMIP,
    both serving the same database (a key made through one worker is read through the
    other); SIGTERM stops every process."""
    from kmip.core import enums

    from tests.kmip.conftest import ClientFiles, make_client
    from tests.pg import scratch_database

    kmip_port = free_port()
    with scratch_database() as url, Server(tmp_path / "data", STRONGROOM_WORKERS="2", STRONGROOM_DATABASE_URL=url,
                                           STRONGROOM_KMIP_PORT=str(kmip_port)) as server:
        proc, env, base = server.proc, server.env, server.url
        # Many fresh connections: the kernel spreads them over both workers' sockets.
        trust = _trust(tmp_path)
        codes = {httpx.get(f"{base}/healthz", timeout=5, verify=trust).status_code for _ in range(40)}
        assert codes == {200}
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) >= 2, children
        # Metrics add up every worker's counts, whichever worker answers the scrape.
        username, password = (tmp_path / "data" / "first-run-admin-password").read_text().split()
        with httpx.Client(base_url=base, verify=trust, timeout=10) as web:
            r = web.post("/api/v1/auth/login", json={"username": username, "password": password})
            web.headers["X-CSRF-Token"] = r.json()["csrf_token"]
            r = web.post("/api/v1/auth/password", json={"current_password": password,
                                                        "new_password": "several workers 1234 ok"})
            web.headers["X-CSRF-Token"] = r.json()["csrf_token"]
            prom = web.post("/api/v1/tokens", json={"name": "prometheus", "scopes": ["system:read"]}).json()
        healthz = re.compile(
            r'^strongroom_http_requests_total\{method="GET",route="/healthz",status="200"\} (\S+)$', re.M)
        seen = set()
        for _ in range(6):  # fresh connections: the scrapes land on both workers
            text = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {prom['secret']}"},
                             verify=trust, timeout=10).text
            found = healthz.search(text)
            assert found is not None, text[:2000]
            seen.add(float(found.group(1)))
        assert seen == {40.0}, seen
        # KMIP: every worker listens on the port (each as soon as it has started), the
        # supervisor does not.
        deadline = time.monotonic() + 60
        while True:
            listening = subprocess.run(["ss", "-Hltnp", f"sport = :{kmip_port}"], capture_output=True,
                                       text=True).stdout
            pids = {int(p) for p in re.findall(r"pid=(\d+)", listening)}
            if len(pids) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(pids) == 2 and pids <= {int(c) for c in children}, listening
        out = tmp_path / "client"
        r = subprocess.run([KEYSERVER, "kmip-client", "create", "deploy-test", "--role", "key-officer",
                            "--out", str(out)], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        files = ClientFiles("deploy-test", "", out / "cert.pem", out / "key.pem", out / "ca.pem")
        made = []
        for _ in range(6):  # fresh connections, spread over both workers by the kernel
            with make_client(files, kmip_port) as client:
                uid = client.create(enums.CryptographicAlgorithm.AES, 256)
                client.activate(uid)
                made.append(uid)
        for uid in made:
            with make_client(files, kmip_port) as client:
                assert len(client.get(uid).value) == 32
        # Housekeeping (the audit chainer) runs in the supervisor, not in the workers:
        # while it is stopped, the workers' records wait in the inbox; it chains them
        # when it continues.
        assert _eventually_zero(lambda: _inbox(url))
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            with make_client(files, kmip_port) as client:
                client.get(made[0])
            time.sleep(2)  # four of a chainer's polls
            assert _inbox(url) > 0
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert _eventually_zero(lambda: _inbox(url))
        assert server.stop() == 0

        def alive(pid: str) -> bool:
            status = Path(f"/proc/{pid}/status")
            return status.exists() and "zombie" not in status.read_text()

        # Workers are joined before the supervisor exits; multiprocessing's resource
        # tracker follows a moment later.
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in children if alive(pid)]


def _inbox(url: str) -> int:
    import psycopg
    from sqlalchemy.engine import make_url

    with psycopg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)) as conn:
        row = conn.execute("SELECT count(*) FROM audit_inbox").fetchone()
    return int(row[0]) if row else 0


def _eventually_zero(count: Callable[[], int], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while count() and time.monotonic() < deadline:
        time.sleep(0.2)
    return count() == 0


def test_several_workers_refused_on_sqlite(tmp_path: Path) -> None:
    env = {**_env(tmp_path / "data", free_port()), "STRONGROOM_WORKERS": "2"}
    r = subprocess.run([KEYSERVER, "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "need PostgreSQL" in r.stderr


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed (scripts/test installs it)")
def test_haproxy_config_is_valid(tmp_path: Path) -> None:
    """deploy/haproxy.cfg as shipped: its variables resolved (a CA file must exist),
    `haproxy -c` accepts it; TLS is passed through on every port, never terminated."""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + timedelta(days=1)).sign(key, hashes.SHA256()))
    ca = tmp_path / "ca.pem"
    ca.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    cfg = REPO / "deploy" / "haproxy.cfg"
    env = {**os.environ, "KS_CA_FILE": str(ca), "LB_STATS_SOCKET": str(tmp_path / "admin.sock"),
           "KS_REPLICA1": "127.0.0.2", "KS_REPLICA2": "127.0.0.3", "KS_REPLICA3": "127.0.0.4"}
    r = subprocess.run(["haproxy", "-c", "-f", str(cfg)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    text = cfg.read_text()
    assert "mode tcp" in text and " ssl " not in text and "crt " not in text  # passthrough only
    assert "option redispatch" in text and "uri /readyz" in text and "verify required" in text
    # Without a CA file the health checks cannot verify anything: refused.
    env["KS_CA_FILE"] = str(tmp_path / "missing.pem")
    r = subprocess.run(["haproxy", "-c", "-f", str(cfg)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0


def test_grafana_dashboard_queries_metrics_the_server_exposes(tmp_path: Path) -> None:
    """Every metric (and route label) deploy/grafana/strongroom.json queries is in a real
    server's /metrics output, scraped with a token limited to system:read."""

    dashboard = json.loads((REPO / "deploy" / "grafana" / "strongroom.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert exprs
    metrics = {m for e in exprs for m in re.findall(r"\b(strongroom_[a-z0-9_]+)", e)}
    routes = {m for e in exprs for m in re.findall(r'route="([^"]+)"', e)}
    assert all(re.search(r"\bstrongroom_", e) for e in exprs), "every panel queries the server's metrics"
    sinks = json.dumps([{"name": "local", "type": "file", "path": str(tmp_path / "audit.jsonl")}])
    with Server(tmp_path / "data", STRONGROOM_AUDIT_SINKS=sinks) as server, server.client() as web:
        username, password = (tmp_path / "data" / "first-run-admin-password").read_text().split()
        r = web.post("/api/v1/auth/login", json={"username": username, "password": password})
        web.headers["X-CSRF-Token"] = r.json()["csrf_token"]
        r = web.post("/api/v1/auth/password", json={"current_password": password,
                                                    "new_password": "grafana dashboard check 1234"})
        assert r.status_code == 200, r.text
        web.headers["X-CSRF-Token"] = r.json()["csrf_token"]
        assert web.post("/api/v1/keys", json={"name": "metrics"}).status_code == 201
        prom = web.post("/api/v1/tokens", json={"name": "prometheus", "scopes": ["system:read"]}).json()["secret"]
        ops = web.post("/api/v1/tokens", json={"name": "app", "scopes": ["datakeys:generate"]}).json()["secret"]
        for _ in range(3):  # the first call of a token goes to the route, the next to the hot path
            r = web.post("/api/v1/keys/metrics/generate-data-key", json={}, headers={"Authorization": f"Bearer {ops}"})
            assert r.status_code == 200, r.text
        assert web.get("/readyz").status_code == 200
        assert web.get("/metrics", headers={"Authorization": f"Bearer {ops}"}).status_code == 403
        r = web.get("/metrics", headers={"Authorization": f"Bearer {prom}"})
        assert r.status_code == 200, r.text
    exposed = {line.split("{")[0].split(" ")[0] for line in r.text.splitlines() if line and not line.startswith("#")}
    assert metrics <= exposed, sorted(metrics - exposed)
    for route in routes:
        assert f'route="{route}"' in r.text, route
