"""`kms-bench keyserver`: the key server's own benchmark (docs/benchmarks.md).

One run measures, on this machine:
* data-key generations per second and p50/p99 latency over HTTP at 1, 50 and 200
  concurrent clients (a real multi-worker server on PostgreSQL, driven by wrk);
* the raw HSM ceiling: RSA-2048 OAEP unwraps per second in the same token;
* host re-wraps (unwrap under the KEK + wrap under a host's RSA public key, all in the
  HSM) per second, and their ratio to that ceiling.
Each figure is the median of several runs, with the spread (min-max).

`kms-bench --suites keyserver` runs it (`--embedded`, in a child process) inside a whole
report, or measures a running server with `measure_http`.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import psycopg
import typer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from rich.console import Console
from rich.progress import Progress
from sqlalchemy.engine import make_url

from hsm import HsmBackend, WrappedKey
from keyserver.core.keys import KeySpec
from keyserver.core.principal import system_context
from keyserver.services import build_services
from keyserver.settings import Settings
from kmsbench.ports import free_port
from kmsbench.sections import write_section

console = Console(stderr=True)
SECTION = "keyserver-bench"  # its marked section of docs/benchmarks.md
LUA = """
wrk.method = "POST"
wrk.body = "{}"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
"""
# Virtual users (the seeds' "200 virtual users"): each waits this long on average between
# its requests, so 200 of them offer about 1,000 requests per second. The wait is drawn
# uniformly from 0 to twice that, as load tools' random timers do: with one fixed wait the
# 200 users stay in step and arrive as bursts of 200 every cycle, which measures the burst
# (at 1,500/s of capacity, 130 ms to drain), not the server's latency at that rate.
THINK_MS = 190
VU_LUA = """
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("seed", threads)
end
function init(args)
  math.randomseed(os.time() * 100 + seed)
end
function delay()
  return math.random(0, %d)
end
"""


@dataclass
class LoadResult:
    clients: int
    think_ms: int = 0
    rps: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    errors: list[int] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)
    # Audit records not yet chained when the load ended, and how long the chainer took to
    # catch up (the next load starts after it has: each load meets a settled server).
    audit_backlog: list[int] = field(default_factory=list)
    audit_drain_s: list[float] = field(default_factory=list)


def machine() -> dict[str, Any]:
    cpu, flags = platform.processor(), ""
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = re.search(r"model name\s*:\s*(.*)", info).group(1)  # type: ignore[union-attr]
        flags = re.search(r"flags\s*:\s*(.*)", info).group(1)  # type: ignore[union-attr]
    except (OSError, AttributeError):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / 2**30, 1),
            "aes_ni": " aes " in f" {flags} ", "kernel": platform.release(), "python": platform.python_version()}


def _ms(value: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s|m)", value)
    if not m:
        raise ValueError(value)
    n, unit = float(m.group(1)), m.group(2)
    return n * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def parse_wrk(out: str) -> tuple[float, float, float, int, int]:
    rps = float(re.search(r"Requests/sec:\s*([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"^\s*50%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"^\s*99%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = 0
    m = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", out)
    if m:
        errors += int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        errors += sum(int(x) for x in m.groups())
    return rps, p50, p99, total, errors



def measure_ops(fn: Any, *, seconds: float, threads: int) -> float:
    """Operations per second of `fn()` called in a loop from `threads` threads."""
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            fn()
            counts[i] += 1

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    started = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.monotonic() - started)


def hsm_figures(backend: HsmBackend, wrapped: WrappedKey, *, seconds: float, repeats: int,
                threads: int) -> dict[str, list[float]]:
    from kmsbench.hsm_ceiling import measure_unwrap_ceiling

    host_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = host_key.public_key().public_bytes(serialization.Encoding.DER,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)
    ceiling, rewrap = [], []
    for _ in range(repeats):
        ceiling.append(measure_unwrap_ceiling(backend, seconds=seconds, threads=threads))
        rewrap.append(measure_ops(lambda: backend.rewrap_for_public_key(wrapped, public_key_der=der),
                                  seconds=seconds, threads=threads))
    return {"unwrap_ceiling": ceiling, "host_rewrap": rewrap}


def measure_http(url: str, token: str, *, clients: list[int], virtual_users: int, duration: int, repeats: int,
                 scratch: Path, progress: Progress | None = None,
                 settle: Callable[[], tuple[int, float]] | None = None) -> list[dict[str, Any]]:
    """Data keys over HTTP with wrk against `url` (a generate-data-key route), every
    repetition of every load kept; `scratch` holds wrk's scripts (they carry the token).
    `settle` (when the store is at hand) waits after each load until the audit chainer
    has caught up and says how far behind it was."""
    lua = scratch / "post.lua"
    lua.write_text(LUA % token)
    vu_lua = scratch / "vu.lua"
    vu_lua.write_text(LUA % token + VU_LUA % (2 * THINK_MS))
    loads = [LoadResult(c) for c in clients]
    if virtual_users:
        loads.append(LoadResult(virtual_users, THINK_MS))
    task = progress.add_task("data keys over HTTP", total=len(loads) * repeats) if progress else None
    # Warm the workers (HSM handle caches, connection pools) before measuring.
    subprocess.run(["wrk", "-t1", "-c8", "-d2s", "-s", str(lua), url], capture_output=True, check=True)
    for _ in range(repeats):
        for lr in loads:
            script = vu_lua if lr.think_ms else lua
            out = subprocess.run(["wrk", f"-t{min(2, lr.clients)}", f"-c{lr.clients}", f"-d{duration}s",
                                  "--timeout", "10s", "--latency", "-s", str(script), url],
                                 capture_output=True, text=True, check=True).stdout
            rps, p50, p99, total, errors = parse_wrk(out)
            lr.rps.append(rps)
            lr.p50_ms.append(p50)
            lr.p99_ms.append(p99)
            lr.requests.append(total)
            lr.errors.append(errors)
            if settle is not None:
                backlog, drain = settle()
                lr.audit_backlog.append(backlog)
                lr.audit_drain_s.append(drain)
            if progress is not None and task is not None:
                progress.advance(task)
    return [asdict(lr) for lr in loads]


def run(*, postgres: str | None, clients: list[int], virtual_users: int, duration: int, repeats: int, workers: int,
        output: Path | None, json_out: Path | None, data_dir: Path | None = None, hsm: bool = True,
        quiet: bool = False) -> dict[str, Any]:
    """The whole benchmark against a throwaway server: on a scratch database of the
    PostgreSQL server `postgres`, or on the embedded SQLite database when it is None
    (one worker: SQLite is single-process). `data_dir` (empty or absent) holds the
    server's files instead of a temporary directory; it is emptied afterwards."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")
    if data_dir is not None and data_dir.exists() and any(data_dir.iterdir()):
        raise SystemExit(f"{data_dir} is not empty: the benchmark empties its data directory afterwards")
    admin_url = make_url(postgres) if postgres else None
    dbname = f"strongroom_bench_{uuid.uuid4().hex[:8]}"

    def admin() -> psycopg.Connection[Any]:
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
                             "pass --postgres URL") from None
    else:
        workers = 1
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        data = data_dir
    else:
        data = Path(tempfile.mkdtemp(prefix="strongroom-bench-"))
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("STRONGROOM_")},
           "STRONGROOM_DATA_DIR": str(data), "STRONGROOM_PORT": str(port), "STRONGROOM_WORKERS": str(workers),
           "STRONGROOM_LOG_LEVEL": "WARNING", "STRONGROOM_DATABASE_POOL_SIZE": "16",
           "STRONGROOM_THREADS": "16",
           # wrk's 200 connections all come from 127.0.0.1; the server's cap per address
           # (64 per worker) would answer the rest 503, which wrk counts as fast answers.
           # Raised as for clients behind one load balancer (docs/api.md, limits).
           "STRONGROOM_HTTP_MAX_CONNECTIONS_PER_SOURCE": "1024",
           # Not measured here; off so that a server already on their ports does not matter.
           "STRONGROOM_KMIP_ENABLED": "false", "STRONGROOM_AGENT_ENABLED": "false"}
    if admin_url is not None:
        env["STRONGROOM_DATABASE_URL"] = admin_url.set(database=dbname).render_as_string(hide_password=False)
    results: dict[str, Any] = {"machine": machine(), "when": datetime.now(UTC).isoformat(timespec="seconds"),
                               "workers": workers, "duration_s": duration, "repeats": repeats,
                               "database": "PostgreSQL" if admin_url is not None else "SQLite (embedded)"}
    server = None
    try:
        os.environ.update({k: v for k, v in env.items() if k.startswith("STRONGROOM_")})
        if admin_url is None:
            os.environ.pop("STRONGROOM_DATABASE_URL", None)
        settings = Settings()
        services = build_services(settings)
        services.initialize()
        ctx = system_context("bench")
        services.keys.create(ctx, KeySpec(name="bench"))
        _, _ = services.identity.create_user(ctx, username="bench", role="operator",
                                             password=uuid.uuid4().hex + "-load")
        user = next(u for u in services.identity.list_users(ctx) if u.username == "bench")
        token = services.identity.create_token(system_context("bench"), name="bench", scopes=None,
                                               expires_in_days=1, user_id=user.id).secret
        services.audit.flush()
        server = subprocess.Popen([str(Path(sys.executable).with_name("keyserver")), "serve"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"https://127.0.0.1:{port}"  # the default: TLS from the internal CA
        trust = ssl.create_default_context(cadata=services.ca.certificate_pem().decode())
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=2, verify=trust).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the benchmark server did not become ready")
            time.sleep(0.2)
        with Progress(console=console) as progress:
            results["http"] = measure_http(f"{base}/api/v1/keys/bench/generate-data-key", token, clients=clients,
                                           settle=lambda: _settle(services),
                                           virtual_users=virtual_users, duration=duration, repeats=repeats,
                                           scratch=data, progress=progress)
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        server = None
        with services.db() as s:
            from sqlalchemy import select

            from keyserver.store.models import KeyVersion
            v = s.execute(select(KeyVersion).limit(1)).scalar_one()
            wrapped = WrappedKey(v.wrapping_key_id or "", v.wrapping_mechanism or "", v.wrapped_key or b"")
        if hsm:
            with console.status("HSM ceiling and host re-wraps"):
                results["hsm_1_thread"] = hsm_figures(services.hsm, wrapped, seconds=3, repeats=repeats, threads=1)
                results["hsm_2_threads"] = hsm_figures(services.hsm, wrapped, seconds=3, repeats=repeats,
                                                       threads=2)
        services.close()
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        if admin_url is not None:
            with admin() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        if data_dir is None:
            shutil.rmtree(data, ignore_errors=True)
        else:
            for child in data.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
    report = render(results)
    if not quiet:
        console.print(report)
    if json_out:
        json_out.write_text(json.dumps(results, indent=2))
    if output:
        write_section(output, report, name=SECTION)
    return results


def _backlog(lr: dict[str, Any]) -> str:
    if not lr.get("audit_backlog"):
        return "n/a"
    return f"{_med(lr['audit_backlog']):,.0f} ({_med(lr['audit_drain_s']):.1f} s)"


def _settle(services: Any, limit_s: float = 300) -> tuple[int, float]:
    backlog = services.audit.pending()
    started = time.monotonic()
    while services.audit.pending() and time.monotonic() - started < limit_s:
        time.sleep(0.1)
    return backlog, round(time.monotonic() - started, 2)


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _spread(xs: list[float], fmt: str = "{:.0f}") -> str:
    return f"{fmt.format(min(xs))}-{fmt.format(max(xs))}"


def render(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        f"Run {r['when']} on {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, "
        f"AES-NI {'yes' if m['aes_ni'] else 'no'}, kernel {m['kernel']}, Python {m['python']}. "
        f"Server: {r['workers']} uvicorn worker(s) on {r.get('database', 'PostgreSQL')} + SoftHSM2, load from "
        "wrk on the same "
        f"machine; {r['repeats']} runs of {r['duration_s']} s each, median (min-max).",
        "",
        "| load | data keys/s | p50 ms | p99 ms | errors / requests | audit records behind at the end (caught up in) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for lr in r["http"]:
        shape = (f"{lr['clients']} virtual users, {lr['think_ms']} ms mean think time" if lr.get("think_ms")
                 else f"{lr['clients']} clients, back to back")
        lines.append(f"| {shape} | {_med(lr['rps']):.0f} ({_spread(lr['rps'])}) | "
                     f"{_med(lr['p50_ms']):.1f} ({_spread(lr['p50_ms'], '{:.1f}')}) | "
                     f"{_med(lr['p99_ms']):.1f} ({_spread(lr['p99_ms'], '{:.1f}')}) | "
                     f"{sum(lr['errors'])} / {sum(lr['requests'])} | {_backlog(lr)} |")
    if "hsm_1_thread" not in r:  # an existing server (kms-bench --keyserver): its token is out of reach
        return "\n".join(lines)
    lines += ["", "| HSM operation (in-token) | 1 thread, ops/s | 2 threads, ops/s |", "|---|---:|---:|"]
    h1, h2 = r["hsm_1_thread"], r["hsm_2_threads"]
    for label, k in (("RSA-2048 OAEP unwrap (the ceiling)", "unwrap_ceiling"),
                     ("host re-wrap: unwrap under KEK + wrap under host RSA key", "host_rewrap")):
        lines.append(f"| {label} | {_med(h1[k]):.0f} ({_spread(h1[k])}) | {_med(h2[k]):.0f} ({_spread(h2[k])}) |")
    ratio1 = _med(h1["host_rewrap"]) / _med(h1["unwrap_ceiling"])
    ratio2 = _med(h2["host_rewrap"]) / _med(h2["unwrap_ceiling"])
    lines.append(f"| host re-wraps / ceiling | {ratio1:.0%} | {ratio2:.0%} |")
    return "\n".join(lines)


SCALING_SECTION = "keyserver-scaling"
# Issue 16's targets for the data-key hot path.
TARGET_RPS = 1000.0
TARGET_P99_MS = 100.0


def scaling(*, postgres: str, workers: list[int], embedded: bool, duration: int, repeats: int,
            progress: Progress | None = None) -> dict[str, Any]:
    """200 clients back to back and 200 virtual users against PostgreSQL with each of
    `workers` worker processes, and the embedded default, one configuration after the
    other in one run."""
    configs: list[tuple[str, str | None, int]] = [(f"PostgreSQL, {w} worker{'s' if w > 1 else ''}", postgres, w)
                                                  for w in workers]
    if embedded:
        configs.append(("embedded SQLite, 1 worker", None, 1))
    task = progress.add_task("configurations", total=len(configs)) if progress else None
    rows = []
    for label, url, w in configs:
        # Each in a process of its own: the PKCS#11 module is initialised once per process,
        # for one token directory.
        with tempfile.TemporaryDirectory(prefix="strongroom-scaling-") as tmp:
            out = Path(tmp) / "r.json"
            cmd = [sys.executable, "-m", "kmsbench.keyserver_load", "--clients", "200", "--virtual-users", "200",
                   "--duration", str(duration), "--repeats", str(repeats), "--workers", str(w), "--no-hsm",
                   "--json", str(out), *(["--postgres", url] if url else ["--embedded"])]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{label}: the benchmark failed:\n{done.stderr[-2000:]}")
            r = json.loads(out.read_text())
        rows.append({"label": label, "workers": w, "store": "postgresql" if url else "sqlite", "http": r["http"]})
        if progress is not None and task is not None:
            progress.advance(task)
    return {"machine": machine(), "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "duration_s": duration, "repeats": repeats, "rows": rows}


def _load(row: dict[str, Any], *, think: bool) -> dict[str, Any]:
    return next(lr for lr in row["http"] if bool(lr.get("think_ms")) == think)


def render_scaling(r: dict[str, Any], chart: str | None) -> str:
    m = r["machine"]
    lines = [
        f"Run {r['when']} on {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, kernel {m['kernel']}, "
        f"Python {m['python']}; wrk on the same machine; {r['repeats']} runs of {r['duration_s']} s per figure, "
        "median (min-max). 200 virtual users wait "
        f"0-{2 * THINK_MS} ms (uniform, mean {THINK_MS} ms) between requests: together they offer about "
        f"{1000 * 200 // (THINK_MS + 10):,} requests/s.",
        "",
        "| configuration | 200 clients: data keys/s | p99 ms | 200 virtual users: data keys/s | p50 ms | p99 ms "
        "| errors / requests |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        b, v = _load(row, think=False), _load(row, think=True)
        errors = sum(b["errors"]) + sum(v["errors"])
        requests = sum(b["requests"]) + sum(v["requests"])
        lines.append(f"| {row['label']} | {_med(b['rps']):,.0f} ({_spread(b['rps'])}) | {_med(b['p99_ms']):.0f} | "
                     f"{_med(v['rps']):,.0f} ({_spread(v['rps'])}) | {_med(v['p50_ms']):.1f} | "
                     f"{_med(v['p99_ms']):.0f} ({_spread(v['p99_ms'])}) | {errors} / {requests:,} |")
    lines += ["", *verdicts(r)]
    if chart:
        lines += ["", f"![data keys per second and p99 by configuration]({chart})"]
    return "\n".join(lines)


def verdicts(r: dict[str, Any]) -> list[str]:
    """Issue 16's targets, met or missed, from the figures of this run."""
    out = []
    pg = [row for row in r["rows"] if row["store"] == "postgresql"]
    best = max(pg, key=lambda row: _med(_load(row, think=False)["rps"]), default=None)
    if best is not None:
        b, v = _load(best, think=False), _load(best, think=True)
        errors = sum(b["errors"]) + sum(v["errors"])
        rps, p99 = _med(b["rps"]), _med(v["p99_ms"])
        met = rps >= TARGET_RPS and p99 <= TARGET_P99_MS and errors == 0
        out.append(f"* **≥ {TARGET_RPS:,.0f} data keys/s at 200 clients, p99 ≤ {TARGET_P99_MS:.0f} ms, no errors "
                   f"(PostgreSQL):** {'met' if met else 'missed'} — {best['label']}: {rps:,.0f}/s back to back; "
                   f"p99 {p99:.0f} ms for 200 virtual users offering ~1,000/s; {errors} errors.")
        emb = next((row for row in r["rows"] if row["store"] == "sqlite"), None)
        if emb is not None:
            e = _med(_load(emb, think=False)["rps"])
            out.append(f"* **Embedded default within 2x of PostgreSQL:** {'met' if 2 * e >= rps else 'missed'} — "
                       f"{e:,.0f}/s against {rps:,.0f}/s ({rps / e:.2f}x).")
    return out


def scaling_chart(r: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [row["label"] for row in r["rows"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.8 + 0.6 * len(labels)), sharey=True)
    for ax, think, key, title, target in (
            (left, False, "rps", "200 clients back to back: data keys/s", TARGET_RPS),
            (right, True, "p99_ms", "200 virtual users (~1,000/s offered): p99 ms", TARGET_P99_MS)):
        data = [_load(row, think=think)[key] for row in r["rows"]]
        meds = [_med(d) for d in data]
        ax.barh(range(len(labels)), meds, xerr=[[m - min(d) for m, d in zip(meds, data, strict=True)],
                                                [max(d) - m for m, d in zip(meds, data, strict=True)]],
                capsize=3, color="#2e86c1")
        ax.axvline(target, color="#c0392b", linestyle="--", linewidth=1, label=f"target {target:,.0f}")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
    left.set_yticks(range(len(labels)), labels)
    left.invert_yaxis()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


app = typer.Typer(add_completion=False)


@app.command()
def bench(
    postgres: Annotated[str, typer.Option(help="PostgreSQL server URL (a scratch database is created)")] =
        "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    embedded: Annotated[bool, typer.Option(help="embedded SQLite database instead of PostgreSQL (one worker)")] =
        False,
    clients: Annotated[str, typer.Option(help="comma-separated concurrent client counts")] = "1,50,200",
    virtual_users: Annotated[int, typer.Option(help="virtual users with think time (0 to skip)")] = 200,
    duration: Annotated[int, typer.Option(min=1, help="seconds per measurement")] = 10,
    repeats: Annotated[int, typer.Option(min=1, help="runs per figure (median and spread are reported)")] = 3,
    workers: Annotated[int, typer.Option(min=1, help="server worker processes")] = 2,
    data_dir: Annotated[Path | None, typer.Option(help="empty directory for the server's files (default: a "
                                                       "temporary one)")] = None,
    output: Annotated[Path | None, typer.Option(help="Markdown file whose key-server section is rewritten")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="raw results as JSON")] = None,
    scaling_workers: Annotated[str | None, typer.Option(
        "--scaling", help="instead: PostgreSQL with each of these worker counts (e.g. 1,2,3) and the embedded "
                          "default, at 200 clients and 200 virtual users, with issue 16's targets and a chart")] = None,
    chart: Annotated[Path | None, typer.Option(help="--scaling: the chart's PNG file")] = None,
    hsm: Annotated[bool, typer.Option(help="also measure the HSM's ceiling and host re-wraps")] = True,
) -> None:
    """Measure data keys/s and latency over HTTP, and the HSM's own ceiling, in one run."""
    if scaling_workers:
        with Progress(console=console) as progress:
            r = scaling(postgres=postgres, workers=[int(w) for w in scaling_workers.split(",")], embedded=True,
                        duration=duration, repeats=repeats, progress=progress)
        link = None
        if chart is not None:
            scaling_chart(r, chart)
            link = os.path.relpath(chart, output.parent) if output else str(chart)
        report = render_scaling(r, link)
        console.print(report, markup=False)
        if json_out:
            json_out.write_text(json.dumps(r, indent=2))
        if output:
            write_section(output, report, name=SCALING_SECTION)
        return
    run(postgres=None if embedded else postgres, clients=[int(c) for c in clients.split(",")],
        virtual_users=virtual_users, duration=duration, repeats=repeats,
        workers=workers, output=output, json_out=json_out, data_dir=data_dir, hsm=hsm)


def main(argv: list[str] | None = None) -> None:
    app(args=argv, prog_name="kms-bench keyserver")


if __name__ == "__main__":
    main()
