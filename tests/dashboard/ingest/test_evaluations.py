"""``gen_ai.evaluation.result`` events become scores: sent by the real OpenTelemetry
SDK exporters (logs over OTLP/HTTP and OTLP/gRPC, span events over OTLP/HTTP) to a
live server, linked to the round of the span they are parented to or of the
response they name; and, posted by hand, every odd case: an event before its span,
no name, no value, outside its config, a retried batch."""

from __future__ import annotations

import json
import time

import pytest

from dashboard.judging.models import EvaluationRefusal, Score, ScoreConfig
from dashboard.observatory.derive.drain import outbox_drain_all
from dashboard.observatory.models import LogRecord, Round, Span

RESPONSE = "chatcmpl-42"


def sdk_providers(logs_exporter, spans_exporter=None):
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    resource = Resource.create({"service.name": "evaluator"})
    tracer_provider = TracerProvider(resource=resource)
    if spans_exporter is not None:
        tracer_provider.add_span_processor(SimpleSpanProcessor(spans_exporter))
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs_exporter))
    return tracer_provider, logger_provider


def chat_then_evaluate(tracer_provider, logger_provider, conversation: str) -> str:
    """A chat span (the GenAI conventions), evaluated three ways: a log record
    parented to it, a log record naming its response id only, and a span event."""
    from opentelemetry import context, trace

    tracer = tracer_provider.get_tracer("agent")
    logger = logger_provider.get_logger("evaluator")
    with tracer.start_as_current_span("chat gpt-4o", attributes={
        "gen_ai.operation.name": "chat", "gen_ai.conversation.id": conversation, "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.id": RESPONSE, "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 3,
    }) as span:
        span.add_event("gen_ai.evaluation.result", {
            "gen_ai.evaluation.name": "toxicity", "gen_ai.evaluation.score.value": 0.0,
            "gen_ai.evaluation.score.label": "clean"})
        span_id = format(span.get_span_context().span_id, "016x")
    token = context.attach(trace.set_span_in_context(span))
    try:
        logger.emit(event_name="gen_ai.evaluation.result", attributes={
            "gen_ai.evaluation.name": "relevance", "gen_ai.evaluation.score.value": 0.25,
            "gen_ai.evaluation.score.label": "not_relevant",
            "gen_ai.evaluation.explanation": "<b>the answer ignores the question</b>"})
    finally:
        context.detach(token)
    # no span in context: only the response id links it
    logger.emit(event_name="gen_ai.evaluation.result", attributes={
        "gen_ai.evaluation.name": "faithfulness", "gen_ai.evaluation.score.label": "pass",
        "gen_ai.response.id": RESPONSE})
    return span_id


def check_linked(project, span_id: str) -> None:
    scores = {s.name: s for s in Score.objects.filter(project=project)}
    assert set(scores) == {"relevance", "faithfulness", "toxicity"}
    chat_round = Round.objects.get(project=project, span_id=span_id)
    for score in scores.values():
        assert (score.source, score.round, score.conversation) == ("otel", chat_round, chat_round.conversation)
        assert score.author_key is not None and score.author_key.project == project
    relevance = scores["relevance"]
    assert (relevance.value, relevance.label, relevance.kind, relevance.target) == (0.25, "not_relevant", "numeric",
                                                                                     "span")
    assert relevance.comment == "<b>the answer ignores the question</b>"
    faithfulness = scores["faithfulness"]
    assert (faithfulness.target, faithfulness.response_id, faithfulness.span_id) == ("response", RESPONSE, span_id)
    assert (faithfulness.kind, faithfulness.label, faithfulness.value) == ("categorical", "pass", None)
    assert (scores["toxicity"].target, scores["toxicity"].span_id) == ("span", span_id)


@pytest.mark.django_db(transaction=True)
def test_the_sdk_http_exporters_send_evaluations_that_become_linked_scores(live_server, project, api_key):
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    headers = {"Authorization": f"Bearer {api_key}"}
    tracer_provider, logger_provider = sdk_providers(
        OTLPLogExporter(endpoint=f"{live_server.url}/v1/logs", headers=headers, timeout=20),
        OTLPSpanExporter(endpoint=f"{live_server.url}/v1/traces", headers=headers, timeout=20))
    try:
        span_id = chat_then_evaluate(tracer_provider, logger_provider, "conv-eval-http")
    finally:
        tracer_provider.shutdown()
        logger_provider.shutdown()
    outbox_drain_all()
    assert LogRecord.objects.filter(project=project, event_name="gen_ai.evaluation.result").count() == 2
    check_linked(project, span_id)


@pytest.mark.django_db(transaction=True)
def test_the_sdk_grpc_log_exporter_sends_evaluations_too(live_server, settings, project, api_key):
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from dashboard.ingest.grpc_server import grpc_server_build

    running, port = grpc_server_build(port=0, threads=2)
    running.start()
    tracer_provider, logger_provider = sdk_providers(
        OTLPLogExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=20,
                        headers=(("authorization", f"Bearer {api_key}"),)),
        OTLPSpanExporter(endpoint=f"{live_server.url}/v1/traces", headers={"Authorization": f"Bearer {api_key}"},
                         timeout=20))
    try:
        span_id = chat_then_evaluate(tracer_provider, logger_provider, "conv-eval-grpc")
    finally:
        tracer_provider.shutdown()
        logger_provider.shutdown()
        running.stop(0).wait()
    outbox_drain_all()
    check_linked(project, span_id)


def emit_refused_and_kept(logger_provider) -> None:
    """Two evaluations of a chat span: one outside the "stars" config (1..5), one inside."""
    from opentelemetry import context, trace

    logger = logger_provider.get_logger("evaluator")
    span = trace.NonRecordingSpan(trace.SpanContext(int("ab" * 16, 16), int("cd" * 8, 16), is_remote=False))
    token = context.attach(trace.set_span_in_context(span))
    try:
        for value in (9, 4):
            logger.emit(event_name="gen_ai.evaluation.result", attributes={
                "gen_ai.evaluation.name": "stars", "gen_ai.evaluation.score.value": value})
    finally:
        context.detach(token)


def check_refused_counted(project) -> None:
    assert list(Score.objects.filter(project=project).values_list("name", "value")) == [("stars", 4.0)]
    refusal = EvaluationRefusal.objects.get(project=project)
    assert (refusal.name, refusal.count, refusal.last_reason) == ("stars", 1, "stars must be within 1..5; got 9")


@pytest.mark.django_db(transaction=True)
def test_the_sdk_http_exporter_is_answered_a_partial_success_for_a_refused_evaluation(live_server, project,
                                                                                     api_key):
    import requests
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

    ScoreConfig.objects.create(project=project, name="stars", kind="numeric", min_value=1, max_value=5)
    answers = []
    session = requests.Session()
    session.hooks["response"].append(lambda response, *args, **kwargs: answers.append(response))
    exporter = OTLPLogExporter(endpoint=f"{live_server.url}/v1/logs", session=session, timeout=20,
                               headers={"Authorization": f"Bearer {api_key}"})
    provider = LoggerProvider()
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter))  # both in one export request
    emit_refused_and_kept(provider)
    provider.shutdown()
    assert [answer.status_code for answer in answers] == [200]
    partial = ExportLogsServiceResponse.FromString(answers[0].content).partial_success
    assert partial.rejected_log_records == 1 and "stars must be within 1..5; got 9" in partial.error_message
    check_refused_counted(project)
    assert LogRecord.objects.filter(project=project).count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_sdk_grpc_exporter_is_answered_a_partial_success_for_a_refused_evaluation(settings, project, api_key):
    import grpc
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2_grpc import LogsServiceStub
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, InMemoryLogRecordExporter

    from dashboard.ingest.grpc_server import grpc_server_build

    ScoreConfig.objects.create(project=project, name="stars", kind="numeric", min_value=1, max_value=5)
    running, port = grpc_server_build(port=0, threads=2)
    running.start()
    try:
        sent = InMemoryLogRecordExporter()
        provider = LoggerProvider()
        provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter(
            endpoint=f"127.0.0.1:{port}", insecure=True, timeout=20,
            headers=(("authorization", f"Bearer {api_key}"),))))
        provider.add_log_record_processor(BatchLogRecordProcessor(sent))
        emit_refused_and_kept(provider)
        provider.shutdown()
        check_refused_counted(project)
        # The SDK does not surface partial_success: ask with its own encoding of the same batch.
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            answer = LogsServiceStub(channel).Export(encode_logs(sent.get_finished_logs()), timeout=20,
                                                     metadata=(("authorization", f"Bearer {api_key}"),))
    finally:
        running.stop(0).wait()
    assert answer.partial_success.rejected_log_records == 1
    assert "stars must be within 1..5; got 9" in answer.partial_success.error_message
    assert EvaluationRefusal.objects.get(project=project).count == 2  # sent twice, refused twice


# --- posted by hand (OTLP JSON) ------------------------------------------------------

TRACE, SPAN = "ab" * 16, "cd" * 8
NOW = time.time_ns()


def attribute(key, value):
    kind = {bool: "boolValue", int: "intValue", float: "doubleValue", str: "stringValue"}[type(value)]
    return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}


def evaluation_log(trace_id=TRACE, span_id=SPAN, at=NOW, **attributes):
    return {"timeUnixNano": str(at), "traceId": trace_id, "spanId": span_id, "eventName": "gen_ai.evaluation.result",
            "attributes": [attribute(k.replace("__", "."), v) for k, v in attributes.items()]}


def post_logs(client, auth, *records):
    body = {"resourceLogs": [{"resource": {}, "scopeLogs": [{"logRecords": list(records)}]}]}
    response = client.post("/v1/logs", json.dumps(body), content_type="application/json", **auth)
    assert response.status_code == 200, response.content
    return response


def chat_span(conversation="conv-1", span_id=SPAN):
    return {"traceId": TRACE, "spanId": span_id, "name": "chat", "startTimeUnixNano": str(NOW),
            "endTimeUnixNano": str(NOW + 1_000_000),
            "attributes": [attribute("gen_ai.operation.name", "chat"), attribute("gen_ai.conversation.id", conversation),
                           attribute("gen_ai.request.model", "gpt-4o")]}


def post_spans(client, auth, *spans):
    body = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": list(spans)}]}]}
    response = client.post("/v1/traces", json.dumps(body), content_type="application/json", **auth)
    assert response.status_code == 200, response.content


@pytest.mark.django_db
def test_an_evaluation_before_its_span_is_linked_when_the_span_comes(client, auth, project):
    post_logs(client, auth, evaluation_log(gen_ai__evaluation__name="relevance", gen_ai__evaluation__score__value=1))
    score = Score.objects.get()
    assert (score.trace_id, score.span_id, score.conversation) == (TRACE, SPAN, None)
    post_spans(client, auth, chat_span())
    outbox_drain_all()
    score.refresh_from_db()
    assert score.round == Round.objects.get(project=project, span_id=SPAN)
    assert score.conversation.external_id == "conv-1"


@pytest.mark.django_db
def test_a_retried_batch_makes_one_score_and_distinct_events_make_several(client, auth):
    first = evaluation_log(gen_ai__evaluation__name="relevance", gen_ai__evaluation__score__value=1)
    second = evaluation_log(at=NOW + 1, gen_ai__evaluation__name="relevance", gen_ai__evaluation__score__value=1)
    post_logs(client, auth, first, second)
    post_logs(client, auth, first, second)
    assert Score.objects.count() == 2


@pytest.mark.django_db
def test_events_that_make_no_score_are_rejected_in_partial_success_and_counted(client, auth, project):
    ScoreConfig.objects.create(project=project, name="stars", kind="numeric", min_value=1, max_value=5)
    response = post_logs(
        client, auth,
        evaluation_log(gen_ai__evaluation__score__value=1),  # no name
        evaluation_log(at=NOW + 1, gen_ai__evaluation__name="relevance"),  # no value nor label
        evaluation_log(at=NOW + 2, gen_ai__evaluation__name="stars", gen_ai__evaluation__score__value=9),  # config
        evaluation_log(at=NOW + 3, trace_id="", span_id="", gen_ai__evaluation__name="orphan",
                       gen_ai__evaluation__score__value=1),  # nothing to judge
        evaluation_log(at=NOW + 4, gen_ai__evaluation__name="stars", gen_ai__evaluation__score__value=4),
        {"timeUnixNano": str(NOW), "eventName": "other", "body": {"stringValue": "kept"}},
    )
    partial = response.json()["partialSuccess"]
    assert partial["rejectedLogRecords"] == "4"
    assert "stars must be within 1..5; got 9" in partial["errorMessage"]
    assert "has no gen_ai.evaluation.name" in partial["errorMessage"]
    # rejected is rejected: only the scored evaluation and the other record are stored
    assert LogRecord.objects.filter(project=project).count() == 2
    assert list(Score.objects.values_list("name", "value")) == [("stars", 4.0)]
    counted = {r.name: (r.count, r.last_reason) for r in EvaluationRefusal.objects.filter(project=project)}
    assert counted["stars"] == (1, "stars must be within 1..5; got 9")
    assert set(counted) == {"", "relevance", "stars", "orphan"} and sum(n for n, _ in counted.values()) == 4
    post_logs(client, auth, evaluation_log(at=NOW + 9, gen_ai__evaluation__name="stars",
                                           gen_ai__evaluation__score__value=0))
    assert EvaluationRefusal.objects.get(project=project, name="stars").count == 2


@pytest.mark.django_db
def test_a_fully_scored_batch_answers_no_partial_success(client, auth):
    response = post_logs(client, auth, evaluation_log(gen_ai__evaluation__name="relevance",
                                                      gen_ai__evaluation__score__value=1))
    assert response.json() == {} and not EvaluationRefusal.objects.exists()


@pytest.mark.django_db
def test_a_span_whose_evaluation_makes_no_score_is_stored_with_a_warning(client, auth, project):
    ScoreConfig.objects.create(project=project, name="helpful", kind="categorical", labels=["yes", "no"])
    span = chat_span() | {"events": [{"name": "gen_ai.evaluation.result", "timeUnixNano": str(NOW),
                                      "attributes": [attribute("gen_ai.evaluation.name", "helpful"),
                                                     attribute("gen_ai.evaluation.score.label", "<maybe>")]}]}
    body = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [span]}]}]}
    response = client.post("/v1/traces", json.dumps(body), content_type="application/json", **auth)
    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert partial.get("rejectedSpans", "0") == "0"  # the span is stored
    assert partial["errorMessage"].startswith("1 gen_ai.evaluation.result span event(s) made no score")
    assert "helpful has no label '<maybe>'" in partial["errorMessage"]
    assert Span.objects.filter(project=project).count() == 1 and not Score.objects.exists()
    assert EvaluationRefusal.objects.get(project=project, name="helpful").count == 1


@pytest.mark.django_db
def test_a_span_event_evaluation_judges_its_span_and_is_stored_once(client, auth, project):
    span = chat_span() | {"events": [{"name": "gen_ai.evaluation.result", "timeUnixNano": str(NOW),
                                      "attributes": [attribute("gen_ai.evaluation.name", "helpful"),
                                                     attribute("gen_ai.evaluation.score.value", True)]}]}
    post_spans(client, auth, span)
    post_spans(client, auth, span)
    outbox_drain_all()
    score = Score.objects.get()
    assert (score.kind, score.value, score.negative, score.source) == ("boolean", 1.0, False, "otel")
    assert score.round == Round.objects.get(project=project, span_id=SPAN)
    assert Span.objects.filter(project=project).count() == 1


@pytest.mark.django_db
def test_evaluations_land_in_the_senders_project_only(client, auth, other_api_key, project, other_project):
    post_spans(client, {"HTTP_AUTHORIZATION": f"Bearer {other_api_key}"}, chat_span("theirs"))
    post_logs(client, auth, evaluation_log(gen_ai__evaluation__name="relevance", gen_ai__evaluation__score__value=1))
    outbox_drain_all()
    score = Score.objects.get()
    assert score.project == project and score.conversation is None and score.round is None
