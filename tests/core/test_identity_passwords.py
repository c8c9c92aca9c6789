"""keyserver/core/identity/passwords.py and the OIDC name rules, without a server."""

from __future__ import annotations

import pytest

from keyserver.core.identity.passwords import (
    JUDGED_CHARACTERS,
    PRIVILEGED_ROLES,
    PasswordRefused,
    check_password,
    generate_password,
)
from keyserver.core.permissions import Role
from keyserver.oidc import OidcClient, OidcConfig


def test_privileged_roles_are_those_that_administer_or_take_keys() -> None:
    assert {Role.ADMIN.value, Role.KEY_OFFICER.value, Role.KMIP_CLIENT.value} == PRIVILEGED_ROLES


def test_one_time_passwords_pass_the_strictest_rule() -> None:
    """The first-run administrator's, a reset's, create-admin's: kept as they are, they hold."""
    for _ in range(100):
        check_password(generate_password(), username="admin", role=Role.ADMIN.value)


@pytest.mark.parametrize("password", ["password1234", "aaaaaaaaaaaa", "qwertyuiopas", "Password2026!",
                                      "iloveyou2026"])
def test_guessable_passwords_are_refused_for_an_admin(password: str) -> None:
    with pytest.raises(PasswordRefused) as refused:
        check_password(password, username="alice", role=Role.ADMIN.value)
    assert refused.value.code == "password_weak" and refused.value.reason == "too_guessable"
    assert refused.value.message.startswith("too easy to guess: ")
    assert "an admin's password needs about 10^10 guesses" in refused.value.message


def test_the_server_s_own_name_counts_as_known_to_an_attacker() -> None:
    with pytest.raises(PasswordRefused):
        check_password("strongroomstrongroom", username="alice", role=Role.OPERATOR.value)


def test_a_long_passphrase_is_judged_quickly_and_passes() -> None:
    check_password("kettle orbit lantern gravel " * 30, username="alice", role=Role.ADMIN.value)
    with pytest.raises(PasswordRefused):  # what is judged is weak, whatever follows
        check_password("a" * JUDGED_CHARACTERS + "kettle orbit lantern", username="alice", role=Role.ADMIN.value)


def _client() -> OidcClient:
    return OidcClient(OidcConfig(issuer="https://idp.example", client_id="c", client_secret="s",
                                 redirect_uri="https://ks.example/cb", role_map={"kms-admins": "admin"}))


def test_an_identity_provider_name_too_long_is_refused_not_cut() -> None:
    client = _client()
    try:
        ok = client._identity({"sub": "1", "preferred_username": "a" * 59, "groups": ["kms-admins"]})
        assert ok.username == "oidc:" + "a" * 59
        with pytest.raises(Exception) as refused:
            client._identity({"sub": "1", "preferred_username": "a" * 60, "groups": ["kms-admins"]})
        assert getattr(refused.value, "code", None) == "oidc_username_too_long"
        assert "'preferred_username' for this person has 60 characters" in str(refused.value)
        with pytest.raises(Exception) as refused:
            client._identity({"sub": "1", "preferred_username": "bo", "name": "x" * 201, "groups": ["kms-admins"]})
        assert getattr(refused.value, "code", None) == "oidc_name_too_long"
    finally:
        client.close()
