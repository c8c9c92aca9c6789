"""Whole-file operations: encrypt, decrypt, re-wrap (rotation) and re-key.

Each writes a new file beside the target, fsyncs it, renames it over the target and
fsyncs the directory: an interruption at any moment leaves either the old file or the
new one, both complete and readable, plus at most a stray `.srtmp-*` file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from agents.cryptfile.chunks import CHUNK_OVERHEAD, ChunkCipher
from agents.cryptfile.errors import IntegrityError
from agents.cryptfile.file import EncryptedFile, read_header
from agents.cryptfile.header import DEFAULT_CHUNK, FILE_KEY_SIZE, HEADER_SIZE, seal_header
from agents.cryptfile.keys import Keyring, KeyVersion

Progress = Callable[[int], None]  # called with the number of bytes just processed
TMP_PREFIX = ".srtmp-"
_RUN = 256  # chunks sealed per run


@contextlib.contextmanager
def atomic_replace(target: str | Path, *, mode: int | None = None) -> Iterator[BinaryIO]:
    """Yield a new file in the target's directory; on success it replaces the target
    durably (fsync file, rename, fsync directory); on failure it is removed."""
    target = Path(target)
    tmp = target.with_name(f"{TMP_PREFIX}{os.urandom(6).hex()}-{target.name}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                 0o600 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
        dfd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _file_mode(path: str | Path) -> int:
    return os.stat(path).st_mode & 0o7777


def encrypt_stream(src: BinaryIO, dst: BinaryIO, key: KeyVersion, *, chunk_size: int = DEFAULT_CHUNK,
                   progress: Progress | None = None) -> None:
    """Encrypt everything `src` yields into `dst`, chunk by chunk (constant memory)."""
    file_key, file_id = os.urandom(FILE_KEY_SIZE), os.urandom(16)
    header = seal_header(file_key, key, file_id=file_id, chunk_size=chunk_size)
    cipher = ChunkCipher(file_key, file_id)
    dst.write(header.encode())
    run = chunk_size * _RUN
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


def encrypt_file(src: str | Path, dst: str | Path, key: KeyVersion, *, chunk_size: int = DEFAULT_CHUNK,
                 progress: Progress | None = None) -> None:
    """Encrypt `src` into `dst` (which may be `src` itself: in-place protection)."""
    with open(src, "rb") as fin, atomic_replace(dst, mode=_file_mode(src)) as fout:
        encrypt_stream(fin, fout, key, chunk_size=chunk_size, progress=progress)


def decrypt_file(src: str | Path, dst: str | Path, keyring: Keyring, *, progress: Progress | None = None) -> None:
    """Decrypt `src` into `dst` (may be `src`: unprotect in place). Every chunk is
    authenticated before anything replaces `dst`."""
    with EncryptedFile.open(str(src), keyring) as ef, atomic_replace(dst, mode=_file_mode(src)) as fout:
        step = ef.header.chunk_size * 256
        for offset in range(0, ef.size, step):
            data = ef.read(offset, step)
            fout.write(data)
            if progress:
                progress(len(data))


def rewrap_file(path: str | Path, keyring: Keyring, new_key: KeyVersion, *,
                progress: Progress | None = None) -> bool:
    """Rotation: wrap the file key under `new_key`; the data chunks are copied verbatim,
    never decrypted. Returns False when the file already uses `new_key`."""
    path = str(path)
    header = read_header(path)
    if (header.key_id, header.key_version) == (new_key.key_id, new_key.version):
        return False
    if header.key_id != new_key.key_id:
        raise ValueError(f"{path} belongs to key {header.key_id}, not {new_key.key_id}")
    file_key = header.unwrap(keyring.get(header.key_id, header.key_version))
    if file_key is None:
        raise IntegrityError(path, "header")
    new_header = seal_header(file_key, new_key, file_id=header.file_id, chunk_size=header.chunk_size)
    with open(path, "rb") as fin, atomic_replace(path, mode=_file_mode(path)) as fout:
        fout.write(new_header.encode())
        fin.seek(HEADER_SIZE)
        while block := fin.read(1 << 20):
            fout.write(block)
            if progress:
                progress(len(block))
    return True


def rekey_file(path: str | Path, keyring: Keyring, new_key: KeyVersion, *,
               progress: Progress | None = None) -> None:
    """Re-key: decrypt every chunk and encrypt it again under a new file key wrapped by
    `new_key` (after a suspected exposure of the old file key)."""
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

