"""OpenTelemetry wiring for the pipeline: config, a tracer provider per agent, and
span helpers that speak the GenAI semantic conventions plus the pipeline's ``ba.*``
attributes, so any OTLP backend (the dashboard included) can link spans to
conversations and tool statistics.

``configure_telemetry`` never touches the global tracer provider unless asked:
tests and processes running several agents can hold several ``Telemetry`` objects.

``ToolResultHook`` (installed by ``hook_executor``) is the glue an agent need not
write: each tool execution becomes a span, a ``tool_result`` record and, when it has
one, an artifact upload.

Sampling (``ObservabilityConfig.sampling``):
- ``"all"``: every span (child spans follow their parent's decision);
- ``"ratio"``: a ``sample_ratio`` share of traces, decided by trace id so a trace is
  kept or dropped whole;
- ``"errors_and_slow"``: every span is recorded, but only spans that ended in ERROR
  or took at least ``slow_threshold_ms`` are exported (decided at the span's end, so
  the parent of a kept span may itself be dropped);
- ``"none"``: nothing is exported; spans still have trace ids for records to carry.
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
from typing import Any, Callable, Iterator, Literal, Mapping, Optional

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode

from ._compression_types import CompressionResult, MessageAction
from ._config import BaseConfig, require
from ._exceptions import ConfigError
from ._exporter import RecordExporter, records_for_result
from ._models import ToolExecutionResult, ToolInvocationRequest
from ._records import LevelRendering

logger = logging.getLogger("pipeline.telemetry")

Sampling = Literal["all", "ratio", "errors_and_slow", "none"]
SAMPLINGS = ("all", "ratio", "errors_and_slow", "none")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token


def parse_otlp_headers(text: str) -> dict[str, str]:
    """Parse the ``OTEL_EXPORTER_OTLP_HEADERS`` form: ``k=v,k2=v2`` (values URL-encoded)."""
    headers: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        name = urllib.parse.unquote(name.strip())
        if not sep or not name:
            raise ConfigError("otlp_headers", f"expected key=value, got {item.strip()[:40]!r}")
        headers[name] = urllib.parse.unquote(value.strip())
    return headers


@dataclass
class ObservabilityConfig(BaseConfig):
    """How the pipeline traces: where spans go, how many, in what batches.

    ``otlp_endpoint`` is the collector's base URL (spans go to ``{endpoint}/v1/traces``);
    None keeps tracing in-process (spans still give records their trace ids).
    ``otlp_headers`` also accepts the ``OTEL_EXPORTER_OTLP_HEADERS`` string form.
    """

    enabled: bool = True
    service_name: str = "ba-agent"
    environment: str = "production"
    otlp_endpoint: Optional[str] = None
    otlp_headers: dict[str, str] = field(default_factory=dict)
    compression: Literal["gzip", "none"] = "gzip"
    sampling: Sampling = "all"
    sample_ratio: float = 1.0  # used when sampling == "ratio"
    slow_threshold_ms: float = 5_000.0  # used when sampling == "errors_and_slow"
    export_timeout_ms: int = 10_000
    schedule_delay_ms: int = 1_000
    max_queue_size: int = 2_048
    max_export_batch_size: int = 512

    def __post_init__(self) -> None:
        if isinstance(self.otlp_headers, str):
            self.otlp_headers = parse_otlp_headers(self.otlp_headers)

    @property
    def traces_url(self) -> Optional[str]:
        return f"{self.otlp_endpoint.rstrip('/')}/v1/traces" if self.otlp_endpoint else None

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, **overrides: Any) -> ObservabilityConfig:
        """Read the standard ``OTEL_*`` variables (the ones an operator already sets)."""
        env = os.environ if environ is None else environ
        data: dict[str, Any] = {}
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            data["enabled"] = False
        if env.get("OTEL_SERVICE_NAME"):
            data["service_name"] = env["OTEL_SERVICE_NAME"]
        if env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            data["otlp_endpoint"] = env["OTEL_EXPORTER_OTLP_ENDPOINT"]
        if env.get("OTEL_EXPORTER_OTLP_HEADERS"):
            data["otlp_headers"] = parse_otlp_headers(env["OTEL_EXPORTER_OTLP_HEADERS"])
        if env.get("OTEL_EXPORTER_OTLP_COMPRESSION"):
            data["compression"] = env["OTEL_EXPORTER_OTLP_COMPRESSION"].strip().lower()
        if env.get("OTEL_EXPORTER_OTLP_TIMEOUT"):
            try:
                data["export_timeout_ms"] = int(env["OTEL_EXPORTER_OTLP_TIMEOUT"])
            except ValueError:
                raise ConfigError("export_timeout_ms", "OTEL_EXPORTER_OTLP_TIMEOUT is not an integer") from None
        data.update(overrides)
        return cls.from_dict(data)

    def validate(self) -> bool:
        require(isinstance(self.enabled, bool), "enabled", "must be true or false")
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
        require(isinstance(self.otlp_headers, dict), "otlp_headers", "must be a mapping or 'k=v,k2=v2'")
        for name, value in self.otlp_headers.items():
            require(isinstance(name, str) and bool(_HEADER_NAME.match(name)), "otlp_headers", f"bad header name {name!r}")
            require(
                isinstance(value, str) and not any(ch in value for ch in "\r\n\x00"),
                "otlp_headers",
                f"bad value for header {name}",
            )
        require(self.compression in ("gzip", "none"), "compression", "must be 'gzip' or 'none'")
        require(self.sampling in SAMPLINGS, "sampling", f"must be one of {', '.join(SAMPLINGS)}")
        require(
            isinstance(self.sample_ratio, (int, float)) and 0.0 <= self.sample_ratio <= 1.0,
            "sample_ratio",
            "must be between 0 and 1",
        )
        require(
            isinstance(self.slow_threshold_ms, (int, float)) and self.slow_threshold_ms >= 0,
            "slow_threshold_ms",
            "must be >= 0",
        )
        for name in ("export_timeout_ms", "schedule_delay_ms", "max_queue_size", "max_export_batch_size"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value > 0, name, "must be a positive integer")
        require(
            self.max_export_batch_size <= self.max_queue_size,
            "max_export_batch_size",
            "must not exceed max_queue_size",
        )
        return True


class _ErrorsAndSlowOnly(SpanProcessor):
    """Forward to ``inner`` only the spans worth keeping: errors and slow ones."""

    def __init__(self, inner: SpanProcessor, slow_threshold_ms: float) -> None:
        self._inner = inner
        self._slow_ns = int(slow_threshold_ms * 1_000_000)

    def on_start(self, span: Span, parent_context: Optional[otel_context.Context] = None) -> None:
        self._inner.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        duration = (span.end_time or 0) - (span.start_time or 0)
        if span.status.status_code is StatusCode.ERROR or duration >= self._slow_ns:
            self._inner.on_end(span)

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


def _sampler(config: ObservabilityConfig) -> Sampler:
    if config.sampling == "none":
        return ALWAYS_OFF
    if config.sampling == "ratio":
        return ParentBased(TraceIdRatioBased(config.sample_ratio))
    return ParentBased(ALWAYS_ON)


def _otlp_exporter(config: ObservabilityConfig) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(
        endpoint=config.traces_url,
        headers=dict(config.otlp_headers),
        timeout=config.export_timeout_ms / 1000,
        compression=Compression.Gzip if config.compression == "gzip" else Compression.NoCompression,
    )


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
    """One agent's tracing: a TracerProvider, its tracer, and the span helpers."""

    def __init__(
        self,
        config: ObservabilityConfig,
        provider: Optional[TracerProvider],
        span_exporter: Optional[SpanExporter] = None,
    ) -> None:
        self.config = config
        self.provider = provider
        self._span_exporter = span_exporter
        self.tracer: trace.Tracer = provider.get_tracer("pipeline") if provider else trace.NoOpTracer()
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

    # --- lifecycle ------------------------------------------------------------------

    def force_flush(self, timeout: float = 5.0) -> bool:
        if self.provider is None:
            return True
        return _bounded(lambda: self.provider.force_flush(int(timeout * 1000)), timeout)

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Export what is buffered and stop, within ``timeout`` seconds whatever the
        collector does (the SDK's own shutdown may wait far longer)."""
        if self.provider is None or self._closed:
            return True
        self._closed = True
        if self._exit_hook is not None:
            atexit.unregister(self._exit_hook)
        provider = self.provider
        done = _bounded(provider.shutdown, timeout)
        if not done and self._span_exporter is not None:
            # The SDK is still exporting (collector down or hanging): tell the exporter
            # to stop retrying so its thread does not outlive us by a minute.
            _bounded(self._span_exporter.shutdown, 0.2)
        return done


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
) -> Telemetry:
    """Build a Telemetry from config: Resource, sampler, BatchSpanProcessor and the
    OTLP/HTTP protobuf exporter (or ``exporter``, for another backend).

    ``shutdown_on_exit`` flushes at interpreter exit within 2 s (the SDK's own exit
    hook may wait 30 s on an unreachable collector, so it is turned off)."""
    config = config or ObservabilityConfig()
    config.validate()
    if not config.enabled:
        return Telemetry(config, None)
    resource = Resource.create(
        {
            "service.name": config.service_name,
            "deployment.environment": config.environment,
            "deployment.environment.name": config.environment,  # the newer semconv name
        }
    )
    provider = TracerProvider(resource=resource, sampler=_sampler(config), shutdown_on_exit=False)
    span_exporter = exporter or (_otlp_exporter(config) if config.otlp_endpoint else None)
    if span_exporter is not None and config.sampling != "none":
        processor: SpanProcessor = BatchSpanProcessor(
            span_exporter,
            max_queue_size=config.max_queue_size,
            schedule_delay_millis=config.schedule_delay_ms,
            max_export_batch_size=config.max_export_batch_size,
            export_timeout_millis=config.export_timeout_ms,
        )
        if config.sampling == "errors_and_slow":
            processor = _ErrorsAndSlowOnly(processor, config.slow_threshold_ms)
        provider.add_span_processor(processor)
    if set_global:
        trace.set_tracer_provider(provider)
    telemetry = Telemetry(config, provider, span_exporter)
    if shutdown_on_exit:
        telemetry._exit_hook = lambda: telemetry.shutdown(2.0)
        atexit.register(telemetry._exit_hook)
    return telemetry


class ToolResultHook:
    """The ``on_result`` callback that turns each tool execution into a span and a
    record, so the agent writes no glue. Set ``conversation_id`` / ``round_id`` as the
    conversation moves on. It never raises into the executor.

    ``read_artifact(artifact_id) -> (bytes, content_type) | None`` lets it upload the
    artifact a result points to.
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
    ) -> None:
        self.conversation_id = conversation_id
        self.round_id = round_id
        self.model = model
        self.telemetry = telemetry
        self.exporter = exporter
        self.read_artifact = read_artifact

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        # The executor calls (request, result, renderings); find them by type so a
        # caller passing (result, request) or keywords works too.
        values = list(args) + list(kwargs.values())
        request = next((v for v in values if isinstance(v, ToolInvocationRequest)), None)
        result = next((v for v in values if isinstance(v, ToolExecutionResult)), None)
        renderings = next(
            (v for v in values if isinstance(v, list) and v and all(isinstance(r, LevelRendering) for r in v)), None
        )
        if request is None or result is None:
            logger.warning("tool result hook called without a request and a result")
            return
        try:
            self.handle(request, result, renderings)
        except Exception:
            logger.exception("tool result hook failed (the tool result is unaffected)")

    def handle(
        self,
        request: ToolInvocationRequest,
        result: ToolExecutionResult,
        renderings: Optional[list[LevelRendering]] = None,
    ) -> None:
        trace_id = span_id = None
        if self.telemetry is not None:
            handle = self.telemetry.record_tool_span(request, result, self.conversation_id, self.round_id)
            trace_id, span_id = handle.trace_id, handle.span_id
        if self.exporter is None:
            return
        record = records_for_result(
            request,
            result,
            conversation_id=self.conversation_id,
            round_id=self.round_id,
            trace_id=trace_id,
            span_id=span_id,
            model=self.model,
            renderings=renderings,
        )
        self.exporter.submit(record)
        if result.artifact_id and self.read_artifact is not None:
            found = self.read_artifact(result.artifact_id)
            if found is not None:
                data, content_type = found
                self.exporter.upload_artifact(result.artifact_id, data, content_type)


def hook_executor(executor: Any, **hook_options: Any) -> ToolResultHook:
    """Append a ToolResultHook to ``executor.on_result`` and return it.

    Artifacts are uploaded from ``executor.artifact_store`` (``retrieve`` + ``info``)
    unless ``read_artifact`` is given.
    """
    callbacks = getattr(executor, "on_result", None)
    if not isinstance(callbacks, list):
        raise TypeError("executor has no on_result callback list")
    store = getattr(executor, "artifact_store", None)
    if "read_artifact" not in hook_options and store is not None and hasattr(store, "retrieve") and hasattr(store, "info"):
        hook_options["read_artifact"] = _store_reader(store)
    hook = ToolResultHook(**hook_options)
    callbacks.append(hook)
    return hook


def _store_reader(store: Any) -> Callable[[str], Optional[tuple[bytes, str]]]:
    def read(artifact_id: str) -> Optional[tuple[bytes, str]]:
        try:
            return store.retrieve(artifact_id), store.info(artifact_id).content_type
        except Exception:  # gone already (cleanup) or unreadable: the record still goes
            logger.warning("artifact %s could not be read for upload", artifact_id)
            return None

    return read
