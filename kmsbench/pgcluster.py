"""A throwaway PostgreSQL cluster: initdb into a directory, a server on a free port with
its socket beside it, stopped and left for the caller to remove. Run as the postgres
user when we are root (PostgreSQL refuses to run as root). The one way this tree makes
a PostgreSQL server of its own: the benchmarks (oltp, kmip), the failover drills and
the tests (tests/pg.py) all use it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg

from kmsbench.ports import free_port

PG_ROOT = Path("/usr/lib/postgresql")


class ClusterError(RuntimeError):
    pass


def server_bindir() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    return next(iter(sorted(PG_ROOT.glob("*/bin"), reverse=True)), None)



def as_postgres(*argv: str, timeout: float = 120) -> str:
    """Run a PostgreSQL program as the postgres user when we are root (else as we are);
    its standard output. A failure raises ClusterError with what it printed."""
    cmd = ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if r.returncode != 0:
        raise ClusterError(f"{' '.join(argv[:2])} failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


class Cluster:
    """A cluster whose data directory is `pgdata` (default run/pgdata) and whose socket
    and log are in `run`. `tcp`: listen on 127.0.0.1 as well as the socket. `settings`:
    server settings (`-c name=value`). `checksums`: initdb -k.

    `with Cluster(run) as c:` makes and starts it and stops it at once afterwards; or call
    init(), start(), restart() and stop() yourself (the oltp suite makes its data
    directory only once the guard point it lives on is mounted)."""

    def __init__(self, run: Path, *, pgdata: Path | None = None, tcp: bool = True,
                 settings: dict[str, str] | None = None, checksums: bool = False) -> None:
        bindir = server_bindir()
        if bindir is None:
            raise ClusterError("no PostgreSQL server binaries: apt-get install postgresql")
        self.bindir, self.run, self.pgdata = bindir, run, pgdata or run / "pgdata"
        self.tcp, self.settings, self.checksums = tcp, dict(settings or {}), checksums
        self.port = free_port()
        self.log = run / "pg.log"

    def init(self) -> None:
        for d in (self.run, self.pgdata):
            d.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                shutil.chown(d, "postgres", "postgres")
        as_postgres(str(self.bindir / "initdb"), *(["-k"] if self.checksums else []), "-A", "trust", "-U",
                    "postgres", "-D", str(self.pgdata), timeout=300)

    def _ctl(self, action: str, mode: str = "fast", check: bool = True) -> None:
        listen = "127.0.0.1" if self.tcp else "''"
        opts = " ".join([f"-p {self.port} -k {self.run} -c listen_addresses={listen}",
                         *(f"-c {k}={v}" for k, v in self.settings.items())])
        try:
            as_postgres(str(self.bindir / "pg_ctl"), "-D", str(self.pgdata), "-o", opts, "-m", mode, "-w",
                        "-t", "120", "-l", str(self.log), action, timeout=300)
        except ClusterError:
            if check:
                raise

    def start(self) -> None:
        self._ctl("start")

    def restart(self, mode: str = "fast") -> None:
        self._ctl("restart", mode)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server if it runs; never raises (a cleanup step)."""
        self._ctl("stop", mode, check=False)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> psycopg.Connection[Any]:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database,
                               autocommit=True, connect_timeout=5)

    def __enter__(self) -> Cluster:
        self.init()
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop("immediate")
