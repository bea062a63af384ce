"""Fixtures shared by the ingest tests."""

from __future__ import annotations

import time
from pathlib import Path

import pytest


@pytest.fixture
def own_database(tmp_path):
    """A database file of its own for servers run as other processes (``manage.py
    otlp_http``, ``otlp_grpc``), migrated, with a project; (its environment, a key)."""
    from benchmarks.bench_ingest import manage
    from benchmarks.load import django_env

    env = {**django_env(tmp_path, ""), "OBSERVATORY_DERIVE_INLINE": "0"}
    env.pop("PYTEST_CURRENT_TEST", None)
    manage(env, "migrate", "--noinput")
    code = ("from dashboard.accounts.services import project_create, apikey_create\n"
            "print(apikey_create(project=project_create(name='p'))[1])\n")
    return env, manage(env, "shell", "-c", code).strip().splitlines()[-1]


def spans_stored(env: dict[str, str]) -> int:
    """The spans in the database of ``own_database``'s environment."""
    from benchmarks.bench_ingest import manage

    code = "from dashboard.observatory.models import Span; print(Span.objects.count())"
    return int(manage(env, "shell", "-c", code).strip().splitlines()[-1])


def alive(pid: int | str) -> bool:
    """The process runs (neither gone nor a zombie)."""
    try:
        return "zombie" not in Path(f"/proc/{int(pid)}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return False


def until_gone(pids: list, message: str, timeout: float = 30.0) -> None:
    """Wait until none of the processes runs; fail with ``message`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, message
        time.sleep(0.2)
