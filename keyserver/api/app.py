"""The FastAPI application: wiring only. Behaviour lives in keyserver/core."""

from __future__ import annotations

import gc
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio.to_thread
import swagger_ui_bundle
from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from starlette.routing import BaseRoute, Match, Mount

from keyserver import product_version
from keyserver.api import problems
from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.hotpath import DataKeyHotPath, XksHotPath
from keyserver.api.routes import (
    agent,
    approvals,
    audit,
    auth,
    crypto,
    databases,
    datakeys,
    guardpoints,
    hosts,
    install,
    keys,
    kmip_clients,
    kmip_grants,
    kv,
    retirement,
    system,
    tokens,
    users,
    volumes,
    xks,
    xks_proxy,
)
from keyserver.core.permissions import Permission
from keyserver.logs import request_id_var
from keyserver.services import Services

log = logging.getLogger("keyserver.access")
WEBUI_DIST = Path(__file__).resolve().parents[2] / "webui" / "dist"
MAX_BODY = 1 << 20  # STRONGROOM_MAX_BODY_BYTES overrides it (create_app)
REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Metrics:
    """The server's Prometheus metrics. With several workers (`PROMETHEUS_MULTIPROC_DIR`,
    set by the supervisor) each worker writes its values to a shared directory and a
    scrape, whichever worker answers it, adds up every worker's: a replica's series no
    longer jump between one worker's counts and another's."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.shared_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        self.requests = Counter("strongroom_http_requests_total", "HTTP requests",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("strongroom_http_request_seconds", "HTTP request latency",
                                 ["method", "route"], registry=self.registry,
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
        # XKS calls answered ThrottlingException at STRONGROOM_XKS_MAX_IN_FLIGHT (api/hotpath.py).
        self.xks_shed = Counter("strongroom_xks_shed_total", "XKS proxy calls shed (429 ThrottlingException) past "
                                "the in-flight bound", registry=self.registry)
        # Set at each scrape from the sinks' cursors (shared by the replicas).
        # Gauges read from the store at a scrape: the most recent value is the truth.
        self.sink_backlog = Gauge("strongroom_audit_sink_backlog_records",
                                  "audit records not yet accepted by the sink", ["sink"], registry=self.registry,
                                  multiprocess_mode="mostrecent")
        self.sink_healthy = Gauge("strongroom_audit_sink_healthy", "1 while the sink accepts records",
                                  ["sink"], registry=self.registry, multiprocess_mode="mostrecent")
        # Set at each scrape (shared by the replicas): rising steadily means the chain does
        # not keep up; every record in it is already committed.
        self.audit_pending = Gauge("strongroom_audit_pending_records",
                                   "audit records committed but not yet chained", registry=self.registry,
                                   multiprocess_mode="mostrecent")

    def exposition(self) -> bytes:
        if self.shared_dir is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, path=self.shared_dir)  # type: ignore[no-untyped-call]
        return generate_latest(merged)


# The console is self-contained (Vite bundle, no CDN, no inline script): scripts and
# connections to this origin only. Mantine sets style attributes, hence inline styles.
CONSOLE_CSP = (b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
               b"font-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
               b"form-action 'self'; frame-ancestors 'none'")


DOCS_ASSETS = "/api/docs/assets"
DOCS_PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Strongroom Key Server: API reference</title>
<link rel="stylesheet" href="{DOCS_ASSETS}/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="{DOCS_ASSETS}/swagger-ui-bundle.js"></script>
<script src="/api/docs/init.js"></script>
</body></html>
"""
DOCS_INIT = """window.ui = SwaggerUIBundle({
  url: "/api/v1/openapi.json", dom_id: "#swagger-ui", deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis], layout: "BaseLayout",
});
"""


def is_page(path: str) -> bool:
    """Served to a browser as a page (the console, the API reference): framed by no
    one, under the console's CSP."""
    return not path.startswith("/api/") or path == "/api/docs" or path.startswith("/api/docs/")


class ConsoleFiles(StaticFiles):
    """The console's files. Hashed assets (`assets/name-HASH.js`) are cached for a year:
    their names change with their content. Everything else (index.html) is revalidated on
    every load, so a new release is picked up at once. The build's pre-compressed copies
    (`.br`, `.gz`, webui/scripts/compress.mjs) go to browsers that accept them."""

    ENCODINGS = (("br", ".br"), ("gzip", ".gz"))

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if response.status_code not in (200, 304):
            return response
        immutable = path.startswith("assets/")
        cache = "public, max-age=31536000, immutable" if immutable else "no-cache"
        if isinstance(response, FileResponse) and response.status_code == 200:
            accepted = dict(scope.get("headers") or []).get(b"accept-encoding", b"").decode("latin-1")
            tokens = {t.split(";")[0].strip() for t in accepted.split(",")}
            for encoding, suffix in self.ENCODINGS:
                compressed = f"{response.path}{suffix}"
                if encoding in tokens and os.path.isfile(compressed):
                    response = FileResponse(compressed, media_type=response.media_type,
                                            headers={"content-encoding": encoding})
                    break
        response.headers["cache-control"] = cache
        response.headers["vary"] = "Accept-Encoding"
        return response


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def route_methods(routes: list[BaseRoute], scope: Scope) -> set[str]:
    """Every method the application's routes answer at the scope's path, as the router
    itself matches them (Starlette's 405 names only the first route that matched the
    path: GET /keys, and not POST /keys). The console's files are not asked."""
    return {method for method in HTTP_METHODS
            if any(not isinstance(route, ConsoleMount) and route.matches({**scope, "method": method})[0] == Match.FULL
                   for route in routes)}


class ConsoleMount(Mount):
    """The console's files at "/", but never for /api/ paths nor the paths of other
    routes (/ca.pem, /healthz, …): a route called with the wrong method must answer its
    own 405 (with its Allow), not the file server's."""

    def __init__(self, *args: Any, routes: list[BaseRoute], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.routes_beside = routes
        self.owned: dict[str, bool] = {}  # path -> a route answers it (bounded: paths come from clients)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope.get("type") == "http":
            path = str(scope.get("path", ""))
            if path.startswith("/api/"):
                return Match.NONE, {}
            owned = self.owned.get(path)
            if owned is None:
                if len(self.owned) >= 4096:
                    self.owned.clear()
                owned = self.owned[path] = bool(route_methods(self.routes_beside, scope))
            if owned:
                return Match.NONE, {}
        return super().matches(scope)


class _BodyTooLarge(Exception):
    """Raised into the application by `receive` once the body passes the limit; the 413
    has already been sent."""


# Over TLS a browser must never be told to come back over plain HTTP (RFC 6797); not sent
# on --insecure-http, where it would pin a local test server's name to HTTPS it lacks.
HSTS = b"max-age=31536000"


class RequestMiddleware:
    """Request id, access log, metrics, body limit and security headers, as plain ASGI
    (BaseHTTPMiddleware costs a task per request on the hot path).

    The body limit counts the bytes as they are received, whatever the framing
    (Content-Length, chunked, or a Content-Length that lies): the 413 goes out as soon as
    the limit is passed, with `Connection: close`, so the rest is never read, let alone
    buffered. A declared length over the limit is refused before the application runs."""

    def __init__(self, app: ASGIApp, metrics: Metrics, services: Services | None = None,
                 routes: list[BaseRoute] | None = None) -> None:
        # Built with the middleware stack (the first request), not by create_app: the
        # OpenAPI dump builds the app with no services at all.
        self.app, self.metrics = app, metrics
        self.max_body = services.settings.max_body_bytes if services is not None else MAX_BODY
        self.routes = routes or []

    @staticmethod
    def _route(scope: Scope) -> str:
        # Label metrics by the route template, never the raw path (unbounded values):
        # put the matched path parameters back as {name}.
        if scope.get("route") is None:
            return "other"
        path: str = scope["path"]
        for name, value in (scope.get("path_params") or {}).items():
            path = path.replace(f"/{value}", f"/{{{name}}}")
        return path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        rid = given if REQUEST_ID_RE.match(given) else uuid.uuid4().hex
        token = request_id_var.set(rid)
        start = time.perf_counter()
        status_holder = [500]
        path: str = scope["path"]
        is_api = path.startswith("/api/")
        page = is_page(path)

        started = [False]
        refused = [False]  # the 413 went out: the application's own answer is dropped
        max_body = self.max_body
        received = 0

        async def send_wrapped(message: Message) -> None:
            if refused[0]:
                return
            if message["type"] == "http.response.start":
                started[0] = True
                status_holder[0] = message["status"]
                h = list(message.get("headers") or [])
                methods = route_methods(self.routes, scope) if message["status"] == 405 else None
                if methods:  # none: the console's files answered, with their own Allow
                    h = [(k, v) for k, v in h if k.lower() != b"allow"]
                    h.append((b"allow", ", ".join(sorted(methods)).encode()))
                h.append((b"x-request-id", rid.encode()))
                h.append((b"x-content-type-options", b"nosniff"))
                h.append((b"referrer-policy", b"no-referrer"))
                if scope.get("scheme") == "https":
                    h.append((b"strict-transport-security", HSTS))
                if is_api:
                    h.append((b"cache-control", b"no-store"))
                if page:
                    h.append((b"x-frame-options", b"DENY"))
                    h.append((b"content-security-policy", CONSOLE_CSP))
                message["headers"] = h
            await send(message)

        async def refuse() -> None:
            await problems.problem(413, "payload_too_large", f"request bodies are limited to {max_body} bytes",
                                   headers={"connection": "close"})(scope, receive, send_wrapped)

        async def receive_counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_body:
                    if not started[0]:
                        await refuse()
                    refused[0] = True
                    raise _BodyTooLarge
            return message

        try:
            length = headers.get(b"content-length")
            if length is not None and (not length.isdigit() or int(length) > max_body):
                await refuse()
                return
            try:
                await self.app(scope, receive_counted, send_wrapped)
            except Exception:
                if refused[0]:
                    return  # the 413 is the answer, whatever the application made of it
                # Answered here, inside the request's context, so the problem carries the
                # request id the log line has (Starlette's outermost handler runs after it).
                if started[0]:
                    raise
                log.exception("unhandled error")
                await problems.problem(500, "internal_error", "an unexpected error occurred; give the "
                                       "request id to the server's operator (it is in the log)")(
                    scope, receive, send_wrapped)
        finally:
            if refused[0]:
                # What the application had read (up to the limit) hangs in the exception's
                # reference cycles, which the raised collection thresholds (decision 0012)
                # would keep for thousands of requests: an attacker's refused bodies would
                # pile up. Collect the young generations now.
                gc.collect(1)
            elapsed = time.perf_counter() - start
            route = self._route(scope)
            method = scope["method"]
            self.metrics.requests.labels(method, route, str(status_holder[0])).inc()
            self.metrics.latency.labels(method, route).observe(elapsed)
            if route not in ("/healthz", "/readyz"):
                client = scope.get("client")
                log.info("%s %s %s", method, path, status_holder[0], extra={
                    "method": method, "path": path, "status": status_holder[0],
                    "duration_ms": round(elapsed * 1000, 2), "client": client[0] if client else None})
            request_id_var.reset(token)


def create_app(services: Services, *, run_background: bool = True, housekeeping: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Sync routes run in this pool; HSM and database calls block, so it is larger
        # than anyio's default of 40.
        anyio.to_thread.current_default_thread_limiter().total_tokens = services.settings.threads
        if run_background:
            # What is alive now (the app, its schemas, the ORM's mappings) lives as long as
            # the process: out of the collector's sight, and young objects collected less
            # often. Measured at 200 clients: +20 % data keys/s, p99 -30 % (decision 0012).
            gc.collect()
            gc.freeze()
            gc.set_threshold(20_000, 20, 50)
            services.start_background(housekeeping=housekeeping)
        try:
            yield
        finally:
            if run_background:
                services.close()

    app = FastAPI(
        responses=problems.OPENAPI_RESPONSES,
        title="Strongroom Key Server",
        version=product_version(),
        summary="HSM-rooted key management: managed keys, data keys, audit.",
        lifespan=lifespan,
        docs_url=None,  # served below from this origin, not FastAPI's CDN page
        redoc_url=None,
        openapi_url="/api/v1/openapi.json",
        # No OpenTelemetry here (Prometheus at /metrics): FastAPI's own check for a
        # configured provider ran on every request (2.5 % of a worker at 1,600 XKS calls/s).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.services = services
    problems.install(app)

    # Included one level deep: every nesting level costs route matching on each request.
    for r in (auth.router, keys.router, crypto.router, datakeys.router, audit.router, users.router,
              tokens.router, system.router):
        app.include_router(r, prefix="/api/v1")
    app.include_router(kmip_clients.router, prefix="/api/v1")
    app.include_router(kmip_grants.router, prefix="/api/v1")
    app.include_router(hosts.router, prefix="/api/v1")
    app.include_router(guardpoints.router, prefix="/api/v1")
    app.include_router(volumes.router, prefix="/api/v1")
    app.include_router(retirement.router, prefix="/api/v1")
    app.include_router(agent.router, prefix="/api/v1")
    app.include_router(approvals.router, prefix="/api/v1")
    app.include_router(databases.router, prefix="/api/v1")
    app.include_router(kv.router)  # /v1/...: the Vault KV-v2 compatible front, database tokens only
    app.include_router(xks.router, prefix="/api/v1")
    app.include_router(xks_proxy.router)  # /xks/<store>/kms/xks/v1/...: the AWS XKS proxy API, SigV4 only
    app.include_router(install.router)

    # The API reference: Swagger UI's files from the swagger-ui-bundle package, on this
    # origin under the console's CSP (no CDN, no inline script: it works offline and no
    # third party's script runs with the key server's cookies).
    app.mount(DOCS_ASSETS, StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="docs-assets")

    @app.get("/api/docs", include_in_schema=False)
    def api_docs() -> HTMLResponse:
        return HTMLResponse(DOCS_PAGE)

    @app.get("/api/docs/init.js", include_in_schema=False)
    def api_docs_init() -> Response:
        return Response(DOCS_INIT, media_type="text/javascript")

    @app.get("/healthz", operation_id="healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", operation_id="readyz", tags=["health"])
    def readyz(services: ServicesDep) -> JSONResponse:
        """Readiness: the database and the HSM both answer."""
        ok, checks = system.readiness(services)
        return JSONResponse({"status": "ok" if ok else "unavailable", "checks": {c.name: c.detail for c in checks}},
                            status_code=200 if ok else 503)

    @app.get("/metrics", operation_id="metrics", tags=["health"], response_class=Response)
    def metrics(ctx: Ctx, services: ServicesDep) -> Response:
        """Prometheus metrics; needs a token with `system:read`."""
        services.policy.require(ctx, Permission.SYSTEM_READ, action="system.metrics")
        app_metrics.audit_pending.set(services.audit.pending())
        if services.sinks.configured:
            for d in services.sinks.describe():
                app_metrics.sink_backlog.labels(d["name"]).set(d["backlog"])
                app_metrics.sink_healthy.labels(d["name"]).set(1 if d["healthy"] else 0)
        return Response(app_metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    if (WEBUI_DIST / "index.html").exists():
        app.router.routes.append(ConsoleMount("/", ConsoleFiles(directory=WEBUI_DIST, html=True), name="webui",
                                              routes=app.router.routes))
    else:
        @app.get("/", include_in_schema=False)
        def landing() -> HTMLResponse:
            return HTMLResponse("<!doctype html><title>Strongroom</title><h1>Strongroom key server</h1>"
                                "<p>The web console is not built. API reference: "
                                "<a href='/api/docs'>/api/docs</a>.</p>")

    app_metrics = Metrics()
    # Inside RequestMiddleware (request ids, metrics, limits, headers apply to both paths),
    # outside the router: see hotpath.py.
    app.add_middleware(DataKeyHotPath, services=services, exception_handlers=app.exception_handlers)
    app.add_middleware(XksHotPath, services=services, on_shed=app_metrics.xks_shed.inc)
    app.add_middleware(RequestMiddleware, metrics=app_metrics, services=services, routes=app.router.routes)
    return app
