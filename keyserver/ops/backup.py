"""`keyserver backup` and `keyserver restore`: one archive holding a consistent copy of
the database and of the SoftHSM2 token, described by a manifest (docs/operations.md
"Backup and restore").

The archive is a plain tar file (mode 0600):

    manifest.json        format, versions, Alembic revision, store, KEKs, audit head and
                         last signed checkpoint, SHA-256 and size of every other member
    database/strongroom.db      the embedded store (SQLite's online backup)
    database/strongroom.pgdump  PostgreSQL (pg_dump's custom format)
    token/...            SoftHSM2's file store (absent for any other PKCS#11 module: the
                         manifest names the keys to back up with the vendor's tools)
    pins/hsm-pins.json   only with --include-pins

Not compressed on purpose: the checksums are the integrity check, and a damaged byte
is reported as the member it is in, not as an undecodable stream (a PostgreSQL dump is
compressed already).
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import tarfile
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import Engine, make_url

from keyserver import product_version
from keyserver.core.audit import GENESIS_HASH
from keyserver.core.errors import CoreError, ServiceUnavailable
from keyserver.core.principal import system_context
from keyserver.ops import EXIT_BROKEN_CHAIN, EXIT_UNAVAILABLE, OpsError, Reporter
from keyserver.services import Services, build_services
from keyserver.settings import SOFTHSM_MODULE, Settings
from keyserver.store import db
from keyserver.store.models import AuditEvent, Kek, KekRotation

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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _revisions(url: str, engine: Engine) -> tuple[str | None, str]:
    """The database's Alembic revision (None: no schema) and this release's head."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(db.alembic_config(url)).get_current_head()
    assert head is not None
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    return current, head


# --- PostgreSQL's own tools ---------------------------------------------------------------
def _pg_env(url: str) -> tuple[str, dict[str, str]]:
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


def _server_major(engine: Engine) -> int:
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


# --- backup -------------------------------------------------------------------------------
def backup(settings: Settings, out: Path, *, include_pins: bool, reporter: Reporter) -> BackupResult:
    """Write one archive: audit record first, then the database, then the token."""
    url = settings.effective_database_url
    kind = store_kind(url)
    if kind == "sqlite" and not sqlite_path(url).exists():
        raise OpsError(f"no database at {sqlite_path(url)}: set STRONGROOM_DATA_DIR (or STRONGROOM_DATABASE_URL) "
                       "to the server's")
    target = _archive_path(out)
    reporter.step("opening the database and the HSM")
    try:
        services = build_services(settings, migrate=False)
    except Exception as exc:
        raise OpsError(f"cannot open the store: {exc}", EXIT_UNAVAILABLE) from None
    try:
        return _backup(services, url, kind, target, include_pins=include_pins, reporter=reporter)
    except ServiceUnavailable as exc:
        raise OpsError(exc.message, EXIT_UNAVAILABLE) from None
    finally:
        services.close()


def _archive_path(out: Path) -> Path:
    name = f"strongroom-backup-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.tar"
    target = out / name if out.is_dir() else out
    if target.exists():
        raise OpsError(f"{target} exists: choose another --out (a backup is never overwritten)")
    if not target.parent.is_dir():
        raise OpsError(f"directory {target.parent} does not exist: create it or choose another --out")
    return target


def _kek_state(services: Services) -> list[tuple[str, str]]:
    """The KEKs as the database sees them, refusing while a rotation runs: during one the
    token gains a KEK and stored versions move to it, batch after batch."""
    with services.db() as s:
        running = s.execute(select(KekRotation.to_kek_id).where(KekRotation.state == "running")).first()
        keks = [(k.kek_id, k.state) for k in s.execute(select(Kek).order_by(Kek.created_at)).scalars()]
    if running is not None:
        raise OpsError(f"a KEK rotation (to {running[0]}) is running: wait for it to finish (`keyserver rotate-kek` "
                       "shows it and resumes it), then back up")
    return keks


def _backup(services: Services, url: str, kind: str, target: Path, *, include_pins: bool,
            reporter: Reporter) -> BackupResult:
    settings = services.settings
    try:
        revision, head = _revisions(url, services.engine)
    except Exception as exc:
        raise OpsError(f"cannot read the database's schema revision: {exc}", EXIT_UNAVAILABLE) from None
    if revision is None:
        raise OpsError("the database has no Strongroom schema: nothing to back up (is STRONGROOM_DATABASE_URL "
                       "the server's?)")
    if revision != head:
        raise OpsError(f"the database is at schema revision {revision}, this keyserver's is {head}: back up with "
                       "the release that serves this database (before upgrading)")
    keks = _kek_state(services)
    token_dir = softhsm_token_dir(settings)
    backup_id = str(uuid.uuid4())
    created = datetime.now(UTC)

    # The record goes into the chain before the dump, so the restored chain holds it.
    reporter.step("recording the backup in the audit chain")
    ctx = system_context("cli")
    try:
        services.audit.record_now(ctx, action="system.backup", outcome="allowed", object_type="backup",
                                  object_id=backup_id, details={"archive": target.name, "store": kind,
                                                                "token": "softhsm2" if token_dir else "external"})
        services.audit.flush()
        status = services.audit.status()
        head_hash = _hash_at(services, status["head_seq"])
    except CoreError as exc:
        raise OpsError(exc.message, EXIT_UNAVAILABLE) from None
    except Exception as exc:
        from hsm import HsmError

        if isinstance(exc, HsmError):
            raise OpsError(f"HSM: {exc}", EXIT_UNAVAILABLE) from None
        raise

    work = Path(tempfile.mkdtemp(prefix=".strongroom-backup-", dir=target.parent))
    try:
        os.chmod(work, 0o700)
        members: dict[str, Path] = {}
        if kind == "sqlite":
            reporter.step("copying the embedded database (SQLite online backup)")
            members[SQLITE_MEMBER] = _sqlite_backup(sqlite_path(url), work / "strongroom.db")
            pg_dump_version = None
        else:
            reporter.step("dumping the PostgreSQL database (pg_dump)")
            path, pg_dump_version = _pg_dump(url, services.engine, work / "strongroom.pgdump")
            members[PGDUMP_MEMBER] = path
        hsm = _hsm_section(services, keks)
        if token_dir is not None:
            reporter.step(f"copying the SoftHSM2 token directory {token_dir}")
            from hsm.softhsm import copy_token_dir

            try:
                copied = copy_token_dir(token_dir, work / "token")
            except (OSError, RuntimeError) as exc:
                raise OpsError(f"cannot copy the token: {exc}") from None
            for relative in copied:
                members[TOKEN_PREFIX + relative] = work / "token" / relative
        if _kek_state(services) != keks:
            raise OpsError("the KEKs changed while the backup was taken (a rotation or retirement started): "
                           "back up again once it has finished")
        if include_pins:
            pins = _local_pins(settings)
            members[PINS_MEMBER] = pins
        reporter.step("writing the archive")
        manifest = {
            "format_version": FORMAT_VERSION,
            "product": "strongroom",
            "product_version": product_version(),
            "backup_id": backup_id,
            "created_at": created.isoformat().replace("+00:00", "Z"),
            "created_by": f"{getpass.getuser()}@{socket.gethostname()}",
            "alembic_revision": revision,
            "store": {"kind": kind, "member": next(iter(members)),
                      **({"pg_dump_version": pg_dump_version} if pg_dump_version else {})},
            "hsm": hsm,
            "audit": {"head_seq": status["head_seq"], "head_hash": head_hash,
                      "last_checkpoint": status["last_checkpoint"], "hmac_key_id": settings.audit_hmac_key_id,
                      "checkpoint_key_fingerprint": status["key_fingerprint"]},
            "pins_included": include_pins,
            "members": {name: {"sha256": _sha256(path), "size": path.stat().st_size}
                        for name, path in sorted(members.items())},
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        partial = target.with_name(target.name + ".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
                tar.add(work / MANIFEST, arcname=MANIFEST)
                for name, path in sorted(members.items()):
                    tar.add(path, arcname=name)
            raw.flush()
            os.fsync(raw.fileno())
        partial.replace(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if token_dir is None:
        reporter.note(_external_hsm_note(hsm))
    if include_pins:
        reporter.note(f"{target} holds the token AND its PINs: whoever has the file can use every key. Keep it "
                      "encrypted, offline, under the same protection as the HSM itself.")
    elif token_dir is not None and settings.environment == "local":
        reporter.note(f"the token's PINs are not in the archive: keep {settings.data_dir / PINS_FILE} (or the "
                      "PINs you configured) apart from it; a restore needs them (`keyserver restore --pins FILE`).")
    return BackupResult(target, manifest)


def _hash_at(services: Services, seq: int) -> str:
    if seq == 0:
        return GENESIS_HASH
    with services.db() as s:
        return str(s.execute(select(AuditEvent.hash).where(AuditEvent.seq == seq)).scalar_one())


def _hsm_section(services: Services, keks: list[tuple[str, str]]) -> dict[str, Any]:
    s = services.settings
    token_dir = softhsm_token_dir(s)
    return {
        "kind": "softhsm2" if token_dir is not None else "external",
        "module": s.hsm_module,
        "token_label": s.hsm_token_label,
        "keks": [{"kek_id": k, "state": state} for k, state in keks],
        # Token-resident keys besides the KEKs: the audit chain's HMAC key and the
        # checkpoint signing key (both created at first start, never extractable).
        "audit_hmac_key_id": s.audit_hmac_key_id,
        "audit_checkpoint_key_id": s.audit_checkpoint_key_id,
    }


def _external_hsm_note(hsm: dict[str, Any]) -> str:
    keys = [k["kek_id"] for k in hsm["keks"] if k["state"] != "destroyed"]
    return (f"the HSM's keys are NOT in this archive (module {hsm['module']} is not SoftHSM2): back up token "
            f"{hsm['token_label']!r} with the vendor's own key backup or cloning — the KEKs {', '.join(keys)} (RSA "
            f"key pairs, labels and ids as named), the audit HMAC key {hsm['audit_hmac_key_id']!r} and the checkpoint "
            f"signing key {hsm['audit_checkpoint_key_id']!r}. Without them this database cannot be decrypted and "
            "its audit chain cannot be verified; the manifest lists them.")


def _local_pins(settings: Settings) -> Path:
    pins = settings.data_dir / PINS_FILE
    if not pins.exists():
        raise OpsError(f"--include-pins: no {pins} (the PINs come from your configuration, not the data "
                       "directory): keep them in your secret store instead")
    return pins


def _sqlite_backup(source: Path, dest: Path) -> Path:
    """SQLite's online backup API, in one step: a read transaction over the whole copy
    (WAL lets the server keep writing meanwhile), so the copy is one consistent state.
    Several smaller steps would restart whenever the server commits in between."""
    src = sqlite3.connect(source, timeout=30)
    dst = sqlite3.connect(dest)
    try:
        src.backup(dst)
        # A self-contained file: no WAL beside it.
        dst.execute("PRAGMA journal_mode=DELETE")
        check = dst.execute("PRAGMA integrity_check").fetchone()[0]
        if check != "ok":
            raise OpsError(f"the copy of {source} failed SQLite's integrity check: {check}")
    finally:
        dst.close()
        src.close()
    return dest


def _pg_dump(url: str, engine: Engine, dest: Path) -> tuple[Path, str]:
    """pg_dump's custom format: one snapshot of the whole database (it runs in one
    repeatable-read transaction), without owners or grants so it restores into a
    database owned by anyone."""
    try:
        major = _server_major(engine)
    except Exception as exc:
        raise OpsError(f"cannot reach PostgreSQL: {exc}", EXIT_UNAVAILABLE) from None
    tool = pg_tool("pg_dump", major)
    conninfo, env = _pg_env(url)
    version = subprocess.run([str(tool), "--version"], capture_output=True, text=True, check=False).stdout.strip()
    r = subprocess.run([str(tool), "--format=custom", "--no-owner", "--no-privileges", f"--file={dest}",
                        f"--dbname={conninfo}"], env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise OpsError(f"pg_dump failed ({tool}): {r.stderr.strip()}", EXIT_UNAVAILABLE)
    os.chmod(dest, 0o600)
    return dest, version


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
            if path.stat().st_size != want["size"] or _sha256(path) != want["sha256"]:
                raise OpsError(f"{archive}: checksum mismatch in {name} (SHA-256 {_sha256(path)}, the manifest says "
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


# --- restore ------------------------------------------------------------------------------
def restore(settings: Settings, archive: Path, *, pins: Path | None, reporter: Reporter) -> RestoreResult:
    """Into an empty data directory (and, for PostgreSQL, an empty database): check the
    archive first, then write, migrate when it is older, and verify the whole chain."""
    url = settings.effective_database_url
    kind = store_kind(url)
    data_dir = settings.data_dir.resolve()
    reporter.step(f"checking {archive} against its manifest")
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with opened(archive, work_parent=data_dir.parent) as (manifest, work):
        reporter.note(describe(manifest))
        _check_target(settings, manifest, url, kind, pins)
        migrated_from = _check_revision(url, manifest)
        reporter.step(f"restoring into {data_dir}")
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(data_dir, 0o700)
        _restore_pins(settings, manifest, work, pins)
        token_dir = softhsm_token_dir(settings)
        if manifest["hsm"]["kind"] == "softhsm2":
            assert token_dir is not None
            _restore_token(manifest, work, token_dir)
        else:
            reporter.note(_external_hsm_note(manifest["hsm"]).replace("are NOT in this archive", "were not in the "
                          "archive") + " They must already be in the HSM this server uses.")
        if kind == "sqlite":
            reporter.step("restoring the embedded database")
            dest = sqlite_path(url)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / SQLITE_MEMBER, dest)
            os.chmod(dest, 0o600)
        else:
            reporter.step("restoring the PostgreSQL database (pg_restore)")
            _pg_restore(url, work / PGDUMP_MEMBER)
    if migrated_from is not None:
        reporter.step(f"migrating the schema from {migrated_from} to this release's")
        db.upgrade(url)
    reporter.step("verifying the KEKs and the whole audit chain")
    try:
        services = build_services(settings, migrate=False)
    except Exception as exc:
        raise OpsError(f"cannot open the restored store: {exc}", EXIT_UNAVAILABLE) from None
    try:
        return _verify_restored(services, manifest, archive, migrated_from)
    except ServiceUnavailable as exc:
        raise OpsError(exc.message, EXIT_UNAVAILABLE) from None
    finally:
        services.close()


def check(archive: Path, reporter: Reporter) -> dict[str, Any]:
    """`restore --check`: the archive against its manifest, nothing written."""
    reporter.step(f"checking {archive} against its manifest")
    with opened(archive) as (manifest, _work):
        return manifest


def _check_target(settings: Settings, manifest: dict[str, Any], url: str, kind: str, pins: Path | None) -> None:
    if manifest["store"]["kind"] != kind:
        where = ("set STRONGROOM_DATABASE_URL to an empty PostgreSQL database" if manifest["store"]["kind"] ==
                 "postgresql" else "unset STRONGROOM_DATABASE_URL (the embedded store)")
        raise OpsError(f"this is a backup of a {manifest['store']['kind']} store and the target is {kind}: {where}; "
                       "a backup restores into the same kind of store")
    data_dir = settings.data_dir.resolve()
    if data_dir.exists() and any(data_dir.iterdir()):
        raise OpsError(f"the data directory {data_dir} is not empty: restore into a new, empty directory "
                       "(STRONGROOM_DATA_DIR), or move this one away first; nothing was written")
    token_dir = softhsm_token_dir(settings)
    if manifest["hsm"]["kind"] == "softhsm2":
        if token_dir is None:
            raise OpsError(f"the backup holds a SoftHSM2 token but this server is configured for "
                           f"{settings.hsm_module}: restore with the SoftHSM2 module (the default)")
        if token_dir.exists() and any(p.name not in (".strongroom-bootstrap.lock",) for p in token_dir.iterdir()):
            raise OpsError(f"the token directory {token_dir} is not empty: restore into an empty one; nothing "
                           "was written")
    if kind == "sqlite":
        dest = sqlite_path(url)
        if dest.exists():
            raise OpsError(f"{dest} exists: restore into a new, empty data directory; nothing was written")
    else:
        _check_empty_database(url)
    if manifest["hsm"]["kind"] == "softhsm2" and settings.environment == "local" and \
            not (settings.hsm_user_pin and settings.hsm_so_pin) and not manifest.get("pins_included") and pins is None:
        raise OpsError("the archive carries no HSM PINs (by design: the token and its PINs together are every key): "
                       f"give the PIN file you keep apart (`--pins /safe/place/{PINS_FILE}`), or set "
                       "STRONGROOM_HSM_USER_PIN and STRONGROOM_HSM_SO_PIN; nothing was written")
    if pins is not None:
        _read_pins(pins)


def _check_empty_database(url: str) -> None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            n = conn.execute(text("SELECT count(*) FROM information_schema.tables WHERE table_schema NOT IN "
                                  "('pg_catalog', 'information_schema')")).scalar_one()
    except Exception as exc:
        raise OpsError(f"cannot reach the target database: {exc}", EXIT_UNAVAILABLE) from None
    finally:
        engine.dispose()
    if n:
        name = make_url(url).database
        raise OpsError(f"the database {name!r} is not empty ({n} tables): create an empty one (`createdb "
                       "NEW_NAME`) and point STRONGROOM_DATABASE_URL at it; nothing was written")


def _check_revision(url: str, manifest: dict[str, Any]) -> str | None:
    """None when the backup is at this release's head; its revision when it is older
    (migrations run after the restore); refused when this release does not know it."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    script = ScriptDirectory.from_config(db.alembic_config(url))
    revision = manifest["alembic_revision"]
    try:
        if script.get_revision(revision) is None:
            raise CommandError(revision)
    except CommandError:
        raise OpsError(f"the backup's schema revision {revision} is unknown to this keyserver (a newer release made "
                       f"it): restore with strongroom {manifest['product_version']} or newer") from None
    return None if revision == script.get_current_head() else str(revision)


_PIN_KEYS = ("user_pin", "so_pin")


def _read_pins(path: Path) -> dict[str, str]:
    try:
        pins = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise OpsError(f"cannot read the PIN file {path}: {exc}") from None
    if not isinstance(pins, dict) or not all(isinstance(pins.get(k), str) for k in _PIN_KEYS):
        raise OpsError(f"{path} is not a PIN file: it must be JSON with user_pin and so_pin, as {PINS_FILE} is")
    return {k: pins[k] for k in _PIN_KEYS}


def _restore_pins(settings: Settings, manifest: dict[str, Any], work: Path, pins: Path | None) -> None:
    """The local environment reads its PINs from the data directory (and would make new
    ones, useless for the restored token, if the file were missing)."""
    source = pins if pins is not None else (work / PINS_MEMBER if manifest.get("pins_included") else None)
    if source is None or settings.environment != "local":
        return
    values = _read_pins(source)
    fd = os.open(settings.data_dir / PINS_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(values, f)


def _restore_token(manifest: dict[str, Any], work: Path, token_dir: Path) -> None:
    from hsm.softhsm import prepare_token_dir

    prepare_token_dir(token_dir)
    for name in sorted(manifest["members"]):
        if not name.startswith(TOKEN_PREFIX):
            continue
        relative = name[len(TOKEN_PREFIX):]
        dest = token_dir / relative
        dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copyfile(work / name, dest)
        os.chmod(dest, 0o600)
        if dest.suffix == ".object":
            # SoftHSM2 locks an object through its empty .lock file beside it.
            dest.with_suffix(".lock").touch(mode=0o600)


def _pg_restore(url: str, dump: Path) -> None:
    engine = create_engine(url)
    try:
        major = _server_major(engine)
    except Exception as exc:
        raise OpsError(f"cannot reach PostgreSQL: {exc}", EXIT_UNAVAILABLE) from None
    finally:
        engine.dispose()
    tool = pg_tool("pg_restore", major)
    conninfo, env = _pg_env(url)
    # One transaction: a failed restore leaves the database empty, ready for another try.
    r = subprocess.run([str(tool), "--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction",
                        f"--dbname={conninfo}", str(dump)], env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise OpsError(f"pg_restore failed ({tool}): {r.stderr.strip()}; the database was left empty")
    # A dump carries no planner statistics: until autovacuum gets round to the restored
    # tables, PostgreSQL would plan the audit log's searches blind (whole-table joins).
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("ANALYZE"))
    finally:
        engine.dispose()


def _verify_restored(services: Services, manifest: dict[str, Any], archive: Path,
                     migrated_from: str | None) -> RestoreResult:
    from hsm import HsmError

    try:
        present = {k.kek_id for k in services.hsm.list_keks()}
    except HsmError as exc:
        raise OpsError(f"HSM: {exc}", EXIT_UNAVAILABLE) from None
    needed = [k["kek_id"] for k in manifest["hsm"]["keks"] if k["state"] in ("active", "retiring")]
    absent = [k for k in needed if k not in present]
    if absent:
        raise OpsError(f"the HSM lacks the KEKs {', '.join(absent)} that the restored database needs: restore the "
                       "token's keys (the vendor's backup, or this archive's token) and run `keyserver verify-audit "
                       "--full`", EXIT_UNAVAILABLE)
    audit = manifest["audit"]
    cp = audit.get("last_checkpoint")
    try:
        # The manifest's checkpoint as an outside copy: the restored chain must hold it,
        # signed by the same key, unchanged.
        result = services.audit.verify(full=True, outside=[cp] if cp else [])
    except HsmError as exc:
        raise OpsError(f"HSM: {exc}", EXIT_UNAVAILABLE) from None
    if not result.ok:
        raise OpsError(f"audit chain BROKEN at record {result.first_broken_seq}: {result.reason} "
                       f"({result.checked} records verified before it). The restored data is in place but must not "
                       "be trusted: investigate, or restore another backup", EXIT_BROKEN_CHAIN)
    if _hash_at(services, int(audit["head_seq"])) != audit["head_hash"]:
        raise OpsError(f"record {audit['head_seq']} in the restored chain is not the one the manifest names: the "
                       "database is not the one this archive's manifest describes", EXIT_BROKEN_CHAIN)
    services.audit.record_now(system_context("cli"), action="system.restore", outcome="allowed",
                              object_type="backup", object_id=str(manifest["backup_id"]),
                              details={"archive": archive.name, "backup_created_at": manifest["created_at"],
                                       "backup_head_seq": audit["head_seq"], "migrated_from": migrated_from})
    services.audit.flush()
    return RestoreResult(manifest, migrated_from, result.checked, services.audit.status()["head_seq"])

