"""`kms-bench xks`: the open-loop rig ends whatever the server does and accounts for every
scheduled request — answered, failed, timed out or never sent — and its report judges
issue 28's target from the run's own figures. Nothing here measures speed: the rates are
tiny and no assertion depends on how fast this machine is."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ipaddress
import json
import math
import socket
import ssl
import subprocess
import sys
import threading
import time
from array import array
from collections import Counter
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from keyserver.core.keys import KeySpec
from keyserver.core.principal import system_context
from keyserver.services import Services
from kmsbench import xks_load, xks_sender
from tests.conftest import unique

MIX = xks_load.DEFAULT_MIX


def _job(port: int, ca: str, **extra: Any) -> dict[str, Any]:
    base = {"host": "127.0.0.1", "port": port, "ca": ca, "path": "/xks/s/kms/xks/v1", "key": "k",
            "region": "eu-west-1", "access": "AKIDEXAMPLE", "secret": "s" * 40,
            "sample": {"aad": "", "ciphertext": "", "initializationVector": "", "authenticationTag": "",
                       "ciphertextMetadata": ""}}
    return xks_load.jobs_for(base, rate=50, seconds=1, senders=1, connections=3, timeout=1.0, mix=MIX)[0] | extra


def _fates(result: dict[str, Any]) -> Counter[str]:
    codes = array("H")
    codes.frombytes(result["codes"])
    return Counter(result["classes"][c] for c in codes)


# --- the schedule ---------------------------------------------------------------------------

def test_the_mix_is_spread_through_the_schedule() -> None:
    ops = xks_sender.pattern(MIX)
    assert Counter(ops) == {"encrypt": 45, "decrypt": 45, "metadata": 10}
    assert max(len(list(same)) for _, same in groupby(ops)) <= 2  # no stretch of one kind
    assert xks_load.parse_mix("encrypt=50,decrypt=50,metadata=0") == {"encrypt": 50, "decrypt": 50}
    for bad in ("encrypt=50,decrypt=40", "sign=100", "encrypt=lots"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"mix|OPERATION"):
            xks_load.parse_mix(bad)


def test_the_senders_share_one_evenly_spaced_schedule() -> None:
    jobs = xks_load.jobs_for({"x": 1}, rate=7, seconds=3, senders=2, connections=5, timeout=1.0, mix=MIX)
    assert [j["count"] for j in jobs] == [11, 10] and [j["connections"] for j in jobs] == [3, 2]
    assert len({j["source"] for j in jobs}) == 2  # the server counts connections per address
    due = sorted(xks_sender.due(j, 100.0, i) for j in jobs for i in range(j["count"]))
    assert due == pytest.approx([100.0 + k / 7 for k in range(21)])


# --- a server that does not answer, or is not there: the run still ends ----------------------

@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kms-bench test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    d = tmp_path_factory.mktemp("stuck")
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (d / "cert.pem").write_bytes(pem)
    (d / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return pem.decode(), d / "cert.pem", d / "key.pem"


@pytest.fixture
def stuck_server(certificate: tuple[str, Path, Path]) -> Iterator[int]:
    """A TLS server that accepts connections and reads requests, and never answers: an
    overloaded proxy as its clients see it."""
    _, cert, key = certificate
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def hold(conn: socket.socket) -> None:
        try:
            tls = ctx.wrap_socket(conn, server_side=True)
            held.append(tls)
            tls.settimeout(0.2)
            while not stop.is_set():
                try:
                    if not tls.recv(65536):
                        return
                except TimeoutError:
                    continue
        except OSError:
            return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=hold, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(5)
    listener.close()
    for conn in held:
        conn.close()


def test_a_server_that_never_answers_gives_timeouts_not_a_hang(stuck_server: int,
                                                                certificate: tuple[str, Path, Path]) -> None:
    job = _job(stuck_server, certificate[0])
    requests = [b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"] * job["count"]
    reports: list[dict[str, Any]] = []

    async def go() -> dict[str, Any]:
        return await xks_sender.drive(job, requests, [None] * job["connections"], time.monotonic() + 0.1,
                                         reports.append)

    result = asyncio.run(go())
    fates = _fates(result)
    assert sum(fates.values()) == job["count"] == 50
    assert fates[xks_sender.TIMEOUT] >= 1 and xks_sender.OK not in fates
    assert set(fates) <= {xks_sender.TIMEOUT, xks_sender.NO_CONNECTION, xks_sender.CLIENT_BEHIND}
    latency = array("d")
    latency.frombytes(result["latency"])
    assert all(math.isnan(x) for x in latency)  # nothing answered, so no latency is made up
    assert reports and all(0 <= r["dispatched"] <= 50 for r in reports)  # progress came while it ran


def test_a_port_nobody_listens_on_gives_connection_failures(certificate: tuple[str, Path, Path]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    job = _job(port, certificate[0])

    async def go() -> dict[str, Any]:
        return await xks_sender.drive(job, [b"x"] * job["count"], [None] * 3, time.monotonic() + 0.1)

    fates = _fates(asyncio.run(go()))
    assert sum(fates.values()) == 50 and fates["connection refused"] >= 1 and xks_sender.OK not in fates


def test_a_sender_that_fails_is_reported_and_stopped(certificate: tuple[str, Path, Path]) -> None:
    job = _job(1, certificate[0])
    del job["sample"]  # signing fails in the sender process
    with pytest.raises(xks_load.SenderFailure, match="KeyError: 'sample'"):
        xks_load.load([job], seconds=1, say=lambda line: None)


# --- the real proxy ---------------------------------------------------------------------------

def test_the_rig_against_the_key_servers_xks_proxy(services: Services, base_url: str) -> None:
    ctx = system_context("kms-bench-test")
    key, store_name = unique("xksbench"), unique("xksbench")
    services.keys.create(ctx, KeySpec(name=key))
    store = services.xks.create(ctx, name=store_name, region="eu-west-1")
    services.xks.grant(ctx, store_name, key=key)
    base = {"host": "127.0.0.1", "port": int(base_url.rsplit(":", 1)[1]), "ca": services.ca.certificate_pem().decode(),
            "path": f"/xks/{store_name}/kms/xks/v1", "key": key, "region": "eu-west-1", "source": "127.0.0.1",
            "access": store.store.access_key_id, "secret": store.secret_access_key}
    assert xks_load._first_encrypt(base) is None
    # A timeout far above any answer on a loaded machine: this checks accounting, not speed.
    jobs = xks_load.jobs_for(base, rate=40, seconds=1, senders=2, connections=4, timeout=60.0, mix=MIX)
    lines: list[str] = []
    run = xks_load.figures(jobs, xks_load.load(jobs, seconds=1, say=lines.append), seconds=1)
    assert run["scheduled"] == 40 and run["failed"] == {} and run["ok"] == 40, run["failed"]
    assert {op: o["scheduled"] for op, o in run["operations"].items()} == {"encrypt": 18, "decrypt": 18,
                                                                          "metadata": 4}
    assert run["p99_ms"] is not None
    assert lines and "40 requests over 1 s" in lines[0]


# --- the report -------------------------------------------------------------------------------

def _run(p99: float | None, failed: dict[str, int] | None = None) -> dict[str, Any]:
    op = {"scheduled": 100, "ok": 100, "p50_ms": 4.0, "p99_ms": p99}
    return {"scheduled": 1000, "ok": 1000 - sum((failed or {}).values()), "failed": failed or {},
            "answered_ok_per_s": 1795.0, "elapsed_s": 30.1, "p50_ms": 4.0, "p90_ms": 9.0, "p99_ms": p99,
            "p999_ms": None, "max_ms": None, "within_budget_pct": 99.5,
            "operations": {"encrypt": op, "decrypt": op, "metadata": op},
            "client": {"lag_p99_ms": 1.0, "lag_max_ms": 3.0, "cpu_ms_per_request": 0.3, "reconnects": 0},
            "audit_behind": 120, "audit_caught_up_s": 0.4}


def _result(rate: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    r = {"machine": {"cpu": "CPU", "cores": 2, "memory_gib": 24, "python": "3.11"}, "when": "2026-11-26",
         "offered_rate": rate, "seconds": 30, "senders": 2, "connections": 64, "timeout_s": 2.0, "mix": MIX,
         "database": "PostgreSQL", "workers": 2, "runs": runs}
    return r | {"summary": xks_load.summarise(r)}


def test_the_target_is_judged_from_the_runs() -> None:
    assert xks_load.summarise(_result(1800, [_run(80.0), _run(90.0), _run(140.0)]))["target"]["met"]
    missed = {
        "slow": _result(1800, [_run(80.0), _run(130.0), _run(140.0)]),
        "failures": _result(1800, [_run(80.0), _run(80.0, {"timeout": 1}), _run(80.0)]),
        "too many failures for a p99": _result(1800, [_run(None, {"timeout": 20})] * 3),
        "low rate": _result(100, [_run(80.0)] * 3),
    }
    for why, r in missed.items():
        assert not r["summary"]["target"]["met"], why
        assert "**missed**" in xks_load.render(r), why
    assert "median p99 a miss" in xks_load.render(missed["too many failures for a p99"])
    assert "timeout: 1" in xks_load.render(missed["failures"])


def test_a_saved_result_goes_into_the_benchmarks_document(tmp_path: Path) -> None:
    saved = tmp_path / "xks.json"
    saved.write_text(json.dumps(_result(1800, [_run(80.0), _run(90.0), _run(100.0)])))
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nprose\n")
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "kmsbench", "xks", "--from-json", str(saved), "--docs", str(doc)],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
    text = doc.read_text()
    assert text.count(xks_load.HEADING) == 1 and text.count(f"<!-- {xks_load.SECTION}:start -->") == 1
    assert "| median (min-max) | | | | 1,795 (1,795-1,795) | 4.0 (4.0-4.0) |" in text and "**met**" in text
    assert "prose" in text
