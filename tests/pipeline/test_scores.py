"""ScoreRecord (the scores API's item schema) and RecordExporter.score: what a score
may be, and that sending one costs the agent a queue append whatever the dashboard
does."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from pipeline import RecordExporter, ScoreRecord


def test_it_reads_what_a_score_judges_most_precisely():
    assert ScoreRecord(name="n", value=1, conversation_id="c").target == "conversation"
    assert ScoreRecord(name="n", value=1, conversation_id="c", round_id="r").target == "round"
    assert ScoreRecord(name="n", value=1, trace_id="a" * 32).target == "trace"
    assert ScoreRecord(name="n", value=1, trace_id="a" * 32, span_id="b" * 16, tool_call_id="x").target == "span"
    assert ScoreRecord(name="n", value=1, tool_call_id="call_1", conversation_id="c").target == "tool_call"
    assert ScoreRecord(name="n", value=1, response_id="chatcmpl-1", trace_id="a" * 32).target == "response"


def test_a_string_value_is_a_label_and_booleans_stay_booleans():
    assert ScoreRecord(name="n", value="good", conversation_id="c").label == "good"
    assert ScoreRecord(name="n", value=True, conversation_id="c").value is True
    assert ScoreRecord(name="n", value=3, label="three", conversation_id="c").label == "three"


@pytest.mark.parametrize("fields, words", [
    (dict(conversation_id="c"), "needs a value or a label"),
    (dict(value=1), "name what is scored"),
    (dict(value=1, span_id="b" * 16, conversation_id="c"), "span_id needs trace_id"),
    (dict(value=1, round_id="r"), "round_id needs conversation_id"),
    (dict(value=float("nan"), conversation_id="c"), "finite"),
    (dict(value=2**60, conversation_id="c"), "too large"),
    (dict(value="good", label="bad", conversation_id="c"), "send the category once"),
    (dict(value=1, conversation_id="c", occurred_at=datetime(2026, 1, 1)), "needs a timezone"),
    (dict(value=1, conversation_id="c", comment="x" * 10_001), "at most 10000"),
    (dict(value=1, conversation_id="c", trace_id="XYZ"), "pattern"),
    (dict(value=1, conversation_id="c\n"), "pattern"),
    (dict(value=[1], conversation_id="c"), "value"),
    (dict(value=1, conversation_id="c", extra=1), "Extra inputs"),
])
def test_it_refuses_what_is_not_a_score(fields, words):
    with pytest.raises(ValidationError, match=words):
        ScoreRecord(name="n", **fields)


def test_it_makes_a_score_id_when_none_is_given():
    first, second = (ScoreRecord(name="n", value=1, conversation_id="c") for _ in range(2))
    assert first.score_id != second.score_id


class Recording:
    """A transport that answers like the dashboard and remembers what it was sent."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.sent: list[tuple[str, str, dict]] = []
        self.lock = threading.Lock()

    def send(self, method, url, headers, body, timeout):
        if self.fail:
            raise ConnectionRefusedError("dashboard down")
        payload = json.loads(body)
        with self.lock:
            self.sent.append((method, url, payload))
        scores = payload.get("scores", [])
        rejected = [{"index": i, "error": "thumbs is a boolean score"} for i, s in enumerate(scores)
                    if s["name"] == "thumbs" and not isinstance(s.get("value"), bool)]
        answer = {"accepted": len(scores) - len(rejected), "duplicates": 0, "updated": 0, "rejected": rejected}
        return 200, {}, json.dumps(answer).encode()


def test_it_sends_scores_in_batches_to_the_scores_endpoint():
    transport = Recording()
    exporter = RecordExporter("http://dashboard.test", "key", transport=transport, flush_interval_ms=20)
    try:
        assert exporter.score("grounded", True, conversation_id="conv-1", round_id="conv-1-r0",
                              comment="quotes 1,234 from query_sales")
        assert exporter.score("thumbs", 0.5, conversation_id="conv-1")  # the dashboard refuses this one
        assert exporter.flush(5)
    finally:
        exporter.shutdown(2)
    # One batch, or two when the sending thread took the first score in before the second
    # came and the flush then sent what it had (the batching is timing's, the delivery is not).
    assert {(method, url) for method, url, _ in transport.sent} == {("POST", "http://dashboard.test/api/v1/scores")}
    assert 1 <= len(transport.sent) <= 2
    sent = [score for _, _, payload in transport.sent for score in payload["scores"]]
    assert [score["name"] for score in sent] == ["grounded", "thumbs"]
    first = sent[0]
    assert (first["name"], first["value"], first["round_id"], first["comment"]) == (
        "grounded", True, "conv-1-r0", "quotes 1,234 from query_sales")
    stats = exporter.stats()
    assert (stats.scores_submitted, stats.scores_sent, stats.scores_failed, stats.submitted) == (2, 1, 1, 0)
    assert exporter.delivery_stats()[0].submitted == 0  # the records queue saw none of it


def test_it_refuses_junk_scores_here_and_never_raises():
    exporter = RecordExporter("http://dashboard.test", "key", transport=Recording(), start=False)
    assert not exporter.score("n")  # no value
    assert not exporter.score("n", 1)  # nothing scored
    assert not exporter.submit_score(object())
    assert not exporter.submit_score({"name": "n", "value": float("inf"), "conversation_id": "c"})
    stats = exporter.stats()
    assert (stats.scores_submitted, stats.scores_failed) == (4, 4)
    exporter.shutdown(1)


def test_it_starts_the_score_thread_with_the_first_score():
    def threads():
        return {thread.name for thread in threading.enumerate()}

    exporter = RecordExporter("http://dashboard.test", "key", transport=Recording())
    try:
        assert "pipeline-score-exporter" not in threads()
        exporter.score("n", 1, conversation_id="c")
        assert "pipeline-score-exporter" in threads()
    finally:
        exporter.shutdown(2)


def test_a_dashboard_that_is_down_costs_the_agent_nothing():
    exporter = RecordExporter("http://dashboard.test", "key", transport=Recording(fail=True), flush_interval_ms=10,
                              backoff_s=0.01, max_backoff_s=0.02)
    started = time.perf_counter()
    for index in range(200):
        assert exporter.score("grounded", index % 2 == 0, conversation_id=f"conv-{index}",
                              occurred_at=datetime.now(timezone.utc))
    assert time.perf_counter() - started < 1.0
    assert exporter.shutdown(0.5) is False  # left unsent, counted, no hang
    stats = exporter.stats()
    assert stats.scores_sent == 0 and stats.scores_failed == 200
