"""Synchronous timeouts for synchronous tools (seeds v2.1: ``def`` tools, no asyncio).

The tool runs on a worker thread while the caller waits at most ``timeout_ms``.
Python cannot kill a thread, so on timeout the worker is *abandoned*: it is a
daemon thread that keeps running until the tool returns by itself, and its late
result (or exception) is discarded. Abandoned ("stuck") workers are bounded: at
most ``max_workers`` workers exist at once (default 32); when all of them are
stuck, new calls fail fast with a RESOURCE_ERROR instead of spawning more threads.
Workers whose calls finish are kept (a small idle pool) and reused, so a normal
call costs a hand-off between two threads, not a thread start.

``InlineTimeoutHandler`` is the other form the design documents describe: the tool
on the calling thread and a timer raising the timeout into it. No hand-off, but only
Python code can be interrupted; see its docstring for when to choose it.
"""

from __future__ import annotations

import contextvars
import ctypes
import functools
import heapq
import logging
import queue
import threading
import time
from typing import Any, Callable, Optional

from ._errors import ToolError, ToolErrorResponse, ToolErrorType
from ._exceptions import ToolTimeoutError
from ._models import ToolExecutionResult

logger = logging.getLogger("pipeline.tools")

DEFAULT_MAX_WORKERS = 32
DEFAULT_MAX_IDLE_WORKERS = 8


class WorkerLimitReached(ToolError):
    """Every worker is busy or stuck on a timed-out tool: the call was not started."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            ToolErrorType.RESOURCE_ERROR,
            f"All {limit} tool worker threads are busy or stuck on timed-out tools; "
            "the call was not started",
            code="WORKER_LIMIT",
        )


class _Job:
    __slots__ = ("func", "context", "done", "value", "error", "finished", "abandoned")

    def __init__(self, func: Callable[[], Any]) -> None:
        self.func = func
        self.context = contextvars.copy_context()  # tracing context follows the tool
        self.done = threading.Lock()
        self.done.acquire()  # released by the worker when the job ends
        self.value: Any = None
        self.error: Optional[BaseException] = None
        self.finished = False
        self.abandoned = False


class _Worker:
    """One daemon thread that runs jobs handed to it, one at a time.

    The caller that handed a job over owns the worker until the job ends, and gives
    it back to the idle list itself; the worker books nothing on the way back except
    after an abandoned job (so a call that finishes in time costs two thread
    switches and two uncontended lock round trips, nothing more)."""

    def __init__(self, handler: "ToolTimeoutHandler") -> None:
        self.jobs: queue.SimpleQueue[Optional[_Job]] = queue.SimpleQueue()
        self.handler = handler
        self.thread = threading.Thread(target=self._run, name="pipeline-tool-worker", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        handler = self.handler
        lock = handler._lock
        while True:
            try:
                job = self.jobs.get(timeout=handler.idle_seconds)
            except queue.Empty:
                if handler._retire(self):
                    return
                continue
            if job is None:  # no room in the idle list: this worker ends
                return
            try:
                job.value = job.context.run(job.func)
            except BaseException as exc:  # handed to the caller, who re-raises it
                job.error = exc
            job.func = None  # type: ignore[assignment]  # drop references early
            with lock:  # the race with a caller timing out this very moment
                job.finished = True
                abandoned = job.abandoned
            job.done.release()
            if abandoned and not handler._reclaim(self, job):
                return


class _OnDefaultHandler:
    """A method that, called on the class (the seeds' ``@staticmethod`` form,
    ``ToolTimeoutHandler.execute_with_timeout(func=..., ...)``), runs on the
    process-wide handler, and on an instance runs on that instance."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self._func = func
        functools.update_wrapper(self, func)  # type: ignore[arg-type]

    def __get__(self, obj: Any, owner: Any = None) -> Callable[..., Any]:
        return self._func.__get__(obj if obj is not None else get_timeout_handler(), owner)


class ToolTimeoutHandler:
    """Runs a callable with a timeout on a bounded, reused set of worker threads."""

    def __init__(
        self,
        max_workers: int = DEFAULT_MAX_WORKERS,
        max_idle_workers: int = DEFAULT_MAX_IDLE_WORKERS,
        idle_seconds: float = 60.0,
    ) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        if max_idle_workers < 0:
            raise ValueError("max_idle_workers must not be negative")
        self.max_workers = max_workers
        self.max_idle_workers = min(max_idle_workers, max_workers)
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)  # a busy worker became free
        self._waiting = 0  # callers waiting in _freed for a worker
        self._idle: list[_Worker] = []
        self._busy = 0  # workers running a job, abandoned ones included (<= max_workers)
        self._workers = 0  # live worker threads
        self._stuck = 0  # workers still running an abandoned job
        self._started = 0  # threads ever started (for tests and diagnostics)

    # ------------------------------------------------------------------ counters

    @property
    def stuck_workers(self) -> int:
        return self._stuck

    @property
    def live_workers(self) -> int:
        return self._workers

    @property
    def threads_started(self) -> int:
        return self._started

    # ------------------------------------------------------------------ running

    @_OnDefaultHandler
    def execute_with_timeout(
        self, func: Callable[[], Any], tool_call_id: str, timeout_ms: float = 30_000
    ) -> Any:
        """Return ``func()``, or raise ToolTimeoutError (alias TimeoutException, a
        TimeoutError) after ``timeout_ms``. Callable on the class as the seeds
        write it (then on the process-wide handler) or on an instance.

        Exceptions raised by ``func`` propagate as themselves. On timeout the worker
        thread is abandoned (it cannot be killed): it runs on until the tool
        returns, and that late result is discarded. Raises WorkerLimitReached (a
        RESOURCE_ERROR ToolError) when no worker can take the call.
        """
        if not timeout_ms or timeout_ms <= 0:
            raise ValueError("timeout_ms must be positive")
        timeout = timeout_ms / 1000.0
        worker, timeout = self._take(timeout)
        job = _Job(func)
        worker.jobs.put(job)
        if not job.done.acquire(timeout=timeout):
            with self._lock:
                if not job.finished:  # the worker did not win the race: abandon it
                    job.abandoned = True
                    self._stuck += 1
            if job.abandoned:  # the worker gives itself back when the tool returns
                logger.warning(
                    "tool call %s timed out after %sms; its worker thread is abandoned",
                    tool_call_id,
                    timeout_ms,
                )
                raise ToolTimeoutError(
                    f"Tool call {tool_call_id} timed out after {timeout_ms:g}ms"
                )
            job.done.acquire()  # finished just now: the release is imminent
        self._give_back(worker)
        if job.error is not None:
            error, job.error = job.error, None
            raise error
        return job.value

    def _take(self, timeout: float) -> tuple[_Worker, float]:
        """A worker for one call (idle, or a new thread), and what is left of the
        timeout after waiting for one when all ``max_workers`` were busy."""
        with self._lock:
            if self._stuck >= self.max_workers:
                raise WorkerLimitReached(self.max_workers)
            if self._busy >= self.max_workers:
                # Every worker is busy: wait for one, but within this call's timeout.
                deadline = time.monotonic() + timeout
                self._waiting += 1
                try:
                    while self._busy >= self.max_workers:
                        left = deadline - time.monotonic()
                        if left <= 0 or self._stuck >= self.max_workers:
                            raise WorkerLimitReached(self.max_workers)
                        self._freed.wait(left)
                finally:
                    self._waiting -= 1
                timeout = max(deadline - time.monotonic(), 0.001)
            self._busy += 1
            if self._idle:
                return self._idle.pop(), timeout
            self._workers += 1
            self._started += 1
        try:
            return _Worker(self), timeout
        except BaseException:
            with self._lock:
                self._workers -= 1
                self._busy -= 1
                self._notify_freed()
            raise

    def _give_back(self, worker: _Worker) -> None:
        """The caller's call ended in time: its worker goes idle (or ends)."""
        with self._lock:
            keep = self._park(worker)
        if not keep:
            worker.jobs.put(None)

    def _reclaim(self, worker: _Worker, job: _Job) -> bool:
        """An abandoned job ended: book its late result away and say whether the
        worker stays (idle) or ends."""
        with self._lock:
            self._stuck -= 1
            job.value = job.error = None  # the late result is discarded
            return self._park(worker)

    def _park(self, worker: _Worker) -> bool:
        """A worker's job ended: it goes idle, or ends when the idle list is full
        (returns which). Caller holds the lock."""
        self._busy -= 1
        keep = len(self._idle) < self.max_idle_workers
        if keep:
            self._idle.append(worker)
        else:
            self._workers -= 1
        self._notify_freed()
        return keep

    def _notify_freed(self) -> None:
        """Caller holds the lock."""
        if self._waiting:
            self._freed.notify()

    def _retire(self, worker: _Worker) -> bool:
        """An idle worker that waited ``idle_seconds`` for work ends, unless a caller
        took it from the idle list at that very moment."""
        with self._lock:
            if worker in self._idle:
                self._idle.remove(worker)
                self._workers -= 1
                return True
        return False

    # ------------------------------------------------------------------ results

    @staticmethod
    def validate_input_size(parameters: Any, max_size_mb: float = 10) -> bool:
        """Whether a call's parameters are at most ``max_size_mb`` MiB (seeds v2.0).

        Measured as their JSON encoding: the seeds' ``sys.getsizeof`` counts only
        the outer dict, so 1 GB of text under one key passed."""
        from ._levels import to_json

        size = len(to_json(parameters).encode("utf-8", "surrogatepass"))
        return size <= max_size_mb * 1024 * 1024

    @staticmethod
    def create_timeout_result(
        tool_call_id: str, timeout_ms: float, **fields: Any
    ) -> ToolExecutionResult:
        """The error result of a timed-out call (returned, not raised), in the
        standard error observation."""
        return ToolErrorResponse(
            tool_call_id=tool_call_id,
            error_type=ToolErrorType.TIMEOUT,
            error_code=ToolErrorType.TIMEOUT.default_code,
            error_message=f"Tool execution timed out after {timeout_ms:g}ms",
        ).to_result(**fields)


class _Overrun(BaseException):
    """Raised into a tool that ran past its deadline on the calling thread. A
    BaseException, so a tool's ``except Exception`` cannot swallow it."""


class _Deadline:
    __slots__ = ("at", "ident", "done", "fired")

    def __init__(self, at: float, ident: int) -> None:
        self.at = at
        self.ident = ident
        self.done = False
        self.fired = False

    def __lt__(self, other: "_Deadline") -> bool:
        return self.at < other.at


def _raise_in(ident: int, exception: Optional[type]) -> None:
    """Have thread ``ident`` raise ``exception`` at its next bytecode (None clears
    a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(ident), ctypes.py_object(exception) if exception is not None else None
    )


class InlineTimeoutHandler:
    """The seeds' synchronous timeout handler (v2.1: the tool runs on the calling
    thread, a timer raises the timeout): no hand-off to a worker thread, so a call
    costs tens of microseconds less, and the tool runs on the agent's own thread.

    The deadline is enforced by one watchdog thread per handler, which raises
    the timeout into the calling thread. Python code is interrupted at once (even
    inside ``except Exception``); a tool blocked inside C (a socket read without a
    timeout, ``time.sleep``, a lock) is interrupted only when that call returns.
    So use it for tools that compute in Python (parsers, formatters, in-memory
    lookups), and ToolTimeoutHandler (the default: a hard deadline, the stuck
    worker abandoned) for tools that wait on I/O.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._armed: list[_Deadline] = []
        self._thread: Optional[threading.Thread] = None
        self._waiting_until = float("inf")

    def execute_with_timeout(
        self, func: Callable[[], Any], tool_call_id: str, timeout_ms: float = 30_000
    ) -> Any:
        """Return ``func()`` run on this thread, or raise ToolTimeoutError when it
        runs past ``timeout_ms`` (see the class for what can be interrupted)."""
        if not timeout_ms or timeout_ms <= 0:
            raise ValueError("timeout_ms must be positive")
        deadline = _Deadline(time.monotonic() + timeout_ms / 1000.0, threading.get_ident())
        self._arm(deadline)
        try:
            try:
                return func()
            finally:
                self._disarm(deadline)
        except _Overrun:
            if not deadline.fired:  # an outer call's deadline (a tool calling tools): its turn
                raise
            logger.warning("tool call %s timed out after %sms on the calling thread", tool_call_id, timeout_ms)
            raise ToolTimeoutError(f"Tool call {tool_call_id} timed out after {timeout_ms:g}ms") from None

    def _arm(self, deadline: _Deadline) -> None:
        with self._lock:
            heapq.heappush(self._armed, deadline)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._watch, name="pipeline-tool-watchdog", daemon=True)
                self._thread.start()
            elif deadline.at < self._waiting_until:
                self._wake.notify()  # earlier than the watchdog's next look (a rare, short timeout)

    def _disarm(self, deadline: _Deadline) -> None:
        with self._lock:
            deadline.done = True
            if deadline.fired:  # raised into this thread, maybe not delivered yet: the tool has returned
                _raise_in(deadline.ident, None)

    def _watch(self) -> None:
        with self._lock:
            while True:
                armed = self._armed
                while armed and armed[0].done:
                    heapq.heappop(armed)
                now = time.monotonic()
                while armed and armed[0].at <= now:
                    due = heapq.heappop(armed)
                    if not due.done:
                        due.fired = True
                        _raise_in(due.ident, _Overrun)
                self._waiting_until = armed[0].at if armed else now + 60.0
                self._wake.wait(self._waiting_until - now)
                self._waiting_until = float("inf")


_default_handler: Optional[ToolTimeoutHandler] = None
_default_lock = threading.Lock()


def get_timeout_handler() -> ToolTimeoutHandler:
    """The process-wide handler, so the stuck-worker bound holds across executors."""
    global _default_handler
    if _default_handler is None:
        with _default_lock:
            if _default_handler is None:
                _default_handler = ToolTimeoutHandler()
    return _default_handler
