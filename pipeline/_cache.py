"""TTL caches (seeds v2.0 "通用 TTL 缓存基类"): one generic, bounded, thread-safe
cache and its two uses, the tool idempotency cache and the summary cache.

Bounded for real: at ``max_size`` a new key first evicts expired entries, then the
least recently used one. Recency lives in an OrderedDict (O(1) per get/set);
expiry order in a heap with lazy deletion (O(log n) amortised), so "evict
expired first" needs no scan of the whole cache. One lock; the clock and any
other user code are called outside it.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Generic, Hashable, Literal, Optional, TypeVar, Union

from ._config import require
from ._exceptions import ConfigError
from ._levels import OutputLevel
from ._models import ToolCachePolicy, ToolExecutionResult

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

Clock = Callable[[], float]

#: TTL in seconds of each cache policy; CACHEABLE uses the cache's default TTL.
POLICY_TTL_SECONDS: dict[ToolCachePolicy, float] = {
    ToolCachePolicy.TTL_SHORT: 300.0,
    ToolCachePolicy.TTL_MEDIUM: 3600.0,
    ToolCachePolicy.TTL_LONG: 86400.0,
}


def _check_ttl(value: object, field: str) -> Optional[float]:
    if value is None:
        return None
    require(
        isinstance(value, (int, float)) and not isinstance(value, bool),
        field,
        "must be a number of seconds or None",
    )
    ttl = float(value)  # type: ignore[arg-type]
    require(not math.isnan(ttl) and ttl > 0, field, "must be greater than 0 (None means no expiry)")
    return None if math.isinf(ttl) else ttl


@dataclass
class _Entry(Generic[V]):
    value: V
    expires_at: Optional[float]


@dataclass(frozen=True)
class CacheStats:
    """Counters since creation (``clear`` keeps them)."""

    hits: int
    misses: int
    evictions: int  # removed to make room (least recently used)
    expirations: int  # removed because their TTL had passed
    size: int
    max_size: int

    def as_dict(self) -> dict[str, int]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "expirations": self.expirations,
            "size": self.size,
            "max_size": self.max_size,
        }


_UNSET: Any = object()


def _seconds(value: Any) -> Any:
    """A TTL given as a timedelta (the seeds' ``ttl=``) in seconds; others as given."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def _documented_sizes(
    max_size: Any, default_ttl: Any, ttl: Any, max_entries: Any, default_max: int, default_secs: Any
) -> tuple[Any, Any]:
    """Fold the seeds' ``(ttl: timedelta, max_entries)`` forms (keywords, or
    positional with a timedelta first) into (max_size, default_ttl_seconds)."""
    if isinstance(max_size, timedelta):  # TTLCache(timedelta(...), 100) as in v2.0
        if ttl is not None:
            raise ConfigError("ttl", "given twice")
        ttl, max_size = max_size, _UNSET
        if default_ttl is not _UNSET:
            if max_entries is not None:
                raise ConfigError("max_entries", "given twice")
            max_entries, default_ttl = default_ttl, _UNSET
    if ttl is not None:
        if default_ttl is not _UNSET:
            raise ConfigError("ttl", "give ttl or default_ttl_seconds, not both")
        default_ttl = _seconds(ttl)
    if max_entries is not None:
        if max_size is not _UNSET:
            raise ConfigError("max_entries", "give max_entries or max_size, not both")
        max_size = max_entries
    return (default_max if max_size is _UNSET else max_size), (
        default_secs if default_ttl is _UNSET else _seconds(default_ttl)
    )


class TTLCache(Generic[K, V]):
    """A bounded LRU cache whose entries expire after a TTL.

    ``default_ttl_seconds=None`` means entries never expire unless ``set`` gives a
    TTL; ``set(..., ttl_seconds=math.inf)`` stores one entry without expiry. The
    seeds' constructor, ``TTLCache(ttl=timedelta(...), max_entries=1000)`` (or
    positional with the timedelta first), is taken too.
    """

    def __init__(
        self,
        max_size: Any = _UNSET,
        default_ttl_seconds: Any = _UNSET,
        clock: Clock = time.monotonic,
        *,
        ttl: Union[timedelta, float, None] = None,
        max_entries: Optional[int] = None,
    ) -> None:
        max_size, default_ttl_seconds = _documented_sizes(
            max_size, default_ttl_seconds, ttl, max_entries, 1000, 300
        )
        require(
            isinstance(max_size, int) and not isinstance(max_size, bool) and max_size >= 1,
            "max_size",
            "must be an integer of at least 1",
        )
        require(callable(clock), "clock", "must be callable")
        self._max_size = max_size
        self._default_ttl = _check_ttl(default_ttl_seconds, "default_ttl_seconds")
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[K, _Entry[V]] = OrderedDict()
        self._expiry_heap: list[tuple[float, int, K]] = []
        self._seq = itertools.count()
        self._hits = self._misses = self._evictions = self._expirations = 0

    @property
    def max_size(self) -> int:
        return self._max_size

    @property
    def default_ttl_seconds(self) -> Optional[float]:
        return self._default_ttl

    def get(self, key: K) -> Optional[V]:
        """The value, or None when absent or expired. A hit makes it most recent."""
        now = self._clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                return None
            if entry.expires_at is not None and entry.expires_at <= now:
                del self._entries[key]
                self._expirations += 1
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return entry.value

    def set(self, key: K, value: V, ttl_seconds: Optional[float] = None) -> None:
        """Store ``value``; ``ttl_seconds=None`` uses the cache's default TTL."""
        ttl = self._default_ttl if ttl_seconds is None else _check_ttl(ttl_seconds, "ttl_seconds")
        now = self._clock()
        expires_at = None if ttl is None else now + ttl
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
            elif len(self._entries) >= self._max_size:
                self._make_room(now)
            self._entries[key] = _Entry(value, expires_at)
            if expires_at is not None:
                heapq.heappush(self._expiry_heap, (expires_at, next(self._seq), key))
                if len(self._expiry_heap) > 2 * self._max_size + 64:
                    self._compact_heap()

    def delete(self, key: K) -> bool:
        """Remove ``key``; True if it was there."""
        with self._lock:
            return self._entries.pop(key, None) is not None

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._expiry_heap.clear()

    def purge_expired(self) -> int:
        """Drop every expired entry now; returns how many."""
        now = self._clock()
        with self._lock:
            return self._drop_expired(now, limit=None)

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._evictions, self._expirations, len(self._entries), self._max_size)

    def size(self) -> int:
        """The seeds' name for ``len(cache)``."""
        return len(self)

    def __len__(self) -> int:
        """Entries held, expired ones not yet dropped included."""
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Present and not expired; does not count as a hit or change recency."""
        now = self._clock()
        with self._lock:
            entry = self._entries.get(key)  # type: ignore[call-overload]
            return entry is not None and (entry.expires_at is None or entry.expires_at > now)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} size={len(self)} max_size={self._max_size}>"

    # --- internals; the lock is held -------------------------------------------

    def _make_room(self, now: float) -> None:
        if self._drop_expired(now, limit=1):
            return
        self._entries.popitem(last=False)
        self._evictions += 1

    def _drop_expired(self, now: float, limit: Optional[int]) -> int:
        heap = self._expiry_heap
        dropped = 0
        while heap and heap[0][0] <= now and (limit is None or dropped < limit):
            expires_at, _, key = heapq.heappop(heap)
            entry = self._entries.get(key)
            # Stale heap items (key re-set or deleted since) are skipped.
            if entry is not None and entry.expires_at == expires_at:
                del self._entries[key]
                self._expirations += 1
                dropped += 1
        return dropped

    def _compact_heap(self) -> None:
        self._expiry_heap = [
            item
            for item in self._expiry_heap
            if (entry := self._entries.get(item[2])) is not None and entry.expires_at == item[0]
        ]
        heapq.heapify(self._expiry_heap)


class IdempotencyCache(TTLCache[str, ToolExecutionResult]):
    """Results of successful tool executions by idempotency key (seeds v2.1: the
    key leaves out tool_call_id, so a repeated call reuses the earlier result)."""

    def __init__(
        self,
        max_size: Any = _UNSET,
        default_ttl_seconds: Any = _UNSET,
        clock: Clock = time.monotonic,
        *,
        ttl_seconds: Optional[float] = None,
        max_entries: Optional[int] = None,
        ttl: Union[timedelta, float, None] = None,
    ) -> None:
        """Defaults 10,000 entries, 1 hour; the seeds' ``ttl_seconds=`` and
        ``max_entries=`` keywords are taken too."""
        if ttl_seconds is not None:
            if ttl is not None:
                raise ConfigError("ttl_seconds", "give ttl_seconds or ttl, not both")
            ttl = ttl_seconds
        max_size, default_ttl_seconds = _documented_sizes(
            max_size, default_ttl_seconds, ttl, max_entries, 10_000, 3600
        )
        super().__init__(max_size=max_size, default_ttl_seconds=default_ttl_seconds, clock=clock)

    def get_cached_result(self, key: str) -> Optional[ToolExecutionResult]:
        """The seeds' name: the result cached under ``key`` (a copy), or None."""
        cached = self.get(key)
        return None if cached is None else cached.model_copy(deep=True)

    def cache_result(self, key: str, result: ToolExecutionResult) -> None:
        """The seeds' name: cache ``result`` (a copy) under ``key`` for the default TTL."""
        self.set(key, result.model_copy(deep=True))

    def ttl_for(self, policy: ToolCachePolicy) -> Union[float, None, Literal[0]]:
        """0: do not cache (NO_CACHE); None: no expiry (CACHEABLE on a cache
        without default TTL); otherwise seconds."""
        policy = ToolCachePolicy(policy)
        if policy is ToolCachePolicy.NO_CACHE:
            return 0
        if policy is ToolCachePolicy.CACHEABLE:
            return self.default_ttl_seconds
        return POLICY_TTL_SECONDS[policy]

    def remember(self, key: str, result: ToolExecutionResult, policy: ToolCachePolicy) -> bool:
        """Cache a successful result under ``policy``; never NO_CACHE, never an
        error. Returns whether it was stored. A copy is stored, so later changes
        to ``result`` do not leak into the cache."""
        if not isinstance(key, str) or not key:
            raise ConfigError("key", "an idempotency key must be a non-empty string")
        ttl = self.ttl_for(policy)
        if ttl == 0 or not result.success:
            return False
        self.set(key, result.model_copy(deep=True), ttl_seconds=math.inf if ttl is None else ttl)
        return True

    def lookup(
        self,
        key: str,
        tool_call_id: Optional[str] = None,
        output_level: Optional[OutputLevel] = None,
    ) -> Optional[ToolExecutionResult]:
        """A copy of the cached result marked ``cache_hit=True`` (and answering
        ``tool_call_id`` when given, since the model's new call has a new id).

        The key leaves out the output level, so with ``output_level`` a result
        rendered at another level is a miss: it is not this call's observation."""
        cached = self.get(key)
        if cached is None:
            return None
        if output_level is not None and cached.output_level is not OutputLevel(output_level):
            return None
        update: dict[str, object] = {"cache_hit": True}
        if tool_call_id is not None:
            update["tool_call_id"] = tool_call_id
        return cached.model_copy(update=update, deep=True)


class SummaryCache(TTLCache[str, dict]):
    """LLM summaries of message runs (seeds: 24 h), keyed by the texts and model."""

    def __init__(
        self,
        max_size: Any = _UNSET,
        default_ttl_seconds: Any = _UNSET,
        clock: Clock = time.monotonic,
        *,
        ttl_hours: Optional[float] = None,
        max_entries: Optional[int] = None,
        ttl: Union[timedelta, float, None] = None,
    ) -> None:
        """Defaults 1,000 entries, 24 hours; the seeds' ``ttl_hours=`` and
        ``max_entries=`` keywords are taken too."""
        if ttl_hours is not None:
            if ttl is not None:
                raise ConfigError("ttl_hours", "give ttl_hours or ttl, not both")
            require(
                isinstance(ttl_hours, (int, float)) and not isinstance(ttl_hours, bool),
                "ttl_hours",
                "must be a number of hours",
            )
            ttl = ttl_hours * 3600.0
        max_size, default_ttl_seconds = _documented_sizes(
            max_size, default_ttl_seconds, ttl, max_entries, 1000, 86400
        )
        super().__init__(max_size=max_size, default_ttl_seconds=default_ttl_seconds, clock=clock)

    @staticmethod
    def _make_key(conversation_id: str, message_hash: str) -> str:
        return f"{conversation_id}:{message_hash}"

    def get_cached_summary(self, conversation_id: str, message_hash: str) -> Optional[str]:
        """The seeds' form: the summary cached for these messages, or None."""
        cached = self.get(self._make_key(conversation_id, message_hash))
        return cached.get("summary") if isinstance(cached, dict) else None

    def cache_summary(
        self,
        conversation_id: str,
        message_hash: str,
        summary: str,
        metadata: Optional[dict] = None,
    ) -> None:
        """The seeds' form: cache ``{"summary", "timestamp", "metadata"}``."""
        self.set(
            self._make_key(conversation_id, message_hash),
            {"summary": summary, "timestamp": datetime.now().isoformat(), "metadata": metadata or {}},
        )

    @staticmethod
    def key_for(texts: list[str], model: str) -> str:
        """sha256 over the model and each text, length-prefixed so that
        ["ab", "c"] and ["a", "bc"] never share a key."""
        if not isinstance(model, str) or not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
            raise TypeError("key_for expects a list of strings and a model name")
        digest = hashlib.sha256()
        for part in (model, *texts):
            data = part.encode("utf-8", "surrogatepass")
            digest.update(len(data).to_bytes(8, "big"))
            digest.update(data)
        return digest.hexdigest()


_global_idempotency_cache: Optional[IdempotencyCache] = None
_global_lock = threading.Lock()


def get_idempotency_cache() -> IdempotencyCache:
    """The process-wide idempotency cache (seeds v2.0), created on first use."""
    global _global_idempotency_cache
    if _global_idempotency_cache is None:
        with _global_lock:
            if _global_idempotency_cache is None:
                _global_idempotency_cache = IdempotencyCache()
    return _global_idempotency_cache
