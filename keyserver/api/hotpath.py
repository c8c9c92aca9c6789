"""The hot routes, served without FastAPI's routing and dependency solving: the data-key
route's common case (DataKeyHotPath) and every AWS XKS proxy call (XksHotPath).

`POST /api/v1/keys/{key_ref}/generate-data-key` is what envelope-encrypting clients call
for every object they write. Profiled at 200 clients (docs/benchmarks.md, decision 0012),
FastAPI's machinery around the call (middleware, route matching, dependencies, the hop to
a worker thread and back) cost more CPU than making the data key and committing its audit
record. Here the common case runs on the event loop: an API token validated within the
cache TTL, a JSON body the route's own model accepts, the key's Active version cached in
this process and a GCM block in hand; the audit record is committed, grouped with
concurrent requests', before the key is returned. Anything else — a session, a token not
yet cached, a body to refuse, a refusal to audit, a cache to fill — goes on to the FastAPI
route with the body replayed, so every answer but this success is the route's own, and
errors raised here are answered by the application's own exception handlers.

The XKS proxy (AWS KMS calls it up to 1,800 times a second per key store) is served
here whole: routes/xks_proxy.py's `serve` already answers every case itself, in the
API's own error shape, and needs nothing from FastAPI but the request. Profiled at
1,000 calls/s (docs/benchmarks.md), matching the path against the application's few
hundred routes and solving the route's dependencies cost ten times the call's own work.
Its routes stay declared in routes/xks_proxy.py for the OpenAPI description. Calls are
bounded here (routes/xks_proxy.py `XksAdmission`): past `STRONGROOM_XKS_MAX_IN_FLIGHT`
in this process, a call is answered ThrottlingException before any of its work is done.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from keyserver.api.deps import cached_caller
from keyserver.api.routes.keys import data_key_body
from keyserver.api.routes.xks_proxy import XKS_ROUTE, XksAdmission, serve_xks
from keyserver.api.schemas import GenerateDataKeyRequest
from keyserver.services import Services

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Handler = Callable[[Request, Any], Response | Awaitable[Response]]

PATH = re.compile(r"^/api/v1/keys/([^/]+)/generate-data-key$")
ROUTE_PATH = "/api/v1/keys/{key_ref}/generate-data-key"


class DataKeyHotPath:
    def __init__(self, app: ASGIApp, *, services: Services, exception_handlers: Mapping[Any, Handler]) -> None:
        self.app = app
        self.services = services
        self.handlers = exception_handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = PATH.match(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        client = scope.get("client")
        ctx = cached_caller(headers.get(b"authorization", b"").decode("latin-1"), self.services,
                            client[0] if client else None)
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if ctx is None or content_type != b"application/json":
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = b""
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # the client went away: let the application see it
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        replay = _replaying(messages, receive)
        try:
            request = GenerateDataKeyRequest.model_validate_json(body)
        except ValidationError:
            await self.app(scope, replay, send)
            return
        ref = match.group(1)
        datakeys = self.services.datakeys
        try:
            sealed = datakeys.seal_cached(ctx, ref, number_of_bytes=request.number_of_bytes,
                                          context=request.context, include_plaintext=request.include_plaintext)
            if sealed is None:
                await self.app(scope, replay, send)
                return
            dk, record = sealed
            await self.services.audit.commit_async(record)
            response: Response = JSONResponse(data_key_body(dk))
        except Exception as exc:
            handler = next((h for cls in type(exc).__mro__ if (h := self.handlers.get(cls)) is not None), None)
            if handler is None:
                raise
            answer = handler(Request(scope, replay), exc)
            response = await answer if inspect.isawaitable(answer) else answer
        # What the router would have set: metrics label both paths with the route template.
        scope["route"] = ROUTE_PATH
        scope["path_params"] = {"key_ref": ref}
        await response(scope, replay, send)


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay


XKS_PATH = re.compile(r"^/xks/([^/]+)/kms/xks/v1/(?:keys/([^/]+)/([^/]+)|health)$")


class XksHotPath:
    def __init__(self, app: ASGIApp, *, services: Services, on_shed: Callable[[], None] | None = None) -> None:
        self.app = app
        self.services = services
        self.admission = XksAdmission(services, limit=services.settings.xks_max_in_flight, on_shed=on_shed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = XKS_PATH.match(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        store, key_id, operation = match.groups()
        # What the router would have set: metrics label both ways with the route template.
        params = {"store": store} if key_id is None else {"store": store, "key_id": key_id, "operation": operation}
        admission = self.admission
        if admission.in_flight >= admission.limit:
            client = scope.get("client")
            shed = admission.shed(store, operation or "health", client[0] if client else None)
            scope["route"] = XKS_ROUTE
            scope["path_params"] = params
            await shed(scope, receive, send)
            return
        # Counted until the answer is sent: a slow reader holds its place too.
        admission.in_flight += 1
        try:
            response = await serve_xks(Request(scope, receive), self.services, store, operation or "health", key_id)
            scope["route"] = XKS_ROUTE
            scope["path_params"] = params
            await response(scope, receive, send)
        finally:
            admission.in_flight -= 1
