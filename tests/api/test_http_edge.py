"""The HTTP edge over real TLS: every 405 names exactly the methods its path has, HSTS
on TLS responses (and not over plain HTTP), and the API reference served from the key
server itself, its page allowed by the console's CSP."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from keyserver.api.app import WEBUI_DIST
from tests import https
from tests.serve import Server

METHODS = ("GET", "PUT", "POST", "DELETE", "PATCH", "HEAD")
PARAM = re.compile(r"\{[^}]+\}")


def concrete(path: str) -> str:
    """A path template with each parameter filled with a value that matches any
    converter (a UUID is also a valid name)."""
    return PARAM.sub("00000000-0000-4000-8000-000000000000", path)


def test_every_405_allows_exactly_the_methods_of_its_path(base_url: str) -> None:
    with https.client(base_url=base_url) as anon:
        spec: dict[str, Any] = anon.get("/api/v1/openapi.json").json()
        wrong: list[str] = []
        checked = 0
        for path, item in spec["paths"].items():
            has = {m.upper() for m in item if m.upper() in METHODS}
            expected = has  # FastAPI's routes answer HEAD only where they declare it
            for method in METHODS:
                if method in has:
                    continue
                r = anon.request(method, concrete(path))
                checked += 1
                if r.status_code != 405:
                    wrong.append(f"{method} {path}: {r.status_code}")
                    continue
                allow = {m.strip() for m in r.headers.get("allow", "").split(",") if m.strip()}
                if allow != expected:
                    wrong.append(f"{method} {path}: Allow {sorted(allow)}, the path has {sorted(expected)}")
                if r.headers.get("content-type") != "application/problem+json":
                    wrong.append(f"{method} {path}: {r.headers.get('content-type')}")
    assert checked > 100
    assert not wrong, "\n".join(wrong)


@pytest.mark.skipif(not (WEBUI_DIST / "index.html").exists(),
                    reason="the console is not built (webui/dist): no file server answers its paths")
def test_the_consoles_own_paths_keep_the_file_servers_allow(base_url: str) -> None:
    with https.client(base_url=base_url) as anon:
        r = anon.put("/keys")  # a console page, not an API route
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"


def test_hsts_over_tls_on_the_api_and_the_console(base_url: str) -> None:
    with https.client(base_url=base_url) as anon:
        for path in ("/healthz", "/api/v1/openapi.json", "/", "/api/docs"):
            r = anon.get(path)
            assert r.headers.get("strict-transport-security") == "max-age=31536000", path


def test_the_api_reference_is_served_from_the_key_server(base_url: str) -> None:
    """No CDN: every script and style the page names is on this origin and answers,
    and the page's own CSP (the console's) allows them: no inline script."""
    with https.client(base_url=base_url) as anon:
        page = anon.get("/api/docs")
        assert page.status_code == 200
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
        html = page.text
        assert "cdn." not in html and "//" not in re.sub(r"https?://[^\"']*strongroom\.dev[^\"']*", "", html)
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "an inline script: the CSP would block it"
        assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
        assert any(a.endswith(".js") for a in assets) and any(a.endswith(".css") for a in assets)
        for asset in assets:
            assert asset.startswith("/"), asset
            r = anon.get(asset)
            assert r.status_code == 200 and r.content, asset
        assert anon.get(assets[0]).headers.get("strict-transport-security")


@pytest.mark.parametrize("insecure", [True])
def test_no_hsts_over_plain_http(tmp_path: Path, insecure: bool) -> None:
    with Server(tmp_path / "data", "--insecure-http", STRONGROOM_KMIP_ENABLED="false",
                STRONGROOM_AGENT_ENABLED="false") as s, httpx.Client(base_url=s.url) as c:
        for path in ("/healthz", "/"):
            assert "strict-transport-security" not in c.get(path).headers
