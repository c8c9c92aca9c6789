"""Sign-in, sessions with CSRF, first-run password change, throttling, API tokens."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import update

from keyserver.core.principal import system_context
from keyserver.services import Services
from keyserver.settings import Settings
from keyserver.store.models import BrowserSession
from tests import https
from tests.conftest import Actor, unique


def login(base_url: str, username: str, password: str) -> tuple[httpx.Client, httpx.Response]:
    c = https.client(base_url=base_url, timeout=30)
    r = c.post("/api/v1/auth/login", json={"username": username, "password": password})
    if r.status_code == 200:
        c.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    return c, r


def test_first_run_admin_must_change_password(base_url: str, admin_password: str) -> None:
    c, r = login(base_url, "admin", admin_password)
    assert r.status_code == 200 and r.json()["user"]["must_change_password"] is True
    cookie = r.headers.get_list("set-cookie")
    assert any("strongroom_session=" in h and "HttpOnly" in h and "SameSite=strict" in h for h in cookie)
    blocked = c.get("/api/v1/keys")
    assert blocked.status_code == 403 and blocked.json()["code"] == "password_change_required"
    assert c.get("/api/v1/auth/me").status_code == 200
    weak = c.post("/api/v1/auth/password", json={"current_password": admin_password, "new_password": "short"})
    assert weak.status_code == 400
    r = c.post("/api/v1/auth/password", json={"current_password": admin_password,
                                              "new_password": "a much better passphrase"})
    assert r.status_code == 200 and r.json()["user"]["must_change_password"] is False
    c.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    assert c.get("/api/v1/keys").status_code == 200
    c.close()


def test_unsafe_methods_need_csrf(base_url: str, actors: dict[str, Actor]) -> None:
    a = actors["key-officer"]
    c, _ = login(base_url, a.username, a.password)
    token = c.headers.pop("X-CSRF-Token")
    r = c.post("/api/v1/keys", json={"name": unique("csrf")})
    assert r.status_code == 403 and r.json()["code"] == "csrf_failed"
    r = c.post("/api/v1/keys", json={"name": unique("csrf")}, headers={"X-CSRF-Token": "wrong"})
    assert r.status_code == 403
    r = c.post("/api/v1/keys", json={"name": unique("csrf")}, headers={"X-CSRF-Token": token})
    assert r.status_code == 201
    assert c.get("/api/v1/keys").status_code == 200  # safe methods need no token
    c.close()


def test_logout_ends_the_session(base_url: str, actors: dict[str, Actor]) -> None:
    a = actors["operator"]
    c, _ = login(base_url, a.username, a.password)
    cookie = c.cookies.get("strongroom_session")
    assert c.post("/api/v1/auth/logout").status_code == 204
    with https.client(base_url=base_url, cookies={"strongroom_session": cookie or ""}) as replay:
        r = replay.get("/api/v1/auth/me")
    assert r.status_code == 401 and r.json()["code"] == "session_expired"
    c.close()


def test_idle_and_expired_sessions(base_url: str, actors: dict[str, Actor], services: Services) -> None:
    a = actors["auditor"]
    c, _ = login(base_url, a.username, a.password)
    from keyserver.core.identity import sha256_hex

    h = sha256_hex(c.cookies["strongroom_session"])
    with services.db.begin() as s:
        s.execute(update(BrowserSession).where(BrowserSession.id_hash == h)
                  .values(last_seen_at=datetime.now(UTC) - timedelta(hours=2)))
    r = c.get("/api/v1/auth/me")
    assert r.status_code == 401 and "expired" in r.json()["detail"]
    assert r.headers["www-authenticate"].startswith("Bearer")
    c.close()


def test_bad_credentials_and_lockout(base_url: str, services: Services) -> None:
    name = unique("lock")
    services.identity.create_user(system_context("tests"), username=name, role="operator",
                                  password="the right password 1")
    for _ in range(services.settings.login_max_failures):
        _, r = login(base_url, name, "wrong password!!")
        assert r.status_code == 401 and r.json()["code"] == "bad_credentials"
    _, r = login(base_url, name, "the right password 1")
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
    _, r = login(base_url, "nobody-" + name, "whatever password")
    assert r.status_code == 401 and r.json()["detail"] == "wrong username or password"
    services.audit.flush()
    rows, _, _ = services.audit.query(__import__("keyserver.core.audit", fromlist=["AuditFilter"])
                                   .AuditFilter(action="auth.login", object_id=name, outcome="denied"), limit=20)
    assert len(rows) == services.settings.login_max_failures + 1
    assert rows[0].details["reason"] == "throttled" and rows[0].details["throttle"] == "source"


def test_disabled_user_cannot_sign_in(base_url: str, services: Services, admin: httpx.Client) -> None:
    name = unique("gone")
    user, _ = services.identity.create_user(system_context("tests"), username=name, role="operator",
                                            password="a fine password 2")
    c, r = login(base_url, name, "a fine password 2")
    assert r.status_code == 200
    assert admin.patch(f"/api/v1/users/{user.id}", json={"disabled": True}).status_code == 200
    assert c.get("/api/v1/auth/me").status_code == 401  # live session revoked at once
    _, r = login(base_url, name, "a fine password 2")
    assert r.status_code == 401
    c.close()


def test_api_token_revocation_and_expiry(base_url: str, actors: dict[str, Actor], services: Services) -> None:
    a = actors["operator"]
    r = a.session.post("/api/v1/tokens", json={"name": "ci", "expires_in_days": 1})
    created = r.json()
    assert created["secret"].startswith("srk_") and created["token"]["prefix"] in created["secret"]
    listed = a.session.get("/api/v1/tokens").json()
    assert any(t["id"] == created["token"]["id"] for t in listed)
    assert all("secret" not in t for t in listed)
    with https.client(base_url=base_url, headers={"Authorization": f"Bearer {created['secret']}"}) as c:
        assert c.get("/api/v1/keys").status_code == 200
        # Two days later (the service's clock is injectable) the token has expired,
        # cached or not.
        later = datetime.now(UTC) + timedelta(days=2)
        services.identity._now = lambda: later
        try:
            r = c.get("/api/v1/keys")
        finally:
            from keyserver.core.audit import utcnow

            services.identity._now = utcnow
        assert r.status_code == 401 and r.json()["code"] == "token_expired"
        assert a.session.delete(f"/api/v1/tokens/{created['token']['id']}").status_code == 200
        r = c.get("/api/v1/keys")
        assert r.status_code == 401 and r.json()["code"] == "token_revoked"
        assert c.post("/api/v1/tokens", json={"name": "x"}).status_code == 401


def test_tokens_cannot_mint_tokens(actors: dict[str, Actor]) -> None:
    r = actors["admin"].client.post("/api/v1/tokens", json={"name": "child"})
    assert r.status_code == 403 and "cannot create API tokens" in r.json()["detail"]


def test_malformed_authorization(base_url: str) -> None:
    with https.client(base_url=base_url) as c:
        for header in ("Basic abc", "Bearer", "Bearer srk_nope", "Bearer srk_abc_def", "Bearer " + "x" * 5000):
            r = c.get("/api/v1/keys", headers={"Authorization": header})
            assert r.status_code == 401, header
        r = c.get("/api/v1/keys")
        assert r.status_code == 401 and r.json()["code"] == "unauthenticated"


def test_last_admin_is_protected(admin: httpx.Client, services: Services, actors: dict[str, Actor]) -> None:
    users = admin.get("/api/v1/users").json()
    admins = [u for u in users if u["role"] == "admin" and not u["disabled"]]
    # Disable all but one admin, then the last one must refuse.
    keep = next(u for u in admins if u["username"] == actors["admin"].username)
    others = [u for u in admins if u["id"] != keep["id"]]
    for u in others:
        assert admin.patch(f"/api/v1/users/{u['id']}", json={"disabled": True}).status_code == 200
    try:
        r = admin.patch(f"/api/v1/users/{keep['id']}", json={"role": "auditor"})
        assert r.status_code == 409 and r.json()["code"] == "last_admin"
    finally:
        for u in others:
            admin.patch(f"/api/v1/users/{u['id']}", json={"disabled": False})


def test_user_admin_flow(admin: httpx.Client, base_url: str) -> None:
    r = admin.post("/api/v1/users", json={"username": unique("alice"), "role": "key-officer",
                                          "full_name": "Alice"})
    assert r.status_code == 201
    otp, user = r.json()["one_time_password"], r.json()["user"]
    assert user["must_change_password"] is True
    c, r = login(base_url, user["username"], otp)
    assert r.status_code == 200 and r.json()["user"]["role"] == "key-officer"
    new = admin.post(f"/api/v1/users/{user['id']}/reset-password").json()["one_time_password"]
    assert c.get("/api/v1/auth/me").status_code == 401  # reset ends sessions
    _, r = login(base_url, user["username"], new)
    assert r.status_code == 200
    assert admin.post("/api/v1/users", json={"username": user["username"], "role": "auditor"}).status_code == 409
    assert admin.post("/api/v1/users", json={"username": "Bad Name", "role": "auditor"}).status_code == 400
    assert admin.post("/api/v1/users", json={"username": "okname", "role": "root"}).status_code == 422
    assert admin.get("/api/v1/users/00000000-0000-0000-0000-000000000000").status_code == 404
    c.close()


def test_revocation_in_another_replica_is_honoured(base_url: str, actors: dict[str, Actor],
                                                   services: Services, settings: object) -> None:
    """Tokens are cached per replica; a revocation committed by *another* replica
    reaches this one through LISTEN/NOTIFY before the next request."""
    import time

    from keyserver.services import build_services

    a = actors["key-officer"]
    created = a.session.post("/api/v1/tokens", json={"name": "replicated"}).json()
    with https.client(base_url=base_url, headers={"Authorization": f"Bearer {created['secret']}"}) as c:
        # The embedded store's poller drops every cache when it sees a change (the token's
        # own creation among them, seen up to 0.2 s later): ask until the entry stays.
        deadline = time.monotonic() + 10
        while True:
            assert c.get("/api/v1/keys").status_code == 200
            if services.identity.cached_token(created["secret"]) is not None or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert services.identity.cached_token(created["secret"]) is not None
        other = build_services(settings, hsm=services.hsm, migrate=False)  # type: ignore[arg-type]
        try:
            principal = other.identity.authenticate_token(a.client.headers["authorization"].split()[1])
            from keyserver.core.principal import RequestContext

            other.identity.revoke_token(RequestContext(principal), __import__("uuid").UUID(created["token"]["id"]))
        finally:
            other.engine.dispose()
        deadline = time.monotonic() + 5
        while services.identity.cached_token(created["secret"]) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        r = c.get("/api/v1/keys")
        assert r.status_code == 401 and r.json()["code"] == "token_revoked"


def test_a_password_reset_ends_sessions_and_tokens_unless_kept(admin: httpx.Client, base_url: str,
                                                               services: Services) -> None:
    user = admin.post("/api/v1/users", json={"username": unique("reset"), "role": "operator"}).json()
    c, r = login(base_url, user["user"]["username"], user["one_time_password"])
    r = c.post("/api/v1/auth/password", json={"current_password": user["one_time_password"],
                                              "new_password": "a fine new passphrase 1"})
    assert r.status_code == 200
    c.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    secrets_ = [c.post("/api/v1/tokens", json={"name": f"t{i}", "expires_in_days": 30}).json()["secret"]
                for i in range(2)]

    def works(secret: str) -> bool:
        with https.client(base_url=base_url, headers={"Authorization": f"Bearer {secret}"}) as t:
            return t.get("/api/v1/keys").status_code == 200

    assert all(works(x) for x in secrets_)
    uid = user["user"]["id"]
    kept = admin.post(f"/api/v1/users/{uid}/reset-password", json={"keep_tokens": True})
    assert kept.status_code == 200 and all(works(x) for x in secrets_)
    assert c.get("/api/v1/auth/me").status_code == 401  # sessions end either way
    assert admin.post(f"/api/v1/users/{uid}/reset-password").status_code == 200
    assert not any(works(x) for x in secrets_)
    services.audit.flush()
    resets = admin.get("/api/v1/audit/events", params={"action": "user.reset_password",
                                                       "object_id": user["user"]["username"]}).json()["items"]
    assert [(e["details"]["tokens_kept"], e["details"]["tokens_revoked"]) for e in resets] == [(False, 2), (True, 0)]
    c.close()


def test_changing_ones_password_ends_every_other_session_and_rotates_ones_own(admin: httpx.Client,
                                                                              base_url: str) -> None:
    made = admin.post("/api/v1/users", json={"username": unique("rotate"), "role": "auditor",
                                             "password": "chosen by the admin 123"}).json()
    username = made["user"]["username"]
    assert made["user"]["must_change_password"] is True  # a password someone else chose
    first, r = login(base_url, username, "chosen by the admin 123")
    assert r.json()["user"]["must_change_password"] is True
    assert first.get("/api/v1/keys").json()["code"] == "password_change_required"
    other, _ = login(base_url, username, "chosen by the admin 123")
    old_cookie = first.cookies.get("strongroom_session")
    r = first.post("/api/v1/auth/password", json={"current_password": "chosen by the admin 123",
                                                  "new_password": "my very own passphrase 9"})
    assert r.status_code == 200
    assert first.cookies.get("strongroom_session") not in (None, old_cookie)  # a new session id
    first.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    assert first.get("/api/v1/keys").status_code == 200
    assert other.get("/api/v1/auth/me").status_code == 401  # the other session ended
    with https.client(base_url=base_url, cookies={"strongroom_session": old_cookie or ""}) as stale:
        assert stale.get("/api/v1/auth/me").status_code == 401  # and so did the old id
    first.close()
    other.close()


def test_token_lifetime_is_bounded_by_the_server(actors: dict[str, Actor]) -> None:
    s = actors["key-officer"].session
    r = s.post("/api/v1/tokens", json={"name": "forever", "expires_in_days": None})
    assert r.status_code == 400 and r.json()["code"] == "token_lifetime" and "365" in r.json()["detail"]
    r = s.post("/api/v1/tokens", json={"name": "too long", "expires_in_days": 400})
    assert r.status_code == 400 and r.json()["code"] == "token_lifetime"
    assert s.post("/api/v1/tokens", json={"name": "a year", "expires_in_days": 365}).status_code == 201


def test_lockout_does_not_reveal_accounts_nor_lock_out_an_address(actors: dict[str, Actor], admin: httpx.Client,
                                                                  base_url: str, settings: Settings) -> None:
    real = admin.post("/api/v1/users", json={"username": unique("locked"), "role": "auditor"}).json()["user"]
    real, ghost = real["username"], unique("nobody")
    for name in (real, ghost):
        answers = []
        for _ in range(settings.login_max_failures + 1):
            _, r = login(base_url, name, "wrong password entirely")
            answers.append((r.status_code, r.json()["code"], r.json()["detail"]))
        # the same answers, in the same order, whether the account exists or not
        assert answers[:settings.login_max_failures] == [(401, "bad_credentials", "wrong username or password")] * \
            settings.login_max_failures
        assert answers[-1][0] == 429 and "this account" in answers[-1][2]
    # a colleague behind the same address signs in regardless
    other = actors["operator"]
    _, r = login(base_url, other.username, other.password)
    assert r.status_code == 200


def _code(secret_b32: str, at: float, *, step_offset: int = 0) -> str:
    """What an authenticator app shows (RFC 6238: HMAC-SHA-1, 6 digits, 30 s)."""
    import base64

    from cryptography.hazmat.primitives.hashes import SHA1
    from cryptography.hazmat.primitives.twofactor.totp import TOTP

    key = base64.b32decode(secret_b32 + "=" * (-len(secret_b32) % 8))
    return TOTP(key, 6, SHA1(), 30, enforce_key_length=False).generate(at + 30 * step_offset).decode()  # noqa: S303


def test_a_second_factor_is_set_up_confirmed_required_and_reset(admin: httpx.Client, base_url: str,
                                                                services: Services) -> None:
    import time as _time
    from urllib.parse import parse_qs, urlparse

    made = admin.post("/api/v1/users", json={"username": unique("mfa"), "role": "auditor"}).json()
    username, otp = made["user"]["username"], made["one_time_password"]
    c, _ = login(base_url, username, otp)
    password = "my passphrase with a factor 7"
    r = c.post("/api/v1/auth/password", json={"current_password": otp, "new_password": password})
    c.headers["X-CSRF-Token"] = r.json()["csrf_token"]

    assert c.get("/api/v1/auth/me").json()["second_factor"] is False
    enrolled = c.post("/api/v1/auth/totp")
    assert enrolled.status_code == 201, enrolled.text
    secret, uri = enrolled.json()["secret"], enrolled.json()["otpauth_uri"]
    assert uri.startswith("otpauth://totp/") and parse_qs(urlparse(uri).query)["secret"] == [secret]
    _, r = login(base_url, username, password)
    assert r.status_code == 200  # not confirmed yet: the password alone still signs in
    wrong = c.post("/api/v1/auth/totp/confirm", json={"code": _code(secret, _time.time(), step_offset=5)})
    assert wrong.status_code == 403 and wrong.json()["code"] == "totp_wrong"
    now = _time.time()
    assert c.post("/api/v1/auth/totp/confirm", json={"code": _code(secret, now)}).status_code == 204
    assert c.get("/api/v1/auth/me").json()["second_factor"] is True  # what the console's account page shows
    assert c.post("/api/v1/auth/totp").json()["code"] == "totp_exists"

    # From now on sign-in needs the code; a code is good for one sign-in.
    _, r = login(base_url, username, password)
    assert r.status_code == 401 and r.json()["code"] == "totp_required"
    _, r = login(base_url, username, "not the password")
    assert r.status_code == 401 and r.json()["code"] == "bad_credentials"  # nothing revealed without the password
    with https.client(base_url=base_url) as h:
        later = _code(secret, now, step_offset=1)  # the next step (drift allowed), unused so far
        r = h.post("/api/v1/auth/login", json={"username": username, "password": password, "totp_code": later})
        assert r.status_code == 200, r.text
        again = h.post("/api/v1/auth/login", json={"username": username, "password": password, "totp_code": later})
        assert again.status_code == 401 and again.json()["code"] == "bad_credentials"  # replayed
        r = h.post("/api/v1/auth/login", json={"username": username, "password": password, "totp_code": "12345"})
        assert r.status_code == 422
    with services.db() as s:
        from sqlalchemy import select

        from keyserver.store.models import User
        stored = s.execute(select(User.totp).where(User.username == username)).scalar_one()
        assert secret not in str(stored)  # sealed, never stored as it is

    assert admin.delete(f"/api/v1/users/{made['user']['id']}/totp").status_code == 204
    assert c.get("/api/v1/auth/me").status_code == 401  # the reset ended the user's sessions
    _, r = login(base_url, username, password)
    assert r.status_code == 200  # back to the password alone, until set up again
    services.audit.flush()
    actions = {e["action"] for e in admin.get("/api/v1/audit/events", params={
        "object_id": username, "limit": 50}).json()["items"]}
    assert {"user.totp_enroll", "user.totp_confirm", "user.totp_reset"} <= actions
    c.close()


def test_a_credential_can_ask_what_it_may_do(actors: dict[str, Actor], admin: httpx.Client) -> None:
    officer = actors["key-officer"]
    r = actors["operator"].client.get("/api/v1/auth/can", params={"permission": "keys:export"}).json()
    assert r["allowed"] is False and "role" in r["reason"]
    assert officer.client.get("/api/v1/auth/can", params={"permission": "keys:export"}).json()["allowed"] is True
    name = admin.post("/api/v1/keys", json={"name": unique("can"), "exportable": False}).json()["name"]
    r = officer.client.get("/api/v1/auth/can", params={"permission": "keys:export", "key": name}).json()
    assert r["allowed"] is False and "not exportable" in r["reason"]
    narrow = officer.session.post("/api/v1/tokens", json={"name": "narrow", "scopes": ["keys:read"],
                                                          "expires_in_days": 1}).json()["secret"]
    with https.client(base_url=str(officer.client.base_url), headers={"Authorization": f"Bearer {narrow}"}) as t:
        r = t.get("/api/v1/auth/can", params={"permission": "keys:export"}).json()
        assert r["allowed"] is False and "token scopes" in r["reason"]
        assert t.get("/api/v1/auth/can", params={"permission": "no:such"}).status_code == 422


def test_a_role_change_ends_the_users_sessions(admin: httpx.Client, base_url: str) -> None:
    made = admin.post("/api/v1/users", json={"username": unique("promoted"), "role": "auditor",
                                             "password": "initial passphrase 123"}).json()
    c, _ = login(base_url, made["user"]["username"], "initial passphrase 123")
    r = c.post("/api/v1/auth/password", json={"current_password": "initial passphrase 123",
                                              "new_password": "my own passphrase 456"})
    c.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    assert c.get("/api/v1/auth/me").json()["role"] == "auditor"
    assert admin.patch(f"/api/v1/users/{made['user']['id']}", json={"role": "key-officer"}).status_code == 200
    assert c.get("/api/v1/auth/me").status_code == 401  # sign in again: a new session for the new role
    _, r = login(base_url, made["user"]["username"], "my own passphrase 456")
    assert r.json()["user"]["role"] == "key-officer"
    c.close()


def _from(base_url: str, address: str) -> httpx.Client:
    """A client whose connections come from `address` (any of 127/8 is this host's loopback)."""
    return https.client(base_url=base_url, timeout=30,
                        transport=httpx.HTTPTransport(local_address=address, verify=https._verify(None)))


def test_an_attacker_guessing_from_other_addresses_never_locks_the_owner_out(base_url: str, services: Services,
                                                                            settings: Settings) -> None:
    """Five wrong passwords a minute kept `admin` locked out for ever. Now each of the
    attacker's addresses waits longer and longer after a few failures, and the account
    as a whole, after a looser budget, makes only addresses its owner has not used
    wait: the owner at their usual address signs in throughout."""
    name, password = unique("owner"), "the owner's own passphrase 1"
    services.identity.create_user(system_context("tests"), username=name, role="admin", password=password)
    with _from(base_url, "127.0.0.2") as owner:
        assert owner.post("/api/v1/auth/login", json={"username": name, "password": password}).status_code == 200
    free, budget = settings.login_max_failures, 4 * settings.login_max_failures
    answers: list[tuple[str, int, str]] = []
    attackers = [f"127.0.0.{i}" for i in range(3, 11)]
    for address in attackers:
        with _from(base_url, address) as attacker:
            for _ in range(free + 3):
                r = attacker.post("/api/v1/auth/login", json={"username": name, "password": "a guess 0123456"})
                assert r.status_code in (401, 429), r.text
                assert r.status_code == 401 or int(r.headers["retry-after"]) <= 900  # a wait, not a lock
                answers.append((address, r.status_code, r.json()["detail"]))
    guesses = [a for a in answers if a[1] == 401]
    # Slowed: each address had `free` guesses checked, the account `budget` over all of them.
    assert len(guesses) == budget and {a for a, _, _ in guesses} == set(attackers[:budget // free])
    assert all("from this address" in d for a, c, d in answers if c == 429 and a in attackers[:budget // free])
    assert all(c == 429 for a, c, _ in answers if a not in attackers[:budget // free])
    # The owner, from where they always sign in, is let in at once.
    with _from(base_url, "127.0.0.2") as owner:
        r = owner.post("/api/v1/auth/login", json={"username": name, "password": password})
        assert r.status_code == 200, r.text
    # From an address never used, the owner waits like the attacker: delayed, not locked.
    with _from(base_url, "127.0.0.11") as elsewhere:
        r = elsewhere.post("/api/v1/auth/login", json={"username": name, "password": password})
    assert r.status_code == 429 and 0 < int(r.headers["retry-after"]) <= 900
    # One audit record per wait, not one per refused try.
    services.audit.flush()
    from keyserver.core.audit import AuditFilter

    rows, _, _ = services.audit.query(AuditFilter(action="auth.login", object_id=name, outcome="denied"), limit=500)
    throttled = [r for r in rows if r.details.get("reason") == "throttled"]
    refusals = sum(1 for _, c, _ in answers if c == 429) + 1
    assert len(throttled) == len(attackers) + 1 < refusals
    assert len([r for r in rows if r.details.get("reason") == "bad_credentials"]) == budget
