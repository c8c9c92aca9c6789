"""The volume suite (docs/benchmarks.md): a LUKS2 volume opened in userspace (the native
data plane, `strongroom-volume`, under a loop device) against a plain loop-mounted image
file on the same disk, with a guard point beside them on the same workloads so users
can choose with numbers. Each target is an ext4 file system; interleaved runs:

* seq: 1 MiB writes with fsync, then a cold read (page caches dropped);
* fio: 4 KiB random reads and random writes, O_DIRECT, libaio at queue depth 16;
* pgbench TPC-B-like with PostgreSQL's whole data directory on the target.

The volume is opened as the agent opens it, with a random passphrase in place of the
one the key server seals (the server is not on the I/O path). Needs root, FUSE, loop
devices, cryptsetup and fio.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from agents.volume import luks
from agents.volume.manager import DAEMON
from kmsbench.guardpoint import copy_once
from kmsbench.guardpoint_oltp import PG_BIN, Cluster
from kmsbench.guardpoint_rig import BLOCK, Step, guard_point

TARGETS = ("plain loop", "volume (userspace)", "guard point")


def _sh(*argv: str) -> str:
    r = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:3])} failed: {r.stderr.strip()[-500:]}")
    return r.stdout


@contextmanager
def _ext4_on(device: str, mnt: Path) -> Iterator[Path]:
    _sh("mkfs.ext4", "-q", "-F", device)
    mnt.mkdir()
    _sh("mount", device, str(mnt))
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, check=False)


@contextmanager
def _loop(path: Path) -> Iterator[str]:
    device = _sh("losetup", "--find", "--show", str(path)).strip()
    try:
        yield device
    finally:
        subprocess.run(["losetup", "-d", device], capture_output=True, check=False)


@contextmanager
def plain_loop(base: Path, size: int) -> Iterator[Path]:
    image = base / "plain.img"
    with open(image, "xb") as f:
        f.truncate(size)
    with _loop(image) as device, _ext4_on(device, base / "plain") as mnt:
        yield mnt


@contextmanager
def userspace_volume(base: Path, size: int) -> Iterator[Path]:
    """A LUKS2 volume (aes-xts-plain64, 4 KiB sectors) served by strongroom-volume."""
    image, served = base / "volume.img", base / "volume-fuse"
    with open(image, "xb") as f:
        f.truncate(size + (16 << 20))
    passphrase = os.urandom(32)
    luks.format_volume(image, passphrase, sector_size=4096, label="kms-bench")
    served.mkdir()
    r, w = os.pipe()
    proc = subprocess.Popen([str(DAEMON), "-f", "--writeback-cache", "--ready-fd", str(w), str(image), str(served)],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=[w])
    os.close(w)
    assert proc.stdin is not None
    proc.stdin.write(passphrase)
    proc.stdin.close()
    with os.fdopen(r) as ready:
        if not ready.readline().startswith("ready"):
            raise SystemExit(f"strongroom-volume did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
    try:
        with _loop(served / "volume") as device, _ext4_on(device, base / "volume") as mnt:
            yield mnt
    finally:
        subprocess.run(["fusermount3", "-u", str(served)], capture_output=True, check=False)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fio_once(directory: Path, rw: str, *, size_mib: int, seconds: int) -> float:
    """IOPS of 4 KiB random `rw` (randread or randwrite)."""
    out = _sh("fio", "--name=bench", f"--directory={directory}", f"--rw={rw}", "--bs=4k", f"--size={size_mib}M",
              "--ioengine=libaio", "--iodepth=16", "--direct=1", "--time_based", f"--runtime={seconds}",
              "--ramp_time=1", "--group_reporting", "--output-format=json")
    job = json.loads(out[out.index("{"):])["jobs"][0]
    return float(job["read" if rw == "randread" else "write"]["iops"])


def measure(*, runs: int, seq_mib: int, fio_mib: int, fio_seconds: int, pg_scale: int, pg_seconds: int,
            pg_clients: int, base: Path, step: Step) -> dict[str, Any]:
    """{"seq": {target: [(write MB/s, read MB/s)...]}, "fio": {rw: {target: [iops...]}},
    "pgbench": {target: [tps...]}}: interleaved runs, the same disk for every target."""
    for tool in ("cryptsetup", "fio", "losetup", "mkfs.ext4"):
        if shutil.which(tool) is None:
            raise SystemExit(f"the volume suite needs {tool} (apt-get install cryptsetup-bin fio)")
    if not DAEMON.exists():
        raise SystemExit(f"{DAEMON} is not built: make -C {DAEMON.parent}")
    pg = PG_BIN is not None and shutil.which("runuser") is not None and pg_scale > 0
    # Every workload's files at once (pgbench's database stays while the others run), and ext4's own.
    size = (seq_mib + fio_mib + (pg_scale * 24 if pg else 0) + 1024) * BLOCK
    os.chmod(base, 0o755)  # noqa: S103 - the postgres user must reach every target
    seq: dict[str, list[tuple[float, float]]] = {t: [] for t in TARGETS}
    fio: dict[str, dict[str, list[float]]] = {rw: {t: [] for t in TARGETS} for rw in ("randread", "randwrite")}
    tps: dict[str, list[float]] = {t: [] for t in TARGETS}
    data = os.urandom(BLOCK)
    with ExitStack() as stack:
        targets = {"plain loop": stack.enter_context(plain_loop(base, size)),
                   "volume (userspace)": stack.enter_context(userspace_volume(base, size)),
                   "guard point": stack.enter_context(guard_point(base))}
        clusters: dict[str, Cluster] = {}
        if pg:
            for name, directory in targets.items():
                os.chmod(directory, 0o755)  # noqa: S103 - see above
                clusters[name] = Cluster(directory / "pgdata", base / f"run-{len(clusters)}")
                stack.callback(clusters[name].stop)
                clusters[name].start(pg_scale)
                step(f"pgbench initialised on {name}")
        for _ in range(runs):
            for name, directory in targets.items():  # interleaved: noise hits all alike
                # Every target's images are files of one host file system: with ext4's
                # data=ordered, whichever fsyncs first would also write back what the others
                # left dirty (measured: the plain loop, first in each round, at a third of
                # its speed). Each timed write starts with nothing dirty.
                os.sync()
                seq[name].append(copy_once(directory, seq_mib * BLOCK, data))
                step(f"seq {name}")
            for rw in fio:
                for name, directory in targets.items():
                    os.sync()
                    fio[rw][name].append(fio_once(directory, rw, size_mib=fio_mib, seconds=fio_seconds))
                    for leftover in directory.glob("bench.*"):
                        leftover.unlink()
                    step(f"{rw} {name}")
            for name, cluster in clusters.items():
                os.sync()
                tps[name].append(cluster.pgbench("-c", str(pg_clients), "-j", str(min(pg_clients, 2)), "-T",
                                                 str(pg_seconds)))
                step(f"pgbench {name}")
    return {"seq": seq, "fio": fio, "pgbench": tps if pg else {}}
