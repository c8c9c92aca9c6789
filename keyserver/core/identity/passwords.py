"""Passwords: argon2id hashes, the one-time passwords the server makes, and what a
chosen password must be: long enough, not the username, and hard to guess as zxcvbn
estimates it (dictionaries, common passwords, keyboard walks, repeats, dates) — harder
for roles that administer accounts or take keys out."""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from zxcvbn import zxcvbn

from keyserver.core.errors import InvalidInput
from keyserver.core.permissions import ROLE_PERMISSIONS, Permission, Role

MIN_PASSWORD = 12
MAX_PASSWORD = 1024
# zxcvbn's matching grows steeply with length (a 256-character password takes seconds):
# it judges the first 72 characters, its own default; what follows only adds strength.
JUDGED_CHARACTERS = 72
# Whoever can make accounts, change the KEK, or take keys out in plaintext or destroy
# them: a guessed password of theirs loses keys, not just sight of them.
_PRIVILEGED_PERMISSIONS = frozenset({Permission.USERS_MANAGE, Permission.SYSTEM_KEK, Permission.KEYS_EXPORT,
                                     Permission.KEYS_DESTROY})
PRIVILEGED_ROLES = frozenset(r.value for r in Role if ROLE_PERMISSIONS[r] & _PRIVILEGED_PERMISSIONS)
# zxcvbn's estimated guesses, as powers of ten: 10^8 is beyond an online attack slowed by
# the sign-in throttle; 10^10 also holds a while against an offline one on argon2id hashes.
MIN_GUESSES_LOG10 = 8
MIN_GUESSES_LOG10_PRIVILEGED = 10

_hasher = PasswordHasher()  # argon2id, RFC 9106 low-memory profile defaults
# Verified against when the user does not exist, so timing does not reveal usernames.
DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))
# The password hash of accounts the identity provider signs in: no password matches it.
EXTERNAL_PASSWORD = "!external"  # noqa: S105 - not a password: a hash nothing verifies against


class PasswordRefused(InvalidInput):
    """A chosen password that breaks a rule; `reason` names the rule for the audit record."""

    def __init__(self, message: str, *, code: str, reason: str) -> None:
        super().__init__(message, code=code)
        self.reason = reason


def generate_password() -> str:
    # 120 random bits: far beyond MIN_GUESSES_LOG10_PRIVILEGED (tests/core check it passes).
    return secrets.token_urlsafe(15)


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(password_hash, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def check_password(password: str, *, username: str, role: str, context: Iterable[str] = ()) -> None:
    """Refuse a password its owner would choose badly; `context` holds other words an
    attacker knows (the full name)."""
    if len(password) < MIN_PASSWORD:
        raise PasswordRefused(f"a password has at least {MIN_PASSWORD} characters (this one has {len(password)}); "
                              "use a passphrase of four or more unrelated words",
                              code="password_too_short", reason="too_short")
    if len(password) > MAX_PASSWORD:
        raise PasswordRefused(f"a password has at most {MAX_PASSWORD} characters (this one has {len(password)})",
                              code="password_too_long", reason="too_long")
    if username.lower() in password.lower():
        raise PasswordRefused("a password must not contain the username", code="password_weak",
                              reason="contains_username")
    privileged = role in PRIVILEGED_ROLES
    needed = MIN_GUESSES_LOG10_PRIVILEGED if privileged else MIN_GUESSES_LOG10
    hints = [username, *username.replace("@", ".").split("."), *(w for c in context for w in c.split()), "strongroom"]
    judged = zxcvbn(password[:JUDGED_CHARACTERS], user_inputs=[h for h in hints if h])
    guesses = float(judged["guesses_log10"])
    if guesses >= needed:
        return
    warning = str(judged["feedback"].get("warning") or "it follows a common pattern").rstrip(".")
    whose = (f"{'an' if role[0] in 'aeiou' else 'a'} {role}'s" if privileged else "a")
    raise PasswordRefused(f"too easy to guess: {warning[0].lower()}{warning[1:]}; {whose} password needs about "
                          f"10^{needed} guesses, this one about 10^{int(guesses)}: use a longer passphrase of "
                          "unrelated words", code="password_weak", reason="too_guessable")
