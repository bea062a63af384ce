"""How long the demo agent takes, and how much of it is the agent's own work.

    .venv/bin/python -m benchmarks.bench_demo [--conversations 40]

Runs the demo offline (records go to an in-memory sink, spans are made but not
exported) and prints the time per scenario and the share spent inside tools
(which includes the scripted timeouts and retry back-offs, on purpose).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from pipeline import ObservabilityConfig, ToolResultRecord, TraceSampling, configure_telemetry
from pipeline.demo.__main__ import DATA_SEED, plan_conversations
from pipeline.demo.agent import DemoAgent
from pipeline.demo.data import build_sales_database
from pipeline.demo.model import ScriptedModel


class _Sink:
    def __init__(self) -> None:
        self.tool_ms = 0.0
        self.records = 0

    def submit(self, record: Any) -> bool:
        self.records += 1
        if isinstance(record, ToolResultRecord):
            self.tool_ms += record.result.duration_ms
        return True

    def upload_artifact(self, *args: Any) -> bool:
        return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=40)
    args = parser.parse_args()
    logging.getLogger("pipeline.tools").setLevel(logging.ERROR)  # the scripted timeouts are expected
    with tempfile.TemporaryDirectory() as work:
        started = time.perf_counter()
        database = build_sales_database(Path(work) / "sales.sqlite3", seed=DATA_SEED)
        build_s = time.perf_counter() - started
        sink = _Sink()
        telemetry = configure_telemetry(ObservabilityConfig(service_name="bench-demo", trace_sampling=TraceSampling.ALWAYS), shutdown_on_exit=False)
        agent = DemoAgent.create(
            model=ScriptedModel(), database_path=database, artifact_dir=Path(work) / "artifacts",
            exporter=sink, telemetry=telemetry,
        )
        per_scenario: dict[str, list[float]] = defaultdict(list)
        run_started = time.perf_counter()
        for planned in plan_conversations(args.conversations, seed=1):
            t0 = time.perf_counter()
            agent.run_conversation(planned.scenario, conversation_id=planned.conversation_id, user_id=planned.user_id)
            per_scenario[planned.scenario.key].append((time.perf_counter() - t0) * 1000)
        run_s = time.perf_counter() - run_started
        telemetry.shutdown(2)

    s = agent.stats
    print(f"sales database built in {build_s:.2f} s")
    print(f"{s.conversations} conversations, {s.rounds} rounds, {s.tool_calls} tool calls in {run_s:.2f} s "
          f"({sink.records} records, {sink.records / run_s:,.0f} records/s)")
    print(f"inside tools (incl. scripted timeouts, retries): {sink.tool_ms / 1000:.2f} s; "
          f"agent loop, counting, compression, records: {run_s - sink.tool_ms / 1000:.2f} s "
          f"({(run_s - sink.tool_ms / 1000) * 1000 / max(1, s.rounds):.1f} ms per round)")
    print(f"errors {s.errors}, retries {s.retries}, cache hits {s.cache_hits}, compressions {s.compressions}, "
          f"skill activations {s.skill_activations} ({s.refused_activations} refused), artifacts {s.artifacts}")
    print("mean ms per conversation by scenario:")
    for key, times in per_scenario.items():
        print(f"  {key:<26} {sum(times) / len(times):8.1f}  (n={len(times)})")


if __name__ == "__main__":
    main()
