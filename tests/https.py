"""HTTPS clients for the tests' key server, which serves a certificate from its internal
CA as `keyserver serve` does by default: they trust that CA and nothing else.

The session's `ca_file` fixture sets the CA; servers a test starts itself (a
subprocess) pass their own data directory's `ca.pem`."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import httpx

_trusted: ssl.SSLContext | None = None


def trust(ca_file: Path) -> ssl.SSLContext:
    global _trusted
    _trusted = ssl.create_default_context(cafile=str(ca_file))
    return _trusted


def _verify(ca_file: Path | None) -> ssl.SSLContext:
    if ca_file is not None:
        return ssl.create_default_context(cafile=str(ca_file))
    assert _trusted is not None, "the session's key server is not up yet (use the base_url fixture)"
    return _trusted


def client(*, ca_file: Path | None = None, **kwargs: Any) -> httpx.Client:
    return httpx.Client(verify=_verify(ca_file), **kwargs)


def get(url: str, *, ca_file: Path | None = None, **kwargs: Any) -> httpx.Response:
    return httpx.get(url, verify=_verify(ca_file), **kwargs)


def post(url: str, *, ca_file: Path | None = None, **kwargs: Any) -> httpx.Response:
    return httpx.post(url, verify=_verify(ca_file), **kwargs)


def server_spki_pin(url: str, *, ca_file: Path | None = None) -> str:
    """Base64 SHA-256 of the SubjectPublicKeyInfo the HTTPS server at `url` presents,
    after checking its chain against the trusted CA (or `ca_file`'s): the pin Chromium's
    --ignore-certificate-errors-spki-list takes."""
    import base64
    import hashlib
    import socket
    from urllib.parse import urlsplit

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 443
    with socket.create_connection((host, port), timeout=10) as raw, \
            _verify(ca_file).wrap_socket(raw, server_hostname=host) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    spki = x509.load_der_x509_certificate(der).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()
