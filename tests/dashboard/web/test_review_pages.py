"""Review queue pages: a queue made from the conversation list's filters, a reviewer
given the next unreviewed conversation (never one another reviewer holds), scoring
it in place, marking it reviewed and moving on in one post; progress by reviewer;
another project's queue, a stranger and a viewer see or change nothing."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from tests.dashboard.web.pages_factories import PASSWORD, full_conversation

from dashboard.accounts.models import Membership
from dashboard.accounts.services import membership_add
from dashboard.judging.models import ReviewItem, ReviewQueue
from dashboard.judging.services import review_queue_create
from dashboard.observatory.models import Conversation

pytestmark = pytest.mark.django_db
HOSTILE = "<script>alert(1)</script>"


@pytest.fixture
def listed(project):
    for name in ("ok-1", "ok-2"):
        Conversation.objects.create(project=project, external_id=name, title=name)
    for name in ("err-1", "err-2", "err-3"):
        Conversation.objects.create(project=project, external_id=name, title=name, has_errors=True)
    full_conversation(project, "full", rounds=2)
    return project


def make(client, project, name="errors", query="has_errors=on", **extra):
    return client.post(reverse("web:review_queues", args=[project.slug]), {"name": name, "query": query, **extra})


def next_item(client, project, queue):
    response = client.post(reverse("web:review_next", args=[project.slug, queue.pk]))
    assert response.status_code == 302
    return response["Location"]


def test_a_queue_is_made_from_the_lists_filters(client_in, listed):
    response = make(client_in, listed, query="has_errors=on&sort=started_at&after=1.2")
    queue = ReviewQueue.objects.get(project=listed)
    assert response.status_code == 302 and response["Location"].endswith(f"/review/{queue.pk}/")
    assert queue.query == "has_errors=on&sort=started_at"  # no paging cursor
    assert sorted(ReviewItem.objects.filter(queue=queue).values_list("conversation__external_id", flat=True)) == [
        "err-1", "err-2", "err-3", "full"]
    page = client_in.get(response["Location"]).content.decode()
    assert 'data-field="done">0<' in page and 'data-field="left">4<' in page
    assert 'data-testid="make-queue"' in client_in.get(reverse("web:conversations", args=[listed.slug])).content.decode()


@pytest.mark.parametrize("fields, words", [
    ({"query": "score_min=abc"}, "These filters are not valid"),
    ({"name": ""}, "This field is required"),
])
def test_bad_queue_forms_are_a_400_with_the_reason(client_in, listed, fields, words):
    response = make(client_in, listed, **fields)
    assert response.status_code == 400 and words in response.content.decode()
    assert not ReviewQueue.objects.exists()


def test_a_taken_name_is_refused(client_in, listed):
    make(client_in, listed)
    response = make(client_in, listed)
    assert response.status_code == 400 and "already" in response.content.decode()


def test_a_reviewer_works_through_the_queue_one_post_at_a_time(client_in, listed, member):
    make(client_in, listed, query="has_errors=on&sort=started_at")
    queue = ReviewQueue.objects.get()
    location = next_item(client_in, listed, queue)
    first = ReviewItem.objects.get(queue=queue, position=0)
    assert location.endswith(f"/review/{queue.pk}/items/{first.pk}/")
    page = client_in.get(location).content.decode()
    assert 'data-review-done' in page and 'data-testid="scores-conversation"' in page
    done = client_in.post(reverse("web:review_item_done", args=[listed.slug, queue.pk, first.pk]), {"status": "done"})
    assert done["Location"].endswith(f"/items/{ReviewItem.objects.get(queue=queue, position=1).pk}/")
    skip_of = ReviewItem.objects.get(queue=queue, position=1)
    client_in.post(reverse("web:review_item_done", args=[listed.slug, queue.pk, skip_of.pk]), {"status": "skipped"})
    first.refresh_from_db()
    assert (first.status, first.done_by) == ("done", member)
    page = client_in.get(reverse("web:review_queue", args=[listed.slug, queue.pk])).content.decode()
    assert 'data-field="done">1<' in page and 'data-field="skipped">1<' in page and "ana 2" in page


def test_the_full_conversation_is_scored_in_place_on_its_item(client_in, listed):
    queue = review_queue_create(project=listed, name="full", query="", user=None,
                                conversations=Conversation.objects.filter(external_id="full"))
    page = client_in.get(next_item(client_in, listed, queue)).content.decode()
    assert page.count('data-testid="scores-round"') == 2 and 'data-testid="scores-tool_call"' in page


def test_a_finished_queue_says_so(client_in, listed):
    queue = review_queue_create(project=listed, name="one", query="", user=None,
                                conversations=Conversation.objects.filter(external_id="ok-1"))
    item = ReviewItem.objects.get(queue=queue)
    client_in.post(reverse("web:review_item_done", args=[listed.slug, queue.pk, item.pk]), {"status": "done"})
    response = client_in.post(reverse("web:review_next", args=[listed.slug, queue.pk]), follow=True)
    assert "Nothing left to review" in response.content.decode()


def test_two_reviewers_are_given_different_items_and_cannot_finish_each_others(client_in, listed, django_user_model):
    queue = review_queue_create(project=listed, name="q", query="", user=None,
                                conversations=Conversation.objects.filter(project=listed).order_by("pk"))
    colleague = django_user_model.objects.create_user("cy", password=PASSWORD)
    membership_add(project=listed, user=colleague)
    other = Client()
    other.force_login(colleague)
    mine, theirs = next_item(client_in, listed, queue), next_item(other, listed, queue)
    assert mine != theirs
    held = client_in.get(theirs).content.decode()
    assert 'data-testid="held-by-other"' in held and "cy is reviewing" in held and "data-review-done" not in held
    theirs_pk = int(theirs.rstrip("/").rsplit("/", 1)[1])
    response = client_in.post(reverse("web:review_item_done", args=[listed.slug, queue.pk, theirs_pk]),
                              {"status": "done"}, follow=True)
    assert "Another reviewer holds this item" in response.content.decode()
    assert ReviewItem.objects.get(pk=theirs_pk).status == "pending"


def test_hostile_names_are_escaped(client_in, listed):
    make(client_in, listed, name=HOSTILE, description=HOSTILE)
    for url in (reverse("web:review_queues", args=[listed.slug]),
                reverse("web:review_queue", args=[listed.slug, ReviewQueue.objects.get().pk])):
        body = client_in.get(url).content.decode()
        assert HOSTILE not in body and "&lt;script&gt;" in body


def test_strangers_viewers_and_other_projects_see_nothing(client, client_in, listed, other_project, stranger,
                                                          django_user_model):
    queue = review_queue_create(project=listed, name="mine", query="", user=None,
                                conversations=Conversation.objects.filter(project=listed))
    theirs = review_queue_create(project=other_project, name="theirs", query="", user=None,
                                 conversations=Conversation.objects.none())
    item = ReviewItem.objects.filter(queue=queue).first()
    urls = [reverse("web:review_queues", args=[listed.slug]), reverse("web:review_queue", args=[listed.slug, queue.pk]),
            reverse("web:review_item", args=[listed.slug, queue.pk, item.pk])]
    client.force_login(stranger)
    assert [client.get(url).status_code for url in urls] == [404, 404, 404]
    assert client.post(reverse("web:review_next", args=[listed.slug, queue.pk])).status_code == 404
    # another project's queue, or an item of another queue, through my project
    assert client_in.get(reverse("web:review_queue", args=[listed.slug, theirs.pk])).status_code == 404
    assert client_in.post(reverse("web:review_next", args=[listed.slug, theirs.pk])).status_code == 404
    other_queue = review_queue_create(project=listed, name="other", query="", user=None,
                                      conversations=Conversation.objects.none())
    assert client_in.get(reverse("web:review_item", args=[listed.slug, other_queue.pk, item.pk])).status_code == 404
    viewer = django_user_model.objects.create_user("vi", password=PASSWORD)
    membership_add(project=listed, user=viewer, role=Membership.Role.VIEWER)
    client.force_login(viewer)
    assert client.get(urls[1]).status_code == 200 and "review-next" not in client.get(urls[1]).content.decode()
    assert client.post(reverse("web:review_next", args=[listed.slug, queue.pk])).status_code == 404
    assert make(client, listed, name="viewer's").status_code == 404
    assert not ReviewItem.objects.filter(claimed_by__isnull=False).exists()


def test_the_queue_pages_read_a_constant_number_of_rows(client_in, listed, django_assert_max_num_queries):
    queue = review_queue_create(project=listed, name="q", query="", user=None,
                                conversations=Conversation.objects.filter(project=listed))
    with django_assert_max_num_queries(9):
        assert client_in.get(reverse("web:review_queue", args=[listed.slug, queue.pk])).status_code == 200
    with django_assert_max_num_queries(8):
        assert client_in.get(reverse("web:review_queues", args=[listed.slug])).status_code == 200


def test_a_queue_from_a_relative_filter_keeps_it_relative_shows_when_it_was_filled_and_refills_as_of_now(
        client_in, project):
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    for name, ago in (("err-recent", timedelta(hours=2)), ("err-old", timedelta(days=3))):
        Conversation.objects.create(project=project, external_id=name, title=name, has_errors=True,
                                    started_at=now - ago, last_activity_at=now - ago)
    Conversation.objects.create(project=project, external_id="ok-recent", title="ok-recent", started_at=now)
    response = make(client_in, project, name="errors today", query="has_errors=on&within=24h")
    queue = ReviewQueue.objects.get(project=project)
    assert queue.query == "has_errors=on&within=24h"  # as given: no absolute date
    assert list(queue.items.values_list("conversation__external_id", flat=True)) == ["err-recent"]
    assert now <= queue.filled_at <= timezone.now()
    page = client_in.get(response["Location"]).content.decode()
    assert "has errors, started in the last 24h" in page and f"{queue.filled_at:%Y-%m-%d %H:%M} UTC" in page
    listing = client_in.get(reverse("web:review_queues", args=[project.slug])).content.decode()
    assert "has errors, started in the last 24h" in listing

    # A day later: the first item stays (a snapshot), the refill reads "the last 24h" as of now.
    ReviewQueue.objects.filter(pk=queue.pk).update(filled_at=now - timedelta(days=1))
    Conversation.objects.filter(project=project, external_id="err-recent").update(started_at=now - timedelta(days=2))
    Conversation.objects.create(project=project, external_id="err-new", title="err-new", has_errors=True,
                                started_at=timezone.now())
    client_in.post(reverse("web:review_queue_refill", args=[project.slug, queue.pk]))
    queue.refresh_from_db()
    assert list(queue.items.order_by("position").values_list("conversation__external_id", flat=True)) == [
        "err-recent", "err-new"]
    assert queue.filled_at > now


def test_the_list_filters_by_a_relative_start_and_refuses_a_bad_one(client_in, project):
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    for name, ago in (("new", timedelta(minutes=30)), ("day", timedelta(hours=20)), ("old", timedelta(days=3))):
        Conversation.objects.create(project=project, external_id=name, title=name, started_at=now - ago)
    listed = client_in.get(reverse("web:conversations", args=[project.slug]), {"within": "24h"})
    assert {c.external_id for c in listed.context["page"].rows} == {"new", "day"}
    # with an absolute start too, the later of the two counts
    both = client_in.get(reverse("web:conversations", args=[project.slug]),
                         {"within": "24h", "since": f"{now - timedelta(hours=1):%Y-%m-%dT%H:%M}"})
    assert {c.external_id for c in both.context["page"].rows} == {"new"}
    assert client_in.get(reverse("web:conversations", args=[project.slug]), {"within": "2y"}).status_code == 400
