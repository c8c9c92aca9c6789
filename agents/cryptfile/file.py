"""Random access to one encrypted file: reads and writes touch only the chunks they
cover (docs/FORMAT.md). This is the layer the transparent mount builds on.

Layout: header (128) then chunks, each stored as chunk_size + 28 bytes except the
last, which holds 0..chunk_size plaintext bytes (+ 28). The plaintext size follows
from the file size alone, so stat needs no decryption. Every file has at least one
chunk: an empty file is the header plus one empty final chunk, which makes
"truncated to nothing" detectable too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from types import TracebackType

from agents.cryptfile.chunks import CHUNK_OVERHEAD, ChunkCipher
from agents.cryptfile.errors import FormatError, IntegrityError
from agents.cryptfile.header import (
    DEFAULT_CHUNK,
    FILE_KEY_SIZE,
    HEADER_SIZE,
    FileHeader,
    parse_header,
    seal_header,
)
from agents.cryptfile.keys import Keyring, KeyVersion
from agents.cryptfile.replace import atomic_replace

# Chunks sealed per write system call. Large enough that any write of the mount (at most
# 1 MiB, i.e. 257 chunks of 4 KiB when unaligned) is ONE pwrite: a killed agent then
# leaves either the old or the new state of the range, never a file whose end is a
# non-final chunk. Extensions beyond this in one call (a truncate to a much larger
# size) are still several steps: see "Interrupted writes" in docs/FORMAT.md.
_BATCH = 512
# Reads this large are a sequential reader's: the mount only sends them when the kernel
# reads ahead (a database's page reads are 8 KiB).
_STREAM = 128 << 10
_KEEP_OUT = 4 << 20


def plaintext_size(stored_size: int, chunk_size: int) -> int:
    """Plaintext bytes of an encrypted file of `stored_size` bytes; raises ValueError
    when no well-formed file has that size."""
    body = stored_size - HEADER_SIZE
    if body < CHUNK_OVERHEAD:
        raise ValueError("shorter than a header and one chunk")
    full = chunk_size + CHUNK_OVERHEAD
    n = (body - CHUNK_OVERHEAD) // full + 1
    return (n - 1) * chunk_size + (body - (n - 1) * full - CHUNK_OVERHEAD)


def stored_size(size: int, chunk_size: int) -> int:
    n = max(1, -(-size // chunk_size))
    return HEADER_SIZE + (n - 1) * (chunk_size + CHUNK_OVERHEAD) + (size - (n - 1) * chunk_size) + CHUNK_OVERHEAD


class EncryptedFile:
    def __init__(self, fd: int, path: str, header: FileHeader, file_key: bytes, *, writable: bool) -> None:
        self._fd = fd
        self.path = path
        self.header = header
        self._cipher = ChunkCipher(file_key, header.file_id)
        self._chunk = header.chunk_size
        self._stored_chunk = header.chunk_size + CHUNK_OVERHEAD
        self._writable = writable
        self._lock = threading.RLock()
        self._size = self._size_from_disk()
        # (index, plaintext) of the final chunk as this object last sealed it: a
        # sequential writer re-seals the old final chunk (it loses its "last" flag) at
        # every append, and need not read and decrypt it back each time.
        self._tail: tuple[int, bytes] | None = None
        self._out = bytearray()  # sealing buffer of _write

    # --- opening -------------------------------------------------------------------
    @classmethod
    def create(cls, path: str, key: KeyVersion, *, chunk_size: int = DEFAULT_CHUNK, mode: int = 0o600,
               exclusive: bool = True) -> EncryptedFile:
        file_key, file_id = os.urandom(FILE_KEY_SIZE), os.urandom(16)
        header = seal_header(file_key, key, file_id=file_id, chunk_size=chunk_size)
        flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), mode)
        try:
            empty = ChunkCipher(file_key, file_id).seal(0, b"", last=True)
            os.pwrite(fd, header.encode() + empty, 0)
            return cls(fd, path, header, file_key, writable=True)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def open(cls, path: str, keyring: Keyring, *, writable: bool = False) -> EncryptedFile:
        fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | getattr(os, "O_CLOEXEC", 0))
        try:
            header = parse_header(os.pread(fd, HEADER_SIZE, 0))
            file_key = header.unwrap(keyring.get(header.key_id, header.key_version))
            if file_key is None:
                raise IntegrityError(path, "header")
            return cls(fd, path, header, file_key, writable=writable)
        except BaseException:
            os.close(fd)
            raise

    def _size_from_disk(self) -> int:
        disk = os.fstat(self._fd).st_size
        try:
            return plaintext_size(disk, self._chunk)
        except ValueError:
            raise IntegrityError(self.path, "chunk 0 (file truncated)") from None

    # --- reading -------------------------------------------------------------------
    @property
    def size(self) -> int:
        return self._size

    def _chunks(self) -> int:
        return max(1, -(-self._size // self._chunk))

    def _read_chunk(self, index: int) -> bytes:
        n = self._chunks()
        length = (self._size - (n - 1) * self._chunk if index == n - 1 else self._chunk) + CHUNK_OVERHEAD
        stored = os.pread(self._fd, length, HEADER_SIZE + index * self._stored_chunk)
        plaintext = self._cipher.open(index, stored, last=index == n - 1, chunk_size=self._chunk) \
            if len(stored) == length else None
        if plaintext is None:
            raise IntegrityError(self.path, f"chunk {index}")
        return plaintext

    def read(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0:
            raise ValueError("offset and size must not be negative")
        out = bytearray(max(0, min(size, self._size - offset)))
        n = self.read_into(offset, memoryview(out))
        return bytes(out[:n])

    def read_into(self, offset: int, out: memoryview) -> int:
        """Read up to len(out) plaintext bytes at `offset` into `out` (the mount reads
        straight into the kernel's buffer); returns the count, 0 at or past the end.
        Chunks wholly inside the range are decrypted in place in `out`; only a partial
        first or last chunk goes through a chunk-sized buffer."""
        if offset < 0:
            raise ValueError("offset must not be negative")
        with self._lock:
            end = min(offset + len(out), self._size)
            if offset >= end:
                return 0
            c, n = self._chunk, self._chunks()
            first, last = offset // c, (end - 1) // c
            span_end = min((last + 1) * c, self._size)  # plaintext end of the chunks read
            # One pread for the whole run of chunks, then authenticate each in place.
            start = HEADER_SIZE + first * self._stored_chunk
            stored_end = HEADER_SIZE + last * self._stored_chunk + (span_end - last * c) + CHUNK_OVERHEAD
            raw = memoryview(os.pread(self._fd, stored_end - start, start))
            if len(raw) >= _STREAM:
                # A sequential reader: have the disk fetch the next two requests' worth
                # while this one is decrypted (cold sequential reads went from ~230 to
                # ~540 MB/s; the backing file's own read-ahead does not keep up).
                os.posix_fadvise(self._fd, stored_end, 2 * len(raw), os.POSIX_FADV_WILLNEED)
            if len(raw) != stored_end - start:
                raise IntegrityError(self.path, f"chunk {first + len(raw) // self._stored_chunk} (file truncated)")
            count = end - offset
            aligned = offset == first * c and end == span_end
            target = out[:count] if aligned else memoryview(bytearray(span_end - first * c))
            bad = self._cipher.open_run(first, raw, c, target, final_index=n - 1)
            if bad is not None:
                raise IntegrityError(self.path, f"chunk {bad}")
            if not aligned:
                out[:count] = target[offset - first * c:end - first * c]
            return count

    def verify(self) -> None:
        """Authenticate every chunk (raises IntegrityError naming the first bad one)."""
        with self._lock:
            for i in range(self._chunks()):
                self._read_chunk(i)

    # --- writing -------------------------------------------------------------------
    def _require_writable(self) -> None:
        if not self._writable:
            raise PermissionError(f"{self.path} is open read-only")

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        if offset < 0:
            raise ValueError("offset must not be negative")
        self._require_writable()
        if not len(data):
            return 0  # like pwrite(2): writing nothing never extends the file
        with self._lock:
            self._write(offset, memoryview(data).cast("B"), max(self._size, offset + len(data)))
        return len(data)

    def truncate(self, size: int) -> None:
        if size < 0:
            raise ValueError("size must not be negative")
        self._require_writable()
        with self._lock:
            if size > self._size:
                # The whole chunks between the old final chunk and the new one become
                # holes (zeros on disk, no space); the old final chunk is re-sealed full
                # and not final, the new final chunk is sealed (docs/FORMAT.md, "Sparse
                # regions").
                self._write(self._size, memoryview(b""), size)
            elif size < self._size:
                self._tail = None
                n = max(1, -(-size // self._chunk))
                keep = size - (n - 1) * self._chunk
                tail = self._read_chunk(n - 1)[:keep] if n - 1 < self._chunks() else b""
                sealed = self._cipher.seal(n - 1, tail, last=True)
                # In this order a crash between the steps leaves a tail that
                # repair_torn_tail can tell apart: whole chunks cut first (the kept
                # final one still marked not final), then the new final chunk, then
                # the exact end.
                os.ftruncate(self._fd, HEADER_SIZE + n * self._stored_chunk)
                os.pwrite(self._fd, sealed, HEADER_SIZE + (n - 1) * self._stored_chunk)
                os.ftruncate(self._fd, stored_size(size, self._chunk))
                self._size = size
                self._tail = (n - 1, bytes(tail))

    def _write(self, offset: int, data: memoryview, new_size: int) -> None:
        old_size, old_n = self._size, self._chunks()
        new_n = max(1, -(-new_size // self._chunk))
        first = min(offset, old_size) // self._chunk
        if new_n > old_n:
            first = min(first, old_n - 1)  # the old final chunk loses its "last" flag
        end_write = offset + len(data)
        # Only the chunks the write covers, unless the file grows: then everything up to
        # the new end.
        last = new_n - 1 if new_size > old_size else (end_write - 1) // self._chunk
        c = self._chunk
        # A growing file's whole chunks past the old final chunk that the write does not
        # touch, short of the new final chunk, are holes (docs/FORMAT.md, "Sparse
        # regions"): never written, so they stay zeros on disk and cost no space. Only
        # chunks no data was ever written to become holes. The chunks before the gap
        # (the old final chunk, re-sealed as not final) are written first, then those
        # after it: a crash in between leaves a torn tail repair_torn_tail mends.
        segments = [(first, last)]
        if new_size > old_size:
            gap_end = min(offset // c if len(data) else new_n - 1, new_n - 1)
            if gap_end > old_n:
                segments = [(first, old_n - 1), (gap_end, last)]
        # Chunks that may hold old bytes the write does not cover: the edges of the write
        # and the old final chunk (which loses its "last" flag when the file grows).
        # Every other chunk of the range is wholly new data or the zeros of a gap.
        keep = {i for i in (first, last, old_n - 1)
                if first <= i <= last and i < old_n and i * c < old_size
                and not (offset <= i * c and end_write >= min((i + 1) * c, new_size))}
        need = min(_BATCH, max(hi + 1 - lo for lo, hi in segments)) * self._stored_chunk
        # Kept across writes (under the lock): no 1 MiB calloc per request of the mount.
        # Larger ones (long runs of large chunks) stay transient.
        if len(self._out) < need <= _KEEP_OUT:
            self._out = bytearray(need)
        out = self._out if need <= len(self._out) else bytearray(need)
        batches = [(start, min(hi + 1, start + _BATCH)) for lo, hi in segments for start in range(lo, hi + 1, _BATCH)]
        for batch_start, batch_end in batches:
            span_start, span_end = batch_start * c, min(batch_end * c, new_size)
            plain: memoryview
            if offset <= span_start and span_end <= end_write and not keep:
                plain = data[span_start - offset:span_end - offset]  # the common case: no copy
            else:
                buf = bytearray(span_end - span_start)  # zeros: a gap's part of a sealed chunk
                for i in keep:
                    if batch_start <= i < batch_end:
                        tail = self._tail
                        old = tail[1] if tail is not None and tail[0] == i else self._read_chunk(i)
                        at = i * c - span_start
                        buf[at:at + len(old)] = old[:span_end - i * c]
                lo, hi = max(offset, span_start), min(end_write, span_end)
                if lo < hi:
                    buf[lo - span_start:hi - span_start] = data[lo - offset:hi - offset]
                plain = memoryview(buf)
            written = self._cipher.seal_run(batch_start, plain, c, out, final_index=new_n - 1)
            self._tail = None  # until the write is on disk
            os.pwrite(self._fd, memoryview(out)[:written], HEADER_SIZE + batch_start * self._stored_chunk)
            if batch_start <= new_n - 1 < batch_end:
                self._tail = (new_n - 1, bytes(plain[(new_n - 1) * c - span_start:]))
        if new_size < old_size:  # cannot happen through write(); kept for truncate's sake
            os.ftruncate(self._fd, stored_size(new_size, self._chunk))
        self._size = new_size

    # --- rotation while open ------------------------------------------------------------
    def rewrap(self, keyring: Keyring, new_key: KeyVersion,
               on_replaced: Callable[[os.stat_result], None] | None = None) -> bool:
        """Re-wrap this open file's key under `new_key` without closing it: a new file
        with the new header and the same chunks (copied, not decrypted) is fsynced and
        renamed over the path, then this object continues on it. Readers and writers of
        this object wait for the copy (the file lock) and never see a mix. `on_replaced`
        runs under the lock with the new file's stat (the mount re-keys its registry).
        Returns False when the file already uses `new_key`."""
        with self._lock:
            if (self.header.key_id, self.header.key_version) == (new_key.key_id, new_key.version):
                return False
            if self.header.key_id != new_key.key_id:
                raise ValueError(f"{self.path} belongs to key {self.header.key_id}, not {new_key.key_id}")
            file_key = self.header.unwrap(keyring.get(self.header.key_id, self.header.key_version))
            if file_key is None:
                raise IntegrityError(self.path, "header")
            new_header = seal_header(file_key, new_key, file_id=self.header.file_id, chunk_size=self._chunk)
            mode = os.fstat(self._fd).st_mode & 0o7777
            with atomic_replace(self.path, mode=mode) as out:
                out.write(new_header.encode())
                out.flush()
                end = os.fstat(self._fd).st_size
                offset = HEADER_SIZE
                while offset < end:
                    copied = os.copy_file_range(self._fd, out.fileno(), end - offset, offset, offset)
                    if copied == 0:
                        break
                    offset += copied
            fd = os.open(self.path, (os.O_RDWR if self._writable else os.O_RDONLY) | getattr(os, "O_CLOEXEC", 0))
            os.close(self._fd)
            self._fd, self.header = fd, new_header
            if on_replaced is not None:
                on_replaced(os.fstat(fd))
            return True

    def rekey(self, new_key: KeyVersion, on_replaced: Callable[[os.stat_result], None] | None = None) -> None:
        """Re-encrypt this open file under a fresh file key (and file id) wrapped by
        `new_key`, without closing it: every chunk is authenticated and sealed anew into
        a new file that is fsynced and renamed over the path, then this object continues
        on it. Readers and writers of this object wait for it (the file lock)."""
        with self._lock:
            file_key, file_id = os.urandom(FILE_KEY_SIZE), os.urandom(16)
            header = seal_header(file_key, new_key, file_id=file_id, chunk_size=self._chunk)
            cipher = ChunkCipher(file_key, file_id)
            n = self._chunks()
            out = bytearray(_BATCH * self._stored_chunk)
            with atomic_replace(self.path, mode=os.fstat(self._fd).st_mode & 0o7777) as f:
                f.write(header.encode())
                for first in range(0, n, _BATCH):
                    plain = self.read(first * self._chunk, _BATCH * self._chunk)
                    written = cipher.seal_run(first, plain, self._chunk, out, final_index=n - 1)
                    f.write(memoryview(out)[:written])
            fd = os.open(self.path, (os.O_RDWR if self._writable else os.O_RDONLY) | getattr(os, "O_CLOEXEC", 0))
            os.close(self._fd)
            self._fd, self.header, self._cipher = fd, header, cipher
            if on_replaced is not None:
                on_replaced(os.fstat(fd))

    # --- lifecycle ------------------------------------------------------------------
    def fsync(self) -> None:
        os.fsync(self._fd)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> EncryptedFile:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def read_header(path: str) -> FileHeader:
    """The header of `path`, parsed without any key (FormatError if not ours)."""
    with open(path, "rb") as f:
        data = f.read(HEADER_SIZE)
    if not data:
        raise FormatError("empty file: not a Strongroom encrypted file")
    return parse_header(data)


def repair_torn_tail(path: str, keyring: Keyring) -> int | None:
    """After a crash of the writer (never otherwise: this is what truncation detection
    would otherwise catch): when the file no longer ends in a chunk sealed as final, keep
    the longest run of chunks that authenticate in place, re-seal the last of them as
    final and cut the rest. Returns the new plaintext size, or None when the file was
    intact. A size change is one multi-step write (re-seal the old final chunk, append,
    or re-seal and cut), so a kill between the steps leaves such a tail; every chunk of
    the kept run is authentic, so nothing is invented, only unsynced data is lost.

    Only for files the writer's journal lists as being written when it died."""
    fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    try:
        header = parse_header(os.pread(fd, HEADER_SIZE, 0))
        file_key = header.unwrap(keyring.get(header.key_id, header.key_version))
        if file_key is None:
            raise IntegrityError(path, "header")
        cipher = ChunkCipher(file_key, header.file_id)
        stored_chunk = header.chunk_size + CHUNK_OVERHEAD
        body = os.fstat(fd).st_size - HEADER_SIZE
        full, rest = divmod(body, stored_chunk)
        count = full + (1 if rest else 0)
        if count:
            last_len = rest or stored_chunk
            tail = os.pread(fd, last_len, HEADER_SIZE + (count - 1) * stored_chunk)
            if len(tail) == last_len and cipher.open(count - 1, tail, last=True) is not None:
                return None  # ends in its final chunk: intact (earlier chunks are checked on read)
        good, plain = 0, b""
        while good < full:
            stored = os.pread(fd, stored_chunk, HEADER_SIZE + good * stored_chunk)
            opened = cipher.open(good, stored, last=False, chunk_size=header.chunk_size)  # holes too
            if opened is None:
                break
            good, plain = good + 1, opened
        if good < full:
            # A cut that was sealed but not yet applied: chunk `good` is the new final one.
            stored = os.pread(fd, stored_chunk, HEADER_SIZE + good * stored_chunk)
            for length in range(CHUNK_OVERHEAD, stored_chunk + 1):
                final = cipher.open(good, stored[:length], last=True)
                if final is not None:
                    os.ftruncate(fd, HEADER_SIZE + good * stored_chunk + length)
                    os.fsync(fd)
                    return good * header.chunk_size + len(final)
        if good == 0:
            plain = b""  # not one chunk survives: the file is empty again
        index = max(good - 1, 0)
        sealed = cipher.seal(index, plain, last=True)
        os.pwrite(fd, sealed, HEADER_SIZE + index * stored_chunk)
        os.ftruncate(fd, HEADER_SIZE + index * stored_chunk + len(sealed))
        os.fsync(fd)
        return index * header.chunk_size + len(plain)
    finally:
        os.close(fd)
