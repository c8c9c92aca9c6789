"""Serving the guard points the key server assigns to this host.

The daemon keeps, in `state_dir/guardpoints/`, one definition file per guard point
(`<id>.json`: the server's definition plus the key's Active version) and runs one child
process per guard point (`serve_guard_point` in serve.py; mode off in raw.py), the guard
point's control plane: it starts the compiled data plane (`strongroom-fuse`, which
serves every request of applications) and feeds it keys and the policy; a process per
guard point isolates one's failure from the others. The child watches its definition
file and applies a new revision live (the access policy is swapped whole in the data
plane, no remount); when the key's Active version moves it re-wraps every file header
to it in the background while applications keep working. It reports what it applied in
`<id>.status.json`, which the daemon sends with each heartbeat. The data plane's events
(access decisions, integrity failures, missing keys) go to the event spool.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.config import AgentConfig
from agents.guardpoint.adoption import release
from agents.guardpoint.inventory import UNREADABLE
from agents.guardpoint.records import read_json, write_json
from agents.guardpoint.serve import serve_guard_point
from agents.guardpoint.shield import serving, unmount_to_shield, unshield
from agents.keyclient.revocation import host_revocation
from agents.keyclient.spool import EventSpool

log = logging.getLogger("strongroom.agent.guardpoints")
# A guard point's process that dies is restarted after RESTART_FIRST_SECONDS, doubling
# while it keeps dying within RESTART_RESET_SECONDS of its restart, up to the maximum.
WATCH_CRASH_SECONDS = 0.1
RESTART_FIRST_SECONDS = 0.1
RESTART_MAX_SECONDS = 30.0
RESTART_RESET_SECONDS = 60.0


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
        # The server lists `retiring_versions` with its keys: it takes files per version in
        # a report too (decision 0024). A server without it refuses fields it does not know.
        self._counts_taken = False
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
            write_json(self._dir / f"{gp_id}.status.json", {"revision": d.get("revision"), "state": "error",
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
                        unmount_to_shield(running.path)  # "transport endpoint is not connected" until then
                        self._start(gp_id)

    def apply(self, definitions: list[dict[str, Any]], active_versions: dict[str, int | None],
              retiring_versions: dict[str, list[int]] | None = None,
              destroyed_versions: dict[str, list[int]] | None = None) -> None:
        """Make the running mounts match the server's definitions. `retiring_versions`
        (per key id; None: the server does not say) reaches each guard point's process
        through its definition file: a version newly retiring makes it count its files
        again. So do `destroyed_versions`: the process wipes them from its data plane."""
        with self._lock:
            self._counts_taken = retiring_versions is not None
            self._apply(definitions, active_versions, retiring_versions or {}, destroyed_versions or {})

    def _apply(self, definitions: list[dict[str, Any]], active_versions: dict[str, int | None],
               retiring_versions: dict[str, list[int]], destroyed_versions: dict[str, list[int]]) -> None:
        wanted = {d["id"]: {**d, "active_version": active_versions.get(d["key_id"]),
                            "retiring_versions": sorted(retiring_versions.get(d["key_id"], [])),
                            "destroyed_versions": sorted(destroyed_versions.get(d["key_id"], []))}
                  for d in definitions}
        for gp_id in set(self._running) - set(wanted):
            self._stop(gp_id)
        for gp_id, d in wanted.items():
            if d["active_version"] is None:
                self._definitions[gp_id] = d
                write_json(self._dir / f"{gp_id}.status.json", {
                    "revision": d["revision"], "state": "error",
                    "detail": f"key {d['key_name']} has no Active version"})
                continue
            before = self._definitions.get(gp_id)
            if before is not None and gp_id in self._running and (before["mode"] == "off") != (d["mode"] == "off"):
                self._halt(gp_id)  # encryption turned on or off: the FUSE mount and the raw view trade places
            if before != d:
                write_json(self._dir / f"{gp_id}.json", d)
            self._definitions[gp_id] = d
            running = self._running.get(gp_id)
            if running is None:
                self._start(gp_id)
            elif running.process.exitcode == 0:  # ended on purpose: tried again at each heartbeat
                unmount_to_shield(running.path)
                self._start(gp_id)
        for record in self._dir.glob("*.shield.json"):  # guard points deleted while the agent was down
            gp_id = record.name.split(".", 1)[0]
            path = (read_json(record) or {}).get("path")
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
            status = read_json(self._dir / f"{gp_id}.status.json") or {"state": "unmounted", "detail": "starting"}
            running = self._running.get(gp_id)
            state = status.get("state", "unmounted")
            if state in ("mounted", "off", "unprotecting") and (running is None or not running.process.is_alive()):
                state = "unmounted"
            report = {"id": gp_id, "revision": status.get("revision"), "path": d["path"], "key": d["key_name"],
                      "state": state, "detail": str(status.get("detail", ""))[:500], "rekey": status.get("rekey"),
                      "unprotect": status.get("unprotect")}
            counted = status.get("versions")
            if self._counts_taken and isinstance(counted, dict) and status.get("scanned_at"):
                # The last walk's count, whatever the state now: it is what the files were
                # under when it finished, and `scanned_at` says when that was. Files whose
                # header names no version of the key go apart, as a count of their own: the
                # server shows them and a retirement's statement names them.
                report["versions"] = {v: n for v, n in counted.items() if v.isdigit()}
                report["scanned_at"] = status["scanned_at"]
                unreadable = counted.get(UNREADABLE, 0)
                if isinstance(unreadable, int) and not isinstance(unreadable, bool) and unreadable >= 0:
                    report["unreadable"] = unreadable  # anything else is not a count: the server hears none
            out.append(report)
        return out

    def _stop(self, gp_id: str, *, deleted: bool = True) -> None:  # with self._lock held
        """Stop serving a guard point; `deleted`: the server no longer defines it (an
        unprotected one then gives its path back its plaintext: release())."""
        d = self._definitions.pop(gp_id, None)
        if not deleted:  # the daemon stops: the state files are what a restart resumes from (re-key, unprotect)
            self._halt(gp_id)
            return
        unprotected = (read_json(self._dir / f"{gp_id}.unprotect.json") or {}).get("done_generation", 0)
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
        unmount_to_shield(running.path)
        if running.process.is_alive():
            running.process.kill()
            running.process.join(timeout=5)
        return running.path

    def stop_all(self, refused: str | None = None) -> None:
        """Stop every guard point, each path left on its shield. `refused`: why the host may
        serve none (its revocation), written into every guard point's status after its
        process is gone. Without it the status would keep whatever the process wrote last
        ("mounted", or a data plane's crash when the revocation and a kill -9 come
        together), and the daemon stands down before its crash watcher ever says why."""
        self._stopping.set()
        with self._lock:
            definitions = dict(self._definitions)
            for gp_id in list(self._running):
                self._stop(gp_id, deleted=False)
            if refused is not None:
                for gp_id, d in definitions.items():
                    write_json(self._dir / f"{gp_id}.status.json", {"revision": d.get("revision"), "state": "error",
                                                                    "detail": refused})


def local_reports(state_dir: Path) -> list[dict[str, Any]]:
    """The guard points as the daemon last left them (for `kms-agent status`)."""
    out = []
    for definition_file in sorted((state_dir / "guardpoints").glob("*-*-*-*-*.json")):
        if definition_file.name.count(".") != 1:  # <id>.status/.rekey/.unprotect.json are not definitions
            continue
        d = read_json(definition_file)
        if d is None:
            continue
        status = read_json(definition_file.with_suffix(".status.json")) or {}
        mounted = serving(d["path"])
        out.append({"path": d["path"], "key": d["key_name"], "revision": status.get("revision"),
                    "state": "mounted" if mounted else status.get("state", "unmounted"),
                    "detail": status.get("detail", "")})
    return out
