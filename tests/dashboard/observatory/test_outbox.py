"""The derivation outbox (dashboard.observatory.outbox): notes committed with the rows,
drained idempotently, claimed under a lease, failures contained per conversation."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from dashboard.observatory.busy import database_busy
from dashboard.observatory.derive import drain
from dashboard.observatory.derive.passes import totals
from dashboard.observatory.models import Conversation, DerivationNote, ToolHourlyRollup, ToolMinuteRollup
from dashboard.observatory.derive.notes import derivations_enqueue

pytestmark = pytest.mark.django_db


def post(client, auth, batch):
    response = client.post("/api/v1/records", json.dumps({"records": batch}), content_type="application/json", **auth)
    assert response.status_code == 200, response.content


@pytest.fixture
def crash_after_commit(settings, monkeypatch):
    """The process dies right after the ingest commit: the drainer is never told."""
    from dashboard.observatory.derive import notes

    monkeypatch.setattr(notes, "_wakers", [])  # no drainer woken


def test_it_commits_the_note_with_the_rows_and_derives_it_later(client, auth, records, crash_after_commit):
    post(client, auth, [records.tool_result(conversation="a"), records.message(conversation="a")])
    conversation = Conversation.objects.get()
    assert conversation.tool_calls == 0  # nothing derived: the process "died"
    assert DerivationNote.objects.count() == 1
    outcome = drain.outbox_drain_all()  # a drainer after the restart
    assert outcome.notes == 1
    conversation.refresh_from_db()
    assert (conversation.tool_calls, conversation.messages) == (1, 1)
    assert ToolHourlyRollup.objects.get().calls == 1
    assert not DerivationNote.objects.exists()


def test_it_writes_no_note_when_the_rows_roll_back(project):
    with pytest.raises(RuntimeError), transaction.atomic():
        derivations_enqueue(project_id=project.pk, conversation_ids=[1])
        raise RuntimeError("the batch failed")
    assert not DerivationNote.objects.exists()


def test_it_writes_nothing_for_nothing(project):
    derivations_enqueue(project_id=project.pk)
    assert not DerivationNote.objects.exists()


def test_it_gives_the_same_rows_when_a_note_is_drained_twice(client, auth, records, crash_after_commit):
    post(client, auth, [records.tool_result(conversation="a"), records.tool_result(conversation="a", success=False)])
    note = DerivationNote.objects.get()
    copy = DerivationNote.objects.create(project_id=note.project_id, conversation_ids=note.conversation_ids,
                                         hours=note.hours)
    drain.outbox_drain_all()
    first = list(Conversation.objects.values_list("tool_calls", "errors"))
    DerivationNote.objects.create(project_id=copy.project_id, conversation_ids=copy.conversation_ids, hours=copy.hours)
    drain.outbox_drain_all()
    assert list(Conversation.objects.values_list("tool_calls", "errors")) == first == [(2, 1)]
    assert ToolHourlyRollup.objects.get().calls == 2


def test_it_leaves_a_leased_note_to_its_drainer_until_the_lease_ends(client, auth, records, crash_after_commit):
    post(client, auth, [records.message()])
    claimed = drain.notes_claim()  # a drainer that is then killed mid-pass
    assert len(claimed) == 1 and claimed[0].attempts == 1
    assert drain.notes_claim() == []  # leased: no second drainer takes it
    DerivationNote.objects.update(claimed_until=timezone.now() - timedelta(seconds=1))  # the lease ran out
    assert drain.outbox_drain_all().notes == 1
    assert Conversation.objects.get().messages == 1


def test_it_isolates_a_failing_conversation_from_the_others(client, auth, records, crash_after_commit, monkeypatch,
                                                            settings):
    settings.OBSERVATORY_DERIVE_RETRY_SECONDS = 0
    post(client, auth, [records.message(conversation="good"), records.message(conversation="poison"),
                        records.message(conversation="also-good")])
    poison = Conversation.objects.get(external_id="poison").pk
    real = totals.conversation_totals_refresh

    def fails_on_poison(*, conversation_ids, minutes=None, scope=None):
        if poison in conversation_ids:
            raise ValueError("year 1 BC")
        return real(conversation_ids=conversation_ids, minutes=minutes)

    monkeypatch.setattr(totals, "conversation_totals_refresh", fails_on_poison)
    drain.outbox_drain_all()
    figures = dict(Conversation.objects.values_list("external_id", "messages"))
    assert figures == {"good": 1, "also-good": 1, "poison": 0}
    parked = DerivationNote.objects.get()
    assert parked.conversation_ids == [poison] and parked.parked
    assert "year 1 BC" in parked.last_error


def test_it_waits_before_retrying_a_failed_note(client, auth, records, crash_after_commit, monkeypatch, settings):
    settings.OBSERVATORY_DERIVE_RETRY_SECONDS = 60
    post(client, auth, [records.message()])
    monkeypatch.setattr(totals, "conversation_totals_refresh", lambda **kwargs: 1 / 0)
    outcome = drain.outbox_drain_all()
    assert outcome.failed == 1 and outcome.parked == 0
    note = DerivationNote.objects.get()
    assert note.available_at > timezone.now() + timedelta(seconds=50)
    assert drain.outbox_drain_all().failed == 0  # not ready yet: not tried again


def test_it_drains_the_notes_of_every_project_apart(client, auth, other_auth, records, crash_after_commit):
    post(client, auth, [records.message(conversation="mine")])
    post(client, other_auth, [records.message(conversation="theirs")])
    assert drain.outbox_drain_all().notes == 2
    assert sorted(Conversation.objects.values_list("project__name", "external_id", "messages")) == sorted(
        (c.project.name, c.external_id, 1) for c in Conversation.objects.select_related("project"))


def test_it_never_parks_a_note_for_a_busy_database(client, auth, records, crash_after_commit, monkeypatch, settings):
    """"database is locked" under many senders is the database's state, not the note's
    fault: retried as often as it takes, the note is derived once the lock clears."""
    from django.db import OperationalError

    settings.OBSERVATORY_DERIVE_RETRY_SECONDS = 0
    post(client, auth, [records.message(conversation="a"), records.message(conversation="b")])
    real = totals.conversation_totals_refresh
    busy = {"left": drain.MAX_ATTEMPTS * 3}

    def locked_for_a_while(*, conversation_ids, minutes=None, scope=None):
        if busy["left"]:
            busy["left"] -= 1
            raise OperationalError("database is locked")
        return real(conversation_ids=conversation_ids, minutes=minutes)

    monkeypatch.setattr(totals, "conversation_totals_refresh", locked_for_a_while)
    for _ in range(drain.MAX_ATTEMPTS * 3):
        drain.outbox_drain_all()
        assert not DerivationNote.objects.filter(parked=True).exists()
    drain.outbox_drain_all()
    assert not busy["left"] and not DerivationNote.objects.exists()
    assert sorted(Conversation.objects.values_list("external_id", "messages")) == [("a", 1), ("b", 1)]


def _wrapped(cause: Exception):
    """The OperationalError Django raises for ``cause`` (its driver's error)."""
    from django.db import OperationalError

    try:
        raise OperationalError(str(cause)) from cause
    except OperationalError as exc:
        return exc


def test_a_real_sqlite_lock_is_busy_and_a_real_sqlite_error_is_not(tmp_path):
    import sqlite3

    holder = sqlite3.connect(tmp_path / "db.sqlite3", isolation_level=None)
    waiter = sqlite3.connect(tmp_path / "db.sqlite3", isolation_level=None, timeout=0)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError) as locked:
        waiter.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError) as wrong:
        waiter.execute("SELECT no_such_function()")
    holder.close(), waiter.close()
    assert database_busy(_wrapped(locked.value))
    assert not database_busy(_wrapped(wrong.value))


@pytest.mark.parametrize("sqlstate, busy", [
    ("40P01", True), ("40001", True), ("55P03", True), ("08006", True), ("57P01", True),
    ("57014", False), ("54000", False), ("22P02", False),
])
def test_a_postgresql_error_is_busy_by_its_sqlstate(sqlstate, busy):
    import psycopg.errors

    assert database_busy(_wrapped(psycopg.errors.lookup(sqlstate)("from the server"))) is busy


def test_a_lost_postgresql_connection_is_busy_and_other_errors_are_not():
    import psycopg

    assert database_busy(_wrapped(psycopg.OperationalError("server closed the connection unexpectedly")))
    assert not database_busy(ValueError("database is locked"))


def test_a_note_failing_the_same_way_every_time_is_parked_not_retried_forever(
        client, auth, records, crash_after_commit, monkeypatch, settings):
    """An OperationalError that is not the database being busy ("no such function",
    too many SQL variables, a statement always past its timeout) counts as a failure:
    split, backed off, parked with its error. Retried as busy, uncounted, such a note
    waited forever and nothing after it was reported as converged."""
    import sqlite3

    settings.OBSERVATORY_DERIVE_RETRY_SECONDS = 0
    post(client, auth, [records.message(conversation="a"), records.message(conversation="b")])
    real = totals.conversation_totals_refresh

    def broken_for_a(*, conversation_ids, minutes=None, scope=None):
        if Conversation.objects.filter(pk__in=conversation_ids, external_id="a").exists():
            try:
                sqlite3.connect(":memory:").execute("SELECT no_such_function()")
            except sqlite3.OperationalError as exc:
                raise _wrapped(exc) from exc
        return real(conversation_ids=conversation_ids, minutes=minutes)

    monkeypatch.setattr(totals, "conversation_totals_refresh", broken_for_a)
    for _ in range(drain.MAX_ATTEMPTS + 2):
        drain.outbox_drain_all()
    parked = DerivationNote.objects.get()
    assert parked.parked and "no such function" in parked.last_error
    assert parked.conversation_ids == [Conversation.objects.get(external_id="a").pk]
    assert Conversation.objects.get(external_id="b").messages == 1


def test_a_busy_merged_pass_is_retried_merged_not_note_by_note(client, auth, records, crash_after_commit, monkeypatch):
    """"database is locked" on a pass of many notes delays them all, uncounted, for one
    merged pass later: deriving them one by one had each recompute its hour (6,000
    notes that never drained in a soak)."""
    from django.db import OperationalError

    post(client, auth, [records.message(conversation="a")])
    post(client, auth, [records.message(conversation="b")])
    calls: list[list[int]] = []

    def locked(*, conversation_ids, minutes=None, scope=None):
        calls.append(list(conversation_ids))
        raise OperationalError("database is locked")

    monkeypatch.setattr(totals, "conversation_totals_refresh", locked)
    outcome = drain.outbox_drain()
    assert (outcome.failed, outcome.notes, len(calls)) == (2, 0, 1)  # one merged try, none alone
    notes = list(DerivationNote.objects.values_list("attempts", "claimed_until", "last_error"))
    assert notes == [(0, None, "OperationalError: database is locked")] * 2


def derived_with_a_span(client, auth, records, call: str) -> None:
    """Conversation "a" with one tool call, derived, in a project with a span (the
    link step runs only when there are spans)."""
    from dashboard.observatory.models import Span

    post(client, auth, [records.tool_result(conversation="a", result={"tool_call_id": call})])
    now = timezone.now()
    Span.objects.create(project_id=Conversation.objects.get().project_id, trace_id="f" * 32, span_id="f" * 16,
                        start_time=now, end_time=now)
    drain.outbox_drain_all()


def executions_linked(monkeypatch) -> list[int]:
    """The ids of the tool executions the link passes read from now on."""
    from dashboard.observatory.derive.passes import links

    read: list[int] = []
    real = links._executions_link

    def recording(project_id, in_scope, counts):
        read.extend(row[0] for row in in_scope)
        return real(project_id, in_scope, counts)

    monkeypatch.setattr(links, "_executions_link", recording)
    return read


def test_it_links_the_rows_received_since_its_oldest_note_not_the_conversations_history(
        client, auth, records, crash_after_commit, monkeypatch):
    """A pass reads what its batches brought: an old row of the same conversation is
    not read again (a conversation of the soak grew by thousands a minute)."""
    from dashboard.observatory.models import ToolExecution

    derived_with_a_span(client, auth, records, "call_old")
    ToolExecution.objects.update(received_at=timezone.now() - drain.ROWS_BEFORE_NOTE - timedelta(minutes=5))
    post(client, auth, [records.tool_result(conversation="a", result={"tool_call_id": "call_new"})])
    read = executions_linked(monkeypatch)
    drain.outbox_drain_all()
    assert read == [ToolExecution.objects.get(tool_call_id="call_new").pk]
    assert Conversation.objects.get().tool_calls == 2  # the totals still count every row


def test_it_keeps_the_time_of_a_split_note_so_its_rows_stay_in_scope(
        client, auth, records, crash_after_commit, monkeypatch, settings):
    settings.OBSERVATORY_DERIVE_RETRY_SECONDS = 0
    post(client, auth, [records.message(conversation="a"), records.message(conversation="b")])
    written = DerivationNote.objects.get().created_at
    monkeypatch.setattr(totals, "conversation_totals_refresh", lambda **kwargs: 1 / 0)
    rows_from = DerivationNote.objects.get().rows_from
    drain.outbox_drain()  # the merged pass fails: the note is split, one per conversation
    assert sorted(DerivationNote.objects.values_list("created_at", flat=True)) == [written, written]
    assert list(DerivationNote.objects.values_list("rows_from", flat=True)) == [rows_from, rows_from]


def test_a_note_holds_when_its_batchs_rows_were_received(client, auth, records, crash_after_commit):
    post(client, auth, [records.tool_result(conversation="a"), records.message(conversation="a")])
    from dashboard.observatory.models import Message, ToolExecution

    note = DerivationNote.objects.get()
    received = [*ToolExecution.objects.values_list("received_at", flat=True),
                *Message.objects.values_list("received_at", flat=True)]
    assert note.rows_from <= min(received) and max(received) <= note.created_at


def test_a_pass_reads_the_rows_of_its_own_batches_not_those_before_or_after(
        client, auth, records, crash_after_commit, monkeypatch):
    """The window is exact at both ends: no row of a later note's batch (behind a
    backlog, every row up to now was read again by each pass), and none received
    before its batch (each pass read the 60 s before its notes again)."""
    from dashboard.observatory.models import ToolExecution

    derived_with_a_span(client, auth, records, "call_before")
    ToolExecution.objects.update(received_at=timezone.now() - timedelta(seconds=10))  # within the old margin
    post(client, auth, [records.tool_result(conversation="a", result={"tool_call_id": "call_1"})])
    (first,) = DerivationNote.objects.all()
    earlier = timedelta(seconds=5)  # the first batch came 5 s before the second
    ToolExecution.objects.filter(tool_call_id="call_1").update(received_at=F("received_at") - earlier)
    DerivationNote.objects.update(created_at=F("created_at") - earlier, rows_from=F("rows_from") - earlier)
    first.refresh_from_db()
    post(client, auth, [records.tool_result(conversation="a", result={"tool_call_id": "call_2"})])
    read = executions_linked(monkeypatch)
    drain.passes_run(drain._merged([first]))  # the first note's pass alone
    assert read == [ToolExecution.objects.get(tool_call_id="call_1").pk]
    first.delete()
    read.clear()
    drain.outbox_drain_all()  # the second note's pass
    assert read == [ToolExecution.objects.get(tool_call_id="call_2").pk]
    assert Conversation.objects.get().tool_calls == 3


def test_the_window_of_notes_without_rows_from_keeps_the_margin_and_ignores_hour_notes(project):
    now = timezone.now()
    batch = DerivationNote(project=project, conversation_ids=[1], created_at=now, rows_from=now - timedelta(seconds=2))
    older = DerivationNote(project=project, conversation_ids=[2], created_at=now - timedelta(seconds=30))
    hours = DerivationNote(project=project, hours=["2026-11-26T05:00:00+00:00"], created_at=now + timedelta(hours=1))
    assert drain._rows_window([batch, hours]) == (batch.rows_from - drain.CLOCK_SLACK, now + drain.CLOCK_SLACK)
    assert drain._rows_window([batch, older])[0] == older.created_at - drain.ROWS_BEFORE_NOTE


def test_it_recomputes_a_busy_minute_at_most_once_an_interval(client, auth, records, crash_after_commit, settings):
    """Each recompute reads the whole minute: between two, the notes of that minute
    wait in one note due when the interval ends, and then the rollup counts every row."""
    settings.OBSERVATORY_ROLLUP_INTERVAL_SECONDS = 60
    post(client, auth, [records.tool_result(conversation="a")])
    drain.outbox_drain_all()
    assert ToolHourlyRollup.objects.get().calls == 1
    post(client, auth, [records.tool_result(conversation="a")])
    drain.outbox_drain_all()
    assert ToolHourlyRollup.objects.get().calls == 1  # not yet
    assert Conversation.objects.get().tool_calls == 2  # the conversation's totals do not wait
    waiting = DerivationNote.objects.get()
    began = ToolMinuteRollup.objects.get(tool_name="query_sales").updated_at
    assert waiting.minutes and not waiting.hours and waiting.available_at == began + timedelta(seconds=60)
    ToolMinuteRollup.objects.update(updated_at=began - timedelta(seconds=60))  # the interval passes
    DerivationNote.objects.update(available_at=timezone.now())
    drain.outbox_drain_all()
    assert ToolHourlyRollup.objects.get().calls == 2
    assert not DerivationNote.objects.exists()


def test_a_costly_minute_is_recomputed_at_most_once_per_four_times_its_cost(
        client, auth, records, crash_after_commit, settings, monkeypatch):
    """However full the minute, its recomputes take at most about a quarter of the drainer's time."""
    from dashboard.observatory.derive.passes import rollups

    settings.OBSERVATORY_ROLLUP_INTERVAL_SECONDS = 10
    post(client, auth, [records.tool_result(conversation="a")])
    drain.outbox_drain_all()
    slice_ = ToolMinuteRollup.objects.get(tool_name="query_sales")
    assert rollups._recompute_costs[(slice_.project_id, slice_.minute)] >= 0  # what it took, noted
    monkeypatch.setitem(rollups._recompute_costs, (slice_.project_id, slice_.minute), 30.0)  # it took 30 s
    began = slice_.updated_at - timedelta(seconds=60)  # past the interval, within 4 x 30 s
    ToolMinuteRollup.objects.update(updated_at=began)
    post(client, auth, [records.tool_result(conversation="a")])
    drain.outbox_drain_all()
    assert ToolHourlyRollup.objects.get().calls == 1  # not yet
    assert Conversation.objects.get().tool_calls == 2  # the totals do not wait
    assert DerivationNote.objects.get().available_at == began + timedelta(seconds=120)


def test_a_batchs_pass_recomputes_only_the_minutes_of_its_tool_rows(
        client, auth, records, crash_after_commit, monkeypatch):
    """Not the hour: 25 minutes into the hour-long soak, recomputing whole hours was
    75 % of the derivation's time."""
    from dashboard.observatory.derive.passes import rollups
    from dashboard.observatory.models import minute_of

    read = []
    real = rollups._minute_stats
    monkeypatch.setattr(rollups, "_minute_stats", lambda project_id, start: read.append(start) or real(
        project_id, start))
    at = records.now - timedelta(minutes=30)
    post(client, auth, [records.tool_result(conversation="a", at=at), records.message(conversation="a")])
    drain.outbox_drain_all()
    assert read == [minute_of(at)]
    assert ToolHourlyRollup.objects.get().calls == 1


@pytest.fixture
def sqlite_file(db):
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("one drainer at a time is SQLite's (PostgreSQL's passes write concurrently)")
    return connection.settings_dict["NAME"]


def test_on_sqlite_a_drainer_that_finds_another_at_work_leaves_the_notes_to_it(
        client, auth, records, crash_after_commit, sqlite_file):
    post(client, auth, [records.message(conversation="a")])
    with drain.drain_exclusive(wait=False) as mine:  # another drainer, here the test, at work
        assert mine
        assert drain.outbox_drain_all(wait=False).notes == 0
        assert DerivationNote.objects.count() == 1  # not claimed: nothing waits out a lease
    assert drain.outbox_drain_all(wait=False).notes == 1
    assert Conversation.objects.get().messages == 1


@pytest.mark.django_db(transaction=True)  # the thread has its own connection
def test_on_sqlite_a_waiting_drainer_drains_once_the_other_is_done(
        client, auth, records, crash_after_commit, sqlite_file):
    import threading

    post(client, auth, [records.message(conversation="a")])
    done: list[int] = []
    with drain.drain_exclusive():
        waiting = threading.Thread(target=lambda: done.append(_drain_in_thread()))
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and not done  # the lock is across threads too
    waiting.join(10)
    assert done == [1]


def _drain_in_thread() -> int:
    from django.db import connection

    try:
        return drain.outbox_drain_all().notes
    finally:
        connection.close()


def test_on_sqlite_a_killed_drainer_leaves_no_lock_behind(sqlite_file):
    import signal
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n",
         f"{sqlite_file}-derive.lock"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with drain.drain_exclusive(wait=False) as mine:
            assert not mine  # held by the other process
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        with drain.drain_exclusive(wait=False) as mine:
            assert mine  # the kernel let go of it with the process
    finally:
        holder.kill()
        holder.wait(10)


@pytest.fixture
def postgresql(db):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("drainers at work together are PostgreSQL's (SQLite: one at a time)")


@pytest.mark.django_db(transaction=True)  # the drainers have their own connections
def test_on_postgresql_a_drainer_keeps_its_notes_while_its_pass_outlasts_the_lease(
        client, auth, records, crash_after_commit, postgresql, monkeypatch):
    """A merged pass of 500 notes took 37 s on a busy machine (bench_cluster --drain),
    past the 30 s lease: the second worker took the same notes and derived them again,
    and 2 workers did ~1,780 notes' work for a backlog of 1,273."""
    import threading
    import time

    monkeypatch.setattr(drain, "LEASE", timedelta(seconds=1))
    post(client, auth, [records.message(conversation="a")])
    inside, finish, done = threading.Event(), threading.Event(), []
    derive = drain.passes_run

    def slow_pass(batch, *args):
        inside.set()
        finish.wait(10)
        derive(batch, *args)

    monkeypatch.setattr(drain, "passes_run", slow_pass)
    first = threading.Thread(target=lambda: done.append(_drain_in_thread()))
    first.start()
    try:
        assert inside.wait(10)
        time.sleep(2.5)  # the lease has run out twice over; the pass goes on
        assert drain.notes_claim() == []  # a second drainer leaves them to the first
    finally:
        finish.set()
        first.join(10)
    assert done == [1]
    assert Conversation.objects.get().messages == 1
    assert not DerivationNote.objects.exists()


def test_the_soak_says_which_notes_kept_it_from_converging(client, auth, records, crash_after_commit, settings):
    """benchmarks.load.waiting_notes: the notes still there, waiting or parked, with
    their attempts, when they are due and their last error."""
    from benchmarks.load import waiting_notes

    post(client, auth, [records.message(conversation="a")])
    post(client, auth, [records.message(conversation="b")])
    first, second = DerivationNote.objects.order_by("id")
    DerivationNote.objects.filter(pk=first.pk).update(parked=True, attempts=5, last_error="ValueError: <bad>")
    DerivationNote.objects.filter(pk=second.pk).update(available_at=timezone.now() + timedelta(seconds=90))
    lines = waiting_notes(first.project_id)
    assert len(lines) == 2
    assert "5 attempts, PARKED; last error: ValueError: <bad>" in lines[0]
    assert re.search(r"0 attempts, due in (89|90) s; last error: -$", lines[1])
