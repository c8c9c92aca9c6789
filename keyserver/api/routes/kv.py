"""A HashiCorp Vault KV version 2 compatible read path, for databases that take their
encryption keys from Vault (MariaDB's hashicorp_key_management plugin).

Only what such a database calls: the mount's description (the plugin's
`check-kv-version` step asks for `options.version`) and `GET <mount>/data/<key id>`
with an optional `?version=N`. Authenticated by the database's token in
`X-Vault-Token` only (no session, no CSRF: nothing ambient); answers and errors in
Vault's shapes (`{"errors": [...]}`). The key value is the key's bytes in hexadecimal:
the plugin decodes hex digits into the binary key. Rules and audit: core/integrations.py.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from keyserver.api.deps import ServicesDep, client_ip
from keyserver.api.routes.databases import KV_MOUNT
from keyserver.core.errors import CoreError, Forbidden, NotFound, ServiceUnavailable
from keyserver.core.integrations import MAX_KV_ID
from keyserver.core.principal import RequestContext
from keyserver.logs import request_id_var

router = APIRouter(prefix="/v1", tags=["kv"])
NUMBER_RE = re.compile(r"^[0-9]{1,10}$")
HEADER_HELP = "the database's token (POST /api/v1/databases)"
NO_STORE = {"cache-control": "no-store"}


def vault_error(status: int, *messages: str) -> JSONResponse:
    return JSONResponse({"errors": list(messages)}, status_code=status, headers=NO_STORE)


def core_error(exc: CoreError) -> JSONResponse:
    if isinstance(exc, Forbidden):
        return vault_error(403, "permission denied")
    if isinstance(exc, NotFound):
        return vault_error(404)
    if isinstance(exc, ServiceUnavailable):
        return vault_error(503, exc.message)
    return vault_error(500, exc.message)


def _context(request: Request, services: ServicesDep, token: str | None) -> RequestContext:
    return services.databases.authenticate(token, source_ip=client_ip(request), request_id=request_id_var.get())


@router.get(f"/sys/mounts/{KV_MOUNT}/tune", operation_id="vaultMountTune", response_model=dict[str, Any],
            responses={403: {"description": "bad or revoked token"}})
async def vault_mount_tune(request: Request, services: ServicesDep,
                           x_vault_token: str | None = Header(default=None, max_length=200,
                                                              description=HEADER_HELP)) -> JSONResponse:
    """The KV mount's settings as Vault describes them: a version 2 key/value store."""
    def run() -> None:
        services.databases.check(_context(request, services, x_vault_token))

    try:
        await run_in_threadpool(run)
    except CoreError as exc:
        return core_error(exc)
    tune = {"default_lease_ttl": 0, "max_lease_ttl": 0, "force_no_cache": False, "description": "Strongroom",
            "options": {"version": "2"}}
    return JSONResponse({**tune, "request_id": request_id_var.get(), "lease_id": "", "renewable": False,
                         "lease_duration": 0, "data": tune, "wrap_info": None, "warnings": None, "auth": None},
                        headers=NO_STORE)


@router.get(f"/{KV_MOUNT}/data/{{kv_id}}", operation_id="vaultReadSecret", response_model=dict[str, Any],
            responses={403: {"description": "bad or revoked token, no grant, key revoked"},
                       404: {"description": "no such version, or destroyed"}})
async def vault_read_secret(kv_id: str, request: Request, services: ServicesDep,
                            version: str | None = Query(default=None, max_length=10,
                                                        description="a KV version = a key version; 0 or none: "
                                                                    "the latest"),
                            x_vault_token: str | None = Header(default=None, max_length=200,
                                                               description=HEADER_HELP)) -> JSONResponse:
    """A granted key's version, as a KV-v2 secret whose `data` field is the key in hex."""
    if not NUMBER_RE.match(kv_id) or not 1 <= int(kv_id) <= MAX_KV_ID:
        return vault_error(404, f"key ids are numbers from 1 to {MAX_KV_ID}")
    if version is not None and not NUMBER_RE.match(version):
        return vault_error(400, "version is a number")
    wanted = int(version) if version else None

    def run() -> Any:
        ctx = _context(request, services, x_vault_token)
        return services.databases.read(ctx, kv_id=int(kv_id), version=wanted or None)

    try:
        secret = await run_in_threadpool(run)
    except CoreError as exc:
        return core_error(exc)
    created = secret.created_time.isoformat().replace("+00:00", "Z")
    return JSONResponse({
        "request_id": request_id_var.get(), "lease_id": "", "renewable": False, "lease_duration": 0,
        "data": {"data": {"data": secret.material.hex()},
                 "metadata": {"created_time": created, "custom_metadata": None, "deletion_time": "",
                              "destroyed": False, "version": secret.version}},
        "wrap_info": None, "warnings": None, "auth": None,
    }, headers=NO_STORE)
