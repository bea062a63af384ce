"""The shared ingest helpers: bounded bodies, safe JSON, the gate, error answers."""

from __future__ import annotations

import gzip
import json

import pytest
from django.db import OperationalError
from django.test import RequestFactory

from dashboard.ingest.common import (
    IngestError,
    database_errors_as_busy,
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
    with pytest.raises(IngestError) as caught, database_errors_as_busy():
        raise OperationalError("deadlock detected")
    assert caught.value.retry_after


def test_it_frees_the_gate_after_errors(settings):
    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 1
    for _ in range(3):
        with pytest.raises(ValueError), ingest_gate():
            raise ValueError("boom")
    with ingest_gate():
        assert refusal(lambda: ingest_gate().__enter__()) == (429, "too many concurrent ingest requests")
