"""Send records and artifacts to the dashboard from a background thread.

The agent must never wait on, or crash because of, the dashboard. ``submit`` only
appends to a bounded in-memory queue (the oldest record is dropped when it is full)
and returns; a daemon thread batches (``batch_size`` records or ``flush_interval_ms``),
POSTs JSON to ``{endpoint}/api/v1/records`` and retries what can be retried:
connection errors, timeouts, 429 and 5xx, with exponential backoff and jitter,
honouring ``Retry-After``. A batch the server refuses outright (another 4xx) is
dropped and counted, not retried forever. Each record carries a client-made
``record_id``, so a batch the server saw twice stores nothing twice.

Accounting, once ``flush`` has returned True:
``submitted == sent + rejected + dropped + failures + queue_depth``.

``records_for_result`` builds the record of one tool execution, with the same data
rendered at other output levels for the dashboard's comparison.
"""

from __future__ import annotations

import atexit
import gzip
import hashlib
import json
import logging
import random
import re
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import asdict, dataclass
from datetime import timezone
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, Union

from pydantic import ValidationError

from ._artifacts import ARTIFACT_ID_RE
from ._levels import OutputLevel
from ._models import ToolExecutionResult, ToolInvocationRequest
from ._records import IngestResponse, LevelRendering, RecordSchemaError, ToolResultRecord, _Record, parse_record

logger = logging.getLogger("pipeline.exporter")

ARTIFACT_ID = re.compile(ARTIFACT_ID_RE)
MAX_RESPONSE_BYTES = 1 << 20  # an answer bigger than this is not one we asked for

Headers = Mapping[str, str]


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


@dataclass(frozen=True)
class ExporterStats:
    """Counters since the exporter started. Record counts, except where named."""

    submitted: int = 0  # every call of submit(), junk included
    sent: int = 0  # acknowledged by the dashboard (accepted + duplicates)
    duplicates: int = 0  # acknowledged as already stored (a retried batch)
    rejected: int = 0  # refused one by one: by the dashboard, or junk refused locally
    dropped: int = 0  # queue overflow (oldest first) or submitted after shutdown
    retries: int = 0  # HTTP attempts repeated (batches and artifacts)
    failures: int = 0  # records given up: batch refused (4xx), retries exhausted, shutdown
    queue_depth: int = 0
    artifacts_sent: int = 0
    artifacts_failed: int = 0  # refused, retries exhausted, invalid, dropped from the queue
    last_error: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Artifact:
    artifact_id: str
    data: bytes
    content_type: str


class _GiveUp(Exception):
    """The exchange cannot succeed (refused, retries exhausted, shutting down)."""


class RecordExporter:
    """Batch records to ``POST {endpoint}/api/v1/records`` in a daemon thread.

    ``clock`` (wall-clock epoch seconds, to read a ``Retry-After`` date) and ``sleep``
    are injectable so tests can run backoff without waiting; the default ``sleep``
    wakes up early on shutdown so a backoff never delays exit.
    """

    def __init__(
        self,
        endpoint: str,
        api_key: str,
        *,
        batch_size: int = 100,
        flush_interval_ms: int = 500,
        max_queue: int = 10_000,
        max_artifact_queue: int = 64,
        max_artifact_bytes: int = 32 * 1024 * 1024,
        transport: Optional[Transport] = None,
        clock: Callable[[], float] = time.time,
        sleep: Optional[Callable[[float], Any]] = None,
        max_retries: int = 6,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        max_retry_after_s: float = 60.0,
        request_timeout_s: float = 10.0,
        compress: bool = False,
        jitter: Callable[[], float] = random.random,
        start: bool = True,
        register_atexit: bool = False,
    ) -> None:
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError("endpoint must be an http(s) URL")
        if batch_size < 1 or max_queue < 1 or max_artifact_queue < 1:
            raise ValueError("batch_size, max_queue and max_artifact_queue must be positive")
        if max_retries < 0 or flush_interval_ms <= 0:
            raise ValueError("max_retries must be >= 0 and flush_interval_ms > 0")
        self.endpoint = endpoint.rstrip("/")
        self._auth = f"Bearer {api_key}"
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_ms / 1000
        self.max_queue = max_queue
        self.max_artifact_bytes = max_artifact_bytes
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.request_timeout_s = request_timeout_s
        self.compress = compress
        self._transport: Transport = transport or UrllibTransport()
        self._clock = clock
        self._jitter = jitter
        self._stop = threading.Event()  # set at shutdown: no more waiting, no more retries
        self._sleep: Callable[[float], Any] = sleep or self._stop.wait

        self._lock = threading.Lock()
        self._queue: deque[Any] = deque()
        self._artifacts: deque[_Artifact] = deque(maxlen=max_artifact_queue)
        self._in_flight = 0
        self._closed = False
        self._wake = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._counts = {name: 0 for name in ExporterStats.__dataclass_fields__ if name not in ("queue_depth", "last_error")}
        self._last_error: Optional[str] = None
        self._warned: set[str] = set()

        self._thread = threading.Thread(target=self._run, name="pipeline-record-exporter", daemon=True)
        if start:
            self.start()
        if register_atexit:
            atexit.register(self.shutdown, 2.0)

    def start(self) -> None:
        """Start the sending thread (done by the constructor unless ``start=False``)."""
        with self._lock:
            if not self._thread.is_alive() and not self._closed:
                self._thread.start()

    # --- the agent thread: cheap, never raises ---------------------------------------

    def submit(self, record: Any) -> bool:
        """Queue one record (a record model, or a dict ``parse_record`` accepts).

        Returns False when it was refused (junk, after shutdown); never raises.
        """
        try:
            if not isinstance(record, _Record):
                record = parse_record(record)
        except (RecordSchemaError, ValidationError, TypeError, ValueError) as exc:
            with self._lock:
                self._counts["submitted"] += 1
                self._counts["rejected"] += 1
            self._warn_once("junk", "record refused locally (counted as rejected): %s", str(exc)[:200])
            return False
        except Exception:  # a hostile object whose methods raise: still never our caller's problem
            with self._lock:
                self._counts["submitted"] += 1
                self._counts["rejected"] += 1
            self._warn_once("junk", "record refused locally (counted as rejected)")
            return False
        with self._lock:
            self._counts["submitted"] += 1
            if self._closed:
                self._counts["dropped"] += 1
                return False
            if len(self._queue) >= self.max_queue:
                self._queue.popleft()
                self._counts["dropped"] += 1
            self._queue.append(record)
            full = len(self._queue) == self.batch_size
        if full:
            self._wake.set()
        return True

    def upload_artifact(self, artifact_id: str, data: bytes, content_type: str = "application/octet-stream") -> bool:
        """Queue the bytes of an artifact for ``PUT /api/v1/artifacts/{id}``; never raises.

        The artifact queue is short (artifacts are big): when full the oldest is
        dropped; an artifact over ``max_artifact_bytes`` is refused.
        """
        if (
            not isinstance(artifact_id, str)
            or not ARTIFACT_ID.match(artifact_id)
            or not isinstance(data, (bytes, bytearray, memoryview))
            or len(data) > self.max_artifact_bytes
            or not isinstance(content_type, str)
            or not content_type
            or any(ch in content_type for ch in "\r\n\x00")
        ):
            with self._lock:
                self._counts["artifacts_failed"] += 1
            self._warn_once("bad-artifact", "artifact refused locally: bad id, data, size or content type")
            return False
        with self._lock:
            if self._closed:
                self._counts["artifacts_failed"] += 1
                return False
            if len(self._artifacts) == self._artifacts.maxlen:
                self._counts["artifacts_failed"] += 1
            self._artifacts.append(_Artifact(artifact_id, bytes(data), content_type))
        self._wake.set()
        return True

    def stats(self) -> ExporterStats:
        with self._lock:
            return ExporterStats(**self._counts, queue_depth=len(self._queue), last_error=self._last_error)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far has been sent or given up; bounded."""
        deadline = time.monotonic() + max(0.0, timeout)
        self._wake.set()
        with self._idle:
            while self._queue or self._artifacts or self._in_flight:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return False
                self._idle.wait(min(remaining, 0.05))
                self._wake.set()
        return True

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Send what can be sent within ``timeout`` seconds, then stop; never hangs.

        What is still queued afterwards is counted as ``failures``. Returns True when
        everything was delivered (or given up) in time.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        with self._lock:
            already = self._closed
            self._closed = True
        if already:
            return not self._thread.is_alive()
        drained = self._thread.is_alive() and self.flush(max(0.0, deadline - time.monotonic()) * 0.8)
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            left = len(self._queue)
            self._queue.clear()
            self._counts["failures"] += left
            self._counts["artifacts_failed"] += len(self._artifacts)
            self._artifacts.clear()
            if left:
                self._last_error = f"shutdown with {left} records unsent"
        if left:
            logger.warning("record exporter stopped with %d records unsent", left)
        return drained and not left

    def __enter__(self) -> RecordExporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # --- the background thread ----------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            try:
                self._drain()
            except Exception as exc:  # the thread must outlive any bug in one batch
                logger.exception("record exporter loop error")
                self._note_error(f"exporter error: {exc!r}"[:300])

    def _drain(self) -> None:
        # One batch of records, then one artifact, so neither starves the other.
        while not self._stop.is_set():
            with self._lock:
                batch = [self._queue.popleft() for _ in range(min(self.batch_size, len(self._queue)))]
                artifact = self._artifacts.popleft() if self._artifacts else None
                self._in_flight = len(batch) + (1 if artifact else 0)
            if not self._in_flight:
                return
            try:
                if batch:
                    self._send_batch(batch)
                if artifact:
                    self._send_artifact(artifact)
            finally:
                with self._idle:
                    self._in_flight = 0
                    self._idle.notify_all()

    def _send_batch(self, batch: list[Any]) -> None:
        records: list[dict[str, Any]] = []
        for record in batch:
            try:
                records.append(record.model_dump(mode="json"))
            except Exception as exc:  # e.g. a field the agent mutated into junk after submit
                self._count(rejected=1)
                self._warn_once("serialize", "record could not be serialised: %s", str(exc)[:200])
        if records:
            self._post_records(records)

    def _post_records(self, records: list[dict[str, Any]]) -> None:
        body = json.dumps({"records": records}, ensure_ascii=False, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"}
        try:
            status, _, answer = self._exchange("POST", f"{self.endpoint}/api/v1/records", headers, body)
        except _GiveUp:
            self._count(failures=len(records))
            return
        if status == 413 and len(records) > 1:
            # Too big for the dashboard in one go: halve until it fits.
            half = len(records) // 2
            self._post_records(records[:half])
            self._post_records(records[half:])
            return
        if not 200 <= status < 300:
            self._count(failures=len(records))
            self._note_error(f"records refused with HTTP {status}: {_snippet(answer)}")
            self._warn_once(f"http-{status}", "dashboard refused a batch of records with HTTP %d", status)
            return
        try:
            response = IngestResponse.model_validate_json(answer) if answer else None
        except ValidationError:
            response = None
        if response is None:
            # A 2xx without a body we understand still means the batch arrived.
            self._count(sent=len(records))
            return
        rejected = min(len(response.rejected), len(records))
        if rejected:
            first = response.rejected[0]
            self._note_error(f"record {first.index} rejected: {first.error[:200]}")
            self._warn_once("rejected", "dashboard rejected records, first: %s", first.error[:200])
        duplicates = min(response.duplicates, len(records) - rejected)
        self._count(sent=len(records) - rejected, duplicates=duplicates, rejected=rejected)

    def _send_artifact(self, artifact: _Artifact) -> None:
        headers = {
            "Content-Type": artifact.content_type,
            "X-Content-SHA256": hashlib.sha256(artifact.data).hexdigest(),
        }
        url = f"{self.endpoint}/api/v1/artifacts/{artifact.artifact_id}"
        try:
            status, _, answer = self._exchange("PUT", url, headers, artifact.data)
        except _GiveUp:
            self._count(artifacts_failed=1)
            return
        if status in (200, 201):
            self._count(artifacts_sent=1)
        else:
            self._count(artifacts_failed=1)
            self._note_error(f"artifact {artifact.artifact_id} refused with HTTP {status}: {_snippet(answer)}")

    def _exchange(self, method: str, url: str, headers: dict[str, str], body: bytes) -> tuple[int, Headers, bytes]:
        """One request with retries. Returns the final non-retryable answer (2xx or a
        refusal); raises _GiveUp when retries are exhausted or we are shutting down."""
        headers = {**headers, "Authorization": self._auth, "User-Agent": "pipeline-record-exporter/1"}
        if self.compress:
            body = gzip.compress(body, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
        for attempt in range(self.max_retries + 1):
            retry_after: Optional[float] = None
            try:
                status, answer_headers, answer = self._transport.send(method, url, headers, body, self.request_timeout_s)
            except Exception as exc:  # connection refused/reset/timeout: retry
                self._note_error(f"{method} {url}: {type(exc).__name__}: {str(exc)[:200]}")
            else:
                if status != 429 and status < 500:
                    return status, answer_headers, answer
                self._note_error(f"{method} {url}: HTTP {status}")
                retry_after = _retry_after(answer_headers, self.max_retry_after_s, self._clock())
            if attempt == self.max_retries or self._stop.is_set():
                break
            self._count(retries=1)
            self._sleep(retry_after if retry_after is not None else self._backoff(attempt))
            if self._stop.is_set():
                break
        self._warn_once(f"give-up-{method}", "giving up on %s %s: %s", method, url, self._last_error)
        raise _GiveUp()

    def _backoff(self, attempt: int) -> float:
        # Exponential, capped, with jitter so many agents do not retry in step.
        ceiling = min(self.max_backoff_s, self.backoff_s * (2**attempt))
        return ceiling * (0.5 + 0.5 * self._jitter())

    # --- bookkeeping ----------------------------------------------------------------

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta

    def _note_error(self, message: str) -> None:
        with self._lock:
            self._last_error = message

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        logger.warning(message, *args)


def _snippet(body: bytes) -> str:
    return body[:200].decode("utf-8", "replace")


def _retry_after(headers: Headers, cap: float, now: float) -> Optional[float]:
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


RenderingsInput = Union[Sequence[LevelRendering], Mapping[Union[OutputLevel, str], str], None]


def records_for_result(
    request: ToolInvocationRequest,
    result: ToolExecutionResult,
    *,
    conversation_id: str,
    round_id: Optional[str] = None,
    trace_id: Optional[str] = None,
    span_id: Optional[str] = None,
    model: Optional[str] = None,
    renderings: RenderingsInput = None,
    count_tokens: Optional[Callable[[str], int]] = None,
) -> ToolResultRecord:
    """Build the ToolResultRecord of one tool execution.

    ``renderings`` are the same raw data at other output levels (for the dashboard's
    side-by-side comparison): LevelRendering objects, or ``{level: observation}``
    whose tokens ``count_tokens`` measures (0 without it). The result's own
    observation is always one of them.
    """
    by_level: dict[OutputLevel, LevelRendering] = {}
    if isinstance(renderings, Mapping):
        for level, observation in renderings.items():
            level = OutputLevel(level)
            tokens = count_tokens(observation) if count_tokens else 0
            by_level[level] = LevelRendering(level=level, observation=observation, tokens=tokens)
    elif renderings:
        for rendering in renderings:
            by_level[rendering.level] = rendering
    if by_level:
        by_level.setdefault(
            result.output_level,
            LevelRendering(level=result.output_level, observation=result.observation, tokens=result.observation_tokens),
        )
    ordered = [by_level[level] for level in OutputLevel if level in by_level]
    return ToolResultRecord(
        conversation_id=conversation_id,
        round_id=round_id,
        trace_id=trace_id,
        span_id=span_id,
        tool_name=request.tool_name,
        tool_version=request.tool_version,
        parameters=request.parameters,
        model=model,
        result=result,
        renderings=ordered,
    )

