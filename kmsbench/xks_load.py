"""`kms-bench xks`: issue 28's external key store target — AWS KMS's default of 1,800
requests/s per key store offered to a throwaway `keyserver serve`, p99 well inside AWS's
250 ms budget per call (BENCHMARKS.md: p99 at most 100 ms, no error).

The load is open-loop: each request has a scheduled time (rate x seconds of them, evenly
spaced and interleaved over `--senders` processes) and its latency runs from that time,
not from when a busy client got round to sending it, so a slow server cannot hide its
queue (no coordinated omission). The requests are the XKS calls AWS KMS makes — Encrypt
of a 32-byte data key with the encryption context as AAD, Decrypt of such a ciphertext,
GetKeyMetadata — in a fixed mix (`--mix`), each signed by botocore's SigV4 signer
before the run with a distinct kmsRequestId, and every answer is checked (Decrypt gives
the plaintext back). The server audits every call, as in production; how far the audit
chain was behind after each run is reported.

Every run ends in bounded time: a request unanswered `--timeout` seconds after its
scheduled time is a timeout, the senders stop at the last scheduled time plus that,
and the parent gives up on a sender that is neither progressing nor alive. An
overloaded server shows up as timeouts and failures, never as a hang; the senders'
own delay (dispatch lag) and CPU per request are reported, so a client that could not
keep up is seen. The client itself: kmsbench/xks_sender.py.

Results: JSON (`--json`, by default kms-bench-xks-<time>.json here), the Markdown
(`--markdown`) and docs/benchmarks.md's section (`--docs`), also from a saved JSON
(`--from-json`) without running anything.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import multiprocessing
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from kmsbench import xks_sender
from kmsbench.drill import _interruptible
from kmsbench.drill_load import _pct
from kmsbench.keyserver_load import _med, _settle, _spread, machine
from kmsbench.ports import free_port
from kmsbench.sections import write_section

console = Console(stderr=True, highlight=False)
SECTION = "xks-bench"  # its marked section of docs/benchmarks.md
HEADING = "## AWS KMS external key store (XKS) proxy (issue 28)"
TARGET_RATE = 1800  # AWS KMS's default request quota per external key store
BUDGET_MS = 250.0  # AWS KMS's timeout for one call to the proxy
WELL_INSIDE_MS = 100.0  # "well inside": the benchmark sheet's p99 target (AWS allows 250 ms)
REGION = "eu-west-1"
MAX_SECONDS = 240  # SigV4 signatures are accepted for five minutes
MAX_PER_SOURCE = 64  # the server's http_max_connections_per_source: one sender is one source address
DEFAULT_MIX = {"encrypt": 45, "decrypt": 45, "metadata": 10}
CLIENT_LAG_NOTE_MS = 10.0  # dispatch lag p99 above this: the figures measure the client too


def parse_mix(text: str) -> dict[str, int]:
    """"encrypt=45,decrypt=45,metadata=10" -> percentages (they must add up to 100)."""
    mix: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        op, _, share = part.partition("=")
        if op not in xks_sender.OPERATIONS or not share.isdigit():
            raise argparse.ArgumentTypeError(f"{part!r}: expected OPERATION=PERCENT with an operation from "
                                             f"{', '.join(xks_sender.OPERATIONS)}")
        mix[op] = int(share)
    if sum(mix.values()) != 100:
        raise argparse.ArgumentTypeError(f"the mix adds up to {sum(mix.values())} %, not 100")
    return {op: share for op, share in mix.items() if share}


# --- the throwaway server --------------------------------------------------------------------

@contextmanager
def xks_server(*, postgres: str | None, workers: int) -> Iterator[dict[str, Any]]:
    """A `keyserver serve` on a scratch database (or the embedded store: one worker) with
    a key, an XKS store granted it, and one Encrypt made to have a ciphertext to decrypt.
    Yields the senders' common job and the services (for the audit backlog)."""
    import psycopg
    from sqlalchemy.engine import make_url

    from keyserver.core.keys import KeySpec
    from keyserver.core.principal import system_context
    from keyserver.services import build_services
    from keyserver.settings import Settings

    admin_url = make_url(postgres) if postgres else None
    dbname = f"strongroom_xks_{uuid.uuid4().hex[:8]}"

    def admin() -> Any:
        assert admin_url is not None
        return psycopg.connect(host=admin_url.host, port=admin_url.port or 5432, user=admin_url.username,
                               password=admin_url.password, dbname=admin_url.database or "postgres",
                               autocommit=True, connect_timeout=5)

    if admin_url is not None:
        try:
            with admin() as conn:
                conn.execute(f'CREATE DATABASE "{dbname}"')
        except psycopg.Error as exc:
            raise SystemExit(f"cannot reach PostgreSQL at {admin_url.render_as_string()}: {exc}; "
                             "pass --postgres URL, or --postgres embedded") from None
    data = Path(tempfile.mkdtemp(prefix="strongroom-xks-bench-"))
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("STRONGROOM_")},
           "STRONGROOM_DATA_DIR": str(data), "STRONGROOM_PORT": str(port), "STRONGROOM_WORKERS": str(workers),
           "STRONGROOM_LOG_LEVEL": "WARNING", "STRONGROOM_DATABASE_POOL_SIZE": "16", "STRONGROOM_THREADS": "16",
           "STRONGROOM_KMIP_ENABLED": "false", "STRONGROOM_AGENT_ENABLED": "false"}
    if admin_url is not None:
        env["STRONGROOM_DATABASE_URL"] = admin_url.set(database=dbname).render_as_string(hide_password=False)
    os.environ.update({k: v for k, v in env.items() if k.startswith("STRONGROOM_")})
    if admin_url is None:
        os.environ.pop("STRONGROOM_DATABASE_URL", None)
    server: subprocess.Popen[bytes] | None = None
    services = None
    try:
        services = build_services(Settings())
        services.initialize()
        ctx = system_context("kms-bench")
        services.keys.create(ctx, KeySpec(name="bench"))
        store = services.xks.create(ctx, name="bench", region=REGION)
        services.xks.grant(ctx, "bench", key="bench")
        services.audit.flush()
        job = {"host": "127.0.0.1", "port": port, "ca": services.ca.certificate_pem().decode(),
               "path": "/xks/bench/kms/xks/v1", "key": "bench", "region": REGION, "source": "127.0.0.1",
               "access": store.store.access_key_id, "secret": store.secret_access_key}
        server = subprocess.Popen([str(Path(sys.executable).with_name("keyserver")), "serve"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while (error := _first_encrypt(job)) is not None:
            if server.poll() is not None:
                raise SystemExit(f"the benchmark server exited with {server.returncode} before it answered")
            if time.monotonic() > deadline:
                raise SystemExit(f"the benchmark server did not answer an XKS Encrypt within 60 s: {error}")
            time.sleep(0.2)
        yield {"job": job, "services": services, "workers": workers,
               "database": "PostgreSQL" if admin_url is not None else "SQLite (embedded)"}
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        if services is not None:
            services.close()
        shutil.rmtree(data, ignore_errors=True)
        if admin_url is not None:
            with admin() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def _first_encrypt(job: dict[str, Any]) -> str | None:
    """Encrypts xks_sender.PLAINTEXT and puts the answer in job["sample"] (every Decrypt
    of the run decrypts it); the reason when the server does not answer yet."""
    aad = base64.b64encode(b"kms-bench encryption context").decode()
    request = xks_sender.signed(job, "encrypt", {
        "requestMetadata": xks_sender.meta("encrypt"), "plaintext": base64.b64encode(xks_sender.PLAINTEXT).decode(),
        "additionalAuthenticatedData": aad, "encryptionAlgorithm": "AES_GCM"})

    async def once() -> tuple[int, bytes]:
        async with asyncio.timeout(10):
            conn = await xks_sender.Connection.open(job, xks_sender.trust(job))
            try:
                status, body, _ = await conn.exchange(request)
            finally:
                conn.close()
        return status, body

    try:
        status, body = asyncio.run(once())
    except (OSError, EOFError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if status != 200:
        return f"{status} {body[:300]!r}"
    job["sample"] = {**json.loads(body), "aad": aad}
    return None


# --- one run: the senders, their progress, their results ---------------------------------------

class SenderFailure(SystemExit):
    """The load generator failed (not the server): no figure from this run is valid."""


def jobs_for(base: dict[str, Any], *, rate: int, seconds: int, senders: int, connections: int, timeout: float,
             mix: dict[str, int]) -> list[dict[str, Any]]:
    """Each sender's share: every senders-th request of the global schedule, its own
    connections, its own loopback source address (the server counts connections per
    address, as it would AWS KMS's hosts)."""
    total = rate * seconds
    ops = xks_sender.pattern(mix)
    return [{**base, "index": s, "senders": senders, "rate": rate, "pattern": ops, "timeout": timeout,
             "count": total // senders + (1 if s < total % senders else 0),
             "connections": connections // senders + (1 if s < connections % senders else 0),
             "source": f"127.0.0.{2 + s}", "wait_limit": 1800} for s in range(senders)]


def _progress_line(elapsed: float, total: int, snaps: dict[int, dict[str, Any]]) -> str:
    s: Counter[str] = Counter()
    for snap in snaps.values():
        s.update({k: v for k, v in snap.items() if k != "lag_max_ms"})
    lag = max((snap["lag_max_ms"] for snap in snaps.values()), default=0.0)
    return (f"  {elapsed:5.1f} s: {s['dispatched']:,} of {total:,} due; {s['ok']:,} ok, {s['failed']:,} failed "
            f"({s['timeouts']:,} timeouts); {s['in_flight']:,} in flight, {s['waiting']:,} waiting for a "
            f"connection; client lag max {lag:.1f} ms")


def _say(line: str) -> None:
    console.print(line, markup=False, soft_wrap=True)


def load(jobs: list[dict[str, Any]], *, seconds: int, say: Callable[[str], None] = _say) -> list[dict[str, Any]]:
    """Runs the senders of one run and returns their results; raises SenderFailure when
    one fails, dies or says nothing in time (they are all stopped then)."""
    mp = multiprocessing.get_context("spawn")  # the parent holds threads (audit chainer, pools): no fork
    out: Any = mp.Queue()
    controls = [mp.Queue() for _ in jobs]
    procs = [mp.Process(target=xks_sender.main, args=(job, control, out), name=f"xks-sender-{job['index']}",
                        daemon=True) for job, control in zip(jobs, controls, strict=True)]
    total = sum(job["count"] for job in jobs)
    timeout = max(job["timeout"] for job in jobs)
    try:
        for p in procs:
            p.start()
        # Signing runs at about 4,000 requests/s per core; the limits below are generous.
        _await(out, procs, "prepared", 60 + total / 500, "sign their requests")
        for control in controls:
            control.put("connect")
        _await(out, procs, "ready", 90, "open and warm their connections")
        start = time.monotonic() + 1.0
        for control in controls:
            control.put(("go", start))
        say(f"  {total:,} requests over {seconds} s from {len(jobs)} sender(s)")
        results: dict[int, dict[str, Any]] = {}
        snaps: dict[int, dict[str, Any]] = {}
        printed = start
        # The senders stop by themselves at the last scheduled time plus the timeout;
        # past that (and the time to hand over their results) they are stopped.
        deadline = start + seconds + timeout + 60
        while len(results) < len(procs):
            kind, index, payload = _next(out, procs, results, deadline)
            if kind == "progress":
                snaps[index] = payload
                if time.monotonic() - printed >= 0.95 * xks_sender.PROGRESS_EVERY:
                    printed = time.monotonic()
                    say(_progress_line(printed - start, total, snaps))
            elif kind == "result":
                results[index] = payload
        for p in procs:
            p.join(10)
        return [results[i] for i in sorted(results)]
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        for q in (out, *controls):
            q.cancel_join_thread()
            q.close()


def _next(out: Any, procs: list[Any], done: dict[int, Any] | set[int], deadline: float) -> tuple[str, int, Any]:
    """The next message from a sender, or SenderFailure: one posted an error, one died
    without a word, or nothing came before the deadline."""
    while True:
        try:
            # A sender's last message is in the pipe before it exits: look once more
            # before calling a sender that exited silent.
            dead = [p for i, p in enumerate(procs) if i not in done and p.exitcode is not None]
            kind, index, payload = out.get(timeout=2.0 if dead else 0.5)
        except queue.Empty:
            if dead:
                raise SenderFailure(f"sender {dead[0].name} exited with code {dead[0].exitcode} without a result "
                                    "(its traceback, if any, is above)") from None
            if time.monotonic() > deadline:
                missing = [p.name for i, p in enumerate(procs) if i not in done]
                raise SenderFailure(f"{', '.join(missing)} gave nothing before the deadline; stopped them") from None
            continue
        if kind == "error":
            raise SenderFailure(f"sender {index} failed:\n{payload}")
        return kind, index, payload


def _await(out: Any, procs: list[Any], kind: str, seconds: float, doing: str) -> None:
    done: set[int] = set()
    deadline = time.monotonic() + seconds
    while len(done) < len(procs):
        try:
            got, index, _ = _next(out, procs, done, deadline)
        except SenderFailure as exc:
            if "before the deadline" in str(exc):
                raise SenderFailure(f"the senders did not {doing} within {seconds:.0f} s") from None
            raise
        if got == kind:
            done.add(index)


# --- figures ----------------------------------------------------------------------------------

def _ms(x: float | None) -> float | None:
    """A percentile for JSON: None where it is a miss (more requests failed than it leaves)."""
    return None if x is None or math.isinf(x) else x


def figures(jobs: list[dict[str, Any]], results: list[dict[str, Any]], *, seconds: int) -> dict[str, Any]:
    """One run's figures. Percentiles are over every scheduled request, a failed or
    unanswered one counting as slower than any answer: p99 is a miss once over 1 % failed."""
    ok: list[float] = []
    per_op: dict[str, list[float]] = {op: [] for op in jobs[0]["pattern"]}
    per_op_n: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for job, res in zip(jobs, results, strict=True):
        codes, lat = array("H"), array("d")
        codes.frombytes(res["codes"])
        lat.frombytes(res["latency"])
        for i, (code, seconds_late) in enumerate(zip(codes, lat, strict=True)):
            fate, op = res["classes"][code], xks_sender.operation_of(job, i)
            per_op_n[op] += 1
            if fate == xks_sender.OK:
                ok.append(seconds_late)
                per_op[op].append(seconds_late)
            else:
                failed[fate] += 1
                per_op[op].append(math.inf)
    scheduled = len(ok) + sum(failed.values())
    every = ok + [math.inf] * sum(failed.values())
    start = min(r["start"] for r in results)
    elapsed = max(seconds, max(r["last_answer"] for r in results) - start)
    cpu = sum(r["cpu_s"] for r in results)
    return {
        "scheduled": scheduled, "ok": len(ok), "failed": dict(failed.most_common()),
        "answered_ok_per_s": round(len(ok) / elapsed, 1), "elapsed_s": round(elapsed, 2),
        **{f"{name}_ms": _ms(_pct(every, q)) for name, q in (("p50", .5), ("p90", .9), ("p99", .99),
                                                             ("p999", .999))},
        "max_ms": _ms(round(max(every) * 1000, 1)) if every else None,
        "within_budget_pct": round(100 * sum(x * 1000 <= BUDGET_MS for x in ok) / max(scheduled, 1), 2),
        "operations": {op: {"scheduled": per_op_n[op], "ok": sum(not math.isinf(x) for x in xs),
                            "p50_ms": _ms(_pct(xs, .5)), "p99_ms": _ms(_pct(xs, .99))} for op, xs in per_op.items()},
        "client": {"lag_p99_ms": max(r["lag_p99_ms"] for r in results),
                   "lag_max_ms": max(r["lag_max_ms"] for r in results),
                   "cpu_ms_per_request": round(1000 * cpu / max(scheduled, 1), 3),
                   "reconnects": sum(r["reconnects"] for r in results)},
    }


def _inf(x: float | None) -> float:
    return math.inf if x is None else float(x)


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """Medians and spreads over the runs, and the target met or missed."""
    runs = result["runs"]
    med = {k: _med([_inf(r[k]) for r in runs]) for k in ("p50_ms", "p90_ms", "p99_ms", "answered_ok_per_s")}
    failures = sum(sum(r["failed"].values()) for r in runs)
    reasons = []
    if result["offered_rate"] < TARGET_RATE:
        reasons.append(f"{result['offered_rate']:,} requests/s offered, not {TARGET_RATE:,}")
    if failures:
        reasons.append(f"{failures:,} of {sum(r['scheduled'] for r in runs):,} requests failed or timed out")
    if med["p99_ms"] > WELL_INSIDE_MS:
        reasons.append("median p99 " + ("a miss" if math.isinf(med["p99_ms"]) else f"{med['p99_ms']:,.1f} ms"))
    return {"median": {k: _ms(v) for k, v in med.items()}, "failures": failures,
            "target": {"rate": TARGET_RATE, "budget_ms": BUDGET_MS, "p99_at_most_ms": WELL_INSIDE_MS,
                       "met": not reasons, "missed_because": reasons}}


def _f(x: float | None, fmt: str = "{:,.1f}") -> str:
    return "miss" if x is None or math.isinf(x) else fmt.format(x)


def _spread_of(values: list[float | None], fmt: str = "{:,.1f}") -> str:
    xs = [_inf(v) for v in values]
    if len(xs) == 1:
        return _f(xs[0], fmt)
    if any(math.isinf(x) for x in xs):
        return f"{_f(_med(xs), fmt)} ({_f(min(xs), fmt)}-{_f(max(xs), fmt)})"
    return f"{_f(_med(xs), fmt)} ({_spread(xs, fmt)})"


def render(r: dict[str, Any]) -> str:
    m, runs, s = r["machine"], r["runs"], r["summary"]
    mix = ", ".join(f"{share} % {xks_sender.OPERATIONS[op]}" for op, share in r["mix"].items())
    lines = [
        f"`kms-bench xks` {r['when']} on {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Python "
        f"{m['python']}: one `keyserver serve` ({r['workers']} worker(s), {r['database']}, SoftHSM2) and the load on "
        f"the same machine. {r['offered_rate']:,} requests/s offered open-loop for {r['seconds']} s, "
        f"{len(runs)} run(s), median (min-max); {mix}; each request SigV4-signed by botocore beforehand, its "
        f"latency counted from its scheduled time; {r['connections']} keep-alive TLS connections from "
        f"{r['senders']} sender process(es); unanswered {r['timeout_s']:g} s after its time = a timeout. A request "
        "that failed counts as slower than any answer (\"miss\": over 1 % failed).",
        "",
        "| run | scheduled | answered 200 | failed | 200s per s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms "
        "| within 250 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k, run in enumerate(runs, 1):
        lines.append(f"| {k} | {run['scheduled']:,} | {run['ok']:,} | {sum(run['failed'].values()):,} | "
                     f"{run['answered_ok_per_s']:,.0f} | {_f(run['p50_ms'])} | {_f(run['p90_ms'])} | "
                     f"{_f(run['p99_ms'])} | {_f(run['p999_ms'])} | {_f(run['max_ms'])} | "
                     f"{run['within_budget_pct']:.2f} % |")
    if len(runs) > 1:
        lines.append(f"| median (min-max) | | | | {_spread_of([x['answered_ok_per_s'] for x in runs], '{:,.0f}')} | "
                     + " | ".join(_spread_of([x[k] for x in runs]) for k in ("p50_ms", "p90_ms", "p99_ms"))
                     + " | | | |")
    lines += ["", "| operation | share | p50 ms | p99 ms |", "|---|---:|---:|---:|"]
    for op, share in r["mix"].items():
        lines.append(f"| {xks_sender.OPERATIONS[op]} | {share} % | "
                     f"{_spread_of([x['operations'][op]['p50_ms'] for x in runs])} | "
                     f"{_spread_of([x['operations'][op]['p99_ms'] for x in runs])} |")
    failed: Counter[str] = Counter()
    for run in runs:
        failed.update(run["failed"])
    lines += ["", "Failures over all runs: " + (", ".join(f"{fate}: {n:,}" for fate, n in failed.most_common())
                                               or "none") + "."]
    client = [x["client"] for x in runs]
    lag = max(c["lag_p99_ms"] for c in client)
    lines.append(f"Load generator: dispatch lag p99 {lag:.1f} ms (max {max(c['lag_max_ms'] for c in client):.1f}), "
                 f"{_med([c['cpu_ms_per_request'] for c in client]):.2f} ms of its CPU per request, "
                 f"{sum(c['reconnects'] for c in client)} reconnection(s)."
                 + (f" It fell behind its schedule (lag p99 over {CLIENT_LAG_NOTE_MS:.0f} ms): the latencies "
                    "include its delay, so the server may be faster than shown." if lag > CLIENT_LAG_NOTE_MS else ""))
    if all("audit_behind" in x for x in runs):
        lines.append("Audit records not yet chained after each run (caught up in): " + ", ".join(
            f"{x['audit_behind']:,} ({x['audit_caught_up_s']:.1f} s)" for x in runs) + ".")
    t = s["target"]
    lines += ["", f"Target (issue 28): {t['rate']:,} requests/s offered, every call answered, p99 at most "
                  f"{t['p99_at_most_ms']:.0f} ms (AWS KMS allows {t['budget_ms']:.0f} ms): "
                  + ("**met**." if t["met"] else f"**missed** ({'; '.join(t['missed_because'])}).")]
    return "\n".join(lines)


# --- the command ------------------------------------------------------------------------------

def run(*, postgres: str | None, rate: int, seconds: int, senders: int, workers: int, runs: int = 3,
        connections: int = 64, timeout: float = 2.0, mix: dict[str, int] | None = None) -> dict[str, Any]:
    mix = mix or DEFAULT_MIX
    if not 1 <= seconds <= MAX_SECONDS:
        raise SystemExit(f"--seconds is 1 to {MAX_SECONDS}: SigV4 signatures are accepted for five minutes")
    if connections < senders or -(-connections // senders) > MAX_PER_SOURCE:
        raise SystemExit(f"--connections is {senders} to {MAX_PER_SOURCE * senders} with {senders} sender(s): "
                         f"the server accepts {MAX_PER_SOURCE} connections per address and worker, and each "
                         "sender is one address (add --senders for more)")
    if postgres is None:
        workers = 1  # SQLite: one process
    result: dict[str, Any] = {
        "machine": machine(), "when": datetime.now(UTC).isoformat(timespec="seconds"), "offered_rate": rate,
        "seconds": seconds, "senders": senders, "connections": connections, "timeout_s": timeout, "mix": mix,
        "runs": []}
    with xks_server(postgres=postgres, workers=workers) as rig:
        result |= {"database": rig["database"], "workers": rig["workers"]}
        for k in range(1, runs + 1):
            console.print(f"[bold]run {k}/{runs}[/bold]: {rate:,} requests/s for {seconds} s")
            jobs = jobs_for(rig["job"], rate=rate, seconds=seconds, senders=senders, connections=connections,
                            timeout=timeout, mix=mix)
            fig = figures(jobs, load(jobs, seconds=seconds), seconds=seconds)
            behind, caught_up = _settle(rig["services"], limit_s=120)
            fig |= {"audit_behind": behind, "audit_caught_up_s": caught_up}
            result["runs"].append(fig)
            failures = ", ".join(f"{fate}: {n:,}" for fate, n in fig["failed"].items()) or "none"
            console.print(f"  {fig['ok']:,} of {fig['scheduled']:,} answered 200; p50 {_f(fig['p50_ms'])}, p99 "
                          f"{_f(fig['p99_ms'])} ms; failures: {failures}", markup=False, soft_wrap=True)
    result["summary"] = summarise(result)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="kms-bench xks", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres",
                   help="PostgreSQL URL for a scratch database (default: local); 'embedded' for SQLite")
    p.add_argument("--rate", type=int, default=TARGET_RATE, help=f"requests/s offered (default {TARGET_RATE})")
    p.add_argument("--seconds", type=int, default=30, help=f"seconds of load per run (default 30, at most "
                                                           f"{MAX_SECONDS})")
    p.add_argument("--runs", type=int, default=3, help="runs against the same server (median and spread; default 3)")
    p.add_argument("--mix", type=parse_mix, default=DEFAULT_MIX,
                   help="percent of each operation (default encrypt=45,decrypt=45,metadata=10)")
    p.add_argument("--senders", type=int, default=2, help="client processes, one source address each (default 2)")
    p.add_argument("--connections", type=int, default=64, help="keep-alive connections in all (default 64)")
    p.add_argument("--timeout", type=float, default=2.0,
                   help="seconds after its scheduled time at which an unanswered request is a timeout (default 2)")
    p.add_argument("--workers", type=int, default=2, help="server worker processes (default 2)")
    p.add_argument("--json", type=Path, help="write the results here (default kms-bench-xks-<time>.json)")
    p.add_argument("--markdown", type=Path, help="write the tables here")
    p.add_argument("--docs", type=Path, help="rewrite the XKS section of this Markdown file (docs/benchmarks.md)")
    p.add_argument("--from-json", type=Path, help="run nothing: render (and --docs) a saved result")
    args = p.parse_args(argv)
    for name in ("rate", "runs", "senders", "workers"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.timeout <= 0:
        p.error("--timeout must be positive")
    if args.from_json is not None:
        result = json.loads(args.from_json.read_text())
    else:
        with _interruptible():  # SIGTERM unwinds like Ctrl-C: senders, server and scratch database go
            result = run(postgres=None if args.postgres == "embedded" else args.postgres, rate=args.rate,
                         seconds=args.seconds, senders=args.senders, workers=args.workers, runs=args.runs,
                         connections=args.connections, timeout=args.timeout, mix=args.mix)
        out = args.json or Path(f"kms-bench-xks-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}.json")
        out.write_text(json.dumps(result, indent=1) + "\n")
        console.print(f"results: {out}")
    text = render(result)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.docs:
        write_section(args.docs, text, name=SECTION, heading=HEADING)


if __name__ == "__main__":
    main()
