"""`keyserver restore`: an archive back into an empty data directory, checked member
by member, migrated when it is from an older release, and verified (KEKs in the HSM,
the audit chain) before the server may start on it. The archive: keyserver/ops/archive.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from keyserver.core.errors import ServiceUnavailable
from keyserver.core.principal import system_context
from keyserver.ops import EXIT_BROKEN_CHAIN, EXIT_UNAVAILABLE, OpsError, Reporter
from keyserver.ops.archive import (
    PGDUMP_MEMBER,
    PINS_FILE,
    PINS_MEMBER,
    SQLITE_MEMBER,
    TOKEN_PREFIX,
    RestoreResult,
    describe,
    external_hsm_note,
    hash_at,
    opened,
    pg_env,
    pg_tool,
    server_major,
    softhsm_token_dir,
    sqlite_path,
    store_kind,
)
from keyserver.services import Services, build_services
from keyserver.settings import Settings
from keyserver.store import db


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
            reporter.note(external_hsm_note(manifest["hsm"]).replace("are NOT in this archive", "were not in the "
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
        major = server_major(engine)
    except Exception as exc:
        raise OpsError(f"cannot reach PostgreSQL: {exc}", EXIT_UNAVAILABLE) from None
    finally:
        engine.dispose()
    tool = pg_tool("pg_restore", major)
    conninfo, env = pg_env(url)
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
    if hash_at(services, int(audit["head_seq"])) != audit["head_hash"]:
        raise OpsError(f"record {audit['head_seq']} in the restored chain is not the one the manifest names: the "
                       "database is not the one this archive's manifest describes", EXIT_BROKEN_CHAIN)
    services.audit.record_now(system_context("cli"), action="system.restore", outcome="allowed",
                              object_type="backup", object_id=str(manifest["backup_id"]),
                              details={"archive": archive.name, "backup_created_at": manifest["created_at"],
                                       "backup_head_seq": audit["head_seq"], "migrated_from": migrated_from})
    services.audit.flush()
    return RestoreResult(manifest, migrated_from, result.checked, services.audit.status()["head_seq"])

