"""Golden files of the encrypted file format, one folder per released version.

Every released version's files stay here for ever: the reader must keep opening them.
`python -m tests.agents.golden` rewrites the current version's files from fixed inputs
(only when the format itself changes, which means a new version folder)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from agents.cryptfile.chunks import ChunkCipher
from agents.cryptfile.header import seal_header
from agents.cryptfile.keys import KeyVersion

HERE = Path(__file__).parent
KEY = KeyVersion(uuid.UUID("00112233-4455-6677-8899-aabbccddeeff"), 3, bytes(range(32)))
FILE_KEY = bytes(range(32, 64))
FILE_ID = bytes(range(64, 80))
HEADER_NONCE = bytes.fromhex("a0a1a2a3a4a5a6a7a8a9aaab")
CASES: dict[str, tuple[bytes, int]] = {
    "empty": (b"", 4096),
    "hello": (b"hello, strongroom\n", 4096),
    "three-chunks-512": (bytes(i % 251 for i in range(1300)), 512),
    "exact-chunk-512": (bytes(255 - i % 256 for i in range(512)), 512),
}


def chunk_nonce(index: int) -> bytes:
    return bytes.fromhex("c0ffee00") + index.to_bytes(8, "big")


def build(name: str) -> bytes:
    plaintext, chunk_size = CASES[name]
    header = seal_header(FILE_KEY, KEY, file_id=FILE_ID, chunk_size=chunk_size, nonce=HEADER_NONCE)
    cipher = ChunkCipher(FILE_KEY, FILE_ID)
    pieces = [plaintext[i:i + chunk_size] for i in range(0, len(plaintext), chunk_size)] or [b""]
    out = header.encode()
    for i, piece in enumerate(pieces):
        out += cipher.seal(i, piece, last=i == len(pieces) - 1, nonce=chunk_nonce(i))
    return out


def write_v1() -> None:
    folder = HERE / "v1"
    folder.mkdir(exist_ok=True)
    for name, (plaintext, _) in CASES.items():
        (folder / f"{name}.srcf").write_bytes(build(name))
        (folder / f"{name}.plain").write_bytes(plaintext)
    (folder / "keys.json").write_text(json.dumps({
        "key_id": str(KEY.key_id), "key_version": KEY.version, "key_material_hex": KEY.material.hex(),
        "note": "test keys only; file key and nonces are fixed so these files are reproducible",
    }, indent=2) + "\n")
