"""The official OpenTelemetry Python SDK exporters (OTLP http/protobuf and gRPC,
spans and logs, gzip), configured only by OTEL_EXPORTER_OTLP_* variables, against
a real gunicorn, ``manage.py otlp_grpc`` and ``manage.py otlp_http``: every span stored exactly once, the
logs linked to their span's conversation, and both shown on the pages."""

from __future__ import annotations

import html
import sys

import pytest

from .interop import exporter_env, last_json, running_stack, wait_for

ROUNDS = 30


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with running_stack(tmp_path_factory.mktemp("interop-python")) as running:
        yield running


@pytest.mark.parametrize("protocol, receiver", [("grpc", False), ("http/protobuf", False), ("http/protobuf", True)],
                         ids=["grpc", "http-dashboard", "http-receiver"])
def test_it_stores_every_span_and_log_of_the_sdk_exporters_once(stack, protocol, receiver):
    conversation = f"conv-{protocol.replace('/', '-')}{'-receiver' if receiver else ''}"
    done = stack.run_client(
        [sys.executable, "tests/interop/python_client.py", conversation, str(ROUNDS)],
        exporter_env(stack, protocol=protocol, receiver=receiver),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = last_json(done.stdout)
    assert (report["failed_spans"], report["failed_logs"]) == (0, 0), done.stderr[-3000:]
    stored = dict(stack.rows(
        "SELECT s.span_id, count(*) FROM observatory_span s JOIN observatory_conversation c ON c.id = s.conversation_id"
        " WHERE c.external_id = ? GROUP BY s.span_id", (conversation,)))
    assert stored == {span_id: 1 for span_id in report["sent"]}
    # Records that arrived before their span are linked by the derivation runner: wait for it.
    logs = wait_for(lambda: stack.rows(
        "SELECT l.span_id, l.event_name FROM observatory_logrecord l JOIN observatory_conversation c"
        " ON c.id = l.conversation_id WHERE c.external_id = ?", (conversation,)), 2 * ROUNDS)
    assert stack.rows("SELECT count(*) FROM observatory_logrecord WHERE span_id IN (%s)"
                      % ",".join("?" * len(report["sent"])), tuple(report["sent"])) == [(2 * ROUNDS,)]
    assert len(logs) == report["logs"] == 2 * ROUNDS
    assert {span_id for span_id, _ in logs} == set(report["sent"])
    assert {name for _, name in logs} == {"gen_ai.user.message", "gen_ai.choice"}

    (conversation_pk, trace_id), = stack.rows(
        "SELECT c.id, s.trace_id FROM observatory_conversation c JOIN observatory_span s ON s.conversation_id = c.id"
        " WHERE c.external_id = ? LIMIT 1", (conversation,))
    timeline = stack.page(f"/p/{stack.project_slug}/conversations/{conversation_pk}/")
    assert html.escape("<script>question 0</script>", quote=False) in timeline
    assert "<script>question 0" not in timeline
    trace = stack.page(f"/p/{stack.project_slug}/traces/{trace_id}/")
    assert "gen_ai.choice" in trace and "chat gpt-4o" in trace
