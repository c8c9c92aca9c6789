"""What a chosen password must be, over real HTTP: guessable ones are refused with
`password_weak` and a message that says what to do, more strictly for the roles that
administer accounts or take keys out; each refusal is audited. A session ended by a
password change says so (`session_replaced`); an over-long username is refused, not cut."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import select

from keyserver.core.errors import InvalidInput
from keyserver.core.principal import system_context
from keyserver.services import Services
from keyserver.store.models import AuditEvent, User
from tests import https
from tests.api.test_auth import login
from tests.conftest import unique


def _denials(services: Services, action: str, object_id: str) -> list[AuditEvent]:
    services.audit.flush()
    with services.db() as s:
        return list(s.execute(select(AuditEvent).where(AuditEvent.action == action, AuditEvent.object_id == object_id,
                                                       AuditEvent.outcome == "denied")
                              .order_by(AuditEvent.seq)).scalars())


@pytest.mark.parametrize(("role", "password"), [
    ("admin", "password1234"),
    ("admin", "aaaaaaaaaaaa"),
    ("key-officer", "password1234"),
    ("key-officer", "Winter2026!!"),  # enough for an operator (below), not for a key officer
    ("kmip-client", "qwertyuiop12"),
    ("operator", "aaaaaaaaaaaa"),
    ("auditor", "password1234"),
])
def test_a_guessable_password_is_refused_and_audited(admin: httpx.Client, services: Services, role: str,
                                                     password: str) -> None:
    name = unique("weak")
    r = admin.post("/api/v1/users", json={"username": name, "role": role, "password": password})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "password_weak"
    assert body["detail"].startswith("too easy to guess: ") and "use a longer passphrase of unrelated words" in \
        body["detail"]
    assert name not in {u["username"] for u in admin.get("/api/v1/users").json()}
    [denied] = _denials(services, "user.create", name)
    assert denied.details == {"reason": "too_guessable", "role": role}


def test_privileged_roles_need_a_harder_password(admin: httpx.Client) -> None:
    r = admin.post("/api/v1/users", json={"username": unique("ops"), "role": "operator", "password": "Winter2026!!"})
    assert r.status_code == 201, r.text
    r = admin.post("/api/v1/users", json={"username": unique("ko"), "role": "key-officer", "password": "Winter2026!!"})
    assert r.status_code == 400 and "a key-officer's password needs about 10^10 guesses" in r.json()["detail"]
    r = admin.post("/api/v1/users", json={"username": unique("ko"), "role": "key-officer",
                                          "password": "kettle orbit lantern gravel"})
    assert r.status_code == 201, r.text


def test_short_and_username_passwords_have_their_own_codes(admin: httpx.Client, services: Services) -> None:
    name = unique("short")
    r = admin.post("/api/v1/users", json={"username": name, "role": "operator", "password": "kettle orb"})
    assert r.status_code == 400 and r.json()["code"] == "password_too_short"
    assert "this one has 10" in r.json()["detail"]
    r = admin.post("/api/v1/users", json={"username": name, "role": "operator",
                                          "password": f"{name} kettle orbit lantern"})
    assert r.status_code == 400 and r.json()["code"] == "password_weak" and "username" in r.json()["detail"]
    assert {d.details["reason"] for d in _denials(services, "user.create", name)} == {"too_short",
                                                                                      "contains_username"}


def test_changing_to_a_weak_password_is_refused_and_audited(base_url: str, services: Services) -> None:
    name, password = unique("officer"), "several unrelated words 4711"
    services.identity.create_user(system_context("tests"), username=name, role="key-officer", password=password)
    c, r = login(base_url, name, password)
    assert r.status_code == 200
    r = c.post("/api/v1/auth/password", json={"current_password": password, "new_password": "password1234"})
    assert r.status_code == 400 and r.json()["code"] == "password_weak", r.text
    assert "a key-officer's password needs about 10^10 guesses" in r.json()["detail"]
    [denied] = _denials(services, "user.change_password", name)
    assert denied.details == {"reason": "too_guessable"}
    # Nothing changed: the old password still signs in, the session still works.
    assert c.get("/api/v1/auth/me").status_code == 200
    c.close()
    c, r = login(base_url, name, password)
    assert r.status_code == 200
    c.close()


def test_an_old_session_after_a_password_change_says_replaced(base_url: str, services: Services) -> None:
    name, password = unique("two"), "several unrelated words 4711"
    services.identity.create_user(system_context("tests"), username=name, role="operator", password=password)
    first, _ = login(base_url, name, password)
    second, _ = login(base_url, name, password)
    r = first.post("/api/v1/auth/password", json={"current_password": password,
                                                  "new_password": "a different set of words 0815"})
    assert r.status_code == 200, r.text
    first.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    stale = second.get("/api/v1/auth/me")
    assert stale.status_code == 401 and stale.json()["code"] == "session_replaced"
    assert "password" in stale.json()["detail"] and "sign in again" in stale.json()["detail"]
    assert first.get("/api/v1/auth/me").status_code == 200  # the changer's new session
    # Signed out by hand afterwards, a session is just over.
    cookie = first.cookies.get("strongroom_session")
    assert first.post("/api/v1/auth/logout").status_code == 204
    with https.client(base_url=base_url, cookies={"strongroom_session": cookie or ""}) as replay:
        assert replay.get("/api/v1/auth/me").json()["code"] == "session_expired"
    first.close()
    second.close()


def test_an_over_long_username_is_refused_not_cut(admin: httpx.Client, services: Services) -> None:
    name = "u" * 65
    r = admin.post("/api/v1/users", json={"username": name, "role": "operator"})
    assert r.status_code in (400, 422) and "64" in r.text, r.text
    with services.db() as s:
        assert s.execute(select(User).where(User.username == name[:64])).first() is None
    # The same rule for callers that do not come through the REST schema (the CLI).
    with pytest.raises(InvalidInput) as refused:
        services.identity.create_user(system_context("cli"), username=name, role="operator")
    assert refused.value.code == "username_too_long" and "this one has 65" in refused.value.message
