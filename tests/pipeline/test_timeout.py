import contextvars
import threading
import time

import pytest

from pipeline import InlineTimeoutHandler, ToolErrorType, ToolTimeoutHandler, WorkerLimitReached, classify_exception, get_timeout_handler
from pipeline._exceptions import ToolTimeoutError


def wait_until(condition, limit=5.0):
    """Poll for a state change made by another thread (not a timing assertion)."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.005)


@pytest.fixture
def release():
    """An Event hanging tools block on; set at the end so abandoned workers finish."""
    event = threading.Event()
    yield event
    event.set()


def test_it_returns_the_value():
    assert ToolTimeoutHandler().execute_with_timeout(lambda: 42, "call_1", 1000) == 42


def test_it_reuses_one_worker_for_calls_that_finish():
    handler = ToolTimeoutHandler()
    for i in range(50):
        assert handler.execute_with_timeout(lambda i=i: i, "call", 1000) == i
    assert handler.threads_started == 1 and handler.live_workers == 1


@pytest.mark.parametrize("handler_class", [ToolTimeoutHandler, InlineTimeoutHandler])
def test_it_propagates_exceptions_as_themselves(handler_class):
    boom = LookupError("no such region")

    def tool():
        raise boom

    with pytest.raises(LookupError) as caught:
        handler_class().execute_with_timeout(tool, "call_1", 1000)
    assert caught.value is boom


def test_it_times_out_a_hanging_tool(release):
    handler = ToolTimeoutHandler()
    with pytest.raises(ToolTimeoutError, match="call_h timed out after 20ms"):
        handler.execute_with_timeout(release.wait, "call_h", 20)
    assert handler.stuck_workers == 1


def test_it_discards_the_late_result_and_reuses_the_worker(release):
    handler = ToolTimeoutHandler()
    with pytest.raises(ToolTimeoutError):
        handler.execute_with_timeout(lambda: release.wait() and "late", "call_h", 10)
    release.set()
    wait_until(lambda: handler.stuck_workers == 0)
    assert handler.execute_with_timeout(lambda: "fresh", "call_2", 1000) == "fresh"
    assert handler.threads_started == 1


def test_it_never_starts_more_threads_than_the_limit(release):
    handler = ToolTimeoutHandler(max_workers=4)
    outcomes = []
    for i in range(100):
        try:
            handler.execute_with_timeout(release.wait, f"call_{i}", 5)
        except (ToolTimeoutError, WorkerLimitReached) as exc:
            outcomes.append(type(exc))
    assert outcomes.count(ToolTimeoutError) == 4
    assert outcomes.count(WorkerLimitReached) == 96
    assert handler.threads_started == 4 and handler.stuck_workers == 4


def test_it_bounds_threads_under_concurrent_hanging_calls(release):
    handler = ToolTimeoutHandler(max_workers=4)
    errors = []

    def caller(n):
        for i in range(5):
            try:
                handler.execute_with_timeout(release.wait, f"call_{n}_{i}", 5)
            except (ToolTimeoutError, WorkerLimitReached) as exc:
                errors.append(exc)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 100
    assert handler.threads_started <= 4
    release.set()
    wait_until(lambda: handler.stuck_workers == 0)
    assert handler.execute_with_timeout(lambda: "ok", "after", 1000) == "ok"
    assert handler.threads_started <= 4


def test_a_caller_waits_for_a_busy_worker_within_its_timeout():
    handler = ToolTimeoutHandler(max_workers=1)
    started, go_on = threading.Event(), threading.Event()
    results = []

    def slow():
        started.set()
        go_on.wait(5)
        return "first"

    first = threading.Thread(target=lambda: results.append(handler.execute_with_timeout(slow, "c1", 5000)))
    first.start()
    assert started.wait(5)
    threading.Timer(0.05, go_on.set).start()  # frees the only worker while c2 waits
    assert handler.execute_with_timeout(lambda: "second", "c2", 5000) == "second"
    first.join()
    assert results == ["first"] and handler.threads_started == 1


def test_a_caller_gives_up_waiting_for_a_busy_worker_at_its_timeout(release):
    handler = ToolTimeoutHandler(max_workers=1)
    first = threading.Thread(target=lambda: handler.execute_with_timeout(release.wait, "c1", 5000))
    first.start()
    wait_until(lambda: handler.live_workers == 1)
    with pytest.raises(WorkerLimitReached):
        handler.execute_with_timeout(lambda: 1, "c2", 30)
    release.set()
    first.join()
    assert handler.execute_with_timeout(lambda: 3, "c3", 1000) == 3


def test_it_classifies_the_limit_as_a_resource_error(release):
    handler = ToolTimeoutHandler(max_workers=1)
    with pytest.raises(ToolTimeoutError):
        handler.execute_with_timeout(release.wait, "c1", 5)
    with pytest.raises(WorkerLimitReached) as caught:
        handler.execute_with_timeout(lambda: 1, "c2", 5)
    assert classify_exception(caught.value) is ToolErrorType.RESOURCE_ERROR
    assert caught.value.code == "WORKER_LIMIT"


def test_it_keeps_at_most_the_idle_limit_of_workers():
    handler = ToolTimeoutHandler(max_workers=8, max_idle_workers=2)
    gate = threading.Barrier(6)
    threads = [
        threading.Thread(target=handler.execute_with_timeout, args=(lambda: gate.wait(5), f"c{n}", 5000))
        for n in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert handler.threads_started == 6
    wait_until(lambda: handler.live_workers == 2)


def test_it_retires_idle_workers():
    handler = ToolTimeoutHandler(idle_seconds=0.01)
    handler.execute_with_timeout(lambda: None, "c", 1000)
    wait_until(lambda: handler.live_workers == 0)
    assert handler.execute_with_timeout(lambda: 7, "c", 1000) == 7


def test_it_carries_the_callers_context_to_the_tool():
    current = contextvars.ContextVar("current", default="none")
    current.set("span-123")
    assert ToolTimeoutHandler().execute_with_timeout(current.get, "c", 1000) == "span-123"


@pytest.mark.parametrize("timeout_ms", [0, -5, None])
def test_it_refuses_a_non_positive_timeout(timeout_ms):
    with pytest.raises(ValueError):
        ToolTimeoutHandler().execute_with_timeout(lambda: 1, "c", timeout_ms)


@pytest.mark.parametrize("kwargs", [{"max_workers": 0}, {"max_idle_workers": -1}])
def test_it_refuses_a_bad_configuration(kwargs):
    with pytest.raises(ValueError):
        ToolTimeoutHandler(**kwargs)


def test_it_makes_the_timeout_result_in_the_standard_shape():
    result = ToolTimeoutHandler.create_timeout_result("call_9", 3000, retry_count=1)
    assert not result.success and result.retry_count == 1
    assert (result.error_type, result.error_code) == ("timeout", "TIMEOUT")
    assert result.error_message == "Tool execution timed out after 3000ms"
    assert result.observation == result.format_error_observation()


def test_it_shares_one_default_handler():
    assert get_timeout_handler() is get_timeout_handler()
