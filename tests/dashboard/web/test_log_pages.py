"""OTLP log records on the pages: under their span on the trace page, GenAI events in
the conversation timeline, and the logs list (keyset paged, project-scoped, escaped)."""

from __future__ import annotations

import uuid

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import HOUR, add_span

from dashboard.observatory.models import Conversation, LogRecord
from dashboard.web.selectors import logs as log_selectors

pytestmark = pytest.mark.django_db
TRACE = "0123456789abcdef" * 2
HOSTILE = "<script>alert(1)</script>"


def add_log(project, *, trace_id=TRACE, span_id="1" * 16, event_name="gen_ai.user.message", body=None,
            conversation=None, attributes=None, index=0):
    return LogRecord.objects.create(
        project=project, trace_id=trace_id, span_id=span_id, record_hash=f"{index:032x}", time=HOUR,
        severity_number=9, severity_text="INFO", event_name=event_name,
        body={"content": HOSTILE} if body is None else body, attributes=attributes or {}, conversation=conversation,
    )


def test_it_shows_logs_under_their_span_escaped(client_in, project):
    add_span(project, TRACE, "1" * 16, "chat gpt-4o")
    add_log(project)
    add_log(project, span_id="9" * 16, event_name="app.orphan", body="no span of mine", index=1)
    body = client_in.get(reverse("web:trace", args=[project.slug, TRACE])).content.decode()
    assert "gen_ai.user.message" in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and HOSTILE not in body
    assert "Logs of this trace outside its spans" in body and "no span of mine" in body
    assert f'{reverse("web:logs", args=[project.slug])}?trace={TRACE}' in body


def test_it_keeps_the_trace_page_query_count_flat(client_in, project, django_assert_max_num_queries):
    for index in range(20):
        add_span(project, TRACE, f"{index + 1:016x}", f"span {index}")
        add_log(project, span_id=f"{index + 1:016x}", index=index)
    with django_assert_max_num_queries(8):  # + the trace's scores
        assert client_in.get(reverse("web:trace", args=[project.slug, TRACE])).status_code == 200


def test_it_shows_genai_events_in_the_conversation_timeline(client_in, project):
    conversation = Conversation.objects.create(project=project, external_id="c1", started_at=HOUR)
    add_log(project, conversation=conversation)
    add_log(project, conversation=conversation, event_name="gen_ai.client.inference.operation.details", body={},
            attributes={"gen_ai.output.messages": [{"role": "assistant", "parts": [{"content": "forty-two"}]}]},
            index=1)
    add_log(project, conversation=conversation, event_name="http.request", body="not a model message", index=2)
    add_log(project, conversation=conversation, event_name="gen_ai.choice", body="", index=3,
            attributes={"gen_ai.output.messages": "<i>x</i>"})
    body = client_in.get(reverse("web:conversation", args=[project.slug, conversation.pk])).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and HOSTILE not in body
    assert "forty-two" in body
    assert "not a model message" not in body
    assert "&lt;i&gt;x&lt;/i&gt;" in body


def test_it_lists_logs_newest_first_in_pages(client_in, project, monkeypatch, django_assert_max_num_queries):
    monkeypatch.setattr(log_selectors, "PAGE_SIZE", 3)
    made = [add_log(project, index=index, body=f"log {index}") for index in range(7)]
    url = reverse("web:logs", args=[project.slug])
    with django_assert_max_num_queries(6):
        first = client_in.get(url)
    assert [row.pk for row in first.context["logs"]] == [made[6].pk, made[5].pk, made[4].pk]
    second = client_in.get(url, {"before": first.context["next_before"]})
    assert [row.pk for row in second.context["logs"]] == [made[3].pk, made[2].pk, made[1].pk]
    third = client_in.get(url, {"before": second.context["next_before"]})
    assert [row.pk for row in third.context["logs"]] == [made[0].pk] and third.context["next_before"] is None


def test_it_lists_one_traces_logs_even_without_spans(client_in, project):
    add_log(project, body="kept without its span")
    add_log(project, trace_id="f" * 32, body="another trace", index=1)
    body = client_in.get(reverse("web:logs", args=[project.slug]), {"trace": TRACE}).content.decode()
    assert "kept without its span" in body and "another trace" not in body
    assert HOSTILE not in body


def test_it_hides_other_projects_logs(client_in, project, other_project):
    add_log(other_project, body="secret")
    assert client_in.get(reverse("web:logs", args=[other_project.slug])).status_code == 404
    assert "secret" not in client_in.get(reverse("web:logs", args=[project.slug])).content.decode()


@pytest.mark.parametrize("params", [{"before": "x"}, {"trace": "nothex"}, {"trace": "0" * 33}])
def test_it_answers_404_for_hostile_params(client_in, project, params):
    assert client_in.get(reverse("web:logs", args=[project.slug]), params).status_code == 404


def test_it_needs_a_login(client, project):
    response = client.get(reverse("web:logs", args=[project.slug]))
    assert response.status_code == 302


def test_it_has_its_own_place_in_the_nav(client_in, project):
    logs_url = reverse("web:logs", args=[project.slug])
    for page in ("web:overview", "web:conversations", "web:traces"):  # reachable from every page
        assert f'<a href="{logs_url}"' in client_in.get(reverse(page, args=[project.slug])).content.decode()
    body = client_in.get(logs_url).content.decode()
    assert f'<a href="{logs_url}" class="current">Logs</a>' in body
    conversations = reverse("web:conversations", args=[project.slug])
    assert f'<a href="{conversations}">Conversations</a>' in body  # no longer the current section


def test_it_says_how_logs_arrive_when_there_are_none(client_in, project):
    body = client_in.get(reverse("web:logs", args=[project.slug])).content.decode()
    assert 'data-testid="logs-empty"' in body
    assert "http://testserver/v1/logs" in body and "OTEL_EXPORTER_OTLP_ENDPOINT=http://testserver" in body
    assert reverse("web:keys", args=[project.slug]) in body
    add_log(project)
    assert 'data-testid="logs-empty"' not in client_in.get(reverse("web:logs", args=[project.slug])).content.decode()


def test_the_timeline_shows_a_message_event_once_as_its_round_s_message_not_again_raw(client_in, project):
    """Message events of a span that has its round are that round's messages (the
    log_messages pass): the panel of raw events leaves them out and says so; events of a
    span without a round, and other gen_ai events, stay listed."""
    from dashboard.observatory.models import Round, Source

    conversation = Conversation.objects.create(project=project, external_id="c1", started_at=HOUR)
    Round.objects.create(project=project, conversation=conversation, round_id="r1", index=1, occurred_at=HOUR,
                         record_id=uuid.uuid4(),
                         source=Source.SPAN, trace_id=TRACE, span_id="1" * 16, user_message="what is six by seven")
    add_log(project, conversation=conversation, body={"content": "what is six by seven"})
    add_log(project, conversation=conversation, event_name="gen_ai.choice", index=1,
            body={"message": {"content": "the round's answer"}})
    add_log(project, conversation=conversation, span_id="2" * 16, index=2, body={"content": "a span not here yet"})
    add_log(project, conversation=conversation, event_name="gen_ai.evaluation.result", index=3, body="graded")
    other = Conversation.objects.create(project=project, external_id="c2", started_at=HOUR)  # same trace elsewhere
    add_log(project, conversation=other, index=4, body={"content": "another conversation's"})

    body = client_in.get(reverse("web:conversation", args=[project.slug, conversation.pk])).content.decode()
    panel = body[body.index('data-testid="conversation-logs"'):]
    assert body.count("what is six by seven") == 1  # the round's, not the raw event's
    assert "the round&#x27;s answer" not in panel
    assert "a span not here yet" in panel and "graded" in panel
    assert "another conversation" not in body
    assert "2 more are shown as their rounds' messages above." in panel
