"""The record models (the dashboard's ingest schema) and parse_record's versioning."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from pipeline import (
    SCHEMA_VERSION,
    CompressionMode,
    CompressionRecord,
    CompressionResult,
    IngestResponse,
    MessageRecord,
    RecordSchemaError,
    RoundRecord,
    SkillActivationRecord,
    ToolResultRecord,
    parse_record,
    register_migration,
)
from pipeline import _records

NOW = "2025-02-06T10:00:00+00:00"


def tool_result(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "type": "tool_result",
        "conversation_id": "conv-1",
        "round_id": "r1",
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "span_id": "b7ad6b7169203331",
        "tool_name": "query_sales",
        "parameters": {"region": "north"},
        "result": {"tool_call_id": "toolu_01", "observation": "3 rows", "success": True},
        "renderings": [{"level": "brief", "observation": "3 rows", "tokens": 2}],
        "occurred_at": NOW,
    }
    data.update(overrides)
    return data


def message(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "type": "message",
        "conversation_id": "conv-1",
        "index": 0,
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [{"id": "toolu_01", "name": "query_sales", "args": {}}],
    }
    data.update(overrides)
    return data


def round_(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "type": "round",
        "conversation_id": "conv-1",
        "round_id": "r1",
        "index": 0,
        "user_message": "上个月华北区销售额是多少？",
        "thoughts": ["query sales"],
        "context_tokens": 1200,
        "context_window": 200_000,
        "compression_threshold": 0.8,
        "started_at": NOW,
        "ended_at": NOW,
    }
    data.update(overrides)
    return data


def compression(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "type": "compression",
        "conversation_id": "conv-1",
        "result": {
            "mode": "truncate",
            "target_tokens": 100,
            "tokens_before": 300,
            "tokens_after": 90,
            "messages_before": 10,
            "messages_after": 4,
            "target_met": True,
        },
    }
    data.update(overrides)
    return data


def skill(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "type": "skill_activation",
        "conversation_id": "conv-1",
        "skill_name": "sales-analysis",
        "activation_id": "act-1",
        "load_level": 2,
        "chain": ["sales-analysis"],
        "tokens_loaded": 420,
    }
    data.update(overrides)
    return data


BUILDERS = {
    "tool_result": (tool_result, ToolResultRecord),
    "message": (message, MessageRecord),
    "round": (round_, RoundRecord),
    "compression": (compression, CompressionRecord),
    "skill_activation": (skill, SkillActivationRecord),
}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_it_parses_a_valid_record_of_each_type(kind: str) -> None:
    build, model = BUILDERS[kind]
    record = parse_record(build())
    assert isinstance(record, model)
    assert record.schema_version == SCHEMA_VERSION
    assert isinstance(record.record_id, uuid.UUID)
    # What the exporter sends is what the dashboard reads back.
    again = parse_record(record.model_dump(mode="json"))
    assert again == record


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_it_refuses_extra_fields(kind: str) -> None:
    build, _ = BUILDERS[kind]
    with pytest.raises(RecordSchemaError, match="surprise"):
        parse_record(build(surprise=1))


@pytest.mark.parametrize("kind", sorted(BUILDERS))
@pytest.mark.parametrize(
    "bad_id",
    ["", "conv\n1", "conv\x00", "conv\x1b[31m", "conv\x7f", "x" * 201, "ok\n"],
)
def test_it_refuses_bad_conversation_ids(kind: str, bad_id: str) -> None:
    build, _ = BUILDERS[kind]
    with pytest.raises(RecordSchemaError, match="conversation_id"):
        parse_record(build(conversation_id=bad_id))


@pytest.mark.parametrize("kind", ["tool_result", "round", "compression", "skill_activation"])
@pytest.mark.parametrize("bad", ["0AF7651916CD43DD8448EB211C80319C", "abc", "g" * 32, "0" * 33, 12])
def test_it_refuses_a_trace_id_that_is_not_32_lowercase_hex(kind: str, bad: Any) -> None:
    build, _ = BUILDERS[kind]
    with pytest.raises(RecordSchemaError, match="trace_id"):
        parse_record(build(trace_id=bad))


@pytest.mark.parametrize("bad", ["B7AD6B7169203331", "b7ad", "z" * 16])
def test_it_refuses_a_bad_span_id(bad: str) -> None:
    with pytest.raises(RecordSchemaError, match="span_id"):
        parse_record(tool_result(span_id=bad))


@pytest.mark.parametrize(
    "build, field, size",
    [
        (message, "tool_calls", _records.MAX_TOOL_CALLS + 1),
        (round_, "thoughts", _records.MAX_THOUGHTS + 1),
        (skill, "chain", _records.MAX_CHAIN + 1),
        (skill, "resources", _records.MAX_RESOURCES + 1),
        (tool_result, "renderings", 4),
    ],
)
def test_it_refuses_oversized_lists(build: Any, field: str, size: int) -> None:
    items: dict[str, Any] = {
        "tool_calls": {"id": "t", "name": "n"},
        "thoughts": "thinking",
        "chain": "s",
        "resources": "r.md",
        "renderings": {"level": "brief", "observation": "x", "tokens": 1},
    }
    with pytest.raises(RecordSchemaError, match=field):
        parse_record(build(**{field: [items[field]] * size}))


def test_it_refuses_the_same_level_rendered_twice() -> None:
    rendering = {"level": "full", "observation": "x", "tokens": 1}
    with pytest.raises(RecordSchemaError, match="level twice"):
        parse_record(tool_result(renderings=[rendering, rendering]))


@pytest.mark.parametrize(
    "build, field",
    [
        (message, "occurred_at"),
        (tool_result, "occurred_at"),
        (round_, "started_at"),
        (round_, "ended_at"),
        (skill, "occurred_at"),
    ],
)
def test_it_refuses_naive_datetimes(build: Any, field: str) -> None:
    with pytest.raises(RecordSchemaError, match="timezone"):
        parse_record(build(**{field: "2025-02-06T10:00:00"}))
    with pytest.raises(ValidationError):
        model = BUILDERS[build()["type"]][1]
        model.model_validate(build(**{field: datetime(2025, 2, 6, 10, 0)}))


def test_it_accepts_aware_datetimes_in_other_zones() -> None:
    record = parse_record(round_(started_at="2025-02-06T18:00:00+08:00"))
    assert record.started_at == datetime(2025, 2, 6, 10, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "data, error",
    [
        (None, "JSON object"),
        ([message()], "JSON object"),
        ("message", "JSON object"),
        (message(type="nope"), "unknown record type"),
        ({"conversation_id": "c"}, "unknown record type"),
        (message(schema_version="1"), "integer"),
        (message(schema_version=True), "integer"),
        (message(schema_version=1.0), "integer"),
        (message(record_id="not-a-uuid"), "record_id"),
        (message(index=-1), "index"),
        (message(role="root"), "role"),
        (compression(result={"mode": "zip"}), "result"),
    ],
)
def test_it_refuses_malformed_records_with_a_clear_error(data: Any, error: str) -> None:
    with pytest.raises(RecordSchemaError, match=error):
        parse_record(data)


def test_it_refuses_schema_version_0_without_a_migration() -> None:
    with pytest.raises(RecordSchemaError, match="schema_version 0 is no longer supported; send version 1"):
        parse_record(message(schema_version=0))


@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, 10**30])
def test_it_refuses_a_future_schema_version(version: int) -> None:
    with pytest.raises(RecordSchemaError, match="newer than this reader supports"):
        parse_record(message(schema_version=version))


@pytest.fixture
def restore_migrations() -> Any:
    saved = dict(_records.MIGRATIONS)
    yield _records.MIGRATIONS
    _records.MIGRATIONS.clear()
    _records.MIGRATIONS.update(saved)


def test_it_migrates_an_older_record_through_a_registered_migration(restore_migrations: Any) -> None:
    @register_migration(0)
    def rename_text_to_content(data: dict[str, Any]) -> dict[str, Any]:
        data["content"] = data.pop("text")
        return data

    old = message(schema_version=0)
    old["text"] = old.pop("content")
    record = parse_record(old)
    assert isinstance(record, MessageRecord)
    assert record.content == "Let me look." and record.schema_version == SCHEMA_VERSION
    assert "text" in old  # the caller's dict is not modified


def test_it_reports_a_migration_that_fails(restore_migrations: Any) -> None:
    register_migration(0)(lambda data: data["missing"])
    with pytest.raises(RecordSchemaError, match="could not be migrated"):
        parse_record(message(schema_version=0))
    register_migration(0)(lambda data: ["not", "a", "dict"])
    with pytest.raises(RecordSchemaError, match="did not return an object"):
        parse_record(message(schema_version=0))


def test_it_refuses_to_register_a_migration_from_the_current_version(restore_migrations: Any) -> None:
    with pytest.raises(ValueError):
        register_migration(SCHEMA_VERSION)(lambda data: data)
    assert SCHEMA_VERSION not in restore_migrations


def test_it_leaves_the_migration_registry_as_it_found_it() -> None:
    assert 0 not in _records.MIGRATIONS


def test_it_refuses_hostile_deeply_nested_parameters() -> None:
    nested: Any = "x"
    for _ in range(5_000):
        nested = [nested]
    with pytest.raises(RecordSchemaError, match="parameters: .*nested deeper"):
        parse_record(tool_result(parameters={"a": nested}))
    with pytest.raises(RecordSchemaError, match="args"):
        parse_record(message(tool_calls=[{"id": "t", "name": "n", "args": {"a": nested}}]))
    shallow = {"a": [{"b": [1, 2]}]}
    assert parse_record(tool_result(parameters=shallow)).parameters == shallow


def test_it_reads_the_ingest_response_and_ignores_unknown_keys() -> None:
    response = IngestResponse.model_validate_json(
        b'{"accepted": 2, "duplicates": 1, "rejected": [{"index": 3, "error": "bad"}], "newer": true}'
    )
    assert (response.accepted, response.duplicates, response.rejected[0].index) == (2, 1, 3)
    with pytest.raises(ValidationError):
        IngestResponse.model_validate({"accepted": -1})


def test_it_builds_records_with_typed_enums() -> None:
    record = CompressionRecord.model_validate(compression())
    assert isinstance(record.result, CompressionResult) and record.result.mode is CompressionMode.TRUNCATE


# --- numbers every column downstream can hold ----------------------------------------

@pytest.mark.parametrize("build, path, value", [
    (round_, ("index",), 2**31),
    (round_, ("input_tokens",), 2**63),
    (message, ("tokens",), 10**20),
    (tool_result, ("result", "retry_count"), 1_001),
    (tool_result, ("result", "data_size_bytes"), 2**64),
    (tool_result, ("result", "duration_ms"), 1e308),
    (tool_result, ("result", "duration_ms"), float("inf")),
    (tool_result, ("result", "duration_ms"), float("nan")),
    (compression, ("result", "messages_after"), 255_927_610_201),
    (compression, ("result", "duration_ms"), float("inf")),
    (skill, ("tokens_loaded",), 2**40),
])
def test_it_refuses_numbers_past_what_the_dashboard_can_store(build: Any, path: tuple[str, ...], value: Any) -> None:
    data = build()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(RecordSchemaError):
        parse_record(data)


def test_it_accepts_numbers_at_the_bounds() -> None:
    data = round_(index=2**31 - 1, input_tokens=2**31 - 1)
    assert parse_record(data).index == 2**31 - 1
