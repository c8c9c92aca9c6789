"""What `keyserver backup` writes and `keyserver restore` reads: the archive's members
and manifest, where the store and the token are, PostgreSQL's own tools, and opening
an archive with every member checked against the manifest."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.engine import Engine, make_url

from keyserver.core.audit import GENESIS_HASH
from keyserver.ops import OpsError
from keyserver.services import Services
from keyserver.settings import SOFTHSM_MODULE, Settings
from keyserver.store import db
from keyserver.store.models import AuditEvent

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SQLITE_MEMBER = "database/strongroom.db"
PGDUMP_MEMBER = "database/strongroom.pgdump"
TOKEN_PREFIX = "token/"  # noqa: S105 - a directory in the archive
PINS_MEMBER = "pins/hsm-pins.json"
PINS_FILE = "hsm-pins.json"
PG_BIN_ROOT = Path("/usr/lib/postgresql")


@dataclass(frozen=True)
class BackupResult:
    path: Path
    manifest: dict[str, Any]


@dataclass(frozen=True)
class RestoreResult:
    manifest: dict[str, Any]
    migrated_from: str | None  # the backup's revision when migrations ran, else None
    records_verified: int
    head_seq: int


# --- where things are ---------------------------------------------------------------------
def store_kind(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


def sqlite_path(url: str) -> Path:
    database = make_url(url).database
    if not database or database == ":memory:":
        raise OpsError(f"{url} is not a database file: nothing to back up")
    return Path(database)


def softhsm_token_dir(settings: Settings) -> Path | None:
    """The SoftHSM2 token directory the server uses, or None for any other module. Worked
    out as Settings.hsm_config does, without its side effect of making local PINs."""
    if settings.hsm_module != SOFTHSM_MODULE and "softhsm" not in Path(settings.hsm_module).name:
        return None
    if settings.hsm_softhsm_token_dir is not None:
        return settings.hsm_softhsm_token_dir.resolve()
    conf = os.environ.get("SOFTHSM2_CONF")
    if conf:
        from hsm.softhsm import token_dir_from_conf

        return token_dir_from_conf(Path(conf))
    if settings.environment == "local":
        return (settings.data_dir / "tokens").resolve()
    return None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def revisions(url: str, engine: Engine) -> tuple[str | None, str]:
    """The database's Alembic revision (None: no schema) and this release's head."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(db.alembic_config(url)).get_current_head()
    assert head is not None
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    return current, head


# --- PostgreSQL's own tools ---------------------------------------------------------------
def pg_env(url: str) -> tuple[str, dict[str, str]]:
    """libpq connection string for pg_dump/pg_restore, with the password in the
    environment (never on a command line other users can read in ps)."""
    from psycopg.conninfo import make_conninfo

    u = make_url(url)
    params: dict[str, Any] = {k: v for k, v in u.query.items() if isinstance(v, str)}
    for name, value in (("host", u.host), ("port", u.port), ("user", u.username), ("dbname", u.database)):
        if value is not None:
            params[name] = str(value)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    if u.password:
        env["PGPASSWORD"] = str(u.password)
    return make_conninfo(**params), env


def server_major(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SHOW server_version_num")).scalar_one()) // 10000


def pg_tool(name: str, major: int) -> Path:
    """pg_dump or pg_restore for a server of version `major`: that version's, else the
    nearest newer one (an older pg_dump refuses a newer server, a newer one reads it)."""
    candidates = []
    for bindir in PG_BIN_ROOT.glob("*/bin"):
        with contextlib.suppress(ValueError):
            candidates.append((int(bindir.parent.name), bindir / name))
    usable = sorted((v, p) for v, p in candidates if v >= major and p.exists())
    if usable:
        return usable[0][1]
    found = sorted(v for v, p in candidates if p.exists())
    have = f" (found {name} for {', '.join(map(str, found))} only)" if found else ""
    raise OpsError(f"no {name} for PostgreSQL {major} in {PG_BIN_ROOT}/*/bin{have}: install the client of the "
                   f"server's version (Debian/Ubuntu: apt-get install postgresql-client-{major})")



# --- reading an archive -------------------------------------------------------------------
@contextlib.contextmanager
def opened(archive: Path, *, work_parent: Path | None = None) -> Iterator[tuple[dict[str, Any], Path]]:
    """The archive's manifest and a directory holding its members, every one checked
    against the manifest's SHA-256 and size; removed afterwards."""
    if not archive.is_file():
        raise OpsError(f"no archive at {archive}")
    work = Path(tempfile.mkdtemp(prefix=".strongroom-restore-", dir=work_parent))
    try:
        os.chmod(work, 0o700)
        try:
            with tarfile.open(archive, mode="r:") as tar:
                names = []
                for member in tar.getmembers():
                    if not member.isfile():
                        raise OpsError(f"{archive}: member {member.name!r} is not a regular file: not a Strongroom "
                                       "backup (or a damaged one)")
                    names.append(member.name)
                tar.extractall(work, filter="data")
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise OpsError(f"{archive} is not a readable tar archive ({exc}): the file is damaged or truncated; "
                           "use another copy of the backup") from None
        try:
            manifest = json.loads((work / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise OpsError(f"{archive}: the manifest is missing or unreadable ({exc}): the archive is damaged; "
                           "use another copy of the backup") from None
        if not isinstance(manifest, dict) or manifest.get("product") != "strongroom":
            raise OpsError(f"{archive} is not a Strongroom backup")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise OpsError(f"{archive} is backup format {manifest.get('format_version')}; this keyserver reads "
                           f"format {FORMAT_VERSION}: restore with the release that made it")
        listed = manifest.get("members", {})
        extra = set(names) - set(listed) - {MANIFEST}
        missing = set(listed) - set(names)
        if extra or missing:
            raise OpsError(f"{archive} does not match its manifest (missing: {sorted(missing) or 'none'}, "
                           f"unlisted: {sorted(extra) or 'none'}): the archive is damaged or was altered")
        for name, want in sorted(listed.items()):
            path = work / name
            if path.stat().st_size != want["size"] or sha256(path) != want["sha256"]:
                raise OpsError(f"{archive}: checksum mismatch in {name} (SHA-256 {sha256(path)}, the manifest says "
                               f"{want['sha256']}): the archive is damaged or was altered; use another copy of the "
                               "backup")
        yield manifest, work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def describe(manifest: dict[str, Any]) -> str:
    audit, hsm = manifest["audit"], manifest["hsm"]
    cp = audit.get("last_checkpoint")
    keks = ", ".join(k["kek_id"] for k in hsm["keks"])
    return (f"backup {manifest['backup_id']} of {manifest['created_at']} by {manifest['created_by']} "
            f"(strongroom {manifest['product_version']}, schema {manifest['alembic_revision']}, "
            f"{manifest['store']['kind']} store, {'SoftHSM2 token' if hsm['kind'] == 'softhsm2' else 'external HSM'} "
            f"{hsm['token_label']!r}, KEKs {keks}; audit head {audit['head_seq']}"
            + (f", last signed checkpoint {cp['checkpoint']} at record {cp['seq']}" if cp else "") + ")")


# --- shared by backup and restore -------------------------------------------------------
def hash_at(services: Services, seq: int) -> str:
    if seq == 0:
        return GENESIS_HASH
    with services.db() as s:
        return str(s.execute(select(AuditEvent.hash).where(AuditEvent.seq == seq)).scalar_one())


def external_hsm_note(hsm: dict[str, Any]) -> str:
    keys = [k["kek_id"] for k in hsm["keks"] if k["state"] != "destroyed"]
    return (f"the HSM's keys are NOT in this archive (module {hsm['module']} is not SoftHSM2): back up token "
            f"{hsm['token_label']!r} with the vendor's own key backup or cloning — the KEKs {', '.join(keys)} (RSA "
            f"key pairs, labels and ids as named), the audit HMAC key {hsm['audit_hmac_key_id']!r} and the checkpoint "
            f"signing key {hsm['audit_checkpoint_key_id']!r}. Without them this database cannot be decrypted and "
            "its audit chain cannot be verified; the manifest lists them.")
