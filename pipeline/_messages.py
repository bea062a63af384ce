"""Reading a conversation for compression: what each message is, what it costs and
what it must stay with.

Messages are either dicts (``role`` / ``content`` / ``tool_calls`` /
``tool_call_id``, with ``content`` a string, ``None`` or a list of Claude-style blocks
``text`` / ``tool_use`` / ``tool_result`` / ...) or LangChain ``BaseMessage`` objects,
one kind per list; anything else is refused with a ValueError naming the message.

Decisions the seeds left open (documented here because callers depend on them):

- Tokens of a message are ``token_counter.count_message_tokens(m, model)``; the
  analysis of each message is cached by its content, so a growing conversation is
  counted once per new message, not once per compression.
- Priority (seeds v2.1): system → CRITICAL, never dropped or shortened; user → HIGH;
  a tool result that is an error (``status="error"``, ``is_error``, or content
  starting ``"Operation failed."``) → HIGH; an AI message with tool calls → HIGH;
  plain AI text → MEDIUM; a successful tool result → MEDIUM; a verbose log → LOW.
  A message is a verbose log when it carries ``verbose: True`` (dict key, dict
  ``metadata``, or LangChain ``additional_kwargs``) or is named ``"log"``; the mark
  only demotes what would be MEDIUM (never a user message, an error or a tool call).
  A previous compression's summary (a ``summary_id`` key, or
  ``additional_kwargs["summary_id"]``) is HIGH, not CRITICAL, so later summaries can
  absorb it instead of piling up.
- Tool pairing is atomic: an AI message with tool calls and all messages answering
  those calls form one unit, kept or dropped together. A result pairs with the
  nearest earlier call of its id; a result whose call is not in the list (already
  orphaned on input) is its own unit.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ._compression_types import MessagePriority

ROLES = ("system", "user", "assistant", "tool")
TOKEN_CACHE_SIZE = 50_000  # per-message analyses kept (LRU)
ERROR_PREFIX = "Operation failed."

PRIORITY_RANK = {  # drop order: lowest rank first
    MessagePriority.LOW: 0,
    MessagePriority.MEDIUM: 1,
    MessagePriority.HIGH: 2,
    MessagePriority.CRITICAL: 3,
}


# ------------------------------------------------------------------ message reading


@dataclass(frozen=True)
class MessageInfo:
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


def _read_content(parsed: _Parsed) -> tuple[str, list[str], list[str], bool]:
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


class MessageAnalyzer:
    """Reads and counts messages, remembering each analysis by message content so a
    growing conversation is counted once per new message, not once per compression."""

    def __init__(self, token_counter: Any, model: str) -> None:
        self.counter = token_counter
        self.model = model
        self._cache: OrderedDict[tuple, MessageInfo] = OrderedDict()
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

    def analyse(self, messages: Sequence[Any]) -> tuple[str, list[MessageInfo]]:
        """("dict" | "langchain", one MessageInfo per message); ValueError on malformed input."""
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

    def _read(self, message: Any, kind: str, where: str) -> MessageInfo:
        parsed = _parse_dict(message, where) if kind == "dict" else _parse_langchain(message, where)
        text, calls, answers, error = _read_content(parsed)
        if parsed.role == "system":  # a system message makes and answers no calls
            calls, answers = [], []
        priority, why, label = _classify(parsed, calls, answers, error, text)
        return MessageInfo(
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
class MessageUnit:
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


def group_units(infos: list[MessageInfo]) -> tuple[list[MessageUnit], dict[int, str]]:
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
            units.append(MessageUnit(members, info.tokens, info.priority))
            continue
        priority = max((infos[i].priority for i in members), key=PRIORITY_RANK.__getitem__)
        units.append(MessageUnit(members, sum(infos[i].tokens for i in members), priority))
    return units, notes


# ------------------------------------------------------------------------- content


def content_of(message: Any) -> Any:
    return message.get("content") if isinstance(message, dict) else message.content


def with_content(message: Any, content: Any) -> Any:
    if isinstance(message, dict):
        return {**message, "content": content}
    return message.model_copy(update={"content": content})


def readable_text(message: Any) -> str:
    """The content of a message as the diff page shows it (blocks in words)."""
    parsed = _Parsed()
    parsed.content = content_of(message)
    return _read_content(parsed)[0]


def text_slots(content: Any) -> list[tuple[tuple, str]]:
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


def replace_slot(content: Any, path: tuple, text: str) -> Any:
    """A copy of ``content`` with the string at ``path`` replaced (containers on the
    path are copied; the caller's message is never changed)."""
    if not path:
        return text
    head, rest = path[0], path[1:]
    copy = list(content) if isinstance(content, list) else dict(content)
    copy[head] = replace_slot(content[head], rest, text)
    return copy
