"""The drills' load and figures: clients through the load balancer recording every
acknowledged operation, and requests, errors and latency per phase."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from kmsbench.drill_rig import (
    KEYS,
)

# --- the load ----------------------------------------------------------------------------

@dataclass
class Op:
    kind: str  # "datakey" or "rotate"
    key: str
    request_id: str
    start: float
    end: float
    error: str | None = None  # the class: "connection closed", "connection reset", "502", "503 <code>", ...
    blob: str | None = None
    plaintext: str | None = None
    version: int | None = None
    key_id: str | None = None


def _classify(exc: BaseException) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connect failed"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "connection closed"
    if isinstance(exc, (httpx.ReadError, httpx.WriteError)):
        return "connection reset"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    return type(exc).__name__


class Load:
    """`clients` concurrent clients through the load balancer, on an event loop of their
    own (a thread): `rotators` of them rotate a key every `rotate_every` s, the others
    generate data keys back to back (`think_ms`: a mean wait between requests). Each
    client keeps one connection alive for 0.5-1.5 times `connection_s`, then opens
    another (as clients with a connection lifetime do: a replica back in the pool gets
    its share of new connections), and after any error."""

    def __init__(self, base: str, token: str, trust: ssl.SSLContext, *, clients: int, rotators: int,
                 think_ms: float, rotate_every: float, tag: str, connection_s: float = 4.0) -> None:
        self.base, self.trust, self.tag = base, trust, tag
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.clients, self.rotators, self.think, self.rotate_every = clients, rotators, think_ms / 1000, rotate_every
        self.connection_s = connection_s
        self.ops: list[Op] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="drill-load", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)

    async def _main(self) -> None:
        await asyncio.gather(*(self._client(i) for i in range(self.clients)))

    def _client_for(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base, verify=self.trust, headers=self.headers, timeout=30,
                                 limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))

    async def _client(self, i: int) -> None:
        import random

        rng = random.Random(i)  # noqa: S311 - timing and connection lifetimes, not secrets
        rotator = i < self.rotators
        key = KEYS[i % len(KEYS)]
        client, n = self._client_for(), 0
        until = time.monotonic() + rng.uniform(0.5, 1.5) * self.connection_s
        await asyncio.sleep(rng.random() * 0.5)  # not all at once
        try:
            while not self._stop.is_set():
                n += 1
                rid = f"{self.tag}-{i}-{n}"
                op = Op("rotate" if rotator else "datakey", key, rid, time.monotonic(), 0.0)
                try:
                    if rotator:
                        r = await client.post(f"/api/v1/keys/{key}/rotate", headers={"X-Request-ID": rid})
                    else:
                        r = await client.post(f"/api/v1/keys/{key}/generate-data-key", content=b"{}",
                                              headers={"X-Request-ID": rid})
                    op.end = time.monotonic()
                    if r.status_code == 200:
                        body = r.json()
                        if rotator:
                            op.version, op.key_id = body["current_version"], body["id"]
                        else:
                            op.blob, op.plaintext = body["ciphertext_blob"], body["plaintext"]
                    else:
                        code = ""
                        if r.headers.get("content-type", "").startswith("application/problem+json"):
                            code = " " + str(r.json().get("code", ""))
                        op.error = f"{r.status_code}{code}"
                except httpx.HTTPError as exc:
                    op.end = time.monotonic()
                    op.error = _classify(exc)
                self.ops.append(op)
                if op.error is not None or time.monotonic() > until:
                    await client.aclose()
                    client = self._client_for()
                    until = time.monotonic() + rng.uniform(0.5, 1.5) * self.connection_s
                if rotator:
                    await asyncio.sleep(self.rotate_every)
                elif self.think:
                    await asyncio.sleep(rng.uniform(0, 2 * self.think))
        finally:
            await client.aclose()


# --- figures -----------------------------------------------------------------------------

@dataclass
class PhaseFigures:
    name: str
    seconds: float
    requests: int
    errors: int
    per_second: float
    p50_ms: float | None
    p99_ms: float | None
    error_classes: dict[str, int] = field(default_factory=dict)


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 1)


def phase_figures(ops: list[Op], name: str, start: float, end: float) -> PhaseFigures:
    mine = [o for o in ops if start <= o.start < end]
    ok = [o.end - o.start for o in mine if o.error is None]
    errors = [o for o in mine if o.error is not None]
    return PhaseFigures(name, round(end - start, 2), len(mine), len(errors), round(len(ok) / max(end - start, 1e-9), 1),
                        _pct(ok, 0.50), _pct(ok, 0.99), dict(Counter(o.error or "" for o in errors)))


@dataclass
class DrillResult:
    drill: str
    description: str
    phases: list[PhaseFigures]
    # The disruption: from the kill (or the PostgreSQL restart's start) to when it was
    # over for new requests (the replica marked down; every replica serving again).
    window: tuple[float, float]
    window_label: str
    errors_in_flight_at_start: int
    errors_started_in_window: int
    errors_outside_window: int
    error_span_s: float | None  # first failed request's start to last failed request's end
    last_error_s: float | None  # the last failed request's end, from the window's start
    events: dict[str, float]  # seconds from the load's start
    checks: dict[str, bool]
    counts: dict[str, int]
    problems: list[str]


