"""Issue 26's transport figures (`kms-bench guardpoint-transport`): plain, nocipher (the
same daemon with `--content plain`, same transport options) and guard point, on tmpfs and
disk, /dev/fuse and FUSE over io_uring side by side; copies, concurrent files, fio 4 KiB
random writes, pgbench; the ratios and the issue's targets. Needs root."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

from kmsbench.guardpoint import (
    FILE_MB,
    concurrent_once,
    copy_once,
)
from kmsbench.guardpoint_oltp import (
    MIXES,
    PG_BIN,
    Cluster,
)
from kmsbench.guardpoint_rig import (
    BLOCK,
    DAEMON_THREADS,
    Transport,
    guard_point,
    spread,
    wait_mounted,
)
from kmsbench.machine import describe
from kmsbench.sections import write_section
from kmsbench.workspace import unmount_all

# --- transport (issue 26): guard point vs the same daemon without its cipher ---------------
# Every FUSE arm is one strongroom-fuse with the same transport options; "nocipher" runs it
# with `--content plain`, so guard point / nocipher is the cipher's share of the cost and
# nocipher / plain the transport's (FUSE itself).
ENABLE_URING = Path("/sys/module/fuse/parameters/enable_uring")
_TRANSPORT_LINE = re.compile(r"strongroom-fuse: transport (.+)")
TRANSPORT_WORKLOADS = ("copy", "concurrent", "fio", "oltp")
LOCATIONS = ("tmpfs", "disk")


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
            wait_mounted(mnt, lambda: proc.poll() is None)
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
    return "—" if not xs else spread(xs)


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


