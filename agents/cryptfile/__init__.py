"""Encrypted file format v1 (docs/FORMAT.md): the per-file key in an authenticated
header, AES-256-GCM chunks bound to file id, index and finality. Knows nothing of FUSE,
the server or the CLI."""

from agents.cryptfile.errors import CryptfileError, FormatError, IntegrityError, KeyUnavailable
from agents.cryptfile.file import EncryptedFile, plaintext_size, read_header, stored_size
from agents.cryptfile.header import DEFAULT_CHUNK, HEADER_SIZE, FileHeader, parse_header
from agents.cryptfile.keys import Keyring, KeyVersion, StaticKeyring
from agents.cryptfile.transform import decrypt_file, encrypt_file, rekey_file, rewrap_file, rewrap_in_place

__all__ = [
    "DEFAULT_CHUNK",
    "HEADER_SIZE",
    "CryptfileError",
    "EncryptedFile",
    "FileHeader",
    "FormatError",
    "IntegrityError",
    "KeyUnavailable",
    "KeyVersion",
    "Keyring",
    "StaticKeyring",
    "decrypt_file",
    "encrypt_file",
    "parse_header",
    "plaintext_size",
    "read_header",
    "rekey_file",
    "rewrap_file",
    "rewrap_in_place",
    "stored_size",
]
