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

    The table therefore holds only keys in use, so it needs no size bound: the
    design's ``max_locks`` is accepted and not needed (nothing idle is kept to evict).
    """

    def __init__(self, max_locks: int = 1000) -> None:
        if isinstance(max_locks, bool) or not isinstance(max_locks, int) or max_locks < 1:
            raise ValueError("max_locks must be a positive integer")
        self.max_locks = max_locks
        self._entries: dict[str, _LockEntry] = {}
        self._guard = threading.Lock()

    @contextmanager
    def acquire(self, key: str, timeout: Optional[float] = None) -> Iterator[Any]:
        """The design's form of ``lock``: yields the key's RLock while held.
        Raises LockTimeoutError (a TimeoutError) if not had within ``timeout`` s."""
        entry = self._check_out(key)
        try:
            acquired = entry.lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout))
            if not acquired:
                raise LockTimeoutError(f"Failed to acquire lock for {key[:80]!r} within {timeout} s")
            try:
                yield entry.lock
            finally:
                entry.lock.release()
        finally:
            self._check_in(key, entry)

    def get_ref_count(self, key: str) -> int:
        """The design's name of ``ref_count``."""
        return self.ref_count(key)

    def cleanup(self, key: str) -> bool:
        """The design's explicit clean-up: True if ``key`` has no lock in use (there is
        then nothing to remove: unused locks are removed as soon as released), False
        while someone holds or waits for it."""
        return self.ref_count(key) == 0

    def clear_all(self) -> None:
        """The design's shutdown call. Locks in use are never dropped (a thread
        holding one would otherwise share its critical section with the next taker);
        unused ones are already gone, so this only checks the table."""
        with self._guard:
            for key in [k for k, e in self._entries.items() if e.users == 0]:
                del self._entries[key]

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


class ConversationLock:
    """A per-key lock handle with ``threading.Lock``'s interface (``acquire``,
    ``release``, ``with``) whose lock lives in a LockManager: held or waited for, it
    cannot be evicted, so two holders of one key always share one lock."""

    def __init__(self, manager: LockManager, key: str) -> None:
        self._manager = manager
        self._key = key
        self._held: list[_LockEntry] = []  # entries this handle acquired (re-entrant)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        entry = self._manager._check_out(self._key)
        try:
            acquired = entry.lock.acquire(blocking, timeout)
        except BaseException:
            self._manager._check_in(self._key, entry)
            raise
        if not acquired:
            self._manager._check_in(self._key, entry)
            return False
        self._held.append(entry)
        return True

    def release(self) -> None:
        if not self._held:
            raise RuntimeError("release unlocked lock")
        entry = self._held.pop()
        entry.lock.release()
        self._manager._check_in(self._key, entry)

    def __enter__(self) -> "ConversationLock":
        self.acquire()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.release()


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


def thread_config(conversation_id: str) -> dict[str, Any]:
    """The LangGraph config addressing a conversation's thread."""
    return {"configurable": {"thread_id": conversation_id}}


def _is_langchain_state(snapshot: Any, current: list[Any]) -> bool:
    try:
        from langchain_core.messages import BaseMessage
    except ImportError:  # langchain is an optional extra
        return False
    if any(isinstance(message, BaseMessage) for message in current):
        return True
    # A LangGraph StateSnapshot (values, next, config, ...) of a thread with no messages yet.
    return hasattr(snapshot, "values") and hasattr(snapshot, "next") and hasattr(snapshot, "config")


def to_langchain_message(message: Mapping[str, Any]) -> Any:
    """The design's conversion of an injected dict: user -> HumanMessage, assistant
    -> AIMessage (system -> SystemMessage, tool -> ToolMessage), ``additional_kwargs``
    kept and ``isMeta`` carried in them."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    extra = dict(message.get("additional_kwargs") or {})
    if message.get("isMeta"):
        extra["isMeta"] = True
    role, content = message["role"], message["content"]
    if role == "user":
        return HumanMessage(content=content, additional_kwargs=extra)
    if role == "assistant":
        return AIMessage(content=content, additional_kwargs=extra)
    if role == "system":
        return SystemMessage(content=content, additional_kwargs=extra)
    return ToolMessage(content=content, tool_call_id=message.get("tool_call_id", ""), additional_kwargs=extra)


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

    @classmethod
    def _get_lock(cls, conversation_id: str) -> ConversationLock:
        """v2.1's per-conversation lock: a handle on the global LockManager's lock
        for the conversation (the design's ``lru_cache`` could evict a held lock)."""
        return ConversationLock(get_lock_manager(), conversation_id)

    @staticmethod
    @contextmanager
    def _conversation_lock(conversation_id: str, lock_manager: Optional[LockManager] = None) -> Iterator[Any]:
        """The design's helper: hold the conversation's lock (the global manager's
        unless one is given)."""
        manager = lock_manager if lock_manager is not None else get_lock_manager()
        with manager.acquire(conversation_id) as lock:
            yield lock

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

        ``agent_state`` is a compiled LangGraph graph with a checkpointer, or any
        object with its two methods: ``get_state(config)`` returning the state (a
        StateSnapshot, a mapping, or an object with ``messages``) and
        ``update_state(config, values)`` taking ``{"messages": the new full list}``,
        where ``config`` is ``{"configurable": {"thread_id": conversation_id}}``.
        Into a state holding LangChain messages (any LangGraph state) the dicts go as
        HumanMessage / AIMessage / SystemMessage, as the design converts them; into a
        dict state, as dicts. Returns False, logging why, for malformed messages, a
        state object without those methods, a failing state (a graph without a
        checkpointer), or a lock not had within ``timeout``: the agent keeps running
        and the state is left as it was.
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
                config = thread_config(conversation_id)
                snapshot = agent_state.get_state(config)
                current = _current_messages(snapshot)
                if _is_langchain_state(snapshot, current):
                    new = [to_langchain_message(m) for m in messages]
                else:
                    new = [dict(m) for m in messages]
                agent_state.update_state(config, {"messages": current + new})
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
