"""Each suite runs the project's own benchmark code (kmsbench/engine.py,
kmsbench/guardpoint.py, kmsbench/keyserver_load.py, `kms-bench kmip`, kmsbench/rotation.py)
inside the run's work directory and returns {"params": ..., "raw": ...}: every
repetition's numbers, from which the report computes medians, spread and change."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx

from kmsbench.config import Config
from kmsbench.errors import BenchError, Exit

Step = Callable[[str], None]
Suite = Callable[[Config, Path, Step], dict[str, Any]]


def steps(cfg: Config, suite: str) -> int | None:
    """How many times a suite calls `step` (the progress bar's total), None if unknown."""
    return {
        "engine": cfg.runs * len(cfg.engine_chunks),
        "copy": cfg.runs * len(cfg.copy_sizes_mib) * 3,
        "concurrent": cfg.runs * 2,
        "oltp": 2 + cfg.runs * 4,
        "keyserver": ((len(cfg.clients) + (1 if cfg.virtual_users else 0)) * cfg.runs_for("keyserver")
                      if cfg.keyserver else None),
        "kmip": cfg.runs_for("kmip"),
        "rotation": 1 + 2 * cfg.runs,
        "volume": 3 + cfg.runs * 12,
    }.get(suite)


def engine(cfg: Config, work: Path, step: Step) -> dict[str, Any]:
    from kmsbench.engine import measure_all

    raw = measure_all(repeats=cfg.runs, chunks=cfg.engine_chunks, openssl_seconds=cfg.openssl_seconds, step=step)
    return {"params": {"chunks": list(cfg.engine_chunks), "mib_per_measurement": raw["total_mib"],
                       "openssl_seconds": cfg.openssl_seconds}, "raw": raw}


def copy(cfg: Config, work: Path, step: Step) -> dict[str, Any]:
    from kmsbench.guardpoint import measure_copy

    raw: dict[str, Any] = {}
    for size in cfg.copy_sizes_mib:
        base = work / f"copy-{size}"
        base.mkdir()

        def sized(name: str, size: int = size) -> None:
            step(f"{size} MiB {name}")

        raw[str(size)] = measure_copy(size_mib=size, runs=cfg.runs, base=base, step=sized)
    return {"params": {"sizes_mib": cfg.copy_sizes_mib, "block": "1 MiB", "fsync": True, "cold_read": True},
            "raw": raw}


def concurrent(cfg: Config, work: Path, step: Step) -> dict[str, Any]:
    from kmsbench.guardpoint import FILE_MB, measure_concurrent

    base = work / "concurrent"
    base.mkdir()
    raw = measure_concurrent(threads=cfg.threads, files=cfg.files_per_thread, runs=cfg.runs, base=base, step=step)
    return {"params": {"threads": cfg.threads, "files_per_thread": cfg.files_per_thread, "file_mb": FILE_MB},
            "raw": raw}


def oltp(cfg: Config, work: Path, step: Step) -> dict[str, Any]:
    from kmsbench.guardpoint_oltp import measure_oltp

    base = work / "oltp"
    base.mkdir()
    raw = measure_oltp(scale=cfg.pg_scale, seconds=cfg.pg_seconds, clients=cfg.pg_clients, runs=cfg.runs,
                       base=base, step=step)
    return {"params": {"scale": cfg.pg_scale, "seconds": cfg.pg_seconds, "clients": cfg.pg_clients}, "raw": raw}


def rotation(cfg: Config, work: Path, step: Step) -> dict[str, Any]:
    from kmsbench.rotation import measure

    base = work / "rotation"
    base.mkdir()
    raw = measure(base=base, files=cfg.rotation_files, file_kib=cfg.rotation_file_kib, runs=cfg.runs, step=step)
    return {"params": {"files": cfg.rotation_files, "file_kib": cfg.rotation_file_kib}, "raw": raw}


def volume(cfg: Config, work: Path, step: Step) -> dict[str, Any]:
    from kmsbench.volume import measure

    base = work / "volume"
    base.mkdir()
    raw = measure(runs=cfg.runs, seq_mib=cfg.volume_seq_mib, fio_mib=cfg.volume_fio_mib,
                  fio_seconds=cfg.volume_fio_seconds, pg_scale=cfg.pg_scale, pg_seconds=cfg.pg_seconds,
                  pg_clients=cfg.pg_clients, base=base, step=step)
    return {"params": {"seq_mib": cfg.volume_seq_mib, "fio_mib": cfg.volume_fio_mib,
                       "fio_seconds": cfg.volume_fio_seconds, "pg_scale": cfg.pg_scale, "pg_seconds": cfg.pg_seconds,
                       "pg_clients": cfg.pg_clients}, "raw": raw}


def run_child(cmd: list[str], *, log: Path, env: dict[str, str]) -> None:
    """Run a benchmark command in its own session; on Ctrl-C it gets SIGINT and a
    minute to stop its servers and drop its scratch database, then its whole process
    group is killed."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = proc.wait()
        except BaseException:
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(60)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if code != 0:
        tail = log.read_text(errors="replace")[-1500:]
        raise RuntimeError(f"{' '.join(cmd[:4])} exited with {code}:\n{tail}")


def _child_env(work: Path) -> dict[str, str]:
    # Scratch files of the child (its mkdtemp) land in the work directory: removed with it.
    return {**os.environ, "TMPDIR": str(work), "COLUMNS": "200"}


def _kms_bench(command: str) -> list[str]:
    """`kms-bench COMMAND` in a child process, by this interpreter."""
    return [sys.executable, "-m", "kmsbench", command]


def keyserver(cfg: Config, work: Path, step: Step) -> dict[str, Any]:
    params = {"clients": cfg.clients, "virtual_users": cfg.virtual_users, "seconds": cfg.load_seconds}
    if cfg.keyserver is not None:
        return {"params": {**params, "server": cfg.keyserver}, "raw": _existing_keyserver(cfg, work, step)}
    base = work / "keyserver"
    base.mkdir()
    out = base / "results.json"
    run_child([*_kms_bench("keyserver"), "--embedded", "--clients", ",".join(map(str, cfg.clients)),
               "--virtual-users", str(cfg.virtual_users), "--duration", str(cfg.load_seconds),
               "--repeats", str(cfg.runs_for("keyserver")), "--data-dir", str(base / "server"), "--json", str(out)],
              log=base / "keyserver-bench.log", env=_child_env(work))
    raw = json.loads(out.read_text())
    step("done")
    return {"params": {**params, "server": "throwaway: 1 worker, embedded SQLite, SoftHSM2"}, "raw": raw}


def _existing_keyserver(cfg: Config, work: Path, step: Step) -> dict[str, Any]:
    from kmsbench.keyserver_load import machine, measure_http

    assert cfg.keyserver is not None and cfg.token is not None
    base = cfg.keyserver.rstrip("/")
    key = cfg.key
    if key is None:
        key = f"kms-bench-{uuid.uuid4().hex[:8]}"
        made = httpx.post(f"{base}/api/v1/keys", json={"name": key, "description": "created by kms-bench"},
                          headers={"Authorization": f"Bearer {cfg.token}"}, timeout=30,
                          verify=cfg.keyserver_tls())
        if made.status_code != 201:
            raise BenchError(Exit.SERVICE, f"could not create a benchmark key on {base}: {made.status_code} "
                             f"{made.text[:200]}", "pass an existing key with --key NAME, or a token that may "
                             "create keys")
    scratch = work / "keyserver"
    scratch.mkdir()

    class _Steps:
        def add_task(self, *_: Any, **__: Any) -> int:
            return 0

        def advance(self, *_: Any) -> None:
            step("load")

    http = measure_http(f"{base}/api/v1/keys/{key}/generate-data-key", cfg.token, clients=cfg.clients,
                        virtual_users=cfg.virtual_users, duration=cfg.load_seconds,
                        repeats=cfg.runs_for("keyserver"),
                        scratch=scratch, progress=_Steps())  # type: ignore[arg-type]
    return {"machine": machine(), "workers": "?", "duration_s": cfg.load_seconds,
            "repeats": cfg.runs_for("keyserver"),
            "database": f"the server at {base}", "http": http, "key": key}


@contextmanager
def postgres_cluster(base: Path) -> Iterator[str]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 with connection slots for 200 KMIP
    clients, so the benchmark neither needs nor crowds a shared server."""
    from kmsbench.pgcluster import Cluster, ClusterError

    try:
        cluster = Cluster(base, settings={"max_connections": "500", "shared_buffers": "128MB"})
    except ClusterError:
        raise BenchError(Exit.PRIVILEGES, "no PostgreSQL server binaries", "apt-get install postgresql, or pass "
                         "--postgres URL") from None
    with cluster:
        yield cluster.url()


def kmip(cfg: Config, work: Path, step: Step) -> dict[str, Any]:
    base = work / "kmip"
    base.mkdir()
    runs = []
    with postgres_cluster(base) if cfg.postgres is None else nullcontext(cfg.postgres) as postgres:
        for i in range(cfg.runs_for("kmip")):
            out = base / f"run-{i + 1}.json"
            run_child([*_kms_bench("kmip"), "--postgres", postgres, "--connections",
                       ",".join(map(str, cfg.kmip_connections)), "--duration", str(cfg.load_seconds), "--json",
                       str(out)], log=base / f"run-{i + 1}.log", env=_child_env(work))
            runs.append(json.loads(out.read_text()))
            step(f"run {i + 1}")
    return {"params": {"connections": cfg.kmip_connections, "seconds": cfg.load_seconds,
                       "peer": "PyKMIP 0.11 bundled server",
                       "database": "throwaway PostgreSQL cluster" if cfg.postgres is None else "--postgres"},
            "raw": {"runs": runs}}


SUITE_FUNCTIONS: dict[str, Suite] = {"engine": engine, "copy": copy, "concurrent": concurrent, "oltp": oltp,
                                     "keyserver": keyserver, "kmip": kmip, "rotation": rotation, "volume": volume}
