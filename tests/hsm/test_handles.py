"""HandleCache: LRU, TTL, leases and generations, with a fake clock and fake objects."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hsm.handles import CacheKey, HandleCache


@dataclass(eq=False)
class FakeObject:
    handle: int
    destroyed: int = 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _key(n: int) -> CacheKey:
    return ("kek", "RSA-OAEP-SHA1", n.to_bytes(32, "big"))


def _destroy(obj: FakeObject) -> None:
    obj.destroyed += 1


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _cache(clock: Clock, *, size: int = 3, ttl: float = 60.0) -> HandleCache:
    return HandleCache(max_entries=size, ttl_seconds=ttl, destroy=_destroy, clock=clock)


def _put(cache: HandleCache, n: int, generation: int = 0) -> FakeObject:
    obj = FakeObject(n)
    entry = cache.adopt(_key(n), handle=n, owner=obj, generation=generation)
    cache.release(entry)
    return obj


def test_hit_after_adopt(clock: Clock) -> None:
    cache = _cache(clock)
    obj = _put(cache, 1)
    entry = cache.lease(_key(1))
    assert entry is not None and entry.handle == 1
    cache.release(entry)
    assert obj.destroyed == 0


def test_lru_eviction_destroys_the_least_recently_used(clock: Clock) -> None:
    cache = _cache(clock, size=2)
    first, second = _put(cache, 1), _put(cache, 2)
    entry = cache.lease(_key(1))  # 1 becomes most recent
    assert entry is not None
    cache.release(entry)
    third = _put(cache, 3)
    assert (first.destroyed, second.destroyed, third.destroyed) == (0, 1, 0)
    assert cache.lease(_key(2)) is None
    assert len(cache) == 2


def test_eviction_waits_for_the_lease(clock: Clock) -> None:
    cache = _cache(clock, size=1)
    obj = _put(cache, 1)
    held = cache.lease(_key(1))
    assert held is not None
    _put(cache, 2)  # evicts 1 while it is in use
    assert obj.destroyed == 0
    cache.release(held)
    assert obj.destroyed == 1


def test_ttl_counts_from_creation(clock: Clock) -> None:
    cache = _cache(clock, ttl=10.0)
    obj = _put(cache, 1)
    clock.now += 9.0
    entry = cache.lease(_key(1))
    assert entry is not None
    cache.release(entry)
    clock.now += 1.5
    assert cache.lease(_key(1)) is None
    assert obj.destroyed == 1


def test_sweep_destroys_expired_entries_nobody_asks_for(clock: Clock) -> None:
    cache = _cache(clock, ttl=8.0)
    stale = _put(cache, 1)
    clock.now += 9.0
    cache.lease(_key(99))  # any access sweeps at most every ttl/4
    assert stale.destroyed == 1
    assert len(cache) == 0


def test_losing_an_adopt_race_destroys_the_loser(clock: Clock) -> None:
    cache = _cache(clock)
    winner = _put(cache, 1)
    loser = FakeObject(2)
    entry = cache.adopt(_key(1), handle=2, owner=loser, generation=0)
    assert entry.owner is winner
    cache.release(entry)
    assert (winner.destroyed, loser.destroyed) == (0, 1)


def test_forget_and_clear(clock: Clock) -> None:
    cache = _cache(clock)
    one, two = _put(cache, 1), _put(cache, 2)
    cache.forget(_key(1))
    cache.forget(_key(1))
    assert one.destroyed == 1
    held = cache.lease(_key(2))
    assert held is not None
    cache.clear()
    assert two.destroyed == 0
    cache.release(held)
    assert two.destroyed == 1


def test_disabled_cache_destroys_after_use(clock: Clock) -> None:
    cache = _cache(clock, size=0)
    obj = FakeObject(1)
    entry = cache.adopt(_key(1), handle=1, owner=obj, generation=0)
    assert obj.destroyed == 0
    cache.release(entry)
    assert obj.destroyed == 1
    assert cache.lease(_key(1)) is None


def test_reset_never_destroys_objects_of_old_sessions(clock: Clock) -> None:
    cache = _cache(clock)
    idle = _put(cache, 1)
    busy = _put(cache, 2)
    held = cache.lease(_key(2))
    assert held is not None
    cache.reset(generation=1)
    cache.release(held)
    assert (idle.destroyed, busy.destroyed) == (0, 0)
    assert cache.lease(_key(1)) is None
    # A handle unwrapped in an old session after the reset is used once, not cached.
    late = FakeObject(3)
    entry = cache.adopt(_key(3), handle=3, owner=late, generation=0)
    cache.release(entry)
    assert late.destroyed == 0 and cache.lease(_key(3)) is None
    fresh = _put(cache, 4, generation=1)
    assert cache.lease(_key(4)) is not None and fresh.destroyed == 0
