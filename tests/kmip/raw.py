"""Raw TTLV over TLS, for what PyKMIP's client will not send: batches, garbage, fuzz."""

from __future__ import annotations

import socket
import ssl
import struct
from typing import Any

from kmip.core import enums
from kmip.core.messages import contents, messages, payloads
from kmip.core.utils import BytearrayStream

from tests.kmip.conftest import ClientFiles, verifying_context


def connect(files: ClientFiles, port: int, *, timeout: float = 10.0) -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return verifying_context(files).wrap_socket(sock, server_hostname="localhost")


def request(items: list[tuple[enums.Operation, Any]], *, version: tuple[int, int] = (1, 2),
            continue_on_error: bool = False) -> bytes:
    batch = [messages.RequestBatchItem(operation=contents.Operation(op), request_payload=payload,
                                       unique_batch_item_id=contents.UniqueBatchItemID(f"item-{i}".encode()))
             for i, (op, payload) in enumerate(items)]
    header = messages.RequestHeader(
        protocol_version=contents.ProtocolVersion(*version), batch_count=contents.BatchCount(len(batch)),
        batch_error_cont_option=(contents.BatchErrorContinuationOption(enums.BatchErrorContinuationOption.CONTINUE)
                                 if continue_on_error else None))
    stream = BytearrayStream()
    messages.RequestMessage(request_header=header, batch_items=batch).write(stream)
    return bytes(stream.buffer)


def query_request() -> bytes:
    return request([(enums.Operation.QUERY, payloads.QueryRequestPayload(
        query_functions=[enums.QueryFunction.QUERY_OPERATIONS]))])


def read_response(conn: ssl.SSLSocket) -> bytes:
    header = _exactly(conn, 8)
    return header + _exactly(conn, struct.unpack("!I", header[4:])[0])


def _exactly(conn: ssl.SSLSocket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def decode(data: bytes) -> Any:
    response = messages.ResponseMessage()
    response.read(BytearrayStream(data))
    return response


def roundtrip(conn: ssl.SSLSocket, data: bytes) -> Any:
    conn.sendall(data)
    return decode(read_response(conn))
