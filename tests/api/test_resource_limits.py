"""Hostile HTTP clients against a real `keyserver serve` process, on the REST/console port
and on the agent port: bodies however they are framed, oversized and slow headers, many
connections from one source. Each attack asserts a functional bound — the refusal comes
before the attacker is done, the server's resident memory grows by less than a few tens
of MB, and a good client is served while the attack runs — never a time threshold."""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serve import Server

CHUNK = b"x" * 65536
ATTACK_BYTES = 96 << 20  # per connection: what the old server buffered in full
RSS_BOUND = 40 << 20  # growth allowed while attacks run: buffers, not bodies
PER_SOURCE = 8


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with Server(tmp_path_factory.mktemp("limits"), STRONGROOM_KMIP_ENABLED="false",
                STRONGROOM_HTTP_HEADER_TIMEOUT_SECONDS="2", STRONGROOM_HTTP_BODY_TIMEOUT_SECONDS="3",
                STRONGROOM_TLS_HANDSHAKE_TIMEOUT_SECONDS="1",
                STRONGROOM_HTTP_MAX_CONNECTIONS_PER_SOURCE=str(PER_SOURCE)) as s:
        yield s


def agent_port(server: Server) -> int:
    return int(server.env["STRONGROOM_AGENT_PORT"])


def connect(server: Server, port: int, source: str = "127.0.0.1") -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    ctx = ssl.create_default_context(cafile=str(server.data / "ca.pem"))
    ctx.check_hostname = False
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def read_response(conn: ssl.SSLSocket, data: bytes = b"") -> bytes:
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def answered(conn: ssl.SSLSocket) -> bytes:
    """Whatever answer has arrived, without waiting (readable alone may be a TLS 1.3
    session ticket, not an answer)."""
    if not select.select([conn], [], [], 0)[0] and not conn.pending():
        return b""
    conn.setblocking(False)
    try:
        return conn.recv(65536)
    except (ssl.SSLWantReadError, BlockingIOError):
        return b""
    except OSError:
        return b""
    finally:
        conn.setblocking(True)
        conn.settimeout(30)


def chunked_attack(server: Server, port: int, path: str, *, total: int = ATTACK_BYTES) -> tuple[int, bytes]:
    """POST a chunked body of up to `total` bytes, stopping as soon as an answer arrives:
    (bytes sent, the answer's head)."""
    conn = connect(server, port)
    sent = 0
    try:
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n".encode())
        frame = b"%x\r\n" % len(CHUNK) + CHUNK + b"\r\n"
        early = b""
        while sent < total and not early:
            early = answered(conn)
            if early:
                break
            try:
                conn.sendall(frame)
            except OSError:
                break  # closed by the server after its answer
            sent += len(CHUNK)
        return sent, read_response(conn, early)
    finally:
        conn.close()


@pytest.mark.parametrize("where", ["rest", "agent"])
def test_chunked_body_is_refused_before_it_ends(server: Server, where: str) -> None:
    port, path = (server.port, "/api/v1/auth/login") if where == "rest" else (agent_port(server), "/api/v1/enroll")
    sent, head = chunked_attack(server, port, path)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    assert b"application/problem+json" in head and b"connection: close" in head.lower()
    assert sent < ATTACK_BYTES, "the answer came only after the whole body"


def test_body_at_the_limit_is_still_read(server: Server) -> None:
    """Counting is exact: a chunked body of exactly the limit reaches the route."""
    body = b"{" + b" " * ((1 << 20) - 2) + b"}"

    def gen() -> Iterator[bytes]:
        for i in range(0, len(body), 65536):
            yield body[i:i + 65536]

    with server.client() as c:
        r = c.post("/api/v1/auth/login", content=gen(), headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text  # the route's own answer: not a login
    with server.client() as c:
        r = c.post("/api/v1/auth/login", content=iter([body, b" "]), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"


def test_memory_stays_bounded_and_a_good_client_is_served(server: Server) -> None:
    """Four attackers at once on each port, again and again, while a good client signs
    nothing but asks /readyz and reads the CA: it completes its requests, and the
    server's RSS rises by buffers, not by the bodies (the old server grew ~3 MB per MB)."""
    baseline = rss(server.proc.pid)
    peak = [baseline]
    stop = threading.Event()
    answers: list[bytes] = []

    def attacker(port: int, path: str) -> None:
        while not stop.is_set():
            answers.append(chunked_attack(server, port, path, total=32 << 20)[1][:12])

    def sampler() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], rss(server.proc.pid))

    threads = [threading.Thread(target=attacker, args=(p, path)) for p, path in
               [(server.port, "/api/v1/auth/login"), (agent_port(server), "/api/v1/enroll")] * 4]
    threads.append(threading.Thread(target=sampler))
    for t in threads:
        t.start()
    served = 0
    try:
        with server.client() as good, httpx.Client(base_url=f"https://127.0.0.1:{agent_port(server)}",
                                                   verify=server.tls(), timeout=30) as agent_good:
            for _ in range(40):
                assert good.get("/readyz").status_code == 200
                assert agent_good.get("/ca.pem").status_code == 200
                served += 1
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert served == 40
    assert len(answers) >= 8 and all(a.startswith(b"HTTP/1.1 413") for a in answers), answers[:5]
    grown = peak[0] - baseline
    assert grown < RSS_BOUND, f"RSS grew by {grown >> 20} MiB under attack"


def test_declared_length_over_the_limit_is_refused_unread(server: Server) -> None:
    conn = connect(server, server.port)
    try:
        conn.sendall(b"POST /api/v1/auth/login HTTP/1.1\r\nHost: x\r\nContent-Length: 300000000\r\n\r\n")
        head = read_response(conn)
    finally:
        conn.close()
    assert head.startswith(b"HTTP/1.1 413"), head[:200]



@pytest.mark.parametrize("where", ["rest", "agent"])
def test_endless_headers_are_refused_with_431(server: Server, where: str) -> None:
    """One header line that never ends: httptools kept all of it (+85 MB for 64 MiB)."""
    port = server.port if where == "rest" else agent_port(server)
    baseline = rss(server.proc.pid)
    conn = connect(server, port)
    sent, early = 0, b""
    try:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        while sent < ATTACK_BYTES and not early:
            early = answered(conn)
            if early:
                break
            try:
                conn.sendall(CHUNK)
            except OSError:
                break
            sent += len(CHUNK)
        head = read_response(conn, early)
    finally:
        conn.close()
    assert head.startswith(b"HTTP/1.1 431"), head[:200]
    assert sent < ATTACK_BYTES
    assert rss(server.proc.pid) - baseline < RSS_BOUND


def cut_while_dripping(conn: socket.socket, drip: bytes, *, every: float = 0.2, at_most: int = 150) -> bool:
    """Send `drip` a byte at a time; True once the server has closed the connection."""
    for i in range(at_most):
        try:
            conn.sendall(drip[i % len(drip):i % len(drip) + 1])
        except OSError:
            return True
        conn.settimeout(every)
        try:
            if conn.recv(1) == b"":
                return True
        except (TimeoutError, ssl.SSLWantReadError):
            continue
        except OSError:
            return True
    return False


def test_headers_dripped_byte_by_byte_are_cut(server: Server) -> None:
    """A slow client that sends a byte of its headers every 200 ms (30 s at most here;
    the limit is 2 s) is cut: no connection is held by dripping."""
    conn = connect(server, server.port)
    try:
        assert cut_while_dripping(conn, b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 400)
    finally:
        conn.close()


@pytest.mark.parametrize("where", ["rest", "agent"])
def test_a_body_dripped_byte_by_byte_is_cut(server: Server, where: str) -> None:
    """Whole headers, then a body of 1,000 declared bytes sent a byte every 200 ms (30 s
    at most here; the limit is 3 s): the connection is cut, not held."""
    port, path = (server.port, "/api/v1/auth/login") if where == "rest" else (agent_port(server), "/api/v1/enroll")
    conn = connect(server, port)
    try:
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: 1000\r\n\r\n".encode())
        assert cut_while_dripping(conn, b" " * 1000)
    finally:
        conn.close()


def test_connections_that_never_start_tls_are_cut(server: Server) -> None:
    """Pre-TLS: a TCP connection that sends nothing, or half a ClientHello, is closed
    after the handshake's time (asyncio's default was 60 s)."""
    for port in (server.port, agent_port(server)):
        for greeting in (b"", b"\x16\x03\x01\x02\x00"):
            raw = socket.create_connection(("127.0.0.1", port), timeout=30)
            try:
                raw.sendall(greeting)
                raw.settimeout(30)
                try:
                    closed = raw.recv(1) == b""
                except ConnectionResetError:
                    closed = True
                assert closed
            finally:
                raw.close()


def test_one_source_cannot_take_every_connection(server: Server) -> None:
    """REST: an address that opens more than its share is answered 503 on the extra
    ones, and a client from another address is served while they are held."""
    held = [connect(server, server.port, source="127.0.0.2") for _ in range(PER_SOURCE + 4)]
    try:
        answers = [read_response(c) for c in held[PER_SOURCE:]]
        assert all(a.startswith(b"HTTP/1.1 503") and b"too_many_connections" in a for a in answers), answers
        with server.client() as good:
            assert all(good.get("/healthz").status_code == 200 for _ in range(20))
    finally:
        for c in held:
            c.close()


def test_agent_port_counts_handshakes_per_source(tmp_path: Path) -> None:
    """The agent port faces the hosts' network: connections that never start TLS count
    against their address's share too. One address opening many is closed at once past
    its share (the handshake's own time is a minute here), and a host from another
    address is served while the first ones are held."""
    with Server(tmp_path / "data", STRONGROOM_KMIP_ENABLED="false", STRONGROOM_TLS_HANDSHAKE_TIMEOUT_SECONDS="60",
                STRONGROOM_HTTP_MAX_CONNECTIONS_PER_SOURCE=str(PER_SOURCE)) as server:
        port = agent_port(server)
        flood = [socket.create_connection(("127.0.0.1", port), timeout=30, source_address=("127.0.0.2", 0))
                 for _ in range(PER_SOURCE + 12)]
        try:
            def closed(s: socket.socket, wait: float) -> bool:
                s.settimeout(wait)
                try:
                    return s.recv(1) == b""
                except ConnectionResetError:
                    return True
                except TimeoutError:
                    return False

            assert all(closed(s, 30) for s in flood[PER_SOURCE:])
            assert not any(closed(s, 0.1) for s in flood[:PER_SOURCE])  # held, within their minute
            with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=server.tls(), timeout=30) as good:
                assert all(good.get("/healthz").status_code == 200 for _ in range(20))
        finally:
            for s in flood:
                s.close()


def test_a_trusted_load_balancer_is_not_capped_per_address(tmp_path: Path) -> None:
    """Behind HAProxy (TLS passed through) every client comes from the proxy's address:
    capped per address, the replicas refused all but 64 of 200 drill clients. The
    proxy's address is named (STRONGROOM_TRUSTED_PROXIES) and caps its clients itself;
    every other address keeps its cap."""
    with Server(tmp_path / "data", STRONGROOM_KMIP_ENABLED="false",
                STRONGROOM_HTTP_MAX_CONNECTIONS_PER_SOURCE=str(PER_SOURCE),
                STRONGROOM_TRUSTED_PROXIES='["127.0.0.3/32"]') as server:
        for port in (server.port, agent_port(server)):
            proxied = [connect(server, port, source="127.0.0.3") for _ in range(PER_SOURCE + 4)]
            try:
                for c in proxied:
                    c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert all(read_response(c).startswith(b"HTTP/1.1 200") for c in proxied)
            finally:
                for c in proxied:
                    c.close()
        other = [connect(server, server.port, source="127.0.0.2") for _ in range(PER_SOURCE + 1)]
        try:
            assert b"too_many_connections" in read_response(other[-1])
        finally:
            for c in other:
                c.close()
