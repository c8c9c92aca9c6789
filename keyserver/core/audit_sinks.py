"""Audit sinks: the chain's records and signed checkpoints, copied off the server.

Like Vault's audit devices: a JSON-lines file (rotated by size), syslog (RFC 5424 over
TCP with TLS, RFC 5425 framing) and an HTTPS webhook. Delivery is at-least-once:

* The database is the spool. Each sink has a cursor row (`audit_sink_cursors`: the last
  record and checkpoint it accepted). A delivery thread per sink and replica reads what
  follows the cursor, hands it to the sink, and only when the sink has accepted it
  (file: written and fsynced; syslog: written to the TLS stream; webhook: a 2xx) moves
  the cursor, with a compare-and-set. A crash, a restart or an unreachable receiver
  loses nothing: delivery resumes from the cursor. A batch may be delivered twice (a
  crash after the sink accepted it, or two replicas racing); receivers deduplicate on
  `seq` (records) and `checkpoint` (checkpoints).
* Checkpoints travel in the same stream, right after the record they cover: a copy of
  the stream is an outside copy for `verify-audit --checkpoints`.
* Fail closed (optional): while no sink accepts, key operations are refused
  (503 `audit_unavailable`) — reads and the audit itself stay available, so operators
  can see why.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import httpx
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.audit.checkpoints import checkpoint_dict
from keyserver.core.audit.record import event_dict, iso, utcnow
from keyserver.store.models import AuditCheckpoint, AuditEvent, AuditSinkCursor

log = logging.getLogger(__name__)
BATCH = 500
SEND_TIMEOUT = 10.0


class Sink(Protocol):
    name: str
    kind: str

    def send(self, items: list[dict[str, Any]]) -> None:
        """Deliver `items` in order; return only once the receiver has them. Raises on failure."""

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SinkStatus:
    name: str
    kind: str
    delivered_seq: int
    delivered_checkpoint: int
    backlog: int
    delivered_at: datetime | None
    last_error: str | None
    failing_since: datetime | None

    @property
    def healthy(self) -> bool:
        return self.failing_since is None


def _line(item: dict[str, Any]) -> bytes:
    return json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


class FileSink:
    """JSON lines appended to `path`, fsynced per batch; when the file would pass
    `max_bytes` it is rotated (path → path.1 → … → path.<keep>, the oldest dropped)."""

    kind = "file"

    def __init__(self, name: str, path: Path, *, max_bytes: int = 100 * 1024 * 1024, keep: int = 10) -> None:
        self.name, self._path, self._max, self._keep = name, Path(path), max_bytes, keep
        self._path.parent.mkdir(parents=True, exist_ok=True)

    def _rotate(self) -> None:
        for i in range(self._keep - 1, 0, -1):
            older = self._path.with_name(f"{self._path.name}.{i}")
            if older.exists():
                older.replace(self._path.with_name(f"{self._path.name}.{i + 1}"))
        self._path.replace(self._path.with_name(f"{self._path.name}.1"))

    def send(self, items: list[dict[str, Any]]) -> None:
        try:
            size = self._path.stat().st_size
        except FileNotFoundError:
            size = 0
        chunk: list[bytes] = []
        for line in map(_line, items):
            if size and size + len(line) > self._max:
                self._write(b"".join(chunk))  # durable before it is renamed away
                chunk, size = [], 0
                self._rotate()
            chunk.append(line)
            size += len(line)
        self._write(b"".join(chunk))

    def _write(self, data: bytes) -> None:
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        pass


# RFC 5424 severities: informational for what was allowed, notice for refusals and errors.
_SEVERITY = {"allowed": 6, "denied": 5, "error": 5}


class SyslogSink:
    """RFC 5424 messages over TCP with TLS (RFC 5425: octet-counted frames), one per
    record or checkpoint; MSGID `record` or `checkpoint`, the JSON as MSG. The server's
    certificate is verified against `ca_file` (or the system's trust store) and its name."""

    kind = "syslog"

    def __init__(self, name: str, host: str, port: int = 6514, *, ca_file: Path | None = None,
                 facility: int = 10, app_name: str = "strongroom", server_name: str | None = None) -> None:
        self.name, self._host, self._port, self._facility, self._app = name, host, port, facility, app_name
        self._server_name = server_name or host
        self._ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        self._ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self._sock: ssl.SSLSocket | None = None
        self._hostname = socket.gethostname()[:255] or "-"

    def _connect(self) -> ssl.SSLSocket:
        if self._sock is None:
            raw = socket.create_connection((self._host, self._port), timeout=SEND_TIMEOUT)
            try:
                self._sock = self._ctx.wrap_socket(raw, server_hostname=self._server_name)
            except BaseException:
                raw.close()
                raise
        return self._sock

    def _frame(self, item: dict[str, Any]) -> bytes:
        severity = _SEVERITY.get(str(item.get("outcome")), 6) if item.get("type") == "record" else 6
        pri = self._facility * 8 + severity
        msg = (f"<{pri}>1 {item.get('time') or '-'} {self._hostname} {self._app} {os.getpid()} "
               f"{item.get('type', 'record')} - ").encode() + json.dumps(
                   item, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        return f"{len(msg)} ".encode() + msg

    def send(self, items: list[dict[str, Any]]) -> None:
        try:
            self._connect().sendall(b"".join(self._frame(i) for i in items))
        except (OSError, ssl.SSLError):
            self.close()
            raise

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None


class WebhookSink:
    """A JSON array per batch, POSTed over HTTPS; any 2xx accepts it."""

    kind = "webhook"

    def __init__(self, name: str, url: str, *, ca_file: Path | None = None,
                 headers: dict[str, str] | None = None) -> None:
        if not url.startswith("https://"):
            raise ValueError(f"audit sink {name!r}: a webhook URL must be https://")
        self.name, self._url = name, url
        self._client = httpx.Client(verify=ssl.create_default_context(cafile=str(ca_file) if ca_file else None),
                                    timeout=SEND_TIMEOUT, headers=headers or {})

    def send(self, items: list[dict[str, Any]]) -> None:
        r = self._client.post(self._url, content=json.dumps(items, separators=(",", ":")).encode(),
                              headers={"content-type": "application/json"})
        if not 200 <= r.status_code < 300:
            raise OSError(f"the webhook answered {r.status_code}")

    def close(self) -> None:
        self._client.close()


class CopyUnreadable(ValueError):
    """An outside copy that cannot be read (a copy that cannot be read is not one that matches)."""


@dataclass(frozen=True, slots=True)
class SinkCopy:
    """The records and checkpoints of a sink's copy, read from the file each time it is
    iterated (the verifier reads it twice, holding neither pass in memory): a file
    sink's JSON lines, or what a syslog receiver kept of the syslog sink's messages, one
    a line — the whole RFC 5424 message or any template ending in the message (`%msgid%
    %msg%`): the JSON from the line's first `{`. Lines that are not ours are skipped; a
    line that is JSON, or whose header names a record or checkpoint, and does not parse
    raises `CopyUnreadable`."""

    path: Path

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            with self.path.open(encoding="utf-8") as f:
                for n, line in enumerate(f, start=1):
                    text = line.strip()
                    at = text.find("{")
                    if at < 0:
                        continue
                    header = text[:at].split()
                    try:
                        doc = json.loads(text[at:])
                    except json.JSONDecodeError:
                        if at == 0 or "record" in header or "checkpoint" in header:
                            raise CopyUnreadable(f"{self.path}: line {n} is not JSON") from None
                        continue
                    if isinstance(doc, dict) and doc.get("type") in ("record", "checkpoint"):
                        yield doc
        except (OSError, UnicodeDecodeError) as exc:
            raise CopyUnreadable(f"{self.path}: {exc}") from None


def read_copy(path: Path) -> list[dict[str, Any]]:
    """A (small) sink copy's records and checkpoints as a list; `SinkCopy` streams."""
    return list(SinkCopy(path))


class AuditSinks:
    """Delivers the chain to every configured sink (one thread per sink)."""

    def __init__(self, session_factory: sessionmaker[Session], sinks: list[Sink], *, fail_closed: bool = False,
                 poll_seconds: float = 1.0, now: Callable[[], datetime] = utcnow) -> None:
        names = [s.name for s in sinks]
        if len(set(names)) != len(names):
            raise ValueError("audit sink names must be unique")
        self._db = session_factory
        self._sinks = sinks
        self._fail_closed = fail_closed
        self._poll = poll_seconds
        self._now = now
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failing: dict[str, str] = {}  # this replica's view: sink → last error
        self._lock = threading.Lock()
        # One delivery at a time per sink in this replica: flush() (shutdown, tests) and the
        # sink's thread would otherwise both send what follows the same cursor, and the
        # receiver would see a batch again after later records. Replicas may still race
        # (documented above); within one, the stream stays in order.
        self._delivering = {sink.name: threading.Lock() for sink in sinks}

    @property
    def configured(self) -> bool:
        return bool(self._sinks)

    # --- delivery --------------------------------------------------------------------
    def _cursor(self, name: str) -> tuple[int, int]:
        with self._db() as s:
            row = s.get(AuditSinkCursor, name)
        if row is not None:
            return row.seq, row.checkpoint
        try:
            with self._db.begin() as s:
                s.execute(insert(AuditSinkCursor).values(name=name, seq=0, checkpoint=0))
        except Exception:  # another replica made it first
            log.debug("audit sink %s: cursor created elsewhere", name)
        return 0, 0

    def deliver_once(self, sink: Sink) -> int:
        """Deliver what follows the sink's cursor (one batch); how many items went out.
        Raises when the sink refused: the cursor stays, the next try resends."""
        with self._delivering[sink.name]:
            return self._deliver_locked(sink)

    def _deliver_locked(self, sink: Sink) -> int:
        seq, cp = self._cursor(sink.name)
        with self._db() as s:
            records = list(s.execute(select(AuditEvent).where(AuditEvent.seq > seq)
                                     .order_by(AuditEvent.seq).limit(BATCH)).scalars())
            upto = records[-1].seq if records else seq
            checkpoints = list(s.execute(select(AuditCheckpoint).where(AuditCheckpoint.id > cp,
                                                                       AuditCheckpoint.seq <= upto)
                                         .order_by(AuditCheckpoint.id)).scalars())
            items: list[dict[str, Any]] = []
            pending = [checkpoint_dict(c) for c in checkpoints]
            for r in records:
                items.append({"type": "record", **event_dict(r)})
                while pending and pending[0]["seq"] <= r.seq:
                    items.append(pending.pop(0))
            items.extend(pending)  # checkpoints of records delivered before
        if not items:
            return 0
        sink.send(items)
        new_cp = checkpoints[-1].id if checkpoints else cp
        with self._db.begin() as s:
            s.execute(update(AuditSinkCursor).where(
                AuditSinkCursor.name == sink.name, AuditSinkCursor.seq == seq, AuditSinkCursor.checkpoint == cp)
                .values(seq=upto, checkpoint=new_cp, delivered_at=self._now(), last_error=None, failing_since=None))
        return len(items)

    def _failed(self, sink: Sink, exc: BaseException) -> None:
        message = f"{type(exc).__name__}: {exc}"[:500]
        with self._lock:
            first = sink.name not in self._failing
            self._failing[sink.name] = message
        if first:
            log.warning("audit sink %s (%s) cannot deliver: %s; retrying", sink.name, sink.kind, message)
        try:
            with self._db.begin() as s:
                row = s.get(AuditSinkCursor, sink.name)
                if row is not None:
                    row.last_error = message
                    if row.failing_since is None:
                        row.failing_since = self._now()
        except Exception:
            log.debug("audit sink %s: could not record its failure", sink.name, exc_info=True)

    def _run(self, sink: Sink) -> None:
        backoff = self._poll
        while not self._stop.is_set():
            try:
                sent = self.deliver_once(sink)
                with self._lock:
                    recovered = self._failing.pop(sink.name, None) is not None
                if recovered:
                    log.info("audit sink %s delivers again", sink.name)
                backoff = self._poll
                if sent:
                    continue  # more may be waiting
            except Exception as exc:
                self._failed(sink, exc)
                backoff = min(backoff * 2, 30.0)
            self._stop.wait(backoff)

    def flush(self, timeout: float = 30.0) -> None:
        """Deliver everything chained so far to every sink (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        for sink in self._sinks:
            while self.deliver_once(sink):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"audit sink {sink.name} did not catch up in {timeout} s")

    def start(self) -> None:
        if self._threads or not self._sinks:
            return
        self._stop.clear()
        for sink in self._sinks:
            t = threading.Thread(target=self._run, args=(sink,), name=f"audit-sink-{sink.name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=SEND_TIMEOUT + 5)
        self._threads = []
        for sink in self._sinks:
            sink.close()

    # --- health ----------------------------------------------------------------------
    def status(self) -> list[SinkStatus]:
        with self._db() as s:
            rows = {r.name: r for r in s.execute(select(AuditSinkCursor)).scalars()}
            head = s.execute(select(AuditEvent.seq).order_by(AuditEvent.seq.desc()).limit(1)).scalar() or 0
        out = []
        for sink in self._sinks:
            r = rows.get(sink.name)
            out.append(SinkStatus(
                name=sink.name, kind=sink.kind, delivered_seq=r.seq if r else 0,
                delivered_checkpoint=r.checkpoint if r else 0, backlog=head - (r.seq if r else 0),
                delivered_at=r.delivered_at if r else None, last_error=r.last_error if r else None,
                failing_since=r.failing_since if r else None))
        return out

    def refusal(self) -> str | None:
        """Why key operations must wait (fail-closed and no sink accepts), else None."""
        if not self._fail_closed or not self._sinks:
            return None
        with self._lock:
            failing = dict(self._failing)
        if len(failing) < len(self._sinks):
            return None
        detail = "; ".join(f"{name}: {error}" for name, error in sorted(failing.items()))
        return ("no audit sink accepts records (" + detail + "); key operations wait until one does "
                "(STRONGROOM_AUDIT_FAIL_CLOSED) — check the sinks' receivers, or GET /readyz")

    def describe(self) -> list[dict[str, Any]]:
        """For /readyz and the console."""
        return [{"name": st.name, "kind": st.kind, "delivered_seq": st.delivered_seq, "backlog": st.backlog,
                 "delivered_at": iso(st.delivered_at) if st.delivered_at else None,
                 "last_error": st.last_error, "healthy": st.healthy} for st in self.status()]
