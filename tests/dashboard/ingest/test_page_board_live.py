"""Ingest steps aside while another process of the server serves a page: a real
gunicorn (deploy/gunicorn.conf.py) whose workers map the page board, and this test
acting as a process of the server serving a page on a slot no worker uses."""

from __future__ import annotations

import http.client
import time

from dashboard.priority import BOARD_ENV, MAX_WAIT, SLOTS, PageBoard

from .interop import running_stack
from .test_key_cache_live import post, spans_body


def test_every_worker_waits_for_a_page_served_by_another_process(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("page-board")
    board_path = str(workdir / "pages.board")
    with running_stack(workdir, **{BOARD_ENV: board_path}) as stack:
        page = PageBoard(board_path, SLOTS - 1)
        connections = [http.client.HTTPConnection("127.0.0.1", stack.web.port, timeout=30) for _ in range(4)]
        try:
            for number, connection in enumerate(connections):  # warm: key seen, connection open
                assert post(connection, stack.key, spans_body(number + 1, number + 1)) == (200, b"")
            page.mark(time.time())  # a page starts in "another process"
            for number, connection in enumerate(connections):
                started = time.monotonic()
                assert post(connection, stack.key, spans_body(number + 1, 100 + number)) == (200, b"")
                assert time.monotonic() - started >= MAX_WAIT  # waited at a safe point, then stored
            page.mark(0.0)
        finally:
            for connection in connections:
                connection.close()
        assert stack.rows("SELECT count(*) FROM observatory_span")[0][0] == 8
