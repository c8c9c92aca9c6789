"""Serving the guard points the key server assigns to this host.

The daemon keeps, in `state_dir/guardpoints/`, one definition file per guard point
(`<id>.json`: the server's definition plus the key's Active version) and runs one child
process per guard point (`serve_guard_point`), the guard point's control plane: it starts
the compiled data plane (`strongroom-fuse`, which serves every request of applications)
and feeds it keys and the policy; a process per guard point isolates one's failure from
the others. The child watches its definition file and applies a new revision live (the
access policy is swapped whole in the data plane, no remount); when the key's Active
version moves it re-wraps every file header to it in the background while applications
keep working. It reports what it applied in `<id>.status.json`, which the daemon sends
with each heartbeat. The data plane's events (access decisions, integrity failures,
missing keys) go to the event spool.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import multiprocessing
import os
import signal
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.config import AgentConfig
from agents.cryptfile import FormatError, KeyVersion, decrypt_file, encrypt_file, read_header, rewrap_in_place
from agents.cryptfile.transform import TMP_PREFIX, atomic_replace
from agents.errors import AgentError
from agents.guardpoint.dataplane import DataPlane, DataPlaneError, Event, enable_fuse_io_uring, recover_journal
from agents.guardpoint.dataplane import available as dataplane_unavailable
from agents.guardpoint.policy import AccessPolicy, Effect, Mode, Rule
from agents.guardpoint.protect import plan
from agents.guardpoint.shield import ShieldError, mounts_at, serving, shield, unmount_to_shield, unshield
from agents.keyclient.revocation import host_revocation
from agents.keyclient.spool import EventSpool

log = logging.getLogger("strongroom.agent.guardpoints")
WATCH_SECONDS = 1.0
# A guard point's process that dies is restarted after RESTART_FIRST_SECONDS, doubling
# while it keeps dying within RESTART_RESET_SECONDS of its restart, up to the maximum.
WATCH_CRASH_SECONDS = 0.1
RESTART_FIRST_SECONDS = 0.1
RESTART_MAX_SECONDS = 30.0
RESTART_RESET_SECONDS = 60.0


def policy_from(definition: dict[str, Any]) -> AccessPolicy:
    """The server's definition as the mount's policy object."""
    rules = tuple(Rule(effect=Effect(r["effect"]), users=frozenset(r.get("users", ())),
                       uids=frozenset(r.get("uids", ())), groups=frozenset(r.get("groups", ())),
                       executables=frozenset(r.get("executables", ())), access=r.get("access", "all"),
                       audit=bool(r.get("audit", False)))
                  for r in definition.get("rules", ()))
    return AccessPolicy(mode=Mode(definition["mode"]), rules=rules, default=Effect(definition["default_effect"]))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with atomic_replace(path, mode=0o600) as f:
        f.write(json.dumps(data).encode())


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


# --- initial protection ------------------------------------------------------------------
class ProtectionRefused(AgentError):
    """The directory cannot be protected as it is; the message says what to do."""


def initial_protection(mount: str, backing: str, key: KeyVersion, *, chunk_size: int,
                       progress: Callable[[int, int], None] | None = None) -> int:
    """Make `mount` ready to be mounted over, protecting the plaintext it already holds.

    A non-empty protected directory is moved to the backing path (one rename, on the same
    file system) and an empty one put in its place, then every plaintext file in the
    backing directory is encrypted in place (agents.guardpoint.protect: write-new, fsync,
    rename). Each step can be interrupted and is simply run again at the next start:
    files already encrypted are skipped. Nothing is ever deleted. Returns the number of
    files encrypted."""
    adopt(mount, backing)
    todo = plan(Path(backing), key.key_id, protect=True)
    for done, path in enumerate(todo.files, start=1):
        encrypt_file(path, path, key, chunk_size=chunk_size)
        if progress is not None:
            progress(done, len(todo.files))
    return len(todo.files)


def adopt(mount: str, backing: str) -> None:
    """Move what `mount` holds to the backing directory (one rename on the same file
    system) and leave an empty directory with its owner and mode in its place; make the
    backing directory the agent's alone. Nothing is encrypted here."""
    os.makedirs(mount, exist_ok=True)
    os.makedirs(os.path.dirname(backing), exist_ok=True)
    if os.listdir(mount):
        if os.path.exists(backing) and os.listdir(backing):
            raise ProtectionRefused(f"both {mount} and its backing directory {backing} hold files: move the "
                                    f"files of {mount} out, or empty {backing}, then the agent mounts it")
        if os.stat(mount).st_dev != os.stat(os.path.dirname(backing) or "/").st_dev:
            raise ProtectionRefused(f"{mount} holds files and {backing} is on another file system: encrypt them "
                                    f"into it with `kms-agent encrypt`, or choose a backing_path beside {mount}")
        st = os.stat(mount)
        if os.path.exists(backing):
            os.rmdir(backing)  # empty, checked above
        os.rename(mount, backing)
        os.mkdir(mount, stat.S_IMODE(st.st_mode))
        os.chown(mount, st.st_uid, st.st_gid)
        _fsync_dirs(os.path.dirname(mount), os.path.dirname(backing))
    os.makedirs(backing, mode=0o700, exist_ok=True)
    os.chmod(backing, 0o700)  # ciphertext and names: the agent's alone


def release(mount: str, backing: str, key_id: uuid.UUID) -> bool:
    """The reverse of adopt() once a guard point is unprotected and deleted: when no file
    of its key is left encrypted and the (unmounted) path is an empty directory, the
    backing directory takes the path's place, with the path's owner and mode. Returns
    False, changing nothing, when any condition fails."""
    if _mounted(mount) or not os.path.isdir(backing) or plan(Path(backing), key_id, protect=False).files:
        return False
    if os.path.exists(mount):
        if not os.path.isdir(mount) or os.listdir(mount):
            return False
        if os.stat(mount).st_dev != os.stat(backing).st_dev:
            return False
        st = os.stat(mount)
        os.chmod(backing, stat.S_IMODE(st.st_mode))
        os.chown(backing, st.st_uid, st.st_gid)
        os.rmdir(mount)
    os.rename(backing, mount)
    _fsync_dirs(os.path.dirname(mount), os.path.dirname(backing))
    return True


def _fsync_dirs(*dirs: str) -> None:
    for d in set(dirs):  # a rename, durably
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --- the child: one mount ---------------------------------------------------------------
@dataclass
class _Applied:
    definition: dict[str, Any]
    active: int  # the key version new files are written under
    rekeyed: int = 0  # the last re-key generation finished
    rekeying: bool = False
    rekey: dict[str, Any] | None = None  # progress, as reported


def serve_guard_point(config_path: str | None, directory: str, gp_id: str) -> None:
    """Child process entry: serve guard point `gp_id` until SIGTERM or unmount.

    This process is the guard point's control plane: it protects the directory, repairs
    what a crash left half-written, starts the native data plane (`strongroom-fuse`,
    agents/guardpoint/dataplane.py) and feeds it key versions and the policy; it relays
    the data plane's events to the spool, applies new definitions live, re-wraps headers
    on rotation and drives online re-key. No request of an application passes through it.
    It exits non-zero when the data plane dies, so that the manager restarts it at once."""
    from agents.keyclient.client import ServerClient, ServerKeyring
    from agents.keyclient.identity import HostIdentity

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s guard point {gp_id[:8]}: %(message)s")
    config = AgentConfig.load(Path(config_path) if config_path else None)
    folder = Path(directory)
    definition_file, status_file = folder / f"{gp_id}.json", folder / f"{gp_id}.status.json"
    definition = _read_json(definition_file)
    assert definition is not None
    client = ServerClient.for_host(config.server_url, HostIdentity.load_or_create(config.state_dir),
                                   timeout=config.request_timeout_seconds)
    keyring = ServerKeyring(client, ttl_seconds=config.key_cache_ttl_seconds,
                            max_entries=config.key_cache_max_entries)
    spool = EventSpool(config.spool_dir)
    key_id = uuid.UUID(definition["key_id"])
    state = _Applied(definition, int(definition["active_version"]))
    finished = _read_json(folder / f"{gp_id}.rekey.json")
    if finished and finished.get("done_generation"):
        state.rekeyed = int(finished["done_generation"])

    def current_key() -> KeyVersion:
        return keyring.get(key_id, state.active)

    mount, backing = definition["path"], definition["backing_path"]

    def on_event(event: Event) -> None:
        spool.append({**event.as_audit(), "guard_point": gp_id,
                      "path": os.path.join(mount, event.path.lstrip("/"))})

    def status(state_name: str, detail: str, **extra: Any) -> None:
        _write_json(status_file, {"revision": definition["revision"], "state": state_name, "detail": detail, **extra})

    owner_file, shield_record = folder / f"{gp_id}.pid", folder / f"{gp_id}.shield.json"
    previous = _previous_plane(owner_file)
    owner_file.write_text(str(os.getpid()))  # from here on, a previous supervisor reports nothing
    if previous is not None and not os.path.exists(f"/proc/{previous[0]}"):
        # Its supervisor died: it ends by itself and unmounts by path on the way out; had
        # we mounted anew before, that would take our mount (or the shield) away.
        _wait_gone(previous[1], mount)
    # A dead data plane, or one an agent that died left serving: take it over (its FUSE
    # connection aborted). Only down to the shield: until the new mount is up, the path
    # answers EROFS.
    unmount_to_shield(mount)
    if previous is not None:
        _wait_gone(previous[1], mount)  # nothing may still write the backing files we repair and serve
    if definition["mode"] == "off":
        _serve_raw(definition_file, status_file, folder / f"{gp_id}.unprotect.json", keyring, spool, gp_id,
                   shield_record)
        return
    try:
        adopt(mount, backing)
        shield(mount, shield_record)
    except ProtectionRefused as exc:
        status("error", str(exc))
        return
    except (ShieldError, OSError) as exc:
        status("error", f"{exc}: the guard point is not served until it can be shielded")
        return
    unavailable = dataplane_unavailable()
    if unavailable:
        status("error", f"cannot serve the guard point: {unavailable}")
        return
    try:
        protected = initial_protection(mount, backing, current_key(), chunk_size=int(definition["chunk_size"]),
                                       progress=lambda done, total: status(
                                           "protecting", f"initial protection: {done}/{total} files"))
    except ProtectionRefused as exc:
        status("error", str(exc))
        return
    if protected:
        spool.append({"event": "guardpoint.protected", "guard_point": gp_id, "path": mount, "files": protected})
    journal = folder / f"{gp_id}.journal"
    for path in recover_journal(backing, str(journal), keyring):
        spool.append({"event": "guardpoint.repaired", "guard_point": gp_id, "path": os.path.join(mount, path)})
    if config.fuse_io_uring and (why := enable_fuse_io_uring()):
        log.warning("guard point %s: %s; serving over /dev/fuse", gp_id, why)
    plane = DataPlane(backing, mount, chunk_size=int(definition["chunk_size"]), journal=str(journal),
                      root_fd=os.open(mount, os.O_RDONLY | os.O_DIRECTORY), on_event=on_event,
                      writeback_cache=config.fuse_writeback_cache, io_uring=config.fuse_io_uring)
    def configure(p: DataPlane) -> None:
        for version in range(1, state.active + 1):  # files may still be under any earlier version
            try:
                p.set_key(keyring.get(key_id, version))
            except DataPlaneError:
                raise
            except Exception as exc:  # a destroyed version: its files answer ENOKEY (audited)
                log.info("key version %d not loaded: %s", version, exc)
        p.set_key(current_key())
        p.set_active(current_key())
        p.set_policy(policy_from(definition))

    try:
        plane.start(configure=configure)
    except Exception as exc:
        status("error", f"the data plane could not start: {exc}")
        raise SystemExit(1) from None
    signal.signal(signal.SIGTERM, lambda *_: plane.close_channel())  # the daemon wipes its keys and unmounts
    if plane.process is not None:
        owner_file.write_text(f"{os.getpid()} {plane.process.pid}")

    def report(detail: str = "") -> None:
        _write_json(status_file, {"revision": state.definition["revision"], "state": "mounted", "detail": detail,
                                  "key_version": state.active, "rekey": state.rekey})

    def rewrap_all(version: KeyVersion) -> None:
        done = 0
        for real in _encrypted_files(backing):
            try:
                if read_header(real).key_version != version.version and rewrap_in_place(real, keyring, version):
                    done += 1
            except (FormatError, OSError) as exc:
                log.warning("rewrap of %s skipped: %s", real, exc)
        spool.append({"event": "guardpoint.rewrapped", "guard_point": gp_id, "path": mount,
                      "key_version": version.version, "files": done})
        report()

    rekey_file_ = folder / f"{gp_id}.rekey.json"

    def rekey_all(generation: int) -> None:
        """Re-encrypt every file that existed when re-key `generation` was asked for,
        each by the data plane while applications keep using it. The list of (file, file
        id) is kept on disk first: a file is done when its file id changed (a re-key
        makes a new one), so an interrupted run resumes where it stopped and never
        re-encrypts a file twice. New files need nothing: each has a fresh file key."""
        plan = _read_json(rekey_file_)
        if plan is None or plan.get("generation") != generation:
            files: dict[str, str] = {}
            for real in _encrypted_files(backing):
                with contextlib.suppress(FormatError, OSError):
                    files[os.path.relpath(real, backing)] = read_header(real).file_id.hex()
            plan = {"generation": generation, "files": files}
            _write_json(rekey_file_, plan)
        # Each file is written anew beside itself: the largest one must fit, or the run
        # would stop half way on ENOSPC. Said before anything is written.
        largest = max((os.stat(os.path.join(backing, rel)).st_blocks * 512
                       for rel in plan["files"] if os.path.isfile(os.path.join(backing, rel))), default=0)
        vfs = os.statvfs(backing)
        if largest > vfs.f_bavail * vfs.f_frsize:
            raise OSError(errno.ENOSPC, f"re-key needs {largest} bytes free on the backing file system "
                                        f"(its largest file), {vfs.f_bavail * vfs.f_frsize} are free")
        total, skipped, damaged = len(plan["files"]), [], []
        for done, (rel, old_id) in enumerate(plan["files"].items(), start=1):
            try:
                if read_header(os.path.join(backing, rel)).file_id.hex() == old_id:
                    rc = plane.rekey(rel)
                    if rc == errno.EMLINK:
                        skipped.append(rel)  # hard-linked: re-keying one name would split the file
                    elif rc == errno.EIO:
                        damaged.append(rel)  # fails to authenticate (audited): the others go on
                        log.warning("re-key of %s skipped: it fails to authenticate", rel)
                    elif rc not in (0, errno.ENOENT):
                        raise OSError(rc, f"re-key of {rel}: {os.strerror(rc)}")
            except (FormatError, FileNotFoundError) as exc:  # gone or replaced since: its key is new or gone
                log.info("re-key of %s skipped: %s", rel, exc)
            if done % 16 == 0 and done < total:
                state.rekey = {"generation": generation, "done": done, "total": total, "finished": False}
                report()
        state.rekey = {"generation": generation, "done": total, "total": total, "finished": True,
                       **({"skipped_hard_links": skipped[:100]} if skipped else {})}
        state.rekeyed = generation
        _write_json(rekey_file_, {**plan, "done_generation": generation})
        # Spooled before it is reported finished: whoever sees it finished finds the record.
        spool.append({"event": "guardpoint.rekeyed", "guard_point": gp_id, "path": mount,
                      "generation": generation, "files": total - len(skipped) - len(damaged),
                      "skipped": len(skipped) + len(damaged), "damaged": len(damaged)})
        report(f"re-key skipped {len(damaged)} file(s) that fail to authenticate: {', '.join(damaged[:5])}"
               if damaged else "")

    def maybe_rekey(d: dict[str, Any]) -> None:
        generation = int(d.get("rekey_generation", 0))
        if generation > state.rekeyed and not state.rekeying:
            state.rekeying = True

            def run() -> None:
                try:
                    rekey_all(generation)
                except Exception as exc:  # reported, retried at the next definition change or restart
                    log.error("re-key generation %d failed: %s", generation, exc)
                    report(f"re-key failed: {exc}")
                finally:
                    state.rekeying = False

            threading.Thread(target=run, daemon=True).start()

    def watch() -> None:
        seen = definition_file.stat().st_mtime_ns
        while True:
            time.sleep(WATCH_SECONDS)
            try:
                mtime = definition_file.stat().st_mtime_ns
            except FileNotFoundError:
                return  # the daemon is removing this guard point
            if mtime == seen:
                continue
            seen = mtime
            new = _read_json(definition_file)
            if new is None:
                continue
            if new["mode"] == "off":
                continue  # encryption off: the daemon replaces this mount by the raw view
            try:
                if new["revision"] != state.definition["revision"]:
                    plane.set_policy(policy_from(new))  # swapped whole in the data plane: no remount
                    spool.append({"event": "guardpoint.policy_applied", "guard_point": gp_id, "path": mount,
                                  "revision": new["revision"]})
                state.definition = new
                report()
                maybe_rekey(new)
                if int(new["active_version"]) != state.active:
                    version = keyring.get(key_id, int(new["active_version"]))
                    plane.set_key(version)
                    plane.set_active(version)
                    state.active = version.version
                    threading.Thread(target=rewrap_all, args=(version,), daemon=True).start()
            except Exception as exc:  # keep serving as before; retried at the next change
                report(f"could not apply revision {new['revision']}: {exc}")

    threading.Thread(target=watch, daemon=True).start()
    report()
    maybe_rekey(state.definition)  # a re-key asked for before (or interrupted by) a restart
    spool.append({"event": "guardpoint.mounted", "guard_point": gp_id, "path": mount,
                  "revision": definition["revision"]})
    code = plane.wait()
    # The data plane's exit status tells a clean stop (0) from a crash: the console's
    # guard-point timeline shows the difference.
    spool.append({"event": "guardpoint.unmounted", "guard_point": gp_id, "path": mount, "status": code})
    with contextlib.suppress(OSError, ValueError):
        if int(owner_file.read_text().split()[0]) != os.getpid():
            return  # taken over by a newer process (the agent died and came back): it reports now
    if code != 0 and definition_file.exists():  # not stopped by the daemon: say what happened, and be restarted
        _write_json(status_file, {"revision": state.definition["revision"], "state": "error",
                                  "detail": f"the data plane ended with status {code}; see the agent's log"})
        raise SystemExit(1)


def _previous_plane(owner_file: Path) -> tuple[int, int] | None:
    """(supervisor, data plane) pids the guard point's last supervisor wrote, if it got
    as far as starting its data plane."""
    try:
        supervisor, plane = (int(x) for x in owner_file.read_text().split())
    except (OSError, ValueError):
        return None
    return supervisor, plane


def _wait_gone(plane: int, mount: str, timeout: float = 10.0) -> None:
    """Until data plane `plane` of `mount` has exited (bounded: a plane stuck in the
    kernel is reported and passed by)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            argv = Path(f"/proc/{plane}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{plane}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            return  # gone
        if not argv or not argv[0].endswith(b"strongroom-fuse") or os.fsencode(mount) not in argv:
            return  # the pid was reused
        if state == "Z":
            return  # ended, not yet reaped
        time.sleep(0.02)
    log.warning("the previous data plane (pid %d) of %s has not exited; serving it anew regardless", plane, mount)


def _encrypted_files(backing: str) -> Iterator[str]:
    """Regular files under the backing directory, temporary files of an interrupted
    whole-file operation excepted."""
    for dirpath, _, names in os.walk(backing):
        for name in names:
            real = os.path.join(dirpath, name)
            if not name.startswith(TMP_PREFIX) and not os.path.islink(real) and os.path.isfile(real):
                yield real


# --- mode off: the backing files as stored -------------------------------------------------
def _serve_raw(definition_file: Path, status_file: Path, unprotect_file: Path, keyring: Any, spool: Any,
               gp_id: str, shield_record: Path) -> None:
    """Encryption off: the backing directory is bind-mounted at the path, so applications
    see the files as stored (ciphertext stays ciphertext; new files are written in clear,
    and encrypted by initial protection when the mode returns to enforce or learn). Only
    where the server's policy says `off`: never as a fallback. Here an unprotect request
    decrypts every file of the key in place (resumable: a file is decrypted with
    write-new, fsync, rename, and files already clear are skipped)."""
    first = _read_json(definition_file)
    assert first is not None
    definition: dict[str, Any] = first
    mount, backing, key_id = definition["path"], definition["backing_path"], uuid.UUID(definition["key_id"])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    finished = (_read_json(unprotect_file) or {}).get("done_generation", 0)
    progress: dict[str, Any] | None = None

    def report(state: str = "off", detail: str = "encryption off: applications see the backing files as stored"
               ) -> None:
        _write_json(status_file, {"revision": definition["revision"], "state": state, "detail": detail,
                                  "unprotect": progress})

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
    spool.append({"event": "guardpoint.mounted", "guard_point": gp_id, "path": mount,
                  "revision": definition["revision"], "mode": "off"})
    try:
        while not stop.is_set():
            new = _read_json(definition_file)
            if new is None and not definition_file.exists():
                return  # deleted: the daemon unmounts and, once unprotected, releases the path
            if new is not None and new["revision"] != definition["revision"]:
                definition = new
                report()
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
                _write_json(unprotect_file, {"done_generation": generation})
                report()
                spool.append({"event": "guardpoint.unprotected", "guard_point": gp_id, "path": mount,
                              "generation": generation, "files": total})
            stop.wait(WATCH_SECONDS)
    finally:
        _unmount(mount)
        spool.append({"event": "guardpoint.unmounted", "guard_point": gp_id, "path": mount})


# --- the parent: reconcile definitions with running mounts ---------------------------------
@dataclass
class _Running:
    process: multiprocessing.process.BaseProcess
    path: str
    started: float  # time.monotonic()


class GuardPointManager:
    """Runs one process per guard point and keeps it running: a process that dies (a
    crash, a kill -9) is restarted at once by a watcher thread, not at the next
    heartbeat, and the crash is reported (`guardpoint.serve_failed`, audited as an
    error). Crashing again soon after a restart backs off, up to RESTART_MAX_SECONDS."""

    def __init__(self, config: AgentConfig, config_path: Path | None) -> None:
        self._config_path = str(config_path) if config_path else None
        self._dir = config.state_dir / "guardpoints"
        self._dir.mkdir(mode=0o700, exist_ok=True)
        self._running: dict[str, _Running] = {}
        self._definitions: dict[str, dict[str, Any]] = {}
        self._ctx = multiprocessing.get_context("spawn")
        self._spool = EventSpool(config.spool_dir)
        self._lock = threading.RLock()
        self._crashes: dict[str, tuple[int, float]] = {}  # guard point -> (crashes in a row, restart due at)
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="guard-point-watch", daemon=True)
        self._watcher.start()

    def _start(self, gp_id: str) -> None:
        d = self._definitions[gp_id]
        refused = host_revocation(self._dir.parent)
        if refused is not None:
            # Seen once, remembered: no restart after a crash, no start at a heartbeat, even
            # with keys still cached. The path stays shielded.
            self._running.pop(gp_id, None)
            _write_json(self._dir / f"{gp_id}.status.json", {"revision": d.get("revision"), "state": "error",
                                                            "detail": refused})
            return
        p = self._ctx.Process(target=serve_guard_point, args=(self._config_path, str(self._dir), gp_id),
                              name=f"guard point {d['path']}", daemon=False)
        p.start()
        self._running[gp_id] = _Running(p, d["path"], time.monotonic())

    def _watch(self) -> None:
        while not self._stopping.wait(WATCH_CRASH_SECONDS):
            with self._lock:
                for gp_id, running in list(self._running.items()):
                    code = running.process.exitcode
                    if code is None or code == 0 or gp_id not in self._definitions:
                        continue  # alive, or ended on purpose (its status file says why)
                    now = time.monotonic()
                    crashes, due = self._crashes.get(gp_id, (0, 0.0))
                    if due == 0.0:  # a new crash: report it once, and decide when to restart
                        lived = now - running.started
                        crashes = 1 if lived > RESTART_RESET_SECONDS else crashes + 1
                        due = now + min(RESTART_MAX_SECONDS, RESTART_FIRST_SECONDS * 2 ** (crashes - 1))
                        self._crashes[gp_id] = (crashes, due)
                        log.error("guard point %s stopped unexpectedly (exit %s); restarting it", running.path, code)
                        self._spool.append({"event": "guardpoint.serve_failed", "guard_point": gp_id,
                                            "path": running.path, "exit_code": code, "crashes_in_a_row": crashes})
                    if now >= due:
                        self._crashes[gp_id] = (crashes, 0.0)
                        _unmount(running.path)  # "transport endpoint is not connected" until then
                        self._start(gp_id)

    def apply(self, definitions: list[dict[str, Any]], active_versions: dict[str, int | None]) -> None:
        """Make the running mounts match the server's definitions."""
        with self._lock:
            self._apply(definitions, active_versions)

    def _apply(self, definitions: list[dict[str, Any]], active_versions: dict[str, int | None]) -> None:
        wanted = {d["id"]: {**d, "active_version": active_versions.get(d["key_id"])} for d in definitions}
        for gp_id in set(self._running) - set(wanted):
            self._stop(gp_id)
        for gp_id, d in wanted.items():
            if d["active_version"] is None:
                self._definitions[gp_id] = d
                _write_json(self._dir / f"{gp_id}.status.json", {
                    "revision": d["revision"], "state": "error",
                    "detail": f"key {d['key_name']} has no Active version"})
                continue
            before = self._definitions.get(gp_id)
            if before is not None and gp_id in self._running and (before["mode"] == "off") != (d["mode"] == "off"):
                self._halt(gp_id)  # encryption turned on or off: the FUSE mount and the raw view trade places
            if before != d:
                _write_json(self._dir / f"{gp_id}.json", d)
            self._definitions[gp_id] = d
            running = self._running.get(gp_id)
            if running is None:
                self._start(gp_id)
            elif running.process.exitcode == 0:  # ended on purpose: tried again at each heartbeat
                _unmount(running.path)
                self._start(gp_id)
        for record in self._dir.glob("*.shield.json"):  # guard points deleted while the agent was down
            gp_id = record.name.split(".", 1)[0]
            path = (_read_json(record) or {}).get("path")
            if gp_id not in wanted and gp_id not in self._running and isinstance(path, str):
                unshield(path, record)
                (self._dir / f"{gp_id}.pid").unlink(missing_ok=True)

    def reports(self) -> list[dict[str, Any]]:
        """What each guard point applied, for the heartbeat."""
        with self._lock:
            return self._reports()

    def _reports(self) -> list[dict[str, Any]]:
        out = []
        for gp_id, d in self._definitions.items():
            status = _read_json(self._dir / f"{gp_id}.status.json") or {"state": "unmounted", "detail": "starting"}
            running = self._running.get(gp_id)
            state = status.get("state", "unmounted")
            if state in ("mounted", "off", "unprotecting") and (running is None or not running.process.is_alive()):
                state = "unmounted"
            out.append({"id": gp_id, "revision": status.get("revision"), "path": d["path"], "key": d["key_name"],
                        "state": state, "detail": str(status.get("detail", ""))[:500], "rekey": status.get("rekey"),
                        "unprotect": status.get("unprotect")})
        return out

    def _stop(self, gp_id: str, *, deleted: bool = True) -> None:  # with self._lock held
        """Stop serving a guard point; `deleted`: the server no longer defines it (an
        unprotected one then gives its path back its plaintext: release())."""
        d = self._definitions.pop(gp_id, None)
        if not deleted:  # the daemon stops: the state files are what a restart resumes from (re-key, unprotect)
            self._halt(gp_id)
            return
        unprotected = (_read_json(self._dir / f"{gp_id}.unprotect.json") or {}).get("done_generation", 0)
        for suffix in ("json", "status.json", "rekey.json", "unprotect.json"):
            (self._dir / f"{gp_id}.{suffix}").unlink(missing_ok=True)
        path = self._halt(gp_id)
        # Deleted: the path is no longer a guard point, so the shield goes and the bare
        # directory gets its owner and mode back.
        shielded_ok = unshield(path, self._dir / f"{gp_id}.shield.json")
        (self._dir / f"{gp_id}.pid").unlink(missing_ok=True)
        if d is not None and d["mode"] == "off" and unprotected and unprotected == d.get("unprotect_generation") \
                and shielded_ok:
            if release(d["path"], d["backing_path"], uuid.UUID(d["key_id"])):
                log.info("guard point %s released: its files are back at the path, in clear", d["path"])
            else:
                log.warning("guard point %s was unprotected but could not be released: the files stay in %s",
                            d["path"], d["backing_path"])

    def _halt(self, gp_id: str) -> str:
        """Stop the guard point's process and unmount down to the shield; its path."""
        self._crashes.pop(gp_id, None)
        running = self._running.pop(gp_id)
        if running.process.is_alive() and running.process.pid:
            os.kill(running.process.pid, signal.SIGTERM)
        running.process.join(timeout=10)
        _unmount(running.path)
        if running.process.is_alive():
            running.process.kill()
            running.process.join(timeout=5)
        return running.path

    def stop_all(self) -> None:
        self._stopping.set()
        with self._lock:
            for gp_id in list(self._running):
                self._stop(gp_id, deleted=False)


def local_reports(state_dir: Path) -> list[dict[str, Any]]:
    """The guard points as the daemon last left them (for `kms-agent status`)."""
    out = []
    for definition_file in sorted((state_dir / "guardpoints").glob("*-*-*-*-*.json")):
        if definition_file.name.count(".") != 1:  # <id>.status/.rekey/.unprotect.json are not definitions
            continue
        d = _read_json(definition_file)
        if d is None:
            continue
        status = _read_json(definition_file.with_suffix(".status.json")) or {}
        mounted = serving(d["path"])
        out.append({"path": d["path"], "key": d["key_name"], "revision": status.get("revision"),
                    "state": "mounted" if mounted else status.get("state", "unmounted"),
                    "detail": status.get("detail", "")})
    return out


def _mounted(path: str) -> bool:
    """Anything mounted at `path`, the shield included (from the mount table:
    os.path.ismount cannot stat a mount whose process died and says False)."""
    return bool(mounts_at(path))


def _unmount(path: str) -> None:
    """A FUSE mount or mode off's bind mount, down to the shield; lazily if busy:
    applications holding files keep them until they close."""
    unmount_to_shield(path)
