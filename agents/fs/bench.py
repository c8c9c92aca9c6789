"""Copy benchmark of a guard point (the seed reports' test 3), docs/benchmarks.md.

One run, same disk, side by side: a file of SIZE written with fsync and read back cold
(page cache dropped) on a plain directory, on a guard point, and on gocryptfs (Debian's
package) when installed. Medians of several runs with their spread; ratios against
plain and against gocryptfs. Needs root (FUSE, drop_caches).

    python -m agents.fs.bench [--size-mib 1024] [--runs 3] [--output docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from agents.benchreport import write_section
from agents.cryptfile import KeyVersion, StaticKeyring

BLOCK = 1 << 20


def _serve(backing: str, mnt: str, key: KeyVersion) -> None:
    from agents.fs.guardpoint import mount

    mount(backing, mnt, StaticKeyring([key]), lambda: key)


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


@contextmanager
def gocryptfs(base: Path) -> Iterator[Path]:
    cipher, mnt, pw = base / "gc-backing", base / "gc", base / "gc-pass"
    cipher.mkdir()
    mnt.mkdir()
    pw.write_text(uuid.uuid4().hex)
    subprocess.run(["gocryptfs", "-init", "-q", "-passfile", str(pw), str(cipher)], check=True)
    subprocess.run(["gocryptfs", "-q", "-passfile", str(pw), str(cipher), str(mnt)], check=True)
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


def run(*, size_mib: int, runs: int) -> str:
    size = size_mib * BLOCK
    data = os.urandom(BLOCK)
    # On a real disk, not tmpfs: BENCH_DIR picks the file system to measure.
    base = Path(tempfile.mkdtemp(prefix="gp-bench-", dir=os.environ.get("BENCH_DIR")))
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
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return render(results, size_mib=size_mib, runs=runs)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: FUSE mounts and dropping the page cache")
    report = run(size_mib=args.size_mib, runs=args.runs)
    print(report)
    if args.output:
        write_section(args.output, report, name="guardpoint-copy-bench", heading=(
            "## Guard point: large file copy\n\nCommand: `python -m agents.fs.bench --output docs/benchmarks.md` "
            "(root). The seed reports' test 3 on this machine."))


if __name__ == "__main__":
    main()
