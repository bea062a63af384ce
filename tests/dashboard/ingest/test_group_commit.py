"""Group commit (dashboard/ingest/group_commit.py) on the real database: requests
storing at the same moment share one transaction, each gets its own outcome, and
none is answered before its commit."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any, Callable

import pytest
from django.db import IntegrityError, OperationalError, connection, transaction

from dashboard.ingest import group_commit
from dashboard.ingest.group_commit import GroupCommit, Together, Unmerged
from dashboard.ingest.otlp import decode_json
from dashboard.ingest.spans import spans_prepare
from dashboard.observatory.models import Conversation, Span

pytestmark = pytest.mark.django_db(transaction=True)


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` on its own thread (its own connection, as a request's); the outcome lands in the dict."""
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, outcome


def _until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _conversation(project: Any, name: str) -> Callable[[], int]:
    return lambda: Conversation.objects.create(project=project, external_id=name).pk


def _queued(committer: GroupCommit, fn: Callable[[], Any], count: int) -> tuple[threading.Thread, dict[str, Any]]:
    """``fn`` started on its own thread, once the queue holds ``count`` writes."""
    started = _in_thread(fn)
    _until(lambda: len(committer._queue) == count, f"{count} writes to queue")
    return started


def _release(release: threading.Event, *started: tuple[threading.Thread, dict[str, Any]]) -> None:
    release.set()
    for thread, _ in started:
        thread.join(10)


def _failing(project: Any, name: str) -> Callable[[], int]:
    """A write that writes, then fails (a hostile batch): what it wrote must be rolled back."""
    def write() -> int:
        _conversation(project, name)()
        raise ValueError("hostile batch")

    return write


def _leader_holding(committer: GroupCommit, project: Any) -> tuple[threading.Thread, dict[str, Any], threading.Event]:
    """A first write that leads a group and stays inside its transaction until released,
    so that the writes started meanwhile queue for the next group."""
    inside, release = threading.Event(), threading.Event()

    def first() -> int:
        inside.set()
        assert release.wait(10)
        return _conversation(project, "a")()

    thread, outcome = _in_thread(lambda: committer.run(first))
    assert inside.wait(10)
    return thread, outcome, release


def _names(project: Any) -> set[str]:
    return set(Conversation.objects.filter(project=project).values_list("external_id", flat=True))


def test_writes_queued_while_a_group_commits_share_the_next_transaction(project):
    committer = GroupCommit()
    first, first_outcome, release = _leader_holding(committer, project)
    others = [_in_thread(lambda name=name: committer.run(_conversation(project, name))) for name in ("b", "c")]
    _until(lambda: len(committer._queue) == 2, "the two writes to queue")
    release.set()
    for thread, _ in [(first, first_outcome), *others]:
        thread.join(10)
    ids = [first_outcome["result"], *(outcome["result"] for _, outcome in others)]
    assert committer.groups == 2  # the leader's own group, then b and c together
    assert len(set(ids)) == 3 and _names(project) == {"a", "b", "c"}


def test_a_group_takes_no_more_rows_than_its_bound_but_always_its_first_write(project):
    committer = GroupCommit()
    first, first_outcome, release = _leader_holding(committer, project)
    big = group_commit.MAX_GROUP_ROWS - 100
    writes = []
    for count, (name, rows) in enumerate((("b", big), ("c", 200), ("d", group_commit.MAX_GROUP_ROWS * 3)), 1):
        writes.append(_in_thread(lambda name=name, rows=rows: committer.run(_conversation(project, name), rows)))
        _until(lambda count=count: len(committer._queue) == count, f"{name} to queue")
    release.set()
    for thread, _ in [(first, first_outcome), *writes]:
        thread.join(10)
    # a; then b alone (c would pass the bound); then c alone (d would); then d, bigger than the bound
    assert committer.groups == 4 and _names(project) == {"a", "b", "c", "d"}


def test_a_failing_write_fails_alone_and_the_others_of_its_group_are_stored(project):
    committer = GroupCommit()
    first, first_outcome, release = _leader_holding(committer, project)

    failing = _queued(committer, lambda: committer.run(_failing(project, "b")), 1)
    good = _queued(committer, lambda: committer.run(_conversation(project, "c")), 2)
    _release(release, (first, first_outcome), failing, good)
    assert isinstance(failing[1]["error"], ValueError)
    assert "result" in good[1] and "result" in first_outcome
    assert _names(project) == {"a", "c"}
    assert committer.groups == 4  # a; b+c rolled back; then b and c each alone


def test_a_group_that_cannot_begin_fails_every_write_of_it_and_stores_nothing(project):
    if connection.vendor != "sqlite":
        pytest.skip("the writer lock held from another connection is SQLite's")
    committer = GroupCommit()
    holding, release = threading.Event(), threading.Event()

    def other_writer() -> None:  # not through the group: another process's transaction, say
        with transaction.atomic():
            holding.set()
            assert release.wait(10)

    other = _in_thread(other_writer)
    assert holding.wait(10)
    first = _in_thread(lambda: committer.run(_conversation(project, "a")))
    _until(lambda: committer._leading, "the first write to lead")
    # While the first waits for the lock (in vain), two more queue and join its group.
    queued = [_in_thread(lambda name=name: committer.run(_conversation(project, name))) for name in ("b", "c")]
    _until(lambda: len(committer._queue) == 3, "the two writes to queue behind the first, still queued")
    for thread, outcome in (first, *queued):
        thread.join(10)
        assert isinstance(outcome["error"], OperationalError)
    release.set()
    other[0].join(10)
    assert committer.groups == 1 and _names(project) == set()


def test_writes_queued_while_the_leader_waits_for_the_database_join_its_transaction(project):
    if connection.vendor != "sqlite":
        pytest.skip("the writer lock held from another connection is SQLite's")
    committer = GroupCommit()
    holding, release = threading.Event(), threading.Event()

    def other_writer() -> None:
        with transaction.atomic():
            holding.set()
            assert release.wait(10)

    other = _in_thread(other_writer)
    assert holding.wait(10)
    writes = [_in_thread(lambda: committer.run(_conversation(project, "a")))]
    _until(lambda: committer._leading, "the first write to lead")
    writes += [_in_thread(lambda name=name: committer.run(_conversation(project, name))) for name in ("b", "c")]
    _until(lambda: len(committer._queue) == 3, "the two writes to queue behind the first, still queued")
    release.set()
    for thread, _ in [other, *writes]:
        thread.join(10)
    assert all("result" in outcome for _, outcome in writes)
    assert committer.groups == 1 and _names(project) == {"a", "b", "c"}


def test_a_write_returns_only_after_its_transaction_committed(project):
    committed: list[str] = []

    def write() -> int:
        transaction.on_commit(lambda: committed.append("done"))
        return _conversation(project, "a")()

    thread, outcome = _in_thread(lambda: group_commit.ingest_write(write, 1))
    thread.join(10)
    assert committed == ["done"] and outcome["result"]
    seen = _in_thread(lambda: _names(project))  # another connection sees it
    seen[0].join(10)
    assert seen[1]["result"] == {"a"}


def test_a_second_writer_of_a_group_is_answered_only_after_the_leader_s_commit(project, monkeypatch):
    """The leader runs the second writer's write in its transaction; the second
    writer must not return (its request be answered 200) before that transaction
    committed: marking it done inside the transaction would acknowledge a batch a
    failed commit then loses. The commit is held a moment (as a slow fsync would);
    the second writer's return must still come after it, and find its row stored."""
    committer = GroupCommit()
    events: list[str] = []
    answered = threading.Event()
    real = group_commit.ingest_transaction

    @contextlib.contextmanager
    def slow_commit():
        first = not events
        with real():
            if first:  # the leader's transaction: let the second writer queue, to join it
                events.append("began")
                _until(lambda: len(committer._queue) == 2, "the second writer to queue")
            yield
            if first:  # the writes ran; hold the commit, giving an early answer time to show
                answered.wait(1.0)
        if first:
            events.append("committed")

    monkeypatch.setattr(group_commit, "ingest_transaction", slow_commit)

    def second() -> bool:
        committer.run(_conversation(project, "b"))
        events.append("b answered")
        answered.set()
        return Conversation.objects.filter(external_id="b").exists()  # on its own connection

    leader = _in_thread(lambda: committer.run(_conversation(project, "a")))
    _until(lambda: events == ["began"], "the leader's transaction to begin")
    follower = _in_thread(second)
    for thread, _ in (leader, follower):
        thread.join(10)
    assert committer.groups == 1  # one group: the leader and the second writer
    assert events == ["began", "committed", "b answered"]
    assert follower[1]["result"] is True and _names(project) == {"a", "b"}


def test_inside_a_transaction_a_write_runs_in_it_alone(project):
    committer = GroupCommit()
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            committer.run(_conversation(project, "a"))
            raise RuntimeError("the caller's transaction rolls back")
    assert committer.groups == 0 and _names(project) == set()


def test_one_thread_runs_several_writes_as_one_group_each_with_its_outcome(project):
    """run_all (the OTLP/HTTP receiver's one thread): one transaction for all; a failing
    write fails alone (the group runs again, each alone), the others are stored."""
    committer = GroupCommit()

    outcomes = committer.run_all([(_conversation(project, "a"), 1, None), (_failing(project, "bad"), 1, None),
                                  (_conversation(project, "b"), 1, None)])
    assert [error is None for _, error in outcomes] == [True, False, True]
    assert isinstance(outcomes[1][1], ValueError) and outcomes[0][0] != outcomes[2][0]
    assert _names(project) == {"a", "b"}
    assert committer.groups == 4  # all three rolled back; then each alone
    assert committer.run_all([(_conversation(project, name), 1, None) for name in ("c", "d")])[1][1] is None
    assert committer.groups == 5 and _names(project) == {"a", "b", "c", "d"}


def test_a_commit_one_write_fails_for_good_fails_that_write_alone(project):
    """A deferred foreign key (Django's, on SQLite and PostgreSQL) is checked at the
    commit, after every write of the group ran: the database's error says nothing of
    which write was at fault, and it is not the database being busy, so the group
    runs again, each write alone; only the orphan's request fails (a 500), the
    others are stored. (Given to every write, the error made a 500 of each.) SQLite
    leaves its transaction open when such a commit fails: the connection is closed,
    or the writes after it would run in that transaction and never commit."""
    committer = GroupCommit()
    missing_project = project.pk + 1000

    def orphan() -> int:
        return Conversation.objects.create(project_id=missing_project, external_id="orphan").pk

    outcomes = committer.run_all([(_conversation(project, "a"), 1, None), (orphan, 1, None),
                                  (_conversation(project, "b"), 1, None)])
    assert [error is None for _, error in outcomes] == [True, False, True]
    assert isinstance(outcomes[1][1], IntegrityError)
    assert _names(project) == {"a", "b"} and not Conversation.objects.filter(external_id="orphan").exists()
    assert committer.groups == 4  # all three at the commit; then each alone
    assert committer.run_all([(_conversation(project, "c"), 1, None)])[0][1] is None
    thread, seen = _in_thread(lambda: _names(project))  # another connection: committed rows only
    thread.join(10)
    assert seen["result"] == {"a", "b", "c"}


def test_one_thread_s_writes_past_the_group_bound_take_several_groups_and_all_finish(project):
    committer = GroupCommit()
    names = [f"w{index}" for index in range(group_commit.MAX_GROUP * 2 + 3)]
    outcomes = committer.run_all([(_conversation(project, name), 1, None) for name in names])
    assert all(error is None for _, error in outcomes) and len({result for result, _ in outcomes}) == len(names)
    assert committer.groups == 3 and _names(project) == set(names)
    assert not committer._leading and not committer._queue  # the lead is free again


def test_no_writes_leave_the_lead_free(project):
    committer = GroupCommit()
    assert committer.run_all([]) == []
    thread, outcome = _in_thread(lambda: committer.run(_conversation(project, "a")))
    thread.join(10)
    assert "result" in outcome and _names(project) == {"a"}


def test_a_thread_s_writes_join_the_group_another_thread_leads(project):
    committer = GroupCommit()
    first, first_outcome, release = _leader_holding(committer, project)
    several = _queued(committer, lambda: committer.run_all([(_conversation(project, name), 1, None) for name in "bc"]), 2)
    single = _queued(committer, lambda: committer.run(_conversation(project, "d")), 3)
    _release(release, (first, first_outcome), several, single)
    assert [error for _, error in several[1]["result"]] == [None, None] and "result" in single[1]
    assert committer.groups == 2 and _names(project) == {"a", "b", "c", "d"}


def _together(project: Any, calls: list[list[str]], key: str = "k", *, unmerged: bool = False) -> Any:
    """A write of several conversations, ``Together`` with the others of ``key``: its
    merged store creates all the names of its parts in one call (noted in ``calls``),
    or creates them and raises ``Unmerged`` (a result it cannot split)."""
    def store(parts: list[str]) -> list[int]:
        calls.append(list(parts))
        ids = [_conversation(project, part)() for part in parts]
        if unmerged and len(parts) > 1:
            raise Unmerged
        return ids

    return lambda name: (lambda: store([name])[0], 1, Together(key, name, store))


def test_writes_together_of_one_key_are_stored_by_one_call_each_with_its_result(project):
    committer = GroupCommit()
    calls: list[list[str]] = []
    write, other = _together(project, calls), _together(project, calls, key="other")
    outcomes = committer.run_all([write("a"), (_conversation(project, "x"), 1, None), write("b"), other("c"),
                                  write("d")])
    assert [error for _, error in outcomes] == [None] * 5
    assert calls == [["a", "b", "d"], ["c"]]  # one key's parts merged, in queue order; a lone one alone
    by_name = dict(Conversation.objects.filter(project=project).values_list("external_id", "pk"))
    assert [result for result, _ in outcomes] == [by_name[name] for name in "axbcd"]
    assert committer.groups == 1


def test_a_merged_write_that_cannot_split_its_results_runs_each_write_alone(project):
    """Unmerged (a retried batch among them): the merged rows roll back and each write
    runs alone in its own transaction, stored once."""
    committer = GroupCommit()
    calls: list[list[str]] = []
    write = _together(project, calls, unmerged=True)
    outcomes = committer.run_all([write("a"), write("b")])
    assert [error for _, error in outcomes] == [None, None] and calls == [["a", "b"], ["a"], ["b"]]
    assert committer.groups == 3
    assert sorted(Conversation.objects.filter(project=project).values_list("external_id", flat=True)) == ["a", "b"]


_NOW = time.time_ns()


def _span_batch(project: Any, trace: int, spans: range) -> Any:
    """A prepared batch of plain spans (``spans_prepare``), ids from the numbers given
    (a batch sent again is the same spans: the same times too)."""
    now = _NOW
    document = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [
        {"traceId": f"{trace:032x}", "spanId": f"{span + 1:016x}", "name": f"s{span}",
         "startTimeUnixNano": str(now), "endTimeUnixNano": str(now + 1000)} for span in spans
    ]}]}]}
    return spans_prepare(project=project, spans=decode_json(json.dumps(document).encode()).spans)


def test_span_batches_of_a_group_are_one_write_and_a_retried_one_among_them_is_stored_once(project):
    """Span batches of one project in one group are one merged write; a batch sent
    again (its spans stored already: on PostgreSQL the first try's COPY fails, on
    SQLite the merged count is short) makes the group run again, each batch alone:
    every batch is acknowledged, the retried one with nothing inserted, no span twice."""
    assert group_commit.pending_store_all([_span_batch(project, 1, range(0, 3))])[0][0].inserted == 3
    before = group_commit._process.groups
    outcomes = group_commit.pending_store_all([_span_batch(project, 2, range(0, 4)), _span_batch(project, 3, range(0, 2))])
    assert [(result.inserted, error) for result, error in outcomes] == [(4, None), (2, None)]
    assert group_commit._process.groups == before + 1  # one transaction, the two batches one write
    outcomes = group_commit.pending_store_all([_span_batch(project, 4, range(0, 2)), _span_batch(project, 1, range(0, 3)),
                                               _span_batch(project, 5, range(0, 1))])
    assert [(result.inserted, result.duplicates, error) for result, error in outcomes] == [
        (2, 0, None), (0, 3, None), (1, 0, None)]
    assert group_commit._process.groups == before + 1 + 4  # the group, rolled back; then each alone
    alone = group_commit.pending_store_all([_span_batch(project, 1, range(0, 4))])  # one span new, three stored
    assert [(result.inserted, result.duplicates, error) for result, error in alone] == [(1, 3, None)]
    assert Span.objects.filter(project=project).count() == 3 + 6 + 3 + 1


def test_a_key_revoked_after_its_first_use_fails_its_batch_alone_in_a_merged_group(project):
    """A key seen before is checked by the span write itself (one read with the traces'
    lookup): revoked since, its batch gets 401 and stores nothing, while the batch of
    another key of the project, in the same group, is stored; the key is forgotten."""
    from dashboard.accounts.services import apikey_create, apikey_revoke
    from dashboard.ingest import common
    from dashboard.ingest.export import TRACES, ExportOutcome, ExportRequest, otlp_export_all

    (_, kept_text), (revoked, revoked_text) = apikey_create(project=project), apikey_create(project=project, name="b")

    def request(text: str, trace: int) -> ExportRequest:
        document = {"resourceSpans": [{"scopeSpans": [{"spans": [
            {"traceId": f"{trace:032x}", "spanId": f"{index + 1:016x}", "name": "s",
             "startTimeUnixNano": str(_NOW), "endTimeUnixNano": str(_NOW + 1000)} for index in range(3)]}]}]}
        body = json.dumps(document).encode()
        return ExportRequest(TRACES, f"Bearer {text}", lambda: body, "application/json")

    first = otlp_export_all([request(kept_text, 1), request(revoked_text, 2)])  # both keys seen: remembered
    assert [outcome.stored for outcome in first] == [3, 3] and len(common._known_keys) >= 2
    apikey_revoke(key=revoked)
    before = group_commit._process.groups
    outcomes = otlp_export_all([request(kept_text, 3), request(revoked_text, 4)])
    assert isinstance(outcomes[0], ExportOutcome) and outcomes[0].stored == 3
    assert isinstance(outcomes[1], common.IngestError) and (outcomes[1].status, outcomes[1].message) == (
        401, "revoked API key")
    assert group_commit._process.groups == before + 3  # merged, rolled back; each alone
    assert set(Span.objects.filter(project=project).values_list("trace_id", flat=True)) == {
        f"{trace:032x}" for trace in (1, 2, 3)}
    assert common.hash_key(revoked_text) not in common._known_keys
