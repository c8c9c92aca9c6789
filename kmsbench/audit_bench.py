"""`kms-bench audit`: what the audit chain costs and how long verifying it takes at scale.

On a scratch PostgreSQL database with its own SoftHSM2 token:

* the chaining rate (records/s the chainer moves from the inbox into the chain, each
  HMACed in the HSM, a signed checkpoint every 1,000) while the chain grows to
  `--records` (default 1,000,000);
* a full `verify --full` of the whole chain, and an incremental `verify` after 1,000
  more records (what the console and a cron job run);
* the audit cost per data key: a data key's latency with its record (the inbox INSERT
  is part of the request) and the chainer's CPU per record (in the background).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from sqlalchemy import insert

from kmsbench.keyserver_load import machine
from kmsbench.scratch import create_database, drop_database
from kmsbench.sections import write_section

console = Console(stderr=True)
SECTION = "audit-bench"
FILL_BATCH = 10_000


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
        payload = {"time": None, "actor": "bench", "actor_type": "system", "action": "bench.record",
                   "object_type": "key", "object_id": str(uuid.uuid4()), "outcome": "allowed", "source_ip": "10.0.0.1",
                   "request_id": uuid.uuid4().hex, "details": {"name": "payments-db", "version": 3, "bytes": 32}}
        chained, chain_seconds, chain_cpu = 0, 0.0, 0.0
        while chained < records:
            n = min(FILL_BATCH, records - chained)
            stamp = utcnow().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            with svc.engine.begin() as conn:
                conn.execute(insert(AuditInbox), [{"payload": {**payload, "time": stamp}} for _ in range(n)])
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
        svc.close()
    finally:
        os.environ.update(saved)
        drop_database(postgres, database_url)
        shutil.rmtree(data, ignore_errors=True)
    out["load_after"] = os.getloadavg()[0]
    text = render(out)
    console.print(text)
    if json_out:
        json_out.write_text(json.dumps(out, indent=2))
    if output:
        write_section(output, text, name=SECTION)
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
