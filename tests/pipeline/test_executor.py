import json
import threading

import pytest

from pipeline import (
    ContextModifier,
    OutputLevel,
    ToolCachePolicy,
    ToolError,
    ToolExecutor,
    ToolInvocationRequest,
    ToolRetryPolicy,
    ToolSpec,
    ToolTimeoutHandler,
    pipeline_tool,
    render_levels,
)
from pipeline._artifacts import THRESHOLD_BYTES, ArtifactStore
from pipeline._cache import IdempotencyCache
from pipeline._exceptions import ConfigError
from pipeline._tokens import DynamicTokenCounter

ROWS = [{"id": i, "name": f"user{i}"} for i in range(10)]
COUNTER = DynamicTokenCounter()
MODEL = "claude-3-sonnet"


class FakeClock:
    """The clock is an edge: each reading advances 5 ms."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 0.005
        return self.now


class FakeSleep:
    """Records the backoff instead of waiting."""

    def __init__(self):
        self.calls = []

    def __call__(self, seconds):
        self.calls.append(seconds)


@pytest.fixture
def release():
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def sleep():
    return FakeSleep()


@pytest.fixture
def executor(sleep):
    ex = ToolExecutor(
        token_counter=COUNTER,
        sleep=sleep,
        retry_policy=ToolRetryPolicy(initial_delay_ms=1000, backoff_multiplier=1.5),
        timeout_handler=ToolTimeoutHandler(max_workers=8),
    )
    ex.register("rows", lambda n=10: [{"id": i, "name": f"user{i}"} for i in range(n)])
    return ex


def call(tool="rows", call_id="call_1", **fields):
    return ToolInvocationRequest(tool_call_id=call_id, tool_name=tool, **fields)


# --------------------------------------------------------------------------- success


def test_it_runs_a_tool_and_counts_the_observation_tokens(executor):
    result = executor.execute(call(parameters={"n": 10}))
    assert result.success and result.tool_call_id == "call_1"
    assert result.output_level is OutputLevel.STANDARD
    assert result.observation.startswith("Found 10 items:\n") and result.observation.endswith("... and 7 more")
    assert result.observation_tokens == COUNTER.count_tokens(result.observation, MODEL)
    assert result.retry_count == 0 and result.last_error is None


def test_it_measures_duration_with_fake_clock():
    ex = ToolExecutor(token_counter=COUNTER, clock=FakeClock())
    ex.register("one", lambda: 1)
    assert ex.execute(call("one")).duration_ms == pytest.approx(5.0)


def test_it_resolves_the_level_explicit_config_tool_dynamic_global():
    ex = ToolExecutor(token_counter=COUNTER, tool_levels={"configured": "full"}, global_default_level="full")
    ex.register("plain", lambda: ROWS)
    ex.register("configured", lambda: ROWS, default_level="brief")
    ex.register("briefly", lambda: ROWS, default_level="brief")
    assert ex.execute(call("plain", output_level="brief")).output_level is OutputLevel.BRIEF
    assert ex.execute(call("configured")).output_level is OutputLevel.FULL  # config over registration
    assert ex.execute(call("briefly", output_level="standard")).output_level is OutputLevel.STANDARD
    assert ex.execute(call("briefly")).observation == "Found 10 items"
    assert ex.execute(call("plain"), context_usage=0.95).output_level is OutputLevel.BRIEF
    assert ex.execute(call("plain"), context_usage=0.2).output_level is OutputLevel.FULL


# --------------------------------------------------------------------------- refusals


def test_it_denies_a_tool_the_active_skill_does_not_allow():
    ran = []
    ex = ToolExecutor(token_counter=COUNTER)
    ex.register("file_write", lambda: ran.append(1))
    modifier = ContextModifier(allowed_tools=frozenset({"file_reader"}))
    result = ex.execute(call("file_write"), context_modifier=modifier)
    assert not result.success and ran == []
    assert (result.error_type, result.error_code) == ("permission_denied", "PERMISSION_DENIED")
    assert result.observation == result.format_error_observation()
    assert result.observation_tokens > 0


@pytest.mark.parametrize(
    "modifier, allowed",
    [
        (None, True),
        (ContextModifier(), True),
        (ContextModifier(allowed_tools=frozenset({"rows"})), True),
        ({"allowed_tools": ["rows"]}, True),
        ({"allowed_tools": []}, False),
        ({"allowed_tools": "rows"}, True),
        ({"allowed_tools": "rowsy"}, False),  # a string is one name, not a substring check
        ({"allowed_tools": 42}, False),  # junk restriction denies
        (object(), True),  # no allowed_tools attribute: no restriction
    ],
)
def test_it_reads_allowed_tools_duck_typed(executor, modifier, allowed):
    assert executor.execute(call(), context_modifier=modifier).success is allowed


def test_it_answers_an_unknown_tool_with_not_found(executor):
    result = executor.execute(call("drop_tables"))
    assert not result.success and result.error_type == "not_found"
    assert "Unknown tool 'drop_tables'. Available tools: rows" in result.observation


def test_it_survives_hostile_tool_output(executor):
    class Nasty:
        def __repr__(self):
            raise RuntimeError("no repr")

    loop: dict = {"nasty": Nasty(), (1, 2): "tuple key"}
    loop["loop"] = loop
    executor.register("hostile", lambda: loop)
    for level in ("brief", "standard", "full"):
        result = executor.execute(call("hostile", output_level=level))
        assert result.success, result.observation
    assert "<circular reference>" in result.observation and "<Nasty object>" in result.observation


def test_it_cuts_a_huge_text_result_without_a_store(executor):
    executor.register("blob", lambda: "y" * 5_000_000)
    result = executor.execute(call("blob"))
    assert result.success and len(result.observation) < 600 and result.data_size_bytes == 5_000_000


def test_it_refuses_a_request_that_is_not_a_request(executor):
    with pytest.raises(TypeError):
        executor.execute({"tool_call_id": "c", "tool_name": "rows"})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- idempotency cache


def counting_tool():
    calls = []

    def tool(q="x"):
        calls.append(q)
        return [q] * 5

    return tool, calls


def test_it_reuses_a_cached_result_across_tool_call_ids():
    tool, calls = counting_tool()
    ex = ToolExecutor(token_counter=COUNTER, idempotency_cache=IdempotencyCache())
    ex.register("search", tool, cache_policy=ToolCachePolicy.TTL_SHORT)
    first = ex.execute(call("search", "call_1", parameters={"q": "扬州"}))
    second = ex.execute(call("search", "call_2", parameters={"q": "扬州"}))
    assert calls == ["扬州"]
    assert second.cache_hit and not first.cache_hit
    assert second.tool_call_id == "call_2" and second.observation == first.observation
    ex.execute(call("search", "call_3", parameters={"q": "other"}))
    assert calls == ["扬州", "other"]


def test_it_never_caches_no_cache_tools_or_failures():
    tool, calls = counting_tool()
    ex = ToolExecutor(token_counter=COUNTER, retry_policy=ToolRetryPolicy(max_retries=0))
    ex.register("write", tool)
    ex.execute(call("write"))
    ex.execute(call("write"))
    assert len(calls) == 2
    failures = []

    def flaky():
        failures.append(1)
        raise ConnectionError("down")

    ex.register("flaky", flaky, cache_policy="cacheable")
    assert not ex.execute(call("flaky")).success and not ex.execute(call("flaky")).success
    assert len(failures) == 2


def test_it_lets_the_request_and_the_config_decide_the_cache_policy():
    tool, calls = counting_tool()
    ex = ToolExecutor(token_counter=COUNTER, tool_cache_policies={"search": "ttl_long"})
    ex.register("search", tool)  # registered NO_CACHE, configured TTL_LONG
    ex.execute(call("search"))
    assert ex.execute(call("search")).cache_hit
    assert not ex.execute(call("search", cache_policy=ToolCachePolicy.NO_CACHE)).cache_hit
    assert len(calls) == 2


def test_it_misses_the_cache_for_another_output_level():
    tool, calls = counting_tool()
    ex = ToolExecutor(token_counter=COUNTER)
    ex.register("search", tool, cache_policy="cacheable")
    ex.execute(call("search", output_level="brief"))
    result = ex.execute(call("search", output_level="full"))
    assert not result.cache_hit and result.observation == json.dumps(["x"] * 5)
    assert len(calls) == 2


def test_it_does_not_let_a_caller_change_the_cached_result():
    tool, _ = counting_tool()
    ex = ToolExecutor(token_counter=COUNTER)
    ex.register("search", tool, cache_policy="cacheable")
    ex.execute(call("search"))
    hit = ex.execute(call("search", "call_2"))
    hit.warnings.append("mutated")
    assert ex.execute(call("search", "call_3")).warnings == []


# --------------------------------------------------------------------------- failures and retries


def test_it_retries_transient_errors_with_backoff_through_fake_sleep(executor, sleep):
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("connection reset")
        return {"success": True, "message": "done"}

    executor.register("flaky", flaky)
    result = executor.execute(call("flaky", output_level="brief"))
    assert result.success and result.observation == "Success: done"
    assert result.retry_count == 2 and result.last_error == "transient_error: connection reset"
    assert sleep.calls == [1.0, 1.5]


def test_it_gives_up_after_max_retries(executor, sleep):
    def down():
        raise ToolError("rate_limit", "quota exceeded", code="HTTP_429")

    executor.register("down", down)
    result = executor.execute(call("down"))
    assert not result.success and result.retry_count == 3 and len(sleep.calls) == 3
    assert (result.error_type, result.error_code, result.error_message) == ("rate_limit", "HTTP_429", "quota exceeded")
    assert result.observation == (
        "Operation failed.\n\nError Type: rate_limit\nError Code: HTTP_429\n"
        "Error Message: quota exceeded\n\nTool Call ID: call_1"
    )


@pytest.mark.parametrize(
    "exc, error_type",
    [
        (ValueError("region must be a string"), "invalid_parameters"),
        (KeyError("region"), "not_found"),
        (PermissionError("read only"), "permission_denied"),
        (RuntimeError("bug in tool"), "execution_error"),
    ],
)
def test_it_does_not_retry_permanent_or_execution_errors(executor, sleep, exc, error_type):
    def broken():
        raise exc

    executor.register("broken", broken)
    result = executor.execute(call("broken"))
    assert (result.success, result.error_type, result.retry_count, sleep.calls) == (False, error_type, 0, [])


def test_it_reports_wrong_parameters_as_invalid(executor):
    result = executor.execute(call(parameters={"n": 3, "evil": "'; DROP TABLE"}))
    assert not result.success and result.error_type == "invalid_parameters"
    assert "evil" in result.error_message


def test_it_retries_timeouts_with_growing_timeouts(sleep, release):
    handler = ToolTimeoutHandler(max_workers=8)
    seen = []
    original = handler.execute_with_timeout

    def spy(func, tool_call_id, timeout_ms):
        seen.append(timeout_ms)
        return original(func, tool_call_id, timeout_ms)

    handler.execute_with_timeout = spy  # type: ignore[method-assign]
    ex = ToolExecutor(
        token_counter=COUNTER,
        sleep=sleep,
        timeout_handler=handler,
        retry_policy=ToolRetryPolicy(max_retries=2, timeout_multiplier=2, max_timeout_ms=30),
    )
    ex.register("hang", release.wait)
    result = ex.execute(call("hang", timeout_ms=10))
    assert seen == [10, 20, 30]
    assert not result.success and result.error_type == "timeout" and result.retry_count == 2
    assert result.error_message == "Tool execution timed out after 30ms"


def test_it_does_not_retry_timeouts_when_the_request_says_so(sleep, release):
    ex = ToolExecutor(token_counter=COUNTER, sleep=sleep, timeout_handler=ToolTimeoutHandler(max_workers=2))
    ex.register("hang", release.wait, timeout_ms=10)  # the tool's own timeout applies
    result = ex.execute(call("hang", retry_on_timeout=False))
    assert result.error_type == "timeout" and result.retry_count == 0 and sleep.calls == []
    assert result.error_message == "Tool execution timed out after 10ms"


def test_it_turns_its_own_failure_into_an_internal_error_with_fake_sleep(executor):
    def broken_sleep(seconds):
        raise RuntimeError("clock exploded")

    executor._sleep = broken_sleep
    executor.register("flaky", lambda: (_ for _ in ()).throw(ConnectionError("x")))
    result = executor.execute(call("flaky"))
    assert not result.success and result.error_type == "internal_error"
    assert "clock exploded" in result.error_message


# --------------------------------------------------------------------------- degraded edges


class FailingCounter:
    """A fake token counter that is down."""

    def count_tokens(self, text, model):
        raise RuntimeError("tokenizer missing")


def test_it_estimates_tokens_when_a_fake_counter_fails():
    ex = ToolExecutor(token_counter=FailingCounter())
    ex.register("rows", lambda: ROWS)
    result, renderings = ex.execute_with_renderings(call())
    assert result.success and result.observation_tokens == len(result.observation) // 4 + 1
    assert result.warnings == ["token_count_estimated: RuntimeError"]
    assert all(r.tokens > 0 for r in renderings)


def test_it_keeps_data_inline_when_the_store_refuses(tmp_path):
    ex = ToolExecutor(token_counter=COUNTER, artifact_store=ArtifactStore(tmp_path, max_total_bytes=10))
    ex.register("rows", lambda: ROWS)
    result = ex.execute(call(output_level="full"))
    assert result.success and json.loads(result.observation) == ROWS
    assert result.warnings[0].startswith("artifact_store_failed")


def test_it_survives_failing_callbacks_and_passes_renderings(executor):
    seen = []
    executor.on_result.append(lambda req, res, rend: 1 / 0)
    executor.on_result.append(lambda req, res, rend: seen.append((req.tool_call_id, res.success, len(rend))))
    assert executor.execute(call()).success
    assert seen == [("call_1", True, 3)]


# --------------------------------------------------------------------------- renderings and artifacts


def test_it_renders_all_three_levels_with_token_counts(tmp_path):
    store = ArtifactStore(tmp_path)
    ex = ToolExecutor(token_counter=COUNTER, artifact_store=store)
    ex.register("rows", lambda: ROWS)
    result, renderings = ex.execute_with_renderings(call(output_level="brief"))
    assert [r.level for r in renderings] == [OutputLevel.BRIEF, OutputLevel.STANDARD, OutputLevel.FULL]
    brief, standard, full = renderings
    assert brief.observation == result.observation == "Found 10 items"
    assert standard.observation.endswith("... and 7 more")
    assert json.loads(full.observation) == ROWS  # no artifact for this call: the data itself
    assert store.list() == []
    for r in renderings:
        assert r.tokens == COUNTER.count_tokens(r.observation, MODEL)
    assert result.observation_tokens == brief.tokens


def test_it_reuses_the_calls_artifact_for_the_full_rendering(tmp_path):
    store = ArtifactStore(tmp_path)
    ex = ToolExecutor(token_counter=COUNTER, artifact_store=store)
    ex.register("rows", lambda: ROWS)
    result, renderings = ex.execute_with_renderings(call(output_level="full"))
    assert result.artifact_id and len(store.list()) == 1
    assert renderings[2].observation == result.observation
    assert renderings[2].observation.startswith(f"Data stored as artifact: {result.artifact_id}")
    assert renderings[0].observation == "Found 10 items"
    assert "/" not in result.observation


def test_it_stores_large_results_once_and_says_so_at_every_level(tmp_path):
    store = ArtifactStore(tmp_path)
    ex = ToolExecutor(token_counter=COUNTER, artifact_store=store)
    ex.register("dump", lambda: "x" * THRESHOLD_BYTES)
    result, renderings = ex.execute_with_renderings(call("dump"))
    assert result.output_level is OutputLevel.STANDARD and result.artifact_id
    assert len(store.list()) == 1
    assert all(r.observation.startswith("Data stored as artifact:") for r in renderings)


def test_it_renders_only_the_own_level_of_a_cache_hit():
    ex = ToolExecutor(token_counter=COUNTER)
    ex.register("rows", lambda: ROWS, cache_policy="cacheable")
    ex.execute(call())
    result, renderings = ex.execute_with_renderings(call(call_id="call_2"))
    assert result.cache_hit and [r.level for r in renderings] == [OutputLevel.STANDARD]


def test_it_has_no_renderings_for_a_failure(executor):
    result, renderings = executor.execute_with_renderings(call("missing"))
    assert not result.success and renderings == []


def test_it_renders_levels_standalone():
    renderings = render_levels(ROWS, COUNTER, MODEL, artifact_id="artifact_" + "0" * 16)
    assert renderings[2].observation.startswith("Data stored as artifact: artifact_0000000000000000")
    assert renderings[0].tokens == COUNTER.count_tokens("Found 10 items", MODEL)


# --------------------------------------------------------------------------- registration


def test_it_registers_decorated_tools():
    ex = ToolExecutor(token_counter=COUNTER)

    @pipeline_tool
    def query_database(sql: str = "select 1"):
        return [{"sql": sql}]

    @pipeline_tool(name="web_search", cache_policy="ttl_short", default_level="brief", executor=ex)
    def search(q: str):
        return [q]

    assert isinstance(query_database.pipeline_tool, ToolSpec)
    assert query_database() == [{"sql": "select 1"}]  # still a plain function
    ex.register_tool(query_database)
    assert ex.tool_names == ["query_database", "web_search"]
    assert ex.execute(call("web_search", parameters={"q": "a"})).observation == "Found 1 item"


@pytest.mark.parametrize(
    "name, func, kwargs, field",
    [
        ("", len, {}, "name"),
        ("x" * 201, len, {}, "name"),
        (None, len, {}, "name"),
        ("t", "not callable", {}, "func"),
        ("t", len, {"version": ""}, "version"),
        ("t", len, {"timeout_ms": 0}, "timeout_ms"),
        ("t", len, {"timeout_ms": True}, "timeout_ms"),
        ("t", len, {"default_level": "loud"}, "default_level"),
        ("t", len, {"cache_policy": "forever"}, "cache_policy"),
    ],
)
def test_it_refuses_bad_registrations_naming_the_field(name, func, kwargs, field):
    with pytest.raises(ConfigError) as caught:
        ToolExecutor(token_counter=COUNTER).register(name, func, **kwargs)
    assert caught.value.field == field


def test_it_refuses_to_register_an_undecorated_function():
    with pytest.raises(ConfigError):
        ToolExecutor(token_counter=COUNTER).register_tool(len)


# --------------------------------------------------------------------------- concurrency


def test_it_serves_several_threads_at_once(tmp_path):
    ex = ToolExecutor(
        token_counter=COUNTER,
        artifact_store=ArtifactStore(tmp_path),
        timeout_handler=ToolTimeoutHandler(max_workers=16),
    )
    ex.register("echo", lambda n: [{"n": n}] * (n % 5), cache_policy="cacheable")
    ex.register("fail", lambda: (_ for _ in ()).throw(ValueError("bad")))
    problems = []

    def agent(worker):
        for i in range(40):
            call_id = f"call_{worker}_{i}"
            result = ex.execute(call("echo", call_id, parameters={"n": i}, output_level="full" if i % 7 == 0 else None))
            if not result.success or result.tool_call_id != call_id:
                problems.append(result)
            failure = ex.execute(call("fail", call_id))
            if failure.success or failure.tool_call_id != call_id:
                problems.append(failure)

    threads = [threading.Thread(target=agent, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert problems == []
    assert ex.timeout_handler.threads_started <= 16
