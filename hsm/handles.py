"""Object handles across sessions, and the cache of unwrapped data-key handles.

PKCS#11 object handles belong to the application, not to a session: a session object
created in one session can be used from every other session of the process (it dies
with the session that created it). python-pkcs11 instead binds each key object to the
session it came from and offers no public way to rebind it. The views below are key
objects over (any session, any handle), built on python-pkcs11's own operation mixins,
so a thread can use a cached handle on whichever pooled session it borrowed.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pkcs11 import KeyType, _pkcs11, types

# The implementation mixins live in the compiled module; python-pkcs11 mixes them into
# the classes it creates for every object (see make_object in _pkcs11.pyx). They only
# use self.session, self.handle and self.key_type, which the views supply.
_EncryptMixin: Any = _pkcs11.EncryptMixin  # type: ignore[attr-defined]
_DecryptMixin: Any = _pkcs11.DecryptMixin  # type: ignore[attr-defined]
_WrapMixin: Any = _pkcs11.WrapMixin  # type: ignore[attr-defined]
_UnwrapMixin: Any = _pkcs11.UnwrapMixin  # type: ignore[attr-defined]
_SignMixin: Any = _pkcs11.SignMixin  # type: ignore[attr-defined]
_SecretKey: Any = types.SecretKey
_PublicKey: Any = types.PublicKey
_PrivateKey: Any = types.PrivateKey


class _View:
    def __init__(self, session: Any, handle: int) -> None:
        self._session = session
        self._handle = handle

    @property
    def session(self) -> Any:
        return self._session

    @property
    def handle(self) -> int:
        return self._handle


class AesKeyView(_View, _EncryptMixin, _DecryptMixin, _SecretKey):  # type: ignore[misc]
    key_type = KeyType.AES


class RsaPublicView(_View, _WrapMixin, _PublicKey):  # type: ignore[misc]
    key_type = KeyType.RSA


class RsaPrivateView(_View, _UnwrapMixin, _PrivateKey):  # type: ignore[misc]
    key_type = KeyType.RSA


class HmacKeyView(_View, _SignMixin, _SecretKey):  # type: ignore[misc]
    key_type = KeyType.GENERIC_SECRET


class RsaPrivateOpsView(_View, _SignMixin, _DecryptMixin, _PrivateKey):  # type: ignore[misc]
    """A client private key opened in the token for Sign / Decrypt (KMIP services)."""

    key_type = KeyType.RSA


class EcPrivateOpsView(_View, _SignMixin, _PrivateKey):  # type: ignore[misc]
    """A client EC private key opened in the token for Sign (CKM_ECDSA)."""

    key_type = KeyType.EC


class AesUnwrapView(_View, _UnwrapMixin, _SecretKey):  # type: ignore[misc]
    """A sealed object's DEK, opened in the token to unwrap the object inside it."""

    key_type = KeyType.AES


# --- the data-key handle cache --------------------------------------------------
CacheKey = tuple[str, str, bytes]  # (wrapping key id, mechanism, sha256 of the blob)


@dataclass(eq=False)
class CachedHandle:
    key: CacheKey
    handle: int
    # The python-pkcs11 object from the session that created the handle; destroying
    # through it keeps C_DestroyObject on a session we know owns the object.
    owner: Any = field(repr=False)
    # Session generation the object was created in (see HandleCache.reset).
    generation: int
    expires_at: float
    leases: int = 0
    retired: bool = False


class HandleCache:
    """Bounded LRU of unwrapped session-object handles with a time-to-live.

    A handle is leased while an operation uses it, so eviction or `forget` never
    destroys an object under a running operation; the last lease-holder destroys it.
    The TTL counts from creation, not from last use: a hot key is still re-unwrapped
    now and then, which bounds how long one unwrap stays usable in this process.

    Generations: when the backend re-opens its sessions, objects created in the old
    ones die with them and their handle numbers may be reused by the module. Entries of
    an old generation are therefore dropped without C_DestroyObject, ever.
    """

    def __init__(
        self,
        *,
        max_entries: int,
        ttl_seconds: float,
        destroy: Callable[[Any], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max = max_entries
        self._ttl = ttl_seconds
        self._destroy = destroy
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[CacheKey, CachedHandle] = OrderedDict()
        self._generation = 0
        self._next_sweep = clock() + ttl_seconds / 4

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def lease(self, key: CacheKey) -> CachedHandle | None:
        doomed: list[Any] = []
        with self._lock:
            now = self._clock()
            self._sweep_locked(now, doomed)
            entry = self._entries.get(key)
            if entry is not None and entry.expires_at <= now:
                self._retire_locked(entry, doomed)
                entry = None
            if entry is not None:
                self._entries.move_to_end(key)
                entry.leases += 1
        self._destroy_all(doomed)
        return entry

    def adopt(self, key: CacheKey, *, handle: int, owner: Any, generation: int) -> CachedHandle:
        """Cache a freshly unwrapped handle and return it leased to the caller.

        If another thread cached the same blob meanwhile, theirs wins and ours is
        destroyed. With caching disabled, or for a handle from sessions that have been
        reset since, the entry is not cached: the caller uses it once and releases it.
        """
        doomed: list[Any] = []
        with self._lock:
            now = self._clock()
            entry = CachedHandle(
                key, handle, owner, generation, expires_at=now + self._ttl, leases=1
            )
            if self._max == 0 or generation != self._generation:
                entry.retired = True
                return entry
            existing = self._entries.get(key)
            if existing is not None and existing.expires_at > now:
                existing.leases += 1
                self._entries.move_to_end(key)
                entry.leases = 0
                self._retire_locked(entry, doomed, cached=False)
                entry = existing
            else:
                if existing is not None:
                    self._retire_locked(existing, doomed)
                self._entries[key] = entry
                while len(self._entries) > self._max:
                    _, oldest = self._entries.popitem(last=False)
                    self._retire_locked(oldest, doomed, cached=False)
        self._destroy_all(doomed)
        return entry

    def release(self, entry: CachedHandle) -> None:
        doomed: list[Any] = []
        with self._lock:
            entry.leases -= 1
            if entry.retired and entry.leases == 0 and entry.generation == self._generation:
                doomed.append(entry.owner)
        self._destroy_all(doomed)

    def forget(self, key: CacheKey) -> None:
        doomed: list[Any] = []
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._retire_locked(entry, doomed)
        self._destroy_all(doomed)

    def clear(self) -> None:
        """Destroy every unleased entry now, the leased ones on release."""
        doomed: list[Any] = []
        with self._lock:
            for entry in list(self._entries.values()):
                self._retire_locked(entry, doomed)
        self._destroy_all(doomed)

    def reset(self, generation: int) -> None:
        """The sessions were re-opened: forget every entry without destroying it."""
        with self._lock:
            for entry in self._entries.values():
                entry.retired = True
            self._entries.clear()
            self._generation = generation

    def _sweep_locked(self, now: float, doomed: list[Any]) -> None:
        # A full pass every quarter TTL keeps expired objects from lingering in the
        # token when nobody asks for them again; O(n) with n <= max_entries, rarely.
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._ttl / 4
        for entry in [e for e in self._entries.values() if e.expires_at <= now]:
            self._retire_locked(entry, doomed)

    def _retire_locked(
        self, entry: CachedHandle, doomed: list[Any], *, cached: bool = True
    ) -> None:
        if cached:
            self._entries.pop(entry.key, None)
        entry.retired = True
        if entry.leases == 0 and entry.generation == self._generation:
            doomed.append(entry.owner)

    def _destroy_all(self, doomed: list[Any]) -> None:
        for owner in doomed:
            self._destroy(owner)
