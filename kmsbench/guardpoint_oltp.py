"""The guard point's OLTP benchmark (the seed reports' test 6): pgbench's TPC-B-like and
select-only mixes with PostgreSQL's whole data directory (WAL included) on a guard point
vs a plain directory, in a throwaway cluster run as the postgres user."""

from __future__ import annotations

import os
import re
import shutil
import statistics
from pathlib import Path

from kmsbench.guardpoint_rig import (
    Step,
    bench_dir,
    guard_point,
    no_step,
    spread,
)
from kmsbench.pgcluster import Cluster as PgCluster
from kmsbench.pgcluster import as_postgres, server_bindir

PG_BIN = server_bindir()


class Cluster:
    """A throwaway cluster (kmsbench/pgcluster.py) whose whole data directory is `pgdata`
    (on the arm measured), reached over its socket in `run` only, with pgbench's tables."""

    def __init__(self, pgdata: Path, run: Path) -> None:
        self.pg = PgCluster(run, pgdata=pgdata, tcp=False, settings={"shared_buffers": "128MB"})

    def _pgbench(self, *args: str) -> str:
        return as_postgres(str(self.pg.bindir / "pgbench"), "-h", str(self.pg.run), "-p", str(self.pg.port), *args,
                           "postgres", timeout=900)

    def start(self, scale: int) -> None:
        self.pg.init()
        self.pg.start()
        self._pgbench("-i", "-q", "-s", str(scale))

    def pgbench(self, *args: str) -> float:
        out = self._pgbench(*args)
        m = re.search(r"tps = ([\d.]+)", out)
        if m is None:
            raise SystemExit(f"no tps in pgbench's output: {out[-500:]}")
        return float(m.group(1))

    def stop(self) -> None:
        self.pg.stop()


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


