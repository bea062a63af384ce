"""``python -m pipeline.demo``: the plan, the arguments, the summary and the exit code
against a local stand-in dashboard (accepting, refusing, or not there)."""

from __future__ import annotations

import http.server
import io
import json
import re
import socket
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from pipeline import IngestResponse, RejectedRecord
from pipeline.demo.__main__ import EXIT_REJECTED, USERS, Progress, main, parse_args, plan_conversations
from pipeline.demo.agent import AgentStats
from pipeline.demo.scenarios import SCENARIOS


def test_it_plans_the_same_conversations_for_the_same_seed() -> None:
    assert plan_conversations(30, seed=5) == plan_conversations(30, seed=5)


def test_it_plans_other_conversation_ids_for_another_seed() -> None:
    first = {p.conversation_id for p in plan_conversations(30, seed=5)}
    assert first.isdisjoint(p.conversation_id for p in plan_conversations(30, seed=6))
    assert len(first) == 30


def test_it_cycles_scenarios_and_varies_users() -> None:
    plan = plan_conversations(2 * len(SCENARIOS), seed=1)
    assert [p.scenario.key for p in plan] == [s.key for s in SCENARIOS] * 2
    assert len({p.user_id for p in plan}) > 3 and {p.user_id for p in plan} <= set(USERS)


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--endpoint", "http://127.0.0.1:8000"], "--api-key"),
        (["--endpoint", "ftp://example.com", "--api-key", "k"], "http(s) URL"),
        (["--endpoint", "file:///etc/passwd", "--api-key", "k"], "http(s) URL"),
        (["--offline", "--conversations", "-1"], ">= 0"),
        (["--offline", "--conversations", "many"], "invalid int"),
        (["--offline", "--flush-timeout", "-3"], ">= 0"),
    ],
)
def test_it_refuses_bad_arguments(argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2 and problem in capsys.readouterr().err


def test_it_runs_offline_when_the_endpoint_is_empty() -> None:
    assert parse_args(["--endpoint", ""]).offline


def test_it_prints_a_progress_line_per_tenth_when_not_a_terminal() -> None:
    stream = io.StringIO()
    progress = Progress(20, stream)
    for done in range(21):
        progress.update(done, AgentStats(tool_calls=done))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 11 and lines[-1].startswith("[" + "#" * 30 + "] 20/20")


def test_it_runs_offline_and_prints_the_summary(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--offline", "--conversations", "3", "--work-dir", str(tmp_path), "--quiet"], stdout=out, stderr=err)
    assert code == 0
    summary = out.getvalue()
    assert "Demo agent: 3 conversations" in summary and "offline: nothing sent" in summary
    assert "artifacts          1" in summary  # export_orders is the third scenario
    assert (tmp_path / "sales-7.sqlite3").exists()
    assert "dataset            3 items in demo-dataset.jsonl: replayed from the file, 3/3 answers as expected" in summary
    assert len((tmp_path / "demo-dataset.jsonl").read_text().splitlines()) == 3


# --- against a stand-in dashboard -------------------------------------------------------------


class StandIn(http.server.BaseHTTPRequestHandler):
    """A fake dashboard on 127.0.0.1 whose answer to records is set per test."""

    records_status = 200
    reject_first = False
    config: dict[str, Any] = {}
    posted: list[dict[str, Any]] = []
    paths: list[str] = []

    def _reply(self, status: int, body: bytes = b"", content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.paths.append(f"GET {self.path}")
        self._reply(200, json.dumps(self.config).encode(), "application/json")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.paths.append(f"POST {self.path}")
        if self.path != "/api/v1/records":
            self._reply(200, b"", "application/x-protobuf")
            return
        if self.records_status != 200:
            self._reply(self.records_status, b'{"error": "no"}')
            return
        records = json.loads(body)["records"]
        self.posted.extend(records)
        rejected = [RejectedRecord(index=0, error="round_id: bad")] if self.reject_first else []
        answer = IngestResponse(accepted=len(records) - len(rejected), rejected=rejected)
        self._reply(200, answer.model_dump_json().encode())

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.paths.append(f"PUT {self.path}")
        self._reply(201, b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[type[StandIn]]:
    handler = type("Handler", (StandIn,), {"posted": [], "paths": [], "config": {}})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.endpoint = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    yield handler
    server.shutdown()
    server.server_close()
    thread.join(5)


def _main(endpoint: str, tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    argv = ["--endpoint", endpoint, "--api-key", "po_test", "--conversations", "3", "--quiet",
            "--work-dir", str(tmp_path), "--flush-timeout", "5", *extra]
    return main(argv, stdout=out, stderr=err), out.getvalue(), err.getvalue()


def test_it_sends_records_spans_and_artifacts(stand_in: type[StandIn], tmp_path: Path) -> None:
    code, out, _ = _main(stand_in.endpoint, tmp_path)  # type: ignore[attr-defined]
    assert code == 0
    assert "0 rejected, 0 dropped, 0 not delivered" in out and "artifact uploads   1 sent" in out
    assert {"round", "message", "tool_result", "skill_activation"} <= {r["type"] for r in stand_in.posted}
    assert "POST /v1/traces" in stand_in.paths
    assert "POST /api/v1/scores" in stand_in.paths and re.search(r"scores +[1-9]\d* made, [1-9]\d* sent, 0 not", out)
    assert any(p.startswith("PUT /api/v1/artifacts/artifact_") for p in stand_in.paths)
    assert "GET /api/v1/config" in stand_in.paths


def test_it_applies_the_dashboards_config(stand_in: type[StandIn], tmp_path: Path) -> None:
    stand_in.config = {"revision": 3, "compression": {"max_tokens": 900}}
    code, _, _ = _main(stand_in.endpoint, tmp_path, "--no-telemetry")  # type: ignore[attr-defined]
    assert code == 0
    windows = {r["context_window"] for r in stand_in.posted if r["type"] == "round"}
    assert windows == {900}
    assert "POST /v1/traces" not in stand_in.paths


def test_it_fails_when_the_dashboard_rejects_records(stand_in: type[StandIn], tmp_path: Path) -> None:
    stand_in.reject_first = True
    code, out, err = _main(stand_in.endpoint, tmp_path, "--no-telemetry")  # type: ignore[attr-defined]
    assert code == EXIT_REJECTED
    assert "REFUSED" in err and "round_id: bad" in err


def test_it_fails_when_the_dashboard_refuses_the_key(stand_in: type[StandIn], tmp_path: Path) -> None:
    stand_in.records_status = 401
    code, _, err = _main(stand_in.endpoint, tmp_path, "--no-telemetry")  # type: ignore[attr-defined]
    assert code == EXIT_REJECTED and "HTTP 401" in err


def test_it_succeeds_when_the_dashboard_is_down(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = _main(f"http://127.0.0.1:{port}", tmp_path, "--flush-timeout", "1")
    assert code == 0
    assert "Demo agent: 3 conversations" in out and "unreachable" in out
    assert "was not reachable" in err and "the agent ran fine" in err
