"""Everything that can be known to fail is checked before any work starts, and each
problem says what to do. `check` returns all problems found, most fundamental first."""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
from pathlib import Path
from typing import Any

import httpx

from kmsbench.config import FUSE_SUITES, Config
from kmsbench.errors import BenchError, Exit

SOFTHSM = "/usr/lib/softhsm/libsofthsm2.so"


def _pg_bin() -> Path | None:
    return next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)


def privileges(cfg: Config) -> list[BenchError]:
    problems: list[BenchError] = []
    fuse = sorted(FUSE_SUITES & set(cfg.suites))
    if fuse:
        if os.geteuid() != 0:
            problems.append(BenchError(
                Exit.PRIVILEGES, f"the {', '.join(fuse)} suite(s) need root: they mount FUSE file systems that "
                "other users (PostgreSQL) reach, and drop the page cache between write and read",
                "run kms-bench as root (sudo .venv/bin/kms-bench ...), or leave these suites out with "
                "--suites engine,keyserver (and kmip with --postgres URL)"))
        if not os.path.exists("/dev/fuse"):
            problems.append(BenchError(Exit.PRIVILEGES, "/dev/fuse is missing",
                                       "load the fuse module (modprobe fuse) or, in a container, pass "
                                       "--device /dev/fuse --cap-add SYS_ADMIN"))
        if shutil.which("fusermount3") is None:
            problems.append(BenchError(Exit.PRIVILEGES, "fusermount3 is not installed",
                                       "apt-get install fuse3"))
    if "oltp" in cfg.suites:
        pg = _pg_bin()
        if pg is None or not (pg / "initdb").exists() or not (pg / "pgbench").exists():
            problems.append(BenchError(Exit.PRIVILEGES, "the oltp suite needs PostgreSQL's server binaries "
                                       "(initdb, pg_ctl, pgbench under /usr/lib/postgresql/*/bin)",
                                       "apt-get install postgresql (the server is not started: kms-bench runs "
                                       "throwaway clusters), or leave oltp out of --suites"))
        if shutil.which("runuser") is None:
            problems.append(BenchError(Exit.PRIVILEGES, "the oltp suite needs runuser (PostgreSQL refuses to run "
                                       "as root)", "apt-get install util-linux"))
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            problems.append(BenchError(Exit.PRIVILEGES, "there is no 'postgres' system user to run the "
                                       "throwaway clusters as", "apt-get install postgresql (creates it), or "
                                       "useradd --system postgres"))
    if "keyserver" in cfg.suites:
        if shutil.which("wrk") is None:
            problems.append(BenchError(Exit.PRIVILEGES, "the keyserver suite drives its load with wrk, which is "
                                       "not installed", "apt-get install wrk"))
        if cfg.keyserver is None and not os.path.exists(SOFTHSM):
            problems.append(BenchError(Exit.PRIVILEGES, f"the throwaway key server needs SoftHSM2 ({SOFTHSM})",
                                       "apt-get install softhsm2, or measure a running server with "
                                       "--keyserver URL --token TOKEN"))
    if "kmip" in cfg.suites:
        if importlib.util.find_spec("kmip") is None:
            problems.append(BenchError(Exit.PRIVILEGES, "PyKMIP (the peer of the kmip suite) is not installed",
                                       "pip install 'pykmip>=0.11,<0.12' into this environment"))
        if not os.path.exists(SOFTHSM):
            problems.append(BenchError(Exit.PRIVILEGES, f"the kmip suite's server needs SoftHSM2 ({SOFTHSM})",
                                       "apt-get install softhsm2"))
    return problems


def keyserver(cfg: Config) -> list[BenchError]:
    """A --keyserver that is down, or a token it refuses."""
    if "keyserver" not in cfg.suites or cfg.keyserver is None:
        return []
    base = cfg.keyserver.rstrip("/")
    if not cfg.token:
        return [BenchError(Exit.USAGE, "--keyserver needs --token", "create an API token with the keys scope in "
                           "the console (or `keyserver token create`) and pass it with --token")]
    try:
        ready = httpx.get(f"{base}/readyz", timeout=5, verify=cfg.keyserver_tls())
    except httpx.HTTPError as exc:
        return [BenchError(Exit.SERVICE, f"the key server at {base} does not answer ({exc.__class__.__name__}: "
                           f"{exc})", "start it (keyserver serve), check the URL and port (and --cacert: the "
                           "server's ca.pem), or leave out --keyserver to benchmark a throwaway server on this "
                           "machine")]
    if ready.status_code != 200:
        return [BenchError(Exit.SERVICE, f"the key server at {base} is not ready (readyz answered "
                           f"{ready.status_code})", "check its logs (database, HSM), then run kms-bench again")]
    headers = {"Authorization": f"Bearer {cfg.token}"}
    try:
        probe = httpx.get(f"{base}/api/v1/keys", params={"limit": 1}, headers=headers, timeout=10,
                          verify=cfg.keyserver_tls())
    except httpx.HTTPError as exc:
        return [BenchError(Exit.SERVICE, f"the key server at {base} failed a request: {exc}",
                           "check the server, then run kms-bench again")]
    if probe.status_code in (401, 403):
        return [BenchError(Exit.SERVICE, f"the key server at {base} refused the token ({probe.status_code})",
                           "pass a valid, unexpired API token that may list keys and generate data keys")]
    if probe.status_code != 200:
        return [BenchError(Exit.SERVICE, f"the key server at {base} answered {probe.status_code} to GET "
                           "/api/v1/keys", "check that the URL is the key server's base URL")]
    return []


def postgres(cfg: Config) -> list[BenchError]:
    """The kmip suite's Strongroom server runs on a scratch database of this server."""
    if "kmip" not in cfg.suites:
        return []
    if cfg.postgres is None:
        pg = _pg_bin()
        if pg is None or not (pg / "initdb").exists():
            return [BenchError(Exit.PRIVILEGES, "the kmip suite runs its key server on a throwaway PostgreSQL "
                               "cluster and needs PostgreSQL's server binaries", "apt-get install postgresql, or "
                               "pass --postgres URL (a server with ~250 free connections), or leave kmip out")]
        if os.geteuid() != 0:
            return [BenchError(Exit.PRIVILEGES, "the kmip suite's throwaway PostgreSQL cluster runs as the "
                               "postgres user, which needs root", "run as root, or pass --postgres URL (a server "
                               "with ~250 free connections)")]
        return []
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(cfg.postgres)
    try:
        with psycopg.connect(host=url.host, port=url.port or 5432, user=url.username, password=url.password,
                             dbname=url.database or "postgres", connect_timeout=5) as conn:
            row: Any = conn.execute("SELECT has_database_privilege(current_user, current_database(), 'CREATE')"
                                    " OR (SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = "
                                    "current_user)").fetchone()
    except psycopg.Error as exc:
        return [BenchError(Exit.SERVICE, f"the kmip suite needs a PostgreSQL server; {url.render_as_string()} is "
                           f"unreachable ({str(exc).strip().splitlines()[0]})",
                           "start PostgreSQL or pass --postgres URL (a user that may CREATE DATABASE), or leave "
                           "kmip out of --suites")]
    if not row or not row[0]:
        return [BenchError(Exit.PRIVILEGES, f"the PostgreSQL user of {url.render_as_string()} may not create "
                           "databases", "pass --postgres with a user that has CREATEDB")]
    return []


def disk(cfg: Config) -> list[BenchError]:
    need = cfg.disk_needed()
    if not need:
        return []
    where = cfg.work
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    suite, largest = max(need.items(), key=lambda kv: kv[1])
    wanted = int(largest * 1.1) + (256 << 20)  # headroom: the file system's own metadata, logs
    if free < wanted:
        return [BenchError(Exit.DISK, f"the {suite} suite needs {wanted / 2**30:.1f} GiB free on the file system "
                           f"of {where}, which has {free / 2**30:.1f} GiB",
                           "free some space, point --workdir at a larger disk, or choose smaller sizes "
                           "(--quick, --copy-sizes, --threads/--files, --pg-scale, --rotation-files)")]
    return []


def check(cfg: Config) -> list[BenchError]:
    return privileges(cfg) + keyserver(cfg) + postgres(cfg) + disk(cfg)
