"""The MetricsCollector's totals as OTLP metrics (``enable_metrics`` with an
``otlp_endpoint``): cumulative counters per tool, read from the collector every
``metrics_export_interval_s`` and posted to ``{endpoint}/v1/metrics`` within
``metrics_export_timeout_ms``.

Nothing is added to a tool call's cost: the instruments are observable, so the SDK
reads the running totals the collector keeps anyway, on its own thread. Each export
carries the totals so far (cumulative), so a failed export is not retried: the next
one supersedes it. A receiver without an OTLP metrics endpoint (the dashboard answers
404) is noted once and not asked again.
"""

from __future__ import annotations

import gzip
import logging
import time
from typing import Any, Callable, Iterable, Optional

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from ._delivery import Transport, UrllibTransport, exchange, protobuf_headers
from ._metrics import MetricsCollector

logger = logging.getLogger("pipeline.telemetry")

# instrument name -> (the tool_totals() key, unit, description)
INSTRUMENTS = {
    "ba.tool.calls": ("calls", "{call}", "Tool executions"),
    "ba.tool.errors": ("errors", "{call}", "Tool executions that failed"),
    "ba.tool.retries": ("retries", "{retry}", "Retries of tool executions"),
    "ba.tool.cache_hits": ("cache_hits", "{call}", "Tool executions answered from the idempotency cache"),
    "ba.tool.duration": ("duration_ms", "ms", "Time spent in tool executions"),
}
TOOL_NAME = "gen_ai.tool.name"
TOKEN_TYPE = "gen_ai.token.type"


class OtlpMetricPoster(MetricExporter):
    """Post each collection as one OTLP/HTTP protobuf request; no retry queue."""

    def __init__(
        self,
        url: str,
        *,
        headers: dict[str, str],
        gzip_body: bool,
        timeout_s: float,
        transport: Optional[Transport] = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(preferred_temporality=None, preferred_aggregation=None)
        self.url = url
        self._headers = protobuf_headers(headers, gzip_body)
        self._gzip = gzip_body
        self._timeout = timeout_s
        self._transport = transport or UrllibTransport()
        self._clock = clock
        self.exports = 0  # collections the receiver accepted
        self.unsupported = False  # the receiver has no metrics endpoint: stop asking
        self._warned = False

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        if self.unsupported:
            return MetricExportResult.SUCCESS
        body = encode_metrics(metrics_data).SerializeToString()
        if self._gzip:
            body = gzip.compress(body, compresslevel=5)
        timeout = min(self._timeout, timeout_millis / 1000)
        outcome, _ = exchange(self._transport, "POST", self.url, self._headers, body, timeout,
                              max_retry_after_s=0.0, now=self._clock())
        if outcome is None:
            self.exports += 1
            return MetricExportResult.SUCCESS
        if outcome.refused in ("http_404", "http_405", "http_415", "http_501"):
            self.unsupported = True
            logger.info("%s does not accept OTLP metrics (%s); metrics stay in-process", self.url, outcome.refused)
            return MetricExportResult.SUCCESS
        if not self._warned:
            self._warned = True
            logger.warning("metrics export failed (the next one carries the same totals): %s", outcome.error)
        return MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def _observe(collector: MetricsCollector, key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(totals[key], {TOOL_NAME: tool}) for tool, totals in collector.tool_totals().items()]

    return observe


def _observe_tokens(collector: MetricsCollector) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        observations = []
        for tool, totals in collector.tool_totals().items():
            observations.append(Observation(totals["input_tokens"], {TOOL_NAME: tool, TOKEN_TYPE: "input"}))
            observations.append(Observation(totals["output_tokens"], {TOOL_NAME: tool, TOKEN_TYPE: "output"}))
        return observations

    return observe


def metrics_meter_provider(config: Any, collector: MetricsCollector, resource: Resource, *,
                           transport: Optional[Transport] = None) -> tuple[MeterProvider, OtlpMetricPoster]:
    """A MeterProvider exporting ``collector``'s totals per ``config`` (an
    ObservabilityConfig with an otlp_endpoint), and its poster."""
    poster = OtlpMetricPoster(
        config.metrics_url,
        headers=config.headers,
        gzip_body=config.otlp_compression == "gzip",
        timeout_s=config.metrics_export_timeout_ms / 1000,
        transport=transport,
    )
    reader = PeriodicExportingMetricReader(
        poster,
        export_interval_millis=config.metrics_export_interval_s * 1000,
        export_timeout_millis=config.metrics_export_timeout_ms,
    )
    provider = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
    meter = provider.get_meter("pipeline")
    for name, (key, unit, description) in INSTRUMENTS.items():
        meter.create_observable_counter(name, callbacks=[_observe(collector, key)], unit=unit, description=description)
    meter.create_observable_counter("ba.tool.tokens", callbacks=[_observe_tokens(collector)], unit="{token}",
                                    description="Tokens of tool calls (input) and observations (output)")
    return provider, poster
