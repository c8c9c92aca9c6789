"""Guard-point benchmarks (docs/benchmarks.md), each plain vs protected side by side in
one run on the same disk, medians of several interleaved runs with their spread:

* copy (the seed reports' test 3): a file of SIZE written with fsync and read back cold
  (page cache dropped) on a plain directory, a guard point, and gocryptfs (Debian's
  package) when installed; ratios against plain and against gocryptfs;
* concurrent (test 4 scaled to this machine): THREADS threads each writing then reading
  back cold their own 10 MB files;
* oltp (test 6): pgbench's TPC-B-like and select-only mixes with PostgreSQL's whole data
  directory (WAL included) on a guard point vs a plain directory (guardpoint_oltp.py);
* transport (issue 26, `kms-bench guardpoint-transport`): the above and fio 4 KiB random
  writes on plain, nocipher (the same daemon with `--content plain`, same transport
  options) and guard point, on tmpfs and disk, /dev/fuse and FUSE over io_uring side by
  side; ratios guard/plain, nocipher/plain, guard/nocipher and the issue's targets
  (guardpoint_transport.py).

The arms themselves (guard point, gocryptfs) and what the suites share: guardpoint_rig.py.

Needs root (FUSE, drop_caches; the oltp suite runs PostgreSQL as the postgres user).

    python -m kmsbench.guardpoint [--suites copy,concurrent,oltp] [--size-mib 1024] [--runs 3]
                              [--output docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kmsbench.guardpoint_oltp import (
    run_oltp,
)
from kmsbench.guardpoint_rig import (
    BLOCK,
    Step,
    bench_dir,
    drop_caches,
    gocryptfs,
    guard_point,
    no_step,
    nothing,
    spread,
)
from kmsbench.sections import write_section


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



def measure_copy(*, size_mib: int, runs: int, base: Path | None = None,
                 step: Step = no_step) -> dict[str, list[tuple[float, float]]]:
    """(write MB/s, read MB/s) per interleaved run for plain, guard point and gocryptfs
    (when installed); `step(label)` after each measurement (progress bars)."""
    size = size_mib * BLOCK
    data = os.urandom(BLOCK)
    base, owned = bench_dir(base)
    results: dict[str, list[tuple[float, float]]] = {"plain": [], "guard point": []}
    have_gocryptfs = shutil.which("gocryptfs") is not None
    if have_gocryptfs:
        results["gocryptfs"] = []
    try:
        plain = base / "plain"
        plain.mkdir()
        with guard_point(base) as gp, (gocryptfs(base) if have_gocryptfs else nothing()) as gc:
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
                       step: Step = no_step) -> dict[str, list[tuple[float, float]]]:
    """(write MB/s, read MB/s) aggregate per interleaved run, plain and guard point."""
    base, owned = bench_dir(base)
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
        lines.append(f"| {name} | {spread(w)} | {spread(r)} | {statistics.median(w) / pw - 1:+.0%} "
                     f"| {statistics.median(r) / pr - 1:+.0%} |")
    return "\n".join(lines)


def run_concurrent(*, threads: int, files: int, runs: int) -> str:
    return render_concurrent(measure_concurrent(threads=threads, files=files, runs=runs), threads=threads,
                             files=files, runs=runs)


# --- oltp ------------------------------------------------------------------------------
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
