"""Tool calls known only from their spans: observation tokens counted from the
result by the model's encoder (the pipeline's counter, as for a record), or unknown
(null) when the span does not hold the whole result; unknown is left out of every
sum and counted as left out on every surface, never shown as 0 or $0.00. Each
surface is checked against a recomputation from the rows. Arguments sent as JSON
text are parsed, bounded."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from django.db.models import Sum
from django.urls import reverse
from tests.dashboard.observatory.test_span_rows import send, span

from dashboard.observatory.costs import observation_cost
from dashboard.observatory.models import Conversation, ToolExecution, ToolHourlyRollup, ToolMinuteRollup
from dashboard.observatory.selectors import tool_stats
from dashboard.tuning.pricing import PriceTable
from dashboard.web.costs import usd_plain, usd_text
from pipeline import count_tokens

pytestmark = pytest.mark.django_db

RESULT = "Paris: sunny, 21 degrees, light wind from the west; tomorrow rain."
OI_RESULT = "42 rows: region=east total=39.0%"


def genai_conversation(conversation: str = "conv-t") -> list[dict]:
    """A model call (gpt-4o) asking for two lookups; one tool span holds its result,
    the other none; an OpenInference tool span with its output.value; then a
    failed model call that reports no usage."""
    asks = [{"role": "assistant", "parts": [
        {"type": "tool_call", "id": "call_a", "name": "lookup", "arguments": {"q": "Paris"}},
        {"type": "tool_call", "id": "call_b", "name": "lookup", "arguments": {"q": "Rome"}}]}]
    common = {"gen_ai__conversation__id": conversation}
    return [
        span("1" * 16, "chat", at_ms=0, ms=100, gen_ai__operation__name="chat", gen_ai__request__model="gpt-4o",
             gen_ai__usage__input_tokens=30, gen_ai__usage__output_tokens=9, gen_ai__output__messages=asks,
             gen_ai__input__messages=[{"role": "user", "parts": [{"type": "text", "content": "Weather?"}]}],
             **common),
        span("2" * 16, "execute_tool lookup", at_ms=200, ms=20, gen_ai__operation__name="execute_tool",
             gen_ai__tool__name="lookup", gen_ai__tool__call__id="call_a", gen_ai__tool__call__result=RESULT, **common),
        span("3" * 16, "execute_tool lookup", at_ms=250, ms=20, gen_ai__operation__name="execute_tool",
             gen_ai__tool__name="lookup", gen_ai__tool__call__id="call_b", **common),
        span("4" * 16, "sql", at_ms=300, ms=20, openinference__span__kind="TOOL", tool__name="sql",
             input__value='{"sql": "select region, total from sales"}', output__value=OI_RESULT, session__id=conversation),
        span("5" * 16, "chat", at_ms=400, ms=100, error=True, gen_ai__operation__name="chat",
             gen_ai__request__model="gpt-4o", error__type="RateLimitError", **common),
    ]


@pytest.fixture
def derived(client, auth, project):
    send(client, auth, *genai_conversation())
    return Conversation.objects.get(project=project, external_id="conv-t")


def test_it_counts_a_span_results_tokens_with_the_models_encoder(derived):
    a = ToolExecution.objects.get(tool_call_id="call_a")
    assert (a.observation, a.model) == (RESULT, "gpt-4o")
    assert a.observation_tokens == count_tokens(RESULT, "gpt-4o") > 0
    sql = ToolExecution.objects.get(tool_name="sql")  # no call id: the round before it in its trace
    assert (sql.model, sql.observation_tokens) == ("gpt-4o", count_tokens(OI_RESULT, "gpt-4o"))


def test_results_are_counted_before_the_write_transaction(client, auth, project, monkeypatch):
    """Encoding a 16 KiB result takes ~6 ms; in the transaction it held SQLite's write
    lock. The counter is the real one, watched: every count of a result whose model
    the pass can tell from the page runs outside a transaction, and what it stores is
    what the pipeline counts."""
    from django.db import connection

    from dashboard.observatory.derive.passes import span_rows

    depths: list[int] = []  # (the test's own transaction is the first level)

    def watched(text, *model):
        depths.append(len(connection.atomic_blocks))
        return count_tokens(text, *model)

    monkeypatch.setattr(span_rows, "count_tokens", watched)
    outside = len(connection.atomic_blocks)
    send(client, auth, *genai_conversation())
    assert depths == [outside, outside]
    assert ToolExecution.objects.get(tool_call_id="call_a").observation_tokens == count_tokens(RESULT, "gpt-4o")
    assert ToolExecution.objects.get(tool_name="sql").observation_tokens == count_tokens(OI_RESULT, "gpt-4o")


def test_a_call_of_no_round_is_counted_by_the_default_encoder(client, auth, project):
    send(client, auth, span("9" * 16, "t", gen_ai__operation__name="execute_tool", gen_ai__tool__name="alone",
                            gen_ai__tool__call__result=OI_RESULT, gen_ai__conversation__id="conv-alone"))
    (execution,) = ToolExecution.objects.filter(tool_name="alone")
    assert (execution.model, execution.observation_tokens) == ("", count_tokens(OI_RESULT))


def test_a_span_without_its_result_has_unknown_tokens_not_0(derived):
    assert ToolExecution.objects.get(tool_call_id="call_b").observation_tokens is None


def test_a_result_ingest_cut_has_unknown_tokens(client, auth, project):
    send(client, auth, span("6" * 16, "execute_tool big", gen_ai__operation__name="execute_tool",
                            gen_ai__tool__name="big", gen_ai__tool__call__result="word " * 10_000,
                            gen_ai__conversation__id="conv-big"))
    (execution,) = ToolExecution.objects.filter(tool_name="big")
    assert execution.observation_tokens is None and execution.observation  # a part is kept, not counted


def test_the_pipelines_own_count_wins_and_a_huge_one_is_no_count(client, auth, project):
    send(client, auth,
         span("7" * 16, "t", gen_ai__operation__name="execute_tool", gen_ai__tool__name="own",
              gen_ai__tool__call__result=RESULT, ba__observation_tokens=5, gen_ai__conversation__id="conv-own"),
         span("8" * 16, "t", gen_ai__operation__name="execute_tool", gen_ai__tool__name="own",
              ba__observation_tokens=10**15, gen_ai__conversation__id="conv-own"))
    assert sorted(ToolExecution.objects.filter(tool_name="own").values_list("observation_tokens", flat=True),
                  key=str) == [5, None]


def test_the_rollups_leave_unknown_out_and_count_it(derived):
    rows = ToolExecution.objects.filter(project=derived.project)
    rollups = ToolHourlyRollup.objects.filter(project=derived.project)
    assert rollups.aggregate(n=Sum("unknown_token_calls"))["n"] == rows.filter(observation_tokens__isnull=True).count() == 1
    assert rollups.aggregate(n=Sum("unleveled_tokens"))["n"] == rows.aggregate(n=Sum("observation_tokens"))["n"]
    assert ToolMinuteRollup.objects.aggregate(n=Sum("unknown_token_calls"))["n"] == 1
    (lookup,) = [s for s in tool_stats(derived.project) if s.tool_name == "lookup"]
    table = PriceTable.load()
    known = rows.filter(tool_name="lookup", observation_tokens__isnull=False)
    assert (lookup.calls, lookup.unknown_token_calls, lookup.priced_calls, lookup.unpriced_calls) == (2, 1, 1, 0)
    assert lookup.cost == sum(observation_cost(e, table) for e in known) > 0


def test_the_tools_table_and_its_csv_say_what_was_left_out(derived, client_in, project):
    body = client_in.get(reverse("web:tools", args=[project.slug])).content.decode()
    row = re.search(r'<tr data-tool="lookup">(.*?)</tr>', body, re.S).group(1)
    cost = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", re.search(r'data-field="cost">(.*?)</td>', row, re.S).group(1)))
    (lookup,) = [s for s in tool_stats(project) if s.tool_name == "lookup"]
    assert cost == f"{usd_text(lookup.cost)} (1 call with unknown tokens left out)"
    sql_row = re.search(r'<tr data-tool="sql">(.*?)</tr>', body, re.S).group(1)
    sql_cost = re.sub(r"<[^>]+>", "", re.search(r'data-field="cost">(.*?)</td>', sql_row, re.S).group(1))
    assert sql_cost == usd_text(observation_cost(ToolExecution.objects.get(tool_name="sql"), PriceTable.load(),
                                                 fallback_model=derived.model))
    exported = client_in.get(reverse("web:tools_export", args=[project.slug]))
    rows = {r["tool"]: r for r in csv.DictReader(io.StringIO(b"".join(exported.streaming_content).decode()))}
    assert (rows["lookup"]["unknown_token_calls"], rows["lookup"]["unpriced_calls"]) == ("1", "0")
    assert rows["lookup"]["observation_cost_usd"] == str(usd_plain(lookup.cost))


def test_the_tool_calls_csv_leaves_unknown_blank_not_0(derived, client_in, project):
    exported = client_in.get(reverse("web:tool_calls_export", args=[project.slug, derived.pk]))
    rows = {r["tool_call_id"]: r for r in csv.DictReader(io.StringIO(b"".join(exported.streaming_content).decode()))}
    a = ToolExecution.objects.get(tool_call_id="call_a")
    assert (rows["call_b"]["observation_tokens"], rows["call_b"]["observation_cost_usd"]) == ("", "")
    assert rows["call_a"]["observation_tokens"] == str(a.observation_tokens)
    assert rows["call_a"]["observation_cost_usd"] == str(usd_plain(observation_cost(a, PriceTable.load())))


def test_the_timeline_says_unknown_and_shows_the_count(derived, client_in, project):
    body = client_in.get(reverse("web:conversation", args=[project.slug, derived.pk])).content.decode()
    shown = {}
    for execution in ToolExecution.objects.filter(conversation=derived):
        block = re.search(rf'id="exec-{execution.pk}"(.*?)data-field="observation-tokens"[^>]*>([^<]*)<', body, re.S)
        shown[execution.tool_call_id or execution.tool_name] = block.group(2)
    a, sql = ToolExecution.objects.get(tool_call_id="call_a"), ToolExecution.objects.get(tool_name="sql")
    assert shown == {"call_a": f"{a.observation_tokens:,} tokens", "call_b": "tokens unknown",
                     sql.tool_call_id or "sql": f"{sql.observation_tokens:,} tokens"}


def test_compare_says_unknown_and_sums_only_what_is_known(derived, client, auth, client_in, project):
    from dashboard.web.selectors.compare import compare

    send(client, auth, *[dict(s, traceId="cd" * 16) for s in genai_conversation("conv-u")])
    other = Conversation.objects.get(project=project, external_id="conv-u")
    body = client_in.get(reverse("web:compare", args=[project.slug]) + f"?a={derived.pk}&b={other.pk}")
    assert body.status_code == 200
    shown = re.findall(r'data-field="observation-tokens">([^<]*)<', body.content.decode())
    a = ToolExecution.objects.get(conversation=derived, tool_call_id="call_a")
    cost = usd_text(observation_cost(a, PriceTable.load()))
    assert shown.count("tokens unknown") == 2 and shown.count(f"{a.observation_tokens:,} tokens · {cost}") == 2
    first = compare(derived, other).rows[0].a
    known = ToolExecution.objects.filter(conversation=derived, round_id=first.round["round_id"])
    assert first.observation_tokens == (known.aggregate(n=Sum("observation_tokens"))["n"],
                                        known.filter(observation_tokens__isnull=True).count())


def test_the_tool_page_and_overview_leave_unknown_out_and_say_so(derived, client_in, project):
    page = client_in.get(reverse("web:tool", args=[project.slug, "lookup"])).content.decode()
    a = ToolExecution.objects.get(tool_call_id="call_a")
    assert re.search(r'data-field="seen-calls">([^<]*)<', page).group(1) == "1"
    assert re.search(r'data-field="seen">([^<]*)<', page).group(1) == f"{a.observation_tokens:,}"
    assert "1 call with unknown tokens" in re.search(r'data-testid="unknown-tokens">([^<]*)<', page).group(1)
    overview = client_in.get(reverse("web:overview", args=[project.slug]) + "?range=7d").content.decode()
    card = re.search(r'Observation tokens</div><div class="value">([^<]*)<', overview).group(1)
    assert card == f"{ToolExecution.objects.aggregate(n=Sum('observation_tokens'))['n']:,}"
    assert re.search(r'data-testid="unknown-tokens">([^<]*)<', overview).group(1).startswith("1 call with unknown")


def test_the_read_api_gives_null_for_unknown_tokens(derived, client_in, project):
    response = client_in.get(f"/api/v1/projects/{project.slug}/conversations/{derived.external_id}")
    assert response.status_code == 200, response.content
    executions = {e["tool_call_id"]: e for e in response.json()["tool_executions"]}
    assert executions["call_b"]["observation_tokens"] is None
    tools = {row["tool_name"]: row for row in client_in.get(f"/api/v1/projects/{project.slug}/tools").json()}
    assert tools["lookup"]["unknown_token_calls"] == 1


# --- arguments (item 4) ---------------------------------------------------------------------

def test_json_text_arguments_are_parsed_not_double_encoded(client, auth, project):
    send(client, auth,
         span("a" * 16, "t", gen_ai__operation__name="execute_tool", gen_ai__tool__name="find",
              gen_ai__tool__call__arguments='{"q": "x", "n": 2}', gen_ai__conversation__id="conv-args"),
         span("b" * 16, "t", gen_ai__operation__name="execute_tool", gen_ai__tool__name="find",
              gen_ai__tool__call__arguments="plain words, not JSON", gen_ai__conversation__id="conv-args"),
         span("c" * 16, "t", traceloop__span__kind="tool", traceloop__entity__name="find",
              traceloop__entity__input='{"inputs": {"q": "y"}}', traceloop__association__properties__session_id="conv-args"),
         span("d" * 16, "t", gen_ai__operation__name="execute_tool", gen_ai__tool__name="find",
              gen_ai__tool__call__arguments="[1, 2]", gen_ai__conversation__id="conv-args"))
    by_span = dict(ToolExecution.objects.filter(tool_name="find").values_list("span_id", "parameters"))
    assert by_span == {"a" * 16: {"q": "x", "n": 2}, "b" * 16: {"input": "plain words, not JSON"},
                       "c" * 16: {"inputs": {"q": "y"}}, "d" * 16: {"input": [1, 2]}}


def test_openinference_input_value_is_parsed_too(derived):
    assert ToolExecution.objects.get(tool_name="sql").parameters == {"sql": "select region, total from sales"}


def test_hostile_json_arguments_stay_text_bounded(client, auth, project):
    deep = "[" * 5000 + "]" * 5000  # the parser recurses once a level
    nested = json.dumps(json.loads("[" * 40 + "]" * 40))  # valid, deeper than the limit
    send(client, auth, *[
        span(f"{i + 1:016x}", "t", gen_ai__operation__name="execute_tool", gen_ai__tool__name="hostile",
             gen_ai__tool__call__arguments=text, gen_ai__conversation__id="conv-hostile")
        for i, text in enumerate([deep, nested, '{"a": ' * 3000])
    ])
    parameters = list(ToolExecution.objects.filter(tool_name="hostile").order_by("span_id")
                      .values_list("parameters", flat=True))
    assert len(parameters) == 3 and all(set(p) == {"input"} and isinstance(p["input"], str) for p in parameters)
    assert all(len(p["input"]) <= 16 * 1024 for p in parameters)


def test_a_failed_model_call_from_a_span_is_a_gap_in_the_token_budget(derived):
    from dashboard.web.selectors.timeline import token_budget

    assert token_budget(derived)["context"] == [30, None]


def test_hostile_message_documents_do_not_stop_the_derivation(client, auth, project):
    deep = "[" * 5000 + "]" * 5000
    send(client, auth, span("e" * 16, "chat", gen_ai__operation__name="chat", gen_ai__request__model="gpt-4o",
                            gen_ai__input__messages=deep, gen_ai__output__messages=deep,
                            gen_ai__conversation__id="conv-deep"))
    assert Conversation.objects.get(project=project, external_id="conv-deep").rounds == 1
