"""Guard-point benchmarks (docs/benchmarks.md), each plain vs protected side by side in
one run on the same disk, medians of several interleaved runs with their spread:

* copy (the seed reports' test 3): a file of SIZE written with fsync and read back cold
  (page cache dropped) on a plain directory, a guard point, and gocryptfs (Debian's
  package) when installed; ratios against plain and against gocryptfs;
* concurrent (test 4 scaled to this machine): THREADS threads each writing then reading
  back cold their own 10 MB files;
* oltp (test 6): pgbench's TPC-B-like and select-only mixes with PostgreSQL's whole data
  directory (WAL included) on a guard point vs a plain directory.

Needs root (FUSE, drop_caches; the oltp suite runs PostgreSQL as the postgres user).

    python -m kmsbench.guardpoint [--suites copy,concurrent,oltp] [--size-mib 1024] [--runs 3]
                              [--output docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from agents.cryptfile import KeyVersion
from kmsbench.sections import write_section

BLOCK = 1 << 20


def _serve(backing: str, mnt: str, key: KeyVersion) -> None:
    """The guard point: the native data plane (strongroom-fuse) and its control plane,
    in a process of their own, as the agent runs them."""
    from agents.guardpoint.dataplane import serve

    serve(backing, mnt, [key], key, allow_other=True, journal=backing + ".journal")


def _wait_mounted(path: Path, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not os.path.ismount(path):
        if not alive() or time.monotonic() > deadline:
            raise SystemExit(f"could not mount {path}")
        time.sleep(0.05)


@contextmanager
def guard_point(base: Path) -> Iterator[Path]:
    backing, mnt = base / "gp-backing", base / "gp"
    backing.mkdir()
    mnt.mkdir()
    key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
    proc = multiprocessing.get_context("spawn").Process(target=_serve, args=(str(backing), str(mnt), key))
    proc.start()
    try:
        _wait_mounted(mnt, proc.is_alive)
        yield mnt
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)
        proc.join(10)
        if proc.is_alive():  # busy or wedged: detach it lazily rather than leave a server behind
            subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)
            proc.terminate()
            proc.join(10)


@contextmanager
def gocryptfs(base: Path) -> Iterator[Path]:
    cipher, mnt, pw = base / "gc-backing", base / "gc", base / "gc-pass"
    cipher.mkdir()
    mnt.mkdir()
    pw.write_text(uuid.uuid4().hex)
    # Its daemon keeps inherited pipes open (no capture_output) and, without syslog, warns
    # on stderr about it: neither belongs in a benchmark's output.
    subprocess.run(["gocryptfs", "-init", "-q", "-passfile", str(pw), str(cipher)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(["gocryptfs", "-q", "-passfile", str(pw), str(cipher), str(mnt)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield mnt
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def copy_once(directory: Path, size: int, data: bytes) -> tuple[float, float]:
    """MB/s writing `size` bytes with fsync, then reading them back cold."""
    path = directory / "bench.dat"
    start = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        for _ in range(size // BLOCK):
            f.write(data)
        os.fsync(f.fileno())
    write = size / (time.perf_counter() - start) / 1e6
    drop_caches()
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(BLOCK):
            pass
    read = size / (time.perf_counter() - start) / 1e6
    path.unlink()
    return write, read


Step = Callable[[str], None]


def _no_step(_: str) -> None:
    pass


def _base(base: Path | None) -> tuple[Path, bool]:
    """The directory to work in: `base` when the caller owns one (kms-bench's workdir),
    else a fresh one on BENCH_DIR's file system (a real disk, not tmpfs), removed after."""
    if base is not None:
        return base, False
    return Path(tempfile.mkdtemp(prefix="gp-bench-", dir=os.environ.get("BENCH_DIR"))), True


def measure_copy(*, size_mib: int, runs: int, base: Path | None = None,
                 step: Step = _no_step) -> dict[str, list[tuple[float, float]]]:
    """(write MB/s, read MB/s) per interleaved run for plain, guard point and gocryptfs
    (when installed); `step(label)` after each measurement (progress bars)."""
    size = size_mib * BLOCK
    data = os.urandom(BLOCK)
    base, owned = _base(base)
    results: dict[str, list[tuple[float, float]]] = {"plain": [], "guard point": []}
    have_gocryptfs = shutil.which("gocryptfs") is not None
    if have_gocryptfs:
        results["gocryptfs"] = []
    try:
        plain = base / "plain"
        plain.mkdir()
        with guard_point(base) as gp, (gocryptfs(base) if have_gocryptfs else _none()) as gc:
            targets = {"plain": plain, "guard point": gp, **({"gocryptfs": gc} if gc else {})}
            for _ in range(runs):
                for name, directory in targets.items():  # interleaved: noise hits all alike
                    results[name].append(copy_once(directory, size, data))
                    step(name)
    finally:
        if owned:
            shutil.rmtree(base, ignore_errors=True)
    return results


def run(*, size_mib: int, runs: int) -> str:
    return render(measure_copy(size_mib=size_mib, runs=runs), size_mib=size_mib, runs=runs)


@contextmanager
def _none() -> Iterator[None]:
    yield None


def render(results: dict[str, list[tuple[float, float]]], *, size_mib: int, runs: int) -> str:
    def med(name: str, i: int) -> float:
        return statistics.median(r[i] for r in results[name])

    def spread(name: str, i: int) -> str:
        xs = [r[i] for r in results[name]]
        return f"{min(xs):.0f}-{max(xs):.0f}"

    lines = [f"{size_mib} MiB written in 1 MiB blocks with fsync, then read back with the page cache dropped; "
             f"same disk; {runs} interleaved runs, median (min-max), MB/s.", "",
             "| | write | read | write vs plain | read vs plain |", "|---|---:|---:|---:|---:|"]
    for name in results:
        lines.append(f"| {name} | {med(name, 0):.0f} ({spread(name, 0)}) | {med(name, 1):.0f} ({spread(name, 1)}) "
                     f"| {med(name, 0) / med('plain', 0):.0%} | {med(name, 1) / med('plain', 1):.0%} |")
    if "gocryptfs" in results:
        lines += ["", f"Guard point vs gocryptfs: write {med('guard point', 0) / med('gocryptfs', 0):.2f}x, "
                      f"read {med('guard point', 1) / med('gocryptfs', 1):.2f}x (targets: ≥ 1.5x and ≥ 1.0x)."]
    return "\n".join(lines)


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"


# --- concurrent ------------------------------------------------------------------------
FILE_MB = 10


def concurrent_once(directory: Path, threads: int, files: int) -> tuple[float, float]:
    """Aggregate MB/s: `threads` threads each writing `files` 10 MB files (fsync), then
    reading them all back cold."""
    data = os.urandom(FILE_MB * BLOCK)
    total = threads * files * FILE_MB * BLOCK

    def write(t: int) -> None:
        for i in range(files):
            with open(directory / f"t{t}-{i}", "wb", buffering=0) as f:
                f.write(data)
                os.fsync(f.fileno())

    def read(t: int) -> None:
        for i in range(files):
            with open(directory / f"t{t}-{i}", "rb", buffering=0) as f:
                while f.read(BLOCK):
                    pass

    with ThreadPoolExecutor(threads) as pool:
        start = time.perf_counter()
        list(pool.map(write, range(threads)))
        w = total / (time.perf_counter() - start) / 1e6
        drop_caches()
        start = time.perf_counter()
        list(pool.map(read, range(threads)))
        r = total / (time.perf_counter() - start) / 1e6
    for p in directory.iterdir():
        p.unlink()
    return w, r


def measure_concurrent(*, threads: int, files: int, runs: int, base: Path | None = None,
                       step: Step = _no_step) -> dict[str, list[tuple[float, float]]]:
    """(write MB/s, read MB/s) aggregate per interleaved run, plain and guard point."""
    base, owned = _base(base)
    results: dict[str, list[tuple[float, float]]] = {"plain": [], "guard point": []}
    try:
        plain = base / "plain"
        plain.mkdir()
        with guard_point(base) as gp:
            for _ in range(runs):
                for name, directory in (("plain", plain), ("guard point", gp)):
                    results[name].append(concurrent_once(directory, threads, files))
                    step(name)
    finally:
        if owned:
            shutil.rmtree(base, ignore_errors=True)
    return results


def render_concurrent(results: dict[str, list[tuple[float, float]]], *, threads: int, files: int,
                      runs: int) -> str:
    lines = [f"{threads} threads, each writing {files} x {FILE_MB} MB files with fsync, then reading them back "
             f"with the page cache dropped; {runs} interleaved runs, median (min-max), aggregate MB/s.", "",
             "| | write | read | write change | read change |", "|---|---:|---:|---:|---:|"]
    pw = statistics.median(r[0] for r in results["plain"])
    pr = statistics.median(r[1] for r in results["plain"])
    for name, rs in results.items():
        w, r = [x[0] for x in rs], [x[1] for x in rs]
        lines.append(f"| {name} | {_spread(w)} | {_spread(r)} | {statistics.median(w) / pw - 1:+.0%} "
                     f"| {statistics.median(r) / pr - 1:+.0%} |")
    return "\n".join(lines)


def run_concurrent(*, threads: int, files: int, runs: int) -> str:
    return render_concurrent(measure_concurrent(threads=threads, files=files, runs=runs), threads=threads,
                             files=files, runs=runs)


# --- oltp ------------------------------------------------------------------------------
PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)


def _as_postgres(*cmd: str, timeout: float = 900) -> str:
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
        _as_postgres(f"{PG_BIN}/initdb", "-A", "trust", "-U", "postgres", "-D", str(self.pgdata))
        _as_postgres(f"{PG_BIN}/pg_ctl", "-D", str(self.pgdata), "-w", "-l", str(self.run / "pg.log"), "-o",
                     f"-p {self.port} -k {self.run} -c listen_addresses='' -c shared_buffers=128MB", "start")
        _as_postgres(f"{PG_BIN}/pgbench", "-h", str(self.run), "-p", str(self.port), "-i", "-q", "-s", str(scale),
                     "postgres")

    def pgbench(self, *args: str) -> float:
        out = _as_postgres(f"{PG_BIN}/pgbench", "-h", str(self.run), "-p", str(self.port), *args, "postgres")
        m = re.search(r"tps = ([\d.]+)", out)
        if m is None:
            raise SystemExit(f"no tps in pgbench's output: {out[-500:]}")
        return float(m.group(1))

    def stop(self) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", f"{PG_BIN}/pg_ctl", "-D", str(self.pgdata), "-w",
                        "-m", "fast", "stop"], capture_output=True, check=False, timeout=120)


MIXES: dict[str, list[str]] = {"TPC-B-like": [], "select-only": ["-S"]}


def measure_oltp(*, scale: int, seconds: int, clients: int, runs: int, base: Path | None = None,
                 step: Step = _no_step) -> dict[str, dict[str, list[float]]]:
    """tps per interleaved run: {mix: {"plain": [...], "guard point": [...]}}."""
    if PG_BIN is None or shutil.which("runuser") is None:
        raise SystemExit("the oltp suite needs PostgreSQL's server binaries (apt-get install postgresql) and runuser")
    base, owned = _base(base)
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
        lines.append(f"| {mix} | {_spread(p)} | {_spread(g)} | {change:+.1%} |")
    lines += ["", "Targets: select-only within 3 %, TPC-B-like within 10 % of plain."]
    return "\n".join(lines)


def run_oltp(*, scale: int, seconds: int, clients: int, runs: int) -> str:
    return render_oltp(measure_oltp(scale=scale, seconds=seconds, clients=clients, runs=runs), scale=scale,
                       seconds=seconds, clients=clients, runs=runs)


SECTIONS = {
    "copy": ("guardpoint-copy-bench", "## Guard point: large file copy\n\nCommand: `python -m kmsbench.guardpoint "
             "--suites copy --output docs/benchmarks.md` (root). The seed reports' test 3 on this machine."),
    "concurrent": ("guardpoint-concurrent-bench", "## Guard point: concurrent file I/O\n\nCommand: `python -m "
                   "kmsbench.guardpoint --suites concurrent --output docs/benchmarks.md` (root). The seed reports' "
                   "test 4 scaled to this machine."),
    "oltp": ("guardpoint-oltp-bench", "## Guard point: OLTP (pgbench)\n\nCommand: `python -m kmsbench.guardpoint "
             "--suites oltp --output docs/benchmarks.md` (root, PostgreSQL installed). The seed reports' test 6 "
             "with PostgreSQL's own benchmark."),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suites", default="copy", help="comma-separated: copy, concurrent, oltp")
    parser.add_argument("--size-mib", type=int, default=1024, help="copy: file size")
    parser.add_argument("--threads", type=int, default=8, help="concurrent: threads")
    parser.add_argument("--files", type=int, default=4, help="concurrent: 10 MB files per thread")
    parser.add_argument("--scale", type=int, default=10, help="oltp: pgbench scale")
    parser.add_argument("--clients", type=int, default=4, help="oltp: pgbench clients")
    parser.add_argument("--seconds", type=int, default=30, help="oltp: seconds per pgbench run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--tmpfs", action="store_true",
                        help="work on tmpfs (/dev/shm): the encryption layer's own cost, no disk; its own sections")
    args = parser.parse_args()
    if args.tmpfs:
        os.environ["BENCH_DIR"] = "/dev/shm"  # noqa: S108 - a fresh mkdtemp() is made inside it
    if os.geteuid() != 0:
        raise SystemExit("needs root: FUSE mounts and dropping the page cache")
    suites = [x.strip() for x in args.suites.split(",") if x.strip()]
    unknown = set(suites) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown suite(s) {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    for suite in suites:
        if suite == "copy":
            report = run(size_mib=args.size_mib, runs=args.runs)
        elif suite == "concurrent":
            report = run_concurrent(threads=args.threads, files=args.files, runs=args.runs)
        else:
            report = run_oltp(scale=args.scale, seconds=args.seconds, clients=args.clients, runs=args.runs)
        print(report, flush=True)
        if args.output:
            name, heading = SECTIONS[suite]
            if args.tmpfs:
                name = name.replace("-bench", "-tmpfs-bench")
                heading = heading.replace("\n\nCommand:", " on tmpfs\n\nCommand:", 1).replace(
                    "--output", "--tmpfs --output", 1) + (" On tmpfs nothing waits for a disk: what is left is the "
                                                          "cost of the encryption layer itself.")
            write_section(args.output, report, name=name, heading=heading)


if __name__ == "__main__":
    main()
