"""RFC 9457 problem+json for every error: a status, a stable `code`, and a detail that
tells the caller what to do. Tracebacks never reach the client."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as SATimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from hsm import HsmError
from keyserver.core import errors as e
from keyserver.core.approvals import ApprovalPending
from keyserver.logs import request_id_var
from keyserver.store.db import is_busy

log = logging.getLogger(__name__)

STATUS = {
    e.InvalidInput: 400,
    e.Unauthenticated: 401,
    e.Forbidden: 403,
    e.NotFound: 404,
    e.Conflict: 409,
    e.IntegrityFailure: 422,
    e.RateLimited: 429,
    e.ServiceUnavailable: 503,
}
TITLES = {
    400: "Bad request", 401: "Authentication required", 403: "Forbidden", 404: "Not found",
    405: "Method not allowed", 409: "Conflict", 413: "Payload too large",
    422: "Unprocessable content", 429: "Too many requests", 500: "Internal error",
    503: "Service unavailable",
}


# Every route may answer these; documented once for the whole API (and the typed client).
OPENAPI_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": TITLES[status],
             "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}
    for status in (400, 401, 403, 404, 409, 422, 429, 503)
}


def problem(status: int, code: str, detail: str, *, headers: dict[str, str] | None = None,
            errors: list[dict[str, Any]] | None = None) -> JSONResponse:
    body: dict[str, Any] = {
        "type": f"https://strongroom.dev/problems/{code}",
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "code": code,
        "request_id": request_id_var.get(),
    }
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, media_type="application/problem+json", headers=headers)


# Routes a caller reaches without a token or session (each authenticates otherwise:
# credentials in the body, a one-time enrollment token, or nothing secret at all).
UNAUTHENTICATED_OPERATIONS = frozenset({"login", "enrollHost", "getCaCertificate", "getAgentInstaller",
                                        "downloadAgent", "getEnrollmentInfoPublic", "authMethods", "oidcLogin",
                                        "oidcCallback"})


def install(app: FastAPI) -> None:
    from keyserver.api.schemas import Problem

    generate = app.openapi

    def openapi() -> dict[str, Any]:
        # The error responses above refer to this schema; no route returns it as a model.
        if app.openapi_schema is None:
            schema = generate()
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {})["Problem"] = (
                Problem.model_json_schema(ref_template="#/components/schemas/{model}"))
            # How callers authenticate (docs/api.md): an API token, or the console's
            # session cookie with its CSRF header on unsafe methods. Every /api/v1 route
            # takes either, but the few that need none (sign-in, enrollment, downloads).
            components["securitySchemes"] = {
                "apiToken": {"type": "http", "scheme": "bearer", "bearerFormat": "srk_…",
                             "description": "an API token from POST /api/v1/tokens"},
                "session": {"type": "apiKey", "in": "cookie", "name": "strongroom_session",
                            "description": "the console's session (POST /api/v1/auth/login); unsafe methods "
                                           "also send X-CSRF-Token"},
                "hostCertificate": {"type": "mutualTLS",
                                    "description": "an enrolled host's client certificate, on the agent port"},
            }
            for path, item in schema.get("paths", {}).items():
                for op in item.values():
                    if not isinstance(op, dict) or op.get("operationId") in UNAUTHENTICATED_OPERATIONS:
                        continue
                    if path.startswith("/api/v1/agent/"):
                        op["security"] = [{"hostCertificate": []}]
                    elif path.startswith("/api/v1/") or path == "/metrics":
                        op["security"] = [{"apiToken": []}, {"session": []}]
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(ApprovalPending)
    async def _pending(_: Request, exc: ApprovalPending) -> JSONResponse:
        # Not an error: the action was recorded and waits for other people (core/approvals.py).
        from keyserver.api.routes.approvals import approval_public

        return JSONResponse({"status": "pending", "code": exc.code, "detail": exc.message,
                             "request_id": request_id_var.get(),
                             "approval": approval_public(exc.request).model_dump(mode="json")}, status_code=202)

    @app.exception_handler(e.CoreError)
    async def _core(_: Request, exc: e.CoreError) -> JSONResponse:
        status = next((s for cls, s in STATUS.items() if isinstance(exc, cls)), 500)
        headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, e.RateLimited) else None
        if status == 503:
            headers = {"Retry-After": "5"}
        if status == 401:
            headers = {"WWW-Authenticate": 'Bearer realm="strongroom"'}
        return problem(status, exc.code, exc.message, headers=headers, errors=exc.errors)

    @app.exception_handler(HsmError)
    async def _hsm(_: Request, exc: HsmError) -> JSONResponse:
        log.warning("HSM error: %s", exc)
        return problem(503, "hsm_unavailable", f"the HSM is not usable: {exc}",
                       headers={"Retry-After": "5"})

    @app.exception_handler(OperationalError)
    @app.exception_handler(DBAPIError)
    @app.exception_handler(SATimeoutError)
    async def _db(_: Request, exc: Exception) -> JSONResponse:
        if is_busy(exc):
            log.warning("store busy: %s", type(getattr(exc, "orig", None) or exc).__name__)
            return problem(503, "store_busy", "the store is busy with other writes; nothing was changed, "
                           "retry in a moment", headers={"Retry-After": "1"})
        orig = getattr(exc, "orig", None)
        log.error("database error: %s", type(orig).__name__ if orig else exc)
        return problem(503, "database_unavailable",
                       "the database is not reachable; nothing was changed, retry shortly",
                       headers={"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
                  for err in exc.errors()]
        first = errors[0] if errors else {"loc": [], "msg": "invalid"}
        where = ".".join(str(p) for p in first["loc"] if p != "body") or "body"
        return problem(422, "validation_error", f"{where}: {first['msg']}", errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        # The router's headers go out too: a 405 names the methods that are allowed (Allow).
        return problem(exc.status_code, code, str(exc.detail), headers=dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return problem(500, "internal_error",
                       "an unexpected error occurred; the request id is in the server log")
