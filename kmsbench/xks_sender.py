"""The open-loop client of `kms-bench xks`: one sender process's share of the schedule,
sent over persistent TLS connections, each request's fate recorded, the whole bounded in
time.

Why not httpx: the first rig started every request of the run as a coroutine at once
through an `httpx.AsyncClient` with 512 connections per sender. Once all of them were
busy, the rest waited inside httpcore's pool, whose bookkeeping pass (run whenever a
request joins, finishes or times out) walks every waiting request times every
connection: 29 ms of CPU per pass with 1,000 waiting (measured), so a sender offering
900 requests/s needed tens of seconds of CPU per second and never got through its
54,000 requests. It also opened connections on demand past the server's 64 per address
and worker (answered 503 too_many_connections, reconnected, a TLS handshake each time).
Here requests are signed and serialised before the start, each sender keeps a fixed
set of connections opened (and used once) before the start, requests wait for a free
connection in a FIFO of our own, and nothing outlives its deadline:

* a request's latency runs from its scheduled time (no coordinated omission), so time
  spent waiting for a connection counts;
* a request not answered within `timeout` of its scheduled time is a timeout (its
  connection is closed and reopened, as a client with a deadline does); one still
  waiting for a connection then is dropped unsent, and one the dispatcher itself
  reaches that late is recorded as the client's fault, not the server's;
* the run ends at the last scheduled time plus `timeout`, whatever the server does.

Spawned by kmsbench.xks_load (multiprocessing, "spawn"): this module imports nothing of
the key server, so a sender starts fast.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import re
import resource
import ssl
import sys
import time
import traceback
import uuid
from array import array
from collections import Counter
from typing import Any

OPERATIONS = {"encrypt": "Encrypt", "decrypt": "Decrypt", "metadata": "GetKeyMetadata"}
# Fates of a request other than an HTTP answer; answers are "200" or "<status> <errorName>".
OK, NOT_SENT, IN_FLIGHT, TIMEOUT, NO_CONNECTION, CLIENT_BEHIND = (
    "ok", "not sent", "in flight", "timeout", "no free connection within the timeout",
    "not sent: the load generator was behind")
PLAINTEXT = b"k" * 32  # what every Decrypt must give back (the warm-up Encrypt's plaintext)
PROGRESS_EVERY = 1.0
_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.I)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[ \t]*chunked", re.I)
_CLOSE = re.compile(rb"\r\nconnection:[ \t]*close", re.I)
_ERROR = re.compile(rb'"(?:errorName|code)":"([A-Za-z_]+)"')


def pattern(mix: dict[str, int]) -> list[str]:
    """The operations in the order they are offered: smooth weighted round robin over
    100 slots, so every stretch of the schedule has the mix, not blocks of one kind."""
    current = dict.fromkeys(mix, 0)
    total = sum(mix.values())
    out = []
    for _ in range(total):
        for op, weight in mix.items():
            current[op] += weight
        op = max(current, key=lambda k: current[k])
        current[op] -= total
        out.append(op)
    return out


def operation_of(job: dict[str, Any], i: int) -> str:
    """The operation of this sender's i-th request (the global schedule interleaves the
    senders: global index i * senders + sender)."""
    ops = job["pattern"]
    return str(ops[(i * job["senders"] + job["index"]) % len(ops)])


def due(job: dict[str, Any], start: float, i: int) -> float:
    return start + (i * int(job["senders"]) + int(job["index"])) / float(job["rate"])


def meta(op: str) -> dict[str, str]:
    return {"awsPrincipalArn": "arn:aws:iam::111122223333:role/kms-bench", "kmsOperation": OPERATIONS[op],
            "kmsRequestId": str(uuid.uuid4()), "kmsKeyArn": "arn:aws:kms:eu-west-1:111122223333:key/kms-bench"}


def signed(job: dict[str, Any], op: str, body: dict[str, Any]) -> bytes:
    """`body` to `op`, as it goes on the wire, signed by botocore's SigV4 signer (AWS's own)."""
    from botocore.auth import SigV4Auth  # a development dependency
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    path = f"{job['path']}/keys/{job['key']}/{op}"
    host = f"{job['host']}:{job['port']}"
    data = json.dumps(body).encode()
    request = AWSRequest(method="POST", url=f"https://{host}{path}", data=data,
                         headers={"Content-Type": "application/json"})
    SigV4Auth(Credentials(job["access"], job["secret"]), "kms-xks-proxy", job["region"]).add_auth(request)
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in request.headers.items()) + f"Content-Length: {len(data)}\r\n\r\n"
    return head.encode() + data


def sign(job: dict[str, Any], op: str) -> bytes:
    """One request of the run: a fresh data key to encrypt, the sample to decrypt, or the
    key's metadata, with a request id of its own."""
    sample = job["sample"]
    body: dict[str, Any] = {"requestMetadata": meta(op)}
    if op == "encrypt":
        body |= {"plaintext": base64.b64encode(os.urandom(32)).decode(),
                 "additionalAuthenticatedData": sample["aad"], "encryptionAlgorithm": "AES_GCM"}
    elif op == "decrypt":
        body |= {"additionalAuthenticatedData": sample["aad"], "encryptionAlgorithm": "AES_GCM",
                 **{k: sample[k] for k in ("ciphertext", "initializationVector", "authenticationTag",
                                           "ciphertextMetadata")}}
    return signed(job, op, body)


def prepare(job: dict[str, Any]) -> list[bytes]:
    """This sender's requests for the whole run, signed now: signing during the run
    would cost the client time the schedule does not give it (signatures stay valid
    for five minutes, so a run is at most four)."""
    return [sign(job, operation_of(job, i)) for i in range(job["count"])]


# What a 200 answer to each operation must contain (Starlette writes compact JSON).
EXPECTED = {"decrypt": b'"plaintext":"' + base64.b64encode(PLAINTEXT) + b'"', "encrypt": b'"ciphertext":"',
            "metadata": b'"keyStatus":"ENABLED"'}


def classify(status: int, body: bytes, op: str) -> str:
    if status == 200:
        return OK if EXPECTED[op] in body else "200 with a wrong answer"
    m = _ERROR.search(body)
    return f"{status} {m.group(1).decode()}" if m else str(status)


def error_class(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return f"TLS error ({exc.reason or type(exc).__name__})"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, asyncio.IncompleteReadError | ConnectionResetError | BrokenPipeError):
        return "connection closed by the server"
    return f"connection failed ({type(exc).__name__})"


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, job: dict[str, Any], tls: ssl.SSLContext) -> Connection:
        reader, writer = await asyncio.open_connection(job["host"], job["port"], ssl=tls,
                                                       local_addr=(job["source"], 0))
        return cls(reader, writer)

    def usable(self) -> bool:
        # The server closes idle keep-alive connections; one it closed is not used again.
        return not self.reader.at_eof() and not self.writer.is_closing()

    async def exchange(self, request: bytes) -> tuple[int, bytes, bool]:
        """(status, body, the server closes the connection after it)."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = _LENGTH.search(head)
        if length is not None:
            body = await self.reader.readexactly(int(length.group(1)))
        elif _CHUNKED.search(head):
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                parts.append(await self.reader.readexactly(size + 2))
                if size == 0:
                    break
            body = b"".join(p[:-2] for p in parts)
        else:
            raise ConnectionResetError("an answer without a length")
        return status, body, _CLOSE.search(head) is not None

    def close(self) -> None:
        self.writer.transport.abort()  # no TLS goodbye: the deadline has passed


def trust(job: dict[str, Any]) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=job["ca"])


async def warm(job: dict[str, Any], tls: ssl.SSLContext, warmups: list[bytes]) -> list[Connection]:
    """Opens the sender's connections and makes one GetKeyMetadata on each, so that the
    run measures neither TLS handshakes nor a worker's first signing-key derivation."""
    async def one(request: bytes) -> Connection:
        conn = await Connection.open(job, tls)
        status, body, closing = await conn.exchange(request)
        fate = classify(status, body, "metadata")
        if fate != OK:
            raise RuntimeError(f"warm-up GetKeyMetadata answered {fate}: {body[:300]!r}")
        if closing:
            raise RuntimeError("the server closed a connection after the warm-up request")
        return conn

    async with asyncio.timeout(60):
        return list(await asyncio.gather(*(one(r) for r in warmups)))


async def drive(job: dict[str, Any], requests: list[bytes], conns: list[Connection | None], start: float,
                report: Any = None) -> dict[str, Any]:
    """Sends `requests` at their scheduled times from `start` (time.monotonic()), over
    `conns` (one worker each), and returns every request's fate and latency. `report`,
    when given, is called about once a second with counts so far."""
    tls = trust(job)
    n, timeout = len(requests), float(job["timeout"])
    fates = ["" for _ in range(n)]
    latency = array("d", [math.nan]) * n  # seconds from the scheduled time, answered requests only
    lag = array("d", [0.0]) * n  # scheduled time to the dispatcher's taking it: the client's own delay
    counts: Counter[str] = Counter()
    waiting: asyncio.Queue[int | None] = asyncio.Queue()
    stats = {"reconnects": 0, "last_answer": start, "in_flight": 0}
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)

    def settle(i: int, fate: str) -> None:
        fates[i] = fate
        counts[fate] += 1

    async def worker(w: int) -> None:
        while (i := await waiting.get()) is not None:
            deadline = due(job, start, i) + timeout
            if time.monotonic() >= deadline:
                settle(i, NO_CONNECTION)
                continue
            op = operation_of(job, i)
            fates[i] = IN_FLIGHT
            stats["in_flight"] += 1
            try:
                async with asyncio.timeout(deadline - time.monotonic()):
                    conn = conns[w]
                    if conn is None or not conn.usable():
                        if conn is not None:
                            conn.close()
                        conns[w] = None
                        conn = conns[w] = await Connection.open(job, tls)
                        stats["reconnects"] += 1
                    status, body, closing = await conn.exchange(requests[i])
                answered = time.monotonic()
                latency[i] = answered - due(job, start, i)
                stats["last_answer"] = max(stats["last_answer"], answered)
                settle(i, classify(status, body, op))
                if closing:
                    conn.close()
                    conns[w] = None
            except TimeoutError:
                settle(i, TIMEOUT)
                _drop(conns, w)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                settle(i, error_class(exc))
                _drop(conns, w)
            finally:
                stats["in_flight"] -= 1

    async def progress() -> None:
        seen = 0
        while True:
            await asyncio.sleep(PROGRESS_EVERY)
            upto = dispatched
            lag_max = max(lag[seen:upto], default=0.0)  # over the requests dispatched since the last report
            seen = upto
            report({"dispatched": upto, "ok": counts[OK], "failed": sum(counts.values()) - counts[OK],
                    "timeouts": counts[TIMEOUT], "in_flight": stats["in_flight"], "waiting": waiting.qsize(),
                    "lag_max_ms": round(lag_max * 1000, 1)})

    workers = [asyncio.create_task(worker(w)) for w in range(len(conns))]
    reporter = asyncio.create_task(progress()) if report is not None else None
    dispatched = 0
    try:
        while dispatched < n:
            now = time.monotonic()
            at = due(job, start, dispatched)
            if at > now:
                await asyncio.sleep(at - now)
                continue
            while dispatched < n and (at := due(job, start, dispatched)) <= now:
                lag[dispatched] = now - at
                if now - at >= timeout:
                    settle(dispatched, CLIENT_BEHIND)
                else:
                    waiting.put_nowait(dispatched)
                dispatched += 1
        for _ in workers:
            waiting.put_nowait(None)
        # Every request left has its deadline by then; the margin is for closing.
        end = due(job, start, n - 1) + timeout + 2.0 if n else time.monotonic()
        await asyncio.wait(workers, timeout=max(0.0, end - time.monotonic()))
    finally:
        for task in [*workers, *([reporter] if reporter else [])]:
            task.cancel()
        await asyncio.gather(*workers, *([reporter] if reporter else []), return_exceptions=True)
        for w in range(len(conns)):
            _drop(conns, w)
    for i, fate in enumerate(fates):  # a worker cancelled mid-request (should not happen), or never reached
        if fate in ("", IN_FLIGHT):
            settle(i, TIMEOUT if fate == IN_FLIGHT else NOT_SENT)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    sent_lags = sorted(lag[:dispatched])
    classes = sorted(set(fates))
    code = {fate: k for k, fate in enumerate(classes)}
    return {"index": job["index"], "count": n, "classes": classes,
            "codes": array("H", [code[f] for f in fates]).tobytes(), "latency": latency.tobytes(),
            "start": start, "last_answer": stats["last_answer"], "reconnects": stats["reconnects"],
            "lag_p99_ms": round(sent_lags[int(0.99 * (len(sent_lags) - 1))] * 1000, 2) if sent_lags else 0.0,
            "lag_max_ms": round(sent_lags[-1] * 1000, 2) if sent_lags else 0.0,
            "cpu_s": round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 3)}


def _drop(conns: list[Connection | None], w: int) -> None:
    conn = conns[w]
    conns[w] = None
    if conn is not None:
        conn.close()


def _run(coro: Any) -> Any:
    try:
        import uvloop  # uvicorn's own loop: less of the client's CPU per request
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(job: dict[str, Any], control: Any, out: Any) -> None:
    """A sender process: sign, then on "connect" open and warm the connections, then on
    ("go", start) run the schedule, posting ("progress", ...) each second and finally
    ("result", ...). Any failure is posted as ("error", ...) before the process exits;
    the parent also watches the process itself, so a crash cannot leave it waiting."""
    index = job["index"]
    try:
        requests = prepare(job)
        warmups = [sign(job, "metadata") for _ in range(job["connections"])]
        out.put(("prepared", index, len(requests)))
        if control.get(timeout=job["wait_limit"]) != "connect":
            return

        async def session() -> dict[str, Any]:
            conns: list[Connection | None] = list(await warm(job, trust(job), warmups))
            out.put(("ready", index, len(conns)))
            command, start = await asyncio.get_running_loop().run_in_executor(
                None, lambda: control.get(timeout=job["wait_limit"]))
            if command != "go":
                for w in range(len(conns)):
                    _drop(conns, w)
                return {}
            return await drive(job, requests, conns, start, lambda snap: out.put(("progress", index, snap)))

        result = _run(session())
        if result:
            out.put(("result", index, result))
    except BaseException as exc:  # whatever it was, the parent must hear of it
        out.put(("error", index, "".join(traceback.format_exception(exc)).strip()))
        sys.exit(1)
