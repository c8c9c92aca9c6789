"""Guard-point benchmarks (docs/benchmarks.md), each plain vs protected side by side in
one run on the same disk, medians of several interleaved runs with their spread:

* copy (the seed reports' test 3): a file of SIZE written with fsync and read back cold
  (page cache dropped) on a plain directory, a guard point, and gocryptfs (Debian's
  package) when installed; ratios against plain and against gocryptfs;
* concurrent (test 4 scaled to this machine): THREADS threads each writing then reading
  back cold their own 10 MB files;
* oltp (test 6): pgbench's TPC-B-like and select-only mixes with PostgreSQL's whole data
  directory (WAL included) on a guard point vs a plain directory;
* transport (issue 26, `kms-bench guardpoint-transport`): the above and fio 4 KiB random
  writes on plain, nocipher (the same daemon with `--content plain`, same transport
  options) and guard point, on tmpfs and disk, /dev/fuse and FUSE over io_uring side by
  side; ratios guard/plain, nocipher/plain, guard/nocipher and the issue's targets.

Needs root (FUSE, drop_caches; the oltp suite runs PostgreSQL as the postgres user).

    python -m kmsbench.guardpoint [--suites copy,concurrent,oltp] [--size-mib 1024] [--runs 3]
                              [--output docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.cryptfile import KeyVersion
from kmsbench.machine import describe
from kmsbench.sections import write_section
from kmsbench.workspace import unmount_all

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
def guard_point(base: Path, *, name: str = "gp", transport: Transport | None = None,
                log: Path | None = None) -> Iterator[Path]:
    """A guard point at base/NAME over base/NAME-backing; with `transport`, started with
    those options and the daemon's stderr written to `log` (issue 26's arms)."""
    backing, mnt = base / f"{name}-backing", base / name
    backing.mkdir()
    mnt.mkdir()
    key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
    target: Callable[..., None] = _serve
    args: tuple[Any, ...] = (str(backing), str(mnt), key)
    if transport is not None:
        target, args = _serve_transport, (*args, transport, str(log or base / f"{name}.stderr"))
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args)
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


# --- transport (issue 26): guard point vs the same daemon without its cipher ---------------
# Every FUSE arm is one strongroom-fuse with the same transport options; "nocipher" runs it
# with `--content plain`, so guard point / nocipher is the cipher's share of the cost and
# nocipher / plain the transport's (FUSE itself).
ENABLE_URING = Path("/sys/module/fuse/parameters/enable_uring")
DAEMON_THREADS = 16  # DataPlane's default, given to both FUSE arms alike
_TRANSPORT_LINE = re.compile(r"strongroom-fuse: transport (.+)")
TRANSPORT_WORKLOADS = ("copy", "concurrent", "fio", "oltp")
LOCATIONS = ("tmpfs", "disk")


@dataclass(frozen=True)
class Transport:
    """What the FUSE arms ask the kernel for; what they got is the daemon's INIT line."""

    io_uring: bool = False
    writeback_cache: bool = True

    @property
    def label(self) -> str:
        return "uring" if self.io_uring else "dev"

    def daemon_args(self) -> list[str]:
        # Only what differs from the daemon's defaults: a daemon without the options still runs.
        return [*(["--io-uring"] if self.io_uring else []),
                *([] if self.writeback_cache else ["--writeback-cache", "off"])]

    def asked(self) -> str:
        return (f"{'FUSE over io_uring' if self.io_uring else '/dev/fuse'}, writeback cache "
                f"{'on' if self.writeback_cache else 'off'}")


def _serve_transport(backing: str, mnt: str, key: KeyVersion, transport: Transport, log_path: str) -> None:
    """`_serve` with transport options; DataPlane logs the daemon's stderr (its INIT line
    among it), which goes to `log_path` for the parent to read."""
    from agents.cryptfile import StaticKeyring
    from agents.guardpoint.dataplane import DataPlane, recover_journal
    from agents.guardpoint.policy import PERMIT_ALL

    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("strongroom.agent.dataplane")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # the transport line is logged at INFO
    journal = backing + ".journal"
    recover_journal(backing, journal, StaticKeyring([key]))
    plane = DataPlane(backing, mnt, journal=journal, allow_other=True, threads=DAEMON_THREADS,
                      io_uring=transport.io_uring, writeback_cache=transport.writeback_cache)

    def configure(p: DataPlane) -> None:
        p.set_key(key)
        p.set_active(key)
        p.set_policy(PERMIT_ALL)

    plane.start(configure=configure)
    plane.wait()


@contextmanager
def nocipher(base: Path, name: str, transport: Transport, log: Path) -> Iterator[Path]:
    """strongroom-fuse with `--content plain` over a backing directory beside the guard
    point's, with the guard point's transport options; its stderr in `log`."""
    from agents.guardpoint.dataplane import DAEMON

    backing, mnt = base / f"{name}-backing", base / name
    backing.mkdir()
    mnt.mkdir()
    with open(log, "wb") as err:
        proc = subprocess.Popen([str(DAEMON), "--content", "plain", "--threads", str(DAEMON_THREADS),
                                 "--allow-other", *transport.daemon_args(), str(backing), str(mnt)],
                                stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    try:
        try:
            _wait_mounted(mnt, lambda: proc.poll() is None)
        except SystemExit:
            raise SystemExit(f"strongroom-fuse --content plain did not mount {mnt}: "
                             f"{log.read_text(errors='replace')[-1500:]}") from None
        yield mnt
    finally:
        unmount_all(mnt)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait(10)


def negotiated(mnt: Path, log: Path, timeout: float = 3.0) -> str | None:
    """The daemon's `strongroom-fuse: transport ...` line, or None (a daemon without it)."""
    os.listdir(mnt)  # a request answered: INIT was, and its line printed
    deadline = time.monotonic() + timeout
    while True:
        with suppress(OSError):
            m = _TRANSPORT_LINE.search(log.read_text(errors="replace"))
            if m:
                return m.group(1).strip()
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


@contextmanager
def uring_enabled(needed: bool) -> Iterator[None]:
    """FUSE over io_uring is granted only while the host's fuse module allows it: allowed
    for the arms that ask, the original value put back after (it is host-wide)."""
    if not needed:
        yield
        return
    try:
        original = ENABLE_URING.read_text().strip()
    except OSError as exc:
        raise SystemExit(f"the io_uring arms need {ENABLE_URING} (FUSE over io_uring, Linux 6.14+): {exc}; "
                         "run with --transports dev") from None
    try:
        if original != "Y":
            ENABLE_URING.write_text("Y\n")
        yield
    finally:
        if original != "Y":
            ENABLE_URING.write_text(original + "\n")


@contextmanager
def transport_arms(base: Path, transports: list[Transport]) -> Iterator[tuple[dict[str, Path], dict[str, Any]]]:
    """{arm: directory} for plain and, per transport, nocipher and guard point, all on
    `base`'s file system; and per FUSE arm what it asked for and what INIT gave it."""
    with ExitStack() as stack:
        stack.enter_context(uring_enabled(any(t.io_uring for t in transports)))
        plain = base / "plain"
        plain.mkdir()
        arms: dict[str, Path] = {"plain": plain}
        info: dict[str, Any] = {}
        for t in transports:
            for kind in ("nocipher", "guard point"):
                name = f"{'nc' if kind == 'nocipher' else 'gp'}-{t.label}"
                log = base / f"{name}.stderr"
                mnt = stack.enter_context(nocipher(base, name, t, log) if kind == "nocipher"
                                          else guard_point(base, name=name, transport=t, log=log))
                arms[f"{kind} {t.label}"] = mnt
                info[f"{kind} {t.label}"] = {"asked": t.asked(), "io_uring": t.io_uring,
                                             "negotiated": negotiated(mnt, log)}
        yield arms, info


def fio_once(directory: Path, *, size_mib: int, seconds: int) -> float:
    """IOPS of 4 KiB buffered random writes (psync, O_DIRECT off), fsync at the end: fio
    counts the final fsync in the job's runtime, so what the page cache absorbed (all of
    it, with the writeback cache) is paid for before the figure is taken."""
    r = subprocess.run(["fio", "--name=rw", f"--directory={directory}", "--rw=randwrite", "--bs=4k",
                        f"--size={size_mib}M", f"--runtime={seconds}", "--time_based", "--ioengine=psync",
                        "--direct=0", "--end_fsync=1", "--output-format=json"],
                       capture_output=True, text=True, check=False, timeout=seconds * 10 + 900)
    if r.returncode != 0 or "{" not in r.stdout:
        raise SystemExit(f"fio failed in {directory}: {r.stderr[-1500:]}")
    iops = float(json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]["write"]["iops"])
    for p in directory.glob("rw.*"):
        p.unlink()
    return iops


def _mbs(wr: tuple[float, float]) -> str:
    return f"write {wr[0]:.0f}, read {wr[1]:.0f} MB/s"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def measure_location(base: Path, *, transports: list[Transport], workloads: list[str], runs: int,
                     p: dict[str, Any], where: str) -> dict[str, Any]:
    """Every workload on every arm of one location, runs interleaved across the arms."""
    out: dict[str, Any] = {"path": str(base), "fs": describe(base)["disk"]}
    with transport_arms(base, transports) as (arms, info):
        out["arms"] = info
        for name, line in ((k, v["negotiated"]) for k, v in info.items()):
            _say(f"[{where}] {name}: {line or 'no transport line (asked for ' + info[name]['asked'] + ')'}")

        def note(workload: str, i: int, arm: str, value: object) -> None:
            _say(f"[{where}] {workload} run {i + 1}/{runs} {arm}: {value}")

        if "copy" in workloads:
            size, data = p["copy_mib"][where], os.urandom(BLOCK)
            out["copy"] = {arm: [] for arm in arms}
            for i in range(runs):
                for arm, d in arms.items():
                    out["copy"][arm].append(copy_once(d, size * BLOCK, data))
                    note("copy", i, arm, _mbs(out["copy"][arm][-1]))
        if "concurrent" in workloads:
            out["concurrent"] = {arm: [] for arm in arms}
            for i in range(runs):
                for arm, d in arms.items():
                    out["concurrent"][arm].append(concurrent_once(d, p["threads"], p["files"]))
                    note("concurrent", i, arm, _mbs(out["concurrent"][arm][-1]))
        if "fio" in workloads:
            out["fio"] = {arm: [] for arm in arms}
            for i in range(runs):
                for arm, d in arms.items():
                    out["fio"][arm].append(fio_once(d, size_mib=p["fio_mib"], seconds=p["fio_seconds"]))
                    note("fio", i, arm, f"{out['fio'][arm][-1]:.0f} IOPS")
        if "oltp" in workloads:
            out["oltp"] = _oltp_arms(base, arms, p=p, runs=runs, note=note)
    return out


def _oltp_arms(base: Path, arms: dict[str, Path], *, p: dict[str, Any], runs: int,
               note: Callable[[str, int, str, object], None]) -> dict[str, dict[str, list[float]]]:
    if PG_BIN is None or shutil.which("runuser") is None:
        raise SystemExit("oltp needs PostgreSQL's server binaries (apt-get install postgresql) and runuser")
    results: dict[str, dict[str, list[float]]] = {mix: {arm: [] for arm in arms} for mix in MIXES}
    clusters: dict[str, Cluster] = {}
    try:
        for arm, d in arms.items():
            clusters[arm] = Cluster(d / "pgdata", base / f"run-{arm.replace(' ', '-')}")
            clusters[arm].start(p["pg_scale"])
        for i in range(runs):
            for mix, extra in MIXES.items():
                for arm, cluster in clusters.items():
                    results[mix][arm].append(cluster.pgbench(*extra, "-c", str(p["pg_clients"]), "-j",
                                                             str(min(p["pg_clients"], 2)), "-T", str(p["pg_seconds"])))
                    note(f"pgbench {mix}", i, arm, f"{results[mix][arm][-1]:.0f} tps")
    finally:
        for cluster in clusters.values():
            cluster.stop()
    return results


def _enough_room(path: Path, p: dict[str, Any], workloads: list[str], where: str, arms: int) -> None:
    need = 0
    if "copy" in workloads:
        need = max(need, int(p["copy_mib"][where] * BLOCK * 1.1))
    if "oltp" in workloads:  # every arm's cluster lives at once: ~16 MB per scale unit, WAL, growth
        need = max(need, int(arms * (p["pg_scale"] * 16 * BLOCK * 1.5 + 256 * BLOCK)))
    free = shutil.disk_usage(path).free
    if need > free:
        raise SystemExit(f"{where} ({path}) has {free / 2**30:.1f} GiB free, the chosen sizes need "
                         f"{need / 2**30:.1f} GiB: shrink --pg-scale / the copy size")


def measure_transport(*, locations: dict[str, Path], transports: list[Transport], workloads: list[str], runs: int,
                      p: dict[str, Any]) -> dict[str, Any]:
    """The whole run: {"params", "machine", "locations": {where: measure_location(...)}}.
    Each location's work happens in a fresh directory made (and removed) inside it."""
    results: dict[str, Any] = {"params": {**p, "runs": runs, "workloads": workloads,
                                          "transports": [t.label for t in transports],
                                          "writeback_cache": transports[0].writeback_cache,
                                          "daemon_threads": DAEMON_THREADS},
                               "machine": describe(next(iter(locations.values()))), "locations": {}}
    for where, parent in locations.items():
        _enough_room(parent, p, workloads, where, 1 + 2 * len(transports))
    for where, parent in locations.items():
        base = Path(tempfile.mkdtemp(prefix="gp-transport-", dir=parent))
        os.chmod(base, 0o755)  # noqa: S103 - the postgres user must reach its data directories
        try:
            results["locations"][where] = measure_location(base, transports=transports, workloads=workloads,
                                                           runs=runs, p=p, where=where)
        finally:
            if not unmount_all(base):  # never remove through a live mount
                shutil.rmtree(base, ignore_errors=True)
    return results


# --- rendering -------------------------------------------------------------------------------
TRANSPORT_SECTION = (
    "guardpoint-transport-bench",
    "## Guard point transport (issue 26)\n\nCommand: `kms-bench guardpoint-transport --runs 5 --output "
    "docs/benchmarks.md` (root; fio and PostgreSQL installed; `--smoke` for a check of the wiring). The guard "
    "point against plain and against the same daemon without its cipher (`strongroom-fuse --content plain`, "
    "same transport options): guard point / nocipher is the cipher's share, nocipher / plain the transport's.")

# (what, figure key or "*" for every figure, location or None for each, ratio, at least)
TARGETS: list[tuple[str, str, str | None, str, float]] = [
    ("pgbench TPC-B-like, guard point / plain", "oltp:TPC-B-like", None, "guard/plain", 0.75),
    ("pgbench select-only, guard point / plain", "oltp:select-only", None, "guard/plain", 0.80),
    ("guard point / nocipher, every figure (the lowest)", "*", None, "guard/nocipher", 0.90),
    ("copy write + fsync, guard point / plain", "copy:write", "tmpfs", "guard/plain", 0.50),
    ("copy cold read, guard point / plain", "copy:read", "tmpfs", "guard/plain", 0.35),
    ("copy write + fsync, guard point / plain", "copy:write", "disk", "guard/plain", 0.95),
    ("copy cold read, guard point / plain", "copy:read", "disk", "guard/plain", 0.80),
    ("fio 4 KiB randwrite IOPS, guard point / plain", "fio", None, "guard/plain", 0.50),
]
RATIOS = {"guard/plain": ("guard point", "plain"), "nocipher/plain": ("nocipher", "plain"),
          "guard/nocipher": ("guard point", "nocipher")}


def _figures(loc: dict[str, Any], p: dict[str, Any], where: str) -> list[tuple[str, str, dict[str, list[float]]]]:
    """(key, label, {arm: values per run}) of one location, in the report's order."""
    figs: list[tuple[str, str, dict[str, list[float]]]] = []
    for key, label in (("copy", f"{p['copy_mib'][where]} MiB copy, MB/s"),
                       ("concurrent", f"{p['threads']} threads x {p['files']} x {FILE_MB} MB, MB/s")):
        if key in loc:
            for i, (part, what) in enumerate((("write", "write + fsync"), ("read", "cold read"))):
                figs.append((f"{key}:{part}", label.replace(", ", f" {what}, "),
                             {arm: [r[i] for r in rs] for arm, rs in loc[key].items()}))
    if "fio" in loc:
        figs.append(("fio", "fio 4 KiB randwrite, IOPS", loc["fio"]))
    for mix, by_arm in loc.get("oltp", {}).items():
        figs.append((f"oltp:{mix}", f"pgbench {mix}, tps", by_arm))
    return figs


def _ratio(values: dict[str, list[float]], kind: str, variant: str) -> tuple[float, float, float] | None:
    """Ratio of the medians, and the lowest and highest ratio of one run's pair."""
    a, b = (values.get(arm if arm == "plain" else f"{arm} {variant}") for arm in RATIOS[kind])
    if not a or not b or statistics.median(b) == 0:
        return None
    pairs = [x / y for x, y in zip(a, b, strict=False) if y]
    return statistics.median(a) / statistics.median(b), min(pairs, default=0.0), max(pairs, default=0.0)


def _fmt_ratio(r: tuple[float, float, float] | None) -> str:
    return "—" if r is None else f"{r[0]:.2f} ({r[1]:.2f}-{r[2]:.2f})"


def _num(xs: list[float]) -> str:
    return "—" if not xs else _spread(xs)


def render_transport(results: dict[str, Any]) -> str:
    p, locs = results["params"], results["locations"]
    variants: list[str] = p["transports"]
    fio = (f"`fio --rw=randwrite --bs=4k --size={p['fio_mib']}M --runtime={p['fio_seconds']} --time_based "
           "--ioengine=psync --direct=0 --end_fsync=1`")
    lines = [f"{p['runs']} interleaved runs, median (min-max); ratios are of the medians, with the lowest and "
             "highest ratio of a single run's pair. plain: the directory itself; nocipher: `strongroom-fuse "
             f"--content plain` over a directory of the same file system, {p['daemon_threads']} threads, "
             f"allow_other, writeback cache {'on' if p['writeback_cache'] else 'off'}, the guard point's options; "
             "guard point: the same daemon with format v1 encryption, started by the control plane (DataPlane). "
             f"Transports: {', '.join(variants)} (dev: /dev/fuse; uring: FUSE over io_uring). Copies are written in "
             f"1 MiB blocks with fsync and read back with the page cache dropped; fio: {fio}; pgbench scale "
             f"{p['pg_scale']}, {p['pg_clients']} clients, {p['pg_seconds']} s, the whole data directory on the "
             "arm.", ""]
    for where, loc in locs.items():
        fs = loc["fs"]
        lines += [f"**{where}**: {fs.get('fstype', '?')} on {fs.get('device', '?')} ({loc['path']})", "",
                  "| figure | transport | plain | nocipher | guard point | guard/plain | nocipher/plain "
                  "| guard/nocipher |", "|---|---|---:|---:|---:|---:|---:|---:|"]
        for _key, label, values in _figures(loc, p, where):
            for v in variants:
                lines.append(f"| {label} | {v} | {_num(values.get('plain', []))} "
                             f"| {_num(values.get(f'nocipher {v}', []))} | {_num(values.get(f'guard point {v}', []))} "
                             + "".join(f"| {_fmt_ratio(_ratio(values, k, v))} " for k in RATIOS) + "|")
        lines.append("")
    lines += _render_targets(results, variants)
    lines += ["", "Transport each FUSE arm negotiated (the daemon's INIT line, `strongroom-fuse: transport ...`):", ""]
    for where, loc in locs.items():
        for arm, a in loc.get("arms", {}).items():
            got = a.get("negotiated")
            if got is None:
                text = f"not reported by the daemon; asked for {a['asked']}"
            else:
                text = f"`{got}`"
                if a.get("io_uring") and "uring" not in got.split():
                    text += " (asked for FUSE over io_uring, not granted)"
            lines.append(f"- {where}, {arm}: {text}")
    return "\n".join(lines)


def _render_targets(results: dict[str, Any], variants: list[str]) -> list[str]:
    p, locs = results["params"], results["locations"]
    lines = ["Issue 26's targets, guard point ratios of medians (✓ met, ✗ missed):", "",
             f"| target | where | at least | {' | '.join(variants)} |",
             "|---|---|---:|" + "---:|" * len(variants)]
    for what, key, only, kind, least in TARGETS:
        for where, loc in locs.items():
            if only is not None and where != only:
                continue
            figs = _figures(loc, p, where)
            cells = []
            for v in variants:
                found = [(r[0], label) for k, label, values in figs if key in ("*", k)
                         for r in [_ratio(values, kind, v)] if r is not None]
                if not found:
                    cells.append("—")
                    continue
                value, label = min(found)
                cells.append(f"{value:.2f} {'✓' if value >= least else '✗'}" + (f" ({label})" if key == "*" else ""))
            size = f", {p['copy_mib'][where]} MiB" if key.startswith("copy") else ""
            lines.append(f"| {what} | {where}{size} | {least:.2f} | {' | '.join(cells)} |")
    return lines


# --- command -----------------------------------------------------------------------------------
def _names(text: str, allowed: tuple[str, ...]) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"choose from {','.join(allowed)}, got {text!r}")
    return [n for n in allowed if n in names]


def transport_main(argv: list[str] | None = None) -> None:
    """`kms-bench guardpoint-transport`: issue 26's measurements in one run."""
    ap = argparse.ArgumentParser(
        prog="kms-bench guardpoint-transport",
        description="Guard point vs plain vs the same daemon without its cipher (nocipher), on tmpfs and on disk, "
                    "/dev/fuse and FUSE over io_uring: copies, concurrent files, fio 4 KiB random writes, pgbench; "
                    "issue 26's targets met or missed. Needs root.")
    ap.add_argument("--runs", type=int, default=3, help="interleaved repetitions (default 3)")
    ap.add_argument("--locations", type=lambda s: _names(s, LOCATIONS), default=list(LOCATIONS))
    ap.add_argument("--workloads", type=lambda s: _names(s, TRANSPORT_WORKLOADS), default=list(TRANSPORT_WORKLOADS))
    ap.add_argument("--transports", type=lambda s: _names(s, ("dev", "uring")), default=["dev", "uring"],
                    help="dev (/dev/fuse), uring (FUSE over io_uring: enable_uring is set to Y for the run, then "
                         "put back); default both, side by side")
    ap.add_argument("--writeback-cache", choices=("on", "off"), default="on", help="for every FUSE arm (default on)")
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("BENCH_DIR") or "."),
                    help="the disk location: a directory on the disk measured (default $BENCH_DIR or .)")
    ap.add_argument("--tmpfs-dir", type=Path, default=Path("/dev/shm"),  # noqa: S108 - a fresh mkdtemp() is made inside it
                    help="the tmpfs location (default /dev/shm)")
    ap.add_argument("--tmpfs-copy-mib", type=int, default=1024)
    ap.add_argument("--disk-copy-mib", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=10, help="concurrent: threads (default 10)")
    ap.add_argument("--files", type=int, default=4, help="concurrent: 10 MB files per thread (default 4)")
    ap.add_argument("--fio-mib", type=int, default=256)
    ap.add_argument("--fio-seconds", type=int, default=20)
    ap.add_argument("--pg-scale", type=int, default=50)
    ap.add_argument("--pg-clients", type=int, default=8)
    ap.add_argument("--pg-seconds", type=int, default=30)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes, 1 run: checks the wiring in a minute or two, measures nothing")
    ap.add_argument("--output", type=Path, help="also write the section into this Markdown file (docs/benchmarks.md)")
    ap.add_argument("--json", type=Path, help="also write every run's numbers here")
    ap.add_argument("--from-json", type=Path, help="measure nothing: render an earlier --json")
    args = ap.parse_args(argv)

    def stop(signum: int, _frame: object) -> None:
        # SIGTERM and SIGHUP take Ctrl-C's way out: mounts undone, enable_uring put back.
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    if args.from_json is not None:
        results = json.loads(args.from_json.read_text())
    else:
        if args.smoke:
            args.runs, args.tmpfs_copy_mib, args.disk_copy_mib = 1, 8, 8
            args.threads, args.files, args.fio_mib, args.fio_seconds = 2, 1, 8, 2
            args.pg_scale, args.pg_clients, args.pg_seconds = 1, 2, 2
        numbers = {k: getattr(args, k) for k in ("runs", "tmpfs_copy_mib", "disk_copy_mib", "threads", "files",
                                                   "fio_mib", "fio_seconds", "pg_scale", "pg_clients", "pg_seconds")}
        small = [k for k, v in numbers.items() if v < 1]
        if small:
            ap.error(f"--{small[0].replace('_', '-')} must be at least 1")
        if os.geteuid() != 0:
            raise SystemExit("needs root: FUSE mounts, dropping the page cache, enable_uring")
        missing = [t for t, w in (("fio", "fio"), ("runuser", "oltp"), ("fusermount3", "copy")) if w in
                   args.workloads and shutil.which(t) is None]
        if missing:
            raise SystemExit(f"missing program(s): {', '.join(missing)}")
        from agents.guardpoint.dataplane import available

        why = available()
        if why:
            raise SystemExit(why)
        dirs = {"tmpfs": args.tmpfs_dir, "disk": args.workdir}
        locations = {w: dirs[w].absolute() for w in args.locations}
        if "disk" in locations and describe(locations["disk"])["disk"].get("fstype") in ("tmpfs", "ramfs"):
            raise SystemExit(f"--workdir {locations['disk']} is on tmpfs: pass a directory on the disk to measure")
        p = {"copy_mib": {"tmpfs": args.tmpfs_copy_mib, "disk": args.disk_copy_mib}, "threads": args.threads,
             "files": args.files, "fio_mib": args.fio_mib, "fio_seconds": args.fio_seconds, "pg_scale": args.pg_scale,
             "pg_clients": args.pg_clients, "pg_seconds": args.pg_seconds, "smoke": args.smoke}
        transports = [Transport(io_uring=t == "uring", writeback_cache=args.writeback_cache == "on")
                      for t in args.transports]
        results = measure_transport(locations=locations, transports=transports, workloads=args.workloads,
                                    runs=args.runs, p=p)
        if args.json is not None:
            args.json.write_text(json.dumps(results, indent=1))
    report = render_transport(results)
    print(report, flush=True)
    if args.output is not None:
        name, heading = TRANSPORT_SECTION
        write_section(args.output, report, name=name, heading=heading)


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
