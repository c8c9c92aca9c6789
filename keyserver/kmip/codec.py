"""PyKMIP's codec, with its Byte String read and write made whole-slice.

PyKMIP 0.11 reads and writes a Byte String one byte at a time (`istream.read(1)` and
`pack('!B', b)` per byte), and each read re-slices the whole remaining message: an
Encrypt of 4 KiB cost thousands of calls and megabytes of copying, and encoding a Get
response's 32-byte key was a tenth of a Get's CPU time. The replacements below produce
and accept exactly the same bytes (tests/kmip/test_codec.py compares them with the
originals); everything else stays PyKMIP's. Installed once, on import, for the whole
process: the bytes on the wire do not change, so PyKMIP's client in the same process
is unaffected.
"""

from __future__ import annotations

from typing import Any

from kmip.core import enums, exceptions
from kmip.core.primitives import ByteString

ORIGINAL_READ_VALUE = ByteString.read_value
ORIGINAL_WRITE_VALUE = ByteString.write_value
_PAD = 8


def _padding(length: int) -> int:
    return (_PAD - length % _PAD) % _PAD


def read_value(self: ByteString, istream: Any, kmip_version: Any = enums.KMIPVersion.KMIP_1_0) -> None:
    data = istream.read(self.length)
    if len(data) != self.length:
        raise exceptions.ReadValueError(ByteString.__name__, "value", self.length, len(data))
    self.value = bytes(data)
    self.padding_length = _padding(self.length)
    pad = istream.read(self.padding_length)
    if len(pad) != self.padding_length or any(pad):
        raise exceptions.ReadValueError(ByteString.__name__, "pad", 0, pad)


def write_value(self: ByteString, ostream: Any, kmip_version: Any = enums.KMIPVersion.KMIP_1_0) -> None:
    ostream.write(bytes(self.value) + bytes(_padding(len(self.value))))


def install() -> None:
    ByteString.read_value = read_value
    ByteString.write_value = write_value


install()
