"""The in-process derivation runner used when no broker is configured."""

from __future__ import annotations

import json
import time

import pytest

from dashboard.observatory.derive import runner
from dashboard.observatory.models import Conversation, ToolHourlyRollup

pytestmark = pytest.mark.django_db(transaction=True)  # the runner's thread has its own connection


@pytest.fixture
def background(settings):
    """Ingest as the embedded default does outside tests: no broker, not inline."""
    settings.OBSERVATORY_DERIVE_INLINE = False
    settings.OBSERVATORY_DERIVE_DELAY_MS = 50
    runner._runner = None
    yield
    if runner._runner is not None:
        runner._runner.stop()
    runner._runner = None


def post(client, auth, batch):
    """Send like an exporter: retry while the server answers 503 (here the runner's thread
    can hold the test database's table lock for a moment), then require success."""
    for _ in range(50):
        response = client.post("/api/v1/records", json.dumps({"records": batch}), content_type="application/json", **auth)
        if response.status_code != 503:
            break
        time.sleep(0.05)
    assert response.status_code == 200, response.content
    return response


def test_it_answers_before_deriving_and_derives_after_a_flush(client, auth, records, background):
    response = post(client, auth, [records.round(), records.message(), records.tool_result(), records.tool_result(success=False)])
    assert response.status_code == 200
    assert runner.runner().flush(timeout=20)
    conversation = Conversation.objects.get()
    assert (conversation.rounds, conversation.messages, conversation.tool_calls, conversation.errors) == (1, 1, 2, 1)
    rollup = ToolHourlyRollup.objects.get()
    assert (rollup.calls, rollup.errors) == (2, 1)


def test_it_merges_a_burst_of_batches_into_the_same_rows_as_inline(client, auth, records, background, settings):
    for i in range(20):
        post(client, auth, [records.tool_result(conversation=f"c{i % 3}"), records.message(conversation=f"c{i % 3}", index=i)])
    assert runner.runner().flush(timeout=20)
    background_rows = sorted(Conversation.objects.values_list("external_id", "tool_calls", "messages"))
    background_rollup = list(ToolHourlyRollup.objects.values_list("tool_name", "calls"))

    from dashboard.observatory import tasks

    tasks.conversation_totals_refresh(list(Conversation.objects.values_list("pk", flat=True)))
    assert sorted(Conversation.objects.values_list("external_id", "tool_calls", "messages")) == background_rows
    assert background_rows == [("c0", 7, 7), ("c1", 7, 7), ("c2", 6, 6)]
    assert background_rollup == [("query_sales", 20)]


def test_it_keeps_running_after_a_failing_pass(client, auth, records, background, monkeypatch):
    from dashboard.observatory.derive.passes import totals

    calls = {"n": 0}
    real = totals.conversation_totals_refresh

    def flaky(*, conversation_ids, minutes=None, scope=None):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("database went away")
        return real(conversation_ids=conversation_ids, minutes=minutes)

    monkeypatch.setattr(totals, "conversation_totals_refresh", flaky)
    post(client, auth, [records.message()])
    assert runner.runner().flush(timeout=20)
    assert Conversation.objects.get().messages == 1  # the failed pass was put back and run again
    post(client, auth, [records.message(index=1)])
    assert runner.runner().flush(timeout=20)
    assert Conversation.objects.get().messages == 2


def test_it_parks_work_that_keeps_failing_with_its_error(client, auth, records, background, monkeypatch, settings):
    from dashboard.observatory.derive.passes import totals
    from dashboard.observatory.derive import drain, notes
    from dashboard.observatory.models import DerivationNote

    settings.OBSERVATORY_DERIVE_RETRY_SECONDS = 0
    calls = {"n": 0}

    def broken(*, conversation_ids, minutes=None, scope=None):
        calls["n"] += 1
        raise RuntimeError("a bug, not a passing fault")

    monkeypatch.setattr(totals, "conversation_totals_refresh", broken)
    post(client, auth, [records.message()])
    assert runner.runner().flush(timeout=20)
    note = DerivationNote.objects.get()
    assert note.parked and note.attempts == drain.MAX_ATTEMPTS
    assert "a bug, not a passing fault" in note.last_error
    assert calls["n"] == 2 * drain.MAX_ATTEMPTS  # each pass: merged, then alone
    monkeypatch.undo()
    notes.notes_retry(ids=[note.pk])  # the admin's "retry now", once the bug is fixed
    assert runner.runner().flush(timeout=20)
    assert not DerivationNote.objects.exists()
    assert Conversation.objects.get().messages == 1


def test_it_links_an_uploaded_artifact_on_the_background_thread(client, auth, records, background):
    import hashlib

    from dashboard.observatory.models import Artifact, ToolExecution

    data = b'{"rows": 3}'
    artifact_id = "artifact_" + hashlib.sha256(data).hexdigest()
    post(client, auth, [records.tool_result(result={"artifact_id": artifact_id, "data_size_bytes": len(data)})])
    upload = client.generic("PUT", f"/api/v1/artifacts/{artifact_id}", data, content_type="application/json",
                            HTTP_X_CONTENT_SHA256=hashlib.sha256(data).hexdigest(), **auth)
    assert upload.status_code == 201
    assert runner.runner().flush(timeout=20)
    artifact = Artifact.objects.get()
    assert artifact.tool_execution == ToolExecution.objects.get()
    assert artifact.conversation.external_id == "conv-1"


@pytest.fixture
def sqlite_wal(db):
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("SQLite's write-ahead log")
    return f"{connection.settings_dict['NAME']}-wal"


def test_it_truncates_the_sqlite_write_ahead_log_once_it_passes_the_limit(project, sqlite_wal):
    import os

    Conversation.objects.bulk_create(Conversation(project=project, external_id=f"c{i}", title="x" * 500)
                                     for i in range(200))
    size = os.path.getsize(sqlite_wal)
    assert size > 0
    assert runner.sqlite_wal_truncate(size + 1) is None  # under the limit: nothing to do
    assert runner.sqlite_wal_truncate(1) is True
    assert os.path.getsize(sqlite_wal) == 0
    assert Conversation.objects.count() == 200  # everything is in the database file


def test_it_leaves_the_log_for_the_next_pass_when_a_reader_keeps_it_busy(project, sqlite_wal, monkeypatch):
    import os
    import sqlite3

    from django.db import connection

    monkeypatch.setattr(runner, "WAL_BUSY_MS", 50)
    Conversation.objects.create(project=project, external_id="before")
    reader = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM observatory_conversation").fetchone()  # holds this snapshot
        Conversation.objects.create(project=project, external_id="after")
        started = time.monotonic()
        assert runner.sqlite_wal_truncate(1) is False
        assert time.monotonic() - started < 2
        assert os.path.getsize(sqlite_wal) > 0
    finally:
        reader.close()
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        assert cursor.fetchone()[0] == 5000  # the connection's own timeout is back
    assert runner.sqlite_wal_truncate(1) is True


def test_stopping_ends_the_thread_after_the_pass_under_way(background, monkeypatch):
    """A worker being replaced stops its runner: the pass under way finishes, no other
    starts (before, it drained on for up to 100 passes and was cut off mid-pass, its
    notes left claimed until their lease ended: 30 s of lag)."""
    import threading

    from dashboard.observatory.derive import drain

    passes: list[float] = []
    started = threading.Event()

    def slow_pass(**kwargs):
        passes.append(time.monotonic())
        started.set()
        time.sleep(0.3)
        return drain.DrainOutcome(notes=1)  # always more to do: the drain would go on

    monkeypatch.setattr(drain, "outbox_drain", slow_pass)
    drainer = runner.runner()
    drainer.wake()
    assert started.wait(5)
    stopping = time.monotonic()
    drainer.stop(timeout=5)
    assert time.monotonic() - stopping < 1.0
    assert not drainer._thread.is_alive()
    assert len(passes) <= 2


def test_the_hourly_and_daily_jobs_run_once_for_all_the_processes(settings, tmp_path):
    """The time of the last run is a file in DATA_DIR, shared by the web workers: a worker
    that starts (or replaces one) no longer reruns the hourly pass at once."""
    import os

    settings.DATA_DIR = tmp_path
    assert runner._once_per("derive-hourly", 3600) is True
    assert runner._once_per("derive-hourly", 3600) is False  # another worker, a moment later
    assert runner._once_per("derive-daily", 86400) is True  # each job its own time
    marker = tmp_path / "derive-hourly"
    an_hour_ago = time.time() - 3601
    os.utime(marker, (an_hour_ago, an_hour_ago))
    assert runner._once_per("derive-hourly", 3600) is True


def test_the_jobs_still_run_when_their_time_cannot_be_marked(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "missing"  # the marker cannot be written there
    assert runner._once_per("derive-hourly", 3600) is True
    assert runner._once_per("derive-hourly", 3600) is True  # unmarked: each process runs it, as before
