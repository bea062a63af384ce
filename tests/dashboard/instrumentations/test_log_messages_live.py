"""Messages sent as log events, for real: the openai client under
``opentelemetry-instrumentation-openai-v2`` against a fake OpenAI server on 127.0.0.1
(the network edge), its spans and log events through the SDK's OTLP/HTTP exporters
into a live dashboard.

- the current conventions, as the installed openai-v2 sends them with ``EVENT_ONLY``
  (``gen_ai.client.inference.operation.details`` with ``gen_ai.input.messages`` /
  ``gen_ai.output.messages``);
- the previous ones (``gen_ai.system.message``, ``gen_ai.user.message``,
  ``gen_ai.assistant.message``, ``gen_ai.tool.message``, ``gen_ai.choice``), which
  openai-v2 releases before 2.x sent with content capture ``true``: the installed
  release always takes its new path, so the app here makes its chat span itself and
  builds the events with the instrumentation's own ``message_to_event`` /
  ``choice_to_event``, from the real client's response objects.

Neither puts the text on the spans. Each runs with the events exported before the spans
and after them: both orders give the same rounds, messages and title, and search and
the JSON export find the text.
"""

from __future__ import annotations

import json
import os

import pytest
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from dashboard.accounts.services import apikey_create, project_create
from dashboard.observatory.derive.drain import outbox_drain_all
from dashboard.observatory.models import Conversation, LogRecord, Message, Round, Span

from .fake_openai import ANSWER, fake_openai_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

QUESTION = "Weather in <b>Paris</b>?"
MODES = {
    "previous events": {},
    "event only": {"OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
                   "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "EVENT_ONLY"},
}


def _previous_events_call(llm, tracer, logger, **request):
    """One chat call as openai-v2 before 2.x traced it: a chat span with the request
    and response attributes, one event per input message and one per choice."""
    from opentelemetry.instrumentation.openai_v2.utils import choice_to_event, message_to_event
    from opentelemetry.trace import SpanKind

    with tracer.start_as_current_span(f"chat {request['model']}", kind=SpanKind.CLIENT, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.request.model": request["model"],
    }) as span:
        for message in request["messages"]:
            logger.emit(message_to_event(message, True))
        result = llm.chat.completions.create(**request)
        span.set_attributes({"gen_ai.response.model": result.model,
                             "gen_ai.usage.input_tokens": result.usage.prompt_tokens,
                             "gen_ai.usage.output_tokens": result.usage.completion_tokens})
        for choice in result.choices:
            logger.emit(choice_to_event(choice, True))
    return result


def _run_app(live_server, key: str, monkeypatch, mode: str, events_first: bool) -> None:
    """An app asking the (fake) model about the weather, once with a tool call."""
    import openai
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    for name in ("OTEL_SEMCONV_STABILITY_OPT_IN", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
                 "OTEL_INSTRUMENTATION_GENAI_EMIT_EVENT"):
        monkeypatch.delitem(os.environ, name, raising=False)
    for name, value in MODES[mode].items():
        monkeypatch.setitem(os.environ, name, value)
    headers = {"Authorization": f"Bearer {key}"}
    resource = Resource.create({"service.name": "weather-app"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=f"{live_server.url}/v1/traces", headers=headers, timeout=10),
        schedule_delay_millis=60_000))
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(
        OTLPLogExporter(endpoint=f"{live_server.url}/v1/logs", headers=headers, timeout=10),
        schedule_delay_millis=60_000))
    server = fake_openai_server()
    instrumentor = OpenAIInstrumentor()
    llm = openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="fake", max_retries=0)
    tracer = tracer_provider.get_tracer("weather-app")
    if mode == "event only":
        instrumentor.instrument(tracer_provider=tracer_provider, logger_provider=logger_provider)
        create = llm.chat.completions.create
    else:
        logger = logger_provider.get_logger("opentelemetry.instrumentation.openai_v2")

        def create(**request):
            return _previous_events_call(llm, tracer, logger, **request)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    try:
        with tracer.start_as_current_span("invoke_agent weather", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "oai-events-1",
        }):
            messages = [{"role": "system", "content": "You answer about the weather."},
                        {"role": "user", "content": QUESTION}]
            first = create(model="gpt-4o-mini", messages=messages, tools=tools)
            call = first.choices[0].message.tool_calls[0]
            messages += [first.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
            assert create(model="gpt-4o-mini", messages=messages).choices[0].message.content == ANSWER
    finally:
        if mode == "event only":
            instrumentor.uninstrument()
        server.shutdown()
    first_flush, second_flush = (logger_provider, tracer_provider) if events_first else (tracer_provider, logger_provider)
    assert first_flush.force_flush()
    outbox_drain_all()
    assert second_flush.force_flush()
    outbox_drain_all()
    tracer_provider.shutdown()
    logger_provider.shutdown()


def _shown(project, client) -> dict:
    conversation = Conversation.objects.get(project=project, external_id="oai-events-1")
    rounds = list(Round.objects.filter(conversation=conversation).order_by("index"))
    messages = list(Message.objects.filter(conversation=conversation).order_by("index"))
    found = client.get(f"/p/{project.slug}/conversations/", {"q": "Paris"}).context["page"].rows
    export = b"".join(client.get(f"/p/{project.slug}/conversations/{conversation.pk}/export.json").streaming_content)
    return {
        "title": conversation.title,
        "rounds": [(r.user_message, r.thoughts, r.final_answer) for r in rounds],
        "messages": [(m.role, m.content, m.tool_calls, m.tool_call_id) for m in messages],
        "searched": [row.pk for row in found] == [conversation.pk],
        "exported": ANSWER in json.loads(export)["messages"][-1]["content"],
    }


@pytest.mark.parametrize("mode", list(MODES))
def test_messages_sent_as_events_become_the_rounds_messages_in_either_order(live_server, client, django_user_model,
                                                                           monkeypatch, mode):
    shown = []
    for events_first in (True, False):
        user = django_user_model.objects.create_user(f"ana-{events_first}", password="x" * 12)
        project = project_create(name=f"Events {events_first}", owner=user)
        _run_app(live_server, apikey_create(project=project)[1], monkeypatch, mode, events_first)
        # the text came only as events: none on the spans
        assert LogRecord.objects.filter(project=project).exists()
        assert not any("Paris" in json.dumps(span.attributes) for span in Span.objects.filter(project=project))
        client.force_login(user)
        shown.append(_shown(project, client))
    assert shown[0] == shown[1]
    figures = shown[0]
    assert figures["title"] == QUESTION
    assert figures["rounds"] == [(QUESTION, [], None), ("", [], ANSWER)]
    call = {"id": "call_w1", "name": "get_weather", "args": {"city": "Paris"}}
    assert figures["messages"] == [
        ("system", "You answer about the weather.", [], ""), ("user", QUESTION, [], ""),
        ("assistant", "", [call], ""),
        ("tool", "sunny", [], "call_w1"), ("assistant", ANSWER, [], ""),
    ]
    assert figures["searched"] and figures["exported"]


def test_the_timeline_escapes_the_text_of_events(live_server, client, django_user_model, monkeypatch):
    user = django_user_model.objects.create_user("bo", password="x" * 12)
    project = project_create(name="Escaped", owner=user)
    _run_app(live_server, apikey_create(project=project)[1], monkeypatch, "previous events", True)
    client.force_login(user)
    conversation = Conversation.objects.get(project=project, external_id="oai-events-1")
    body = client.get(f"/p/{project.slug}/conversations/{conversation.pk}/").content.decode()
    assert "<b>Paris</b>" not in body and "&lt;b&gt;Paris&lt;/b&gt;" in body
