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

    def _undecodable(self, data: bytes) -> bytes:
        shape = outline(data)
        if shape is None or not shape.items:
            return self.error(R.INVALID_MESSAGE, "the request is not a decodable KMIP request message")
        version = shape.version if shape.version in SUPPORTED else DEFAULT_VERSION
        items = []
        for op_value, batch_id in shape.items:
            op = _operation(op_value)
            if op is None or op not in REGISTRY:
                items.append(self._item(operation=op, batch_id=batch_id, reason=R.OPERATION_NOT_SUPPORTED,
                                        message=f"operation {op.name if op else op_value} is not supported"))
            else:
                items.append(self._item(operation=op, batch_id=batch_id, reason=R.INVALID_MESSAGE,
                                        message="the batch item could not be decoded"))
        return self._encode(version, items)

    # --- the work ------------------------------------------------------------------
    def handle(self, data: bytes, *, principal: Principal, source_ip: str | None) -> bytes:
        request = messages.RequestMessage()
        try:
            request.read(BytearrayStream(data))
        except Exception:
            # The codec raises many types on bad input; the outline decides the answer.
            return self._undecodable(data)
        header = request.request_header
        version = (int(header.protocol_version.major), int(header.protocol_version.minor))
        if version not in SUPPORTED:
            return self.error(R.INVALID_MESSAGE, f"KMIP {version[0]}.{version[1]} is not supported; "
                              "use DiscoverVersions", version=DEFAULT_VERSION)
        if header.asynchronous_indicator is not None and header.asynchronous_indicator.value:
            return self.error(R.FEATURE_NOT_SUPPORTED, "asynchronous operations are not supported",
                              version=version)
        option = (header.batch_error_cont_option.value if header.batch_error_cont_option is not None
                  else enums.BatchErrorContinuationOption.STOP)
        if option == enums.BatchErrorContinuationOption.UNDO:
            return self.error(R.FEATURE_NOT_SUPPORTED, "the Undo batch error option is not supported",
                              version=version)
        ctx = RequestContext(principal=principal, source_ip=source_ip, request_id=uuid.uuid4().hex)
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
                items.append(self._item(operation=op, batch_id=batch_id, reason=reason, message=message))
                if option == enums.BatchErrorContinuationOption.STOP:
                    break
        out = self._encode(version, items)
        limit = header.maximum_response_size.value if header.maximum_response_size is not None else None
        if limit is not None and len(out) > limit:
            return self.error(R.RESPONSE_TOO_LARGE, f"the response would be {len(out)} bytes, over the "
                              f"Maximum Response Size of {limit}", version=version)
        return out
