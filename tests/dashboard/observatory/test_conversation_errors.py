"""A conversation whose only error is one failed tool call has errors: ``has_errors``
(the list's "with errors" filter, the overview's count) and ``errors`` are set from the
tool call alone, whichever way it arrived: a pipeline record, a GenAI tool span with an
error status, an OpenInference TOOL span. Through the real endpoints and the outbox."""

from __future__ import annotations

import json

import pytest

from dashboard.observatory.derive.drain import outbox_drain_all
from dashboard.observatory.models import Conversation, ToolExecution

from .test_span_rows import agent_spans, send, span

pytestmark = pytest.mark.django_db


def only_error_is_the_tool_call(project, external_id: str) -> None:
    conversation = Conversation.objects.get(project=project, external_id=external_id)
    calls = ToolExecution.objects.filter(conversation=conversation)
    assert [call.success for call in calls.order_by("occurred_at")].count(False) == 1  # one failed call...
    assert conversation.rounds >= 1 and conversation.status != "error"  # ...and no failed round
    assert (conversation.errors, conversation.has_errors) == (1, True)
    assert list(Conversation.objects.filter(project=project, has_errors=True)) == [conversation]


def test_a_failed_tool_record_alone_makes_a_conversation_have_errors(client, auth, project, records):
    batch = [records.round("conv-r", 0), records.message("conv-r", 0, content="Sales in March?"),
             records.tool_result("conv-r"), records.tool_result("conv-r", success=False)]
    response = client.post("/api/v1/records", json.dumps({"records": batch}), content_type="application/json",
                           **auth)
    assert response.status_code == 200 and response.json()["accepted"] == 4
    outbox_drain_all()
    only_error_is_the_tool_call(project, "conv-r")


def test_a_genai_tool_span_with_an_error_status_alone_makes_a_conversation_have_errors(client, auth, project):
    send(client, auth,
         span("1" * 16, "chat gpt-4o", at_ms=0, ms=200, gen_ai__operation__name="chat",
              gen_ai__conversation__id="conv-g", gen_ai__request__model="gpt-4o",
              gen_ai__usage__input_tokens=20, gen_ai__usage__output_tokens=5),
         span("2" * 16, "execute_tool weather", at_ms=300, ms=50, error=True, gen_ai__operation__name="execute_tool",
              gen_ai__conversation__id="conv-g", gen_ai__tool__name="weather", gen_ai__tool__call__id="call_1"),
         span("3" * 16, "chat gpt-4o", at_ms=400, ms=200, gen_ai__operation__name="chat",
              gen_ai__conversation__id="conv-g", gen_ai__request__model="gpt-4o",
              gen_ai__usage__input_tokens=30, gen_ai__usage__output_tokens=8))
    only_error_is_the_tool_call(project, "conv-g")


def test_an_openinference_tool_span_with_an_error_status_alone_makes_a_conversation_have_errors(
        client, auth, project):
    spans = agent_spans("conv-oi")
    spans["tool"] = span("3" * 16, "weather", parent="1" * 16, at_ms=300, ms=50, error=True,
                         openinference__span__kind="TOOL", tool__name="weather")
    send(client, auth, *spans.values())
    only_error_is_the_tool_call(project, "conv-oi")
