"""Health endpoints, metrics, and the server's behaviour when its dependencies fail."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
import uvicorn
from sqlalchemy.engine import make_url

from hsm.config import HsmConfig
from keyserver.api.app import create_app
from keyserver.services import LazyHsm, Services, build_services
from keyserver.settings import Settings
from tests import https
from tests.conftest import unique
from tests.serve import free_port


@contextmanager
def serve(services: Services, port: int | None = None) -> Iterator[str]:
    """`services`' app over plain HTTP on `port` (a free one by default)."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(services, run_background=False), host="127.0.0.1",
                                           port=port, log_config=None, lifespan="on"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(10)


def test_health_ready_and_metrics(base_url: str, admin: httpx.Client) -> None:
    with https.client(base_url=base_url) as anon:
        assert anon.get("/healthz").json() == {"status": "ok"}
        r = anon.get("/readyz")
        assert r.status_code == 200 and r.json()["checks"] == {"database": "ok", "hsm": "ok"}
        assert anon.get("/metrics").status_code == 401
    admin.get("/api/v1/keys")
    text = admin.get("/metrics").text
    assert 'strongroom_http_requests_total{method="GET",route="/api/v1/keys",status="200"}' in text
    assert "strongroom_http_request_seconds_bucket" in text
    # The audit chain's backlog, read from the store at each scrape.
    pending = [line for line in text.splitlines() if line.startswith("strongroom_audit_pending_records ")]
    assert len(pending) == 1 and float(pending[0].split()[1]) >= 0


def test_system_health_names_this_replica_its_checks_and_the_audit_chain(
        actors: dict[str, object], settings: Settings) -> None:
    admin = actors["admin"].client  # type: ignore[attr-defined]
    admin.post("/api/v1/keys", json={"name": unique("health")})
    r = admin.get("/api/v1/system/health")
    assert r.status_code == 200, r.text
    h = r.json()
    assert h["status"] == "ok" and h["version"] and h["pid"] > 0
    assert h["store"] == ("embedded" if settings.effective_database_url.startswith("sqlite") else "postgresql")
    checks = {c["name"]: c for c in h["checks"]}
    assert checks["database"]["ok"] and checks["hsm"]["ok"] and checks["database"]["latency_ms"] >= 0
    assert h["audit_head_seq"] > 0 and h["audit_pending"] >= 0 and h["active_kek"].startswith("kek-")
    # An auditor reads it too (every role holds system:read).
    assert actors["auditor"].client.get("/api/v1/system/health").status_code == 200  # type: ignore[attr-defined]


def test_system_health_of_a_replica_without_its_hsm_is_unavailable_with_advice(
        settings: Settings, actors: dict[str, object]) -> None:
    broken = LazyHsm(HsmConfig(user_pin="a-long-user-pin", so_pin="a-long-so-pin",
                               module_path="/nonexistent/libpkcs11.so"))
    services = build_services(settings, hsm=broken, migrate=False)  # type: ignore[arg-type]
    token = actors["admin"].client.headers["authorization"]  # type: ignore[attr-defined]
    try:
        with serve(services) as url, https.client(base_url=url, headers={"Authorization": token}) as c:
            r = c.get("/api/v1/system/health")
            assert r.status_code == 200, r.text
            checks = {x["name"]: x for x in r.json()["checks"]}
            assert r.json()["status"] == "unavailable"
            assert checks["database"]["ok"] and not checks["hsm"]["ok"]
            assert "/nonexistent/libpkcs11.so" in checks["hsm"]["detail"] and checks["hsm"]["latency_ms"] is None
    finally:
        services.engine.dispose()


def test_security_headers_and_unknown_routes(base_url: str) -> None:
    with https.client(base_url=base_url) as c:
        r = c.get("/api/v1/nothing-here")
        assert r.status_code == 404 and r.json()["code"] == "not_found"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["cache-control"] == "no-store"
        r = c.put("/api/v1/keys")
        assert r.status_code == 405


def test_oversized_and_malformed_bodies(admin: httpx.Client) -> None:
    r = admin.post("/api/v1/keys", content=b"{" + b" " * (1 << 20 + 1) + b"}",
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
    r = admin.post("/api/v1/keys", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["code"] == "validation_error"


def test_missing_hsm_gives_503_with_advice(settings: Settings) -> None:
    broken = LazyHsm(HsmConfig(user_pin="a-long-user-pin", so_pin="a-long-so-pin",
                               module_path="/nonexistent/libpkcs11.so"))
    services = build_services(settings, hsm=broken, migrate=False)  # type: ignore[arg-type]
    try:
        with serve(services) as url, https.client(base_url=url) as c:
            r = c.get("/readyz")
            assert r.status_code == 503
            assert "/nonexistent/libpkcs11.so" in r.json()["checks"]["hsm"]
            r = c.post("/api/v1/auth/login", json={"username": "x", "password": "y"})
            # Login needs no HSM: a wrong password is still a plain 401.
            assert r.status_code == 401
    finally:
        services.engine.dispose()


def test_key_operation_without_hsm_is_503(settings: Settings, actors: dict[str, object]) -> None:
    broken = LazyHsm(HsmConfig(user_pin="a-long-user-pin", so_pin="a-long-so-pin",
                               module_path="/nonexistent/libpkcs11.so"))
    services = build_services(settings, hsm=broken, migrate=False)  # type: ignore[arg-type]
    token = actors["key-officer"].client.headers["authorization"]  # type: ignore[attr-defined]
    try:
        with serve(services) as url, https.client(base_url=url, headers={"Authorization": token}) as c:
            r = c.post("/api/v1/keys", json={"name": unique("nohsm")})
            assert r.status_code == 503
            body = r.json()
            assert body["code"] in ("hsm_unavailable", "unavailable")
            assert "Traceback" not in r.text and r.headers["retry-after"]
    finally:
        services.engine.dispose()


def test_database_down_is_503_and_recovers(settings: Settings, hsm_backend: object,
                                           actors: dict[str, object], database_url: str) -> None:
    # A server whose database is unreachable answers 503, never a traceback.
    dead = Settings(database_url="postgresql+psycopg://postgres@127.0.0.1:1/none",
                    data_dir=Path(settings.data_dir))
    services = build_services(dead, hsm=hsm_backend, migrate=False)  # type: ignore[arg-type]
    token = actors["admin"].client.headers["authorization"]  # type: ignore[attr-defined]
    try:
        with serve(services) as url, https.client(base_url=url, headers={"Authorization": token}) as c:
            r = c.get("/api/v1/keys")
            assert r.status_code == 503 and r.json()["code"] == "database_unavailable"
            assert c.get("/readyz").json()["checks"]["database"].startswith("unreachable")
    finally:
        services.engine.dispose()
    # Connections killed under a live server: the pool notices and the next call works.
    admin = actors["admin"].client  # type: ignore[attr-defined]
    assert admin.get("/api/v1/keys").status_code == 200
    name = admin.post("/api/v1/keys", json={"name": unique("kill")}).json()["name"]
    assert admin.post(f"/api/v1/keys/{name}/generate-data-key", json={}).status_code == 200
    u = make_url(database_url)
    with psycopg.connect(host=u.host, port=u.port or 5432, user=u.username, dbname="postgres", autocommit=True) as conn:
        # With a timeout, each call returns once that backend has gone: "killed" is a fact.
        conn.execute("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                     "WHERE datname = %s AND pid <> pg_backend_pid()", (u.database,))
    assert admin.get("/api/v1/keys").status_code == 200
    r = admin.post("/api/v1/keys", json={"name": unique("after-kill")})
    assert r.status_code == 201
    # The hot path's pool does not ping; it retries once on a dead connection.
    assert admin.post(f"/api/v1/keys/{name}/generate-data-key", json={}).status_code == 200


def test_openapi_documents_errors_and_operation_ids(base_url: str) -> None:
    spec = https.get(f"{base_url}/api/v1/openapi.json").json()
    assert spec["components"]["schemas"]["Problem"]["required"] == ["type", "title", "status", "detail", "code"]
    for path, item in spec["paths"].items():
        for method, op in item.items():
            assert op.get("operationId"), f"{method} {path} has no operationId"
            if path.startswith("/api/v1/") and op["operationId"] != "login":
                ref = op["responses"]["401"]["content"]["application/problem+json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/Problem"


def test_out_of_range_integers_are_422_with_a_request_id(admin: httpx.Client) -> None:
    huge = "9" * 30
    for path, params in ((f"/api/v1/audit/events/{huge}", None), ("/api/v1/audit/events", {"before_seq": huge}),
                         ("/api/v1/keys", {"offset": huge}), ("/api/v1/audit/checkpoints", {"after": huge})):
        r = admin.get(path, params=params)
        assert r.status_code == 422 and r.json()["request_id"] == r.headers["x-request-id"], (path, r.text)


def test_405_names_the_allowed_methods(admin: httpx.Client) -> None:
    r = admin.put("/api/v1/audit/verify")
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"
    assert r.headers["allow"] == "POST"


def test_the_console_is_served_under_a_content_security_policy(base_url: str) -> None:
    r = https.get(f"{base_url}/")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-eval" not in csp
    assert "'unsafe-inline'" not in csp.split("script-src")[1].split(";")[0]


def test_openapi_declares_how_each_route_authenticates(base_url: str) -> None:
    spec = https.get(f"{base_url}/api/v1/openapi.json").json()
    assert set(spec["components"]["securitySchemes"]) == {"apiToken", "session", "hostCertificate"}
    ops = {op["operationId"]: op.get("security") for item in spec["paths"].values() for op in item.values()}
    assert ops["listKeys"] == [{"apiToken": []}, {"session": []}]
    assert ops["getAgentKey"] == [{"hostCertificate": []}]
    assert ops["login"] is None and ops["enrollHost"] is None


def test_an_unexpected_error_is_a_500_problem_with_the_request_id(services: Services, settings: Settings,
                                                                  hsm_backend: object) -> None:
    """Answered inside the request's context: the body's request id is the log's."""
    broken = build_services(settings, hsm=hsm_backend, migrate=False)  # type: ignore[arg-type]

    def boom(*_: object, **__: object) -> None:
        raise RuntimeError("a bug")

    broken.keys.list = boom  # type: ignore[method-assign]
    token = None
    try:
        with serve(broken) as url:
            from keyserver.core.principal import system_context

            token = services.identity.create_token(system_context("tests"), name="boom", scopes=None,
                                                   expires_in_days=1, user_id=_admin_id(services)).secret
            r = httpx.get(f"{url}/api/v1/keys", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 500 and r.json()["code"] == "internal_error"
            assert r.json()["request_id"] == r.headers["x-request-id"] and r.json()["request_id"]
    finally:
        broken.engine.dispose()


def _admin_id(services: Services) -> object:
    from sqlalchemy import select

    from keyserver.store.models import User

    with services.db() as s:
        return s.execute(select(User.id).where(User.role == "admin")).scalars().first()
