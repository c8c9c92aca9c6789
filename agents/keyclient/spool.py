"""Events the agent reports to the server (file encrypted, access denied, key fetched),
kept in a local append-only spool until the server has acknowledged them, so a server
outage or an agent restart loses none.

The spool is a directory of JSON-lines segments. `append` writes and fsyncs; `send`
hands the oldest batch to a sender and deletes it only when the sender returns.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Sender = Callable[[list[dict[str, Any]]], None]  # raises when the server did not accept


class EventSpool:
    def __init__(self, directory: Path, *, segment_events: int = 500) -> None:
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._segment_events = segment_events
        self._lock = threading.Lock()
        self._current: Path | None = None
        self._count = 0

    def append(self, event: dict[str, Any]) -> None:
        line = (json.dumps({"time": time.time(), **event}, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._current is None or self._count >= self._segment_events:
                self._current = self._dir / f"{time.time_ns():020d}.jsonl"
                self._count = 0
            fd = os.open(self._current, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
            self._count += 1

    def pending(self) -> int:
        with self._lock:
            return sum(len(p.read_bytes().splitlines()) for p in self._segments())

    def _segments(self) -> list[Path]:
        return sorted(self._dir.glob("*.jsonl"))

    def send(self, sender: Sender, *, rejected: tuple[type[Exception], ...] = ()) -> int:
        """Deliver every complete segment, oldest first; stop at the first failure
        (the sender's exception propagates, nothing is lost). A segment the server
        refuses as invalid (`rejected`) would block every later one: it is set aside
        as `*.rejected` for inspection and the rest go on. Returns events sent.
        A spool that cannot be written (read-only, immutable) sends nothing: a segment
        shipped but not deleted would be shipped again at every try."""
        sent = 0
        probed = False
        while True:
            with self._lock:
                segments = self._segments()
                if not segments:
                    return sent
                segment = segments[0]
                if not probed:  # the file system's own error (EROFS, EPERM, ...), about the spool
                    probe = self._dir / ".writable"
                    try:
                        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT, 0o600))
                        probe.unlink()
                    except OSError as exc:
                        raise OSError(exc.errno, exc.strerror, str(self._dir)) from exc
                    probed = True
                if segment == self._current:
                    self._current = None  # close it: new events go to a new segment
            events = []
            for raw in segment.read_bytes().splitlines():
                try:
                    events.append(json.loads(raw))
                except ValueError:
                    continue  # a line torn by a crash mid-append: drop it, keep the rest
            try:
                sender(events)
            except rejected:
                segment.rename(segment.with_suffix(".rejected"))
                continue
            segment.unlink()
            sent += len(events)
