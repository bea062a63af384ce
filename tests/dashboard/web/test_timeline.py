"""The conversation timeline, its partials (observation, waterfall) and the JSON export."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import add_span, full_conversation, round_record, store, tool_record

from dashboard.observatory.models import CompressionEvent, Conversation, Round, ToolExecution

pytestmark = pytest.mark.django_db
TRACE = "ab" * 16


@pytest.fixture
def conversation(project):
    full_conversation(project, "conv-1", rounds=3, trace_id=TRACE)
    add_span(project, TRACE, "a" * 16, "agent.round", duration_ms=1000)
    add_span(project, TRACE, "b" * 16, "tool query_sales", parent="a" * 16, start_ms=100, duration_ms=300,
             attributes={"gen_ai.tool.name": "query_sales"})
    add_span(project, TRACE, "c" * 16, "tool load_csv", parent="a" * 16, start_ms=500, duration_ms=400,
             status_code=2)
    return Conversation.objects.get(project=project, external_id="conv-1")


def url(conversation, name="web:conversation", **kw):
    return reverse(name, args=[conversation.project.slug, conversation.pk])


def test_it_shows_rounds_in_order_with_everything_in_them(client_in, conversation):
    response = client_in.get(url(conversation))
    assert response.status_code == 200
    body = response.content.decode()
    assert body.count('data-testid="round"') == 3
    # People count rounds from 1 (the stored index from 0): headings and anchors alike.
    assert [r.index for r in Round.objects.filter(conversation=conversation).order_by("index")] == [0, 1, 2]
    assert body.index('id="round-1"') < body.index('id="round-2"') < body.index('id="round-3"')
    assert re.findall(r"<h3>Round (\d+)</h3>", body) == ["1", "2", "3"] and 'id="round-0"' not in body
    assert "What were sales in the north?" in body
    assert "I should query the sales table." in body
    assert "Sales were 12." in body
    assert body.count('data-testid="tool-call"') == 6
    assert "query_sales" in body and "load_csv" in body
    assert "timeout" in body and "E_TIMEOUT" in body and "load_csv failed" in body  # the failed call
    assert "1 retry" in body
    assert "sales-report" in body and "data-cleaning → sales-report" in body and "321 tokens loaded" in body
    event = CompressionEvent.objects.get(conversation=conversation)
    assert reverse("web:compression", args=[conversation.project.slug, event.pk]) in body
    assert 'class="badge level-brief"' in body and 'class="badge level-standard"' in body


def test_it_draws_the_token_budget_from_the_rounds(client_in, conversation):
    body = client_in.get(url(conversation)).content.decode()
    start = body.index('<script id="budget-data" type="application/json">') + len(
        '<script id="budget-data" type="application/json">')
    data = json.loads(body[start: body.index("</script>", start)])
    rounds = list(Round.objects.filter(conversation=conversation).order_by("index"))
    assert data["labels"] == [r.index + 1 for r in rounds] == [1, 2, 3]
    assert data["context"] == [r.derived_context_tokens or r.context_tokens for r in rounds] == [1000, 2000, 3000]
    assert data["window"] == [8000, 8000, 8000]
    assert data["threshold"] == [6400, 6400, 6400]
    assert data["compressions"] == [None, None, 7000]  # fired in the last round, at tokens_before
    assert 'data-chart="token-budget"' in body


def test_it_shows_the_waterfall_of_the_first_traced_round(client_in, conversation):
    body = client_in.get(url(conversation)).content.decode()
    assert 'data-testid="waterfall"' in body
    assert "agent.round" in body and "tool query_sales" in body
    # query_sales: starts at 10% of the trace, lasts 30%; load_csv is an error bar.
    assert "bar o-10 w-30" in body
    assert "bar o-50 w-40 error" in body
    assert "indent-1" in body


def test_it_loads_another_rounds_waterfall_as_a_partial(client_in, conversation):
    round_ = Round.objects.get(conversation=conversation, index=0)
    response = client_in.get(reverse("web:round_waterfall", args=[conversation.project.slug, round_.pk]),
                             HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    body = response.content.decode()
    assert "<html" not in body and 'id="waterfall-panel"' in body and "agent.round" in body
    untraced = Round.objects.get(conversation=conversation, index=1)
    body = client_in.get(reverse("web:round_waterfall", args=[conversation.project.slug, untraced.pk])).content
    assert b"This round names no trace." in body


def test_it_loads_the_observation_when_opened(client_in, project, conversation):
    execution = ToolExecution.objects.filter(conversation=conversation, tool_name="query_sales").first()
    page = client_in.get(url(conversation)).content.decode()
    observation_url = reverse("web:observation", args=[project.slug, execution.pk])
    assert f'hx-get="{observation_url}"' in page and 'hx-trigger="toggle once"' in page
    assert execution.observation not in page  # not loaded with the timeline
    response = client_in.get(observation_url, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert execution.observation in response.content.decode()
    assert b"<html" not in response.content


def test_it_groups_records_without_a_round_apart(client_in, project):
    store(project, [round_record("lonely", 0), tool_record("lonely", tool="orphan_tool", round_id=None)])
    body = client_in.get(url(Conversation.objects.get(external_id="lonely"))).content.decode()
    assert "Outside any reported round" in body and "orphan_tool" in body


def test_it_keeps_the_query_count_flat(client_in, project, django_assert_max_num_queries):
    full_conversation(project, "big", rounds=30)
    page = url(Conversation.objects.get(external_id="big"))
    # session, user, project, switcher, conversation, then one query per kind of row
    # (the GenAI log events included, and a count of those the rounds show), and the
    # scores and the member's role
    with django_assert_max_num_queries(20):
        assert client_in.get(page).status_code == 200


def test_it_pages_long_conversations(client_in, project, monkeypatch):
    from dashboard.observatory import selectors

    monkeypatch.setattr(selectors, "ROUNDS_PER_PAGE", 2)
    full_conversation(project, "long", rounds=5)
    conversation = Conversation.objects.get(external_id="long")
    first = client_in.get(url(conversation)).content.decode()
    assert first.count('data-testid="round"') >= 2 and 'id="round-3"' not in first and "?page=2" in first
    third = client_in.get(url(conversation) + "?page=3").content.decode()
    assert 'id="round-5"' in third and "?page=2" in third
    assert client_in.get(url(conversation) + "?page=9").status_code == 404
    assert client_in.get(url(conversation) + "?page=abc").status_code == 404
    assert client_in.get(url(conversation) + "?page=-1").status_code == 404


def test_it_exports_the_conversation_as_json(client_in, conversation):
    response = client_in.get(url(conversation, "web:conversation_export"))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == f'attachment; filename="conversation-{conversation.pk}.json"'
    data = json.loads(b"".join(response.streaming_content))
    assert data["conversation"]["conversation_id"] == "conv-1"
    assert [r["index"] for r in data["rounds"]] == [0, 1, 2]
    assert len(data["tool_executions"]) == 6
    assert {t["tool_name"] for t in data["tool_executions"]} == {"query_sales", "load_csv"}
    assert data["compressions"][0]["result"]["mode"] == "summarize"
    assert data["skill_activations"][0]["chain"] == ["data-cleaning", "sales-report"]
    assert len(data["messages"]) == 1
    assert data["conversation"]["totals"]["tool_calls"] == 6
    assert {t["source"] for t in data["tool_executions"]} == {"record"}  # none derived from spans


def test_it_escapes_hostile_content_everywhere_on_the_timeline(client_in, project):
    hostile = "<script>alert('x')</script>"
    store(project, [
        round_record("evil", 0, user_message=hostile, final_answer=hostile),
        tool_record("evil", tool="<script>tool()</script>", round_id="evil-r0", observation=hostile,
                    parameters={"q": hostile}),
    ])
    conversation = Conversation.objects.get(external_id="evil")
    body = client_in.get(url(conversation)).content.decode()
    assert "<script>alert" not in body and "<script>tool()" not in body
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in body
    execution = ToolExecution.objects.get(conversation=conversation)
    partial = client_in.get(reverse("web:observation", args=[project.slug, execution.pk])).content.decode()
    assert "<script>" not in partial and "&lt;script&gt;" in partial


def test_it_shows_no_filesystem_path(client_in, conversation, settings):
    body = client_in.get(url(conversation)).content.decode()
    assert str(settings.DATA_DIR) not in body and str(settings.BASE_DIR) not in body


def budget_data(body: str) -> dict:
    start = body.index('<script id="budget-data" type="application/json">') + len(
        '<script id="budget-data" type="application/json">')
    return json.loads(body[start: body.index("</script>", start)])


def test_a_failed_model_call_is_a_gap_in_the_token_budget_not_a_drop_to_0(client_in, project):
    store(project, [round_record("conv-f", 0, context_tokens=1000),
                    round_record("conv-f", 1, context_tokens=0, status="error", final_answer=None),
                    round_record("conv-f", 2, context_tokens=3000)])
    conversation = Conversation.objects.get(project=project, external_id="conv-f")
    body = client_in.get(url(conversation)).content.decode()
    rounds = list(Round.objects.filter(conversation=conversation).order_by("index"))
    assert [r.derived_context_tokens or r.context_tokens for r in rounds] == [1000, 0, 3000]  # 0: none reported
    assert budget_data(body)["context"] == [1000, None, 3000]
    shown = [re.sub(r"\s+", " ", text) for text in re.findall(r'data-field="context">([^<]*)<', body)]
    assert shown == ["context 1,000 / 8,000 tokens", "context unknown / 8,000 tokens", "context 3,000 / 8,000 tokens"]
