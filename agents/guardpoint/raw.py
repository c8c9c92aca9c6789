"""A guard point in mode `off`: the backing files as stored, bind-mounted at the path,
and the unprotect that decrypts them in place."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

from agents.cryptfile import decrypt_file
from agents.guardpoint.adoption import ProtectionRefused, adopt
from agents.guardpoint.inventory import UNREADABLE, walk
from agents.guardpoint.protect import plan
from agents.guardpoint.records import WATCH_SECONDS, read_json, write_json
from agents.guardpoint.shield import ShieldError, shield, unmount_to_shield

log = logging.getLogger("strongroom.agent.guardpoints")


def serve_raw(definition_file: Path, status_file: Path, unprotect_file: Path, keyring: Any, spool: Any,
               gp_id: str, shield_record: Path) -> None:
    """Encryption off: the backing directory is bind-mounted at the path, so applications
    see the files as stored (ciphertext stays ciphertext; new files are written in clear,
    and encrypted by initial protection when the mode returns to enforce or learn). Only
    where the server's policy says `off`: never as a fallback. Here an unprotect request
    decrypts every file of the key in place (resumable: a file is decrypted with
    write-new, fsync, rename, and files already clear are skipped). Files are counted per
    key version as stored (inventory.py; not re-wrapped: applications see them as they
    are) at the start, when a version of the key starts retiring and after an unprotect;
    files in clear are the mode's own, not reported as unreadable."""
    first = read_json(definition_file)
    assert first is not None
    definition: dict[str, Any] = first
    mount, backing, key_id = definition["path"], definition["backing_path"], uuid.UUID(definition["key_id"])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    finished = (read_json(unprotect_file) or {}).get("done_generation", 0)
    progress: dict[str, Any] | None = None
    counted: dict[str, Any] = {}
    last: dict[str, Any] = {}

    def report(state: str = "off", detail: str = "encryption off: applications see the backing files as stored"
               ) -> None:
        last.update(state=state, detail=detail)
        write_json(status_file, {"revision": definition["revision"], "state": state, "detail": detail,
                                  "unprotect": progress, **counted})

    def count() -> None:
        try:
            done = walk(backing, key_id)
        except OSError as exc:  # the last count stands
            log.error("counting the files of %s failed: %s", mount, exc)
            return
        versions = done.report(definition.get("retiring_versions") or ())
        versions.pop(UNREADABLE, None)
        counted.update(versions=versions, scanned_at=done.scanned_at)
        report(**last)

    def count_in_background() -> None:
        threading.Thread(target=count, daemon=True).start()

    try:
        adopt(mount, backing)
        owner = shield(mount, shield_record)  # the bind mount goes on it: a crash uncovers the shield only
        os.chmod(backing, owner.mode)  # the raw view's root is the backing directory: the path's owner and mode
        os.chown(backing, owner.uid, owner.gid)
    except (ProtectionRefused, ShieldError, OSError) as exc:
        report("error", str(exc))
        return
    bound = subprocess.run(["mount", "--bind", backing, mount], capture_output=True, text=True, check=False)
    if bound.returncode != 0:
        report("error", f"could not bind {backing} at {mount}: {bound.stderr.strip()} (the agent runs as root?)")
        return
    report()
    count_in_background()
    spool.append({"event": "guardpoint.mounted", "guard_point": gp_id, "path": mount,
                  "revision": definition["revision"], "mode": "off"})
    try:
        while not stop.is_set():
            new = read_json(definition_file)
            if new is None and not definition_file.exists():
                return  # deleted: the daemon unmounts and, once unprotected, releases the path
            if new is not None:
                newly_retiring = set(new.get("retiring_versions") or ()) - set(
                    definition.get("retiring_versions") or ())
                revised, definition = new["revision"] != definition["revision"], new
                if revised:
                    report()
                if newly_retiring:
                    count_in_background()  # a retirement waits on this count
            generation = int(definition.get("unprotect_generation", 0))
            if generation > finished:
                todo = plan(Path(backing), key_id, protect=False)
                total = len(todo.files)
                for done, path in enumerate(todo.files, start=1):
                    if stop.is_set():
                        return  # resumed at the next start: decrypted files are skipped
                    try:
                        decrypt_file(path, path, keyring)
                    except Exception as exc:  # reported; retried at the next start
                        progress = {"generation": generation, "done": done - 1, "total": total, "finished": False}
                        report("error", f"unprotect stopped at {path}: {exc}")
                        return
                    if done % 16 == 0 or done == total:
                        progress = {"generation": generation, "done": done, "total": total, "finished": done == total}
                        report("unprotecting", f"decrypting in place: {done}/{total} files")
                finished = generation
                progress = {"generation": generation, "done": total, "total": total, "finished": True}
                write_json(unprotect_file, {"done_generation": generation})
                report()
                count_in_background()  # in clear now: under no version
                spool.append({"event": "guardpoint.unprotected", "guard_point": gp_id, "path": mount,
                              "generation": generation, "files": total})
            stop.wait(WATCH_SECONDS)
    finally:
        unmount_to_shield(mount)  # lazily if busy: applications keep open files until they close
        spool.append({"event": "guardpoint.unmounted", "guard_point": gp_id, "path": mount})
