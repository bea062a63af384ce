"""The tools table and tool detail, checked against a recomputation from the rows."""

from __future__ import annotations

import html
import math
import random
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import HOUR, store, tool_record

from dashboard.observatory import histogram
from dashboard.observatory.models import ToolExecution
from dashboard.web.selectors import tools as tool_selectors
from dashboard.web.views.ranges import range_start

pytestmark = pytest.mark.django_db


@pytest.fixture
def executions(project):
    """A mix of tools, outcomes, levels, retries, cache hits and latencies over hours."""
    rng = random.Random(7)
    records = []
    for i in range(120):
        tool = rng.choice(["query_sales", "load_csv", "web_search"])
        success = rng.random() > 0.25
        records.append(tool_record(
            f"conv-{i % 9}", tool=tool, at=HOUR - timedelta(hours=rng.randrange(0, 30), minutes=rng.randrange(60)),
            success=success, error_type=None if success else rng.choice(["timeout", "validation", "network"]),
            duration_ms=rng.choice([0.5, 3, 40, 90, 150, 700, 2500, 9000, 600_000]) * rng.uniform(0.5, 1.0),
            level=rng.choice(["brief", "standard", "full"]),
            tokens={"brief": rng.randrange(5, 20), "standard": rng.randrange(30, 90), "full": rng.randrange(200, 900)},
            retries=rng.choice([0, 0, 0, 1, 2]), cache_hit=rng.random() < 0.2,
        ))
    store(project, records)
    return project


def cell(body: str, tool: str, field: str) -> str:
    row = re.search(rf'<tr data-tool="{re.escape(tool)}">(.*?)</tr>', body, re.S).group(1)
    return html.unescape(re.search(rf'data-field="{field}">([^<]*)<', row).group(1).strip())


def test_it_matches_a_recomputation_from_the_rows(client_in, executions):
    response = client_in.get(reverse("web:tools", args=[executions.slug]) + "?range=7d")
    assert response.status_code == 200
    body = response.content.decode()
    since = range_start(24 * 7)
    for tool in ("query_sales", "load_csv", "web_search"):
        rows = list(ToolExecution.objects.filter(project=executions, tool_name=tool, occurred_at__gte=since))
        calls = len(rows)
        successes = sum(r.success for r in rows)
        assert cell(body, tool, "calls") == f"{calls:,}"
        assert cell(body, tool, "errors") == f"{calls - successes:,}"
        assert cell(body, tool, "success_rate") == f"{successes / calls * 100:.1f}%"
        assert cell(body, tool, "retries") == f"{sum(r.retry_count for r in rows):,}"
        assert cell(body, tool, "cache_hit_rate") == f"{sum(r.cache_hit for r in rows) / calls * 100:.1f}%"
        timeouts = sum(1 for r in rows if not r.success and r.error_type == "timeout")
        assert cell(body, tool, "timeouts") == f"{timeouts:,}"
        for level in ("brief", "standard", "full"):
            seen = [r.observation_tokens for r in rows if r.output_level == level]
            expected = f"{sum(seen) / len(seen):,.1f}" if seen else "—"
            assert cell(body, tool, f"mean_{level}") == expected
        # Percentiles: the bucket bound holding the nearest-rank value of the rows.
        durations = sorted(r.duration_ms for r in rows)
        for q, field in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
            exact = durations[max(1, math.ceil(q * calls)) - 1]
            index = histogram.bucket_index(exact)
            op = ">" if index == len(histogram.LATENCY_BUCKET_BOUNDS_MS) else "≤"
            bound = histogram.LATENCY_BUCKET_BOUNDS_MS[min(index, len(histogram.LATENCY_BUCKET_BOUNDS_MS) - 1)]
            from dashboard.web.templatetags.observatory import duration

            assert cell(body, tool, field) == f"{op} {duration(bound)}"
    assert "bucket estimates" in body


def test_it_only_counts_the_chosen_range(client_in, project):
    store(project, [
        tool_record("a", tool="old_tool", at=HOUR - timedelta(days=20)),
        tool_record("a", tool="new_tool", at=HOUR),
    ])
    body = client_in.get(reverse("web:tools", args=[project.slug]) + "?range=24h").content.decode()
    assert 'data-tool="new_tool"' in body and 'data-tool="old_tool"' not in body
    body = client_in.get(reverse("web:tools", args=[project.slug]) + "?range=30d").content.decode()
    assert 'data-tool="old_tool"' in body


def test_it_falls_back_to_the_default_range_for_junk(client_in, executions):
    response = client_in.get(reverse("web:tools", args=[executions.slug]) + "?range=<script>")
    assert response.status_code == 200
    assert b"<strong>7d</strong>" in response.content


def test_it_keeps_the_tools_query_count_flat(client_in, executions, django_assert_max_num_queries):
    page = reverse("web:tools", args=[executions.slug])
    with django_assert_max_num_queries(6):
        assert client_in.get(page).status_code == 200


def test_it_shows_tool_detail_with_exact_percentiles_when_small(client_in, executions):
    response = client_in.get(reverse("web:tool", args=[executions.slug, "load_csv"]) + "?range=7d")
    assert response.status_code == 200
    body = response.content.decode()
    since = range_start(24 * 7)
    durations = sorted(ToolExecution.objects.filter(project=executions, tool_name="load_csv", occurred_at__gte=since)
                       .values_list("duration_ms", flat=True))
    from dashboard.web.templatetags.observatory import duration

    p95 = durations[math.ceil(0.95 * len(durations)) - 1]
    assert re.search(r'data-testid="p95">\s*' + re.escape(duration(p95)) + "<", body)
    assert "exact, from the calls" in body
    assert 'data-chart="histogram"' in body and 'id="histogram-data"' in body
    failures = ToolExecution.objects.filter(project=executions, tool_name="load_csv", success=False).count()
    assert body.count('<tr class="error">') == min(failures, 20)


def test_it_uses_bucket_estimates_above_the_exact_limit(client_in, executions, monkeypatch):
    monkeypatch.setattr(tool_selectors, "EXACT_PERCENTILE_LIMIT", 3)
    body = client_in.get(reverse("web:tool", args=[executions.slug, "load_csv"])).content.decode()
    assert "bucket estimates (upper bounds)" in body


def test_it_sums_what_each_level_costs(client_in, executions):
    body = client_in.get(reverse("web:tool", args=[executions.slug, "web_search"]) + "?range=7d").content.decode()
    since = range_start(24 * 7)
    rows = ToolExecution.objects.filter(project=executions, tool_name="web_search", occurred_at__gte=since)
    table = re.search(r'data-testid="level-costs">(.*?)</table>', body, re.S).group(1)
    for level in ("brief", "standard", "full"):
        total = sum(getattr(r, f"{level}_tokens") for r in rows)
        assert f"{total:,}" in table
    assert f"{sum(r.observation_tokens for r in rows):,}" in table


def test_it_lists_error_types(client_in, executions):
    body = client_in.get(reverse("web:tool", args=[executions.slug, "query_sales"]) + "?range=7d").content.decode()
    since = range_start(24 * 7)
    failed = ToolExecution.objects.filter(project=executions, tool_name="query_sales", success=False,
                                          occurred_at__gte=since)
    table = re.search(r'data-testid="error-types">(.*?)</table>', body, re.S).group(1)
    for error_type in {f.error_type for f in failed}:
        n = failed.filter(error_type=error_type).count()
        assert re.search(rf">{error_type}</span></td><td class=\"num\">{n}<", table)


def test_it_answers_404_for_an_unknown_tool(client_in, project):
    assert client_in.get(reverse("web:tool", args=[project.slug, "never_ran"])).status_code == 404
    assert client_in.get(reverse("web:tool", args=[project.slug, "x" * 300])).status_code == 404


def test_it_escapes_a_hostile_tool_name(client_in, project):
    name = "<script>alert(1)</script>"
    store(project, [tool_record("a", tool=name, at=HOUR, success=False, error_type="<b>boom</b>")])
    for page in (reverse("web:tools", args=[project.slug]), reverse("web:tool", args=[project.slug, name]),
                 reverse("web:overview", args=[project.slug])):
        response = client_in.get(page)
        assert response.status_code == 200, page
        body = response.content.decode()
        assert "<script>alert(1)</script>" not in body and "<b>boom</b>" not in body
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body


def test_it_says_when_level_costs_cover_only_the_newest_calls(client_in, project, monkeypatch):
    monkeypatch.setattr(tool_selectors, "LEVEL_COST_CALLS", 2)
    store(project, [
        tool_record("c", tool="t", at=HOUR - timedelta(minutes=3), tokens={"brief": 1000, "standard": 1, "full": 1}),
        tool_record("c", tool="t", at=HOUR - timedelta(minutes=2), tokens={"brief": 10, "standard": 1, "full": 1}),
        tool_record("c", tool="t", at=HOUR - timedelta(minutes=1), tokens={"brief": 20, "standard": 1, "full": 1}),
    ])
    body = client_in.get(reverse("web:tool", args=[project.slug, "t"])).content.decode()
    assert 'data-testid="costs-sampled"' in body and "newest 2 calls" in body
    table = re.search(r'data-testid="level-costs">(.*?)</table>', body, re.S).group(1)
    assert re.findall(r'<td class="num">([^<]*)</td>', table)[:3] == ["2", "30", "15.0"]  # the oldest call left out


def test_it_prices_each_tools_observation_tokens(client_in, executions):
    from dashboard.observatory.models import ToolHourlyRollup
    from dashboard.web.costs import usd_text

    body = client_in.get(reverse("web:tools", args=[executions.slug]) + "?range=7d").content.decode()
    since = range_start(24 * 7)
    for tool in ("query_sales", "load_csv", "web_search"):
        shown = re.search(rf'<tr data-tool="{tool}">(.*?)</tr>', body, re.S).group(1)
        rows = ToolExecution.objects.filter(project=executions, tool_name=tool, occurred_at__gte=since)
        # gpt-4o's seeded price: $2.50 per million input tokens
        expected = sum(r.observation_tokens for r in rows) * 2_500_000
        assert sum(ToolHourlyRollup.objects.filter(project=executions, tool_name=tool, hour__gte=since)
                   .values_list("cost_pico_usd", flat=True)) == expected
        assert re.search(r'data-field="cost"><span>([^<]*)</span>', shown).group(1) == usd_text(expected)


def test_it_says_how_many_calls_a_tools_cost_leaves_out(client_in, project):
    from dashboard.web.costs import usd_text

    store(project, [tool_record("c", tool="t"), tool_record("c", tool="t") | {"model": "my-own-model"},
                    tool_record("c", tool="t") | {"model": "my-own-model"}])
    priced = ToolExecution.objects.get(project=project, tool_name="t", model="gpt-4o")
    expected = usd_text(priced.observation_tokens * 2_500_000)  # gpt-4o's seeded input price
    table = client_in.get(reverse("web:tools", args=[project.slug])).content.decode()
    row = re.search(r'<tr data-tool="t">(.*?)</tr>', table, re.S).group(1)
    assert re.search(r'data-field="cost"><span>([^<]*)</span> <span class="muted">([^<]*)</span>', row).groups() == (
        expected, "(2 calls without a price left out)")
    page = client_in.get(reverse("web:tool", args=[project.slug, "t"])).content.decode()
    assert re.search(r'data-testid="tool-cost">([^<]*)<', page).group(1) == expected
    assert re.search(r'data-testid="tool-cost-left-out">([^<]*)<', page).group(1) == "(2 calls without a price left out)"


def test_it_links_each_bucket_of_the_tool_series_to_its_failures(client_in, executions):
    import json

    body = client_in.get(reverse("web:tool", args=[executions.slug, "load_csv"]) + "?range=7d").content.decode()
    start = body.index('<script id="series-data" type="application/json">')
    data = json.loads(body[body.index(">", start) + 1: body.index("</script>", start)])
    failing = ToolExecution.objects.filter(project=executions, tool_name="load_csv", success=False)
    assert sum(data["errors"]) == failing.filter(occurred_at__gte=range_start(24 * 7)).count()
    i = max(range(len(data["errors"])), key=lambda k: data["errors"][k])
    page = client_in.get(data["links"][i]).content.decode()
    shown = re.search(r'<h2 id="failures">(.*?)</table>', page, re.S).group(1)
    assert shown.count('<tr class="error">') == data["errors"][i]
    from datetime import datetime

    start_at = datetime.fromisoformat(data["starts"][i])  # UTC, as the bucket's link
    in_bucket = failing.filter(occurred_at__gte=start_at, occurred_at__lt=start_at + timedelta(hours=1))
    for failure in in_bucket:
        assert f"#exec-{failure.pk}" in shown


@pytest.mark.parametrize("query", ["?since=garbage", "?until=2026-02-30T10:00", "?since=" + "1" * 50])
def test_it_ignores_a_bad_failure_bucket(client_in, executions, query):
    response = client_in.get(reverse("web:tool", args=[executions.slug, "load_csv"]) + query)
    assert response.status_code == 200 and "Recent failures" in response.content.decode()


def test_it_estimates_percentiles_when_some_calls_are_spans_alone(client_in, project):
    """A tool span outside any conversation counts in the rollups only: exact
    percentiles over the executions would leave it out, so the page shows the
    histogram's bounds over every call."""
    from datetime import timedelta

    from tests.dashboard.web.pages_factories import HOUR, add_span, store, tool_record

    from dashboard.observatory.derive.passes import rollups

    store(project, [tool_record("conv-p", tool="mixed", duration_ms=10.0)])
    add_span(project, "c" * 32, "1" * 16, "execute_tool mixed", duration_ms=9000.0, tool_name="mixed",
             operation="execute_tool")
    rollups.tool_rollups_refresh(project_id=project.pk, hours=[HOUR, HOUR + timedelta(hours=1)])
    response = client_in.get(reverse("web:tool", args=[project.slug, "mixed"]))
    assert response.context["stats"].calls == 2
    percentiles = response.context["percentiles"]
    assert not percentiles.exact and percentiles.p99 >= 9000


def test_it_lists_failed_tool_spans_outside_any_conversation(client_in, project, other_project):
    from tests.dashboard.web.pages_factories import add_span

    add_span(project, "c" * 32, "1" * 16, "execute_tool lonely", tool_name="lonely", operation="execute_tool",
             status_code=2, status_message="<b>refused</b>")
    add_span(project, "c" * 32, "2" * 16, "execute_tool lonely", tool_name="lonely", operation="execute_tool",
             attributes={"error.type": "timeout"})
    add_span(project, "c" * 32, "3" * 16, "execute_tool lonely", tool_name="lonely", operation="execute_tool")
    add_span(other_project, "d" * 32, "1" * 16, "execute_tool lonely", tool_name="lonely", status_code=2)
    response = client_in.get(reverse("web:tool", args=[project.slug, "lonely"]))
    assert response.status_code == 200
    assert sorted(s.span_id for s in response.context["span_failures"]) == ["1" * 16, "2" * 16]
    body = response.content.decode()
    assert f"/traces/{'c' * 32}/#span-{'1' * 16}" in body and "&lt;b&gt;refused" in body
