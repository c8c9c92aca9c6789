"""Passwords: argon2id hashes, the one-time passwords the server makes, and what a
chosen password must be."""

from __future__ import annotations

import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from keyserver.core.errors import InvalidInput

MIN_PASSWORD = 12
_hasher = PasswordHasher()  # argon2id, RFC 9106 low-memory profile defaults
# Verified against when the user does not exist, so timing does not reveal usernames.
DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))
# The password hash of accounts the identity provider signs in: no password matches it.
EXTERNAL_PASSWORD = "!external"  # noqa: S105 - not a password: a hash nothing verifies against


def generate_password() -> str:
    return secrets.token_urlsafe(15)


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(password_hash, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def check_password(password: str, username: str) -> None:
    if len(password) < MIN_PASSWORD or len(password) > 1024:
        raise InvalidInput(f"a password has at least {MIN_PASSWORD} characters")
    if username.lower() in password.lower():
        raise InvalidInput("a password must not contain the username")
