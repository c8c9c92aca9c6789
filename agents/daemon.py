"""The agent daemon (`kms-agent run`): heartbeats, guard points, event shipping, revocation.

Every heartbeat reports the host (OS, agent version, guard points) and ships the event
spool, keeps this host's guard points mounted as the server defines them
(agents/guardpoint/manager.py) and tells the server of a volume re-key it believes
running that no longer runs here (killed with its process). A key version the server
lists as retiring (decision 0024) reaches the guard points, which count their files per
version again, and each local volume sealed under it is re-sealed under the Active
version. The server's answer carries
its clock, checked against ours, and the interval to beat at. When the server says this
host is revoked, the daemon drops every cached key at once, unmounts its guard points
and stops (exit status 6: restarting cannot help, re-enrollment can). While the server
is unreachable it keeps beating, and the key cache keeps serving until its TTL ends. A
revocation seen by any of the agent's processes (a volume command, a guard point) is
remembered on disk (agents/keyclient/revocation.py) and stops the daemon the same way,
at its next turn, whether the server answers or not; with that record the daemon does
not start at all until the host is enrolled again.

Any other failure of a beat (a full or read-only state or spool directory, a 4xx answer,
a guard point that cannot be applied, an answer the agent does not understand) does not
stop the daemon: stopping would end revocation, re-keying and event shipping on this
host. It is logged once, with what to do, written to `state_dir/daemon.json` (shown by
`kms-agent status`), and the daemon beats again after a bounded backoff; what a guard
point checks does not depend on the beat, so nothing serves with fewer checks meanwhile.
"""

from __future__ import annotations

import errno
import logging
import os
import platform
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agents.errors import AgentError
from agents.guardpoint.manager import GuardPointManager
from agents.guardpoint.records import write_json
from agents.keyclient.cache import ServerUnreachable
from agents.keyclient.client import HostRevoked, ServerClient, ServerKeyring, ServerRefused
from agents.keyclient.revocation import RevocationLedger, host_refusal_message
from agents.keyclient.spool import EventSpool
from agents.volume.manager import VolumeManager

log = logging.getLogger("strongroom.agent")
MAX_CLOCK_SKEW_SECONDS = 120.0
# A beat that failed is tried again after the interval, doubled at each failure in a row
# up to this many intervals (and never more than MAX_BACKOFF_SECONDS): a local fault is not
# hammered, and its repair is seen within minutes.
BACKOFF_INTERVALS = 4
MAX_BACKOFF_SECONDS = 300.0
STATUS_FILE = "daemon.json"  # in state_dir: what `kms-agent status` shows of the daemon
_FIXES = {errno.ENOSPC: "free space on that file system", errno.EDQUOT: "raise the quota or free space",
          errno.EROFS: "remount that file system read-write",
          errno.EPERM: "clear its immutable attribute (lsattr; chattr -i) or fix its owner and mode",
          errno.EACCES: "fix its owner and mode (the daemon runs as root)", errno.ENOTDIR: "it must be a directory",
          errno.ENOENT: "restore it (the agent's state and spool live under state_dir)"}


def os_description() -> str:
    return f"{platform.system()} {platform.release()} ({platform.machine()})"


def clock_skew(server_time: str, now: datetime | None = None) -> float:
    """Seconds this host's clock is ahead of the server's (negative: behind)."""
    theirs = datetime.fromisoformat(server_time)
    return ((now or datetime.now(UTC)) - theirs).total_seconds()


def describe_failure(exc: Exception) -> str:
    """A failed beat in one line: what went wrong and what the operator should do."""
    if isinstance(exc, ServerRefused):
        return (f"{exc.describe()}: the key server refuses this agent's heartbeat; see its audit log for this host "
                "and check that the agent's version matches the server's")
    if isinstance(exc, OSError):
        name = errno.errorcode.get(exc.errno or 0, "error")
        where = f"{exc.filename}: " if exc.filename else ""
        fix = _FIXES.get(exc.errno or 0, "repair that file system")
        return (f"{where}{exc.strerror or exc} ({name}): {fix}; events wait in the spool and are shipped once it "
                "works again")
    if isinstance(exc, AgentError):
        return f"{exc.describe()}: fix what it names; the daemon keeps trying"
    return (f"unexpected failure in a heartbeat ({type(exc).__name__}: {exc}): an answer this agent does not "
            "understand (do the agent's and the server's versions match?) or a bug to report with the traceback "
            "logged with it")


def retiring_versions(keys: list[dict[str, Any]]) -> dict[str, list[int]] | None:
    """The versions retiring per key id (decision 0024); None when the server's key list
    does not carry them at all (a server from before retirement, which also refuses
    per-version counts in a heartbeat)."""
    if not any("retiring_versions" in k for k in keys):
        return None
    return {str(k["key_id"]): [int(v) for v in k.get("retiring_versions") or []] for k in keys}


def destroyed_versions(keys: list[dict[str, Any]]) -> dict[str, list[int]]:
    """The destroyed versions per key id: wiped from every cache and data plane here, so a
    destroyed version stops decrypting on this host at the next beat, not when a cache
    entry expires or a guard point restarts."""
    return {str(k["key_id"]): [int(v) for v in k.get("destroyed_versions") or []] for k in keys}


class AgentDaemon:
    def __init__(self, client: ServerClient, keyring: ServerKeyring, spool: EventSpool, *,
                 guard_points: GuardPointManager | None = None,
                 revocations: RevocationLedger | None = None, volumes: VolumeManager | None = None,
                 status_file: Path | None = None) -> None:
        self._client = client
        self._revocations = revocations
        self._keyring = keyring
        self._spool = spool
        self._manager = guard_points
        self._volumes = volumes
        self._tag: str | None = None
        self._definitions: list[dict[str, Any]] = []
        self.interval = 30.0
        self.revoked = False
        self.last_error: str | None = None  # what the last beat failed of, with what to do
        self.failing_since: datetime | None = None
        self.failed_beats = 0  # in a row
        self.last_ok: datetime | None = None
        self._status_file = status_file
        self._status_unwritable: str | None = None

    def beat(self) -> dict[str, Any]:
        """One heartbeat and one spool flush. Raises HostRevoked (after dropping the
        cache) or ServerUnreachable; any other failure after the heartbeat is raised
        once the spool has been shipped (a guard point that cannot be applied does not
        hold back the audit events)."""
        reports = self._manager.reports() if self._manager else None
        try:
            answer = self._client.heartbeat(os_name=os_description(), guard_points=reports)
        except HostRevoked as exc:
            self._stand_down(self._host_refusal() or exc.describe())
            raise
        failure: Exception | None = None
        try:
            self._apply(answer)
        except (HostRevoked, ServerUnreachable):
            raise
        except Exception as exc:  # raised below, after the spool is shipped
            failure = exc
        try:
            sent = self._spool.send(self._client.send_events, rejected=(ServerRefused,))
        except Exception:
            if failure is None:
                raise
            log.debug("the spool did not ship either", exc_info=True)
            sent = 0
        if sent:
            log.info("shipped %d events", sent)
        if failure is not None:
            raise failure
        return answer

    def _apply(self, answer: dict[str, Any]) -> None:
        """What the server's answer asks of this host: destroyed versions wiped, guard
        points and volumes brought to the server's definitions, the clock checked."""
        self.interval = float(answer.get("heartbeat_seconds", self.interval))
        # Every beat: a rotation moves a key's Active version, and a retirement marks one
        # retiring, without touching the guard point or the volume.
        keys = self._client.list_keys() if (self._manager or self._volumes) and self._host_refusal() is None else []
        retiring = retiring_versions(keys)
        destroyed = destroyed_versions(keys)
        for key_id, versions in destroyed.items():
            for v in versions:
                self._keyring.cache.drop(uuid.UUID(key_id), v)
        if self._manager is not None and self._host_refusal() is None:
            if answer.get("guard_points_tag") != self._tag:
                self._definitions = self._client.guard_points()
                self._tag = answer.get("guard_points_tag")
            active = {k["key_id"]: k["active_version"] for k in keys}
            self._manager.apply(self._definitions, active, retiring, destroyed)
        if self._volumes is not None and self._host_refusal() is None:
            try:  # a re-key killed with its process is told to the server here, not left "rekeying"
                self._volumes.check_rekeys()
                self._reseal_retiring(retiring or {}, str(answer.get("host_id") or "") or None)
            except (HostRevoked, ServerUnreachable):
                raise
            except AgentError as exc:
                log.warning("volumes: %s", exc.describe())
        skew = clock_skew(answer["server_time"])  # last: a malformed time must not hold back the rest
        if abs(skew) > MAX_CLOCK_SKEW_SECONDS:
            log.warning("this host's clock is %.0f s %s the key server's: fix NTP, or certificates and "
                        "audit times will be wrong", abs(skew), "ahead of" if skew > 0 else "behind")

    def _reseal_retiring(self, retiring: dict[str, list[int]], host_id: str | None) -> None:
        """Volumes sealed under a retiring version, re-sealed under the Active one: each
        once per beat, a failure logged and tried again at the next."""
        assert self._volumes is not None
        for done in self._volumes.reseal_retiring(retiring, host_id=host_id):
            name = done.volume["name"]
            if done.error is not None or done.updated is None:
                log.warning("volume %s: re-sealing it off a retiring key version failed (tried again at the next "
                            "heartbeat): %s", name, done.error)
                continue
            to_version = done.updated.get("key_version")
            log.info("volume %s re-sealed for retirement: key %s version %s -> %s", name,
                     done.volume["key_name"], done.from_version, to_version)
            self._spool.append({"event": "volume.resealed_for_retirement", "volume_id": done.volume["id"],
                                "name": name, "key": done.volume["key_name"], "from_version": done.from_version,
                                "to_version": to_version})

    def _stand_down(self, refused: str) -> None:
        self._keyring.cache.drop_all()
        if self._manager:
            self._manager.stop_all(refused)  # their processes hold keys too; each status says why
        self.revoked = True

    def _host_refusal(self) -> str | None:
        seen = self._revocations.host() if self._revocations is not None else None
        return None if seen is None else host_refusal_message(seen)

    def ship_events(self) -> None:
        """Ship what the spool holds now (at a graceful stop: the unmounts and anything
        since the last beat reach the audit log at once, not at the next start)."""
        if self.revoked:
            return
        try:
            self._spool.send(self._client.send_events, rejected=(ServerRefused,))
        except (ServerUnreachable, HostRevoked, OSError) as exc:
            log.warning("events stay in the spool until the next start: %s", exc)

    def run(self, stop: threading.Event) -> int:
        """Beat until `stop` is set (0) or the host is revoked (6). Any other failure of a
        beat is reported and tried again (KeyboardInterrupt and SystemExit still end it)."""
        try:
            while not stop.is_set():
                refused = self._host_refusal()  # seen by another process, perhaps while the server is away
                if refused is not None:
                    self._stand_down(refused)
                    log.error("%s", refused)
                    return 6
                wait = self.interval
                try:
                    self.beat()
                except HostRevoked as exc:
                    if not self.revoked:  # refused by a call after the heartbeat: drop the keys all the same
                        self._stand_down(self._host_refusal() or exc.describe())
                    log.error("this host was revoked by the key server (%s): cached keys dropped; re-enroll it "
                              "with `kms-agent enroll --token ...`", exc.detail)
                    return 6
                except ServerUnreachable as exc:
                    self._failed(exc, f"key server unreachable: {exc}; working from the key cache until its TTL ends")
                except Exception as exc:  # a failed beat must not end revocation and shipping
                    self._failed(exc, describe_failure(exc))
                    wait = min(self.interval * 2 ** (self.failed_beats - 1), self.interval * BACKOFF_INTERVALS,
                               max(self.interval, MAX_BACKOFF_SECONDS))
                else:
                    self._recovered()
                self._write_status(running=True, next_beat_seconds=wait)
                self._pause(stop, wait)
            return 0
        finally:
            self._write_status(running=False)

    def _failed(self, exc: Exception, message: str) -> None:
        """Logged once per distinct failure; the same one again only at debug level."""
        self.failed_beats += 1
        self.failing_since = self.failing_since or datetime.now(UTC)
        if message == self.last_error:
            log.debug("heartbeat failed again (%d in a row): %s", self.failed_beats, message, exc_info=exc)
        elif isinstance(exc, ServerUnreachable):
            log.warning("%s", message)
        else:
            log.error("heartbeat failed: %s", message)
            # the traceback once: in full where the cause is unknown, else for whoever debugs
            log.log(logging.ERROR if not isinstance(exc, (AgentError, OSError)) else logging.DEBUG,
                    "the failure's traceback", exc_info=exc)
        self.last_error = message

    def _recovered(self) -> None:
        self.last_ok = datetime.now(UTC)
        if self.last_error is not None:
            if self.last_error.startswith("key server unreachable"):
                log.info("the key server answers again")
            else:
                log.info("heartbeats succeed again: cleared after %d failed beat(s) since %s (%s)", self.failed_beats,
                         self.failing_since.isoformat(timespec="seconds") if self.failing_since else "?",
                         self.last_error)
        self.last_error, self.failing_since, self.failed_beats = None, None, 0

    def _pause(self, stop: threading.Event, seconds: float) -> None:
        """Wait, looking at the revocation record every interval: a backoff does not
        delay standing down."""
        remaining = seconds
        while remaining > 0:
            step = min(remaining, max(self.interval, 0.01))
            if stop.wait(step) or self._host_refusal() is not None:
                return
            remaining -= step

    def _write_status(self, *, running: bool, next_beat_seconds: float | None = None) -> None:
        """`state_dir/daemon.json` for `kms-agent status`. Best effort: the state
        directory may be what fails, and the log says so already."""
        if self._status_file is None:
            return
        now = datetime.now(UTC)
        status = {"pid": os.getpid(), "running": running, "updated_at": now.isoformat(),
                  "last_ok_at": self.last_ok.isoformat() if self.last_ok else None,
                  "interval_seconds": self.interval, "next_beat_seconds": next_beat_seconds,
                  "revoked": self.revoked,
                  "error": None if self.last_error is None else {
                      "message": self.last_error, "failed_beats": self.failed_beats,
                      "since": self.failing_since.isoformat() if self.failing_since else None}}
        try:
            write_json(self._status_file, status)
            self._status_unwritable = None
        except OSError as exc:
            if str(exc) != self._status_unwritable:
                log.warning("cannot write %s (kms-agent status shows an older state): %s", self._status_file, exc)
            self._status_unwritable = str(exc)
