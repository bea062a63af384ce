"""The derivation tasks on a real Celery worker consuming from a real Redis broker.

deploy/test.sh starts a private redis-server and sets OBSERVATORY_TEST_REDIS_URL; without
it these tests are skipped. The worker runs in a thread of the test process (Celery's own
test worker), so it works on the same test database.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from dashboard.observatory.models import Conversation, ToolHourlyRollup

REDIS_URL = os.environ.get("OBSERVATORY_TEST_REDIS_URL", "")
pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not REDIS_URL, reason="needs the Redis that deploy/test.sh starts (OBSERVATORY_TEST_REDIS_URL)"),
]


@pytest.fixture
def worker(settings):
    from celery.contrib.testing.worker import start_worker

    from dashboard.celery import app

    saved = {key: app.conf[key] for key in ("broker_url", "task_always_eager")}
    app.conf.update(broker_url=REDIS_URL, task_always_eager=False)
    forget_connections(app)  # an earlier test may have pooled connections to the default broker
    settings.CELERY_TASK_ALWAYS_EAGER = False  # ingest now enqueues instead of running in-process
    settings.CELERY_BROKER_URL = REDIS_URL
    with app.connection_for_write() as connection:
        connection.default_channel.client.flushdb()  # nothing left over from another run
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10, loglevel="WARNING"):
        yield app
    app.conf.update(saved)
    forget_connections(app)


def forget_connections(app):
    """Drop the connection and producer pools Celery caches, so the next send uses the
    broker_url now configured (Celery itself does this only after a fork)."""
    app._pool = None
    app.amqp._producer_pool = None


def wait_for(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def post(client, auth, batch):
    return client.post("/api/v1/records", json.dumps({"records": batch}), content_type="application/json", **auth)


def test_it_derives_totals_and_rollups_on_the_worker(client, auth, records, worker):
    batch = [records.round(input_tokens=40), records.message(), records.tool_result(), records.tool_result(success=False)]
    assert post(client, auth, batch).status_code == 200
    assert wait_for(lambda: Conversation.objects.filter(tool_calls=2).exists())
    assert wait_for(lambda: ToolHourlyRollup.objects.filter(calls=2, errors=1).exists())
    conversation = Conversation.objects.get()
    assert (conversation.rounds, conversation.messages, conversation.errors, conversation.input_tokens) == (1, 1, 1, 40)


def test_it_gives_the_same_rows_when_the_worker_gets_a_task_twice(client, auth, records, worker, project):
    from dashboard.observatory import tasks

    assert post(client, auth, [records.tool_result(), records.message()]).status_code == 200
    assert wait_for(lambda: Conversation.objects.filter(tool_calls=1, messages=1).exists())
    before = list(Conversation.objects.values("rounds", "messages", "tool_calls", "errors", "title"))
    ids = list(Conversation.objects.values_list("pk", flat=True))
    Conversation.objects.update(tool_calls=99, messages=99)  # spoil: only the worker can repair it
    tasks.conversation_totals_refresh.delay(ids)
    tasks.conversation_totals_refresh.delay(ids)  # duplicate delivery
    assert wait_for(lambda: list(Conversation.objects.values("rounds", "messages", "tool_calls", "errors", "title")) == before)
    time.sleep(0.5)  # let the second delivery finish too: it must change nothing
    assert list(Conversation.objects.values("rounds", "messages", "tool_calls", "errors", "title")) == before
