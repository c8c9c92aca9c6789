"""The whole-slice Byte String codec (keyserver/kmip/codec.py) writes and accepts exactly
the bytes PyKMIP's own byte-at-a-time code does, and refuses what it refuses."""

from __future__ import annotations

import pytest
from kmip.core import enums, exceptions
from kmip.core.primitives import Base, ByteString
from kmip.core.utils import BytearrayStream

from keyserver.kmip import codec

LENGTHS = [0, 1, 7, 8, 9, 15, 16, 17, 32, 255, 4096, 4099]


def _encode(value: bytes, write_value: object) -> bytes:
    s = ByteString(value, tag=enums.Tags.KEY_MATERIAL)
    stream = BytearrayStream()
    Base.write(s, stream)  # tag, type and length: PyKMIP's own
    write_value(s, stream)  # type: ignore[operator]
    return bytes(stream.buffer)


@pytest.mark.parametrize("length", LENGTHS)
def test_the_same_bytes_as_pykmip_both_ways(length: int) -> None:
    value = bytes((i * 37 + 11) % 256 for i in range(length))
    ours, theirs = _encode(value, codec.write_value), _encode(value, codec.ORIGINAL_WRITE_VALUE)
    assert ours == theirs and len(ours) % 8 == 0
    trailer = b"NEXTITEM"  # what follows in the message must be left where it was
    for read_value in (codec.read_value, codec.ORIGINAL_READ_VALUE):
        stream = BytearrayStream(ours + trailer)
        s = ByteString(tag=enums.Tags.KEY_MATERIAL)
        Base.read(s, stream)
        read_value(s, stream)
        assert s.value == value and bytes(stream.buffer) == trailer


def test_nonzero_padding_and_truncation_are_refused() -> None:
    good = _encode(b"abc", codec.write_value)
    bad_pad = good[:-1] + b"\x01"
    for data in (bad_pad, good[:-3], good[:9]):
        stream = BytearrayStream(data)
        s = ByteString(tag=enums.Tags.KEY_MATERIAL)
        Base.read(s, stream)
        with pytest.raises(exceptions.ReadValueError):
            codec.read_value(s, stream)


def test_it_is_installed_for_the_whole_process() -> None:
    assert ByteString.read_value is codec.read_value and ByteString.write_value is codec.write_value
