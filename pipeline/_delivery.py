"""One delivery engine under every exporter: a bounded queue, a sending thread that
retries while the queue has room, and an optional spool.

The record exporter, its artifact uploads and the span exporter differ only in how an
item becomes bytes (``encode``) and how a batch is sent (``send``); the rest is here:

- ``put`` is all the agent thread does: append to an in-memory intake under a lock
  held for a few deque operations. It never waits on the network or the disk.
- The intake is ``absorbed`` every ``interval``: each item is built and encoded,
  appended to the spool, and moved to the pending queue, bounded in items and bytes.
  Overflow drops the oldest, counted. Without a spool the sending thread absorbs;
  with one, a spooling thread does it every 100 ms whatever the network does (a
  dashboard that hangs a request for 10 s must not keep records off the disk).
- It sends batches from the head of the pending queue. Connection errors, timeouts,
  408, 429 and 5xx are retried with capped exponential backoff and jitter (honouring
  ``Retry-After``) for as long as the queue has room, by default with no limit on
  attempts; a batch refused outright (another 4xx) is dropped and counted with its
  reason; 413 halves the batch. While it waits out a backoff it keeps absorbing, so
  the spool stays current during an outage.

Accounting, at any time (``stats()``)::

    submitted + replayed == sent + rejected + dropped + failures + filtered
                            + queue_depth + kept_in_spool

``reasons`` breaks the losses down (overflow, http_400, retries_exhausted, ...).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import timezone
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Mapping, Optional, Protocol

from ._priority import defer_to_tool_calls
from ._spool import Spool

logger = logging.getLogger("pipeline.exporter")

Headers = Mapping[str, str]
MAX_RESPONSE_BYTES = 1 << 20  # an answer bigger than this is not one we asked for
YIELD_S = 0.0005  # longest stretch the sending thread works without offering the GIL


class Transport(Protocol):
    """One HTTP exchange. Raise OSError (or any exception) when no answer came back:
    the exporter treats that as a connection failure and retries."""

    def send(
        self, method: str, url: str, headers: Headers, body: bytes, timeout: float
    ) -> tuple[int, Headers, bytes]: ...


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect would turn a POST into a GET without its body; treat it as the answer.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class UrllibTransport:
    """The default transport: the standard library, so agents need no HTTP client."""

    def __init__(self) -> None:
        self._opener = urllib.request.build_opener(_NoRedirect())

    def send(
        self, method: str, url: str, headers: Headers, body: bytes, timeout: float
    ) -> tuple[int, Headers, bytes]:
        request = urllib.request.Request(url, data=body or None, headers=dict(headers), method=method)
        try:
            with self._opener.open(request, timeout=timeout) as response:
                return response.status, dict(response.headers), response.read(MAX_RESPONSE_BYTES)
        except urllib.error.HTTPError as error:
            with error:
                return error.code, dict(error.headers or {}), error.read(MAX_RESPONSE_BYTES)


def protobuf_headers(headers: Mapping[str, str], gzip_body: bool) -> dict[str, str]:
    """The headers of an OTLP/HTTP protobuf request."""
    out = {"Content-Type": "application/x-protobuf", **headers}
    if gzip_body:
        out["Content-Encoding"] = "gzip"
    return out


@dataclass(frozen=True)
class DeliveryStats:
    """Counters of one delivery queue since it started (items, except where named)."""

    submitted: int = 0  # put() calls, junk refused locally included
    sent: int = 0  # acknowledged by the receiver (duplicates included)
    duplicates: int = 0  # acknowledged as already stored (a retried batch)
    rejected: int = 0  # refused one by one: by the receiver, or junk refused locally
    dropped: int = 0  # queue overflow (oldest first) or put after shutdown
    failures: int = 0  # given up after trying: batch refused (4xx), retries exhausted, shutdown
    filtered: int = 0  # decided not to send when built (e.g. a span sampled out)
    retries: int = 0  # attempts repeated
    queue_depth: int = 0
    queue_bytes: int = 0  # encoded bytes waiting (items not encoded yet count 0)
    reasons: Mapping[str, int] = field(default_factory=dict)  # why items were not delivered
    replayed: int = 0  # found in the spool at start (queued by an earlier process)
    spooled: int = 0  # written to the spool
    kept_in_spool: int = 0  # still in the spool at shutdown: the next start sends them
    spool_errors: int = 0
    spool_bytes: int = 0
    spool_lag_ms_max: float = 0.0  # longest put-to-spool delay: what kill -9 can lose
    last_error: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True, kw_only=True)
class Outcome:
    """What happened to one batch, as the sender saw it."""

    delivered: int = 0
    duplicates: int = 0
    rejected: int = 0  # of the delivered, refused one by one by the receiver
    retry: bool = False  # nothing arrived: try the batch again
    retry_after: Optional[float] = None
    refused: Optional[str] = None  # the batch was refused outright, for this reason
    too_large: bool = False
    error: Optional[str] = None


class Refused(Exception):
    """Raised by ``encode`` for an item that can never be sent (counted as rejected)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


def retry_after_seconds(headers: Headers, cap: float, now: float) -> Optional[float]:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date), capped."""
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = when.timestamp() - now
    if seconds != seconds:  # NaN
        return None
    return max(0.0, min(cap, seconds))


def http_outcome(status: int, headers: Headers, body: bytes, *, max_retry_after_s: float, now: float) -> Optional[Outcome]:
    """The outcome of a non-2xx answer (None for 2xx: the caller reads the body)."""
    if 200 <= status < 300:
        return None
    detail = f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}"
    if status in (408, 429) or status >= 500:
        return Outcome(retry=True, retry_after=retry_after_seconds(headers, max_retry_after_s, now), error=detail)
    if status == 413:
        return Outcome(too_large=True, error=detail)
    return Outcome(refused=f"http_{status}", error=detail)


def exchange(transport: Transport, method: str, url: str, headers: Headers, body: bytes, timeout: float,
             *, max_retry_after_s: float, now: float) -> tuple[Optional[Outcome], bytes]:
    """One HTTP attempt: (None, body) on 2xx, else (the outcome to act on, b"")."""
    try:
        status, answer_headers, answer = transport.send(method, url, headers, body, timeout)
    except Exception as exc:  # refused, reset, timed out: retry
        return Outcome(retry=True, error=f"{method} {url}: {type(exc).__name__}: {str(exc)[:200]}"), b""
    outcome = http_outcome(status, answer_headers, answer, max_retry_after_s=max_retry_after_s, now=now)
    if outcome is not None and outcome.error:
        outcome.error = f"{method} {url}: {outcome.error}"
    return outcome, answer


class _Entry:
    __slots__ = ("payload", "meta", "size", "seq", "queued_at")

    def __init__(self, payload: Any, meta: Any, size: int, seq: Optional[int], queued_at: float) -> None:
        self.payload = payload
        self.meta = meta
        self.size = size
        self.seq = seq
        self.queued_at = queued_at


Encoded = tuple[Any, Any]  # (payload: bytes to send and spool, or any object; meta for the sender)


class DeliveryQueue:
    """A bounded queue and the daemon thread that delivers it.

    ``encode(item) -> (payload, meta) | None`` runs on the thread (None: filtered;
    raise Refused for junk); ``send(entries) -> Outcome`` does one attempt.
    ``monotonic`` and ``wait(event, seconds)`` make time injectable (a fake clock in
    tests, a compressed one in the outage benchmark); ``sleep``, when given, replaces
    waiting out a backoff altogether (tests that only record the delays).
    """

    def __init__(
        self,
        *,
        name: str,
        encode: Callable[[Any], Optional[Encoded]],
        send: Callable[[list[_Entry]], Outcome],
        max_items: int,
        max_bytes: int,
        batch_size: int,
        max_batch_bytes: int,
        interval_s: float,
        spool: Optional[Spool] = None,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        max_retries: Optional[int] = None,
        jitter: Callable[[], float] = random.random,
        sleep: Optional[Callable[[float], Any]] = None,
        monotonic: Callable[[], float] = time.monotonic,
        wait: Optional[Callable[[threading.Event, float], Any]] = None,
    ) -> None:
        if max_items < 1 or max_bytes < 1 or batch_size < 1 or max_batch_bytes < 1:
            raise ValueError("queue and batch bounds must be positive")
        if max_retries is not None and max_retries < 0:
            raise ValueError("max_retries must be >= 0 or None (retry while the queue has room)")
        if interval_s <= 0 or backoff_s < 0 or max_backoff_s < 0:
            raise ValueError("interval must be positive and backoff not negative")
        self.name = name
        self._encode = encode
        self._send = send
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.batch_size = batch_size
        self.max_batch_bytes = max_batch_bytes
        self.interval_s = interval_s
        # With a spool, absorb often: what is not on disk yet is what a crash loses.
        self.absorb_interval_s = min(interval_s, 0.1) if spool is not None else interval_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_retries = max_retries
        self._jitter = jitter
        self._sleep = sleep
        self._monotonic = monotonic
        self._wait = wait or (lambda event, seconds: event.wait(seconds))
        self._spool = spool

        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._intake: deque[tuple[Any, float]] = deque()
        self._deferring = True  # see _room_to_defer
        self._absorbing = 0
        self._pending: deque[_Entry] = deque()
        self._pending_bytes = 0
        self._in_flight: list[_Entry] = []
        self._closed = False
        self._flushing = 0
        self._attempt = 0  # consecutive retryable failures of the head batch
        self._next_attempt = 0.0
        self._batch_limit = batch_size  # halved by 413 until a batch gets through
        self._counts = {name: 0 for name in ("submitted", "sent", "duplicates", "rejected", "dropped",
                                             "failures", "filtered", "retries", "kept_in_spool")}
        self._reasons: dict[str, int] = {}
        self._lag_max = 0.0
        self._last_error: Optional[str] = None
        self._warned: set[str] = set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._spooler = threading.Thread(target=self._run_spooler, name=f"{name}-spool", daemon=True) if spool else None

    # --- any thread -----------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if not self._thread.is_alive() and not self._closed and not self._stop.is_set():
                self._thread.start()
                if self._spooler is not None:
                    self._spooler.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def put(self, item: Any) -> bool:
        """Queue one item (the agent thread's whole cost). False after shutdown."""
        queued_at = self._monotonic()
        with self._lock:
            self._counts["submitted"] += 1
            if self._closed:
                self._lose("dropped", "closed", 1)
                return False
            intake = self._intake
            if len(intake) >= self.max_items:
                intake.popleft()
                self._lose("dropped", "overflow", 1)
            intake.append((item, queued_at))
            full = len(intake) == self.batch_size
        if full:
            self._wake.set()
        return True

    def refuse(self, reason: str) -> None:
        """Count an item refused before it was queued (junk the caller detected)."""
        with self._lock:
            self._counts["submitted"] += 1
            self._lose("rejected", reason, 1)

    def stats(self) -> DeliveryStats:
        spool = self._spool
        with self._lock:
            return DeliveryStats(
                **self._counts,
                queue_depth=self._depth(),
                queue_bytes=self._pending_bytes + sum(e.size for e in self._in_flight),
                reasons=dict(self._reasons),
                replayed=spool.replayed if spool else 0,
                spooled=spool.spooled if spool else 0,
                spool_errors=spool.errors if spool else 0,
                spool_bytes=spool.size_bytes if spool and spool.enabled else 0,
                spool_lag_ms_max=self._lag_max * 1000.0,
                last_error=self._last_error,
            )

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far was delivered or given up; bounded."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._idle:
            self._flushing += 1
        try:
            self._wake.set()
            with self._idle:
                while self._depth():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._thread.is_alive():
                        return False
                    self._idle.wait(min(remaining, 0.05))
            return True
        finally:
            with self._idle:
                self._flushing -= 1

    def shutdown(self, timeout: float) -> bool:
        """Deliver what can be delivered within ``timeout`` s, then stop; never hangs.

        What is left is kept for the next start when it is in the spool, else counted
        as ``failures`` (reason ``shutdown``). True when nothing was left."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._lock:
            already = self._closed
            self._closed = True
        if already:
            return not self._thread.is_alive()
        if self._thread.is_alive():
            self.flush(max(0.0, deadline - time.monotonic()) * 0.8)
        self._stop.set()
        self._wake.set()
        for thread in (self._spooler, self._thread):  # the spooler writes what is left first
            if thread is not None and thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))
        alive = self._thread.is_alive() or (self._spooler is not None and self._spooler.is_alive())
        with self._lock:
            kept = lost = 0
            for entry in self._pending:
                if entry.seq is not None and self._spool is not None and self._spool.enabled:
                    kept += 1
                else:
                    lost += 1
            lost += len(self._intake)
            if not alive:
                lost += len(self._in_flight) + self._absorbing
                self._in_flight, self._absorbing = [], 0
            self._pending.clear()
            self._intake.clear()
            self._pending_bytes = 0
            self._counts["kept_in_spool"] += kept
            if lost:
                self._lose("failures", "shutdown", lost)
                self._last_error = f"shutdown with {lost} unsent"
            left = self._depth()
        if not alive and self._spool is not None:
            self._spool.close()
        if lost:
            logger.warning("%s stopped with %d unsent%s", self.name, lost,
                           f" ({kept} kept in the spool)" if kept else "")
        elif kept:
            logger.info("%s stopped with %d kept in the spool for the next start", self.name, kept)
        return not (lost or kept or left)

    # --- the sending thread ---------------------------------------------------------

    def _run(self) -> None:
        spooled = self._spool is not None  # then the spooling thread absorbs
        while True:
            try:
                if not spooled:
                    self._absorb()
                if self._stop.is_set():
                    break
                now = self._monotonic()
                if self._due(now):
                    defer_to_tool_calls(self._room_to_defer)  # a burst of tool calls goes first
                    self._send_next()
                    continue
                self._wait(self._wake, self._until_next(now))
                self._wake.clear()
            except Exception as exc:  # the thread must outlive any bug in one batch
                logger.exception("%s loop error", self.name)
                self._note(f"exporter error: {exc!r}"[:300])
                self._wait(self._stop, self.interval_s)

    def _run_spooler(self) -> None:
        self._replay()
        while True:
            try:
                self._absorb()
                if len(self._pending) >= self._batch_limit:
                    self._wake.set()
            except Exception as exc:
                logger.exception("%s spool loop error", self.name)
                self._note(f"spool error: {exc!r}"[:300])
            if self._stop.is_set():
                break  # after one last absorb: what was submitted before shutdown is on disk
            self._wait(self._stop, self.absorb_interval_s)
        self._spool.commit()  # type: ignore[union-attr]

    def _replay(self) -> None:
        spool = self._spool
        assert spool is not None
        found = spool.open()
        if not found:
            return
        now = self._monotonic()
        entries = [_Entry(payload, None, len(payload), seq, now) for seq, payload in found]
        with self._lock:
            self._pending.extend(entries)
            self._pending_bytes += sum(e.size for e in entries)
            dropped = self._bound()
        spool.done(e.seq for e in dropped)
        logger.info("%s: %d queued by an earlier process found in the spool", self.name, len(found))

    def _absorb(self) -> None:
        with self._lock:
            if not self._intake:
                return
            items, self._intake = self._intake, deque()
            self._absorbing = len(items)
        entries: list[_Entry] = []
        losses: dict[tuple[str, str], int] = {}
        yielded = time.perf_counter()
        for item, queued_at in items:
            defer_to_tool_calls(self._room_to_defer)  # a burst of tool calls goes first
            # Let a waiting agent thread have the GIL every YIELD_S of work: building
            # one item is short, a whole batch is not, and the agent must not wait on
            # us for long (the interpreter alone would make it wait 5 ms).
            if time.perf_counter() - yielded > YIELD_S:
                time.sleep(0)
                yielded = time.perf_counter()
            try:
                encoded = self._encode(item)
            except Refused as refused:
                losses[("rejected", refused.reason)] = losses.get(("rejected", refused.reason), 0) + 1
                self._warn_once(refused.reason, "%s: an item could not be sent: %s", self.name, str(refused)[:200])
                continue
            except Exception as exc:  # a bug building one item must not lose the others
                losses[("rejected", "encode_error")] = losses.get(("rejected", "encode_error"), 0) + 1
                self._warn_once("encode_error", "%s: an item could not be encoded: %r", self.name, exc)
                continue
            if encoded is None:
                losses[("filtered", "filtered")] = losses.get(("filtered", "filtered"), 0) + 1
                continue
            payload, meta = encoded
            size = len(payload) if isinstance(payload, (bytes, bytearray)) else 0
            entries.append(_Entry(payload, meta, size, None, queued_at))
        spool = self._spool
        if spool is not None and spool.enabled and entries:
            spoolable = [e for e in entries if isinstance(e.payload, (bytes, bytearray))]
            for entry, seq in zip(spoolable, spool.append([e.payload for e in spoolable])):
                entry.seq = seq
            written = self._monotonic()
            lag = max((written - e.queued_at for e in spoolable if e.seq is not None), default=0.0)
        else:
            lag = 0.0
        with self._lock:
            self._absorbing = 0
            for (counter, reason), n in losses.items():
                self._lose(counter, reason, n)
            self._pending.extend(entries)
            self._pending_bytes += sum(e.size for e in entries)
            self._lag_max = max(self._lag_max, lag)
            dropped = self._bound()
            self._idle.notify_all()
        if spool is not None:
            spool.done(e.seq for e in dropped)
            spool.commit()

    def _bound(self) -> list[_Entry]:
        """Drop the oldest pending entries beyond the bounds (lock held)."""
        dropped: list[_Entry] = []
        pending = self._pending
        while pending and (len(pending) + len(self._intake) > self.max_items or self._pending_bytes > self.max_bytes):
            entry = pending.popleft()
            self._pending_bytes -= entry.size
            dropped.append(entry)
        if dropped:
            by_bytes = self._pending_bytes + sum(e.size for e in dropped) > self.max_bytes
            self._lose("dropped", "overflow_bytes" if by_bytes else "overflow", len(dropped))
            self._warn_once("overflow", "%s queue is full: dropping the oldest (counted in stats)", self.name)
        return dropped

    def _due(self, now: float) -> bool:
        with self._lock:  # the spooling thread may be trimming the queue
            if not self._pending or now < self._next_attempt:
                return False
            return (
                len(self._pending) >= self._batch_limit
                or self._pending_bytes >= self.max_batch_bytes
                or self._flushing > 0
                or self._closed
                or now - self._pending[0].queued_at >= self.interval_s
            )

    def _until_next(self, now: float) -> float:
        timeout = self.absorb_interval_s
        with self._lock:
            if self._pending:
                if now < self._next_attempt:
                    timeout = min(timeout, self._next_attempt - now)
                else:
                    timeout = min(timeout, self._pending[0].queued_at + self.interval_s - now)
        return max(0.001, timeout)

    def _send_next(self) -> None:
        with self._lock:
            batch: list[_Entry] = []
            size = 0
            while self._pending and len(batch) < self._batch_limit:
                entry = self._pending[0]
                if batch and size + entry.size > self.max_batch_bytes:
                    break
                self._pending.popleft()
                self._pending_bytes -= entry.size
                size += entry.size
                batch.append(entry)
            self._in_flight = batch
        try:
            outcome = self._send(batch)
        except Exception as exc:  # a sender bug: treat like a failed attempt, keep the data
            logger.exception("%s: sending a batch failed", self.name)
            outcome = Outcome(retry=True, error=f"sender error: {exc!r}"[:300])
        self._settle(batch, outcome)

    def _settle(self, batch: list[_Entry], outcome: Outcome) -> None:
        done: list[_Entry] = []
        delay: Optional[float] = None
        with self._lock:
            self._in_flight = []
            if outcome.error:
                self._last_error = outcome.error
            if outcome.too_large and len(batch) > 1:
                self._batch_limit = max(1, len(batch) // 2)  # halve until it fits
                self._requeue(batch)
            elif outcome.retry:
                self._attempt += 1
                if self.max_retries is not None and self._attempt > self.max_retries:
                    self._attempt = 0
                    self._lose("failures", "retries_exhausted", len(batch))
                    self._warn_once("give-up", "%s gives up on a batch: %s", self.name, outcome.error)
                    done = batch
                else:
                    self._counts["retries"] += 1
                    self._requeue(batch)
                    done = self._bound()
                    delay = outcome.retry_after if outcome.retry_after is not None else self._backoff(self._attempt - 1)
                    self._warn_once("retry", "%s: receiver unavailable, retrying with backoff: %s", self.name, outcome.error)
            else:
                self._attempt = 0
                self._batch_limit = self.batch_size
                if outcome.too_large or outcome.refused:
                    reason = outcome.refused or "http_413"
                    self._lose("failures", reason, len(batch))
                    self._warn_once(reason, "%s: receiver refused a batch (%s)", self.name, outcome.error)
                else:
                    rejected = min(outcome.rejected, len(batch))
                    self._counts["sent"] += len(batch) - rejected
                    self._counts["duplicates"] += min(outcome.duplicates, len(batch) - rejected)
                    if rejected:
                        self._lose("rejected", "rejected_by_receiver", rejected)
                done = batch
            if delay is not None and self._sleep is None:
                self._next_attempt = self._monotonic() + delay
            self._idle.notify_all()
        if self._spool is not None:
            self._spool.done(e.seq for e in done)
        if delay is not None and self._sleep is not None:
            self._sleep(delay)

    def _requeue(self, batch: list[_Entry]) -> None:
        self._pending.extendleft(reversed(batch))
        self._pending_bytes += sum(e.size for e in batch)

    def _backoff(self, attempt: int) -> float:
        # Exponential, capped, with jitter so many agents do not retry in step.
        ceiling = min(self.max_backoff_s, self.backoff_s * (2 ** min(attempt, 60)))
        return ceiling * (0.5 + 0.5 * self._jitter())

    # --- bookkeeping ----------------------------------------------------------------

    def _room_to_defer(self) -> bool:
        """Whether the sending thread may wait for the agent's tool calls: until the
        queue is four-fifths full, then not again until it is down to a fifth, so a
        long burst is caught up with rather than met with more waiting (the sending
        thread's own state; the depth is read without the lock, as a hint)."""
        depth = self._depth()
        if self._deferring and depth >= self.max_items * 4 // 5:
            self._deferring = False
        elif not self._deferring and depth <= self.max_items // 5:
            self._deferring = True
        return self._deferring

    def _depth(self) -> int:
        return len(self._intake) + self._absorbing + len(self._pending) + len(self._in_flight)

    def _lose(self, counter: str, reason: str, n: int) -> None:
        """Count ``n`` items under ``counter`` with their reason (lock held)."""
        self._counts[counter] += n
        self._reasons[reason] = self._reasons.get(reason, 0) + n

    def _note(self, message: str) -> None:
        with self._lock:
            self._last_error = message

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        logger.warning(message, *args)
