"""Tool calls first, export second: how the exporters' threads keep out of the
agent's way while it calls tools.

CPython runs one thread's Python at a time. An exporter thread building spans and
records holds that lock in stretches, and an agent thread that wants it back (each
tool call hands work to a worker thread and back) waits for the end of a stretch,
up to the interpreter's 5 ms switch interval: that was most of what telemetry cost a
tool call. So the executor marks each call in flight and when the last one ended (a
few integer and clock reads, no lock: this is a hint), and between items the
exporter threads wait, sleeping, while the agent is busy calling tools: during a
call that started less than ``MAX_DEFER_S`` ago, and for ``QUIET_S`` after the last
call ended. A burst of back-to-back calls is exported right after the burst.

Bounds: a long-running tool (over ``MAX_DEFER_S``: real I/O, where the agent waits
anyway) does not hold export up, and a delivery queue stops deferring once it is
four-fifths full and starts again only when it is down to a fifth, so a burst longer
than the queue is caught up with at full speed, as without deferring.
"""

from __future__ import annotations

import time
from typing import Callable

MAX_DEFER_S = 0.002  # a call running longer than this is not short: export goes on beside it
QUIET_S = 0.001  # the agent counts as busy this long after its last tool call ended

_in_flight = 0
_started = 0.0
_ended = -1.0


def call_started() -> None:
    global _in_flight, _started
    _started = time.perf_counter()
    _in_flight += 1


def call_ended() -> None:
    global _in_flight, _ended
    _in_flight = max(0, _in_flight - 1)
    _ended = time.perf_counter()


def agent_busy_for() -> float:
    """Seconds an exporter thread should wait before its next item (0: go on)."""
    now = time.perf_counter()
    if _in_flight > 0:
        return QUIET_S if now - _started < MAX_DEFER_S else 0.0
    return max(0.0, QUIET_S - (now - _ended))


def defer_to_tool_calls(may_wait: Callable[[], bool]) -> None:
    """Called by an exporter thread between items: sleep while the agent is busy
    calling tools and ``may_wait()`` (its queue has room) says so."""
    wait = agent_busy_for()
    while wait > 0 and may_wait():
        time.sleep(wait)
        wait = agent_busy_for()
