"""Two drainers deriving the same conversation at once (two web processes, or two
Celery workers): the one that read last must be the one whose totals stay."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from dashboard.observatory import costs
from dashboard.observatory.derive.passes import totals
from dashboard.observatory.models import Conversation
from tests.dashboard.observatory.helpers import store

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_never_lets_a_pass_that_read_early_overwrite_a_later_one(project, records, monkeypatch):
    store(project, [records.message(conversation="c", index=0)])
    conversation = Conversation.objects.get()
    read_done, release = threading.Event(), threading.Event()
    real_priced = costs.conversations_priced
    slow_drainer: list[threading.Thread] = []

    def slow_after_reading(conversations, *args, **kwargs):
        if threading.current_thread() in slow_drainer:
            read_done.set()
            release.wait(10)  # the slow drainer stalls between its reads and its write
        return real_priced(conversations, *args, **kwargs)

    monkeypatch.setattr(costs, "conversations_priced", slow_after_reading)
    errors: list[BaseException] = []

    def run(target):
        try:
            target()
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    slow = threading.Thread(target=run, args=(lambda: totals.conversation_totals_refresh(
        conversation_ids=[conversation.pk]),))
    slow_drainer.append(slow)
    slow.start()
    assert read_done.wait(10)

    def ingest_then_derive():
        store(project, [records.message(conversation="c", index=1)])  # a batch after the slow read
        totals.conversation_totals_refresh(conversation_ids=[conversation.pk])

    fast = threading.Thread(target=run, args=(ingest_then_derive,))
    fast.start()
    fast.join(0.5)  # the fast drainer reads and writes while the slow one stalls
    release.set()
    slow.join(10)
    fast.join(20)
    assert not errors and not slow.is_alive() and not fast.is_alive()
    conversation.refresh_from_db()
    assert conversation.messages == 2


def test_it_keeps_a_user_another_writer_set_while_it_was_reading(project, records, monkeypatch):
    """The span-row pass sets a conversation's user from its naming spans; a totals
    pass that read before that and derives no user must not write the old one back."""
    store(project, [records.message(conversation="u", index=0)])
    conversation = Conversation.objects.get()
    assert conversation.user_id == ""
    real_priced = costs.conversations_priced

    def user_set_meanwhile(conversations, *args, **kwargs):
        Conversation.objects.filter(pk=conversation.pk).update(user_id="ana")  # between the reads and the write
        return real_priced(conversations, *args, **kwargs)

    monkeypatch.setattr(costs, "conversations_priced", user_set_meanwhile)
    assert totals.conversation_totals_refresh(conversation_ids=[conversation.pk]) == 1
    conversation.refresh_from_db()
    assert (conversation.user_id, conversation.messages) == ("ana", 1)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="several nodes share a database on PostgreSQL only")
def test_a_node_whose_clock_runs_ahead_stamps_its_pass_by_the_database_clock(project, records, monkeypatch):
    """A pass stamps when it began by the database's clock: with its node's own, a node an
    hour ahead would have its older pass win over every newer one for that hour."""
    from datetime import timedelta

    from django.utils import timezone

    from dashboard.observatory.dbfunctions import database_now

    store(project, [records.message(conversation="c", index=0)])
    conversation = Conversation.objects.get()
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=1))  # this node's clock
    totals.conversation_totals_refresh(conversation_ids=[conversation.pk])
    conversation.refresh_from_db()
    assert abs(conversation.totals_updated_at - database_now()) < timedelta(minutes=1)
