"""The bulk writes the passes share (dashboard/observatory/rows.py), on the real database:
values go through the same adapters as Django's own saving (datetimes, JSON, None), so
what is read back through the ORM is what was written."""

from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from types import SimpleNamespace

import pytest

from dashboard.observatory.models import Conversation, ConversationMinute, ToolExecution
from dashboard.observatory.rows import update_rows, upsert_rows
from tests.dashboard.observatory.helpers import store

pytestmark = pytest.mark.django_db

MINUTE = datetime(2026, 11, 29, 10, 7, tzinfo=dt_timezone.utc)


def _slice(conversation: Conversation, minute: datetime, calls: int, model: str = "") -> SimpleNamespace:
    return SimpleNamespace(conversation_id=conversation.pk, minute=minute, tool_calls=calls, tool_errors=calls // 2,
                           retries=1, tool_model=model, updated_at=minute + timedelta(seconds=30))


def _slices(conversation: Conversation) -> dict[datetime, tuple]:
    return {row[0]: row[1:] for row in ConversationMinute.objects.filter(conversation=conversation)
            .values_list("minute", "tool_calls", "tool_errors", "retries", "tool_model", "updated_at")}


def test_upsert_rows_inserts_new_keys_and_updates_the_others_fields_on_a_known_key(project):
    conversation = Conversation.objects.create(project=project, external_id="c1")
    fields = ["conversation", "minute", "tool_calls", "tool_errors", "retries", "tool_model", "updated_at"]
    upsert_rows(ConversationMinute, [_slice(conversation, MINUTE, 4, "gpt-4o")], ["conversation", "minute"], fields)
    later = MINUTE + timedelta(minutes=1)
    upsert_rows(ConversationMinute, [_slice(conversation, MINUTE, 7), _slice(conversation, later, 2, "模型")],
                ["conversation", "minute"], fields)

    assert _slices(conversation) == {
        MINUTE: (7, 3, 1, "", MINUTE + timedelta(seconds=30)),  # the same key: updated, not a second row
        later: (2, 1, 1, "模型", later + timedelta(seconds=30)),
    }
    assert ConversationMinute.objects.count() == 2


def test_upsert_rows_of_nothing_writes_nothing(project, django_assert_num_queries):
    with django_assert_num_queries(0):
        upsert_rows(ConversationMinute, [], ["conversation", "minute"], ["conversation", "minute"])


def test_update_rows_writes_json_datetimes_and_nulls_as_the_orm_reads_them(project, records):
    store(project, [records.tool_result(conversation="c1")])
    execution = ToolExecution.objects.get()
    parameters = {"q": "订单 <b>", "nested": [1, None, {"x": 2.5}]}
    update_rows(ToolExecution, [SimpleNamespace(pk=execution.pk, parameters=parameters, round_id="r9",
                                                linked_span_id=None)], ["parameters", "round_id", "linked_span"])
    conversation = execution.conversation
    moment = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt_timezone.utc)
    conversation.last_activity_at, conversation.title, conversation.cost_pico_usd = moment, "标题 \"x\"", None
    update_rows(Conversation, [conversation], ["last_activity_at", "title", "cost_pico_usd"])

    execution.refresh_from_db()
    conversation.refresh_from_db()
    assert (execution.parameters, execution.round_id, execution.linked_span_id) == (parameters, "r9", None)
    assert (conversation.last_activity_at, conversation.title, conversation.cost_pico_usd) == (
        moment, "标题 \"x\"", None)
