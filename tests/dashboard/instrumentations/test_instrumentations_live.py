"""Real instrumentation packages, real OTLP exporter, live dashboard: a conversation
that arrives only as spans is a whole conversation on the pages.

- a LangGraph tool-calling agent with a fake chat model (the LLM edge) under
  OpenInference's LangChain instrumentation, and under traceloop's (OpenLLMetry);
- the openai client under ``opentelemetry-instrumentation-openai-v2`` against a fake
  OpenAI-compatible server on 127.0.0.1 (the network edge).

Spans go through a BatchSpanProcessor with small batches, so children are exported
before the span that names the conversation (the late-linking case). Each test checks
what the pages show against what the app did, and the numbers against a
recomputation from the stored spans.
"""

from __future__ import annotations

import os

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from dashboard.accounts.services import apikey_create, project_create
from dashboard.observatory.conventions import CHAT, EXECUTE_TOOL, span_facts
from dashboard.observatory.models import Conversation, Round, Source, Span, ToolExecution
from dashboard.observatory.derive.drain import outbox_drain_all

from .fake_openai import ANSWER, ANSWER_USAGE, TOOL_CALL_USAGE, fake_openai_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture
def setup(live_server, django_user_model):
    user = django_user_model.objects.create_user("ana", password="x" * 12)
    project = project_create(name="Instrumented", owner=user)
    _, key = apikey_create(project=project)
    provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
    exporter = OTLPSpanExporter(endpoint=f"{live_server.url}/v1/traces",
                                headers={"Authorization": f"Bearer {key}"}, timeout=10)
    # Two spans a batch: children leave before their parents, as in production.
    provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=2, schedule_delay_millis=50))
    return project, user, provider


def _finish(provider: TracerProvider) -> None:
    provider.force_flush()
    provider.shutdown()
    outbox_drain_all()


def recomputed(conversation: Conversation) -> dict[str, int]:
    """The conversation's figures from its stored spans alone."""
    totals = {"rounds": 0, "input_tokens": 0, "output_tokens": 0, "tool_calls": 0, "errors": 0}
    for span in Span.objects.filter(conversation=conversation):
        facts = span_facts(span.attributes, span.resource, span.events)
        if facts.operation == CHAT:
            totals["rounds"] += 1
            totals["input_tokens"] += facts.input_tokens or 0
            totals["output_tokens"] += facts.output_tokens or 0
            totals["errors"] += span.status_code == 2
        elif facts.operation == EXECUTE_TOOL:
            totals["tool_calls"] += 1
            totals["errors"] += span.status_code == 2
    return totals


def shown(client, project, conversation) -> dict[str, int]:
    response = client.get(f"/p/{project.slug}/conversations/{conversation.pk}/")
    assert response.status_code == 200
    c = response.context["conversation"]
    return {"rounds": c.rounds, "input_tokens": c.input_tokens, "output_tokens": c.output_tokens,
            "tool_calls": c.tool_calls, "errors": c.errors}


def listed(client, project, **filters) -> list[int]:
    response = client.get(f"/p/{project.slug}/conversations/", filters)
    assert response.status_code == 200
    return [row.pk for row in response.context["page"].rows]


# --- a LangGraph agent with a fake chat model ------------------------------------------

def _langgraph_agent():
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.prebuilt import ToolNode, create_react_agent

    @tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        if city == "Atlantis":
            raise ValueError("no weather under the sea")
        return f"sunny in {city}"

    class FakeToolCallingModel(FakeMessagesListChatModel):
        """The LLM edge: scripted answers, one asking for two tool calls."""

        def bind_tools(self, tools, **kwargs):
            return self

    model = FakeToolCallingModel(responses=[
        AIMessage(content="", tool_calls=[
            {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_paris"},
            {"name": "get_weather", "args": {"city": "Atlantis"}, "id": "call_atlantis"},
        ], usage_metadata={"input_tokens": 20, "output_tokens": 5, "total_tokens": 25}),
        AIMessage(content="Sunny in Paris; Atlantis has no weather.",
                  usage_metadata={"input_tokens": 40, "output_tokens": 7, "total_tokens": 47}),
    ])
    # A failing tool becomes an error ToolMessage for the model, as agents do.
    return create_react_agent(model, ToolNode([get_weather], handle_tool_errors=True))


def _check_langgraph_conversation(client, project, conversation, *, model: str) -> None:
    assert shown(client, project, conversation) == recomputed(conversation)
    assert (conversation.rounds, conversation.input_tokens, conversation.output_tokens) == (2, 60, 12)
    assert conversation.model == model
    rounds = list(Round.objects.filter(conversation=conversation).order_by("index"))
    assert [(r.index, r.input_tokens, r.output_tokens, r.source) for r in rounds] == [
        (0, 20, 5, Source.SPAN), (1, 40, 7, Source.SPAN)
    ]
    assert rounds[0].user_message == "Weather in Paris and Atlantis?"
    assert rounds[1].final_answer == "Sunny in Paris; Atlantis has no weather."
    tools = {t.tool_call_id: t for t in ToolExecution.objects.filter(conversation=conversation)}
    assert set(tools) == {"call_paris", "call_atlantis"}
    assert tools["call_paris"].success and tools["call_paris"].parameters == {"city": "Paris"}
    assert "sunny in Paris" in tools["call_paris"].observation
    assert {t.round_id for t in tools.values()} == {rounds[0].round_id}
    assert all(t.linked_span_id for t in tools.values())
    # Every span of the trace is linked, though the conversation is named late.
    assert not Span.objects.filter(project=project, trace_id=rounds[0].trace_id, conversation__isnull=True).exists()
    page = client.get(f"/p/{project.slug}/conversations/{conversation.pk}/").content.decode()
    assert "Round 1" in page and "get_weather" in page and f"/traces/{rounds[0].trace_id}/" in page
    assert conversation.pk in listed(client, project, tool="get_weather")
    assert conversation.pk in listed(client, project, q="Atlantis has no weather")  # text search: the answer
    tool_page = client.get(f"/p/{project.slug}/tools/get_weather/")
    assert tool_page.context["stats"].calls == 2
    traces = client.get(f"/p/{project.slug}/traces/", {"conversation": conversation.pk})
    assert [row.root.trace_id for row in traces.context["page"].rows] == [rounds[0].trace_id]


def test_it_shows_a_langgraph_agent_under_openinference(setup, client):
    from openinference.instrumentation import using_attributes
    from openinference.instrumentation.langchain import LangChainInstrumentor

    project, user, provider = setup
    client.force_login(user)
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        with using_attributes(session_id="oi-session-1", user_id="ana@example.com"):
            _langgraph_agent().invoke({"messages": [("user", "Weather in Paris and Atlantis?")]})
    finally:
        instrumentor.uninstrument()
    _finish(provider)

    conversation = Conversation.objects.get(project=project, external_id="oi-session-1")
    assert conversation.user_id == "ana@example.com"
    _check_langgraph_conversation(client, project, conversation, model="")
    # The failing tool call is an error wherever errors are counted.
    failed = ToolExecution.objects.get(conversation=conversation, tool_call_id="call_atlantis")
    assert not failed.success and failed.error_type
    assert conversation.has_errors and conversation.pk in listed(client, project, has_errors="on")
    tool_page = client.get(f"/p/{project.slug}/tools/get_weather/")
    assert [f.tool_call_id for f in tool_page.context["failures"]] == ["call_atlantis"]
    assert tool_page.context["percentiles"].p50 is not None


def test_it_shows_a_langgraph_agent_under_openllmetry(setup, client):
    from opentelemetry.instrumentation.langchain import LangchainInstrumentor

    project, user, provider = setup
    client.force_login(user)
    instrumentor = LangchainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        _langgraph_agent().invoke(
            {"messages": [("user", "Weather in Paris and Atlantis?")]},
            config={"metadata": {"session_id": "tl-session-1", "user_id": "bo"}},
        )
    finally:
        instrumentor.uninstrument()
    _finish(provider)

    conversation = Conversation.objects.get(project=project, external_id="tl-session-1")
    assert conversation.user_id == "bo"
    _check_langgraph_conversation(client, project, conversation, model="")


# --- the openai client under opentelemetry-instrumentation-openai-v2 ----------------------

def test_it_shows_openai_calls_under_the_genai_instrumentation(setup, client, monkeypatch):
    import openai
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    monkeypatch.setitem(os.environ, "OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setitem(os.environ, "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    project, user, provider = setup
    client.force_login(user)
    server = fake_openai_server()
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    tracer = provider.get_tracer("weather-app")
    llm = openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="fake", max_retries=0)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    try:
        # The app names the conversation on its agent span (the GenAI convention);
        # that span ends, and is exported, after the model calls inside it.
        with tracer.start_as_current_span("invoke_agent weather", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather",
            "gen_ai.conversation.id": "oai-conv-1",
        }):
            messages = [{"role": "user", "content": "Weather in Paris?"}]
            first = llm.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools)
            call = first.choices[0].message.tool_calls[0]
            with tracer.start_as_current_span("execute_tool get_weather", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
                "gen_ai.tool.call.id": call.id, "gen_ai.tool.call.arguments": call.function.arguments,
                "gen_ai.tool.call.result": "sunny",
            }):
                pass
            messages += [first.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
            second = llm.chat.completions.create(model="gpt-4o-mini", messages=messages)
            assert second.choices[0].message.content == ANSWER
            with pytest.raises(openai.BadRequestError):
                llm.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "now fail"}])
    finally:
        instrumentor.uninstrument()
        server.shutdown()
    _finish(provider)

    conversation = Conversation.objects.get(project=project, external_id="oai-conv-1")
    assert shown(client, project, conversation) == recomputed(conversation)
    assert conversation.rounds == 3
    assert conversation.input_tokens == TOOL_CALL_USAGE["prompt_tokens"] + ANSWER_USAGE["prompt_tokens"]
    assert conversation.output_tokens == TOOL_CALL_USAGE["completion_tokens"] + ANSWER_USAGE["completion_tokens"]
    # A round's model is the one that answered, else the one asked for (the failed call).
    assert conversation.model == "gpt-4o-mini"
    assert (conversation.status, conversation.errors, conversation.tool_calls) == ("error", 1, 1)
    rounds = list(Round.objects.filter(conversation=conversation).order_by("index"))
    assert [r.status for r in rounds] == ["ok", "ok", "error"]
    assert [r.model for r in rounds] == ["gpt-4o-mini-2024-07-18", "gpt-4o-mini-2024-07-18", "gpt-4o-mini"]
    assert rounds[0].user_message == "Weather in Paris?" and rounds[1].final_answer == ANSWER
    execution = ToolExecution.objects.get(conversation=conversation)
    assert (execution.tool_call_id, execution.parameters, execution.round_id) == (
        "call_w1", {"city": "Paris"}, rounds[0].round_id
    )
    assert conversation.pk in listed(client, project, has_errors="on")
    assert conversation.pk in listed(client, project, tool="get_weather")
    # The token budget chart: context tokens per round from the spans.
    page = client.get(f"/p/{project.slug}/conversations/{conversation.pk}/")
    assert page.context["budget"]["context"] == [31, 55, None]  # the failed call: a gap, not 0
