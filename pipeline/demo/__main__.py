"""Run the demo agent against a dashboard:

    python -m pipeline.demo --endpoint http://127.0.0.1:8000 --api-key KEY --conversations 40

``--endpoint ''`` (or ``--offline``) runs without a dashboard and prints the summary only.
The exit code is non-zero only when the dashboard refused what was sent (a bug worth
looking at), not when it was down: an agent must not fail because its observer did.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, TextIO

from .. import (
    DatasetError,
    ExporterStats,
    ObservabilityConfig,
    RecordExporter,
    RemoteConfig,
    Telemetry,
    TraceSampling,
    UrllibTransport,
    configure_telemetry,
    fetch_dataset,
    read_dataset,
    send_dataset,
    write_dataset,
)
from .agent import AgentStats, DemoAgent
from .data import build_sales_database
from .model import Scenario, ScriptedModel
from .replay import DATASET_NAME, demo_dataset, replay
from .scenarios import scenario_for

USERS = ("ana.silva", "li.wei", "ben.okafor", "mei.chen", "dara.novak", "jun.park", "fang.liu")
EXIT_REJECTED = 2
DATA_SEED = 7  # the sales data is the same company every run; --seed varies the conversations

logger = logging.getLogger("pipeline.demo")


@dataclass(frozen=True)
class PlannedConversation:
    conversation_id: str
    user_id: str
    scenario: Scenario


def plan_conversations(count: int, seed: int) -> list[PlannedConversation]:
    """Which conversations to run: scenarios in a fixed cycle, ids and users from the seed."""
    rng = random.Random(seed)
    planned = []
    for index in range(count):
        scenario = scenario_for(index)
        digest = hashlib.sha256(f"{seed}:{index}".encode()).hexdigest()[:12]
        planned.append(PlannedConversation(f"demo-{digest}", rng.choice(USERS), scenario))
    return planned


class TallyingTransport:
    """The exporter's transport, counting answers by status so the summary can tell
    a dashboard that refused records (4xx) from one that was not there."""

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner or UrllibTransport()
        self.statuses: Counter[int] = Counter()
        self.unreachable = 0
        self._lock = threading.Lock()

    def send(self, method: str, url: str, headers: Any, body: bytes, timeout: float) -> Any:
        try:
            answer = self.inner.send(method, url, headers, body, timeout)
        except Exception:
            with self._lock:
                self.unreachable += 1
            raise
        with self._lock:
            self.statuses[answer[0]] += 1
        return answer

    @property
    def refused(self) -> int:
        """Answers that mean "no" rather than "not now" (4xx other than 408 and 429)."""
        with self._lock:
            return sum(n for status, n in self.statuses.items() if 400 <= status < 500 and status not in (408, 429))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", default="http://127.0.0.1:8000", help="the dashboard's base URL ('' = offline)")
    parser.add_argument("--api-key", default="", help="a project API key (manage.py createapikey)")
    parser.add_argument("--conversations", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1, help="makes conversation ids and users (default 1)")
    parser.add_argument("--no-telemetry", action="store_true", help="send no spans")
    parser.add_argument("--offline", action="store_true", help="run without a dashboard")
    parser.add_argument("--work-dir", type=Path, default=None, help="sales database and artifacts (default: a temp dir)")
    parser.add_argument("--flush-timeout", type=float, default=20.0, help="seconds to deliver what is queued at the end")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.conversations < 0:
        parser.error("--conversations must be >= 0")
    if args.flush_timeout < 0:
        parser.error("--flush-timeout must be >= 0")
    args.offline = args.offline or not args.endpoint
    if not args.offline and not args.endpoint.startswith(("http://", "https://")):
        parser.error("--endpoint must be an http(s) URL or ''")
    if not args.offline and not args.api_key:
        parser.error("--api-key is needed with an endpoint (or use --offline)")
    return args


class Progress:
    """A plain-text progress bar on stderr (one line per tenth when not a terminal)."""

    def __init__(self, total: int, stream: TextIO, enabled: bool = True) -> None:
        self.total, self.stream, self.enabled = total, stream, enabled and total > 0
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self._last_tenth = -1

    def update(self, done: int, stats: AgentStats) -> None:
        if not self.enabled:
            return
        width = 30
        filled = width * done // self.total
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} conversations"
            f" | tool calls {stats.tool_calls}, errors {stats.errors}, compressions {stats.compressions}"
        )
        if self.tty:
            self.stream.write("\r" + line + ("\n" if done == self.total else ""))
        elif 10 * done // self.total != self._last_tenth:
            self._last_tenth = 10 * done // self.total
            self.stream.write(line + "\n")
        self.stream.flush()


def main(argv: Optional[Sequence[str]] = None, *, stdout: TextIO = sys.stdout, stderr: TextIO = sys.stderr) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=stderr, format="%(levelname)s %(name)s: %(message)s")
    # Timeouts and retries are what the demo shows on purpose: the dashboard has them.
    logging.getLogger("pipeline.tools").setLevel(logging.ERROR)
    temp_dir = None
    work_dir = args.work_dir
    if work_dir is None:
        temp_dir = work_dir = Path(tempfile.mkdtemp(prefix="pipeline-demo-"))
    try:
        return _run(args, work_dir, stdout, stderr)
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


def _run(args: argparse.Namespace, work_dir: Path, stdout: TextIO, stderr: TextIO) -> int:
    started = time.monotonic()
    database = work_dir / f"sales-{DATA_SEED}.sqlite3"
    if not database.exists():
        build_sales_database(database, seed=DATA_SEED)

    transport: Optional[TallyingTransport] = None
    exporter: Optional[RecordExporter] = None
    remote: Optional[RemoteConfig] = None
    if not args.offline:
        transport = TallyingTransport()
        exporter = RecordExporter(
            args.endpoint, args.api_key, transport=transport, max_retries=3, backoff_s=0.25, request_timeout_s=5.0
        )
    telemetry = _telemetry(args)

    agent = DemoAgent.create(
        model=ScriptedModel(), database_path=database, artifact_dir=work_dir / "artifacts",
        exporter=exporter, telemetry=telemetry,
    )
    if not args.offline:
        remote = _remote_config(args, agent)

    plan = plan_conversations(args.conversations, args.seed)
    progress = Progress(len(plan), stderr, enabled=not args.quiet)
    progress.update(0, agent.stats)
    for done, planned in enumerate(plan, start=1):
        agent.run_conversation(planned.scenario, conversation_id=planned.conversation_id, user_id=planned.user_id)
        progress.update(done, agent.stats)
    agent_seconds = time.monotonic() - started

    if remote is not None:
        remote.stop(timeout=1.0)
    regression = _regression_run(args, database, work_dir)
    delivered = True
    if exporter is not None:
        stderr.write(f"Sending what is still queued (at most {args.flush_timeout:g} s) ...\n")
        delivered = exporter.shutdown(timeout=args.flush_timeout)
    telemetry.shutdown(timeout=min(5.0, max(0.5, args.flush_timeout / 2)))
    _summary(stdout, args, agent, exporter, transport, agent_seconds, time.monotonic() - started)
    stdout.write(regression + "\n")

    if exporter is None:
        return 0
    stats = exporter.stats()
    if stats.rejected or (transport is not None and transport.refused):
        stderr.write(f"The dashboard REFUSED records: {stats.last_error}. This is a bug or a bad API key.\n")
        return EXIT_REJECTED
    if not delivered or stats.failures or stats.dropped:
        stderr.write(
            f"The dashboard at {args.endpoint} was not reachable for part of the run ({stats.last_error}); "
            "the agent ran fine, but some records were not delivered.\n"
        )
    return 0


def _regression_run(args: argparse.Namespace, database: Path, work_dir: Path) -> str:
    """A small dataset of the agent's own answers, written to a file and (online) to
    the dashboard, read back from each and replayed; one summary line."""
    path = work_dir / "demo-dataset.jsonl"
    artifacts = work_dir / "regression-artifacts"
    count = write_dataset(path, demo_dataset(database, artifacts))
    from_file = replay(read_dataset(path), database, artifacts)
    line = (f"  dataset            {count} items in {path.name}: replayed from the file, "
            f"{from_file.passed}/{from_file.items} answers as expected")
    if args.offline:
        return line
    try:
        send_dataset(args.endpoint, args.api_key, DATASET_NAME, read_dataset(path))
        from_dashboard = replay(fetch_dataset(args.endpoint, args.api_key, DATASET_NAME),
                                database, artifacts)
    except (DatasetError, OSError, ValueError) as exc:
        return line + f"; the dashboard's copy could not be made ({str(exc)[:120]})"
    return line + (f"; from the dashboard's \"{DATASET_NAME}\" {from_dashboard.passed}/{from_dashboard.items}")


def _telemetry(args: argparse.Namespace) -> Telemetry:
    if args.no_telemetry:
        return configure_telemetry(ObservabilityConfig(enabled=False), shutdown_on_exit=False)
    config = ObservabilityConfig(
        service_name="pipeline-demo-agent",
        trace_sampling=TraceSampling.ALWAYS,  # a demo shows every round's waterfall
        environment="demo",
        otlp_endpoint=None if args.offline else args.endpoint,
        otlp_headers={} if args.offline else {"Authorization": f"Bearer {args.api_key}"},
        export_timeout_ms=5_000,
        schedule_delay_ms=500,
    )
    return configure_telemetry(config, shutdown_on_exit=False)


def _remote_config(args: argparse.Namespace, agent: DemoAgent) -> RemoteConfig:
    """Fetch the dashboard's config now (bounded) and keep polling; a dashboard that is
    down leaves the agent on its own config."""
    remote: RemoteConfig

    def apply(_config: Any) -> None:
        remote.apply_to(executor=agent.executor, context_manager=agent.context_manager, token_counter=agent.token_counter)

    remote = RemoteConfig(args.endpoint, args.api_key, interval_seconds=15, request_timeout_s=3.0, on_change=apply)
    remote.refresh_now()
    remote.start()
    return remote


def _summary(
    out: TextIO,
    args: argparse.Namespace,
    agent: DemoAgent,
    exporter: Optional[RecordExporter],
    transport: Optional[TallyingTransport],
    agent_seconds: float,
    total_seconds: float,
) -> None:
    s = agent.stats
    lines = [
        f"Demo agent: {s.conversations} conversations in {agent_seconds:.1f} s ({total_seconds:.1f} s with delivery)",
        f"  rounds             {s.rounds} ({s.failed_rounds} without an answer)",
        f"  tool calls         {s.tool_calls}: {s.errors} errors, {s.retries} retries, {s.cache_hits} cache hits",
        f"  compressions       {s.compressions}",
        f"  skill activations  {s.skill_activations} ({s.refused_activations} refused)",
        f"  artifacts          {s.artifacts}",
    ]
    if exporter is None:
        lines.append(f"  records            {s.records} made (offline: nothing sent)")
        lines.append(f"  scores             {s.scores} made (offline: nothing sent)")
    else:
        e: ExporterStats = exporter.stats()
        lines.append(
            f"  records            {s.records} made, {e.sent} sent ({e.duplicates} already stored), "
            f"{e.rejected} rejected, {e.dropped} dropped, {e.failures} not delivered"
        )
        lines.append(f"  artifact uploads   {e.artifacts_sent} sent, {e.artifacts_failed} failed")
        lines.append(f"  scores             {s.scores} made, {e.scores_sent} sent, {e.scores_failed} not stored")
        if transport is not None and transport.unreachable:
            lines.append(f"  dashboard          unreachable {transport.unreachable} times ({args.endpoint})")
    out.write("\n".join(lines) + "\n")
    out.flush()


if __name__ == "__main__":
    sys.exit(main())
