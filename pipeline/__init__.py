"""The BA-Agent information pipeline: the tool protocol, context compression,
skills, metrics and telemetry that an agent imports.

Pure Python; no Django anywhere inside. Everything public is re-exported here from
private modules and listed in ``__all__``.
"""

from ._compression_types import (
    CompressionMode,
    CompressionResult,
    CompressionSummary,
    MessageAction,
    MessageChange,
    MessagePriority,
)
from ._levels import OutputLevel
from ._models import ToolCachePolicy, ToolExecutionResult, ToolInvocationRequest
from ._records import (
    SCHEMA_VERSION,
    CompressionRecord,
    LevelRendering,
    MessageRecord,
    Record,
    RecordSchemaError,
    RoundRecord,
    SkillActivationRecord,
    ToolCall,
    ToolResultRecord,
    parse_record,
)

__all__ = [
    "SCHEMA_VERSION",
    "CompressionMode",
    "CompressionRecord",
    "CompressionResult",
    "CompressionSummary",
    "LevelRendering",
    "MessageAction",
    "MessageChange",
    "MessagePriority",
    "MessageRecord",
    "OutputLevel",
    "Record",
    "RecordSchemaError",
    "RoundRecord",
    "SkillActivationRecord",
    "ToolCachePolicy",
    "ToolCall",
    "ToolExecutionResult",
    "ToolInvocationRequest",
    "ToolResultRecord",
    "parse_record",
]

# Each block below is owned by one part of the library; keep additions inside it.
# --- tools (levels, carriers, errors, retry, timeout, caches, artifacts, tokens, executor) ---
# --- context (compression), skills, metrics ---
# --- telemetry, record export, remote config ---
