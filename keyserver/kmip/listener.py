"""The KMIP listener: TCP + mutual TLS, TTLV framing, limits, one thread per connection.

* TLS 1.2 and 1.3 only, forward-secret suites only (ECDHE for 1.2; all 1.3 suites are);
  a client certificate from the internal CA is required.
* The client's certificate serial is looked up on connect and again before every request
  (KmipClientService.authenticate): a revoked client is refused at once.
* Limits (docs/kmip.md "Connection limits"): at most `max_connections` connections, and
  at most `max_connections_per_source` from one address, so that no single source can
  fill the listener (more are closed at accept). The TLS handshake runs in the
  connection's own thread, never in the accept loop, and must finish within
  `handshake_timeout` in total (a client dripping bytes does not reset it). A client
  that sends no whole request for `idle_timeout` is closed. When the listener is three
  quarters full, handshakes and idle clients get only `pressure_timeout`; when it is
  full, a newcomer takes the place of the oldest unfinished handshake of the busiest
  source: whoever holds a connection without using it makes room for someone who will,
  and connections that never start TLS lock nobody out. A message over
  `max_message_bytes` is answered with Invalid Message and the connection closed.
  Nothing here holds a global lock while working.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field

from cryptography import x509
from kmip.core import enums

from keyserver.core.ca import CertificateAuthority
from keyserver.core.errors import CoreError
from keyserver.core.kmip_clients import KmipClientService
from keyserver.core.principal import Principal
from keyserver.kmip.dispatcher import Dispatcher
from keyserver.runtime.tls import server_context
from keyserver.settings import from_network

log = logging.getLogger(__name__)
HEADER = 8
REQUEST_MESSAGE_PREFIX = struct.pack("!I", enums.Tags.REQUEST_MESSAGE.value << 8 | 0x01)
REAP_EVERY = 0.1  # seconds between sweeps of the accept loop over the open connections
REFUSAL_LOG_EVERY = 10.0  # a flood is logged once per this many seconds, not per connection


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    max_connections: int = 64
    max_message_bytes: int = 1 << 20
    idle_timeout: float = 60.0
    max_connections_per_source: int = 16
    handshake_timeout: float = 5.0
    pressure_timeout: float = 2.0
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()  # not capped per address


@dataclass(slots=True)
class _Conn:
    """One open connection as the accept loop sees it. `state` is "handshake", "idle"
    (waiting for or reading a request) or "busy" (a request being served, never cut)."""

    sock: socket.socket
    peer: str
    thread: threading.Thread
    state: str = "handshake"
    since: float = field(default_factory=time.monotonic)


class _Closed(Exception):
    """The peer went away, idled out, or broke framing: close without an answer."""


class KmipListener:
    def __init__(
        self,
        *,
        ca: CertificateAuthority,
        clients: KmipClientService,
        dispatcher: Dispatcher,
        host: str,
        port: int,
        server_names: list[str] | None = None,
        limits: ListenerLimits | None = None,
        reuse_port: bool = False,
    ) -> None:
        self._ca = ca
        self._clients = clients
        self._dispatcher = dispatcher
        self._host = host
        self._port = port
        self._names = list(server_names or [])
        self._limits = limits or ListenerLimits()
        self._reuse_port = reuse_port
        self._sock: socket.socket | None = None
        self._ssl: ssl.SSLContext | None = None
        self._stop = threading.Event()
        self._accept_thread: threading.Thread | None = None
        self._conns: dict[int, _Conn] = {}
        self._per_source: dict[str, int] = {}
        self._lock = threading.Lock()  # guards _conns and _per_source only, never held during work
        self._last_reap = 0.0
        self._refused = 0
        self._refusal_logged = 0.0
        self.port = port

    # --- life cycle ------------------------------------------------------------------
    def start(self) -> int:
        self._ca.ensure()
        self._ssl = server_context(self._ca, [self._host, *self._names], client_cert=ssl.CERT_REQUIRED,
                                   common_name="Strongroom KMIP server")
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self._reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((self._host, self._port))
        sock.listen(256)
        sock.settimeout(0.5)  # so the accept loop notices stop()
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        self._stop.clear()
        self._accept_thread = threading.Thread(target=self._accept_loop, name="kmip-accept", daemon=True)
        self._accept_thread.start()
        log.info("KMIP listener on %s:%s", self._host, self.port)
        return self.port

    def stop(self) -> None:
        self._stop.set()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)
            self._accept_thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        with self._lock:
            conns = list(self._conns.values())
        for c in conns:
            _cut(c.sock)
        for c in conns:
            c.thread.join(timeout=5)

    @property
    def active_connections(self) -> int:
        with self._lock:
            return len(self._conns)

    # --- accepting -------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            self._reap()
            try:
                raw, addr = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            peer = addr[0]
            limits = self._limits
            victim: _Conn | None = None
            with self._lock:
                capped = not from_network(peer, limits.trusted_proxies)  # a load balancer caps its clients
                refused = ("source" if capped and self._per_source.get(peer, 0) >= limits.max_connections_per_source
                           else "full" if self._open() >= limits.max_connections else None)
                if refused == "full" and len(self._conns) < 2 * limits.max_connections:
                    victim = self._evictable()
                    if victim is not None:
                        victim.state, refused = "cut", None
                if refused is None:
                    thread = threading.Thread(target=self._serve, args=(raw, peer), daemon=True,
                                              name=f"kmip-conn-{peer}:{addr[1]}")
                    self._conns[id(raw)] = _Conn(raw, peer, thread)
                    self._per_source[peer] = self._per_source.get(peer, 0) + 1
            if victim is not None:
                log.debug("KMIP handshake from %s cut to make room for %s", victim.peer, peer)
                _cut(victim.sock)
            if refused is not None:
                raw.close()
                self._log_refusal(peer, refused)
                continue
            thread.start()

    def _open(self) -> int:
        """Connections that count against the cap: not those already cut (their threads
        are on their way out)."""
        return sum(1 for c in self._conns.values() if c.state != "cut")

    def _evictable(self) -> _Conn | None:
        """When full, a newcomer takes the place of an unfinished handshake: the oldest
        one of the source that holds the most connections (or, with none, that source's
        longest-idle connection; never one whose request is being served). A client that completes its
        handshake does so in milliseconds; whoever opens connections and sends nothing
        can thus never keep anyone out (a reconnecting attacker would otherwise win
        every race for a slot freed by the reaper)."""
        pending = [c for c in self._conns.values() if c.state == "handshake"]
        if not pending:
            # Else the longest-idle authenticated connection of that source: idle clients
            # holding every slot kept a newcomer waiting for the 2 s pressure timeout
            # (p99 ~0.7 s); a KMIP client whose idle connection is closed connects again.
            pending = [c for c in self._conns.values() if c.state == "idle"]
        if not pending:
            return None
        return max(pending, key=lambda c: (self._per_source.get(c.peer, 0), -c.since))

    def _log_refusal(self, peer: str, why: str) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._refusal_logged >= REFUSAL_LOG_EVERY:
            limit = (f"{self._limits.max_connections} connections open" if why == "full" else
                     f"{self._limits.max_connections_per_source} connections open from {peer}")
            log.warning("KMIP connection from %s refused: %s (%s refused since the last warning)",
                        peer, limit, self._refused)
            self._refusal_logged, self._refused = now, 0

    def _reap(self) -> None:
        """Cut handshakes and idle clients past their time (shorter when nearly full)."""
        now = time.monotonic()
        if now - self._last_reap < REAP_EVERY:
            return
        self._last_reap = now
        limits = self._limits
        with self._lock:
            pressure = self._open() * 4 >= limits.max_connections * 3
            late = []
            for c in self._conns.values():
                allowed = {"handshake": limits.handshake_timeout, "idle": limits.idle_timeout}.get(c.state)
                if allowed is None:
                    continue
                if pressure:
                    allowed = min(allowed, limits.pressure_timeout)
                if now - c.since > allowed:
                    c.state = "cut"
                    late.append(c)
        for c in late:
            log.debug("KMIP connection from %s cut: %s past its time", c.peer, c.state)
            _cut(c.sock)

    def _mark(self, key: int, state: str) -> None:
        with self._lock:
            c = self._conns.get(key)
            if c is not None and c.state != "cut":
                c.state, c.since = state, time.monotonic()

    # --- one connection ----------------------------------------------------------------
    def _serve(self, raw: socket.socket, peer: str) -> None:
        assert self._ssl is not None
        key = id(raw)
        conn: ssl.SSLSocket | None = None
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one small response per request
            raw.settimeout(self._limits.handshake_timeout)
            conn = self._ssl.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
            with self._lock:
                # wrap_socket detached `raw`: stop() and the reaper cut the TLS socket instead.
                entry = self._conns.get(key)
                if entry is not None:
                    entry.sock = conn
                    cut = entry.state == "cut"
            if entry is None or cut:
                return
            conn.do_handshake()
            conn.settimeout(self._limits.idle_timeout)
            der = conn.getpeercert(binary_form=True)
            if der is None:
                return  # CERT_REQUIRED makes this unreachable; belt and braces
            cert = x509.load_der_x509_certificate(der)
            principal = self._authenticate(conn, cert, peer)
            while principal is not None and not self._stop.is_set():
                self._mark(key, "idle")
                data = self._read_message(conn)
                self._mark(key, "busy")
                principal = self._authenticate(conn, cert, peer)
                if principal is None:
                    return
                conn.sendall(self._dispatcher.handle(data, principal=principal, source_ip=peer))
        except (_Closed, ssl.SSLError, OSError, ValueError) as exc:
            log.debug("KMIP connection from %s closed: %s", peer, exc)
        except Exception:
            log.exception("KMIP connection from %s failed", peer)
        finally:
            with contextlib.suppress(OSError):
                (conn or raw).close()
            with self._lock:
                if self._conns.pop(key, None) is not None:
                    left = self._per_source.get(peer, 1) - 1
                    if left:
                        self._per_source[peer] = left
                    else:
                        self._per_source.pop(peer, None)

    def _authenticate(self, conn: ssl.SSLSocket, cert: x509.Certificate, peer: str) -> Principal | None:
        """The client's principal, or None after telling it why it is refused."""
        try:
            return self._clients.authenticate(cert, source_ip=peer)
        except CoreError as exc:
            reason = (enums.ResultReason.PERMISSION_DENIED if exc.code == "kmip_client_revoked"
                      else enums.ResultReason.AUTHENTICATION_NOT_SUCCESSFUL)
            with contextlib.suppress(OSError):
                conn.sendall(self._dispatcher.error(reason, exc.message))
            return None

    def _read_exactly(self, conn: ssl.SSLSocket, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = conn.recv(min(n - len(buf), 65536))
            except TimeoutError:
                raise _Closed("idle timeout") from None
            if not chunk:
                raise _Closed("peer closed")
            buf += chunk
        return bytes(buf)

    def _read_message(self, conn: ssl.SSLSocket) -> bytes:
        header = self._read_exactly(conn, HEADER)
        if header[:4] != REQUEST_MESSAGE_PREFIX:
            # Not a Request Message structure: framing is lost, so answer once and close.
            conn.sendall(self._dispatcher.error(enums.ResultReason.INVALID_MESSAGE,
                                                "expected a KMIP Request Message (TTLV)"))
            raise _Closed("bad framing")
        length = struct.unpack("!I", header[4:])[0]
        if length % 8 or length + HEADER > self._limits.max_message_bytes:
            conn.sendall(self._dispatcher.error(
                enums.ResultReason.INVALID_MESSAGE,
                f"request messages are limited to {self._limits.max_message_bytes} bytes"
                if length % 8 == 0 else "the message length is not a multiple of 8"))
            raise _Closed("oversized or misaligned message")
        return header + self._read_exactly(conn, length)


def _cut(sock: socket.socket) -> None:
    """End a connection from another thread: its reader wakes up with end-of-file. The
    plain socket's shutdown, not SSLSocket's, which would drop the TLS object under the
    reader's feet."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
