"""Messages a model call sends as log events (conventions.EVENT_RULES) become its
round's, through the real ingest paths (OTLP JSON to /v1/traces and /v1/logs) and the
real outbox: either order, a late event in its place, a span's own messages kept,
hostile bodies read as text or nothing, and every pass run twice changing nothing."""

from __future__ import annotations

import json
import time

import pytest

from dashboard.accounts.services import apikey_create, project_create
from dashboard.observatory.conventions import event_messages
from dashboard.observatory.derive.drain import outbox_drain_all
from dashboard.observatory.derive.passes.log_messages import log_messages_derive
from dashboard.observatory.models import Conversation, Message, Round

pytestmark = pytest.mark.django_db

TRACE = "ef" * 16
CHAT = "0a" * 8
ROOT = "0b" * 8
NOW = (time.time_ns() // 3_600_000_000_000 - 1) * 3_600_000_000_000


@pytest.fixture
def project_key():
    project = project_create(name="Events")
    _, key = apikey_create(project=project)
    return project, {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def _value(v):
    if isinstance(v, dict):
        return {"kvlistValue": {"values": [{"key": k, "value": _value(x)} for k, x in v.items()]}}
    if isinstance(v, list):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    if isinstance(v, int) and not isinstance(v, bool):
        return {"intValue": str(v)}
    return {"stringValue": v}


def post_spans(client, auth, *, chat_attributes=None):
    spans = [
        {"traceId": TRACE, "spanId": ROOT, "name": "invoke_agent", "startTimeUnixNano": str(NOW),
         "endTimeUnixNano": str(NOW + 10**9),
         "attributes": [{"key": "gen_ai.conversation.id", "value": {"stringValue": "events-1"}}]},
        {"traceId": TRACE, "spanId": CHAT, "parentSpanId": ROOT, "name": "chat gpt-4o",
         "startTimeUnixNano": str(NOW + 1000), "endTimeUnixNano": str(NOW + 5 * 10**8),
         "attributes": [{"key": k, "value": _value(v)} for k, v in {
             "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", **(chat_attributes or {})}.items()]},
    ]
    document = {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
    assert client.post("/v1/traces", data=json.dumps(document), content_type="application/json",
                       **auth).status_code == 200


def post_events(client, auth, events: list[tuple[str, object]], *, at: int = 2000, attributes=None):
    records = [
        {"traceId": TRACE, "spanId": CHAT, "timeUnixNano": str(NOW + at + i), "eventName": name,
         **({"body": _value(body)} if body is not None else {}),
         "attributes": [{"key": k, "value": _value(v)} for k, v in (attributes or {}).items()]}
        for i, (name, body) in enumerate(events)
    ]
    document = {"resourceLogs": [{"scopeLogs": [{"logRecords": records}]}]}
    response = client.post("/v1/logs", data=json.dumps(document), content_type="application/json", **auth)
    assert response.status_code == 200, response.content


PREVIOUS = [
    ("gen_ai.system.message", {"content": "Be brief."}),
    ("gen_ai.user.message", {"content": "Revenue by region?"}),
    ("gen_ai.choice", {"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": "East leads with 39%."}}),
]


def snapshot(project) -> dict:
    conversation = Conversation.objects.get(project=project, external_id="events-1")
    (round_,) = Round.objects.filter(conversation=conversation)
    return {
        "title": conversation.title, "messages_count": conversation.messages,
        "round": (round_.user_message, round_.thoughts, round_.final_answer),
        "messages": list(Message.objects.filter(conversation=conversation).order_by("index")
                         .values_list("index", "role", "content", "tool_calls", "tool_call_id")),
    }


EXPECTED = {
    "title": "Revenue by region?", "messages_count": 3,
    "round": ("Revenue by region?", [], "East leads with 39%."),
    "messages": [(0, "system", "Be brief.", [], ""), (1, "user", "Revenue by region?", [], ""),
                 (2, "assistant", "East leads with 39%.", [], "")],
}


def test_events_before_their_span(client, project_key):
    project, auth = project_key
    post_events(client, auth, PREVIOUS)
    outbox_drain_all()
    post_spans(client, auth)
    outbox_drain_all()
    assert snapshot(project) == EXPECTED


def test_events_after_their_span(client, project_key):
    project, auth = project_key
    post_spans(client, auth)
    outbox_drain_all()
    assert snapshot(project)["round"] == ("", [], None)  # nothing yet
    post_events(client, auth, PREVIOUS)
    outbox_drain_all()
    assert snapshot(project) == EXPECTED


def test_a_late_event_takes_its_place_in_time_order(client, project_key):
    project, auth = project_key
    post_spans(client, auth)
    post_events(client, auth, PREVIOUS[2:], at=9000)  # the answer first
    outbox_drain_all()
    post_events(client, auth, PREVIOUS[:2])  # then the question, which came before it
    outbox_drain_all()
    assert snapshot(project) == EXPECTED


def test_running_the_pass_again_changes_nothing(client, project_key):
    project, auth = project_key
    post_spans(client, auth)
    post_events(client, auth, PREVIOUS)
    outbox_drain_all()
    before = snapshot(project)
    conversation = Conversation.objects.get(project=project, external_id="events-1")
    log_messages_derive(project_id=project.pk, conversation_ids=[conversation.pk])  # a rebuild
    assert snapshot(project) == before == EXPECTED


def test_the_current_details_event_and_tool_calls(client, project_key):
    project, auth = project_key
    post_spans(client, auth)
    details = {
        "gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": "Weather?"}]}],
        "gen_ai.output.messages": [{"role": "assistant", "parts": [
            {"type": "tool_call", "id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}],
            "finish_reason": "tool_call"}],
    }
    post_events(client, auth, [("gen_ai.client.inference.operation.details", None)], attributes=details)
    outbox_drain_all()
    shown = snapshot(project)
    assert shown["round"] == ("Weather?", [], None)
    assert shown["messages"][-1] == (1, "assistant", "", [{"id": "call_1", "name": "get_weather",
                                                           "args": {"city": "Paris"}}], "")


def test_a_span_with_its_own_messages_keeps_them(client, project_key):
    project, auth = project_key
    own = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "From the span"}]}])
    post_spans(client, auth, chat_attributes={"gen_ai.input.messages": own})
    post_events(client, auth, PREVIOUS)
    outbox_drain_all()
    shown = snapshot(project)
    assert shown["round"][0] == "From the span"
    assert [m[2] for m in shown["messages"]] == ["From the span"]


@pytest.mark.parametrize("body", [
    None, 7, "just text", ["a", "list"], {"content": {"nested": ["x"] * 3}}, {"tool_calls": "not a list"},
    {"tool_calls": [5, {"function": "nope"}]}, {"message": "not a mapping"},
])
def test_hostile_bodies_become_text_or_nothing(client, project_key, body):
    project, auth = project_key
    post_spans(client, auth)
    post_events(client, auth, [("gen_ai.user.message", body), ("gen_ai.choice", body)])
    outbox_drain_all()
    conversation = Conversation.objects.get(project=project, external_id="events-1")
    assert Round.objects.filter(conversation=conversation).count() == 1
    for message in Message.objects.filter(conversation=conversation):
        assert isinstance(message.content, str)


def test_the_table_reads_the_previous_event_shapes():
    inputs, outputs = event_messages("gen_ai.assistant.message", {"tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"q": "x"}'}}]}, {})
    assert (inputs[0].role, inputs[0].tool_calls[0].name, inputs[0].tool_calls[0].arguments) == (
        "assistant", "f", {"q": "x"})
    inputs, _ = event_messages("gen_ai.tool.message", {"content": "42", "id": "c1"}, {})
    assert (inputs[0].role, inputs[0].content, inputs[0].tool_call_id) == ("tool", "42", "c1")
    _, outputs = event_messages("gen_ai.choice", {"index": 0, "finish_reason": "stop", "message": {"content": "hi"}}, {})
    assert (outputs[0].role, outputs[0].content) == ("assistant", "hi")
    assert event_messages("gen_ai.evaluation.result", {"content": "x"}, {}) == ([], [])


def test_a_batch_without_message_events_costs_two_queries(client, project_key, django_assert_num_queries):
    project, auth = project_key
    post_spans(client, auth)
    outbox_drain_all()
    conversation = Conversation.objects.get(project=project, external_id="events-1")
    round_ = Round.objects.get(conversation=conversation)
    with django_assert_num_queries(2):  # the events the window brought, the rounds whose span has events
        assert log_messages_derive(project_id=project.pk, conversation_ids=[conversation.pk],
                                   since=round_.received_at, until=round_.received_at) == 0
