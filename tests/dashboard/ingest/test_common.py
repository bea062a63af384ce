"""The shared ingest helpers: bounded bodies, safe JSON, the gate, error answers."""

from __future__ import annotations

import gzip
import json
import sqlite3
import threading
import time

import psycopg.errors
import pytest
from django.db import OperationalError
from hypothesis import given, settings as hypothesis_settings
from hypothesis import strategies as st
from django.http import HttpResponse
from django.test import RequestFactory

from dashboard.ingest.common import (
    IngestError,
    database_errors_refused,
    error_response,
    ingest_gate,
    load_json,
    read_body,
)


def request(body: bytes, **headers):
    return RequestFactory().generic("POST", "/x", body, content_type="application/json", **headers)


def refusal(call) -> tuple[int, str]:
    with pytest.raises(IngestError) as caught:
        call()
    return caught.value.status, caught.value.message


def test_it_reads_identity_and_multi_member_gzip_bodies():
    assert read_body(request(b"abc"), max_bytes=10, max_decoded_bytes=10) == b"abc"
    two_members = gzip.compress(b"ab") + gzip.compress(b"cd")
    assert read_body(request(two_members, HTTP_CONTENT_ENCODING="gzip"), max_bytes=100, max_decoded_bytes=10) == b"abcd"


def test_it_refuses_bad_lengths_encodings_and_gzip():
    assert refusal(lambda: read_body(request(b"x" * 11), max_bytes=10, max_decoded_bytes=99))[0] == 413
    truncated = gzip.compress(b"hello world")[:-6]
    assert refusal(lambda: read_body(request(truncated, HTTP_CONTENT_ENCODING="gzip"), max_bytes=99,
                                     max_decoded_bytes=99))[0] == 400
    bomb = gzip.compress(b"0" * 100_000)
    assert refusal(lambda: read_body(request(bomb, HTTP_CONTENT_ENCODING="gzip"), max_bytes=10_000,
                                     max_decoded_bytes=1000))[0] == 413
    assert refusal(lambda: read_body(request(b"x", HTTP_CONTENT_ENCODING="zstd"), max_bytes=9,
                                     max_decoded_bytes=9))[0] == 415
    bad_length = request(b"x")
    bad_length.META["CONTENT_LENGTH"] = "ten"
    assert refusal(lambda: read_body(bad_length, max_bytes=9, max_decoded_bytes=9)) == (400, "invalid Content-Length")


def test_it_parses_json_with_a_depth_cap_that_ignores_brackets_in_strings():
    text = json.dumps({"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[" + "{" * 50}).encode()
    assert load_json(text, max_depth=3)["a"].startswith("[[")
    assert refusal(lambda: load_json(b"[" * 5 + b"]" * 5, max_depth=4))[0] == 400
    assert load_json(b"[" * 4 + b"]" * 4, max_depth=4) == [[[[]]]]
    assert load_json(b'["\\"[[[["]', max_depth=1) == ['"[[[[']


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


# Strings full of what could fool a text scan: quotes, backslashes, brackets, escapes.
_tricky_text = st.text(alphabet=st.sampled_from(list('"\\[]{}ab\n\u00e9\u4e2d')), max_size=12)
_json_values = st.recursive(
    st.none() | st.integers() | _tricky_text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_tricky_text, children, max_size=3),
    max_leaves=30,
)


@hypothesis_settings(max_examples=300, deadline=None)
@given(value=_json_values, max_depth=st.integers(min_value=1, max_value=6), ascii_only=st.booleans())
def test_it_measures_the_depth_of_any_json_as_its_parsed_value_has_it(value, max_depth, ascii_only):
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    if _depth(value) > max_depth:
        assert refusal(lambda: load_json(body, max_depth=max_depth))[0] == 400
    else:
        assert load_json(body, max_depth=max_depth) == value


def test_it_refuses_the_non_json_constants_python_would_accept():
    for body in (b'{"x": NaN}', b"[Infinity]", b"[-Infinity]"):
        assert refusal(lambda: load_json(body))[0] == 400


def test_it_answers_short_json_errors_with_retry_after():
    response = error_response(IngestError(429, "slow down", retry_after=1))
    assert (response.status_code, json.loads(response.content), response["Retry-After"]) == (429, {"error": "slow down"}, "1")
    response = error_response(IngestError(400, "bad"), content_type="application/x-protobuf", body=b"\x08\x03")
    assert response["Content-Type"] == "application/x-protobuf" and response.content == b"\x08\x03"


def test_it_turns_database_lock_errors_into_503(settings):
    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 2
    def locked():
        with ingest_gate():
            raise OperationalError("database is locked")
    status, _ = refusal(locked)
    assert status == 503
    with pytest.raises(IngestError) as caught, database_errors_refused():
        raise OperationalError("deadlock detected") from psycopg.errors.DeadlockDetected("deadlock detected")
    assert (caught.value.status, caught.value.retry_after) == (503, 2)


def test_it_turns_other_database_errors_into_a_500_naming_nothing(settings):
    """Not busy (``database_busy``): the same batch would fail the same way again."""
    with pytest.raises(IngestError) as caught, database_errors_refused():
        raise OperationalError("no such table: observatory_span") from sqlite3.OperationalError("no such table")
    assert (caught.value.status, caught.value.retry_after) == (500, None)
    assert "observatory" not in caught.value.message and "table" not in caught.value.message


def test_it_frees_the_gate_after_errors(settings):
    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 1
    for _ in range(3):
        with pytest.raises(ValueError), ingest_gate():
            raise ValueError("boom")
    with ingest_gate():
        assert refusal(lambda: ingest_gate().__enter__()) == (429, "too many concurrent ingest requests")


def _hold_gate(release: threading.Event) -> tuple[threading.Thread, threading.Event]:
    """Another request holding a place in the gate until ``release`` is set."""
    held = threading.Event()

    def hold() -> None:
        with ingest_gate():
            held.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    return thread, held


def test_it_lets_a_request_wait_for_a_place_in_a_full_gate(settings, monkeypatch):
    """A small batch finds the gate full: it waits for the place another request
    frees instead of costing its sender a 429 and a second."""
    from dashboard.ingest import common

    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 1
    monkeypatch.setattr(common, "GATE_WAIT", 30.0)
    release = threading.Event()
    holder, _ = _hold_gate(release)
    threading.Timer(0.2, release.set).start()
    started = time.monotonic()
    with ingest_gate():
        waited = time.monotonic() - started
    holder.join(10)
    assert 0.1 < waited < 20


def test_it_lets_one_request_wait_and_refuses_the_others_at_once(settings, monkeypatch):
    """Only one request waits, so a full process still keeps a thread for the pages."""
    from dashboard.ingest import common

    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 1
    monkeypatch.setattr(common, "GATE_WAIT", 30.0)
    release = threading.Event()
    holder, _ = _hold_gate(release)
    waiter_in = threading.Event()

    def wait_for_a_place() -> None:
        with ingest_gate():
            waiter_in.set()

    waiter = threading.Thread(target=wait_for_a_place)
    waiter.start()
    deadline = time.monotonic() + 10
    while not common._gate_waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    assert refusal(lambda: ingest_gate().__enter__()) == (429, "too many concurrent ingest requests")
    assert time.monotonic() - started < 5  # refused without waiting
    release.set()
    holder.join(10)
    waiter.join(10)
    assert waiter_in.is_set()


def test_it_refuses_at_once_while_a_page_runs_in_the_process(settings, monkeypatch):
    from dashboard import priority
    from dashboard.ingest import common

    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 1
    monkeypatch.setattr(common, "GATE_WAIT", 30.0)
    release = threading.Event()
    holder, _ = _hold_gate(release)
    page = priority.PagePriorityMiddleware(lambda request: (refusal(lambda: ingest_gate().__enter__()), HttpResponse())[1])
    started = time.monotonic()
    try:
        page(RequestFactory().get("/"))
    finally:
        release.set()
        holder.join(10)
    assert time.monotonic() - started < 5


def test_it_waits_for_no_place_when_the_gate_is_closed(settings, monkeypatch):
    from dashboard.ingest import common

    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 0
    monkeypatch.setattr(common, "GATE_WAIT", 30.0)
    started = time.monotonic()
    assert refusal(lambda: ingest_gate().__enter__())[0] == 429
    assert time.monotonic() - started < 5


class Dribble:
    """A server's input stream that returns a few bytes a read, as a socket does."""

    def __init__(self, data: bytes, step: int = 3) -> None:
        self.data, self.step = data, step

    def read(self, size: int = -1) -> bytes:
        part, self.data = self.data[: min(self.step, size)], self.data[min(self.step, size):]
        return part


def chunked_request(data: bytes, **headers):
    """What gunicorn hands Django for ``Transfer-Encoding: chunked``: no
    Content-Length, the decoded chunks on wsgi.input."""
    made = RequestFactory().generic("POST", "/x", b"", content_type="application/x-protobuf",
                                    HTTP_TRANSFER_ENCODING="chunked", **headers)
    made.META.pop("CONTENT_LENGTH", None)
    made.META["wsgi.input"] = Dribble(data)
    return made


def test_it_reads_a_chunked_body_to_its_end():
    assert read_body(chunked_request(b"0123456789" * 10), max_bytes=100, max_decoded_bytes=100) == b"0123456789" * 10
    packed = gzip.compress(b"hello " * 50)
    assert read_body(chunked_request(packed, HTTP_CONTENT_ENCODING="gzip"), max_bytes=1000,
                     max_decoded_bytes=1000) == b"hello " * 50


def test_it_bounds_a_chunked_body_before_and_after_gzip():
    assert refusal(lambda: read_body(chunked_request(b"x" * 101), max_bytes=100, max_decoded_bytes=1000))[0] == 413
    bomb = gzip.compress(b"0" * 100_000)
    assert refusal(lambda: read_body(chunked_request(bomb, HTTP_CONTENT_ENCODING="gzip"), max_bytes=10_000,
                                     max_decoded_bytes=1000))[0] == 413


def test_it_refuses_a_body_shorter_than_its_content_length():
    short = request(b"abc")
    short.META["CONTENT_LENGTH"] = "10"
    assert refusal(lambda: read_body(short, max_bytes=99, max_decoded_bytes=99)) == (
        400, "body ended after 3 of its 10 bytes")
