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
from ._exceptions import (
    ArtifactError,
    ArtifactNotFound,
    CircularDependencyError,
    ConfigError,
    InvalidArtifactId,
    LockTimeoutError,
    PipelineError,
    RecordExportError,
    SkillError,
    ToolTimeoutError,
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
    "ArtifactError",
    "ArtifactNotFound",
    "CircularDependencyError",
    "ConfigError",
    "InvalidArtifactId",
    "LockTimeoutError",
    "PipelineError",
    "RecordExportError",
    "SkillError",
    "ToolTimeoutError",
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
from ._levels import format_observation, resolve_output_level, summarize_data, to_json
from ._carriers import ContentBlock, ContentBlockType, MessageType, StandardMessage
from ._errors import ToolError, ToolErrorResponse, ToolErrorType, classify_exception
from ._retry import ToolRetryPolicy
from ._timeout import InlineTimeoutHandler, ToolTimeoutHandler, WorkerLimitReached, get_timeout_handler
from ._executor import LazyRenderings, ToolExecutor, ToolSpec, pipeline_tool, render_levels

__all__ += [
    "ContentBlock",
    "ContentBlockType",
    "LazyRenderings",
    "MessageType",
    "StandardMessage",
    "ToolError",
    "ToolErrorResponse",
    "ToolErrorType",
    "ToolExecutor",
    "ToolRetryPolicy",
    "ToolSpec",
    "InlineTimeoutHandler",
    "ToolTimeoutHandler",
    "WorkerLimitReached",
    "classify_exception",
    "format_observation",
    "get_timeout_handler",
    "pipeline_tool",
    "render_levels",
    "resolve_output_level",
    "summarize_data",
    "to_json",
]
from ._artifacts import (
    ARTIFACT_ID_PATTERN,
    ARTIFACT_ID_RE,
    THRESHOLD_BYTES,
    ArtifactInfo,
    ArtifactStore,
    validate_artifact_id,
)
from ._cache import CacheStats, IdempotencyCache, SummaryCache, TTLCache
from ._tokens import (
    DynamicTokenCounter,
    EncoderConfig,
    ModelEncoderRegistry,
    ModelFamily,
    TokenEncoder,
    count_conversation_tokens,
    count_message_tokens,
    count_tokens,
    get_token_counter,
)

__all__ += [
    "ARTIFACT_ID_PATTERN",
    "ARTIFACT_ID_RE",
    "THRESHOLD_BYTES",
    "ArtifactInfo",
    "ArtifactStore",
    "CacheStats",
    "DynamicTokenCounter",
    "EncoderConfig",
    "IdempotencyCache",
    "ModelEncoderRegistry",
    "ModelFamily",
    "SummaryCache",
    "TTLCache",
    "TokenEncoder",
    "count_conversation_tokens",
    "count_message_tokens",
    "count_tokens",
    "get_token_counter",
    "validate_artifact_id",
]
# The design documents' own names for the tool side (docs/design-conformance.md).
from ._artifacts import open_store
from ._cache import get_idempotency_cache
from ._exceptions import TimeoutException
from ._executor import PipelineToolWrapper
from ._storage import DataFileManager, DataStorage
from ._threadsafe import ThreadSafeContainer, ThreadSafeMixin

__all__ += [
    "DataFileManager",
    "DataStorage",
    "PipelineToolWrapper",
    "ThreadSafeContainer",
    "ThreadSafeMixin",
    "TimeoutException",
    "get_idempotency_cache",
    "open_store",
]
# --- context (compression), skills, metrics ---
from ._compression import AdvancedContextManager, BasicContextManager, ContextCompressionConfig
from ._summarizers import ExtractiveSummarizer, LLMSummarizer, Summarizer

__all__ += [
    "AdvancedContextManager",
    "BasicContextManager",
    "ContextCompressionConfig",
    "ExtractiveSummarizer",
    "LLMSummarizer",
    "Summarizer",
]
from ._skill_activation import (
    ContextModifier,
    SkillActivationRequest,
    SkillActivationResult,
    SkillActivationStack,
    SkillActivator,
    SkillMessage,
)
from ._skill_models import SkillInstructions, SkillMetadata, SkillResource, validate_skill_name
from ._skills import SkillLoader

__all__ += [
    "ContextModifier",
    "SkillActivationRequest",
    "SkillActivationResult",
    "SkillActivationStack",
    "SkillActivator",
    "SkillInstructions",
    "SkillLoader",
    "SkillMessage",
    "SkillMetadata",
    "SkillResource",
    "validate_skill_name",
]
from ._injection import LockManager, MessageInjectionProtocol

__all__ += ["LockManager", "MessageInjectionProtocol"]
# --- context: the design documents' forms (docs/design-conformance.md) ---
from ._compression import ThreadSafeContextManager, as_summarizer
from ._context_state import CompressedMessages, MessageImportance, MessageWrapper
from ._conversation import ConversationRound, MultiRoundConversation
from ._injection import get_lock_manager
from ._llm_compressor import CompressionCostEstimate, ContextCompressionStrategy, LLMCompressor
from ._tokens import CONFIG_SEARCH_PATHS, discover_config_file

__all__ += [
    "CONFIG_SEARCH_PATHS",
    "CompressedMessages",
    "CompressionCostEstimate",
    "ContextCompressionStrategy",
    "ConversationRound",
    "LLMCompressor",
    "MessageImportance",
    "MessageWrapper",
    "MultiRoundConversation",
    "ThreadSafeContextManager",
    "as_summarizer",
    "discover_config_file",
    "get_lock_manager",
]
from ._metrics import (
    ConversationMetrics,
    MetricsCollector,
    ThreadSafeMetricsCollector,
    ToolMetrics,
    get_metrics_collector,
)

__all__ += [
    "ConversationMetrics",
    "MetricsCollector",
    "ThreadSafeMetricsCollector",
    "ToolMetrics",
    "get_metrics_collector",
]
# --- telemetry, record export, remote config ---
from ._delivery import DeliveryStats
from ._exporter import ExporterStats, RecordExporter, Transport, UrllibTransport, records_for_result
from ._global_observability import (
    configure_observability,
    execute_with_observability,
    get_observability_config,
    get_telemetry,
)
from ._observability import (
    ObservabilityConfig,
    SpanHandle,
    Telemetry,
    ToolResultHook,
    TraceSampling,
    configure_telemetry,
    hook_executor,
    parse_otlp_headers,
)
from ._span_export import SpanDeliveryProcessor
from ._records import IngestResponse, RejectedRecord, register_migration
from ._scores import ScoreRecord
from ._datasets import (
    DatasetError,
    DatasetItem,
    fetch_dataset,
    parse_dataset_line,
    read_dataset,
    send_dataset,
    write_dataset,
)
from ._remote_config import ConfigPayload, EffectiveConfig, RemoteConfig, RemoteConfigStats

__all__ += [
    "ConfigPayload",
    "DatasetError",
    "DatasetItem",
    "DeliveryStats",
    "EffectiveConfig",
    "ExporterStats",
    "IngestResponse",
    "ObservabilityConfig",
    "RecordExporter",
    "RejectedRecord",
    "RemoteConfig",
    "RemoteConfigStats",
    "ScoreRecord",
    "SpanDeliveryProcessor",
    "SpanHandle",
    "Telemetry",
    "ToolResultHook",
    "TraceSampling",
    "Transport",
    "UrllibTransport",
    "configure_observability",
    "configure_telemetry",
    "execute_with_observability",
    "fetch_dataset",
    "get_observability_config",
    "get_telemetry",
    "hook_executor",
    "parse_dataset_line",
    "parse_otlp_headers",
    "read_dataset",
    "records_for_result",
    "register_migration",
    "send_dataset",
    "write_dataset",
]
