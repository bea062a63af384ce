"""The demo agent end to end, offline: every scenario through the real pipeline, its
records through a real RecordExporter whose HTTP transport is a fake, its spans into
an in-memory exporter. Then the agent against a dashboard that is down or broken."""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import socket
import sqlite3
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pipeline import (
    CompressionRecord,
    IngestResponse,
    MessageRecord,
    ObservabilityConfig,
    OutputLevel,
    RecordExporter,
    RemoteConfig,
    RoundRecord,
    SkillActivationRecord,
    ToolResultRecord,
    TraceSampling,
    configure_telemetry,
    parse_record,
)
from pipeline.demo.agent import DEFAULT_CONTEXT_WINDOW, GROUNDED_SCORE, DemoAgent, answer_quotes_tool_figure
from pipeline.demo.model import Call, ModelTurn, RoundScript, Scenario, ScriptedModel
from pipeline.demo.scenarios import SCENARIOS

ALL_LEVELS = [OutputLevel.BRIEF, OutputLevel.STANDARD, OutputLevel.FULL]


class FakeTransport:
    """The dashboard's HTTP side, faked: it keeps what was sent and accepts it."""

    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.scores: list[dict[str, Any]] = []
        self.artifacts: dict[str, tuple[bytes, dict[str, str]]] = {}
        self._lock = threading.Lock()

    def send(self, method: str, url: str, headers: Any, body: bytes, timeout: float) -> tuple[int, dict, bytes]:
        with self._lock:
            if method == "POST" and url.endswith("/api/v1/records"):
                records = json.loads(body)["records"]
                self.batches.append(records)
                return 200, {}, IngestResponse(accepted=len(records)).model_dump_json().encode()
            if method == "POST" and url.endswith("/api/v1/scores"):
                scores = json.loads(body)["scores"]
                self.scores.extend(scores)
                return 200, {}, json.dumps({"accepted": len(scores), "duplicates": 0, "rejected": []}).encode()
            if method == "PUT" and "/api/v1/artifacts/" in url:
                self.artifacts[url.rsplit("/", 1)[1]] = (body, dict(headers))
                return 201, {}, b"{}"
        return 404, {}, b""


class Run:
    def __init__(self, records: list[Any], transport: FakeTransport, spans: list[Any], agent: DemoAgent) -> None:
        self.records, self.transport, self.spans, self.agent = records, transport, spans, agent
        self.by_conversation: dict[str, list[Any]] = defaultdict(list)
        for record in records:
            self.by_conversation[record.conversation_id].append(record)

    def of(self, scenario: str, kind: type) -> list[Any]:
        return [r for r in self.by_conversation[f"conv-{scenario}"] if isinstance(r, kind)]


@pytest.fixture(scope="module")
def run(sales_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    transport = FakeTransport()
    exporter = RecordExporter("http://dashboard.test", "po_fake", transport=transport, flush_interval_ms=50)
    spans = InMemorySpanExporter()
    telemetry = configure_telemetry(ObservabilityConfig(schedule_delay_ms=50, trace_sampling=TraceSampling.ALWAYS), exporter=spans, shutdown_on_exit=False)
    agent = DemoAgent.create(
        model=ScriptedModel(), database_path=sales_db, artifact_dir=tmp_path_factory.mktemp("artifacts"),
        exporter=exporter, telemetry=telemetry,
    )
    for scenario in SCENARIOS:
        agent.run_conversation(scenario, conversation_id=f"conv-{scenario.key}", user_id="ana")
    assert exporter.shutdown(timeout=10)
    telemetry.shutdown(timeout=5)
    records = [parse_record(item) for batch in transport.batches for item in batch]
    yield Run(records, transport, list(spans.get_finished_spans()), agent)


def _results(run: Run, scenario: str) -> list[Any]:
    return [r.result for r in run.of(scenario, ToolResultRecord)]


# --- what every conversation sends -----------------------------------------------------


def test_it_delivers_every_record_it_made(run: Run) -> None:
    assert len(run.records) == run.agent.stats.records
    assert run.agent.stats.conversations == len(SCENARIOS)
    assert len({r.record_id for r in run.records}) == len(run.records)


def test_it_answers_every_round(run: Run) -> None:
    rounds = [r for r in run.records if isinstance(r, RoundRecord)]
    assert len(rounds) == sum(len(s.rounds) for s in SCENARIOS)
    assert all(r.status == "ok" and r.final_answer for r in rounds)
    assert all(r.trace_id and r.user_id == "ana" and r.model == "scripted-analyst-1" for r in rounds)
    assert all(r.context_window == DEFAULT_CONTEXT_WINDOW and r.compression_threshold == 0.8 for r in rounds)
    assert all(0 < r.context_tokens <= DEFAULT_CONTEXT_WINDOW and r.input_tokens > 0 for r in rounds)


def test_it_scores_each_round_that_ran_a_tool_on_whether_its_answer_quotes_a_figure(run: Run) -> None:
    rounds = {(r.conversation_id, r.round_id): r for r in run.records if isinstance(r, RoundRecord)}
    tooled = {(r.conversation_id, r.round_id) for r in run.records if isinstance(r, ToolResultRecord)}
    scores = {(s["conversation_id"], s["round_id"]): s for s in run.transport.scores}
    assert len(run.transport.scores) == len(scores) == run.agent.stats.scores
    assert set(scores) <= set(rounds) and set(scores) >= {key for key in tooled if key in rounds}
    assert {s["name"] for s in scores.values()} == {GROUNDED_SCORE}
    for key, score in scores.items():
        assert score["value"] is answer_quotes_tool_figure(rounds[key].final_answer, _observations(run, key))[0]
    verdicts = {s["value"] for s in scores.values()}
    assert verdicts == {True, False}  # the demo shows both
    share = scores[("conv-revenue_by_region", "conv-revenue_by_region-r1")]
    assert share["value"] is True and share["comment"].startswith("quotes ")


def _observations(run: Run, key: tuple[str, str]) -> list[str]:
    return [r.result.observation for r in run.records if isinstance(r, ToolResultRecord)
            and (r.conversation_id, r.round_id) == key and r.result.success]


@pytest.mark.parametrize("answer, observations, verdict, why", [
    ("Revenue was 1,234.5 last year.", ["total 1234.5"], True, "quotes 1234.5, which a tool returned"),
    ("华东约占35.2%。", ["35.2"], True, "quotes 35.2"),
    ("Revenue was 999.", ["total 1234.5"], False, "quotes 999, which no tool of the round returned"),
    ("Same figures as before.", ["total 1234.5"], False, "the answer quotes no figure"),
    ("It has 3 rows.", ["3 rows"], False, "the answer quotes no figure"),  # one digit is not a figure
    (None, ["12"], False, "the round has no answer"),
])
def test_the_check_finds_a_quoted_figure(answer, observations, verdict, why) -> None:
    passed, said = answer_quotes_tool_figure(answer, observations)
    assert passed is verdict and said.startswith(why)


def test_it_gives_every_tool_call_a_record_with_three_renderings(run: Run) -> None:
    tool_records = [r for r in run.records if isinstance(r, ToolResultRecord)]
    assert len(tool_records) == run.agent.stats.tool_calls
    for record in tool_records:
        assert [r.level for r in record.renderings] == ALL_LEVELS
        own = next(r for r in record.renderings if r.level is record.result.output_level)
        assert own.observation == record.result.observation
        assert record.trace_id and record.span_id


def test_it_numbers_messages_in_conversation_order(run: Run) -> None:
    for conversation, records in run.by_conversation.items():
        messages = [r for r in records if isinstance(r, MessageRecord)]
        assert [m.index for m in messages] == list(range(len(messages))), conversation
        assert messages[0].role == "system" and messages[1].role == "user"
        assert all(m.tokens and m.tokens > 0 for m in messages)


def test_it_pairs_every_tool_message_with_a_call(run: Run) -> None:
    for records in run.by_conversation.values():
        called = {c.id for m in records if isinstance(m, MessageRecord) for c in m.tool_calls}
        answered = [m.tool_call_id for m in records if isinstance(m, MessageRecord) and m.role == "tool"]
        assert set(answered) == called and len(answered) == len(called)


def test_it_nests_chat_and_tool_spans_under_the_round_span(run: Run) -> None:
    rounds = {s.context.span_id: s for s in run.spans if s.name == "invoke_agent demo-analyst"}
    children = [s for s in run.spans if s.name.startswith(("chat ", "execute_tool "))]
    assert rounds and children
    for span in children:
        assert span.parent is not None and span.parent.span_id in rounds
        assert span.attributes["gen_ai.conversation.id"].startswith("conv-")
    tool_span_ids = {format(s.context.span_id, "016x") for s in run.spans if s.name.startswith("execute_tool ")}
    assert {r.span_id for r in run.records if isinstance(r, ToolResultRecord)} <= tool_span_ids


# --- what each scenario scripts ----------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "error_type"),
    [
        ("timeout_then_aggregate", "timeout"),
        ("invalid_sql_fixed", "invalid_parameters"),
        ("missing_report", "not_found"),
        ("growth_division_error", "invalid_parameters"),
        ("zh_region_skill", "permission_denied"),
    ],
)
def test_it_shows_the_error_each_scenario_scripts(run: Run, scenario: str, error_type: str) -> None:
    failed = [r for r in _results(run, scenario) if not r.success]
    assert [r.error_type for r in failed] == [error_type]
    assert failed[0].observation.startswith("Operation failed.")


def test_it_retries_a_timeout_with_growing_timeouts_then_recovers(run: Run) -> None:
    timed_out, recovered = _results(run, "timeout_then_aggregate")
    assert timed_out.retry_count == 2 and "timed out after 1600ms" in (timed_out.error_message or "")
    assert recovered.success


def test_it_retries_a_rate_limited_search(run: Run) -> None:
    first = _results(run, "throttled_search")[0]
    assert first.success and first.retry_count == 1 and first.last_error.startswith("rate_limit")


def test_it_recovers_from_bad_sql_by_fixing_the_query(run: Run) -> None:
    assert [r.success for r in _results(run, "invalid_sql_fixed")] == [False, True]


def test_it_compresses_the_long_analysis(run: Run) -> None:
    compressions = run.of("long_analysis", CompressionRecord)
    assert compressions
    for record in compressions:
        assert record.result.tokens_after < record.result.tokens_before
        assert record.result.tokens_before > 0.8 * DEFAULT_CONTEXT_WINDOW
        assert record.trace_id and record.span_id and record.result.model == "scripted-analyst-1"


def test_it_refuses_a_skill_cycle_in_the_nested_review(run: Run) -> None:
    activations = run.of("quarterly_review_nested", SkillActivationRecord)
    assert [(a.skill_name, a.success, a.depth) for a in activations] == [
        ("quarterly-review", True, 0),
        ("sales-analysis", True, 1),
        ("quarterly-review", False, 2),
    ]
    assert activations[1].chain == ["quarterly-review"]
    assert "Circular dependency" in activations[2].error
    assert run.agent.stats.refused_activations == 1


def test_it_denies_a_tool_the_active_skill_does_not_allow(run: Run) -> None:
    results = run.of("zh_region_skill", ToolResultRecord)
    denied = [r for r in results if r.result.error_type == "permission_denied"]
    assert [r.tool_name for r in denied] == ["vector_search"]
    # After switching to market-research, the same search goes through.
    assert results[-1].tool_name == "vector_search" and results[-1].result.success
    skills = [a.skill_name for a in run.of("zh_region_skill", SkillActivationRecord)]
    assert skills == ["sales-analysis", "market-research"]


def test_it_injects_skill_instructions_as_meta_messages(run: Run) -> None:
    meta = [m for m in run.of("zh_region_skill", MessageRecord) if m.is_meta]
    assert meta and all(m.role == "user" for m in meta)
    assert any("Sales analysis" in m.content for m in meta)


def test_it_answers_a_repeated_query_from_the_cache(run: Run) -> None:
    rounds = {r.index: r.round_id for r in run.of("revenue_by_region", RoundRecord)}
    by_round = {r.round_id: r.result for r in run.of("revenue_by_region", ToolResultRecord)}
    assert not by_round[rounds[0]].cache_hit
    assert by_round[rounds[2]].cache_hit
    assert by_round[rounds[2]].observation == by_round[rounds[0]].observation


def test_it_stores_and_uploads_the_export_as_an_artifact(run: Run) -> None:
    export = _results(run, "export_orders")[0]
    assert export.artifact_id and export.output_level is OutputLevel.FULL
    body, headers = run.transport.artifacts[export.artifact_id]
    assert hashlib.sha256(body).hexdigest() == headers["X-Content-SHA256"] == export.data_hash
    assert len(json.loads(body)) > 10_000
    assert _results(run, "export_orders")[1].success  # read back by id in the next round


# --- what the answers say ----------------------------------------------------------------


_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_ARTIFACT_ID = re.compile(r"artifact_[0-9a-f]+")


def _figures(text: str) -> set[float]:
    return {float(n.replace(",", "")) for n in _NUMBER.findall(_ARTIFACT_ID.sub("", text))}


def test_it_states_the_share_the_sales_data_gives(run: Run, sales_db: Path) -> None:
    with sqlite3.connect(sales_db) as db:
        regions = db.execute("SELECT region, SUM(revenue) FROM orders GROUP BY region ORDER BY 2 DESC").fetchall()
    leader, revenue = regions[0]
    share = round(revenue / sum(r for _, r in regions) * 100, 1)
    english = {r.index: r.final_answer for r in run.of("revenue_by_region", RoundRecord)}
    assert english[1] == f"{leader} brought in {share}% of total revenue."
    chinese = run.of("zh_region_skill", RoundRecord)[0].final_answer
    assert f"{share}%" in chinese and chinese.startswith("华东" if leader == "East" else "")


def test_it_states_no_figure_its_tools_did_not_return(run: Run) -> None:
    for conversation, records in run.by_conversation.items():
        sources = [m.content for m in records if isinstance(m, MessageRecord) and m.role in ("user", "tool")]
        sources += [r.result.observation for r in records if isinstance(r, ToolResultRecord)]
        known = set().union(*(_figures(text) for text in sources))
        for round_record in (r for r in records if isinstance(r, RoundRecord)):
            unknown = _figures(round_record.final_answer or "") - known
            assert not unknown, (conversation, round_record.final_answer, unknown)


def test_it_names_the_artifact_its_own_round_stored(run: Run) -> None:
    results = {r.round_id: r.result for r in run.of("long_analysis", ToolResultRecord)}
    for round_record in run.of("long_analysis", RoundRecord):
        named = _ARTIFACT_ID.findall(round_record.final_answer or "")
        own = results[round_record.round_id].artifact_id
        assert named == [own] or (not named and "summarised before I read it" in round_record.final_answer)
    assert any(_ARTIFACT_ID.search(r.final_answer or "") for r in run.of("long_analysis", RoundRecord))


# --- the loop with other models -------------------------------------------------------------


class FakeLoopingModel:
    """A fake LLM that never answers: it calls the calculator forever."""

    name = "fake-looper"

    def __init__(self) -> None:
        self.calls = 0

    def respond(self, messages: list[dict[str, Any]]) -> ModelTurn:
        self.calls += 1
        return ModelTurn(tool_calls=[{"id": f"call_{self.calls}", "name": "calculator", "args": {"expression": "1+1"}}])


class FakeBrokenModel:
    """A fake LLM whose API fails on the first round only."""

    name = "fake-broken"

    def __init__(self) -> None:
        self.rounds = 0

    def respond(self, messages: list[dict[str, Any]]) -> ModelTurn:
        self.rounds += 1
        if self.rounds == 1:
            raise ConnectionError("model API unavailable")
        return ModelTurn(final_answer="fine now", input_tokens=10, output_tokens=2)


class Collect:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def submit(self, record: Any) -> bool:
        self.records.append(record)
        return True

    def upload_artifact(self, *args: Any) -> bool:
        return True


def _agent(model: Any, sales_db: Path, tmp_path: Path, exporter: Any = None) -> DemoAgent:
    return DemoAgent.create(model=model, database_path=sales_db, artifact_dir=tmp_path / "a", exporter=exporter)


def test_it_ends_a_round_whose_fake_model_never_answers(sales_db: Path, tmp_path: Path) -> None:
    sink = Collect()
    agent = _agent(FakeLoopingModel(), sales_db, tmp_path, sink)
    agent.run_conversation(Scenario("loop", "en", [RoundScript("add")]), conversation_id="c", user_id="u")
    (round_record,) = [r for r in sink.records if isinstance(r, RoundRecord)]
    assert round_record.status == "error" and round_record.final_answer is None
    assert agent.stats.failed_rounds == 1 and agent.stats.tool_calls == 16


def test_it_carries_on_after_a_fake_model_failure(sales_db: Path, tmp_path: Path) -> None:
    sink = Collect()
    agent = _agent(FakeBrokenModel(), sales_db, tmp_path, sink)
    agent.run_conversation(Scenario("s", "en", [RoundScript("one"), RoundScript("two")]), conversation_id="c", user_id="u")
    statuses = [r.status for r in sink.records if isinstance(r, RoundRecord)]
    assert statuses == ["error", "ok"]


def test_it_refuses_hostile_skill_requests_as_failed_activations(sales_db: Path, tmp_path: Path) -> None:
    sink = Collect()
    agent = _agent(ScriptedModel(), sales_db, tmp_path, sink)
    hostile = [
        Call("Skill", {"name": "../../etc/passwd"}),
        Call("Skill", {"name": "sales-analysis", "level": 9}),
        Call("Skill", {"name": ["a"], "level": True}),
        Call("Skill", {}),
        Call("Skill", {"name": "no-such-skill"}),
    ]
    agent.run_conversation(Scenario("h", "en", [RoundScript("q", hostile, "done")]), conversation_id="c", user_id="u")
    activations = [r for r in sink.records if isinstance(r, SkillActivationRecord)]
    assert len(activations) == 5 and not any(a.success for a in activations)
    tool_messages = [r for r in sink.records if isinstance(r, MessageRecord) and r.role == "tool"]
    assert all(m.content.startswith("Operation failed.") for m in tool_messages)
    assert [r.status for r in sink.records if isinstance(r, RoundRecord)] == ["ok"]


def test_it_tells_the_model_about_an_unknown_tool(sales_db: Path, tmp_path: Path) -> None:
    sink = Collect()
    agent = _agent(ScriptedModel(), sales_db, tmp_path, sink)
    script = RoundScript("q", [Call("rm_rf", {"path": "/"}, fault="no_such_fault")], "done")
    agent.run_conversation(Scenario("u", "en", [script]), conversation_id="c", user_id="u")
    (tool,) = [r for r in sink.records if isinstance(r, ToolResultRecord)]
    assert tool.result.error_type == "not_found" and len(tool.renderings) == 3


# --- a dashboard that is down or broken ------------------------------------------------------


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Answer500(http.server.BaseHTTPRequestHandler):
    hits = 0

    def _fail(self) -> None:
        type(self).hits += 1
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.send_response(500)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"boom!")

    do_GET = do_POST = do_PUT = _fail

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def broken_dashboard() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer500)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def _run_against(
    endpoint: str, sales_db: Path, tmp_path: Path, *, before_shutdown: Any = None
) -> tuple[DemoAgent, RecordExporter, RemoteConfig]:
    exporter = RecordExporter(endpoint, "po_key", max_retries=1, backoff_s=0.01, request_timeout_s=2, flush_interval_ms=50)
    telemetry = configure_telemetry(
        ObservabilityConfig(otlp_endpoint=endpoint, otlp_headers={"Authorization": "Bearer po_key"},
                            trace_sampling=TraceSampling.ALWAYS,
                            export_timeout_ms=1_000, schedule_delay_ms=50),
        shutdown_on_exit=False,
    )
    remote = RemoteConfig(endpoint, "po_key", request_timeout_s=2)
    agent = DemoAgent.create(model=ScriptedModel(), database_path=sales_db, artifact_dir=tmp_path / "a",
                             exporter=exporter, telemetry=telemetry)
    assert remote.refresh_now() is False and remote.current() is None
    assert remote.apply_to(executor=agent.executor, context_manager=agent.context_manager) is False
    export = next(s for s in SCENARIOS if s.key == "export_orders")
    for scenario in (SCENARIOS[0], export):
        agent.run_conversation(scenario, conversation_id=f"c-{scenario.key}", user_id="u")
    if before_shutdown is not None:
        before_shutdown(agent)
    exporter.shutdown(timeout=3)
    telemetry.shutdown(timeout=2)
    return agent, exporter, remote


def test_it_survives_a_dashboard_that_is_down(sales_db: Path, tmp_path: Path) -> None:
    agent, exporter, remote = _run_against(f"http://127.0.0.1:{_unused_port()}", sales_db, tmp_path)
    assert agent.stats.conversations == 2 and agent.stats.failed_rounds == 0
    stats = exporter.stats()
    assert stats.sent == 0 and stats.failures == stats.submitted == agent.stats.records
    assert stats.artifacts_sent == 0 and "Connection refused" in (stats.last_error or "")
    assert remote.stats().errors == 1


def test_it_survives_a_dashboard_that_answers_500(sales_db: Path, tmp_path: Path, broken_dashboard: str) -> None:
    agent, exporter, remote = _run_against(broken_dashboard, sales_db, tmp_path)
    assert agent.stats.conversations == 2 and agent.stats.failed_rounds == 0
    stats = exporter.stats()
    assert stats.sent == 0 and stats.retries > 0 and "HTTP 500" in (stats.last_error or "")
    assert remote.stats().last_error == "HTTP 500"
    assert _Answer500.hits > 2


class _Hold(http.server.BaseHTTPRequestHandler):
    """A dashboard that takes every request and answers only when released."""

    release = threading.Event()
    received = 0
    answered = 0

    def _hold(self) -> None:
        type(self).received += 1
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).release.wait(30)
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()
        type(self).answered += 1

    do_GET = do_POST = do_PUT = _hold

    def log_message(self, *args: Any) -> None:
        pass


def test_it_does_not_wait_for_a_dashboard_that_hangs(sales_db: Path, tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hold)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    seen: dict[str, int] = {}

    def while_hanging(agent: DemoAgent) -> None:
        # The whole run finished while the dashboard had not answered anything:
        # nothing in the loop waited for it (the config fetch timed out on its own).
        seen.update(received=_Hold.received, answered=_Hold.answered, rounds=agent.stats.rounds)
        _Hold.release.set()

    try:
        _run_against(f"http://127.0.0.1:{server.server_address[1]}", sales_db, tmp_path, before_shutdown=while_hanging)
    finally:
        _Hold.release.set()
        server.shutdown()
        server.server_close()
    assert seen["received"] >= 2 and seen["answered"] == 0
    assert seen["rounds"] == len(SCENARIOS[0].rounds) + 2
