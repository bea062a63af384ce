"""The design's process-wide observability: execute_with_observability, the global
config functions and the logging settings. Anything that changes process-wide state
for good (OpenTelemetry's global provider) runs in a subprocess."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

from pipeline import (
    MetricsCollector,
    ObservabilityConfig,
    ToolError,
    ToolErrorType,
    TraceSampling,
    configure_telemetry,
    execute_with_observability,
)
from pipeline._exceptions import ConfigError
from pipeline._global_observability import configure_logging, log_file_path
from tests.pipeline.otlp_collector import STATUS_ERROR, STATUS_OK, Collector

ROOT = Path(__file__).resolve().parents[2]



def telemetry_for(collector: Collector, **fields: Any) -> Any:
    config = ObservabilityConfig(otlp_endpoint=collector.url, otlp_compression="none", schedule_delay_ms=20,
                                 enable_metrics=True, **fields)
    return configure_telemetry(config, shutdown_on_exit=False, metrics=MetricsCollector())


def test_it_traces_a_wrapped_tool_with_the_designs_attributes(collector: Collector) -> None:
    telemetry = telemetry_for(collector, trace_sampling=TraceSampling.ALWAYS)

    def query_sales(region: str) -> list[int]:
        """Sales of a region."""
        return [1, 2, 3]

    traced = execute_with_observability(query_sales, "query_sales", conversation_id="conv-7", telemetry=telemetry)
    assert traced("East") == [1, 2, 3]
    assert (traced.__name__, traced.__doc__) == ("query_sales", "Sales of a region.")
    telemetry.shutdown(5)
    (span,) = collector.spans
    attributes = span["attributes"]
    assert span["name"] == "execute_tool query_sales" and span["status"] == STATUS_OK
    assert (attributes["tool.name"], attributes["tool.success"]) == ("query_sales", True)
    assert attributes["tool.duration_ms"] >= 0 and attributes["gen_ai.tool.name"] == "query_sales"
    assert attributes["gen_ai.conversation.id"] == "conv-7"
    stats = telemetry.metrics.get_conversation("conv-7").get_tool_stats()["query_sales"]
    assert (stats["call_count"], stats["success_rate"]) == (1, 1.0)


def test_it_records_a_failing_tool_and_lets_the_exception_through(collector: Collector) -> None:
    telemetry = telemetry_for(collector, trace_sampling=TraceSampling.ALWAYS)

    def flaky() -> None:
        raise ToolError(ToolErrorType.TRANSIENT_ERROR, "upstream <b>down</b>")

    with pytest.raises(ToolError, match="upstream"):
        execute_with_observability(flaky, "flaky", telemetry=telemetry)()
    telemetry.shutdown(5)
    (span,) = collector.spans
    assert span["status"] == STATUS_ERROR
    assert span["attributes"]["tool.success"] is False and "upstream <b>down</b>" in span["attributes"]["tool.error"]
    assert span["attributes"]["error.type"] == ToolErrorType.TRANSIENT_ERROR.value
    stats = telemetry.metrics.get_conversation("unassigned").get_tool_stats()["flaky"]
    assert stats["error_rate"] == 1.0 and stats["error_types"] == {ToolErrorType.TRANSIENT_ERROR.value: 1}


def test_it_samples_ten_percent_of_traces_by_default(collector: Collector) -> None:
    telemetry = telemetry_for(collector)  # the design's default: MEDIUM
    assert telemetry.config.get_sampling_rate() == 0.1
    seen: list[tuple[int, int]] = []

    def tool() -> None:
        context = trace.get_current_span().get_span_context()
        seen.append((context.trace_id, context.span_id))

    traced = execute_with_observability(tool, "tool", telemetry=telemetry)
    for _ in range(400):
        traced()
    telemetry.shutdown(5)
    bound = TraceIdRatioBased.get_bound_for_rate(0.1)
    expected = {format(s, "016x") for t, s in seen if t & TraceIdRatioBased.TRACE_ID_LIMIT < bound}
    assert set(collector.span_ids()) == expected
    assert 10 <= len(expected) <= 80  # about 40 of 400


def test_it_refuses_a_bad_wrap() -> None:
    with pytest.raises(TypeError):
        execute_with_observability("not callable", "t")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        execute_with_observability(print, "")


# --- logging ------------------------------------------------------------------------


@pytest.fixture
def pipeline_logger() -> Iterator[logging.Logger]:
    target = logging.getLogger("pipeline")
    level, propagate = target.level, target.propagate
    yield target
    configure_logging(ObservabilityConfig(enable_logging=False))
    target.setLevel(level)
    target.propagate = propagate


def test_it_writes_json_log_lines_with_trace_ids_to_a_file(pipeline_logger: logging.Logger, tmp_path: Path) -> None:
    config = ObservabilityConfig(log_output=["file"], log_file=str(tmp_path / "agent.log"), log_level="debug",
                                 service_name="sales-agent", extra_tags={"team": "ba"})
    (handler,) = configure_logging(config)
    tracer = configure_telemetry(ObservabilityConfig(trace_sampling=TraceSampling.ALWAYS),
                                 shutdown_on_exit=False).tracer
    with tracer.start_as_current_span("round") as span:
        logging.getLogger("pipeline.logging_test").debug("retrying %s", "call_1 扬州")
    logging.getLogger("pipeline.logging_test").info("outside")
    handler.flush()
    first, second = (json.loads(line) for line in (tmp_path / "agent.log").read_text(encoding="utf-8").splitlines())
    assert first["message"] == "retrying call_1 扬州" and first["level"] == "DEBUG"
    assert first["logger"] == "pipeline.logging_test" and first["service.name"] == "sales-agent" and first["team"] == "ba"
    assert first["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert "trace_id" not in second
    assert pipeline_logger.propagate is False  # our handlers own the output: nothing printed twice


def test_it_writes_text_lines_at_the_configured_level(pipeline_logger: logging.Logger, capsys: Any) -> None:
    configure_logging(ObservabilityConfig(log_output=["stdout"], log_format="text", log_level="WARNING"))
    logging.getLogger("pipeline.exporter").info("quiet")
    logging.getLogger("pipeline.exporter").warning("dashboard down")
    out = capsys.readouterr().out
    assert "WARNING pipeline.exporter: dashboard down" in out and "quiet" not in out


def test_it_replaces_its_own_handlers_when_configured_again(pipeline_logger: logging.Logger) -> None:
    before = list(pipeline_logger.handlers)
    configure_logging(ObservabilityConfig(log_output=["stderr"]))
    configure_logging(ObservabilityConfig(log_output=["stderr", "stdout"]))
    assert len(pipeline_logger.handlers) == len(before) + 2
    configure_logging(ObservabilityConfig(enable_logging=False))
    assert pipeline_logger.handlers == before and pipeline_logger.propagate


def test_it_logs_without_a_file_it_cannot_open(pipeline_logger: logging.Logger, tmp_path: Path, capsys: Any) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    handlers = configure_logging(ObservabilityConfig(log_output=["file", "stderr"], log_file=str(blocker / "x.log")))
    assert len(handlers) == 1  # stderr only, and one warning about the file, on it
    (line,) = capsys.readouterr().err.splitlines()
    assert "could not be opened" in json.loads(line)["message"]


def test_it_names_the_default_log_file_after_the_service() -> None:
    assert log_file_path(ObservabilityConfig(service_name="sales agent/1")) == "sales_agent_1.log"
    assert log_file_path(ObservabilityConfig(log_file="/var/log/a.log")) == "/var/log/a.log"


# --- process-wide: in a subprocess --------------------------------------------------

GLOBAL = """
import json, logging, sys
from opentelemetry import trace
from pipeline import (ObservabilityConfig, TraceSampling, configure_observability, execute_with_observability,
                      get_observability_config, get_telemetry)

default = get_observability_config()
assert default.trace_sampling is TraceSampling.MEDIUM and default is get_observability_config()
config = ObservabilityConfig(otlp_endpoint=sys.argv[1], trace_sampling=TraceSampling.ALWAYS, enable_metrics=False,
                             otlp_compression="none", schedule_delay_ms=20, service_name="global-agent")
telemetry = configure_observability(config)
assert get_observability_config() is config and get_telemetry() is telemetry
assert trace.get_tracer_provider() is telemetry.provider  # OpenTelemetry's global provider, set once
traced = execute_with_observability(lambda region: region.upper(), "shout")
assert traced("east") == "EAST"
logging.getLogger("pipeline.demo").warning("configured")
again = configure_observability(ObservabilityConfig(otlp_endpoint=sys.argv[1], trace_sampling="always",
                                                    enable_metrics=False, log_output=["stdout"], log_format="text"))
traced("west")  # wrapped before: follows the new global config
assert trace.get_tracer_provider() is telemetry.provider  # OpenTelemetry does not allow a second one
logging.getLogger("pipeline.demo").warning("reconfigured")
again.shutdown(5)
telemetry.shutdown(5)
"""


def test_it_applies_a_global_config_to_the_whole_process(collector: Collector, tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", GLOBAL, collector.url], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert [s["name"] for s in collector.spans] == ["execute_tool shout", "execute_tool shout"]
    assert {r["service.name"] for r in collector.resources} == {"global-agent", "ba-agent"}
    stdout = run.stdout.splitlines()
    assert json.loads(stdout[0])["message"] == "configured"  # json to stdout and to the file by default
    assert stdout[1].endswith("WARNING pipeline.demo: reconfigured")
    (line,) = (tmp_path / "global-agent.log").read_text().splitlines()
    assert json.loads(line)["message"] == "configured"
