"""The design documents' tool-side calls, as written, with their documented outputs:
the data of tests/pipeline/test_design_examples_tools.py, kept apart so that

    python -m tests.pipeline.design_examples_tools

counts how many fail against any version of the library (it imports nothing from
``pipeline`` itself: each snippet does its own imports, as a developer would)."""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap
import traceback

# (name, where the documents show it, code as written + the documented outputs)
DOCUMENTED: list[tuple[str, str, str]] = [
    (
        "ToolCachePolicy",
        "v2.1 ToolCachePolicy",
        """
        from pipeline import ToolCachePolicy
        assert [p.value for p in ToolCachePolicy] == ["no_cache", "cacheable", "ttl_short", "ttl_medium", "ttl_long"]
        assert isinstance(ToolCachePolicy.NO_CACHE, str)
        """,
    ),
    (
        "OutputLevel",
        "v2.0 Tool Result Format",
        """
        from pipeline import OutputLevel
        assert (OutputLevel.BRIEF, OutputLevel.STANDARD, OutputLevel.FULL) == ("brief", "standard", "full")
        """,
    ),
    (
        "ToolInvocationRequest(all documented fields)",
        "v2.1 ToolInvocationRequest",
        """
        from pipeline import OutputLevel, ToolCachePolicy, ToolInvocationRequest
        request = ToolInvocationRequest(
            tool_call_id="call_abc123",
            tool_name="web_search",
            tool_version="1.0.0",
            parameters={"query": "扬州天气"},
            output_level=None,
            timeout_ms=120000,
            retry_on_timeout=True,
            storage_dir=None,
            caller_id="ba-agent",
            permission_level="default",
            idempotency_key=None,
            cache_policy=ToolCachePolicy.NO_CACHE,
        )
        assert request.storage_dir is None and request.caller_id == "ba-agent"
        minimal = ToolInvocationRequest(tool_call_id="call_abc123", tool_name="web_search",
                                        parameters={"query": "扬州天气"}, caller_id="ba-agent")
        assert (minimal.tool_version, minimal.output_level, minimal.timeout_ms) == ("1.0.0", None, 120000)
        assert (minimal.retry_on_timeout, minimal.storage_dir, minimal.permission_level) == (True, None, "default")
        assert (minimal.idempotency_key, minimal.cache_policy) == (None, ToolCachePolicy.NO_CACHE)
        """,
    ),
    (
        "ToolInvocationRequest(storage_dir=path)",
        "v2.1 ToolInvocationRequest",
        """
        from pipeline import ToolInvocationRequest
        request = ToolInvocationRequest(tool_call_id="call_1", tool_name="query_database",
                                        parameters={}, caller_id="ba-agent", storage_dir=str(tmp))
        assert request.storage_dir == str(tmp)
        """,
    ),
    (
        "get_or_generate_idempotency_key()",
        "v2.1 ToolInvocationRequest",
        """
        from pipeline import ToolInvocationRequest
        first = ToolInvocationRequest(tool_call_id="call_1", tool_name="web_search",
                                      parameters={"query": "扬州天气"}, caller_id="ba-agent")
        second = ToolInvocationRequest(tool_call_id="call_2", tool_name="web_search",
                                       parameters={"query": "扬州天气"}, caller_id="ba-agent")
        # tool_name + tool_version + parameters + caller_id + permission_level, no tool_call_id
        assert first.get_or_generate_idempotency_key() == second.get_or_generate_idempotency_key()
        other_caller = second.model_copy(update={"caller_id": "skill-x"})
        assert other_caller.get_or_generate_idempotency_key() != first.get_or_generate_idempotency_key()
        explicit = ToolInvocationRequest(tool_call_id="c", tool_name="t", parameters={}, caller_id="a",
                                         idempotency_key="mine")
        assert explicit.get_or_generate_idempotency_key() == "mine"
        """,
    ),
    (
        "tool_call_id from AIMessage.tool_calls",
        "v2.0 Phase 1 (CORRECT example), v2.1 LangChain tool-call loop",
        """
        from langchain_core.messages import AIMessage
        from pipeline import ToolInvocationRequest
        ai_message = AIMessage(content="", tool_calls=[{"id": "call_abc123", "name": "web_search",
                                                         "args": {"query": "..."}}])
        for tool_call in ai_message.tool_calls:
            tool_call_id = tool_call["id"]
            tool_name = tool_call["name"]
            parameters = tool_call["args"]
            request = ToolInvocationRequest(tool_call_id=tool_call_id, tool_name=tool_name,
                                            parameters=parameters, caller_id="ba-agent")
        assert request.tool_call_id == "call_abc123"
        """,
    ),
    (
        "get_effective_output_level(...)",
        "v2.0 Phase 1, v1.9 Output Level 决策机制",
        """
        from pipeline import OutputLevel, ToolInvocationRequest
        request = ToolInvocationRequest(tool_call_id="c", tool_name="t", parameters={}, caller_id="a")
        assert request.get_effective_output_level() == OutputLevel.STANDARD
        assert request.get_effective_output_level(tool_config_default=OutputLevel.FULL) == OutputLevel.FULL
        assert request.get_effective_output_level(None, OutputLevel.STANDARD, 0.9) == OutputLevel.BRIEF
        assert request.get_effective_output_level(
            tool_config_default=None, global_default=OutputLevel.FULL, context_window_usage=0.5) == OutputLevel.FULL
        explicit = request.model_copy(update={"output_level": OutputLevel.FULL})
        assert explicit.get_effective_output_level(OutputLevel.BRIEF, OutputLevel.BRIEF, 0.99) == OutputLevel.FULL
        """,
    ),
    (
        "ToolExecutionResult(documented fields)",
        "v2.1 ToolExecutionResult",
        """
        from pipeline import OutputLevel, ToolExecutionResult
        result = ToolExecutionResult(tool_call_id="call_abc123", observation="Found 3 files", success=True)
        assert result.output_level == OutputLevel.STANDARD
        assert result._data_file is None
        assert (result.artifact_id, result.data_size_bytes, result.data_hash, result.data_summary) == (None, 0, None, None)
        assert (result.retry_count, result.last_error) == (0, None)
        assert (result.error_code, result.error_type, result.error_message, result.duration_ms) == (None, None, None, 0.0)
        """,
    ),
    (
        "from_raw_data(tool_call_id, raw_data, output_level, storage_dir) positional path",
        "v2.1 ToolExecutionResult",
        """
        from pipeline import OutputLevel, ToolExecutionResult
        raw_data = [{"id": i, "name": "x" * 2000} for i in range(1000)]  # about 2 MB
        result = ToolExecutionResult.from_raw_data("call_abc123", raw_data, OutputLevel.STANDARD, str(tmp))
        assert result.artifact_id and result.artifact_id.startswith("artifact_")
        assert result.observation.startswith("Data stored as artifact: " + result.artifact_id)
        assert len(result.observation) < 1000 and str(tmp) not in result.observation
        assert result.data_size_bytes > 1024 * 1024
        """,
    ),
    (
        "from_raw_data(..., storage_dir=path)",
        "v2.1 ToolExecutionResult",
        """
        from pathlib import Path
        from pipeline import OutputLevel, ToolExecutionResult
        raw_data = [{"id": i, "name": f"user{i}"} for i in range(1000)]
        result = ToolExecutionResult.from_raw_data(tool_call_id="call_abc123", raw_data=raw_data,
                                                   output_level=OutputLevel.FULL, storage_dir=str(tmp))
        assert result.observation == (
            f"Data stored as artifact: {result.artifact_id}\\n\\n"
            "Large dataset available for subsequent tool access.\\n\\n"
            "To access this data, reference the artifact_id in your next tool call.\\n"
            "The system will securely retrieve the data for you.\\n\\n"
            "Data summary: List with 1000 items. First item keys: ['id', 'name']"
        )
        assert result.data_summary == "List with 1000 items. First item keys: ['id', 'name']"
        # v2.0 typed storage_dir as a Path
        again = ToolExecutionResult.from_raw_data("call_2", raw_data, OutputLevel.FULL, storage_dir=Path(tmp))
        assert again.artifact_id == result.artifact_id
        """,
    ),
    (
        "from_raw_data(tool_call_id, raw_data, output_level) without storage",
        "v2.0 Example Usage (BRIEF / STANDARD / FULL), v2.1 Output Level 示例",
        """
        from pipeline import OutputLevel, ToolExecutionResult
        raw_data = [{"id": 1, "name": "Alice"}, {"id": 2, "name": "Bob"}] + [{"id": i, "name": f"u{i}"} for i in range(3, 11)]
        brief = ToolExecutionResult.from_raw_data("call_123", raw_data, OutputLevel.BRIEF)
        assert brief.observation == "Found 10 items"
        standard = ToolExecutionResult.from_raw_data("call_123", raw_data, OutputLevel.STANDARD)
        assert standard.observation.startswith("Found 10 items:\\n  - ")
        assert "Alice" in standard.observation and standard.observation.endswith("\\n  ... and 7 more")
        full = ToolExecutionResult.from_raw_data("call_123", raw_data, OutputLevel.FULL)
        assert full.observation.startswith('[{"id": 1, "name": "Alice"}, ')
        """,
    ),
    (
        "to_tool_message()",
        "v2.1 ToolExecutionResult, v2.0 to_tool_message",
        """
        from langchain_core.messages import ToolMessage
        from pipeline import ToolExecutionResult
        result = ToolExecutionResult(tool_call_id="call_abc123", observation="file1.py\\nfile2.py", success=True)
        tool_msg = result.to_tool_message()
        assert isinstance(tool_msg, ToolMessage)
        assert (tool_msg.content, tool_msg.tool_call_id) == ("file1.py\\nfile2.py", "call_abc123")
        messages = []
        messages.append(tool_msg)
        failed = ToolExecutionResult(tool_call_id="call_1", observation="", success=False,
                                     error_type="timeout", error_code="TIMEOUT", error_message="too slow")
        assert failed.to_tool_message().content == (
            "Operation failed.\\n\\nError Type: timeout\\nError Code: TIMEOUT\\nError Message: too slow\\n\\n"
            "Tool Call ID: call_1")
        """,
    ),
    (
        "to_llm_message()",
        "v2.1 ToolExecutionResult (debugging), v2.0",
        """
        from pipeline import ToolExecutionResult
        result = ToolExecutionResult(tool_call_id="call_abc123", observation="src/main.py", success=True)
        assert result.to_llm_message() == {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_abc123", "content": "src/main.py", "is_error": False}]}
        """,
    ),
    (
        "create_retry(new_timeout_ms)",
        "v2.0 Phase 2",
        """
        from pipeline import ToolExecutionResult
        failed = ToolExecutionResult(tool_call_id="call_1", observation="", success=False,
                                     error_type="timeout", error_message="timed out")
        retry = failed.create_retry(60000)
        assert (retry.retry_count, retry.last_error, retry.success) == (1, "timed out", False)
        assert retry.error_type == "RETRY" and retry.error_message == "Retrying after 1 failures"
        assert retry.observation == "Retry 1 after: timed out"
        """,
    ),
    (
        "format_error_observation()",
        "v2.0 / v1.9 统一的错误格式",
        """
        from pipeline import ToolExecutionResult
        failed = ToolExecutionResult(tool_call_id="call_9", observation="", success=False,
                                     error_type="not_found", error_code="NOT_FOUND", error_message="no such table")
        assert failed.format_error_observation() == (
            "Operation failed.\\n\\nError Type: not_found\\nError Code: NOT_FOUND\\n"
            "Error Message: no such table\\n\\nTool Call ID: call_9")
        """,
    ),
    (
        "ToolTimeoutHandler.execute_with_timeout(func=, tool_call_id=, timeout_ms=) + TimeoutException",
        "v2.1 ToolTimeoutHandler (使用示例)",
        """
        import time
        from pipeline import ToolExecutionResult, ToolTimeoutHandler, TimeoutException
        def actual_tool(params):
            time.sleep(params["sleep"])
            return "done"
        def run(request_tool_call_id, params, timeout_ms):
            try:
                result = ToolTimeoutHandler.execute_with_timeout(
                    func=lambda: actual_tool(params),
                    tool_call_id=request_tool_call_id,
                    timeout_ms=timeout_ms
                )
                return ToolExecutionResult(tool_call_id=request_tool_call_id, observation=str(result), success=True)
            except TimeoutException:
                return ToolTimeoutHandler.create_timeout_result(request_tool_call_id, timeout_ms)
        ok = run("call_ok", {"sleep": 0}, 5000)
        assert ok.success and ok.observation == "done"
        late = run("call_late", {"sleep": 0.5}, 50)
        assert late.success is False and late.error_type == "timeout"
        assert "Tool execution timed out after 50ms" in late.observation
        """,
    ),
    (
        "execute_with_timeout default timeout_ms=30000",
        "v2.1 ToolTimeoutHandler",
        """
        from pipeline import ToolTimeoutHandler
        assert ToolTimeoutHandler.execute_with_timeout(lambda: 42, "call_1") == 42
        """,
    ),
    (
        "create_timeout_result(tool_call_id, timeout_ms)",
        "v2.1 ToolTimeoutHandler",
        """
        from pipeline import ToolExecutionResult, ToolTimeoutHandler
        result = ToolTimeoutHandler.create_timeout_result("call_abc123", 30000)
        assert isinstance(result, ToolExecutionResult)
        assert (result.tool_call_id, result.success, result.error_type) == ("call_abc123", False, "timeout")
        assert result.error_message == "Tool execution timed out after 30000ms"
        assert "Tool execution timed out after 30000ms" in result.observation
        """,
    ),
    (
        "validate_input_size(parameters, max_size_mb=10)",
        "v2.0 Phase 2.5, v1.9 超时处理",
        """
        from pipeline import ToolTimeoutHandler
        assert ToolTimeoutHandler.validate_input_size({"query": "扬州天气"}) is True
        assert ToolTimeoutHandler.validate_input_size({"blob": "x" * (2 * 1024 * 1024)}, max_size_mb=1) is False
        """,
    ),
    (
        "ToolErrorType (values, is_retryable, is_permanent)",
        "v2.0 Error Handling",
        """
        from pipeline import ToolErrorType
        assert [t.value for t in ToolErrorType] == [
            "timeout", "rate_limit", "resource_error", "transient_error", "permission_denied",
            "invalid_parameters", "not_found", "validation_error", "execution_error", "internal_error",
            "dependency_error"]
        assert {t for t in ToolErrorType if t.is_retryable} == {
            ToolErrorType.TIMEOUT, ToolErrorType.RATE_LIMIT, ToolErrorType.RESOURCE_ERROR, ToolErrorType.TRANSIENT_ERROR}
        assert {t for t in ToolErrorType if t.is_permanent} == {
            ToolErrorType.PERMISSION_DENIED, ToolErrorType.INVALID_PARAMETERS, ToolErrorType.NOT_FOUND,
            ToolErrorType.VALIDATION_ERROR}
        assert not ToolErrorType.EXECUTION_ERROR.is_retryable and not ToolErrorType.EXECUTION_ERROR.is_permanent
        """,
    ),
    (
        "ToolErrorResponse(request_id=...).should_retry / to_result()",
        "v2.0 Error Handling",
        """
        from pipeline import ToolErrorResponse, ToolErrorType, ToolExecutionResult
        error = ToolErrorResponse(request_id="call_1", error_type=ToolErrorType.RATE_LIMIT,
                                  error_code="HTTP_429", error_message="quota exceeded")
        assert error.should_retry is True
        result = error.to_result()
        assert isinstance(result, ToolExecutionResult)
        assert (result.tool_call_id, result.success) == ("call_1", False)
        assert (result.error_code, result.error_type, result.error_message) == ("HTTP_429", "rate_limit", "quota exceeded")
        assert "quota exceeded" in result.observation
        assert ToolErrorResponse(tool_call_id="call_2", error_type=ToolErrorType.NOT_FOUND,
                                 error_code="NOT_FOUND", error_message="x").should_retry is False
        """,
    ),
    (
        "ToolRetryPolicy (fields, should_retry, get_delay, get_retry_timeout)",
        "v2.0 Phase 1.5, v1.9 重试策略",
        """
        from pipeline import ToolErrorType, ToolRetryPolicy
        policy = ToolRetryPolicy()
        assert (policy.max_retries, policy.backoff_multiplier, policy.initial_delay_ms, policy.max_delay_ms) == (3, 1.5, 1000, 10000)
        assert (policy.timeout_multiplier, policy.max_timeout_ms) == (2.0, 300000)
        assert ToolErrorType.TIMEOUT in policy.retry_on and ToolErrorType.RESOURCE_ERROR in policy.retry_on
        assert policy.should_retry(ToolErrorType.TIMEOUT, 0) is True
        assert policy.should_retry(ToolErrorType.TIMEOUT, 3) is False
        assert policy.should_retry(ToolErrorType.PERMISSION_DENIED, 0) is False
        assert [policy.get_delay(a) for a in (0, 1, 2, 10)] == [1000, 1500, 2250, 10000]
        assert policy.get_retry_timeout(30000, 1) == 60000 and policy.get_retry_timeout(30000, 10) == 300000
        narrow = ToolRetryPolicy(max_retries=1, retry_on=[ToolErrorType.TIMEOUT])
        assert narrow.should_retry(ToolErrorType.RATE_LIMIT, 0) is False
        assert narrow.should_retry(ToolErrorType.TIMEOUT, 0) is True
        """,
    ),
    (
        "TTLCache[K, V] get / set / clear (subclassed as documented)",
        "v2.1 TTL 缓存基类",
        """
        from typing import Any, Dict
        from pipeline import TTLCache
        class MyCache(TTLCache[str, Dict[str, Any]]):
            pass
        cache = MyCache()
        assert cache.get("k") is None
        cache.set("k", {"v": 1})
        assert cache.get("k") == {"v": 1}
        cache.clear()
        assert cache.get("k") is None
        """,
    ),
    (
        "TTLCache(ttl=timedelta, max_entries=) size() / in",
        "v2.0 通用 TTL 缓存基类",
        """
        from datetime import timedelta
        from pipeline import TTLCache
        cache = TTLCache(ttl=timedelta(seconds=60), max_entries=2)
        cache.set("a", 1)
        cache.set("b", 2)
        assert cache.size() == 2 and "a" in cache and "z" not in cache
        positional = TTLCache(timedelta(minutes=5), 10)
        positional.set("k", "v")
        assert positional.get("k") == "v"
        """,
    ),
    (
        "IdempotencyCache(TTLCache[str, ToolExecutionResult]) get / set",
        "v2.1 TTL 缓存基类 (子类)",
        """
        from pipeline import IdempotencyCache, ToolExecutionResult, ToolInvocationRequest
        cache = IdempotencyCache()
        request = ToolInvocationRequest(tool_call_id="call_1", tool_name="web_search",
                                        parameters={"query": "扬州天气"}, caller_id="ba-agent")
        key = request.get_or_generate_idempotency_key()
        result = ToolExecutionResult(tool_call_id="call_1", observation="晴", success=True)
        cache.set(key, result)
        assert cache.get(key).observation == "晴"
        cache.clear()
        assert cache.get(key) is None
        """,
    ),
    (
        "IdempotencyCache(ttl_seconds=, max_entries=) get_cached_result / cache_result, get_idempotency_cache()",
        "v2.0 Idempotency Support",
        """
        from pipeline import IdempotencyCache, ToolExecutionResult, ToolInvocationRequest, get_idempotency_cache
        request = ToolInvocationRequest(tool_call_id="call_1", tool_name="web_search",
                                        parameters={"query": "扬州天气"}, caller_id="ba-agent")
        key = request.get_or_generate_idempotency_key()
        cache = get_idempotency_cache()
        assert cache is get_idempotency_cache() and isinstance(cache, IdempotencyCache)
        assert cache.get_cached_result(key) is None
        cache.cache_result(key, ToolExecutionResult(tool_call_id="call_1", observation="晴", success=True))
        cached = cache.get_cached_result(key)
        assert cached is not None and cached.observation == "晴"
        own = IdempotencyCache(ttl_seconds=3600, max_entries=10000)
        own.cache_result("k", cached)
        assert own.size() == 1
        """,
    ),
    (
        "SummaryCache(ttl_hours=, max_entries=) get_cached_summary / cache_summary",
        "v2.0 SummaryCache",
        """
        from pipeline import SummaryCache
        cache = SummaryCache(ttl_hours=24, max_entries=1000)
        assert cache.get_cached_summary("conv-1", "abc") is None
        cache.cache_summary("conv-1", "abc", "用户询问了扬州天气", metadata={"model": "haiku"})
        assert cache.get_cached_summary("conv-1", "abc") == "用户询问了扬州天气"
        value = cache.get("conv-1:abc")
        assert value["summary"] == "用户询问了扬州天气" and value["metadata"] == {"model": "haiku"}
        assert isinstance(value["timestamp"], str)
        assert SummaryCache().get_cached_summary("conv-1", "abc") is None
        """,
    ),
    (
        "ThreadSafeMixin (_lock, _with_lock)",
        "v2.1 ThreadSafeMixin, v2.0 使用示例",
        """
        import threading
        from pipeline import ThreadSafeMixin
        class MyClass(ThreadSafeMixin):
            def __init__(self):
                super().__init__()
                self._data = []
            def add_item(self, item):
                with self._lock:
                    self._data.append(item)
            def add_two(self, item):
                with self._with_lock():
                    self._data.extend([item, item])
        obj = MyClass()
        threads = [threading.Thread(target=lambda: [obj.add_item(1) or obj.add_two(2) for _ in range(200)]) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert len(obj._data) == 4 * 200 * 3
        """,
    ),
    (
        "ThreadSafeContainer[T]() get / set / delete / keys / items",
        "v2.0 §4 完整的线程安全考虑",
        """
        from pipeline import ThreadSafeContainer
        container = ThreadSafeContainer[int]()
        container.set("a", 1)
        container.set("b", 2)
        assert container.get("a") == 1 and container.get("zz") is None
        container.delete("a")
        container.delete("missing")
        assert container.keys() == ["b"] and container.items() == [("b", 2)]
        with container._acquire():
            with container._acquire():  # re-entrant
                container.set("c", 3)
        assert sorted(container.keys()) == ["b", "c"]
        """,
    ),
    (
        "DataStorage.store_large_data / retrieve_data / cleanup_old_files",
        "v2.1 文件存储策略",
        """
        import hashlib, json
        from pathlib import Path
        from pipeline import DataStorage
        assert DataStorage.STORAGE_DIR == Path("tool_data")
        DataStorage.STORAGE_DIR = Path(tmp) / "tool_data"
        data = {"rows": [{"id": i} for i in range(5)]}
        data_hash = hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16]
        artifact_id = DataStorage.store_large_data("call_abc123", data, data_hash)
        assert artifact_id.startswith("artifact_") and "/" not in artifact_id
        assert DataStorage.retrieve_data(artifact_id) == data
        assert DataStorage.cleanup_old_files(max_age_hours=24) == 0
        assert DataStorage.retrieve_data(artifact_id) == data
        assert DataStorage.cleanup_old_files() == 0
        """,
    ),
    (
        "DataFileManager (constructor, daemon, register/touch, cleanups, context manager)",
        "v2.0 Production Considerations §1",
        """
        from pathlib import Path
        from pipeline import DataFileManager
        DataFileManager.STORAGE_DIR = Path(tmp) / "tool_data"
        DataFileManager.METADATA_FILE = DataFileManager.STORAGE_DIR / ".metadata.json"
        DataFileManager.STORAGE_DIR.mkdir(parents=True)
        path = DataFileManager.STORAGE_DIR / "call_1_abc.json"
        path.write_text('{"rows": []}')
        with DataFileManager(max_age_hours=24, max_size_gb=10, cleanup_interval_seconds=3600, auto_start=True) as manager:
            manager.register_file(str(path), {"size_bytes": path.stat().st_size, "tool_call_id": "call_1",
                                               "conversation_id": "conv-1"})
            manager.touch_file(str(path))
            assert manager.cleanup_expired() == 0
            assert manager.cleanup_by_size() == 0
            assert path.exists()
            manager.start_cleanup_daemon()  # already running: a warning, no second thread
        assert DataFileManager.METADATA_FILE.exists()
        manager.stop_cleanup_daemon(timeout=5.0)
        """,
    ),
    (
        "ContentBlock / StandardMessage.to_debug_dict()",
        "v2.1 外部/研究格式",
        """
        from pipeline import ContentBlock, ContentBlockType, MessageType, StandardMessage
        block = ContentBlock(type=ContentBlockType.TOOL_RESULT, content="src/main.py", tool_use_id="call_xxx",
                             is_error=False)
        message = StandardMessage(role=MessageType.USER, content=[block])
        assert message.to_debug_dict() == {"role": "user", "content": [
            {"type": "tool_result", "content": "src/main.py", "tool_use_id": "call_xxx", "is_error": False}]}
        thinking = ContentBlock(type=ContentBlockType.THINKING, thinking="I need to search...")
        use = ContentBlock(type=ContentBlockType.TOOL_USE, id="call_xxx", name="Glob", input={"pattern": "**/*.py"})
        text = ContentBlock(type=ContentBlockType.TEXT, text="Find all Python files")
        assert StandardMessage(role=MessageType.ASSISTANT, content=[thinking, use]).to_debug_dict()["role"] == "assistant"
        assert text.text == "Find all Python files"
        """,
    ),
    (
        "@pipeline_tool",
        "v2.1 Phase 2 (@pipeline_tool 装饰器)",
        """
        from pipeline import ToolExecutor, ToolInvocationRequest, pipeline_tool
        @pipeline_tool
        def web_search(query: str) -> list:
            return [query, query]
        assert web_search("x") == ["x", "x"]
        executor = ToolExecutor()
        executor.register_tool(web_search)
        result = executor.execute(ToolInvocationRequest(tool_call_id="call_1", tool_name="web_search",
                                                        parameters={"query": "扬州"}, caller_id="ba-agent"))
        assert result.success and result.observation.startswith("Found 2 items")
        """,
    ),
    (
        "PipelineToolWrapper",
        "v2.1 Phase 2 (PipelineToolWrapper, LangChain 集成)",
        """
        from pipeline import PipelineToolWrapper, ToolInvocationRequest
        wrapper = PipelineToolWrapper()
        wrapper.register("query_database", lambda sql: [{"n": 1}])
        result = wrapper.execute(ToolInvocationRequest(tool_call_id="call_1", tool_name="query_database",
                                                       parameters={"sql": "select 1"}, caller_id="ba-agent"))
        assert result.success and result.to_tool_message().tool_call_id == "call_1"
        """,
    ),
    (
        "executor stores large data in the request's storage_dir",
        "v2.1 ToolInvocationRequest.storage_dir + 文件存储规则",
        """
        from pipeline import OutputLevel, ToolExecutor, ToolInvocationRequest
        executor = ToolExecutor()
        executor.register("query_database", lambda: [{"id": i, "name": f"u{i}"} for i in range(50)])
        result = executor.execute(ToolInvocationRequest(tool_call_id="call_1", tool_name="query_database",
                                                        parameters={}, caller_id="ba-agent",
                                                        output_level=OutputLevel.FULL, storage_dir=str(tmp)))
        assert result.success and result.artifact_id and str(tmp) not in result.observation
        """,
    ),
    (
        "artifact cleanup when the conversation ends",
        "v2.1 安全：文件存储规则 (清理策略：TTL 24 小时，会话结束清理)",
        """
        from pipeline import ArtifactStore, OutputLevel, ToolExecutionResult
        store = ArtifactStore(tmp)
        result = ToolExecutionResult.from_raw_data("call_1", [{"id": 1}], OutputLevel.FULL, store,
                                                   conversation_id="conv-1")
        assert store.exists(result.artifact_id)
        assert store.cleanup_conversation("conv-1") == 1
        assert not store.exists(result.artifact_id)
        store.close()
        """,
    ),
]


def run_documented(code: str, tmp: str) -> None:
    namespace = {"tmp": tmp, "__name__": "documented_example"}
    exec(compile(textwrap.dedent(code), "<documented>", "exec"), namespace)


def main() -> int:
    failures = []
    for name, where, code in DOCUMENTED:
        with tempfile.TemporaryDirectory() as tmp:
            cwd = os.getcwd()
            os.chdir(tmp)
            try:
                store_dir = os.path.join(tmp, "store")
                os.mkdir(store_dir)
                run_documented(code, store_dir)
            except BaseException as exc:  # noqa: BLE001 - counting, not handling
                failures.append((name, where, exc))
            finally:
                os.chdir(cwd)
    for name, where, exc in failures:
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        print(f"FAIL {name} [{where}]: {last[:200]}")
    print(f"{len(failures)} of {len(DOCUMENTED)} documented tool-side calls fail")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
