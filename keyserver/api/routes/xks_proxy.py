"""The AWS KMS External Key Store (XKS) Proxy API, version 1 (v1.0.0 of AWS's published
specification), under each key store's URI path prefix: `/xks/<store>/kms/xks/v1/...`.

Only what AWS KMS calls: `POST keys/{keyId}/metadata` (GetKeyMetadata), `keys/{keyId}/
encrypt`, `keys/{keyId}/decrypt` and `health` (GetHealthStatus), JSON in and out,
authenticated by SigV4 (service `kms-xks-proxy`; no session, no CSRF) and, for a key
store that requires one, the client certificate the XKS port verified (runtime/
xksport.py; decision 0023). Errors in
the API's shape, `{"errorName", "errorMessage"}`, with its HTTP statuses. Translation
only: authentication, rules and audit are in core/xks.py and core/sigv4.py.

The routes below declare the API (OpenAPI); api/hotpath.py serves the same paths through
`serve_xks` before the router is consulted (FastAPI's matching cost more than the call),
and sheds calls past `XksAdmission`'s bound with the API's ThrottlingException.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import contextvars
import json
import logging
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from keyserver import product_version
from keyserver.api.deps import ServicesDep, client_cert_chain, client_ip
from keyserver.core.audit import PendingRecord
from keyserver.core.errors import (
    Conflict,
    CoreError,
    Forbidden,
    IntegrityFailure,
    InvalidInput,
    NotFound,
    ServiceUnavailable,
    Unauthenticated,
)
from keyserver.core.principal import ANONYMOUS, RequestContext
from keyserver.core.sigv4 import header_map
from keyserver.core.xks import MAX_AAD, MAX_PLAINTEXT, NAME_RE, XksCall, integrity_value
from keyserver.logs import request_id_var
from keyserver.services import Services
from keyserver.store.db import WouldBlock, no_blocking

log = logging.getLogger(__name__)
router = APIRouter(prefix="/xks/{store}/kms/xks/v1", tags=["xks-proxy"])
MAX_REQUEST = 64 * 1024
META_FIELDS = {"awsPrincipalArn": "aws_principal_arn", "awsSourceVpc": "aws_source_vpc",
               "awsSourceVpce": "aws_source_vpce", "kmsKeyArn": "kms_key_arn", "kmsOperation": "kms_operation",
               "kmsRequestId": "kms_request_id", "kmsViaService": "kms_via_service"}
STATUS = {"ValidationException": 400, "InvalidStateException": 400, "InvalidCiphertextException": 400,
          "InvalidKeyUsageException": 400, "AuthenticationFailedException": 401, "AccessDeniedException": 403,
          "KeyNotFoundException": 404, "InvalidUriPathException": 404, "ThrottlingException": 429,
          "InternalException": 500, "UnsupportedOperationException": 501, "DependencyTimeoutException": 503}
OPERATIONS = {"metadata", "encrypt", "decrypt"}
EXPLAIN = {"metadata": "GetKeyMetadata", "encrypt": "Encrypt", "decrypt": "Decrypt"}


class XksFailure(Exception):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name, self.message = name, message


def xks_error(name: str, message: str) -> JSONResponse:
    """The API's error body; its errorMessage is printable ASCII, under 512 characters."""
    text = "".join(c if " " <= c <= "~" else "?" for c in message)[:511]
    return JSONResponse({"errorName": name, "errorMessage": text}, status_code=STATUS[name])


def from_core(exc: CoreError) -> JSONResponse:
    if isinstance(exc, Unauthenticated):
        return xks_error("AuthenticationFailedException", exc.message)
    if isinstance(exc, Forbidden):
        return xks_error("AccessDeniedException", exc.message)
    if isinstance(exc, NotFound):
        return xks_error("KeyNotFoundException", exc.message)
    if isinstance(exc, IntegrityFailure):
        return xks_error("InvalidCiphertextException", "the ciphertext, tag, IV, metadata or AAD do not authenticate")
    if isinstance(exc, InvalidInput):
        name = "InvalidCiphertextException" if exc.code == "invalid_ciphertext" else "ValidationException"
        return xks_error(name, exc.message)
    if isinstance(exc, Conflict):
        if exc.code == "usage_not_allowed":
            return xks_error("InvalidKeyUsageException", exc.message)
        return xks_error("InvalidStateException", exc.message)
    if isinstance(exc, ServiceUnavailable):
        return xks_error("DependencyTimeoutException" if exc.code == "hsm_unavailable" else "InternalException",
                         exc.message)
    return xks_error("InternalException", exc.message)


def _b64(body: dict[str, Any], field: str, *, required: bool, limit: int, sizes: tuple[int, ...] = ()) -> bytes:
    value = body.get(field)
    if value is None:
        if required:
            raise XksFailure("ValidationException", f"{field} is required")
        return b""
    if not isinstance(value, str) or len(value) > (limit * 4) // 3 + 4:
        raise XksFailure("ValidationException", f"{field} is a base64 string of at most {limit} bytes")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise XksFailure("ValidationException", f"{field} is not base64") from None
    if len(data) > limit or (sizes and len(data) not in sizes):
        raise XksFailure("ValidationException", f"{field} is {len(data)} bytes; "
                         + (f"it must be {' or '.join(map(str, sizes))}" if sizes else f"at most {limit}"))
    return data


def _meta(body: dict[str, Any], operation: str) -> dict[str, str]:
    meta = body.get("requestMetadata")
    if not isinstance(meta, dict):
        raise XksFailure("ValidationException", "requestMetadata is required")
    out: dict[str, str] = {}
    for name, value in meta.items():
        if name in META_FIELDS and value is not None:
            if not isinstance(value, str) or len(value) > 2048:
                raise XksFailure("ValidationException", f"requestMetadata.{name} is a string of at most 2048 "
                                 "characters")
            out[META_FIELDS[name]] = value
    needed = ("kmsRequestId", "kmsOperation") + (("awsPrincipalArn",) if operation != "health" else ())
    missing = [n for n in needed if META_FIELDS[n] not in out]
    if missing:
        raise XksFailure("ValidationException", f"requestMetadata lacks {', '.join(missing)}")
    return out


def client_names(request: Request) -> frozenset[str] | None:
    """The CN and DNS SANs of the client certificate the XKS port verified against its
    CA bundle, None without one (any other port: its certificates vouch for nothing here)."""
    chain = client_cert_chain(request, "xks")
    if not chain:
        return None
    cert = x509.load_pem_x509_certificate(chain[0].encode())
    names = {a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME) if isinstance(a.value, str)}
    with contextlib.suppress(x509.ExtensionNotFound):
        names |= set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                     .get_values_for_type(x509.DNSName))
    return frozenset(names)


def _parse(body: bytes) -> dict[str, Any]:
    if len(body) > MAX_REQUEST:
        raise XksFailure("ValidationException", f"the request is over {MAX_REQUEST} bytes")
    try:
        parsed = json.loads(body or b"null")
    except ValueError:
        raise XksFailure("ValidationException", "the body is not JSON") from None
    if not isinstance(parsed, dict):
        raise XksFailure("ValidationException", "the body is a JSON object")
    return parsed


XKS_ROUTE = "/xks/{store}/kms/xks/v1/..."  # the metrics label of every call
# Per process, for the calls that must touch the store; a plain executor: anyio's
# hand-off cost more than the call's own work.
_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="xks")


async def serve_xks(request: Request, services: Services, store: str, operation: str,
                    key_id: str | None) -> JSONResponse:
    """One call of the API, every answer (errors included) in its own shape."""
    if operation not in (OPERATIONS if key_id is not None else {"health"}):
        return xks_error("InvalidUriPathException", f"no XKS operation '{operation}'")
    # Authentication comes first: a malformed request is refused (and audited) only once
    # its signature is good, so an unsigned caller learns nothing about the API.
    body = await request.body()
    parsed: dict[str, Any] = {}
    meta: dict[str, str] = {}
    malformed: XksFailure | None = None
    try:
        parsed = _parse(body)
        meta = _meta(parsed, operation)
        if key_id is not None and (not key_id or len(key_id) > 128):
            raise XksFailure("ValidationException", "keyId is 1 to 128 characters")
    except XksFailure as exc:
        malformed = exc
    call = XksCall(operation=operation, meta=meta)
    headers = header_map(request.scope["headers"])
    raw_path = request.scope.get("raw_path", b"").decode("latin-1") or request.url.path
    query = request.scope.get("query_string", b"").decode("latin-1")
    presented = client_names(request)

    def run() -> dict[str, Any]:
        ctx = services.xks.authenticate(
            store, call, authorization=headers.get("authorization"), method=request.method,
            raw_path=raw_path.partition("?")[0], query=query, headers=headers, body=body,
            source_ip=client_ip(request), request_id=request_id_var.get(), client_names=presented)
        try:
            if malformed is not None:
                raise malformed
            return answer(ctx)
        except XksFailure as exc:
            services.xks.refused(ctx, call, exc.name)
            raise

    def answer(ctx: RequestContext) -> dict[str, Any]:
        if operation == "health":
            healthy = services.xks.health(ctx, call)
            return {"xksProxyFleetSize": 1, "xksProxyVendor": "Strongroom", "xksProxyModel": product_version(),
                    "ekmVendor": "Strongroom (PKCS#11 HSM)",
                    "ekmFleetDetails": [{"id": "hsm", "model": "PKCS#11",
                                         "healthStatus": "ACTIVE" if healthy else "UNAVAILABLE"}]}
        assert key_id is not None
        if operation == "metadata":
            status = services.xks.key_status(ctx, call, key_id)
            return {"keySpec": "AES_256", "keyUsage": ["ENCRYPT", "DECRYPT"],
                    "keyStatus": "ENABLED" if status.enabled else "DISABLED"}
        if parsed.get("encryptionAlgorithm") != "AES_GCM":
            raise XksFailure("ValidationException", "encryptionAlgorithm must be AES_GCM")
        aad = _b64(parsed, "additionalAuthenticatedData", required=False, limit=MAX_AAD)
        if operation == "encrypt":
            integrity = parsed.get("ciphertextDataIntegrityValueAlgorithm")
            if integrity not in (None, "SHA_256"):
                raise XksFailure("ValidationException", "ciphertextDataIntegrityValueAlgorithm must be SHA_256")
            plaintext = _b64(parsed, "plaintext", required=True, limit=MAX_PLAINTEXT)
            out = services.xks.encrypt(ctx, call, key_id, plaintext, aad)
            answer = {"authenticationTag": _s(out.tag), "ciphertext": _s(out.ciphertext),
                      "initializationVector": _s(out.iv), "ciphertextMetadata": _s(out.metadata)}
            if integrity == "SHA_256":
                answer["ciphertextDataIntegrityValue"] = _s(integrity_value(aad, out.metadata, out.iv,
                                                                            out.ciphertext, out.tag))
            return answer
        ciphertext = _b64(parsed, "ciphertext", required=True, limit=MAX_PLAINTEXT)
        iv = _b64(parsed, "initializationVector", required=True, limit=16, sizes=(12, 16))
        tag = _b64(parsed, "authenticationTag", required=True, limit=16, sizes=(16,))
        metadata = _b64(parsed, "ciphertextMetadata", required=False, limit=20)
        if iv and len(iv) != 12:
            raise XksFailure("InvalidCiphertextException", "this proxy's ciphertexts have a 12-byte IV")
        plain = services.xks.decrypt(ctx, call, key_id, ciphertext, aad=aad, iv=iv, tag=tag, metadata=metadata)
        return {"plaintext": _s(plain)}

    def attempt() -> tuple[dict[str, Any] | None, list[PendingRecord], CoreError | XksFailure | None]:
        # The records a call committed (a refusal's included) are handed back with its
        # answer or its failure: awaited below either way.
        with services.audit.deferred() as records:
            try:
                return run(), records, None
            except (CoreError, XksFailure) as exc:
                return None, records, exc

    def on_loop() -> tuple[dict[str, Any] | None, list[PendingRecord], CoreError | XksFailure | None] | None:
        with no_blocking():
            try:
                return attempt()
            except WouldBlock:
                return None

    # Tried on the event loop first: the usual call touches no database (the store, its
    # grants and signing key cached; its audit record committed below) and costs less
    # than handing it to a thread. One that must read or write the store (a cache miss,
    # a refusal recorded at once, the minute's last-seen) is refused that before any
    # effect and is redone in a thread of the proxy's own pool.
    done = on_loop()
    if done is None:
        done = await asyncio.get_running_loop().run_in_executor(_POOL, contextvars.copy_context().run, attempt)
    out, records, failure = done
    # The answer leaves only once its records are durable: a failed commit answers 500.
    for record in records:
        await services.audit.commit_async(record)
    if isinstance(failure, XksFailure):
        return xks_error(failure.name, failure.message)
    if failure is not None:
        return from_core(failure)
    assert out is not None
    return JSONResponse(out)


SHED_AUDIT_SECONDS = 1.0  # one `xks.shed` record per this many seconds while shedding
SHED_NAMES = 16  # stores / addresses named in one record; the rest are counted as OTHER
OTHER = "(other)"


@dataclass
class _Shed:
    """The calls shed since the last `xks.shed` record."""

    since: datetime
    until: datetime
    count: int = 0
    stores: Counter[str] = field(default_factory=Counter)
    operations: Counter[str] = field(default_factory=Counter)
    sources: Counter[str] = field(default_factory=Counter)

    def merge(self, other: _Shed) -> None:
        self.since, self.until = min(self.since, other.since), max(self.until, other.until)
        self.count += other.count
        for mine, theirs in ((self.stores, other.stores), (self.operations, other.operations),
                             (self.sources, other.sources)):
            for name, n in theirs.items():
                _bump(mine, name, n)


def _bump(counts: Counter[str], name: str, n: int = 1) -> None:
    # The names come from unauthenticated requests: a flood of made-up ones must not
    # grow a record (or this process) without bound.
    counts[name if name in counts or len(counts) < SHED_NAMES else OTHER] += n


class XksAdmission:
    """The bound on XKS calls in flight in this worker process (`STRONGROOM_XKS_MAX_IN_FLIGHT`).

    Past it a call is answered at once with the API's 429 ThrottlingException — before
    its body is read, its signature checked or the HSM touched — instead of queueing on
    the event loop and in the proxy's thread pool, where every caller's latency and the
    process's memory would grow without bound and answers would come after AWS KMS's
    250 ms had run out anyway. Only the event loop touches the counts: no lock.

    A shed call is not authenticated (that is the work shedding saves), so it is recorded
    as the anonymous caller's refusal, like a bad signature. One record per call would
    add an audit write to every refusal of a server that is already past its capacity,
    and the chainer (the bottleneck behind it, docs/benchmarks.md) would fall further
    behind; so calls shed within SHED_AUDIT_SECONDS are summed into one `xks.shed`
    record (outcome `denied`), written when the interval ends. A record that fails to
    commit is folded into the next interval's, so no shed call goes unrecorded while the
    process lives."""

    def __init__(self, services: Services, *, limit: int, on_shed: Callable[[], None] | None = None,
                 every: float = SHED_AUDIT_SECONDS) -> None:
        self.services, self.limit, self.every = services, limit, every
        self.in_flight = 0
        self._on_shed = on_shed
        self._pending: _Shed | None = None
        self._writing: set[asyncio.Task[None]] = set()

    def shed(self, store: str, operation: str, source_ip: str | None) -> JSONResponse:
        now = datetime.now(UTC)
        if self._pending is None:
            self._pending = _Shed(since=now, until=now)
            self._schedule()
        pending = self._pending
        pending.until = now
        pending.count += 1
        _bump(pending.stores, store if NAME_RE.match(store) else OTHER)
        _bump(pending.operations, operation if operation in OPERATIONS or operation == "health" else OTHER)
        _bump(pending.sources, source_ip or "unknown")
        if self._on_shed is not None:
            self._on_shed()
        return xks_error("ThrottlingException", f"this proxy has {self.limit} calls in flight, its bound: "
                         "retry shortly")

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(self.every, self._write_soon)

    def _write_soon(self) -> None:
        task = asyncio.get_running_loop().create_task(self._write())
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)

    async def _write(self) -> None:
        shed, self._pending = self._pending, None
        if shed is None:
            return
        stores, sources = sorted(shed.stores), sorted(shed.sources)
        one_store = stores[0] if len(stores) == 1 and stores[0] != OTHER else None
        one_source = sources[0] if len(sources) == 1 and sources[0] not in (OTHER, "unknown") else None
        details = {"refused": "ThrottlingException", "shed": shed.count, "max_in_flight": self.limit,
                   "since": shed.since.isoformat(), "until": shed.until.isoformat(),
                   "stores": dict(shed.stores), "operations": dict(shed.operations),
                   "source_ips": dict(shed.sources)}
        record = PendingRecord(RequestContext(ANONYMOUS, one_source, None), "xks.shed",
                               "xks_store" if one_store else None, one_store, details, "denied")
        try:
            await self.services.audit.commit_async(record)
        except Exception:
            log.exception("the xks.shed record of %d shed call(s) was not committed; retried with the next",
                          shed.count)
            if self._pending is None:
                self._pending = shed
                self._schedule()
            else:
                self._pending.merge(shed)


def _s(data: bytes) -> str:
    return base64.b64encode(data).decode()


@router.post("/keys/{key_id}/{operation}", operation_id="xksKeyOperation", response_model=dict[str, Any],
             responses={400: {"description": "ValidationException, InvalidStateException, InvalidCiphertextException"},
                        401: {"description": "AuthenticationFailedException (SigV4, or the "
                                                    "key store's required client certificate)"},
                        403: {"description": "AccessDeniedException"},
                        404: {"description": "KeyNotFoundException, InvalidUriPathException"}})
async def xks_key_operation(store: str, key_id: str, operation: str, request: Request,
                            services: ServicesDep) -> JSONResponse:
    """GetKeyMetadata (`metadata`), Encrypt (`encrypt`) or Decrypt (`decrypt`) of the XKS Proxy API v1."""
    return await serve_xks(request, services, store, operation, key_id)


@router.post("/health", operation_id="xksHealth", response_model=dict[str, Any],
             responses={401: {"description": "AuthenticationFailedException (SigV4, or the key store's required "
                                              "client certificate)"}})
async def xks_health(store: str, request: Request, services: ServicesDep) -> JSONResponse:
    """GetHealthStatus of the XKS Proxy API v1: the HSM's state."""
    return await serve_xks(request, services, store, "health", None)
