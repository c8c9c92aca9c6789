"""The drills' rig (`kms-bench drill`, kmsbench/drill.py): a PostgreSQL cluster of its
own, three `keyserver serve` replicas sharing one data directory, each on a loopback
address of its own, and HAProxy running the shipped deploy/haproxy.cfg in front."""

from __future__ import annotations

import csv
import grp
import io
import os
import pwd
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg

from kmsbench.pgcluster import Cluster
from kmsbench.ports import free_port

REPO = Path(__file__).resolve().parents[1]
HAPROXY_CFG = REPO / "deploy" / "haproxy.cfg"
KEYSERVER = str(Path(sys.executable).with_name("keyserver"))
REPLICA_ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")  # the config's three slots
KEYS = ("drill-0", "drill-1", "drill-2", "drill-3")



# --- PostgreSQL: a cluster of the drill's own ------------------------------------------

def drill_cluster(root: Path) -> Cluster:
    """The drill's cluster (kmsbench/pgcluster.py), made: slots for every replica's pool
    and the checks' connections."""
    cluster = Cluster(root, settings={"max_connections": "400", "shared_buffers": "64MB"})
    cluster.init()
    return cluster


# --- the replicas and HAProxy ------------------------------------------------------------

@dataclass
class Replica:
    index: int
    address: str
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"ks{self.index + 1}"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([KEYSERVER, "serve"], env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class HAProxy:
    """deploy/haproxy.cfg as shipped, its variables set to the drill's addresses."""

    def __init__(self, root: Path, *, rest: int, kmip: int, agent: int, ca: Path) -> None:
        self.socket_path = root / "haproxy.sock"
        self.rest_port = free_port()
        self.env = {**os.environ, "LB_BIND": "127.0.0.1", "LB_REST_PORT": str(self.rest_port),
                    "LB_KMIP_PORT": str(free_port()), "LB_AGENT_PORT": str(free_port()),
                    "KS_REST_PORT": str(rest), "KS_KMIP_PORT": str(kmip), "KS_AGENT_PORT": str(agent),
                    "KS_CA_FILE": str(ca), "KS_CHECK_NAME": "localhost", "LB_STATS_SOCKET": str(self.socket_path),
                    "LB_USER": pwd.getpwuid(os.getuid()).pw_name, "LB_GROUP": grp.getgrgid(os.getgid()).gr_name,
                    # every load client of the drill connects from 127.0.0.1
                    "LB_MAX_CONN_PER_SOURCE": "10000"}
        for i, addr in enumerate(REPLICA_ADDRESSES):
            self.env[f"KS_REPLICA{i + 1}"] = addr
        self.log = root / "haproxy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def check(self) -> None:
        r = subprocess.run(["haproxy", "-c", "-q", "-f", str(HAPROXY_CFG)], env=self.env, capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise SystemExit(f"haproxy -c failed on {HAPROXY_CFG}:\n{r.stdout}{r.stderr}")

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(HAPROXY_CFG)], env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)  # soft stop
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def stats(self) -> dict[str, dict[str, str]]:
        """`show stat` of the REST backend's servers: name -> row (status, stot, ...)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.socket_path))
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
        return {r["svname"]: dict(r) for r in rows if r["pxname"] == "rest" and r["svname"].startswith("ks")}

    def status(self, server: str) -> str:
        try:
            return self.stats()[server]["status"]
        except (OSError, KeyError):
            return "unknown"


def wait_for(check: Any, what: str, seconds: float) -> float:
    """Poll `check` until true; the time it became true (monotonic)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if check():
                return time.monotonic()
        except (OSError, httpx.HTTPError, psycopg.Error):
            pass
        if time.monotonic() > deadline:
            raise DrillFailed(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(0.1)


class DrillFailed(Exception):
    pass


# --- the load ----------------------------------------------------------------------------
# --- the rig ---------------------------------------------------------------------------

class Rig:
    """The cluster, the shared data directory, three replicas and HAProxy."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.replicas: list[Replica] = []
        self._haproxy: HAProxy | None = None
        self._cluster: Cluster | None = None

    @property
    def cluster(self) -> Cluster:
        assert self._cluster is not None
        return self._cluster

    @property
    def haproxy(self) -> HAProxy:
        assert self._haproxy is not None
        return self._haproxy

    def start(self) -> None:
        self._cluster = drill_cluster(self.root)
        self.cluster.start()
        self.database = "strongroom_drill"
        with self.cluster.connect("postgres") as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        root = self.root
        self.data = root / "data"
        self.token = self._initialise()
        self.ca = self.data / "ca.pem"
        self.trust = ssl.create_default_context(cafile=str(self.ca))
        rest, kmip, agent = (free_port("127.0.0.1", *REPLICA_ADDRESSES) for _ in range(3))
        self.rest_port = rest
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("STRONGROOM_", "SOFTHSM2_CONF"))}
        for i, addr in enumerate(REPLICA_ADDRESSES):
            env = {**base_env, "STRONGROOM_DATA_DIR": str(self.data),
                   "STRONGROOM_DATABASE_URL": self.cluster.url(self.database), "STRONGROOM_WORKERS": "1",
                   "STRONGROOM_HOST": addr, "STRONGROOM_PORT": str(rest),
                   "STRONGROOM_KMIP_HOST": addr, "STRONGROOM_KMIP_PORT": str(kmip),
                   "STRONGROOM_AGENT_HOST": addr, "STRONGROOM_AGENT_PORT": str(agent),
                   "STRONGROOM_SERVER_NAMES": '["127.0.0.1"]', "STRONGROOM_DATABASE_POOL_SIZE": "16",
                   "STRONGROOM_LOG_LEVEL": "WARNING",
                   # the replicas see every client as the proxy (TLS passed through): not capped per address
                   "STRONGROOM_TRUSTED_PROXIES": '["127.0.0.0/8"]'}
            self.replicas.append(Replica(i, addr, env, root / f"replica-{i + 1}.log"))
        self._haproxy = HAProxy(root, rest=rest, kmip=kmip, agent=agent, ca=self.ca)
        self.haproxy.check()
        for r in self.replicas:
            r.start()
        for r in self.replicas:
            wait_for(lambda r=r: self.ready(r), f"replica {r.name} to be ready (log: {r.log})", 90)
        self.haproxy.start()
        wait_for(lambda: all(self.haproxy.status(r.name) == "UP" for r in self.replicas),
              "HAProxy to mark every replica up", 30)
        self.base = f"https://127.0.0.1:{self.haproxy.rest_port}"

    def _initialise(self) -> str:
        """Schema, token, CA, the drill's keys and an administrator's API token, made once
        before any replica starts (as the compose file's first replica does alone)."""
        for k in [k for k in os.environ if k.startswith(("STRONGROOM_", "SOFTHSM2_CONF"))]:
            del os.environ[k]
        from keyserver.core.keys import KeySpec
        from keyserver.core.principal import system_context
        from keyserver.services import build_services
        from keyserver.settings import Settings

        settings = Settings(data_dir=self.data, database_url=self.cluster.url(self.database))
        services = build_services(settings)
        try:
            services.initialize()
            ctx = system_context("drill")
            for name in KEYS:
                services.keys.create(ctx, KeySpec(name=name))
            user, _ = services.identity.create_user(ctx, username="drill", role="admin",
                                                    password=uuid.uuid4().hex + "-load-rig")
            token = services.identity.create_token(ctx, name="drill", scopes=None, expires_in_days=1,
                                                   user_id=user.id).secret
            services.audit.flush()
            (self.data / "ca.pem").write_bytes(services.ca.certificate_pem())
        finally:
            services.close()
        return token

    def ready(self, r: Replica) -> bool:
        assert r.proc is not None
        if r.proc.poll() is not None:
            raise DrillFailed(f"replica {r.name} exited with {r.proc.returncode}; its log: {r.log}")
        if not self.ca.exists():
            return False
        url = f"https://{r.address}:{self.rest_port}/readyz"
        return httpx.get(url, verify=self.trust, timeout=2).status_code == 200

    def serves_data_key(self, r: Replica) -> bool:
        """A data key made by this replica itself (not through HAProxy)."""
        resp = httpx.post(f"https://{r.address}:{self.rest_port}/api/v1/keys/{KEYS[0]}/generate-data-key",
                          json={}, headers={"Authorization": f"Bearer {self.token}"}, verify=self.trust, timeout=5)
        return resp.status_code == 200

    def close(self) -> None:
        if self._haproxy is not None:
            self._haproxy.stop()
        for r in self.replicas:
            r.stop()
        if self._cluster is not None:
            self._cluster.stop("immediate")

    def inbox(self) -> int:
        with self.cluster.connect(self.database) as conn:
            row = conn.execute("SELECT count(*) FROM audit_inbox").fetchone()
        return int(row[0]) if row else 0


