"""One KMIP request message in, one response message out.

Decodes with PyKMIP, checks the header, runs the batch items in order through the
operation modules, and turns every failure into a result reason (errors.translate).
A message the codec cannot decode is still answered when its outline can be read:
unknown operations get Operation Not Supported, anything else Invalid Message.
"""

from __future__ import annotations

import logging
import struct
import time
import uuid
from dataclasses import dataclass
from typing import Any

from kmip.core import enums
from kmip.core.messages import contents, messages
from kmip.core.utils import BytearrayStream

from keyserver.core.audit import PendingRecord
from keyserver.core.errors import Forbidden, Hidden
from keyserver.core.principal import Principal, RequestContext
from keyserver.kmip import codec  # noqa: F401  (installs the whole-slice Byte String codec)
from keyserver.kmip.context import Call, Engine
from keyserver.kmip.errors import KmipFailure, translate
from keyserver.kmip.operations import REGISTRY
from keyserver.kmip.operations.discover_versions import SUPPORTED

log = logging.getLogger(__name__)
R = enums.ResultReason
T = enums.Tags
DEFAULT_VERSION = (1, 2)
# Failures of the server, not refusals of the request: audited as errors.
SERVER_FAILURES = frozenset({R.GENERAL_FAILURE, R.CRYPTOGRAPHIC_FAILURE})


@dataclass(frozen=True, slots=True)
class Outline:
    """What a cheap TTLV walk finds in a message the codec refused."""

    version: tuple[int, int] | None
    items: list[tuple[int | None, bytes | None]]


def _walk(data: bytes) -> list[tuple[int, int, bytes]]:
    """(tag, type, value) of each item of a TTLV structure's body. Raises ValueError."""
    out, i = [], 0
    while i < len(data):
        if i + 8 > len(data):
            raise ValueError("truncated item header")
        tag = int.from_bytes(data[i:i + 3], "big")
        typ, length = data[i + 3], struct.unpack("!I", data[i + 4:i + 8])[0]
        padded = length if typ == 0x01 else (length + 7) // 8 * 8
        if i + 8 + padded > len(data):
            raise ValueError("truncated item value")
        out.append((tag, typ, data[i + 8:i + 8 + length]))
        i += 8 + padded
    return out


def outline(data: bytes) -> Outline | None:
    try:
        top = _walk(data)
        if len(top) != 1 or top[0][0] != T.REQUEST_MESSAGE.value or top[0][1] != 0x01:
            return None
        version: tuple[int, int] | None = None
        items: list[tuple[int | None, bytes | None]] = []
        for tag, typ, value in _walk(top[0][2]):
            if tag == T.REQUEST_HEADER.value and typ == 0x01:
                for htag, htyp, hval in _walk(value):
                    if htag == T.PROTOCOL_VERSION.value and htyp == 0x01:
                        nums = {t: int.from_bytes(v[:4], "big") for t, _, v in _walk(hval)}
                        version = (nums.get(T.PROTOCOL_VERSION_MAJOR.value, 1),
                                   nums.get(T.PROTOCOL_VERSION_MINOR.value, 0))
            elif tag == T.BATCH_ITEM.value and typ == 0x01:
                op: int | None = None
                batch_id: bytes | None = None
                for btag, _, bval in _walk(value):
                    if btag == T.OPERATION.value and len(bval) >= 4:
                        op = int.from_bytes(bval[:4], "big")
                    elif btag == T.UNIQUE_BATCH_ITEM_ID.value:
                        batch_id = bytes(bval)
                items.append((op, batch_id))
        return Outline(version=version, items=items)
    except (ValueError, IndexError, struct.error):
        return None


def _operation(value: int | None) -> enums.Operation | None:
    try:
        return enums.Operation(value) if value is not None else None
    except ValueError:
        return None


def _printable(text: str) -> str:
    """Client text as an audit record can hold it: a NUL or control byte from a hostile
    request must not fail the record (PostgreSQL's text refuses NUL) or forge a line."""
    return "".join(c if c.isprintable() else "\ufffd" for c in text)


def _uid_of(payload: Any) -> str | None:
    value = getattr(payload, "unique_identifier", None)
    value = getattr(value, "value", value)
    return str(value)[:128] if value else None


class Dispatcher:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    # --- building responses -----------------------------------------------------
    @staticmethod
    def _item(
        *, operation: enums.Operation | None, batch_id: bytes | None, reason: enums.ResultReason | None = None,
        message: str | None = None, payload: Any = None,
    ) -> Any:
        # Fresh primitives only: nothing parsed is written back (PLATFORM.md, TextString).
        return messages.ResponseBatchItem(
            operation=contents.Operation(operation) if operation is not None else None,
            unique_batch_item_id=contents.UniqueBatchItemID(batch_id) if batch_id is not None else None,
            result_status=contents.ResultStatus(
                enums.ResultStatus.SUCCESS if reason is None else enums.ResultStatus.OPERATION_FAILED),
            result_reason=contents.ResultReason(reason) if reason is not None else None,
            result_message=contents.ResultMessage(message) if message is not None else None,
            response_payload=payload,
        )

    @staticmethod
    def _encode(version: tuple[int, int], items: list[Any]) -> bytes:
        pv = contents.ProtocolVersion(*version)
        header = messages.ResponseHeader(protocol_version=pv, time_stamp=contents.TimeStamp(int(time.time())),
                                         batch_count=contents.BatchCount(len(items)))
        stream = BytearrayStream()
        messages.ResponseMessage(response_header=header, batch_items=items).write(
            stream, kmip_version=contents.protocol_version_to_kmip_version(pv))
        return bytes(stream.buffer)

    def error(self, reason: enums.ResultReason, message: str, *, version: tuple[int, int] | None = None) -> bytes:
        """A whole-message refusal (authentication, size, framing)."""
        return self._encode(version or DEFAULT_VERSION,
                            [self._item(operation=None, batch_id=None, reason=reason, message=message)])

    def refuse(self, reason: enums.ResultReason, message: str, *, principal: Principal,
               source_ip: str | None) -> bytes:
        """`error` for an authenticated client's message refused before it reaches
        `handle` (framing, size): audited like every other refusal."""
        ctx = RequestContext(principal=principal, source_ip=source_ip, request_id=uuid.uuid4().hex)
        self._refused(ctx, None, reason, message)
        return self.error(reason, message)

    def _refused(self, ctx: RequestContext, operation: enums.Operation | None, reason: enums.ResultReason,
                 message: str, *, uid: str | None = None) -> None:
        """Audit one refusal: who, which operation, which result reason and why. Every
        KMIP refusal passes here (docs/kmip.md), so none depends on the operation
        remembering to record it."""
        record = PendingRecord(
            ctx=ctx, action=f"kmip.{operation.name.lower() if operation is not None else 'request'}",
            object_type="kmip_object" if uid else None, object_id=_printable(uid) if uid else None,
            outcome="error" if reason in SERVER_FAILURES else "denied",
            details={"result_reason": reason.name, "message": _printable(message[:500])})
        try:
            self._engine.objects.record(record)
        except Exception:
            # The client still gets its refusal; the audit sinks report their own failure.
            log.exception("could not audit a KMIP refusal (%s: %s)", reason.name, message)

    def _undecodable(self, data: bytes, ctx: RequestContext) -> bytes:
        shape = outline(data)
        if shape is None or not shape.items:
            self._refused(ctx, None, R.INVALID_MESSAGE, "the request is not a decodable KMIP request message")
            return self.error(R.INVALID_MESSAGE, "the request is not a decodable KMIP request message")
        version = shape.version if shape.version in SUPPORTED else DEFAULT_VERSION
        items = []
        for op_value, batch_id in shape.items:
            op = _operation(op_value)
            if op is None or op not in REGISTRY:
                reason, message = R.OPERATION_NOT_SUPPORTED, f"operation {op.name if op else op_value} is not supported"
            else:
                reason, message = R.INVALID_MESSAGE, "the batch item could not be decoded"
            self._refused(ctx, op, reason, message)
            items.append(self._item(operation=op, batch_id=batch_id, reason=reason, message=message))
        return self._encode(version, items)

    # --- the work ------------------------------------------------------------------
    def handle(self, data: bytes, *, principal: Principal, source_ip: str | None) -> bytes:
        ctx = RequestContext(principal=principal, source_ip=source_ip, request_id=uuid.uuid4().hex)
        request = messages.RequestMessage()
        try:
            request.read(BytearrayStream(data))
        except Exception:
            # The codec raises many types on bad input; the outline decides the answer.
            return self._undecodable(data, ctx)
        header = request.request_header
        version = (int(header.protocol_version.major), int(header.protocol_version.minor))
        refusal: tuple[enums.ResultReason, str] | None = None
        if version not in SUPPORTED:
            refusal = R.INVALID_MESSAGE, f"KMIP {version[0]}.{version[1]} is not supported; use DiscoverVersions"
        elif header.asynchronous_indicator is not None and header.asynchronous_indicator.value:
            refusal = R.FEATURE_NOT_SUPPORTED, "asynchronous operations are not supported"
        option = (header.batch_error_cont_option.value if header.batch_error_cont_option is not None
                  else enums.BatchErrorContinuationOption.STOP)
        if refusal is None and option == enums.BatchErrorContinuationOption.UNDO:
            refusal = R.FEATURE_NOT_SUPPORTED, "the Undo batch error option is not supported"
        if refusal is not None:
            self._refused(ctx, None, *refusal)
            return self.error(*refusal, version=version if version in SUPPORTED else DEFAULT_VERSION)
        call = Call(ctx=ctx, engine=self._engine)
        items = []
        for item in request.batch_items:
            op = item.operation.value
            batch_id = bytes(item.unique_batch_item_id.value) if item.unique_batch_item_id is not None else None
            handler = REGISTRY.get(op)
            try:
                if handler is None:
                    raise KmipFailure(R.OPERATION_NOT_SUPPORTED, f"operation {op.name} is not supported")
                payload = handler(call, item.request_payload)
                items.append(self._item(operation=op, batch_id=batch_id, payload=payload))
            except Exception as exc:
                reason, message = translate(exc)
                # The policy layer audits its own refusals (with the object); the rest here.
                if not isinstance(exc, Forbidden | Hidden):
                    self._refused(ctx, op, reason, message, uid=_uid_of(item.request_payload))
                items.append(self._item(operation=op, batch_id=batch_id, reason=reason, message=message))
                if option == enums.BatchErrorContinuationOption.STOP:
                    break
        out = self._encode(version, items)
        limit = header.maximum_response_size.value if header.maximum_response_size is not None else None
        if limit is not None and len(out) > limit:
            message = f"the response would be {len(out)} bytes, over the Maximum Response Size of {limit}"
            self._refused(ctx, None, R.RESPONSE_TOO_LARGE, message)
            return self.error(R.RESPONSE_TOO_LARGE, message, version=version)
        return out
