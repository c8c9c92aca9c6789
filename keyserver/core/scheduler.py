"""Background work that must survive restarts: due key rotations, activation and
deactivation dates, unfinished KEK rotations and key-version retirements ready to
complete. All of its state lives in the database, so a restarted (or another) replica
simply picks up where it was."""

from __future__ import annotations

import logging
import threading

from keyserver.core.errors import CoreError
from keyserver.core.kek import KekService
from keyserver.core.keys import KeyService
from keyserver.core.principal import system_context
from keyserver.core.replicas import ReplicaRegistry
from keyserver.core.retirement import RetirementService

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, keys: KeyService, keks: KekService, *, interval_seconds: float,
                 replicas: ReplicaRegistry | None = None, retirement: RetirementService | None = None) -> None:
        self._keys = keys
        self._retirement = retirement
        self._keks = keks
        self._replicas = replicas
        self._interval = interval_seconds
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> dict[str, int]:
        counts = self._keys.run_due(system_context("scheduler"))
        counts["kek_rewrapped"] = self._keks.resume_rotations()
        if self._retirement is not None:
            # A retirement whose holders all moved (or were excluded) gets its signed statement.
            counts["versions_retired"] = self._retirement.run_due()
        if any(counts.values()):
            log.info("scheduler: %s", counts)
        return counts

    def kick(self) -> None:
        """Run soon (e.g. right after a KEK rotation was requested)."""
        self._kick.set()

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            error = None
            try:
                self.run_once()
            except CoreError as exc:
                error = exc.message
                log.warning("scheduler run postponed: %s", exc.message)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                log.exception("scheduler run failed; retrying at the next interval")
            if self._replicas is not None:
                try:
                    self._replicas.beat(scheduler_error=error)
                except Exception as exc:  # the database is away: the next interval reports
                    log.warning("could not report this replica: %s", exc)
            self._kick.wait(timeout=self._interval)
            self._kick.clear()
