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
        out += AESGCM(file_key).decrypt(piece[:12], piece[12:], aad)
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
