"""How the console is delivered (issue 17): the build's pre-compressed copies to browsers
that accept them, hashed assets cached for a year while the page is revalidated, and a
sign-in page that loads under 300 KB."""

from __future__ import annotations

import gzip
import re
import ssl

import httpx

from keyserver.api.app import WEBUI_DIST


def _raw(client: httpx.Client, path: str, encoding: str) -> tuple[httpx.Response, bytes]:
    """The response and its body as sent (not decoded)."""
    with client.stream("GET", path, headers={"accept-encoding": encoding}) as r:
        return r, b"".join(r.iter_raw())


def _entry_files() -> list[str]:
    """What index.html makes the browser fetch before anything is clicked."""
    assert (WEBUI_DIST / "index.html").exists(), "build the console first (scripts/test does)"
    html = (WEBUI_DIST / "index.html").read_text()
    return re.findall(r'(?:src|href)="/?(assets/[^"]+)"', html)


def test_assets_come_precompressed_and_cached_for_a_year(base_url: str, tls: ssl.SSLContext) -> None:
    js = next(f for f in _entry_files() if f.endswith(".js"))
    plain = (WEBUI_DIST / js).read_bytes()
    with httpx.Client(base_url=base_url, verify=tls) as c:
        br, body = _raw(c, f"/{js}", "gzip, deflate, br")
        assert br.status_code == 200 and br.headers["content-encoding"] == "br"
        assert body == (WEBUI_DIST / f"{js}.br").read_bytes()
        assert br.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert br.headers["vary"] == "Accept-Encoding"
        assert br.headers["content-type"].startswith(("text/javascript", "application/javascript"))
        gz, body = _raw(c, f"/{js}", "gzip")
        assert gz.headers["content-encoding"] == "gzip" and gzip.decompress(body) == plain
        identity, body = _raw(c, f"/{js}", "identity")
        assert "content-encoding" not in identity.headers and body == plain
        page = c.get("/", headers={"accept-encoding": "br"})
        assert page.status_code == 200 and page.headers["cache-control"] == "no-cache"
        assert "script-src 'self'" in page.headers["content-security-policy"]


def test_the_sign_in_page_loads_under_300_kb() -> None:
    """What the browser downloads for the sign-in page (brotli, as every current browser
    accepts it): the page and its entry script and styles; every other page is a chunk
    of its own, fetched when opened."""
    files = ["index.html", *_entry_files()]
    sizes = {}
    for name in files:
        br = WEBUI_DIST / f"{name}.br"
        sizes[name] = (br if br.exists() else WEBUI_DIST / name).stat().st_size
    assert sum(sizes.values()) < 300 * 1024, sizes
    # The pages are split off: the dashboard's charts are not in the entry script.
    assert len(list((WEBUI_DIST / "assets").glob("Dashboard-*.js"))) == 1
