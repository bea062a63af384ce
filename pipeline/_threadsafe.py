"""The seeds' two thread-safety helpers: ThreadSafeMixin (v2.1 "核心组件") and
ThreadSafeContainer (v2.0 §4 "完整的线程安全考虑")."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Generic, Iterator, Optional, TypeVar

T = TypeVar("T")


class ThreadSafeMixin:
    """Gives a class ``self._lock`` and ``with self._with_lock():``.

    Subclasses call ``super().__init__()``, as the seeds say. A subclass that
    forgets gets its lock on first use instead of an AttributeError."""

    _lock: threading.Lock

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # cooperative: the mixin may sit before other bases
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> object:
        if name == "_lock":  # super().__init__() was not called: make the lock now
            return _first_lock(self)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @contextmanager
    def _with_lock(self) -> Iterator[None]:
        with self._lock:
            yield


_LOCK_FOR_LOCKS = threading.Lock()


def _first_lock(obj: ThreadSafeMixin) -> threading.Lock:
    with _LOCK_FOR_LOCKS:  # two threads racing to create it get the same lock
        lock = obj.__dict__.get("_lock")
        if lock is None:
            lock = obj.__dict__["_lock"] = threading.Lock()
        return lock


class ThreadSafeContainer(Generic[T]):
    """A dict of str keys behind a re-entrant lock; reads return copies of the
    key and item lists, so callers iterate without holding the lock."""

    def __init__(self) -> None:
        self._data: dict[str, T] = {}
        self._lock = threading.RLock()
        self._lock_count = 0  # nesting depth, as in the seeds (diagnostics)

    @contextmanager
    def _acquire(self) -> Iterator[None]:
        with self._lock:
            self._lock_count += 1
            try:
                yield
            finally:
                self._lock_count -= 1

    def get(self, key: str) -> Optional[T]:
        with self._acquire():
            return self._data.get(key)

    def set(self, key: str, value: T) -> None:
        with self._acquire():
            self._data[key] = value

    def delete(self, key: str) -> None:
        with self._acquire():
            self._data.pop(key, None)

    def keys(self) -> list[str]:
        with self._acquire():
            return list(self._data.keys())

    def items(self) -> list[tuple[str, T]]:
        with self._acquire():
            return list(self._data.items())

    def __len__(self) -> int:
        with self._acquire():
            return len(self._data)
