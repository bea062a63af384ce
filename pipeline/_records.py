"""The records an agent sends to the dashboard (``POST /api/v1/records``).

These pydantic models are the ingest API's schemas: the dashboard imports them, so
there is one schema per record for both sides. Each record carries a client-made
``record_id`` (UUID) that makes the retry of a batch harmless, and a
``schema_version``; ``parse_record`` migrates older versions or refuses them clearly.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Annotated, Any, Callable, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from ._bounds import MAX_COUNT, MAX_DURATION_MS
from ._compression_types import CompressionResult
from ._levels import OutputLevel
from ._models import ToolExecutionResult

SCHEMA_VERSION = 1

# Ids made by agents or users: printable, bounded, no control characters.
Identifier = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
TraceId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
SpanId = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]
Role = Literal["system", "user", "assistant", "tool"]

# Bounds on lists a record may carry: a record is one event, not a dump. The ingest
# body limit bounds the bytes; these bound the row counts one record can fan out to.
MAX_TOOL_CALLS = 128
MAX_THOUGHTS = 1_000
MAX_CHAIN = 64
MAX_RESOURCES = 1_000
MAX_JSON_DEPTH = 32  # free-form JSON (tool parameters) nested deeper is hostile, not data


def _limit_depth(value: dict[str, Any]) -> dict[str, Any]:
    # Iterative, so a hostile nesting cannot exhaust the stack while being checked.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((child, depth + 1) for child in item)
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_limit_depth)]


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _require_aware(value: Optional[datetime], name: str) -> Optional[datetime]:
    # A naive datetime is ambiguous across agents in different time zones.
    if value is not None and value.tzinfo is None:
        raise ValueError(f"{name} needs a timezone (use UTC)")
    return value


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")

    record_id: uuid.UUID = Field(default_factory=uuid.uuid4)
    schema_version: Literal[1] = SCHEMA_VERSION
    conversation_id: Identifier
    occurred_at: datetime = Field(default_factory=_now)

    @field_validator("occurred_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        _require_aware(value, "occurred_at")
        return value


class LevelRendering(BaseModel):
    """The observation of one result rendered at one output level."""

    model_config = ConfigDict(extra="forbid")

    level: OutputLevel
    observation: str
    tokens: int = Field(ge=0, le=MAX_COUNT)


class ToolResultRecord(_Record):
    type: Literal["tool_result"] = "tool_result"
    round_id: Optional[Identifier] = None
    trace_id: Optional[TraceId] = None
    span_id: Optional[SpanId] = None
    tool_name: Identifier
    tool_version: str = Field(default="1.0.0", max_length=64)
    parameters: JsonObject = Field(default_factory=dict)
    model: Optional[Identifier] = None
    result: ToolExecutionResult
    # The same raw data at BRIEF, STANDARD and FULL, so the dashboard can compare.
    renderings: list[LevelRendering] = Field(default_factory=list, max_length=3)

    @field_validator("renderings")
    @classmethod
    def _one_per_level(cls, value: list[LevelRendering]) -> list[LevelRendering]:
        levels = [r.level for r in value]
        if len(set(levels)) != len(levels):
            raise ValueError("renderings has a level twice")
        return value


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: Identifier
    name: Identifier
    args: JsonObject = Field(default_factory=dict)


class MessageRecord(_Record):
    type: Literal["message"] = "message"
    round_id: Optional[Identifier] = None
    index: int = Field(ge=0, le=MAX_COUNT)  # position in the conversation
    role: Role
    content: str
    name: Optional[str] = Field(default=None, max_length=200)
    tool_calls: list[ToolCall] = Field(default_factory=list, max_length=MAX_TOOL_CALLS)
    tool_call_id: Optional[Identifier] = None
    is_meta: bool = False  # hidden from the user (skill injections)
    tokens: Optional[int] = Field(default=None, ge=0, le=MAX_COUNT)


class RoundRecord(_Record):
    type: Literal["round"] = "round"
    round_id: Identifier
    index: int = Field(ge=0, le=MAX_COUNT)
    trace_id: Optional[TraceId] = None
    model: Optional[Identifier] = None
    user_id: Optional[Identifier] = None
    user_message: str = ""
    thoughts: list[str] = Field(default_factory=list, max_length=MAX_THOUGHTS)
    final_answer: Optional[str] = None
    status: Literal["ok", "error"] = "ok"
    context_tokens: int = Field(default=0, ge=0, le=MAX_COUNT)  # context size sent to the model this round
    context_window: Optional[int] = Field(default=None, gt=0, le=MAX_COUNT)
    compression_threshold: Optional[float] = Field(default=None, gt=0, le=1)
    input_tokens: int = Field(default=0, ge=0, le=MAX_COUNT)
    output_tokens: int = Field(default=0, ge=0, le=MAX_COUNT)
    started_at: Optional[datetime] = None
    ended_at: Optional[datetime] = None

    @field_validator("started_at", "ended_at")
    @classmethod
    def _aware_times(cls, value: Optional[datetime], info: Any) -> Optional[datetime]:
        return _require_aware(value, info.field_name)


class CompressionRecord(_Record):
    type: Literal["compression"] = "compression"
    round_id: Optional[Identifier] = None
    trace_id: Optional[TraceId] = None
    span_id: Optional[SpanId] = None
    result: CompressionResult


class SkillActivationRecord(_Record):
    type: Literal["skill_activation"] = "skill_activation"
    round_id: Optional[Identifier] = None
    trace_id: Optional[TraceId] = None
    span_id: Optional[SpanId] = None
    skill_name: Identifier
    activation_id: Identifier
    load_level: Literal[1, 2, 3]
    depth: int = Field(default=0, ge=0, le=MAX_COUNT)
    chain: list[Identifier] = Field(default_factory=list, max_length=MAX_CHAIN)
    tokens_loaded: int = Field(default=0, ge=0, le=MAX_COUNT)
    # resource names relative to the skill
    resources: list[str] = Field(default_factory=list, max_length=MAX_RESOURCES)
    success: bool = True
    error: Optional[str] = None
    duration_ms: float = Field(default=0.0, ge=0, le=MAX_DURATION_MS)


Record = Annotated[
    Union[ToolResultRecord, MessageRecord, RoundRecord, CompressionRecord, SkillActivationRecord],
    Field(discriminator="type"),
]
RECORD_TYPES: dict[str, type[_Record]] = {
    "tool_result": ToolResultRecord,
    "message": MessageRecord,
    "round": RoundRecord,
    "compression": CompressionRecord,
    "skill_activation": SkillActivationRecord,
}
_record_adapter: TypeAdapter[Any] = TypeAdapter(Record)

# schema_version -> function that lifts a record dict of that version by one version.
Migration = Callable[[dict[str, Any]], dict[str, Any]]
MIGRATIONS: dict[int, Migration] = {}


class RecordSchemaError(ValueError):
    """A record that cannot be read: wrong shape, unknown type or unsupported version."""


def register_migration(from_version: int) -> Callable[[Migration], Migration]:
    """Register the function that lifts a record dict from ``from_version`` to the next.

    When SCHEMA_VERSION moves to 2, the reader keeps accepting version 1 by
    registering ``@register_migration(1)``; a version with no registered step is
    refused with a message that says which version to send.
    """

    def register(migrate: Migration) -> Migration:
        if from_version >= SCHEMA_VERSION:
            raise ValueError(f"a migration must start below SCHEMA_VERSION ({SCHEMA_VERSION})")
        MIGRATIONS[from_version] = migrate
        return migrate

    return register


def _migrate(data: dict[str, Any], version: int) -> dict[str, Any]:
    while version < SCHEMA_VERSION:
        migrate = MIGRATIONS.get(version)
        if migrate is None:
            raise RecordSchemaError(
                f"schema_version {version} is no longer supported; send version {SCHEMA_VERSION}"
            )
        try:
            lifted = migrate(dict(data))
        except Exception as exc:  # a migration step is code we run on client data
            raise RecordSchemaError(
                f"schema_version {version} record could not be migrated: {str(exc)[:200]}"
            ) from None
        if not isinstance(lifted, dict):
            raise RecordSchemaError(f"migration from schema_version {version} did not return an object")
        version += 1
        data = {**lifted, "schema_version": version}
    return data


def parse_record(data: Any) -> Record:
    """Validate one record dict, migrating an older schema_version first."""
    if not isinstance(data, dict):
        raise RecordSchemaError("a record must be a JSON object")
    version = data.get("schema_version", SCHEMA_VERSION)
    if not isinstance(version, int) or isinstance(version, bool):
        raise RecordSchemaError("schema_version must be an integer")
    if version > SCHEMA_VERSION:
        raise RecordSchemaError(
            f"schema_version {version} is newer than this reader supports ({SCHEMA_VERSION})"
        )
    data = _migrate(data, version)
    if data.get("type") not in RECORD_TYPES:
        raise RecordSchemaError(
            f"unknown record type {str(data.get('type'))[:40]!r}; expected one of {sorted(RECORD_TYPES)}"
        )
    try:
        return _record_adapter.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"][1:]) or "record"
        raise RecordSchemaError(f"{where}: {first['msg']}") from None


class RejectedRecord(BaseModel):
    """One record of a batch the dashboard refused, by its position in the batch."""

    index: int = Field(ge=0, le=MAX_COUNT)
    error: str = Field(max_length=2_000)


class IngestResponse(BaseModel):
    """The dashboard's answer to ``POST /api/v1/records``.

    Shared so the exporter reads exactly what the ingest endpoint writes. Extra keys
    are ignored: a newer dashboard may say more than this reader knows.
    """

    accepted: int = Field(default=0, ge=0, le=MAX_COUNT)
    duplicates: int = Field(default=0, ge=0)  # record_ids already stored (a retried batch, le=MAX_COUNT)
    rejected: list[RejectedRecord] = Field(default_factory=list)
