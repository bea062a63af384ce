"""The derivation tasks: each recomputes from rows, so running it twice gives the
same result, and its aggregates equal a recomputation from the rows."""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from django.db.models import Model
from django.forms.models import model_to_dict

from dashboard.observatory import tasks
from dashboard.observatory.derive import schedule
from dashboard.observatory.derive.passes import links, rollups
from dashboard.observatory.histogram import histogram_of
from dashboard.observatory.models import (
    Artifact,
    Conversation,
    Message,
    Round,
    Span,
    ToolExecution,
    ToolHourlyRollup,
    ToolMinuteRollup,
)
from dashboard.observatory.services import retention_purge
from dashboard.observatory.models import hour_of, minute_of
from tests.dashboard.observatory.helpers import store

pytestmark = pytest.mark.django_db


def snapshot(rows: list[Model], exclude=("updated_at", "totals_updated_at")) -> list[dict]:
    return [{k: v for k, v in model_to_dict(row).items() if k not in exclude} for row in rows]


def span(project, *, trace="a" * 32, span_id="b" * 16, start=None, duration_ms=5.0, **fields):
    start = start or datetime.now(timezone.utc) - timedelta(minutes=5)
    return Span.objects.create(
        project=project, trace_id=trace, span_id=span_id, name=fields.pop("name", "tool"),
        start_time=start, end_time=start + timedelta(milliseconds=duration_ms), duration_ms=duration_ms, **fields,
    )


# --- conversation totals --------------------------------------------------------------

def test_it_recomputes_conversation_totals_from_rows(project, records):
    outcome = store(project, [
        records.round(index=0, model="gpt-4o", user_id="u1", input_tokens=100, output_tokens=10, context_tokens=900),
        records.round(index=1, model="gpt-4o", user_id="u1", input_tokens=200, output_tokens=20,
                      context_tokens=1500, status="error"),
        records.message(index=0, content="  What   were sales\nin March?  "),
        records.message(index=1, role="assistant", content="Let me look."),
        records.tool_result(), records.tool_result(success=False, result={"retry_count": 2}),
        records.compression(), records.skill(success=False, error="boom"),
    ])
    tasks.conversation_totals_refresh(sorted(outcome.conversation_ids))
    conversation = Conversation.objects.get()
    assert (conversation.rounds, conversation.messages, conversation.tool_calls) == (2, 2, 2)
    assert (conversation.input_tokens, conversation.output_tokens, conversation.max_context_tokens) == (300, 30, 1500)
    assert (conversation.errors, conversation.retries, conversation.compressions) == (3, 2, 1)  # round + tool + skill
    assert conversation.has_errors and conversation.status == "error"
    assert (conversation.title, conversation.model, conversation.user_id) == ("What were sales in March?", "gpt-4o", "u1")


def test_it_picks_each_conversations_own_first_and_latest_rows(project, records):
    """Title, model, user and status come from one row of each kind per conversation
    (found by the database: a conversation's rows are never all read), whatever the
    number of conversations or rows."""
    at = records.now
    batch = [records.message(conversation="a", index=3, content="later question"),
             records.message(conversation="a", index=1, content="first question"),
             records.message(conversation="a", index=0, role="system", content="be brief"),
             records.round(conversation="b", index=0, user_message="from the round", model="m-old", status="error"),
             records.round(conversation="b", index=1, model="m-new", user_id="u-b"),
             records.tool_result(conversation="c", model="tool-old", at=at - timedelta(minutes=2)),
             records.tool_result(conversation="c", model="tool-new", at=at - timedelta(minutes=1)),
             *[records.tool_result(conversation="c", at=at) for _ in range(20)]]  # no model: not the latest
    ids = sorted(store(project, batch).conversation_ids)
    tasks.conversation_totals_refresh(ids)
    got = {c.external_id: (c.title, c.model, c.user_id, c.status) for c in Conversation.objects.all()}
    assert got == {"a": ("first question", "", "", "ok"), "b": ("from the round", "m-new", "u-b", "ok"),
                   "c": ("", "tool-new", "", "ok")}


def test_it_gives_the_same_totals_when_run_twice(project, records):
    outcome = store(project, [records.round(), records.message(), records.tool_result()])
    ids = sorted(outcome.conversation_ids)
    tasks.conversation_totals_refresh(ids)
    first = snapshot(list(Conversation.objects.all()) + list(Round.objects.all()))
    tasks.conversation_totals_refresh(ids)
    assert snapshot(list(Conversation.objects.all()) + list(Round.objects.all())) == first


def test_it_derives_context_tokens_per_round_from_messages_when_not_reported(project, records):
    outcome = store(project, [
        records.round(index=0), records.round(index=1), records.round(index=2, context_tokens=5000),
        records.message(index=0, round_id="r0", tokens=100), records.message(index=1, round_id="r0", tokens=50),
        records.message(index=2, round_id="r1", tokens=70),
        records.tool_result(round_id="r1"), records.tool_result(round_id="r1", success=False),
    ])
    tasks.conversation_totals_refresh(sorted(outcome.conversation_ids))
    rounds = list(Round.objects.order_by("index").values_list("derived_context_tokens", "tool_call_count", "error_count"))
    assert rounds == [(150, 0, 0), (220, 2, 1), (5000, 0, 0)]


# --- hourly tool rollups ----------------------------------------------------------------

def expected_rollups(project) -> dict[tuple[str, datetime], dict]:
    """The rollups recomputed in Python straight from the tool execution rows."""
    expected: dict = {}
    for row in ToolExecution.objects.filter(project=project):
        key = (row.tool_name, hour_of(row.occurred_at))
        entry = expected.setdefault(key, {"calls": 0, "successes": 0, "errors": 0, "retries": 0, "timeouts": 0,
                                          "cache_hits": 0, "duration_sum_ms": 0.0, "durations": [],
                                          "error_types": Counter(), "brief_tokens": 0, "brief_count": 0})
        entry["calls"] += 1
        entry["successes" if row.success else "errors"] += 1
        entry["retries"] += row.retry_count
        entry["timeouts"] += (not row.success and row.error_type == "timeout")
        entry["cache_hits"] += row.cache_hit
        entry["duration_sum_ms"] += row.duration_ms
        entry["durations"].append(row.duration_ms)
        if not row.success:
            entry["error_types"][row.error_type or "unknown"] += 1
        if row.output_level == "brief":
            entry["brief_tokens"] += row.observation_tokens
            entry["brief_count"] += 1
    return expected


def test_it_matches_rollups_to_a_recomputation_from_rows(project, records):
    rng = random.Random(7)
    base = records.now - timedelta(hours=3)
    batch = []
    for _ in range(300):
        success = rng.random() > 0.2
        batch.append(records.tool_result(
            tool=rng.choice(["query_sales", "read_file", "chart"]), success=success,
            duration_ms=rng.choice([0.3, 4.0, 55.0, 1200.0, 900_000.0]),
            at=base + timedelta(minutes=rng.randrange(0, 240)),
            result={"retry_count": rng.randrange(0, 3), "cache_hit": rng.random() > 0.7,
                    "output_level": rng.choice(["brief", "standard", "full"]),
                    "observation_tokens": rng.randrange(0, 500),
                    **({} if success else {"error_type": rng.choice(["timeout", "not_found", ""])})},
        ))
    outcome = store(project, batch)
    tasks.tool_rollups_refresh(project.pk, [], sorted(m.isoformat() for m in outcome.tool_minutes))
    expected = expected_rollups(project)
    rollups = {(r.tool_name, r.hour): r for r in ToolHourlyRollup.objects.filter(project=project)}
    assert set(rollups) == set(expected)
    for key, want in expected.items():
        got = rollups[key]
        for name in ("calls", "successes", "errors", "retries", "timeouts", "cache_hits", "brief_tokens", "brief_count"):
            assert getattr(got, name) == want[name], (key, name)
        assert got.duration_sum_ms == pytest.approx(want["duration_sum_ms"])
        assert got.latency_histogram == histogram_of(want["durations"])
        assert got.error_types == dict(want["error_types"])


def test_it_gives_the_same_rollups_when_run_twice_and_drops_stale_ones(project, records):
    outcome = store(project, [records.tool_result(tool="a"), records.tool_result(tool="b")])
    minutes = sorted(m.isoformat() for m in outcome.tool_minutes)
    tasks.tool_rollups_refresh(project.pk, [], minutes)
    first = snapshot(list(ToolHourlyRollup.objects.order_by("tool_name")))
    tasks.tool_rollups_refresh(project.pk, [], minutes)
    assert snapshot(list(ToolHourlyRollup.objects.order_by("tool_name"))) == first
    ToolExecution.objects.filter(tool_name="b").delete()
    tasks.tool_rollups_refresh(project.pk, [], minutes)
    assert list(ToolHourlyRollup.objects.values_list("tool_name", flat=True)) == ["a"]


def test_it_counts_tool_spans_that_no_record_describes(project, records):
    store(project, [records.tool_result(tool="query_sales", result={"tool_call_id": "call_known"})])
    at = records.now
    span(project, span_id="1" * 16, tool_name="query_sales", tool_call_id="call_known", start=at)  # described
    span(project, span_id="2" * 16, tool_name="web_search", tool_call_id="call_x", start=at, duration_ms=30.0,
         status_code=2, attributes={"error.type": "timeout", "ba.retry_count": 1})
    tasks.tool_rollups_refresh(project.pk, [hour_of(at).isoformat()])
    rollups = {r.tool_name: r for r in ToolHourlyRollup.objects.all()}
    assert rollups["query_sales"].calls == 1
    web = rollups["web_search"]
    assert (web.calls, web.errors, web.timeouts, web.retries, web.error_types) == (1, 1, 1, 1, {"timeout": 1})


def test_a_conversations_tool_span_counts_as_the_tool_execution_derived_from_it(project, records):
    """Span-only calls are looked for among the tool spans no span-row pass derives:
    a conversation's tool call span counts once its tool execution is derived, and
    never twice."""
    from dashboard.observatory.derive.passes import span_rows
    from dashboard.observatory.models import Conversation

    conversation = Conversation.objects.create(project=project, external_id="c")
    at = records.now
    span(project, span_id="1" * 16, tool_name="search", tool_call_id="call_1", start=at,
         conversation=conversation, operation="execute_tool", attributes={"gen_ai.tool.name": "search"})
    hour = [hour_of(at).isoformat()]
    tasks.tool_rollups_refresh(project.pk, hour)
    assert not ToolHourlyRollup.objects.filter(tool_name="search").exists()  # not derived yet
    span_rows.span_rows_derive(project_id=project.pk, conversation_ids=[conversation.pk])
    tasks.tool_rollups_refresh(project.pk, hour)
    assert ToolHourlyRollup.objects.get(tool_name="search").calls == 1


def test_it_reads_span_facts_of_every_json_type_like_the_rows_say(project, records):
    # The rollup reads five attributes through the database's JSON extraction (SQLite
    # and PostgreSQL differ in what they hand back); hostile types count as nothing, and
    # a token count that is none (negative, a list, absurd, absent) is unknown, not 0.
    at = records.now
    facts = [
        {"ba.retry_count": 2, "ba.cache_hit": True, "ba.output_level": "brief", "ba.observation_tokens": 40},
        {"ba.retry_count": "3", "ba.cache_hit": "yes", "ba.output_level": "full", "ba.observation_tokens": -5},
        {"ba.retry_count": -1, "ba.cache_hit": False, "ba.output_level": "<script>", "ba.observation_tokens": 10},
        {"ba.retry_count": True, "ba.cache_hit": 1, "ba.output_level": "brief", "ba.observation_tokens": [1, 2]},
        {"ba.retry_count": {"n": 1}, "error.type": {"nested": "x"}, "ba.observation_tokens": 10**30},
        {},
    ]
    for index, attributes in enumerate(facts):
        span(project, span_id=f"{index + 1:016x}", tool_name="probe", tool_call_id=f"call_{index}", start=at,
             duration_ms=5.0, status_code=2 if index == 4 else 0, attributes=attributes)
    tasks.tool_rollups_refresh(project.pk, [hour_of(at).isoformat()])
    rollup = ToolHourlyRollup.objects.get(tool_name="probe")
    assert (rollup.calls, rollup.errors, rollup.successes) == (6, 1, 5)
    assert rollup.retries == 2 + 3  # an int and a digit string; bools, negatives, objects count 0
    assert rollup.cache_hits == 2  # true and 1 (SQLite cannot tell them apart)
    assert (rollup.brief_count, rollup.brief_tokens, rollup.full_count, rollup.full_tokens) == (1, 40, 0, 0)
    assert (rollup.unknown_token_calls, rollup.unleveled_tokens) == (4, 10)
    assert sum(rollup.error_types.values()) == 1


def test_a_minutes_recompute_reads_that_minute_and_the_hour_sums_its_slices(project, records):
    """A batch's pass recomputes the minutes its rows fall in, never the rest of the
    hour: a row stored in another minute since is not counted until that minute is
    recomputed, and the other minutes' figures stay in the hour's sum."""
    hour = hour_of(records.now) - timedelta(hours=2)
    first, second = hour + timedelta(minutes=5, seconds=10), hour + timedelta(minutes=41, seconds=59)
    outcome = store(project, [records.tool_result(tool="a", at=first, duration_ms=4.0),
                              records.tool_result(tool="a", at=second, duration_ms=1200.0, success=False,
                                                  result={"error_type": "timeout"})])
    assert outcome.tool_minutes == {minute_of(first), minute_of(second)}
    tasks.tool_rollups_refresh(project.pk, [], sorted(m.isoformat() for m in outcome.tool_minutes))
    slices = {row.minute: row.calls for row in ToolMinuteRollup.objects.filter(tool_name="a")}
    assert slices == {minute_of(first): 1, minute_of(second): 1}
    store(project, [records.tool_result(tool="a", at=second + timedelta(seconds=-30))])  # not yet recomputed
    store(project, [records.tool_result(tool="b", at=first)])
    tasks.tool_rollups_refresh(project.pk, [], [minute_of(first).isoformat()])
    rollups = {row.tool_name: row for row in ToolHourlyRollup.objects.all()}
    assert (rollups["a"].calls, rollups["a"].errors, rollups["a"].timeouts, rollups["b"].calls) == (2, 1, 1, 1)
    assert rollups["a"].error_types == {"timeout": 1} and rollups["a"].duration_sum_ms == 1204.0
    assert rollups["a"].latency_histogram == histogram_of([4.0, 1200.0])
    tasks.tool_rollups_refresh(project.pk, [], [minute_of(second).isoformat()])
    assert ToolHourlyRollup.objects.get(tool_name="a").calls == 3


def test_an_hours_recompute_writes_a_slice_for_every_minute_with_rows(project, records):
    """The sweep, a repricing and notes from before the slices name whole hours."""
    hour = hour_of(records.now) - timedelta(hours=5)
    store(project, [records.tool_result(tool="a", at=hour + timedelta(minutes=m, seconds=m)) for m in (0, 7, 7, 59)])
    store(project, [records.tool_result(tool="a", at=hour + timedelta(hours=1))])  # the next hour: not read
    assert tasks.tool_rollups_refresh(project.pk, [hour.isoformat()]) == 1
    slices = dict(ToolMinuteRollup.objects.filter(tool_name="a").values_list("minute", "calls"))
    assert ToolMinuteRollup.objects.filter(tool_name=rollups.MINUTE_MARK).count() == 60  # each minute's mark
    assert slices == {hour: 1, hour + timedelta(minutes=7): 2, hour + timedelta(minutes=59): 1}
    assert list(ToolHourlyRollup.objects.values_list("hour", "calls")) == [(hour, 4)]
    ToolExecution.objects.all().delete()
    tasks.tool_rollups_refresh(project.pk, [hour.isoformat()])
    assert not ToolMinuteRollup.objects.exclude(tool_name=rollups.MINUTE_MARK).exists()
    assert not ToolHourlyRollup.objects.exists()


# --- links --------------------------------------------------------------------------------

def test_it_links_tool_executions_and_spans_by_tool_call_id(project, records):
    store(project, [records.tool_result(result={"tool_call_id": "call_42"})])
    linked = span(project, tool_name="query_sales", tool_call_id="call_42")
    first = tasks.links_refresh(project.pk)
    execution = ToolExecution.objects.get()
    assert execution.linked_span == linked and execution.trace_id == "a" * 32
    assert Span.objects.get().conversation == execution.conversation
    again = tasks.links_refresh(project.pk)
    assert first["tool_executions"] == 1 and again["tool_executions"] == 0 and again["spans"] == 0


def test_it_links_spans_to_conversations_by_attribute_and_by_trace(project, records):
    span(project, span_id="1" * 16, attributes={"gen_ai.conversation.id": "from-span"})
    span(project, span_id="2" * 16, name="http")  # same trace, no attributes
    span(project, trace="c" * 32, span_id="3" * 16, attributes={"session.id": "sess-9"})
    tasks.links_refresh(project.pk)
    by_span = {s.span_id: s.conversation.external_id for s in Span.objects.select_related("conversation")}
    assert by_span == {"1" * 16: "from-span", "2" * 16: "from-span", "3" * 16: "sess-9"}
    conversation = Conversation.objects.get(external_id="from-span")
    assert conversation.totals_updated_at is not None  # totals refreshed for span-born conversations
    before = Conversation.objects.count()
    tasks.links_refresh(project.pk)
    assert Conversation.objects.count() == before


def test_it_never_links_across_projects(project, other_project, records):
    store(project, [records.tool_result(result={"tool_call_id": "call_shared"})])
    span(other_project, tool_name="t", tool_call_id="call_shared", attributes={"gen_ai.conversation.id": "conv-1"})
    tasks.links_refresh(project.pk)
    tasks.links_refresh(other_project.pk)
    assert ToolExecution.objects.get().linked_span is None
    assert Span.objects.get().conversation.project == other_project


# --- retention ------------------------------------------------------------------------------

def test_it_purges_past_retention_and_nothing_more_on_a_second_run(project, records, settings, _test_settings):
    from dashboard.observatory.services import artifact_store
    import hashlib
    import io

    old = datetime.now(timezone.utc) - timedelta(days=400)
    outcome = store(project, [records.message(conversation="old", at=old), records.message(conversation="new"),
                              records.tool_result(conversation="old", at=old),
                              records.tool_result(conversation="new")])
    tasks.conversation_totals_refresh(list(Conversation.objects.values_list("pk", flat=True)))
    tasks.tool_rollups_refresh(project.pk, [], sorted(m.isoformat() for m in outcome.tool_minutes))
    assert ToolMinuteRollup.objects.filter(tool_name="query_sales").count() == ToolHourlyRollup.objects.count() == 2
    span(project, span_id="1" * 16, start=old)
    span(project, span_id="2" * 16)
    data = b"old bytes"
    outcome = artifact_store(project=project, artifact_id="artifact_" + "0" * 16, stream=io.BytesIO(data),
                             sha256=hashlib.sha256(data).hexdigest(), content_type="text/plain", max_bytes=100)
    Artifact.objects.filter(pk=outcome.artifact.pk).update(expires_at=old)
    first = retention_purge(project=project)
    assert (first.spans, first.conversations, first.artifacts) == (1, 1, 1)
    assert list(Conversation.objects.values_list("external_id", flat=True)) == ["new"]
    assert Message.objects.count() == 1 and Span.objects.count() == 1
    assert set(ToolMinuteRollup.objects.values_list("minute", flat=True)) == {minute_of(records.now)}
    assert list(ToolHourlyRollup.objects.values_list("hour", flat=True)) == [hour_of(records.now)]
    assert [p for p in _test_settings.rglob("*") if p.is_file()] == []
    second = retention_purge(project=project)
    assert (second.spans, second.records, second.conversations, second.artifacts) == (0, 0, 0, 0)


def test_it_runs_the_beat_tasks_over_all_projects(project, records):
    store(project, [records.tool_result()])
    assert tasks.rollup_recent_hours(hours_back=3) == 1
    assert tasks.rollup_recent_hours(hours_back=3) == 1
    assert tasks.purge_expired() == {"span_partitions": 0, "spans": 0, "records": 0, "conversations": 0, "artifacts": 0, "login_throttles": 0}


def test_it_never_overwrites_rollups_with_those_of_a_pass_that_began_earlier(project, records, monkeypatch):
    """Two drainers recompute one minute; the one that began reading first finishes
    last. Its figures are older than what is stored, so it writes nothing."""
    outcome = store(project, [records.tool_result(tool="a")])
    minutes = sorted(m.isoformat() for m in outcome.tool_minutes)
    began = datetime.now(timezone.utc) - timedelta(seconds=5)  # the slow pass began reading here
    store(project, [records.tool_result(tool="a")])
    tasks.tool_rollups_refresh(project.pk, [], minutes)  # the fast pass, begun later, saw both rows
    assert ToolHourlyRollup.objects.get().calls == 2
    real_now = rollups.database_now
    monkeypatch.setattr(rollups, "database_now", lambda: began)  # the clock a pass stamps its start by
    ToolExecution.objects.filter(pk=ToolExecution.objects.order_by("-pk")[0].pk).delete()  # what the slow pass read
    tasks.tool_rollups_refresh(project.pk, [], minutes)
    monkeypatch.setattr(rollups, "database_now", real_now)
    assert ToolHourlyRollup.objects.get().calls == 2  # the stale figures were not written


def test_a_pass_that_found_a_minute_empty_still_wins_over_one_begun_earlier(project, records, monkeypatch):
    """A derived call gives way to its record (deleted); the pass after that finds the
    minute empty. A pass begun before, which read the deleted row, finishes last: the
    minute's mark says it is stale, so it writes nothing."""
    at = records.now - timedelta(hours=2)
    store(project, [records.tool_result(tool="a", at=at)])
    minute = [minute_of(at).isoformat()]
    began = datetime.now(timezone.utc) - timedelta(seconds=5)  # the slow pass began reading here
    ToolExecution.objects.all().delete()  # the row is gone before the fast pass reads
    tasks.tool_rollups_refresh(project.pk, [], minute)  # the fast pass, begun later: nothing in the minute
    assert not ToolHourlyRollup.objects.exists()
    store(project, [records.tool_result(tool="a", at=at)])  # what the slow pass read
    real_now = rollups.database_now
    monkeypatch.setattr(rollups, "database_now", lambda: began)  # the clock a pass stamps its start by
    tasks.tool_rollups_refresh(project.pk, [], minute)
    monkeypatch.setattr(rollups, "database_now", real_now)
    assert not ToolHourlyRollup.objects.exists()  # its stale figures were not written


def test_it_links_a_scope_larger_than_a_chunk_like_one_chunk(project, records, monkeypatch):

    outcome = store(project, [records.tool_result(conversation="c", result={"tool_call_id": f"call_{i}"})
                              for i in range(5)])
    for index in range(5):
        span(project, span_id=f"{index + 1:016x}", tool_name="t", tool_call_id=f"call_{index}")
    monkeypatch.setattr(links, "LINK_CHUNK", 2)
    counts = links.links_refresh(project_id=project.pk, conversation_ids=sorted(outcome.conversation_ids))
    assert counts["tool_executions"] == 5 and counts["spans"] == 5
    assert not ToolExecution.objects.filter(linked_span=None).exists()
    assert set(Span.objects.values_list("conversation__external_id", flat=True)) == {"c"}


def test_the_beat_holds_the_drain_lock_a_step_at_a_time(project, records, monkeypatch):
    """On SQLite the hourly job takes the drainers' lock for each step (the links, an
    hour of rollups, a step of slices), never across steps: the outbox drains between
    them. Held for the whole job, the hour-long soak's last notes waited minutes."""
    import contextlib



    at = minute_of(records.now)
    store(project, [records.tool_result(conversation=f"c{n}", at=at - timedelta(hours=n)) for n in range(3)])
    store(project, [records.tool_result(at=datetime.now(timezone.utc) - timedelta(minutes=m)) for m in (5, 25, 45)])
    held, steps = [], []

    @contextlib.contextmanager
    def counted(*, wait=True):
        assert not held, "a step began inside another"
        held.append(True)
        steps.append(1)
        try:
            yield True
        finally:
            held.pop()

    monkeypatch.setattr(schedule, "drain_exclusive", counted)
    tasks.rollup_recent_hours(hours_back=3)
    hours = len(rollups.hours_with_rows(project_id=project.pk, since=datetime.now(timezone.utc) - timedelta(hours=3)))
    assert len(steps) >= 1 + hours + 3  # the links, each hour, the slices' steps (the conversations of 3 ten-minute spans)
