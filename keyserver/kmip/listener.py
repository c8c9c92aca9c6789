"""The KMIP listener: TCP + mutual TLS, TTLV framing, limits, one thread per connection.

* TLS 1.2 and 1.3 only, forward-secret suites only (ECDHE for 1.2; all 1.3 suites are);
  a client certificate from the internal CA is required.
* The client's certificate serial is looked up on connect and again before every request
  (KmipClientService.authenticate): a revoked client is refused at once.
* Limits: at most `max_connections` connections (more are closed at accept); an idle
  client is closed after `idle_timeout`; a message over `max_message_bytes` is answered
  with Invalid Message and the connection closed. Nothing here holds a global lock:
  connections are served concurrently, bounded by `max_connections`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import struct
import threading
from dataclasses import dataclass

from cryptography import x509
from kmip.core import enums

from keyserver.core.ca import CertificateAuthority
from keyserver.core.errors import CoreError
from keyserver.core.kmip_clients import KmipClientService
from keyserver.core.principal import Principal
from keyserver.kmip.dispatcher import Dispatcher
from keyserver.runtime.tls import server_context

log = logging.getLogger(__name__)
HEADER = 8
REQUEST_MESSAGE_PREFIX = struct.pack("!I", enums.Tags.REQUEST_MESSAGE.value << 8 | 0x01)
HANDSHAKE_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    max_connections: int = 64
    max_message_bytes: int = 1 << 20
    idle_timeout: float = 60.0


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
        self._conns: dict[int, tuple[socket.socket, threading.Thread]] = {}
        self._lock = threading.Lock()  # guards _conns only, never held during work
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
        for sock, _ in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for _, thread in conns:
            thread.join(timeout=5)

    @property
    def active_connections(self) -> int:
        with self._lock:
            return len(self._conns)

    # --- accepting -------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                raw, addr = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            with self._lock:
                full = len(self._conns) >= self._limits.max_connections
                if not full:
                    thread = threading.Thread(target=self._serve, args=(raw, addr[0]), daemon=True,
                                              name=f"kmip-conn-{addr[0]}:{addr[1]}")
                    self._conns[id(raw)] = (raw, thread)
            if full:
                log.warning("KMIP connection from %s refused: %s connections open", addr[0],
                            self._limits.max_connections)
                raw.close()
                continue
            thread.start()

    # --- one connection ----------------------------------------------------------------
    def _serve(self, raw: socket.socket, peer: str) -> None:
        assert self._ssl is not None
        conn: ssl.SSLSocket | None = None
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one small response per request
            raw.settimeout(HANDSHAKE_TIMEOUT)
            conn = self._ssl.wrap_socket(raw, server_side=True)
            with self._lock:
                # wrap_socket detached `raw`: stop() must shut down the TLS socket instead.
                entry = self._conns.get(id(raw))
                if entry is not None:
                    self._conns[id(raw)] = (conn, entry[1])
            conn.settimeout(self._limits.idle_timeout)
            der = conn.getpeercert(binary_form=True)
            if der is None:
                return  # CERT_REQUIRED makes this unreachable; belt and braces
            cert = x509.load_der_x509_certificate(der)
            principal = self._authenticate(conn, cert, peer)
            while principal is not None and not self._stop.is_set():
                data = self._read_message(conn)
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
                self._conns.pop(id(raw), None)

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
