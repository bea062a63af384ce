"""POST /v1/metrics (and gRPC MetricsService): the GenAI client metrics and the
pipeline's own kept as hourly sums, cumulative points counted once, other metrics
counted by name, and every refusal (short 4xx, nothing stored)."""

from __future__ import annotations

import gzip
import json
from datetime import datetime, timezone

import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from dashboard.ingest.otlp_metrics import MAX_POINTS, PIPELINE_SUMS
from dashboard.metrics.models import MetricHour, MetricSeries, OtherMetric
from dashboard.observatory.models import IngestTransport

from .database_faults import broken_reports, broken_table, busy_database, faults, names_nothing_internal

pytestmark = pytest.mark.django_db

URL = "/v1/metrics"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
START = 1_700_000_000_000_000_000  # 2023-11-14 22:13:20 UTC
MINUTE = 60 * 10**9
HOUR = datetime(2023, 11, 14, 22, tzinfo=timezone.utc)
DELTA, CUMULATIVE = 1, 2


def _attributes(target, values: dict) -> None:
    for key, value in values.items():
        target.append(KeyValue(key=key, value=AnyValue(string_value=value)))


def token_usage(points: list[tuple[int, int, float, str]], *, temporality: int = CUMULATIVE, start: int = START,
                model: str = "gpt-4o-mini", response_suffix: str = "-2024") -> ExportMetricsServiceRequest:
    """gen_ai.client.token.usage as the openai-v2 instrumentation sends it: a
    histogram per token type. ``points``: (time, count, sum, token type)."""
    request = ExportMetricsServiceRequest()
    resource_metrics = request.resource_metrics.add()
    _attributes(resource_metrics.resource.attributes, {"service.name": "agent"})
    scope = resource_metrics.scope_metrics.add()
    scope.scope.name = "opentelemetry.instrumentation.openai_v2"
    metric = scope.metrics.add()
    metric.name, metric.unit = "gen_ai.client.token.usage", "{token}"
    metric.histogram.aggregation_temporality = temporality
    for time, count, total, token_type in points:
        point = metric.histogram.data_points.add()
        point.start_time_unix_nano, point.time_unix_nano = start, time
        point.count, point.sum = count, total
        point.explicit_bounds.extend([1, 4, 16])
        point.bucket_counts.extend([0, 0, 0, count])
        _attributes(point.attributes, {"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                                       "gen_ai.response.model": model + response_suffix, "gen_ai.token.type": token_type})
    return request


def tool_calls(values: list[tuple[int, int]], *, temporality: int = CUMULATIVE, start: int = START,
               name: str = "ba.tool.calls", tool: str = "query_sales") -> ExportMetricsServiceRequest:
    """A pipeline counter (a monotonic sum): ``values`` are (time, value)."""
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = name
    metric.sum.aggregation_temporality, metric.sum.is_monotonic = temporality, True
    previous = start
    for time, value in values:
        point = metric.sum.data_points.add()
        point.start_time_unix_nano = start if temporality == CUMULATIVE else previous
        point.time_unix_nano, point.as_int = time, value
        previous = time
        _attributes(point.attributes, {"gen_ai.tool.name": tool})
    return request


def other_metric(name: str = "http.client.duration", points: int = 3) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = name
    for index in range(points):
        point = metric.gauge.data_points.add()
        point.time_unix_nano, point.as_double = START + index, 1.5
    return request


def post(client, auth, request, content_type: str = PROTOBUF, **extra):
    body = request if isinstance(request, bytes) else request.SerializeToString()
    return client.post(URL, data=body, content_type=content_type, **auth, **extra)


def hours(project) -> dict[tuple, tuple[float, int]]:
    return {(row.hour, row.name, row.model, row.tool_name, row.token_type): (row.value, row.count)
            for row in MetricHour.objects.filter(project=project)}


def test_it_stores_token_usage_per_model_hour_and_token_type(client, auth, project):
    response = post(client, auth, token_usage([(START + MINUTE, 2, 120, "input"), (START + MINUTE, 2, 30, "output")]))
    assert response.status_code == 200, response.content
    assert ExportMetricsServiceResponse.FromString(response.content) == ExportMetricsServiceResponse()
    # the model the conventions table reads: the response's model first
    assert hours(project) == {
        (HOUR, "gen_ai.client.token.usage", "gpt-4o-mini-2024", "", "input"): (120.0, 2),
        (HOUR, "gen_ai.client.token.usage", "gpt-4o-mini-2024", "", "output"): (30.0, 2),
    }


def test_it_counts_cumulative_exports_once_as_increments(client, auth, project):
    """The SDK's default: each export repeats the total since the start."""
    assert post(client, auth, tool_calls([(START + MINUTE, 10)])).status_code == 200
    assert post(client, auth, tool_calls([(START + MINUTE, 10)])).status_code == 200  # a retry
    assert post(client, auth, tool_calls([(START + 2 * MINUTE, 25)])).status_code == 200
    assert post(client, auth, tool_calls([(START + 3 * MINUTE, 25)])).status_code == 200  # nothing new
    assert hours(project) == {(HOUR, "ba.tool.calls", "", "query_sales", ""): (25.0, 0)}
    series = MetricSeries.objects.get(project=project)
    assert (series.value, series.time_unix_nano) == (25.0, START + 3 * MINUTE)


def test_it_takes_a_restarted_series_whole(client, auth, project):
    assert post(client, auth, tool_calls([(START + MINUTE, 10)])).status_code == 200
    restarted = START + 2 * MINUTE
    assert post(client, auth, tool_calls([(restarted + MINUTE, 4)], start=restarted)).status_code == 200
    assert hours(project)[(HOUR, "ba.tool.calls", "", "query_sales", "")] == (14.0, 0)


def test_it_puts_each_increment_in_the_hour_of_its_point(client, auth, project):
    later = START + 60 * MINUTE  # 23:13
    assert post(client, auth, tool_calls([(START + MINUTE, 10), (later, 16)])).status_code == 200
    rows = hours(project)
    assert rows[(HOUR, "ba.tool.calls", "", "query_sales", "")] == (10.0, 0)
    assert rows[(HOUR.replace(hour=23), "ba.tool.calls", "", "query_sales", "")] == (6.0, 0)


def test_it_adds_delta_points_and_a_retried_one_once(client, auth, project):
    request = tool_calls([(START + MINUTE, 3), (START + 2 * MINUTE, 4)], temporality=DELTA)
    assert post(client, auth, request).status_code == 200
    assert post(client, auth, request).status_code == 200
    assert post(client, auth, tool_calls([(START + 3 * MINUTE, 5)], temporality=DELTA,
                                         start=START + 2 * MINUTE)).status_code == 200
    assert hours(project) == {(HOUR, "ba.tool.calls", "", "query_sales", ""): (12.0, 0)}


def test_it_counts_other_metrics_by_name_and_keeps_none_of_their_points(client, auth, project):
    assert post(client, auth, other_metric(points=3)).status_code == 200
    assert post(client, auth, other_metric(points=2)).status_code == 200
    # a kept name in a shape it does not read (a gauge) is another metric too
    assert post(client, auth, other_metric("gen_ai.client.token.usage", points=1)).status_code == 200
    assert dict(OtherMetric.objects.filter(project=project).values_list("name", "points")) == {
        "http.client.duration": 5, "gen_ai.client.token.usage": 1}
    assert not MetricHour.objects.exists()


def test_it_reads_the_otlp_json_mapping(client, auth, project):
    document = {"resourceMetrics": [{"scopeMetrics": [{"metrics": [{
        "name": "gen_ai.client.operation.duration", "unit": "s",
        "histogram": {"aggregationTemporality": 2, "dataPoints": [{
            "startTimeUnixNano": str(START), "timeUnixNano": str(START + MINUTE), "count": "3", "sum": 1.5,
            "bucketCounts": ["0", "3"], "explicitBounds": [1.0],
            "attributes": [{"key": "gen_ai.request.model", "value": {"stringValue": "claude"}}],
            "exemplars": [{"spanId": "cd" * 8, "traceId": "ab" * 16, "asDouble": 0.5,
                           "timeUnixNano": str(START)}],
        }]},
    }]}]}]}
    response = post(client, auth, json.dumps(document).encode(), JSON)
    assert response.status_code == 200, response.content
    assert response.json() == {}
    assert hours(project) == {(HOUR, "gen_ai.client.operation.duration", "claude", "", ""): (1.5, 3)}


def test_it_rejects_only_the_points_past_the_accepted_years(client, auth, project):
    request = tool_calls([(START + MINUTE, 10)])
    bad = request.resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points.add()
    bad.time_unix_nano, bad.as_int = 2**63, 4
    response = post(client, auth, request)
    assert response.status_code == 200
    answer = ExportMetricsServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_data_points == 1 and "years" in answer.partial_success.error_message
    assert hours(project) == {(HOUR, "ba.tool.calls", "", "query_sales", ""): (10.0, 0)}


def test_it_rejects_a_negative_or_infinite_value(client, auth, project):
    request = tool_calls([(START + MINUTE, 10)])
    bad = request.resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points.add()
    bad.time_unix_nano, bad.as_double = START + MINUTE, float("inf")
    response = post(client, auth, request)
    assert ExportMetricsServiceResponse.FromString(response.content).partial_success.rejected_data_points == 1


def test_it_keeps_every_name_the_pipeline_exports():
    from pipeline._metrics_export import INSTRUMENTS

    assert set(PIPELINE_SUMS) == set(INSTRUMENTS) | {"ba.tool.tokens"}


@pytest.mark.parametrize(
    "body, content_type",
    [
        (b"\x0a\xff\xff\xff\xff\x0f", PROTOBUF),  # truncated protobuf
        (b"garbage that is not protobuf \xff", PROTOBUF),
        (b"{not json", JSON),
        (b'{"resourceMetrics": 7}', JSON),
        (b'{"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "ba.tool.calls", "sum": '
         b'{"dataPoints": [{"timeUnixNano": "soon", "asInt": "1"}]}}]}]}]}', JSON),
        (b'{"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": 5}]}]}]}', JSON),
        (b'[1, 2]', JSON),
    ],
)
def test_it_refuses_malformed_bodies(client, auth, project, body, content_type):
    response = post(client, auth, body, content_type)
    assert response.status_code == 400
    if content_type == PROTOBUF:
        assert status_pb2.Status.FromString(response.content).message
    assert not MetricHour.objects.exists() and not MetricSeries.objects.exists() and not OtherMetric.objects.exists()


def test_it_refuses_too_many_points_before_storing_any(client, auth, project):
    response = post(client, auth, other_metric(points=MAX_POINTS + 1))
    assert response.status_code == 413
    assert not OtherMetric.objects.exists()


def test_it_refuses_an_oversized_body(client, auth, project, settings):
    settings.OBSERVATORY_MAX_BODY_BYTES = 1024
    response = post(client, auth, other_metric(points=200))
    assert response.status_code == 413
    assert not OtherMetric.objects.exists()


def test_it_refuses_a_gzip_bomb(client, auth, project, settings):
    settings.OBSERVATORY_MAX_DECODED_BYTES = 64 * 1024
    bomb = gzip.compress(tool_calls([(START + MINUTE, 1)]).SerializeToString() + b"\x00" * (1024 * 1024))
    response = post(client, auth, bomb, HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 413
    assert not MetricHour.objects.exists() and not MetricSeries.objects.exists()


def test_it_takes_gzip(client, auth, project):
    body = gzip.compress(tool_calls([(START + MINUTE, 7)]).SerializeToString())
    assert post(client, auth, body, HTTP_CONTENT_ENCODING="gzip").status_code == 200
    assert hours(project) == {(HOUR, "ba.tool.calls", "", "query_sales", ""): (7.0, 0)}


@pytest.mark.parametrize("header", [None, "Bearer po_0123456789abcdef_" + "x" * 43, "Basic abc"])
def test_it_refuses_a_wrong_key(client, header):
    extra = {"HTTP_AUTHORIZATION": header} if header else {}
    response = client.post(URL, data=tool_calls([(START + MINUTE, 1)]).SerializeToString(), content_type=PROTOBUF,
                           **extra)
    assert response.status_code == 401
    assert not MetricHour.objects.exists() and not MetricSeries.objects.exists()


def test_it_refuses_other_methods_and_content_types(client, auth):
    assert client.get(URL, **auth).status_code == 405
    assert client.post(URL, data=b"x", content_type="text/plain", **auth).status_code == 415


def test_each_project_keeps_its_own_series(client, auth, other_auth, project, other_project):
    assert post(client, auth, tool_calls([(START + MINUTE, 10)])).status_code == 200
    assert post(client, other_auth, tool_calls([(START + MINUTE, 10)])).status_code == 200
    assert hours(project) == hours(other_project) == {(HOUR, "ba.tool.calls", "", "query_sales", ""): (10.0, 0)}


# --- a busy database and a broken one, for real ------------------------------------

@pytest.mark.django_db(transaction=True)
def test_it_answers_503_with_retry_after_when_the_database_is_really_busy(client, auth, project, monkeypatch):
    with busy_database(monkeypatch, "metrics_metrichour"):
        response = post(client, auth, tool_calls([(START + MINUTE, 10)]))
    assert (response.status_code, response["Retry-After"]) == (503, "2")
    assert not MetricHour.objects.exists() and not MetricSeries.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_it_answers_500_naming_nothing_when_the_database_is_broken(client, auth, project, caplog):
    with broken_table("metrics_metrichour"):
        response = post(client, auth, tool_calls([(START + MINUTE, 10)]))
    assert response.status_code == 500 and "Retry-After" not in response
    assert names_nothing_internal(status_pb2.Status.FromString(response.content).message)
    assert not MetricSeries.objects.exists()  # the series' state went with the rolled-back hours
    (report,) = broken_reports(caplog)
    assert f"project {project.pk}" in report.getMessage()
    assert faults(IngestTransport.OTLP_HTTP, project) == 1


def test_retention_purges_old_hours_and_forgotten_series(client, auth, project):
    from datetime import timedelta

    from dashboard.observatory.services import retention_purge

    assert post(client, auth, tool_calls([(START + MINUTE, 10)])).status_code == 200
    MetricSeries.objects.update(seen_at=HOUR)
    retention_purge(project=project, now=HOUR + timedelta(days=400))
    assert not MetricHour.objects.exists() and not MetricSeries.objects.exists()


def test_series_past_the_limit_are_counted_as_other_metrics(client, auth, project, monkeypatch):
    from dashboard.ingest import metrics as store

    monkeypatch.setattr(store, "MAX_SERIES", 1)
    assert post(client, auth, tool_calls([(START + MINUTE, 3)], tool="a")).status_code == 200
    assert post(client, auth, tool_calls([(START + MINUTE, 5)], tool="b")).status_code == 200
    assert hours(project) == {(HOUR, "ba.tool.calls", "", "a", ""): (3.0, 0)}
    assert dict(OtherMetric.objects.filter(project=project).values_list("name", "points")) == {
        "ba.tool.calls (past 1 series)": 1}


def test_names_past_the_limit_are_counted_under_one_name(client, auth, project, monkeypatch):
    from dashboard.ingest import metrics as store

    monkeypatch.setattr(store, "MAX_OTHER_NAMES", 2)
    for name in ("one", "two", "three", "x" * 5000):
        assert post(client, auth, other_metric(name, points=1)).status_code == 200
    counted = dict(OtherMetric.objects.filter(project=project).values_list("name", "points"))
    assert counted == {"one": 1, "two": 1, "(other names)": 2}


@pytest.mark.django_db(transaction=True)
def test_two_processes_sending_the_first_point_of_a_new_series_at_once_count_it_once(project):
    """Two server processes (each its own group commit) store the same export of a new
    series at the same moment, the second while the first's transaction is open: an
    exporter's retry after a timeout, say. The hour's row already exists (another
    series of the same model and tool)."""
    import threading
    from collections import Counter

    from django.db import connection, transaction

    from dashboard.ingest import metrics as store
    from dashboard.ingest.otlp_metrics import decode_metrics_protobuf

    if connection.vendor != "postgresql":
        pytest.skip("SQLite admits one writer at a time: the transactions cannot overlap")

    def points(request: ExportMetricsServiceRequest):
        return decode_metrics_protobuf(request.SerializeToString()).points

    elsewhere = tool_calls([(START + MINUTE, 4)])
    elsewhere.resource_metrics[0].resource.attributes.add(key="service.instance.id",
                                                          value=AnyValue(string_value="worker-2"))
    with transaction.atomic():
        store._metrics_write(project.pk, points(elsewhere), Counter())
    export = points(tool_calls([(START + MINUTE, 10)]))
    first_open, first_may_commit, errors = threading.Event(), threading.Event(), []

    def process(hold: bool) -> None:
        try:
            with transaction.atomic():
                store._metrics_write(project.pk, export, Counter())
                if hold:
                    first_open.set()
                    assert first_may_commit.wait(10)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)
        finally:
            connection.close()

    first = threading.Thread(target=process, args=(True,))
    first.start()
    assert first_open.wait(10)
    second = threading.Thread(target=process, args=(False,))
    second.start()
    second.join(0.5)  # it waits for the first's transaction
    first_may_commit.set()
    first.join(10)
    second.join(10)
    assert not errors
    assert hours(project) == {(HOUR, "ba.tool.calls", "", "query_sales", ""): (14.0, 0)}
    assert MetricSeries.objects.filter(project=project).count() == 2
