"""The compiled format engine (agents/dataplane, libsrcf) against the Python reference
(agents/cryptfile): golden files, differential round trips both ways across chunk sizes
and random write/truncate sequences, every header rejection, tampering, sizes, the
loader's refusals, and the C side's own checks (the C tests under ASan + UBSan, the
fuzz target over its committed corpus, the benchmark program)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import struct
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.cryptfile import (
    EncryptedFile,
    FormatError,
    IntegrityError,
    KeyUnavailable,
    KeyVersion,
    StaticKeyring,
    decrypt_file,
    encrypt_file,
    parse_header,
    plaintext_size,
    rekey_file,
    rewrap_file,
    stored_size,
)
from agents.cryptfile import native as nat
from agents.cryptfile.header import HEADER_SIZE
from tests import parallel
from tests.agents import golden
from tests.agents.conftest import DATAPLANE

pytestmark = pytest.mark.usefixtures("native_engine")

GOLDEN = Path(golden.__file__).parent / "v1"
CHUNK_SIZES = [512, 1024, 4096, 65536, 1 << 20]
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def new_key(version: int = 1, key_id: uuid.UUID | None = None) -> KeyVersion:
    return KeyVersion(key_id or uuid.uuid4(), version, os.urandom(32))


def engine(*, native: bool) -> mock._patch[mock.MagicMock]:
    """The whole-file operations on the compiled engine, or on the Python reference as
    on a host without the library."""
    return mock.patch.object(nat, "available", return_value=native)


def python_engine() -> mock._patch[mock.MagicMock]:
    return engine(native=False)


def native_read(data: bytes, key: KeyVersion, *, path: str = "f") -> bytes:
    """The whole plaintext of an encrypted file's bytes, through the compiled engine only."""
    header = nat.parse_header(data[:HEADER_SIZE])
    size = nat.plaintext_size(len(data), header.chunk_size)
    n = nat.chunk_count(size, header.chunk_size)
    out = bytearray(size)
    with nat.NativeKey(key) as nk, nat.NativeFile.open(data[:HEADER_SIZE], nk, path=path) as nf:
        assert nf.open_run(0, data[HEADER_SIZE:], out, final_index=n - 1) == size
    return bytes(out)


def python_read(path: Path, key: KeyVersion) -> bytes:
    with EncryptedFile.open(str(path), StaticKeyring([key])) as f:
        data = f.read(0, f.size)
        f.verify()
        return data


def native_write(plain: bytes, key: KeyVersion, chunk_size: int, splits: list[int] | None = None) -> bytes:
    """An encrypted file sealed by the compiled engine, in runs cut at `splits` (chunks)."""
    n = max(1, -(-len(plain) // chunk_size))
    with nat.NativeKey(key) as nk, nat.NativeFile.create(nk, chunk_size=chunk_size) as nf:
        parts = [nf.header]
        bounds = sorted({0, n, *(s for s in (splits or []) if 0 < s < n)})
        for first, end in itertools.pairwise(bounds):
            piece = plain[first * chunk_size:end * chunk_size]
            out = bytearray(nat.run_stored_len(len(piece), chunk_size))
            parts.append(bytes(out[:nf.seal_run(first, piece, out, final_index=n - 1)]))
        return b"".join(parts)


# --- golden files ---------------------------------------------------------------------
def golden_key() -> KeyVersion:
    k = json.loads((GOLDEN / "keys.json").read_text())
    return KeyVersion(uuid.UUID(k["key_id"]), k["key_version"], bytes.fromhex(k["key_material_hex"]))


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.srcf")), ids=lambda p: p.name)
def test_golden_files_open_with_the_native_code(path: Path, tmp_path: Path) -> None:
    expected = path.with_suffix(".plain").read_bytes()
    assert native_read(path.read_bytes(), golden_key()) == expected
    decrypt_file(path, tmp_path / "out", StaticKeyring([golden_key()]))  # the CLI's path
    assert (tmp_path / "out").read_bytes() == expected


@pytest.mark.parametrize("name", sorted(golden.CASES))
def test_the_native_writer_reproduces_the_golden_files(name: str) -> None:
    plain, chunk = golden.CASES[name]
    n = max(1, -(-len(plain) // chunk))
    with nat.NativeKey(golden.KEY) as nk, nat.NativeFile.create(
            nk, chunk_size=chunk, file_key=golden.FILE_KEY, file_id=golden.FILE_ID,
            wrap_nonce=golden.HEADER_NONCE) as nf:
        out = bytearray(nat.run_stored_len(len(plain), chunk))
        written = nf.seal_run(0, plain, out, final_index=n - 1,
                              nonces=b"".join(golden.chunk_nonce(i) for i in range(n)))
        assert nf.header + bytes(out[:written]) == (GOLDEN / f"{name}.srcf").read_bytes()


# --- differential: native <-> Python ---------------------------------------------------
@FAST
@given(chunk=st.sampled_from(CHUNK_SIZES), data=st.data())
def test_native_files_decrypt_with_python(tmp_path_factory: pytest.TempPathFactory, chunk: int,
                                          data: st.DataObject) -> None:
    length = data.draw(st.integers(0, 3 * chunk + 7 if chunk <= 65536 else chunk + 100), label="length")
    splits = data.draw(st.lists(st.integers(1, 4), max_size=3), label="run splits")
    plain = os.urandom(length)
    key = new_key()
    p = tmp_path_factory.mktemp("n2p") / "f"
    p.write_bytes(native_write(plain, key, chunk, splits))
    assert python_read(p, key) == plain


@FAST
@given(chunk=st.sampled_from(CHUNK_SIZES), data=st.data())
def test_python_files_decrypt_with_native(tmp_path_factory: pytest.TempPathFactory, chunk: int,
                                          data: st.DataObject) -> None:
    length = data.draw(st.integers(0, 3 * chunk + 7 if chunk <= 65536 else chunk + 100), label="length")
    plain = os.urandom(length)
    key = new_key()
    d = tmp_path_factory.mktemp("p2n")
    (d / "plain").write_bytes(plain)
    with python_engine():
        encrypt_file(d / "plain", d / "enc", key, chunk_size=chunk)
    assert native_read((d / "enc").read_bytes(), key) == plain
    decrypt_file(d / "enc", d / "out", StaticKeyring([key]))  # native path of the CLI
    assert (d / "out").read_bytes() == plain


@pytest.mark.parametrize("chunk", [512, 4096, 1 << 20])
@pytest.mark.parametrize("size", [0, 1, 1000, 256 * 4096 + 3, (1 << 20) * 2 + 1])
def test_cli_transforms_agree_across_engines(tmp_path: Path, chunk: int, size: int) -> None:
    """encrypt / decrypt / rewrap / rekey on either engine, read back by the other."""
    plain = os.urandom(size)
    key = new_key()
    v2 = KeyVersion(key.key_id, 2, os.urandom(32))
    ring = StaticKeyring([key, v2])
    for writer_native in (True, False):
        p = tmp_path / f"f{writer_native}"
        p.write_bytes(plain)
        with engine(native=writer_native):
            encrypt_file(p, p, key, chunk_size=chunk)
            assert rewrap_file(p, ring, v2)
            rekey_file(p, ring, v2)
        assert python_read(p, v2) == plain
        assert native_read(p.read_bytes(), v2) == plain
        with engine(native=not writer_native):
            decrypt_file(p, tmp_path / "out", ring)
        assert (tmp_path / "out").read_bytes() == plain


# --- sparse regions (holes): written by either engine, read by the other ---------------------
def native_sparse_write(path: Path, key: KeyVersion, chunk: int, head: bytes, tail: bytes, size: int) -> None:
    """A file of `size` bytes written with the compiled engine as a writer that extends
    by ftruncate: `head` from offset 0 (its chunks sealed, none final), then the stored
    file extended past whole chunks (zeros on disk: holes), then the final chunk holding
    `tail` at the end of the plaintext sealed in place. `head` is whole chunks."""
    assert len(head) % chunk == 0 and 0 < len(tail) <= chunk
    n = nat.chunk_count(size, chunk)
    assert len(head) // chunk < n - 1 and size - (n - 1) * chunk == len(tail)
    with nat.NativeKey(key) as nk, nat.NativeFile.create(nk, chunk_size=chunk) as nf:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            out = bytearray(nat.run_stored_len(max(len(head), len(tail)), chunk))
            os.pwrite(fd, nf.header, 0)
            os.pwrite(fd, memoryview(out)[:nf.seal_run(0, head, out, final_index=n - 1)], HEADER_SIZE)
            os.ftruncate(fd, nat.stored_size(size, chunk))
            os.pwrite(fd, memoryview(out)[:nf.seal_run(n - 1, tail, out, final_index=n - 1)],
                      nat.chunk_offset(n - 1, chunk))
            os.fsync(fd)
        finally:
            os.close(fd)


def native_read_range(path: Path, key: KeyVersion, first: int, count: int) -> bytes:
    """Chunks first .. first + count - 1 of a stored file, opened as one run by the
    compiled engine (as the mount reads a range)."""
    with open(path, "rb") as f:
        header = f.read(HEADER_SIZE)
        length = os.fstat(f.fileno()).st_size
        chunk = nat.parse_header(header).chunk_size
        n = nat.chunk_count(nat.plaintext_size(length, chunk), chunk)
        lo = nat.chunk_offset(first, chunk)
        stored = os.pread(f.fileno(), min(length, lo + count * (chunk + 28)) - lo, lo)
    out = bytearray(count * chunk)
    with nat.NativeKey(key) as nk, nat.NativeFile.open(header, nk, path=str(path)) as nf:
        return bytes(out[:nf.open_run(first, stored, out, final_index=n - 1)])


@pytest.mark.parametrize("chunk", [512, 4096])
def test_a_hole_written_by_python_reads_with_native(tmp_path: Path, chunk: int) -> None:
    key = new_key()
    p = tmp_path / "f"
    head, tail = os.urandom(chunk + 10), os.urandom(chunk // 2)
    with EncryptedFile.create(str(p), key, chunk_size=chunk) as f:
        f.write(0, head)
        f.truncate(10 * chunk)
        f.write(15 * chunk + 7, tail)
    model = head + bytes(15 * chunk + 7 - len(head)) + tail
    data = p.read_bytes()
    holes = [i for i in range(nat.chunk_count(len(model), chunk))
             if data[nat.chunk_offset(i, chunk):nat.chunk_offset(i + 1, chunk)] == bytes(chunk + 28)]
    assert holes == [*range(2, 9), *range(10, 15)]  # 9 was the final chunk of the truncate
    assert native_read(data, key) == model
    decrypt_file(p, tmp_path / "out", StaticKeyring([key]))  # the CLI's native path
    assert (tmp_path / "out").read_bytes() == model
    assert native_read_range(p, key, 3, 2) == bytes(2 * chunk)  # a run of holes alone


def test_a_large_hole_written_by_python_reads_with_native(tmp_path: Path) -> None:
    key = new_key()
    p = tmp_path / "f"
    size = 1 << 30
    with EncryptedFile.create(str(p), key) as f:
        f.write(0, b"start")
        f.truncate(size)
        f.fsync()
    assert p.stat().st_blocks * 512 < 1 << 20
    n = nat.chunk_count(size, 4096)
    assert native_read_range(p, key, 0, 256) == b"start" + bytes(256 * 4096 - 5)
    assert native_read_range(p, key, n // 2, 256) == bytes(256 * 4096)
    assert native_read_range(p, key, n - 256, 256) == bytes(256 * 4096)


@pytest.mark.parametrize("chunk", [512, 4096])
def test_a_hole_written_by_native_reads_with_python(tmp_path: Path, chunk: int) -> None:
    key = new_key()
    p = tmp_path / "f"
    head, tail = os.urandom(2 * chunk), os.urandom(chunk - 1)
    size = 20 * chunk + len(tail)
    native_sparse_write(p, key, chunk, head, tail, size)
    model = head + bytes(size - len(head) - len(tail)) + tail
    assert python_read(p, key) == model  # read whole and verified chunk by chunk
    with EncryptedFile.open(str(p), StaticKeyring([key]), writable=True) as f:
        assert f.read(5 * chunk + 3, chunk) == bytes(chunk)
        f.write(7 * chunk + 1, b"x")  # a write into the hole, then a cut inside it
        f.truncate(12 * chunk + 9)
    after = bytearray(model[:12 * chunk + 9])
    after[7 * chunk + 1] = ord("x")
    assert python_read(p, key) == after
    assert native_read(p.read_bytes(), key) == after


def test_a_large_hole_written_by_native_reads_with_python(tmp_path: Path) -> None:
    key = new_key()
    p = tmp_path / "f"
    size = (1 << 30) + 5
    native_sparse_write(p, key, 4096, os.urandom(4096), b"tail!", size)
    st_ = p.stat()
    assert st_.st_size == stored_size(size, 4096) and st_.st_blocks * 512 < 1 << 20
    with EncryptedFile.open(str(p), StaticKeyring([key])) as f:
        assert f.size == size
        assert f.read(4096, 1 << 20) == bytes(1 << 20)
        assert f.read(size // 2, 1 << 20) == bytes(1 << 20)
        assert f.read(size - 4101, 5000) == bytes(4096) + b"tail!"


@pytest.mark.parametrize("writer", ["python", "native"])
def test_a_zeroed_final_chunk_is_an_integrity_error_in_both(tmp_path: Path, writer: str) -> None:
    key = new_key()
    p = tmp_path / "f"
    if writer == "python":
        with EncryptedFile.create(str(p), key, chunk_size=512) as f:
            f.write(0, os.urandom(100))
            f.truncate(8 * 512)  # the final chunk is full: 540 stored bytes
    else:
        native_sparse_write(p, key, 512, os.urandom(512), os.urandom(512), 8 * 512)
    data = p.read_bytes()
    zeroed = data[:nat.chunk_offset(7, 512)] + bytes(540)
    assert len(zeroed) == len(data)
    p.write_bytes(zeroed)
    with pytest.raises(IntegrityError, match="chunk 7"):
        native_read(zeroed, key)
    with pytest.raises(IntegrityError, match="chunk 7"):
        python_read(p, key)
    with pytest.raises(IntegrityError, match="chunk 7"):
        decrypt_file(p, tmp_path / "out", StaticKeyring([key]))


@pytest.mark.parametrize("lo,hi", [(0, 270), (270, 540), (0, 539), (1, 540)])
def test_a_partly_zeroed_chunk_is_an_integrity_error_in_both(sample: tuple[Path, KeyVersion, bytes], lo: int,
                                                              hi: int) -> None:
    p, key, _ = sample
    data = p.read_bytes()
    at = nat.chunk_offset(2, 512)
    p.write_bytes(data[:at + lo] + bytes(hi - lo) + data[at + hi:])
    with pytest.raises(IntegrityError, match="chunk 2"):
        native_read(p.read_bytes(), key)
    with pytest.raises(IntegrityError, match="chunk 2"):
        python_read(p, key)


def test_a_whole_zeroed_non_final_chunk_reads_as_zeros_in_both(sample: tuple[Path, KeyVersion, bytes]) -> None:
    """The trade-off docs/FORMAT.md states ("Sparse regions")."""
    p, key, plain = sample
    data = p.read_bytes()
    at = nat.chunk_offset(2, 512)
    p.write_bytes(data[:at] + bytes(540) + data[at + 540:])
    expected = plain[:1024] + bytes(512) + plain[1536:]
    assert native_read(p.read_bytes(), key) == expected
    assert python_read(p, key) == expected


OPS = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 6), st.integers(0, 5), st.integers(0, 3)),
    st.tuples(st.just("truncate"), st.integers(0, 7), st.integers(0, 5), st.just(0)),
), min_size=1, max_size=12)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunk=st.sampled_from([512, 4096]), ops=OPS)
def test_random_writes_by_python_read_by_native(tmp_path_factory: pytest.TempPathFactory, chunk: int,
                                                ops: list[tuple[str, int, int, int]]) -> None:
    """The reference's random access (writes anywhere, truncates both ways) leaves files
    the compiled engine reads whole and in any sub-run."""
    key = new_key()
    p = tmp_path_factory.mktemp("rw") / "f"
    model = bytearray()
    with EncryptedFile.create(str(p), key, chunk_size=chunk) as f:
        for op, a, b, c in ops:
            offset = a * chunk + b * 37
            if op == "write":
                blob = os.urandom(c * chunk + b * 11)
                f.write(offset, blob)
                if blob:
                    model.extend(bytes(max(0, offset - len(model))))
                    model[offset:offset + len(blob)] = blob
            else:
                f.truncate(offset)
                del model[offset:]
                model.extend(bytes(offset - len(model)))
            data = p.read_bytes()
            assert native_read(data, key) == model
    # Sub-runs: any first chunk, any count, as the mount would read a range.
    data = p.read_bytes()
    n = nat.chunk_count(len(model), chunk)
    with nat.NativeKey(key) as nk, nat.NativeFile.open(data[:HEADER_SIZE], nk) as nf:
        for first in range(n):
            for count in (1, 2, n - first):
                count = min(count, n - first)
                lo = HEADER_SIZE + first * (chunk + 28)
                hi = min(len(data), lo + count * (chunk + 28))
                out = bytearray(count * chunk)
                got = nf.open_run(first, data[lo:hi], out, final_index=n - 1)
                assert bytes(out[:got]) == bytes(model[first * chunk:first * chunk + got])


class NativeWriter:
    """Random access built from the compiled engine's runs alone (the way the FUSE
    daemon will use them): a write decrypts the chunks it covers partly, re-seals every
    chunk it touches, and the old final chunk when the file grows."""

    def __init__(self, path: Path, key: KeyVersion, chunk: int) -> None:
        self.path, self.chunk = path, chunk
        self.nk = nat.NativeKey(key)
        self.nf = nat.NativeFile.create(self.nk, chunk_size=chunk)
        self.size = 0
        path.write_bytes(self.nf.header + self._seal(0, b"", 0))

    def _seal(self, first: int, plain: bytes, final: int) -> bytes:
        out = bytearray(nat.run_stored_len(len(plain), self.chunk))
        return bytes(out[:self.nf.seal_run(first, plain, out, final_index=final)])

    def _plain(self) -> bytearray:
        data = self.path.read_bytes()
        n = nat.chunk_count(self.size, self.chunk)
        out = bytearray(self.size)
        self.nf.open_run(0, data[HEADER_SIZE:], out, final_index=n - 1)
        return out

    def write(self, offset: int, blob: bytes) -> None:
        if not blob:
            return
        plain = self._plain()
        plain.extend(bytes(max(0, offset + len(blob) - len(plain))))
        plain[offset:offset + len(blob)] = blob
        self._store(plain, first=min(offset, self.size) // self.chunk)

    def truncate(self, size: int) -> None:
        plain = self._plain()
        del plain[size:]
        plain.extend(bytes(size - len(plain)))
        self._store(plain, first=min(size, self.size) // self.chunk)

    def _store(self, plain: bytearray, *, first: int) -> None:
        old_n, n = nat.chunk_count(self.size, self.chunk), nat.chunk_count(len(plain), self.chunk)
        first = min(first, old_n - 1, n - 1)  # the old final chunk loses its flag
        sealed = self._seal(first, bytes(plain[first * self.chunk:]), n - 1)
        with open(self.path, "r+b") as f:
            f.seek(nat.chunk_offset(first, self.chunk))
            f.write(sealed)
            f.truncate(nat.stored_size(len(plain), self.chunk))
        self.size = len(plain)

    def close(self) -> None:
        self.nf.close()
        self.nk.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunk=st.sampled_from([512, 4096]), ops=OPS)
def test_random_writes_by_native_read_by_python(tmp_path_factory: pytest.TempPathFactory, chunk: int,
                                                ops: list[tuple[str, int, int, int]]) -> None:
    key = new_key()
    p = tmp_path_factory.mktemp("nw") / "f"
    w = NativeWriter(p, key, chunk)
    model = bytearray()
    try:
        for op, a, b, c in ops:
            offset = a * chunk + b * 37
            if op == "write":
                blob = os.urandom(c * chunk + b * 11)
                w.write(offset, blob)
                if blob:
                    model.extend(bytes(max(0, offset - len(model))))
                    model[offset:offset + len(blob)] = blob
            else:
                w.truncate(offset)
                del model[offset:]
                model.extend(bytes(offset - len(model)))
            assert python_read(p, key) == model
    finally:
        w.close()


# --- header rejections, tampering ------------------------------------------------------
@pytest.fixture
def sample(tmp_path: Path) -> Iterator[tuple[Path, KeyVersion, bytes]]:
    key = new_key(version=5)
    plain = os.urandom(512 * 4 + 100)
    p = tmp_path / "enc"
    p.write_bytes(native_write(plain, key, 512))
    yield p, key, plain


def with_bytes(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value):]


REJECTIONS = {  # FORMAT.md, "Header": each with its own code in the C library
    "magic": (lambda d: with_bytes(d, 0, b"SRCX"), 11, "bad magic"),
    "version": (lambda d: with_bytes(d, 4, struct.pack(">H", 2)), 12, "format version"),
    "truncated": (lambda d: d[:100], 10, "truncated"),
    "header length": (lambda d: with_bytes(d, 6, struct.pack(">H", 64)), 13, "header length"),
    "chunk size not a power of two": (lambda d: with_bytes(d, 8, struct.pack(">I", 1000)), 14, "chunk size"),
    "chunk size too small": (lambda d: with_bytes(d, 8, struct.pack(">I", 256)), 14, "chunk size"),
    "chunk size too large": (lambda d: with_bytes(d, 8, struct.pack(">I", 1 << 21)), 14, "chunk size"),
    "wrapping": (lambda d: with_bytes(d, 48, b"\x02"), 15, "wrapping"),
    "flags": (lambda d: with_bytes(d, 49, b"\x01"), 16, "flags"),
    "reserved": (lambda d: with_bytes(d, 60, b"\x01"), 17, "reserved"),
    "key version 0": (lambda d: with_bytes(d, 44, bytes(4)), 18, "key version 0"),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_every_header_rejection(sample: tuple[Path, KeyVersion, bytes], case: str, tmp_path: Path) -> None:
    p, key, _ = sample
    mutate, code, words = REJECTIONS[case]
    bad = mutate(p.read_bytes())
    lib = nat.load()
    h = nat._Header()
    assert lib.srcf_header_parse(bad, len(bad), nat.ctypes.byref(h)) == code
    with pytest.raises(FormatError, match=words):
        nat.parse_header(bad[:HEADER_SIZE])
    with pytest.raises(FormatError):  # the reference refuses it too
        parse_header(bad[:HEADER_SIZE])
    p.write_bytes(bad)
    with pytest.raises(FormatError):
        decrypt_file(p, tmp_path / "out", StaticKeyring([key]))
    assert not (tmp_path / "out").exists()


def test_the_error_codes_are_distinct_and_say_no_more_than_the_class() -> None:
    lib = nat.load()
    messages = {code: nat._message(lib, code) for code in [*range(10, 19), 20, 30, 31]}
    assert len(set(messages.values())) == len(messages)
    assert all(m != "unknown error" for m in messages.values())


@pytest.mark.parametrize("offset", [12, 27, 70, 100, 127])
def test_a_tampered_authenticated_header_field(sample: tuple[Path, KeyVersion, bytes], offset: int,
                                               tmp_path: Path) -> None:
    p, key, _ = sample
    data = bytearray(p.read_bytes())
    data[offset] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as exc:
        decrypt_file(p, tmp_path / "out", StaticKeyring([key]))
    assert exc.value.where == "header" and exc.value.path == str(p)


def test_a_header_naming_another_key_or_version(sample: tuple[Path, KeyVersion, bytes]) -> None:
    p, key, _ = sample
    data = p.read_bytes()
    with nat.NativeKey(KeyVersion(key.key_id, 6, key.material)) as other, pytest.raises(KeyUnavailable, match="5"):
        nat.NativeFile.open(data[:HEADER_SIZE], other, path=str(p))
    impostor = KeyVersion(key.key_id, key.version, os.urandom(32))
    with pytest.raises(IntegrityError, match="header"):
        native_read(data, impostor, path=str(p))


@pytest.mark.parametrize("chunk", [0, 2, 4])
def test_a_tampered_chunk_is_named(sample: tuple[Path, KeyVersion, bytes], chunk: int, tmp_path: Path) -> None:
    p, key, _ = sample
    data = bytearray(p.read_bytes())
    data[HEADER_SIZE + chunk * 540 + 20] ^= 0x10
    p.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as exc:
        decrypt_file(p, tmp_path / "out", StaticKeyring([key]))
    assert exc.value.where == f"chunk {chunk}" and str(p) in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_swapped_reordered_and_foreign_chunks(sample: tuple[Path, KeyVersion, bytes]) -> None:
    p, key, plain = sample
    data = p.read_bytes()
    chunks = [data[HEADER_SIZE + i * 540:HEADER_SIZE + (i + 1) * 540] for i in range(5)]
    swapped = data[:HEADER_SIZE] + chunks[1] + chunks[0] + b"".join(chunks[2:])
    with pytest.raises(IntegrityError, match="chunk 0"):
        native_read(swapped, key)
    rotated = data[:HEADER_SIZE] + b"".join(chunks[1:4]) + chunks[0] + chunks[4]
    with pytest.raises(IntegrityError, match="chunk 0"):
        native_read(rotated, key)
    other = native_write(plain, key, 512)  # same key, same data, another file id
    foreign = data[:HEADER_SIZE + 540] + other[HEADER_SIZE + 540:HEADER_SIZE + 1080] + data[HEADER_SIZE + 1080:]
    with pytest.raises(IntegrityError, match="chunk 1"):
        native_read(foreign, key)


@pytest.mark.parametrize("cut", ["boundary", "mid-chunk", "to-header", "one-byte", "appended-28", "appended-chunk"])
def test_truncated_or_extended_files(sample: tuple[Path, KeyVersion, bytes], cut: str, tmp_path: Path) -> None:
    p, key, _ = sample
    data = p.read_bytes()
    bad = {"boundary": data[:HEADER_SIZE + 3 * 540], "mid-chunk": data[:-50], "to-header": data[:HEADER_SIZE],
           "one-byte": data[:-1], "appended-28": data + bytes(28),
           "appended-chunk": data + data[HEADER_SIZE:HEADER_SIZE + 540]}[cut]
    p.write_bytes(bad)
    with pytest.raises(IntegrityError):
        decrypt_file(p, tmp_path / "out", StaticKeyring([key]))
    assert not (tmp_path / "out").exists()


def test_open_run_zeroes_its_output_on_failure(sample: tuple[Path, KeyVersion, bytes]) -> None:
    p, key, _ = sample
    data = bytearray(p.read_bytes())
    data[-5] ^= 1  # the final chunk's tag
    out = bytearray(b"\xaa" * (512 * 4 + 100))
    with nat.NativeKey(key) as nk, nat.NativeFile.open(bytes(data[:HEADER_SIZE]), nk) as nf, \
            pytest.raises(IntegrityError, match="chunk 4"):
        nf.open_run(0, data[HEADER_SIZE:], out, final_index=4)
    assert out == bytes(len(out))


# --- sizes ----------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [512, 4096])
def test_sizes_agree_with_the_reference(chunk: int) -> None:
    for size in [*range(0, 3 * chunk + 3), 10**12, 2**62]:
        stored = nat.stored_size(size, chunk)
        assert stored == stored_size(size, chunk)
        assert nat.plaintext_size(stored, chunk) == plaintext_size(stored, chunk) == size
        assert nat.chunk_offset(nat.chunk_count(size, chunk) - 1, chunk) < stored
    valid = {stored_size(s, chunk) for s in range(0, 3 * chunk + 3)}
    for length in range(0, HEADER_SIZE + 3 * (chunk + 28) + 3):
        if length in valid:
            assert nat.plaintext_size(length, chunk) == plaintext_size(length, chunk)
        else:  # cut inside the header or a chunk, an empty final chunk after others, ...
            with pytest.raises(ValueError):
                nat.plaintext_size(length, chunk)
    for bad in (lambda: nat.stored_size(2**63, chunk), lambda: nat.stored_size(2**63 - 100, chunk),
                lambda: nat.chunk_offset(2**60, chunk), lambda: nat.plaintext_size(2**64 - 1, chunk),
                lambda: nat.plaintext_size(1000, 1000)):
        with pytest.raises(ValueError):
            bad()


# --- the library's own guarantees, from Python -----------------------------------------
def test_threads_share_one_file() -> None:
    key = new_key()
    plain = [os.urandom(64 * 4096 + 1 + i) for i in range(8)]
    errors: list[BaseException] = []
    with nat.NativeKey(key) as nk, nat.NativeFile.create(nk, chunk_size=4096) as nf:
        def work(data: bytes) -> None:
            try:
                for _ in range(10):
                    out = bytearray(nat.run_stored_len(len(data), 4096))
                    n = nf.seal_run(0, data, out, final_index=64)
                    back = bytearray(len(data))
                    assert nf.open_run(0, memoryview(out)[:n], back, final_index=64) == len(data)
                    assert back == data
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(p,)) for p in plain]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert nf.chunks_sealed == 8 * 10 * 65


def test_caller_mistakes_are_value_errors() -> None:
    with nat.NativeKey(new_key()) as nk:
        with pytest.raises(ValueError):
            nat.NativeFile.create(nk, chunk_size=1000)
        with nat.NativeFile.create(nk, chunk_size=512) as nf:
            out = bytearray(10_000)
            with pytest.raises(ValueError):  # a short chunk that is not the final one
                nf.seal_run(0, b"x" * 600, out, final_index=None)
            with pytest.raises(ValueError):  # out too small
                nf.seal_run(0, b"x" * 600, bytearray(100), final_index=1)
        with pytest.raises(ValueError):
            nf.seal_run(0, b"", out, final_index=0)  # closed


def test_the_loader_refuses_clearly(tmp_path: Path) -> None:
    """Another architecture, not a library, missing: NativeUnavailable saying why."""
    foreign = tmp_path / "libsrcf.so"
    data = bytearray(nat.LIBRARY.read_bytes())
    data[18:20] = (183).to_bytes(2, "little")  # e_machine: aarch64
    foreign.write_bytes(bytes(data))
    with pytest.raises(nat.NativeUnavailable, match="built for aarch64"):
        nat.load(foreign)
    foreign.write_bytes(b"#!/bin/sh\n")
    with pytest.raises(nat.NativeUnavailable, match="not ELF"):
        nat.load(foreign)
    with pytest.raises(nat.NativeUnavailable, match="is missing"):
        nat.load(tmp_path / "nothing.so")
    with mock.patch.object(nat.platform, "libc_ver", return_value=("", "")), \
            pytest.raises(nat.NativeUnavailable, match="glibc"):
        nat.load(nat.LIBRARY)


def test_without_the_library_the_cli_paths_use_the_reference(tmp_path: Path) -> None:
    key = new_key()
    plain = os.urandom(70_000)
    p = tmp_path / "f"
    p.write_bytes(plain)
    with python_engine():
        encrypt_file(p, p, key)
        decrypt_file(p, tmp_path / "out", StaticKeyring([key]))
    assert (tmp_path / "out").read_bytes() == plain


def test_status_names_the_engine() -> None:
    assert nat.describe() == f"native ({nat.LIBRARY})"


# --- the C side: tests under sanitizers, the fuzz target, the benchmark ---------------------
def make(*targets: str, timeout: int = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return parallel.make(DATAPLANE, *targets, timeout=timeout, env={**os.environ, **env})


def test_c_tests_under_asan_and_ubsan() -> None:
    r = make("check-asan")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith(" 0 failed")


@pytest.mark.skipif(shutil.which("clang") is None, reason="no clang (libFuzzer); scripts/test installs it")
def test_fuzz_target_over_the_committed_corpus() -> None:
    corpus = DATAPLANE / "fuzz" / "corpus"
    assert len(list(corpus.iterdir())) >= 20
    r = make("fuzz-run", FUZZ_RUNS="20000", FUZZ_SECONDS="10", timeout=180)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "Done" in r.stderr and "ERROR" not in r.stderr


def test_the_benchmark_program_runs() -> None:
    r = make("bench")
    assert r.returncode == 0, r.stdout + r.stderr
    run = subprocess.run([str(DATAPLANE / "build" / "bench_srcf"), "--total", "1", "--repeats", "1"],
                         capture_output=True, text=True, timeout=30, check=False)
    assert run.returncode == 0, run.stderr
    assert "| 4 KiB | encrypt |" in run.stdout and "| 64 KiB | decrypt |" in run.stdout
