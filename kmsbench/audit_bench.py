"""`kms-bench audit`: what the audit chain costs and how long verifying it takes at scale.

On a scratch PostgreSQL database with its own SoftHSM2 token:

* the chaining rate (records/s the chainer moves from the inbox into the chain, each
  HMACed in the HSM, a signed checkpoint every 1,000) while the chain grows to
  `--records` (default 1,000,000);
* a full `verify --full` of the whole chain, and an incremental `verify` after 1,000
  more records (what the console and a cron job run);
* the audit cost per data key: a data key's latency with its record (the inbox INSERT
  is part of the request) and the chainer's CPU per record (in the background);
* the console's reads at that size, over HTTP: the activity charts (GET /audit/activity,
  24 hours and 7 days by hour, 30 days by day), the audit log's pages (GET
  /audit/events unfiltered, by actor, denied only), its searches (words, prefixes, an
  actor's prefix) and the usage charts of a key and of an actor (GET /audit/usage), p50
  and p95.

The records look like a month of a real deployment: spread over the last 30 days, 200
actors, a dozen actions, 95 % allowed, 4 % denied and 1 % failed with their reasons.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from sqlalchemy import insert, text

from kmsbench.keyserver_load import machine
from kmsbench.scratch import create_database, drop_database
from kmsbench.sections import write_section

console = Console(stderr=True)
SECTION = "audit-bench"
FILL_BATCH = 10_000
SPREAD_DAYS = 30
ACTORS = [f"svc-{i:03d}" for i in range(200)]
ACTIONS = ["datakey.generate", "datakey.decrypt", "key.read", "key.rotate", "key.create", "kmip.get", "kmip.locate",
           "host.heartbeat", "key.deliver", "auth.login", "token.create", "guardpoint.update"]
REASONS = ["missing datakeys:decrypt", "missing keys:create", "context_mismatch", "key_not_active", "host_revoked"]
READS = 50  # requests per console read measured
KEYS = [str(uuid.UUID(int=k + 1)) for k in range(50)]
KEY_NAMES = [f"app-{k:02d}-db" for k in range(len(KEYS))]


def _payload(i: int, n: int, now: datetime, base: dict[str, Any]) -> dict[str, Any]:
    """The i-th of n records: time spread evenly over the last SPREAD_DAYS, actor, action
    and outcome from fixed cycles (repeatable, no randomness); each actor uses one of
    KEYS keys, and each record has its own request id."""
    t = now - timedelta(days=SPREAD_DAYS) * (1 - i / n)
    roll = i % 100
    outcome = "allowed" if roll < 95 else "denied" if roll < 99 else "error"
    actor = (i * 7) % len(ACTORS)
    key = actor % len(KEYS)
    details = {"name": KEY_NAMES[key], "version": 3, "bytes": 32} if outcome == "allowed" else {
        "reason": REASONS[i % len(REASONS)]}
    return {**base, "time": t.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "actor": ACTORS[actor],
            "action": ACTIONS[(i * 13) % len(ACTIONS)], "outcome": outcome, "details": details,
            "object_id": KEYS[key], "request_id": f"{i:032x}"}


def _console_reads(svc: Any, out: dict[str, Any], records: int) -> None:
    """The console's reads over HTTP against the filled store: p50/p95 of READS each."""
    import httpx
    import uvicorn

    from keyserver.api.app import create_app
    from keyserver.core.principal import system_context

    # An auditor's API token (a browser session's cookie is Secure: not sent over this plain HTTP).
    ctx = system_context("bench")
    user, _ = svc.identity.create_user(ctx, username="bench-auditor", role="auditor", password=f"bench {uuid.uuid4()}")
    token = svc.identity.create_token(ctx, name="bench", scopes=None, expires_in_days=1, user_id=user.id).secret
    server = uvicorn.Server(uvicorn.Config(create_app(svc, run_background=False), host="127.0.0.1", port=0,
                                           log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    now = datetime.now(UTC)
    reads: dict[str, tuple[str, dict[str, str | int]]] = {
        "activity, 24 hours by hour": ("/api/v1/audit/activity", {"since": (now - timedelta(hours=24)).isoformat(),
                                                                   "until": now.isoformat(), "bucket": "hour"}),
        "activity, 7 days by hour": ("/api/v1/audit/activity", {"since": (now - timedelta(days=7)).isoformat(),
                                                                 "until": now.isoformat(), "bucket": "hour"}),
        "activity, 30 days by day": ("/api/v1/audit/activity", {"since": (now - timedelta(days=30)).isoformat(),
                                                                 "until": now.isoformat(), "bucket": "day"}),
        "audit log, first page": ("/api/v1/audit/events", {"limit": 50}),
        "audit log, one actor": ("/api/v1/audit/events", {"limit": 50, "actor": ACTORS[3]}),
        "audit log, denied only": ("/api/v1/audit/events", {"limit": 50, "outcome": "denied"}),
        "search, one record's request id": ("/api/v1/audit/events", {"limit": 50, "q": f"{records // 2:032x}"}),
        "search, a key's name (2 % of records)": ("/api/v1/audit/events", {"limit": 50, "q": KEY_NAMES[7]}),
        "search, a word in 8 % of records": ("/api/v1/audit/events", {"limit": 50, "q": "generate"}),
        "search, a prefix (5 % of records)": ("/api/v1/audit/events", {"limit": 50, "q": "svc-01*"}),
        "search, two words (0.7 % of records)": ("/api/v1/audit/events", {"limit": 50, "q": "generate app-07*"}),
        "audit log, actor prefix (5 %)": ("/api/v1/audit/events", {"limit": 50, "actor": "svc-01*"}),
        "usage, one key, 24 hours by hour": ("/api/v1/audit/usage", {"key_id": KEYS[7], "bucket": "hour",
                                                                      "since": (now - timedelta(hours=24)).isoformat(),
                                                                      "until": now.isoformat()}),
        "usage, one key, 30 days by day": ("/api/v1/audit/usage", {"key_id": KEYS[7], "bucket": "day",
                                                                    "since": (now - timedelta(days=30)).isoformat(),
                                                                    "until": now.isoformat()}),
        "usage, one actor, 7 days by hour": ("/api/v1/audit/usage", {"actor": ACTORS[3], "bucket": "hour",
                                                                      "since": (now - timedelta(days=7)).isoformat(),
                                                                      "until": now.isoformat()}),
    }
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                          headers={"Authorization": f"Bearer {token}"}) as c:
            results: dict[str, dict[str, float | str]] = {}
            for name, (path, params) in reads.items():
                c.get(path, params=params).raise_for_status()  # warm
                lat = []
                for _ in range(READS):
                    t = time.perf_counter()
                    c.get(path, params=params).raise_for_status()
                    lat.append((time.perf_counter() - t) * 1000)
                lat.sort()
                results[name] = {"p50_ms": round(statistics.median(lat), 1),
                                 "p95_ms": round(lat[int(0.95 * (len(lat) - 1))], 1)}
            out["console_reads"] = results
            with svc.engine.connect() as conn:
                out["rollup_rows"] = conn.execute(text("SELECT (SELECT count(*) FROM audit_hourly) + "
                                                       "(SELECT count(*) FROM audit_refusals_hourly)")).scalar_one()
                out["usage_rows"] = conn.execute(text("SELECT count(*) FROM audit_usage_hourly")).scalar_one()
                out["sizes_mb"] = {t: round(conn.execute(text(f"SELECT pg_total_relation_size('{t}')")).scalar_one()
                                            / 2**20, 1)
                                   for t in ("audit_events", "audit_search", "audit_usage_hourly")}
            # What a search returns, so the table says how selective each one was.
            for name, (path, params) in reads.items():
                if path.endswith("/events"):
                    page = c.get(path, params=params).json()
                    results[name]["matched"] = f"{page['total']:,}{'' if page['total_exact'] else '+'}"
    finally:
        server.should_exit = True
        thread.join(10)


def run(*, postgres: str, records: int, output: Path | None, json_out: Path | None) -> dict[str, Any]:
    from keyserver.core.audit import utcnow
    from keyserver.core.keys import KeySpec
    from keyserver.core.principal import system_context
    from keyserver.services import build_services
    from keyserver.settings import Settings
    from keyserver.store.models import AuditInbox

    database_url = create_database(postgres, "auditbench")
    data = Path(tempfile.mkdtemp(prefix="strongroom-auditbench-"))
    out: dict[str, Any] = {"machine": machine(), "when": datetime.now(UTC).isoformat(timespec="seconds"),
                           "records": records, "load_before": os.getloadavg()[0]}
    env_keys = [k for k in os.environ if k.startswith("STRONGROOM_")]
    saved = {k: os.environ.pop(k) for k in env_keys}
    try:
        settings = Settings(data_dir=data, database_url=database_url, log_level="WARNING",
                            audit_checkpoint_records=1000)
        svc = build_services(settings)
        svc.initialize()
        ctx = system_context("bench")
        base = {"time": None, "actor": "bench", "actor_type": "system", "action": "bench.record",
                   "object_type": "key", "object_id": str(uuid.uuid4()), "outcome": "allowed", "source_ip": "10.0.0.1",
                   "request_id": uuid.uuid4().hex, "details": {"name": "payments-db", "version": 3, "bytes": 32}}
        chained, chain_seconds, chain_cpu = 0, 0.0, 0.0
        start = utcnow()
        while chained < records:
            n = min(FILL_BATCH, records - chained)
            with svc.engine.begin() as conn:
                conn.execute(insert(AuditInbox), [{"payload": _payload(chained + j, records, start, base)}
                                                  for j in range(n)])
            t, c = time.perf_counter(), time.process_time()
            chained += svc.audit.flush()
            chain_seconds += time.perf_counter() - t
            chain_cpu += time.process_time() - c
            if chained % 100_000 < FILL_BATCH:
                console.print(f"chained {chained:,} / {records:,} ({chained / chain_seconds:,.0f}/s)")
        out["chain_rate"] = round(chained / chain_seconds, 1)
        out["chain_cpu_us_per_record"] = round(chain_cpu / chained * 1e6, 1)

        t = time.perf_counter()
        full = svc.audit.verify(full=True)
        out["verify_full_s"] = round(time.perf_counter() - t, 2)
        assert full.ok, full.reason
        out["verified_records"] = full.checked
        for i in range(1000):
            svc.audit.record_now(ctx, action="bench.more", outcome="allowed", details={"i": i})
        svc.audit.flush()
        t = time.perf_counter()
        inc = svc.audit.verify()
        out["verify_incremental_s"] = round(time.perf_counter() - t, 3)
        out["verify_incremental_records"] = inc.checked
        assert inc.ok, inc.reason
        t = time.perf_counter()
        st = svc.audit.status()
        out["status_ms"] = round((time.perf_counter() - t) * 1000, 1)
        out["checkpoints"] = st["last_checkpoint"]["checkpoint"] if st["last_checkpoint"] else 0

        key = svc.keys.create(ctx, KeySpec(name="bench-datakeys"))
        for _ in range(50):
            svc.datakeys.generate(ctx, str(key.id))  # warm: caches, pools
        lat = []
        for _ in range(2000):
            t = time.perf_counter()
            svc.datakeys.generate(ctx, str(key.id))
            lat.append(time.perf_counter() - t)
        out["datakey_ms_median"] = round(statistics.median(lat) * 1000, 3)
        with svc.engine.begin() as conn:  # the record's own share of a request: the inbox INSERT
            t = time.perf_counter()
            for _ in range(2000):
                svc.audit.add(conn, ctx, action="datakey.generate", object_type="key", object_id=str(key.id),
                              details={"name": "bench-datakeys", "version": 1, "bytes": 32})
            out["inbox_insert_us"] = round((time.perf_counter() - t) / 2000 * 1e6, 1)
        svc.audit.flush()
        # A log that grew to this size over weeks has planner statistics (autovacuum
        # analyzes a table every 10 % of growth); one filled a minute ago has not yet.
        with svc.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
        _console_reads(svc, out, records)
        svc.close()
    finally:
        os.environ.update(saved)
        drop_database(postgres, database_url)
        shutil.rmtree(data, ignore_errors=True)
    out["load_after"] = os.getloadavg()[0]
    report = render(out)
    console.print(report)
    if json_out:
        json_out.write_text(json.dumps(out, indent=2))
    if output:
        write_section(output, report, name=SECTION)
    return out


def render(r: dict[str, Any]) -> str:
    m = r["machine"]
    return "\n".join([
        "## Audit chain: cost and verification at scale",
        "",
        f"Measured {r['when']} on {m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB), PostgreSQL and "
        f"SoftHSM2 on the same machine; load average before/after {r['load_before']:.1f} / "
        f"{r['load_after']:.1f}. Command: `.venv/bin/kms-bench audit --records {r['records']} "
        "--output docs/benchmarks.md`.",
        "",
        "| measure | value |",
        "|---|--:|",
        f"| records in the chain | {r['verified_records']:,} |",
        f"| chaining rate (HMAC in the HSM per record, a signed checkpoint every 1,000) | "
        f"{r['chain_rate']:,.0f} records/s |",
        f"| chainer CPU per record in the key server's process (in the background; the HSM's own work "
        f"is the token's) | {r['chain_cpu_us_per_record']} µs |",
        f"| `verify-audit --full` of the whole chain | {r['verify_full_s']} s |",
        f"| `verify-audit` (incremental, from the last verified checkpoint; "
        f"{r['verify_incremental_records']:,} records) | {r['verify_incremental_s']} s |",
        f"| `GET /audit/status` (what the dashboard reads) | {r['status_ms']} ms |",
        f"| checkpoints signed | {r['checkpoints']:,} |",
        f"| data key, one thread, median (the record's INSERT included) | {r['datakey_ms_median']} ms |",
        f"| of which the record's inbox INSERT | {r['inbox_insert_us']} µs |",
        "",
        f"The console's reads at {r['verified_records']:,} records over HTTP ({READS} requests each; the records "
        f"spread over {SPREAD_DAYS} days, {len(ACTORS)} actors, {len(ACTIONS)} actions, 5 % refused; "
        f"{r['rollup_rows']:,} rows of hourly counts, {r['usage_rows']:,} of key usage counts; "
        f"on disk: " + ", ".join(f"{t} {mb:,} MiB" for t, mb in r["sizes_mb"].items()) + "):",
        "",
        "| read | records matched | p50 ms | p95 ms |",
        "|---|--:|--:|--:|",
        *(f"| {name} | {v['matched']} | {v['p50_ms']} | {v['p95_ms']} |" if "matched" in v
          else f"| {name} | | {v['p50_ms']} | {v['p95_ms']} |" for name, v in r["console_reads"].items()),
    ])


app = typer.Typer(add_completion=False)


@app.command()
def bench_audit(
    postgres: Annotated[str, typer.Option(help="PostgreSQL server URL (a scratch database is created)")] =
        "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    records: Annotated[int, typer.Option(min=1000, help="records to build the chain to")] = 1_000_000,
    output: Annotated[Path | None, typer.Option(help="Markdown file whose audit section is rewritten")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="raw results as JSON")] = None,
) -> None:
    """What the audit chain costs, and verify time at scale (full and incremental)."""
    run(postgres=postgres, records=records, output=output, json_out=json_out)


def main(argv: list[str] | None = None) -> None:
    app(args=argv, prog_name="kms-bench audit")


if __name__ == "__main__":
    main()
