"""Context compression: shrink a conversation to a token target and say, message by
message, what was done (the ``CompressionResult`` the dashboard draws as a diff).

How messages are read, prioritised and paired into units lives in ``_messages``; this
module holds the config, the two managers and the three modes. A compression
returns the same kind of messages it was given. Unchanged messages are returned as
the very same objects; a TRUNCATED one is a copy.

Decisions the seeds left open (documented here because callers depend on them):

- Tokens of a list are the sum of ``token_counter.count_message_tokens(m, model)``
  over its messages; ``tokens_after`` is exactly that recount of the returned list.
- Units (a tool call with all its results) are kept or dropped whole; system
  messages (CRITICAL) are never dropped or shortened.
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

import dataclasses
import hashlib
import math
import threading
import time
from collections import deque
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
from ._messages import (
    PRIORITY_RANK,
    MessageAnalyzer,
    MessageInfo,
    MessageUnit,
    content_of,
    group_units,
    readable_text,
    replace_slot,
    text_slots,
    with_content,
)
from ._context_state import CompressedMessages, StatefulContext
from ._summarizers import ExtractiveSummarizer, LLMSummarizer, Summarizer, cut_to_tokens
from ._tokens import get_token_counter

__all__ = [
    "AdvancedContextManager",
    "BasicContextManager",
    "ContextCompressionConfig",
    "ThreadSafeContextManager",
    "as_summarizer",
]

#: The v2.0 names of ContextCompressionConfig's fields (constructor, from_dict and
#: read-only attributes) -> (the library's field, factor from the v2.0 unit).
DESIGN_CONFIG_NAMES = {
    "llm_threshold": ("llm_summarization_threshold", 1),
    "summary_cache_ttl": ("summary_cache_ttl_seconds", 3600),  # hours in the design
    "max_compression_cost_per_hour": ("max_cost_per_hour_usd", 1),
    "max_cost_per_hour": ("max_cost_per_hour_usd", 1),
}

CONTENT_BEFORE_MAX_CHARS = 2_000  # what a change carries for the diff page
MIN_TRUNCATED_CHARS = 32  # a shorter head is not worth keeping: drop instead
MIN_SUMMARY_TOKENS = 16  # below this there is no room for a useful summary
SUMMARY_HEADER = "[Conversation summary: {count} earlier messages]\n"


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
class _CompressionConfigFields(BaseConfig):
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

    # The v2.0 attribute names (read-only views of the fields).
    @property
    def llm_threshold(self) -> int:
        return self.llm_summarization_threshold

    @property
    def summary_cache_ttl(self) -> float:
        """Hours, as v2.0 gives it (``summary_cache_ttl_seconds / 3600``)."""
        ttl = self.summary_cache_ttl_seconds / 3600
        return int(ttl) if ttl == int(ttl) else ttl

    @property
    def max_cost_per_hour(self) -> float:
        return self.max_cost_per_hour_usd

    def should_compress(self, current_tokens: int) -> bool:
        """True once the context is over ``max_tokens * threshold_ratio``."""
        if isinstance(current_tokens, bool) or not isinstance(current_tokens, int) or current_tokens < 0:
            raise ValueError("current_tokens must be a non-negative integer")
        return current_tokens > self.max_tokens * self.threshold_ratio


def _translate_design_names(values: dict[str, Any]) -> dict[str, Any]:
    """The v2.0 keywords mapped onto the fields; giving both names is an error."""
    out = dict(values)
    for name, (field_name, factor) in DESIGN_CONFIG_NAMES.items():
        if name not in out:
            continue
        value = out.pop(name)
        if field_name in values or any(
            other in values for other, (f, _) in DESIGN_CONFIG_NAMES.items() if f == field_name and other != name
        ):
            raise ConfigError(name, f"given twice (also as {field_name} or another name for it)")
        if factor != 1 and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = value * factor
        out[field_name] = value
    return out


class ContextCompressionConfig(_CompressionConfigFields):
    """How and when a conversation is compressed (seeds v2.0 ``ContextCompressionConfig``).

    Compression fires when the context exceeds ``max_tokens * threshold_ratio`` and
    aims at ``max_tokens * target_ratio``, well below, so it does not fire again on
    the next round. ``enable_llm_summarization`` defaults to False: an agent with no
    LLM summariser configured gets free extractive summaries (the seeds default of
    True would make SUMMARIZE fall back on every call of such an agent).

    Also accepts the v2.0 names, as keywords and in ``from_dict``:
    ``llm_threshold`` (= ``llm_summarization_threshold``), ``summary_cache_ttl``
    (hours; = ``summary_cache_ttl_seconds / 3600``), ``max_compression_cost_per_hour``
    and ``max_cost_per_hour`` (= ``max_cost_per_hour_usd``); the first and last two
    are also readable attributes. ``to_dict`` writes the library's names.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **_translate_design_names(kwargs))

    @classmethod
    def from_dict(cls, data: Any) -> "ContextCompressionConfig":
        if isinstance(data, dict):
            data = _translate_design_names(data)
        return super().from_dict(data)


# -------------------------------------------------------------------------- the plan


@dataclass
class _Plan:
    """What to do with each original message, before the output list is built."""

    action: list[MessageAction]
    reason: list[str]
    truncated: dict[int, Any] = field(default_factory=dict)  # index -> new message
    summary: Optional[CompressionSummary] = None
    summary_message: Any = None


def _mark(plan: _Plan, unit: MessageUnit, action: MessageAction, reason: str) -> None:
    for index in unit.members:
        plan.action[index] = action
        plan.reason[index] = reason


# ------------------------------------------------------------------------ managers


def as_summarizer(llm: Any) -> Optional[Summarizer]:
    """A ``Summarizer`` from what the design passes as ``llm_summarizer``: a
    Summarizer as it is; a LangChain chat model (``invoke``) or a callable
    ``prompt -> str`` wrapped in ``LLMSummarizer`` (its reply's text is the summary)."""
    if llm is None:
        return None
    if callable(getattr(llm, "summarize", None)) and callable(getattr(llm, "estimate_cost_usd", None)):
        return llm
    return LLMSummarizer(llm)


class AdvancedContextManager(StatefulContext):
    """Compresses a conversation to a token target with TRUNCATE, EXTRACT or
    SUMMARIZE (seeds v2.1 ``AdvancedContextManager``).

    ``compress`` returns the new message list, as the design does; the list is a
    ``CompressedMessages`` whose ``.result`` is the ``CompressionResult`` accounting
    for every original message (``compress_with_result`` returns both as a tuple).
    The design's stateful form (``add_message``, ``get_compressed_messages``,
    ``total_tokens``) is built on ``compress``.

    Constructed either the library's way, ``AdvancedContextManager(config,
    token_counter=, model=, summarizer=)``, or the design's: v2.1
    ``AdvancedContextManager(max_tokens=, compression_mode=, llm_summarizer=,
    token_counter=)`` and v2.0 ``AdvancedContextManager(max_tokens=200000,
    compression_config=None)``. ``max_tokens`` and ``compression_mode`` override the
    config's ``max_tokens`` and ``strategy`` (on a copy). An ``llm_summarizer`` (a
    LangChain chat model, a callable or a Summarizer) is wrapped by
    ``as_summarizer``; given without a config, the LLM summarises every SUMMARIZE
    span (``enable_llm_summarization=True``, ``llm_summarization_threshold=0``).

    Compression itself is synchronous and cheap (per-message analyses are cached);
    only the summariser runs in a background thread, bounded by
    ``summary_timeout_seconds``. ``clock`` (seconds, monotonic) drives the rolling
    hour of the summariser cost cap.
    """

    def __init__(
        self,
        config: Any = None,
        *,
        token_counter: Any = None,
        model: str = "claude-3-sonnet",
        summarizer: Optional[Summarizer] = None,
        summary_cache: Any = None,
        clock: Callable[[], float] = time.monotonic,
        max_tokens: Optional[int] = None,
        compression_mode: Any = None,
        llm_summarizer: Any = None,
        compression_config: Optional[ContextCompressionConfig] = None,
    ) -> None:
        if isinstance(config, int) and not isinstance(config, bool):  # v2.0: AdvancedContextManager(200000)
            if max_tokens is not None:
                raise TypeError("max_tokens given twice")
            config, max_tokens = None, config
        if compression_config is not None:
            if config is not None:
                raise TypeError("give config or compression_config, not both")
            config = compression_config
        if llm_summarizer is not None and summarizer is not None:
            raise TypeError("give summarizer or llm_summarizer, not both")
        if config is None:
            config = ContextCompressionConfig()
            if llm_summarizer is not None:
                config = dataclasses.replace(config, enable_llm_summarization=True, llm_summarization_threshold=0)
        if not isinstance(config, ContextCompressionConfig):
            raise TypeError("config must be a ContextCompressionConfig")
        overrides: dict[str, Any] = {}
        if max_tokens is not None:
            _check_int(max_tokens, "max_tokens", 1)
            overrides["max_tokens"] = max_tokens
        if compression_mode is not None:
            overrides["strategy"] = self._mode(compression_mode)
        self.config = dataclasses.replace(config, **overrides) if overrides else config
        self.config.validate()
        if token_counter is None:
            token_counter = get_token_counter()
        if not callable(getattr(token_counter, "count_message_tokens", None)):
            raise TypeError("token_counter needs a count_message_tokens(message, model) method")
        self.model = model
        self.summarizer = summarizer if summarizer is not None else as_summarizer(llm_summarizer)
        self._init_state()
        self._analyzer = MessageAnalyzer(token_counter, model)
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

    @property
    def max_tokens(self) -> int:
        """The context window (``config.max_tokens``)."""
        return self.config.max_tokens

    @property
    def compression_threshold(self) -> float:
        """The share of the window that triggers compression (``config.threshold_ratio``)."""
        return self.config.threshold_ratio

    @property
    def llm_compressor(self) -> Optional[Summarizer]:
        """The design's lazily built LLM compressor: the summariser used for SUMMARIZE
        when ``enable_llm_summarization`` is on (None otherwise)."""
        return self.summarizer if self.config.enable_llm_summarization else None

    def count_tokens(self, messages: Sequence[Any]) -> int:
        """The tokens of a message list, as compression counts them (cached)."""
        return sum(info.tokens for info in self._analyzer.analyse(messages)[1])

    def should_compress(self, messages_or_tokens: Any = None) -> bool:
        """Over ``max_tokens * threshold_ratio``? For a message list, a token count,
        or (no argument) the messages stored by ``add_message``."""
        if messages_or_tokens is None:
            tokens = self.total_tokens
        elif isinstance(messages_or_tokens, int):
            tokens = messages_or_tokens
        else:
            tokens = self.count_tokens(messages_or_tokens)
        return self.config.should_compress(tokens)

    def spent_last_hour_usd(self) -> float:
        with self._lock:
            return self._spent_locked()

    def compress(
        self,
        messages: Sequence[Any],
        target_tokens: Optional[int] = None,
        mode: Optional[CompressionMode] = None,
    ) -> CompressedMessages:
        """Compress ``messages`` to at most ``target_tokens`` (default
        ``max_tokens * target_ratio``) with ``mode`` (default ``config.strategy``):
        the new list, whose ``.result`` is the CompressionResult.

        Raises ValueError for malformed messages and ConfigError (a ValueError) for a
        target that is not a positive integer. Never raises for summariser trouble.
        """
        output, result = self.compress_with_result(messages, target_tokens, mode)
        return CompressedMessages(output, result)

    def compress_with_result(
        self,
        messages: Sequence[Any],
        target_tokens: Optional[int] = None,
        mode: Optional[CompressionMode] = None,
    ) -> tuple[list[Any], CompressionResult]:
        """``compress`` returning ``(messages, result)``."""
        started = time.perf_counter()
        self.config.validate()  # it may have been changed since (admin, remote config)
        target = self._target(target_tokens)
        requested = self.config.strategy if mode is None else self._mode(mode)
        kind, infos = self._analyzer.analyse(messages)
        units, notes = group_units(infos)
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

    # -- the stateful form (StatefulContext)

    def _count_one(self, message: Any) -> int:
        return self._analyzer.analyse([message])[1][0].tokens

    def _compress_stored(self, messages: list[Any]) -> CompressedMessages:
        return self.compress(messages)

    # -- inputs

    def _target(self, target_tokens: Optional[int]) -> int:
        if target_tokens is None:
            return self.config.target_tokens
        if isinstance(target_tokens, bool) or not isinstance(target_tokens, int) or target_tokens <= 0:
            raise ConfigError("target_tokens", "must be a positive integer")
        return target_tokens

    @staticmethod
    def _mode(mode: Any) -> CompressionMode:
        if mode is None:
            raise ConfigError("mode", "no compression mode")
        try:
            return CompressionMode(mode)
        except ValueError:
            raise ConfigError("mode", f"unknown compression mode {str(mode)[:40]!r}") from None

    # -- TRUNCATE: system + the newest units that fit

    def _truncate(self, messages: Sequence[Any], infos: list[MessageInfo], units: list[MessageUnit], target: int) -> _Plan:
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

    def _extract(self, messages: Sequence[Any], infos: list[MessageInfo], units: list[MessageUnit], target: int) -> _Plan:
        plan = self._start_plan(infos, units)
        recent_from = len(infos) - self.config.keep_recent
        droppable = [u for u in units if not u.protected]
        older = [u for u in droppable if u.last < recent_from]
        recent = [u for u in droppable if u.last >= recent_from]
        order = sorted(older, key=lambda u: (PRIORITY_RANK[u.priority], u.first)) + sorted(
            recent, key=lambda u: (PRIORITY_RANK[u.priority], u.first)
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
        infos: list[MessageInfo],
        units: list[MessageUnit],
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
        span: list[MessageUnit] = []
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

    def _start_plan(self, infos: list[MessageInfo], units: list[MessageUnit]) -> _Plan:
        plan = _Plan([MessageAction.KEPT] * len(infos), [""] * len(infos))
        for unit in units:
            if unit.protected:
                for index in unit.members:
                    plan.reason[index] = infos[index].why
        return plan

    def _shorten_newest(self, plan: _Plan, messages: Sequence[Any], infos: list[MessageInfo], unit: MessageUnit, budget: int) -> None:
        """Rather than leave only protected messages, shorten the longest text of the
        newest unit's biggest message so the unit fits ``budget``."""
        candidates = [i for i in unit.members if text_slots(content_of(messages[i]))]
        if not candidates:
            return
        index = max(candidates, key=lambda i: infos[i].tokens)
        room = budget - (unit.tokens - infos[index].tokens)
        if room <= 0:
            return
        message = messages[index]
        path, text = max(text_slots(content_of(message)), key=lambda slot: len(slot[1]))
        if len(text) <= MIN_TRUNCATED_CHARS:
            return
        limit = min(len(text), self.config.truncate_max_chars)

        def build(keep: int) -> Any:
            marker = f"\n…[truncated: {len(text) - keep} of {len(text)} characters removed]"
            return with_content(message, replace_slot(content_of(message), path, text[:keep] + marker))

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
    infos: list[MessageInfo],
    plan: _Plan,
    notes: dict[int, str],
    target: int,
    analyzer: MessageAnalyzer,
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
                    readable_text(plan.truncated[index])[:CONTENT_BEFORE_MAX_CHARS] if action is MessageAction.TRUNCATED else None
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


class BasicContextManager(StatefulContext):
    """The seeds' simple manager: keep the system messages and the last
    ``keep_recent`` *rounds* (a round starts at a user message that is not only tool
    results), dropping older rounds, and fewer recent ones if even those exceed
    the target (``max_tokens`` unless given; the newest round is always kept). Rounds
    keep tool calls and their results together. No priorities, no LLM; mode is
    TRUNCATE. ``compress`` returns the list (``.result`` the CompressionResult).

    The design's stateful form (``add_message`` ...) compresses the stored context,
    once over ``max_tokens * compression_threshold``, to half of ``max_tokens``.
    """

    threshold_ratio = 0.8
    #: The share of max_tokens the stateful form compresses to.
    target_ratio = 0.5

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
        self._analyzer = MessageAnalyzer(token_counter, model)
        self._init_state()

    @property
    def compression_threshold(self) -> float:
        return self.threshold_ratio

    def should_compress(self, current_tokens: Optional[int] = None) -> bool:
        """Over ``max_tokens * 0.8``? For a token count, or (no argument) the stored messages."""
        if current_tokens is None:
            current_tokens = self.total_tokens
        return current_tokens > self.max_tokens * self.threshold_ratio

    def compress(self, messages: Sequence[Any], target_tokens: Optional[int] = None) -> CompressedMessages:
        """The kept messages; ``.result`` says what happened to each."""
        output, result = self.compress_with_result(messages, target_tokens)
        return CompressedMessages(output, result)

    def _count_one(self, message: Any) -> int:
        return self._analyzer.analyse([message])[1][0].tokens

    def _compress_stored(self, messages: list[Any]) -> CompressedMessages:
        return self.compress(messages, max(1, int(self.max_tokens * self.target_ratio)))

    def compress_with_result(
        self, messages: Sequence[Any], target_tokens: Optional[int] = None
    ) -> tuple[list[Any], CompressionResult]:
        """``compress`` returning ``(messages, result)``."""
        limit = self.max_tokens if target_tokens is None else target_tokens
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ConfigError("target_tokens", "must be a positive integer")
        started = time.perf_counter()
        _, infos = self._analyzer.analyse(messages)
        units, notes = group_units(infos)
        rounds: list[list[MessageUnit]] = []
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
        while len(kept) > 1 and protected_tokens + sum(u.tokens for r in kept for u in r) > limit:
            kept = kept[1:]
        first_kept = len(rounds) - len(kept)
        for number, round_units in enumerate(rounds):
            if number < first_kept:
                why = f"dropped: older than the last {self.keep_recent} rounds"
                if number >= len(rounds) - self.keep_recent:
                    why = "dropped: the recent rounds alone exceed " + ("max_tokens" if target_tokens is None else "the target")
                for unit in round_units:
                    _mark(plan, unit, MessageAction.DROPPED, why)
            else:
                for unit in round_units:
                    _mark(plan, unit, MessageAction.KEPT, "kept: in a recent round")
        snapshot = {"max_tokens": self.max_tokens, "keep_recent": self.keep_recent}
        output, result = _assemble(messages, infos, plan, notes, limit, self._analyzer, snapshot)
        result.mode = CompressionMode.TRUNCATE
        result.requested_mode = CompressionMode.TRUNCATE
        result.duration_ms = (time.perf_counter() - started) * 1000
        return output, result


class ThreadSafeContextManager(BasicContextManager):
    """The design's thread-safe variant (v2.0 §4). Every manager here already stores
    and compresses under its own lock, so this adds nothing but the name."""
