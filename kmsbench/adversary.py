"""`kms-bench adversary`: the key server under each hostile-client attack of issue 25,
side by side with no attack — the server process's resident memory (before, and the
peak during the attack) and a good client's latency, p50/p99, over HTTPS and over KMIP.

A throwaway `keyserver serve` (embedded store, SoftHSM2, every port on loopback) is
started in a scratch directory. The good clients come from 127.0.0.1; the attackers
from other loopback addresses (127.0.0.2 …), as other machines would. Each attack runs
until the good clients have made their requests, and stops by itself.

* `chunked-rest` / `chunked-agent`: 4 connections at a time sending endless chunked
  bodies to POST /api/v1/auth/login (REST) and /api/v1/enroll (agent port);
* `endless-headers`: 4 connections sending one header line that never ends;
* `slow-headers`: 60 connections dripping a header byte every 200 ms;
* `pre-tls`: 500 TCP connections to the REST port that never start TLS;
* `agent-pre-tls`: 512 such connections to the agent port from eight addresses;
* `kmip-pre-tls`: 64 connections to KMIP that never start TLS, from one address, then
  from four, each reopened as soon as the server closes it;
* `kmip-idle`: 64 authenticated KMIP connections from four addresses, held idle.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from kmip.core import enums
from kmip.core.messages import contents, messages, payloads
from kmip.core.utils import BytearrayStream
from rich.console import Console

from kmsbench.keyserver_load import machine
from kmsbench.ports import free_port
from kmsbench.sections import write_section

console = Console(stderr=True)
SECTION = "adversary-bench"
HEADING = "## Under attack: memory and a good client's latency (issue 25)"
KEYSERVER = str(Path(sys.executable).with_name("keyserver"))
CHUNK = b"x" * 65536



def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class Target:
    data: Path
    proc: subprocess.Popen[bytes]
    port: int
    agent_port: int
    kmip_port: int
    client: Path  # the KMIP client's files (cert.pem, key.pem, ca.pem)

    def trust(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.data / "ca.pem"))
        ctx.check_hostname = False
        return ctx

    def kmip_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.client / "ca.pem"))
        ctx.check_hostname = False
        ctx.load_cert_chain(str(self.client / "cert.pem"), str(self.client / "key.pem"))
        return ctx


@contextlib.contextmanager
def keyserver(work: Path) -> Iterator[Target]:
    data = work / "data"
    port, agent_port, kmip_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRONGROOM_", "SOFTHSM2_CONF"))}
    env.update(STRONGROOM_DATA_DIR=str(data), STRONGROOM_PORT=str(port), STRONGROOM_AGENT_PORT=str(agent_port),
               STRONGROOM_KMIP_PORT=str(kmip_port), STRONGROOM_LOG_LEVEL="ERROR")
    client = work / "kmip-client"
    proc = subprocess.Popen([KEYSERVER, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = Target(data, proc, port, agent_port, kmip_port, client)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"keyserver serve exited with {proc.returncode}")
            with contextlib.suppress(OSError, httpx.TransportError):
                if (data / "ca.pem").exists() and httpx.get(f"https://127.0.0.1:{port}/readyz", verify=target.trust(),
                                                           timeout=2).status_code == 200:
                    socket.create_connection(("127.0.0.1", kmip_port), timeout=2).close()
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the key server did not become ready in 120 s")
            time.sleep(0.2)
        done = subprocess.run([KEYSERVER, "kmip-client", "create", "adversary-bench", "--role", "key-officer",
                               "--out", str(client)], env=env, capture_output=True, text=True, timeout=300,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"keyserver kmip-client create failed: {done.stderr}")
        yield target
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# --- the good clients ------------------------------------------------------------------
def _query() -> bytes:
    batch = [messages.RequestBatchItem(operation=contents.Operation(enums.Operation.QUERY),
                                       request_payload=payloads.QueryRequestPayload(
                                           query_functions=[enums.QueryFunction.QUERY_OPERATIONS]))]
    header = messages.RequestHeader(protocol_version=contents.ProtocolVersion(1, 2),
                                    batch_count=contents.BatchCount(1))
    stream = BytearrayStream()
    messages.RequestMessage(request_header=header, batch_items=batch).write(stream)
    return bytes(stream.buffer)


def _exactly(conn: ssl.SSLSocket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def good_http(t: Target, n: int) -> tuple[list[float], int]:
    """n GET /readyz on one keep-alive connection (reconnecting after an error)."""
    times, errors = [], 0
    with httpx.Client(base_url=f"https://127.0.0.1:{t.port}", verify=t.trust(), timeout=30) as c:
        for _ in range(n):
            start = time.perf_counter()
            try:
                ok = c.get("/readyz").status_code == 200
            except httpx.HTTPError:
                ok = False
            times.append(time.perf_counter() - start)
            errors += not ok
    return times, errors


def good_kmip(t: Target, n: int) -> tuple[list[float], int]:
    """n Query requests, each on a new TLS connection (as a client that connects per
    request does: what connection floods hit), with up to 50 retries of a refused one."""
    ctx, query = t.kmip_context(), _query()
    times, errors = [], 0
    for _ in range(n):
        start = time.perf_counter()
        for _attempt in range(50):
            try:
                with ctx.wrap_socket(socket.create_connection(("127.0.0.1", t.kmip_port), timeout=30)) as conn:
                    conn.sendall(query)
                    header = _exactly(conn, 8)
                    _exactly(conn, struct.unpack("!I", header[4:])[0])
                break
            except (OSError, ssl.SSLError):
                time.sleep(0.05)
        else:
            errors += 1
        times.append(time.perf_counter() - start)
    return times, errors


# --- the attacks -----------------------------------------------------------------------
Attack = Callable[[Target, threading.Event], None]


def _tls(t: Target, port: int, source: str) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    return t.trust().wrap_socket(raw, server_hostname="127.0.0.1")


def _answered(conn: ssl.SSLSocket) -> bool:
    if not select.select([conn], [], [], 0)[0] and not conn.pending():
        return False
    conn.setblocking(False)
    try:
        return bool(conn.recv(1024))
    except (ssl.SSLWantReadError, BlockingIOError):
        return False
    except OSError:
        return True
    finally:
        conn.settimeout(30)


def _flood_body(t: Target, stop: threading.Event, port: int, head: bytes, frame: bytes, source: str) -> None:
    while not stop.is_set():
        try:
            conn = _tls(t, port, source)
        except (OSError, ssl.SSLError):
            time.sleep(0.05)
            continue
        with conn:
            try:
                conn.sendall(head)
                for _ in range(4096):  # 256 MiB at most per connection
                    if stop.is_set() or _answered(conn):
                        break
                    conn.sendall(frame)
            except (OSError, ssl.SSLError):
                pass


def _parallel(n: int, fn: Callable[[], None]) -> None:
    threads = [threading.Thread(target=fn, daemon=True) for _ in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def chunked(where: str) -> Attack:
    def attack(t: Target, stop: threading.Event) -> None:
        port, path = (t.port, "/api/v1/auth/login") if where == "rest" else (t.agent_port, "/api/v1/enroll")
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n").encode()
        frame = b"%x\r\n" % len(CHUNK) + CHUNK + b"\r\n"
        _parallel(4, lambda: _flood_body(t, stop, port, head, frame, "127.0.0.2"))
    return attack


def endless_headers(t: Target, stop: threading.Event) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Endless: "
    _parallel(4, lambda: _flood_body(t, stop, t.port, head, CHUNK, "127.0.0.2"))


def slow_headers(t: Target, stop: threading.Event) -> None:
    def one() -> None:
        while not stop.is_set():
            try:
                conn = _tls(t, t.port, "127.0.0.2")
            except (OSError, ssl.SSLError):
                time.sleep(0.2)
                continue
            with conn:
                try:
                    conn.sendall(b"GET /healthz HTTP/1.1\r\n")
                    while not stop.wait(0.2):
                        conn.sendall(b"X")
                except (OSError, ssl.SSLError):
                    pass
    _parallel(60, one)


def _hold_tcp(port: int, count: int, sources: list[str], stop: threading.Event, greeting: bytes = b"") -> None:
    """`count` TCP connections spread over `sources`, reopened when the server closes them."""
    socks: list[tuple[str, socket.socket | None]] = [(sources[i % len(sources)], None) for i in range(count)]
    while not stop.is_set():
        for i, (src, s) in enumerate(socks):
            alive = False
            if s is not None:
                s.setblocking(False)
                try:
                    alive = s.recv(1) != b""
                except BlockingIOError:
                    alive = True
                except OSError:
                    alive = False
                if not alive:
                    s.close()
            if not alive:
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(src, 0))
                    if greeting:
                        s.sendall(greeting)
                except OSError:
                    s = None
                socks[i] = (src, s)
        stop.wait(0.05)
    for _, s in socks:
        if s is not None:
            s.close()


def pre_tls(t: Target, stop: threading.Event) -> None:
    _hold_tcp(t.port, 500, ["127.0.0.3"], stop)


def agent_pre_tls(t: Target, stop: threading.Event) -> None:
    _hold_tcp(t.agent_port, 512, [f"127.0.0.{2 + i}" for i in range(8)], stop)


def kmip_pre_tls(sources: int) -> Attack:
    def attack(t: Target, stop: threading.Event) -> None:
        _hold_tcp(t.kmip_port, 64, [f"127.0.0.{2 + i}" for i in range(sources)], stop)
    return attack


def kmip_idle(t: Target, stop: threading.Event) -> None:
    ctx, query = t.kmip_context(), _query()
    held: list[ssl.SSLSocket] = []
    while not stop.is_set():
        held = [c for c in held if c.fileno() != -1]
        while len(held) < 64 and not stop.is_set():
            src = f"127.0.0.{2 + len(held) % 4}"
            try:
                c = ctx.wrap_socket(socket.create_connection(("127.0.0.1", t.kmip_port), timeout=5,
                                                             source_address=(src, 0)))
                c.sendall(query)
                header = _exactly(c, 8)
                _exactly(c, struct.unpack("!I", header[4:])[0])
                held.append(c)
            except (OSError, ssl.SSLError):
                break
        for c in list(held):  # closed by the server: drop it, it is reopened above
            c.setblocking(False)
            try:
                gone = c.recv(1) == b""
            except (ssl.SSLWantReadError, BlockingIOError):
                gone = False
            except OSError:
                gone = True
            if gone:
                c.close()
                held.remove(c)
        stop.wait(0.1)
    for c in held:
        c.close()


ATTACKS: dict[str, Attack | None] = {
    "none": None,
    "chunked-rest": chunked("rest"),
    "chunked-agent": chunked("agent"),
    "endless-headers": endless_headers,
    "slow-headers": slow_headers,
    "pre-tls": pre_tls,
    "agent-pre-tls (8 sources)": agent_pre_tls,
    "kmip-pre-tls (1 source)": kmip_pre_tls(1),
    "kmip-pre-tls (4 sources)": kmip_pre_tls(4),
    "kmip-idle (4 sources)": kmip_idle,
}


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def measure(t: Target, name: str, attack: Attack | None, *, http_n: int, kmip_n: int) -> dict[str, Any]:
    pid = t.proc.pid
    before = rss(pid)
    peak = [before]
    stop = threading.Event()

    def sampler() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], rss(pid))

    threads = [threading.Thread(target=sampler, daemon=True)]
    if attack is not None:
        threads.append(threading.Thread(target=attack, args=(t, stop), daemon=True))
    for th in threads:
        th.start()
    try:
        time.sleep(1.0 if attack is not None else 0)  # the attack under way before the good client starts
        http_times, http_errors = good_http(t, http_n)
        kmip_times, kmip_errors = good_kmip(t, kmip_n)
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    time.sleep(1.0)  # what the attack left behind, closed
    return {"attack": name, "rss_before_mib": before / 2**20, "rss_peak_mib": peak[0] / 2**20,
            "rss_after_mib": rss(pid) / 2**20,
            "http_p50_ms": _pct(http_times, .5), "http_p99_ms": _pct(http_times, .99), "http_errors": http_errors,
            "kmip_p50_ms": _pct(kmip_times, .5), "kmip_p99_ms": _pct(kmip_times, .99), "kmip_errors": kmip_errors,
            "http_n": http_n, "kmip_n": kmip_n}


def render(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [f"`kms-bench adversary` on {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Python {m['python']}"
             f" ({r['when']}). One `keyserver serve` (embedded store, one worker); the good client makes "
             f"{r['results'][0]['http_n']} GET /readyz on a keep-alive HTTPS connection, then "
             f"{r['results'][0]['kmip_n']} KMIP Query each on a new mutual-TLS connection, while the attack runs.",
             "", "| attack | server RSS before | peak during | after | HTTPS p50 / p99 | HTTPS errors "
             "| KMIP p50 / p99 (new connection each) | KMIP errors |", "|---|---|---|---|---|---|---|---|"]
    for x in r["results"]:
        lines.append(f"| {x['attack']} | {x['rss_before_mib']:.0f} MiB | {x['rss_peak_mib']:.0f} MiB "
                     f"(+{x['rss_peak_mib'] - x['rss_before_mib']:.0f}) | {x['rss_after_mib']:.0f} MiB "
                     f"| {x['http_p50_ms']:.1f} / {x['http_p99_ms']:.1f} ms | {x['http_errors']} "
                     f"| {x['kmip_p50_ms']:.1f} / {x['kmip_p99_ms']:.1f} ms | {x['kmip_errors']} |")
    if r.get("note"):
        lines += ["", r["note"]]
    return "\n".join(lines)


def run(*, http_n: int, kmip_n: int, attacks: list[str], output: Path | None, json_out: Path | None,
        note: str | None) -> dict[str, Any]:
    results = []
    with tempfile.TemporaryDirectory(prefix="kms-bench-adversary-") as tmp, keyserver(Path(tmp)) as target:
        measure(target, "warm-up", None, http_n=50, kmip_n=10)
        for name in attacks:
            console.print(f"[bold]{name}[/bold] …")
            x = measure(target, name, ATTACKS[name], http_n=http_n, kmip_n=kmip_n)
            console.print(f"  RSS {x['rss_before_mib']:.0f} → peak {x['rss_peak_mib']:.0f} MiB; HTTPS p50 "
                          f"{x['http_p50_ms']:.1f} p99 {x['http_p99_ms']:.1f} ms ({x['http_errors']} errors); KMIP "
                          f"p50 {x['kmip_p50_ms']:.1f} p99 {x['kmip_p99_ms']:.1f} ms ({x['kmip_errors']} errors)")
            results.append(x)
    report = {"machine": machine(), "when": time.strftime("%Y-%m-%d"), "results": results, "note": note}
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2))
    if output is not None:
        write_section(output, render(report), name=SECTION, heading=HEADING)
    print(render(report))
    return report


app = typer.Typer(add_completion=False)


@app.command()
def bench_adversary(
    requests: Annotated[int, typer.Option(min=10, help="the good client's HTTPS requests per attack")] = 300,
    kmip_requests: Annotated[int, typer.Option(min=5, help="the good client's KMIP requests per attack")] = 50,
    attack: Annotated[list[str] | None, typer.Option(help=f"attacks to run (default all): {', '.join(ATTACKS)}")]
        = None,
    output: Annotated[Path | None, typer.Option(help="Markdown file whose adversary section is rewritten")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="raw results as JSON")] = None,
    note: Annotated[str | None, typer.Option(help="a sentence written under the table (e.g. a busy machine)")]
        = None,
) -> None:
    """Server memory and a good client's latency under each hostile-client attack."""
    names = attack or list(ATTACKS)
    unknown = [n for n in names if n not in ATTACKS]
    if unknown:
        raise typer.BadParameter(f"unknown attack(s) {', '.join(unknown)}; choose from {', '.join(ATTACKS)}")
    if "none" not in names:
        names = ["none", *names]
    run(http_n=requests, kmip_n=kmip_requests, attacks=names, output=output, json_out=json_out, note=note)


def main(argv: list[str] | None = None) -> None:
    app(args=argv, prog_name="kms-bench adversary")


if __name__ == "__main__":
    main()
