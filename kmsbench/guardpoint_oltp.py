"""The guard point's OLTP benchmark (the seed reports' test 6): pgbench's TPC-B-like and
select-only mixes with PostgreSQL's whole data directory (WAL included) on a guard point
vs a plain directory, in a throwaway cluster run as the postgres user."""

from __future__ import annotations

import os
import re
import shutil
import socket
import statistics
import subprocess
from pathlib import Path

from kmsbench.guardpoint_rig import (
    Step,
    bench_dir,
    guard_point,
    no_step,
    spread,
)

PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)


def as_postgres(*cmd: str, timeout: float = 900) -> str:
    r = subprocess.run(["runuser", "-u", "postgres", "--", *cmd], capture_output=True, text=True, timeout=timeout,
                       check=False)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:2])} failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


class Cluster:
    """A throwaway PostgreSQL cluster whose whole data directory is `pgdata`."""

    def __init__(self, pgdata: Path, run: Path) -> None:
        assert PG_BIN is not None
        self.pgdata, self.run = pgdata, run
        run.mkdir(exist_ok=True)
        shutil.chown(run, "postgres", "postgres")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]

    def start(self, scale: int) -> None:
        self.pgdata.mkdir()
        shutil.chown(self.pgdata, "postgres", "postgres")
        as_postgres(f"{PG_BIN}/initdb", "-A", "trust", "-U", "postgres", "-D", str(self.pgdata))
        as_postgres(f"{PG_BIN}/pg_ctl", "-D", str(self.pgdata), "-w", "-l", str(self.run / "pg.log"), "-o",
                     f"-p {self.port} -k {self.run} -c listen_addresses='' -c shared_buffers=128MB", "start")
        as_postgres(f"{PG_BIN}/pgbench", "-h", str(self.run), "-p", str(self.port), "-i", "-q", "-s", str(scale),
                     "postgres")

    def pgbench(self, *args: str) -> float:
        out = as_postgres(f"{PG_BIN}/pgbench", "-h", str(self.run), "-p", str(self.port), *args, "postgres")
        m = re.search(r"tps = ([\d.]+)", out)
        if m is None:
            raise SystemExit(f"no tps in pgbench's output: {out[-500:]}")
        return float(m.group(1))

    def stop(self) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", f"{PG_BIN}/pg_ctl", "-D", str(self.pgdata), "-w",
                        "-m", "fast", "stop"], capture_output=True, check=False, timeout=120)


MIXES: dict[str, list[str]] = {"TPC-B-like": [], "select-only": ["-S"]}


def measure_oltp(*, scale: int, seconds: int, clients: int, runs: int, base: Path | None = None,
                 step: Step = no_step) -> dict[str, dict[str, list[float]]]:
    """tps per interleaved run: {mix: {"plain": [...], "guard point": [...]}}."""
    if PG_BIN is None or shutil.which("runuser") is None:
        raise SystemExit("the oltp suite needs PostgreSQL's server binaries (apt-get install postgresql) and runuser")
    base, owned = bench_dir(base)
    os.chmod(base, 0o755)  # noqa: S103 - the postgres user must reach both data directories
    results: dict[str, dict[str, list[float]]] = {mix: {"plain": [], "guard point": []} for mix in MIXES}
    clusters: dict[str, Cluster] = {}
    try:
        plain = base / "plain"
        plain.mkdir()
        with guard_point(base) as gp:
            for name, directory in (("plain", plain), ("guard point", gp)):
                clusters[name] = Cluster(directory / "pgdata", base / f"run-{name.replace(' ', '-')}")
                clusters[name].start(scale)
                step(f"initialised {name}")
            for _ in range(runs):
                for mix, extra in MIXES.items():
                    for name, cluster in clusters.items():  # interleaved: noise hits both alike
                        results[mix][name].append(cluster.pgbench(
                            *extra, "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(seconds)))
                        step(f"{mix} {name}")
            for cluster in clusters.values():
                cluster.stop()
    finally:
        for cluster in clusters.values():
            cluster.stop()
        if owned:
            shutil.rmtree(base, ignore_errors=True)
    return results


def render_oltp(results: dict[str, dict[str, list[float]]], *, scale: int, seconds: int, clients: int,
                runs: int) -> str:
    lines = [f"pgbench scale {scale}, {clients} clients, {seconds} s per run, {runs} interleaved runs; the whole "
             "data directory (WAL included) on the guard point; median (min-max) tps.", "",
             "| mix | plain | guard point | change |", "|---|---:|---:|---:|"]
    for mix, by_target in results.items():
        p, g = by_target["plain"], by_target["guard point"]
        change = statistics.median(g) / statistics.median(p) - 1
        lines.append(f"| {mix} | {spread(p)} | {spread(g)} | {change:+.1%} |")
    lines += ["", "Targets: select-only within 3 %, TPC-B-like within 10 % of plain."]
    return "\n".join(lines)


def run_oltp(*, scale: int, seconds: int, clients: int, runs: int) -> str:
    return render_oltp(measure_oltp(scale=scale, seconds=seconds, clients=clients, runs=runs), scale=scale,
                       seconds=seconds, clients=clients, runs=runs)


