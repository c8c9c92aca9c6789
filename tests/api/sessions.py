"""A person signed in over REST with their password, as the console signs in: the
session cookie and the CSRF token on every request. Approvals count only from such a
session (never from an API token), so every test of a held action signs its approvers
in this way."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx


def signed_in(c: httpx.Client, name: str, password: str) -> httpx.Client:
    r = c.post("/api/v1/auth/login", json={"username": name, "password": password})
    assert r.status_code == 200, r.text
    c.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    # Secure cookies over a plain-HTTP test server: sent as a browser over TLS would.
    c.headers["Cookie"] = next(h.split(";")[0] for h in r.headers.get_list("set-cookie")
                               if h.startswith("strongroom_session="))
    return c


@contextlib.contextmanager
def session(url: str, name: str, password: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url) as c:
        yield signed_in(c, name, password)
