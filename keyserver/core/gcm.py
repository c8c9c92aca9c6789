"""How many AES-GCM encryptions each key version has made, against NIST's limit.

The HSM draws a random 96-bit IV for every GCM encryption under a key version (data
keys, the encrypt service). NIST SP 800-38D §8.3 bounds that to 2^32 invocations per key:
beyond it the chance of a repeated IV — which gives away the authentication key and
the XOR of two plaintexts — is no longer negligible. A version that reaches the limit
refuses to encrypt (it still decrypts) and says to rotate the key.

Counting every encryption would put a database write on the data-key hot path. Each
process instead reserves a block of invocations from the version's counter in one
UPDATE and spends it in memory; a block a crash leaves unspent is counted as used
(the safe side). Replicas share the counter.
"""

from __future__ import annotations

import threading
import uuid

from sqlalchemy import Connection, Engine, select, update

from keyserver.core.errors import Conflict, StoreBusy
from keyserver.store.models import KeyVersion

GCM_LIMIT = 2**32
BLOCK = 4096


class GcmBudget:
    def __init__(self, engine: Engine, *, limit: int = GCM_LIMIT, block: int = BLOCK) -> None:
        self._engine = engine
        self._limit, self._block = limit, block
        self._left: dict[tuple[uuid.UUID, int], int] = {}
        self._lock = threading.Lock()

    def try_spend(self, key_id: uuid.UUID, version: int) -> bool:
        """Spend one invocation from this process's block, if it has one left: never
        touches the store (False: call `spend`)."""
        slot = (key_id, version)
        with self._lock:
            left = self._left.get(slot, 0)
            if left > 0:
                self._left[slot] = left - 1
                return True
        return False

    def spend(self, key_id: uuid.UUID, version: int, *, name: str, conn: Connection | None = None) -> None:
        """Account for one GCM encryption under the version; Conflict `gcm_limit` when it
        has made its 2^32. `conn`: the caller's open transaction (one per thread, decision
        0010), else a short one of its own."""
        if self.try_spend(key_id, version):
            return
        slot = (key_id, version)
        got = self._reserve(conn, key_id, version) if conn is not None else self._reserve_alone(key_id, version)
        if got <= 0:
            raise Conflict(f"version {version} of key '{name}' has made the {self._limit:,} AES-GCM encryptions "
                           "NIST SP 800-38D allows one key with random IVs; rotate the key (its older versions "
                           "still decrypt)", code="gcm_limit")
        with self._lock:
            self._left[slot] = self._left.get(slot, 0) + got - 1
            if len(self._left) > 100_000:
                self._left.clear()

    def _reserve_alone(self, key_id: uuid.UUID, version: int) -> int:
        with self._engine.begin() as conn:
            return self._reserve(conn, key_id, version)

    def _reserve(self, conn: Connection, key_id: uuid.UUID, version: int) -> int:
        """Take up to a block from the version's counter; 0 only when the version has none left."""
        where = (KeyVersion.key_id == key_id, KeyVersion.version == version)
        # A whole block, in one statement, while the version is a block or more from its
        # limit: the row lock orders replicas and threads, so a crowd reserving at once
        # (every replica when the database comes back) waits its turn instead of losing a
        # compare-and-set race and being told the key is used up.
        done = conn.execute(update(KeyVersion).where(*where, KeyVersion.gcm_invocations <= self._limit - self._block)
                            .values(gcm_invocations=KeyVersion.gcm_invocations + self._block))
        if getattr(done, "rowcount", 0) == 1:
            return self._block
        # The last block before the limit (or no such version): what is left, compare-and-set.
        for _ in range(10):
            used = conn.execute(select(KeyVersion.gcm_invocations).where(*where)).scalar()
            if used is None or used >= self._limit:
                return 0
            take = min(self._block, self._limit - used)
            done = conn.execute(update(KeyVersion).where(*where, KeyVersion.gcm_invocations == used)
                                .values(gcm_invocations=used + take))
            if getattr(done, "rowcount", 0) == 1:
                return take
        # Lost every race for the last few: busy, not used up (the caller may retry).
        raise StoreBusy("the key version's encryption count is contended; retry in a moment")

    def used(self, key_id: uuid.UUID, version: int) -> int:
        """Invocations reserved so far (spent, or held by a process)."""
        with self._engine.connect() as conn:
            return int(conn.execute(select(KeyVersion.gcm_invocations).where(
                KeyVersion.key_id == key_id, KeyVersion.version == version)).scalar() or 0)
