"""The real OpenTelemetry SDK exporter (OTLP protobuf over HTTP) against a live server."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dashboard.accounts.services import apikey_create, project_create
from dashboard.observatory.models import Conversation, Span

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def project_key():
    project = project_create(name="Live agents")
    _, key = apikey_create(project=project)
    return project, key


def agent_spans(conversation_id: str):
    """Finished spans shaped like an agent's: a chat round with a tool call inside."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "demo-agent", "session.id": "ignored"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("pipeline", "0.1.0")
    with tracer.start_as_current_span(
        "chat gpt-4o",
        attributes={
            "gen_ai.conversation.id": conversation_id,
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.usage.input_tokens": 1200,
            "gen_ai.usage.output_tokens": 80,
        },
    ):
        with tracer.start_as_current_span(
            "execute_tool search_orders",
            attributes={
                "gen_ai.conversation.id": conversation_id,
                "gen_ai.tool.name": "search_orders",
                "gen_ai.tool.call.id": f"call_{conversation_id}",
                "ba.output_level": "standard",
                "ba.retry_count": 1,
                "ba.cache_hit": False,
            },
        ) as tool_span:
            tool_span.add_event("retry", {"attempt": 1})
    provider.shutdown()
    return memory.get_finished_spans()


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_it_stores_and_links_what_the_sdk_exporter_sends(live_server, project_key, compression):
    project, key = project_key
    spans = agent_spans("conv-live")
    exporter = OTLPSpanExporter(
        endpoint=f"{live_server.url}/v1/traces",
        headers={"Authorization": f"Bearer {key}"},
        compression=compression,
        timeout=10,
    )
    try:
        assert exporter.export(spans) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()

    conversation = Conversation.objects.get(project=project, external_id="conv-live")
    rows = {row.name: row for row in Span.objects.filter(project=project)}
    assert set(rows) == {"chat gpt-4o", "execute_tool search_orders"}
    chat, tool = rows["chat gpt-4o"], rows["execute_tool search_orders"]
    assert tool.parent_span_id == chat.span_id
    assert tool.trace_id == chat.trace_id == format(spans[0].context.trace_id, "032x")
    assert {chat.conversation_id, tool.conversation_id} == {conversation.pk}
    assert (tool.tool_name, tool.tool_call_id) == ("search_orders", "call_conv-live")
    assert chat.attributes["gen_ai.usage.input_tokens"] == 1200
    assert tool.attributes["ba.retry_count"] == 1
    assert tool.events[0]["name"] == "retry"
    assert chat.service_name == "demo-agent"
    assert chat.resource["service.name"] == "demo-agent"


def test_it_stores_nothing_from_an_exporter_with_a_wrong_key(live_server, project_key):
    exporter = OTLPSpanExporter(
        endpoint=f"{live_server.url}/v1/traces",
        headers={"Authorization": "Bearer po_0123456789abcdef_" + "x" * 43},
        timeout=10,
    )
    try:
        # 401 is not retryable, so the exporter gives up at once.
        assert exporter.export(agent_spans("conv-denied")) == SpanExportResult.FAILURE
    finally:
        exporter.shutdown()
    assert Span.objects.count() == 0
