"""`kms-bench drill`: failover drills on real parts (docs/operations.md "Failover drills").

Three `keyserver serve` replicas (one worker each) on one PostgreSQL cluster of the
drill's own (initdb in a temporary directory; the machine's server is never touched),
sharing one data directory (the SoftHSM2 token, its PINs and the internal CA's ca.pem,
as the compose file's replicas share their volumes), behind HAProxy running the shipped
deploy/haproxy.cfg with loopback addresses: each replica on an address of its own
(127.0.0.2-4) with the same ports, as containers are. 200 clients with keep-alive load
it through HAProxy — most generate data keys back to back, a few rotate keys — and every
acknowledged operation is recorded.

* `replica`: kill -9 one replica under load, keep it down a phase, restart it and wait
  until HAProxy marks it up again.
* `postgres`: restart PostgreSQL under load (`pg_ctl restart -m fast`, or `immediate`:
  a crash and recovery); the replicas are not touched and must recover by themselves.

Each drill then checks that nothing acknowledged was lost: every data key decrypts (REST
decrypt route) to the plaintext it was returned with and has its audit record (by
request id), every rotation's version is in the audit chain, the chain verifies; and
that errors happened only in the window of the disruption. Printed: requests, errors by
class, p50/p99 per phase (before / during / after), the windows. Exit 0 when every check
holds, 1 otherwise; `--json` writes everything.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from kmsbench.drill_load import (
    DrillResult,
    Load,
    Op,
    phase_figures,
)
from kmsbench.drill_rig import (
    DrillFailed,
    Rig,
    wait_for,
)

console = Console(stderr=True)



# --- the drills --------------------------------------------------------------------------

def _api(rig: Rig) -> httpx.Client:
    return httpx.Client(base_url=rig.base, verify=rig.trust, timeout=60,
                        headers={"Authorization": f"Bearer {rig.token}"})


def verify_acknowledged(rig: Rig, ops: list[Op]) -> tuple[dict[str, bool], dict[str, int], list[str]]:
    """Nothing acknowledged was lost: every data key decrypts to its plaintext and has its
    audit record; every rotation's version is in the chain; the chain verifies."""
    problems: list[str] = []
    datakeys = [o for o in ops if o.kind == "datakey" and o.error is None]
    rotations = [o for o in ops if o.kind == "rotate" and o.error is None]
    wait_for(lambda: rig.inbox() == 0, "the audit chainer to chain every record", 120)
    with _api(rig) as api:
        def exported(action: str) -> list[dict[str, Any]]:
            r = api.get("/api/v1/audit/export", params={"format": "jsonl", "action": action})
            r.raise_for_status()
            return [json.loads(line) for line in r.text.splitlines() if line.strip()]

        generated = {e["request_id"] for e in exported("datakey.generate") if e["outcome"] == "allowed"}
        missing_audit = [o.request_id for o in datakeys if o.request_id not in generated]
        rotated = {(e["object_id"], (e.get("details") or {}).get("version")) for e in exported("key.rotate")
                   if e["outcome"] == "allowed"}
        missing_rotations = [o.request_id for o in rotations if (o.key_id, o.version) not in rotated]
        if missing_audit:
            problems.append(f"{len(missing_audit)} acknowledged data keys without their audit record, "
                            f"e.g. {missing_audit[:3]}")
        if missing_rotations:
            problems.append(f"{len(missing_rotations)} acknowledged rotations not in the chain, "
                            f"e.g. {missing_rotations[:3]}")
    wrong = _decrypt_all(rig, datakeys)
    if wrong:
        problems.append(f"{len(wrong)} acknowledged data keys did not decrypt to their plaintext, e.g. {wrong[:3]}")
    wait_for(lambda: rig.inbox() == 0, "the audit chainer to chain every record", 120)
    with _api(rig) as api:
        v = api.post("/api/v1/audit/verify", json={"full": True})
        chain_ok = v.status_code == 200 and v.json()["ok"] is True
        if not chain_ok:
            problems.append(f"audit chain verification failed: {v.status_code} {v.text[:300]}")
        checked = v.json().get("checked", 0) if v.status_code == 200 else 0
    checks = {"every acknowledged data key decrypts to its plaintext": not wrong,
              "every acknowledged data key has its audit record": not missing_audit,
              "every acknowledged rotation is in the audit chain": not missing_rotations,
              "the audit chain verifies": chain_ok}
    counts = {"acknowledged data keys": len(datakeys), "acknowledged rotations": len(rotations),
              "audit records verified": int(checked)}
    return checks, counts, problems


def _decrypt_all(rig: Rig, datakeys: list[Op], concurrency: int = 32) -> list[str]:
    async def main() -> list[str]:
        wrong: list[str] = []
        queue: asyncio.Queue[Op] = asyncio.Queue()
        for o in datakeys:
            queue.put_nowait(o)

        async def worker() -> None:
            async with httpx.AsyncClient(base_url=rig.base, verify=rig.trust, timeout=60,
                                         headers={"Authorization": f"Bearer {rig.token}"}) as c:
                while not queue.empty():
                    o = queue.get_nowait()
                    for attempt in range(3):
                        try:
                            r = await c.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": o.blob})
                            break
                        except httpx.TransportError:
                            if attempt == 2:
                                raise
                    if r.status_code != 200 or r.json()["plaintext"] != o.plaintext:
                        wrong.append(f"{o.request_id}: {r.status_code}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return wrong

    return asyncio.run(main())


def _attribute(ops: list[Op], window: tuple[float, float]) -> tuple[int, int, int, float | None, float | None]:
    """Failed requests: in flight when the disruption began, started inside its window,
    or outside it (the drill fails on those)."""
    start, end = window
    failed = [o for o in ops if o.error is not None]
    in_flight = sum(1 for o in failed if o.start < start <= o.end)
    inside = sum(1 for o in failed if start <= o.start <= end)
    outside = len(failed) - in_flight - inside
    span = round(max(o.end for o in failed) - min(o.start for o in failed), 2) if failed else None
    last = round(max(o.end for o in failed) - start, 2) if failed else None
    return in_flight, inside, outside, span, last


def _outside_errors(ops: list[Op], window: tuple[float, float]) -> str:
    """Each failed request neither in flight at the window's start nor started inside it:
    its class, request id and times from the window's start (what a failed drill needs)."""
    start, end = window
    return "; ".join(f"{o.error} ({o.request_id}, {o.start - start:+.2f}..{o.end - start:+.2f} s)"
                     for o in ops if o.error is not None
                     and not (o.start < start <= o.end) and not (start <= o.start <= end))


def replica_drill(rig: Rig, *, phase: float, clients: int, rotators: int, think_ms: float) -> DrillResult:
    victim = rig.replicas[1]
    load = Load(rig.base, rig.token, rig.trust, clients=clients, rotators=rotators, think_ms=think_ms,
                rotate_every=0.5, tag="kill")
    t0 = time.monotonic()
    load.start()
    time.sleep(phase)
    sessions_before = int(rig.haproxy.stats()[victim.name]["stot"])
    t_kill = time.monotonic()
    victim.kill()
    t_down = wait_for(lambda: rig.haproxy.status(victim.name).startswith("DOWN"), "HAProxy to mark the killed "
                   "replica down", 30)
    time.sleep(max(0.0, phase - (time.monotonic() - t_kill)))
    t_restart = time.monotonic()
    victim.start()
    t_up = wait_for(lambda: rig.haproxy.status(victim.name) == "UP", "HAProxy to mark the restarted replica up", 90)
    stot_at_up = int(rig.haproxy.stats()[victim.name]["stot"])
    time.sleep(phase)
    t_end = time.monotonic()
    load.stop()
    stot_after = int(rig.haproxy.stats()[victim.name]["stot"])
    serves = rig.serves_data_key(victim)
    ops = load.ops
    window = (t_kill, t_down)
    in_flight, inside, outside, span, last = _attribute(ops, window)
    phases = [phase_figures(ops, "before", t0, t_kill), phase_figures(ops, "during (kill to up again)", t_kill, t_up),
              phase_figures(ops, "after", t_up, t_end)]
    checks, counts, problems = verify_acknowledged(rig, ops)
    checks["errors only for requests in flight on the killed replica (or racing its close)"] = outside == 0
    checks["the restarted replica is up in HAProxy and serves new connections"] = (stot_after > stot_at_up and serves)
    checks["no errors after it was back"] = phases[2].errors == 0
    if outside:
        problems.append(f"{outside} errors outside the kill window: {_outside_errors(ops, window)}")
    counts["connections to the killed replica before the kill"] = sessions_before
    counts["connections to it after its restart"] = stot_after - stot_at_up
    events = {"kill": t_kill - t0, "marked down": t_down - t0, "restarted": t_restart - t0, "marked up": t_up - t0,
              "end": t_end - t0}
    return DrillResult("replica", f"kill -9 of replica {victim.name} under {clients} clients, restarted after "
                       f"{t_restart - t_kill:.1f} s", phases, (window[0] - t0, window[1] - t0),
                       "kill to marked down", in_flight, inside, outside, span, last,
                       {k: round(v, 2) for k, v in events.items()}, checks, counts, problems)


def postgres_drill(rig: Rig, *, phase: float, clients: int, rotators: int, think_ms: float,
                   mode: str) -> DrillResult:
    pids = {r.name: r.proc.pid for r in rig.replicas if r.proc is not None}
    load = Load(rig.base, rig.token, rig.trust, clients=clients, rotators=rotators, think_ms=think_ms,
                rotate_every=0.5, tag="pg")
    t0 = time.monotonic()
    load.start()
    time.sleep(phase)
    t_stop = time.monotonic()
    rig.cluster.restart(mode)
    t_pg_up = time.monotonic()
    t_serving = wait_for(lambda: all(rig.serves_data_key(r) for r in rig.replicas),
                      "every replica to serve data keys again after the restart", 120)
    t_all_up = wait_for(lambda: all(rig.haproxy.status(r.name) == "UP" for r in rig.replicas),
                     "HAProxy to mark every replica up again", 60)
    time.sleep(phase)
    t_end = time.monotonic()
    load.stop()
    ops = load.ops
    window = (t_stop, t_serving)
    in_flight, inside, outside, span, last = _attribute(ops, window)
    phases = [phase_figures(ops, "before", t0, t_stop),
              phase_figures(ops, "during (restart to serving again)", t_stop, t_serving),
              phase_figures(ops, "after", t_serving, t_end)]
    checks, counts, problems = verify_acknowledged(rig, ops)
    same = all(r.proc is not None and r.proc.poll() is None and r.proc.pid == pids[r.name] for r in rig.replicas)
    checks["the replicas recovered by themselves (same processes, none restarted)"] = same
    checks["errors only while PostgreSQL restarted and the replicas reconnected"] = outside == 0
    checks["no errors after every replica served again"] = phases[2].errors == 0
    if outside:
        problems.append(f"{outside} errors outside the restart window: {_outside_errors(ops, window)}")
    events = {"pg_ctl restart": t_stop - t0, "PostgreSQL up": t_pg_up - t0, "every replica serving": t_serving - t0,
              "every replica up in HAProxy": t_all_up - t0, "end": t_end - t0}
    return DrillResult("postgres", f"PostgreSQL restarted (pg_ctl restart -m {mode}) under {clients} clients; "
                       "replicas untouched", phases, (window[0] - t0, window[1] - t0),
                       "restart issued to every replica serving", in_flight, inside, outside, span, last,
                       {k: round(v, 2) for k, v in events.items()}, checks, counts, problems)


# --- output ------------------------------------------------------------------------------

def render(results: list[DrillResult]) -> None:
    for d in results:
        t = Table(title=f"drill: {d.description}", title_justify="left")
        for col in ("phase", "s", "requests", "ok/s", "errors", "p50 ms", "p99 ms", "error classes"):
            t.add_column(col, justify="left" if col in ("phase", "error classes") else "right")
        for p in d.phases:
            t.add_row(p.name, f"{p.seconds:.1f}", f"{p.requests:,}", f"{p.per_second:,.0f}", str(p.errors),
                      "-" if p.p50_ms is None else f"{p.p50_ms:.1f}", "-" if p.p99_ms is None else f"{p.p99_ms:.1f}",
                      ", ".join(f"{k}: {v}" for k, v in sorted(p.error_classes.items())) or "-")
        console.print(t)
        console.print(f"  window ({d.window_label}): {d.window[0]:.2f}-{d.window[1]:.2f} s "
                      f"({d.window[1] - d.window[0]:.2f} s); errors: {d.errors_in_flight_at_start} in flight at its "
                      f"start, {d.errors_started_in_window} started inside it, {d.errors_outside_window} outside; "
                      f"first to last error {d.error_span_s if d.error_span_s is not None else '-'} s; last error "
                      f"{d.last_error_s if d.last_error_s is not None else '-'} s after the window's start")
        console.print("  events (s from the load's start): "
                      + ", ".join(f"{k} {v:.2f}" for k, v in d.events.items()))
        console.print("  " + ", ".join(f"{k}: {v:,}" for k, v in d.counts.items()))
        for k, ok in d.checks.items():
            console.print(f"  [{'green' if ok else 'red'}]{'ok  ' if ok else 'FAIL'}[/] {k}")
        for problem in d.problems:
            console.print(f"  [red]{problem}[/red]")


def run(*, drills: list[str], phase: float, clients: int, rotators: int, think_ms: float, pg_mode: str,
        json_out: Path | None, keep: bool = False) -> list[DrillResult]:
    if shutil.which("haproxy") is None:
        raise SystemExit("haproxy is not installed: apt-get install haproxy")
    root = Path(tempfile.mkdtemp(prefix="strongroom-drill-"))
    results: list[DrillResult] = []
    rig = Rig(root)
    try:
        with console.status("starting PostgreSQL, three replicas and HAProxy"):
            rig.start()
        for name in drills:
            with console.status(f"drill: {name}"):
                if name == "replica":
                    results.append(replica_drill(rig, phase=phase, clients=clients, rotators=rotators,
                                                 think_ms=think_ms))
                else:
                    results.append(postgres_drill(rig, phase=phase, clients=clients, rotators=rotators,
                                                  think_ms=think_ms, mode=pg_mode))
    finally:
        rig.close()
        if keep:
            console.print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    render(results)
    if json_out is not None:
        json_out.write_text(json.dumps({"when": datetime.now(UTC).isoformat(timespec="seconds"),
                                        "cores": os.cpu_count(), "phase_s": phase, "clients": clients,
                                        "rotators": rotators, "drills": [asdict(d) for d in results]}, indent=2))
    return results


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


@contextmanager
def _interruptible() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C: the replicas, HAProxy and the cluster are stopped."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


app = typer.Typer(add_completion=False)


@app.command()
def drill(
    drills: Annotated[str, typer.Option(help="which drills, comma-separated: replica, postgres")] = "replica,postgres",
    phase: Annotated[float, typer.Option(min=1, help="seconds of each phase: before, during, after")] = 20,
    clients: Annotated[int, typer.Option(min=2, help="concurrent clients through HAProxy")] = 200,
    rotators: Annotated[int, typer.Option(min=0, help="of them, clients rotating keys (every 0.5 s)")] = 4,
    think_ms: Annotated[float, typer.Option(min=0, help="mean wait between a client's data keys (0: back to "
                                                        "back)")] = 0,
    pg_mode: Annotated[str, typer.Option(help="pg_ctl restart mode: fast (clean) or immediate (a crash)")] = "fast",
    json_out: Annotated[Path | None, typer.Option("--json", help="every figure and check as JSON")] = None,
    keep: Annotated[bool, typer.Option(help="keep the scratch directory (logs) afterwards")] = False,
) -> None:
    """Replica kill -9 and PostgreSQL restart under load, behind HAProxy: nothing
    acknowledged lost, errors only in the disruption's window."""
    names = [d.strip() for d in drills.split(",") if d.strip()]
    if not names or any(n not in ("replica", "postgres") for n in names):
        raise typer.BadParameter("choose from replica, postgres", param_hint="--drills")
    if pg_mode not in ("fast", "immediate"):
        raise typer.BadParameter("fast or immediate", param_hint="--pg-mode")
    try:
        with _interruptible():
            results = run(drills=names, phase=phase, clients=clients, rotators=rotators, think_ms=think_ms,
                          pg_mode=pg_mode, json_out=json_out, keep=keep)
    except DrillFailed as exc:
        console.print(f"[red]drill failed[/red]: {exc}")
        raise typer.Exit(1) from None
    raise typer.Exit(0 if all(all(d.checks.values()) for d in results) else 1)


def main(argv: list[str] | None = None) -> None:
    app(args=argv, prog_name="kms-bench drill")


if __name__ == "__main__":
    main()
