"""The conventions table: each convention's attributes read as the dashboard's
concepts, precedence between them, messages in the three shapes, hostile values."""

from __future__ import annotations

import json

import pytest

from dashboard.observatory import conventions
from dashboard.observatory.conventions import MessageFact, ToolCallFact, messages_of, span_facts


@pytest.mark.parametrize("attributes, concept, expected", [
    # conversation
    ({"gen_ai.conversation.id": "c1"}, "conversation", "c1"),
    ({"session.id": "s1"}, "conversation", "s1"),
    ({"traceloop.association.properties.session_id": "t1"}, "conversation", "t1"),
    ({"session.id": "s1", "gen_ai.conversation.id": "c1"}, "conversation", "c1"),  # GenAI first
    # user, agent
    ({"user.id": "u1"}, "user", "u1"),
    ({"enduser.id": "u2"}, "user", "u2"),
    ({"traceloop.association.properties.user_id": "u3"}, "user", "u3"),
    ({"gen_ai.agent.name": "planner"}, "agent", "planner"),
    ({"traceloop.span.kind": "agent", "traceloop.entity.name": "planner"}, "agent", "planner"),
    ({"traceloop.span.kind": "task", "traceloop.entity.name": "step"}, "agent", ""),
    # model: the response's before the request's; "unknown" says nothing
    ({"gen_ai.request.model": "gpt-4o", "gen_ai.response.model": "gpt-4o-2024"}, "model", "gpt-4o-2024"),
    ({"gen_ai.response.model": "unknown", "gen_ai.request.model": "gpt-4o"}, "model", "gpt-4o"),
    ({"llm.model_name": "claude-3"}, "model", "claude-3"),
    ({"llm.request.model": "m"}, "model", "m"),
    # provider: current, previous, OpenInference
    ({"gen_ai.provider.name": "openai"}, "provider", "openai"),
    ({"gen_ai.system": "anthropic"}, "provider", "anthropic"),
    ({"llm.provider": "openai"}, "provider", "openai"),
    # operation
    ({"gen_ai.operation.name": "chat"}, "operation", "chat"),
    ({"gen_ai.operation.name": "text_completion"}, "operation", "chat"),
    ({"gen_ai.operation.name": "execute_tool"}, "operation", "execute_tool"),
    ({"gen_ai.operation.name": "invoke_agent"}, "operation", "invoke_agent"),
    ({"gen_ai.operation.name": "embeddings"}, "operation", "embeddings"),
    ({"gen_ai.operation.name": "execute_task"}, "operation", ""),
    ({"openinference.span.kind": "LLM"}, "operation", "chat"),
    ({"openinference.span.kind": "TOOL"}, "operation", "execute_tool"),
    ({"openinference.span.kind": "AGENT"}, "operation", "invoke_agent"),
    ({"openinference.span.kind": "RETRIEVER"}, "operation", "retrieval"),
    ({"openinference.span.kind": "EMBEDDING"}, "operation", "embeddings"),
    ({"openinference.span.kind": "CHAIN"}, "operation", ""),
    ({"traceloop.span.kind": "tool"}, "operation", "execute_tool"),
    ({"llm.request.type": "chat"}, "operation", "chat"),
    ({"gen_ai.tool.name": "search"}, "operation", "execute_tool"),  # a tool span without an operation
    # tools
    ({"gen_ai.tool.name": "search"}, "tool_name", "search"),
    ({"openinference.span.kind": "TOOL", "tool.name": "search"}, "tool_name", "search"),
    ({"tool.name": "search"}, "tool_name", ""),  # not on a TOOL span: a description, not a call
    ({"traceloop.span.kind": "tool", "traceloop.entity.name": "search"}, "tool_name", "search"),
    ({"gen_ai.tool.call.id": "call_1"}, "tool_call_id", "call_1"),
    ({"tool_call.id": "call_2"}, "tool_call_id", "call_2"),
    # errors
    ({"error.type": "TimeoutError"}, "error_type", "TimeoutError"),
])
def test_it_reads_each_convention(attributes, concept, expected):
    assert getattr(span_facts(attributes), concept) == expected


@pytest.mark.parametrize("attributes, expected", [
    ({"gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 3}, (12, 3)),
    ({"gen_ai.usage.prompt_tokens": 12, "gen_ai.usage.completion_tokens": 3}, (12, 3)),  # previous names
    ({"llm.token_count.prompt": 12, "llm.token_count.completion": 3}, (12, 3)),
    ({"llm.usage.prompt_tokens": "12", "llm.usage.completion_tokens": 3.0}, (12, 3)),
    ({"gen_ai.usage.input_tokens": -5, "gen_ai.usage.output_tokens": True}, (None, None)),  # nonsense is nothing
    ({"gen_ai.usage.input_tokens": "1e99", "gen_ai.usage.output_tokens": [1]}, (None, None)),
])
def test_it_reads_tokens_and_refuses_nonsense(attributes, expected):
    facts = span_facts(attributes)
    assert (facts.input_tokens, facts.output_tokens) == expected


def test_it_reads_the_conversation_and_user_from_the_resource_after_the_span():
    resource = {"session.id": "from-resource", "user.id": "u-resource"}
    assert span_facts({}, resource).conversation == "from-resource"
    assert span_facts({"gen_ai.conversation.id": "own"}, resource).conversation == "own"
    assert span_facts({}, resource).user == "u-resource"
    assert span_facts({}, {"gen_ai.request.model": "m"}).model == ""  # a model is the span's own


def test_it_takes_the_error_type_from_an_exception_event():
    events = [{"name": "log", "attributes": {}}, {"name": "exception", "attributes": {"exception.type": "KeyError"}}]
    assert span_facts({}, None, events).error_type == "KeyError"
    assert span_facts({"error.type": "timeout"}, None, events).error_type == "timeout"


def test_it_never_raises_on_hostile_shapes():
    for attributes in (None, [], "x", {"gen_ai.conversation.id": {"a": 1}}, {"session.id": ["x"]}):
        facts = span_facts(attributes, "not a dict", [1, None, {"name": "exception", "attributes": "x"}])
        assert facts.conversation == ""
    assert messages_of("input_messages", {"gen_ai.input.messages": "{not json"}) == []
    assert messages_of("input_messages", {"gen_ai.input.messages": json.dumps([1, "x", {"parts": 3}])}) == [
        MessageFact(role="")]
    assert messages_of("input_messages", {"llm.input_messages.999999999.message.role": "user"}) == []


def test_it_reads_genai_json_messages():
    attributes = {
        "gen_ai.input.messages": json.dumps([
            {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
            {"role": "user", "parts": [{"type": "text", "content": "weather?"}]},
            {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "w", "arguments": {"q": 1}}]},
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "sunny"}]},
        ]),
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "Sunny."}]}]),
    }
    inputs = messages_of("input_messages", attributes)
    assert [(m.role, m.content) for m in inputs] == [
        ("system", "be brief"), ("user", "weather?"), ("assistant", ""), ("tool", "sunny")]
    assert inputs[2].tool_calls == [ToolCallFact("c1", "w", {"q": 1})]
    assert inputs[3].tool_call_id == "c1"
    assert [(m.role, m.content) for m in messages_of("output_messages", attributes)] == [("assistant", "Sunny.")]


def test_it_reads_the_previous_indexed_messages():
    attributes = {
        "gen_ai.prompt.1.role": "user", "gen_ai.prompt.1.content": "second",
        "gen_ai.prompt.0.role": "system", "gen_ai.prompt.0.content": "first",
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.tool_calls.0.id": "c9", "gen_ai.completion.0.tool_calls.0.name": "search",
        "gen_ai.completion.0.tool_calls.0.arguments": '{"q": "x"}',
    }
    assert [(m.role, m.content) for m in messages_of("input_messages", attributes)] == [
        ("system", "first"), ("user", "second")]
    (answer,) = messages_of("output_messages", attributes)
    assert answer.tool_calls == [ToolCallFact("c9", "search", {"q": "x"})]


def test_it_reads_openinference_messages():
    attributes = {
        "llm.input_messages.0.message.role": "user", "llm.input_messages.0.message.content": "hi",
        "llm.input_messages.1.message.role": "assistant",
        "llm.input_messages.1.message.tool_calls.0.tool_call.id": "c1",
        "llm.input_messages.1.message.tool_calls.0.tool_call.function.name": "w",
        "llm.input_messages.1.message.tool_calls.0.tool_call.function.arguments": '{"city": "Paris"}',
        "llm.input_messages.2.message.role": "tool", "llm.input_messages.2.message.content": "sunny",
        "llm.input_messages.2.message.tool_call_id": "c1",
        "llm.output_messages.0.message.role": "assistant", "llm.output_messages.0.message.content": "Sunny.",
    }
    inputs = messages_of("input_messages", attributes)
    assert [m.role for m in inputs] == ["user", "assistant", "tool"]
    assert inputs[1].tool_calls == [ToolCallFact("c1", "w", {"city": "Paris"})]
    assert inputs[2].tool_call_id == "c1"
    assert messages_of("output_messages", attributes)[0].content == "Sunny."


def test_it_has_one_row_per_key_and_documents_every_row():
    keys = [(rule.concept, rule.key, rule.when) for rule in conventions.RULES]
    assert len(keys) == len(set(keys))
    with open("docs/conventions.md", encoding="utf-8") as doc:
        text = doc.read()
    for rule in conventions.RULES + conventions.MESSAGE_RULES:
        assert f"`{rule.key}`" in text, rule.key
    for event in conventions.EVENT_RULES:
        assert f"| `{event.event}` |" in text and (not event.key or f"`{event.key}`" in text), event.event


def test_it_answers_fast_for_spans_no_convention_describes():
    plain = {"http.method": "GET", "http.route": "/x"}
    assert conventions.link_facts(plain, {}, False) == ("", "", "", "")
    assert not conventions.is_genai(plain, {})
    assert conventions.is_genai({"llm.input_messages.0.message.role": "user"}, {})


# --- the tools offered to the model ---------------------------------------------------

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}


def test_tools_offered_read_from_the_genai_definitions_json():
    from dashboard.observatory.conventions import tools_offered

    definitions = [{"type": "function", "name": "get_weather", "description": "Weather now", "parameters": WEATHER},
                   {"type": "function", "name": "search"}, {"no": "name"}]
    assert tools_offered({"gen_ai.tool.definitions": json.dumps(definitions)}) == [
        {"name": "get_weather", "description": "Weather now", "parameters": WEATHER}, {"name": "search"}]
    assert tools_offered({"gen_ai.tool.definitions": definitions[:1]}) == [  # an array value
        {"name": "get_weather", "description": "Weather now", "parameters": WEATHER}]


def test_tools_offered_read_from_openinference_and_openllmetry_indexed_keys():
    from dashboard.observatory.conventions import tools_offered

    schema = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
    assert tools_offered({"llm.tools.1.tool.json_schema": json.dumps({"name": "search"}),
                          "llm.tools.0.tool.json_schema": json.dumps(schema)}) == [
        {"name": "get_weather", "parameters": WEATHER}, {"name": "search"}]
    assert tools_offered({"llm.request.functions.0.name": "lookup", "llm.request.functions.0.description": "find",
                          "llm.request.functions.0.parameters": json.dumps(WEATHER)}) == [
        {"name": "lookup", "description": "find", "parameters": WEATHER}]


@pytest.mark.parametrize("attributes", [
    {}, {"gen_ai.tool.definitions": '[{"name": "cut at the lim'}, {"gen_ai.tool.definitions": "{}"},
    {"gen_ai.tool.definitions": "[1, 2]"}, {"llm.tools.x.tool.json_schema": "{}"},
    {"gen_ai.request.model": "gpt-4o"},
])
def test_tools_offered_is_none_when_the_span_does_not_say(attributes):
    from dashboard.observatory.conventions import tools_offered

    assert tools_offered(attributes) is None
