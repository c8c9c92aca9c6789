"""What the XKS proxy reads on every call, cached per replica (decision 0020, "The
proxy's hot path"): a key store's row (state, region, credential ids, certificate rule)
and a grant with its key's version ids and states.

Invalidated the way DataKeyService's active versions are (decision 0004): every change
to a store or its grants publishes Topic.XKS, every change to a key version's state or
material (and a KEK rewrap of the sealed secret) Topic.KEYS, inside the change's
transaction; this process drops the cache in after_commit (so the very next call sees
the change) and other replicas on the notification. A lookup that raced a clear is not
kept (the generation); a process that cannot hear notifications does not use the cache;
the TTL is only a backstop. Never unwrapped material: the store rows hold the secret as
it is stored, sealed under the KEK. Reads run in autocommit: no BEGIN/ROLLBACK round trips.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, raiseload, sessionmaker

from keyserver.store.models import KeyVersion
from keyserver.store.notify import Notifier, Topic
from keyserver.store.xks import XksKey, XksStore

MAX_ENTRIES = 10_000
_K = TypeVar("_K")
_V = TypeVar("_V")


@dataclass(frozen=True, slots=True)
class XksVersion:
    id: uuid.UUID
    number: int
    state: str
    revocation_reason: str | None


@dataclass(frozen=True, slots=True)
class XksGrant:
    """What a call needs of a grant: ids and states, never material."""

    external_id: str
    key_id: uuid.UUID
    newest: XksVersion
    versions: dict[int, XksVersion]  # every version: decrypt names older ones


class XksLookups:
    def __init__(self, read: sessionmaker[Session], notifier: Notifier | None, *,
                 cache_seconds: float = 30.0) -> None:
        self._read = read
        self._notifier = notifier  # None: no cache
        self._cache_seconds = cache_seconds
        self._stores: dict[tuple[str, str], tuple[tuple[XksStore, ...], float]] = {}
        self._grants: dict[tuple[str, str], tuple[XksGrant, float]] = {}
        self._lock = threading.Lock()
        self._generation = 0
        if notifier is not None:
            for topic in Topic:  # KEYS: versions and KEK rewraps; XKS: stores and grants
                notifier.subscribe(topic, self.clear)

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._stores.clear()
            self._grants.clear()

    def changed(self, s: Session) -> None:
        """Inside a change's transaction: every replica drops its cached stores and grants."""
        if self._notifier is not None:
            self._notifier.publish(s, Topic.XKS)

    def _cached(self, cache: dict[_K, tuple[_V, float]], key: _K) -> _V | None:
        if self._notifier is None or not self._notifier.healthy:
            return None
        with self._lock:
            hit = cache.get(key)
        if hit is not None and time.monotonic() - hit[1] < self._cache_seconds:
            return hit[0]
        return None

    def _keep(self, cache: dict[_K, tuple[_V, float]], key: _K, value: _V, generation: int,
              started: float) -> None:
        if self._notifier is None:
            return
        with self._lock:
            if generation != self._generation:
                return
            if len(cache) > MAX_ENTRIES:
                cache.clear()
            cache[key] = (value, started)

    def store_rows(self, store: str, access: str) -> tuple[XksStore, ...]:
        """The store the path names (its certificate rule) and the credential's (usually
        the same row), detached, in one query."""
        hit = self._cached(self._stores, (store, access))
        if hit is not None:
            return hit
        with self._lock:
            started, generation = time.monotonic(), self._generation
        wanted = [XksStore.name == store]
        if access:
            wanted += [XksStore.access_key_id == access, XksStore.previous_access_key_id == access]
        with self._read() as s:
            rows = tuple(s.execute(select(XksStore).options(raiseload(XksStore.keys))
                                   .where(or_(*wanted))).scalars().all())
            s.expunge_all()
        if rows:  # unknown names are not kept: they would crowd out the stores in use
            self._keep(self._stores, (store, access), rows, generation, started)
        return rows

    def grant(self, store: str, external_id: str) -> XksGrant | None:
        """The grant with every version of its key, in one query; None: no such grant."""
        hit = self._cached(self._grants, (store, external_id))
        if hit is not None:
            return hit
        with self._lock:
            started, generation = time.monotonic(), self._generation
        with self._read() as s:
            rows = s.execute(
                select(XksKey.key_id, KeyVersion.id, KeyVersion.version, KeyVersion.state,
                       KeyVersion.revocation_reason)
                .join(XksStore, XksStore.id == XksKey.store_id)
                .join(KeyVersion, KeyVersion.key_id == XksKey.key_id)
                .where(XksStore.name == store, XksKey.external_id == external_id)
                .order_by(KeyVersion.version)).all()
        if not rows:
            return None
        versions = {number: XksVersion(vid, number, state, reason) for _, vid, number, state, reason in rows}
        found = XksGrant(external_id=external_id, key_id=rows[0][0], newest=versions[rows[-1][2]],
                         versions=versions)
        self._keep(self._grants, (store, external_id), found, generation, started)
        return found
