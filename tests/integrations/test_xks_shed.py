"""Load shedding of the XKS proxy (api/hotpath.py, routes/xks_proxy.py `XksAdmission`):
past `STRONGROOM_XKS_MAX_IN_FLIGHT` calls in flight a call is answered 429
ThrottlingException at once, counted in /metrics, summed into one `xks.shed` audit
record per interval, and the proxy serves again once the burst is over. A real HTTPS
server (tests/conftest.py `serving_https`) on the session's store, with the bound set
low; every request signed by botocore as in test_xks.py."""

from __future__ import annotations

import base64
import copy
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from keyserver.api.app import create_app
from keyserver.services import Services
from tests.conftest import serving_https
from tests.integrations.test_xks import Xks, _events, _key

BOUND = 1
BURST = 40


@pytest.fixture(scope="module")
def bounded_url(services: Services) -> Iterator[str]:
    """The application as `keyserver serve` runs it with STRONGROOM_XKS_MAX_IN_FLIGHT=1,
    on the session's store."""
    configured = copy.copy(services)
    configured.settings = services.settings.model_copy(update={"xks_max_in_flight": BOUND})
    with serving_https(create_app(configured, run_background=False), configured) as url:
        yield url


def _burst(xks: Xks, tls: Any, ext: str, enc: dict[str, Any]) -> list[httpx.Response]:
    """BURST signed calls (half Encrypt, half Decrypt), each on its own connection,
    released together."""
    start = threading.Barrier(BURST)
    clients = [httpx.Client(base_url=xks.base_url, verify=tls, timeout=30) for _ in range(BURST)]

    def one(i: int) -> httpx.Response:
        caller = copy.copy(xks)
        caller.http = clients[i]
        start.wait()
        return caller.encrypt(ext, b"data key", b"ctx") if i % 2 else caller.decrypt(ext, enc, b"ctx")

    try:
        with ThreadPoolExecutor(BURST) as pool:
            return list(pool.map(one, range(BURST)))
    finally:
        for c in clients:
            c.close()


def _shed_records(services: Services, admin: httpx.Client, store: str, expected: int) -> list[dict[str, Any]]:
    """The store's `xks.shed` records once they account for `expected` shed calls (they
    are written at the end of each one-second interval)."""
    deadline = time.monotonic() + 15
    while True:
        records = _events(services, admin, action="xks.shed", object_id=store)
        if sum(r["details"]["shed"] for r in records) >= expected or time.monotonic() > deadline:
            return records
        time.sleep(0.3)


def test_past_the_bound_calls_are_shed_counted_audited_then_served(
        admin: httpx.Client, bounded_url: str, tls: Any, services: Services) -> None:
    xks = Xks(admin, bounded_url, tls)
    ext = xks.grant(admin, _key(admin))
    r = xks.encrypt(ext, b"data key", b"ctx")  # one at a time: never shed
    assert r.status_code == 200, r.text
    enc = r.json()

    answers: list[httpx.Response] = []
    for _ in range(5):  # the first burst sheds in practice; a few more if the scheduler did not
        answers += _burst(xks, tls, ext, enc)
        if any(a.status_code == 429 for a in answers):
            break
    shed = [a for a in answers if a.status_code != 200]
    served = [a for a in answers if a.status_code == 200]
    assert shed and served, [a.status_code for a in answers]
    for a in shed:
        assert a.status_code == 429, a.text
        body = a.json()
        assert set(body) == {"errorName", "errorMessage"} and body["errorName"] == "ThrottlingException", body
        assert a.headers["content-type"] == "application/json"
    for a in served:
        assert set(a.json()) in ({"plaintext"}, {"authenticationTag", "ciphertext", "initializationVector",
                                                 "ciphertextMetadata"}), a.text
        if "plaintext" in a.json():
            assert base64.b64decode(a.json()["plaintext"]) == b"data key"

    # One record per interval, not per call: together they count every shed call.
    records = _shed_records(services, admin, xks.name, len(shed))
    assert sum(r["details"]["shed"] for r in records) == len(shed), records
    assert len(records) == 1 or len(records) < len(shed), records
    for rec in records:
        assert rec["outcome"] == "denied" and rec["actor"] == "anonymous", rec
        assert rec["object_type"] == "xks_store" and rec["object_id"] == xks.name, rec
        d = rec["details"]
        assert d["refused"] == "ThrottlingException" and d["max_in_flight"] == BOUND, d
        assert d["stores"] == {xks.name: d["shed"]} and d["source_ips"] == {"127.0.0.1": d["shed"]}, d
        assert set(d["operations"]) <= {"encrypt", "decrypt"} and sum(d["operations"].values()) == d["shed"], d
        assert d["since"] <= d["until"], d

    # A shed call did none of the call's work: the key's records are the served calls'.
    crypto = [e for e in _events(services, admin, actor=f"xks:{xks.name}")
              if e["action"] in ("key.encrypt", "key.decrypt")]
    assert len(crypto) == len(served) + 1, (len(crypto), len(served))

    metrics = admin.get(f"{bounded_url}/metrics")
    assert metrics.status_code == 200, metrics.text
    found = re.search(r"^strongroom_xks_shed_total (\S+)$", metrics.text, re.M)
    assert found is not None and float(found.group(1)) == len(shed), metrics.text
    answered = re.search(r'^strongroom_http_requests_total\{method="POST",route="/xks/\{store\}/kms/xks/v1/keys/'
                         r'\{key_id\}/\{operation\}",status="429"\} (\S+)$', metrics.text, re.M)
    assert answered is not None and float(answered.group(1)) == len(shed), metrics.text

    # After the burst: served again, one call at a time.
    for _ in range(5):
        r = xks.decrypt(ext, enc, b"ctx")
        assert r.status_code == 200, r.text
    r = xks.call("/health", {"requestMetadata": {"kmsRequestId": "h-after", "kmsOperation": "KmsHealthCheck"}})
    assert r.status_code == 200, r.text
