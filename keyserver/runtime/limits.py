"""Connection limits of the HTTP ports (REST/console and the agent port), per worker
process and per port (docs/api.md "Limits").

uvicorn bounds a request's body only through the application (api/app.py counts it)
and its headers not at all with httptools: a client could send headers forever, or one
byte of them every few seconds, or open connections until none is left for anyone else.
Here, on top of uvicorn's protocol:

* the request line and headers together are at most `max_header_bytes` (431, closed);
* they must arrive within `header_timeout` of the connection's start or of the request's
  first byte, and the body within `body_timeout` of the headers (closed: a slow client
  never holds a connection by dripping);
* one address holds at most `max_per_source` connections (503, closed at once);
* uvicorn's own `limit_concurrency` answers 503 past `max_connections`;
* a TLS handshake must finish within `handshake_timeout` (asyncio's default is 60 s).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import ssl
import time
from asyncio import sslproto
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import uvicorn

from keyserver.settings import Settings, from_network

log = logging.getLogger(__name__)
REFUSAL_LOG_EVERY = 10.0  # a flood is logged once per this many seconds, not per connection

try:  # the protocol uvicorn's "auto" would pick
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as HttpProtocol
except ImportError:  # pragma: no cover - httptools is part of uvicorn[standard]
    from uvicorn.protocols.http.h11_impl import H11Protocol as HttpProtocol  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_header_bytes: int = 64 << 10
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    max_connections: int = 2048
    max_per_source: int = 64
    handshake_timeout: float = 5.0
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()  # not capped per address

    @classmethod
    def from_settings(cls, s: Settings) -> HttpLimits:
        return cls(max_header_bytes=s.http_max_header_bytes, header_timeout=s.http_header_timeout_seconds,
                   body_timeout=s.http_body_timeout_seconds,
                   max_connections=s.http_max_connections, max_per_source=s.http_max_connections_per_source,
                   handshake_timeout=s.tls_handshake_timeout_seconds, trusted_proxies=tuple(s.trusted_proxies))


def _refusal(status: bytes, code: str, detail: str) -> bytes:
    body = (f'{{"type":"https://strongroom.dev/problems/{code}","status":{status[:3].decode()},'
            f'"code":"{code}","detail":"{detail}"}}').encode()
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/problem+json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


HEADERS_TOO_LARGE = _refusal(b"431 Request Header Fields Too Large", "headers_too_large",
                             "the request line and headers are too large")
TOO_MANY_FROM_SOURCE = _refusal(b"503 Service Unavailable", "too_many_connections",
                                "too many connections from this address; reuse one (keep-alive)")


class _Refusals:
    """Connections closed by a limit, logged once per REFUSAL_LOG_EVERY at most."""

    def __init__(self) -> None:
        self.count, self.logged = 0, 0.0

    def __call__(self, peer: str, why: str) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.logged >= REFUSAL_LOG_EVERY:
            log.warning("HTTP connection from %s closed: %s (%d such since the last warning)", peer, why, self.count)
            self.count, self.logged = 0, now


def bounded_protocol(limits: HttpLimits, base: type[Any] = HttpProtocol, *, per_source: dict[str, int] | None = None,
                     note_refusal: _Refusals | None = None) -> type[Any]:
    """`base` (uvicorn's httptools protocol or a subclass) with the limits above. The
    per-source counts belong to the class made here (one per port and process), unless
    `per_source` is None because the TLS layer below counts them (`tls_counted`)."""
    count_sources = per_source is None
    counts: dict[str, int] = {} if per_source is None else per_source
    note: _Refusals = note_refusal or _Refusals()

    class Bounded(base):  # type: ignore[misc]
        _peer: str | None = None  # set while this connection is counted against its address
        _addr = ""
        _header_bytes = 0
        _awaiting_headers = True
        _header_timer: asyncio.TimerHandle | None = None
        _refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            peer = self._addr = self.client[0] if self.client else ""
            if not count_sources or from_network(peer, limits.trusted_proxies):
                self._arm()
                return
            if counts.get(peer, 0) >= limits.max_per_source:
                self._refuse(TOO_MANY_FROM_SOURCE)
                note(peer, f"{limits.max_per_source} connections open from this address")
                return
            counts[peer] = counts.get(peer, 0) + 1
            self._peer = peer
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._peer is not None:
                left = counts.get(self._peer, 1) - 1
                if left:
                    counts[self._peer] = left
                else:
                    counts.pop(self._peer, None)
                self._peer = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            before = self._awaiting_headers
            super().data_received(data)
            # Counted when headers were awaited before and after parsing the chunk: one
            # that ends the headers (and carries the body's start) or ends a request is
            # not theirs. httptools keeps a header until it is whole, so what is fed
            # while they stay incomplete is buffered there: this bounds it.
            if before and self._awaiting_headers and not self._refused:
                self._header_bytes += len(data)
                if self._header_bytes > limits.max_header_bytes:
                    self._refuse(HEADERS_TOO_LARGE)
                    note(self._addr, f"headers over {limits.max_header_bytes} bytes")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._awaiting_headers = False
            self._arm(limits.body_timeout)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()
            self._awaiting_headers, self._header_bytes = True, 0

        def send_400_response(self, msg: str) -> None:
            if not self._refused:
                super().send_400_response(msg)

        def _refuse(self, answer: bytes) -> None:
            self._refused = True
            self._disarm()
            if not self.transport.is_closing():
                self.transport.write(answer)
                self.transport.close()

        def _arm(self, seconds: float = limits.header_timeout) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _late(self) -> None:
            # abort, not close: a graceful TLS close would wait for the slow client too.
            self._header_timer = None
            self._refused = True
            self.transport.abort()
            note(self._addr, "headers or body not received in time")

    Bounded.__name__ = Bounded.__qualname__ = f"Bounded{base.__name__}"
    return Bounded


def tls_counted(limits: HttpLimits, http: type[Any], context: ssl.SSLContext) -> Callable[..., asyncio.Protocol]:
    """A uvicorn protocol factory doing TLS itself (asyncio's SSLProtocol around `http`)
    so that connections are counted per address from the moment they are accepted,
    handshake included: one address cannot hold more than its share of connections
    that never finish TLS. (uvicorn's own TLS hands the protocol a connection only
    after its handshake, when the address is known too late.)"""
    per_source: dict[str, int] = {}
    note_refusal = _Refusals()
    app_class = bounded_protocol(limits, http, per_source={}, note_refusal=note_refusal)

    class CountedTls(sslproto.SSLProtocol):
        # asyncio reads TLS into a buffer of this size, allocated per connection at
        # accept: its 256 KiB default made 512 connections that never start TLS cost
        # 150 MB. A TLS record is at most 16 KiB.
        max_size = 32 * 1024
        _peer: str | None = None
        _refused = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            peer = str((transport.get_extra_info("peername") or ("",))[0])
            if from_network(peer, limits.trusted_proxies):
                super().connection_made(transport)  # a load balancer: it caps its clients itself
                return
            if per_source.get(peer, 0) >= limits.max_per_source:
                self._refused = True
                cast(asyncio.Transport, transport).abort()
                note_refusal(peer, f"{limits.max_per_source} connections open from this address")
                return
            per_source[peer] = per_source.get(peer, 0) + 1
            self._peer = peer
            super().connection_made(transport)

        def connection_lost(self, exc: BaseException | None) -> None:
            if self._refused:
                return
            if self._peer is not None:
                left = per_source.get(self._peer, 1) - 1
                if left:
                    per_source[self._peer] = left
                else:
                    per_source.pop(self._peer, None)
                self._peer = None
            super().connection_lost(exc)

    def create(**kwargs: Any) -> asyncio.Protocol:
        app_protocol = app_class(**kwargs)
        waiter: Any = None  # a server's handshake has no one waiting on it
        protocol: Any = CountedTls(asyncio.get_running_loop(), app_protocol, context, waiter, server_side=True,
                                   ssl_handshake_timeout=limits.handshake_timeout)  # type: ignore[arg-type]
        return cast(asyncio.Protocol, protocol)

    return create


def limit_server(server: uvicorn.Server, limits: HttpLimits, *, count_tls: bool = False) -> None:
    """Apply `limits` to a server not yet started. `count_tls`: the TLS layer is done
    here (`tls_counted`), so that handshakes count against the per-address cap too."""
    config = server.config
    base = config.http if isinstance(config.http, type) else HttpProtocol
    if count_tls and config.ssl_context_factory is not None:
        context = config.ssl_context_factory(config, ssl.create_default_context)
        config.ssl_context_factory = None
        config.http = tls_counted(limits, base, context)  # type: ignore[assignment]
    else:
        config.http = bounded_protocol(limits, base)
    config.limit_concurrency = limits.max_connections
    config.h11_max_incomplete_event_size = limits.max_header_bytes


def bound_handshakes(loop: asyncio.AbstractEventLoop, timeout: float) -> None:
    """Every TLS server this loop creates from now on gives a handshake `timeout`
    seconds (uvicorn does not pass asyncio's ssl_handshake_timeout)."""
    create = loop.create_server

    @functools.wraps(create)
    async def create_server(*args: Any, **kwargs: Any) -> asyncio.Server:
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", timeout)
        return await create(*args, **kwargs)

    loop.create_server = create_server  # type: ignore[method-assign]
