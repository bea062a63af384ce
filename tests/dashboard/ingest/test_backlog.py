"""Ingest slowed to what the derivations keep up with (common.derivations_keep_up):
429 with Retry-After while a drainer is at work and the oldest note due has waited
past OBSERVATORY_DERIVE_BACKLOG_SECONDS; nothing of a refused batch is stored."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.ingest import common
from dashboard.observatory.derive import drain
from dashboard.observatory.models import DerivationNote, Span, ToolExecution

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_reads(monkeypatch, settings):
    settings.OBSERVATORY_DERIVE_BACKLOG_SECONDS = 10
    monkeypatch.setattr(common, "BACKLOG_READ_EVERY", 0.0)  # each request reads the backlog


def backlog(project, *, waited: float, drainer_at_work: bool = True) -> DerivationNote:
    now = timezone.now()
    waiting = DerivationNote.objects.create(project=project, conversation_ids=[1],
                                            available_at=now - timedelta(seconds=waited))
    if drainer_at_work:
        DerivationNote.objects.create(project=project, conversation_ids=[2], claimed_until=now + drain.LEASE)
    return waiting


def post_records(client, auth, batch):
    return client.post("/api/v1/records", json.dumps({"records": batch}), content_type="application/json", **auth)


def post_spans(client, auth):
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "ab" * 16, "spanId": "cd" * 8, "name": "step", "kind": 1,
        "startTimeUnixNano": "1764000000000000000", "endTimeUnixNano": "1764000000250000000"}]}]}]}
    return client.post("/v1/traces", json.dumps(body), content_type="application/json", **auth)


def test_it_refuses_records_with_retry_after_while_the_derivations_are_behind(client, auth, records, project):
    backlog(project, waited=30)
    response = post_records(client, auth, [records.tool_result()])
    assert response.status_code == 429
    assert response["Retry-After"] == str(common.BACKLOG_RETRY_AFTER)
    assert "behind" in response.content.decode()
    assert not ToolExecution.objects.exists()


def test_it_refuses_otlp_spans_while_the_derivations_are_behind(client, auth, project):
    backlog(project, waited=30)
    response = post_spans(client, auth)
    assert response.status_code == 429 and response["Retry-After"]
    assert not Span.objects.exists()


def test_it_takes_batches_again_once_the_derivations_caught_up(client, auth, records, project):
    waiting = backlog(project, waited=30)
    assert post_records(client, auth, [records.tool_result()]).status_code == 429
    waiting.delete()  # derived
    assert post_records(client, auth, [records.tool_result()]).status_code == 200


def test_it_takes_batches_within_the_bound(client, auth, records, project):
    backlog(project, waited=5)
    assert post_records(client, auth, [records.tool_result()]).status_code == 200


def test_it_takes_batches_when_no_drainer_is_at_work(client, auth, records, project):
    """Nothing derives (no runner, the Celery workers down): refusing ingest would
    not bring the derivations closer, only make the agents drop what they hold."""
    backlog(project, waited=600, drainer_at_work=False)
    assert post_records(client, auth, [records.tool_result()]).status_code == 200


def test_it_never_refuses_when_turned_off(client, auth, records, project, settings):
    settings.OBSERVATORY_DERIVE_BACKLOG_SECONDS = 0
    backlog(project, waited=600)
    assert post_records(client, auth, [records.tool_result()]).status_code == 200


def test_an_unknown_key_gets_401_not_the_backlog(client, records, project):
    backlog(project, waited=30)
    response = post_records(client, {"HTTP_AUTHORIZATION": "Bearer po_nope"}, [records.tool_result()])
    assert response.status_code == 401
    response = post_spans(client, {"HTTP_AUTHORIZATION": "Bearer po_nope"})
    assert response.status_code == 401


def test_each_process_reads_the_backlog_at_most_once_a_second(project, monkeypatch, django_assert_num_queries):
    monkeypatch.setattr(common, "BACKLOG_READ_EVERY", 60.0)
    monkeypatch.setattr(common, "_backlog_read", (float("-inf"), 0.0))
    backlog(project, waited=30)
    with pytest.raises(common.IngestError):
        common.derivations_keep_up()
    with django_assert_num_queries(0), pytest.raises(common.IngestError):
        common.derivations_keep_up()  # what was read a moment ago
