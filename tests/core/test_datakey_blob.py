from __future__ import annotations

import uuid

import pytest

from keyserver.core.datakeys import HEADER, MAGIC, context_digest, parse_blob
from keyserver.core.errors import InvalidInput


def test_header_layout_is_stable() -> None:
    kid = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
    header = HEADER.pack(MAGIC, 1, kid.bytes, 7, 1)
    assert header.hex() == "5352444b01" + "00112233445566778899aabbccddeeff" + "00000007" + "01"
    hdr, k, v, sealed = parse_blob(header + bytes(29))
    assert (hdr, k, v, sealed) == (header, kid, 7, bytes(29))


@pytest.mark.parametrize("blob", [b"", b"SRDK", b"XXXX" + bytes(60), b"SRDK\x02" + bytes(60),
                                  HEADER.pack(MAGIC, 1, bytes(16), 1, 9) + bytes(40),
                                  HEADER.pack(MAGIC, 1, bytes(16), 1, 1) + bytes(28)])
def test_malformed_blobs_are_caller_errors(blob: bytes) -> None:
    with pytest.raises(InvalidInput) as exc:
        parse_blob(blob)
    assert exc.value.code == "invalid_blob"


def test_context_digest_is_canonical() -> None:
    assert context_digest({"b": "2", "a": "1"}) == context_digest({"a": "1", "b": "2"})
    assert context_digest(None) == context_digest({})
    assert context_digest({"a": "1"}) != context_digest({"a": "2"})
    with pytest.raises(InvalidInput):
        context_digest({"k": "x" * 5000})
