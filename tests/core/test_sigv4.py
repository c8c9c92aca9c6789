"""core/sigv4.py against botocore's own signer: what botocore signs verifies, and any
change to the signed parts, the scope or the clock is refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from keyserver.core import sigv4

HOST = "kms.example.test:8443"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEYxx"


def _signed(path: str, body: bytes, *, query: str = "", extra: dict[str, str] | None = None,
            payload_header: bool = False) -> dict[str, str]:
    url = f"https://{HOST}{path}" + (f"?{query}" if query else "")
    headers = {"Content-Type": "application/json", **(extra or {})}
    if payload_header:
        import hashlib
        headers["X-Amz-Content-SHA256"] = hashlib.sha256(body).hexdigest()
    request = AWSRequest(method="POST", url=url, data=body, headers=headers)
    SigV4Auth(Credentials("SRXKSEXAMPLE", SECRET), "kms-xks-proxy", "eu-west-1").add_auth(request)
    out = {k.lower(): v for k, v in request.headers.items()}
    out["host"] = HOST
    return out


def _verify(headers: dict[str, str], path: str, body: bytes, *, query: str = "", secret: str = SECRET,
            now: datetime | None = None) -> None:
    signed = sigv4.parse(headers.get("authorization"), headers, now=now or datetime.now(UTC))
    sigv4.verify(signed, sigv4.signing_key(secret, signed.scope), method="POST", raw_path=path, query=query,
                 headers=headers, body=body)


@pytest.mark.parametrize("path", ["/xks/s/kms/xks/v1/keys/a%20b/encrypt", "/xks/s/kms/xks/v1/keys/a.b~c_d-e/decrypt",
                                  "/xks/s/kms/xks/v1/health", "/"])
def test_botocore_signatures_verify(path: str) -> None:
    _verify(_signed(path, b'{"x": 1}'), path, b'{"x": 1}')


def test_query_extra_headers_and_payload_header_verify() -> None:
    path = "/xks/s/kms/xks/v1/health"
    headers = _signed(path, b"{}", query="b=2&a=1&c=x%2Fy", extra={"X-Custom": "  two   spaces  "},
                      payload_header=True)
    _verify(headers, path, b"{}", query="b=2&a=1&c=x%2Fy")


def test_changes_are_refused() -> None:
    path = "/xks/s/kms/xks/v1/health"
    headers = _signed(path, b"{}")
    with pytest.raises(sigv4.SigV4Error, match="does not match"):
        _verify(headers, path, b"{ }")
    with pytest.raises(sigv4.SigV4Error, match="does not match"):
        _verify(headers, "/xks/t/kms/xks/v1/health", b"{}")
    with pytest.raises(sigv4.SigV4Error, match="does not match"):
        _verify(headers, path, b"{}", secret=SECRET + "x")
    with pytest.raises(sigv4.SigV4Error, match="does not match"):
        _verify({**headers, "content-type": "text/plain"}, path, b"{}")
    with pytest.raises(sigv4.SigV4Error, match="5 minutes"):
        _verify(headers, path, b"{}", now=datetime.now(UTC) + timedelta(minutes=6))
    with pytest.raises(sigv4.SigV4Error, match="x-amz-content-sha256"):
        _verify({**headers, "x-amz-content-sha256": "0" * 64}, path, b"{}")
    with pytest.raises(sigv4.SigV4Error, match="missing"):
        _verify({k: v for k, v in headers.items() if k != "authorization"}, path, b"{}")
    with pytest.raises(sigv4.SigV4Error, match="not an AWS4-HMAC-SHA256"):
        _verify({**headers, "authorization": "Bearer x"}, path, b"{}")
    unsigned_host = headers["authorization"].replace("SignedHeaders=content-type;host;x-amz-date",
                                                     "SignedHeaders=content-type;x-amz-date")
    with pytest.raises(sigv4.SigV4Error, match="host"):
        _verify({**headers, "authorization": unsigned_host}, path, b"{}")
    # A date of the right shape that is no date (month 13) is refused, never a 500.
    with pytest.raises(sigv4.SigV4Error, match="not a valid date"):
        _verify({**headers, "x-amz-date": "20261301T000000Z"}, path, b"{}")
    with pytest.raises(sigv4.SigV4Error, match="YYYYMMDD"):
        _verify({**headers, "x-amz-date": "2026-01-01T00:00:00Z"}, path, b"{}")
