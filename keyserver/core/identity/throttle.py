"""Sign-in throttling: slows password guessing without ever locking the owner out
(docs/decisions/0015). Per process; the per-account part lives in the user's row."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from datetime import timedelta

ACCOUNT_LOCKED = "too many failed sign-ins for this account; try again later"
SOURCE_THROTTLED = "too many failed sign-ins for this account from this address; try again later"
ADDRESS_THROTTLED = "too many failed sign-ins from this address; try again later"
KNOWN_SOURCE_DAYS = 90


class _Window:
    """Failures per key in a sliding window (per process)."""

    def __init__(self, limit: int, window: float) -> None:
        self._limit, self._window = limit, window
        self._fails: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def retry_after(self, key: str) -> int | None:
        """Seconds until `key` may try again, or None when it may now."""
        with self._lock:
            q = self._fails.get(key)
            now = time.monotonic()
            while q and q[0] < now - self._window:
                q.popleft()
            if q and len(q) >= self._limit:
                return int(q[0] + self._window - now) + 1
            return None

    def fail(self, key: str) -> None:
        with self._lock:
            self._fails.setdefault(key, deque()).append(time.monotonic())
            if len(self._fails) > 100_000:
                self._fails.clear()


class _Backoff:
    """Failed sign-ins per key (a username and source address), each costing the key an
    exponentially longer wait once `free` of them are used: `base`, twice that, … up to
    `cap`. Per process; bounded (the stalest keys go first)."""

    def __init__(self, free: int, base: float, cap: float, size: int = 100_000) -> None:
        self._free, self._base, self._cap, self._size = free, base, max(cap, base), size
        self._state: OrderedDict[str, tuple[int, float]] = OrderedDict()  # key -> (failures, last at)
        self._lock = threading.Lock()

    def wait(self, key: str) -> int | None:
        """Whole seconds `key` must still wait before its next try, or None."""
        with self._lock:
            failures, at = self._state.get(key, (0, 0.0))
            if failures < self._free:
                return None
            left = at + min(self._base * 2.0 ** (failures - self._free), self._cap) - time.monotonic()
            return math.ceil(left) if left > 0 else None

    def fail(self, key: str) -> None:
        with self._lock:
            failures, _ = self._state.pop(key, (0, 0.0))
            self._state[key] = (failures + 1, time.monotonic())
            while len(self._state) > self._size:
                self._state.popitem(last=False)

    def forget(self, key: str) -> None:
        with self._lock:
            self._state.pop(key, None)


class LoginThrottle:
    """Slows password guessing without ever locking the owner out (docs/decisions/0015).

    * per username *and* source address: `max_failures` free, then an exponentially
      growing wait (`lockout_seconds`, doubling, at most 15 minutes) — the attacker's address slows
      down, the owner's other addresses do not;
    * per username, over every address: a looser budget (4 times `max_failures`), then the
      same kind of wait — but only for addresses the owner has not signed in from (a
      session from that address in the last 90 days): spread over many addresses, the
      guesses slow down; the owner at their usual address still signs in. Real accounts
      keep this in the database (shared by replicas); unknown usernames here, alike, so
      the answers do not tell which accounts exist;
    * per address: 300 failures in 5 minutes bounds spraying many usernames.

    A refused try is not checked (no password is verified, nothing counts as failed).
    The first refusal of each wait is audited; the others are counted and the count goes
    into the next audited sign-in of that username from that address.
    """

    CAP = 900.0

    def __init__(self, max_failures: int, lockout_seconds: int) -> None:
        self.account_free = 4 * max_failures
        self._pair = _Backoff(max_failures, lockout_seconds, self.CAP)
        self._unknown = _Backoff(self.account_free, lockout_seconds, self.CAP)
        self._address = _Window(300, 300.0)
        self._lockout = lockout_seconds
        self._refused: dict[str, int] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _pair_key(ip: str | None, username: str) -> str:
        return f"{ip}|{username}"

    def source_wait(self, ip: str | None, username: str) -> tuple[str, int] | None:
        """('address' or 'source', seconds) when this address must wait, or None."""
        if ip is not None and (retry := self._address.retry_after(ip)) is not None:
            return "address", retry
        retry = self._pair.wait(self._pair_key(ip, username))
        return None if retry is None else ("source", retry)

    def unknown_wait(self, username: str) -> int | None:
        return self._unknown.wait(username)

    def account_delay(self, failures: int) -> timedelta | None:
        """How long the account's unknown addresses wait after its `failures`-th failure."""
        if failures < self.account_free:
            return None
        return timedelta(seconds=min(self._lockout * 2 ** (failures - self.account_free), max(self.CAP, self._lockout)))

    def refused(self, scope: str, ip: str | None, username: str) -> bool:
        """Count a refusal; True when it is the first of its wait (to be audited)."""
        key = f"{scope}|{ip}" if scope == "address" else f"{scope}|{self._pair_key(ip, username)}"
        with self._lock:
            first = key not in self._refused
            if len(self._refused) > 100_000:
                self._refused.clear()
            self._refused[key] = self._refused.get(key, -1) + 1
            return first

    def uncounted(self, ip: str | None, username: str) -> int:
        """Refusals not yet audited of this username and address (the first of each wait was), reset."""
        pair = self._pair_key(ip, username)
        with self._lock:
            return sum(self._refused.pop(f"{scope}|{k}", 0) for scope, k in
                       (("source", pair), ("account", pair), ("address", str(ip))))

    def fail(self, ip: str | None, username: str, *, known: bool) -> None:
        if ip is not None:
            self._address.fail(ip)
        self._pair.fail(self._pair_key(ip, username))
        if not known:
            self._unknown.fail(username)

    def succeed(self, ip: str | None, username: str) -> None:
        self._pair.forget(self._pair_key(ip, username))
