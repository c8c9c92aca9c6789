"""Audit sinks against real receivers: a JSON-lines file (rotated), rsyslog from Debian
over TLS (RFC 5425), and an HTTPS webhook served by the test. Delivery is at-least-once
from a cursor that survives a restart; a copy of a sink's stream verifies the chain from
outside; fail-closed refuses key operations while no sink accepts (issue 15)."""

from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from hsm import HsmBackend
from keyserver.core.audit_sinks import AuditSinks, FileSink, SyslogSink, WebhookSink
from keyserver.core.errors import ServiceUnavailable
from keyserver.core.keys import KeySpec
from keyserver.core.principal import system_context
from keyserver.services import Services
from keyserver.settings import Settings
from tests.api.test_health_and_faults import serve
from tests.conftest import own_services, own_store, services_on, unique
from tests.serve import free_port

RSYSLOGD = "/usr/sbin/rsyslogd"


def _services(tmp_path: Path, hsm_backend: HsmBackend, url: str | None,
              **settings: Any) -> contextlib.AbstractContextManager[Services]:
    return services_on(url, tmp_path / "data", hsm_backend, audit_checkpoint_records=4,
                       audit_checkpoint_seconds=3600, **settings)


def _store(tmp_path: Path, hsm_backend: HsmBackend, **settings: Any) -> contextlib.AbstractContextManager[Services]:
    return own_services(tmp_path / "data", hsm_backend, audit_checkpoint_records=4, audit_checkpoint_seconds=3600,
                        **settings)


def _records(svc: Services, n: int) -> None:
    for i in range(n):
        svc.audit.record_now(system_context("tests"), action="test.event", outcome="allowed", details={"i": i})
        svc.audit.flush()


def _lines(*files: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]


def _checked(items: list[dict[str, Any]], head: int) -> None:
    """Every record 1..head exactly once, in order, and each checkpoint right after
    the record it covers (at-least-once may repeat a batch: duplicates are allowed)."""
    seqs = [i["seq"] for i in items if i["type"] == "record"]
    assert sorted(set(seqs)) == list(range(1, head + 1)) and seqs == sorted(seqs)
    last = 0
    for i in items:
        if i["type"] == "record":
            last = i["seq"]
        else:
            assert i["seq"] <= last


# --- file ------------------------------------------------------------------------------
def test_file_sink_rotates_resumes_after_a_restart_and_is_an_outside_copy(
        services: Services, hsm_backend: HsmBackend, tmp_path: Path) -> None:
    out = tmp_path / "sink" / "audit.jsonl"
    sink = {"name": "local", "type": "file", "path": str(out), "max_bytes": 4096, "keep": 50}
    with own_store() as url:
        with _services(tmp_path, hsm_backend, url, audit_sinks=[sink]) as svc:
            _records(svc, 30)
            svc.sinks.flush()
        # a restart: the cursor is in the database, and so are the records still to go
        with _services(tmp_path, hsm_backend, url, audit_sinks=[sink]) as svc:
            _records(svc, 10)
            svc.sinks.flush()
            head = svc.audit.status()["head_seq"]
            rotated = sorted(out.parent.glob("audit.jsonl.*"), key=lambda p: -int(p.suffix[1:]))
            assert len(rotated) >= 3, "4 KiB files: the stream was rotated"
            assert all(p.stat().st_size <= 4096 for p in [*rotated, out])
            items = _lines(*rotated, out)
            _checked(items, head)
            status = svc.sinks.status()[0]
            assert (status.delivered_seq, status.backlog, status.healthy) == (head, 0, True)
            checkpoints = [i for i in items if i["type"] == "checkpoint"]
            assert len(checkpoints) >= 5
            assert svc.audit.verify(outside=checkpoints).ok


class _SlowFileSink(FileSink):
    """A file sink whose first send waits until the test lets it go: the window in which
    a second delivery in the same replica (flush() beside the sink's thread) could read
    the same cursor and send the same batch again."""

    def __init__(self, name: str, path: Path) -> None:
        super().__init__(name, path)
        self.inside, self.go, self.sends = threading.Event(), threading.Event(), 0

    def send(self, items: list[dict[str, Any]]) -> None:
        self.sends += 1
        if self.sends == 1:
            self.inside.set()
            assert self.go.wait(60)
        super().send(items)


def test_deliveries_in_one_replica_do_not_overlap(services: Services, hsm_backend: HsmBackend,
                                                  tmp_path: Path) -> None:
    """Seen on a loaded machine: flush() and the sink's thread both sent what followed one
    cursor, and the file read 1..5 then 3..5 again. Within one replica the stream stays in
    order and each batch goes once."""
    out = tmp_path / "sink" / "audit.jsonl"
    with _store(tmp_path, hsm_backend) as svc:
        _records(svc, 3)
        slow = _SlowFileSink("slow", out)
        sinks = AuditSinks(svc.db, [slow])
        first = threading.Thread(target=sinks.deliver_once, args=(slow,))
        first.start()
        assert slow.inside.wait(60)
        second = threading.Thread(target=sinks.deliver_once, args=(slow,))
        second.start()
        second.join(1.0)  # without the per-sink lock it would send the same batch meanwhile
        slow.go.set()
        first.join(60)
        second.join(60)
        sinks.flush()
        seqs = [i["seq"] for i in _lines(out) if i["type"] == "record"]
        assert seqs == sorted(set(seqs)) == list(range(1, svc.audit.status()["head_seq"] + 1))


def test_a_failing_sink_is_reported_and_fail_closed_refuses_key_operations_until_it_recovers(
        services: Services, hsm_backend: HsmBackend, tmp_path: Path) -> None:
    target = tmp_path / "blocked.jsonl"
    target.mkdir()  # a directory where the file should be: every write fails
    sink = {"name": "blocked", "type": "file", "path": str(target)}
    with _store(tmp_path, hsm_backend, audit_sinks=[sink], audit_fail_closed=True) as svc:
        ctx = system_context("tests")
        svc.keys.create(ctx, KeySpec(name=unique("before")))  # nothing has failed yet
        svc.sinks.start()
        deadline = time.monotonic() + 15
        while svc.sinks.refusal() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert svc.sinks.refusal() is not None
        with pytest.raises(ServiceUnavailable) as e:
            svc.keys.create(ctx, KeySpec(name=unique("during")))
        assert e.value.code == "audit_unavailable" and "blocked" in e.value.message
        assert svc.keys.list(ctx)[1] >= 1  # reads stay open
        with serve(svc) as url:  # and a balancer sees why this replica cannot serve key operations
            ready = httpx.get(f"{url}/readyz")
            assert ready.status_code == 503 and "no audit sink accepts" in ready.json()["checks"]["audit_sinks"]
        status = svc.sinks.status()[0]
        assert not status.healthy and "IsADirectoryError" in (status.last_error or "")
        target.rmdir()  # the receiver is back
        deadline = time.monotonic() + 30
        while svc.sinks.refusal() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert svc.sinks.refusal() is None
        svc.keys.create(ctx, KeySpec(name=unique("after")))
        with serve(svc) as url:
            ready = httpx.get(f"{url}/readyz")
            assert ready.status_code == 200 and ready.json()["checks"]["audit_sinks"] == "ok"
        svc.audit.flush()
        svc.sinks.flush()
        items = _lines(target)
        refused = [i for i in items if i["type"] == "record" and i["outcome"] == "error"
                   and i["details"].get("refused")]
        assert refused and refused[0]["action"] == "key.create"  # the refusal itself reached the sink
        _checked(items, svc.audit.status()["head_seq"])


# --- syslog over TLS, received by rsyslog ----------------------------------------------
def _ca_and_server(d: Path) -> tuple[Path, Path, Path]:
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test syslog CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = d / "ca.pem", d / "server.pem", d / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@contextlib.contextmanager
def _rsyslog(d: Path) -> Iterator[tuple[int, Path, Path]]:
    if not Path(RSYSLOGD).exists():
        pytest.fail("scripts/test installs rsyslog and rsyslog-gnutls; rsyslogd is missing")
    ca, cert, key = _ca_and_server(d)
    port, out, work = free_port(), d / "received.log", d / "work"
    work.mkdir()
    conf = d / "rsyslog.conf"
    conf.write_text(f'''
global(workDirectory="{work}" DefaultNetstreamDriver="gtls" DefaultNetstreamDriverCAFile="{ca}"
       DefaultNetstreamDriverCertFile="{cert}" DefaultNetstreamDriverKeyFile="{key}")
module(load="imtcp" StreamDriver.Name="gtls" StreamDriver.Mode="1" StreamDriver.AuthMode="anon")
input(type="imtcp" address="127.0.0.1" port="{port}")
template(name="json_only" type="string" string="%msgid% %msg%\\n")
action(type="omfile" file="{out}" template="json_only")
''')
    proc = subprocess.Popen([RSYSLOGD, "-n", "-f", str(conf), "-i", str(d / "rsyslogd.pid")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert proc.poll() is None, (proc.stdout.read() if proc.stdout else b"").decode()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.1)
        yield port, ca, out
    finally:
        proc.terminate()
        proc.wait(10)


def test_syslog_sink_delivers_rfc5424_over_tls_to_rsyslog(services: Services, hsm_backend: HsmBackend,
                                                           tmp_path: Path) -> None:
    with _rsyslog(tmp_path) as (port, ca, received):
        sink = {"name": "siem", "type": "syslog", "host": "127.0.0.1", "port": port, "ca_file": str(ca),
                "server_name": "localhost"}
        with _store(tmp_path, hsm_backend, audit_sinks=[sink]) as svc:
            _records(svc, 9)
            svc.sinks.flush()
            head = svc.audit.status()["head_seq"]
            deadline = time.monotonic() + 20
            items: list[dict[str, Any]] = []
            while time.monotonic() < deadline:
                if received.exists():
                    rows = [line.split(" ", 1) for line in received.read_text().splitlines() if line.strip()]
                    items = [json.loads(msg) for _, msg in rows]
                    if len([i for i in items if i["type"] == "record"]) >= head:
                        break
                time.sleep(0.2)
            assert all(msgid == item["type"] for (msgid, _), item in zip(rows, items, strict=True))
            _checked(items, head)
            assert svc.audit.verify(outside=[i for i in items if i["type"] == "checkpoint"]).ok
    # A receiver that is not the one named fails TLS verification: nothing is sent.
    wrong = SyslogSink("wrong", "127.0.0.1", free_port(), ca_file=ca, server_name="localhost")
    with pytest.raises(OSError):
        wrong.send([{"type": "record", "seq": 1}])


# --- HTTPS webhook ---------------------------------------------------------------------
def test_webhook_sink_posts_batches_and_retries_until_accepted(services: Services, hsm_backend: HsmBackend,
                                                              tmp_path: Path) -> None:
    ca, cert, key = _ca_and_server(tmp_path)
    received: list[list[dict[str, Any]]] = []
    answers = [503]  # the first POST is refused: the batch must come again

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            status = answers.pop(0) if answers else 200
            if status == 200:
                received.append(body)
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"https://localhost:{server.server_address[1]}/audit"
        with _store(tmp_path, hsm_backend,
                    audit_sinks=[{"name": "hook", "type": "webhook", "url": url, "ca_file": str(ca)}]) as svc:
            _records(svc, 6)
            hook = svc.sinks._sinks[0]
            with pytest.raises(OSError, match="503"):
                svc.sinks.deliver_once(hook)
            assert svc.sinks.status()[0].delivered_seq == 0  # refused: the cursor stays
            svc.sinks.flush()
            _checked([i for batch in received for i in batch], svc.audit.status()["head_seq"])
    finally:
        server.shutdown()
    with pytest.raises(ValueError, match="https"):
        WebhookSink("plain", "http://localhost/audit")


def test_sink_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="needs 'path'"):
        Settings(audit_sinks=[{"name": "x", "type": "file"}])
    with pytest.raises(ValueError, match="https"):
        Settings(audit_sinks=[{"name": "x", "type": "webhook", "url": "http://siem/"}])
    with pytest.raises(ValueError):
        Settings(audit_sinks=[{"name": "Bad Name", "type": "syslog", "host": "siem"}])
