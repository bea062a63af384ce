"""The trace view: waterfall of any trace, span attributes and events."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import HOUR, add_span, full_conversation

from dashboard.accounts.services import apikey_create
from dashboard.ingest.otlp import MAX_VALUE_CHARS
from dashboard.observatory.models import Round, Span
from dashboard.web.selectors import traces

pytestmark = pytest.mark.django_db
TRACE = "0123456789abcdef" * 2


@pytest.fixture
def trace(project):
    add_span(project, TRACE, "1" * 16, "agent.run", duration_ms=2000)
    add_span(project, TRACE, "2" * 16, "llm.call", parent="1" * 16, start_ms=0, duration_ms=500,
             attributes={"gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": 321})
    add_span(project, TRACE, "3" * 16, "tool.query_sales", parent="1" * 16, start_ms=1000, duration_ms=1000,
             status_code=2, events=[{"name": "exception", "attributes": {"exception.type": "TimeoutError"}}])
    add_span(project, TRACE, "4" * 16, "db.query", parent="3" * 16, start_ms=1500, duration_ms=200)
    return TRACE


def test_it_draws_the_tree_in_order_with_offsets(project, trace):
    view = traces.waterfall(project, trace)
    assert [(r.span.name, r.depth) for r in view.rows] == [
        ("agent.run", 0), ("llm.call", 1), ("tool.query_sales", 1), ("db.query", 2)]
    assert [(round(r.offset_pct), round(r.width_pct)) for r in view.rows] == [(0, 100), (0, 25), (50, 50), (75, 10)]
    assert view.duration_ms == 2000


def test_it_shows_attributes_and_events(client_in, project, trace):
    response = client_in.get(reverse("web:trace", args=[project.slug, trace]))
    assert response.status_code == 200
    body = response.content.decode()
    assert "gen_ai.request.model" in body and "gpt-4o" in body and "321" in body
    assert "TimeoutError" in body and 'class="badge error">error<' in body
    assert "bar o-50 w-50 error" in body


def test_it_survives_a_parent_cycle_and_missing_parents(project):
    add_span(project, "f" * 32, "a" * 16, "x", parent="b" * 16)
    add_span(project, "f" * 32, "b" * 16, "y", parent="a" * 16)
    add_span(project, "f" * 32, "c" * 16, "z", parent="9" * 16)
    view = traces.waterfall(project, "f" * 32)
    assert sorted(r.span.name for r in view.rows) == ["x", "y", "z"]  # every span once


def test_it_limits_huge_traces(project, monkeypatch):
    monkeypatch.setattr(traces, "SPAN_LIMIT", 3)
    for i in range(5):
        add_span(project, "e" * 32, f"{i:016x}", f"s{i}", start_ms=i)
    view = traces.waterfall(project, "e" * 32)
    assert view.truncated and len(view.rows) == 3


def test_it_escapes_hostile_attributes(client_in, project):
    add_span(project, "d" * 32, "1" * 16, "<script>n()</script>",
             attributes={"<script>k()</script>": "<script>v()</script>"},
             events=[{"name": "<script>e()</script>"}])
    body = client_in.get(reverse("web:trace", args=[project.slug, "d" * 32])).content.decode()
    for code in ("n()", "k()", "v()", "e()"):
        assert f"<script>{code}" not in body
        assert f"&lt;script&gt;{code}&lt;/script&gt;" in body


def test_it_answers_404_for_an_unknown_trace(client_in, project):
    assert client_in.get(reverse("web:trace", args=[project.slug, "9" * 32])).status_code == 404


def test_it_keeps_the_query_count_flat(client_in, project, trace, django_assert_max_num_queries):
    url = reverse("web:trace", args=[project.slug, trace])
    with django_assert_max_num_queries(7):  # + the trace's scores
        assert client_in.get(url).status_code == 200


BADGE = 'data-testid="span-truncated"'


def waterfall_label(body: str, name: str) -> str:
    return re.search(rf'<td class="label[^"]*" title="{re.escape(name)}">(.*?)</td>', body, re.S).group(1)


def span_summary(body: str, span_id: str) -> str:
    return re.search(rf'<details class="panel span-detail" id="span-{span_id}">\s*<summary>(.*?)</summary>',
                     body, re.S).group(1)


def test_it_badges_the_spans_that_ingest_cut_and_only_those(client, member, project):
    """Through the real OTLP ingest: one span with an attribute over the value limit."""
    _, key = apikey_create(project=project)
    start = int(HOUR.timestamp() * 1e9)

    def otlp_span(span_id: str, name: str, value: str) -> dict:
        return {"traceId": "c" * 32, "spanId": span_id, "name": name, "kind": 1,
                "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 5_000_000),
                "attributes": [{"key": "payload", "value": {"stringValue": value}}]}

    body = {"resourceSpans": [{"scopeSpans": [{"spans": [
        otlp_span("1" * 16, "cut.span", "x" * (MAX_VALUE_CHARS + 10)),
        otlp_span("2" * 16, "whole.span", "small"),
    ]}]}]}
    response = client.post("/v1/traces", data=json.dumps(body), content_type="application/json",
                           headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200
    assert dict(Span.objects.filter(project=project).values_list("name", "truncated")) == {
        "cut.span": True, "whole.span": False}

    client.force_login(member)
    page = client.get(reverse("web:trace", args=[project.slug, "c" * 32])).content.decode()
    assert BADGE in waterfall_label(page, "cut.span") and BADGE in span_summary(page, "1" * 16)
    assert BADGE not in waterfall_label(page, "whole.span") and BADGE not in span_summary(page, "2" * 16)
    assert page.count(BADGE) == 2


def test_it_badges_a_truncated_span_in_the_conversation_waterfall(client_in, project):
    full_conversation(project, "conv-t", rounds=1, trace_id="d" * 32)
    add_span(project, "d" * 32, "1" * 16, "agent.round", duration_ms=100, truncated=True)
    round_ = Round.objects.get(conversation__external_id="conv-t")
    partial = client_in.get(reverse("web:round_waterfall", args=[project.slug, round_.pk])).content.decode()
    assert BADGE in waterfall_label(partial, "agent.round")
