"""The overview's metrics panel: the GenAI client metrics per model (and the chart per
model and hour) and the pipeline's per tool, equal to sums of the stored hourly rows;
other metrics only counted; escaped; only the project's own."""

from __future__ import annotations

import html
import json
import re
from datetime import timedelta

import pytest
from django.db.models import Sum
from django.urls import reverse
from tests.dashboard.ingest.test_otlp_metrics import other_metric, token_usage, tool_calls
from tests.dashboard.web.pages_factories import HOUR, full_conversation

from dashboard.ingest.metrics import metrics_store
from dashboard.ingest.otlp_metrics import decode_metrics_protobuf
from dashboard.metrics.models import MetricHour, OtherMetric
from dashboard.observatory.models import Conversation

pytestmark = pytest.mark.django_db

T0 = int(HOUR.timestamp()) * 10**9  # two hours ago, on the hour
MINUTE = 60 * 10**9


def send(project, request) -> None:
    metrics_store(project=project, metrics=decode_metrics_protobuf(request.SerializeToString()))


@pytest.fixture
def metered(project):
    # cumulative, as the SDK sends: the second export repeats the first's totals
    send(project, token_usage([(T0 + MINUTE, 2, 300, "input"), (T0 + MINUTE, 2, 40, "output")], start=T0))
    send(project, token_usage([(T0 + 70 * MINUTE, 5, 900, "input"), (T0 + 70 * MINUTE, 5, 100, "output")],
                              start=T0))
    send(project, token_usage([(T0 + MINUTE, 1, 11, "input")], start=T0, model="<b>claude</b>"))
    send(project, tool_calls([(T0 + MINUTE, 4), (T0 + 2 * MINUTE, 9)], start=T0))
    send(project, tool_calls([(T0 + MINUTE, 1)], start=T0, name="ba.tool.errors"))
    send(project, other_metric(points=3))
    return project


def overview(client, project):
    response = client.get(reverse("web:overview", args=[project.slug]) + "?range=24h")
    assert response.status_code == 200
    return response


def cell(body: str, row_attribute: str, key: str, field: str) -> str:
    row = re.search(rf'<tr {row_attribute}="{re.escape(key)}">(.*?)</tr>', body, re.S).group(1)
    return re.search(rf'data-field="{field}">([^<]*)<', row).group(1)


def test_the_model_figures_are_sums_of_the_hourly_rows(client_in, metered):
    body = overview(client_in, metered).content.decode()
    rows = MetricHour.objects.filter(project=metered, name="gen_ai.client.token.usage", hour__gte=HOUR - timedelta(hours=20))
    for model in set(rows.values_list("model", flat=True)):
        tokens_in = rows.filter(model=model, token_type="input").aggregate(v=Sum("value"))["v"] or 0
        tokens_out = rows.filter(model=model, token_type="output").aggregate(v=Sum("value"))["v"] or 0
        assert cell(body, "data-metric-model", html.escape(model), "metric-tokens") == f"{int(tokens_in):,} / {int(tokens_out):,}"
    # the cumulative repeats counted once: 900 input tokens in all, not 1,200
    assert cell(body, "data-metric-model", "gpt-4o-mini-2024", "metric-tokens") == "900 / 100"


def test_the_tool_figures_are_sums_of_the_hourly_rows(client_in, metered):
    body = overview(client_in, metered).content.decode()
    rows = MetricHour.objects.filter(project=metered, tool_name="query_sales")
    calls = rows.filter(name="ba.tool.calls").aggregate(v=Sum("value"))["v"]
    errors = rows.filter(name="ba.tool.errors").aggregate(v=Sum("value"))["v"]
    assert (cell(body, "data-metric-tool", "query_sales", "calls"), cell(body, "data-metric-tool", "query_sales", "errors")) == (
        f"{int(calls):,}", f"{int(errors):,}") == ("9", "1")


def test_the_chart_is_the_rows_per_model_and_hour(client_in, metered):
    response = overview(client_in, metered)
    series = json.loads(re.search(r'<script id="series-data" type="application/json">(.*?)</script>',
                                  response.content.decode(), re.S).group(1))
    starts = series["starts"]
    for model, per_bucket in series["metric_tokens"]["tokens"].items():
        expected = []
        for start in starts:
            value = MetricHour.objects.filter(
                project=metered, name="gen_ai.client.token.usage", model=model, hour=start,
                token_type__in=("input", "output")).aggregate(v=Sum("value"))["v"] or 0
            expected.append(int(value))
        assert per_bucket == expected
    assert sum(series["metric_tokens"]["tokens"]["gpt-4o-mini-2024"]) == 1000


def test_other_metrics_are_counted_not_shown(client_in, metered):
    body = overview(client_in, metered).content.decode()
    points = OtherMetric.objects.filter(project=metered).aggregate(n=Sum("points"))["n"]
    assert re.search(r'data-field="other-points">([^<]*)<', body).group(1) == f"{points:,}" == "3"
    assert "http.client.duration" not in re.search(r'data-testid="metrics-by-model".*?</table>', body, re.S).group(0)


def test_it_escapes_what_the_app_sent(client_in, metered):
    body = overview(client_in, metered).content.decode()
    assert "<b>claude</b>" not in body and "&lt;b&gt;claude&lt;/b&gt;" in body


def test_it_puts_the_conversations_figures_of_the_model_beside_the_metrics(client_in, project):
    full_conversation(project, "a", rounds=2)
    conversation = Conversation.objects.get(project=project)
    send(project, token_usage([(T0 + MINUTE, 1, 10, "input")], start=T0, model=conversation.model,
                              response_suffix=""))
    body = overview(client_in, project).content.decode()
    assert cell(body, "data-metric-model", conversation.model, "derived-tokens") == (
        f"{conversation.input_tokens:,} / {conversation.output_tokens:,}")
    assert cell(body, "data-metric-model", conversation.model, "metric-tokens") == "10 / 0"


def test_a_project_without_metrics_says_how_they_arrive(client_in, project):
    body = overview(client_in, project).content.decode()
    assert 'data-testid="metrics-empty"' in body and "/v1/metrics" in body


def test_other_users_projects_are_404(client_in, other_project):
    send(other_project, tool_calls([(T0 + MINUTE, 4)], start=T0))
    assert client_in.get(reverse("web:overview", args=[other_project.slug])).status_code == 404
