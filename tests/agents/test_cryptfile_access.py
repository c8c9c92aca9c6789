"""Random access against a plain model, and the whole-file transforms."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agents.cryptfile import (
    EncryptedFile,
    IntegrityError,
    KeyVersion,
    StaticKeyring,
    decrypt_file,
    encrypt_file,
    read_header,
    rekey_file,
    rewrap_file,
)
from agents.cryptfile.transform import TMP_PREFIX

CHUNK = 512


class RandomAccess(RuleBasedStateMachine):
    """Writes at any offset, truncates, reads and reopens; every read and size must
    match a bytearray doing the same."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = tempfile.mkdtemp()
        self.path = os.path.join(self.dir, "f")
        self.key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
        self.f = EncryptedFile.create(self.path, self.key, chunk_size=CHUNK)
        self.model = bytearray()

    @rule(offset=st.integers(0, 6 * CHUNK), data=st.binary(max_size=3 * CHUNK))
    def write(self, offset: int, data: bytes) -> None:
        self.f.write(offset, data)
        if data:
            if offset > len(self.model):
                self.model += bytes(offset - len(self.model))
            self.model[offset:offset + len(data)] = data

    @rule(size=st.integers(0, 7 * CHUNK))
    def truncate(self, size: int) -> None:
        self.f.truncate(size)
        if size < len(self.model):
            del self.model[size:]
        else:
            self.model += bytes(size - len(self.model))

    @rule(offset=st.integers(0, 7 * CHUNK), size=st.integers(0, 3 * CHUNK))
    def read(self, offset: int, size: int) -> None:
        assert self.f.read(offset, size) == bytes(self.model[offset:offset + size])

    @rule(offset=st.integers(0, 7 * CHUNK), size=st.integers(0, 3 * CHUNK))
    def read_into(self, offset: int, size: int) -> None:
        buf = bytearray(b"\xaa" * size)  # what lies beyond the count must stay untouched
        n = self.f.read_into(offset, memoryview(buf))
        expected = bytes(self.model[offset:offset + size])
        assert (n, bytes(buf[:n]), bytes(buf[n:])) == (len(expected), expected, b"\xaa" * (size - n))

    @precondition(lambda self: True)
    @rule()
    def reopen(self) -> None:
        self.f.fsync()
        self.f.close()
        self.f = EncryptedFile.open(self.path, StaticKeyring([self.key]), writable=True)

    @invariant()
    def same_size_and_valid(self) -> None:
        assert self.f.size == len(self.model)
        self.f.verify()

    def teardown(self) -> None:
        self.f.close()
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


RandomAccess.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
test_random_access_matches_a_plain_file = RandomAccess.TestCase


@pytest.fixture
def key() -> KeyVersion:
    return KeyVersion(uuid.uuid4(), 1, os.urandom(32))


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5, 1 << 20])
def test_encrypt_decrypt_roundtrip(tmp_path: Path, key: KeyVersion, size: int) -> None:
    src, enc, out = tmp_path / "src", tmp_path / "enc", tmp_path / "out"
    data = os.urandom(size)
    src.write_bytes(data)
    os.chmod(src, 0o640)
    seen: list[int] = []
    encrypt_file(src, enc, key, progress=seen.append)
    assert sum(seen) == size
    if size >= 32:  # shorter plaintexts occur in random bytes by chance
        assert data not in enc.read_bytes()
    assert stat.S_IMODE(enc.stat().st_mode) == 0o640
    decrypt_file(enc, out, StaticKeyring([key]))
    assert out.read_bytes() == data


def test_in_place_protect_and_unprotect(tmp_path: Path, key: KeyVersion) -> None:
    p = tmp_path / "db.dat"
    data = os.urandom(10_000)
    p.write_bytes(data)
    encrypt_file(p, p, key)
    assert read_header(str(p)).key_version == 1
    decrypt_file(p, p, StaticKeyring([key]))
    assert p.read_bytes() == data
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(TMP_PREFIX)]


def test_rewrap_changes_only_the_header(tmp_path: Path, key: KeyVersion) -> None:
    p = tmp_path / "f"
    p.write_bytes(os.urandom(9000))
    plain = p.read_bytes()
    encrypt_file(p, p, key)
    before = p.read_bytes()
    v2 = KeyVersion(key.key_id, 2, os.urandom(32))
    ring = StaticKeyring([key, v2])
    assert rewrap_file(p, ring, v2) is True
    after = p.read_bytes()
    assert after[128:] == before[128:] and after[:128] != before[:128]
    assert read_header(str(p)).key_version == 2
    assert rewrap_file(p, ring, v2) is False  # already there: nothing to do
    with EncryptedFile.open(str(p), StaticKeyring([v2])) as f:
        assert f.read(0, f.size) == plain
    with pytest.raises(ValueError, match="belongs to key"):
        rewrap_file(p, ring, KeyVersion(uuid.uuid4(), 1, os.urandom(32)))


def test_rekey_reencrypts_everything(tmp_path: Path, key: KeyVersion) -> None:
    p = tmp_path / "f"
    p.write_bytes(os.urandom(9000))
    plain = p.read_bytes()
    encrypt_file(p, p, key)
    before = p.read_bytes()
    v2 = KeyVersion(key.key_id, 2, os.urandom(32))
    rekey_file(p, StaticKeyring([key, v2]), v2)
    after = p.read_bytes()
    assert after[12:28] != before[12:28]  # a new file id (and file key)
    windows = range(128, 9000, 512)
    assert not {before[i:i + 64] for i in windows} & {after[i:i + 64] for i in windows}
    with EncryptedFile.open(str(p), StaticKeyring([v2])) as f:
        assert f.read(0, f.size) == plain


@pytest.mark.parametrize("operation", ["encrypt", "decrypt", "rewrap", "rekey"])
def test_interrupted_transform_leaves_the_original_readable(tmp_path: Path, key: KeyVersion, operation: str) -> None:
    p = tmp_path / "f"
    data = os.urandom(3 << 20)
    p.write_bytes(data)
    v2 = KeyVersion(key.key_id, 2, os.urandom(32))
    ring = StaticKeyring([key, v2])
    if operation != "encrypt":
        encrypt_file(p, p, key)
    original = p.read_bytes()

    def boom(_: int) -> None:
        raise KeyboardInterrupt  # Ctrl-C half way through

    with pytest.raises(KeyboardInterrupt):
        {"encrypt": lambda: encrypt_file(p, p, key, progress=boom),
         "decrypt": lambda: decrypt_file(p, p, ring, progress=boom),
         "rewrap": lambda: rewrap_file(p, ring, v2, progress=boom),
         "rekey": lambda: rekey_file(p, ring, v2, progress=boom)}[operation]()
    assert p.read_bytes() == original
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f"]


def test_decrypt_refuses_a_tampered_file_before_replacing_anything(tmp_path: Path, key: KeyVersion) -> None:
    p, out = tmp_path / "f", tmp_path / "out"
    p.write_bytes(os.urandom(5000))
    encrypt_file(p, p, key)
    data = bytearray(p.read_bytes())
    data[-5] ^= 1
    p.write_bytes(bytes(data))
    out.write_bytes(b"previous contents")
    with pytest.raises(IntegrityError):
        decrypt_file(p, out, StaticKeyring([key]))
    assert out.read_bytes() == b"previous contents"


def test_read_only_handles_refuse_writes(tmp_path: Path, key: KeyVersion) -> None:
    p = tmp_path / "f"
    EncryptedFile.create(str(p), key).close()
    with EncryptedFile.open(str(p), StaticKeyring([key])) as f, pytest.raises(PermissionError):
        f.write(0, b"x")
    with pytest.raises(FileExistsError):
        EncryptedFile.create(str(p), key)


def test_a_write_touches_only_the_chunks_it_covers(tmp_path: Path, key: KeyVersion) -> None:
    p = tmp_path / "f"
    with EncryptedFile.create(str(p), key, chunk_size=4096) as f:
        f.write(0, os.urandom(64 * 4096))
    before = p.read_bytes()
    with EncryptedFile.open(str(p), StaticKeyring([key]), writable=True) as f:
        f.write(10 * 4096 + 100, b"x" * 5000)  # chunks 10 and 11 only
    after = p.read_bytes()
    stored = 4096 + 28
    changed = {i for i in range(64) if before[128 + i * stored:128 + (i + 1) * stored]
               != after[128 + i * stored:128 + (i + 1) * stored]}
    assert changed == {10, 11}
    assert after[:128] == before[:128]


@pytest.mark.parametrize("size", [0, 1, CHUNK, 3 * CHUNK + 7, 700 * CHUNK + 1])
def test_rekey_while_open_keeps_the_handle_working(tmp_path: Path, key: KeyVersion, size: int) -> None:
    """Online re-key: the open object continues on the re-encrypted file (new file key,
    new file id), and what was written before and after is all there."""
    p = str(tmp_path / "f")
    data = os.urandom(size)
    v2 = KeyVersion(key.key_id, 2, os.urandom(32))
    with EncryptedFile.create(p, key, chunk_size=CHUNK) as f:
        f.write(0, data)
        old_id, old_ino = f.header.file_id, os.stat(p).st_ino
        seen: list[int] = []
        f.rekey(v2, on_replaced=lambda st: seen.append(st.st_ino))
        assert f.header.file_id != old_id and f.header.key_version == 2
        assert seen == [os.stat(p).st_ino] and seen[0] != old_ino
        assert f.read(0, size + 10) == data
        f.write(size, b"tail")
    with EncryptedFile.open(p, StaticKeyring([v2])) as g:
        assert g.read(0, g.size) == data + b"tail"
        g.verify()
    with pytest.raises(IntegrityError):  # the old version no longer opens it
        EncryptedFile.open(p, StaticKeyring([KeyVersion(key.key_id, 2, key.material)]))
    assert not [n for n in os.listdir(tmp_path) if n.startswith(TMP_PREFIX)]


def _torn(tmp_path: Path, key: KeyVersion, size: int) -> tuple[str, bytes, EncryptedFile]:
    p = str(tmp_path / "torn")
    data = os.urandom(size)
    f = EncryptedFile.create(p, key, chunk_size=CHUNK)
    f.write(0, data)
    return p, data, f


def test_repair_of_an_extension_cut_by_a_crash(tmp_path: Path, key: KeyVersion) -> None:
    """The old final chunk re-sealed as not final and part of the new chunks written,
    then the writer died: the authentic prefix is kept, sealed as final."""
    from agents.cryptfile.chunks import ChunkCipher
    from agents.cryptfile.file import repair_torn_tail
    from agents.cryptfile.header import HEADER_SIZE

    p, data, f = _torn(tmp_path, key, 3 * CHUNK + 100)
    assert repair_torn_tail(p, StaticKeyring([key])) is None  # intact: untouched
    ring = StaticKeyring([key])
    file_key = f.header.unwrap(key)
    assert file_key is not None
    cipher = ChunkCipher(file_key, f.header.file_id)
    grown = data + os.urandom(2 * CHUNK)
    stored = CHUNK + 28
    with open(p, "r+b") as raw:  # chunk 3 grows to full and loses "last"; chunk 4 half written
        raw.seek(HEADER_SIZE + 3 * stored)
        raw.write(cipher.seal(3, grown[3 * CHUNK:4 * CHUNK], last=False))
        raw.write(cipher.seal(4, grown[4 * CHUNK:5 * CHUNK], last=False)[:100])
    f.close()
    with pytest.raises(IntegrityError):
        EncryptedFile.open(p, ring).verify()
    assert repair_torn_tail(p, ring) == 4 * CHUNK
    with EncryptedFile.open(p, ring) as g:
        g.verify()
        assert g.read(0, g.size) == grown[:4 * CHUNK]


def test_repair_of_a_cut_sealed_but_not_applied(tmp_path: Path, key: KeyVersion) -> None:
    """A truncation is: cut whole chunks, seal the new final chunk, cut to the exact end.
    Stopped before the last step, the new final chunk is found and the rest cut."""
    from agents.cryptfile.chunks import ChunkCipher
    from agents.cryptfile.file import repair_torn_tail
    from agents.cryptfile.header import HEADER_SIZE

    p, data, f = _torn(tmp_path, key, 5 * CHUNK)
    file_key = f.header.unwrap(key)
    assert file_key is not None
    cipher = ChunkCipher(file_key, f.header.file_id)
    with open(p, "r+b") as raw:  # a cut to 2 chunks + 10 bytes, stopped after its second step
        raw.truncate(HEADER_SIZE + 3 * (CHUNK + 28))
        raw.seek(HEADER_SIZE + 2 * (CHUNK + 28))
        raw.write(cipher.seal(2, data[2 * CHUNK:2 * CHUNK + 10], last=True))
    f.close()
    ring = StaticKeyring([key])
    assert repair_torn_tail(p, ring) == 2 * CHUNK + 10
    with EncryptedFile.open(p, ring) as g:
        g.verify()
        assert g.read(0, g.size) == data[:2 * CHUNK + 10]


@pytest.mark.parametrize("stage", ["old-final-resealed", "after-the-hole-half-written"])
def test_repair_of_an_extension_past_a_hole_cut_by_a_crash(tmp_path: Path, key: KeyVersion, stage: str) -> None:
    """An extension that leaves a hole writes the old final chunk (re-sealed full, not
    final) first, then the chunks after the hole. Killed after the first step, or half
    way through the second, the file is repaired like any torn tail: the holes before the
    tear are kept (they read as zeros), the last kept chunk is sealed as final."""
    from agents.cryptfile.chunks import ChunkCipher
    from agents.cryptfile.file import repair_torn_tail
    from agents.cryptfile.header import HEADER_SIZE

    p, data, f = _torn(tmp_path, key, 2 * CHUNK + 100)
    file_key = f.header.unwrap(key)
    assert file_key is not None
    cipher = ChunkCipher(file_key, f.header.file_id)
    stored = CHUNK + 28
    grown = data + bytes(3 * CHUNK - len(data))
    with open(p, "r+b") as raw:  # chunk 2 re-sealed full, not final: the first step
        raw.seek(HEADER_SIZE + 2 * stored)
        raw.write(cipher.seal(2, grown[2 * CHUNK:], last=False))
        if stage == "after-the-hole-half-written":  # chunks 3..5 a hole, chunk 6 half written
            raw.seek(HEADER_SIZE + 6 * stored)
            raw.write(cipher.seal(6, os.urandom(CHUNK), last=False)[:300])
    f.close()
    ring = StaticKeyring([key])
    with pytest.raises(IntegrityError):
        EncryptedFile.open(p, ring).verify()
    expected = grown if stage == "old-final-resealed" else grown + bytes(3 * CHUNK)
    assert repair_torn_tail(p, ring) == len(expected)
    assert repair_torn_tail(p, ring) is None
    with EncryptedFile.open(p, ring) as g:
        g.verify()
        assert g.read(0, g.size) == expected


def test_a_truncate_up_past_a_hole_survives_reopening_and_repair_finds_it_intact(tmp_path: Path,
                                                                                key: KeyVersion) -> None:
    from agents.cryptfile.file import repair_torn_tail

    p, data, f = _torn(tmp_path, key, CHUNK + 1)
    f.truncate(50 * CHUNK + 3)
    f.write(20 * CHUNK, b"in the hole")
    f.close()
    ring = StaticKeyring([key])
    assert repair_torn_tail(p, ring) is None
    expected = bytearray(data + bytes(50 * CHUNK + 3 - len(data)))
    expected[20 * CHUNK:20 * CHUNK + 11] = b"in the hole"
    with EncryptedFile.open(p, ring, writable=True) as g:
        g.verify()
        assert g.read(0, g.size) == expected
        g.truncate(30 * CHUNK + 5)  # a cut into the hole: its new final chunk is sealed zeros
        g.verify()
        assert g.read(0, g.size) == expected[:30 * CHUNK + 5]


def test_a_read_into_the_callers_buffer_leaves_no_plaintext_when_a_chunk_fails(tmp_path: Path,
                                                                              key: KeyVersion) -> None:
    """The mount decrypts straight into the kernel's reply buffer: when any chunk of the
    run fails, the error is raised and not one byte of the chunks before it remains."""
    path = str(tmp_path / "f")
    data = os.urandom(10 * 4096)
    with EncryptedFile.create(path, key, chunk_size=4096) as f:
        f.write(0, data)
    raw = bytearray(Path(path).read_bytes())
    raw[128 + 6 * (4096 + 28) + 100] ^= 1  # inside chunk 6
    Path(path).write_bytes(bytes(raw))
    with EncryptedFile.open(path, StaticKeyring([key])) as f:
        buf = bytearray(10 * 4096)
        with pytest.raises(IntegrityError, match="chunk 6"):
            f.read_into(0, memoryview(buf))
        assert buf == bytes(len(buf))
        out = bytearray(3 * 4096)
        assert f.read_into(4096 + 7, memoryview(out)) == len(out)  # chunks 1-4: unaligned, intact
        assert out == data[4096 + 7:4 * 4096 + 7]
