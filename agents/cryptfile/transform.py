"""Whole-file operations: encrypt, decrypt, re-wrap (rotation) and re-key.

Each writes a new file beside the target, fsyncs it, renames it over the target and
fsyncs the directory (agents/cryptfile/replace.py): an interruption at any moment leaves
either the old file or the new one, both complete and readable, plus at most a stray
`.srtmp-*` file.

The bulk work goes through the compiled engine (agents/cryptfile/native.py: runs of about
1 MiB per call, file keys only in the library's locked memory) wherever it loads; on a
host where it cannot, through the Python reference implementation, with the same result
byte for byte apart from the random nonces and keys.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from agents.cryptfile import native
from agents.cryptfile.chunks import CHUNK_OVERHEAD, ChunkCipher
from agents.cryptfile.errors import FormatError, IntegrityError
from agents.cryptfile.file import EncryptedFile, read_header
from agents.cryptfile.header import DEFAULT_CHUNK, FILE_KEY_SIZE, HEADER_SIZE, FileHeader, parse_header, seal_header
from agents.cryptfile.keys import Keyring, KeyVersion
from agents.cryptfile.replace import TMP_PREFIX, atomic_replace

__all__ = ["TMP_PREFIX", "atomic_replace", "decrypt_file", "encrypt_file", "encrypt_stream", "is_encrypted",
           "rekey_file", "rewrap_file", "rewrap_in_place"]

Progress = Callable[[int], None]  # called with the number of bytes just processed
_RUN_BYTES = 1 << 20  # plaintext per run: 256 chunks of 4 KiB, 16 of 64 KiB, one of 1 MiB


def _run_chunks(chunk_size: int) -> int:
    """Chunks per run: runs stay near 1 MiB whatever the chunk size (256 chunks of 1 MiB
    would be 256 MiB buffers)."""
    return max(1, _RUN_BYTES // chunk_size)


def _file_mode(path: str | Path) -> int:
    return os.stat(path).st_mode & 0o7777


def encrypt_stream(src: BinaryIO, dst: BinaryIO, key: KeyVersion, *, chunk_size: int = DEFAULT_CHUNK,
                   progress: Progress | None = None) -> None:
    """Encrypt everything `src` yields into `dst`, run by run (constant memory)."""
    if native.available():
        _encrypt_stream_native(src, dst, key, chunk_size=chunk_size, progress=progress)
    else:
        _encrypt_stream_python(src, dst, key, chunk_size=chunk_size, progress=progress)


def encrypt_file(src: str | Path, dst: str | Path, key: KeyVersion, *, chunk_size: int = DEFAULT_CHUNK,
                 progress: Progress | None = None) -> None:
    """Encrypt `src` into `dst` (which may be `src` itself: in-place protection)."""
    with open(src, "rb") as fin, atomic_replace(dst, mode=_file_mode(src)) as fout:
        encrypt_stream(fin, fout, key, chunk_size=chunk_size, progress=progress)


def decrypt_file(src: str | Path, dst: str | Path, keyring: Keyring, *, progress: Progress | None = None) -> None:
    """Decrypt `src` into `dst` (may be `src`: unprotect in place). Every chunk is
    authenticated before anything replaces `dst`."""
    if native.available():
        _decrypt_native(src, dst, keyring, progress=progress)
    else:
        _decrypt_python(src, dst, keyring, progress=progress)


def _rewrapped_header(header: FileHeader, keyring: Keyring, new_key: KeyVersion, path: str) -> bytes | None:
    """`header` with its file key wrapped under `new_key` (same file key, same file id), or
    None when it already is."""
    if (header.key_id, header.key_version) == (new_key.key_id, new_key.version):
        return None
    if header.key_id != new_key.key_id:
        raise ValueError(f"{path} belongs to key {header.key_id}, not {new_key.key_id}")
    old_key = keyring.get(header.key_id, header.key_version)
    if native.available():
        # The file key never leaves the library's locked memory.
        with native.NativeKey(old_key) as old, native.NativeKey(new_key) as new, \
                native.NativeFile.open(header.encode(), old, path=path) as nf:
            return nf.rewrap(new)
    file_key = header.unwrap(old_key)
    if file_key is None:
        raise IntegrityError(path, "header")
    return seal_header(file_key, new_key, file_id=header.file_id, chunk_size=header.chunk_size).encode()


def rewrap_file(path: str | Path, keyring: Keyring, new_key: KeyVersion, *,
                progress: Progress | None = None) -> bool:
    """Rotation: wrap the file key under `new_key`; the data chunks are copied verbatim,
    never decrypted. Returns False when the file already uses `new_key`."""
    path = str(path)
    new_header = _rewrapped_header(read_header(path), keyring, new_key, path)
    if new_header is None:
        return False
    with open(path, "rb") as fin, atomic_replace(path, mode=_file_mode(path)) as fout:
        fout.write(new_header)
        fin.seek(HEADER_SIZE)
        while block := fin.read(1 << 20):
            fout.write(block)
            if progress:
                progress(len(block))
    return True


def rewrap_in_place(path: str | Path, keyring: Keyring, new_key: KeyVersion) -> bool:
    """Rotation of a file a guard point's data plane may have open: only the 128-byte
    header changes (same file key, same file id: the data plane's open state stays valid),
    written with one pwrite inside the file's first 512-byte sector and made durable with
    fdatasync. A sector write is atomic on the block devices and file systems Linux
    supports (the assumption PostgreSQL makes for pg_control), so a crash leaves the old
    header or the new one, never a mix. Returns False when the file already uses
    `new_key`."""
    path = str(path)
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        new_header = _rewrapped_header(parse_header(os.pread(fd, HEADER_SIZE, 0)), keyring, new_key, path)
        if new_header is None:
            return False
        if os.pwrite(fd, new_header, 0) != HEADER_SIZE:
            raise OSError(errno.EIO, f"short header write on {path}")
        os.fdatasync(fd)
        return True
    finally:
        os.close(fd)


def rekey_file(path: str | Path, keyring: Keyring, new_key: KeyVersion, *,
               progress: Progress | None = None) -> None:
    """Re-key: decrypt every chunk and encrypt it again under a new file key wrapped by
    `new_key` (after a suspected exposure of the old file key)."""
    if native.available():
        _rekey_native(path, keyring, new_key, progress=progress)
    else:
        _rekey_python(path, keyring, new_key, progress=progress)


# --- the compiled engine ----------------------------------------------------------------
class _Stored:
    """An encrypted file opened for a sequential pass through the compiled engine: its
    header authenticated, its length checked, its chunks read a run at a time."""

    def __init__(self, fin: BinaryIO, path: str, keyring: Keyring) -> None:
        head = fin.read(HEADER_SIZE)
        if not head:
            raise FormatError("empty file: not a Strongroom encrypted file")
        header = native.parse_header(head)
        with native.NativeKey(keyring.get(header.key_id, header.key_version)) as key:
            self.file = native.NativeFile.open(head, key, path=path)
        self.fin, self.path, self.chunk = fin, path, header.chunk_size
        self.length = os.fstat(fin.fileno()).st_size
        stored_chunk = self.chunk + CHUNK_OVERHEAD
        try:
            self.size = native.plaintext_size(self.length, self.chunk)
        except ValueError:
            body = max(self.length - HEADER_SIZE - CHUNK_OVERHEAD, 0)
            self.file.close()
            raise IntegrityError(path, f"chunk {body // stored_chunk} (file length)") from None
        self.count = native.chunk_count(self.size, self.chunk)
        self.run = _run_chunks(self.chunk)
        self._stored = bytearray(self.run * stored_chunk)

    def runs(self, out: bytearray) -> Iterator[tuple[int, int, int]]:
        """(first index, chunks, plaintext bytes) of each run, decrypted into `out`."""
        stored_chunk = self.chunk + CHUNK_OVERHEAD
        for first in range(0, self.count, self.run):
            count = min(self.run, self.count - first)
            start = HEADER_SIZE + first * stored_chunk
            length = min(self.length, start + count * stored_chunk) - start
            view = memoryview(self._stored)[:length]
            if _read_into(self.fin, view) != length:
                raise IntegrityError(self.path, f"chunk {first} (file truncated)")
            yield first, count, self.file.open_run(first, view, out, final_index=self.count - 1)

    def close(self) -> None:
        self.file.close()


def _encrypt_stream_native(src: BinaryIO, dst: BinaryIO, key: KeyVersion, *, chunk_size: int,
                           progress: Progress | None) -> None:
    run = chunk_size * _run_chunks(chunk_size)
    with native.NativeKey(key) as nkey, native.NativeFile.create(nkey, chunk_size=chunk_size) as nf:
        dst.write(nf.header)
        current, following = bytearray(run), bytearray(run)
        out = bytearray(native.run_stored_len(run, chunk_size))
        index, have = 0, _read_into(src, memoryview(current))
        while True:
            # Read one run ahead: the file's final chunk is sealed with last=1.
            more = _read_into(src, memoryview(following)) if have == run else 0
            count = max(1, -(-have // chunk_size))
            written = nf.seal_run(index, memoryview(current)[:have], out,
                                  final_index=None if more else index + count - 1)
            dst.write(memoryview(out)[:written])
            if progress:
                progress(have)
            if not more:
                return
            index, have = index + count, more
            current, following = following, current


def _decrypt_native(src: str | Path, dst: str | Path, keyring: Keyring, *, progress: Progress | None) -> None:
    with open(src, "rb") as fin:
        stored = _Stored(fin, str(src), keyring)
        try:
            out = bytearray(stored.run * stored.chunk)
            with atomic_replace(dst, mode=_file_mode(src)) as fout:
                for _, _, n in stored.runs(out):
                    fout.write(memoryview(out)[:n])
                    if progress:
                        progress(n)
        finally:
            stored.close()


def _rekey_native(path: str | Path, keyring: Keyring, new_key: KeyVersion, *, progress: Progress | None) -> None:
    path = str(path)
    with open(path, "rb") as fin:
        stored = _Stored(fin, path, keyring)
        try:
            with native.NativeKey(new_key) as nkey, \
                    native.NativeFile.create(nkey, chunk_size=stored.chunk, path=path) as nf, \
                    atomic_replace(path, mode=_file_mode(path)) as fout:
                plain = bytearray(stored.run * stored.chunk)
                out = bytearray(native.run_stored_len(len(plain), stored.chunk))
                fout.write(nf.header)
                for first, _, n in stored.runs(plain):
                    written = nf.seal_run(first, memoryview(plain)[:n], out, final_index=stored.count - 1)
                    fout.write(memoryview(out)[:written])
                    if progress:
                        progress(n)
        finally:
            stored.close()


def _read_into(f: BinaryIO, view: memoryview) -> int:
    """Fill `view` from `f` (short only at the end of the stream); returns the count."""
    readinto = getattr(f, "readinto", None)
    got = 0
    while got < len(view):
        if readinto is not None:
            n = readinto(view[got:])
        else:
            part = f.read(len(view) - got)
            view[got:got + len(part)] = part
            n = len(part)
        if not n:
            break
        got += n
    return got


# --- the Python reference -----------------------------------------------------------------
def _encrypt_stream_python(src: BinaryIO, dst: BinaryIO, key: KeyVersion, *, chunk_size: int,
                           progress: Progress | None) -> None:
    file_key, file_id = os.urandom(FILE_KEY_SIZE), os.urandom(16)
    header = seal_header(file_key, key, file_id=file_id, chunk_size=chunk_size)
    cipher = ChunkCipher(file_key, file_id)
    dst.write(header.encode())
    run = chunk_size * _run_chunks(chunk_size)
    index, current = 0, _read_full(src, run)
    while True:
        # Read one run ahead: the file's final chunk is sealed with last=1.
        following = _read_full(src, run) if len(current) == run else b""
        count = max(1, -(-len(current) // chunk_size))
        out = bytearray(len(current) + count * CHUNK_OVERHEAD)
        cipher.seal_run(index, current, chunk_size, out, final_index=None if following else index + count - 1)
        dst.write(out)
        if progress:
            progress(len(current))
        if not following:
            return
        index, current = index + count, following


def _read_full(f: BinaryIO, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        part = f.read(n - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _decrypt_python(src: str | Path, dst: str | Path, keyring: Keyring, *, progress: Progress | None) -> None:
    with EncryptedFile.open(str(src), keyring) as ef, atomic_replace(dst, mode=_file_mode(src)) as fout:
        step = ef.header.chunk_size * _run_chunks(ef.header.chunk_size)
        for offset in range(0, ef.size, step):
            data = ef.read(offset, step)
            fout.write(data)
            if progress:
                progress(len(data))


def _rekey_python(path: str | Path, keyring: Keyring, new_key: KeyVersion, *, progress: Progress | None) -> None:
    path = str(path)
    with EncryptedFile.open(path, keyring) as ef, atomic_replace(path, mode=_file_mode(path)) as fout:
        chunk = ef.header.chunk_size
        file_key, file_id = os.urandom(FILE_KEY_SIZE), os.urandom(16)
        header = seal_header(file_key, new_key, file_id=file_id, chunk_size=chunk)
        cipher = ChunkCipher(file_key, file_id)
        fout.write(header.encode())
        n = max(1, -(-ef.size // chunk))
        for i in range(n):
            plain = ef.read(i * chunk, chunk)
            fout.write(cipher.seal(i, plain, last=i == n - 1))
            if progress:
                progress(len(plain))


def is_encrypted(path: str | Path) -> bool:
    """True when the file starts with this format's magic (the cheap check, no key)."""
    with open(path, "rb") as f:
        return f.read(4) == b"SRCF"

