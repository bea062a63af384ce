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

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from ._compression_types import CompressionResult
from ._levels import OutputLevel
from ._models import ToolExecutionResult

SCHEMA_VERSION = 1

# Ids made by agents or users: printable, bounded, no control characters.
Identifier = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
TraceId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
SpanId = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]
Role = Literal["system", "user", "assistant", "tool"]


def _now() -> datetime:
    return datetime.now(timezone.utc)


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")

    record_id: uuid.UUID = Field(default_factory=uuid.uuid4)
    schema_version: Literal[1] = SCHEMA_VERSION
    conversation_id: Identifier
    occurred_at: datetime = Field(default_factory=_now)

    @field_validator("occurred_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("occurred_at needs a timezone (use UTC)")
        return value


class LevelRendering(BaseModel):
    """The observation of one result rendered at one output level."""

    model_config = ConfigDict(extra="forbid")

    level: OutputLevel
    observation: str
    tokens: int = Field(ge=0)


class ToolResultRecord(_Record):
    type: Literal["tool_result"] = "tool_result"
    round_id: Optional[Identifier] = None
    trace_id: Optional[TraceId] = None
    span_id: Optional[SpanId] = None
    tool_name: Identifier
    tool_version: str = Field(default="1.0.0", max_length=64)
    parameters: dict[str, Any] = Field(default_factory=dict)
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
    args: dict[str, Any] = Field(default_factory=dict)


class MessageRecord(_Record):
    type: Literal["message"] = "message"
    round_id: Optional[Identifier] = None
    index: int = Field(ge=0)  # position in the conversation
    role: Role
    content: str
    name: Optional[str] = Field(default=None, max_length=200)
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: Optional[Identifier] = None
    is_meta: bool = False  # hidden from the user (skill injections)
    tokens: Optional[int] = Field(default=None, ge=0)


class RoundRecord(_Record):
    type: Literal["round"] = "round"
    round_id: Identifier
    index: int = Field(ge=0)
    trace_id: Optional[TraceId] = None
    model: Optional[Identifier] = None
    user_id: Optional[Identifier] = None
    user_message: str = ""
    thoughts: list[str] = Field(default_factory=list)
    final_answer: Optional[str] = None
    status: Literal["ok", "error"] = "ok"
    context_tokens: int = Field(default=0, ge=0)  # context size sent to the model this round
    context_window: Optional[int] = Field(default=None, gt=0)
    compression_threshold: Optional[float] = Field(default=None, gt=0, le=1)
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    started_at: Optional[datetime] = None
    ended_at: Optional[datetime] = None


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
    depth: int = Field(default=0, ge=0)
    chain: list[Identifier] = Field(default_factory=list)
    tokens_loaded: int = Field(default=0, ge=0)
    resources: list[str] = Field(default_factory=list)  # resource names relative to the skill
    success: bool = True
    error: Optional[str] = None
    duration_ms: float = Field(default=0.0, ge=0)


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
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


class RecordSchemaError(ValueError):
    """A record that cannot be read: wrong shape, unknown type or unsupported version."""


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
    while version < SCHEMA_VERSION:
        migrate = MIGRATIONS.get(version)
        if migrate is None:
            raise RecordSchemaError(
                f"schema_version {version} is no longer supported; send version {SCHEMA_VERSION}"
            )
        data = {**migrate(dict(data)), "schema_version": version + 1}
        version += 1
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
