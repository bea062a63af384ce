"""In-process metrics of tool executions: per conversation and across all of them.

The agent reads these itself (a report at the end of a run, a success rate to decide
on a fallback); the dashboard computes its own from the records it receives.

A long-running agent must not grow without bound, so the collector keeps a bounded
number of conversations (the least recently active is dropped first) and each
conversation a bounded window of recent calls. Counts, sums and averages stay
exact because they are kept as running totals; percentiles are over the window.

The design's shapes (v2.1 positional order, v2.0 fields) all work: ``ToolMetrics``
with ``start_time``/``end_time``/``total_tokens``/``error_code`` and an
``output_level`` given as "STANDARD"; ``ConversationMetrics(conversation_id,
total_input_tokens, total_output_tokens, tool_calls)`` with ``start_time``,
``end_time``, ``messages_count``; ``get_tool_stats()`` with ``call_count``,
``avg_tokens`` and ``error_rate`` beside the richer keys; ``get_or_create_conversation``;
``ThreadSafeMetricsCollector`` (every collector here is thread-safe).
``get_metrics_collector()`` is the process's collector, the one ``hook_executor``
records into and ``configure_telemetry`` exports as OTLP metrics.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Optional, Union

from ._exceptions import ConfigError
from ._levels import OutputLevel
from ._models import ToolExecutionResult

DEFAULT_MAX_CONVERSATIONS = 1000
DEFAULT_WINDOW = 10_000  # recent calls kept per conversation and per tool


def percentile(values: Iterable[float], pct: float) -> float:
    """Nearest-rank percentile (an observed value, no interpolation); 0.0 if empty."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    # round() first so float noise (0.95 * 20 = 19.000000000000004) does not skip a rank
    rank = max(1, math.ceil(round(pct / 100.0 * len(ordered), 9)))
    return float(ordered[min(rank, len(ordered)) - 1])


@dataclass(slots=True)
class ToolMetrics:
    """One tool execution, as the metrics see it (not to be changed once recorded).

    ``output_level`` takes an OutputLevel or its name in any case ("STANDARD");
    ``total_tokens`` defaults to input + output. ``start_time`` / ``end_time`` are the
    design's v2.0 fields, kept when given (``recorded_at`` always says when).
    """

    tool_name: str
    duration_ms: float
    input_tokens: int = 0
    output_tokens: int = 0
    success: bool = True
    retry_count: int = 0
    output_level: Union[OutputLevel, str] = OutputLevel.STANDARD
    error_type: Optional[str] = None
    cache_hit: bool = False
    recorded_at: float = field(default_factory=time.time)
    # The design's v2.0 fields.
    start_time: Optional[datetime] = None
    end_time: Optional[datetime] = None
    total_tokens: int = None  # type: ignore[assignment]  # input + output unless given
    error_code: Optional[str] = None

    def __post_init__(self) -> None:
        # Cheap on purpose: the executor's hook records one per tool call.
        if type(self.output_level) is not OutputLevel:
            self.output_level = OutputLevel(str(self.output_level).lower())
        if self.total_tokens is None:
            self.total_tokens = self.input_tokens + self.output_tokens

    @classmethod
    def from_result(
        cls, tool_name: str, result: ToolExecutionResult, input_tokens: int = 0
    ) -> "ToolMetrics":
        """Metrics of an executor result; its observation tokens are the output tokens."""
        return cls(
            tool_name=tool_name,
            duration_ms=result.duration_ms,
            input_tokens=input_tokens,
            output_tokens=result.observation_tokens,
            success=result.success,
            retry_count=result.retry_count,
            output_level=result.output_level,
            error_type=result.error_type,
            cache_hit=result.cache_hit,
            error_code=result.error_code,
        )


class _ToolTotals:
    """Running totals of one tool, plus a window of recent durations for percentiles."""

    __slots__ = (
        "calls",
        "successes",
        "retries",
        "cache_hits",
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "duration_sum",
        "durations",
        "error_types",
    )

    def __init__(self, window: int) -> None:
        self.calls = 0
        self.successes = 0
        self.retries = 0
        self.cache_hits = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.total_tokens = 0
        self.duration_sum = 0.0
        self.durations: deque[float] = deque(maxlen=window)
        self.error_types: dict[str, int] = {}

    def add(self, metrics: ToolMetrics) -> None:
        self.calls += 1
        self.successes += metrics.success
        self.retries += metrics.retry_count
        self.cache_hits += metrics.cache_hit
        self.input_tokens += metrics.input_tokens
        self.output_tokens += metrics.output_tokens
        self.total_tokens += metrics.total_tokens
        self.duration_sum += metrics.duration_ms
        self.durations.append(metrics.duration_ms)
        if not metrics.success:
            kind = metrics.error_type or "unknown"
            self.error_types[kind] = self.error_types.get(kind, 0) + 1

    def copy(self) -> "_ToolTotals":
        twin = _ToolTotals(self.durations.maxlen or 1)
        for name in self.__slots__:
            setattr(twin, name, getattr(self, name))
        twin.durations = deque(self.durations, maxlen=self.durations.maxlen)
        twin.error_types = dict(self.error_types)
        return twin

    def stats(self) -> dict[str, Any]:
        calls = self.calls
        return {
            "call_count": calls,  # the design's name
            "calls": calls,
            "successes": self.successes,
            "failures": calls - self.successes,
            "success_rate": self.successes / calls if calls else 0.0,
            "error_rate": (calls - self.successes) / calls if calls else 0.0,
            "avg_tokens": self.total_tokens / calls if calls else 0.0,
            "total_duration_ms": self.duration_sum,
            "avg_duration_ms": self.duration_sum / calls if calls else 0.0,
            "p50_duration_ms": percentile(self.durations, 50),
            "p95_duration_ms": percentile(self.durations, 95),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
            "retries": self.retries,
            "cache_hits": self.cache_hits,
            "error_types": dict(self.error_types),
        }


@dataclass
class ConversationMetrics:
    """The metrics of one conversation. Not locked itself: the MetricsCollector
    mutates it under its lock and hands out copies (``get_conversation``)."""

    conversation_id: str
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    tool_calls: deque[ToolMetrics] = field(default_factory=deque)  # the most recent `window`
    start_time: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    end_time: Optional[datetime] = None  # set by MetricsCollector.end_conversation
    total_duration_ms: float = 0.0  # time spent in tools
    successful_calls: int = 0
    failed_calls: int = 0
    retried_calls: int = 0  # calls that needed at least one retry
    skill_activations: int = 0
    unique_skills: list[str] = field(default_factory=list)
    messages_count: int = 0
    compression_events: int = 0
    total_calls: int = 0  # every call, also those beyond the window
    last_activity_at: float = 0.0
    window: int = DEFAULT_WINDOW
    _tools: dict[str, _ToolTotals] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.tool_calls, deque) or self.tool_calls.maxlen != self.window:
            self.tool_calls = deque(self.tool_calls, maxlen=self.window)

    @property
    def started_at(self) -> float:
        """``start_time`` as epoch seconds."""
        return self.start_time.timestamp()

    @property
    def total_tokens(self) -> int:
        return self.total_input_tokens + self.total_output_tokens

    def add(self, metrics: ToolMetrics) -> None:
        self.total_calls += 1
        if metrics.success:
            self.successful_calls += 1
        else:
            self.failed_calls += 1
        if metrics.retry_count > 0:
            self.retried_calls += 1
        self.total_input_tokens += metrics.input_tokens
        self.total_output_tokens += metrics.output_tokens
        self.total_duration_ms += metrics.duration_ms
        self.last_activity_at = metrics.recorded_at
        self.tool_calls.append(metrics)
        totals = self._tools.get(metrics.tool_name)
        if totals is None:
            totals = self._tools[metrics.tool_name] = _ToolTotals(self.window)
        totals.add(metrics)

    def snapshot(self) -> "ConversationMetrics":
        """An independent copy (the recorded ToolMetrics are immutable and shared)."""
        return dataclasses.replace(
            self,
            unique_skills=list(self.unique_skills),
            tool_calls=deque(self.tool_calls, maxlen=self.window),
            _tools={name: totals.copy() for name, totals in self._tools.items()},
        )

    def add_skill_activation(self, skill_name: str) -> None:
        self.skill_activations += 1
        if skill_name not in self.unique_skills:
            self.unique_skills.append(skill_name)

    def get_tool_stats(self) -> dict[str, dict[str, Any]]:
        """Per tool: calls, successes, failures, success_rate, avg/p50/p95 duration,
        input/output/total tokens, retries, cache hits and failures by error type."""
        return {name: totals.stats() for name, totals in sorted(self._tools.items())}

    def to_report(self) -> str:
        """A plain-text report for a person reading the agent's log (the design's
        sections, with failures, retries, cache hits and percentiles added)."""
        lines = [
            "Conversation Metrics Report",
            "============================",
            f"Conversation ID: {self.conversation_id}",
            f"Duration: {self.total_duration_ms / 1000:.1f}s",
            "",
            "Token Usage:",
            f"  - Input: {self.total_input_tokens:,}",
            f"  - Output: {self.total_output_tokens:,}",
            f"  - Total: {self.total_tokens:,}",
            "",
            "Tool Calls:",
            f"  - Total: {self.total_calls}",
            f"  - Successful: {self.successful_calls}",
            f"  - Failed: {self.failed_calls}",
            f"  - Retried: {self.retried_calls}",
            "",
            "Per-Tool Statistics:",
        ]
        stats = self.get_tool_stats()
        if not stats:
            lines.append("  (no tool calls)")
        for name, s in sorted(stats.items(), key=lambda item: (-item[1]["calls"], item[0])):
            lines += [
                f"  {name}:",
                f"    - Calls: {s['calls']} ({s['failures']} failed, {s['retries']} retries, "
                f"{s['cache_hits']} cache hits)",
                f"    - Avg Duration: {s['avg_duration_ms']:.1f}ms (p50 {s['p50_duration_ms']:.1f}ms, "
                f"p95 {s['p95_duration_ms']:.1f}ms)",
                f"    - Avg Tokens: {s['avg_tokens']:.0f} ({s['total_tokens']:,} in all)",
                f"    - Success Rate: {s['success_rate']:.1%}",
            ]
            if s["error_types"]:
                errors = ", ".join(f"{kind} x{count}" for kind, count in sorted(s["error_types"].items()))
                lines.append(f"    - Errors: {errors}")
        lines += [
            "",
            "Skills Activated:",
            f"  - Total: {self.skill_activations}",
            f"  - Unique: {len(self.unique_skills)}",
            f"  - Skills: {', '.join(self.unique_skills) if self.unique_skills else 'None'}",
            "",
            "Context Management:",
            f"  - Messages: {self.messages_count}",
            f"  - Compressions: {self.compression_events}",
        ]
        return "\n".join(lines) + "\n"


class MetricsCollector:
    """Thread-safe metrics across conversations, bounded in memory.

    Keeps at most ``max_conversations`` conversations; recording into a new one
    beyond that drops the least recently active. Global totals cover every call
    ever recorded, dropped conversations included.
    """

    def __init__(self, *, max_conversations: int = DEFAULT_MAX_CONVERSATIONS, window: int = DEFAULT_WINDOW) -> None:
        if max_conversations < 1:
            raise ConfigError("max_conversations", "must be at least 1")
        if window < 1:
            raise ConfigError("window", "must be at least 1")
        self.max_conversations = max_conversations
        self.window = window
        self._conversations: OrderedDict[str, ConversationMetrics] = OrderedDict()
        self._global_tools: dict[str, _ToolTotals] = {}
        self._dropped = 0
        self._lock = threading.Lock()

    def _conversation(self, conversation_id: str) -> ConversationMetrics:
        """Get or create, marking it most recently active. Caller holds the lock."""
        conversation = self._conversations.get(conversation_id)
        if conversation is None:
            conversation = ConversationMetrics(conversation_id=conversation_id, window=self.window)
            self._conversations[conversation_id] = conversation
            while len(self._conversations) > self.max_conversations:
                self._conversations.popitem(last=False)
                self._dropped += 1
        else:
            self._conversations.move_to_end(conversation_id)
        return conversation

    def record_tool_call(self, metrics: ToolMetrics, conversation_id: str) -> None:
        with self._lock:
            self._conversation(conversation_id).add(metrics)
            totals = self._global_tools.get(metrics.tool_name)
            if totals is None:
                totals = self._global_tools[metrics.tool_name] = _ToolTotals(self.window)
            totals.add(metrics)

    def record_result(
        self, tool_name: str, result: ToolExecutionResult, conversation_id: str, *, input_tokens: int = 0
    ) -> ToolMetrics:
        """Record an executor result; returns the metrics recorded."""
        metrics = ToolMetrics.from_result(tool_name, result, input_tokens=input_tokens)
        self.record_tool_call(metrics, conversation_id)
        return metrics

    def get_or_create_conversation(self, conversation_id: str) -> ConversationMetrics:
        """The live metrics of a conversation, created if new (the design's accessor).
        Read them through ``get_conversation`` while other threads record."""
        with self._lock:
            return self._conversation(conversation_id)

    def record_message(self, conversation_id: str, count: int = 1) -> None:
        """Count messages added to a conversation's context (``messages_count``)."""
        with self._lock:
            self._conversation(conversation_id).messages_count += count

    def end_conversation(self, conversation_id: str) -> None:
        """Stamp a conversation's ``end_time`` (now, UTC)."""
        with self._lock:
            self._conversation(conversation_id).end_time = datetime.now(timezone.utc)

    def tool_totals(self) -> dict[str, dict[str, float]]:
        """Running totals per tool across every conversation ever recorded (what the
        OTLP metrics export reads: cheap, no percentiles)."""
        with self._lock:
            return {
                name: {
                    "calls": t.calls,
                    "errors": t.calls - t.successes,
                    "retries": t.retries,
                    "cache_hits": t.cache_hits,
                    "input_tokens": t.input_tokens,
                    "output_tokens": t.output_tokens,
                    "duration_ms": t.duration_sum,
                }
                for name, t in self._global_tools.items()
            }

    def record_skill_activation(self, skill_name: str, conversation_id: str) -> None:
        with self._lock:
            self._conversation(conversation_id).add_skill_activation(skill_name)

    def record_compression(self, conversation_id: str) -> None:
        with self._lock:
            self._conversation(conversation_id).compression_events += 1

    def get_conversation(self, conversation_id: str) -> Optional[ConversationMetrics]:
        """A snapshot copy (safe to read while other threads record), or None."""
        with self._lock:
            conversation = self._conversations.get(conversation_id)
            return None if conversation is None else conversation.snapshot()

    def conversation_ids(self) -> list[str]:
        """Kept conversations, least recently active first."""
        with self._lock:
            return list(self._conversations)

    def get_global_stats(self) -> dict[str, Any]:
        with self._lock:
            tools = {name: totals.stats() for name, totals in sorted(self._global_tools.items())}
            conversations = len(self._conversations)
            dropped = self._dropped
        calls = sum(s["calls"] for s in tools.values())
        successes = sum(s["successes"] for s in tools.values())
        tokens = sum(s["total_tokens"] for s in tools.values())
        duration = sum(s["total_duration_ms"] for s in tools.values())
        return {
            "total_conversations": conversations,
            "dropped_conversations": dropped,
            "total_tool_calls": calls,
            "successful_calls": successes,
            "failed_calls": calls - successes,
            "success_rate": successes / calls if calls else 0.0,
            "total_tokens": tokens,
            "total_duration_seconds": duration / 1000.0,
            "avg_tokens_per_call": tokens / calls if calls else 0.0,
            "tools": tools,
        }


class ThreadSafeMetricsCollector(MetricsCollector):
    """The design's thread-safe collector: every MetricsCollector here already is."""


_global_collector: Optional[MetricsCollector] = None
_global_lock = threading.Lock()


def get_metrics_collector() -> MetricsCollector:
    """The process's MetricsCollector (created on first use)."""
    global _global_collector
    if _global_collector is None:
        with _global_lock:
            if _global_collector is None:
                _global_collector = ThreadSafeMetricsCollector()
    return _global_collector
