"""The span processor ``configure_telemetry`` installs instead of the SDK's
BatchSpanProcessor + OTLPSpanExporter, which give up on a batch after a fixed
timeout (a collector redeploy longer than that loses spans).

It runs on the same delivery engine as the record exporter (``_delivery``): spans are
queued in memory, bounded in spans and bytes (oldest dropped first, counted), encoded
to OTLP protobuf on the sending thread, optionally spooled to disk, and posted to
``{endpoint}/v1/traces``, retried with capped backoff (honouring ``Retry-After``) for
as long as the queue has room. ``partial_success`` rejections are counted; a 4xx other
than 408/429 drops the batch with its reason.

Given another ``SpanExporter`` instead (a test exporter, a vendor's), it queues the
span objects and calls ``export`` for each batch, retrying ``FAILURE`` the same way
(no spool: there are no bytes to keep).

``DeferredSpan`` lets the pipeline's own hook hand over a span it has not built yet:
the agent thread takes ids and a snapshot, this thread builds the span (sampling
included) and encodes it.
"""

from __future__ import annotations

import gzip
import logging
import time
from typing import Any, Callable, Mapping, Optional

from opentelemetry import context as otel_context
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ._delivery import DeliveryQueue, DeliveryStats, Outcome, Transport, UrllibTransport, exchange, protobuf_headers
from ._otlp_encode import SpanGroups, encode_span, frame
from ._spool import FsyncPolicy, Spool

logger = logging.getLogger("pipeline.telemetry")


class DeferredSpan:
    """A finished span to be built on the sending thread (None: sampled out)."""

    __slots__ = ()

    def build_span(self) -> Optional[ReadableSpan]:  # pragma: no cover - subclasses implement it
        raise NotImplementedError


Group = tuple[bytes, str, bytes, str]  # resource, its schema url, scope, its schema url


def split_request(payload: bytes) -> list[tuple[Group, bytes]]:
    """The (group, span bytes) pairs of an encoded request (a span from the spool)."""
    pairs = []
    for resource_spans in ExportTraceServiceRequest.FromString(payload).resource_spans:
        resource = resource_spans.resource.SerializeToString()
        for scope_spans in resource_spans.scope_spans:
            group = (resource, resource_spans.schema_url, scope_spans.scope.SerializeToString(), scope_spans.schema_url)
            pairs.extend((group, span.SerializeToString()) for span in scope_spans.spans)
    return pairs


class SpanDeliveryProcessor(SpanProcessor):
    """Queue ended (sampled) spans and deliver them from a daemon thread, retrying
    while the queue has room. ``keep(span)`` filters at the end (tail sampling).

    Either ``traces_url`` (OTLP/HTTP protobuf through ``transport``) or ``exporter``.
    """

    def __init__(
        self,
        *,
        traces_url: Optional[str] = None,
        headers: Optional[Mapping[str, str]] = None,
        gzip_body: bool = True,
        exporter: Optional[SpanExporter] = None,
        transport: Optional[Transport] = None,
        request_timeout_s: float = 10.0,
        max_queue: int = 10_000,
        max_queue_bytes: int = 32 * 1024 * 1024,
        batch_size: int = 512,
        max_batch_bytes: int = 4 * 1024 * 1024,
        schedule_delay_s: float = 1.0,
        keep: Optional[Callable[[ReadableSpan], bool]] = None,
        spool_dir: Optional[str] = None,
        spool_max_bytes: int = 256 * 1024 * 1024,
        spool_fsync: FsyncPolicy = "batch",
        max_retries: Optional[int] = None,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        max_retry_after_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        wait: Optional[Callable[[Any, float], Any]] = None,
        start: bool = True,
    ) -> None:
        if (traces_url is None) == (exporter is None):
            raise ValueError("give either traces_url or exporter")
        self.traces_url = traces_url
        self._headers = protobuf_headers(headers or {}, gzip_body)
        self._gzip = gzip_body
        self._exporter = exporter
        self._transport = transport or UrllibTransport()
        self._timeout = request_timeout_s
        self._keep = keep
        self._closed = False
        self._delivered = True
        self._max_retry_after_s = max_retry_after_s
        self._clock = clock
        self._groups = SpanGroups()
        spool = Spool(spool_dir, max_bytes=spool_max_bytes, fsync=spool_fsync) if spool_dir and traces_url else None
        self._queue = DeliveryQueue(
            name="pipeline-span-exporter",
            encode=self._encode,
            send=self._send_otlp if traces_url else self._send_to_exporter,
            max_items=max_queue,
            max_bytes=max_queue_bytes,
            batch_size=batch_size,
            max_batch_bytes=max_batch_bytes,
            interval_s=schedule_delay_s,
            spool=spool,
            max_retries=max_retries,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            monotonic=monotonic,
            wait=wait,
        )
        if start:
            self.start()

    def start(self) -> None:
        """Start the sending thread (done by the constructor unless ``start=False``)."""
        self._queue.start()

    # --- the SDK's side (the agent thread) -----------------------------------------

    def on_start(self, span: Span, parent_context: Optional[otel_context.Context] = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            self._queue.put(span)

    def put_deferred(self, span: DeferredSpan) -> bool:
        return self._queue.put(span)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._queue.flush(timeout_millis / 1000)

    def shutdown(self, timeout: float = 5.0) -> bool:  # the SDK calls it without a timeout
        """Deliver within ``timeout`` s, then stop (what is left stays in the spool);
        True when nothing was left."""
        if not self._closed:
            self._closed = True
            delivered = self._queue.shutdown(timeout)
            if self._exporter is not None:
                try:
                    self._exporter.shutdown()
                except Exception:  # someone else's exporter: its failure is not ours to raise
                    logger.warning("span exporter shutdown failed", exc_info=True)
            self._delivered = delivered
        return self._delivered

    def stats(self) -> DeliveryStats:
        return self._queue.stats()

    # --- the sending thread ---------------------------------------------------------

    def _encode(self, item: Any) -> Optional[tuple[Any, Any]]:
        span = item.build_span() if isinstance(item, DeferredSpan) else item
        if span is None or (self._keep is not None and not self._keep(span)):
            return None
        if self.traces_url is None:
            return span, None
        group, encoded = self._groups.group_of(span), encode_span(span)
        # The payload stands alone (it is what the spool keeps); meta spares the
        # sender decoding it again.
        return frame({group: [encoded]}), (group, encoded)

    def _send_otlp(self, batch: list[Any]) -> Outcome:
        groups: dict[Group, list[bytes]] = {}
        unreadable = 0
        for entry in batch:
            try:
                pairs = [entry.meta] if entry.meta is not None else split_request(entry.payload)
            except Exception:  # a spooled span that does not decode: send the others
                unreadable += 1
                continue
            for group, encoded in pairs:
                groups.setdefault(group, []).append(encoded)
        if unreadable == len(batch):
            return Outcome(delivered=len(batch), rejected=len(batch), error="spooled spans could not be decoded")
        body = frame(groups)
        if self._gzip:
            body = gzip.compress(body, compresslevel=5)
        outcome, answer = exchange(self._transport, "POST", self.traces_url, self._headers, body,  # type: ignore[arg-type]
                                   self._timeout, max_retry_after_s=self._max_retry_after_s, now=self._clock())
        if outcome is not None:
            return outcome
        rejected, error = unreadable, None
        try:
            partial = ExportTraceServiceResponse.FromString(answer).partial_success
            rejected = min(unreadable + int(partial.rejected_spans), len(batch))
            if rejected:
                error = f"{rejected} spans rejected: {partial.error_message[:200]}"
        except Exception:  # a 2xx we cannot read still means the batch arrived
            pass
        return Outcome(delivered=len(batch), rejected=rejected, error=error)

    def _send_to_exporter(self, batch: list[Any]) -> Outcome:
        result = self._exporter.export([entry.payload for entry in batch])  # type: ignore[union-attr]
        if result is SpanExportResult.SUCCESS:
            return Outcome(delivered=len(batch))
        return Outcome(retry=True, error=f"{type(self._exporter).__name__} returned {result}")
