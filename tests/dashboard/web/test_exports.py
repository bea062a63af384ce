"""CSV exports: streamed, the page's filters and order, the page's numbers, and
no formula a spreadsheet would run."""

from __future__ import annotations

import csv
import html
import io
import re
from datetime import timedelta

import pytest
from django.http import StreamingHttpResponse
from django.urls import reverse
from tests.dashboard.web.pages_factories import HOUR, full_conversation, round_record, store, tool_record

from dashboard.observatory.models import Conversation, ToolExecution
from dashboard.web.costs import usd_text
from dashboard.web.csv_export import cell

pytestmark = pytest.mark.django_db


def read_csv(response) -> list[dict[str, str]]:
    assert isinstance(response, StreamingHttpResponse)
    assert response["Content-Type"].startswith("text/csv")
    text = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(text)))


@pytest.fixture
def filled(project):
    full_conversation(project, "a", rounds=2)
    full_conversation(project, "b", rounds=3)
    store(project, [round_record("c", 0, user_id="user-2", model="acme-large", at=HOUR + timedelta(hours=1))])
    return project


def test_it_exports_the_filtered_list_in_its_order_with_the_pages_numbers(client_in, filled):
    url = reverse("web:conversations", args=[filled.slug])
    page = client_in.get(url + "?sort=started_at").content.decode()
    rows = read_csv(client_in.get(reverse("web:conversations_export", args=[filled.slug]) + "?sort=started_at"))
    assert [r["external_id"] for r in rows] == re.findall(r'<div class="small muted mono">([^<]*)</div>', page)
    shown_costs = re.findall(r'data-field="cost"><span>([^<]*)</span>', page)
    for row, shown in zip(rows, shown_costs):
        conversation = Conversation.objects.get(external_id=row["external_id"])
        assert int(row["input_tokens"]) == conversation.input_tokens
        assert int(row["tool_calls"]) == conversation.tool_calls and int(row["errors"]) == conversation.errors
        assert usd_text(None if row["cost_usd"] == "" else round(float(row["cost_usd"]) * 10**12)) == shown.strip()
    assert next(r for r in rows if r["external_id"] == "c")["cost_usd"] == ""  # no price: empty, never 0


def test_it_exports_the_title_the_list_shows(client_in, filled):
    Conversation.objects.filter(external_id="c").update(title="")  # known from spans only: no user message
    page = client_in.get(reverse("web:conversations", args=[filled.slug]) + "?sort=started_at").content.decode()
    shown = [html.unescape(t) for t in re.findall(r'<td><a href="[^"]*">([^<]*)</a>', page)]
    rows = read_csv(client_in.get(reverse("web:conversations_export", args=[filled.slug]) + "?sort=started_at"))
    assert [r["title"] for r in rows] == shown
    assert next(r for r in rows if r["external_id"] == "c")["title"] == "c"
    assert next(r for r in rows if r["external_id"] == "a")["title"] == Conversation.objects.get(external_id="a").title


def test_it_applies_the_lists_filters(client_in, filled):
    base = reverse("web:conversations_export", args=[filled.slug])
    assert [r["external_id"] for r in read_csv(client_in.get(base + "?user=user-2"))] == ["c"]
    assert {r["external_id"] for r in read_csv(client_in.get(base + "?has_errors=on"))} == {"a", "b"}
    assert [r["external_id"] for r in read_csv(client_in.get(base + "?q=nothing+like+this"))] == []
    bucket = f"?since={HOUR:%Y-%m-%dT%H:%M}&until={HOUR + timedelta(hours=1):%Y-%m-%dT%H:%M}"
    assert {r["external_id"] for r in read_csv(client_in.get(base + bucket))} == {"a", "b"}


@pytest.mark.parametrize("query", ["?sort=nope", "?since=2026-13-45", "?after=1&before=2", "?until=" + "9" * 40])
def test_it_answers_400_to_a_bad_filter(client_in, filled, query):
    assert client_in.get(reverse("web:conversations_export", args=[filled.slug]) + query).status_code == 400


@pytest.mark.parametrize("value, written", [
    ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"), ("+1", "'+1"), ("-2+3", "'-2+3"),
    ("@SUM(A1)", "'@SUM(A1)"), ("\tx", "'\tx"), ("plain", "plain"), (-3, -3), (None, ""), (True, "true"),
])
def test_it_guards_cells_against_formulas(value, written):
    assert cell(value) == written


def test_it_guards_what_agents_wrote_in_the_export(client_in, project):
    store(project, [round_record("=cmd|' /C calc'!A0", 0, user_id="@evil", user_message="=1+1")])
    rows = read_csv(client_in.get(reverse("web:conversations_export", args=[project.slug])))
    assert rows[0]["external_id"] == "'=cmd|' /C calc'!A0" and rows[0]["user_id"] == "'@evil"
    assert rows[0]["title"] == "'=1+1"


def test_it_exports_tool_stats_equal_to_the_tools_table(client_in, filled):
    body = client_in.get(reverse("web:tools", args=[filled.slug]) + "?range=24h").content.decode()
    rows = read_csv(client_in.get(reverse("web:tools_export", args=[filled.slug]) + "?range=24h"))
    for row in rows:
        shown = re.search(rf'<tr data-tool="{row["tool"]}">(.*?)</tr>', body, re.S).group(1)
        assert re.search(r'data-field="calls">([^<]*)<', shown).group(1) == f'{int(row["calls"]):,}'
        assert re.search(r'data-field="errors">([^<]*)<', shown).group(1) == f'{int(row["errors"]):,}'
        assert f'{float(row["success_rate"]) * 100:.1f}%' in shown
        executions = ToolExecution.objects.filter(project=filled, tool_name=row["tool"])
        assert int(row["calls"]) == executions.count()
        cost = re.search(r'data-field="cost"><span>([^<]*)</span>', shown).group(1)
        assert cost == usd_text(round(float(row["observation_cost_usd"]) * 10**12))


def test_it_exports_a_conversations_tool_calls(client_in, filled):
    conversation = Conversation.objects.get(project=filled, external_id="b")
    rows = read_csv(client_in.get(reverse("web:tool_calls_export", args=[filled.slug, conversation.pk])))
    executions = list(ToolExecution.objects.filter(conversation=conversation).order_by("occurred_at", "id"))
    assert [int(r["id"]) for r in rows] == [e.pk for e in executions]
    assert [int(r["observation_tokens"]) for r in rows] == [e.observation_tokens for e in executions]
    assert rows[0]["parameters"] == '{"region": "north"}'
    assert all(r["observation_cost_usd"] for r in rows)  # gpt-4o has a seeded price


def test_it_exports_tool_calls_of_the_users_project_only(client_in, project, other_project):
    store(other_project, [tool_record("theirs")])
    theirs = Conversation.objects.get(project=other_project)
    assert client_in.get(reverse("web:tool_calls_export", args=[project.slug, theirs.pk])).status_code == 404
    assert client_in.get(reverse("web:tool_calls_export", args=[other_project.slug, theirs.pk])).status_code == 404
