"""Smoke test of README command 1, ``deploy/demo.sh``: on a fresh data dir and a free
port it sets up the dashboard, fills it with the demo agent and stops (``--no-serve``);
run again, it reuses the user and the project and makes a new key.

Slow (two runs of the real command, ~20 s), so it runs only when
OBSERVATORY_DEMO_TESTS=1 (deploy/test.sh sets it) and in the SQLite pass: the command
is the embedded product and always uses SQLite.
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "demo password for the smoke test"

pytestmark = pytest.mark.skipif(
    os.environ.get("OBSERVATORY_DEMO_TESTS") != "1" or bool(os.environ.get("DATABASE_URL")),
    reason="runs deploy/demo.sh for real: set OBSERVATORY_DEMO_TESTS=1 (deploy/test.sh does, SQLite pass only)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _demo(data_dir: Path, port: int, conversations: int, *args: str,
          grpc_port: int = 0, otlp_http_port: int = 0) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "OBSERVATORY_DATA_DIR": str(data_dir),
        "DEMO_PORT": str(port),
        "DEMO_GRPC_PORT": str(grpc_port or _free_port()),
        "DEMO_OTLP_HTTP_PORT": str(otlp_http_port or _free_port()),
        "DEMO_CONVERSATIONS": str(conversations),
        "DEMO_PASSWORD": PASSWORD,
        # deploy/test.sh has just installed the test extras (a superset): no second install.
        "DEMO_EXTRAS": os.environ.get("DEMO_EXTRAS", "test"),
    }
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "SECRET_KEY"):
        env.pop(name, None)
    return subprocess.run(
        [str(ROOT / "deploy" / "demo.sh"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def _count(db: Path, sql: str) -> int:
    with sqlite3.connect(db) as connection:
        return connection.execute(sql).fetchone()[0]


def test_it_fills_the_dashboard_and_reuses_it_on_a_second_run(tmp_path: Path) -> None:
    port, grpc_port, otlp_http_port = _free_port(), _free_port(), _free_port()
    first = _demo(tmp_path, port, 3, "--no-serve", grpc_port=grpc_port, otlp_http_port=otlp_http_port)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    # OTLP/gRPC and the OTLP/HTTP receiver ran beside gunicorn, and stopped with it
    assert f"OTLP/gRPC listening on 127.0.0.1:{grpc_port}" in (tmp_path / "grpc.log").read_text()
    assert f"OTLP/HTTP listening on 127.0.0.1:{otlp_http_port}" in (tmp_path / "otlp-http.log").read_text()
    for stopped in (grpc_port, otlp_http_port):
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", stopped)) != 0
    assert f"Open        http://127.0.0.1:{port}/" in first.stdout
    assert f"Log in as   admin / {PASSWORD}" in first.stdout
    keys = re.findall(r"API key     (po_\S+)", first.stdout)
    assert len(keys) == 1
    assert "0 rejected, 0 dropped, 0 not delivered" in first.stdout

    db = tmp_path / "observatory.sqlite3"
    in_demo = "FROM observatory_conversation c JOIN accounts_project p ON p.id = c.project_id WHERE p.slug = 'demo'"
    assert _count(db, f"SELECT COUNT(*) {in_demo}") == 3
    assert _count(db, "SELECT COUNT(*) FROM observatory_toolexecution") > 0
    assert _count(db, "SELECT COUNT(*) FROM observatory_span") > 0
    assert _count(db, "SELECT COUNT(*) FROM observatory_artifact") == 1  # the third scenario exports
    # the agent's OTLP metrics were taken (they were answered 404 before): its tool calls per tool
    assert _count(db, "SELECT COUNT(*) FROM metrics_metrichour WHERE name = 'ba.tool.calls'") > 0

    second = _demo(tmp_path, port, 1, "--no-serve")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "project demo: exists, reused" in second.stdout
    new_keys = re.findall(r"API key     (po_\S+)", second.stdout)
    assert len(new_keys) == 1 and new_keys != keys
    assert _count(db, f"SELECT COUNT(*) {in_demo}") == 4
    assert _count(db, "SELECT COUNT(*) FROM accounts_project") == 1
    assert _count(db, "SELECT COUNT(*) FROM auth_user") == 1
    assert _count(db, "SELECT COUNT(*) FROM accounts_apikey") == 2
    with socket.socket() as s:  # --no-serve stopped the server
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_it_refuses_a_port_that_is_taken(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = _demo(tmp_path, taken.getsockname()[1], 1, "--no-serve")
    assert result.returncode == 1 and "already listens" in result.stderr


def test_it_refuses_an_unknown_argument(tmp_path: Path) -> None:
    result = _demo(tmp_path, _free_port(), 1, "--serve-forever-please")
    assert result.returncode == 2 and "unknown argument" in result.stderr
