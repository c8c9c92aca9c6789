"""The agent daemon (`kms-agent run`): heartbeats, event shipping, revocation.

Every heartbeat reports the host (OS, agent version, guard points) and ships the event
spool. The server's answer carries its clock, checked against ours, and the interval
to beat at. When the server says this host is revoked, the daemon drops every cached
key at once and stops (exit status 6: restarting cannot help, re-enrollment can). While
the server is unreachable it keeps beating, and the key cache keeps serving until its
TTL ends.
"""

from __future__ import annotations

import logging
import platform
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agents.keyclient.cache import ServerUnreachable
from agents.keyclient.client import HostRevoked, ServerClient, ServerKeyring, ServerRefused
from agents.keyclient.spool import EventSpool

log = logging.getLogger("strongroom.agent")
MAX_CLOCK_SKEW_SECONDS = 120.0


def os_description() -> str:
    return f"{platform.system()} {platform.release()} ({platform.machine()})"


def clock_skew(server_time: str, now: datetime | None = None) -> float:
    """Seconds this host's clock is ahead of the server's (negative: behind)."""
    theirs = datetime.fromisoformat(server_time)
    return ((now or datetime.now(UTC)) - theirs).total_seconds()


class AgentDaemon:
    def __init__(self, client: ServerClient, keyring: ServerKeyring, spool: EventSpool, *,
                 guard_points: Callable[[], list[dict[str, Any]]] = list) -> None:
        self._client = client
        self._keyring = keyring
        self._spool = spool
        self._guard_points = guard_points
        self.interval = 30.0
        self.revoked = False
        self.last_error: str | None = None

    def beat(self) -> dict[str, Any]:
        """One heartbeat and one spool flush. Raises HostRevoked (after dropping the
        cache) or ServerUnreachable."""
        try:
            answer = self._client.heartbeat(os_name=os_description(), guard_points=self._guard_points())
        except HostRevoked:
            self._keyring.cache.drop_all()
            self.revoked = True
            raise
        self.interval = float(answer.get("heartbeat_seconds", self.interval))
        skew = clock_skew(answer["server_time"])
        if abs(skew) > MAX_CLOCK_SKEW_SECONDS:
            log.warning("this host's clock is %.0f s %s the key server's: fix NTP, or certificates and "
                        "audit times will be wrong", abs(skew), "ahead of" if skew > 0 else "behind")
        sent = self._spool.send(self._client.send_events, rejected=(ServerRefused,))
        if sent:
            log.info("shipped %d events", sent)
        return answer

    def run(self, stop: threading.Event) -> int:
        """Beat until `stop` is set (0) or the host is revoked (6)."""
        while not stop.is_set():
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
