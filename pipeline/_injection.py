"""Injecting a skill's messages into an agent's state, safely from many threads.

Each conversation's state is read, extended and written back under that
conversation's own lock, so two activations in one conversation cannot lose each
other's messages while different conversations never wait on each other.

The seeds kept per-conversation locks in an LRU cache: evicting a lock that a
thread still held let a second thread create a fresh lock for the same key and
enter the critical section beside the first. Here a lock lives exactly as long as
someone holds or waits for it (reference counted) and is removed only at zero.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from ._exceptions import LockTimeoutError

logger = logging.getLogger(__name__)

ROLES = frozenset({"system", "user", "assistant", "tool"})
MAX_INJECTED_MESSAGES = 256


class _LockEntry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.users = 0  # threads holding or waiting for this lock


class LockManager:
    """Per-key locks, reference counted: created on first use, removed when the last
    user lets go, never replaced while anyone holds or waits for them.

    The table therefore holds only keys in use, so it needs no size bound.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _LockEntry] = {}
        self._guard = threading.Lock()

    @contextmanager
    def lock(self, key: str, timeout: Optional[float] = None) -> Iterator[None]:
        """Hold the lock for ``key`` for the ``with`` block (re-entrant per thread).

        Raises LockTimeoutError if it cannot be had within ``timeout`` seconds.
        """
        entry = self._check_out(key)
        try:
            acquired = entry.lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout))
            if not acquired:
                raise LockTimeoutError(f"could not lock {key[:80]!r} within {timeout} s")
            try:
                yield
            finally:
                entry.lock.release()
        finally:
            self._check_in(key, entry)

    def _check_out(self, key: str) -> _LockEntry:
        with self._guard:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _LockEntry()
            entry.users += 1
            return entry

    def _check_in(self, key: str, entry: _LockEntry) -> None:
        with self._guard:
            entry.users -= 1
            if entry.users == 0 and self._entries.get(key) is entry:
                del self._entries[key]

    def ref_count(self, key: str) -> int:
        """How many threads hold or wait for ``key``'s lock (0 if none)."""
        with self._guard:
            entry = self._entries.get(key)
            return 0 if entry is None else entry.users

    def __len__(self) -> int:
        """How many keys have a lock right now (all of them in use)."""
        with self._guard:
            return len(self._entries)


_default_lock_manager = LockManager()


def get_lock_manager() -> LockManager:
    """The process-wide LockManager injection uses when none is given."""
    return _default_lock_manager


def _check_messages(messages: Any) -> Optional[str]:
    """Why ``messages`` cannot be injected, or None if they can."""
    if not isinstance(messages, list):
        return "messages must be a list"
    if len(messages) > MAX_INJECTED_MESSAGES:
        return f"more than {MAX_INJECTED_MESSAGES} messages"
    for position, message in enumerate(messages):
        if not isinstance(message, Mapping):
            return f"message {position} is not a mapping"
        if message.get("role") not in ROLES:
            return f"message {position} has no valid role"
        if not isinstance(message.get("content"), str):
            return f"message {position} has no string content"
        if "isMeta" in message and not isinstance(message["isMeta"], bool):
            return f"message {position} has a non-boolean isMeta"
    return None


def _current_messages(state: Any) -> list[Any]:
    """The 'messages' list of a state: a mapping, a LangGraph StateSnapshot
    (``.values``) or an object with a ``messages`` attribute. Missing means empty."""
    if isinstance(state, Mapping):
        current = state.get("messages", [])
    elif isinstance(getattr(state, "values", None), Mapping):
        current = state.values.get("messages", [])
    else:
        current = getattr(state, "messages", [])
    if current is None:
        return []
    if not isinstance(current, (list, tuple)):
        raise TypeError(f"state messages is a {type(current).__name__}, not a list")
    return list(current)


class MessageInjectionProtocol:
    """Appends skill messages (SkillActivationResult.to_llm_messages()) to a
    conversation's agent state, atomically per conversation."""

    @staticmethod
    def inject_into_state(
        messages: list[dict[str, Any]],
        conversation_id: str,
        agent_state: Any,
        lock_manager: Optional[LockManager] = None,
        *,
        timeout: Optional[float] = None,
    ) -> bool:
        """Append ``messages`` to the state's message list; True on success.

        ``agent_state`` is any object with ``get_state()`` returning the state and
        ``update_state(dict)`` taking ``{"messages": the new full list}``. Returns
        False, logging why, for malformed messages, a state object without those
        methods, a failing state, or a lock not had within ``timeout``: the agent
        keeps running and the state is left as it was.
        """
        problem = _check_messages(messages)
        if problem is None and not (isinstance(conversation_id, str) and conversation_id):
            problem = "conversation_id must be a non-empty string"
        if problem is None and not (
            callable(getattr(agent_state, "get_state", None))
            and callable(getattr(agent_state, "update_state", None))
        ):
            problem = f"agent state {type(agent_state).__name__} has no get_state()/update_state()"
        if problem is not None:
            logger.error("skill message injection refused: %s", problem)
            return False

        manager = lock_manager if lock_manager is not None else get_lock_manager()
        try:
            with manager.lock(conversation_id, timeout=timeout):
                current = _current_messages(agent_state.get_state())
                agent_state.update_state({"messages": current + [dict(m) for m in messages]})
        except LockTimeoutError as exc:
            logger.error("skill message injection into %r gave up: %s", conversation_id[:80], exc)
            return False
        except Exception as exc:  # the agent's state is foreign code: report, do not crash
            logger.error(
                "skill message injection into %r failed: %s: %s",
                conversation_id[:80],
                type(exc).__name__,
                exc,
            )
            return False
        return True
