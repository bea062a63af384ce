"""Conversations from spans alone, through the real ingest path (OTLP JSON posted to
/v1/traces) and the real outbox: late linking in either order, rounds, messages and
tool executions derived once, a pipeline record winning, tool statistics counting
every call exactly once, and figures equal to a recomputation from the spans."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.accounts.services import apikey_create, project_create
from dashboard.observatory.derive.passes import span_rows
from dashboard.observatory.models import (
    Conversation,
    DerivationNote,
    Message,
    Round,
    Source,
    Span,
    ToolExecution,
    ToolHourlyRollup,
)
from dashboard.observatory.derive.drain import outbox_drain_all
from dashboard.observatory.selectors import tool_stats

pytestmark = pytest.mark.django_db

TRACE = "ab" * 16
NOW = (time.time_ns() // 3_600_000_000_000 - 1) * 3_600_000_000_000  # the start of the hour before this one


@pytest.fixture
def project_key():
    project = project_create(name="Spans only")
    _, key = apikey_create(project=project)
    return project, {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def value(v):
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    return {"stringValue": v if isinstance(v, str) else json.dumps(v)}


def span(span_id: str, name: str, *, parent: str = "", at_ms: int = 0, ms: int = 100, trace: str = TRACE,
         error: bool = False, **attributes) -> dict:
    return {
        "traceId": trace, "spanId": span_id, "parentSpanId": parent, "name": name,
        "startTimeUnixNano": str(NOW + at_ms * 1_000_000), "endTimeUnixNano": str(NOW + (at_ms + ms) * 1_000_000),
        "status": {"code": 2, "message": "it broke"} if error else {},
        "attributes": [{"key": k.replace("__", "."), "value": value(v)} for k, v in attributes.items()],
    }


def send(client, auth, *spans: dict, drain: bool = True) -> None:
    body = json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "agent"}}]}, "scopeSpans": [{"spans": list(spans)}]}]})
    response = client.post("/v1/traces", body, content_type="application/json", **auth)
    assert response.status_code == 200, response.content
    if drain:
        outbox_drain_all()


def agent_spans(conversation: str = "conv-s") -> dict[str, dict]:
    """An OpenInference-shaped agent run: two model calls and a tool call between."""
    messages_in = [{"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]}]
    call = [{"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1", "name": "weather",
                                             "arguments": {"city": "Paris"}}]}]
    return {
        "root": span("1" * 16, "agent", at_ms=0, ms=1000, session__id=conversation, user__id="ana",
                     openinference__span__kind="AGENT"),
        "llm0": span("2" * 16, "llm", parent="1" * 16, at_ms=10, ms=200, openinference__span__kind="LLM",
                     llm__model_name="gpt-4o", llm__token_count__prompt=20, llm__token_count__completion=5,
                     gen_ai__input__messages=messages_in, gen_ai__output__messages=call),
        "tool": span("3" * 16, "weather", parent="1" * 16, at_ms=300, ms=50, openinference__span__kind="TOOL",
                     tool__name="weather", input__value="Paris",
                     output__value=json.dumps({"type": "tool", "data": {"content": "sunny", "tool_call_id": "call_1"}})),
        "llm1": span("4" * 16, "llm", parent="1" * 16, at_ms=400, ms=300, openinference__span__kind="LLM",
                     llm__model_name="gpt-4o", llm__token_count__prompt=40, llm__token_count__completion=7,
                     llm__input_messages__0__message__role="user",
                     llm__input_messages__0__message__content="Weather in Paris?",
                     llm__input_messages__1__message__role="assistant",
                     llm__input_messages__2__message__role="tool",
                     llm__input_messages__2__message__content="sunny",
                     llm__output_messages__0__message__role="assistant",
                     llm__output_messages__0__message__content="Sunny."),
    }


def check_whole(project, conversation: Conversation) -> None:
    conversation.refresh_from_db()
    assert (conversation.rounds, conversation.input_tokens, conversation.output_tokens) == (2, 60, 12)
    assert (conversation.tool_calls, conversation.user_id, conversation.model) == (1, "ana", "gpt-4o")
    rounds = list(Round.objects.filter(conversation=conversation).order_by("index"))
    assert [(r.index, r.span_id, r.source) for r in rounds] == [(0, "2" * 16, Source.SPAN), (1, "4" * 16, Source.SPAN)]
    assert rounds[0].user_message == "Weather in Paris?" and rounds[1].final_answer == "Sunny."
    execution = ToolExecution.objects.get(conversation=conversation)
    assert (execution.tool_call_id, execution.parameters, execution.observation) == (
        "call_1", {"city": "Paris"}, "sunny")
    assert execution.round_id == rounds[0].round_id and execution.linked_span.span_id == "3" * 16
    assert not Span.objects.filter(project=project, conversation__isnull=True).exists()


@pytest.mark.parametrize("order", [
    ("llm0", "tool", "llm1", "root"),  # children first, the naming span last (BatchSpanProcessor)
    ("root", "llm0", "tool", "llm1"),  # the naming span first, children later
    ("llm1", "root", "tool", "llm0"),  # any order: a later round before an earlier one
])
def test_it_builds_the_whole_conversation_in_any_batch_order(client, project_key, order):
    project, auth = project_key
    spans = agent_spans()
    for name in order:
        send(client, auth, spans[name])
    check_whole(project, Conversation.objects.get(project=project, external_id="conv-s"))


def test_it_derives_children_received_long_before_their_naming_span(client, project_key):
    """A pass after a batch reads the spans received since its notes, and the spans
    of the traces it linked whenever they came: children an hour older than the
    naming span still become rounds and a tool call."""
    from datetime import timedelta

    project, auth = project_key
    spans = agent_spans("conv-old")
    send(client, auth, spans["llm0"], spans["tool"], spans["llm1"])
    Span.objects.filter(project=project).update(received_at=Span.objects.first().received_at - timedelta(hours=1))
    send(client, auth, spans["root"])
    check_whole(project, Conversation.objects.get(project=project, external_id="conv-old"))


def test_it_reads_a_backlog_of_spans_a_few_at_a_time_and_derives_them_all(client, project_key, monkeypatch):
    """Candidates come CANDIDATES at a time in start order (memory bounded by that
    whatever a backlog holds), each page past the last: none skipped, none twice."""
    project, auth = project_key
    monkeypatch.setattr(span_rows, "CANDIDATES", 2)
    send(client, auth, *[span(f"{i + 1:016x}", "search", at_ms=i // 2, trace=f"{i + 1:032x}",
                              gen_ai__operation__name="execute_tool", gen_ai__tool__name="search",
                              gen_ai__tool__call__id=f"call_{i}", gen_ai__conversation__id="conv-many")
                         for i in range(7)])
    conversation = Conversation.objects.get(project=project, external_id="conv-many")
    assert sorted(ToolExecution.objects.filter(conversation=conversation).values_list("tool_call_id", flat=True)) == [
        f"call_{i}" for i in range(7)]
    assert conversation.tool_calls == 7


def test_it_links_late_spans_from_the_outbox_by_trace_not_by_a_rescan(client, project_key):
    project, auth = project_key
    spans = agent_spans()
    send(client, auth, spans["llm0"], spans["tool"], drain=False)
    (note,) = DerivationNote.objects.filter(project=project)
    assert note.trace_ids == [TRACE]  # what the outbox will link, nothing else
    outbox_drain_all()
    assert Span.objects.filter(project=project, conversation__isnull=True).count() == 2  # nobody named it yet
    send(client, auth, spans["root"])
    assert Span.objects.filter(project=project, conversation__isnull=True).count() == 0


def test_it_derives_each_row_once_whatever_is_replayed(client, project_key):
    project, auth = project_key
    spans = agent_spans()
    for _ in range(2):  # a retried batch
        send(client, auth, *spans.values())
    conversation = Conversation.objects.get(project=project, external_id="conv-s")
    counts = (Round.objects.count(), Message.objects.count(), ToolExecution.objects.count())
    span_rows.span_rows_derive(project_id=project.pk, conversation_ids=[conversation.pk])  # a pass again
    Round.objects.update(index=7)  # even a disturbed numbering is put back
    span_rows._renumber([conversation.pk])
    assert (Round.objects.count(), Message.objects.count(), ToolExecution.objects.count()) == counts
    # user, assistant(tool call) in round 0; tool, assistant(answer) in round 1
    assert list(Message.objects.order_by("index").values_list("role", flat=True)) == [
        "user", "assistant", "tool", "assistant"]
    check_whole(project, conversation)


def test_it_counts_a_tool_call_once_when_a_record_arrives_later(client, project_key, records):
    project, auth = project_key
    send(client, auth, *agent_spans().values())
    assert tool_stats(project)[0].calls == 1
    record = records.tool_result(conversation="conv-s", tool="weather", result={"tool_call_id": "call_1"})
    response = client.post("/api/v1/records", {"records": [record]}, content_type="application/json", **auth)
    assert response.status_code in (200, 202), response.content
    outbox_drain_all()
    (execution,) = ToolExecution.objects.filter(project=project)
    assert execution.source == Source.RECORD and execution.linked_span.span_id == "3" * 16  # the span links to it
    assert sum(s.calls for s in tool_stats(project)) == 1
    assert ToolHourlyRollup.objects.filter(project=project).count() <= 2


def test_it_derives_no_tool_call_a_record_already_holds(client, project_key, records):
    project, auth = project_key
    record = records.tool_result(conversation="conv-s", tool="weather", result={"tool_call_id": "call_1"})
    client.post("/api/v1/records", {"records": [record]}, content_type="application/json", **auth)
    outbox_drain_all()
    spans = agent_spans()
    spans["tool"]["attributes"].append({"key": "gen_ai.tool.call.id", "value": {"stringValue": "call_1"}})
    send(client, auth, *spans.values())
    assert list(ToolExecution.objects.values_list("source", flat=True)) == [Source.RECORD]
    assert sum(s.calls for s in tool_stats(project, tool_name="weather")) == 1


def test_it_leaves_the_rounds_of_a_trace_to_its_round_records(client, project_key, records):
    project, auth = project_key
    send(client, auth, *agent_spans().values())
    assert Round.objects.filter(source=Source.SPAN).count() == 2
    batch = [records.round(conversation="conv-s", index=0, trace_id=TRACE, input_tokens=100, output_tokens=1)]
    client.post("/api/v1/records", {"records": batch}, content_type="application/json", **auth)
    outbox_drain_all()
    conversation = Conversation.objects.get(project=project, external_id="conv-s")
    assert list(Round.objects.values_list("source", flat=True)) == [Source.RECORD]
    assert not Message.objects.filter(source=Source.SPAN).exists()
    assert (conversation.rounds, conversation.input_tokens) == (1, 100)  # never both


def test_it_counts_tool_spans_of_every_convention_exactly_once(client, project_key):
    project, auth = project_key
    send(client, auth, *agent_spans().values())  # OpenInference, in a conversation: derived
    send(client, auth,
         span("5" * 16, "execute_tool weather", trace="cd" * 16, gen_ai__tool__name="weather",
              gen_ai__tool__call__id="call_9", error=True, error__type="timeout"),  # GenAI, no conversation
         span("6" * 16, "weather", trace="ef" * 16, traceloop__span__kind="tool",
              traceloop__entity__name="weather", traceloop__association__properties__session_id="tl-1"))
    (stats,) = tool_stats(project, tool_name="weather")
    assert (stats.calls, stats.errors, dict(stats.error_types)) == (3, 1, {"timeout": 1})
    tool_spans = Span.objects.filter(project=project).exclude(tool_name="")
    assert stats.calls == tool_spans.count()
    assert stats.duration_sum_ms == pytest.approx(sum(s.duration_ms for s in tool_spans))


def test_it_sets_status_and_errors_from_span_status_and_error_type(client, project_key):
    project, auth = project_key
    spans = agent_spans("conv-e")
    spans["tool"] = span("3" * 16, "weather", parent="1" * 16, at_ms=300, ms=50, error=True,
                         openinference__span__kind="TOOL", tool__name="weather", exception__type="ValueError")
    spans["llm1"]["status"] = {"code": 2}
    send(client, auth, *spans.values())
    conversation = Conversation.objects.get(project=project, external_id="conv-e")
    assert (conversation.status, conversation.errors, conversation.has_errors) == ("error", 2, True)
    failed = ToolExecution.objects.get(conversation=conversation)
    assert (failed.success, failed.error_type, failed.error_message) == (False, "ValueError", "it broke")


def test_it_keeps_the_error_message_and_leaves_the_stack_trace_on_the_span(client, project_key):
    project, auth = project_key
    spans = agent_spans("conv-m")
    tool = span("3" * 16, "weather", parent="1" * 16, at_ms=300, ms=50, error=True,
                openinference__span__kind="TOOL", tool__name="weather")
    tool["status"]["message"] = "ValueError: no weather\nTraceback (most recent call last):\n  File \"/srv/app.py\""
    spans["tool"] = tool
    send(client, auth, *spans.values())
    assert ToolExecution.objects.get(conversation__external_id="conv-m").error_message == "ValueError: no weather"
    spans = agent_spans("conv-n")
    spans["tool"] = dict(tool, spanId="5" * 16, traceId="cd" * 16, events=[{
        "name": "exception", "timeUnixNano": "1",
        "attributes": [{"key": "exception.message", "value": {"stringValue": "no weather under the sea"}}]}])
    spans["root"]["traceId"] = spans["llm0"]["traceId"] = spans["llm1"]["traceId"] = "cd" * 16
    spans["root"]["spanId"], spans["llm0"]["spanId"], spans["llm1"]["spanId"] = "6" * 16, "7" * 16, "8" * 16
    for name in ("llm0", "llm1"):
        spans[name]["parentSpanId"] = "6" * 16
    spans["tool"]["parentSpanId"] = "6" * 16
    send(client, auth, *spans.values())
    assert ToolExecution.objects.get(conversation__external_id="conv-n").error_message == "no weather under the sea"


def test_it_ignores_what_is_not_a_model_or_tool_call(client, project_key):
    project, auth = project_key
    send(client, auth,
         span("1" * 16, "chain", session__id="conv-c", openinference__span__kind="CHAIN",
              llm__input_messages__0__message__role="user", llm__input_messages__0__message__content="x"),
         span("2" * 16, "GET /", parent="1" * 16, http__method="GET"))
    conversation = Conversation.objects.get(project=project, external_id="conv-c")
    assert (conversation.rounds, conversation.tool_calls) == (0, 0)
    assert Span.objects.filter(conversation=conversation).count() == 2


def test_it_links_a_trace_with_a_few_queries_whatever_its_size(client, project_key, django_assert_max_num_queries):
    from dashboard.observatory.derive.passes.links import traces_link

    project, auth = project_key
    send(client, auth, *[span(f"{i + 2:016x}", "step", parent="1" * 16, at_ms=i) for i in range(200)])
    send(client, auth, span("1" * 16, "agent", gen_ai__conversation__id="conv-q"), drain=False)
    with django_assert_max_num_queries(5):  # spans by trace, rounds by trace, which wait, one UPDATE
        (conversation_id,) = traces_link(project_id=project.pk, trace_ids=[TRACE])
    assert Span.objects.filter(conversation_id=conversation_id).count() == 201
    with django_assert_max_num_queries(3):  # nothing waits any more: no UPDATE
        traces_link(project_id=project.pk, trace_ids=[TRACE])


def test_it_reads_only_whether_a_span_waits_in_traces_linked_at_ingest(client, project_key,
                                                                        django_assert_max_num_queries):
    """A batch links its own traces at ingest, and its note names them and their
    conversation: the late-span pass then costs one query per 500 traces and gives no
    conversation to derive again (it gave every conversation of its traces, so a
    pass of 10,000 noted traces re-derived every conversation: two minutes in the soak)."""
    from dashboard.observatory.derive.passes.links import traces_link

    project, auth = project_key
    send(client, auth, span("1" * 16, "agent", gen_ai__conversation__id="conv-l"),
         *[span(f"{i + 2:016x}", "step", parent="1" * 16, at_ms=i) for i in range(20)])
    assert not Span.objects.filter(project=project, conversation__isnull=True).exists()
    with django_assert_max_num_queries(1):
        assert traces_link(project_id=project.pk, trace_ids=[TRACE]) == []


def test_it_takes_an_error_type_without_an_error_status_as_a_failure(client, project_key):
    project, auth = project_key
    spans = agent_spans("conv-t")
    spans["tool"]["attributes"].append({"key": "error.type", "value": {"stringValue": "timeout"}})
    send(client, auth, *spans.values())
    failed = ToolExecution.objects.get(conversation__external_id="conv-t")
    assert (failed.success, failed.error_type) == (False, "timeout")


@pytest.mark.parametrize("first", ["unnamed", "named"])
def test_it_matches_parallel_calls_of_one_tool_whichever_span_comes_first(client, project_key, first):
    """Two calls of one tool in a round; the failed one's span names no call id (a
    LangChain tool that raised has no ToolMessage): it takes the call the other
    span does not answer, never the other's."""
    project, auth = project_key
    calls = [{"role": "assistant", "parts": [
        {"type": "tool_call", "id": "call_a", "name": "weather", "arguments": {"city": "A"}},
        {"type": "tool_call", "id": "call_b", "name": "weather", "arguments": {"city": "B"}}]}]
    llm = span("2" * 16, "llm", at_ms=0, session__id="conv-p", openinference__span__kind="LLM",
               gen_ai__output__messages=calls)
    named = span("3" * 16, "weather", at_ms=300, openinference__span__kind="TOOL", tool__name="weather",
                 output__value=json.dumps({"type": "tool", "data": {"content": "ok", "tool_call_id": "call_b"}}))
    unnamed = span("4" * 16, "weather", at_ms=200, error=True, openinference__span__kind="TOOL", tool__name="weather")
    send(client, auth, llm)
    for each in ([unnamed, named] if first == "unnamed" else [named, unnamed]):
        send(client, auth, each)
    executions = {e.span_id: e for e in ToolExecution.objects.filter(conversation__external_id="conv-p")}
    assert (executions["4" * 16].tool_call_id, executions["4" * 16].parameters) == ("call_a", {"city": "A"})
    assert (executions["3" * 16].tool_call_id, executions["3" * 16].parameters) == ("call_b", {"city": "B"})
    assert not executions["4" * 16].success and executions["3" * 16].success


def test_it_derives_the_rows_of_spans_the_hourly_pass_links(client, project_key):
    from dashboard.observatory.tasks import links_refresh

    project, auth = project_key
    spans = agent_spans("conv-beat")
    send(client, auth, *spans.values(), drain=False)
    DerivationNote.objects.all().delete()  # a lost note: only the hourly pass is left
    Span.objects.update(conversation=None)
    links_refresh(project.pk)
    check_whole(project, Conversation.objects.get(project=project, external_id="conv-beat"))
    assert tool_stats(project)[0].calls == 1


def test_a_trace_the_derivations_linked_gives_its_later_plain_spans_their_conversation_at_ingest(
        client, project_key, records):
    """TraceConversation is recorded wherever a span gets linked, not only at ingest:
    here a round record names the trace, the late-span pass links the stored span,
    and a later batch of plain spans of the trace is linked as it is stored."""
    from dashboard.observatory.derive.passes.links import traces_link
    from dashboard.observatory.models import TraceConversation
    from dashboard.observatory.services import records_store
    from pipeline import parse_record

    project, auth = project_key
    send(client, auth, span("1" * 16, "step"), drain=False)
    records_store(project=project, records=[parse_record(records.round("conv-r", trace_id=TRACE))])
    (conversation_id,) = traces_link(project_id=project.pk, trace_ids=[TRACE])
    assert TraceConversation.objects.get(project=project, trace_id=TRACE).conversation_id == conversation_id
    send(client, auth, span("2" * 16, "later step", at_ms=5), drain=False)  # no derivation pass after it
    assert Span.objects.get(span_id="2" * 16).conversation_id == conversation_id


def model_call(span_id: str, at_ms: int, conversation: str = "conv-n") -> dict:
    return span(span_id, "chat gpt-4o", at_ms=at_ms, ms=50, gen_ai__conversation__id=conversation,
                gen_ai__operation__name="chat", gen_ai__request__model="gpt-4o", gen_ai__usage__input_tokens=10)


def numbering(conversation: str = "conv-n") -> list[tuple[int, str]]:
    return list(Round.objects.filter(conversation__external_id=conversation).order_by("started_at")
                .values_list("index", "span_id"))


def test_it_numbers_rounds_in_start_order_whichever_batch_brings_them(client, project_key):
    _, auth = project_key
    send(client, auth, model_call("a" * 16, 100), model_call("c" * 16, 300))
    send(client, auth, model_call("e" * 16, 500))  # after them
    send(client, auth, model_call("b" * 16, 200), model_call("d" * 16, 400))  # between them
    assert numbering() == [(0, "a" * 16), (1, "b" * 16), (2, "c" * 16), (3, "d" * 16), (4, "e" * 16)]
    send(client, auth, model_call("f" * 16, 10))  # before them all
    assert numbering() == [(0, "f" * 16), (1, "a" * 16), (2, "b" * 16), (3, "c" * 16), (4, "d" * 16), (5, "e" * 16)]


def test_a_pass_reads_the_rounds_from_its_earliest_new_one_on_not_the_history(client, project_key):
    _, auth = project_key
    send(client, auth, model_call("a" * 16, 100), model_call("b" * 16, 200))
    Round.objects.filter(span_id="a" * 16).update(index=99)  # not read again: not put back
    send(client, auth, model_call("c" * 16, 300))
    assert numbering() == [(99, "a" * 16), (1, "b" * 16), (2, "c" * 16)]
    span_rows._renumber([Conversation.objects.get(external_id="conv-n").pk])  # a whole renumbering reads them all
    assert numbering() == [(0, "a" * 16), (1, "b" * 16), (2, "c" * 16)]


def test_a_record_round_has_the_derived_rounds_renumbered_whole(client, project_key, records):
    project, auth = project_key
    send(client, auth, model_call("a" * 16, 100), model_call("b" * 16, 200))
    Round.objects.filter(span_id="a" * 16).update(index=99)
    record = records.round(conversation="conv-n", index=0, trace_id="ff" * 16)
    response = client.post("/api/v1/records", {"records": [record]}, content_type="application/json", **auth)
    assert response.status_code in (200, 202), response.content
    outbox_drain_all()
    send(client, auth, model_call("c" * 16, 300))
    derived = Round.objects.filter(conversation__external_id="conv-n", source=Source.SPAN).order_by("started_at")
    assert list(derived.values_list("index", flat=True)) == [1, 2, 3]  # after the record's round 0


# --- the totals pass after batches derives the rounds a batch brought, not the history ---

def tool_call(span_id: str, at_ms: int, call: str, conversation: str = "conv-n", *, error: bool = False) -> dict:
    return span(span_id, "execute_tool weather", at_ms=at_ms, ms=20, error=error, gen_ai__conversation__id=conversation,
                gen_ai__operation__name="execute_tool", gen_ai__tool__name="weather", gen_ai__tool__call__id=call)


def per_round(conversation: str = "conv-n") -> list[tuple]:
    return list(Round.objects.filter(conversation__external_id=conversation).order_by("index").values_list(
        "span_id", "cost_pico_usd", "tool_call_count", "error_count", "derived_context_tokens"))


def figures(conversation: str = "conv-n") -> tuple:
    return Conversation.objects.filter(external_id=conversation).values_list(
        "rounds", "tool_calls", "errors", "cost_pico_usd", "unpriced_rounds", "input_tokens").get()


@pytest.fixture
def gpt_price():
    from dashboard.tuning.models import PriceRule
    from tests.dashboard.web.pages_factories import price_rule
    PriceRule.objects.all().delete()
    price_rule("gpt-4o*", "2.5", "10")


def test_a_pass_after_batches_prices_and_counts_only_the_rounds_they_brought(client, project_key, gpt_price):
    from dashboard.observatory.derive.passes import totals
    _, auth = project_key
    send(client, auth, model_call("a" * 16, 100), tool_call("1" * 16, 120, "c1"))
    # Put wrong figures on the first round, received an hour ago (out of the next batch's window,
    # with its slack): a pass that read the history would put them back.
    an_hour_ago = timezone.now() - timedelta(hours=1)
    for model in (Span, Round, ToolExecution):
        model.objects.update(received_at=an_hour_ago)
    Round.objects.filter(span_id="a" * 16).update(cost_pico_usd=7, tool_call_count=5)
    send(client, auth, model_call("b" * 16, 200), tool_call("2" * 16, 220, "c2", error=True))
    assert per_round()[0][1:3] == (7, 5)
    assert figures()[3] == 7 + 25_000_000  # the stored cost of the first round, plus the new one's
    totals.conversation_totals_refresh(conversation_ids=[Conversation.objects.get(external_id="conv-n").pk])
    assert per_round() == [("a" * 16, 25_000_000, 1, 0, 10), ("b" * 16, 25_000_000, 1, 1, 10)]
    assert figures() == (2, 2, 1, 50_000_000, 0, 20)


def test_figures_after_many_batches_equal_a_whole_recomputation(client, project_key, gpt_price):
    from dashboard.observatory.derive.passes import totals
    _, auth = project_key
    for i in range(6):  # a tool span before its round's batch, one after, rounds out of order
        send(client, auth, tool_call(f"{i:x}1".rjust(16, "0"), 1000 * (5 - i) + 20, f"c{i}", error=i == 2),
             model_call(f"{i:x}0".rjust(16, "f"), 1000 * (5 - i)))
    incremental = (per_round(), figures())
    totals.conversation_totals_refresh(conversation_ids=[Conversation.objects.get(external_id="conv-n").pk])
    assert (per_round(), figures()) == incremental
    assert figures() == (6, 6, 1, 6 * 25_000_000, 0, 60)


def test_a_record_taking_over_an_older_derived_call_has_its_round_counted_again(client, project_key, records):
    _, auth = project_key
    send(client, auth, *agent_spans().values())
    (derived,) = Round.objects.filter(conversation__external_id="conv-s", span_id="2" * 16).values_list(
        "tool_call_count", flat=True)
    assert derived == 1
    record = records.tool_result(conversation="conv-s", tool="weather", result={"tool_call_id": "call_1"})
    response = client.post("/api/v1/records", {"records": [record]}, content_type="application/json", **auth)
    assert response.status_code in (200, 202), response.content
    outbox_drain_all()  # the record's batch, then the note for the round that lost the call
    assert Round.objects.get(conversation__external_id="conv-s", span_id="2" * 16).tool_call_count == 0
    assert not DerivationNote.objects.exists()


def test_rounds_naming_no_model_are_priced_again_when_the_conversation_model_changes(client, project_key, gpt_price,
                                                                                   records):
    from dashboard.observatory.derive.passes import totals
    from tests.dashboard.web.pages_factories import price_rule
    price_rule("claude*", "3", "15")
    _, auth = project_key
    nameless = records.round(conversation="conv-n", index=0, trace_id="ee" * 16, input_tokens=1000)
    response = client.post("/api/v1/records", {"records": [nameless]}, content_type="application/json", **auth)
    assert response.status_code in (200, 202), response.content
    outbox_drain_all()
    send(client, auth, model_call("a" * 16, 100))  # the conversation's model: gpt-4o
    first = figures()
    for model in (Span, Round, ToolExecution):  # out of the next batch's window
        model.objects.update(received_at=timezone.now() - timedelta(hours=1))
    send(client, auth, span("b" * 16, "chat claude", at_ms=900, ms=50, gen_ai__conversation__id="conv-n",
                            gen_ai__operation__name="chat", gen_ai__request__model="claude-3",
                            gen_ai__usage__input_tokens=10))  # now claude: the nameless round's price moves
    incremental = (per_round(), figures())
    totals.conversation_totals_refresh(conversation_ids=[Conversation.objects.get(external_id="conv-n").pk])
    assert (per_round(), figures()) == incremental
    assert figures()[3] != first[3]


def test_derived_rows_keep_the_record_ids_rows_stored_before_have():
    """A derived row's id is uuid5 of its span and what it is: rows stored by any
    earlier version must meet the same id, or a second pass would insert them again."""
    import uuid

    from dashboard.observatory.derive.passes.span_rows import NAMESPACE, record_id

    for project, trace, span, what in [(1, "a" * 32, "b" * 16, "round"), (42, "0af7651916cd43dd8448eb211c80319c",
                                                                        "b7ad6b7169203331", "in3"), (7, "", "", "tool"),
                                       (3, "ü-trace", "span/1", "out12")]:
        assert record_id(project, trace, span, what) == uuid.uuid5(NAMESPACE, f"{project}/{trace}/{span}/{what}")
