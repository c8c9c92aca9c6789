"""The 128-byte file header of format v1 (docs/FORMAT.md).

    0   4  magic "SRCF"
    4   2  format version (1)
    6   2  header length (128)
    8   4  chunk size (plaintext bytes per chunk; a power of two, 512 .. 1 MiB)
   12  16  file id (random)
   28  16  key id (the managed key, a UUID)
   44   4  key version
   48   1  file-key wrapping (1 = AES-256-GCM under the key version)
   49   1  flags (0)
   50  18  reserved (zero)
   68  60  wrapped file key: IV (12) || ciphertext (32) || tag (16),
           associated data = bytes 0..67

Every field is authenticated: changing any of them makes the file key fail to unwrap.
"""

from __future__ import annotations

import os
import struct
import uuid
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agents.cryptfile.errors import FormatError
from agents.cryptfile.keys import KeyVersion

MAGIC = b"SRCF"
VERSION = 1
HEADER_SIZE = 128
PREFIX = struct.Struct(">4sHHI16s16sIBB18s")  # bytes 0..67, the associated data
WRAP_AES_256_GCM = 1
NONCE_SIZE = 12
TAG_SIZE = 16
FILE_KEY_SIZE = 32
WRAPPED_KEY_SIZE = NONCE_SIZE + FILE_KEY_SIZE + TAG_SIZE
MIN_CHUNK, MAX_CHUNK, DEFAULT_CHUNK = 512, 1 << 20, 4096

assert PREFIX.size + WRAPPED_KEY_SIZE == HEADER_SIZE


def check_chunk_size(chunk_size: int) -> int:
    if not MIN_CHUNK <= chunk_size <= MAX_CHUNK or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk size must be a power of two from {MIN_CHUNK} to {MAX_CHUNK}")
    return chunk_size


@dataclass(frozen=True, slots=True)
class FileHeader:
    chunk_size: int
    file_id: bytes
    key_id: uuid.UUID
    key_version: int
    wrapped_file_key: bytes = field(repr=False)

    def prefix(self) -> bytes:
        return prefix_bytes(self.chunk_size, self.file_id, self.key_id, self.key_version)

    def encode(self) -> bytes:
        return self.prefix() + self.wrapped_file_key

    def unwrap(self, key: KeyVersion) -> bytes | None:
        """The file key, or None when `key` is not the one that wrapped it or the header
        was altered (the caller reports an IntegrityError with its path)."""
        if (key.key_id, key.version) != (self.key_id, self.key_version):
            return None
        nonce, sealed = self.wrapped_file_key[:NONCE_SIZE], self.wrapped_file_key[NONCE_SIZE:]
        try:
            return AESGCM(key.material).decrypt(nonce, sealed, self.prefix())
        except InvalidTag:
            return None


def prefix_bytes(chunk_size: int, file_id: bytes, key_id: uuid.UUID, key_version: int) -> bytes:
    return PREFIX.pack(MAGIC, VERSION, HEADER_SIZE, chunk_size, file_id, key_id.bytes, key_version,
                       WRAP_AES_256_GCM, 0, bytes(18))


def seal_header(file_key: bytes, key: KeyVersion, *, file_id: bytes, chunk_size: int,
                nonce: bytes | None = None) -> FileHeader:
    """A header carrying `file_key` wrapped under `key` (`nonce` only for test vectors)."""
    prefix = prefix_bytes(check_chunk_size(chunk_size), file_id, key.key_id, key.version)
    nonce = nonce if nonce is not None else os.urandom(NONCE_SIZE)
    wrapped = nonce + AESGCM(key.material).encrypt(nonce, file_key, prefix)
    return FileHeader(chunk_size, file_id, key.key_id, key.version, wrapped)


def parse_header(data: bytes) -> FileHeader:
    """Parse without any key; each malformed case gets its own message."""
    if len(data) < 4 or data[:4] != MAGIC:
        raise FormatError("not a Strongroom encrypted file (bad magic)")
    if len(data) < 6:
        raise FormatError("truncated header")
    (version,) = struct.unpack_from(">H", data, 4)
    if version != VERSION:
        raise FormatError(f"unsupported format version {version} (this agent reads version {VERSION})")
    if len(data) < HEADER_SIZE:
        raise FormatError(f"truncated header: {len(data)} of {HEADER_SIZE} bytes")
    _, _, length, chunk_size, file_id, key_id, key_version, wrap, flags, reserved = PREFIX.unpack_from(data)
    if length != HEADER_SIZE:
        raise FormatError(f"header length {length} is not {HEADER_SIZE} for version 1")
    try:
        check_chunk_size(chunk_size)
    except ValueError:
        raise FormatError(f"invalid chunk size {chunk_size}") from None
    if wrap != WRAP_AES_256_GCM:
        raise FormatError(f"unknown file-key wrapping {wrap}")
    if flags != 0 or reserved != bytes(18):
        raise FormatError("reserved header bits are set (written by a newer agent?)")
    if key_version == 0:
        raise FormatError("key version 0 is invalid")
    return FileHeader(chunk_size, file_id, uuid.UUID(bytes=key_id), key_version,
                      bytes(data[PREFIX.size:HEADER_SIZE]))
