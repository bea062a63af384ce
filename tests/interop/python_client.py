"""Send spans and GenAI log events with the official OpenTelemetry Python SDK
exporters, configured only by the standard OTEL_EXPORTER_OTLP_* variables
(OTEL_EXPORTER_OTLP_PROTOCOL picks grpc or http/protobuf). Prints what it sent as
JSON: span ids, log record count, and whether every export succeeded.

    python tests/interop/python_client.py <conversation id> <rounds>
"""

from __future__ import annotations

import json
import os
import sys

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

GRPC = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") == "grpc"
if GRPC:
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
else:
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter


class Counting:
    """Wraps an exporter to count what it could not deliver."""

    def __init__(self, exporter):
        self.exporter, self.failed = exporter, 0

    def export(self, batch):
        result = self.exporter.export(batch)
        if result.name != "SUCCESS":
            self.failed += len(batch)
        return result

    def __getattr__(self, name):
        return getattr(self.exporter, name)


def main(conversation: str, rounds: int) -> None:
    resource = Resource.create({"service.name": "python-" + ("grpc" if GRPC else "http")})
    spans, logs = Counting(OTLPSpanExporter()), Counting(OTLPLogExporter())
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(spans))
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(logs))
    tracer = tracer_provider.get_tracer("interop-python")
    logger = logger_provider.get_logger("opentelemetry.instrumentation.openai_v2")
    sent, emitted = [], 0
    for index in range(rounds):
        with tracer.start_as_current_span(
            f"chat gpt-4o {index}",
            attributes={"gen_ai.conversation.id": conversation, "gen_ai.request.model": "gpt-4o",
                        "gen_ai.usage.input_tokens": 100 + index, "gen_ai.usage.output_tokens": 7},
        ) as span:
            logger.emit(event_name="gen_ai.user.message", body={"content": f"<script>question {index}</script>"},
                        attributes={"gen_ai.system": "openai"})
            logger.emit(event_name="gen_ai.choice",
                        body={"index": 0, "finish_reason": "stop", "message": {"content": f"answer {index}"}},
                        attributes={"gen_ai.system": "openai"})
            emitted += 2
            sent.append(format(span.get_span_context().span_id, "016x"))
    tracer_provider.shutdown()
    logger_provider.shutdown()
    print(json.dumps({"sent": sent, "logs": emitted, "failed_spans": spans.failed, "failed_logs": logs.failed}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
