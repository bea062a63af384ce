"""Two conversations side by side: aligned rounds with their differences marked,
a summary equal to the stored totals, deep links, 404 across projects, bad input."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import HOUR, compression_record, round_record, store, tool_record

from dashboard.observatory.models import Conversation
from dashboard.web.selectors.compare import ASPECTS, ROUNDS_PER_PAGE

pytestmark = pytest.mark.django_db


def conversation(project, external_id, rounds, *, answer="Sales were 12.", region="north", fail_round=None,
                 level="standard", compress_round=None):
    records = []
    for i in range(rounds):
        at = HOUR + timedelta(minutes=i)
        rid = f"{external_id}-r{i}"
        records.append(round_record(external_id, i, at=at, final_answer=answer, context_tokens=1000 * (i + 1)))
        records.append(tool_record(external_id, round_id=rid, at=at + timedelta(seconds=1), level=level,
                                   parameters={"region": region}, success=i != fail_round,
                                   error_type="timeout" if i == fail_round else None,
                                   retries=1 if i == fail_round else 0))
    if compress_round is not None:
        records.append(compression_record(external_id, f"{external_id}-r{compress_round}",
                                          at=HOUR + timedelta(minutes=compress_round, seconds=5)))
    store(project, records)
    return Conversation.objects.get(project=project, external_id=external_id)


def compare_url(project, a, b, **extra):
    query = "&".join(f"{k}={v}" for k, v in {"a": a.pk, "b": b.pk, **extra}.items())
    return reverse("web:compare", args=[project.slug]) + "?" + query


def rows(body):
    return re.findall(r'data-position="(\d+)" data-differs="([^"]*)"', body)


def test_it_aligns_rounds_and_marks_what_differs(client_in, project):
    a = conversation(project, "run-a", 3)
    b = conversation(project, "run-b", 4, region="south", fail_round=1, level="full", compress_round=2,
                     answer="Sales were 7.")
    body = client_in.get(compare_url(project, a, b)).content.decode()
    aligned = dict(rows(body))
    assert list(aligned) == ["1", "2", "3", "4"]
    assert {"tools", "levels", "final_answer", "observation_tokens"} <= set(aligned["1"].split())
    assert "user_message" not in aligned["1"].split() and "context" not in aligned["1"].split()
    assert "errors" in aligned["2"].split() and "compressions" in aligned["3"].split()
    assert "errors" not in aligned["1"].split()
    assert set(aligned["4"].split()) == set(ASPECTS)  # a round on one side only differs in everything
    assert "no round at this position" in body
    assert '"strategy": "summarize"' in html.unescape(body)  # the compression's config is shown


def test_it_numbers_rounds_from_one_and_links_them(client_in, project):
    a, b = conversation(project, "num-a", 2), conversation(project, "num-b", 2)
    body = client_in.get(compare_url(project, a, b)).content.decode()
    link = reverse("web:conversation", args=[project.slug, a.pk])
    assert f'<a href="{link}#round-1">round 1</a>' in body and f'<a href="{link}#round-2">round 2</a>' in body
    assert "round 0" not in body


def test_it_marks_nothing_for_two_identical_runs(client_in, project):
    a, b = conversation(project, "same-a", 2), conversation(project, "same-b", 2)
    body = client_in.get(compare_url(project, a, b)).content.decode()
    assert [differs for _, differs in rows(body)] == ["none", "none"]
    assert "0 of 2 aligned rounds differ" in body


def test_it_summarises_the_stored_totals_with_deltas(client_in, project):
    a = conversation(project, "sum-a", 2)
    b = conversation(project, "sum-b", 5, fail_round=0)
    body = client_in.get(compare_url(project, a, b)).content.decode()

    def delta(name):
        row = re.search(rf'<tr data-summary="{name}">(.*?)</tr>', body, re.S).group(1)
        return html.unescape(re.search(r'data-field="delta">([^<]*)<', row).group(1))

    assert delta("rounds") == f"+{b.rounds - a.rounds}"
    assert delta("tool calls") == f"+{b.tool_calls - a.tool_calls}"
    assert delta("errors") == f"+{b.errors - a.errors}"
    assert delta("tokens in") == f"+{b.input_tokens - a.input_tokens:,}"
    from dashboard.web.costs import usd_text

    assert delta("cost") == "+" + usd_text(b.cost_pico_usd - a.cost_pico_usd)


def test_it_says_which_rounds_a_cost_leaves_out(client_in, project):
    from dashboard.web.costs import usd_text

    a = conversation(project, "priced", 2)
    store(project, [round_record("half", 0), round_record("half", 1, at=HOUR + timedelta(minutes=1), model="my-own-model")])
    b = Conversation.objects.get(project=project, external_id="half")
    assert (a.unpriced_rounds, b.unpriced_rounds) == (0, 1) and b.cost_pico_usd
    body = client_in.get(compare_url(project, a, b)).content.decode()
    row = re.search(r'<tr data-summary="cost">(.*?)</tr>', body, re.S).group(1)
    cell = {side: html.unescape(re.sub(r"<[^>]+>", "", re.search(rf'data-field="{side}">(.*?)</td>', row, re.S).group(1)))
            for side in ("a", "b", "delta")}
    assert cell["a"] == usd_text(a.cost_pico_usd)
    assert cell["b"] == f"{usd_text(b.cost_pico_usd)} (1 round without a price left out)"
    assert cell["delta"].endswith("(priced rounds only)")


def test_it_refuses_to_compare_a_conversation_with_itself(client_in, project, other_project):
    a = conversation(project, "alone", 1)
    response = client_in.get(compare_url(project, a, a))
    assert response.status_code == 400 and b"two different conversations" in response.content
    assert b'data-testid="compare-problem"' in response.content and b"compare-rows" not in response.content
    theirs = conversation(other_project, "theirs", 1)  # another project's: 404, as on its own page
    assert client_in.get(compare_url(project, theirs, theirs)).status_code == 404


def test_it_redirects_two_ticked_rows_to_a_deep_link(client_in, project):
    a, b = conversation(project, "x", 1), conversation(project, "y", 1)
    response = client_in.get(reverse("web:compare", args=[project.slug]) + f"?c={a.pk}&c={b.pk}")
    assert response.status_code == 302 and response["Location"].endswith(f"?a={a.pk}&b={b.pk}")


@pytest.mark.parametrize("query", ["", "?c=1", "?c=1&c=1", "?c=1&c=2&c=3", "?c=x&c=2", "?a=1", "?a=-1&b=2",
                                   "?a=1&b=" + "9" * 40])
def test_it_answers_400_to_a_bad_pick(client_in, project, query):
    response = client_in.get(reverse("web:compare", args=[project.slug]) + query)
    assert response.status_code == 400
    assert b'data-testid="compare-problem"' in response.content


def test_it_answers_404_for_another_projects_conversation(client_in, project, other_project):
    mine = conversation(project, "mine", 1)
    theirs = conversation(other_project, "theirs", 1)
    assert client_in.get(compare_url(project, mine, theirs)).status_code == 404
    assert client_in.get(compare_url(project, theirs, mine)).status_code == 404
    assert client_in.get(reverse("web:compare", args=[project.slug]) + "?a=999999&b=999998").status_code == 404


def test_it_escapes_what_agents_wrote(client_in, project):
    evil = "<script>alert(1)</script>"
    store(project, [round_record("evil", 0, user_message=evil, final_answer=evil),
                    tool_record("evil", round_id="evil-r0", parameters={"q": evil}, tool=evil)])
    a = Conversation.objects.get(external_id="evil")
    b = conversation(project, "plain", 1)
    body = client_in.get(compare_url(project, a, b)).content.decode()
    assert evil not in body and "&lt;script&gt;" in body


def test_it_pages_long_conversations_with_a_flat_query_count(client_in, project, django_assert_max_num_queries):
    a = conversation(project, "long-a", ROUNDS_PER_PAGE + 5, compress_round=3)
    b = conversation(project, "long-b", ROUNDS_PER_PAGE + 2)
    # session, user, project, switcher, 2 conversations, prices, 3 per side, the scores: not per round
    with django_assert_max_num_queries(14):
        body = client_in.get(compare_url(project, a, b)).content.decode()
    assert len(rows(body)) == ROUNDS_PER_PAGE and 'data-testid="compare-next"' in body
    page2 = client_in.get(compare_url(project, a, b, page=2)).content.decode()
    assert [p for p, _ in rows(page2)] == [str(ROUNDS_PER_PAGE + i) for i in range(1, 6)]
    assert client_in.get(compare_url(project, a, b, page=9)).status_code == 404
