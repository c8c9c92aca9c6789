"""AWS Signature Version 4 verification (the XKS proxy's request authentication).

AWS KMS signs every call to an external key store proxy with SigV4 under the credential
the proxy issued (service `kms-xks-proxy`, the key store's region). This module checks
one request: the `Authorization` header's form, the scope (date, region, service), the
signed headers (`host` and `x-amz-date` at least), the clock (AWS's 5 minutes either
way), the body's SHA-256 (and `x-amz-content-sha256` when sent), and the signature,
compared in constant time. It is the canonical request of AWS's documentation, checked
against requests botocore signs (tests/integrations/test_xks.py). Pure: no HTTP, no
database; the signing key comes from the caller (`signing_key`).
"""

from __future__ import annotations

import hashlib
import hmac
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, unquote

ALGORITHM = "AWS4-HMAC-SHA256"
SKEW = timedelta(minutes=5)
_AUTH_RE = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<cred>[^,\s]+)\s*,\s*SignedHeaders=(?P<signed>[a-z0-9;_.-]+)\s*,"
    r"\s*Signature=(?P<sig>[0-9a-f]{64})$")
_DATE_RE = re.compile(r"^[0-9]{8}T[0-9]{6}Z$")


class SigV4Error(Exception):
    """The request is not signed as it must be; the message says how (safe to return)."""


@dataclass(frozen=True, slots=True)
class Scope:
    access_key_id: str
    date: str  # YYYYMMDD
    region: str
    service: str


@dataclass(frozen=True, slots=True)
class Signed:
    scope: Scope
    amz_date: str
    signed_headers: tuple[str, ...]
    signature: str


def parse(authorization: str | None, headers: dict[str, str], *, now: datetime) -> Signed:
    """The signature's claims, once its form and date are acceptable."""
    if not authorization:
        raise SigV4Error("missing Authorization header (AWS Signature Version 4)")
    m = _AUTH_RE.match(authorization.strip())
    if m is None:
        raise SigV4Error(f"the Authorization header is not an {ALGORITHM} signature")
    parts = m["cred"].split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        raise SigV4Error("the credential scope is not <access key>/<date>/<region>/<service>/aws4_request")
    scope = Scope(*parts[:4])
    signed = tuple(m["signed"].split(";"))
    if list(signed) != sorted(set(signed)):
        raise SigV4Error("SignedHeaders are not sorted and distinct")
    for needed in ("host", "x-amz-date"):
        if needed not in signed:
            raise SigV4Error(f"the signature does not cover the {needed} header")
    missing = [h for h in signed if h not in headers]
    if missing:
        raise SigV4Error(f"signed headers missing from the request: {', '.join(missing)}")
    amz_date = headers["x-amz-date"]
    if not _DATE_RE.match(amz_date):
        raise SigV4Error("X-Amz-Date is not YYYYMMDDTHHMMSSZ")
    try:  # (strptime was a tenth of the proxy's work per call)
        when = datetime(int(amz_date[0:4]), int(amz_date[4:6]), int(amz_date[6:8]), int(amz_date[9:11]),
                        int(amz_date[11:13]), int(amz_date[13:15]), tzinfo=UTC)
    except ValueError:
        raise SigV4Error("X-Amz-Date is not a valid date and time") from None
    if abs(now - when) > SKEW:
        raise SigV4Error("the signature's date is more than 5 minutes from the server's clock")
    if scope.date != amz_date[:8]:
        raise SigV4Error("the credential scope's date is not X-Amz-Date's")
    return Signed(scope=scope, amz_date=amz_date, signed_headers=signed, signature=m["sig"])


def signing_key(secret: str, scope: Scope) -> bytes:
    """kSigning: HMAC-SHA256 chained over date, region, service and "aws4_request"."""
    key = ("AWS4" + secret).encode()
    for part in (scope.date, scope.region, scope.service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def canonical_uri(raw_path: str) -> str:
    """The path as sent, dot segments removed, percent-encoded once more: AWS's rule for
    every service but S3 (botocore's `_normalize_url_path`)."""
    path = posixpath.normpath(raw_path) if raw_path not in ("", "/") else "/"
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if raw_path.endswith("/") and not path.endswith("/"):
        path += "/"
    return quote(path, safe="/~")


def canonical_query(query: str) -> str:
    if not query:
        return ""
    pairs = []
    for item in query.split("&"):
        name, _, value = item.partition("=")
        pairs.append((quote(unquote(name), safe="-_.~"), quote(unquote(value), safe="-_.~")))
    return "&".join(f"{n}={v}" for n, v in sorted(pairs))


def string_to_sign(signed: Signed, *, method: str, raw_path: str, query: str,
                   headers: dict[str, str], body: bytes) -> str:
    payload = hashlib.sha256(body).hexdigest()
    claimed = headers.get("x-amz-content-sha256")
    if claimed is not None and claimed != payload:
        raise SigV4Error("x-amz-content-sha256 is not the body's SHA-256")
    canonical_headers = "".join(f"{h}:{' '.join(headers[h].split())}\n" for h in signed.signed_headers)
    request = "\n".join((method.upper(), canonical_uri(raw_path), canonical_query(query), canonical_headers,
                         ";".join(signed.signed_headers), payload))
    s = signed.scope
    return "\n".join((ALGORITHM, signed.amz_date, f"{s.date}/{s.region}/{s.service}/aws4_request",
                      hashlib.sha256(request.encode()).hexdigest()))


def verify(signed: Signed, key: bytes, *, method: str, raw_path: str, query: str,
           headers: dict[str, str], body: bytes) -> None:
    expected = hmac.new(key, string_to_sign(signed, method=method, raw_path=raw_path, query=query, headers=headers,
                                            body=body).encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signed.signature):
        raise SigV4Error("the signature does not match the request")


def header_map(pairs: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    """Lower-case names; repeated headers joined by commas, as SigV4 canonicalises them."""
    out: dict[str, str] = {}
    for name, value in pairs:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1").strip()
        out[key] = f"{out[key]},{text}" if key in out else text
    return out
