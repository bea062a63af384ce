"""kill -9 mid-stream: a real gunicorn (deploy/gunicorn.conf.py, embedded derivations)
on the database under test takes spans and records from agents that retry like
exporters; every server process gets SIGKILL at once in the middle; it starts again.
Then every acknowledged span and record is stored exactly once, and conversation
totals, tool rollups and links agree with the rows within 60 s, with no command run.

Runs against a fresh database of its own: a temp SQLite file, or (in the PostgreSQL
pass) a new database on the server of DATABASE_URL, dropped afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit


from benchmarks.bench_ingest import create_project_and_key, manage
from benchmarks.load import Acknowledged, Agent, Server, django_env

ROOT = Path(__file__).resolve().parents[2]
CONVERGE_SECONDS = 60


@contextmanager
def crash_database() -> Iterator[str]:
    """'' for SQLite, else the URL of a new database on the test PostgreSQL server."""
    url = os.environ.get("DATABASE_URL", "")
    if not url:
        yield ""
        return
    import psycopg

    name = f"crash_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(url)
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def check(env: dict[str, str], project_id: int, acknowledged: Acknowledged, tmp_path: Path) -> dict:
    acked = tmp_path / "acked.json"
    with acknowledged.lock:
        acked.write_text(json.dumps({"span_ids": sorted(acknowledged.span_ids),
                                     "tool_call_ids": sorted(acknowledged.tool_call_ids)}))
    done = subprocess.run([sys.executable, "-m", "benchmarks.load", "check", str(project_id), str(acked)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def project_id_of(env: dict[str, str]) -> int:
    code = "from dashboard.accounts.models import Project; print(Project.objects.get().pk)"
    return int(manage(env, "shell", "-c", code).strip().splitlines()[-1])


def test_it_loses_nothing_acknowledged_and_converges_after_kill_9(tmp_path):
    with crash_database() as database_url:
        env = django_env(tmp_path, database_url)
        env["OBSERVATORY_DERIVE_INLINE"] = "0"  # as in production, not as under pytest
        env.pop("PYTEST_CURRENT_TEST", None)
        manage(env, "migrate", "--noinput")
        key = create_project_and_key(env)
        project_id = project_id_of(env)
        server = Server(env)
        server.start()
        acknowledged, stop = Acknowledged(), threading.Event()
        agents = [Agent(server.port, key, acknowledged, span_batch_sizes=(64,), records_per_batch=20, seed=seed,
                        conversations=5) for seed in range(4)]
        threads = [threading.Thread(target=agent.run, args=(stop,)) for agent in agents]
        try:
            for thread in threads:
                thread.start()
            time.sleep(3)
            before_kill = acknowledged.batches
            server.kill()
            time.sleep(1)
            server.start()
            time.sleep(3)
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
            assert before_kill > 0 and acknowledged.batches > before_kill, "the agents kept sending after the restart"
            assert acknowledged.refused == 0, acknowledged.first_refusal
            deadline = time.monotonic() + CONVERGE_SECONDS
            while True:
                outcome = check(env, project_id, acknowledged, tmp_path)
                if not any(outcome["divergence"].values()) or time.monotonic() > deadline:
                    break
                time.sleep(2)
        finally:
            stop.set()
            server.stop()
    assert (outcome["lost_spans"], outcome["lost_records"]) == (0, 0)
    assert (outcome["duplicate_spans"], outcome["duplicate_records"]) == (0, 0)
    assert outcome["divergence"] == {"conversations": 0, "rollup_calls": 0, "unlinked_spans": 0,
                                     "unlinked_executions": 0, "parked_notes": 0}
