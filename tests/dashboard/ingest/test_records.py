"""POST /api/v1/records: storing batches, dedupe, and every kind of bad input."""

from __future__ import annotations

import gzip
import json

import pytest

from dashboard.accounts.services import apikey_revoke
from dashboard.observatory.models import (
    CompressionEvent,
    Conversation,
    IngestTransport,
    Message,
    Round,
    SkillActivation,
    ToolExecution,
    ToolHourlyRollup,
)

from .database_faults import broken_reports, broken_table, busy_database, faults, names_nothing_internal

URL = "/api/v1/records"
pytestmark = pytest.mark.django_db(transaction=False)


def post(client, payload, auth, *, raw: bytes | None = None, **headers):
    body = raw if raw is not None else json.dumps(payload).encode()
    return client.generic("POST", URL, body, content_type="application/json", **auth, **headers)


def stored_rows() -> int:
    return sum(m.objects.count() for m in (Round, Message, ToolExecution, CompressionEvent, SkillActivation))


def test_it_stores_every_record_type_and_answers_counts(client, auth, records, project,
                                                        django_capture_on_commit_callbacks):
    batch = [records.round(user_message="How were sales?", model="gpt-4o", input_tokens=50, output_tokens=7),
             records.message(content="How were sales in March?"),
             records.tool_result(renderings=[{"level": "brief", "observation": "3", "tokens": 1},
                                             {"level": "full", "observation": "a,b,c", "tokens": 5}]),
             records.compression(), records.skill()]
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = post(client, {"records": batch}, auth)
    assert len(callbacks) == 1
    assert response.status_code == 200, response.content
    assert response.json() == {"accepted": 5, "duplicates": 0, "rejected": []}
    assert stored_rows() == 5
    conversation = Conversation.objects.get(project=project, external_id="conv-1")
    execution = ToolExecution.objects.get()
    assert (execution.brief_tokens, execution.standard_tokens, execution.full_observation) == (1, None, "a,b,c")
    event = CompressionEvent.objects.get()
    assert (event.kept_count, event.dropped_count, event.result["mode"]) == (2, 1, "extract")
    # derivations ran after commit (eager tasks): totals, title, rollups
    assert (conversation.rounds, conversation.messages, conversation.tool_calls) == (1, 1, 1)
    assert conversation.title == "How were sales in March?"
    assert ToolHourlyRollup.objects.get().calls == 1


def test_it_counts_a_retried_batch_as_duplicates(client, auth, records):
    batch = [records.message(index=i) for i in range(3)]
    post(client, {"records": batch}, auth)
    response = post(client, {"records": batch}, auth)
    assert response.json() == {"accepted": 0, "duplicates": 3, "rejected": []}
    assert Message.objects.count() == 3


def test_it_counts_only_the_new_records_of_a_partly_retried_batch(client, auth, records, project, monkeypatch):
    """The insert skips what is stored and its row count says how many were new
    (on PostgreSQL: a COPY, then the conflict-skipping staging insert)."""
    from django.db import connection

    from dashboard.observatory import rows

    staged, real_staging = [], rows._copy_via_staging
    monkeypatch.setattr(rows, "_copy_via_staging", lambda *args: staged.append(args[1]) or real_staging(*args))
    stored = [records.message(index=i) for i in range(2)] + [records.tool_result()]
    assert post(client, {"records": stored}, auth).json()["accepted"] == 3
    fresh = [records.message(index=5), records.tool_result(), records.round()]
    response = post(client, {"records": stored + fresh}, auth)
    assert response.json() == {"accepted": 3, "duplicates": 3, "rejected": []}
    assert (Message.objects.count(), ToolExecution.objects.count(), Round.objects.count()) == (3, 2, 1)
    again = post(client, {"records": stored + fresh}, auth)
    assert again.json() == {"accepted": 0, "duplicates": 6, "rejected": []}
    if connection.vendor == "postgresql":
        # only an insert that met a conflict took the staging path: not the new round at first
        assert [model.__name__ for model in staged] == ["Message", "ToolExecution", "Message", "ToolExecution", "Round"]


def test_it_counts_a_record_repeated_inside_one_batch_once(client, auth, records):
    record = records.message()
    response = post(client, {"records": [record, record]}, auth)
    assert response.json()["accepted"] == 1 and response.json()["duplicates"] == 1


def test_it_rejects_bad_items_by_index_and_keeps_the_good_ones(client, auth, records):
    extra_field = {**records.message(), "surprise": 1}
    unknown_type = {**records.message(), "type": "telepathy"}
    response = post(client, {"records": [records.message(), extra_field, unknown_type, "nope"]}, auth)
    body = response.json()
    assert response.status_code == 200
    assert body["accepted"] == 1
    assert [r["index"] for r in body["rejected"]] == [1, 2, 3]
    assert "surprise" in body["rejected"][0]["error"]
    assert "unknown record type" in body["rejected"][1]["error"]
    assert Message.objects.count() == 1


def test_it_accepts_a_gzipped_body(client, auth, records):
    raw = gzip.compress(json.dumps({"records": [records.message()]}).encode())
    response = post(client, None, auth, raw=raw, HTTP_CONTENT_ENCODING="gzip")
    assert response.json()["accepted"] == 1


def test_it_keeps_records_of_one_project_apart_from_another(client, auth, other_auth, records, project, other_project):
    record = records.message()
    post(client, {"records": [record]}, auth)
    response = post(client, {"records": [record]}, other_auth)  # same record_id, other project
    assert response.json()["accepted"] == 1
    assert Conversation.objects.filter(project=other_project).count() == 1
    assert Message.objects.filter(project=project).count() == 1


def test_it_replaces_nul_characters_instead_of_failing(client, auth, records):
    raw = json.dumps({"records": [records.message(content="a\u0000b\ud800c")]}).encode()
    response = post(client, None, auth, raw=raw)
    assert response.json()["accepted"] == 1
    assert Message.objects.get().content == "a\ufffdb\ufffdc"


@pytest.mark.parametrize(
    "raw, status, message",
    [
        (b"{not json", 400, "invalid JSON"),
        (b"\xff\xfe{}", 400, "UTF-8"),
        (b"[]", 400, "JSON object"),
        (b'{"records": {}}', 400, '"records" list'),
        (b'{"other": []}', 400, '"records" list'),
        (b'{"records": ' + b"[" * 40 + b"]" * 40 + b"}", 400, "nested deeper"),
        (b'{"records": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nested deeper"),
        (b'{"records": [{"type": "message", "tokens": NaN}]}', 400, "NaN is not a JSON value"),
    ],
    ids=["malformed", "invalid-utf8", "not-object", "records-not-list", "no-records", "deep", "very-deep", "nan"],
)
def test_it_refuses_malformed_bodies(client, auth, raw, status, message):
    response = post(client, None, auth, raw=raw)
    assert response.status_code == status
    assert message in response.json()["error"]
    assert stored_rows() == 0 and Conversation.objects.count() == 0


def test_it_refuses_too_many_records(client, auth, records, settings):
    settings.OBSERVATORY_MAX_RECORDS_PER_BATCH = 3
    response = post(client, {"records": [records.message(index=i) for i in range(4)]}, auth)
    assert response.status_code == 413
    assert stored_rows() == 0


def test_it_refuses_a_body_over_the_limit_before_reading_it(client, auth, settings):
    settings.OBSERVATORY_MAX_BODY_BYTES = 1024
    response = post(client, None, auth, raw=b'{"records": []}' + b" " * 2000)
    assert response.status_code == 413


def test_it_refuses_a_gzip_bomb(client, auth, settings):
    settings.OBSERVATORY_MAX_DECODED_BYTES = 10_000
    raw = gzip.compress(b'{"records": [' + b" " * 1_000_000 + b"]}")
    response = post(client, None, auth, raw=raw, HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 413


def test_it_refuses_corrupt_gzip_and_unknown_encodings(client, auth):
    assert post(client, None, auth, raw=b"not gzip", HTTP_CONTENT_ENCODING="gzip").status_code == 400
    assert post(client, None, auth, raw=b"{}", HTTP_CONTENT_ENCODING="br").status_code == 415


@pytest.mark.parametrize(
    "header, message",
    [(None, "missing API key"), ("Bearer nope", "invalid API key"), ("Basic abc", "missing API key"),
     ("Bearer po_0123456789abcdef_" + "x" * 43, "invalid API key")],
)
def test_it_refuses_missing_and_wrong_keys(client, records, header, message, db):
    auth = {"HTTP_AUTHORIZATION": header} if header else {}
    response = post(client, {"records": [records.message()]}, auth)
    assert response.status_code == 401
    assert response.json() == {"error": message}
    assert stored_rows() == 0


def test_it_refuses_a_revoked_key(client, project, records):
    from dashboard.accounts.services import apikey_create

    key, text = apikey_create(project=project)
    apikey_revoke(key=key)
    response = post(client, {"records": [records.message()]}, {"HTTP_AUTHORIZATION": f"Bearer {text}"})
    assert (response.status_code, response.json()) == (401, {"error": "revoked API key"})


def test_it_answers_429_when_the_gate_is_full(client, auth, records, settings):
    from dashboard.ingest import common

    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 1
    with common.ingest_gate():
        response = post(client, {"records": [records.message()]}, auth)
    assert response.status_code == 429 and response["Retry-After"] == "1"
    assert stored_rows() == 0


def test_it_answers_503_and_stores_nothing_when_the_database_is_locked(client, auth, records, monkeypatch):
    from django.db import OperationalError

    from dashboard.observatory import rows, services

    real_insert, calls = rows.insert_ignoring_conflicts, []

    def locked_on_second_table(model, rows):
        calls.append(model)
        if len(calls) == 2:  # the first table's rows are already in: they must roll back
            raise OperationalError("database is locked")
        return real_insert(model, rows)

    monkeypatch.setattr(services, "insert_ignoring_conflicts", locked_on_second_table)
    response = post(client, {"records": [records.round(), records.message()]}, auth)
    assert response.status_code == 503 and response["Retry-After"]
    assert stored_rows() == 0 and Conversation.objects.count() == 0


def test_it_stores_a_large_batch_with_a_fixed_number_of_queries(auth, records, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboard.observatory import services

    batch = []
    for c in range(20):
        batch += [records.round(conversation=f"c{c}"), records.message(conversation=f"c{c}"),
                  records.tool_result(conversation=f"c{c}"), records.compression(conversation=f"c{c}"),
                  records.skill(conversation=f"c{c}")]
    # The store itself (without the after-commit derivations) stays at a fixed count.
    with CaptureQueriesContext(connection) as small:
        services.records_store(project=_project(auth), records=_parsed(batch[:5]))
    with django_assert_max_num_queries(len(small.captured_queries) + 2):
        services.records_store(project=_project(auth), records=_parsed(batch[5:]))


def test_it_keeps_the_request_query_count_flat_as_batches_grow(client, auth, records,
                                                                django_capture_on_commit_callbacks):
    """Everything but the multi-row INSERTs (which SQLite splits by its parameter
    limit) is the same for 10 records as for 200: nothing runs per record."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries_for(n: int) -> tuple[int, int]:
        batch = [records.tool_result(conversation=f"q{n}-{i % 5}") for i in range(n)]
        with CaptureQueriesContext(connection) as captured, django_capture_on_commit_callbacks(execute=True):
            assert post(client, {"records": batch}, auth).status_code == 200
        inserts = sum(1 for q in captured.captured_queries if q["sql"].startswith("INSERT"))
        return len(captured.captured_queries) - inserts, inserts

    queries_for(1)  # the key's first use writes last_used_at (once a minute)
    (others_10, _), (others_200, inserts_200) = queries_for(10), queries_for(200)
    assert others_200 == others_10
    assert inserts_200 <= 200 // 20 + 2


def test_it_publishes_the_pipeline_record_schemas_in_openapi(client):
    schema = client.get("/api/openapi.json").json()
    body = schema["paths"]["/api/v1/records"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    refs = json.dumps(body["properties"]["records"]["items"])
    for name in ("ToolResultRecord", "MessageRecord", "RoundRecord", "CompressionRecord", "SkillActivationRecord"):
        assert f"#/components/schemas/{name}" in refs
        assert name in schema["components"]["schemas"]


def _project(auth):
    from dashboard.accounts.keys import key_prefix
    from dashboard.accounts.models import ApiKey

    return ApiKey.objects.get(prefix=key_prefix(auth["HTTP_AUTHORIZATION"].split()[1])).project


def _parsed(batch):
    from pipeline import parse_record

    return [parse_record(item) for item in batch]


def test_it_rejects_a_record_id_that_is_not_a_uuid(client, auth, records):
    bad = {**records.message(), "record_id": "not-a-uuid"}
    response = post(client, {"records": [bad]}, auth)
    assert response.json()["accepted"] == 0
    assert response.json()["rejected"][0]["index"] == 0


def test_it_rejects_numbers_no_column_can_hold_instead_of_failing_the_batch(client, auth, records):
    # Found by fuzzing the OpenAPI document: a huge integer reached the INSERT (a 500).
    huge_index = records.round(index=3_787_634_877_088_000_000_000)
    huge_tokens = records.message(tokens=2**40)
    endless = records.tool_result(result={"duration_ms": 12345.5})
    raw = json.dumps({"records": [records.message(), huge_index, huge_tokens, endless]})
    raw = raw.replace("12345.5", "1e309")  # a number literal Python's json parses as infinity
    response = post(client, None, auth, raw=raw.encode())
    assert response.status_code == 200
    body = response.json()
    assert body["accepted"] == 1
    assert [r["index"] for r in body["rejected"]] == [1, 2, 3]
    assert stored_rows() == 1


@pytest.mark.parametrize("moment", [
    "9999-12-31T23:59:59-01:00",  # past year 9999 once shifted to UTC (was a 500)
    "0001-01-01T00:00:00+01:00",  # before year 1 in UTC (PostgreSQL stored it as 1 BC)
    "1969-12-31T23:59:59+00:00",
    "2200-01-01T00:00:00+00:00",
])
def test_it_rejects_times_outside_the_sane_range_per_item(client, auth, records, moment):
    batch = [records.message(index=0), records.tool_result(at=None), records.message(index=1)]
    batch[1]["occurred_at"] = moment
    response = post(client, {"records": batch}, auth)
    assert response.status_code == 200
    body = response.json()
    assert body["accepted"] == 2
    assert [r["index"] for r in body["rejected"]] == [1]
    assert "occurred_at is outside 1970..2199" in body["rejected"][0]["error"]
    assert stored_rows() == 2


def test_it_rejects_a_round_whose_start_or_end_is_out_of_range(client, auth, records):
    late = records.round(index=0, started_at="2024-01-01T00:00:00+00:00", ended_at="9999-12-31T23:59:59-01:00")
    response = post(client, {"records": [late, records.round(index=1)]}, auth)
    assert response.json()["accepted"] == 1
    assert "ended_at is outside" in response.json()["rejected"][0]["error"]


def test_it_takes_the_sane_range_from_settings(client, auth, records, settings):
    settings.OBSERVATORY_TIMESTAMP_MIN_YEAR = 2000
    old = records.message()
    old["occurred_at"] = "1999-06-01T00:00:00+00:00"
    assert post(client, {"records": [old]}, auth).json()["accepted"] == 0


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "application/xml", ""])
def test_it_refuses_other_content_types(client, auth, records, content_type):
    body = json.dumps({"records": [records.message()]}).encode()
    response = client.generic("POST", URL, body, content_type=content_type, **auth)
    assert response.status_code == 415
    assert "application/json" in response.json()["error"]
    assert stored_rows() == 0


def test_it_accepts_json_with_a_charset(client, auth, records):
    body = json.dumps({"records": [records.message()]}).encode()
    response = client.generic("POST", URL, body, content_type="application/json; charset=utf-8", **auth)
    assert response.status_code == 200 and response.json()["accepted"] == 1


# --- a busy database and a broken one, for real ------------------------------------

@pytest.mark.django_db(transaction=True)
def test_it_answers_503_with_retry_after_when_the_database_is_really_busy(client, auth, records, project,
                                                                             monkeypatch, caplog):
    batch = [records.round(), records.message()]
    with busy_database(monkeypatch, "observatory_round", "observatory_message"):
        response = post(client, {"records": batch}, auth)
    assert (response.status_code, response["Retry-After"]) == (503, "2")
    assert response.json() == {"error": "database busy, retry later"}
    assert stored_rows() == 0 and Conversation.objects.count() == 0
    assert not broken_reports(caplog) and faults(IngestTransport.RECORDS, project) == 0


@pytest.mark.django_db(transaction=True)
def test_it_answers_500_naming_nothing_when_the_database_is_broken_and_logs_and_counts_it_once(
        client, auth, records, project, caplog):
    """The message table gone: a 500 the exporter does not retry forever; the
    conversation and the round stored before it in the transaction roll back."""
    batch = [records.round(), records.tool_result(), records.message()]
    with broken_table("observatory_message"):
        response = post(client, {"records": batch}, auth)
    assert response.status_code == 500 and "Retry-After" not in response
    assert names_nothing_internal(response.content.decode())
    assert stored_rows() == 0 and Conversation.objects.count() == 0
    (report,) = broken_reports(caplog)
    assert f"project {project.pk}" in report.getMessage() and "3 records" in report.getMessage()
    assert faults(IngestTransport.RECORDS, project) == 1


@pytest.mark.django_db(transaction=True)
def test_it_answers_500_when_the_key_cannot_be_read_from_a_broken_database(client, auth, records, caplog):
    """Before the view (the key's read, in the API's authentication): the same answer,
    counted without a project."""
    with broken_table("accounts_apikey"):
        response = post(client, {"records": [records.message()]}, auth)
    assert response.status_code == 500 and names_nothing_internal(response.content.decode())
    (report,) = broken_reports(caplog)
    assert "project unknown" in report.getMessage()
    assert faults(IngestTransport.RECORDS) == 1
