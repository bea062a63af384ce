"""Send records and artifacts to the dashboard from background threads.

The agent must never wait on, or crash because of, the dashboard. ``submit`` only
appends to a bounded in-memory queue and returns; the sending thread (see
``_delivery``) builds and serialises the records, batches them (``batch_size`` records,
``max_batch_bytes``, or ``flush_interval_ms``) and POSTs JSON to
``{endpoint}/api/v1/records``. Connection errors, timeouts, 408, 429 and 5xx are
retried with capped exponential backoff and jitter, honouring ``Retry-After``, for as
long as the queue has room (``max_retries=None``, the default); the queue is bounded in
records (``max_queue``) and bytes (``max_queue_bytes``) and overflow drops the oldest,
counted. A batch the server refuses outright (another 4xx) is dropped and counted with
its reason, not retried forever. Each record carries a client-made ``record_id``, so a
batch the server saw twice stores nothing twice.

``spool_dir`` adds an on-disk journal (``_spool``): an outage longer than the memory
queue can hold, or a restart of the agent, then loses nothing; a new exporter on the
same directory sends what the old one left. The journal is written by the sending
thread every 100 ms, so a ``kill -9`` can lose at most the records submitted in that
window (``stats().spool_lag_ms_max`` is the longest such delay seen).

Artifacts go through a second, smaller queue and thread (``PUT
/api/v1/artifacts/{id}``), so a large upload never holds records back. They are not
spooled: the bytes stay in the agent's artifact store.

Scores (``score``: an automatic check's verdict on a round, a user's thumbs) go
through a third queue (``POST /api/v1/scores``), with the same bounds, batching and
retries as records; its thread starts with the first score. Each score carries a
client-made ``score_id``, so a retried batch stores nothing twice. Not spooled.

Accounting, once ``flush`` has returned True (and with no spool)::

    submitted == sent + rejected + dropped + failures + queue_depth

``records_for_result`` builds the record of one tool execution, with the same data
rendered at other output levels for the dashboard's comparison.
"""

from __future__ import annotations

import atexit
import gzip
import hashlib
import logging
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from pydantic import ValidationError

from ._artifacts import ARTIFACT_ID_RE
from ._delivery import DeliveryQueue, DeliveryStats, Outcome, Refused, Transport, UrllibTransport, exchange
from ._levels import OutputLevel
from ._models import ToolExecutionResult, ToolInvocationRequest
from ._records import IngestResponse, LevelRendering, RecordSchemaError, ToolResultRecord, _Record, parse_record
from ._scores import MAX_SCORES_PER_BATCH, ScoreRecord
from ._spool import FsyncPolicy, Spool

logger = logging.getLogger("pipeline.exporter")

ARTIFACT_ID = re.compile(ARTIFACT_ID_RE)

__all__ = ["ExporterStats", "RecordExporter", "Transport", "UrllibTransport", "records_for_result"]


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
    queue_bytes: int = 0  # serialised records waiting
    reasons: Mapping[str, int] = field(default_factory=dict)  # records not delivered, by reason
    replayed: int = 0  # records found in the spool at start (left by an earlier process)
    spooled: int = 0  # records written to the spool
    kept_in_spool: int = 0  # records left in the spool at shutdown, for the next start
    spool_errors: int = 0
    spool_bytes: int = 0
    spool_lag_ms_max: float = 0.0  # longest submit-to-disk delay: the kill -9 window
    scores_submitted: int = 0  # every call of score() / submit_score()
    scores_sent: int = 0  # acknowledged by the dashboard (stored, already stored, or edited)
    scores_failed: int = 0  # refused (locally or by the dashboard), dropped, or given up

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DeferredRecord:
    """A record built on the sending thread from a snapshot taken on the agent thread
    (``ToolResultHook`` uses it so the agent does not pay for the model)."""

    __slots__ = ()

    def build_record(self) -> _Record:  # pragma: no cover - subclasses implement it
        raise NotImplementedError


@dataclass
class _Artifact:
    artifact_id: str
    data: bytes
    content_type: str


class _DeferredArtifact:
    """An artifact whose bytes are read on the sending thread, not the agent's."""

    __slots__ = ("artifact_id", "read")

    def __init__(self, artifact_id: str, read: Callable[[str], Optional[tuple[bytes, str]]]) -> None:
        self.artifact_id = artifact_id
        self.read = read


class RecordExporter:
    """Batch records to ``POST {endpoint}/api/v1/records`` from a daemon thread.

    ``clock`` (wall-clock epoch seconds, to read a ``Retry-After`` date),
    ``monotonic`` and ``wait(event, seconds)`` make time injectable; ``sleep``, when
    given, replaces waiting out a backoff (tests that record the delays).
    ``max_retries=None`` retries while the queue has room; a number gives up on a
    batch after that many retries (counted as ``failures``, reason
    ``retries_exhausted``).
    """

    def __init__(
        self,
        endpoint: str,
        api_key: str,
        *,
        batch_size: int = 100,
        flush_interval_ms: int = 500,
        max_queue: int = 10_000,
        max_queue_bytes: int = 64 * 1024 * 1024,
        max_batch_bytes: int = 4 * 1024 * 1024,
        max_artifact_queue: int = 64,
        max_artifact_bytes: int = 32 * 1024 * 1024,
        max_artifact_queue_bytes: int = 256 * 1024 * 1024,
        spool_dir: Optional[str] = None,
        spool_max_bytes: int = 256 * 1024 * 1024,
        spool_fsync: FsyncPolicy = "batch",
        transport: Optional[Transport] = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        wait: Optional[Callable[[Any, float], Any]] = None,
        sleep: Optional[Callable[[float], Any]] = None,
        max_retries: Optional[int] = None,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        max_retry_after_s: float = 60.0,
        request_timeout_s: float = 10.0,
        compress: bool = False,
        jitter: Optional[Callable[[], float]] = None,
        start: bool = True,
        register_atexit: bool = False,
    ) -> None:
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError("endpoint must be an http(s) URL")
        if batch_size < 1 or max_queue < 1 or max_artifact_queue < 1:
            raise ValueError("batch_size, max_queue and max_artifact_queue must be positive")
        if (max_retries is not None and max_retries < 0) or flush_interval_ms <= 0:
            raise ValueError("max_retries must be None or >= 0 and flush_interval_ms > 0")
        self.endpoint = endpoint.rstrip("/")
        self._auth = f"Bearer {api_key}"
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_ms / 1000
        self.max_queue = max_queue
        self.max_artifact_bytes = max_artifact_bytes
        self.max_retries = max_retries
        self.max_retry_after_s = max_retry_after_s
        self.request_timeout_s = request_timeout_s
        self.compress = compress
        self._transport: Transport = transport or UrllibTransport()
        self._clock = clock
        retry = {
            "backoff_s": backoff_s,
            "max_backoff_s": max_backoff_s,
            "max_retries": max_retries,
            "sleep": sleep,
            "monotonic": monotonic,
            "wait": wait,
            **({"jitter": jitter} if jitter is not None else {}),
        }
        spool = Spool(spool_dir, max_bytes=spool_max_bytes, fsync=spool_fsync) if spool_dir else None
        self._records = DeliveryQueue(
            name="pipeline-record-exporter",
            encode=_encode_record,
            send=self._send_records,
            max_items=max_queue,
            max_bytes=max_queue_bytes,
            batch_size=batch_size,
            max_batch_bytes=max_batch_bytes,
            interval_s=self.flush_interval_s,
            spool=spool,
            **retry,
        )
        self._artifacts = DeliveryQueue(
            name="pipeline-artifact-exporter",
            encode=self._encode_artifact,
            send=self._send_artifact,
            max_items=max_artifact_queue,
            max_bytes=max_artifact_queue_bytes,
            batch_size=1,
            max_batch_bytes=max_artifact_bytes,
            interval_s=self.flush_interval_s,
            **retry,
        )
        self._scores = DeliveryQueue(
            name="pipeline-score-exporter",
            encode=_encode_score,
            send=self._send_scores,
            max_items=max_queue,
            max_bytes=max_queue_bytes,
            batch_size=min(batch_size, MAX_SCORES_PER_BATCH),
            max_batch_bytes=max_batch_bytes,
            interval_s=self.flush_interval_s,
            **retry,
        )
        self._started = False
        if start:
            self.start()
        if register_atexit:
            atexit.register(self.shutdown, 2.0)

    def start(self) -> None:
        """Start the sending threads (done by the constructor unless ``start=False``);
        the scores' starts with the first score."""
        self._records.start()
        self._artifacts.start()
        self._started = True

    # --- the agent thread: cheap, never raises ---------------------------------------

    def submit(self, record: Any) -> bool:
        """Queue one record (a record model, or a dict ``parse_record`` accepts).

        Returns False when it was refused (junk, after shutdown); never raises.
        """
        if not isinstance(record, (_Record, DeferredRecord)):
            try:
                record = parse_record(record)
            except (RecordSchemaError, ValidationError, TypeError, ValueError) as exc:
                self._records.refuse("invalid_record")
                logger.debug("record refused locally (counted as rejected): %s", str(exc)[:200])
                return False
            except Exception:  # a hostile object whose methods raise: still never our caller's problem
                self._records.refuse("invalid_record")
                return False
        return self._records.put(record)

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
            or not _good_content_type(content_type)
        ):
            self._artifacts.refuse("invalid_artifact")
            logger.debug("artifact refused locally: bad id, data, size or content type")
            return False
        accepted = self._artifacts.put(_Artifact(artifact_id, bytes(data), content_type))
        self._artifacts._wake.set()  # artifacts go one by one: no batch to wait for
        return accepted

    def upload_artifact_later(self, artifact_id: str, read: Callable[[str], Optional[tuple[bytes, str]]]) -> bool:
        """Queue an artifact whose bytes ``read(artifact_id) -> (bytes, content_type)``
        fetches on the sending thread (the agent thread reads no file)."""
        if not isinstance(artifact_id, str) or not ARTIFACT_ID.match(artifact_id) or not callable(read):
            self._artifacts.refuse("invalid_artifact")
            return False
        accepted = self._artifacts.put(_DeferredArtifact(artifact_id, read))
        self._artifacts._wake.set()
        return accepted

    def score(
        self,
        name: str,
        value: Union[bool, int, float, None] = None,
        *,
        label: Optional[str] = None,
        comment: Optional[str] = None,
        conversation_id: Optional[str] = None,
        round_id: Optional[str] = None,
        tool_call_id: Optional[str] = None,
        trace_id: Optional[str] = None,
        span_id: Optional[str] = None,
        response_id: Optional[str] = None,
        score_id: Optional[str] = None,
        occurred_at: Optional[datetime] = None,
    ) -> bool:
        """Queue one score for ``POST /api/v1/scores``; never raises, never waits.

        ``value`` is a number or a boolean, ``label`` a category (one of them at
        least); name what it judges with ``conversation_id`` (and ``round_id``),
        ``tool_call_id``, ``trace_id`` (and ``span_id``) or ``response_id``. The
        dashboard checks it against the name's score config; a refusal is counted
        in ``stats().scores_failed``. Give ``score_id`` to make sending the same
        score twice (from two processes, after a restart) store it once, and to
        change it later. Returns False when it was refused here (junk, after shutdown).
        """
        fields = {
            "name": name, "value": value, "label": label, "comment": comment, "conversation_id": conversation_id,
            "round_id": round_id, "tool_call_id": tool_call_id, "trace_id": trace_id, "span_id": span_id,
            "response_id": response_id, "score_id": score_id, "occurred_at": occurred_at,
        }
        return self.submit_score({key: item for key, item in fields.items() if item is not None})

    def submit_score(self, score: Any) -> bool:
        """Queue one score (a ``ScoreRecord``, or a dict it accepts); never raises."""
        if not isinstance(score, ScoreRecord):
            try:
                score = ScoreRecord.model_validate(score)
            except Exception as exc:  # junk, or a hostile object: counted, never our caller's problem
                self._scores.refuse("invalid_score")
                logger.debug("score refused locally (counted as failed): %s", str(exc)[:200])
                return False
        if self._started:
            self._scores.start()
        return self._scores.put(score)

    def stats(self) -> ExporterStats:
        records, artifacts, scores = self._records.stats(), self._artifacts.stats(), self._scores.stats()
        return ExporterStats(
            submitted=records.submitted,
            sent=records.sent,
            duplicates=records.duplicates,
            rejected=records.rejected,
            dropped=records.dropped,
            retries=records.retries + artifacts.retries,
            failures=records.failures,
            queue_depth=records.queue_depth,
            artifacts_sent=artifacts.sent,
            artifacts_failed=artifacts.rejected + artifacts.dropped + artifacts.failures + artifacts.filtered,
            last_error=records.last_error or artifacts.last_error or scores.last_error,
            queue_bytes=records.queue_bytes,
            reasons=records.reasons,
            replayed=records.replayed,
            spooled=records.spooled,
            kept_in_spool=records.kept_in_spool,
            spool_errors=records.spool_errors,
            spool_bytes=records.spool_bytes,
            spool_lag_ms_max=records.spool_lag_ms_max,
            scores_submitted=scores.submitted,
            scores_sent=scores.sent,
            scores_failed=scores.rejected + scores.dropped + scores.failures + scores.filtered,
        )

    def delivery_stats(self) -> tuple[DeliveryStats, DeliveryStats]:
        """The raw counters of the record queue and the artifact queue."""
        return self._records.stats(), self._artifacts.stats()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far has been sent or given up; bounded."""
        deadline = time.monotonic() + max(0.0, timeout)
        records = self._records.flush(timeout)
        scores = not self._scores.stats().queue_depth or self._scores.flush(max(0.0, deadline - time.monotonic()))
        return self._artifacts.flush(max(0.0, deadline - time.monotonic())) and records and scores

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Send what can be sent within ``timeout`` seconds, then stop; never hangs.

        What is still queued afterwards stays in the spool for the next start, or
        without a spool is counted as ``failures``. Returns True when everything was
        delivered (or given up) in time.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        records = self._records.shutdown(timeout * 0.6)
        scores = self._scores.shutdown(max(0.0, deadline - time.monotonic()) * 0.5)
        artifacts = self._artifacts.shutdown(max(0.0, deadline - time.monotonic()))
        return records and artifacts and scores

    def __enter__(self) -> RecordExporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # --- the sending threads -----------------------------------------------------

    def _exchange(self, method: str, url: str, headers: dict[str, str], body: bytes) -> tuple[Optional[Outcome], bytes]:
        headers = {**headers, "Authorization": self._auth, "User-Agent": "pipeline-record-exporter/1"}
        if self.compress:
            body = gzip.compress(body, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
        return exchange(self._transport, method, url, headers, body, self.request_timeout_s,
                        max_retry_after_s=self.max_retry_after_s, now=self._clock())

    def _send_records(self, batch: list[Any]) -> Outcome:
        return self._send_batch(batch, "records", "record")

    def _send_scores(self, batch: list[Any]) -> Outcome:
        # The scores answer has the records' shape (plus "updated", read as delivered).
        return self._send_batch(batch, "scores", "score")

    def _send_batch(self, batch: list[Any], collection: str, item: str) -> Outcome:
        """POST ``{"<collection>": [...]}`` to ``/api/v1/<collection>`` and read the answer."""
        body = b'{"' + collection.encode() + b'":[' + b",".join(entry.payload for entry in batch) + b"]}"
        outcome, answer = self._exchange(
            "POST", f"{self.endpoint}/api/v1/{collection}", {"Content-Type": "application/json"}, body
        )
        if outcome is not None:
            return outcome
        try:
            response = IngestResponse.model_validate_json(answer) if answer else None
        except ValidationError:
            response = None
        if response is None:  # a 2xx without a body we understand still means it arrived
            return Outcome(delivered=len(batch))
        error = None
        if response.rejected:
            first = response.rejected[0]
            error = f"{item} {first.index} rejected: {first.error[:200]}"
            logger.debug("dashboard rejected %s, first: %s", collection, first.error[:200])
        return Outcome(delivered=len(batch), duplicates=response.duplicates,
                       rejected=len(response.rejected), error=error)

    def _encode_artifact(self, item: Any) -> Optional[tuple[bytes, tuple[str, str]]]:
        if isinstance(item, _DeferredArtifact):
            found = item.read(item.artifact_id)
            if found is None:
                raise Refused("artifact_unreadable", f"artifact {item.artifact_id} could not be read")
            data, content_type = found
            if len(data) > self.max_artifact_bytes or not _good_content_type(content_type):
                raise Refused("invalid_artifact", f"artifact {item.artifact_id} is too large or badly typed")
            return bytes(data), (item.artifact_id, content_type)
        return item.data, (item.artifact_id, item.content_type)

    def _send_artifact(self, batch: list[Any]) -> Outcome:
        (entry,) = batch
        artifact_id, content_type = entry.meta
        headers = {"Content-Type": content_type, "X-Content-SHA256": hashlib.sha256(entry.payload).hexdigest()}
        outcome, _ = self._exchange("PUT", f"{self.endpoint}/api/v1/artifacts/{artifact_id}", headers, entry.payload)
        if outcome is not None and outcome.too_large:  # one artifact cannot be halved
            return Outcome(refused="http_413", error=outcome.error)
        return outcome or Outcome(delivered=1)


def _good_content_type(content_type: Any) -> bool:
    return isinstance(content_type, str) and bool(content_type) and not any(ch in content_type for ch in "\r\n\x00")


def _encode_record(item: Any) -> tuple[bytes, None]:
    """A record (or a deferred one, built here) as its JSON bytes."""
    try:
        record = item.build_record() if isinstance(item, DeferredRecord) else item
    except (ValidationError, ValueError, TypeError) as exc:
        raise Refused("invalid_record", str(exc)[:300]) from None
    try:
        return record.model_dump_json().encode(), None
    except Exception as exc:  # e.g. a field the agent mutated into junk after submit
        raise Refused("unserializable", str(exc)[:300]) from None


def _encode_score(item: Any) -> tuple[bytes, None]:
    try:
        return item.model_dump_json().encode(), None
    except Exception as exc:  # a field the caller mutated into junk after submitting
        raise Refused("unserializable", str(exc)[:300]) from None


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
    occurred_at: Optional[datetime] = None,
) -> ToolResultRecord:
    """Build the ToolResultRecord of one tool execution.

    ``renderings`` are the same raw data at other output levels (for the dashboard's
    side-by-side comparison): LevelRendering objects, or ``{level: observation}``
    whose tokens ``count_tokens`` measures (0 without it). The result's own
    observation is always one of them. ``occurred_at`` defaults to now.
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
        **({"occurred_at": occurred_at} if occurred_at is not None else {}),
    )

