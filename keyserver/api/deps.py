"""Authentication of REST callers, turned into a core `RequestContext`.

Authorisation is not decided here: the core's policy layer does that for every
service call. This module only establishes who is calling:
* `Authorization: Bearer srk_...` — an API token (no CSRF: it is not ambient);
* the session cookie — a browser; unsafe methods must echo the CSRF token in
  `X-CSRF-Token` (synchronizer token, stored hashed with the session).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from cryptography import x509
from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from keyserver.core.ca import serial_hex
from keyserver.core.errors import Forbidden, Unauthenticated
from keyserver.core.principal import ANONYMOUS, RequestContext
from keyserver.core.views import HostRecord
from keyserver.logs import request_id_var
from keyserver.services import Services

SESSION_COOKIE = "strongroom_session"
CSRF_COOKIE = "strongroom_csrf"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Reachable while a password change is pending.
PASSWORD_CHANGE_PATHS = frozenset({"/api/v1/auth/me", "/api/v1/auth/password", "/api/v1/auth/logout"})


async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def client_ip(request: Request) -> str | None:
    return request.client.host if request.client else None


def anonymous_context(request: Request) -> RequestContext:
    return RequestContext(principal=ANONYMOUS, source_ip=client_ip(request), request_id=request_id_var.get())


def cached_caller(authorization: str | None, services: Services, ip: str | None) -> RequestContext | None:
    """The caller of an API token validated within the cache TTL, answered without a
    thread hop or I/O (that is most of the automation traffic); None: authenticate the
    ordinary way."""
    if authorization and authorization[:7].lower() == "bearer ":
        principal = services.identity.cached_token(authorization[7:].strip())
        if principal is not None:
            return RequestContext(principal=principal, source_ip=ip, request_id=request_id_var.get())
    return None


async def authenticate(request: Request, services: ServicesDep) -> RequestContext:
    ctx = cached_caller(request.headers.get("authorization"), services, client_ip(request))
    if ctx is not None:
        return ctx
    return await run_in_threadpool(_authenticate, request, services)


def _authenticate(request: Request, services: Services) -> RequestContext:
    auth = request.headers.get("authorization")
    ip, rid = client_ip(request), request_id_var.get()
    try:
        if auth:
            scheme, _, credential = auth.partition(" ")
            if scheme.lower() != "bearer" or not credential:
                raise Unauthenticated("use 'Authorization: Bearer <API token>'", code="token_invalid")
            principal = services.identity.authenticate_token(credential.strip())
        else:
            cookie = request.cookies.get(SESSION_COOKIE)
            if not cookie:
                # No credentials at all is not an attack worth a record; bad ones are.
                raise Unauthenticated("sign in or send an API token", code="unauthenticated")
            principal = services.identity.authenticate_session(
                cookie, csrf_token=request.headers.get("x-csrf-token"),
                require_csrf=request.method not in SAFE_METHODS,
            )
    except (Unauthenticated, Forbidden) as exc:
        if exc.code != "unauthenticated":
            services.audit.record_now(
                RequestContext(ANONYMOUS, ip, rid), action="auth.reject", outcome="denied",
                details={"code": exc.code, "method": request.method, "path": request.url.path},
            )
        raise
    if principal.must_change_password and request.url.path not in PASSWORD_CHANGE_PATHS:
        raise Forbidden("change your one-time password first (POST /api/v1/auth/password)",
                        code="password_change_required")
    return RequestContext(principal=principal, source_ip=ip, request_id=rid)


Ctx = Annotated[RequestContext, Depends(authenticate)]


@dataclass(frozen=True, slots=True)
class HostCaller:
    ctx: RequestContext
    host: HostRecord


def client_cert_chain(request: Request, listener: str) -> list[str]:
    """The client certificate chain (PEM, leaf first) that `listener` verified for this
    connection (runtime/agentport.py TlsScopeProtocol), else []: one listener's CA never
    vouches for another's routes."""
    tls = request.scope.get("extensions", {}).get("tls") or {}
    return list(tls.get("client_cert_chain") or []) if tls.get("listener") == listener else []


async def authenticate_host(request: Request, services: ServicesDep) -> HostCaller:
    """The enrolled host behind the TLS client certificate of this connection (the
    agent port verified it against the internal CA); its serial is looked up on every
    call, so a revoked host is refused at once."""
    chain = client_cert_chain(request, "agent")
    if not chain:
        raise Unauthenticated("agent calls need the host's client certificate: call the agent port "
                              "(mutual TLS) with the certificate issued at enrollment",
                              code="client_certificate_required")
    serial = serial_hex(x509.load_pem_x509_certificate(chain[0].encode()))
    ctx, host = await run_in_threadpool(services.hosts.authenticate, serial, source_ip=client_ip(request),
                                        request_id=request_id_var.get())
    return HostCaller(ctx, host)


HostDep = Annotated[HostCaller, Depends(authenticate_host)]
