"""Session-wide real dependencies: a database, a SoftHSM2 token, the keyserver's
services, and a uvicorn server on a loopback port.

The store is PostgreSQL unless STRONGROOM_TEST_STORE=embedded: then it is the
embedded default exactly as `scripts/start` makes it (no database URL: the SQLite
file in the data directory). `scripts/test` runs the integration suites on both.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from hsm import HsmBackend
from hsm.testing import shared_test_backend
from keyserver.api.app import create_app
from keyserver.core.principal import system_context
from keyserver.runtime.agentport import agent_sidecar
from keyserver.runtime.tls import rest_tls_context, uvicorn_tls
from keyserver.services import Services, build_services
from keyserver.settings import Settings
from kmsbench.ports import POOL_ENV, free_port
from tests import https, parallel
from tests.pg import scratch_database

STORE = os.environ.get("STRONGROOM_TEST_STORE", "postgresql")
assert STORE in ("postgresql", "embedded"), f"STRONGROOM_TEST_STORE={STORE}: postgresql or embedded"
# Every process of a run (pytest's workers, both stores' runs at once, the servers and
# rigs the tests start) takes its ports from one counter: kmsbench/ports.py says why.
os.environ.setdefault(POOL_ENV, str(Path(tempfile.gettempdir()) / "strongroom-test-ports"))


def pytest_configure(config: pytest.Config) -> None:
    parallel.configure(config)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On the embedded store, run every test that goes through the key server's store
    (it uses the `services` fixture, or is marked `store`: it starts its own servers on
    the session's kind of store); the rest (file format, HSM, tooling, servers a test
    starts itself on a fixed store) does not depend on the store and ran once already.

    Then `scripts/test --quick`'s choice, and the order and grouping for pytest-xdist
    (tests/parallel.py)."""
    if STORE == "embedded":
        selected, deselected = [], []
        for item in items:
            on_store = "services" in getattr(item, "fixturenames", ()) or item.get_closest_marker("store") is not None
            (selected if on_store else deselected).append(item)
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
    parallel.exclusive(config, items)
    parallel.quick(config, items)
    parallel.arrange(items)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def database_url(data_dir: Path) -> Iterator[str]:
    if STORE == "embedded":
        yield Settings(data_dir=data_dir).effective_database_url
        return
    with scratch_database() as url:
        yield url


@pytest.fixture(scope="session")
def hsm_backend(tmp_path_factory: pytest.TempPathFactory) -> HsmBackend:
    # SoftHSM2 reads its configuration once per process: one token for the whole run.
    return shared_test_backend(lambda: tmp_path_factory.mktemp("softhsm"))


class _ClosingBackend:
    """The services own their backend and close it; the session fixture owns ours."""

    def __init__(self, inner: HsmBackend) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def close(self) -> None:
        pass


@pytest.fixture(scope="session")
def settings(database_url: str, data_dir: Path) -> Settings:
    return Settings(database_url=None if STORE == "embedded" else database_url, data_dir=data_dir,
                    scheduler_interval_seconds=3600, session_idle_minutes=30, agent_port=0)


@pytest.fixture(scope="session")
def services(settings: Settings, hsm_backend: HsmBackend) -> Iterator[Services]:
    svc = build_services(settings, hsm=_ClosingBackend(hsm_backend))  # type: ignore[arg-type]
    svc.admin_password = svc.initialize()  # type: ignore[attr-defined]
    svc.notifier.start()  # the server under test hears other replicas' revocations
    yield svc
    svc.close()


@contextlib.contextmanager
def own_store() -> Iterator[str | None]:
    """A store of the session's kind of its own, for tests that change what the session's
    server must not see (other settings, tampering): a scratch PostgreSQL database's URL,
    or None (the embedded default, under the data directory given to `services_on`)."""
    with (contextlib.nullcontext(None) if STORE == "embedded" else scratch_database()) as url:
        yield url


@contextlib.contextmanager
def services_on(url: str | None, data_dir: Path, hsm_backend: HsmBackend, **settings: Any) -> Iterator[Services]:
    """Initialised services on `url` (from `own_store`) with the session's token."""
    svc = build_services(Settings(database_url=url, data_dir=data_dir, scheduler_interval_seconds=3600,
                                  agent_port=0, **settings), hsm=_ClosingBackend(hsm_backend))  # type: ignore[arg-type]
    svc.initialize()
    try:
        yield svc
    finally:
        svc.close()


@contextlib.contextmanager
def own_services(data_dir: Path, hsm_backend: HsmBackend, **settings: Any) -> Iterator[Services]:
    with own_store() as url, services_on(url, data_dir, hsm_backend, **settings) as svc:
        yield svc


@pytest.fixture(scope="session")
def admin_password(services: Services) -> str:
    pw = services.admin_password  # type: ignore[attr-defined]
    assert pw, "the first initialize() must create the admin"
    return str(pw)



@contextlib.contextmanager
def _serving(server: uvicorn.Server, sockets: list[socket.socket] | None = None) -> Iterator[None]:
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.05)
    yield
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="session")
def app(services: Services) -> FastAPI:
    return create_app(services, run_background=False)


@pytest.fixture(scope="session")
def ca_file(services: Services, data_dir: Path) -> Path:
    """The internal CA's certificate, as `keyserver serve` leaves it in the data directory."""
    path = data_dir / "ca.pem"
    path.write_bytes(services.ca.certificate_pem())
    return path


@pytest.fixture(scope="session")
def tls(ca_file: Path) -> ssl.SSLContext:
    """What a client that trusts the internal CA verifies the server with (httpx `verify=`)."""
    return https.trust(ca_file)


@contextlib.contextmanager
def serving_https(app: FastAPI, services: Services) -> Iterator[str]:
    """`app` on a real HTTPS server on loopback, its certificate from the internal CA of
    `services` as by default; yields its URL."""
    port = free_port()
    tls = uvicorn_tls(rest_tls_context(services.settings, services.ca))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                                           access_log=False, lifespan="on", **tls))
    with _serving(server):
        yield f"https://127.0.0.1:{port}"


@contextlib.contextmanager
def serving_agent_port(services: Services, app: FastAPI) -> Iterator[str]:
    """The agent port (HTTPS, client certificates from the internal CA) on the same
    application, as `keyserver serve` runs it; yields its URL."""
    sidecar = agent_sidecar(services, app, {"log_config": None, "access_log": False})
    assert sidecar is not None and services.agent_url
    server, sock = sidecar
    with _serving(server, [sock]):
        yield services.agent_url


@pytest.fixture(scope="session")
def base_url(app: FastAPI, services: Services, tls: ssl.SSLContext) -> Iterator[str]:
    """A real HTTPS server on loopback, in this process so tests can also reach the
    services directly (e.g. to flush the audit chain)."""
    with serving_https(app, services) as url:
        yield url


@pytest.fixture(scope="session")
def agent_url(services: Services, app: FastAPI, base_url: str) -> Iterator[str]:
    with serving_agent_port(services, app) as url:
        yield url


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Actor:
    """A caller with a role: an API token client, and the user behind it."""

    def __init__(self, role: str, username: str, password: str, client: httpx.Client,
                 session: httpx.Client) -> None:
        self.role, self.username, self.password = role, username, password
        self.client = client  # API token
        self.session = session  # browser session: cookie + X-CSRF-Token


def _make_actor(services: Services, base_url: str, tls: ssl.SSLContext, role: str) -> Actor:
    username = unique(role.replace("-", ""))
    password = f"correct-horse-{uuid.uuid4().hex}"
    ctx = system_context("tests")
    services.identity.create_user(ctx, username=username, role=role, password=password)
    session = httpx.Client(base_url=base_url, verify=tls, timeout=30)
    r = session.post("/api/v1/auth/login", json={"username": username, "password": password})
    assert r.status_code == 200, r.text
    session.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    r = session.post("/api/v1/tokens", json={"name": "tests"})
    assert r.status_code == 201, r.text
    secret = r.json()["secret"]
    client = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {secret}"}, verify=tls,
                          timeout=30)
    return Actor(role, username, password, client, session)


@pytest.fixture(scope="session")
def actors(services: Services, base_url: str, tls: ssl.SSLContext) -> Iterator[dict[str, Actor]]:
    made = {role: _make_actor(services, base_url, tls, role)
            for role in ("admin", "key-officer", "operator", "auditor")}
    yield made
    for a in made.values():
        a.client.close()
        a.session.close()


@pytest.fixture
def admin(actors: dict[str, Actor]) -> httpx.Client:
    return actors["admin"].client


@pytest.fixture
def new_key(admin: httpx.Client) -> dict[str, Any]:
    r = admin.post("/api/v1/keys", json={"name": unique("key"), "description": "test key",
                                         "tags": {"env": "test"}})
    assert r.status_code == 201, r.text
    return dict(r.json())


REPO = Path(__file__).resolve().parents[1]
