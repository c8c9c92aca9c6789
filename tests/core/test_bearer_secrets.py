"""The one way bearer secrets (API, enrollment and database tokens) are minted and
checked. Rows written before it existed must keep working: the digest is the SHA-256 hex
of the part after the lookup, the lookup 16 characters of lower-case base32."""

from __future__ import annotations

import hashlib
import re

import pytest

from keyserver.core.identity.records import check_secret, mint_secret, split_secret


@pytest.mark.parametrize("prefix", ["srk_", "sre_", "srdb_"])
def test_minted_token_has_the_stored_format(prefix: str) -> None:
    minted = mint_secret(prefix)
    assert re.fullmatch(re.escape(prefix) + r"[a-z2-7]{16}_[A-Za-z0-9_-]{43}", minted.token)
    assert split_secret(prefix, minted.token) == (minted.lookup, minted.token[len(prefix) + 17:])
    assert minted.secret_hash == hashlib.sha256(minted.token[len(prefix) + 17:].encode()).hexdigest()


def test_a_digest_written_before_still_checks() -> None:
    # The form every existing row holds, computed without our helpers.
    secret = "Zm9v_YmFy-secret"
    stored = hashlib.sha256(secret.encode()).hexdigest()
    assert check_secret(secret, stored)
    assert not check_secret(secret + "x", stored)
    assert not check_secret(secret, None)
    assert not check_secret("", None)  # the digest of "" stands in for a missing row, never matches


@pytest.mark.parametrize("token", [None, "", "srk_", "srk_abc", "sre_abc_def", "srk"])
def test_what_is_not_a_token(token: str | None) -> None:
    assert split_secret("srk_", token) is None


def test_the_secret_may_itself_hold_underscores() -> None:
    assert split_secret("srdb_", "srdb_look_se_cr_et") == ("look", "se_cr_et")
