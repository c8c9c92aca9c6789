"""One guard point's control plane: the child process the manager runs per guard point.

It protects the directory, repairs what a crash left half-written, starts the native
data plane (`strongroom-fuse`, agents/guardpoint/dataplane.py) and feeds it key versions
and the policy; it relays the data plane's events to the spool, applies new definitions
live, re-wraps headers on rotation, counts files per key version (inventory.py) and
drives online re-key. No request of an
application passes through it. Its state lives in `state_dir/guardpoints/<id>.*`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.config import AgentConfig
from agents.cryptfile import FormatError, KeyVersion, read_header, rewrap_in_place
from agents.errors import AgentError
from agents.guardpoint.adoption import ProtectionRefused, adopt, initial_protection
from agents.guardpoint.dataplane import DataPlane, DataPlaneError, Event, enable_fuse_io_uring, recover_journal
from agents.guardpoint.dataplane import available as dataplane_unavailable
from agents.guardpoint.inventory import stored_files, walk
from agents.guardpoint.raw import serve_raw
from agents.guardpoint.records import WATCH_SECONDS, policy_from, read_json, write_json
from agents.guardpoint.shield import ShieldError, shield, unmount_to_shield
from agents.keyclient.client import ServerKeyring
from agents.keyclient.spool import EventSpool

log = logging.getLogger("strongroom.agent.guardpoints")
# While a version of the key is retiring, the files are counted again at least this
# often: a retirement cancelled and started again between two heartbeats changes
# nothing the agent sees, and still waits for a walk newer than its start.
RECOUNT_WHILE_RETIRING_SECONDS = 600.0


@dataclass
class _Applied:
    definition: dict[str, Any]
    active: int  # the key version new files are written under
    rekeyed: int = 0  # the last re-key generation finished
    rekeying: bool = False
    rekey: dict[str, Any] | None = None  # progress, as reported
    versions: dict[str, int] | None = None  # files per header version, from the last walk
    scanned_at: str | None = None  # when that walk finished (UTC)
    walked: float = 0.0  # time.monotonic() of that walk


def serve_guard_point(config_path: str | None, directory: str, gp_id: str) -> None:
    """Child process entry: serve guard point `gp_id` until SIGTERM or unmount.

    This process is the guard point's control plane (see the module's docstring). It
    exits non-zero when the data plane dies, so that the manager restarts it at once."""
    from agents.keyclient.client import ServerClient
    from agents.keyclient.identity import HostIdentity

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s guard point {gp_id[:8]}: %(message)s")
    config = AgentConfig.load(Path(config_path) if config_path else None)
    folder = Path(directory)
    definition = read_json(folder / f"{gp_id}.json")
    assert definition is not None
    client = ServerClient.for_host(config.server_url, HostIdentity.load_or_create(config.state_dir),
                                   timeout=config.request_timeout_seconds)
    keyring = ServerKeyring(client, ttl_seconds=config.key_cache_ttl_seconds,
                            max_entries=config.key_cache_max_entries)
    server = GuardPointServer(config, folder, gp_id, definition, keyring, EventSpool(config.spool_dir))
    server.take_over()
    if definition["mode"] == "off":
        serve_raw(server.definition_file, server.status_file, folder / f"{gp_id}.unprotect.json", keyring,
                  server.spool, gp_id, server.shield_record)
        return
    server.run()


class GuardPointServer:
    """Guard point `gp_id` served from its definition: `take_over` what a previous
    process left, then `run` until the data plane ends."""

    def __init__(self, config: AgentConfig, folder: Path, gp_id: str, definition: dict[str, Any],
                 keyring: ServerKeyring, spool: EventSpool) -> None:
        self.config, self.gp_id, self.keyring, self.spool = config, gp_id, keyring, spool
        self.definition = definition  # as started: the status before the mount names its revision
        self.definition_file, self.status_file = folder / f"{gp_id}.json", folder / f"{gp_id}.status.json"
        self.owner_file, self.shield_record = folder / f"{gp_id}.pid", folder / f"{gp_id}.shield.json"
        self.rekey_file, self.journal = folder / f"{gp_id}.rekey.json", folder / f"{gp_id}.journal"
        self.key_id = uuid.UUID(definition["key_id"])
        self.mount, self.backing = definition["path"], definition["backing_path"]
        self.state = _Applied(definition, int(definition["active_version"]))
        finished = read_json(self.rekey_file)
        if finished and finished.get("done_generation"):
            self.state.rekeyed = int(finished["done_generation"])
        self._plane: DataPlane | None = None
        self._walking = threading.Lock()  # one walk of the backing directory at a time

    @property
    def plane(self) -> DataPlane:
        assert self._plane is not None, "the data plane is not started"
        return self._plane

    def current_key(self) -> KeyVersion:
        return self.keyring.get(self.key_id, self.state.active)

    def _on_event(self, event: Event) -> None:
        self.spool.append({**event.as_audit(), "guard_point": self.gp_id,
                           "path": os.path.join(self.mount, event.path.lstrip("/"))})

    def _status(self, state_name: str, detail: str, **extra: Any) -> None:
        write_json(self.status_file, {"revision": self.definition["revision"], "state": state_name,
                                      "detail": detail, **extra})

    def take_over(self) -> None:
        """Become the guard point's process: a previous one (its supervisor died, or an
        agent that died left its data plane serving) is taken over, its FUSE connection
        aborted. Only down to the shield: until the new mount is up, the path answers
        EROFS."""
        previous = _previous_plane(self.owner_file)
        self.owner_file.write_text(str(os.getpid()))  # from here on, a previous supervisor reports nothing
        if previous is not None and not os.path.exists(f"/proc/{previous[0]}"):
            # Its supervisor died: it ends by itself and unmounts by path on the way out; had
            # we mounted anew before, that would take our mount (or the shield) away.
            _wait_gone(previous[1], self.mount)
        unmount_to_shield(self.mount)
        if previous is not None:
            _wait_gone(previous[1], self.mount)  # nothing may still write the backing files we repair and serve

    def _prepare(self) -> bool:
        """Shield the path, protect what it holds, repair what a crash left; False (the
        status says why) when the guard point cannot be served."""
        try:
            adopt(self.mount, self.backing)
            shield(self.mount, self.shield_record)
        except ProtectionRefused as exc:
            self._status("error", str(exc))
            return False
        except (ShieldError, OSError) as exc:
            self._status("error", f"{exc}: the guard point is not served until it can be shielded")
            return False
        unavailable = dataplane_unavailable()
        if unavailable:
            self._status("error", f"cannot serve the guard point: {unavailable}")
            return False
        try:
            protected = initial_protection(
                self.mount, self.backing, self.current_key(), chunk_size=int(self.definition["chunk_size"]),
                progress=lambda done, total: self._status("protecting", f"initial protection: {done}/{total} files"))
        except ProtectionRefused as exc:
            self._status("error", str(exc))
            return False
        if protected:
            self.spool.append({"event": "guardpoint.protected", "guard_point": self.gp_id, "path": self.mount,
                               "files": protected})
        for path in recover_journal(self.backing, str(self.journal), self.keyring):
            self.spool.append({"event": "guardpoint.repaired", "guard_point": self.gp_id,
                               "path": os.path.join(self.mount, path)})
        return True

    def _configure(self, p: DataPlane) -> None:
        for version in range(1, self.state.active + 1):  # files may still be under any earlier version
            try:
                p.set_key(self.keyring.get(self.key_id, version))
            except DataPlaneError:
                raise
            except Exception as exc:  # a destroyed version: its files answer ENOKEY (audited)
                log.info("key version %d not loaded: %s", version, exc)
        p.set_key(self.current_key())
        p.set_active(self.current_key())
        p.set_policy(policy_from(self.definition))

    def run(self) -> None:
        if not self._prepare():
            return
        config = self.config
        if config.fuse_io_uring and (why := enable_fuse_io_uring()):
            log.warning("guard point %s: %s; serving over /dev/fuse", self.gp_id, why)
        self._plane = DataPlane(self.backing, self.mount, chunk_size=int(self.definition["chunk_size"]),
                                journal=str(self.journal),
                                root_fd=os.open(self.mount, os.O_RDONLY | os.O_DIRECTORY), on_event=self._on_event,
                                writeback_cache=config.fuse_writeback_cache, io_uring=config.fuse_io_uring)
        try:
            self.plane.start(configure=self._configure)
        except Exception as exc:
            self._status("error", f"the data plane could not start: {exc}")
            raise SystemExit(1) from None
        signal.signal(signal.SIGTERM, lambda *_: self.plane.close_channel())  # it wipes its keys and unmounts
        if self.plane.process is not None:
            self.owner_file.write_text(f"{os.getpid()} {self.plane.process.pid}")
        threading.Thread(target=self._watch, daemon=True).start()
        self._report()
        # What the files are under now, and any left under an older version by a re-wrap
        # this process's predecessor did not finish.
        self._start_walk(self.state.active, rotation=False)
        self._maybe_rekey(self.state.definition)  # a re-key asked for before (or interrupted by) a restart
        self.spool.append({"event": "guardpoint.mounted", "guard_point": self.gp_id, "path": self.mount,
                           "revision": self.definition["revision"]})
        code = self.plane.wait()
        # The data plane's exit status tells a clean stop (0) from a crash: the console's
        # guard-point timeline shows the difference.
        self.spool.append({"event": "guardpoint.unmounted", "guard_point": self.gp_id, "path": self.mount,
                           "status": code})
        with contextlib.suppress(OSError, ValueError):
            if int(self.owner_file.read_text().split()[0]) != os.getpid():
                return  # taken over by a newer process (the agent died and came back): it reports now
        if code != 0 and self.definition_file.exists():  # not stopped by the daemon: say so, and be restarted
            write_json(self.status_file, {"revision": self.state.definition["revision"], "state": "error",
                                          "detail": f"the data plane ended with status {code}; see the agent's log"})
            raise SystemExit(1)

    def _report(self, detail: str = "") -> None:
        counted = {"versions": self.state.versions, "scanned_at": self.state.scanned_at} if self.state.scanned_at \
            else {}
        write_json(self.status_file, {"revision": self.state.definition["revision"], "state": "mounted",
                                      "detail": detail, "key_version": self.state.active, "rekey": self.state.rekey,
                                      **counted})

    def _start_walk(self, version: int, *, rotation: bool) -> None:
        threading.Thread(target=self._walk, args=(version, rotation), daemon=True).start()

    def _walk(self, active: int, rotation: bool) -> None:
        """Re-wrap every file to version `active` and count the files per header version
        (inventory.py), for the heartbeat. Walks queue up rather than overlap: each one
        that was asked for reports a count taken after it was asked."""
        with self._walking:
            if active != self.state.active:
                return  # a newer rotation came first: its walk re-wraps to that version
            try:
                version = self.keyring.get(self.key_id, active)
                done = walk(self.backing, self.key_id, active=version.version,
                            rewrap=lambda real: rewrap_in_place(real, self.keyring, version))
            except (AgentError, OSError) as exc:  # the last count stands, said so; walked again when asked
                log.error("counting the files of %s failed: %s", self.mount, exc)
                return
            retiring = self.state.definition.get("retiring_versions") or ()
            self.state.versions, self.state.scanned_at = done.report(retiring), done.scanned_at
            self.state.walked = time.monotonic()
        if rotation or done.rewrapped:
            self.spool.append({"event": "guardpoint.rewrapped", "guard_point": self.gp_id, "path": self.mount,
                               "key_version": version.version, "files": done.rewrapped})
        self._report()

    def _rekey_all(self, generation: int) -> None:
        """Re-encrypt every file that existed when re-key `generation` was asked for,
        each by the data plane while applications keep using it. The list of (file, file
        id) is kept on disk first: a file is done when its file id changed (a re-key
        makes a new one), so an interrupted run resumes where it stopped and never
        re-encrypts a file twice. New files need nothing: each has a fresh file key."""
        plan = read_json(self.rekey_file)
        if plan is None or plan.get("generation") != generation:
            files: dict[str, str] = {}
            for real in stored_files(self.backing):
                with contextlib.suppress(FormatError, OSError):
                    files[os.path.relpath(real, self.backing)] = read_header(real).file_id.hex()
            plan = {"generation": generation, "files": files}
            write_json(self.rekey_file, plan)
        # Each file is written anew beside itself: the largest one must fit, or the run
        # would stop half way on ENOSPC. Said before anything is written.
        largest = max((os.stat(os.path.join(self.backing, rel)).st_blocks * 512
                       for rel in plan["files"] if os.path.isfile(os.path.join(self.backing, rel))), default=0)
        vfs = os.statvfs(self.backing)
        if largest > vfs.f_bavail * vfs.f_frsize:
            raise OSError(errno.ENOSPC, f"re-key needs {largest} bytes free on the backing file system "
                                        f"(its largest file), {vfs.f_bavail * vfs.f_frsize} are free")
        total, skipped, damaged = len(plan["files"]), [], []
        for done, (rel, old_id) in enumerate(plan["files"].items(), start=1):
            try:
                if read_header(os.path.join(self.backing, rel)).file_id.hex() == old_id:
                    rc = self.plane.rekey(rel)
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
                self.state.rekey = {"generation": generation, "done": done, "total": total, "finished": False}
                self._report()
        self.state.rekey = {"generation": generation, "done": total, "total": total, "finished": True,
                            **({"skipped_hard_links": skipped[:100]} if skipped else {})}
        self.state.rekeyed = generation
        write_json(self.rekey_file, {**plan, "done_generation": generation})
        # Spooled before it is reported finished: whoever sees it finished finds the record.
        self.spool.append({"event": "guardpoint.rekeyed", "guard_point": self.gp_id, "path": self.mount,
                           "generation": generation, "files": total - len(skipped) - len(damaged),
                           "skipped": len(skipped) + len(damaged), "damaged": len(damaged)})
        self._report(f"re-key skipped {len(damaged)} file(s) that fail to authenticate: {', '.join(damaged[:5])}"
                     if damaged else "")

    def _maybe_rekey(self, d: dict[str, Any]) -> None:
        generation = int(d.get("rekey_generation", 0))
        if generation > self.state.rekeyed and not self.state.rekeying:
            self.state.rekeying = True
            threading.Thread(target=self._rekey_in_background, args=(generation,), daemon=True).start()

    def _rekey_in_background(self, generation: int) -> None:
        try:
            self._rekey_all(generation)
        except Exception as exc:  # reported, retried at the next definition change or restart
            log.error("re-key generation %d failed: %s", generation, exc)
            self._report(f"re-key failed: {exc}")
        finally:
            self.state.rekeying = False

    def _forget(self, versions: list[int]) -> None:
        """Destroyed on the server: wiped from the data plane and this process's cache, so
        a file still under one of them answers ENOKEY from now on, as on a fresh start."""
        for v in versions:
            if v == self.state.active:
                continue  # (the server never destroys an Active version)
            self.plane.drop_key(self.key_id, v)
            self.keyring.cache.drop(self.key_id, v)
            self.spool.append({"event": "guardpoint.key_dropped", "guard_point": self.gp_id, "path": self.mount,
                               "key_version": v})

    def _watch(self) -> None:
        seen = self.definition_file.stat().st_mtime_ns
        while True:
            time.sleep(WATCH_SECONDS)
            try:
                mtime = self.definition_file.stat().st_mtime_ns
            except FileNotFoundError:
                return  # the daemon is removing this guard point
            if mtime == seen:
                if self.state.definition.get("retiring_versions") and not self._walking.locked() \
                        and time.monotonic() - self.state.walked > RECOUNT_WHILE_RETIRING_SECONDS:
                    self.state.walked = time.monotonic()  # asked once, not at every turn while it runs
                    self._start_walk(self.state.active, rotation=False)
                continue
            seen = mtime
            new = read_json(self.definition_file)
            if new is None:
                continue
            if new["mode"] == "off":
                continue  # encryption off: the daemon replaces this mount by the raw view
            try:
                if new["revision"] != self.state.definition["revision"]:
                    self.plane.set_policy(policy_from(new))  # swapped whole in the data plane: no remount
                    self.spool.append({"event": "guardpoint.policy_applied", "guard_point": self.gp_id,
                                       "path": self.mount, "revision": new["revision"]})
                before = self.state.definition.get("retiring_versions") or []
                gone = set(new.get("destroyed_versions") or []) - set(self.state.definition.get(
                    "destroyed_versions") or [])
                self.state.definition = new
                self._forget(sorted(gone))
                self._report()
                self._maybe_rekey(new)
                if int(new["active_version"]) != self.state.active:
                    version = self.keyring.get(self.key_id, int(new["active_version"]))
                    self.plane.set_key(version)
                    self.plane.set_active(version)
                    self.state.active = version.version
                    self._start_walk(version.version, rotation=True)
                elif set(new.get("retiring_versions") or []) - set(before):
                    self._start_walk(self.state.active, rotation=False)  # a retirement waits on this count
            except Exception as exc:  # keep serving as before; retried at the next change
                self._report(f"could not apply revision {new['revision']}: {exc}")


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

