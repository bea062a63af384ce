"""Review queues (judging.services): filled from a list of conversations once each,
items claimed so two reviewers never get the same one (also when they ask at the same
moment, on threads of their own), a claim that runs out freed, finishing only by the
holder, and the progress counted from the items."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection

from dashboard.judging.models import ReviewItem
from dashboard.judging.selectors import queue_progress
from dashboard.judging.services import (
    CLAIM,
    ReviewError,
    review_item_claim,
    review_item_finish,
    review_queue_create,
    review_queue_fill,
)
from dashboard.observatory.models import Conversation

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversations(project):
    return [Conversation.objects.create(project=project, external_id=f"c{i}") for i in range(5)]


@pytest.fixture
def queue(project, member, conversations):
    return review_queue_create(project=project, name="errors today", query="has_errors=on", user=member,
                               conversations=Conversation.objects.filter(project=project).order_by("external_id"))


def test_it_fills_a_queue_in_list_order_and_refills_only_what_is_new(project, queue, conversations):
    assert list(ReviewItem.objects.filter(queue=queue).order_by("position").values_list(
        "conversation__external_id", "position")) == [(f"c{i}", i) for i in range(5)]
    Conversation.objects.create(project=project, external_id="c5")
    assert review_queue_fill(queue=queue, conversations=Conversation.objects.filter(project=project)) == 1
    assert ReviewItem.objects.get(queue=queue, conversation__external_id="c5").position == 5


def test_a_queue_takes_only_its_projects_conversations(project, other_project, member):
    Conversation.objects.create(project=other_project, external_id="theirs")
    queue = review_queue_create(project=project, name="q", query="", user=member,
                                conversations=Conversation.objects.all())
    assert not ReviewItem.objects.filter(queue=queue).exists()


def test_a_name_is_taken_once_per_project(project, queue, member):
    with pytest.raises(ReviewError, match="already"):
        review_queue_create(project=project, name="errors today", query="", user=member,
                            conversations=Conversation.objects.none())


def test_two_reviewers_get_different_items_and_keep_their_own(queue, member, stranger):
    first = review_item_claim(queue=queue, user=member)
    second = review_item_claim(queue=queue, user=stranger)
    assert (first.position, second.position) == (0, 1)
    assert review_item_claim(queue=queue, user=member) == first  # a reload gives the same item
    assert (first.claimed_by, second.claimed_by) == (queue.created_by, stranger)


def test_a_claim_that_ran_out_is_given_to_the_next_reviewer(queue, member, stranger):
    first = review_item_claim(queue=queue, user=member)
    ReviewItem.objects.filter(pk=first.pk).update(claimed_until=first.claimed_until - CLAIM - timedelta(seconds=1))
    assert review_item_claim(queue=queue, user=stranger).pk == first.pk


def test_only_the_holder_finishes_an_item_then_the_next_is_given(queue, member, stranger):
    first = review_item_claim(queue=queue, user=member)
    with pytest.raises(ReviewError, match="Another reviewer holds"):
        review_item_finish(item=first, user=stranger, status="done")
    review_item_finish(item=first, user=member, status="done")
    with pytest.raises(ReviewError):
        review_item_finish(item=first, user=member, status="done")  # once
    assert review_item_claim(queue=queue, user=member).position == 1
    with pytest.raises(ReviewError, match="reviewed or skipped"):
        review_item_finish(item=first, user=member, status="pending")


def test_the_progress_counts_the_items(queue, member, stranger):
    for user, status in ((member, "done"), (stranger, "done"), (member, "skipped")):
        review_item_finish(item=review_item_claim(queue=queue, user=user), user=user, status=status)
    review_item_claim(queue=queue, user=stranger)
    (progress,) = queue_progress([queue])
    assert (progress.total, progress.done, progress.skipped, progress.in_review, progress.left) == (5, 2, 1, 1, 2)
    assert progress.by_reviewer == [("ana", 2), ("bo", 1)]


def test_the_queue_is_done_when_every_item_is(queue, member):
    while (item := review_item_claim(queue=queue, user=member)) is not None:
        review_item_finish(item=item, user=member, status="done")
    assert ReviewItem.objects.filter(queue=queue, status="done").count() == 5


@pytest.mark.django_db(transaction=True)
def test_reviewers_asking_at_the_same_moment_never_share_an_item(project, django_user_model):
    users = [django_user_model.objects.create_user(f"reviewer{i}", password="x-Password-1") for i in range(4)]
    for i in range(8):
        Conversation.objects.create(project=project, external_id=f"r{i}")
    queue = review_queue_create(project=project, name="race", query="", user=users[0],
                                conversations=Conversation.objects.filter(project=project))
    start = threading.Barrier(len(users))
    taken: list[int] = []
    lock = threading.Lock()

    def review(user):
        try:
            start.wait(5)
            for _ in range(2):
                item = review_item_claim(queue=queue, user=user)
                with lock:
                    taken.append(item.pk)
                review_item_finish(item=item, user=user, status="done")
        finally:
            connection.close()

    threads = [threading.Thread(target=review, args=(user,)) for user in users]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(taken) == 8 and len(set(taken)) == 8
    assert ReviewItem.objects.filter(queue=queue, status="done").count() == 8
