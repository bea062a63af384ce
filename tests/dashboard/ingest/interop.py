"""The stack the interop tests send to: a real gunicorn (deploy/gunicorn.conf.py),
``manage.py otlp_grpc`` and ``manage.py otlp_http`` (the OTLP/HTTP receiver, two
processes), on a fresh database of their own (a temp SQLite file, or a
new database on the PostgreSQL server of DATABASE_URL), with a user, a project and
an API key. Rows are read back with plain SQL; pages through a logged-in HTTP session.

The clients run in subprocesses, so each reads the standard OTEL_EXPORTER_OTLP_*
variables fresh, as an agent's process would.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from benchmarks.bench_ingest import free_port, manage
from benchmarks.load import Server, django_env
from tests.dashboard.test_crash import crash_database

ROOT = Path(__file__).resolve().parents[3]
PASSWORD = "interop-Password-1"


@dataclass
class Stack:
    env: dict[str, str]
    key: str
    project_slug: str
    web: Server
    grpc_port: int
    receiver_port: int
    database_url: str

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.web.port}"

    @property
    def grpc_url(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def receiver_url(self) -> str:
        return f"http://127.0.0.1:{self.receiver_port}"

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        if self.database_url:
            import psycopg

            with psycopg.connect(self.database_url) as connection:
                return list(connection.execute(sql.replace("?", "%s"), params).fetchall())
        with sqlite3.connect(Path(self.env["OBSERVATORY_DATA_DIR"]) / "observatory.sqlite3") as connection:
            return list(connection.execute(sql, params).fetchall())

    def run_client(self, args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
        clean = {k: v for k, v in self.env.items() if not k.startswith("OTEL_")}
        return subprocess.run(args, cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=timeout)

    def page(self, path: str) -> str:
        """A page, as the project's member sees it (logged in through the form)."""
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        login = opener.open(f"{self.http_url}/accounts/login/", timeout=30).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login).group(1)
        form = urllib.parse.urlencode(
            {"username": "interop", "password": PASSWORD, "csrfmiddlewaretoken": token}
        ).encode()
        request = urllib.request.Request(
            f"{self.http_url}/accounts/login/", data=form, headers={"Referer": f"{self.http_url}/accounts/login/"}
        )
        opener.open(request, timeout=30).read()
        return opener.open(f"{self.http_url}{path}", timeout=30).read().decode()


def _wait_for_port(port: int, process: subprocess.Popen, name: str, deadline: float = 30) -> None:
    import socket

    ends = time.monotonic() + deadline
    while time.monotonic() < ends:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited: {process.stderr.read().decode(errors='replace')[-2000:]}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not listen in time")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def running_stack(workdir: Path, **extra_env: str) -> Iterator[Stack]:
    with crash_database() as database_url:
        env = {**django_env(workdir, database_url), **extra_env}
        env.pop("PYTEST_CURRENT_TEST", None)
        env["OBSERVATORY_DERIVE_INLINE"] = "0"  # as in production
        env["SESSION_COOKIE_SECURE"] = "0"  # plain http on the loopback interface, as deploy/demo.sh
        manage(env, "migrate", "--noinput")
        code = (
            "from dashboard.accounts.services import project_create, apikey_create\n"
            "from django.contrib.auth import get_user_model\n"
            f"user = get_user_model().objects.create_user('interop', password={PASSWORD!r})\n"
            "project = project_create(name='Interop', owner=user)\n"
            "print(project.slug, apikey_create(project=project)[1])\n"
        )
        slug, key = manage(env, "shell", "-c", code).strip().splitlines()[-1].split()
        web = Server(env)
        grpc_port, receiver_port = free_port(), free_port()
        servers = {
            "otlp_grpc": (grpc_port, [sys.executable, "manage.py", "otlp_grpc", "--port", str(grpc_port)]),
            "otlp_http": (receiver_port, [sys.executable, "manage.py", "otlp_http", "--port", str(receiver_port),
                                          "--processes", "2"]),
        }
        started: list[subprocess.Popen] = []
        try:
            for name, (port, command) in servers.items():
                process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                started.append(process)
                _wait_for_port(port, process, name)
            web.start()
            yield Stack(env, key, slug, web, grpc_port, receiver_port, database_url)
        finally:
            for process in started:
                _stop(process)
            web.stop()


def exporter_env(stack: Stack, *, protocol: str, compression: str = "gzip", receiver: bool = False) -> dict[str, str]:
    """Only the standard variables, as a user would set them; HTTP to the dashboard,
    or to the OTLP/HTTP receiver with ``receiver``."""
    endpoint = stack.grpc_url if protocol == "grpc" else stack.receiver_url if receiver else stack.http_url
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer {stack.key}",  # as the README writes it
        "OTEL_EXPORTER_OTLP_COMPRESSION": compression,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_BLRP_SCHEDULE_DELAY": "50",
    }


def wait_for(read: Any, count: int, seconds: float = 30) -> list:
    """``read()`` once it returns ``count`` rows (or whatever it returns at the deadline)."""
    ends = time.monotonic() + seconds
    while True:
        rows = read()
        if len(rows) >= count or time.monotonic() > ends:
            return rows
        time.sleep(0.2)


def last_json(output: str) -> Any:
    return json.loads(output.strip().splitlines()[-1])
