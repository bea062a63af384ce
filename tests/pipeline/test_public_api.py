"""Pins the public API of the tool protocol (levels, models, carriers, errors, retry,
timeout, executor) and that the library never pulls in Django."""

import subprocess
import sys
from pathlib import Path

import pipeline

TOOL_PROTOCOL_MODULES = {
    "pipeline._levels",
    "pipeline._models",
    "pipeline._carriers",
    "pipeline._errors",
    "pipeline._retry",
    "pipeline._timeout",
    "pipeline._executor",
}

TOOL_PROTOCOL_API = {
    # _levels
    "OutputLevel",
    "format_observation",
    "resolve_output_level",
    "summarize_data",
    "to_json",
    # _models
    "ToolCachePolicy",
    "ToolExecutionResult",
    "ToolInvocationRequest",
    # _carriers
    "ContentBlock",
    "ContentBlockType",
    "MessageType",
    "StandardMessage",
    # _errors
    "ToolError",
    "ToolErrorResponse",
    "ToolErrorType",
    "classify_exception",
    # _retry
    "ToolRetryPolicy",
    # _timeout
    "InlineTimeoutHandler",
    "ToolTimeoutHandler",
    "WorkerLimitReached",
    "get_timeout_handler",
    # _executor
    "LazyRenderings",
    "PipelineToolWrapper",
    "ToolExecutor",
    "ToolSpec",
    "pipeline_tool",
    "render_levels",
}

# Artifacts, caches, the design's storage helpers and thread-safety helpers.
STORAGE_MODULES = {
    "pipeline._artifacts",
    "pipeline._cache",
    "pipeline._storage",
    "pipeline._threadsafe",
}

STORAGE_API = {
    # _artifacts
    "ARTIFACT_ID_PATTERN",
    "ARTIFACT_ID_RE",
    "THRESHOLD_BYTES",
    "ArtifactInfo",
    "ArtifactStore",
    "open_store",
    "validate_artifact_id",
    # _cache
    "CacheStats",
    "IdempotencyCache",
    "SummaryCache",
    "TTLCache",
    "get_idempotency_cache",
    # _storage
    "DataFileManager",
    "DataStorage",
    # _threadsafe
    "ThreadSafeContainer",
    "ThreadSafeMixin",
}

REPO = Path(pipeline.__file__).resolve().parent.parent


def test_it_exports_exactly_the_tool_protocol_api():
    exported = {
        name
        for name in pipeline.__all__
        if getattr(getattr(pipeline, name), "__module__", None) in TOOL_PROTOCOL_MODULES
    }
    assert exported == TOOL_PROTOCOL_API


def test_it_exports_exactly_the_storage_and_cache_api():
    functions_and_classes = {
        name
        for name in pipeline.__all__
        if getattr(getattr(pipeline, name), "__module__", None) in STORAGE_MODULES
    }
    constants = {"ARTIFACT_ID_PATTERN", "ARTIFACT_ID_RE", "THRESHOLD_BYTES"}
    assert functions_and_classes | constants == STORAGE_API
    for name in STORAGE_API:
        assert pipeline.__all__.count(name) == 1, name


def test_it_exports_the_design_documents_exception_name():
    assert pipeline.TimeoutException is pipeline.ToolTimeoutError
    assert pipeline.__all__.count("TimeoutException") == 1


def test_it_lists_each_tool_protocol_name_once_and_every_name_resolves():
    for name in TOOL_PROTOCOL_API:
        assert pipeline.__all__.count(name) == 1, name
    for name in pipeline.__all__:
        assert hasattr(pipeline, name), name


def test_it_imports_no_django():
    code = (
        "import sys, pipeline\n"
        "from pipeline import ToolExecutor, ToolInvocationRequest\n"
        "ex = ToolExecutor()\n"
        "ex.register('one', lambda: [1])\n"
        "assert ex.execute(ToolInvocationRequest(tool_call_id='c', tool_name='one')).success\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_it_ships_type_information():
    assert (REPO / "pipeline" / "py.typed").exists()


# --- context side: compression, conversation model, tokens, skills, injection ---------

CONTEXT_MODULES = {
    "pipeline._compression",
    "pipeline._context_state",
    "pipeline._conversation",
    "pipeline._llm_compressor",
    "pipeline._injection",
    "pipeline._skill_activation",
    "pipeline._skill_models",
    "pipeline._skills",
    "pipeline._summarizers",
    "pipeline._tokens",
}

CONTEXT_API = {
    # _compression
    "AdvancedContextManager",
    "BasicContextManager",
    "ContextCompressionConfig",
    "ThreadSafeContextManager",
    "as_summarizer",
    # _context_state
    "CompressedMessages",
    "MessageImportance",
    "MessageWrapper",
    # _conversation
    "ConversationRound",
    "MultiRoundConversation",
    # _llm_compressor (ContextCompressionStrategy is CompressionMode itself)
    "CompressionCostEstimate",
    "LLMCompressor",
    # _injection
    "LockManager",
    "MessageInjectionProtocol",
    "get_lock_manager",
    # _skill_activation, _skill_models, _skills
    "ContextModifier",
    "SkillActivationRequest",
    "SkillActivationResult",
    "SkillActivationStack",
    "SkillActivator",
    "SkillMessage",
    "SkillInstructions",
    "SkillLoader",
    "SkillMetadata",
    "SkillResource",
    "validate_skill_name",
    # _summarizers
    "ExtractiveSummarizer",
    "LLMSummarizer",
    "Summarizer",
    # _tokens
    "DynamicTokenCounter",
    "EncoderConfig",
    "ModelEncoderRegistry",
    "ModelFamily",
    "TokenEncoder",
    "count_conversation_tokens",
    "count_message_tokens",
    "count_tokens",
    "discover_config_file",
    "get_token_counter",
}


def test_it_exports_exactly_the_context_api():
    exported = {
        name for name in pipeline.__all__ if getattr(getattr(pipeline, name), "__module__", None) in CONTEXT_MODULES
    }
    assert exported == CONTEXT_API
    for name in CONTEXT_API | {"ContextCompressionStrategy", "CONFIG_SEARCH_PATHS"}:
        assert pipeline.__all__.count(name) == 1, name
    assert pipeline.ContextCompressionStrategy is pipeline.CompressionMode
