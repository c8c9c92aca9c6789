"""Single sign-on against a real OpenID provider (node-oidc-provider, run by the test over
HTTPS with its development sign-in pages), driven the way a browser would: the key
server sends the browser to the provider, the person signs in there, the provider sends
the browser back with a code, the key server checks the ID token and opens a session
with the role the person's groups map to (issue 15)."""

from __future__ import annotations

import contextlib
import re
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlparse

import httpx
import pytest

from hsm import HsmBackend
from keyserver.core.principal import system_context
from keyserver.services import Services, build_services
from keyserver.settings import Settings
from tests.api.test_audit_sinks import _ca_and_server
from tests.api.test_health_and_faults import serve
from tests.conftest import REPO, _ClosingBackend
from tests.serve import free_port

SECRET = "a-client-secret-for-tests-only-0123456789"
NODE = shutil.which("node") or "/usr/bin/node"


@contextlib.contextmanager
def _provider(tmp_path: Path, redirect_uri: str) -> Iterator[tuple[str, Path]]:
    ca, cert, key = _ca_and_server(tmp_path)
    port = free_port()
    script = REPO / "webui" / "e2e" / "oidc-provider.mjs"
    if not (REPO / "webui" / "node_modules" / "oidc-provider").exists():
        pytest.fail("scripts/test installs the console's node modules (oidc-provider among them); run it")
    proc = subprocess.Popen([NODE, str(script), str(port), str(cert), str(key), redirect_uri, SECRET],
                            cwd=REPO / "webui", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    issuer = f"https://localhost:{port}"
    try:
        trust = ssl.create_default_context(cafile=str(ca))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{issuer}/.well-known/openid-configuration", verify=trust).status_code == 200:
                    break
            time.sleep(0.2)
        yield issuer, ca
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def _keyserver(settings: Settings, hsm_backend: HsmBackend, port: int, **oidc: Any) -> Iterator[Services]:
    """A second server on the session's store, with OIDC settings, on `port` (the
    provider was told its callback URL before it started)."""
    svc = build_services(settings.model_copy(update={"cookie_secure": False, **oidc}),
                         hsm=_ClosingBackend(hsm_backend), migrate=False)  # type: ignore[arg-type]
    with serve(svc, port):
        yield svc


def _form(html: str, base: str) -> tuple[str, dict[str, str]]:
    """The page's form: where it posts, and its hidden fields."""
    action = re.search(r'<form[^>]*action="([^"]+)"', html)
    assert action, html[:500]
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', html))
    return urljoin(base, action.group(1)), fields


def _sign_in(browser: httpx.Client, start: str, login: str) -> httpx.Response:
    """What a person does in a browser: follow the redirects, fill in the provider's
    sign-in page, agree to share the claims; returns the key server's answer to the
    provider's redirect back."""
    r = browser.get(start)
    assert r.status_code == 302, r.text
    url = r.headers["location"]
    for _ in range(12):
        r = browser.get(url)
        if r.status_code in (302, 303):
            url = urljoin(url, r.headers["location"])
            if "/api/v1/auth/oidc/callback" in url:
                return browser.get(url)
            continue
        action, fields = _form(r.text, url)
        if fields.get("prompt") == "login":
            fields.update(login=login, password="anything")  # the provider's development sign-in
        r = browser.post(action, data=fields)
        assert r.status_code in (302, 303), r.text[:500]
        url = urljoin(action, r.headers["location"])
        if "/api/v1/auth/oidc/callback" in url:
            return browser.get(url)
    raise AssertionError("the provider never sent the browser back")


def test_single_sign_on_with_roles_from_groups(settings: Settings, hsm_backend: HsmBackend, services: Services,
                                               tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    redirect = f"{base}/api/v1/auth/oidc/callback"
    with _provider(tmp_path, redirect) as (issuer, ca), _keyserver(
            settings, hsm_backend, port, oidc_issuer=issuer, oidc_client_id="strongroom", oidc_client_secret=SECRET,
            oidc_ca_file=ca, oidc_redirect_url=redirect,
            oidc_role_map={"kms-admins": "admin", "kms-auditors": "auditor"}) as svc:
        assert httpx.get(f"{base}/api/v1/auth/methods").json() == {"password": True, "oidc": True}
        trust = ssl.create_default_context(cafile=str(ca))
        with httpx.Client(verify=trust, timeout=30) as browser:
            r = _sign_in(browser, f"{base}/api/v1/auth/oidc/login", "admin-alice")
            assert r.status_code == 302 and r.headers["location"] == "/", r.text
            me = browser.get(f"{base}/api/v1/auth/me").json()
            assert (me["username"], me["role"]) == ("oidc:admin-alice", "admin")
            assert me["must_change_password"] is False
        with httpx.Client(verify=trust, timeout=30) as browser:
            r = _sign_in(browser, f"{base}/api/v1/auth/oidc/login", "audit-bob")
            assert r.status_code == 302
            assert browser.get(f"{base}/api/v1/auth/me").json()["role"] == "auditor"
        with httpx.Client(verify=trust, timeout=30) as browser:  # in no group that maps to a role
            r = _sign_in(browser, f"{base}/api/v1/auth/oidc/login", "carol")
            back = parse_qs(urlparse(r.headers["location"]).fragment.split("?", 1)[1])
            assert r.status_code == 302 and back["code"] == ["oidc_no_role"] and "ROLE_MAP" in back["sso_error"][0]
            assert browser.get(f"{base}/api/v1/auth/me").status_code == 401
        # A name longer than an account's here is refused with its length, not cut to fit.
        long_name = "admin-" + "x" * 60
        with httpx.Client(verify=trust, timeout=30) as browser:
            r = _sign_in(browser, f"{base}/api/v1/auth/oidc/login", long_name)
            back = parse_qs(urlparse(r.headers["location"]).fragment.split("?", 1)[1])
            assert r.status_code == 302 and back["code"] == ["oidc_username_too_long"]
            assert "'preferred_username' for this person has 66 characters" in back["sso_error"][0]
            assert browser.get(f"{base}/api/v1/auth/me").status_code == 401
        users = svc.identity.list_users(system_context("tests"))
        assert not [u for u in users if u.username.startswith("oidc:admin-x")]
        # A callback that this server did not start (no cookie, or another state) is refused.
        with httpx.Client(verify=trust, timeout=30) as stranger:
            r = stranger.get(f"{base}/api/v1/auth/oidc/callback", params={"code": "x", "state": "y"})
            assert r.status_code == 302 and "code=oidc_state" in r.headers["location"]
        # The account made for an SSO user has no password that works here.
        r = httpx.post(f"{base}/api/v1/auth/login", json={"username": "oidc:admin-alice", "password": "anything"})
        assert r.status_code == 401
        svc.audit.flush()
        from sqlalchemy import select

        from keyserver.store.models import AuditEvent

        with svc.db() as s:
            logins = s.execute(select(AuditEvent.object_id, AuditEvent.outcome, AuditEvent.details).where(
                AuditEvent.action == "auth.login", AuditEvent.object_id.like("oidc:%"))).all()
        assert {(o, out) for o, out, d in logins if d.get("method") == "oidc"} >= {
            ("oidc:admin-alice", "allowed"), ("oidc:audit-bob", "allowed")}
    # Without the settings, single sign-on is off and says so.
    with _keyserver(settings, hsm_backend, port) as _:
        assert httpx.get(f"{base}/api/v1/auth/methods").json()["oidc"] is False
        r = httpx.get(f"{base}/api/v1/auth/oidc/login")
        assert r.status_code == 404 and r.json()["code"] == "oidc_not_configured"
