"""Tool calls first, export second (pipeline/_priority.py): the exporters' threads
wait while the agent is busy calling tools, within bounds."""

from __future__ import annotations

import threading
import time

from pipeline import RecordExporter, ToolExecutor, ToolInvocationRequest, hook_executor
from pipeline import _priority
from pipeline._priority import MAX_DEFER_S, QUIET_S, agent_busy_for, call_ended, call_started


def test_it_asks_exporters_to_wait_during_a_short_call_and_just_after_it():
    call_started()
    try:
        assert agent_busy_for() == QUIET_S
    finally:
        call_ended()
    assert 0 < agent_busy_for() <= QUIET_S
    time.sleep(QUIET_S * 2)
    assert agent_busy_for() == 0


def test_it_lets_export_go_on_beside_a_long_call():
    call_started()
    try:
        time.sleep(MAX_DEFER_S * 2)
        assert agent_busy_for() == 0
    finally:
        call_ended()


def test_it_never_counts_below_zero():
    call_ended()
    call_ended()
    assert _priority._in_flight == 0


def test_it_marks_each_executor_call_in_flight():
    seen = []
    executor = ToolExecutor()
    executor.register("probe", lambda: seen.append(_priority._in_flight) or "ok")
    executor.execute(ToolInvocationRequest(tool_call_id="c1", tool_name="probe"))
    assert seen == [1] and _priority._in_flight == 0


def test_it_exports_a_burst_after_it_without_losing_anything(collector):
    executor = ToolExecutor()
    executor.register("rows", lambda: [{"id": i} for i in range(5)])
    exporter = RecordExporter(collector.url, "key", max_queue=2000)
    hook_executor(executor, exporter=exporter, conversation_id="burst")
    for i in range(400):  # back to back: exported after the burst
        executor.execute(ToolInvocationRequest(tool_call_id=f"c{i}", tool_name="rows"))
    assert exporter.flush(30)
    stats = exporter.stats()
    exporter.shutdown(5)
    assert stats.dropped == 0 and len({r["result"]["tool_call_id"] for r in collector.records}) == 400


def test_it_stops_deferring_at_four_fifths_and_resumes_below_a_fifth():
    from pipeline._delivery import DeliveryQueue

    queue = DeliveryQueue(name="t", encode=lambda item: (b"x", None), send=lambda batch: None, max_items=100,
                          max_bytes=1 << 20, batch_size=10, max_batch_bytes=1 << 20, interval_s=1.0)
    depth = [0]
    queue._depth = lambda: depth[0]  # type: ignore[method-assign]
    answers = []
    for depth[0] in (10, 79, 80, 50, 21, 20, 50):
        answers.append(queue._room_to_defer())
    assert answers == [True, True, False, False, False, True, True]


def test_it_delivers_while_a_long_tool_runs(collector):
    executor = ToolExecutor()
    started, release = threading.Event(), threading.Event()
    executor.register("quick", lambda: "ok")
    executor.register("long", lambda: started.set() or release.wait(10) or "done")
    exporter = RecordExporter(collector.url, "key", flush_interval_ms=20)
    hook_executor(executor, exporter=exporter, conversation_id="long")
    executor.execute(ToolInvocationRequest(tool_call_id="quick-1", tool_name="quick"))
    worker = threading.Thread(
        target=executor.execute, args=(ToolInvocationRequest(tool_call_id="long-1", tool_name="long"),)
    )
    worker.start()
    try:
        assert started.wait(5)
        deadline = time.monotonic() + 5
        while not collector.records and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [r["result"]["tool_call_id"] for r in collector.records] == ["quick-1"]
    finally:
        release.set()
        worker.join(5)
        exporter.shutdown(5)
