"""RecordExporter against a real HTTP server on 127.0.0.1 that fails, throttles,
drops connections and recovers. Backoff runs on a fake sleep where time matters."""

from __future__ import annotations

import gzip
import hashlib
import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler
from typing import Any, Iterator, Optional

import pytest

from pipeline import (
    LevelRendering,
    MessageRecord,
    OutputLevel,
    RecordExporter,
    ToolExecutionResult,
    ToolInvocationRequest,
    ToolResultRecord,
    records_for_result,
)
from pipeline._delivery import retry_after_seconds as _retry_after
from tests.pipeline.delivery_helpers import FakeClock, LocalServer, free_port, wait_until

API_KEY = "test-key-123"


class IngestServer(LocalServer):
    """A small stand-in for the dashboard's ingest: dedupes on record_id like the
    real one, and follows a script of behaviours for its next requests."""

    def __init__(self, port: int = 0) -> None:
        self.script: deque[str] = deque()  # "500", "429:<retry-after>", "503:<retry-after>", "drop", "store-drop", "400", "hang"
        self.stored: dict[str, dict[str, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        self.artifacts: dict[str, bytes] = {}
        self.max_records: Optional[int] = None  # answer 413 above this
        self.reject_type: Optional[str] = None  # answer per-record rejections for this type
        self.lock = threading.Lock()
        super().__init__(port)

    def received_ids(self) -> list[str]:
        return [rid for req in self.requests for rid in req.get("ids", [])]

    def answer(self, handler: BaseHTTPRequestHandler, status: int, payload: Any = None, headers: Optional[dict[str, str]] = None) -> None:
        self.reply(handler, status, json.dumps(payload).encode() if payload is not None else b"", "application/json", headers)

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length", 0)))
        if handler.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        with self.lock:
            step = self.script.popleft() if self.script else "ok"
        entry: dict[str, Any] = {"method": handler.command, "path": handler.path, "headers": dict(handler.headers), "step": step}
        if handler.headers.get("Authorization") != f"Bearer {API_KEY}":
            self.requests.append(entry)
            return self.answer(handler, 401, {"detail": "bad key"})
        if step == "hang":
            self.requests.append(entry)
            self.release.wait(30)
            return None
        if step == "drop":  # close without any answer
            self.requests.append(entry)
            return None
        if step.startswith(("429:", "503:")):
            self.requests.append(entry)
            status, _, retry_after = step.partition(":")
            return self.answer(handler, int(status), {"detail": "slow down"}, {"Retry-After": retry_after or "1"})
        if step in ("500", "503", "400", "307"):
            self.requests.append(entry)
            extra = {"Location": "/elsewhere"} if step == "307" else None
            return self.answer(handler, int(step), {"detail": step}, extra)
        if handler.command == "PUT":
            entry["sha_ok"] = hashlib.sha256(body).hexdigest() == handler.headers.get("X-Content-SHA256")
            self.requests.append(entry)
            if not entry["sha_ok"]:
                return self.answer(handler, 400, {"detail": "hash"})
            artifact_id = handler.path.rsplit("/", 1)[1]
            created = artifact_id not in self.artifacts
            self.artifacts[artifact_id] = body
            return self.answer(handler, 201 if created else 200, {"artifact_id": artifact_id})
        records = json.loads(body)["records"]
        entry["ids"] = [r["record_id"] for r in records]
        self.requests.append(entry)
        if self.max_records is not None and len(records) > self.max_records:
            return self.answer(handler, 413, {"detail": "too large"})
        accepted = duplicates = 0
        rejected = []
        with self.lock:
            for index, record in enumerate(records):
                if record.get("type") == self.reject_type:
                    rejected.append({"index": index, "error": "refused by test"})
                elif record["record_id"] in self.stored:
                    duplicates += 1
                else:
                    self.stored[record["record_id"]] = record
                    accepted += 1
        if step == "store-drop":  # stored, but the answer never reaches the agent
            return None
        self.answer(handler, 200, {"accepted": accepted, "duplicates": duplicates, "rejected": rejected})


@pytest.fixture
def server() -> Iterator[IngestServer]:
    s = IngestServer()
    yield s
    s.close()


def message(i: int, conversation: str = "conv-1") -> MessageRecord:
    return MessageRecord(conversation_id=conversation, index=i, role="user", content=f"question {i}")


def exporter_for(server: IngestServer, **options: Any) -> RecordExporter:
    options.setdefault("flush_interval_ms", 20)
    return RecordExporter(server.url, API_KEY, **options)


def test_it_sends_records_in_batches_with_the_bearer_key(server: IngestServer) -> None:
    exporter = exporter_for(server, batch_size=100)
    records = [message(i) for i in range(250)]
    for record in records:
        assert exporter.submit(record) is True
    assert exporter.flush(10)
    exporter.shutdown(2)

    assert set(server.stored) == {str(r.record_id) for r in records}
    assert all(len(req["ids"]) <= 100 for req in server.requests)
    first = server.requests[0]
    assert first["path"] == "/api/v1/records"
    assert first["headers"]["Content-Type"] == "application/json"
    stats = exporter.stats()
    assert (stats.submitted, stats.sent, stats.failures, stats.dropped, stats.queue_depth) == (250, 250, 0, 0, 0)


def test_it_survives_500_429_dropped_connections_and_recovers_with_fake_sleep(server: IngestServer) -> None:
    sleeps: list[float] = []
    server.script.extend(["500", "429:7", "drop", "store-drop", "503"])
    exporter = exporter_for(server, batch_size=10, sleep=sleeps.append, max_retries=8)
    records = [message(i) for i in range(35)]
    for record in records:
        exporter.submit(record)
    assert exporter.flush(10)
    exporter.shutdown(2)

    submitted = {str(r.record_id) for r in records}
    assert set(server.received_ids()) == submitted
    # The batch stored before its answer was lost was sent again, yet stored once.
    assert len(server.received_ids()) > len(submitted)
    assert set(server.stored) == submitted and len(server.stored) == 35
    stats = exporter.stats()
    assert stats.sent == 35 and stats.failures == 0
    assert stats.duplicates == 10
    assert stats.retries == 5
    assert 7.0 in sleeps  # Retry-After honoured


def test_it_backs_off_exponentially_capped_with_fake_sleep_and_jitter(server: IngestServer) -> None:
    sleeps: list[float] = []
    server.script.extend(["500"] * 6)
    exporter = exporter_for(
        server, sleep=sleeps.append, jitter=lambda: 1.0, backoff_s=0.5, max_backoff_s=4.0, max_retries=6
    )
    exporter.submit(message(0))
    assert exporter.flush(10)
    exporter.shutdown(2)
    assert sleeps == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert exporter.stats().sent == 1


def test_it_jitters_backoff_between_half_and_full_with_fake_sleep(server: IngestServer) -> None:
    sleeps: list[float] = []
    server.script.extend(["503"])
    exporter = exporter_for(server, sleep=sleeps.append, jitter=lambda: 0.0, backoff_s=2.0)
    exporter.submit(message(0))
    assert exporter.flush(10)
    exporter.shutdown(2)
    assert sleeps == [1.0]


def test_it_gives_up_after_max_retries_with_fake_sleep(server: IngestServer) -> None:
    server.script.extend(["503"] * 10)
    exporter = exporter_for(server, sleep=lambda s: None, max_retries=2)
    for i in range(3):
        exporter.submit(message(i))
    assert exporter.flush(10)
    exporter.shutdown(2)
    stats = exporter.stats()
    assert len(server.requests) == 3  # one try + two retries
    assert (stats.failures, stats.sent, stats.retries) == (3, 0, 2)
    assert "503" in (stats.last_error or "")


def test_it_drops_a_batch_refused_with_400_without_retrying(server: IngestServer) -> None:
    server.script.append("400")
    exporter = exporter_for(server, sleep=lambda s: None)
    for i in range(4):
        exporter.submit(message(i))
    assert exporter.flush(10)
    exporter.submit(message(99))
    assert exporter.flush(10)
    exporter.shutdown(2)
    stats = exporter.stats()
    assert len(server.requests) == 2
    assert (stats.failures, stats.sent, stats.retries) == (4, 1, 0)


def test_it_does_not_retry_an_unauthorised_key(server: IngestServer) -> None:
    exporter = RecordExporter(server.url, "wrong-key", flush_interval_ms=20, sleep=lambda s: None)
    exporter.submit(message(0))
    assert exporter.flush(10)
    exporter.shutdown(2)
    assert len(server.requests) == 1
    assert exporter.stats().failures == 1
    assert "401" in (exporter.stats().last_error or "")
    assert server.stored == {}


def test_it_does_not_follow_redirects(server: IngestServer) -> None:
    server.script.append("307")
    exporter = exporter_for(server, sleep=lambda s: None)
    exporter.submit(message(0))
    assert exporter.flush(10)
    exporter.shutdown(2)
    assert len(server.requests) == 1 and exporter.stats().failures == 1


def test_it_counts_records_the_server_rejects(server: IngestServer) -> None:
    server.reject_type = "round"
    from pipeline import RoundRecord

    exporter = exporter_for(server)
    exporter.submit(message(0))
    exporter.submit(RoundRecord(conversation_id="conv-1", round_id="r1", index=0))
    exporter.submit(message(1))
    assert exporter.flush(10)
    exporter.shutdown(2)
    stats = exporter.stats()
    assert (stats.sent, stats.rejected) == (2, 1)
    assert "refused by test" in (stats.last_error or "")


def test_it_halves_a_batch_the_server_finds_too_large(server: IngestServer) -> None:
    server.max_records = 10
    exporter = exporter_for(server, batch_size=50, start=False)
    records = [message(i) for i in range(50)]
    for record in records:
        exporter.submit(record)
    exporter.start()
    assert exporter.flush(10)
    exporter.shutdown(2)
    assert set(server.stored) == {str(r.record_id) for r in records}
    assert exporter.stats().sent == 50


def test_it_drops_the_oldest_when_the_queue_is_full(server: IngestServer) -> None:
    exporter = exporter_for(server, max_queue=5, start=False)
    records = [message(i) for i in range(8)]
    for record in records:
        assert exporter.submit(record) is True
    stats = exporter.stats()
    assert (stats.dropped, stats.queue_depth, stats.submitted) == (3, 5, 8)
    exporter.start()
    assert exporter.flush(10)
    exporter.shutdown(2)
    assert set(server.stored) == {str(r.record_id) for r in records[3:]}


def test_it_never_raises_on_junk(server: IngestServer) -> None:
    class Hostile(dict):
        def get(self, *args: Any) -> Any:
            raise RuntimeError("boom")

    exporter = exporter_for(server)
    junk: list[Any] = [None, 42, "text", b"\x00", {"type": "nope"}, {"type": "message"}, Hostile(type="message"), object()]
    for item in junk:
        assert exporter.submit(item) is False
    valid = {"type": "message", "conversation_id": "c", "index": 0, "role": "user", "content": "hi"}
    assert exporter.submit(valid) is True
    assert exporter.flush(10)
    exporter.shutdown(2)
    stats = exporter.stats()
    assert (stats.submitted, stats.rejected, stats.sent) == (len(junk) + 1, len(junk), 1)


def test_it_counts_a_record_mutated_into_junk_after_submit(server: IngestServer) -> None:
    exporter = exporter_for(server, start=False)
    record = message(0)
    exporter.submit(record)
    object.__setattr__(record, "tokens", object())  # not JSON-serialisable any more
    exporter.submit(message(1))
    exporter.start()
    assert exporter.flush(10)
    exporter.shutdown(2)
    stats = exporter.stats()
    assert (stats.rejected, stats.sent) == (1, 1)


def test_it_refuses_records_after_shutdown_without_raising(server: IngestServer) -> None:
    exporter = exporter_for(server)
    exporter.shutdown(2)
    assert exporter.submit(message(0)) is False
    assert exporter.upload_artifact("artifact_" + "a" * 16, b"x") is False
    assert exporter.stats().dropped == 1
    assert exporter.shutdown(1) is True  # a second shutdown is harmless


def test_it_shuts_down_within_its_bound_when_the_server_hangs(server: IngestServer) -> None:
    server.script.extend(["hang"] * 5)
    exporter = exporter_for(server, request_timeout_s=30)
    for i in range(3):
        exporter.submit(message(i))
    started = time.monotonic()
    delivered = exporter.shutdown(timeout=0.5)
    elapsed = time.monotonic() - started
    assert delivered is False
    assert elapsed < 5  # bounded by the timeout, not by the 30 s request timeout
    assert exporter.stats().failures + exporter.stats().sent + exporter.stats().queue_depth <= 3


def test_it_shuts_down_within_its_bound_when_nothing_listens() -> None:
    exporter = RecordExporter(f"http://127.0.0.1:{free_port()}", API_KEY, flush_interval_ms=10, backoff_s=5.0)
    for i in range(5):
        exporter.submit(message(i))
    started = time.monotonic()
    assert exporter.shutdown(timeout=0.5) is False
    assert time.monotonic() - started < 5  # the 5 s backoff is interrupted by shutdown
    stats = exporter.stats()
    assert stats.failures == 5 and stats.sent == 0
    assert stats.last_error


def test_it_reports_a_flush_that_cannot_finish(server: IngestServer) -> None:
    server.script.append("hang")
    exporter = exporter_for(server, request_timeout_s=30)
    exporter.submit(message(0))
    assert exporter.flush(0.3) is False
    exporter.shutdown(0.2)


def test_it_gzips_the_body_when_asked(server: IngestServer) -> None:
    exporter = exporter_for(server, compress=True)
    exporter.submit(message(0))
    assert exporter.flush(10)
    exporter.shutdown(2)
    assert server.requests[0]["headers"]["Content-Encoding"] == "gzip"
    assert len(server.stored) == 1


def test_it_uploads_artifacts_with_their_sha256(server: IngestServer) -> None:
    exporter = exporter_for(server)
    artifact_id = "artifact_" + "0123456789abcdef"
    data = b"region,revenue\nnorth,10\n"
    assert exporter.upload_artifact(artifact_id, data, "text/csv") is True
    assert exporter.flush(10)
    exporter.shutdown(2)
    put = server.requests[0]
    assert put["method"] == "PUT" and put["path"] == f"/api/v1/artifacts/{artifact_id}"
    assert put["headers"]["Content-Type"] == "text/csv" and put["sha_ok"]
    assert server.artifacts[artifact_id] == data
    assert exporter.stats().artifacts_sent == 1


def test_it_retries_an_artifact_upload_on_503_with_fake_sleep(server: IngestServer) -> None:
    server.script.extend(["503", "drop"])
    exporter = exporter_for(server, sleep=lambda s: None)
    exporter.upload_artifact("artifact_" + "f" * 32, b"payload")
    assert exporter.flush(10)
    exporter.shutdown(2)
    assert exporter.stats().artifacts_sent == 1 and exporter.stats().retries == 2


@pytest.mark.parametrize(
    "artifact_id, data, content_type",
    [
        ("../etc/passwd", b"x", "text/plain"),
        ("artifact_XYZ", b"x", "text/plain"),
        ("artifact_" + "a" * 16 + "/..", b"x", "text/plain"),
        ("artifact_" + "a" * 16, "not bytes", "text/plain"),
        ("artifact_" + "a" * 16, b"x", "text/plain\r\nX-Evil: 1"),
        (None, b"x", "text/plain"),
    ],
)
def test_it_refuses_bad_artifacts_locally(server: IngestServer, artifact_id: Any, data: Any, content_type: str) -> None:
    exporter = exporter_for(server)
    assert exporter.upload_artifact(artifact_id, data, content_type) is False
    exporter.shutdown(1)
    assert server.requests == [] and exporter.stats().artifacts_failed == 1


def test_it_keeps_the_accounting_invariant(server: IngestServer) -> None:
    server.script.extend(["400", "500"])
    server.reject_type = "round"
    from pipeline import RoundRecord

    exporter = exporter_for(server, batch_size=3, max_queue=20, sleep=lambda s: None, start=False)
    for i in range(25):
        exporter.submit(message(i) if i % 5 else RoundRecord(conversation_id="c", round_id=f"r{i}", index=i))
    exporter.submit("junk")
    exporter.start()
    assert exporter.flush(10)
    exporter.shutdown(2)
    s = exporter.stats()
    assert s.submitted == s.sent + s.rejected + s.dropped + s.failures + s.queue_depth
    assert s.dropped == 5 and s.failures == 3


@pytest.mark.parametrize(
    "value, expected",
    [
        ("7", 7.0),
        ("0", 0.0),
        ("-3", 0.0),
        ("999999", 60.0),
        ("Wed, 21 Oct 2099 07:28:00 GMT", 60.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
        ("soon", None),
        ("nan", None),
    ],
)
def test_it_reads_retry_after_as_seconds_or_http_date_capped(value: str, expected: Optional[float]) -> None:
    assert _retry_after({"Retry-After": value}, 60.0, time.time()) == expected


def test_it_waits_until_a_retry_after_date_with_fake_clock_and_sleep(server: IngestServer) -> None:
    sleeps: list[float] = []
    server.script.append("429:Wed, 21 Oct 2015 07:28:00 GMT")
    fake_now = 1445412480.0 - 25  # 25 s before that date
    exporter = exporter_for(server, sleep=sleeps.append, clock=lambda: fake_now)
    exporter.submit(message(0))
    assert exporter.flush(10)
    exporter.shutdown(2)
    assert sleeps == [25.0] and exporter.stats().sent == 1


def test_it_refuses_a_non_http_endpoint() -> None:
    with pytest.raises(ValueError):
        RecordExporter("file:///etc/passwd", API_KEY, start=False)


def test_it_builds_a_tool_result_record_with_renderings() -> None:
    request = ToolInvocationRequest(tool_call_id="call_1", tool_name="query_sales", parameters={"region": "north"})
    result = ToolExecutionResult(
        tool_call_id="call_1", observation="3 rows", output_level=OutputLevel.STANDARD, success=True, observation_tokens=3
    )
    record = records_for_result(
        request,
        result,
        conversation_id="conv-1",
        round_id="r1",
        trace_id="a" * 32,
        span_id="b" * 16,
        renderings={"full": "row1\nrow2\nrow3", OutputLevel.BRIEF: "3 rows total"},
        count_tokens=lambda text: len(text.split()),
    )
    assert isinstance(record, ToolResultRecord)
    assert [r.level for r in record.renderings] == [OutputLevel.BRIEF, OutputLevel.STANDARD, OutputLevel.FULL]
    assert record.renderings[1] == LevelRendering(level=OutputLevel.STANDARD, observation="3 rows", tokens=3)
    assert record.renderings[0].tokens == 3
    assert (record.tool_name, record.parameters, record.trace_id) == ("query_sales", {"region": "north"}, "a" * 32)
    plain = records_for_result(request, result, conversation_id="conv-1")
    assert plain.renderings == [] and plain.trace_id is None


# --- outages: retry while the queue has room, spool, restart ----------------------------



def test_it_retries_through_refusal_and_503_until_all_arrive_exactly_once_in_real_time() -> None:
    port = free_port()  # nothing listens yet: connection refused
    exporter = RecordExporter(f"http://127.0.0.1:{port}", API_KEY, flush_interval_ms=50, backoff_s=0.05,
                              max_backoff_s=0.3)
    records = [message(i) for i in range(30)]
    try:
        for record in records[:15]:  # 10 records a second while the dashboard is down
            exporter.submit(record)
            time.sleep(0.1)
        down = exporter.stats()
        assert down.retries >= 1 and down.sent == 0 and "Connection refused" in (down.last_error or "")
        server = IngestServer(port)  # back, but overloaded for a moment
        server.script.extend(["503:1", "503:1"])
        try:
            for record in records[15:]:
                exporter.submit(record)
                time.sleep(0.1)
            assert exporter.flush(10)
        finally:
            server.close()
    finally:
        exporter.shutdown(2)
    stats = exporter.stats()
    assert set(server.stored) == {str(r.record_id) for r in records}  # distinct: each arrived
    assert (stats.sent, stats.dropped, stats.failures, stats.queue_depth) == (30, 0, 0, 0)
    assert [r["step"] for r in server.requests[:2]] == ["503:1", "503:1"]


def test_it_loses_nothing_in_a_five_minute_outage_at_ten_records_a_second_with_fake_clock() -> None:
    clock = FakeClock()
    port = free_port()
    exporter = RecordExporter(f"http://127.0.0.1:{port}", API_KEY, monotonic=clock.monotonic, wait=clock.wait,
                              backoff_s=0.5, max_backoff_s=30.0)
    records = [message(i) for i in range(3_000)]
    for record in records:  # 300 virtual seconds, nothing listening
        exporter.submit(record)
        clock.advance(0.1)
    down = exporter.stats()
    assert down.sent == 0 and down.dropped == 0 and down.failures == 0
    assert 5 <= down.retries <= 40  # capped exponential backoff, not a hammering loop
    server = IngestServer(port)
    try:
        assert wait_until(lambda: exporter.stats().queue_depth == 0, 30, step=lambda: clock.advance(1.0))
    finally:
        exporter.shutdown(2)
        server.close()
    stats = exporter.stats()
    assert set(server.stored) == {str(r.record_id) for r in records}
    assert (stats.sent, stats.dropped, stats.failures) == (3_000, 0, 0)


def test_it_drops_exactly_the_oldest_beyond_the_queue_and_counts_them() -> None:
    port = free_port()
    exporter = RecordExporter(f"http://127.0.0.1:{port}", API_KEY, max_queue=50, batch_size=20,
                              flush_interval_ms=20, backoff_s=0.05, max_backoff_s=0.1)
    records = [message(i) for i in range(120)]
    for record in records:
        exporter.submit(record)
    assert wait_until(lambda: exporter.stats().dropped == 70 and exporter.stats().queue_depth == 50)
    server = IngestServer(port)
    try:
        assert exporter.flush(10)
    finally:
        exporter.shutdown(2)
        server.close()
    stats = exporter.stats()
    assert set(server.stored) == {str(r.record_id) for r in records[70:]}
    assert (stats.dropped, stats.sent, stats.reasons["overflow"]) == (70, 50, 70)
    assert stats.submitted == stats.sent + stats.dropped


def test_it_bounds_the_queue_in_bytes_too(server: IngestServer) -> None:
    big = [MessageRecord(conversation_id="c", index=i, role="user", content="x" * 10_000) for i in range(10)]
    exporter = exporter_for(server, max_queue_bytes=35_000, start=False)
    for record in big:
        exporter.submit(record)
    exporter.start()
    assert exporter.flush(10)
    exporter.shutdown(2)
    stats = exporter.stats()
    assert stats.reasons.get("overflow_bytes") == stats.dropped > 0
    assert set(server.stored) == {str(r.record_id) for r in big[-(10 - stats.dropped):]}
    assert stats.sent + stats.dropped == 10


def test_it_retries_without_limit_by_default_with_fake_sleep(server: IngestServer) -> None:
    server.script.extend(["503"] * 25)
    exporter = exporter_for(server, sleep=lambda s: None)
    exporter.submit(message(0))
    assert exporter.flush(10)
    exporter.shutdown(2)
    assert (exporter.stats().sent, exporter.stats().retries, exporter.stats().failures) == (1, 25, 0)


@pytest.mark.parametrize("status", ["400", "307"])
def test_it_drops_a_refused_batch_with_its_reason(server: IngestServer, status: str) -> None:
    server.script.append(status)
    exporter = exporter_for(server, sleep=lambda s: None, start=False)
    for i in range(3):
        exporter.submit(message(i))
    exporter.start()
    assert exporter.flush(10)
    exporter.shutdown(2)
    assert exporter.stats().reasons == {f"http_{status}": 3} and exporter.stats().failures == 3


def replay_to_a_new_server(port: int, spool_dir: Any, replayed: int) -> tuple[IngestServer, RecordExporter]:
    """Bring the dashboard up on ``port`` and let a new exporter on ``spool_dir``
    send what it finds there (``replayed`` records); both are stopped on return."""
    server = IngestServer(port)
    try:
        exporter = RecordExporter(server.url, API_KEY, spool_dir=str(spool_dir), flush_interval_ms=20)
        assert wait_until(lambda: exporter.stats().replayed == replayed)
        assert exporter.flush(10)
        exporter.shutdown(2)
    finally:
        server.close()
    return server, exporter


def test_it_keeps_what_it_could_not_send_in_the_spool_and_a_new_exporter_sends_it(tmp_path: Any) -> None:
    port = free_port()
    spool = tmp_path / "spool"
    first = RecordExporter(f"http://127.0.0.1:{port}", API_KEY, spool_dir=str(spool), backoff_s=5.0)
    records = [message(i) for i in range(40)]
    for record in records:
        first.submit(record)
    assert wait_until(lambda: first.stats().spooled == 40)
    assert first.shutdown(0.5) is False  # nothing listens: it cannot deliver
    stats = first.stats()
    assert (stats.kept_in_spool, stats.failures, stats.sent) == (40, 0, 0)
    server, second = replay_to_a_new_server(port, spool, 40)
    assert set(server.stored) == {str(r.record_id) for r in records}
    assert second.stats().sent == 40 and second.stats().kept_in_spool == 0
    third = RecordExporter(server.url, API_KEY, spool_dir=str(spool))  # delivered: nothing left to replay
    assert wait_until(lambda: third._records._spool.enabled)
    third.shutdown(1)
    assert third.stats().replayed == 0


AGENT = """
import sys, time
from pipeline import MessageRecord, RecordExporter
exporter = RecordExporter(sys.argv[1], "test-key-123", spool_dir=sys.argv[2], backoff_s=5.0)
for i in range(int(sys.argv[3])):
    exporter.submit(MessageRecord(conversation_id="crash", index=i, role="user", content=f"q{i}"))
while exporter.stats().spooled < int(sys.argv[3]):
    time.sleep(0.01)
print("spooled", flush=True)
time.sleep(60)  # killed before this ends
"""


def test_it_delivers_after_the_agent_is_killed_with_sigkill(tmp_path: Any) -> None:
    import signal
    import subprocess
    import sys
    from pathlib import Path

    port = free_port()
    root = Path(__file__).resolve().parents[2]
    agent = subprocess.Popen([sys.executable, "-c", AGENT, f"http://127.0.0.1:{port}", str(tmp_path), "25"],
                             stdout=subprocess.PIPE, text=True, cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    try:
        assert agent.stdout is not None and agent.stdout.readline().strip() == "spooled"
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
    server, _ = replay_to_a_new_server(port, tmp_path, 25)
    assert sorted(r["index"] for r in server.stored.values()) == list(range(25))


def test_it_skips_a_torn_last_entry_of_the_spool_and_sends_the_rest(tmp_path: Any) -> None:
    port = free_port()
    first = RecordExporter(f"http://127.0.0.1:{port}", API_KEY, spool_dir=str(tmp_path), backoff_s=5.0)
    records = [message(i) for i in range(10)]
    for record in records:
        first.submit(record)
    assert wait_until(lambda: first.stats().spooled == 10)
    first.shutdown(0.3)
    (segment,) = sorted(tmp_path.glob("segment-*.spool"))
    data = segment.read_bytes()
    segment.write_bytes(data[:-7])  # a crash in the middle of writing the last entry
    server, second = replay_to_a_new_server(port, tmp_path, 9)
    assert set(server.stored) == {str(r.record_id) for r in records[:9]}
    assert second._records._spool.torn == 1


def test_it_continues_in_memory_when_the_spool_directory_is_unusable(server: IngestServer, tmp_path: Any,
                                                                      caplog: Any) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with caplog.at_level("WARNING", logger="pipeline.exporter"):
        exporter = exporter_for(server, spool_dir=str(blocker / "spool"))
        for i in range(5):
            assert exporter.submit(message(i))
        assert exporter.flush(10)
        exporter.submit(message(5))
        assert exporter.flush(10)
        exporter.shutdown(2)
    stats = exporter.stats()
    assert (stats.sent, stats.spool_errors, stats.spooled) == (6, 1, 0)
    assert len([r for r in caplog.records if "spool" in r.getMessage()]) == 1


def test_it_refuses_to_share_a_spool_directory_between_two_live_exporters(server: IngestServer, tmp_path: Any) -> None:
    first = exporter_for(server, spool_dir=str(tmp_path))
    assert wait_until(lambda: first._records._spool.enabled)
    second = exporter_for(server, spool_dir=str(tmp_path))
    second.submit(message(0))
    assert second.flush(10)
    assert second.stats().spool_errors == 1 and second.stats().sent == 1
    second.shutdown(1)
    first.shutdown(1)


def test_it_measures_how_long_records_wait_before_they_are_on_disk(server: IngestServer, tmp_path: Any) -> None:
    exporter = exporter_for(server, spool_dir=str(tmp_path), flush_interval_ms=500)
    for i in range(20):
        exporter.submit(message(i))
        time.sleep(0.01)
    assert exporter.flush(10)
    exporter.shutdown(2)
    lag = exporter.stats().spool_lag_ms_max
    assert 0 < lag < 1_000  # written within about one 100 ms spool interval, not the flush interval


def test_it_keeps_spooling_while_a_send_hangs(server: IngestServer, tmp_path: Any) -> None:
    server.script.append("hang")  # the dashboard accepts the request and never answers
    exporter = exporter_for(server, spool_dir=str(tmp_path), request_timeout_s=30, batch_size=1)
    exporter.submit(message(0))
    assert wait_until(lambda: len(server.requests) == 1)  # the sending thread is stuck in it now
    for i in range(1, 6):
        exporter.submit(message(i))
    assert wait_until(lambda: exporter.stats().spooled == 6, 2)  # on disk within the spool interval
    assert exporter.stats().spool_lag_ms_max < 1_000
    exporter.shutdown(0.3)
    assert exporter.stats().kept_in_spool == 5  # the one in flight is neither kept nor counted lost
