"""The design's process-wide observability (v2.0 §6): one global ObservabilityConfig,
set with ``configure_observability`` and read with ``get_observability_config``, and
``execute_with_observability`` to trace a plain tool function.

``configure_observability(config)`` applies a config to the whole process:

- it becomes the global config;
- the process's ``Telemetry`` is built from it (spans and metrics exported as it
  says) and replaces the previous one; its tracer provider becomes OpenTelemetry's
  global one if none was set yet (OpenTelemetry allows that once per process);
- the logging settings are installed on the ``pipeline`` logger: level, json or text,
  stdout / stderr / file. Our handlers replace the ones an earlier call installed,
  and the logger stops propagating while it has them (no line printed twice).

An agent that holds its own Telemetry (``configure_telemetry``) needs none of this.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Optional, TypeVar

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from ._errors import classify_exception
from ._exceptions import ConfigError
from ._metrics import ToolMetrics
from ._observability import ObservabilityConfig, Telemetry, _error_attributes, configure_telemetry

logger = logging.getLogger("pipeline.telemetry")

F = TypeVar("F", bound=Callable[..., Any])
UNASSIGNED_CONVERSATION = "unassigned"  # metrics of wrapped tools called outside a conversation
_MARK = "_pipeline_observability"  # on the logging handlers we install

_lock = threading.RLock()
_config: Optional[ObservabilityConfig] = None
_telemetry: Optional[Telemetry] = None


def get_observability_config() -> ObservabilityConfig:
    """The global config (the defaults until ``configure_observability`` is called)."""
    global _config
    with _lock:
        if _config is None:
            _config = ObservabilityConfig()
        return _config


def configure_observability(config: ObservabilityConfig) -> Telemetry:
    """Make ``config`` the process's: tracing, metrics export and logging (see the
    module docstring). Returns the process's new Telemetry."""
    global _config, _telemetry
    if not isinstance(config, ObservabilityConfig):
        raise TypeError("configure_observability() takes an ObservabilityConfig")
    config.validate()
    with _lock:
        previous = _telemetry
        first = isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        telemetry = configure_telemetry(config, set_global=first)
        _config, _telemetry = config, telemetry
        configure_logging(config)
    if previous is not None:
        if previous.provider is not None and previous.provider is trace.get_tracer_provider():
            previous.force_flush(2.0)  # still OpenTelemetry's global provider: keep it running
        else:
            previous.shutdown(2.0)
    return telemetry


def get_telemetry() -> Telemetry:
    """The process's Telemetry, built from the global config on first use."""
    global _telemetry
    with _lock:
        if _telemetry is None:
            _telemetry = configure_telemetry(get_observability_config())
        return _telemetry


def execute_with_observability(
    tool_func: F,
    tool_name: str,
    *,
    conversation_id: Optional[str] = None,
    telemetry: Optional[Telemetry] = None,
) -> F:
    """Wrap ``tool_func`` so each call is a span (``execute_tool {tool_name}``, the
    design's ``tool.*`` attributes beside the GenAI ones) and a ToolMetrics in the
    MetricsCollector. Exceptions propagate unchanged, recorded on the span.

    The config is read at call time (the global one, or ``telemetry``'s), so a later
    ``configure_observability`` applies to tools wrapped before it. Sampling follows
    the tracer's sampler: a trace is kept or dropped whole."""
    if not callable(tool_func):
        raise TypeError("tool_func must be callable")
    if not isinstance(tool_name, str) or not 0 < len(tool_name) <= 200:
        raise ConfigError("tool_name", "must be a non-empty string of at most 200 characters")
    base = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool_name, "tool.name": tool_name}
    if conversation_id is not None:
        base.update({"gen_ai.conversation.id": conversation_id, "session.id": conversation_id})

    @functools.wraps(tool_func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        current = telemetry or get_telemetry()
        started = time.perf_counter()
        with current.tracer.start_as_current_span(f"execute_tool {tool_name}", kind=SpanKind.INTERNAL,
                                                  attributes=base) as span:
            try:
                value = tool_func(*args, **kwargs)
            except Exception as exc:
                duration_ms = (time.perf_counter() - started) * 1000.0
                error_type = classify_exception(exc).value
                span.set_attributes({"tool.success": False, "tool.error": str(exc)[:500],
                                     "tool.duration_ms": duration_ms, "ba.success": False,
                                     "ba.duration_ms": duration_ms, **_error_attributes(error_type)})
                _record(current, tool_name, duration_ms, conversation_id, error_type)
                raise  # the span records the exception and its ERROR status on the way out
            duration_ms = (time.perf_counter() - started) * 1000.0
            span.set_attributes({"tool.success": True, "tool.duration_ms": duration_ms,
                                 "ba.success": True, "ba.duration_ms": duration_ms})
            span.set_status(Status(StatusCode.OK))
            _record(current, tool_name, duration_ms, conversation_id, None)
            return value

    return wrapper  # type: ignore[return-value]


def _record(telemetry: Telemetry, tool_name: str, duration_ms: float, conversation_id: Optional[str],
            error_type: Optional[str]) -> None:
    if telemetry.metrics is None:
        return
    metrics = ToolMetrics(tool_name, duration_ms, success=error_type is None, error_type=error_type)
    telemetry.metrics.record_tool_call(metrics, conversation_id or UNASSIGNED_CONVERSATION)


# --- logging ------------------------------------------------------------------------


class JsonLogFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the service's tags and,
    inside a span, its trace and span ids (so a log line finds its trace)."""

    def __init__(self, config: ObservabilityConfig) -> None:
        super().__init__()
        self._tags = {**config.extra_tags, "service.name": config.service_name,
                      "deployment.environment": config.environment}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **self._tags,
        }
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            entry["trace_id"] = format(context.trace_id, "032x")
            entry["span_id"] = format(context.span_id, "016x")
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def log_file_path(config: ObservabilityConfig) -> str:
    """Where log_output "file" writes: ``log_file``, else ``<service_name>.log`` here."""
    return config.log_file or re.sub(r"[^A-Za-z0-9._-]", "_", config.service_name) + ".log"


def configure_logging(config: ObservabilityConfig) -> list[logging.Handler]:
    """Install the config's logging on the ``pipeline`` logger (replacing what an
    earlier call installed); returns the handlers. A file that cannot be opened is
    reported once and skipped: logging never stops the agent."""
    target = logging.getLogger("pipeline")
    for handler in [h for h in target.handlers if getattr(h, _MARK, False)]:
        target.removeHandler(handler)
        handler.close()
    if not config.enable_logging:
        target.propagate = True
        return []
    target.setLevel(config.log_level.upper())
    formatter: logging.Formatter = (
        JsonLogFormatter(config) if config.log_format == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    handlers: list[logging.Handler] = []
    problems: list[str] = []
    for output in dict.fromkeys(config.log_output):
        try:
            if output == "file":
                handler: logging.Handler = logging.FileHandler(log_file_path(config), encoding="utf-8")
            else:
                handler = logging.StreamHandler(sys.stdout if output == "stdout" else sys.stderr)
        except OSError as exc:
            problems.append(f"log file {log_file_path(config)!r} could not be opened ({exc.strerror or exc})")
            continue
        setattr(handler, _MARK, True)
        handler.setFormatter(formatter)
        target.addHandler(handler)
        handlers.append(handler)
    target.propagate = not handlers  # we own the output now: no line printed twice
    for problem in problems:
        logger.warning("%s; logging without it", problem)
    return handlers
