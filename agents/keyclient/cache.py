"""The agent's key cache: key versions in memory only, bounded in size and time.

A cached version is used for `ttl` seconds after it was fetched. Within that time the
server is not asked again, so the agent keeps working through a server outage. After
it, the version is fetched again; if the server cannot be reached the cache fails
closed (KeyUnavailable saying since when and what to do), never serving an expired key.
`drop_all()` forgets everything at once (host revoked).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable

from agents.cryptfile.errors import KeyUnavailable
from agents.cryptfile.keys import KeyVersion
from agents.errors import AgentError, Exit


class ServerUnreachable(AgentError):
    """The fetcher could not reach the key server (network, TLS, 5xx)."""

    exit_status = Exit.UNREACHABLE

    def describe(self) -> str:
        return f"key server unreachable: {self}"


Fetcher = Callable[[uuid.UUID, int], KeyVersion]


class KeyCache:
    def __init__(self, fetch: Fetcher, *, ttl_seconds: float, max_entries: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_seconds <= 0 or max_entries < 1:
            raise ValueError("ttl_seconds must be > 0 and max_entries >= 1")
        self._fetch = fetch
        self._ttl = ttl_seconds
        self._max = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[uuid.UUID, int], tuple[KeyVersion, float]] = OrderedDict()

    def get(self, key_id: uuid.UUID, version: int) -> KeyVersion:
        k = (key_id, version)
        now = self._clock()
        with self._lock:
            hit = self._entries.get(k)
            if hit is not None and now - hit[1] < self._ttl:
                self._entries.move_to_end(k)
                return hit[0]
        try:
            fresh = self._fetch(key_id, version)
        except ServerUnreachable as exc:
            with self._lock:
                self._entries.pop(k, None)  # expired: fail closed, and forget it
            raise KeyUnavailable(
                f"key {key_id} version {version}: the key server is unreachable ({exc}) and the cached copy "
                f"has expired (cache TTL {self._ttl:.0f} s); restore connectivity to the key server"
            ) from None
        with self._lock:
            self._entries[k] = (fresh, self._clock())
            self._entries.move_to_end(k)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return fresh

    def drop(self, key_id: uuid.UUID, version: int) -> None:
        """Forget one version (destroyed on the server): the next use asks the server, which refuses."""
        with self._lock:
            self._entries.pop((key_id, version), None)

    def drop_all(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
