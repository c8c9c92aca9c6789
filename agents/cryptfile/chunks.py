"""Sealing and opening of data chunks (docs/FORMAT.md, "Chunks").

A stored chunk is nonce (12) || AES-256-GCM ciphertext || tag (16) of up to
`chunk_size` plaintext bytes, under the per-file key, with associated data

    file id (16) || chunk index (u64, big-endian) || last (u8: 1 for the final chunk)

so a chunk cannot be moved within a file, copied into another file, or the file
truncated at a chunk boundary, without failing authentication.

Holes ("Sparse regions"): a stored chunk that is not the file's final chunk, is a whole
`chunk_size` + 28 bytes and is all zero bytes reads as `chunk_size` zero bytes. It is
only looked for after the chunk has failed authentication, so a genuine chunk costs
nothing more (and one is all zero with probability 2^-(8 (chunk_size + 28))).
"""

from __future__ import annotations

import os
import struct
import threading

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agents.cryptfile.header import NONCE_SIZE, TAG_SIZE

CHUNK_OVERHEAD = NONCE_SIZE + TAG_SIZE
_INDEX = struct.Struct(">QB")
_POOL_BYTES = NONCE_SIZE * 512


def is_hole(stored: bytes | bytearray | memoryview, chunk_size: int, *, last: bool) -> bool:
    """Whether a stored chunk that failed authentication is a hole: not the final chunk,
    exactly chunk_size + 28 bytes, every byte zero."""
    length = chunk_size + CHUNK_OVERHEAD
    return not last and len(stored) == length and bytes(stored) == bytes(length)


class NonceSource:
    """Fresh random nonces from the OS CSPRNG, drawn 512 at a time: one getrandom()
    call per 512 chunk writes instead of one per write (per-write calls were ~30 % of
    sealing a 4 KiB chunk). Every nonce is handed out once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool = b""
        self._pos = _POOL_BYTES

    def take(self) -> bytes:
        with self._lock:
            pos = self._pos
            if pos >= _POOL_BYTES:
                self._pool, pos = os.urandom(_POOL_BYTES), 0
            self._pos = pos + NONCE_SIZE
            return self._pool[pos:pos + NONCE_SIZE]


_NONCES = NonceSource()


class ChunkCipher:
    def __init__(self, file_key: bytes, file_id: bytes, *, nonces: NonceSource = _NONCES) -> None:
        self._aead = AESGCM(file_key)
        self._file_id = file_id
        self._nonces = nonces

    def _aad(self, index: int, last: bool) -> bytes:
        return self._file_id + _INDEX.pack(index, 1 if last else 0)

    def seal_into(self, index: int, plaintext: bytes | bytearray | memoryview, out: bytearray | memoryview,
                  *, last: bool, nonce: bytes | None = None) -> int:
        """Write the stored chunk into `out` (len(plaintext) + 28 bytes); returns its length.
        `nonce` is for test vectors only."""
        n = len(plaintext)
        nonce = nonce if nonce is not None else self._nonces.take()
        view = out if isinstance(out, memoryview) else memoryview(out)
        view[:NONCE_SIZE] = nonce
        self._aead.encrypt_into(nonce, plaintext, self._file_id + _INDEX.pack(index, last),
                                view[NONCE_SIZE:NONCE_SIZE + n + TAG_SIZE])
        return n + CHUNK_OVERHEAD

    def seal_run(self, first_index: int, plaintext: bytes | bytearray | memoryview, chunk_size: int,
                 out: bytearray | memoryview, *, final_index: int | None) -> int:
        """Seal consecutive chunks `first_index, first_index + 1, ...` cut from one
        contiguous plaintext buffer into `out` (stored chunks back to back); the chunk
        whose index is `final_index` gets last=1. Returns the bytes written to `out`.

        The bulk path of the format: one getrandom() for the whole run and nothing but
        the AEAD call per chunk."""
        total = len(plaintext)
        count = -(-total // chunk_size) if total else 1
        nonces = os.urandom(NONCE_SIZE * count)
        src = plaintext if isinstance(plaintext, memoryview) else memoryview(plaintext)
        dst = out if isinstance(out, memoryview) else memoryview(out)
        encrypt, prefix, pack = self._aead.encrypt_into, self._file_id, _INDEX.pack
        pos = 0
        for j in range(count):
            index = first_index + j
            piece = src[j * chunk_size:(j + 1) * chunk_size]
            n = len(piece)
            nonce = nonces[j * NONCE_SIZE:(j + 1) * NONCE_SIZE]
            dst[pos:pos + NONCE_SIZE] = nonce
            encrypt(nonce, piece, prefix + pack(index, index == final_index),
                    dst[pos + NONCE_SIZE:pos + NONCE_SIZE + n + TAG_SIZE])
            pos += n + CHUNK_OVERHEAD
        return pos

    def open_run(self, first_index: int, stored: memoryview, chunk_size: int, out: memoryview, *,
                 final_index: int | None) -> int | None:
        """Authenticate and decrypt consecutive stored chunks (back to back in `stored`,
        the last one possibly short) straight into `out`, which holds exactly their
        plaintext. A hole (not `final_index`, a whole stored chunk, all zero) reads as
        zeros. Returns None when every chunk authenticates (or is a hole), else the index
        of the first that does not; `out` is zeroed then, so no unauthenticated byte is
        ever left in it.

        The bulk read path: no allocation and nothing but the AEAD call per chunk."""
        decrypt, prefix, pack = self._aead.decrypt_into, self._file_id, _INDEX.pack
        stored_chunk = chunk_size + CHUNK_OVERHEAD
        pos = out_pos = 0
        index = first_index
        end = len(stored)
        while pos < end:
            length = min(stored_chunk, end - pos)
            n = length - CHUNK_OVERHEAD
            try:
                if n < 0:
                    raise InvalidTag
                decrypt(stored[pos:pos + NONCE_SIZE], stored[pos + NONCE_SIZE:pos + length],
                        prefix + pack(index, index == final_index), out[out_pos:out_pos + n])
            except InvalidTag:
                if n == chunk_size and index != final_index and is_hole(stored[pos:pos + length], chunk_size,
                                                                       last=False):
                    out[out_pos:out_pos + n] = bytes(n)  # a hole reads as zeros
                else:
                    out[:] = bytes(len(out))
                    return index
            pos += length
            out_pos += n
            index += 1
        return None

    def seal(self, index: int, plaintext: bytes | bytearray | memoryview, *, last: bool,
             nonce: bytes | None = None) -> bytes:
        out = bytearray(len(plaintext) + CHUNK_OVERHEAD)
        self.seal_into(index, plaintext, out, last=last, nonce=nonce)
        return bytes(out)

    def open(self, index: int, stored: bytes | bytearray | memoryview, *, last: bool,
             chunk_size: int | None = None) -> bytes | None:
        """The plaintext, or None if the chunk does not authenticate in this position.
        Given the file's `chunk_size`, a hole (not `last`, chunk_size + 28 bytes, all
        zero) reads as chunk_size zero bytes; without it, a hole is None."""
        if len(stored) < CHUNK_OVERHEAD:
            return None
        view = memoryview(stored)
        try:
            return self._aead.decrypt(bytes(view[:NONCE_SIZE]), view[NONCE_SIZE:], self._aad(index, last))
        except InvalidTag:
            if chunk_size is not None and is_hole(view, chunk_size, last=last):
                return bytes(chunk_size)
            return None
