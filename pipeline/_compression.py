"""Context compression: shrink a conversation to a token target and say, message by
message, what was done (the ``CompressionResult`` the dashboard draws as a diff).

Messages are either dicts (``role`` / ``content`` / ``tool_calls`` /
``tool_call_id``, with ``content`` a string, ``None`` or a list of Claude-style blocks
``text`` / ``tool_use`` / ``tool_result`` / ...) or LangChain ``BaseMessage`` objects;
a compression returns the same kind it was given. Unchanged messages are returned as
the very same objects; a TRUNCATED one is a copy.

Decisions the seeds left open (documented here because callers depend on them):

- Tokens of a list are the sum of ``token_counter.count_message_tokens(m, model)``
  over its messages; ``tokens_after`` is exactly that recount of the returned list.
- Priority (seeds v2.1): system → CRITICAL, never dropped or shortened; user → HIGH;
  a tool result that is an error (``status="error"``, ``is_error``, or content
  starting ``"Operation failed."``) → HIGH; an AI message with tool calls → HIGH;
  plain AI text → MEDIUM; a successful tool result → MEDIUM; a verbose log → LOW.
  A message is a verbose log when it carries ``verbose: True`` (dict key, dict
  ``metadata``, or LangChain ``additional_kwargs``) or is named ``"log"``; the mark
  only demotes what would be MEDIUM (never a user message, an error or a tool call).
  A previous compression's summary is HIGH (not CRITICAL) so later summaries can
  absorb it instead of piling up.
- Tool pairing is atomic: an AI message with tool calls and all messages answering
  those calls form one unit, kept or dropped together. A result whose call is not in
  the list (already orphaned on input) is its own unit.
- ``keep_recent`` (messages at the end, widened to whole units) is kept unless the
  protected messages plus that window alone exceed the target; then the window's
  units are dropped too (lowest priority, then oldest, first).
- When a compression would leave no message except protected ones, the newest unit
  is shortened (TRUNCATED: the head of its longest text, up to
  ``truncate_max_chars``) if that fits, rather than dropping everything.
- SUMMARIZE replaces the oldest units (a prefix of the non-system messages) with one
  *system* message placed after the leading system messages, its content starting
  ``[Conversation summary: N earlier messages]``, marked with a ``summary_id`` key
  (dict) or ``additional_kwargs["summary_id"]`` (LangChain).
- Which summariser: with ``enable_llm_summarization`` off (the default) or a span
  shorter than ``llm_summarization_threshold`` messages, the built-in
  ``ExtractiveSummarizer``; otherwise the ``summarizer`` given, and with none given
  SUMMARIZE falls back to EXTRACT saying so. Every fallback (no summariser, cost cap,
  timeout, exception, empty answer, one still running) is recorded as
  ``requested_mode=SUMMARIZE, mode=EXTRACT, fallback_reason=...``; nothing is raised.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from ._compression_types import (
    CompressionMode,
    CompressionResult,
    CompressionSummary,
    MessageAction,
    MessageChange,
    MessagePriority,
)
from ._config import BaseConfig, require
from ._exceptions import ConfigError
from ._cache import SummaryCache
from ._summarizers import ExtractiveSummarizer, Summarizer, cut_to_tokens
from ._tokens import get_token_counter

__all__ = ["AdvancedContextManager", "BasicContextManager", "ContextCompressionConfig"]

ROLES = ("system", "user", "assistant", "tool")
CONTENT_BEFORE_MAX_CHARS = 2_000  # what a change carries for the diff page
MIN_TRUNCATED_CHARS = 32  # a shorter head is not worth keeping: drop instead
MIN_SUMMARY_TOKENS = 16  # below this there is no room for a useful summary
TOKEN_CACHE_SIZE = 50_000  # per-message analyses kept (LRU)
SUMMARY_HEADER = "[Conversation summary: {count} earlier messages]\n"
ERROR_PREFIX = "Operation failed."

_RANK = {  # drop order: lowest rank first
    MessagePriority.LOW: 0,
    MessagePriority.MEDIUM: 1,
    MessagePriority.HIGH: 2,
    MessagePriority.CRITICAL: 3,
}


# --------------------------------------------------------------------------- config


def _check_int(value: Any, name: str, minimum: int) -> None:
    require(isinstance(value, int) and not isinstance(value, bool), name, "must be an integer")
    require(value >= minimum, name, f"must be >= {minimum}")


def _check_number(value: Any, name: str, *, positive: bool) -> None:
    require(
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
        name,
        "must be a finite number",
    )
    if positive:
        require(value > 0, name, "must be > 0")
    else:
        require(value >= 0, name, "must be >= 0")


@dataclass
class ContextCompressionConfig(BaseConfig):
    """How and when a conversation is compressed (seeds v2.0 ``ContextCompressionConfig``).

    Compression fires when the context exceeds ``max_tokens * threshold_ratio`` and
    aims at ``max_tokens * target_ratio``, well below, so it does not fire again on
    the next round. ``enable_llm_summarization`` defaults to False: an agent with no
    LLM summariser configured gets free extractive summaries (the seeds default of
    True would make SUMMARIZE fall back on every call of such an agent).
    """

    strategy: CompressionMode = CompressionMode.EXTRACT
    keep_recent: int = 10  # messages at the end kept unless they alone bust the target
    threshold_ratio: float = 0.8
    max_tokens: int = 200_000  # the model's context window
    target_ratio: float = 0.5
    enable_llm_summarization: bool = False
    llm_summarization_threshold: int = 50  # messages in a span before the LLM is used
    summary_cache_ttl_seconds: float = 86_400.0
    max_cost_per_hour_usd: float = 0.1  # rolling hour of estimated summariser cost
    truncate_max_chars: int = 8_000  # most characters a TRUNCATED message keeps
    summary_max_tokens: int = 500  # the summary's budget (the seeds' max_summary_tokens)
    summary_timeout_seconds: float = 10.0  # how long compress() waits for the summariser

    def __post_init__(self) -> None:
        # "extract" from a dict or the remote config becomes the enum; anything else
        # is left for validate() to name.
        if isinstance(self.strategy, str) and not isinstance(self.strategy, CompressionMode):
            try:
                self.strategy = CompressionMode(self.strategy)
            except ValueError:
                pass

    def validate(self) -> bool:
        choices = ", ".join(m.value for m in CompressionMode)
        require(isinstance(self.strategy, CompressionMode), "strategy", f"must be one of {choices}")
        _check_int(self.keep_recent, "keep_recent", 0)
        _check_number(self.threshold_ratio, "threshold_ratio", positive=True)
        require(self.threshold_ratio <= 1, "threshold_ratio", "must be <= 1")
        _check_int(self.max_tokens, "max_tokens", 1)
        _check_number(self.target_ratio, "target_ratio", positive=True)
        require(
            self.target_ratio <= self.threshold_ratio,
            "target_ratio",
            "must not exceed threshold_ratio (compression would fire again at once)",
        )
        require(isinstance(self.enable_llm_summarization, bool), "enable_llm_summarization", "must be a boolean")
        _check_int(self.llm_summarization_threshold, "llm_summarization_threshold", 0)
        _check_number(self.summary_cache_ttl_seconds, "summary_cache_ttl_seconds", positive=True)
        _check_number(self.max_cost_per_hour_usd, "max_cost_per_hour_usd", positive=False)
        _check_int(self.truncate_max_chars, "truncate_max_chars", MIN_TRUNCATED_CHARS)
        _check_int(self.summary_max_tokens, "summary_max_tokens", MIN_SUMMARY_TOKENS)
        _check_number(self.summary_timeout_seconds, "summary_timeout_seconds", positive=True)
        return True

    @property
    def target_tokens(self) -> int:
        return max(1, int(self.max_tokens * self.target_ratio))

    def should_compress(self, current_tokens: int) -> bool:
        """True once the context is over ``max_tokens * threshold_ratio``."""
        if isinstance(current_tokens, bool) or not isinstance(current_tokens, int) or current_tokens < 0:
            raise ValueError("current_tokens must be a non-negative integer")
        return current_tokens > self.max_tokens * self.threshold_ratio


# ------------------------------------------------------------------ message reading


@dataclass(frozen=True)
class _Info:
    """What compression needs to know about one message; cached per message content."""

    role: str
    priority: MessagePriority
    why: str  # the priority in words
    tokens: int
    calls: tuple[str, ...]  # tool_call ids this message makes
    answers: tuple[str, ...]  # tool_call ids this message answers
    label: str  # "user", "tool error sql_query", ... (for the summariser)
    text: str  # readable content, tool calls on their own lines


def _canon(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)
    except (ValueError, RecursionError) as exc:  # circular or absurdly deep
        raise ValueError(f"message is not serialisable: {exc}") from None


def _dict_key(message: dict) -> tuple:
    # Strings go in as they are: hashing a str is cached by Python, and equal keys
    # compare by identity first, so a warm lookup of an unchanged message is cheap.
    return ("dict", *sorted((str(k), v) if type(v) is str else (str(k), None, _canon(v)) for k, v in message.items()))


def _lc_key(message: Any) -> tuple:
    content = message.content
    return (
        "lc",
        type(message).__name__,
        content if type(content) is str else ("json", _canon(content)),
        _canon(getattr(message, "tool_calls", None) or []),
        getattr(message, "tool_call_id", None),
        getattr(message, "status", None),
        getattr(message, "role", None),
        message.name,
        _canon(message.additional_kwargs) if message.additional_kwargs else "",
    )


def _check_content(content: Any, where: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ValueError(f"{where}: content must be a string, a list of blocks or None, not {type(content).__name__}")
    for block in content:
        if isinstance(block, str):
            continue
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ValueError(f"{where}: every content block must be a string or a dict with a 'type'")


def _short_json(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else _canon(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _block_result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b if isinstance(b, str) else str(b.get("text", f"[{b.get('type', 'block')}]"))
            for b in content
            if isinstance(b, (str, dict))
        )
    return "" if content is None else _short_json(content)


class _Parsed:
    """A message read into plain fields, whatever its kind."""

    __slots__ = ("role", "content", "tool_calls", "tool_call_id", "error", "verbose", "name", "summary")

    def __init__(self) -> None:
        self.role = ""
        self.content: Any = None
        self.tool_calls: list[tuple[str, str, Any]] = []  # (id, name, args)
        self.tool_call_id: Optional[str] = None
        self.error = False
        self.verbose = False
        self.name: Optional[str] = None
        self.summary = False


def _read_tool_calls(raw: Any, where: str) -> list[tuple[str, str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError(f"{where}: tool_calls must be a list")
    calls = []
    for call in raw:
        if not isinstance(call, dict):
            raise ValueError(f"{where}: every tool call must be a dict")
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        call_id = call.get("id")
        name = call.get("name") or function.get("name") or "?"
        args = call.get("args", call.get("input", function.get("arguments")))
        if call_id is not None and not isinstance(call_id, str):
            raise ValueError(f"{where}: tool call id must be a string")
        calls.append((call_id or "", str(name), args))
    return calls


def _parse_dict(message: dict, where: str) -> _Parsed:
    parsed = _Parsed()
    if "role" not in message:
        raise ValueError(f"{where}: missing 'role'")
    role = message["role"]
    if not isinstance(role, str) or role not in ROLES:
        shown = repr(role)[:40]
        raise ValueError(f"{where}: unknown role {shown} (expected one of {', '.join(ROLES)})")
    parsed.role = role
    _check_content(message.get("content"), where)
    parsed.content = message.get("content")
    parsed.tool_calls = _read_tool_calls(message.get("tool_calls"), where)
    call_id = message.get("tool_call_id")
    if call_id is not None and not isinstance(call_id, str):
        raise ValueError(f"{where}: tool_call_id must be a string")
    parsed.tool_call_id = call_id
    parsed.error = message.get("is_error") is True or message.get("status") == "error"
    metadata = message.get("metadata")
    parsed.verbose = (
        message.get("verbose") is True
        or (isinstance(metadata, dict) and metadata.get("verbose") is True)
        or message.get("name") == "log"
    )
    parsed.name = message.get("name") if isinstance(message.get("name"), str) else None
    parsed.summary = isinstance(message.get("summary_id"), str)
    return parsed


def _parse_langchain(message: Any, where: str) -> _Parsed:
    from langchain_core.messages import AIMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage

    parsed = _Parsed()
    if isinstance(message, SystemMessage):
        parsed.role = "system"
    elif isinstance(message, HumanMessage):
        parsed.role = "user"
    elif isinstance(message, AIMessage):
        parsed.role = "assistant"
        parsed.tool_calls = [(c.get("id") or "", c.get("name") or "?", c.get("args")) for c in message.tool_calls]
    elif isinstance(message, ToolMessage):
        parsed.role = "tool"
        parsed.tool_call_id = message.tool_call_id
        parsed.error = message.status == "error"
    elif isinstance(message, ChatMessage) and message.role in ROLES:
        parsed.role = message.role
    else:
        raise ValueError(f"{where}: unsupported message type {type(message).__name__}")
    _check_content(message.content, where)
    parsed.content = message.content
    extra = message.additional_kwargs or {}
    parsed.error = parsed.error or extra.get("is_error") is True
    parsed.verbose = extra.get("verbose") is True or message.name == "log"
    parsed.name = message.name
    parsed.summary = isinstance(extra.get("summary_id"), str)
    return parsed


def _render(parsed: _Parsed) -> tuple[str, list[str], list[str], bool]:
    """(text, ids called, ids answered, any error block) of a parsed message."""
    lines: list[str] = []
    calls = [c[0] for c in parsed.tool_calls if c[0]]
    answers = [parsed.tool_call_id] if parsed.tool_call_id else []
    error = False
    content = parsed.content
    if isinstance(content, str):
        lines.append(content)
    elif isinstance(content, list):
        for block in content:
            if isinstance(block, str):
                lines.append(block)
                continue
            kind = block["type"]
            if kind == "text":
                lines.append(str(block.get("text", "")))
            elif kind == "tool_use":
                if isinstance(block.get("id"), str):
                    calls.append(block["id"])
                lines.append(f"[tool call] {block.get('name', '?')}({_short_json(block.get('input'))})")
            elif kind == "tool_result":
                if isinstance(block.get("tool_use_id"), str):
                    answers.append(block["tool_use_id"])
                block_error = block.get("is_error") is True
                text = _block_result_text(block.get("content"))
                error = error or block_error or text.startswith(ERROR_PREFIX)
                lines.append(("[tool error] " if block_error else "[tool result] ") + text)
            elif kind == "thinking":
                lines.append("[thinking] " + str(block.get("thinking", "")))
            else:
                lines.append(f"[{kind}]")
    shown = set(calls[len([c for c in parsed.tool_calls if c[0]]):])  # ids already shown as blocks
    for call_id, name, args in parsed.tool_calls:
        if not (call_id and call_id in shown):  # LangChain repeats tool_use blocks in tool_calls
            lines.append(f"[tool call] {name}({_short_json(args)})")
    return "\n".join(line for line in lines if line), calls, answers, error


def _classify(parsed: _Parsed, calls: list[str], answers: list[str], error: bool, text: str) -> tuple[MessagePriority, str, str]:
    """(priority, why, label) in the v2.1 order."""
    role = parsed.role
    is_result = role == "tool" or (role == "user" and bool(answers) and not _has_own_text(parsed.content))
    error = error or parsed.error or (is_result and text.startswith(ERROR_PREFIX))
    tool = f" {parsed.name}" if parsed.name and parsed.name != "log" else ""
    if role == "system" and not parsed.summary:
        return MessagePriority.CRITICAL, "system message: never dropped", "system"
    if parsed.summary:
        return MessagePriority.HIGH, "earlier summary: may be summarised again", "earlier summary"
    if is_result and error:
        return MessagePriority.HIGH, "tool error: kept to remember what failed", "tool error" + tool
    if role == "user" and not is_result:
        return MessagePriority.HIGH, "user message", "user"
    if role == "assistant" and calls:
        return MessagePriority.HIGH, "AI message with tool calls", "assistant"
    # Only what would be MEDIUM can be a verbose log: a log mark never demotes a user
    # message, an error or a tool call.
    if parsed.verbose:
        return MessagePriority.LOW, "verbose log: dropped first", role + " (log)"
    if is_result:
        return MessagePriority.MEDIUM, "successful tool result", "tool result" + tool
    return MessagePriority.MEDIUM, "AI text", "assistant"


def _has_own_text(content: Any) -> bool:
    if isinstance(content, str):
        return bool(content.strip())
    if isinstance(content, list):
        return any(isinstance(b, str) or b.get("type") not in ("tool_result",) for b in content)
    return False


class _Analyzer:
    """Reads and counts messages, remembering each analysis by message content so a
    growing conversation is counted once per new message, not once per compression."""

    def __init__(self, token_counter: Any, model: str) -> None:
        self.counter = token_counter
        self.model = model
        self._cache: OrderedDict[tuple, _Info] = OrderedDict()
        self._lock = threading.Lock()

    def count(self, message: Any) -> int:
        tokens = self.counter.count_message_tokens(message, self.model)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise TypeError("token_counter.count_message_tokens must return an int >= 0")
        return tokens

    def count_text(self, text: str) -> int:
        count_tokens = getattr(self.counter, "count_tokens", None)
        if callable(count_tokens):
            return int(count_tokens(text, self.model))
        return self.count({"role": "assistant", "content": text})

    def analyse(self, messages: Sequence[Any]) -> tuple[str, list[_Info]]:
        """("dict" | "langchain", one _Info per message); ValueError on malformed input."""
        if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Sequence):
            raise ValueError("messages must be a list of messages")
        kind = _kind_of(messages)
        infos = []
        with self._lock:
            for index, message in enumerate(messages):
                where = f"message {index}"
                key = _dict_key(message) if kind == "dict" else _lc_key(message)
                info = self._cache.get(key)
                if info is None:
                    info = self._read(message, kind, where)
                    self._cache[key] = info
                    if len(self._cache) > TOKEN_CACHE_SIZE:
                        self._cache.popitem(last=False)
                else:
                    self._cache.move_to_end(key)
                infos.append(info)
        return kind, infos

    def _read(self, message: Any, kind: str, where: str) -> _Info:
        parsed = _parse_dict(message, where) if kind == "dict" else _parse_langchain(message, where)
        text, calls, answers, error = _render(parsed)
        if parsed.role == "system":  # a system message makes and answers no calls
            calls, answers = [], []
        priority, why, label = _classify(parsed, calls, answers, error, text)
        return _Info(
            role=parsed.role,
            priority=priority,
            why=why,
            tokens=self.count(message),
            calls=tuple(dict.fromkeys(calls)),
            answers=tuple(dict.fromkeys(answers)),
            label=label,
            text=text,
        )


def _kind_of(messages: Sequence[Any]) -> str:
    if all(isinstance(m, dict) for m in messages):
        return "dict"
    try:
        from langchain_core.messages import BaseMessage
    except ImportError:  # langchain is optional
        BaseMessage = None  # type: ignore[assignment,misc]
    if BaseMessage is not None and all(isinstance(m, BaseMessage) for m in messages):
        return "langchain"
    for index, message in enumerate(messages):
        if not isinstance(message, dict) and not (BaseMessage is not None and isinstance(message, BaseMessage)):
            raise ValueError(f"message {index}: expected a dict or a LangChain message, not {type(message).__name__}")
    raise ValueError("messages mix dicts and LangChain messages; use one kind")


# --------------------------------------------------------------------------- units


@dataclass
class _Unit:
    """Messages kept or dropped together: one message, or a tool call and its results."""

    members: list[int]
    tokens: int
    priority: MessagePriority

    @property
    def first(self) -> int:
        return self.members[0]

    @property
    def last(self) -> int:
        return self.members[-1]

    @property
    def protected(self) -> bool:
        return self.priority is MessagePriority.CRITICAL


def _units(infos: list[_Info]) -> tuple[list[_Unit], dict[int, str]]:
    """The units (ordered by first message) and a pairing note per paired message."""
    parent = list(range(len(infos)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    # A result pairs with the nearest call before it that has its id (ids should be
    # unique, but a reused id must not tie a new result to an old call); a result
    # placed before its call pairs with the first call of that id.
    first_caller: dict[str, int] = {}
    for index, info in enumerate(infos):
        for call_id in info.calls:
            first_caller.setdefault(call_id, index)
    latest_caller: dict[str, int] = {}
    answered_by: dict[int, list[int]] = {}
    notes: dict[int, str] = {}
    for index, info in enumerate(infos):
        for call_id in info.calls:
            latest_caller[call_id] = index
        for call_id in info.answers:
            call_index = latest_caller.get(call_id, first_caller.get(call_id))
            if call_index is None:
                notes[index] = f"answers call {call_id[:60]} that is not in this list"
                continue
            if call_index != index:
                parent[root(index)] = root(call_index)
                answered_by.setdefault(call_index, []).append(index)
                notes[index] = f"tool result paired with call in message {call_index}"
    for call_index, results in answered_by.items():
        shown = ", ".join(str(i) for i in sorted(set(results)))
        notes[call_index] = f"tool call paired with its results in message{'s' if len(set(results)) > 1 else ''} {shown}"
    groups: dict[int, list[int]] = {}  # root -> members; filled in index order
    for index in range(len(infos)):
        groups.setdefault(root(index), []).append(index)
    units = []
    for members in sorted(groups.values(), key=lambda m: m[0]):
        if len(members) == 1:
            info = infos[members[0]]
            units.append(_Unit(members, info.tokens, info.priority))
            continue
        priority = max((infos[i].priority for i in members), key=_RANK.__getitem__)
        units.append(_Unit(members, sum(infos[i].tokens for i in members), priority))
    return units, notes


# -------------------------------------------------------------------------- the plan


@dataclass
class _Plan:
    """What to do with each original message, before the output list is built."""

    action: list[MessageAction]
    reason: list[str]
    truncated: dict[int, Any] = field(default_factory=dict)  # index -> new message
    summary: Optional[CompressionSummary] = None
    summary_message: Any = None


def _text_slots(content: Any) -> list[tuple[tuple, str]]:
    """Every shortenable string in a content value, with its path."""
    if isinstance(content, str):
        return [((), content)]
    slots: list[tuple[tuple, str]] = []
    if isinstance(content, list):
        for i, block in enumerate(content):
            if isinstance(block, str):
                slots.append(((i,), block))
            elif block.get("type") == "text" and isinstance(block.get("text"), str):
                slots.append(((i, "text"), block["text"]))
            elif block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, str):
                    slots.append(((i, "content"), inner))
                elif isinstance(inner, list):
                    for j, sub in enumerate(inner):
                        if isinstance(sub, dict) and sub.get("type") == "text" and isinstance(sub.get("text"), str):
                            slots.append(((i, "content", j, "text"), sub["text"]))
    return slots


def _replace_slot(content: Any, path: tuple, text: str) -> Any:
    """A copy of ``content`` with the string at ``path`` replaced (containers on the
    path are copied; the caller's message is never changed)."""
    if not path:
        return text
    head, rest = path[0], path[1:]
    copy = list(content) if isinstance(content, list) else dict(content)
    copy[head] = _replace_slot(content[head], rest, text)
    return copy


def _mark(plan: _Plan, unit: _Unit, action: MessageAction, reason: str) -> None:
    for index in unit.members:
        plan.action[index] = action
        plan.reason[index] = reason


def _content_of(message: Any) -> Any:
    return message.get("content") if isinstance(message, dict) else message.content


def _with_content(message: Any, content: Any) -> Any:
    if isinstance(message, dict):
        return {**message, "content": content}
    return message.model_copy(update={"content": content})


# ------------------------------------------------------------------------ managers


class AdvancedContextManager:
    """Compresses a conversation to a token target with TRUNCATE, EXTRACT or
    SUMMARIZE (seeds v2.1 ``AdvancedContextManager``), returning the new message list
    and a ``CompressionResult`` that accounts for every original message.

    Compression itself is synchronous and cheap (per-message analyses are cached);
    only the summariser runs in a background thread, bounded by
    ``summary_timeout_seconds``. ``clock`` (seconds, monotonic) drives the rolling
    hour of the summariser cost cap.
    """

    def __init__(
        self,
        config: Optional[ContextCompressionConfig] = None,
        *,
        token_counter: Any = None,
        model: str = "claude-3-sonnet",
        summarizer: Optional[Summarizer] = None,
        summary_cache: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config if config is not None else ContextCompressionConfig()
        if not isinstance(self.config, ContextCompressionConfig):
            raise TypeError("config must be a ContextCompressionConfig")
        self.config.validate()
        if token_counter is None:
            token_counter = get_token_counter()
        if not callable(getattr(token_counter, "count_message_tokens", None)):
            raise TypeError("token_counter needs a count_message_tokens(message, model) method")
        self.model = model
        self.summarizer = summarizer
        self._analyzer = _Analyzer(token_counter, model)
        self._extractive = ExtractiveSummarizer(self._analyzer.count_text)
        if summary_cache is None:
            summary_cache = SummaryCache(
                max_size=256, default_ttl_seconds=self.config.summary_cache_ttl_seconds, clock=clock
            )
        self.summary_cache = summary_cache
        self._clock = clock
        self._spent: deque[tuple[float, float]] = deque()  # (when, estimated USD)
        self._lock = threading.Lock()
        self._stragglers = 0  # summarisations that timed out and are still running

    # -- public

    def count_tokens(self, messages: Sequence[Any]) -> int:
        """The tokens of a message list, as compression counts them (cached)."""
        return sum(info.tokens for info in self._analyzer.analyse(messages)[1])

    def should_compress(self, messages_or_tokens: Any) -> bool:
        tokens = messages_or_tokens if isinstance(messages_or_tokens, int) else self.count_tokens(messages_or_tokens)
        return self.config.should_compress(tokens)

    def spent_last_hour_usd(self) -> float:
        with self._lock:
            return self._spent_locked()

    def compress(
        self,
        messages: Sequence[Any],
        target_tokens: Optional[int] = None,
        mode: Optional[CompressionMode] = None,
    ) -> tuple[list[Any], CompressionResult]:
        """Compress ``messages`` to at most ``target_tokens`` (default
        ``max_tokens * target_ratio``) with ``mode`` (default ``config.strategy``).

        Raises ValueError for malformed messages and ConfigError (a ValueError) for a
        target that is not a positive integer. Never raises for summariser trouble.
        """
        started = time.perf_counter()
        self.config.validate()  # it may have been changed since (admin, remote config)
        target = self._target(target_tokens)
        requested = self._mode(mode)
        kind, infos = self._analyzer.analyse(messages)
        units, notes = _units(infos)
        total = sum(info.tokens for info in infos)
        fallback: Optional[str] = None
        used = requested

        if total <= target:
            plan = _Plan(
                [MessageAction.KEPT] * len(infos),
                [i.why if i.priority is MessagePriority.CRITICAL else "within target: nothing to drop" for i in infos],
            )
        elif all(unit.protected for unit in units):
            plan = _Plan([MessageAction.KEPT] * len(infos), [info.why for info in infos])
        elif requested is CompressionMode.TRUNCATE:
            plan = self._truncate(messages, infos, units, target)
        elif requested is CompressionMode.EXTRACT:
            plan = self._extract(messages, infos, units, target)
        else:
            plan, fallback = self._summarize(messages, kind, infos, units, total, target)
            if plan is None:
                used = CompressionMode.EXTRACT
                plan = self._extract(messages, infos, units, target)

        output, result = _assemble(messages, infos, plan, notes, target, self._analyzer, self.config.to_dict())
        result.mode = used
        result.requested_mode = requested
        result.fallback_reason = fallback
        result.duration_ms = (time.perf_counter() - started) * 1000
        return output, result

    # -- inputs

    def _target(self, target_tokens: Optional[int]) -> int:
        if target_tokens is None:
            return self.config.target_tokens
        if isinstance(target_tokens, bool) or not isinstance(target_tokens, int) or target_tokens <= 0:
            raise ConfigError("target_tokens", "must be a positive integer")
        return target_tokens

    def _mode(self, mode: Any) -> CompressionMode:
        if mode is None:
            return self.config.strategy
        try:
            return CompressionMode(mode)
        except ValueError:
            raise ConfigError("mode", f"unknown compression mode {str(mode)[:40]!r}") from None

    # -- TRUNCATE: system + the newest units that fit

    def _truncate(self, messages: Sequence[Any], infos: list[_Info], units: list[_Unit], target: int) -> _Plan:
        plan = self._start_plan(infos, units)
        budget = target - sum(u.tokens for u in units if u.protected)
        newest_first = sorted((u for u in units if not u.protected), key=lambda u: u.last, reverse=True)
        kept_any = False
        for position, unit in enumerate(newest_first):
            if unit.tokens <= budget:
                budget -= unit.tokens
                _mark(plan, unit, MessageAction.KEPT, "kept: among the newest messages that fit")
                kept_any = True
                continue
            for older in newest_first[position:]:
                _mark(plan, older, MessageAction.DROPPED, "dropped: older than the newest messages that fit")
            break
        if not kept_any:
            self._shorten_newest(plan, messages, infos, newest_first[0], budget)
        return plan

    # -- EXTRACT: drop by priority (low first), then age, sparing the recent window

    def _extract(self, messages: Sequence[Any], infos: list[_Info], units: list[_Unit], target: int) -> _Plan:
        plan = self._start_plan(infos, units)
        recent_from = len(infos) - self.config.keep_recent
        droppable = [u for u in units if not u.protected]
        older = [u for u in droppable if u.last < recent_from]
        recent = [u for u in droppable if u.last >= recent_from]
        order = sorted(older, key=lambda u: (_RANK[u.priority], u.first)) + sorted(
            recent, key=lambda u: (_RANK[u.priority], u.first)
        )
        total = sum(u.tokens for u in units)
        dropped: set[int] = set()
        for unit in order:
            if total <= target:
                break
            total -= unit.tokens
            dropped.add(unit.first)
            if unit.last >= recent_from:
                why = f"dropped: within the last {self.config.keep_recent} messages, but they alone exceed the target"
            else:
                why = f"dropped: {unit.priority.value} priority, oldest first"
            _mark(plan, unit, MessageAction.DROPPED, why)
        for unit in droppable:
            if unit.first not in dropped:
                why = (
                    f"kept: within the last {self.config.keep_recent} messages"
                    if unit.last >= recent_from
                    else f"kept: {unit.priority.value} priority, fits the target"
                )
                _mark(plan, unit, MessageAction.KEPT, why)
        if len(dropped) == len(droppable):
            newest = max(droppable, key=lambda u: u.last)
            budget = target - sum(u.tokens for u in units if u.protected)
            self._shorten_newest(plan, messages, infos, newest, budget)
        return plan

    # -- SUMMARIZE: the oldest units become one summary message

    def _summarize(
        self,
        messages: Sequence[Any],
        kind: str,
        infos: list[_Info],
        units: list[_Unit],
        total: int,
        target: int,
    ) -> tuple[Optional[_Plan], Optional[str]]:
        """(plan, None) on success; (None, reason) to fall back to EXTRACT."""
        overhead = self._analyzer.count(self._summary_message(kind, "", "sum_0"))
        protected_tokens = sum(u.tokens for u in units if u.protected)
        droppable = [u for u in units if not u.protected]
        reserve = min(self.config.summary_max_tokens + overhead, target - protected_tokens)
        if reserve - overhead < MIN_SUMMARY_TOKENS:
            return None, "no room for a summary within the target"
        span: list[_Unit] = []
        saved = 0
        for unit in droppable:  # oldest first: a prefix of the non-system messages
            if span and total - saved + reserve <= target:
                break
            span.append(unit)
            saved += unit.tokens
        indices = sorted(i for unit in span for i in unit.members)
        texts = [f"{infos[i].label}: {infos[i].text}" for i in indices]
        header = SUMMARY_HEADER.format(count=len(indices))
        budget = reserve - overhead - self._analyzer.count_text(header)
        if budget < MIN_SUMMARY_TOKENS:
            return None, "no room for a summary within the target"

        summarizer, why_not = self._choose_summarizer(len(indices))
        if summarizer is None:
            return None, why_not
        key = self.summary_cache.key_for(texts, f"{summarizer.name}|{self.model}|{budget}")
        entry = self.summary_cache.get(key)
        text = entry.get("summary") if isinstance(entry, dict) else None
        cached = isinstance(text, str) and bool(text.strip())
        cost = 0.0
        if not cached:
            input_tokens = sum(infos[i].tokens for i in indices)
            estimate = _estimate(summarizer, input_tokens, budget)
            refusal = self._reserve_cost(estimate)
            if refusal:
                return None, refusal
            text, failure = self._run_summarizer(summarizer, texts, budget, key)
            if text is None:
                return None, failure
            cost = _estimate(summarizer, input_tokens, self._analyzer.count_text(text))
            cost = cost if math.isfinite(cost) and cost > 0 else 0.0

        summary_id = "sum_" + hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest()[:16]

        def count_summary(content: str) -> int:
            return self._analyzer.count(self._summary_message(kind, content, summary_id))

        # A summariser may overrun its budget (an LLM often does): cut to the reserve.
        content = cut_to_tokens(header + text, reserve, count_summary)
        if len(content) <= len(header) or count_summary(content) > reserve:
            return None, "the summary did not fit the target"
        message = self._summary_message(kind, content, summary_id)
        tokens = self._analyzer.count(message)

        plan = self._start_plan(infos, units)
        replaced = set(indices)
        for index in indices:
            plan.action[index] = MessageAction.SUMMARIZED
            plan.reason[index] = f"replaced by summary {summary_id} of the oldest {len(indices)} messages"
        for unit in droppable:
            if unit.first not in replaced:
                _mark(plan, unit, MessageAction.KEPT, "kept: newer than the summarised span")
        plan.summary = CompressionSummary(
            summary_id=summary_id,
            text=content,
            replaced_indices=indices,
            tokens=tokens,
            summarizer=summarizer.name,
            cached=cached,
            estimated_cost_usd=cost,
        )
        plan.summary_message = message
        return plan, None

    def _choose_summarizer(self, span_messages: int) -> tuple[Optional[Summarizer], str]:
        if not self.config.enable_llm_summarization:
            return self._extractive, ""
        if span_messages < self.config.llm_summarization_threshold:
            return self._extractive, ""
        if self.summarizer is None:
            return None, "no summariser given while enable_llm_summarization is on"
        return self.summarizer, ""

    def _spent_locked(self) -> float:
        hour_ago = self._clock() - 3600.0
        while self._spent and self._spent[0][0] <= hour_ago:
            self._spent.popleft()
        return sum(cost for _, cost in self._spent)

    def _reserve_cost(self, estimate: float) -> Optional[str]:
        """None when the call may go ahead (its estimate is then counted against the
        hour), else the reason it may not."""
        if not math.isfinite(estimate) or estimate < 0:
            return f"summariser gave an invalid cost estimate ({estimate!r})"
        cap = self.config.max_cost_per_hour_usd
        with self._lock:
            if self._stragglers:
                return "a previous summarisation timed out and is still running"
            spent = self._spent_locked()
            if estimate > 0 and spent + estimate > cap:
                return (
                    f"cost cap: ${spent:.4f} spent in the last hour + ${estimate:.4f} estimated "
                    f"exceeds max_cost_per_hour_usd=${cap:.4f}"
                )
            if estimate > 0:
                self._spent.append((self._clock(), estimate))
        return None

    def _run_summarizer(
        self, summarizer: Summarizer, texts: list[str], budget: int, key: Any
    ) -> tuple[Optional[str], Optional[str]]:
        """Run the summariser in a daemon thread, waiting at most the timeout. A late
        answer still lands in the summary cache, ready for the next compression; until
        it arrives, further summarisations are refused (no pile of stuck threads)."""
        box: dict[str, Any] = {}
        finished = threading.Event()

        def work() -> None:
            try:
                text = summarizer.summarize(list(texts), budget)
                if not isinstance(text, str) or not text.strip():
                    box["error"] = "summariser returned no text"
                else:
                    box["text"] = text.strip()
                    self.summary_cache.set(key, {"summary": box["text"], "summarizer": summarizer.name})
            except Exception as exc:  # the agent never sees a summariser's failure
                box["error"] = f"summariser failed: {type(exc).__name__}: {str(exc)[:200]}"
            finally:
                with self._lock:
                    finished.set()
                    if box.get("late"):
                        self._stragglers -= 1

        threading.Thread(target=work, name="pipeline-summarizer", daemon=True).start()
        finished.wait(self.config.summary_timeout_seconds)
        with self._lock:
            if not finished.is_set():
                box["late"] = True
                self._stragglers += 1
                return None, f"summariser timed out after {self.config.summary_timeout_seconds:g} s"
        if "text" in box:
            return box["text"], None
        return None, box.get("error", "summariser returned no text")

    def _summary_message(self, kind: str, content: str, summary_id: str) -> Any:
        if kind == "dict":
            return {"role": "system", "content": content, "summary_id": summary_id}
        from langchain_core.messages import SystemMessage

        return SystemMessage(content=content, id=summary_id, additional_kwargs={"summary_id": summary_id})

    # -- plan helpers

    def _start_plan(self, infos: list[_Info], units: list[_Unit]) -> _Plan:
        plan = _Plan([MessageAction.KEPT] * len(infos), [""] * len(infos))
        for unit in units:
            if unit.protected:
                for index in unit.members:
                    plan.reason[index] = infos[index].why
        return plan

    def _shorten_newest(self, plan: _Plan, messages: Sequence[Any], infos: list[_Info], unit: _Unit, budget: int) -> None:
        """Rather than leave only protected messages, shorten the longest text of the
        newest unit's biggest message so the unit fits ``budget``."""
        candidates = [i for i in unit.members if _text_slots(_content_of(messages[i]))]
        if not candidates:
            return
        index = max(candidates, key=lambda i: infos[i].tokens)
        room = budget - (unit.tokens - infos[index].tokens)
        if room <= 0:
            return
        message = messages[index]
        path, text = max(_text_slots(_content_of(message)), key=lambda slot: len(slot[1]))
        if len(text) <= MIN_TRUNCATED_CHARS:
            return
        limit = min(len(text), self.config.truncate_max_chars)

        def build(keep: int) -> Any:
            marker = f"\n…[truncated: {len(text) - keep} of {len(text)} characters removed]"
            return _with_content(message, _replace_slot(_content_of(message), path, text[:keep] + marker))

        low, high = 0, limit
        while low < high:  # the longest head whose message fits the room
            mid = (low + high + 1) // 2
            if self._analyzer.count(build(mid)) <= room:
                low = mid
            else:
                high = mid - 1
        if low < MIN_TRUNCATED_CHARS:
            return
        new_message = build(low)
        plan.truncated[index] = new_message
        plan.action[index] = MessageAction.TRUNCATED
        plan.reason[index] = (
            f"shortened to fit the target: kept the first {low} of {len(text)} characters "
            "rather than drop every message"
        )
        for other in unit.members:
            if other != index:
                plan.action[other] = MessageAction.KEPT
                plan.reason[other] = "kept with the shortened message it is paired with"


def _assemble(
    messages: Sequence[Any],
    infos: list[_Info],
    plan: _Plan,
    notes: dict[int, str],
    target: int,
    analyzer: _Analyzer,
    config: dict[str, Any],
) -> tuple[list[Any], CompressionResult]:
    """The new message list and the result accounting for every original message."""
    output: list[Any] = []
    after: list[int] = [0] * len(infos)
    new_index: list[Optional[int]] = [None] * len(infos)
    summary = plan.summary
    first_replaced = summary.replaced_indices[0] if summary else -1
    tokens_after = 0
    for index, message in enumerate(messages):
        if index == first_replaced:
            summary.new_index = len(output)  # type: ignore[union-attr]
            output.append(plan.summary_message)
            tokens_after += summary.tokens  # type: ignore[union-attr]
        action = plan.action[index]
        if action is MessageAction.KEPT:
            new_index[index] = len(output)
            output.append(message)
            after[index] = infos[index].tokens
        elif action is MessageAction.TRUNCATED:
            new_index[index] = len(output)
            output.append(plan.truncated[index])
            after[index] = analyzer.count(plan.truncated[index])
        tokens_after += after[index]

    changes = []
    for index, info in enumerate(infos):
        note = notes.get(index)
        reason = plan.reason[index] or info.why
        action = plan.action[index]
        changes.append(
            MessageChange(
                index=index,
                role=info.role,
                priority=info.priority,
                action=action,
                tokens_before=info.tokens,
                tokens_after=after[index],
                new_index=new_index[index],
                summary_id=summary.summary_id if summary and action is MessageAction.SUMMARIZED else None,
                tool_call_ids=list(info.calls or info.answers),
                reason=f"{reason}; {note}" if note else reason,
                content_before=info.text[:CONTENT_BEFORE_MAX_CHARS],
                content_cut=len(info.text) > CONTENT_BEFORE_MAX_CHARS,
                content_after=(
                    _text_of(plan.truncated[index]) if action is MessageAction.TRUNCATED else None
                ),
            )
        )
    target_met = tokens_after <= target
    only_protected = not target_met and all(
        infos[i].priority is MessagePriority.CRITICAL for i, a in enumerate(after) if a
    )
    result = CompressionResult(
        mode=CompressionMode.EXTRACT,  # set by the caller
        model=analyzer.model,
        target_tokens=target,
        tokens_before=sum(info.tokens for info in infos),
        tokens_after=tokens_after,
        messages_before=len(infos),
        messages_after=len(output),
        target_met=target_met,
        only_protected_remain=only_protected,
        changes=changes,
        summaries=[summary] if summary else [],
        config=config,
    )
    return output, result


def _estimate(summarizer: Summarizer, input_tokens: int, output_tokens: int) -> float:
    """The summariser's cost estimate; NaN (refused by the cost check) if it fails."""
    try:
        return float(summarizer.estimate_cost_usd(input_tokens, output_tokens))
    except Exception:  # a broken estimate must not reach the agent
        return math.nan


def _text_of(message: Any) -> str:
    parsed = _Parsed()
    parsed.content = _content_of(message)
    text = _render(parsed)[0]
    return text[:CONTENT_BEFORE_MAX_CHARS]


class BasicContextManager:
    """The seeds' simple manager: keep the system messages and the last
    ``keep_recent`` *rounds* (a round starts at a user message that is not only tool
    results), dropping older rounds, and fewer recent ones if even those exceed
    ``max_tokens`` (the newest round is always kept). Rounds keep tool calls and their
    results together. No priorities, no LLM; mode is TRUNCATE and the target is
    ``max_tokens``.
    """

    threshold_ratio = 0.8

    def __init__(
        self,
        max_tokens: int = 200_000,
        keep_recent: int = 5,
        *,
        token_counter: Any = None,
        model: str = "claude-3-sonnet",
    ) -> None:
        _check_int(max_tokens, "max_tokens", 1)
        _check_int(keep_recent, "keep_recent", 1)
        if token_counter is None:
            token_counter = get_token_counter()
        self.max_tokens = max_tokens
        self.keep_recent = keep_recent
        self.model = model
        self._analyzer = _Analyzer(token_counter, model)

    def should_compress(self, current_tokens: int) -> bool:
        return current_tokens > self.max_tokens * self.threshold_ratio

    def compress(self, messages: Sequence[Any]) -> tuple[list[Any], CompressionResult]:
        started = time.perf_counter()
        _, infos = self._analyzer.analyse(messages)
        units, notes = _units(infos)
        rounds: list[list[_Unit]] = []
        for unit in units:
            info = infos[unit.first]
            starts_round = info.role == "user" and not info.answers
            if unit.protected:
                continue
            if starts_round or not rounds:
                rounds.append([])
            rounds[-1].append(unit)
        plan = _Plan([MessageAction.KEPT] * len(infos), [info.why for info in infos])
        protected_tokens = sum(u.tokens for u in units if u.protected)
        kept = rounds[-self.keep_recent :]
        while len(kept) > 1 and protected_tokens + sum(u.tokens for r in kept for u in r) > self.max_tokens:
            kept = kept[1:]
        first_kept = len(rounds) - len(kept)
        for number, round_units in enumerate(rounds):
            if number < first_kept:
                why = f"dropped: older than the last {self.keep_recent} rounds"
                if number >= len(rounds) - self.keep_recent:
                    why = "dropped: the recent rounds alone exceed max_tokens"
                for unit in round_units:
                    _mark(plan, unit, MessageAction.DROPPED, why)
            else:
                for unit in round_units:
                    _mark(plan, unit, MessageAction.KEPT, "kept: in a recent round")
        snapshot = {"max_tokens": self.max_tokens, "keep_recent": self.keep_recent}
        output, result = _assemble(messages, infos, plan, notes, self.max_tokens, self._analyzer, snapshot)
        result.mode = CompressionMode.TRUNCATE
        result.requested_mode = CompressionMode.TRUNCATE
        result.duration_ms = (time.perf_counter() - started) * 1000
        return output, result
