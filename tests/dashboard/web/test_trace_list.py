"""The traces page: one row per trace (its root span), filters, keyset paging,
project scope; and what the trace page shows of a span (kind, resource, links,
attribute values as JSON)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import HOUR, add_span, full_conversation

from dashboard.observatory.models import Conversation, Span
from dashboard.web.models import SavedView
from dashboard.web.selectors import traces

pytestmark = pytest.mark.django_db


def trace_id(n: int) -> str:
    return f"{n:032x}"


@pytest.fixture
def five_traces(project):
    """Traces 1..5, trace n starting n seconds after HOUR, each with a root and a child."""
    for n in range(1, 6):
        add_span(project, trace_id(n), "1" * 16, f"root {n}", start_ms=n * 1000, duration_ms=n * 100,
                 service_name="api" if n % 2 else "worker", status_code=2 if n == 4 else 1, kind=2)
        add_span(project, trace_id(n), "2" * 16, "child needle" if n == 3 else "child", parent="1" * 16,
                 start_ms=n * 1000, duration_ms=10, status_code=2 if n == 5 else 0)


def listed(client, project, **params) -> list[str]:
    response = client.get(reverse("web:traces", args=[project.slug]), params)
    assert response.status_code == 200, response.content[:500]
    return [row.root.name for row in response.context["page"].rows]


def test_it_lists_one_row_per_trace_newest_first_with_its_counts(client_in, project, five_traces):
    response = client_in.get(reverse("web:traces", args=[project.slug]))
    rows = response.context["page"].rows
    assert [row.root.name for row in rows] == ["root 5", "root 4", "root 3", "root 2", "root 1"]
    # the counts are those of the stored spans of each trace
    for row in rows:
        spans = Span.objects.filter(project=project, trace_id=row.root.trace_id)
        assert (row.spans, row.errors) == (spans.count(), spans.filter(status_code=2).count())
    body = response.content.decode()
    assert reverse("web:trace", args=[project.slug, trace_id(5)]) in body
    assert "server" in body  # the span kind by name


@pytest.mark.parametrize("params, expected", [
    ({"service": "worker"}, ["root 4", "root 2"]),
    ({"status": "error"}, ["root 4"]),
    ({"status": "ok"}, ["root 5", "root 3", "root 2", "root 1"]),
    ({"has_errors": "on"}, ["root 5", "root 4"]),  # trace 5's error is a child's
    ({"min_ms": "250"}, ["root 5", "root 4", "root 3"]),
    ({"max_ms": "250"}, ["root 2", "root 1"]),
    ({"min_ms": "150", "max_ms": "450"}, ["root 4", "root 3", "root 2"]),
    ({"q": "NEEDLE"}, ["root 3"]),  # text in any span's name, case-insensitive
    ({"q": "root 2"}, ["root 2"]),
])
def test_it_filters(client_in, project, five_traces, params, expected):
    assert listed(client_in, project, **params) == expected


def test_it_filters_by_time_range(client_in, project, five_traces):
    since = (HOUR + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M")
    assert listed(client_in, project, since=since[:10]) == ["root 5", "root 4", "root 3", "root 2", "root 1"]
    later = HOUR + timedelta(minutes=1)
    assert listed(client_in, project, since=later.strftime("%Y-%m-%dT%H:%M")) == []
    assert listed(client_in, project, until=later.strftime("%Y-%m-%dT%H:%M"))[:1] == ["root 5"]


def test_it_lists_the_traces_of_a_conversation_from_its_page(client_in, project, five_traces):
    conversation = Conversation.objects.create(project=project, external_id="c-1")
    Span.objects.filter(project=project, trace_id=trace_id(2), span_id="2" * 16).update(conversation=conversation)
    assert listed(client_in, project, conversation=conversation.pk) == ["root 2"]
    page = client_in.get(reverse("web:conversation", args=[project.slug, conversation.pk])).content.decode()
    assert f"{reverse('web:traces', args=[project.slug])}?conversation={conversation.pk}" in page


def test_it_pages_by_keyset_both_ways(client_in, project, five_traces, monkeypatch):
    monkeypatch.setattr(traces, "TRACE_PAGE_SIZE", 2)
    url = reverse("web:traces", args=[project.slug])
    first = client_in.get(url).context["page"]
    assert [r.root.name for r in first.rows] == ["root 5", "root 4"] and first.prev_cursor is None
    second = client_in.get(url, {"after": first.next_cursor}).context["page"]
    assert [r.root.name for r in second.rows] == ["root 3", "root 2"]
    third = client_in.get(url, {"after": second.next_cursor}).context["page"]
    assert [r.root.name for r in third.rows] == ["root 1"] and third.next_cursor is None
    back = client_in.get(url, {"before": third.prev_cursor}).context["page"]
    assert [r.root.name for r in back.rows] == ["root 3", "root 2"]
    assert [r.root.name for r in client_in.get(url, {"before": back.prev_cursor}).context["page"].rows] == [
        "root 5", "root 4"]


@pytest.mark.parametrize("params", [
    {"after": "not-a-cursor"}, {"before": "1.-5"}, {"after": "1.1", "before": "1.1"}, {"min_ms": "-1"},
    {"min_ms": "nan"}, {"max_ms": "1e999"}, {"status": "sideways"}, {"since": "yesterday"},
    {"since": "2025-01-02", "until": "2025-01-01"}, {"min_ms": "5", "max_ms": "5"}, {"conversation": "abc"},
    {"q": "x" * 201},
])
def test_it_answers_400_to_bad_filters(client_in, project, five_traces, params):
    response = client_in.get(reverse("web:traces", args=[project.slug]), params)
    assert response.status_code == 400
    assert b"filter-errors" in response.content


def test_it_answers_404_for_another_projects_conversation(client_in, project, other_project):
    theirs = Conversation.objects.create(project=other_project, external_id="theirs")
    response = client_in.get(reverse("web:traces", args=[project.slug]), {"conversation": theirs.pk})
    assert response.status_code == 404


def test_it_is_project_scoped_and_needs_a_login(client, client_in, project, other_project):
    add_span(other_project, trace_id(9), "1" * 16, "their root")
    assert client_in.get(reverse("web:traces", args=[other_project.slug])).status_code == 404
    assert client_in.get(reverse("web:trace", args=[other_project.slug, trace_id(9)])).status_code == 404
    assert listed(client_in, project) == []
    client.logout()
    assert client.get(reverse("web:traces", args=[project.slug])).status_code == 302


def test_it_keeps_the_query_count_flat(client_in, project, django_assert_max_num_queries):
    for n in range(1, 41):
        add_span(project, trace_id(n), "1" * 16, f"root {n}", start_ms=n)
        add_span(project, trace_id(n), "2" * 16, "child", parent="1" * 16, start_ms=n, status_code=2)
    with django_assert_max_num_queries(9):
        response = client_in.get(reverse("web:traces", args=[project.slug]), {"has_errors": "on", "q": "child"})
    assert len(response.context["page"].rows) == 40


def test_it_saves_the_filters_as_a_view(client_in, project, five_traces):
    response = client_in.post(reverse("web:saved_views", args=[project.slug]),
                              {"name": "slow api", "page": "traces", "query": "service=api&min_ms=250"})
    assert response.status_code == 302
    view = SavedView.objects.get(project=project, name="slow api")
    opened = client_in.get(reverse("web:saved_view", args=[project.slug, view.pk]))
    assert opened.status_code == 302 and opened["Location"].startswith(reverse("web:traces", args=[project.slug]))
    assert listed(client_in, project, service="api", min_ms="250") == ["root 5", "root 3"]
    bad = client_in.post(reverse("web:saved_views", args=[project.slug]),
                         {"name": "bad", "page": "traces", "query": "min_ms=-3"})
    assert bad.status_code == 400 and not SavedView.objects.filter(name="bad").exists()


# --- the trace page ----------------------------------------------------------------


def test_it_shows_kind_resource_links_and_json_values(client_in, project):
    add_span(project, trace_id(7), "1" * 16, "", kind=3, service_name="agent", operation="chat",
             attributes={"flag": True, "tags": ["x", "y"], "none": None, "n": 3},
             resource={"service.name": "agent", "host.name": "box-1"},
             links=[{"trace_id": trace_id(8), "span_id": "2" * 16, "attributes": {"why": "retry"}}])
    body = client_in.get(reverse("web:trace", args=[project.slug, trace_id(7)])).content.decode()
    assert "(unnamed)" in body  # an empty name is a span like any other
    assert "client" in body and "chat" in body  # kind by name, operation
    assert "host.name" in body and "&quot;box-1&quot;" in body  # resource attributes
    assert "true" in body and "True" not in body  # JSON, not Python reprs
    assert "[&quot;x&quot;, &quot;y&quot;]" in body and "null" in body
    assert f"{reverse('web:trace', args=[project.slug, trace_id(8)])}#span-{'2' * 16}" in body  # the link
    assert "&quot;why&quot;: &quot;retry&quot;" in body
    assert f'data-copy="{trace_id(7)}"' in body and f'data-copy="{"1" * 16}"' in body


def test_it_links_rounds_tool_calls_and_failures_to_their_span(client_in, project):
    full_conversation(project, "conv-links")
    conversation = Conversation.objects.get(project=project, external_id="conv-links")
    from dashboard.observatory.models import Round, ToolExecution

    round_ = Round.objects.filter(conversation=conversation).exclude(trace_id="").first()
    Round.objects.filter(pk=round_.pk).update(span_id="ab" * 8)
    failed = ToolExecution.objects.filter(conversation=conversation, success=False).first()
    ToolExecution.objects.filter(pk=failed.pk).update(trace_id=trace_id(3), span_id="cd" * 8)
    page = client_in.get(reverse("web:conversation", args=[project.slug, conversation.pk])).content.decode()
    assert f"{reverse('web:trace', args=[project.slug, round_.trace_id])}#span-{'ab' * 8}" in page
    assert f"{reverse('web:trace', args=[project.slug, trace_id(3)])}#span-{'cd' * 8}" in page
    tool = client_in.get(reverse("web:tool", args=[project.slug, failed.tool_name])).content.decode()
    assert f"{reverse('web:trace', args=[project.slug, trace_id(3)])}#span-{'cd' * 8}" in tool
