"""File format v1: known answers, golden files, an independent decryptor, tampering."""

from __future__ import annotations

import json
import os
import struct
import uuid
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agents.cryptfile import (
    EncryptedFile,
    FormatError,
    IntegrityError,
    KeyUnavailable,
    KeyVersion,
    StaticKeyring,
    encrypt_file,
    plaintext_size,
    stored_size,
)
from tests.agents import golden, vectors

GOLDEN = Path(golden.__file__).parent


# --- primitives --------------------------------------------------------------------
@pytest.mark.parametrize("case", vectors.load("aes_gcm_256.rsp"), ids=lambda c: str(c["name"]))
def test_aes_gcm_known_answers(case: dict[str, bytes]) -> None:
    aead = AESGCM(case["Key"])
    sealed = aead.encrypt(case["IV"], case["PT"], case["AAD"] or None)
    assert sealed == case["CT"] + case["Tag"]
    assert aead.decrypt(case["IV"], sealed, case["AAD"] or None) == case["PT"]
    # A FAIL vector: any altered tag must be rejected.
    bad = bytearray(sealed)
    bad[-1] ^= 1
    with pytest.raises(InvalidTag):
        aead.decrypt(case["IV"], bytes(bad), case["AAD"] or None)


# --- golden files ------------------------------------------------------------------
def golden_keyring(version_dir: Path) -> StaticKeyring:
    k = json.loads((version_dir / "keys.json").read_text())
    return StaticKeyring([KeyVersion(uuid.UUID(k["key_id"]), k["key_version"], bytes.fromhex(k["key_material_hex"]))])


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("v*/*.srcf")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_released_golden_file_still_decrypts(path: Path) -> None:
    expected = path.with_suffix(".plain").read_bytes()
    with EncryptedFile.open(str(path), golden_keyring(path.parent)) as f:
        assert f.size == len(expected)
        assert f.read(0, f.size + 10) == expected
        f.verify()


@pytest.mark.parametrize("name", sorted(golden.CASES))
def test_v1_writer_reproduces_its_golden_files(name: str) -> None:
    assert golden.build(name) == (GOLDEN / "v1" / f"{name}.srcf").read_bytes()


def independent_decrypt(data: bytes, key_material: bytes) -> bytes:
    """Written from docs/FORMAT.md alone, sharing no code with agents.cryptfile."""
    assert data[:4] == b"SRCF" and struct.unpack(">H", data[4:6])[0] == 1
    header_len, chunk = struct.unpack(">HI", data[6:12])
    file_id = data[12:28]
    prefix, wrapped = data[:68], data[68:128]
    file_key = AESGCM(key_material).decrypt(wrapped[:12], wrapped[12:], prefix)
    body, stored, out = data[header_len:], chunk + 28, b""
    count = (len(body) - 28) // stored + 1
    for i in range(count):
        piece = body[i * stored:(i + 1) * stored]
        aad = file_id + struct.pack(">QB", i, 1 if i == count - 1 else 0)
        try:
            out += AESGCM(file_key).decrypt(piece[:12], piece[12:], aad)
        except InvalidTag:  # "Sparse regions": a whole, all-zero, non-final chunk is a hole
            if i == count - 1 or piece != bytes(stored):
                raise
            out += bytes(chunk)
    return out


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("v1/*.srcf")), ids=lambda p: p.name)
def test_an_independent_decryptor_reads_v1(path: Path) -> None:
    k = json.loads((path.parent / "keys.json").read_text())
    assert independent_decrypt(path.read_bytes(), bytes.fromhex(k["key_material_hex"])) == \
        path.with_suffix(".plain").read_bytes()


# --- sizes -------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [512, 4096])
def test_sizes_follow_from_the_file_length(chunk: int) -> None:
    for size in [0, 1, chunk - 1, chunk, chunk + 1, 3 * chunk, 3 * chunk + 7]:
        assert plaintext_size(stored_size(size, chunk), chunk) == size
    with pytest.raises(ValueError):
        plaintext_size(128 + 27, chunk)


# --- faults ------------------------------------------------------------------------
@pytest.fixture
def key() -> KeyVersion:
    return KeyVersion(uuid.uuid4(), 1, os.urandom(32))


@pytest.fixture
def sample(tmp_path: Path, key: KeyVersion) -> Path:
    src = tmp_path / "plain"
    src.write_bytes(os.urandom(512 * 4 + 100))
    dst = tmp_path / "enc"
    encrypt_file(src, dst, key, chunk_size=512)
    return dst


def read_all(path: Path, key: KeyVersion) -> bytes:
    with EncryptedFile.open(str(path), StaticKeyring([key])) as f:
        return f.read(0, f.size)


def mutate(path: Path, offset: int, xor: int = 1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= xor
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("offset,error,where", [
    (0, FormatError, None), (5, FormatError, None), (7, FormatError, None), (10, FormatError, None),
    (48, FormatError, None), (55, FormatError, None),
    (14, IntegrityError, "header"),  # file id
    (30, KeyUnavailable, None),      # key id: now names a key we do not have
    (70, IntegrityError, "header"), (100, IntegrityError, "header"), (127, IntegrityError, "header"),
])
def test_tampered_header(sample: Path, key: KeyVersion, offset: int, error: type[Exception], where: str | None) -> None:
    mutate(sample, offset)
    with pytest.raises(error) as exc:
        read_all(sample, key)
    if where:
        assert exc.value.where == where and exc.value.path == str(sample)  # type: ignore[attr-defined]


def test_key_version_changed_in_header_is_caught(sample: Path, key: KeyVersion) -> None:
    mutate(sample, 47, 1 ^ 3)  # claim version 3, which we hold with the same material
    other = KeyVersion(key.key_id, 3, key.material)
    with pytest.raises(IntegrityError), EncryptedFile.open(str(sample), StaticKeyring([key, other])) as f:
        f.read(0, 1)


@pytest.mark.parametrize("chunk", [0, 2, 4])
def test_tampered_chunk_names_the_chunk(sample: Path, key: KeyVersion, chunk: int) -> None:
    mutate(sample, 128 + chunk * 540 + 20)
    with pytest.raises(IntegrityError) as exc:
        read_all(sample, key)
    assert exc.value.where == f"chunk {chunk}"
    assert str(sample) in str(exc.value)


def test_swapped_chunks(sample: Path, key: KeyVersion) -> None:
    data = bytearray(sample.read_bytes())
    a, b = data[128:128 + 540], data[128 + 540:128 + 1080]
    data[128:128 + 540], data[128 + 540:128 + 1080] = b, a
    sample.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="chunk 0"):
        read_all(sample, key)


def test_chunk_from_another_file(tmp_path: Path, sample: Path, key: KeyVersion) -> None:
    other = tmp_path / "other"
    encrypt_file(sample.with_name("plain"), other, key, chunk_size=512)  # same key, same data
    data, foreign = bytearray(sample.read_bytes()), other.read_bytes()
    data[128 + 540:128 + 1080] = foreign[128 + 540:128 + 1080]
    sample.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="chunk 1"):
        read_all(sample, key)


@pytest.mark.parametrize("cut", ["boundary", "mid-chunk", "to-header"])
def test_truncation_is_detected(sample: Path, key: KeyVersion, cut: str) -> None:
    size = sample.stat().st_size
    new = {"boundary": 128 + 3 * 540, "mid-chunk": size - 50, "to-header": 128}[cut]
    os.truncate(sample, new)
    with pytest.raises(IntegrityError):
        read_all(sample, key)


def test_appended_copy_of_a_chunk(sample: Path, key: KeyVersion) -> None:
    data = sample.read_bytes()
    sample.write_bytes(data + data[128:128 + 540])
    with pytest.raises(IntegrityError):
        read_all(sample, key)


def test_wrong_or_missing_key(sample: Path, key: KeyVersion) -> None:
    with pytest.raises(KeyUnavailable, match="version 1"), EncryptedFile.open(str(sample), StaticKeyring([])):
        pass
    impostor = KeyVersion(key.key_id, key.version, os.urandom(32))
    with pytest.raises(IntegrityError, match="header"):
        read_all(sample, impostor)


def test_not_our_file(tmp_path: Path, key: KeyVersion) -> None:
    p = tmp_path / "x"
    p.write_bytes(b"just some text, not encrypted at all" * 10)
    with pytest.raises(FormatError, match="bad magic"):
        read_all(p, key)
    p.write_bytes(b"")
    with pytest.raises(FormatError):
        read_all(p, key)


# --- sparse regions (holes) --------------------------------------------------------
def stored_chunk(data: bytes, index: int, chunk: int) -> bytes:
    return data[128 + index * (chunk + 28):128 + (index + 1) * (chunk + 28)]


def test_truncating_up_leaves_holes_that_read_as_zeros(tmp_path: Path, key: KeyVersion) -> None:
    """The old final chunk is re-sealed full and not final, the whole chunks in between
    are zeros on disk, the new final chunk is sealed; every reader sees zeros."""
    p = tmp_path / "f"
    head = os.urandom(1000)
    with EncryptedFile.create(str(p), key, chunk_size=512) as f:
        f.write(0, head)  # chunks 0 and 1 (488 bytes, final)
        f.truncate(20 * 512 + 7)
        assert f.size == 20 * 512 + 7
    data = p.read_bytes()
    assert len(data) == stored_size(20 * 512 + 7, 512)
    assert all(stored_chunk(data, i, 512) == bytes(540) for i in range(2, 20))  # holes
    assert stored_chunk(data, 1, 512) != bytes(540)  # the old final chunk, re-sealed full
    assert data[128 + 20 * 540:] != bytes(35)  # the new final chunk, sealed
    expected = head + bytes(20 * 512 + 7 - 1000)
    assert read_all(p, key) == expected
    with EncryptedFile.open(str(p), StaticKeyring([key])) as f:
        f.verify()
        assert f.read(5 * 512 + 3, 700) == bytes(700)
    assert independent_decrypt(data, key.material) == expected


def test_writing_past_the_end_leaves_holes_and_writes_into_them_seal(tmp_path: Path, key: KeyVersion) -> None:
    p = tmp_path / "f"
    a, b, c = os.urandom(100), os.urandom(600), bytes(512)
    with EncryptedFile.create(str(p), key, chunk_size=512) as f:
        f.write(0, a)
        f.write(10 * 512 + 3, b)  # chunks 1..9 are holes, data in chunks 10 and 11
        data = p.read_bytes()
        assert [i for i in range(12) if stored_chunk(data, i, 512) == bytes(540)] == list(range(1, 10))
        f.write(4 * 512, c)  # zeros written into a hole: encrypted zeros, never a hole
        f.write(6 * 512 + 5, b"x")  # a partial write into a hole seals its chunk
    data = p.read_bytes()
    assert [i for i in range(12) if stored_chunk(data, i, 512) == bytes(540)] == [1, 2, 3, 5, 7, 8, 9]
    model = bytearray(a + bytes(10 * 512 + 3 - 100) + b)
    model[6 * 512 + 5] = ord("x")
    assert read_all(p, key) == model
    assert independent_decrypt(data, key.material) == model


def test_a_large_hole_costs_no_space(tmp_path: Path, key: KeyVersion) -> None:
    p = tmp_path / "f"
    size = 1 << 30
    with EncryptedFile.create(str(p), key) as f:
        f.write(0, b"start")
        f.truncate(size)
        f.write(size // 2, b"middle")
        f.fsync()
    st = p.stat()
    assert st.st_size == stored_size(size, 4096)
    assert st.st_blocks * 512 < 1 << 20
    with EncryptedFile.open(str(p), StaticKeyring([key])) as f:
        assert f.size == size
        assert f.read(0, 8192) == b"start" + bytes(8192 - 5)
        assert f.read(size // 2 - 10, 16) == bytes(10) + b"middle"
        assert f.read(size // 4, 1 << 20) == bytes(1 << 20)
        assert f.read(size - 5000, 10000) == bytes(5000)


def test_a_whole_zeroed_non_final_chunk_reads_as_zeros(sample: Path, key: KeyVersion) -> None:
    """The trade-off FORMAT.md states: a non-final chunk replaced by zeros is a hole."""
    plain = read_all(sample, key)
    data = bytearray(sample.read_bytes())
    data[128 + 2 * 540:128 + 3 * 540] = bytes(540)
    sample.write_bytes(bytes(data))
    assert read_all(sample, key) == plain[:1024] + bytes(512) + plain[1536:]
    with EncryptedFile.open(str(sample), StaticKeyring([key])) as f:
        f.verify()


@pytest.mark.parametrize("full", [False, True])
def test_a_zeroed_final_chunk_is_an_integrity_error(tmp_path: Path, key: KeyVersion, full: bool) -> None:
    p = tmp_path / "f"
    with EncryptedFile.create(str(p), key, chunk_size=512) as f:
        f.write(0, os.urandom(4 * 512 if full else 4 * 512 + 100))
    data = bytearray(p.read_bytes())
    data[128 + 3 * 540 if full else 128 + 4 * 540:] = bytes(len(data) - (128 + (3 if full else 4) * 540))
    p.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as exc:
        read_all(p, key)
    assert exc.value.where == f"chunk {3 if full else 4}"
    with EncryptedFile.open(str(p), StaticKeyring([key])) as f, pytest.raises(IntegrityError):
        f.verify()


@pytest.mark.parametrize("lo,hi", [(0, 270), (270, 540), (12, 540), (0, 539), (1, 540)])
def test_a_partly_zeroed_chunk_is_an_integrity_error(sample: Path, key: KeyVersion, lo: int, hi: int) -> None:
    data = bytearray(sample.read_bytes())
    data[128 + 2 * 540 + lo:128 + 2 * 540 + hi] = bytes(hi - lo)
    sample.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as exc:
        read_all(sample, key)
    assert exc.value.where == "chunk 2"
    with EncryptedFile.open(str(sample), StaticKeyring([key])) as f:
        with pytest.raises(IntegrityError, match="chunk 2"):
            f.verify()
        with pytest.raises(IntegrityError, match="chunk 2"):
            f.read(2 * 512 + 10, 5)  # an unaligned read too


def test_a_zero_filled_extension_is_no_valid_file(sample: Path, key: KeyVersion) -> None:
    """Zeros appended after the final chunk (one whole stored chunk of them): the real
    final chunk is then out of place and the zeros cannot be a final chunk."""
    data = sample.read_bytes()
    sample.write_bytes(data[:128 + 4 * 540] + bytes(540) + bytes(540))
    with pytest.raises(IntegrityError, match="chunk 5"):
        read_all(sample, key)
