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
"""

from __future__ import annotations

import logging
import platform
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

from agents.errors import AgentError
from agents.guardpoint.manager import GuardPointManager
from agents.keyclient.cache import ServerUnreachable
from agents.keyclient.client import HostRevoked, ServerClient, ServerKeyring, ServerRefused
from agents.keyclient.revocation import RevocationLedger, host_refusal_message
from agents.keyclient.spool import EventSpool
from agents.volume.manager import VolumeManager

log = logging.getLogger("strongroom.agent")
MAX_CLOCK_SKEW_SECONDS = 120.0


def os_description() -> str:
    return f"{platform.system()} {platform.release()} ({platform.machine()})"


def clock_skew(server_time: str, now: datetime | None = None) -> float:
    """Seconds this host's clock is ahead of the server's (negative: behind)."""
    theirs = datetime.fromisoformat(server_time)
    return ((now or datetime.now(UTC)) - theirs).total_seconds()


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
                 revocations: RevocationLedger | None = None, volumes: VolumeManager | None = None) -> None:
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
        self.last_error: str | None = None

    def beat(self) -> dict[str, Any]:
        """One heartbeat and one spool flush. Raises HostRevoked (after dropping the
        cache) or ServerUnreachable."""
        reports = self._manager.reports() if self._manager else None
        try:
            answer = self._client.heartbeat(os_name=os_description(), guard_points=reports)
        except HostRevoked as exc:
            self._stand_down(self._host_refusal() or exc.describe())
            raise
        self.interval = float(answer.get("heartbeat_seconds", self.interval))
        skew = clock_skew(answer["server_time"])
        if abs(skew) > MAX_CLOCK_SKEW_SECONDS:
            log.warning("this host's clock is %.0f s %s the key server's: fix NTP, or certificates and "
                        "audit times will be wrong", abs(skew), "ahead of" if skew > 0 else "behind")
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
        sent = self._spool.send(self._client.send_events, rejected=(ServerRefused,))
        if sent:
            log.info("shipped %d events", sent)
        return answer

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
        except (ServerUnreachable, HostRevoked) as exc:
            log.warning("events stay in the spool until the next start: %s", exc)

    def run(self, stop: threading.Event) -> int:
        """Beat until `stop` is set (0) or the host is revoked (6)."""
        while not stop.is_set():
            refused = self._host_refusal()  # seen by another process, perhaps while the server is away
            if refused is not None:
                self._stand_down(refused)
                log.error("%s", refused)
                return 6
            try:
                self.beat()
                if self.last_error:
                    log.info("the key server answers again")
                self.last_error = None
            except HostRevoked as exc:
                log.error("this host was revoked by the key server (%s): cached keys dropped; re-enroll it "
                          "with `kms-agent enroll --token ...`", exc.detail)
                return 6
            except ServerUnreachable as exc:
                if str(exc) != self.last_error:
                    log.warning("key server unreachable: %s; working from the key cache until its TTL ends", exc)
                self.last_error = str(exc)
            stop.wait(self.interval)
        return 0
