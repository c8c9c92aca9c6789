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

import getpass
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import tarfile
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from keyserver import product_version
from keyserver.core.errors import CoreError, ServiceUnavailable
from keyserver.core.principal import system_context
from keyserver.ops import EXIT_UNAVAILABLE, OpsError, Reporter
from keyserver.ops.archive import (
    FORMAT_VERSION,
    MANIFEST,
    PGDUMP_MEMBER,
    PINS_FILE,
    PINS_MEMBER,
    SQLITE_MEMBER,
    TOKEN_PREFIX,
    BackupResult,
    external_hsm_note,
    hash_at,
    pg_env,
    pg_tool,
    revisions,
    server_major,
    sha256,
    softhsm_token_dir,
    sqlite_path,
    store_kind,
)
from keyserver.services import Services, build_services
from keyserver.settings import Settings
from keyserver.store.models import Kek, KekRotation


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
        revision, head = revisions(url, services.engine)
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
        head_hash = hash_at(services, status["head_seq"])
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
            "members": {name: {"sha256": sha256(path), "size": path.stat().st_size}
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
        reporter.note(external_hsm_note(hsm))
    if include_pins:
        reporter.note(f"{target} holds the token AND its PINs: whoever has the file can use every key. Keep it "
                      "encrypted, offline, under the same protection as the HSM itself.")
    elif token_dir is not None and settings.environment == "local":
        reporter.note(f"the token's PINs are not in the archive: keep {settings.data_dir / PINS_FILE} (or the "
                      "PINs you configured) apart from it; a restore needs them (`keyserver restore --pins FILE`).")
    return BackupResult(target, manifest)


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
        major = server_major(engine)
    except Exception as exc:
        raise OpsError(f"cannot reach PostgreSQL: {exc}", EXIT_UNAVAILABLE) from None
    tool = pg_tool("pg_dump", major)
    conninfo, env = pg_env(url)
    version = subprocess.run([str(tool), "--version"], capture_output=True, text=True, check=False).stdout.strip()
    r = subprocess.run([str(tool), "--format=custom", "--no-owner", "--no-privileges", f"--file={dest}",
                        f"--dbname={conninfo}"], env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise OpsError(f"pg_dump failed ({tool}): {r.stderr.strip()}", EXIT_UNAVAILABLE)
    os.chmod(dest, 0o600)
    return dest, version


