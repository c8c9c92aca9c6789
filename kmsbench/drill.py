"""`kms-bench drill`: failover drills on real parts (docs/operations.md "Failover drills").

Three `keyserver serve` replicas (one worker each) on one PostgreSQL cluster of the
drill's own (initdb in a temporary directory; the machine's server is never touched),
sharing one data directory (the SoftHSM2 token, its PINs and the internal CA's ca.pem,
as the compose file's replicas share their volumes), behind HAProxy running the shipped
deploy/haproxy.cfg with loopback addresses: each replica on an address of its own
(127.0.0.2-4) with the same ports, as containers are. 200 clients with keep-alive load
it through HAProxy — most generate data keys back to back, a few rotate keys — and every
acknowledged operation is recorded.

* `replica`: kill -9 one replica under load, keep it down a phase, restart it and wait
  until HAProxy marks it up again.
* `postgres`: restart PostgreSQL under load (`pg_ctl restart -m fast`, or `immediate`:
  a crash and recovery); the replicas are not touched and must recover by themselves.

Each drill then checks that nothing acknowledged was lost: every data key decrypts (REST
decrypt route) to the plaintext it was returned with and has its audit record (by
request id), every rotation's version is in the audit chain, the chain verifies; and
that errors happened only in the window of the disruption. Printed: requests, errors by
class, p50/p99 per phase (before / during / after), the windows. Exit 0 when every check
holds, 1 otherwise; `--json` writes everything.
"""

from __future__ import annotations

import asyncio
import csv
import grp
import io
import json
import os
import pwd
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import psycopg
import typer
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
HAPROXY_CFG = REPO / "deploy" / "haproxy.cfg"
KEYSERVER = str(Path(sys.executable).with_name("keyserver"))
REPLICA_ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")  # the config's three slots
KEYS = ("drill-0", "drill-1", "drill-2", "drill-3")
console = Console(stderr=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_port_on_all() -> int:
    """A port free on 127.0.0.1 and on every replica address."""
    while True:
        port = _free_port()
        try:
            for addr in REPLICA_ADDRESSES:
                with socket.socket() as s:
                    s.bind((addr, port))
            return port
        except OSError:
            continue


# --- PostgreSQL: a cluster of the drill's own ------------------------------------------

class Cluster:
    """initdb + pg_ctl in a temporary directory, as the postgres user when we are root
    (PostgreSQL refuses to run as root)."""

    def __init__(self, root: Path) -> None:
        bindir = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)
        if bindir is None:
            raise SystemExit("no PostgreSQL server binaries: apt-get install postgresql")
        self.bindir, self.root, self.port = bindir, root, _free_port()
        self.data = root / "pgdata"
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            shutil.chown(root, "postgres")
        self._run(f"{bindir}/initdb -A trust -U postgres -D {self.data}")

    def _run(self, cmd: str) -> None:
        argv = ["su", "postgres", "-c", cmd] if self.as_postgres else ["sh", "-c", cmd]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"{cmd}: {r.stdout}{r.stderr}")

    def _ctl(self, action: str, mode: str = "fast") -> None:
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=400 "
                "-c shared_buffers=64MB")
        self._run(f"{self.bindir}/pg_ctl -D {self.data} -o '{opts}' -m {mode} -w -t 60 {action} "
                  f"-l {self.root}/pg.log")

    def start(self) -> None:
        self._ctl("start")

    def restart(self, mode: str) -> None:
        self._ctl("restart", mode)

    def stop(self) -> None:
        self._ctl("stop", "immediate")

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str) -> psycopg.Connection[Any]:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database,
                               autocommit=True, connect_timeout=5)


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
        self.rest_port = _free_port()
        self.env = {**os.environ, "LB_BIND": "127.0.0.1", "LB_REST_PORT": str(self.rest_port),
                    "LB_KMIP_PORT": str(_free_port()), "LB_AGENT_PORT": str(_free_port()),
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


def _wait(check: Any, what: str, seconds: float) -> float:
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

@dataclass
class Op:
    kind: str  # "datakey" or "rotate"
    key: str
    request_id: str
    start: float
    end: float
    error: str | None = None  # the class: "connection closed", "connection reset", "502", "503 <code>", ...
    blob: str | None = None
    plaintext: str | None = None
    version: int | None = None
    key_id: str | None = None


def _classify(exc: BaseException) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connect failed"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "connection closed"
    if isinstance(exc, (httpx.ReadError, httpx.WriteError)):
        return "connection reset"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    return type(exc).__name__


class Load:
    """`clients` concurrent clients through the load balancer, on an event loop of their
    own (a thread): `rotators` of them rotate a key every `rotate_every` s, the others
    generate data keys back to back (`think_ms`: a mean wait between requests). Each
    client keeps one connection alive for 0.5-1.5 times `connection_s`, then opens
    another (as clients with a connection lifetime do: a replica back in the pool gets
    its share of new connections), and after any error."""

    def __init__(self, base: str, token: str, trust: ssl.SSLContext, *, clients: int, rotators: int,
                 think_ms: float, rotate_every: float, tag: str, connection_s: float = 4.0) -> None:
        self.base, self.trust, self.tag = base, trust, tag
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.clients, self.rotators, self.think, self.rotate_every = clients, rotators, think_ms / 1000, rotate_every
        self.connection_s = connection_s
        self.ops: list[Op] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="drill-load", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)

    async def _main(self) -> None:
        await asyncio.gather(*(self._client(i) for i in range(self.clients)))

    def _client_for(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base, verify=self.trust, headers=self.headers, timeout=30,
                                 limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))

    async def _client(self, i: int) -> None:
        import random

        rng = random.Random(i)  # noqa: S311 - timing and connection lifetimes, not secrets
        rotator = i < self.rotators
        key = KEYS[i % len(KEYS)]
        client, n = self._client_for(), 0
        until = time.monotonic() + rng.uniform(0.5, 1.5) * self.connection_s
        await asyncio.sleep(rng.random() * 0.5)  # not all at once
        try:
            while not self._stop.is_set():
                n += 1
                rid = f"{self.tag}-{i}-{n}"
                op = Op("rotate" if rotator else "datakey", key, rid, time.monotonic(), 0.0)
                try:
                    if rotator:
                        r = await client.post(f"/api/v1/keys/{key}/rotate", headers={"X-Request-ID": rid})
                    else:
                        r = await client.post(f"/api/v1/keys/{key}/generate-data-key", content=b"{}",
                                              headers={"X-Request-ID": rid})
                    op.end = time.monotonic()
                    if r.status_code == 200:
                        body = r.json()
                        if rotator:
                            op.version, op.key_id = body["current_version"], body["id"]
                        else:
                            op.blob, op.plaintext = body["ciphertext_blob"], body["plaintext"]
                    else:
                        code = ""
                        if r.headers.get("content-type", "").startswith("application/problem+json"):
                            code = " " + str(r.json().get("code", ""))
                        op.error = f"{r.status_code}{code}"
                except httpx.HTTPError as exc:
                    op.end = time.monotonic()
                    op.error = _classify(exc)
                self.ops.append(op)
                if op.error is not None or time.monotonic() > until:
                    await client.aclose()
                    client = self._client_for()
                    until = time.monotonic() + rng.uniform(0.5, 1.5) * self.connection_s
                if rotator:
                    await asyncio.sleep(self.rotate_every)
                elif self.think:
                    await asyncio.sleep(rng.uniform(0, 2 * self.think))
        finally:
            await client.aclose()


# --- figures -----------------------------------------------------------------------------

@dataclass
class PhaseFigures:
    name: str
    seconds: float
    requests: int
    errors: int
    per_second: float
    p50_ms: float | None
    p99_ms: float | None
    error_classes: dict[str, int] = field(default_factory=dict)


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 1)


def phase_figures(ops: list[Op], name: str, start: float, end: float) -> PhaseFigures:
    mine = [o for o in ops if start <= o.start < end]
    ok = [o.end - o.start for o in mine if o.error is None]
    errors = [o for o in mine if o.error is not None]
    return PhaseFigures(name, round(end - start, 2), len(mine), len(errors), round(len(ok) / max(end - start, 1e-9), 1),
                        _pct(ok, 0.50), _pct(ok, 0.99), dict(Counter(o.error or "" for o in errors)))


@dataclass
class DrillResult:
    drill: str
    description: str
    phases: list[PhaseFigures]
    # The disruption: from the kill (or the PostgreSQL restart's start) to when it was
    # over for new requests (the replica marked down; every replica serving again).
    window: tuple[float, float]
    window_label: str
    errors_in_flight_at_start: int
    errors_started_in_window: int
    errors_outside_window: int
    error_span_s: float | None  # first failed request's start to last failed request's end
    last_error_s: float | None  # the last failed request's end, from the window's start
    events: dict[str, float]  # seconds from the load's start
    checks: dict[str, bool]
    counts: dict[str, int]
    problems: list[str]


# --- the drills --------------------------------------------------------------------------

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
        self._cluster = Cluster(self.root)
        self.cluster.start()
        self.database = "strongroom_drill"
        with self.cluster.connect("postgres") as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        root = self.root
        self.data = root / "data"
        self.token = self._initialise()
        self.ca = self.data / "ca.pem"
        self.trust = ssl.create_default_context(cafile=str(self.ca))
        rest, kmip, agent = _free_port_on_all(), _free_port_on_all(), _free_port_on_all()
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
            _wait(lambda r=r: self.ready(r), f"replica {r.name} to be ready (log: {r.log})", 90)
        self.haproxy.start()
        _wait(lambda: all(self.haproxy.status(r.name) == "UP" for r in self.replicas),
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
            self._cluster.stop()

    def inbox(self) -> int:
        with self.cluster.connect(self.database) as conn:
            row = conn.execute("SELECT count(*) FROM audit_inbox").fetchone()
        return int(row[0]) if row else 0


def _api(rig: Rig) -> httpx.Client:
    return httpx.Client(base_url=rig.base, verify=rig.trust, timeout=60,
                        headers={"Authorization": f"Bearer {rig.token}"})


def verify_acknowledged(rig: Rig, ops: list[Op]) -> tuple[dict[str, bool], dict[str, int], list[str]]:
    """Nothing acknowledged was lost: every data key decrypts to its plaintext and has its
    audit record; every rotation's version is in the chain; the chain verifies."""
    problems: list[str] = []
    datakeys = [o for o in ops if o.kind == "datakey" and o.error is None]
    rotations = [o for o in ops if o.kind == "rotate" and o.error is None]
    _wait(lambda: rig.inbox() == 0, "the audit chainer to chain every record", 120)
    with _api(rig) as api:
        def exported(action: str) -> list[dict[str, Any]]:
            r = api.get("/api/v1/audit/export", params={"format": "jsonl", "action": action})
            r.raise_for_status()
            return [json.loads(line) for line in r.text.splitlines() if line.strip()]

        generated = {e["request_id"] for e in exported("datakey.generate") if e["outcome"] == "allowed"}
        missing_audit = [o.request_id for o in datakeys if o.request_id not in generated]
        rotated = {(e["object_id"], (e.get("details") or {}).get("version")) for e in exported("key.rotate")
                   if e["outcome"] == "allowed"}
        missing_rotations = [o.request_id for o in rotations if (o.key_id, o.version) not in rotated]
        if missing_audit:
            problems.append(f"{len(missing_audit)} acknowledged data keys without their audit record, "
                            f"e.g. {missing_audit[:3]}")
        if missing_rotations:
            problems.append(f"{len(missing_rotations)} acknowledged rotations not in the chain, "
                            f"e.g. {missing_rotations[:3]}")
    wrong = _decrypt_all(rig, datakeys)
    if wrong:
        problems.append(f"{len(wrong)} acknowledged data keys did not decrypt to their plaintext, e.g. {wrong[:3]}")
    _wait(lambda: rig.inbox() == 0, "the audit chainer to chain every record", 120)
    with _api(rig) as api:
        v = api.post("/api/v1/audit/verify", json={"full": True})
        chain_ok = v.status_code == 200 and v.json()["ok"] is True
        if not chain_ok:
            problems.append(f"audit chain verification failed: {v.status_code} {v.text[:300]}")
        checked = v.json().get("checked", 0) if v.status_code == 200 else 0
    checks = {"every acknowledged data key decrypts to its plaintext": not wrong,
              "every acknowledged data key has its audit record": not missing_audit,
              "every acknowledged rotation is in the audit chain": not missing_rotations,
              "the audit chain verifies": chain_ok}
    counts = {"acknowledged data keys": len(datakeys), "acknowledged rotations": len(rotations),
              "audit records verified": int(checked)}
    return checks, counts, problems


def _decrypt_all(rig: Rig, datakeys: list[Op], concurrency: int = 32) -> list[str]:
    async def main() -> list[str]:
        wrong: list[str] = []
        queue: asyncio.Queue[Op] = asyncio.Queue()
        for o in datakeys:
            queue.put_nowait(o)

        async def worker() -> None:
            async with httpx.AsyncClient(base_url=rig.base, verify=rig.trust, timeout=60,
                                         headers={"Authorization": f"Bearer {rig.token}"}) as c:
                while not queue.empty():
                    o = queue.get_nowait()
                    for attempt in range(3):
                        try:
                            r = await c.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": o.blob})
                            break
                        except httpx.TransportError:
                            if attempt == 2:
                                raise
                    if r.status_code != 200 or r.json()["plaintext"] != o.plaintext:
                        wrong.append(f"{o.request_id}: {r.status_code}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return wrong

    return asyncio.run(main())


def _attribute(ops: list[Op], window: tuple[float, float]) -> tuple[int, int, int, float | None, float | None]:
    """Failed requests: in flight when the disruption began, started inside its window,
    or outside it (the drill fails on those)."""
    start, end = window
    failed = [o for o in ops if o.error is not None]
    in_flight = sum(1 for o in failed if o.start < start <= o.end)
    inside = sum(1 for o in failed if start <= o.start <= end)
    outside = len(failed) - in_flight - inside
    span = round(max(o.end for o in failed) - min(o.start for o in failed), 2) if failed else None
    last = round(max(o.end for o in failed) - start, 2) if failed else None
    return in_flight, inside, outside, span, last


def _outside_errors(ops: list[Op], window: tuple[float, float]) -> str:
    """Each failed request neither in flight at the window's start nor started inside it:
    its class, request id and times from the window's start (what a failed drill needs)."""
    start, end = window
    return "; ".join(f"{o.error} ({o.request_id}, {o.start - start:+.2f}..{o.end - start:+.2f} s)"
                     for o in ops if o.error is not None
                     and not (o.start < start <= o.end) and not (start <= o.start <= end))


def replica_drill(rig: Rig, *, phase: float, clients: int, rotators: int, think_ms: float) -> DrillResult:
    victim = rig.replicas[1]
    load = Load(rig.base, rig.token, rig.trust, clients=clients, rotators=rotators, think_ms=think_ms,
                rotate_every=0.5, tag="kill")
    t0 = time.monotonic()
    load.start()
    time.sleep(phase)
    sessions_before = int(rig.haproxy.stats()[victim.name]["stot"])
    t_kill = time.monotonic()
    victim.kill()
    t_down = _wait(lambda: rig.haproxy.status(victim.name).startswith("DOWN"), "HAProxy to mark the killed "
                   "replica down", 30)
    time.sleep(max(0.0, phase - (time.monotonic() - t_kill)))
    t_restart = time.monotonic()
    victim.start()
    t_up = _wait(lambda: rig.haproxy.status(victim.name) == "UP", "HAProxy to mark the restarted replica up", 90)
    stot_at_up = int(rig.haproxy.stats()[victim.name]["stot"])
    time.sleep(phase)
    t_end = time.monotonic()
    load.stop()
    stot_after = int(rig.haproxy.stats()[victim.name]["stot"])
    serves = rig.serves_data_key(victim)
    ops = load.ops
    window = (t_kill, t_down)
    in_flight, inside, outside, span, last = _attribute(ops, window)
    phases = [phase_figures(ops, "before", t0, t_kill), phase_figures(ops, "during (kill to up again)", t_kill, t_up),
              phase_figures(ops, "after", t_up, t_end)]
    checks, counts, problems = verify_acknowledged(rig, ops)
    checks["errors only for requests in flight on the killed replica (or racing its close)"] = outside == 0
    checks["the restarted replica is up in HAProxy and serves new connections"] = (stot_after > stot_at_up and serves)
    checks["no errors after it was back"] = phases[2].errors == 0
    if outside:
        problems.append(f"{outside} errors outside the kill window: {_outside_errors(ops, window)}")
    counts["connections to the killed replica before the kill"] = sessions_before
    counts["connections to it after its restart"] = stot_after - stot_at_up
    events = {"kill": t_kill - t0, "marked down": t_down - t0, "restarted": t_restart - t0, "marked up": t_up - t0,
              "end": t_end - t0}
    return DrillResult("replica", f"kill -9 of replica {victim.name} under {clients} clients, restarted after "
                       f"{t_restart - t_kill:.1f} s", phases, (window[0] - t0, window[1] - t0),
                       "kill to marked down", in_flight, inside, outside, span, last,
                       {k: round(v, 2) for k, v in events.items()}, checks, counts, problems)


def postgres_drill(rig: Rig, *, phase: float, clients: int, rotators: int, think_ms: float,
                   mode: str) -> DrillResult:
    pids = {r.name: r.proc.pid for r in rig.replicas if r.proc is not None}
    load = Load(rig.base, rig.token, rig.trust, clients=clients, rotators=rotators, think_ms=think_ms,
                rotate_every=0.5, tag="pg")
    t0 = time.monotonic()
    load.start()
    time.sleep(phase)
    t_stop = time.monotonic()
    rig.cluster.restart(mode)
    t_pg_up = time.monotonic()
    t_serving = _wait(lambda: all(rig.serves_data_key(r) for r in rig.replicas),
                      "every replica to serve data keys again after the restart", 120)
    t_all_up = _wait(lambda: all(rig.haproxy.status(r.name) == "UP" for r in rig.replicas),
                     "HAProxy to mark every replica up again", 60)
    time.sleep(phase)
    t_end = time.monotonic()
    load.stop()
    ops = load.ops
    window = (t_stop, t_serving)
    in_flight, inside, outside, span, last = _attribute(ops, window)
    phases = [phase_figures(ops, "before", t0, t_stop),
              phase_figures(ops, "during (restart to serving again)", t_stop, t_serving),
              phase_figures(ops, "after", t_serving, t_end)]
    checks, counts, problems = verify_acknowledged(rig, ops)
    same = all(r.proc is not None and r.proc.poll() is None and r.proc.pid == pids[r.name] for r in rig.replicas)
    checks["the replicas recovered by themselves (same processes, none restarted)"] = same
    checks["errors only while PostgreSQL restarted and the replicas reconnected"] = outside == 0
    checks["no errors after every replica served again"] = phases[2].errors == 0
    if outside:
        problems.append(f"{outside} errors outside the restart window: {_outside_errors(ops, window)}")
    events = {"pg_ctl restart": t_stop - t0, "PostgreSQL up": t_pg_up - t0, "every replica serving": t_serving - t0,
              "every replica up in HAProxy": t_all_up - t0, "end": t_end - t0}
    return DrillResult("postgres", f"PostgreSQL restarted (pg_ctl restart -m {mode}) under {clients} clients; "
                       "replicas untouched", phases, (window[0] - t0, window[1] - t0),
                       "restart issued to every replica serving", in_flight, inside, outside, span, last,
                       {k: round(v, 2) for k, v in events.items()}, checks, counts, problems)


# --- output ------------------------------------------------------------------------------

def render(results: list[DrillResult]) -> None:
    for d in results:
        t = Table(title=f"drill: {d.description}", title_justify="left")
        for col in ("phase", "s", "requests", "ok/s", "errors", "p50 ms", "p99 ms", "error classes"):
            t.add_column(col, justify="left" if col in ("phase", "error classes") else "right")
        for p in d.phases:
            t.add_row(p.name, f"{p.seconds:.1f}", f"{p.requests:,}", f"{p.per_second:,.0f}", str(p.errors),
                      "-" if p.p50_ms is None else f"{p.p50_ms:.1f}", "-" if p.p99_ms is None else f"{p.p99_ms:.1f}",
                      ", ".join(f"{k}: {v}" for k, v in sorted(p.error_classes.items())) or "-")
        console.print(t)
        console.print(f"  window ({d.window_label}): {d.window[0]:.2f}-{d.window[1]:.2f} s "
                      f"({d.window[1] - d.window[0]:.2f} s); errors: {d.errors_in_flight_at_start} in flight at its "
                      f"start, {d.errors_started_in_window} started inside it, {d.errors_outside_window} outside; "
                      f"first to last error {d.error_span_s if d.error_span_s is not None else '-'} s; last error "
                      f"{d.last_error_s if d.last_error_s is not None else '-'} s after the window's start")
        console.print("  events (s from the load's start): "
                      + ", ".join(f"{k} {v:.2f}" for k, v in d.events.items()))
        console.print("  " + ", ".join(f"{k}: {v:,}" for k, v in d.counts.items()))
        for k, ok in d.checks.items():
            console.print(f"  [{'green' if ok else 'red'}]{'ok  ' if ok else 'FAIL'}[/] {k}")
        for problem in d.problems:
            console.print(f"  [red]{problem}[/red]")


def run(*, drills: list[str], phase: float, clients: int, rotators: int, think_ms: float, pg_mode: str,
        json_out: Path | None, keep: bool = False) -> list[DrillResult]:
    if shutil.which("haproxy") is None:
        raise SystemExit("haproxy is not installed: apt-get install haproxy")
    root = Path(tempfile.mkdtemp(prefix="strongroom-drill-"))
    results: list[DrillResult] = []
    rig = Rig(root)
    try:
        with console.status("starting PostgreSQL, three replicas and HAProxy"):
            rig.start()
        for name in drills:
            with console.status(f"drill: {name}"):
                if name == "replica":
                    results.append(replica_drill(rig, phase=phase, clients=clients, rotators=rotators,
                                                 think_ms=think_ms))
                else:
                    results.append(postgres_drill(rig, phase=phase, clients=clients, rotators=rotators,
                                                  think_ms=think_ms, mode=pg_mode))
    finally:
        rig.close()
        if keep:
            console.print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    render(results)
    if json_out is not None:
        json_out.write_text(json.dumps({"when": datetime.now(UTC).isoformat(timespec="seconds"),
                                        "cores": os.cpu_count(), "phase_s": phase, "clients": clients,
                                        "rotators": rotators, "drills": [asdict(d) for d in results]}, indent=2))
    return results


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


@contextmanager
def _interruptible() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C: the replicas, HAProxy and the cluster are stopped."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


app = typer.Typer(add_completion=False)


@app.command()
def drill(
    drills: Annotated[str, typer.Option(help="which drills, comma-separated: replica, postgres")] = "replica,postgres",
    phase: Annotated[float, typer.Option(min=1, help="seconds of each phase: before, during, after")] = 20,
    clients: Annotated[int, typer.Option(min=2, help="concurrent clients through HAProxy")] = 200,
    rotators: Annotated[int, typer.Option(min=0, help="of them, clients rotating keys (every 0.5 s)")] = 4,
    think_ms: Annotated[float, typer.Option(min=0, help="mean wait between a client's data keys (0: back to "
                                                        "back)")] = 0,
    pg_mode: Annotated[str, typer.Option(help="pg_ctl restart mode: fast (clean) or immediate (a crash)")] = "fast",
    json_out: Annotated[Path | None, typer.Option("--json", help="every figure and check as JSON")] = None,
    keep: Annotated[bool, typer.Option(help="keep the scratch directory (logs) afterwards")] = False,
) -> None:
    """Replica kill -9 and PostgreSQL restart under load, behind HAProxy: nothing
    acknowledged lost, errors only in the disruption's window."""
    names = [d.strip() for d in drills.split(",") if d.strip()]
    if not names or any(n not in ("replica", "postgres") for n in names):
        raise typer.BadParameter("choose from replica, postgres", param_hint="--drills")
    if pg_mode not in ("fast", "immediate"):
        raise typer.BadParameter("fast or immediate", param_hint="--pg-mode")
    try:
        with _interruptible():
            results = run(drills=names, phase=phase, clients=clients, rotators=rotators, think_ms=think_ms,
                          pg_mode=pg_mode, json_out=json_out, keep=keep)
    except DrillFailed as exc:
        console.print(f"[red]drill failed[/red]: {exc}")
        raise typer.Exit(1) from None
    raise typer.Exit(0 if all(all(d.checks.values()) for d in results) else 1)


def main(argv: list[str] | None = None) -> None:
    app(args=argv, prog_name="kms-bench drill")


if __name__ == "__main__":
    main()
