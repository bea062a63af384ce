"""The web worker's memory ceiling (dashboard/worker_memory.py): the reading of
/proc/self/smaps_rollup, and when the ceiling trips, with a fake clock and fake
readings (the true edges); and a real gunicorn replacing a worker over it."""

from __future__ import annotations

import http.client

import pytest

from dashboard.worker_memory import MemoryCeiling, private_mib


def test_it_reads_this_processs_private_memory(tmp_path):
    measured = private_mib()
    if measured is None:
        pytest.skip("no /proc/self/smaps_rollup here")
    assert 1 < measured < 4096
    rollup = tmp_path / "smaps_rollup"
    rollup.write_text("Rss: 9000 kB\nShared_Clean: 100 kB\nPrivate_Clean: 1024 kB\nPrivate_Dirty: 2048 kB\n")
    assert private_mib(str(rollup)) == 3.0


@pytest.mark.parametrize("content", ["", "Private_Dirty: lots\n", "Rss: 12 kB\n"])
def test_it_says_unknown_for_a_missing_or_unreadable_rollup(tmp_path, content):
    rollup = tmp_path / "smaps_rollup"
    rollup.write_text(content)
    assert private_mib(str(rollup)) is None
    assert private_mib(str(tmp_path / "absent")) is None
    assert not MemoryCeiling(1, min_age=0, read=lambda: None).exceeded()


def test_it_trips_over_the_limit_after_the_minimum_age_checking_at_most_every_few_seconds_fake_clock():
    now = [0.0]
    readings = []

    def read():
        readings.append(now[0])
        return 90.0

    ceiling = MemoryCeiling(80, every=5, min_age=60, read=read, clock=lambda: now[0])
    assert not ceiling.exceeded() and readings == []  # young: not even read
    now[0] = 60.0
    assert ceiling.exceeded() and ceiling.last_mib == 90.0
    now[0] = 62.0
    assert not ceiling.exceeded() and readings == [60.0]  # read again only 5 s later
    now[0] = 65.0
    assert ceiling.exceeded() and readings == [60.0, 65.0]
    assert not MemoryCeiling(100, min_age=0, read=read, clock=lambda: now[0]).exceeded()
    assert not MemoryCeiling(0, min_age=0, read=read, clock=lambda: now[0]).exceeded()  # off


def test_gunicorn_replaces_a_worker_over_the_ceiling_and_loses_no_request(tmp_path_factory):
    """WEB_WORKER_PRIVATE_MB=1 (every worker is over it) with WEB_CONCURRENCY=1: after
    the minimum age the next request is answered, then its worker is replaced."""
    import time

    from dashboard import worker_memory

    from .ingest.interop import running_stack
    from .ingest.test_key_cache_live import post, spans_body

    if worker_memory.private_mib() is None:
        pytest.skip("no /proc/self/smaps_rollup here")
    workdir = tmp_path_factory.mktemp("ceiling")
    with running_stack(workdir, WEB_WORKER_PRIVATE_MB="1", WEB_CONCURRENCY="1",
                       WEB_WORKER_MIN_AGE_SECONDS="1") as stack:
        first = stack.web.pids()[1:]
        time.sleep(1.2)
        answers = []
        for number in range(6):
            connection = http.client.HTTPConnection("127.0.0.1", stack.web.port, timeout=30)
            try:
                answers.append(post(connection, stack.key, spans_body(1, number + 1)))
            finally:
                connection.close()
            time.sleep(0.3)
        replaced = stack.web.pids()[1:]
        assert answers == [(200, b"")] * 6
        assert len(replaced) == 1 and replaced != first
        assert stack.rows("SELECT count(*) FROM observatory_span")[0][0] == 6
