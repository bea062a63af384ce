"""InlineTimeoutHandler: the seeds' synchronous timeout (the tool on the calling
thread, a watchdog raising the timeout into it)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from pipeline import InlineTimeoutHandler, ToolErrorType, ToolExecutor, ToolInvocationRequest
from pipeline._exceptions import ToolTimeoutError


def spin(seconds: float) -> str:
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        pass
    return "done"


def test_it_runs_the_tool_on_the_calling_thread_with_its_context():
    current = contextvars.ContextVar("current", default="none")
    current.set("span-7")
    handler = InlineTimeoutHandler()
    assert handler.execute_with_timeout(lambda: (threading.get_ident(), current.get()), "c", 1000) == (
        threading.get_ident(), "span-7")


def test_it_interrupts_python_code_at_the_deadline():
    started = time.monotonic()
    with pytest.raises(ToolTimeoutError, match="call_s timed out after 50ms"):
        InlineTimeoutHandler().execute_with_timeout(lambda: spin(30), "call_s", 50)
    assert time.monotonic() - started < 10


def test_a_tool_cannot_swallow_the_timeout():
    def stubborn():
        for _ in range(1000):
            try:
                spin(30)
            except Exception:  # noqa: BLE001 - what a careless tool does
                continue
        return "never"

    with pytest.raises(ToolTimeoutError):
        InlineTimeoutHandler().execute_with_timeout(stubborn, "c", 50)


def test_a_tool_blocked_in_c_is_interrupted_when_that_call_returns():
    started = time.monotonic()
    with pytest.raises(ToolTimeoutError):
        InlineTimeoutHandler().execute_with_timeout(lambda: (time.sleep(0.3), spin(30)), "c", 50)
    assert 0.25 < time.monotonic() - started < 10  # the documented limit: not before sleep returns


def test_no_timeout_escapes_after_the_call_ends():
    """Calls ending right at their deadline: each returns or times out inside the
    call, never later in the caller's own code."""
    handler = InlineTimeoutHandler()
    outcomes = {"done": 0, "timeout": 0}
    for _ in range(300):
        try:  # sleep returns about when the watchdog fires: sometimes just after the tool returned
            outcomes[handler.execute_with_timeout(lambda: time.sleep(0.002) or "done", "c", 2)] += 1
        except ToolTimeoutError:
            outcomes["timeout"] += 1
        total = 0
        for i in range(20_000):  # the caller's own work right after the call
            total += i
        assert total == 199_990_000
    spin(0.05)  # time for any stray delivery
    assert sum(outcomes.values()) == 300


def test_it_serves_several_threads_each_with_its_own_deadline():
    handler = InlineTimeoutHandler()
    results = {}

    def caller(name, seconds, timeout_ms):
        try:
            results[name] = handler.execute_with_timeout(lambda: spin(seconds), name, timeout_ms)
        except ToolTimeoutError:
            results[name] = "timeout"

    threads = [threading.Thread(target=caller, args=("slow", 30, 100)),
               threading.Thread(target=caller, args=("fast", 0.01, 20_000))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert results == {"slow": "timeout", "fast": "done"}


def test_an_outer_deadline_is_not_taken_for_an_inner_calls():
    handler = InlineTimeoutHandler()

    def outer():
        try:
            return handler.execute_with_timeout(lambda: spin(30), "inner", 20_000)
        except ToolTimeoutError:
            return "inner timed out"  # wrong: it was the outer call's deadline

    with pytest.raises(ToolTimeoutError, match="outer timed out"):
        handler.execute_with_timeout(outer, "outer", 100)


@pytest.mark.parametrize("timeout_ms", [0, -5])
def test_it_refuses_a_non_positive_timeout(timeout_ms):
    with pytest.raises(ValueError):
        InlineTimeoutHandler().execute_with_timeout(lambda: 1, "c", timeout_ms)


def test_the_executor_gives_a_timeout_result_for_a_runaway_tool_inline():
    executor = ToolExecutor(timeout_handler=InlineTimeoutHandler())
    executor.register("runaway", lambda: spin(30), timeout_ms=50)
    executor.register("quick", lambda: [1, 2, 3])
    result = executor.execute(ToolInvocationRequest(tool_call_id="c1", tool_name="runaway", retry_on_timeout=False))
    assert not result.success and result.error_type == ToolErrorType.TIMEOUT.value
    assert executor.execute(ToolInvocationRequest(tool_call_id="c2", tool_name="quick")).success


def test_the_executor_still_runs_an_async_tool_to_completion_inline():
    async def lookup(region: str) -> dict:
        await asyncio.sleep(0.01)
        return {"region": region}

    executor = ToolExecutor(timeout_handler=InlineTimeoutHandler())
    executor.register("lookup", lookup)
    result = executor.execute(ToolInvocationRequest(tool_call_id="c1", tool_name="lookup", parameters={"region": "扬州"}))
    assert result.success and "扬州" in result.observation
