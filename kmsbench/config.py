"""What to run and at which sizes: the seeds' sizes by default, small ones with --quick."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

SUITES = ("engine", "copy", "concurrent", "oltp", "keyserver", "kmip", "rotation", "volume")
FUSE_SUITES = frozenset({"copy", "concurrent", "oltp", "rotation", "volume"})
MIB = 1 << 20


@dataclass
class Config:
    suites: list[str]
    runs: int
    out: Path
    work: Path
    quick: bool = False
    # engine
    engine_chunks: tuple[int, ...] = (4096, 65536)
    openssl_seconds: int = 2
    # copy (the seeds' test 3: 2 GB and 6 GB)
    copy_sizes_mib: list[int] = field(default_factory=lambda: [2048, 6144])
    # concurrent (test 4 scaled: threads x 10 MB files)
    threads: int = 10
    files_per_thread: int = 4
    # oltp (pgbench)
    pg_scale: int = 50
    pg_seconds: int = 30
    pg_clients: int = 8
    # keyserver (REST) and kmip
    clients: list[int] = field(default_factory=lambda: [1, 50, 200])
    virtual_users: int = 200
    load_seconds: int = 10
    kmip_connections: list[int] = field(default_factory=lambda: [1, 50, 200])
    keyserver: str | None = None
    token: str | None = None
    key: str | None = None
    cacert: Path | None = None  # --keyserver's CA (its data directory's ca.pem); None: the system's

    def keyserver_tls(self) -> ssl.SSLContext:
        """How --keyserver's certificate is verified (as `curl --cacert`)."""
        if self.cacert is not None:
            return ssl.create_default_context(cafile=str(self.cacert))
        return ssl.create_default_context()
    postgres: str | None = None  # kmip: None starts a throwaway cluster in the work directory
    # rotation
    rotation_files: int = 1000
    rotation_file_kib: int = 1024
    # volume: a userspace LUKS2 volume vs a plain loop-mounted image (and a guard point);
    # pgbench with the oltp suite's scale, clients and seconds
    volume_seq_mib: int = 2048
    volume_fio_mib: int = 512
    volume_fio_seconds: int = 20
    # Per-suite repetitions where they differ from `runs` (--quick: one KMIP and key-server run).
    suite_runs: dict[str, int] = field(default_factory=dict)

    def runs_for(self, suite: str) -> int:
        return self.suite_runs.get(suite, self.runs)

    @classmethod
    def quick_sizes(cls, **kwargs: object) -> Config:
        """A few minutes on a 2-vCPU machine: small files, short loads."""
        defaults: dict[str, object] = {
            "quick": True, "engine_chunks": (4096, 65536), "openssl_seconds": 1, "copy_sizes_mib": [256],
            "threads": 4, "files_per_thread": 2, "pg_scale": 5, "pg_seconds": 10, "pg_clients": 4,
            "clients": [1, 200], "virtual_users": 200, "load_seconds": 3, "kmip_connections": [1, 50],
            "rotation_files": 64, "rotation_file_kib": 1024, "suite_runs": {"kmip": 1, "keyserver": 1},
            "volume_seq_mib": 256, "volume_fio_mib": 128, "volume_fio_seconds": 5,
        }
        return cls(**{**defaults, **kwargs})  # type: ignore[arg-type]

    def disk_needed(self) -> dict[str, int]:
        """Bytes each selected suite needs at once on the work directory's file system
        (suites run one after another and clean up, so the largest one counts)."""
        need: dict[str, int] = {}
        overhead = 1.05  # the format's per-chunk tag and header, gocryptfs's similar
        if "copy" in self.suites:
            need["copy"] = int(max(self.copy_sizes_mib) * MIB * overhead)
        if "concurrent" in self.suites:
            need["concurrent"] = int(self.threads * self.files_per_thread * 10 * MIB * overhead)
        if "oltp" in self.suites:
            # ~16 MB per scale unit, twice (plain and guard point), WAL and pgbench's growth.
            need["oltp"] = int(2 * (self.pg_scale * 16 * MIB * 1.5 + 256 * MIB))
        if "rotation" in self.suites:
            # The files, plus one file's copy while it is replaced.
            need["rotation"] = int((self.rotation_files + 1) * self.rotation_file_kib * 1024 * overhead)
        if "volume" in self.suites:
            # Three targets (two sparse images and a guard point), each holding the largest workload.
            one = self.volume_seq_mib + self.volume_fio_mib + self.pg_scale * 24 + 1024
            need["volume"] = int(3 * one * MIB)
        if "keyserver" in self.suites or "kmip" in self.suites:
            need["keyserver"] = 64 * MIB
        return need
