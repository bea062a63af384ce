"""TTLCache, IdempotencyCache and SummaryCache (expiry on a fake clock)."""

from __future__ import annotations

import math
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline import IdempotencyCache, OutputLevel, SummaryCache, TTLCache, ToolCachePolicy, ToolExecutionResult
from pipeline._exceptions import ConfigError


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def ok_result(observation: str = "42 rows") -> ToolExecutionResult:
    return ToolExecutionResult(tool_call_id="call_1", observation=observation, success=True)


def test_it_stores_and_returns_values():
    cache: TTLCache[str, int] = TTLCache()
    cache.set("a", 1)
    assert cache.get("a") == 1
    assert "a" in cache and "b" not in cache
    assert cache.get("b") is None
    assert len(cache) == 1
    assert cache.delete("a") is True and cache.delete("a") is False
    assert cache.get("a") is None


def test_it_expires_entries_with_fake_clock():
    clock = FakeClock()
    cache: TTLCache[str, str] = TTLCache(default_ttl_seconds=10, clock=clock)
    cache.set("short", "x", ttl_seconds=1)
    cache.set("default", "y")
    clock.advance(1)
    assert cache.get("short") is None  # expiry is inclusive: at exactly ttl it is gone
    assert "default" in cache
    clock.advance(8.999)
    assert cache.get("default") == "y"
    clock.advance(0.001)
    assert "default" not in cache
    assert cache.get("default") is None
    assert cache.stats().expirations == 2


def test_it_never_expires_with_ttl_none_with_fake_clock():
    clock = FakeClock()
    cache: TTLCache[str, str] = TTLCache(default_ttl_seconds=None, clock=clock)
    cache.set("k", "v")
    clock.advance(10**9)
    assert cache.get("k") == "v"
    timed: TTLCache[str, str] = TTLCache(default_ttl_seconds=5, clock=clock)
    timed.set("forever", "v", ttl_seconds=math.inf)
    clock.advance(10**9)
    assert timed.get("forever") == "v"


def test_it_evicts_the_least_recently_used_at_max_size():
    cache: TTLCache[str, int] = TTLCache(max_size=3)
    for key in "abc":
        cache.set(key, ord(key))
    assert cache.get("a") == ord("a")  # a is now most recent
    cache.set("d", 4)
    assert "b" not in cache
    assert [k for k in "acd" if k in cache] == ["a", "c", "d"]
    assert len(cache) == 3
    assert cache.stats().evictions == 1


def test_it_evicts_expired_entries_before_live_ones_with_fake_clock():
    clock = FakeClock()
    cache: TTLCache[str, int] = TTLCache(max_size=3, default_ttl_seconds=100, clock=clock)
    cache.set("old-but-live", 1)
    cache.set("expiring", 2, ttl_seconds=1)
    cache.set("recent", 3)
    clock.advance(5)
    cache.set("new", 4)
    assert "old-but-live" in cache  # LRU, but the expired entry went first
    assert "expiring" not in cache
    stats = cache.stats()
    assert (stats.evictions, stats.expirations) == (0, 1)


def test_it_updates_an_existing_key_without_evicting():
    cache: TTLCache[str, int] = TTLCache(max_size=2)
    cache.set("a", 1)
    cache.set("b", 2)
    cache.set("a", 10)
    assert cache.get("a") == 10 and cache.get("b") == 2
    assert cache.stats().evictions == 0


def test_it_counts_hits_and_misses():
    cache: TTLCache[str, int] = TTLCache()
    cache.set("a", 1)
    cache.get("a")
    cache.get("a")
    cache.get("zzz")
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.size) == (2, 1, 1)
    assert stats.as_dict()["max_size"] == 1000


def test_it_clears_and_purges_with_fake_clock():
    clock = FakeClock()
    cache: TTLCache[int, int] = TTLCache(default_ttl_seconds=10, clock=clock)
    for i in range(5):
        cache.set(i, i, ttl_seconds=1 if i % 2 else None)
    clock.advance(2)
    assert cache.purge_expired() == 2
    assert len(cache) == 3
    cache.clear()
    assert len(cache) == 0 and cache.get(0) is None


def test_it_keeps_its_heap_bounded_under_churn_with_fake_clock():
    clock = FakeClock()
    cache: TTLCache[int, int] = TTLCache(max_size=10, default_ttl_seconds=60, clock=clock)
    for i in range(10_000):
        cache.set(i % 15, i)
        clock.advance(0.001)
    assert len(cache) == 10
    assert len(cache._expiry_heap) <= 2 * 10 + 64 + 1


@pytest.mark.parametrize("max_size", [0, -1, 1.5, "10", True, None])
def test_it_rejects_a_bad_max_size(max_size):
    with pytest.raises(ConfigError, match="max_size"):
        TTLCache(max_size=max_size)


@pytest.mark.parametrize("ttl", [0, -5, float("nan"), "300", True])
def test_it_rejects_a_bad_ttl(ttl):
    with pytest.raises(ConfigError, match="default_ttl_seconds"):
        TTLCache(default_ttl_seconds=ttl)
    cache: TTLCache[str, int] = TTLCache()
    with pytest.raises(ConfigError, match="ttl_seconds"):
        cache.set("k", 1, ttl_seconds=ttl)
    assert "k" not in cache


def test_it_stays_bounded_and_consistent_across_threads():
    cache: TTLCache[int, int] = TTLCache(max_size=50, default_ttl_seconds=60)
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def work(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait()
        for _ in range(3000):
            key = rng.randrange(200)
            op = rng.random()
            if op < 0.5:
                cache.set(key, key * 2)
            elif op < 0.9:
                value = cache.get(key)
                if value is not None and value != key * 2:
                    errors.append(f"{key} -> {value}")
            else:
                cache.delete(key)
            if len(cache) > 50:
                errors.append("over max_size")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    assert errors == []
    assert len(cache) <= 50
    stats = cache.stats()
    assert stats.hits + stats.misses > 0 and stats.evictions > 0


def test_it_calls_the_clock_outside_the_lock():
    cache: TTLCache[str, int]

    def clock() -> float:
        assert not cache._lock.locked()
        return 0.0

    cache = TTLCache(clock=clock)
    cache.set("a", 1)
    cache.get("a")
    assert "a" in cache
    cache.purge_expired()


@pytest.mark.parametrize(
    ("policy", "ttl"),
    [
        (ToolCachePolicy.NO_CACHE, 0),
        (ToolCachePolicy.CACHEABLE, 3600),
        (ToolCachePolicy.TTL_SHORT, 300),
        (ToolCachePolicy.TTL_MEDIUM, 3600),
        (ToolCachePolicy.TTL_LONG, 86400),
        ("ttl_short", 300),
    ],
)
def test_it_maps_cache_policies_to_ttls(policy, ttl):
    assert IdempotencyCache().ttl_for(policy) == ttl


def test_it_uses_the_default_ttl_for_cacheable():
    assert IdempotencyCache(default_ttl_seconds=120).ttl_for(ToolCachePolicy.CACHEABLE) == 120
    assert IdempotencyCache(default_ttl_seconds=None).ttl_for(ToolCachePolicy.CACHEABLE) is None


def test_it_remembers_successful_results_by_policy_with_fake_clock():
    clock = FakeClock()
    cache = IdempotencyCache(clock=clock)
    assert cache.remember("k-short", ok_result(), ToolCachePolicy.TTL_SHORT) is True
    assert cache.remember("k-long", ok_result(), ToolCachePolicy.TTL_LONG) is True
    clock.advance(301)
    assert cache.get("k-short") is None
    assert cache.get("k-long") is not None
    clock.advance(86400)
    assert cache.get("k-long") is None


def test_it_never_caches_no_cache_or_errors():
    cache = IdempotencyCache()
    assert cache.remember("k", ok_result(), ToolCachePolicy.NO_CACHE) is False
    failed = ToolExecutionResult(tool_call_id="c", observation="Tool Error", success=False, error_type="timeout")
    assert cache.remember("k", failed, ToolCachePolicy.TTL_LONG) is False
    assert len(cache) == 0


def test_it_stores_a_copy_and_marks_lookups_as_hits():
    cache = IdempotencyCache()
    result = ok_result("original")
    cache.remember("k", result, ToolCachePolicy.CACHEABLE)
    result.observation = "mutated by the caller"
    hit = cache.lookup("k", tool_call_id="call_2")
    assert hit is not None
    assert (hit.observation, hit.cache_hit, hit.tool_call_id) == ("original", True, "call_2")
    hit.observation = "mutated again"
    assert cache.get("k").observation == "original"
    assert cache.get("k").cache_hit is False
    assert cache.lookup("missing") is None


def test_it_misses_a_lookup_at_another_output_level():
    cache = IdempotencyCache()
    cache.remember("k", ok_result(), ToolCachePolicy.CACHEABLE)  # rendered at STANDARD
    assert cache.lookup("k", "call_2", OutputLevel.BRIEF) is None
    hit = cache.lookup("k", "call_2", OutputLevel.STANDARD)
    assert hit is not None and hit.cache_hit and hit.tool_call_id == "call_2"


def test_it_refuses_empty_idempotency_keys():
    with pytest.raises(ConfigError, match="key"):
        IdempotencyCache().remember("", ok_result(), ToolCachePolicy.CACHEABLE)


def test_it_makes_stable_unambiguous_summary_keys():
    key = SummaryCache.key_for(["ab", "c"], "claude-3")
    assert key == SummaryCache.key_for(["ab", "c"], "claude-3")
    assert len(key) == 64 and int(key, 16) >= 0
    assert key != SummaryCache.key_for(["a", "bc"], "claude-3")
    assert key != SummaryCache.key_for(["ab", "c"], "gpt-4")
    assert key != SummaryCache.key_for(["c", "ab"], "claude-3")
    assert SummaryCache.key_for([], "m") != SummaryCache.key_for([""], "m")
    assert SummaryCache.key_for(["\ud800 surrogate", "中文"], "m")


def test_it_refuses_non_text_summary_keys():
    with pytest.raises(TypeError):
        SummaryCache.key_for("not a list", "m")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SummaryCache.key_for([1, 2], "m")  # type: ignore[list-item]


def test_it_caches_summaries_for_a_day_with_fake_clock():
    clock = FakeClock()
    cache = SummaryCache(clock=clock)
    key = cache.key_for(["hello"], "m")
    cache.set(key, {"summary": "greeting"})
    clock.advance(86399)
    assert cache.get(key) == {"summary": "greeting"}
    clock.advance(1)
    assert cache.get(key) is None
