"""The conversation list: filters, search, sort, keyset paging, the polled partial."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import HOUR, message_record, round_record, store, tool_record

from dashboard.observatory.models import Conversation
from dashboard.observatory.selectors import CONVERSATION_ORDERS
from dashboard.web.forms import CONVERSATION_SORTS
from dashboard.web.selectors.conversations import PAGE_SIZE, Cursor

pytestmark = pytest.mark.django_db


def external_ids(response) -> list[str]:
    return re.findall(r'<div class="small muted mono">([^<]*)</div>', response.content.decode())


@pytest.fixture
def conversations(project):
    """Three conversations with different users, models, tools and outcomes."""
    store(project, [
        round_record("c-north", 0, at=HOUR, user_message="North sales please", user_id="alice", model="gpt-4o"),
        tool_record("c-north", tool="query_sales", round_id="c-north-r0", at=HOUR),
        round_record("c-south", 0, at=HOUR + timedelta(minutes=5), user_message="South returns",
                     user_id="bob", model="claude-3-sonnet", status="error"),
        tool_record("c-south", tool="load_csv", round_id="c-south-r0", at=HOUR + timedelta(minutes=5),
                    success=False, error_type="timeout"),
        round_record("c-east", 0, at=HOUR + timedelta(minutes=10), user_message="East margins",
                     user_id="alice", model="claude-3-sonnet"),
        message_record("c-east", 1, "assistant", "The margin of the 东部 region is 12%"),
    ])
    return project


def list_url(project, **params):
    from urllib.parse import urlencode

    return reverse("web:conversations", args=[project.slug]) + ("?" + urlencode(params) if params else "")


def test_it_offers_only_orders_the_domain_knows_on_date_columns():
    """Keyset cursors hold a datetime; the domain refuses any other order."""
    assert set(CONVERSATION_SORTS) <= set(CONVERSATION_ORDERS)
    assert all(sort.lstrip("-") in ("last_activity_at", "started_at") for sort in CONVERSATION_SORTS)


def test_it_lists_newest_activity_first(client_in, conversations):
    response = client_in.get(list_url(conversations))
    assert response.status_code == 200
    assert external_ids(response) == ["c-east", "c-south", "c-north"]


@pytest.mark.parametrize(
    "params, expected",
    [
        ({"user": "alice"}, ["c-east", "c-north"]),
        ({"model": "claude-3-sonnet"}, ["c-east", "c-south"]),
        ({"status": "error"}, ["c-south"]),
        ({"has_errors": "on"}, ["c-south"]),
        ({"tool": "load_csv"}, ["c-south"]),
        ({"q": "north"}, ["c-north"]),
        ({"q": "东部"}, ["c-east"]),
        ({"q": "c-south"}, ["c-south"]),
        ({"sort": "last_activity_at"}, ["c-north", "c-south", "c-east"]),
        ({"sort": "-started_at", "user": "alice"}, ["c-east", "c-north"]),
    ],
)
def test_it_filters_searches_and_sorts(client_in, conversations, params, expected):
    response = client_in.get(list_url(conversations, **params))
    assert response.status_code == 200
    assert external_ids(response) == expected


def test_it_filters_by_date_range(client_in, conversations):
    day = HOUR.date()
    response = client_in.get(list_url(conversations, since=day.isoformat(), until=day.isoformat()))
    assert len(external_ids(response)) == 3
    later = (day + timedelta(days=1)).isoformat()
    assert external_ids(client_in.get(list_url(conversations, since=later))) == []
    earlier = (day - timedelta(days=1)).isoformat()
    assert external_ids(client_in.get(list_url(conversations, until=earlier))) == []


@pytest.mark.parametrize(
    "params",
    [
        {"since": "not-a-date"},
        {"status": "maybe"},
        {"sort": "password"},
        {"since": "2025-02-02", "until": "2025-01-01"},
        {"after": "junk"},
        {"after": "1.2", "before": "1.2"},
        {"q": "x" * 201},
        {"after": "99999999999999999999999.1"},
    ],
)
def test_it_answers_400_for_malformed_filters(client_in, conversations, params):
    response = client_in.get(list_url(conversations, **params))
    assert response.status_code == 400
    partial = client_in.get(reverse("web:conversation_rows", args=[conversations.slug]), params)
    assert partial.status_code == 400


def test_it_pages_with_keyset_cursors_through_every_row_once(client_in, project):
    # Same last_activity_at for many rows: the id breaks the ties.
    rows = [
        Conversation(project=project, external_id=f"bulk-{i:03d}", started_at=HOUR,
                     last_activity_at=HOUR + timedelta(seconds=i // 7))
        for i in range(PAGE_SIZE * 2 + 5)
    ]
    Conversation.objects.bulk_create(rows)
    seen: list[str] = []
    url = list_url(project)
    pages = 0
    while url:
        response = client_in.get(url)
        assert response.status_code == 200
        seen += external_ids(response)
        pages += 1
        match = re.search(r'href="\?([^"]*)" rel="next"', response.content.decode())
        url = list_url(project) + "?" + match.group(1).replace("&amp;", "&") if match else None
    assert pages == 3
    assert len(seen) == len(set(seen)) == len(rows)
    expected = [c.external_id for c in Conversation.objects.filter(project=project).order_by("-last_activity_at", "-id")]
    assert seen == expected


def test_it_pages_back_with_the_before_cursor(client_in, project):
    Conversation.objects.bulk_create([
        Conversation(project=project, external_id=f"c{i:03d}", last_activity_at=HOUR + timedelta(seconds=i))
        for i in range(PAGE_SIZE + 10)
    ])
    first = external_ids(client_in.get(list_url(project)))
    second_page = client_in.get(list_url(project, after=Cursor(
        Conversation.objects.get(project=project, external_id=first[-1]).last_activity_at,
        Conversation.objects.get(project=project, external_id=first[-1]).pk).encode()))
    second = external_ids(second_page)
    assert len(second) == 10
    match = re.search(r'href="\?([^"]*)" rel="prev"', second_page.content.decode())
    back = client_in.get(list_url(project) + "?" + match.group(1).replace("&amp;", "&"))
    assert external_ids(back) == first


def test_it_renders_only_the_partial_for_htmx(client_in, conversations):
    response = client_in.get(reverse("web:conversation_rows", args=[conversations.slug]), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    body = response.content.decode()
    assert "<html" not in body
    assert 'id="conversation-rows"' in body
    assert 'hx-trigger="every 10s"' in body  # the first page keeps polling
    assert external_ids(response) == ["c-east", "c-south", "c-north"]


def test_it_shows_a_new_conversation_on_the_next_poll(client_in, conversations):
    url = reverse("web:conversation_rows", args=[conversations.slug])
    before = external_ids(client_in.get(url))
    store(conversations, [round_record("c-new", 0, at=HOUR + timedelta(minutes=30))])
    after = external_ids(client_in.get(url))
    assert after == ["c-new"] + before


def test_it_stops_polling_past_the_first_page(client_in, project):
    Conversation.objects.bulk_create([
        Conversation(project=project, external_id=f"p{i}", last_activity_at=HOUR + timedelta(seconds=i))
        for i in range(PAGE_SIZE + 1)
    ])
    first = client_in.get(list_url(project)).content.decode()
    after = re.search(r'href="\?([^"]*)" rel="next"', first).group(1).replace("&amp;", "&")
    second = client_in.get(list_url(project) + "?" + after).content.decode()
    assert "every 10s" not in second


def test_it_keeps_the_query_count_flat(client_in, project, django_assert_max_num_queries):
    Conversation.objects.bulk_create([
        Conversation(project=project, external_id=f"q{i}", last_activity_at=HOUR + timedelta(seconds=i))
        for i in range(PAGE_SIZE + 5)
    ])
    # + the saved views of the nav, + the user's cost when a user is filtered on
    with django_assert_max_num_queries(8):
        assert client_in.get(list_url(project, q="q1", tool="x", user="u")).status_code == 200
    with django_assert_max_num_queries(7):
        assert client_in.get(list_url(project)).status_code == 200


def test_it_escapes_hostile_titles_and_ids(client_in, project):
    store(project, [round_record("<script>alert(1)</script>", 0, user_message="<img src=x onerror=alert(2)>")])
    body = client_in.get(list_url(project)).content.decode()
    assert "<script>alert(1)</script>" not in body
    assert "<img src=x" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body


def test_it_searches_in_bounded_windows_and_offers_to_search_further(client_in, project, monkeypatch):
    from dashboard.web.selectors import conversations as selectors

    monkeypatch.setattr(selectors, "SEARCH_WINDOW", 3)
    records = [round_record(f"s{i}", 0, at=HOUR + timedelta(minutes=i), user_message="nothing here")
               for i in range(8)]
    records[1] = round_record("s1", 0, at=HOUR + timedelta(minutes=1), user_message="the rare zebra")
    store(project, records)
    url = list_url(project, q="zebra")
    found, windows = [], 0
    while url and windows < 10:
        body = client_in.get(url).content.decode()
        windows += 1
        found += external_ids(client_in.get(url))
        match = re.search(r'href="\?([^"]*)" rel="next"', body)
        url = list_url(project) + "?" + match.group(1).replace("&amp;", "&") if match else None
        if url:
            assert 'data-testid="search-window"' in body
    assert found == ["s1"]
    assert windows == 3  # s7-s5, s4-s2, s1-s0


def test_it_keeps_the_search_query_count_flat(client_in, project, django_assert_max_num_queries):
    Conversation.objects.bulk_create([
        Conversation(project=project, external_id=f"z{i}", last_activity_at=HOUR + timedelta(seconds=i))
        for i in range(30)
    ])
    with django_assert_max_num_queries(8):  # + the saved views
        assert client_in.get(list_url(project, q="nothing matches")).status_code == 200


@pytest.fixture
def said_where(project):
    """'revenue' said by the user, by the model, and only in a system prompt, a tool
    result or a skill's injected (meta) instructions."""
    prompt = "You are a business analyst. Skills: revenue reports."  # every conversation's system prompt
    records = []
    for external_id, role, text, extra in [
        ("by-user", "user", "What was revenue in March?", {}),
        ("by-model", "assistant", "March revenue was 12.", {}),
        ("in-tool", "tool", '{"revenue": 12}', {"tool_call_id": "call_1"}),
        ("in-meta", "user", "Use the revenue skill's steps.", {"is_meta": True}),
        ("in-prompt", "user", "Hello there", {}),
    ]:
        records += [round_record(external_id, 0, user_message="a question", final_answer="an answer"),
                    message_record(external_id, 0, "system", prompt), message_record(external_id, 1, role, text, **extra)]
    store(project, records)
    return project


def test_it_searches_what_the_user_and_the_model_said(client_in, said_where):
    assert sorted(external_ids(client_in.get(list_url(said_where, q="revenue")))) == ["by-model", "by-user"]
    everywhere = client_in.get(list_url(said_where, q="revenue", all_text="on"))
    assert sorted(external_ids(everywhere)) == ["by-model", "by-user", "in-meta", "in-prompt", "in-tool"]
    assert 'name="all_text"' in everywhere.content.decode() and "checked" in everywhere.content.decode()


def test_it_exports_and_answers_the_api_with_the_same_search(client_in, said_where):
    import csv
    import io

    export = reverse("web:conversations_export", args=[said_where.slug])
    for params, expected in [("?q=revenue", ["by-model", "by-user"]),
                             ("?q=revenue&all_text=on", ["by-model", "by-user", "in-meta", "in-prompt", "in-tool"])]:
        body = b"".join(client_in.get(export + params).streaming_content).decode()
        assert sorted(r["external_id"] for r in csv.DictReader(io.StringIO(body))) == expected
    api = f"/api/v1/projects/{said_where.slug}/conversations"
    assert sorted(c["external_id"] for c in client_in.get(api, {"q": "revenue"}).json()["items"]) == ["by-model", "by-user"]
    assert len(client_in.get(api, {"q": "revenue", "all_text": "true"}).json()["items"]) == 5
