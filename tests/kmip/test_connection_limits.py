"""Hostile connections against a real KMIP listener (real TLS, real store and token):
TCP connections that never start TLS, a handshake dripped byte by byte, authenticated
clients that hold connections without using them. Each from addresses of the loopback
range other than the good client's (127.0.0.2, …), as separate machines would be.
The bound is functional: the good client still completes its requests during the
attack, and the attacker's connections are refused or cut; no time thresholds."""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kmip.core import enums

from keyserver.kmip.context import Engine
from keyserver.kmip.dispatcher import Dispatcher
from keyserver.kmip.listener import KmipListener, ListenerLimits
from keyserver.services import Services
from tests.kmip.conftest import ClientFiles, verifying_context
from tests.kmip.raw import query_request, roundtrip
from tests.serve import Server, free_port

GOOD = "127.0.0.1"
PER_SOURCE = 16  # ListenerLimits' default max_connections_per_source


def listener(services: Services, limits: ListenerLimits) -> KmipListener:
    return KmipListener(
        ca=services.ca, clients=services.kmip_clients,
        dispatcher=Dispatcher(Engine(keys=services.keys, objects=services.kmip_objects, crypto=services.crypto)),
        host="127.0.0.1", port=0, limits=limits)


@contextlib.contextmanager
def running(services: Services, limits: ListenerLimits) -> Iterator[KmipListener]:
    lst = listener(services, limits)
    lst.start()
    try:
        yield lst
    finally:
        lst.stop()


def tcp(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def tls(files: ClientFiles, port: int, source: str = GOOD) -> ssl.SSLSocket:
    return verifying_context(files).wrap_socket(tcp(port, source), server_hostname="localhost")


def served(files: ClientFiles, port: int) -> bool:
    """One request on a new connection, as a client that connects per request does."""
    try:
        with tls(files, port) as conn:
            return bool(roundtrip(conn, query_request()).batch_items[0].result_status.value
                        == enums.ResultStatus.SUCCESS)
    except (OSError, ssl.SSLError, ValueError):
        return False


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def test_one_source_cannot_fill_the_listener(services: Services, officer_files: ClientFiles) -> None:
    """64 connections that never start TLS from one address (the old listener's whole
    capacity): the source's cap refuses most of them, everyone else is still served."""
    with running(services, ListenerLimits()) as lst:
        flood = [tcp(lst.port, "127.0.0.2") for _ in range(64)]
        try:
            assert all(served(officer_files, lst.port) for _ in range(20))
            refused = sum(closed_by_server(s) for s in flood[PER_SOURCE:])
            assert refused == 64 - PER_SOURCE
        finally:
            for s in flood:
                s.close()


def test_a_dripped_handshake_is_cut_on_time(services: Services) -> None:
    """A byte of ClientHello every 100 ms keeps each read alive: the handshake's deadline
    is for the whole handshake, not per read."""
    with running(services, ListenerLimits(handshake_timeout=0.5)) as lst:
        s = tcp(lst.port, "127.0.0.3")
        try:
            hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 200
            cut = False
            for byte in hello:  # 21 s of drip at most; the deadline is 0.5 s
                try:
                    s.sendall(bytes([byte]))
                except OSError:
                    cut = True
                    break
                s.settimeout(0.1)
                try:
                    if s.recv(1) == b"":
                        cut = True
                        break
                except TimeoutError:
                    continue
                except OSError:
                    cut = True
                    break
            assert cut, "the dripping client kept its connection"
        finally:
            s.close()


def test_handshakes_that_never_come_make_room_when_full(services: Services, officer_files: ClientFiles) -> None:
    """Several sources together fill the listener with connections that never start
    TLS: nearly full, the listener gives a handshake only its short time, and the good
    client gets in while the attackers keep reconnecting."""
    limits = ListenerLimits(max_connections=8, max_connections_per_source=4, handshake_timeout=60,
                            pressure_timeout=0.3)
    with running(services, limits) as lst:
        attackers = {src: [tcp(lst.port, src) for _ in range(4)] for src in ("127.0.0.2", "127.0.0.3")}
        try:
            ok = 0
            for _ in range(200):
                if served(officer_files, lst.port):
                    ok += 1
                    if ok == 5:
                        break
                else:
                    time.sleep(0.1)
                for src, socks in attackers.items():  # the attack goes on: replace what was cut
                    for i, s in enumerate(socks):
                        s.setblocking(False)
                        try:
                            gone = s.recv(1) == b""
                        except BlockingIOError:
                            gone = False
                        except OSError:
                            gone = True
                        if gone:
                            s.close()
                            with contextlib.suppress(OSError):
                                socks[i] = tcp(lst.port, src)
            assert ok == 5
        finally:
            for socks in attackers.values():
                for s in socks:
                    s.close()


def test_idle_authenticated_clients_make_room_when_full(services: Services, officer_files: ClientFiles) -> None:
    """Authenticated clients from two sources hold every connection without using it
    (the old listener kept them for the idle timeout, 60 s): nearly full, an idle client
    gets only the short time, and the good client is served."""
    limits = ListenerLimits(max_connections=8, max_connections_per_source=4, idle_timeout=60,
                            pressure_timeout=0.3)
    with running(services, limits) as lst:
        held = [tls(officer_files, lst.port, src) for src in ("127.0.0.2", "127.0.0.3") for _ in range(4)]
        try:
            for conn in held:
                assert roundtrip(conn, query_request()).batch_items[0].result_status.value == \
                    enums.ResultStatus.SUCCESS
            ok = 0
            for _ in range(200):
                if served(officer_files, lst.port):
                    ok += 1
                    if ok == 5:
                        break
                else:
                    time.sleep(0.1)
            assert ok == 5
            assert any(closed_by_server(c) for c in held)
        finally:
            for c in held:
                c.close()


def test_a_full_listener_admits_a_newcomer_in_place_of_the_longest_idle_client(
        services: Services, officer_files: ClientFiles) -> None:
    """Full of idle authenticated clients, with the short time long (so only making room
    can let anyone in): the newcomer is served at once in place of the longest-idle
    connection of the source holding the most, and the other source keeps all of its."""
    limits = ListenerLimits(max_connections=6, max_connections_per_source=4, idle_timeout=60,
                            pressure_timeout=60)
    with running(services, limits) as lst:
        many = [tls(officer_files, lst.port, "127.0.0.2") for _ in range(4)]
        few = [tls(officer_files, lst.port, "127.0.0.3") for _ in range(2)]
        try:
            for conn in many + few:
                assert roundtrip(conn, query_request()).batch_items[0].result_status.value == \
                    enums.ResultStatus.SUCCESS
            assert served(officer_files, lst.port)
            # One of the busiest source's (its longest idle: which one that is depends on
            # when each server thread went back to waiting) made room; the other kept all.
            readable, _, _ = select.select(many, [], [], 10)
            assert readable and all(closed_by_server(c) for c in readable)
            assert not any(closed_by_server(c) for c in few)
        finally:
            for c in many + few:
                c.close()


@pytest.mark.parametrize("state", ["handshake", "idle"])
def test_a_listener_with_room_keeps_its_clients(services: Services, officer_files: ClientFiles, state: str) -> None:
    """The short time is for a full listener only: with room, an idle client keeps its
    connection past it and is answered."""
    limits = ListenerLimits(max_connections=64, pressure_timeout=0.2)
    with running(services, limits) as lst:
        if state == "handshake":
            raw = tcp(lst.port, GOOD)
            time.sleep(0.6)
            conn = verifying_context(officer_files).wrap_socket(raw, server_hostname="localhost")
        else:
            conn = tls(officer_files, lst.port)
            assert roundtrip(conn, query_request()).batch_items[0].result_status.value == enums.ResultStatus.SUCCESS
            time.sleep(0.6)
        with conn:
            assert roundtrip(conn, query_request()).batch_items[0].result_status.value == enums.ResultStatus.SUCCESS


def test_keyserver_serve_under_kmip_floods_keeps_its_memory_and_serves(tmp_path: Path) -> None:
    """The product as run (`keyserver serve`, KMIP in its process): four addresses hold
    64 connections that never start TLS, each reopened as soon as it is closed, while a
    good client connects anew for each of its requests. It is served every time (after
    retrying a refused connection, as a KMIP client does), and the server's RSS grows by
    buffers only."""
    kmip_port = free_port()
    with Server(tmp_path / "data", STRONGROOM_KMIP_PORT=str(kmip_port)) as server:
        out = tmp_path / "client"
        done = subprocess.run([server.cli, "kmip-client", "create", "flood.example.com", "--role", "key-officer",
                               "--out", str(out)], env=server.env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        files = ClientFiles("flood.example.com", "", out / "cert.pem", out / "key.pem", out / "ca.pem")
        baseline = rss(server.proc.pid)
        peak = [baseline]
        stop = threading.Event()

        def flood() -> None:
            socks: list[socket.socket | None] = [None] * 64
            while not stop.is_set():
                for i, s in enumerate(socks):
                    if s is not None:
                        s.setblocking(False)
                        try:
                            if s.recv(1) != b"":
                                continue
                        except BlockingIOError:
                            continue
                        except OSError:
                            pass
                        s.close()
                    with contextlib.suppress(OSError):
                        socks[i] = tcp(kmip_port, f"127.0.0.{2 + i % 4}")
                peak[0] = max(peak[0], rss(server.proc.pid))
                stop.wait(0.05)
            for s in socks:
                if s is not None:
                    s.close()

        attacker = threading.Thread(target=flood)
        attacker.start()
        try:
            time.sleep(1)  # the flood under way: the listener full of unfinished handshakes
            answered = 0
            for _ in range(20):
                for _attempt in range(50):
                    if served(files, kmip_port):
                        answered += 1
                        break
                    time.sleep(0.05)
        finally:
            stop.set()
            attacker.join(60)
        assert answered == 20
        assert peak[0] - baseline < 40 << 20, f"RSS grew by {(peak[0] - baseline) >> 20} MiB"


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")
