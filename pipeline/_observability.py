"""OpenTelemetry wiring for the pipeline: config, a tracer provider per agent, and
span helpers that speak the GenAI semantic conventions plus the pipeline's ``ba.*``
attributes, so any OTLP backend (the dashboard included) can link spans to
conversations and tool statistics.

``ObservabilityConfig`` has every field of the design's (v2.0 §6) with its default,
plus the library's own; ``configure_telemetry`` builds one agent's ``Telemetry`` from
it and never touches process-wide state unless asked (tests and processes running
several agents can hold several). The process-wide functions of the design
(``configure_observability``, ``get_observability_config``,
``execute_with_observability``) are in ``_global_observability``.

Sampling (``trace_sampling``, default MEDIUM = 10 % of traces):
- ALWAYS / HIGH / MEDIUM / LOW / NEVER: a share of traces (1, 0.5, 0.1, 0.01, 0),
  decided by trace id so a trace is kept or dropped whole (a child follows its
  parent's decision); ``sample_ratio`` sets any other share;
- ERRORS_AND_SLOW: every span is recorded, only those that ended in ERROR or took at
  least ``slow_threshold_ms`` are exported;
- NEVER still gives spans trace ids, so records carry them.

Spans are exported by ``SpanDeliveryProcessor`` (``_span_export``): bounded, retried
while it has room, optionally spooled (``spool_dir``). ``ToolResultHook`` (installed by
``hook_executor``) is the glue an agent need not write: each tool execution becomes a
span, a ``tool_result`` record, in-process metrics and, when it has one, an artifact
upload. It takes ids and a snapshot on the agent thread; the span and the record are
built on the exporters' threads.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import time
import urllib.parse
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Callable, Iterator, Mapping, Optional, Union

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from ._compression_types import CompressionResult, MessageAction
from ._config import BaseConfig, require
from ._delivery import DeliveryStats
from ._exceptions import ConfigError
from ._executor import LazyRenderings
from ._exporter import DeferredRecord, RecordExporter, records_for_result
from ._metrics import MetricsCollector, ToolMetrics, get_metrics_collector
from ._models import ToolExecutionResult, ToolInvocationRequest
from ._records import LevelRendering, ToolResultRecord
from ._span_export import DeferredSpan, SpanDeliveryProcessor
from ._spool import FSYNC_POLICIES, FsyncPolicy

logger = logging.getLogger("pipeline.telemetry")

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("json", "text")
LOG_OUTPUTS = ("stdout", "stderr", "file")


class TraceSampling(str, Enum):
    """How many traces are kept (the design's levels, plus ERRORS_AND_SLOW)."""

    ALWAYS = "always"  # 100 %
    HIGH = "high"  # 50 %
    MEDIUM = "medium"  # 10 %
    LOW = "low"  # 1 %
    NEVER = "never"  # none
    ERRORS_AND_SLOW = "errors_and_slow"  # the library's own: tail sampling at the span's end


SAMPLING_RATES = {
    TraceSampling.ALWAYS: 1.0,
    TraceSampling.HIGH: 0.5,
    TraceSampling.MEDIUM: 0.1,
    TraceSampling.LOW: 0.01,
    TraceSampling.NEVER: 0.0,
    TraceSampling.ERRORS_AND_SLOW: 1.0,  # all recorded; the end decides what is exported
}

# The earlier names of this library's config, still accepted: name -> documented field.
_ALIASES = {
    "enabled": "enable_tracing",
    "compression": "otlp_compression",
    "export_timeout_ms": "trace_export_timeout_ms",
    "max_export_batch_size": "trace_batch_size",
}
# The earlier ``sampling`` strings, as TraceSampling ("ratio" means: sample_ratio decides).
_OLD_SAMPLING = {"all": TraceSampling.ALWAYS, "none": TraceSampling.NEVER, "errors_and_slow": TraceSampling.ERRORS_AND_SLOW}


def parse_otlp_headers(text: str, field: str = "otlp_headers") -> dict[str, str]:
    """Parse the ``OTEL_EXPORTER_OTLP_HEADERS`` form: ``k=v,k2=v2`` (values URL-encoded);
    a bad item raises ConfigError naming ``field``."""
    headers: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        name = urllib.parse.unquote(name.strip())
        if not sep or not name:
            raise ConfigError(field, f"expected key=value, got {item.strip()[:40]!r}")
        headers[name] = urllib.parse.unquote(value.strip())
    return headers


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass
class ObservabilityConfig(BaseConfig):
    """How the pipeline observes an agent: traces, metrics, logs.

    The first seventeen fields are the design's, with its defaults. ``otlp_endpoint``
    is the collector's base URL: spans go to ``{endpoint}/v1/traces`` and metrics to
    ``{endpoint}/v1/metrics``; None keeps tracing in-process (spans still give records
    their trace ids) and metrics in the MetricsCollector. ``otlp_headers`` also
    accepts the ``OTEL_EXPORTER_OTLP_HEADERS`` string form. Logging settings apply
    when ``configure_observability`` installs them (they are process-wide).

    Earlier names of this library are still accepted as keywords (and by
    ``from_dict``) and readable as properties: ``enabled`` (enable_tracing),
    ``compression`` (otlp_compression), ``export_timeout_ms``
    (trace_export_timeout_ms), ``max_export_batch_size`` (trace_batch_size) and
    ``sampling`` ("all", "ratio", "errors_and_slow", "none").
    """

    # --- the design's (v2.0 §6 "可观测性配置") ---
    enable_tracing: bool = True
    enable_metrics: bool = True
    enable_logging: bool = True
    trace_sampling: TraceSampling = TraceSampling.MEDIUM
    trace_export_timeout_ms: int = 5000  # one export request
    trace_batch_size: int = 100  # spans per export request
    metrics_export_interval_s: int = 60
    metrics_export_timeout_ms: int = 3000
    log_level: str = "INFO"
    log_format: str = "json"  # json or text
    log_output: list[str] = field(default_factory=lambda: ["stdout", "file"])
    otlp_endpoint: Optional[str] = None  # e.g. "http://localhost:4318"
    otlp_headers: Optional[dict[str, str]] = None
    otlp_compression: str = "gzip"  # gzip or none
    service_name: str = "ba-agent"
    environment: str = "production"
    extra_tags: dict[str, str] = field(default_factory=dict)  # added to the OTel resource and JSON logs
    # --- the library's own ---
    sample_ratio: Optional[float] = None  # any share of traces, instead of trace_sampling's
    slow_threshold_ms: float = 5_000.0  # with ERRORS_AND_SLOW
    schedule_delay_ms: int = 1_000  # how long a span waits for its batch
    max_queue_size: int = 10_000  # spans waiting for export (oldest dropped beyond)
    max_queue_bytes: int = 32 * 1024 * 1024
    spool_dir: Optional[str] = None  # keep queued spans on disk across outages and restarts
    spool_max_bytes: int = 256 * 1024 * 1024
    spool_fsync: FsyncPolicy = "batch"
    log_file: Optional[str] = None  # for log_output "file"; default "<service_name>.log"

    def __post_init__(self) -> None:
        if isinstance(self.trace_sampling, str) and not isinstance(self.trace_sampling, TraceSampling):
            try:
                self.trace_sampling = TraceSampling(self.trace_sampling.lower())
            except ValueError:
                pass  # validate() names the field
        if isinstance(self.otlp_headers, str):
            self.otlp_headers = parse_otlp_headers(self.otlp_headers)

    # --- the design's methods -----------------------------------------------------

    def get_sampling_rate(self) -> float:
        """The share of traces kept: ``sample_ratio`` if set, else trace_sampling's."""
        if self.sample_ratio is not None:
            return float(self.sample_ratio)
        return SAMPLING_RATES.get(self.trace_sampling, 0.1)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ObservabilityConfig:
        if not isinstance(data, Mapping):
            raise ConfigError(cls.__name__, "expected a mapping")
        fields = dict(data)
        for alias, name in _ALIASES.items():
            if alias in fields:
                if name in fields:
                    raise ConfigError(alias, f"give {name} or its earlier name {alias}, not both")
                fields[name] = fields.pop(alias)
        sampling = fields.pop("sampling", None)
        if sampling is not None:
            fields.update(_from_old_sampling(sampling, fields.get("sample_ratio")))
        return super().from_dict(fields)

    def validate(self) -> bool:
        for name in ("enable_tracing", "enable_metrics", "enable_logging"):
            require(isinstance(getattr(self, name), bool), name, "must be true or false")
        require(
            isinstance(self.trace_sampling, TraceSampling),
            "trace_sampling",
            f"must be one of {', '.join(s.value for s in TraceSampling)}",
        )
        for name in ("trace_export_timeout_ms", "trace_batch_size", "metrics_export_interval_s",
                     "metrics_export_timeout_ms", "schedule_delay_ms", "max_queue_size", "max_queue_bytes",
                     "spool_max_bytes"):
            require(_positive_int(getattr(self, name)), name, "must be a positive integer")
        require(self.trace_batch_size <= self.max_queue_size, "trace_batch_size", "must not exceed max_queue_size")
        require(
            isinstance(self.log_level, str) and self.log_level.upper() in LOG_LEVELS,
            "log_level",
            f"must be one of {', '.join(LOG_LEVELS)}",
        )
        require(self.log_format in LOG_FORMATS, "log_format", "must be 'json' or 'text'")
        require(
            isinstance(self.log_output, (list, tuple)) and all(o in LOG_OUTPUTS for o in self.log_output),
            "log_output",
            f"must be a list of {', '.join(LOG_OUTPUTS)}",
        )
        for name in ("service_name", "environment"):
            value = getattr(self, name)
            require(
                isinstance(value, str) and 0 < len(value) <= 200 and value.isprintable(),
                name,
                "must be a printable string of 1-200 characters",
            )
        if self.otlp_endpoint is not None:
            parsed = urllib.parse.urlsplit(str(self.otlp_endpoint))
            require(
                parsed.scheme in ("http", "https") and bool(parsed.netloc),
                "otlp_endpoint",
                "must be an http(s) base URL such as http://localhost:4318",
            )
        headers = self.otlp_headers if self.otlp_headers is not None else {}
        require(isinstance(headers, dict), "otlp_headers", "must be a mapping or 'k=v,k2=v2'")
        for name, value in headers.items():
            require(isinstance(name, str) and bool(_HEADER_NAME.match(name)), "otlp_headers", f"bad header name {name!r}")
            require(
                isinstance(value, str) and not any(ch in value for ch in "\r\n\x00"),
                "otlp_headers",
                f"bad value for header {name}",
            )
        require(self.otlp_compression in ("gzip", "none"), "otlp_compression", "must be 'gzip' or 'none'")
        require(
            isinstance(self.extra_tags, dict)
            and len(self.extra_tags) <= 64
            and all(isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= 200 for k, v in self.extra_tags.items()),
            "extra_tags",
            "must map at most 64 names to strings",
        )
        require(
            self.sample_ratio is None
            or (isinstance(self.sample_ratio, (int, float)) and not isinstance(self.sample_ratio, bool)
                and 0.0 <= self.sample_ratio <= 1.0),
            "sample_ratio",
            "must be between 0 and 1 (or None)",
        )
        require(
            isinstance(self.slow_threshold_ms, (int, float)) and self.slow_threshold_ms >= 0,
            "slow_threshold_ms",
            "must be >= 0",
        )
        require(self.spool_dir is None or (isinstance(self.spool_dir, str) and bool(self.spool_dir)),
                "spool_dir", "must be a directory path or None")
        require(self.spool_fsync in FSYNC_POLICIES, "spool_fsync", f"must be one of {', '.join(FSYNC_POLICIES)}")
        require(self.log_file is None or (isinstance(self.log_file, str) and bool(self.log_file)),
                "log_file", "must be a file path or None")
        return True

    # --- derived ----------------------------------------------------------------

    @property
    def traces_url(self) -> Optional[str]:
        return f"{self.otlp_endpoint.rstrip('/')}/v1/traces" if self.otlp_endpoint else None

    @property
    def metrics_url(self) -> Optional[str]:
        return f"{self.otlp_endpoint.rstrip('/')}/v1/metrics" if self.otlp_endpoint else None

    @property
    def headers(self) -> dict[str, str]:
        return dict(self.otlp_headers or {})

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, **overrides: Any) -> ObservabilityConfig:
        """Read the standard ``OTEL_*`` variables (the ones an operator already sets)."""
        env = os.environ if environ is None else environ
        data: dict[str, Any] = {}
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            data.update(enable_tracing=False, enable_metrics=False)
        if env.get("OTEL_SERVICE_NAME"):
            data["service_name"] = env["OTEL_SERVICE_NAME"]
        if env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            data["otlp_endpoint"] = env["OTEL_EXPORTER_OTLP_ENDPOINT"]
        if env.get("OTEL_EXPORTER_OTLP_HEADERS"):
            data["otlp_headers"] = parse_otlp_headers(env["OTEL_EXPORTER_OTLP_HEADERS"])
        if env.get("OTEL_EXPORTER_OTLP_COMPRESSION"):
            data["otlp_compression"] = env["OTEL_EXPORTER_OTLP_COMPRESSION"].strip().lower()
        if env.get("OTEL_EXPORTER_OTLP_TIMEOUT"):
            data["trace_export_timeout_ms"] = _env_int(env, "OTEL_EXPORTER_OTLP_TIMEOUT", "trace_export_timeout_ms")
        if env.get("OTEL_METRIC_EXPORT_INTERVAL"):  # milliseconds, like the SDK's
            interval = _env_int(env, "OTEL_METRIC_EXPORT_INTERVAL", "metrics_export_interval_s")
            data["metrics_export_interval_s"] = max(1, round(interval / 1000))
        if env.get("OTEL_RESOURCE_ATTRIBUTES"):
            tags = parse_otlp_headers(env["OTEL_RESOURCE_ATTRIBUTES"], "extra_tags")
            if "deployment.environment" in tags:
                data["environment"] = tags.pop("deployment.environment")
            data["extra_tags"] = tags
        sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
        if sampler:
            data.update(_env_sampler(sampler, env.get("OTEL_TRACES_SAMPLER_ARG", "")))
        data.update(overrides)
        return cls.from_dict(data)


def _from_old_sampling(sampling: Any, sample_ratio: Any) -> dict[str, Any]:
    if sampling == "ratio":
        return {"sample_ratio": 1.0 if sample_ratio is None else sample_ratio}
    return {"trace_sampling": _OLD_SAMPLING.get(sampling, sampling)}


_dataclass_init = ObservabilityConfig.__init__


def _init_with_earlier_names(self: ObservabilityConfig, *args: Any, **kwargs: Any) -> None:
    # Not InitVars: dataclasses.replace() would read them back and undo its change.
    for alias, name in _ALIASES.items():
        if alias in kwargs:
            if name in kwargs:
                raise TypeError(f"give {name} or its earlier name {alias}, not both")
            kwargs[name] = kwargs.pop(alias)
    if "sampling" in kwargs:
        sampling = kwargs.pop("sampling")
        if sampling is not None:
            kwargs.update(_from_old_sampling(sampling, kwargs.get("sample_ratio")))
    _dataclass_init(self, *args, **kwargs)


ObservabilityConfig.__init__ = _init_with_earlier_names  # type: ignore[method-assign]

for _alias, _name in _ALIASES.items():  # the earlier names, readable and settable

    def _get(self: ObservabilityConfig, _name: str = _name) -> Any:
        return getattr(self, _name)

    def _set(self: ObservabilityConfig, value: Any, _name: str = _name) -> None:
        setattr(self, _name, value)

    setattr(ObservabilityConfig, _alias, property(_get, _set))


def _old_sampling(self: ObservabilityConfig) -> str:
    if self.sample_ratio is not None:
        return "ratio"
    names = {v: k for k, v in _OLD_SAMPLING.items()}
    return names.get(self.trace_sampling, "ratio")  # type: ignore[arg-type]


ObservabilityConfig.sampling = property(_old_sampling)  # type: ignore[assignment,method-assign]


def _env_int(env: Mapping[str, str], variable: str, field_name: str) -> int:
    try:
        return int(env[variable])
    except ValueError:
        raise ConfigError(field_name, f"{variable} is not an integer") from None


def _env_sampler(sampler: str, argument: str) -> dict[str, Any]:
    """OTEL_TRACES_SAMPLER (+ _ARG) as trace_sampling / sample_ratio."""
    if sampler in ("always_on", "parentbased_always_on"):
        return {"trace_sampling": TraceSampling.ALWAYS}
    if sampler in ("always_off", "parentbased_always_off"):
        return {"trace_sampling": TraceSampling.NEVER}
    if sampler in ("traceidratio", "parentbased_traceidratio"):
        try:
            return {"sample_ratio": float(argument) if argument.strip() else 1.0}
        except ValueError:
            raise ConfigError("sample_ratio", "OTEL_TRACES_SAMPLER_ARG is not a number") from None
    raise ConfigError("trace_sampling", f"OTEL_TRACES_SAMPLER {sampler!r} is not supported")


def _sampler(config: ObservabilityConfig) -> Sampler:
    rate = config.get_sampling_rate()
    if config.trace_sampling is TraceSampling.NEVER and config.sample_ratio is None:
        return ALWAYS_OFF
    if rate >= 1.0:
        return ParentBased(ALWAYS_ON)
    return ParentBased(TraceIdRatioBased(rate))


def _errors_and_slow(slow_threshold_ms: float) -> Callable[[ReadableSpan], bool]:
    """The spans worth keeping under ERRORS_AND_SLOW, decided at the span's end (so
    the parent of a kept span may itself be dropped)."""
    slow_ns = int(slow_threshold_ms * 1_000_000)

    def keep(span: ReadableSpan) -> bool:
        duration = (span.end_time or 0) - (span.start_time or 0)
        return span.status.status_code is StatusCode.ERROR or duration >= slow_ns

    return keep


def _hex_ids(span: trace.Span) -> tuple[Optional[str], Optional[str]]:
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None, None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


class SpanHandle:
    """A live span plus the ids records carry (lowercase hex; None when tracing is off)."""

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.trace_id, self.span_id = _hex_ids(span)

    def set(self, **attributes: Any) -> None:
        """Set attributes, skipping None (OTel attributes cannot be null)."""
        self.set_attributes(attributes)

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        # One call, one lock in the SDK: per-attribute calls double a span's cost.
        self.span.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def record_tool_result(self, result: ToolExecutionResult) -> None:
        self.set_attributes(tool_result_attributes(result))
        if result.success:
            self.span.set_status(Status(StatusCode.OK))
        else:
            self.span.set_status(Status(StatusCode.ERROR, (result.error_message or result.error_type or "")[:500]))

    def record_usage(self, input_tokens: Optional[int] = None, output_tokens: Optional[int] = None) -> None:
        self.set(**{"gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": output_tokens})

    def record_compression(self, result: CompressionResult) -> None:
        self.set_attributes(compression_attributes(result))

    def record_skill(self, *, tokens_loaded: int, success: bool = True, error: Optional[str] = None) -> None:
        self.set(**{"ba.skill.tokens_loaded": tokens_loaded, "ba.success": success})
        if not success:
            self.span.set_status(Status(StatusCode.ERROR, (error or "")[:500]))

    def fail(self, error_type: str, message: str = "") -> None:
        self.set_attributes(_error_attributes(error_type))
        self.span.set_status(Status(StatusCode.ERROR, message[:500]))


def _conversation_attributes(conversation_id: str, round_id: Optional[str], **attributes: Any) -> dict[str, Any]:
    """``attributes`` plus what links a span to its conversation and round: the
    GenAI name, OpenInference's name for the same thing, and the round."""
    attributes["gen_ai.conversation.id"] = conversation_id
    attributes["session.id"] = conversation_id
    if round_id is not None:
        attributes["ba.round_id"] = round_id
    return attributes


def _error_attributes(error_type: str) -> dict[str, Any]:
    # The semconv name for dashboards in general, ours for the pipeline's own views.
    return {"error.type": error_type, "ba.error_type": error_type}


def tool_request_attributes(
    request: ToolInvocationRequest, conversation_id: str, round_id: Optional[str]
) -> dict[str, Any]:
    return _conversation_attributes(
        conversation_id,
        round_id,
        **{
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": request.tool_name,
            "gen_ai.tool.call.id": request.tool_call_id,
            "gen_ai.tool.type": "function",
            "ba.tool.version": request.tool_version,
        },
    )


def tool_result_attributes(result: ToolExecutionResult) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "ba.output_level": result.output_level.value,
        "ba.success": result.success,
        "ba.retry_count": result.retry_count,
        "ba.cache_hit": result.cache_hit,
        "ba.observation_tokens": result.observation_tokens,
        "ba.duration_ms": result.duration_ms,
    }
    if result.artifact_id:
        attributes["ba.artifact_id"] = result.artifact_id
    if result.error_type:
        attributes.update(_error_attributes(result.error_type))
    return attributes


def compression_attributes(result: CompressionResult) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "ba.compression.mode": result.mode.value,
        "ba.compression.tokens_before": result.tokens_before,
        "ba.compression.tokens_after": result.tokens_after,
        "ba.compression.target_tokens": result.target_tokens,
        "ba.compression.messages_before": result.messages_before,
        "ba.compression.messages_after": result.messages_after,
        "ba.compression.dropped": result.count(MessageAction.DROPPED),
        "ba.compression.truncated": result.count(MessageAction.TRUNCATED),
        "ba.compression.summarized": result.count(MessageAction.SUMMARIZED),
        "ba.compression.target_met": result.target_met,
    }
    if result.requested_mode is not None:
        attributes["ba.compression.requested_mode"] = result.requested_mode.value
    return attributes


class Telemetry:
    """One agent's tracing: a TracerProvider, its tracer, the span helpers, the
    span exporter's counters (``stats()``) and, with ``enable_metrics``, the
    MetricsCollector its hook records into (``metrics``)."""

    def __init__(
        self,
        config: ObservabilityConfig,
        provider: Optional[TracerProvider],
        processor: Optional[SpanDeliveryProcessor] = None,
        *,
        metrics: Optional[MetricsCollector] = None,
        meter_provider: Any = None,
    ) -> None:
        self.config = config
        self.provider = provider
        self.metrics = metrics
        self._processor = processor
        self._meter_provider = meter_provider
        self.metrics_poster: Any = None  # the OTLP metrics sender, when metrics are exported
        self.tracer: trace.Tracer = provider.get_tracer("pipeline") if provider else trace.NoOpTracer()
        self._scope = getattr(self.tracer, "_instrumentation_scope", None) or InstrumentationScope("pipeline")
        self._closed = False
        self._exit_hook: Optional[Callable[[], Any]] = None

    # --- spans ----------------------------------------------------------------------

    @contextmanager
    def _span(self, name: str, kind: SpanKind, attributes: Mapping[str, Any]) -> Iterator[SpanHandle]:
        with self.tracer.start_as_current_span(name, kind=kind, attributes=dict(attributes)) as span:
            yield SpanHandle(span)

    @contextmanager
    def agent_span(
        self, conversation_id: str, round_id: Optional[str] = None, *, agent_name: str = "ba-agent"
    ) -> Iterator[SpanHandle]:
        """The parent span of one round: ``invoke_agent {agent_name}``."""
        attributes = _conversation_attributes(
            conversation_id, round_id, **{"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent_name}
        )
        with self._span(f"invoke_agent {agent_name}", SpanKind.INTERNAL, attributes) as handle:
            yield handle

    @contextmanager
    def tool_span(
        self, request: ToolInvocationRequest, conversation_id: str, round_id: Optional[str] = None
    ) -> Iterator[SpanHandle]:
        """``execute_tool {tool}``; call ``record_tool_result(result)`` on the handle."""
        attributes = tool_request_attributes(request, conversation_id, round_id)
        with self._span(f"execute_tool {request.tool_name}", SpanKind.INTERNAL, attributes) as handle:
            yield handle

    def record_tool_span(
        self,
        request: ToolInvocationRequest,
        result: ToolExecutionResult,
        conversation_id: str,
        round_id: Optional[str] = None,
    ) -> SpanHandle:
        """The tool span of an execution that already happened (from an ``on_result``
        callback): it ends now and started ``result.duration_ms`` earlier."""
        end_ns = time.time_ns()
        start_ns = end_ns - int(result.duration_ms * 1_000_000)
        span = self.tracer.start_span(
            f"execute_tool {request.tool_name}",
            kind=SpanKind.INTERNAL,
            attributes=tool_request_attributes(request, conversation_id, round_id),
            start_time=start_ns,
        )
        handle = SpanHandle(span)
        handle.record_tool_result(result)
        span.end(end_time=end_ns)
        return handle

    @contextmanager
    def chat_span(
        self,
        model: str,
        conversation_id: str,
        round_id: Optional[str] = None,
        *,
        provider_name: Optional[str] = None,
    ) -> Iterator[SpanHandle]:
        """``chat {model}``; the caller sets usage with ``record_usage(input, output)``."""
        attributes = _conversation_attributes(
            conversation_id, round_id, **{"gen_ai.operation.name": "chat", "gen_ai.request.model": model}
        )
        if provider_name:
            attributes["gen_ai.provider.name"] = provider_name
        with self._span(f"chat {model}", SpanKind.CLIENT, attributes) as handle:
            yield handle

    @contextmanager
    def compression_span(
        self, conversation_id: str, mode: str, round_id: Optional[str] = None, *, tokens_before: Optional[int] = None
    ) -> Iterator[SpanHandle]:
        """``compress_context``; call ``record_compression(result)`` when it is done."""
        attributes = _conversation_attributes(
            conversation_id, round_id, **{"ba.compression.requested_mode": getattr(mode, "value", mode)}
        )
        if tokens_before is not None:
            attributes["ba.compression.tokens_before"] = tokens_before
        with self._span("compress_context", SpanKind.INTERNAL, attributes) as handle:
            yield handle

    @contextmanager
    def skill_span(
        self,
        skill_name: str,
        conversation_id: str,
        *,
        level: int,
        round_id: Optional[str] = None,
        depth: int = 0,
    ) -> Iterator[SpanHandle]:
        """``activate_skill {name}``; call ``record_skill(tokens_loaded=...)`` when loaded."""
        attributes = _conversation_attributes(
            conversation_id, round_id, **{"ba.skill.name": skill_name, "ba.skill.level": level, "ba.skill.depth": depth}
        )
        with self._span(f"activate_skill {skill_name}", SpanKind.INTERNAL, attributes) as handle:
            yield handle

    # --- the hook's fast path: ids now, the span later on the exporter's thread ---------

    def _deferrable(self) -> bool:
        """True when a tool span may be built off the agent thread: this Telemetry's
        own processor is the provider's only one (anyone who added another gets
        real SDK spans, built here)."""
        provider = self.provider
        if provider is None or isinstance(self.tracer, trace.NoOpTracer):
            return False
        active = getattr(getattr(provider, "_active_span_processor", None), "_span_processors", None)
        return active == ((self._processor,) if self._processor is not None else ())

    def _new_span_ids(self) -> tuple[int, int, Optional[SpanContext]]:
        """Trace id, span id and parent for a span of the current context."""
        parent = trace.get_current_span().get_span_context()
        ids = self.provider.id_generator  # type: ignore[union-attr]
        if parent.is_valid:
            return parent.trace_id, ids.generate_span_id(), parent
        return ids.generate_trace_id(), ids.generate_span_id(), None

    def _build_tool_span(self, call: _ToolCall) -> Optional[ReadableSpan]:
        """The finished span of a snapshotted tool call, as the SDK would have made it
        (sampling included); None when sampled out. Runs on the exporter's thread."""
        provider = self.provider
        assert provider is not None
        request, result = call.request, call.result
        name = f"execute_tool {request.tool_name}"
        attributes = tool_request_attributes(request, call.conversation_id, call.round_id)
        attributes.update(tool_result_attributes(result))
        attributes = {k: v for k, v in attributes.items() if v is not None}
        parent_context = trace.set_span_in_context(NonRecordingSpan(call.parent)) if call.parent else None
        decision = provider.sampler.should_sample(parent_context, call.trace_id, name, SpanKind.INTERNAL, attributes)
        if not decision.decision.is_sampled():
            return None
        if decision.attributes:
            attributes.update(decision.attributes)
        if result.success:
            status = Status(StatusCode.OK)
        else:
            status = Status(StatusCode.ERROR, (result.error_message or result.error_type or "")[:500])
        context = SpanContext(
            call.trace_id, call.span_id, is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=decision.trace_state,
        )
        return ReadableSpan(
            name=name,
            context=context,
            parent=call.parent,
            resource=provider.resource,
            attributes=attributes,
            kind=SpanKind.INTERNAL,
            status=status,
            start_time=call.end_ns - int(result.duration_ms * 1_000_000),
            end_time=call.end_ns,
            instrumentation_scope=self._scope,
        )

    # --- lifecycle ------------------------------------------------------------------

    def stats(self) -> DeliveryStats:
        """The span exporter's counters (all zero when spans are not exported)."""
        return self._processor.stats() if self._processor is not None else DeliveryStats()

    def force_flush(self, timeout: float = 5.0) -> bool:
        if self.provider is None:
            return True
        return _bounded(lambda: self.provider.force_flush(int(timeout * 1000)), timeout)

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Export what is buffered and stop, within ``timeout`` seconds whatever the
        collector does; spans still queued stay in the spool when there is one."""
        if self.provider is None or self._closed:
            return True
        self._closed = True
        if self._exit_hook is not None:
            atexit.unregister(self._exit_hook)
        deadline = time.monotonic() + max(0.0, timeout)
        done = True
        if self._meter_provider is not None:
            done = _bounded(lambda: self._meter_provider.shutdown(timeout_millis=timeout * 200), timeout * 0.2)
        if self._processor is not None:
            done = self._processor.shutdown(max(0.0, deadline - time.monotonic())) and done
        return _bounded(self.provider.shutdown, max(0.0, deadline - time.monotonic())) and done


def _bounded(work: Callable[[], Any], timeout: float) -> bool:
    """Run ``work`` in a daemon thread; True if it finished (without raising) in time."""
    outcome: list[bool] = []

    def run() -> None:
        try:
            value = work()
            outcome.append(value is not False)
        except Exception:
            logger.exception("telemetry flush/shutdown failed")
            outcome.append(False)

    thread = threading.Thread(target=run, name="pipeline-telemetry-stop", daemon=True)
    thread.start()
    thread.join(max(0.0, timeout))
    return bool(outcome and outcome[0])


def configure_telemetry(
    config: Optional[ObservabilityConfig] = None,
    *,
    set_global: bool = False,
    exporter: Optional[SpanExporter] = None,
    shutdown_on_exit: bool = True,
    metrics: Optional[MetricsCollector] = None,
    transport: Any = None,
) -> Telemetry:
    """Build a Telemetry from config: Resource, sampler, the retrying span processor
    with the OTLP/HTTP protobuf sender (or ``exporter``, for another backend) and,
    with ``enable_metrics``, the MetricsCollector (``metrics``, else the process's)
    exported as OTLP metrics every ``metrics_export_interval_s``.

    ``shutdown_on_exit`` flushes at interpreter exit within 2 s (the SDK's own exit
    hook may wait 30 s on an unreachable collector, so it is turned off)."""
    config = config or ObservabilityConfig()
    config.validate()
    if not config.enable_tracing:
        return Telemetry(config, None, metrics=_metrics_for(config, metrics))
    resource = _resource(config)
    provider = TracerProvider(resource=resource, sampler=_sampler(config), shutdown_on_exit=False)
    processor: Optional[SpanDeliveryProcessor] = None
    nothing_sampled = config.trace_sampling is TraceSampling.NEVER and config.sample_ratio is None
    if (exporter is not None or config.otlp_endpoint) and not nothing_sampled:
        processor = SpanDeliveryProcessor(
            traces_url=None if exporter is not None else config.traces_url,
            headers=config.headers,
            gzip_body=config.otlp_compression == "gzip",
            exporter=exporter,
            transport=transport,
            request_timeout_s=config.trace_export_timeout_ms / 1000,
            max_queue=config.max_queue_size,
            max_queue_bytes=config.max_queue_bytes,
            batch_size=config.trace_batch_size,
            schedule_delay_s=config.schedule_delay_ms / 1000,
            keep=_errors_and_slow(config.slow_threshold_ms)
            if config.trace_sampling is TraceSampling.ERRORS_AND_SLOW else None,
            spool_dir=config.spool_dir,
            spool_max_bytes=config.spool_max_bytes,
            spool_fsync=config.spool_fsync,
        )
        provider.add_span_processor(processor)
    if set_global:
        trace.set_tracer_provider(provider)
    collector = _metrics_for(config, metrics)
    meter_provider = None
    if collector is not None and config.otlp_endpoint:
        from ._metrics_export import metrics_meter_provider

        meter_provider, telemetry_poster = metrics_meter_provider(config, collector, resource, transport=transport)
    else:
        telemetry_poster = None
    telemetry = Telemetry(config, provider, processor, metrics=collector, meter_provider=meter_provider)
    telemetry.metrics_poster = telemetry_poster
    if shutdown_on_exit:
        telemetry._exit_hook = lambda: telemetry.shutdown(2.0)
        atexit.register(telemetry._exit_hook)
    return telemetry


def _resource(config: ObservabilityConfig) -> Resource:
    return Resource.create(
        {
            **config.extra_tags,
            "service.name": config.service_name,
            "deployment.environment": config.environment,
            "deployment.environment.name": config.environment,  # the newer semconv name
        }
    )


def _metrics_for(config: ObservabilityConfig, metrics: Optional[MetricsCollector]) -> Optional[MetricsCollector]:
    if not config.enable_metrics:
        return None
    return metrics if metrics is not None else get_metrics_collector()


class _ToolCall(DeferredRecord, DeferredSpan):
    """What the hook keeps of one tool execution on the agent thread: references and
    ids, no formatting. The exporters' threads build the record and the span."""

    __slots__ = ("telemetry", "request", "parameters", "result", "renderings", "conversation_id",
                 "round_id", "model", "trace_id", "span_id", "parent", "end_ns")

    def __init__(self, hook: ToolResultHook, request: ToolInvocationRequest, result: ToolExecutionResult,
                 renderings: Any, ids: Optional[tuple[int, int, Optional[SpanContext]]]) -> None:
        self.telemetry = hook.telemetry
        self.request = request
        self.parameters = dict(request.parameters)  # the agent may reuse its dict
        self.result = result
        self.renderings = renderings
        self.conversation_id = hook.conversation_id
        self.round_id = hook.round_id
        self.model = hook.model
        self.trace_id, self.span_id, self.parent = ids if ids is not None else (0, 0, None)
        self.end_ns = time.time_ns()

    def hex_ids(self) -> tuple[Optional[str], Optional[str]]:
        if not self.span_id:
            return None, None
        return format(self.trace_id, "032x"), format(self.span_id, "016x")

    def build_record(self) -> ToolResultRecord:
        trace_id, span_id = self.hex_ids()
        renderings = self.renderings
        if isinstance(renderings, LazyRenderings):
            renderings = renderings.materialize()
        return records_for_result(
            self.request.model_copy(update={"parameters": self.parameters}),
            self.result,
            conversation_id=self.conversation_id,
            round_id=self.round_id,
            trace_id=trace_id,
            span_id=span_id,
            model=self.model,
            renderings=renderings,
            occurred_at=datetime.fromtimestamp(self.end_ns / 1e9, timezone.utc),
        )

    def build_span(self) -> Optional[ReadableSpan]:
        return self.telemetry._build_tool_span(self)  # type: ignore[union-attr]


class ToolResultHook:
    """The ``on_result`` callback that turns each tool execution into a span, a
    record and in-process metrics, so the agent writes no glue. Set
    ``conversation_id`` / ``round_id`` as the conversation moves on. It never raises
    into the executor.

    With a RecordExporter and this library's Telemetry, the agent thread only takes
    ids and a snapshot (a few microseconds); the span and the record are built,
    rendered, counted and serialised on the exporters' threads. Anything else (a
    duck-typed exporter, a provider with extra span processors) is handled on the
    spot, as before.

    ``read_artifact(artifact_id) -> (bytes, content_type) | None`` lets it upload the
    artifact a result points to (read on the exporter's thread when it can be).
    ``metrics`` defaults to ``telemetry.metrics`` (the config's ``enable_metrics``).
    """

    def __init__(
        self,
        *,
        conversation_id: str,
        telemetry: Optional[Telemetry] = None,
        exporter: Optional[RecordExporter] = None,
        round_id: Optional[str] = None,
        model: Optional[str] = None,
        read_artifact: Optional[Callable[[str], Optional[tuple[bytes, str]]]] = None,
        metrics: Optional[MetricsCollector] = None,
    ) -> None:
        self.conversation_id = conversation_id
        self.round_id = round_id
        self.model = model
        self.telemetry = telemetry
        self.exporter = exporter
        self.read_artifact = read_artifact
        self.metrics = metrics if metrics is not None else (telemetry.metrics if telemetry is not None else None)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if (
            len(args) == 3 and not kwargs
            and type(args[0]) is ToolInvocationRequest and type(args[1]) is ToolExecutionResult
        ):  # the executor's own call, the hot path
            request, result, renderings = args
        else:  # find them by type so a caller passing (result, request) or keywords works too
            request, result, renderings = _find_call(args, kwargs)
        if request is None or result is None:
            logger.warning("tool result hook called without a request and a result")
            return
        try:
            self.handle(request, result, renderings if _is_renderings(renderings) else None)
        except Exception:
            logger.exception("tool result hook failed (the tool result is unaffected)")

    def handle(
        self,
        request: ToolInvocationRequest,
        result: ToolExecutionResult,
        renderings: Union[LazyRenderings, list[LevelRendering], None] = None,
    ) -> None:
        telemetry, exporter = self.telemetry, self.exporter
        deferred_span = telemetry is not None and telemetry._deferrable()
        if deferred_span:
            ids = telemetry._new_span_ids()  # type: ignore[union-attr]
        elif telemetry is not None:
            ids = _int_ids(telemetry.record_tool_span(request, result, self.conversation_id, self.round_id))
        else:
            ids = None
        call = _ToolCall(self, request, result, renderings, ids)
        if deferred_span and telemetry._processor is not None:  # type: ignore[union-attr]
            telemetry._processor.put_deferred(call)  # type: ignore[union-attr]
        if self.metrics is not None:
            self.metrics.record_tool_call(ToolMetrics.from_result(request.tool_name, result), self.conversation_id)
        if exporter is None:
            return
        deferred_record = isinstance(exporter, RecordExporter)
        exporter.submit(call if deferred_record else call.build_record())
        self._upload(result.artifact_id, deferred_record)

    def _upload(self, artifact_id: Optional[str], deferred: bool) -> None:
        if not artifact_id or self.read_artifact is None or self.exporter is None:
            return
        if deferred:
            self.exporter.upload_artifact_later(artifact_id, self.read_artifact)
            return
        found = self.read_artifact(artifact_id)
        if found is not None:
            data, content_type = found
            self.exporter.upload_artifact(artifact_id, data, content_type)


def _int_ids(handle: SpanHandle) -> tuple[int, int, None]:
    if handle.trace_id is None or handle.span_id is None:
        return 0, 0, None
    return int(handle.trace_id, 16), int(handle.span_id, 16), None


def _find_call(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    values = list(args) + list(kwargs.values())
    request = next((v for v in values if isinstance(v, ToolInvocationRequest)), None)
    result = next((v for v in values if isinstance(v, ToolExecutionResult)), None)
    renderings = next((v for v in values if _is_renderings(v)), None)
    return request, result, renderings


def _is_renderings(value: Any) -> bool:
    if type(value) is LazyRenderings:
        return True
    return isinstance(value, list) and bool(value) and all(isinstance(r, LevelRendering) for r in value)


def hook_executor(executor: Any, **hook_options: Any) -> ToolResultHook:
    """Append a ToolResultHook to ``executor.on_result`` and return it.

    Artifacts are uploaded from ``executor.artifact_store`` (``retrieve`` + ``info``)
    unless ``read_artifact`` is given.
    """
    callbacks = getattr(executor, "on_result", None)
    if not isinstance(callbacks, list):
        raise TypeError("executor has no on_result callback list")
    store = getattr(executor, "artifact_store", None)
    if "read_artifact" not in hook_options:
        usable = store is not None and hasattr(store, "retrieve") and hasattr(store, "info")
        # Also the stores of requests' storage_dir (the process's open stores).
        hook_options["read_artifact"] = _store_reader(store if usable else None)
    hook = ToolResultHook(**hook_options)
    callbacks.append(hook)
    return hook


def _store_reader(store: Any) -> Callable[[str], Optional[tuple[bytes, str]]]:
    from ._artifacts import stores_holding

    def read(artifact_id: str) -> Optional[tuple[bytes, str]]:
        candidates = ([store] if store is not None else []) + [
            s for s in stores_holding(artifact_id) if s is not store
        ]
        for candidate in candidates:
            try:
                return candidate.retrieve(artifact_id), candidate.info(artifact_id).content_type
            except Exception:  # gone already (cleanup) or unreadable here: try the next
                continue
        logger.warning("artifact %s could not be read for upload", artifact_id)
        return None

    return read
