"""A pool of plain (not logged-in) read/write sessions, one per concurrent operation.

A PKCS#11 session runs one cryptographic operation at a time, so each thread borrows a
session for the length of one backend call and gives it back. The login lives on a
separate anchor session (`hsm.module`); these sessions inherit it because login state
is per process and token, and closing them never logs anybody out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pkcs11 import exceptions as p11

from hsm.errors import HsmUnavailable

log = logging.getLogger(__name__)


class SessionPool:
    def __init__(
        self,
        *,
        size: int,
        open_session: Callable[[], Any],
        borrow_timeout: float = 30.0,
    ) -> None:
        self._size = size
        self._open_session = open_session
        self._timeout = borrow_timeout
        self._cond = threading.Condition()
        self._idle: list[Any] = []
        self._live = 0
        self._generation = 0
        self._closed = False

    @property
    def generation(self) -> int:
        return self._generation

    @contextmanager
    def borrow(self) -> Iterator[tuple[Any, int]]:
        """A session and the generation it belongs to (see `reset`)."""
        session, generation = self._acquire()
        try:
            yield session, generation
        finally:
            self._give_back(session, generation)

    def reset(self, open_session: Callable[[], Any] | None = None) -> int:
        """Close every session (borrowed ones when they come back); return the new generation.

        Objects created in the old sessions die with them: callers must forget their
        handles (HandleCache.reset).
        """
        with self._cond:
            self._generation += 1
            if open_session is not None:
                self._open_session = open_session
            stale, self._idle = self._idle, []
            # Sessions still borrowed belong to the old generation: they are closed
            # when they come back and no longer count against the pool size.
            self._live = 0
            self._cond.notify_all()
            generation = self._generation
        for session in stale:
            _close_quietly(session)
        return generation

    def close(self) -> None:
        with self._cond:
            self._closed = True
            stale, self._idle = self._idle, []
            self._live = 0
            self._cond.notify_all()
        for session in stale:
            _close_quietly(session)

    def _acquire(self) -> tuple[Any, int]:
        deadline = time.monotonic() + self._timeout
        with self._cond:
            while True:
                if self._closed:
                    raise HsmUnavailable("the HSM backend is closed")
                if self._idle:
                    return self._idle.pop(), self._generation
                if self._live < self._size:
                    self._live += 1
                    generation = self._generation
                    opener = self._open_session
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise HsmUnavailable(
                        f"all {self._size} HSM sessions stayed busy for {self._timeout:.0f} s: "
                        "raise the HSM pool size or lower the load"
                    )
                self._cond.wait(remaining)
        # Opening can take a while on a real HSM: not under the lock.
        try:
            return opener(), generation
        except BaseException:
            with self._cond:
                if generation == self._generation and not self._closed:
                    self._live -= 1
                self._cond.notify()
            raise

    def _give_back(self, session: Any, generation: int) -> None:
        with self._cond:
            if not self._closed and generation == self._generation:
                self._idle.append(session)
                self._cond.notify()
                return
        _close_quietly(session)


def _close_quietly(session: Any) -> None:
    try:
        session.close()
    except p11.PKCS11Error as exc:
        log.debug("closing a pooled session failed: %s", type(exc).__name__)
