"""A conversation's tool-call totals are the sums of its minute slices: a pass
recomputes the minutes its batches changed, never the conversation's history, and
the totals always equal a recount of the rows."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta
from datetime import timezone as dt_timezone

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboard.observatory import tasks
from dashboard.observatory.derive import drain
from dashboard.observatory.derive.passes import totals
from dashboard.observatory.dbfunctions import DateUTC, HourUTC, MinuteUTC
from dashboard.observatory.models import (
    Conversation,
    ConversationMinute,
    DerivationNote,
    Span,
    ToolExecution,
)
from dashboard.observatory.services import retention_purge
from dashboard.observatory.models import hour_of, minute_of
from tests.dashboard.observatory.helpers import store

pytestmark = pytest.mark.django_db


def recount(conversation: Conversation) -> tuple[int, int, int]:
    """Tool calls, tool errors and retries of the conversation, from its rows."""
    rows = list(ToolExecution.objects.filter(conversation=conversation).values_list("success", "retry_count"))
    return len(rows), sum(1 for success, _ in rows if not success), sum(retries for _, retries in rows)


def figures(conversation: Conversation) -> tuple[int, int, int]:
    conversation.refresh_from_db()
    return conversation.tool_calls, conversation.errors, conversation.retries


def test_a_pass_recounts_only_its_minutes_and_the_totals_sum_the_slices(project, records):
    base = minute_of(records.now) - timedelta(hours=1)
    first, second = base + timedelta(seconds=5), base + timedelta(minutes=30, seconds=59)
    outcome = store(project, [records.tool_result(at=first), records.tool_result(at=second, success=False,
                                                                                   result={"retry_count": 2})])
    (pk,) = outcome.conversation_ids
    totals.conversation_totals_refresh(conversation_ids=[pk], minutes=sorted(outcome.tool_minutes))
    conversation = Conversation.objects.get()
    assert figures(conversation) == (2, 1, 2)
    assert dict(ConversationMinute.objects.values_list("minute", "tool_calls")) == {base: 1, minute_of(second): 1}

    # Rows stored in the first minute since are not read by a pass about the second only...
    ToolExecution.objects.create(project=project, conversation=conversation, record_id=uuid.uuid4(), tool_name="t",
                                 occurred_at=first + timedelta(seconds=1), success=False, retry_count=5)
    totals.conversation_totals_refresh(conversation_ids=[pk], minutes=[minute_of(second)])
    assert figures(conversation) == (2, 1, 2)
    # ...and are once their minute is: the totals equal the recount.
    totals.conversation_totals_refresh(conversation_ids=[pk], minutes=[base])
    assert figures(conversation) == recount(conversation) == (3, 2, 7)


def test_a_minute_whose_rows_are_gone_is_written_with_zeros(project, records):
    at = minute_of(records.now) - timedelta(minutes=10)
    outcome = store(project, [records.tool_result(at=at), records.tool_result(at=at + timedelta(minutes=1))])
    (pk,) = outcome.conversation_ids
    totals.conversation_totals_refresh(conversation_ids=[pk])
    ToolExecution.objects.filter(occurred_at__lt=at + timedelta(minutes=1)).delete()
    totals.conversation_totals_refresh(conversation_ids=[pk], minutes=[at])
    assert dict(ConversationMinute.objects.values_list("minute", "tool_calls")) == {at: 0, at + timedelta(minutes=1): 1}
    assert figures(Conversation.objects.get()) == (1, 0, 0)


def test_a_conversation_without_slices_is_counted_whole_whatever_the_minutes(project, records):
    """Conversations from before the slices (and a first pass) have none: counted
    whole once, then by the minute."""
    at = records.now - timedelta(hours=3)
    outcome = store(project, [records.tool_result(at=at + timedelta(minutes=m)) for m in (0, 20, 40)])
    (pk,) = outcome.conversation_ids
    totals.conversation_totals_refresh(conversation_ids=[pk], minutes=[])
    assert figures(Conversation.objects.get()) == (3, 0, 0)
    assert ConversationMinute.objects.count() == 3


def test_activity_times_come_from_every_table_spans_included(project, records):
    at = records.now - timedelta(hours=2)
    outcome = store(project, [records.tool_result(at=at), records.message(at=at + timedelta(minutes=5))])
    (pk,) = outcome.conversation_ids
    conversation = Conversation.objects.get()
    for index, (start, end) in enumerate([(at - timedelta(minutes=7), at - timedelta(minutes=6)),
                                          (at + timedelta(minutes=1), at + timedelta(minutes=30)),  # a long span
                                          (at + timedelta(minutes=2), at + timedelta(minutes=3))]):
        Span.objects.create(project=project, trace_id="a" * 32, span_id=f"{index + 1:016x}", start_time=start,
                            end_time=end, conversation=conversation)
    totals.conversation_totals_refresh(conversation_ids=[pk], minutes=[])
    conversation.refresh_from_db()
    assert (conversation.started_at, conversation.last_activity_at) == (at - timedelta(minutes=7),
                                                                        at + timedelta(minutes=30))


def test_the_model_falls_back_to_the_last_tool_call_naming_one(project, records):
    at = minute_of(records.now) - timedelta(minutes=30)
    outcome = store(project, [records.tool_result(model="old", at=at),
                              records.tool_result(model="new", at=at + timedelta(minutes=2)),
                              records.tool_result(at=at + timedelta(minutes=3))])  # names none
    (pk,) = outcome.conversation_ids
    totals.conversation_totals_refresh(conversation_ids=[pk], minutes=sorted(outcome.tool_minutes))
    assert Conversation.objects.get().model == "new"
    outcome = store(project, [records.tool_result(model="newer", at=at + timedelta(minutes=1))])  # earlier
    totals.conversation_totals_refresh(conversation_ids=[pk], minutes=sorted(outcome.tool_minutes))
    assert Conversation.objects.get().model == "new"
    outcome = store(project, [records.tool_result(model="newest", at=at + timedelta(minutes=2, seconds=30))])
    totals.conversation_totals_refresh(conversation_ids=[pk], minutes=sorted(outcome.tool_minutes))
    assert Conversation.objects.get().model == "newest"


def test_of_calls_at_the_same_instant_naming_models_the_one_stored_last_wins(project, records):
    at = minute_of(records.now) - timedelta(minutes=30) + timedelta(seconds=10)
    outcome = store(project, [records.tool_result(model=name, at=at) for name in ("first", "second", "third")]
                    + [records.tool_result(model="earlier", at=at - timedelta(seconds=5)),
                       records.tool_result(at=at + timedelta(seconds=5))])  # later, but names none
    (pk,) = outcome.conversation_ids
    last = ToolExecution.objects.exclude(model="").order_by("-occurred_at", "-id").values_list("model", flat=True)[0]
    for minutes in (sorted(outcome.tool_minutes), None):  # a pass after batches, and a rebuild
        Conversation.objects.filter(pk=pk).update(model="")
        totals.conversation_totals_refresh(conversation_ids=[pk], minutes=minutes)
        assert Conversation.objects.get().model == last
        assert ConversationMinute.objects.get().tool_model == last


def test_the_databases_minute_hour_and_day_are_those_of_python_in_utc(project, records):
    base = records.now.replace(microsecond=0)
    instants = [base, base.replace(second=59, microsecond=999_999), base.replace(second=0),
                base.replace(minute=59, second=59, microsecond=1), base + timedelta(days=400, seconds=1)]
    store(project, [records.tool_result(at=at) for at in instants])
    rows = ToolExecution.objects.annotate(minute=MinuteUTC("occurred_at"), hour=HourUTC("occurred_at"),
                                          day=DateUTC("occurred_at"))
    assert len(rows) == len(instants)
    for row in rows:
        assert (row.minute, row.hour, row.day) == (minute_of(row.occurred_at), hour_of(row.occurred_at),
                                                   row.occurred_at.astimezone(dt_timezone.utc).date())


def test_a_pass_begun_earlier_never_writes_over_a_later_ones_slice(project, records):
    at = minute_of(records.now) - timedelta(minutes=20)
    outcome = store(project, [records.tool_result(at=at)])
    (pk,) = outcome.conversation_ids
    totals.conversation_totals_refresh(conversation_ids=[pk])
    later = timezone.now() + timedelta(seconds=30)
    ConversationMinute.objects.update(tool_calls=7, updated_at=later)  # as a pass begun later wrote it
    Conversation.objects.update(totals_updated_at=later)
    totals.conversation_totals_refresh(conversation_ids=[pk], minutes=[at])
    assert ConversationMinute.objects.get().tool_calls == 7
    assert not DerivationNote.objects.exists()  # it changed no slice: nothing to sum again


def test_a_slice_changed_after_a_later_pass_summed_gets_a_note_to_sum_again(project, records):
    """Two drainers: one begun later wrote the conversation's totals (from slices
    without this pass's minute), then this pass writes its minute's slice: the
    totals are not this pass's to write, so it leaves a note for the next pass."""
    at = minute_of(records.now) - timedelta(minutes=20)
    outcome = store(project, [records.tool_result(at=at), records.tool_result(at=at + timedelta(minutes=1))])
    (pk,) = outcome.conversation_ids
    totals.conversation_totals_refresh(conversation_ids=[pk])
    DerivationNote.objects.all().delete()
    ToolExecution.objects.create(project=project, conversation_id=pk, record_id=uuid.uuid4(), tool_name="t",
                                 occurred_at=at + timedelta(seconds=3), success=True)
    Conversation.objects.update(totals_updated_at=timezone.now() + timedelta(seconds=30))
    totals.conversation_totals_refresh(conversation_ids=[pk], minutes=[at])
    assert figures(Conversation.objects.get())[0] == 2  # not written by this pass
    note = DerivationNote.objects.get()
    assert (note.conversation_ids, note.minutes) == ([pk], [])
    Conversation.objects.update(totals_updated_at=None)
    drain.outbox_drain_all()
    assert figures(Conversation.objects.get())[0] == 3


def test_the_sweep_corrects_a_slice_no_note_named(project, records):
    at = records.now - timedelta(minutes=50)
    outcome = store(project, [records.tool_result(at=at)])
    (pk,) = outcome.conversation_ids
    totals.conversation_totals_refresh(conversation_ids=[pk])
    ToolExecution.objects.create(project=project, conversation_id=pk, record_id=uuid.uuid4(), tool_name="t",
                                 occurred_at=at + timedelta(minutes=10), success=True)  # its note lost
    totals.slices_sweep(project_id=project.pk, since=records.now - timedelta(hours=3))
    assert figures(Conversation.objects.get()) == (2, 0, 0)


def test_retention_removes_old_slices_and_the_next_pass_sums_the_rest(project, records):
    now = timezone.now()
    old, recent = now - timedelta(days=400), now - timedelta(hours=1)
    outcome = store(project, [records.tool_result(at=old), records.tool_result(at=recent)])
    (pk,) = outcome.conversation_ids
    totals.conversation_totals_refresh(conversation_ids=[pk])
    assert ConversationMinute.objects.count() == 2
    retention_purge(project=project, now=now)
    assert list(ConversationMinute.objects.values_list("minute", flat=True)) == [minute_of(recent)]
    totals.conversation_totals_refresh(conversation_ids=[pk], minutes=[])
    assert figures(Conversation.objects.get()) == (1, 0, 0)


def test_a_pass_reads_its_minutes_not_the_conversations_history(project, records):
    """The query that counts the tool calls names the minutes' range: what the plan
    reads does not grow with the conversation (plans: test_indexes)."""
    at = minute_of(records.now) - timedelta(hours=2)
    outcome = store(project, [records.tool_result(at=at + timedelta(minutes=m)) for m in range(0, 60, 3)])
    (pk,) = outcome.conversation_ids
    totals.conversation_totals_refresh(conversation_ids=[pk])
    with CaptureQueriesContext(connection) as queries:
        totals.conversation_totals_refresh(conversation_ids=[pk], minutes=[at + timedelta(minutes=30)])
    counting = [q["sql"] for q in queries if "observatory_toolexecution" in q["sql"] and "COUNT(" in q["sql"]]
    assert counting and all('"occurred_at" >=' in sql and '"occurred_at" <' in sql for sql in counting)


def test_random_batches_leave_every_total_equal_to_a_recount(project, records):
    """Numbers on pages must be true: 40 batches of random tool results over 3 hours
    and 5 conversations, each pass told only its batch's minutes (some out of order,
    some rows deleted as a record winning over a derived call does)."""
    rng = random.Random(7)
    base = minute_of(records.now) - timedelta(hours=3)
    for number in range(40):
        batch = [records.tool_result(conversation=f"c{rng.randrange(5)}", at=base + timedelta(seconds=rng.randrange(10800)),
                                     success=rng.random() > 0.3, result={"retry_count": rng.randrange(3)},
                                     **rng.choice([{}, {}, {"model": "m1"}, {"model": "m2"}]))
                 for _ in range(rng.randrange(1, 12))]
        outcome = store(project, batch)
        minutes = set(outcome.tool_minutes)
        if number % 7 == 6:
            doomed = list(ToolExecution.objects.order_by("?")[:3])
            minutes |= {minute_of(row.occurred_at) for row in doomed}
            conversations = {row.conversation_id for row in doomed}
            ToolExecution.objects.filter(pk__in=[row.pk for row in doomed]).delete()
        else:
            conversations = set()
        totals.conversation_totals_refresh(conversation_ids=outcome.conversation_ids | conversations,
                                                minutes=sorted(minutes))
    for conversation in Conversation.objects.all():
        assert figures(conversation) == recount(conversation)
        named = ToolExecution.objects.filter(conversation=conversation).exclude(model="").order_by("-occurred_at", "-id")
        assert conversation.model == (named[0].model if named else "")


def test_the_outbox_pass_tells_the_totals_its_batches_minutes(project, records):
    """Through the note a batch writes: the pass recounts the minutes it names (the
    task takes them as ISO times, as a broker carries them)."""
    from dashboard.observatory.derive.notes import derivations_enqueue

    at = minute_of(records.now) - timedelta(minutes=40)
    outcome = store(project, [records.tool_result(at=at), records.tool_result(at=at + timedelta(minutes=5))])
    (pk,) = outcome.conversation_ids
    tasks.conversation_totals_refresh([pk])  # slices exist: from now on by the minute
    ToolExecution.objects.create(project=project, conversation_id=pk, record_id=uuid.uuid4(), tool_name="t",
                                 occurred_at=at + timedelta(seconds=9), success=True)  # no note names its minute
    later = store(project, [records.tool_result(at=at + timedelta(minutes=5, seconds=1))])
    derivations_enqueue(project_id=project.pk, conversation_ids=sorted(later.conversation_ids),
                        minutes=later.tool_minutes)
    drain.outbox_drain_all()
    assert figures(Conversation.objects.get())[0] == 3  # the unnoted row's minute was not read
    tasks.conversation_totals_refresh([pk], [at.isoformat()])
    assert figures(Conversation.objects.get())[0] == 4 == recount(Conversation.objects.get())[0]
