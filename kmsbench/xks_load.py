"""`kms-bench xks`: issue 28's external key store target — AWS KMS's default of 1,800
requests/s per key store offered to a throwaway `keyserver serve`, p99 well inside AWS's
250 ms budget per call.

The load is open-loop: each request has a scheduled send time (rate x seconds of them,
spread over `--senders` processes) and its latency runs from that time, not from when a
busy client got round to sending it, so a slow server cannot hide its queue (no
coordinated omission). Requests are the XKS calls AWS KMS makes for a data key: Encrypt
of 32 bytes with a 64-byte encryption context in the AAD, and Decrypt of such a
ciphertext, half each, every one signed by botocore's SigV4 signer ahead of the run
(signatures stay valid five minutes, so a run is at most four) with a distinct
kmsRequestId. Every answer is checked (200, and plaintext back on Decrypt); the server's
audit chain gets one record per call, as in production.

Results: JSON and a Markdown table (`--json`, `--markdown`); docs/benchmarks.md's
section is written from a real run only (`--docs`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy.engine import make_url

from keyserver.core.principal import system_context
from keyserver.services import build_services
from keyserver.settings import Settings
from kmsbench.keyserver_load import _free_port, machine
from kmsbench.sections import write_section

TARGET_RATE = 1800  # AWS KMS's default request quota per external key store
BUDGET_MS = 250.0  # AWS KMS's timeout for one call to the proxy
WELL_INSIDE_MS = BUDGET_MS / 2  # "well inside": p99 at most half the budget
REGION = "eu-west-1"
MAX_SECONDS = 240  # SigV4 signatures are accepted for five minutes


def _sign(url: str, body: dict[str, Any], access: str, secret: str) -> tuple[bytes, dict[str, str]]:
    from botocore.auth import SigV4Auth  # a development dependency: AWS's own signer
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    data = json.dumps(body).encode()
    request = AWSRequest(method="POST", url=url, data=data, headers={"Content-Type": "application/json"})
    SigV4Auth(Credentials(access, secret), "kms-xks-proxy", REGION).add_auth(request)
    return data, dict(request.headers.items())


def _meta(op: str) -> dict[str, str]:
    return {"awsPrincipalArn": "arn:aws:iam::111122223333:role/bench", "kmsOperation": op,
            "kmsRequestId": str(uuid.uuid4()), "kmsKeyArn": "arn:aws:kms:eu-west-1:111122223333:key/bench"}


def _prepare(job: dict[str, Any]) -> list[tuple[str, bytes, dict[str, str]]]:
    """This sender's signed requests, alternately Encrypt and Decrypt."""
    base, access, secret, enc = job["base"], job["access"], job["secret"], job["sample"]
    aad = base64.b64encode(os.urandom(64)).decode()
    out = []
    for i in range(job["count"]):
        if i % 2 == 0:
            url = f"{base}/keys/bench/encrypt"
            body = {"requestMetadata": _meta("Encrypt"), "plaintext": base64.b64encode(os.urandom(32)).decode(),
                    "additionalAuthenticatedData": aad, "encryptionAlgorithm": "AES_GCM"}
        else:
            url = f"{base}/keys/bench/decrypt"
            body = {"requestMetadata": _meta("Decrypt"), "additionalAuthenticatedData": enc["aad"],
                    "encryptionAlgorithm": "AES_GCM", "ciphertext": enc["ciphertext"],
                    "initializationVector": enc["initializationVector"],
                    "authenticationTag": enc["authenticationTag"], "ciphertextMetadata": enc["ciphertextMetadata"]}
        data, headers = _sign(url, body, access, secret)
        out.append((url, data, headers))
    return out


async def _send(requests: list[tuple[str, bytes, dict[str, str]]], rate: float, start: float,
                ca: str) -> tuple[list[float], dict[str, int]]:
    trust = ssl.create_default_context(cadata=ca)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(verify=trust, limits=limits, timeout=10) as client:
        async def one(i: int, url: str, data: bytes, headers: dict[str, str]) -> None:
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                r = await client.post(url, content=data, headers=headers)
                key = str(r.status_code)
            except httpx.HTTPError as exc:
                key = type(exc).__name__
            latencies.append((time.monotonic() - due) * 1000)
            statuses[key] = statuses.get(key, 0) + 1

        await asyncio.gather(*(one(i, *req) for i, req in enumerate(requests)))
    return latencies, statuses


def _sender(job: dict[str, Any], ready: Any, go: Any, out: Any) -> None:
    requests = _prepare(job)
    ready.put(len(requests))
    start_wall = go.get()
    start = time.monotonic() + (start_wall - time.time())
    out.put(asyncio.run(_send(requests, job["rate"], start, job["ca"])))


def _pct(xs: list[float], p: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] if ordered else float("nan")


def run(*, postgres: str | None, rate: int, seconds: int, senders: int, workers: int) -> dict[str, Any]:
    if seconds > MAX_SECONDS:
        raise SystemExit(f"--seconds is at most {MAX_SECONDS}: SigV4 signatures are accepted for five minutes")
    admin_url = make_url(postgres) if postgres else None
    dbname = f"strongroom_xks_{uuid.uuid4().hex[:8]}"
    if admin_url is not None:
        with psycopg.connect(host=admin_url.host, port=admin_url.port or 5432, user=admin_url.username,
                             password=admin_url.password, dbname=admin_url.database or "postgres",
                             autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')
    else:
        workers = 1
    data = Path(tempfile.mkdtemp(prefix="strongroom-xks-bench-"))
    port = _free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("STRONGROOM_")},
           "STRONGROOM_DATA_DIR": str(data), "STRONGROOM_PORT": str(port), "STRONGROOM_WORKERS": str(workers),
           "STRONGROOM_LOG_LEVEL": "WARNING", "STRONGROOM_DATABASE_POOL_SIZE": "16", "STRONGROOM_THREADS": "16",
           "STRONGROOM_KMIP_ENABLED": "false", "STRONGROOM_AGENT_ENABLED": "false"}
    if admin_url is not None:
        env["STRONGROOM_DATABASE_URL"] = admin_url.set(database=dbname).render_as_string(hide_password=False)
    os.environ.update({k: v for k, v in env.items() if k.startswith("STRONGROOM_")})
    if admin_url is None:
        os.environ.pop("STRONGROOM_DATABASE_URL", None)
    from keyserver.core.keys import KeySpec

    services = build_services(Settings())
    services.initialize()
    ctx = system_context("bench")
    services.keys.create(ctx, KeySpec(name="bench"))
    store = services.xks.create(ctx, name="bench", region=REGION)
    services.xks.grant(ctx, "bench", key="bench")
    services.audit.flush()
    ca = services.ca.certificate_pem().decode()
    server = subprocess.Popen([str(Path(sys.executable).with_name("keyserver")), "serve"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"https://127.0.0.1:{port}/xks/bench/kms/xks/v1"
    try:
        trust = ssl.create_default_context(cadata=ca)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"https://127.0.0.1:{port}/readyz", timeout=2, verify=trust).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the benchmark server did not become ready")
            time.sleep(0.2)
        access, secret = store.store.access_key_id, store.secret_access_key
        aad = base64.b64encode(b"kms-bench encryption context").decode()
        body, headers = _sign(f"{base}/keys/bench/encrypt", {
            "requestMetadata": _meta("Encrypt"), "plaintext": base64.b64encode(b"k" * 32).decode(),
            "additionalAuthenticatedData": aad, "encryptionAlgorithm": "AES_GCM"}, access, secret)
        r = httpx.post(f"{base}/keys/bench/encrypt", content=body, headers=headers, verify=trust)
        r.raise_for_status()
        sample = {**r.json(), "aad": aad}
        total = rate * seconds
        jobs = [{"base": base, "access": access, "secret": secret, "sample": sample, "ca": ca,
                 "count": total // senders, "rate": rate / senders} for _ in range(senders)]
        mp = multiprocessing.get_context("spawn")
        ready, go, out = mp.Queue(), mp.Queue(), mp.Queue()
        procs = [mp.Process(target=_sender, args=(job, ready, go, out)) for job in jobs]
        for p in procs:
            p.start()
        prepared = sum(ready.get(timeout=600) for _ in procs)
        start = time.time() + 2
        for _ in procs:
            go.put(start)
        latencies: list[float] = []
        statuses: dict[str, int] = {}
        for _ in procs:
            lat, st = out.get(timeout=seconds + 120)
            latencies += lat
            for k, v in st.items():
                statuses[k] = statuses.get(k, 0) + v
        for p in procs:
            p.join(30)
        elapsed = max(seconds, 1)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        services.close()
        shutil.rmtree(data, ignore_errors=True)
        if admin_url is not None:
            with psycopg.connect(host=admin_url.host, port=admin_url.port or 5432, user=admin_url.username,
                                 password=admin_url.password, dbname=admin_url.database or "postgres",
                                 autocommit=True, connect_timeout=5) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    ok = statuses.get("200", 0)
    p99 = _pct(latencies, 0.99)
    return {
        "machine": machine(), "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "database": "PostgreSQL" if admin_url is not None else "SQLite (embedded)", "workers": workers,
        "offered_rate": rate, "seconds": seconds, "requests": prepared, "ok": ok, "statuses": statuses,
        "achieved_rate": round(ok / elapsed, 1),
        "p50_ms": round(_pct(latencies, 0.50), 2), "p90_ms": round(_pct(latencies, 0.90), 2),
        "p99_ms": round(p99, 2), "max_ms": round(max(latencies, default=float("nan")), 2),
        "mean_ms": round(statistics.fmean(latencies), 2) if latencies else None,
        "target": {"rate": TARGET_RATE, "budget_ms": BUDGET_MS, "p99_at_most_ms": WELL_INSIDE_MS,
                   "met": bool(rate >= TARGET_RATE and ok == prepared and p99 <= WELL_INSIDE_MS)},
    }


def render(r: dict[str, Any]) -> str:
    t = r["target"]
    return "\n".join((
        f"XKS proxy, {r['offered_rate']} requests/s offered for {r['seconds']} s (half Encrypt, half Decrypt, "
        f"SigV4-signed by botocore), {r['database']}, {r['workers']} worker(s), {r['when']}:",
        "",
        "| requests | answered 200 | achieved /s | p50 ms | p90 ms | p99 ms | max ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {r['requests']} | {r['ok']} | {r['achieved_rate']} | {r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} "
        f"| {r['max_ms']} |",
        "",
        f"Target (issue 28): {t['rate']} requests/s offered, every call answered, p99 at most "
        f"{t['p99_at_most_ms']:.0f} ms (half of AWS KMS's {t['budget_ms']:.0f} ms budget): "
        f"**{'met' if t['met'] else 'missed'}**.",
    ))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="kms-bench xks", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres",
                   help="PostgreSQL URL for a scratch database (default: local); 'embedded' for SQLite")
    p.add_argument("--rate", type=int, default=TARGET_RATE, help="requests/s offered (default 1800)")
    p.add_argument("--seconds", type=int, default=30, help=f"seconds of load (default 30, at most {MAX_SECONDS})")
    p.add_argument("--senders", type=int, default=2, help="client processes (default 2)")
    p.add_argument("--workers", type=int, default=2, help="server worker processes (default 2)")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--markdown", type=Path, help="write the table here")
    p.add_argument("--docs", type=Path, help="rewrite the xks section of this Markdown file (docs/benchmarks.md)")
    args = p.parse_args(argv)
    result = run(postgres=None if args.postgres == "embedded" else args.postgres, rate=args.rate,
                 seconds=args.seconds, senders=args.senders, workers=args.workers)
    text = render(result)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.docs:
        write_section(args.docs, text, name="xks", heading="## AWS KMS external key store (XKS) proxy")


if __name__ == "__main__":
    main()
