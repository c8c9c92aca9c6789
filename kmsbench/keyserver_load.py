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
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
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
from kmsbench.sections import write_section

console = Console(stderr=True)
SECTION = "keyserver-bench"  # its marked section of docs/benchmarks.md
LUA = """
wrk.method = "POST"
wrk.body = "{}"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
"""
# Virtual users (the seeds' "200 virtual users"): each waits this long between its
# requests, so 200 of them offer about 1,000 requests per second.
THINK_MS = 190


@dataclass
class LoadResult:
    clients: int
    think_ms: int = 0
    rps: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    errors: list[int] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    from hsm.bench import measure_unwrap_ceiling

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
                 scratch: Path, progress: Progress | None = None) -> list[dict[str, Any]]:
    """Data keys over HTTP with wrk against `url` (a generate-data-key route), every
    repetition of every load kept; `scratch` holds wrk's scripts (they carry the token)."""
    lua = scratch / "post.lua"
    lua.write_text(LUA % token)
    vu_lua = scratch / "vu.lua"
    vu_lua.write_text(LUA % token + f"function delay()\n  return {THINK_MS}\nend\n")
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
            if progress is not None and task is not None:
                progress.advance(task)
    return [asdict(lr) for lr in loads]


def run(*, postgres: str | None, clients: list[int], virtual_users: int, duration: int, repeats: int, workers: int,
        output: Path | None, json_out: Path | None, data_dir: Path | None = None) -> dict[str, Any]:
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
    port = _free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("STRONGROOM_")},
           "STRONGROOM_DATA_DIR": str(data), "STRONGROOM_PORT": str(port), "STRONGROOM_WORKERS": str(workers),
           "STRONGROOM_LOG_LEVEL": "WARNING", "STRONGROOM_DATABASE_POOL_SIZE": "16",
           "STRONGROOM_THREADS": "16",
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
        with console.status("HSM ceiling and host re-wraps"):
            results["hsm_1_thread"] = hsm_figures(services.hsm, wrapped, seconds=3, repeats=repeats, threads=1)
            results["hsm_2_threads"] = hsm_figures(services.hsm, wrapped, seconds=3, repeats=repeats, threads=2)
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
    console.print(report)
    if json_out:
        json_out.write_text(json.dumps(results, indent=2))
    if output:
        write_section(output, report, name=SECTION)
    return results


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
        "| load | data keys/s | p50 ms | p99 ms | errors / requests |",
        "|---|---:|---:|---:|---:|",
    ]
    for lr in r["http"]:
        shape = (f"{lr['clients']} virtual users, {lr['think_ms']} ms think time" if lr.get("think_ms")
                 else f"{lr['clients']} clients, back to back")
        lines.append(f"| {shape} | {_med(lr['rps']):.0f} ({_spread(lr['rps'])}) | "
                     f"{_med(lr['p50_ms']):.1f} ({_spread(lr['p50_ms'], '{:.1f}')}) | "
                     f"{_med(lr['p99_ms']):.1f} ({_spread(lr['p99_ms'], '{:.1f}')}) | "
                     f"{sum(lr['errors'])} / {sum(lr['requests'])} |")
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
) -> None:
    """Measure data keys/s and latency over HTTP, and the HSM's own ceiling, in one run."""
    run(postgres=None if embedded else postgres, clients=[int(c) for c in clients.split(",")],
        virtual_users=virtual_users, duration=duration, repeats=repeats,
        workers=workers, output=output, json_out=json_out, data_dir=data_dir)


def main(argv: list[str] | None = None) -> None:
    app(args=argv, prog_name="kms-bench keyserver")


if __name__ == "__main__":
    main()
