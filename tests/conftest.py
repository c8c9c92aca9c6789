"""Session-wide real dependencies: a PostgreSQL database, a SoftHSM2 token, the
keyserver's services, and a uvicorn server on a loopback port."""

from __future__ import annotations

import contextlib
import socket
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
from keyserver.agentport import agent_sidecar
from keyserver.api.app import create_app
from keyserver.core.principal import system_context
from keyserver.services import Services, build_services
from keyserver.settings import Settings
from tests.pg import scratch_database


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
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
def settings(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(database_url=database_url, data_dir=tmp_path_factory.mktemp("data"),
                    scheduler_interval_seconds=3600, session_idle_minutes=30, agent_port=0)


@pytest.fixture(scope="session")
def services(settings: Settings, hsm_backend: HsmBackend) -> Iterator[Services]:
    svc = build_services(settings, hsm=_ClosingBackend(hsm_backend))  # type: ignore[arg-type]
    svc.admin_password = svc.initialize()  # type: ignore[attr-defined]
    svc.notifier.start()  # the server under test hears other replicas' revocations
    yield svc
    svc.close()


@pytest.fixture(scope="session")
def admin_password(services: Services) -> str:
    pw = services.admin_password  # type: ignore[attr-defined]
    assert pw, "the first initialize() must create the admin"
    return str(pw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
def base_url(app: FastAPI) -> Iterator[str]:
    """A real HTTP server on loopback, in this process so tests can also reach the
    services directly (e.g. to flush the audit chain)."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                                           access_log=False, lifespan="on"))
    with _serving(server):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def agent_url(services: Services, app: FastAPI, base_url: str) -> Iterator[str]:
    """The agent port (HTTPS, client certificates from the internal CA) on the same
    application, as `keyserver serve` runs it."""
    sidecar = agent_sidecar(services, app, {"log_config": None, "access_log": False})
    assert sidecar is not None and services.agent_url
    server, sock = sidecar
    with _serving(server, [sock]):
        yield services.agent_url


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Actor:
    """A caller with a role: an API token client, and the user behind it."""

    def __init__(self, role: str, username: str, password: str, client: httpx.Client,
                 session: httpx.Client) -> None:
        self.role, self.username, self.password = role, username, password
        self.client = client  # API token
        self.session = session  # browser session: cookie + X-CSRF-Token


def _make_actor(services: Services, base_url: str, role: str) -> Actor:
    username = unique(role.replace("-", ""))
    password = f"correct-horse-{uuid.uuid4().hex}"
    ctx = system_context("tests")
    services.identity.create_user(ctx, username=username, role=role, password=password)
    session = httpx.Client(base_url=base_url, timeout=30)
    r = session.post("/api/v1/auth/login", json={"username": username, "password": password})
    assert r.status_code == 200, r.text
    session.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    r = session.post("/api/v1/tokens", json={"name": "tests"})
    assert r.status_code == 201, r.text
    secret = r.json()["secret"]
    client = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    return Actor(role, username, password, client, session)


@pytest.fixture(scope="session")
def actors(services: Services, base_url: str) -> Iterator[dict[str, Actor]]:
    made = {role: _make_actor(services, base_url, role)
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
